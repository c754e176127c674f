//! One connection to a server, plain TCP or TLS: the hello exchange, an outbox each caller
//! encodes its request into, a writer task that writes everything encoded since its last write
//! at once, and a reader task that hands each response to its caller. Over plain TCP, a caller
//! alone on the connection (no other call outstanding, and the reader's last responses answered
//! at most one call) writes a request of up to [`DIRECT_WRITE_MAX`] itself when the writer holds
//! nothing, through a second descriptor of the socket, sparing the hand-off to the writer task
//! that pipelined calls share.
//! Everything after the TLS handshake is generic over the stream's halves.
//!
//! The connection is dead once either task stops (end of stream, I/O error, protocol error):
//! both stop, and every outstanding call fails with [`Error::ConnectionLost`]. A dead connection
//! is never revived; the client opens a new one.

use std::io::{self, Write};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use broker_core::{Command, Outcome};
use broker_proto::{
    ClientCodec, ClientHandshakeCodec, Decoded, ErrorReply, Hello, HelloReply, ProtocolError,
    RequestFrameRef, ServerLimits, MAX_HELLO_FRAME, PROTOCOL_VERSION,
};
use bytes::{Buf, BytesMut};
use futures::stream::{FuturesUnordered, StreamExt};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::Notify;
use tokio::time::{Instant, MissedTickBehavior};
use tokio_util::codec::{Decoder, Encoder};
use tokio_util::sync::CancellationToken;

use crate::pending::{Pending, Registration};
use crate::tls::Tls;
use crate::Error;

/// Callers wait while this many bytes of requests are encoded and not yet taken by the writer
/// (a writer stuck on a server that does not read): the outbox is bounded.
const OUTBOX_BYTES: usize = 1024 * 1024;

/// The protocol versions whose welcome this client accepts. Their frames are the same bytes for
/// every call they share (version 3 only added `PublishIdempotent`, version 4 `RetryAfter` and
/// the dead-letter group settings), so the client speaks the newest and an older server answers
/// a call it lacks with `MalformedRequest`.
const SPOKEN_VERSIONS: std::ops::RangeInclusive<u16> = 2..=PROTOCOL_VERSION;

/// The largest request a lone caller writes itself: a larger one goes through the writer, so
/// that no caller copies megabytes into the socket while holding the outbox's lock (and the
/// hand-off saved is worth nothing beside such a write).
const DIRECT_WRITE_MAX: usize = 64 * 1024;

/// How often the reader answers `Timeout` to calls past their deadline: a call fails at most
/// this long after its timeout.
const TIMEOUT_SWEEP: Duration = Duration::from_millis(20);

/// What the client says in its hello.
#[derive(Debug, Clone)]
pub(crate) struct Identity {
    /// The client name for the server's logs.
    pub(crate) name: String,
    /// The shared secret, if any.
    pub(crate) auth_token: Option<String>,
}

/// An open connection, shared by every call that uses it.
#[derive(Debug)]
pub(crate) struct Connection {
    /// The address it is connected to.
    peer: SocketAddr,
    outbox: Arc<Outbox>,
    pending: Arc<Pending>,
    stop: CancellationToken,
    server: String,
    limits: ServerLimits,
}

