//! The bytes of a snapshot as the consensus engine moves them between nodes, chunk by chunk:
//! on the sending node read in place from the pieces they are made of (the snapshot's own bytes
//! and the record segment files it names), never gathered whole; on the receiving node written
//! to one file, which the state machine unpacks once the last chunk is in.

use std::fs::{self, File};
use std::io::{self, SeekFrom};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncSeek, AsyncWrite, ReadBuf};
use tracing::debug;

/// A snapshot's bytes: being sent (read from its pieces) or being received (written to a file).
pub struct SnapshotStream {
    position: u64,
    direction: Direction,
}

enum Direction {
    Sending {
        pieces: Vec<Piece>,
        /// Where each piece starts in the stream.
        starts: Vec<u64>,
        length: u64,
        /// The file piece last read, kept open for the next chunk.
        open: Option<(usize, File)>,
        /// Links to the segment files, removed when the stream is dropped.
        _links: Option<RemovedOnDrop>,
    },
    Receiving {
        file: File,
        path: RemovedOnDrop,
    },
}

/// One part of a snapshot being sent.
#[derive(Debug)]
pub(crate) enum Piece {
    /// Bytes in memory.
    Bytes(Vec<u8>),
    /// The first `length` bytes of a file.
    File { path: PathBuf, length: u64 },
}

impl Piece {
    fn length(&self) -> u64 {
        match self {
            Piece::Bytes(bytes) => bytes.len() as u64,
            Piece::File { length, .. } => *length,
        }
    }
}

/// A file or directory that is removed when this is dropped.
#[derive(Debug)]
pub(crate) struct RemovedOnDrop(pub(crate) PathBuf);

impl Drop for RemovedOnDrop {
    fn drop(&mut self) {
        let removed = if self.0.is_dir() {
            fs::remove_dir_all(&self.0)
        } else {
            fs::remove_file(&self.0)
        };
        if let Err(error) = removed {
            if error.kind() != io::ErrorKind::NotFound {
                debug!(path = %self.0.display(), %error, "cannot remove a snapshot transfer's file");
            }
        }
    }
}

impl SnapshotStream {
    /// A snapshot to send: `pieces` one after the other; `links`, if given, goes with the
    /// stream (the files it holds are links made for this stream).
    pub(crate) fn sending(pieces: Vec<Piece>, links: Option<RemovedOnDrop>) -> SnapshotStream {
        let mut starts = Vec::with_capacity(pieces.len());
        let mut length = 0;
        for piece in &pieces {
            starts.push(length);
            length += piece.length();
        }
        SnapshotStream {
            position: 0,
            direction: Direction::Sending {
                pieces,
                starts,
                length,
                open: None,
                _links: links,
            },
        }
    }

    /// A snapshot to receive into a new file at `path`, removed when the stream is dropped.
    ///
    /// # Errors
    /// The file cannot be created.
    pub(crate) fn receiving(path: PathBuf) -> io::Result<SnapshotStream> {
        let file = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)?;
        Ok(SnapshotStream {
            position: 0,
            direction: Direction::Receiving {
                file,
                path: RemovedOnDrop(path),
            },
        })
    }

    /// The file a received snapshot was written to (`None` for one being sent).
    pub(crate) fn received(&self) -> Option<&Path> {
        match &self.direction {
            Direction::Receiving { path, .. } => Some(&path.0),
            Direction::Sending { .. } => None,
        }
    }

    /// Reads into `buf` from the current position, from one piece; nothing at the end.
    fn read_here(&mut self, buf: &mut ReadBuf<'_>) -> io::Result<()> {
        let position = self.position;
        let Direction::Sending {
            pieces,
            starts,
            length,
            open,
            ..
        } = &mut self.direction
        else {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "a snapshot being received is not read",
            ));
        };
        if position >= *length || buf.remaining() == 0 {
            return Ok(());
        }
        // The last piece starting at or before the position (empty pieces are skipped over).
        let index = starts.partition_point(|&start| start <= position) - 1;
        let within = position - starts[index];
        let wanted = (pieces[index].length() - within).min(buf.remaining() as u64) as usize;
        let into = buf.initialize_unfilled_to(wanted);
        let read = match &pieces[index] {
            Piece::Bytes(bytes) => {
                let from = within as usize;
                into[..wanted].copy_from_slice(&bytes[from..from + wanted]);
                wanted
            }
            Piece::File { path, .. } => {
                if open.as_ref().is_some_and(|(at, _)| *at != index) {
                    *open = None;
                }
                let (_, file) = match open {
                    Some(open) => open,
                    None => open.insert((index, File::open(path)?)),
                };
                let read = file.read_at(&mut into[..wanted], within)?;
                if read == 0 {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        format!("{} is shorter than the snapshot says", path.display()),
                    ));
                }
                read
            }
        };
        buf.advance(read);
        self.position += read as u64;
        Ok(())
    }

    fn length(&self) -> io::Result<u64> {
        match &self.direction {
            Direction::Sending { length, .. } => Ok(*length),
            Direction::Receiving { file, .. } => Ok(file.metadata()?.len()),
        }
    }
}

