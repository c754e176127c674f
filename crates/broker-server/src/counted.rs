//! A stream that counts the bytes read from it and written to it, for the metrics of a
//! connection whose protocol code reads and writes the stream itself (the Kafka listener's),
//! and of the read half of the broker's own connections.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use prometheus_client::metrics::counter::Counter;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// `inner`, its bytes counted: read into `received`, written into `sent` (when counted).
#[derive(Debug)]
pub(crate) struct Counted<S> {
    inner: S,
    received: Option<Counter>,
    sent: Option<Counter>,
}

impl<S> Counted<S> {
    /// `inner` counted into `counters` (received, sent); `None` counts nothing.
    pub(crate) fn new(inner: S, counters: Option<(Counter, Counter)>) -> Self {
        let (received, sent) = counters.unzip();
        Counted {
            inner,
            received,
            sent,
        }
    }

    /// `inner`, a read half, its bytes counted into `received` when given.
    pub(crate) fn receiving(inner: S, received: Option<Counter>) -> Self {
        Counted {
            inner,
            received,
            sent: None,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Counted<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        context: &mut Context<'_>,
        buffer: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buffer.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(context, buffer);
        if let Some(received) = &self.received {
            let read = buffer.filled().len() - before;
            if read > 0 {
                received.inc_by(read as u64);
            }
        }
        polled
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Counted<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        context: &mut Context<'_>,
        bytes: &[u8],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(context, bytes);
        if let (Poll::Ready(Ok(written)), Some(sent)) = (&polled, &self.sent) {
            sent.inc_by(*written as u64);
        }
        polled
    }

    fn poll_flush(mut self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(context)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(context)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    #[tokio::test]
    async fn bytes_read_and_written_are_counted() {
        let (near, mut far) = tokio::io::duplex(1024);
        let (received, sent) = (Counter::default(), Counter::default());
        let mut counted = Counted::new(near, Some((received.clone(), sent.clone())));
        counted.write_all(b"hello").await.unwrap();
        far.write_all(b"abc").await.unwrap();
        let mut read = [0; 3];
        counted.read_exact(&mut read).await.unwrap();
        assert_eq!((received.get(), sent.get()), (3, 5));
    }
}
