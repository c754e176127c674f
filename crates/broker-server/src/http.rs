//! The server's HTTP/1.1 listeners (the metrics endpoint and the console): a bounded number of
//! connections, each with a limit on how long it may take to send a request's headers and on
//! how long it is kept, TLS when asked, and a graceful close at shutdown.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tracing::{debug, warn};

use crate::intake::accept_tls;
use crate::security::ServerTls;
use crate::shared::Shared;

/// Most connections of one HTTP listener open at once: past it, clients wait in the backlog.
const MAX_CONNECTIONS: usize = 64;

/// How long a connection may take to send a request's headers.
const READ_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a connection is kept at most: clients reconnect as they need, so one that stays
/// idle (or never finishes a request) cannot hold its slot.
const CONNECTION_LIFE: Duration = Duration::from_secs(120);

/// How long a write to a connection may wait for its client to read: a client that sends
/// requests without reading the answers is closed then, not kept for [`CONNECTION_LIFE`].
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// Serves `listener` until the server shuts down, answering each request with `answer`;
/// over TLS with `tls`, when given. `what` names the listener in the log.
pub(crate) async fn serve<A, F>(
    listener: TcpListener,
    shared: Arc<Shared>,
    tls: Option<ServerTls>,
    what: &'static str,
    answer: A,
) where
    A: Fn(Request<Incoming>) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Response<Full<Bytes>>> + Send + 'static,
{
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        // A connection slot before each accept.
        let permit = tokio::select! {
            () = shared.shutdown.cancelled() => return,
            permit = Arc::clone(&slots).acquire_owned() => match permit {
                Ok(permit) => permit,
                // The semaphore is never closed.
                Err(_) => return,
            },
        };
        let accepted = tokio::select! {
            () = shared.shutdown.cancelled() => return,
            accepted = listener.accept() => accepted,
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(cause) => {
                warn!(cause = %cause, listener = what, "accepting an HTTP connection failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let shared = Arc::clone(&shared);
        let tls = tls.clone();
        let answer = answer.clone();
        let tracker = shared.tracker.clone();
        tracker.spawn(async move {
            let _permit = permit;
            let served = match tls {
                None => connection(&shared, stream, peer, answer).await,
                Some(tls) => {
                    match accept_tls(&shared, &tls, stream, peer, &shared.shutdown).await {
                        Some(stream) => connection(&shared, stream, peer, answer).await,
                        None => return,
                    }
                }
            };
            if let Some(cause) = served {
                debug!(peer = %peer, cause = %cause, listener = what, "HTTP connection failed");
            }
        });
    }
}

/// Serves one connection from `peer` to its end; what failed, if it did. Each request carries
/// `peer` among its extensions.
async fn connection<S, A, F>(
    shared: &Shared,
    stream: S,
    peer: SocketAddr,
    answer: A,
) -> Option<hyper::Error>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    A: Fn(Request<Incoming>) -> F + Send + Sync + 'static,
    F: Future<Output = Response<Full<Bytes>>> + Send + 'static,
{
    let service = hyper::service::service_fn(move |mut request: Request<Incoming>| {
        request.extensions_mut().insert(peer);
        let answered = answer(request);
        async move { Ok::<_, Infallible>(answered.await) }
    });
    let connection = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(READ_TIMEOUT)
        .serve_connection(TokioIo::new(WriteStallLimited::new(stream)), service);
    tokio::pin!(connection);
    let served = tokio::select! {
        served = tokio::time::timeout(CONNECTION_LIFE, connection.as_mut()) => served,
        () = shared.shutdown.cancelled() => {
            connection.as_mut().graceful_shutdown();
            tokio::time::timeout(READ_TIMEOUT, connection.as_mut()).await
        }
    };
    match served {
        Ok(Err(cause)) => Some(cause),
        Ok(Ok(())) | Err(_) => None,
    }
}

/// A stream whose writes fail with `TimedOut` once one waited [`WRITE_TIMEOUT`] without the
/// client taking a byte.
struct WriteStallLimited<S> {
    stream: S,
    /// Running while a write waits; reset by every write that goes through.
    stalled: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl<S> WriteStallLimited<S> {
    fn new(stream: S) -> Self {
        WriteStallLimited {
            stream,
            stalled: None,
        }
    }

    /// `poll`'s answer, or `TimedOut` if it is still pending past the stall's deadline.
    fn limit<T>(
        &mut self,
        context: &mut Context<'_>,
        poll: Poll<std::io::Result<T>>,
    ) -> Poll<std::io::Result<T>> {
        if poll.is_ready() {
            self.stalled = None;
            return poll;
        }
        let stalled = self
            .stalled
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(WRITE_TIMEOUT)));
        match stalled.as_mut().poll(context) {
            Poll::Ready(()) => {
                self.stalled = None;
                Poll::Ready(Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "the client read nothing of the answer in time",
                )))
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for WriteStallLimited<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        context: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(context, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for WriteStallLimited<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        context: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let poll = Pin::new(&mut self.stream).poll_write(context, buf);
        self.limit(context, poll)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        context: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let poll = Pin::new(&mut self.stream).poll_write_vectored(context, bufs);
        self.limit(context, poll)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(
        mut self: Pin<&mut Self>,
        context: &mut Context<'_>,
    ) -> Poll<std::io::Result<()>> {
        let poll = Pin::new(&mut self.stream).poll_flush(context);
        self.limit(context, poll)
    }

    fn poll_shutdown(
        mut self: Pin<&mut Self>,
        context: &mut Context<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(context)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_write_the_client_does_not_read_fails_after_the_timeout_and_one_it_reads_goes() {
        let (client, server) = tokio::io::duplex(64);
        let mut server = WriteStallLimited::new(server);
        // Within the pipe's room: written at once.
        server.write_all(&[1; 64]).await.unwrap();
        // Past it, the write waits for the client; it gives up after the timeout.
        let began = tokio::time::Instant::now();
        let error = server.write_all(&[2; 64]).await.unwrap_err();
        assert_eq!(error.kind(), std::io::ErrorKind::TimedOut);
        assert!(began.elapsed() >= WRITE_TIMEOUT);
        // A client that reads lets the writes through, however long it all takes.
        let mut client = client;
        let reader = tokio::spawn(async move {
            let mut read = [0; 64 * 3];
            for chunk in read.chunks_mut(64) {
                tokio::time::sleep(WRITE_TIMEOUT / 2).await;
                client.read_exact(chunk).await.unwrap();
            }
        });
        server.write_all(&[3; 128]).await.unwrap();
        reader.await.unwrap();
    }
}