// The reads and writes are plain file I/O on the calling thread, as the broker's reads of
// records on disk are: chunks of a few megabytes, mostly from the page cache.
impl AsyncRead for SnapshotStream {
    fn poll_read(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Poll::Ready(self.get_mut().read_here(buf))
    }
}

impl AsyncWrite for SnapshotStream {
    fn poll_write(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let Direction::Receiving { file, .. } = &this.direction else {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "a snapshot being sent is not written",
            )));
        };
        let written = file.write_at(buf, this.position)?;
        this.position += written as u64;
        Poll::Ready(Ok(written))
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    /// The end of a received snapshot: the file ends where the last chunk did (a transfer of
    /// the same snapshot that began again from the start may have been longer).
    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if let Direction::Receiving { file, .. } = &this.direction {
            file.set_len(this.position)?;
        }
        Poll::Ready(Ok(()))
    }
}

impl AsyncSeek for SnapshotStream {
    fn start_seek(self: Pin<&mut Self>, to: SeekFrom) -> io::Result<()> {
        let this = self.get_mut();
        let invalid = || io::Error::new(io::ErrorKind::InvalidInput, "a seek before the start");
        let position = match to {
            SeekFrom::Start(at) => Some(at),
            SeekFrom::End(by) => this.length()?.checked_add_signed(by),
            SeekFrom::Current(by) => this.position.checked_add_signed(by),
        };
        this.position = position.ok_or_else(invalid)?;
        Ok(())
    }

    fn poll_complete(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<u64>> {
        Poll::Ready(Ok(self.position))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use tokio::io::{AsyncReadExt, AsyncSeekExt, AsyncWriteExt};

    use super::*;

    #[tokio::test]
    async fn pieces_read_as_one_stream_and_a_received_one_is_written_where_asked() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("segment");
        fs::write(&file, b"0123456789 and what a later snapshot appended").unwrap();
        let links = dir.path().join("links");
        fs::create_dir(&links).unwrap();
        let mut stream = SnapshotStream::sending(
            vec![
                Piece::Bytes(b"head:".to_vec()),
                Piece::Bytes(Vec::new()),
                Piece::File {
                    path: file.clone(),
                    length: 10,
                },
                Piece::Bytes(b":tail".to_vec()),
            ],
            Some(RemovedOnDrop(links.clone())),
        );
        assert_eq!(stream.seek(SeekFrom::End(0)).await.unwrap(), 20);
        stream.seek(SeekFrom::Start(3)).await.unwrap();
        let mut all = Vec::new();
        stream.read_to_end(&mut all).await.unwrap();
        assert_eq!(all, b"d:0123456789:tail");
        // Chunks as the engine reads them: seek, then fill a buffer.
        stream.seek(SeekFrom::Start(7)).await.unwrap();
        let mut chunk = [0; 4];
        stream.read_exact(&mut chunk).await.unwrap();
        assert_eq!(&chunk, b"2345");
        assert!(stream.write_all(b"x").await.is_err());
        drop(stream);
        assert!(!links.exists(), "the links go with the stream");

        // A file shorter than the snapshot says is an error, not a short stream.
        let mut short = SnapshotStream::sending(
            vec![Piece::File {
                path: file,
                length: 100,
            }],
            None,
        );
        let mut all = Vec::new();
        let error = short.read_to_end(&mut all).await.unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::UnexpectedEof);

        let path = dir.path().join("incoming");
        let mut incoming = SnapshotStream::receiving(path.clone()).unwrap();
        incoming.write_all(b"chunk one,").await.unwrap();
        // A chunk sent again lands where it belongs.
        incoming.seek(SeekFrom::Start(6)).await.unwrap();
        incoming.write_all(b"one,two").await.unwrap();
        assert_eq!(incoming.received(), Some(path.as_path()));
        assert_eq!(fs::read(&path).unwrap(), b"chunk one,two");
        // A transfer that begins again and ends sooner leaves nothing of the longer one.
        incoming.seek(SeekFrom::Start(0)).await.unwrap();
        incoming.write_all(b"short").await.unwrap();
        incoming.shutdown().await.unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"short");
        drop(incoming);
        assert!(!path.exists(), "the received file goes with the stream");
    }
}