impl Connection {
    /// Opens a connection to the first of `addrs` that welcomes this client, all within
    /// `timeout`: connects, runs the TLS handshake when `tls` is given, and exchanges hellos.
    ///
    /// The addresses are tried in order, each beside those before it: the next one as soon as
    /// an attempt fails, or when the attempts under way are overdue: no connection within
    /// [`NEXT_ADDRESS_AFTER`], or no welcome within four times as long as the connection took
    /// (at least that long). So a node that is down, cut off, or frozen after accepting the
    /// connection (a stopped process, whose kernel still accepts) costs a cluster's client
    /// about a quarter of a second, not its whole connect timeout, while a node that is merely
    /// slow keeps the whole timeout to answer. When every address fails, or the timeout ends
    /// first, the error is the most telling of the failures (a refusal or a TLS or protocol
    /// error rather than an I/O error), naming the address when there are several.
    pub(crate) async fn open(
        addrs: &[SocketAddr],
        identity: &Identity,
        tls: Option<&Tls>,
        timeout: Duration,
    ) -> Result<Connection, Error> {
        let deadline = crate::deadline::after(Instant::now(), timeout);
        let several = addrs.len() > 1;
        let mut untried = addrs.iter().copied();
        // Declared before the attempts, which borrow it.
        let next_due = NextDue::new();
        let mut attempts = FuturesUnordered::new();
        let mut failure = None;
        let mut start_next = true;
        loop {
            if start_next {
                if let Some(addr) = untried.next() {
                    next_due.set(Instant::now() + NEXT_ADDRESS_AFTER);
                    let attempt = Self::handshake(addr, identity, tls, &next_due);
                    attempts.push(async move {
                        attempt
                            .await
                            .map_err(|error| if several { at(addr, error) } else { error })
                    });
                }
            }
            if attempts.is_empty() {
                return Err(failure.unwrap_or_else(|| {
                    Error::Io(io::Error::new(
                        io::ErrorKind::InvalidInput,
                        "no address to connect to",
                    ))
                }));
            }
            tokio::select! {
                Some(attempt) = attempts.next() => match attempt {
                    Ok(connection) => return Ok(connection),
                    Err(error) => {
                        failure = Some(more_telling(failure, error));
                        start_next = true;
                    }
                },
                () = tokio::time::sleep_until(next_due.get()), if untried.len() > 0 => {
                    // An attempt that connected meanwhile may have put the next one off.
                    start_next = Instant::now() >= next_due.get();
                }
                () = tokio::time::sleep_until(deadline) => {
                    let timed_out = Error::Io(io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!(
                            "no welcome within the connect timeout of {timeout:?} (a server \
                             serving as many connections as its --max-connections lets new \
                             ones wait)"
                        ),
                    ));
                    return Err(more_telling(failure, timed_out));
                }
            }
        }
    }

    /// Connects to `addr` and runs the TLS handshake, if any, and the hello exchange. Once
    /// connected, puts the next address off to four times the time connecting took, if later.
    async fn handshake(
        addr: SocketAddr,
        identity: &Identity,
        tls: Option<&Tls>,
        next_due: &NextDue,
    ) -> Result<Connection, Error> {
        let began = Instant::now();
        let stream = broker_net::connect(addr).await.map_err(Error::Io)?;
        next_due.put_off(Instant::now() + began.elapsed() * 4);
        stream.set_nodelay(true).map_err(Error::Io)?;
        match tls {
            None => {
                // Without it (no descriptor left), every request goes through the writer. Made
                // non-blocking here, whatever the platform's duplicate inherits: a caller
                // writing through it must never wait.
                let direct = socket2::SockRef::from(&stream)
                    .try_clone()
                    .and_then(|socket| socket.set_nonblocking(true).map(|()| socket))
                    .ok()
                    .map(std::net::TcpStream::from);
                let (read, write) = stream.into_split();
                Self::start(read, write, direct, addr, identity).await
            }
            Some(tls) => {
                let stream = tls.connect(stream).await?;
                let (read, write) = tokio::io::split(stream);
                Self::start(read, write, None, addr, identity).await
            }
        }
    }

    /// Exchanges hellos over `read` and `write`, then starts the reader and writer tasks.
    /// `direct`, a second handle on a plain TCP socket, lets lone callers write themselves.
    async fn start<R, W>(
        mut read: R,
        mut write: W,
        direct: Option<std::net::TcpStream>,
        peer: SocketAddr,
        identity: &Identity,
    ) -> Result<Connection, Error>
    where
        R: AsyncRead + Unpin + Send + 'static,
        W: AsyncWrite + Unpin + Send + 'static,
    {
        let mut codec = ClientHandshakeCodec::new(MAX_HELLO_FRAME);
        let mut buffer = BytesMut::new();
        let hello = Hello::new(identity.name.clone(), identity.auth_token.clone());
        codec
            .encode(&hello, &mut buffer)
            .map_err(|error| Error::Protocol(error.to_string()))?;
        write.write_all(&buffer).await.map_err(Error::Io)?;
        write.flush().await.map_err(Error::Io)?;
        let kafka_correlation_id = kafka_correlation_id(&buffer);

        buffer.clear();
        let (reply, as_kafka) = loop {
            if speaks_tls(&buffer) {
                return Err(Error::Tls(
                    "the server speaks TLS; connect with TLS (ClientBuilder::tls_ca_file)"
                        .to_owned(),
                ));
            }
            if broker_net::looks_like_http(&buffer) {
                return Err(Error::Protocol(
                    "the server answered in HTTP: is this a broker's metrics endpoint \
                     (--metrics-listen) or web console (--console-listen) rather than its port?"
                        .to_owned(),
                ));
            }
            let as_kafka = kafka_correlation_id.is_some_and(|id| buffer.get(4..8) == Some(&id[..]));
            if let Some(decoded) = codec.decode(&mut buffer).map_err(handshake_error)? {
                break (decoded, as_kafka);
            }
            if read.read_buf(&mut buffer).await.map_err(Error::Io)? == 0 {
                return Err(Error::Io(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the server closed the connection before answering the hello",
                )));
            }
        };
        let (server, limits) = match reply {
            Decoded::Message(HelloReply::Welcome {
                version,
                server,
                limits,
            }) if SPOKEN_VERSIONS.contains(&version) => (server, limits),
            Decoded::Message(HelloReply::Welcome { version, .. }) => {
                return Err(Error::Protocol(format!(
                    "the server speaks protocol version {version}; this client speaks versions {} to {}",
                    SPOKEN_VERSIONS.start(),
                    SPOKEN_VERSIONS.end()
                )))
            }
            Decoded::Message(HelloReply::Refused(reply)) => return Err(Error::Refused(reply)),
            Decoded::Malformed { reason, .. } if as_kafka => {
                return Err(Error::Protocol(format!(
                    "this port does not speak the broker's protocol: it answers as a Kafka \
                     listener does (a broker's --kafka-listen?); the broker's clients connect to \
                     its client port (--listen) (undecodable hello reply: {reason})"
                )))
            }
            Decoded::Malformed { reason, .. } => {
                return Err(Error::Protocol(format!(
                    "this port does not speak the broker's protocol: is it the broker's client \
                     port (--listen), or another service? (undecodable hello reply: {reason})"
                )))
            }
        };
        tracing::debug!(%peer, %server, "connected");

        let outbox = Arc::new(Outbox::new(codec_for(&limits), direct));
        let pending = Arc::new(Pending::default());
        let stop = CancellationToken::new();
        tokio::spawn(write_requests(
            Arc::clone(&outbox),
            write,
            Arc::clone(&pending),
            stop.clone(),
        ));
        // Bytes after the welcome are the start of the first response: the reader keeps them.
        tokio::spawn(read_responses(
            read,
            buffer,
            codec_for(&limits),
            Arc::clone(&pending),
            stop.clone(),
            peer,
        ));
        Ok(Connection {
            peer,
            outbox,
            pending,
            stop,
            server,
            limits,
        })
    }

    /// The address the connection is connected to.
    pub(crate) fn peer(&self) -> SocketAddr {
        self.peer
    }

    /// Whether the connection died.
    pub(crate) fn is_closed(&self) -> bool {
        self.pending.is_closed()
    }

    /// The server's name and version from its welcome.
    pub(crate) fn server(&self) -> &str {
        &self.server
    }

    /// The limits the server announced in its welcome.
    pub(crate) fn limits(&self) -> ServerLimits {
        self.limits
    }

    /// Sends one request and waits for its outcome. Dropping the future forgets the request.
    /// The request is encoded here, from the borrowed command, into the outbox the writer
    /// takes from (and, for a call alone on a plain TCP connection, written from here); a
    /// request the codec refuses (larger than the server's frame limit) fails alone.
    pub(crate) async fn call(
        &self,
        correlation_id: u64,
        command: &Command,
        max_wait_ms: u32,
        deadline: Instant,
    ) -> Result<Outcome, Error> {
        let call = self
            .pending
            .register(correlation_id, deadline)
            .map_err(Error::ConnectionLost)?;
        let registration = Registration::new(&self.pending, correlation_id);
        let frame = RequestFrameRef {
            correlation_id,
            max_wait_ms,
            command,
        };
        match self.outbox.put(frame, call.alone)? {
            Put::Encoded => {}
            Put::Closed => return Err(self.lost()),
            // Only a full outbox (a writer stuck on a server that does not read) needs a timer
            // of its own. Boxed: this rare path's future would otherwise enlarge every call's.
            Put::Full => match Box::pin(self.outbox.put_when_room(frame, deadline)).await? {
                Put::Encoded => {}
                Put::Closed => return Err(self.lost()),
                Put::Full => return Err(Error::Timeout),
            },
        }
        let outcome = call.reply.await.map_err(|_| self.lost())?;
        registration.disarm();
        outcome
    }

    fn lost(&self) -> Error {
        Error::ConnectionLost(
            self.pending
                .closed_reason()
                .unwrap_or_else(|| "the connection's tasks stopped".to_owned()),
        )
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        // The last user is gone: stop both tasks even if the writer is blocked on a server that
        // does not read.
        self.stop.cancel();
    }
}

/// The request codec, sized to the server's frame limit.
fn codec_for(limits: &ServerLimits) -> ClientCodec {
    ClientCodec::new(usize::try_from(limits.max_frame_bytes).unwrap_or(usize::MAX))
}

/// How long an attempt may go without a connection before the next address is tried beside
/// it (as RFC 8305 staggers its attempts), and the least it may then take to be welcomed.
const NEXT_ADDRESS_AFTER: Duration = Duration::from_millis(250);

/// When the next address is due, shared by the attempts under way (which put it off once they
/// are connected) and the loop that starts them.
#[derive(Debug)]
struct NextDue {
    base: Instant,
    /// Microseconds after `base`.
    micros: AtomicU64,
}

impl NextDue {
    fn new() -> NextDue {
        NextDue {
            base: Instant::now(),
            micros: AtomicU64::new(0),
        }
    }

    fn get(&self) -> Instant {
        self.base + Duration::from_micros(self.micros.load(Ordering::Relaxed))
    }

    fn set(&self, due: Instant) {
        self.micros.store(self.micros_at(due), Ordering::Relaxed);
    }

    /// Makes it `due` if that is later.
    fn put_off(&self, due: Instant) {
        self.micros
            .fetch_max(self.micros_at(due), Ordering::Relaxed);
    }

    fn micros_at(&self, due: Instant) -> u64 {
        u64::try_from(due.saturating_duration_since(self.base).as_micros()).unwrap_or(u64::MAX)
    }
}

/// `error`, saying that it came from `addr` (when a client has several addresses).
fn at(addr: SocketAddr, error: Error) -> Error {
    match error {
        Error::Io(error) => Error::Io(io::Error::new(error.kind(), format!("{addr}: {error}"))),
        Error::Tls(why) => Error::Tls(format!("{addr}: {why}")),
        Error::Protocol(why) => Error::Protocol(format!("{addr}: {why}")),
        other => other,
    }
}

/// The error to report of two failed attempts: an I/O error says least (a refusal, or a TLS
/// or protocol error, says what to fix); two I/O errors are reported together (each names its
/// address when there are several), with the later one's kind; of two others the later one is
/// kept.
fn more_telling(kept: Option<Error>, new: Error) -> Error {
    match (kept, new) {
        (Some(Error::Io(kept)), Error::Io(new)) => {
            Error::Io(io::Error::new(new.kind(), format!("{kept}; {new}")))
        }
        (Some(kept), Error::Io(_)) => kept,
        (_, new) => new,
    }
}

/// Whether the first bytes of an answer are a TLS record (an alert or a handshake, version
/// 3.x) rather than a frame: no frame can be that long, so this is a TLS server.
fn speaks_tls(answer: &[u8]) -> bool {
    matches!(answer, [0x15 | 0x16, 0x03, ..])
}

/// The bytes of `hello` (as sent, length prefix included) that a Kafka listener reads as the
/// request's correlation id (after the length, API key and API version), and that every Kafka
/// response starts with after its length: a reply that starts so comes from a Kafka listener.
fn kafka_correlation_id(hello: &[u8]) -> Option<[u8; 4]> {
    hello.get(8..12)?.try_into().ok()
}

fn handshake_error(error: ProtocolError) -> Error {
    match error {
        ProtocolError::Io(error) => Error::Io(error),
        other => Error::Protocol(format!("bad hello reply: {other}")),
    }
}

/// Requests encoded by their callers and not yet taken by the writer.
#[derive(Debug)]
struct Outbox {
    state: Mutex<OutboxState>,
    /// Wakes the writer when a request is encoded into an empty outbox.
    ready: Notify,
    /// Wakes the caller first in line when the writer takes what is encoded, or stops.
    room: Notify,
    /// The line of callers waiting for room, first come first served (tokio's mutex queues
    /// its waiters in order): only the one holding it puts.
    line: tokio::sync::Mutex<()>,
}

#[derive(Debug)]
struct OutboxState {
    bytes: BytesMut,
    codec: ClientCodec,
    /// How many requests `bytes` holds.
    requests: usize,
    /// Callers in the line for room: while there are any, new callers join it rather than
    /// take the room before them.
    waiting: usize,
    /// The writer took bytes it has not finished writing: nothing may be written before them.
    writing: bool,
    /// A second handle on a plain TCP connection's socket (non-blocking, as the connection's):
    /// a lone caller writes its request through it when the writer holds nothing and nothing
    /// is encoded before it, so that no byte of another request can come between. `None`
    /// over TLS, whose records only the writer can make, and once the writer stopped (so that
    /// the socket closes with the connection's tasks, not with the last handle on it).
    direct: Option<std::net::TcpStream>,
    /// The writer stopped: nothing encoded any more would be written.
    closed: bool,
}

/// What became of a request put into the outbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Put {
    /// Encoded and written by its caller, or encoded for the writer to write.
    Encoded,
    /// Not encoded: the outbox holds [`OUTBOX_BYTES`] already (or, after waiting, still did at
    /// the deadline).
    Full,
    /// Not encoded: the writer stopped.
    Closed,
}

impl Outbox {
    fn new(codec: ClientCodec, direct: Option<std::net::TcpStream>) -> Outbox {
        Outbox {
            state: Mutex::new(OutboxState {
                bytes: BytesMut::new(),
                codec,
                requests: 0,
                waiting: 0,
                writing: false,
                direct,
                closed: false,
            }),
            ready: Notify::new(),
            room: Notify::new(),
            line: tokio::sync::Mutex::new(()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, OutboxState> {
        // Nothing panics while holding it.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Encodes `frame` behind the requests already in the outbox, unless it is full (or
    /// callers wait for room: they go first) or closed; `Err` for a request the codec refuses
    /// (nothing is encoded then). A `lone` caller (see [`crate::pending::Registered::alone`])
    /// writes the request itself when the connection allows it (see [`OutboxState::direct`]);
    /// what the socket does not take at once is left to the writer.
    fn put(&self, frame: RequestFrameRef<'_>, lone: bool) -> Result<Put, Error> {
        self.put_unless_full(frame, false, lone)
    }

    /// [`Outbox::put`]; `in_turn` for the caller first in the line for room.
    fn put_unless_full(
        &self,
        frame: RequestFrameRef<'_>,
        in_turn: bool,
        lone: bool,
    ) -> Result<Put, Error> {
        let mut state = self.lock();
        if state.closed {
            return Ok(Put::Closed);
        }
        if state.bytes.len() >= OUTBOX_BYTES || (state.waiting > 0 && !in_turn) {
            return Ok(Put::Full);
        }
        let OutboxState {
            bytes,
            codec,
            writing,
            direct,
            ..
        } = &mut *state;
        let first_in_line = bytes.is_empty() && !*writing;
        if let Err(error) = codec.encode(frame, bytes) {
            // Nothing was appended; what encoding a too large request grew is not kept.
            broker_net::release_if_grown(bytes);
            return Err(encoding_failed(error));
        }
        let direct = direct
            .as_ref()
            .filter(|_| lone && first_in_line && bytes.len() <= DIRECT_WRITE_MAX);
        if let Some(direct) = direct {
            // Written under the lock, on purpose: a request put meanwhile, or the writer taking
            // what this write leaves, would otherwise go out before this request's end. The
            // write never waits (the socket is non-blocking), is at most `DIRECT_WRITE_MAX`
            // bytes, and happens only when no other call is outstanding to contend for it.
            if write_now(direct, bytes) {
                return Ok(Put::Encoded);
            }
        }
        state.requests += 1;
        let first = state.requests == 1;
        drop(state);
        if first {
            self.ready.notify_one();
        }
        Ok(Put::Encoded)
    }

    /// [`Outbox::put`], waiting for room until `deadline` while the outbox is full. Callers
    /// wait in line, first come first served, and callers that come while any wait join the
    /// line: against a server that reads slowly, none waits while later ones go before it.
    async fn put_when_room(
        &self,
        frame: RequestFrameRef<'_>,
        deadline: Instant,
    ) -> Result<Put, Error> {
        let _in_line = InLine::join(self);
        let Ok(_turn) = tokio::time::timeout_at(deadline, self.line.lock()).await else {
            return Ok(Put::Full);
        };
        loop {
            // Made before looking, so that the writer's next take wakes it.
            let room = self.room.notified();
            let put = self.put_unless_full(frame, true, false)?;
            if put != Put::Full || tokio::time::timeout_at(deadline, room).await.is_err() {
                return Ok(put);
            }
        }
    }

    /// Moves what is encoded to the end of `batch`; how many requests that is. Until
    /// [`Outbox::written`], no caller writes for itself if `batch` holds anything.
    fn take(&self, batch: &mut BytesMut) -> usize {
        let mut state = self.lock();
        if batch.is_empty() {
            // The buffers trade places: each keeps its room for the next time.
            std::mem::swap(&mut state.bytes, batch);
        } else {
            batch.extend_from_slice(&state.bytes);
            state.bytes.clear();
        }
        state.writing = !batch.is_empty();
        let taken = std::mem::take(&mut state.requests);
        drop(state);
        self.room.notify_waiters();
        taken
    }

    /// The writer wrote everything it took.
    fn written(&self) {
        self.lock().writing = false;
    }

    /// The writer stopped: no request is encoded any more, and the callers waiting for room
    /// are told.
    fn close(&self) {
        let mut state = self.lock();
        state.closed = true;
        state.bytes = BytesMut::new();
        state.direct = None;
        drop(state);
        self.room.notify_waiters();
    }
}

/// Writes as much of `bytes` to `socket` as it takes without waiting, and removes that from
/// `bytes`; whether all of it went. A full socket buffer leaves the rest to the writer, and so
/// does an error, which the writer then meets and reports.
fn write_now(mut socket: &std::net::TcpStream, bytes: &mut BytesMut) -> bool {
    while !bytes.is_empty() {
        match socket.write(bytes) {
            Ok(0) => return false,
            Ok(written) => bytes.advance(written),
            Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return false,
        }
    }
    true
}

/// A caller counted in the outbox's line for room until it is dropped (it put its request,
/// gave up at its deadline, or its call was dropped).
struct InLine<'a> {
    outbox: &'a Outbox,
}

impl<'a> InLine<'a> {
    fn join(outbox: &'a Outbox) -> InLine<'a> {
        outbox.lock().waiting += 1;
        InLine { outbox }
    }
}

impl Drop for InLine<'_> {
    fn drop(&mut self) {
        self.outbox.lock().waiting -= 1;
    }
}

/// The error of a request the codec refused.
fn encoding_failed(error: ProtocolError) -> Error {
    match error {
        ProtocolError::FrameTooLarge { size, limit } => Error::Server(ErrorReply::TooLarge {
            what: "frame".to_owned(),
            size,
            limit,
        }),
        other => Error::Protocol(other.to_string()),
    }
}

/// Writes what the callers encoded into the outbox, everything encoded since the last write
/// with one write, until the connection stops.
async fn write_requests<W: AsyncWrite + Unpin>(
    outbox: Arc<Outbox>,
    mut write: W,
    pending: Arc<Pending>,
    stop: CancellationToken,
) {
    let _ended = WriterEnded {
        outbox: Arc::clone(&outbox),
        pending: Arc::clone(&pending),
        stop: stop.clone(),
    };
    let mut batch = BytesMut::new();
    // Made once: a cancellation future registers with its token when first polled.
    let stopped = stop.cancelled();
    tokio::pin!(stopped);
    loop {
        tokio::select! {
            biased;
            () = &mut stopped => break,
            () = outbox.ready.notified() => {}
        }
        let requests = outbox.take(&mut batch);
        if pending.len() > requests {
            // Other calls wait for answers, and the tasks their answers wake usually send at
            // once: let the ready ones run first, so that their requests go in this write
            // instead of costing a write each. (A lone caller is not kept waiting.)
            tokio::task::yield_now().await;
            outbox.take(&mut batch);
        }
        if batch.is_empty() {
            continue;
        }
        let written = tokio::select! {
            biased;
            () = &mut stopped => break,
            // The flush matters for TLS, which may keep records back until flushed.
            written = async { write.write_all(&batch).await?; write.flush().await } => written,
        };
        if let Err(error) = written {
            pending.close(&format!("write failed: {error}"));
            break;
        }
        outbox.written();
        batch.clear();
        broker_net::release_if_grown(&mut batch);
    }
}

/// Ends the connection when its writer stops, however it stops (its task may also be dropped
/// with its runtime): nothing is encoded any more, the socket's second descriptor closes, every
/// waiting call fails, and the reader stops.
struct WriterEnded {
    outbox: Arc<Outbox>,
    pending: Arc<Pending>,
    stop: CancellationToken,
}

impl Drop for WriterEnded {
    fn drop(&mut self) {
        self.outbox.close();
        // A write error closed it first, with its reason; this one then changes nothing.
        self.pending.close("the client closed the connection");
        self.stop.cancel();
    }
}

/// Reads responses and hands each to its caller until the connection ends.
async fn read_responses<R: AsyncRead + Unpin>(
    mut read: R,
    mut buffer: BytesMut,
    mut codec: ClientCodec,
    pending: Arc<Pending>,
    stop: CancellationToken,
    peer: SocketAddr,
) {
    // Calls past their deadline are answered `Timeout` here, by one timer per connection.
    let mut sweep = tokio::time::interval(TIMEOUT_SWEEP);
    sweep.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let stopped = stop.cancelled();
    tokio::pin!(stopped);
    // Responses handed over since the last read: callers woken together tend to send together.
    let mut answered = 0;
    let reason = loop {
        match codec.decode(&mut buffer) {
            Ok(Some(decoded)) => {
                if let Err(reason) = deliver(&pending, decoded) {
                    break reason;
                }
                answered += 1;
                continue;
            }
            Ok(None) => {}
            Err(error) => break error.to_string(),
        }
        if answered > 0 {
            pending.answered_together(std::mem::take(&mut answered));
        }
        broker_net::make_room(&mut buffer);
        // In this order, so that a stream of responses never keeps late calls from expiring.
        let read = tokio::select! {
            biased;
            () = &mut stopped => break "the connection was closed".to_owned(),
            _ = sweep.tick() => {
                pending.expire(Instant::now());
                continue;
            }
            read = read.read_buf(&mut buffer) => read,
        };
        match read {
            Ok(0) if buffer.is_empty() => break "the server closed the connection".to_owned(),
            Ok(0) => {
                break format!(
                    "the server closed the connection in the middle of a frame ({} bytes buffered)",
                    buffer.len()
                )
            }
            Ok(_) => {}
            Err(error) => break format!("read failed: {error}"),
        }
    };
    tracing::debug!(%peer, %reason, "connection closed");
    pending.close(&reason);
    stop.cancel();
}

/// Hands one decoded frame to its caller; `Err` when the connection cannot go on.
fn deliver(pending: &Pending, decoded: Decoded<broker_proto::ResponseFrame>) -> Result<(), String> {
    match decoded {
        Decoded::Message(response) => pending.dispatch(response),
        // The frame boundary is intact, so only the call it answers fails.
        Decoded::Malformed {
            leading_u64: Some(id),
            reason,
        } if id != 0 => {
            pending.complete(
                id,
                Err(Error::Protocol(format!("undecodable response: {reason}"))),
            );
            Ok(())
        }
        Decoded::Malformed { reason, .. } => Err(format!("undecodable response: {reason}")),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn publish(bytes: usize) -> Command {
        Command::Publish {
            topic: "t".to_owned(),
            partition: 0,
            payload: vec![7u8; bytes].into(),
        }
    }

    fn frame(command: &Command) -> RequestFrameRef<'_> {
        RequestFrameRef {
            correlation_id: 1,
            max_wait_ms: 0,
            command,
        }
    }

    #[test]
    fn the_outbox_takes_requests_until_it_holds_its_bound_and_again_once_taken() {
        let outbox = Outbox::new(ClientCodec::new(1 << 20), None);
        let command = publish(64 * 1024);
        let mut encoded = 0;
        while outbox.put(frame(&command), false).unwrap() == Put::Encoded {
            encoded += 1;
        }
        let mut batch = BytesMut::new();
        assert_eq!(outbox.take(&mut batch), encoded);
        // Requests go in while it holds less than its bound: one past it, no more.
        let frame_bytes = batch.len() / encoded;
        assert_eq!(encoded, OUTBOX_BYTES.div_ceil(frame_bytes));
        assert_eq!(outbox.put(frame(&command), false).unwrap(), Put::Encoded);
        // Taken behind what the writer already holds.
        assert_eq!(outbox.take(&mut batch), 1);
        outbox.close();
        assert_eq!(outbox.put(frame(&command), false).unwrap(), Put::Closed);
    }

    #[test]
    fn a_request_over_the_frame_limit_is_refused_and_leaves_the_outbox_as_it_was() {
        let outbox = Outbox::new(ClientCodec::new(1024), None);
        assert!(matches!(
            outbox.put(frame(&publish(2048)), false),
            Err(Error::Server(ErrorReply::TooLarge { limit: 1024, .. }))
        ));
        let mut batch = BytesMut::new();
        assert_eq!(outbox.take(&mut batch), 0);
        assert!(batch.is_empty());
    }

    #[tokio::test]
    async fn a_caller_waits_for_room_until_the_writer_takes_or_its_deadline_passes() {
        let outbox = Arc::new(Outbox::new(ClientCodec::new(2 << 20), None));
        let command = publish(OUTBOX_BYTES);
        assert_eq!(outbox.put(frame(&command), false).unwrap(), Put::Encoded);
        let soon = Instant::now() + Duration::from_millis(50);
        assert_eq!(
            outbox.put_when_room(frame(&command), soon).await.unwrap(),
            Put::Full
        );
        let waiting = {
            let outbox = Arc::clone(&outbox);
            let command = command.clone();
            tokio::spawn(async move {
                let later = Instant::now() + Duration::from_secs(60);
                outbox.put_when_room(frame(&command), later).await.unwrap()
            })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(outbox.take(&mut BytesMut::new()), 1);
        assert_eq!(waiting.await.unwrap(), Put::Encoded);
        // A writer that stops tells the callers still waiting.
        let waiting = {
            let outbox = Arc::clone(&outbox);
            tokio::spawn(async move {
                let later = Instant::now() + Duration::from_secs(60);
                outbox.put_when_room(frame(&command), later).await.unwrap()
            })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        outbox.close();
        assert_eq!(waiting.await.unwrap(), Put::Closed);
    }

    #[tokio::test]
    async fn callers_waiting_for_room_go_first_in_the_order_they_came() {
        let outbox = Arc::new(Outbox::new(ClientCodec::new(2 << 20), None));
        let command = publish(OUTBOX_BYTES);
        assert_eq!(outbox.put(frame(&command), false).unwrap(), Put::Encoded);
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut waiting = Vec::new();
        for caller in 0..3 {
            let (outbox, order) = (Arc::clone(&outbox), Arc::clone(&order));
            let command = command.clone();
            waiting.push(tokio::spawn(async move {
                let later = Instant::now() + Duration::from_secs(60);
                let put = outbox.put_when_room(frame(&command), later).await.unwrap();
                order.lock().unwrap().push(caller);
                put
            }));
            // Each is in line before the next comes.
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // The writer takes; a caller that comes now, before the waiting ones have run, finds
        // no room: the room is theirs.
        assert_eq!(outbox.take(&mut BytesMut::new()), 1);
        assert_eq!(outbox.put(frame(&command), false).unwrap(), Put::Full);
        // Each takes the whole room in turn; the writer takes again after each.
        for _ in 0..3 {
            tokio::time::sleep(Duration::from_millis(10)).await;
            assert_eq!(outbox.take(&mut BytesMut::new()), 1);
        }
        for caller in waiting {
            assert_eq!(caller.await.unwrap(), Put::Encoded);
        }
        assert_eq!(*order.lock().unwrap(), [0, 1, 2]);
        // With nobody in line, a caller puts at once again.
        assert_eq!(outbox.put(frame(&command), false).unwrap(), Put::Encoded);
    }

    /// A connected pair of plain TCP sockets on loopback, the first non-blocking (as a
    /// connection's socket is), with small buffers both ways (so that a few tens of kilobytes
    /// fill them); reading from the second fails after 10 seconds rather than hang.
    fn socket_pair() -> (std::net::TcpStream, std::net::TcpStream) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        // Set before the connection: the accepted socket inherits it.
        socket2::SockRef::from(&listener)
            .set_recv_buffer_size(4096)
            .unwrap();
        let ours = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        socket2::SockRef::from(&ours)
            .set_send_buffer_size(4096)
            .unwrap();
        ours.set_nonblocking(true).unwrap();
        let (peer, _) = listener.accept().unwrap();
        peer.set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        (ours, peer)
    }

    fn encoded(command: &Command) -> Vec<u8> {
        let mut bytes = BytesMut::new();
        ClientCodec::new(64 << 20)
            .encode(frame(command), &mut bytes)
            .unwrap();
        bytes.to_vec()
    }

    fn read_exactly(mut peer: &std::net::TcpStream, count: usize) -> Vec<u8> {
        use std::io::Read;
        let mut bytes = vec![0; count];
        peer.read_exact(&mut bytes).unwrap();
        bytes
    }

    #[test]
    fn a_lone_caller_writes_its_request_itself_when_the_writer_holds_nothing() {
        let (ours, peer) = socket_pair();
        let outbox = Outbox::new(ClientCodec::new(1 << 20), Some(ours));
        let command = publish(100);
        assert_eq!(outbox.put(frame(&command), true).unwrap(), Put::Encoded);
        // Nothing was left for the writer, and the request is on the wire.
        assert_eq!(outbox.take(&mut BytesMut::new()), 0);
        let request = encoded(&command);
        assert_eq!(read_exactly(&peer, request.len()), request);
    }

    #[test]
    fn a_caller_leaves_its_request_to_the_writer_unless_alone_and_first() {
        let (ours, peer) = socket_pair();
        let outbox = Outbox::new(ClientCodec::new(1 << 20), Some(ours));
        let command = publish(100);
        // Other calls are outstanding: the writer writes, with theirs.
        assert_eq!(outbox.put(frame(&command), false).unwrap(), Put::Encoded);
        // Alone, but behind a request the writer has not taken: after it.
        assert_eq!(outbox.put(frame(&command), true).unwrap(), Put::Encoded);
        let mut batch = BytesMut::new();
        assert_eq!(outbox.take(&mut batch), 2);
        // The writer holds bytes it has not written: nothing may go before them.
        assert_eq!(outbox.put(frame(&command), true).unwrap(), Put::Encoded);
        assert_eq!(outbox.take(&mut batch), 1);
        outbox.written();
        assert_eq!(outbox.put(frame(&command), true).unwrap(), Put::Encoded);
        assert_eq!(outbox.take(&mut BytesMut::new()), 0);
        // Only the last one was written by its caller.
        let request = encoded(&command);
        assert_eq!(read_exactly(&peer, request.len()), request);
        peer.set_nonblocking(true).unwrap();
        let mut more = [0; 1];
        let read = std::io::Read::read(&mut &peer, &mut more);
        assert_eq!(read.unwrap_err().kind(), io::ErrorKind::WouldBlock);
    }

    #[test]
    fn what_the_socket_does_not_take_at_once_is_left_to_the_writer_in_order() {
        let (ours, peer) = socket_pair();
        let mut socket = ours.try_clone().unwrap();
        let outbox = Outbox::new(ClientCodec::new(1 << 20), Some(ours));
        // More than the socket buffers hold, with the peer not reading yet; small enough for
        // its caller to write.
        let command = Command::Publish {
            topic: "t".to_owned(),
            partition: 0,
            payload: (0..60 << 10)
                .map(|i: u32| i as u8)
                .collect::<Vec<u8>>()
                .into(),
        };
        assert_eq!(outbox.put(frame(&command), true).unwrap(), Put::Encoded);
        let mut rest = BytesMut::new();
        assert_eq!(outbox.take(&mut rest), 1);
        let request = encoded(&command);
        assert!(!rest.is_empty() && rest.len() < request.len());
        // The writer writes the rest; the peer gets the request whole, in order.
        let reader = std::thread::spawn(move || read_exactly(&peer, request.len()) == request);
        while !rest.is_empty() {
            match socket.write(&rest) {
                Ok(written) => rest.advance(written),
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => {
                    std::thread::sleep(Duration::from_millis(1));
                }
                Err(error) => panic!("{error}"),
            }
        }
        assert!(reader.join().unwrap());
    }

    #[test]
    fn the_callers_handle_on_the_socket_goes_when_the_writer_stops() {
        let (ours, peer) = socket_pair();
        let outbox = Outbox::new(ClientCodec::new(1 << 20), Some(ours));
        outbox.close();
        // That was the socket's last descriptor: the peer sees the end of the stream.
        let mut byte = [0; 1];
        assert_eq!(std::io::Read::read(&mut &peer, &mut byte).unwrap(), 0);
        assert_eq!(outbox.put(frame(&publish(1)), true).unwrap(), Put::Closed);
    }

    #[test]
    fn a_large_request_is_left_to_the_writer_even_alone() {
        let (ours, _peer) = socket_pair();
        let outbox = Outbox::new(ClientCodec::new(1 << 20), Some(ours));
        let command = publish(DIRECT_WRITE_MAX);
        assert_eq!(outbox.put(frame(&command), true).unwrap(), Put::Encoded);
        assert_eq!(outbox.take(&mut BytesMut::new()), 1);
    }

    #[tokio::test]
    async fn no_caller_writes_for_itself_until_the_writer_has_written_what_it_took() {
        // The writer's stream takes 64 bytes and no more until read: it stays in its write.
        let (stream, mut server) = tokio::io::duplex(64);
        // A second socket stands for the caller's handle: a request written through it
        // would jump ahead of what the writer holds.
        let (ours, peer) = socket_pair();
        let outbox = Arc::new(Outbox::new(ClientCodec::new(1 << 20), Some(ours)));
        let (pending, stop) = (Arc::new(Pending::default()), CancellationToken::new());
        let first = publish(1000);
        assert_eq!(outbox.put(frame(&first), false).unwrap(), Put::Encoded);
        let writer = tokio::spawn(write_requests(
            Arc::clone(&outbox),
            stream,
            Arc::clone(&pending),
            stop.clone(),
        ));
        tokio::time::sleep(Duration::from_millis(50)).await;
        let second = publish(10);
        assert_eq!(outbox.put(frame(&second), true).unwrap(), Put::Encoded);
        // Both come through the writer, in order; nothing through the caller's handle.
        let expected = [encoded(&first), encoded(&second)].concat();
        let mut received = vec![0; expected.len()];
        let read = tokio::io::AsyncReadExt::read_exact(&mut server, &mut received);
        tokio::time::timeout(Duration::from_secs(10), read)
            .await
            .expect("the writer wrote both requests")
            .unwrap();
        assert_eq!(received, expected);
        peer.set_nonblocking(true).unwrap();
        let mut byte = [0; 1];
        let read = std::io::Read::read(&mut &peer, &mut byte);
        assert_eq!(read.unwrap_err().kind(), io::ErrorKind::WouldBlock);
        stop.cancel();
        writer.await.unwrap();
        // The writer ended the connection as it went.
        assert!(pending.is_closed());
        assert_eq!(outbox.put(frame(&second), true).unwrap(), Put::Closed);
    }
}
