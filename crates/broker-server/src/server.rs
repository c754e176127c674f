//! The accept loop and the life of one connection: TLS handshake (when configured), hello and
//! authentication, then batches of pipelined requests, then a graceful close.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use broker_core::BrokerState;
use broker_net::Foreign;
use broker_proto::{
    Decoded, ErrorReply, Hello, HelloReply, ProtocolError, RequestFrame, ResponseFrame,
    ServerCodec, ServerHandshakeCodec, MAGIC, MAX_HELLO_FRAME, OLDEST_PROTOCOL_VERSION,
    PROTOCOL_VERSION,
};
use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tokio::time::{self, Duration};
use tokio_util::codec::Encoder;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, trace, warn};

use crate::answers;
use crate::arrivals::Arriving;
use crate::broker::Broker;
use crate::connection::{write_responses, Connection};
use crate::intake::{accept_tls, next_connection, refused, submit};
use crate::metrics::{Listener, Metrics};
use crate::reply::{Outgoing, ReplyTo, RequestPermit};
use crate::shards::Shards;
use crate::shared::Shared;
use crate::{clock, AuthToken, Config, Listeners, ServerError, Stores, SERVER_NAME};
use crate::{reaper, replicated};

/// How long a new connection may take to send its hello.
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);

/// Runs the accept loop until `shutdown` completes, then shuts down gracefully.
pub(crate) async fn serve(
    Listeners {
        broker: listener,
        metrics: metrics_listener,
        kafka: kafka_listener,
        console: console_listener,
    }: Listeners,
    config: Config,
    storage: Option<Stores>,
    shutdown: impl Future<Output = ()>,
    started: impl FnOnce() -> std::io::Result<()>,
) -> Result<(), ServerError> {
    let restored = storage.is_some();
    let metrics = metrics_listener
        .as_ref()
        .map(|_| Arc::new(Metrics::default()));
    let shards = start_shards(&config, storage, metrics.as_ref())?;
    let connections = Arc::new(Semaphore::new(config.max_connections));
    let grace = config.shutdown_grace;
    let cluster = config.cluster.clone();
    let shared = Arc::new(Shared::new(shards, config, metrics.clone()));
    // In a cluster the node's directory stays locked while the server runs.
    let _cluster_dir = match (&cluster, &shared.config.data_dir) {
        (Some(settings), Some(dir)) => {
            let listening = listener.local_addr().ok();
            let kafka = kafka_listener
                .as_ref()
                .and_then(|kafka| kafka.local_addr().ok());
            let started = replicated::start(&shared, settings, dir, listening, kafka).await?;
            crate::data_groups::start(&shared, settings, dir);
            // Every node: one that leads a group carries the moves of its topics out.
            shared
                .tracker
                .spawn(crate::moves::drive(Arc::clone(&shared)));
            Some(started)
        }
        _ => None,
    };
    if let (Some(listener), Some(metrics)) = (metrics_listener, metrics) {
        shared.tracker.spawn(crate::exporter::serve(
            listener,
            Arc::clone(&shared),
            metrics,
        ));
    }
    // In a cluster the leader takes over the sessions when it is elected.
    if restored && shared.cluster().is_none() {
        for broker in shared.shards.all() {
            broker.lock().restore_sessions();
        }
    }
    shared.tracker.spawn(reaper::reap(Arc::clone(&shared)));
    shared.tracker.spawn(clock::run(Arc::clone(&shared)));
    if let Some(console) = console_listener {
        shared
            .tracker
            .spawn(crate::console::serve(console, Arc::clone(&shared)));
    }
    if let Some(kafka) = kafka_listener {
        shared.tracker.spawn(crate::kafka::serve(
            Arc::clone(&shared),
            kafka,
            Arc::clone(&connections),
        ));
    }
    // Everything that can refuse the start is behind: a cluster node asked its peers whether it
    // lost its log. If the announcement fails (a library caller's `started` refuses), what
    // started stops as on a shutdown, and the failure is returned.
    let announced = started();
    if announced.is_ok() {
        accept_until(&shared, &listener, &connections, shutdown).await;
    }
    info!("shutting down");
    drop(listener);
    shared.shutdown.cancel();
    stop(&shared, grace).await;
    announced.map_err(ServerError::from)
}

/// How many bytes of memory a byte of log holds, at most, while its records wait for a
/// checkpoint: the record itself and its place in its partition's log, the room that log
/// keeps to grow into (twice what it holds, at worst), and the copy a checkpoint takes while
/// it writes them. Measured: about 5 (BENCHMARKS.md, "Memory with a data directory").
const HELD_PER_LOG_BYTE: u64 = 6;

/// The broker's shards: started from `storage` (their journals' fsyncs observed by `metrics`,
/// if given), or new and in memory, as many as `config` asks, sharing its memory budget.
fn start_shards(
    config: &Config,
    storage: Option<Stores>,
    metrics: Option<&Arc<Metrics>>,
) -> Result<Shards, ServerError> {
    // A cluster node holds a state per group (see `data_groups`).
    let count = match (&storage, &config.cluster) {
        (Some(stores), _) => stores.shards().len(),
        (None, Some(cluster)) => crate::data_groups::count(cluster, config.data_dir.as_deref()),
        (None, None) => config.shards.unwrap_or(1),
    };
    // With a data directory, records live on disk: the memory budget is for a broker in memory.
    let memory_budget = storage.is_none().then(|| config.memory_share(count));
    let configure = |state: BrokerState| {
        state
            .with_capacity(config.capacity)
            .with_memory_budget(memory_budget)
            .with_limits(config.limits)
            .with_names(config.names)
    };
    let mut brokers = Vec::with_capacity(count);
    // With a data directory (a single broker's: a cluster node keeps its records in its
    // replicated log), each shard holds about its part of --max-memory in records: those
    // written to their segments leave memory as it fills, and publishes wait for the disk
    // past it (see `JournalSettings::held_log_bytes`). At least two of the largest records,
    // so that evictions and checkpoints do not run for every record under a budget barely
    // above the payload limit.
    let mut journal = config.journal();
    let share = config.max_memory / count.max(1) as u64 / HELD_PER_LOG_BYTE;
    journal.held_log_bytes = Some(share.max(2 * config.max_payload_bytes as u64));
    match storage {
        Some(stores) => {
            for storage in stores.into_shards() {
                let (state, journal) = storage.start(journal, configure)?;
                if let Some(metrics) = metrics {
                    let metrics = Arc::clone(metrics);
                    journal.observe_fsyncs(move |took| metrics.fsynced(took));
                }
                brokers.push(Broker::new(state, Some(journal)));
            }
        }
        None => {
            for _ in 0..count {
                let state = BrokerState::new(config.capacity)
                    .map_err(|error| ServerError::InvalidConfig(error.to_string()))?;
                brokers.push(Broker::new(configure(state), None));
            }
        }
    }
    match brokers.len() {
        1 => Ok(Shards::single(brokers.remove(0))),
        _ => Ok(Shards::new(brokers, config.limits.max_topics)),
    }
}

/// Accepts connections on `listener`, each served by a task of its own within the connection
/// limit, until `shutdown` completes.
async fn accept_until(
    shared: &Arc<Shared>,
    listener: &TcpListener,
    connections: &Arc<Semaphore>,
    shutdown: impl Future<Output = ()>,
) {
    tokio::pin!(shutdown);
    loop {
        let (stream, peer, permit) = tokio::select! {
            () = &mut shutdown => break,
            next = next_connection(shared, listener, connections) => match next {
                Some(next) => next,
                // The slots are never closed.
                None => break,
            },
        };
        let id = shared.new_connection_id();
        shared
            .tracker
            .spawn(handle(Arc::clone(shared), id, stream, peer, permit));
    }
}

/// Stops what [`serve`] started: the cluster node, then the connections and tasks (waited
/// for at most the shutdown grace), then the log, written and synced.
async fn stop(shared: &Arc<Shared>, grace: Duration) {
    shared.tracker.close();
    // The cluster node stops before the tasks are waited for: its leadership task ends with the
    // shutdown, and waiting requests are answered by their connections' closing.
    // (Its further groups first: the first group's stop closes the node's peer port.)
    for group in shared.further_groups() {
        group.shutdown().await;
    }
    if let Some(cluster) = shared.cluster() {
        cluster.shutdown().await;
    }
    if time::timeout(grace, shared.tracker.wait()).await.is_err() {
        warn!(
            remaining = shared.tracker.len(),
            "shutdown grace expired; abandoning unfinished connections"
        );
    }
    // Write and sync what the log still holds before exiting.
    let flushing = Arc::clone(shared);
    let flushed = tokio::task::spawn_blocking(move || {
        for broker in flushing.shards.all() {
            if let Some(journal) = broker.journal() {
                journal.finish();
            }
        }
    });
    if flushed.await.is_err() {
        error!("flushing the log failed");
    }
}

/// Serves one connection from its first byte to close. `_permit` is its connection slot.
async fn handle(
    shared: Arc<Shared>,
    id: u64,
    stream: TcpStream,
    peer: SocketAddr,
    _permit: OwnedSemaphorePermit,
) {
    // Per-connection lines are debug at most, and a connection that only says hello (a ping or
    // a health check every few seconds) logs at trace, so they do not flood a debug log.
    trace!(peer = %peer, connection = id, "connection opened");
    let _open = shared
        .metrics
        .as_ref()
        .map(|metrics| metrics.connection_opened(Listener::Broker));
    if let Err(cause) = stream.set_nodelay(true) {
        debug!(peer = %peer, cause = %cause, "cannot set TCP_NODELAY");
    }
    // Until its hello is welcomed, a new connection may be displaced by another.
    let displaced = shared.shutdown.child_token();
    let arriving = shared.arrivals.arriving(id, displaced.clone());
    match &shared.config.tls {
        None => {
            let (read, write) = stream.into_split();
            serve_stream(&shared, id, read, write, peer, (arriving, &displaced)).await;
        }
        Some(tls) => {
            if let Some(stream) = accept_tls(&shared, tls, stream, peer, &displaced).await {
                let (read, write) = tokio::io::split(stream);
                serve_stream(&shared, id, read, write, peer, (arriving, &displaced)).await;
            }
        }
    }
}

/// The hello (given up once `displaced` is cancelled, see `arrivals`), then requests until the
/// connection ends, over either kind of stream.
async fn serve_stream<R, W>(
    shared: &Arc<Shared>,
    id: u64,
    read: R,
    mut write: W,
    peer: SocketAddr,
    (arriving, displaced): (Arriving, &CancellationToken),
) where
    R: AsyncRead + Unpin + Send,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let received = shared
        .metrics
        .as_ref()
        .map(|metrics| metrics.byte_counters(Listener::Broker).0);
    let mut connection = Connection::new(read, received);
    let mut hello_codec = ServerHandshakeCodec::new(MAX_HELLO_FRAME);
    let welcomed = handshake(
        shared,
        &mut connection,
        &mut hello_codec,
        &mut write,
        (peer, displaced),
    )
    .await;
    if let Some(welcomed) = welcomed {
        if !arriving.arrived() {
            // Displaced between its hello and now: the connection that displaced it waits
            // for its slot.
            trace!(peer = %peer, connection = id, "connection displaced after its hello");
            return;
        }
        let codec = ServerCodec::new(shared.config.max_frame_bytes, welcomed.version);
        let requests = serve_requests(shared, id, connection, codec, write, peer).await;
        if shared.config.leave_on_disconnect {
            reaper::disconnect(shared, id);
        }
        let client = welcomed.client;
        if requests == 0 {
            trace!(peer = %peer, connection = id, client, "connection closed after its hello");
        } else {
            debug!(peer = %peer, connection = id, client, requests, "connection closed");
        }
    }
}

/// Refuses a peer that spoke `foreign` instead of saying hello: one line in the log, and an
/// answer in its own protocol where it has one.
async fn refuse_foreign<W: AsyncWrite + Unpin>(
    shared: &Shared,
    write: &mut W,
    peer: SocketAddr,
    foreign: Foreign,
) {
    let hint = foreign.where_to_go();
    warn!(
        peer = %peer,
        "refusing a client speaking {}: this port speaks the broker's own protocol; {hint}",
        foreign.name()
    );
    refused(shared, "unsupported_protocol");
    let text = format!(
        "This port speaks the broker's own protocol, not {}; {hint}.",
        foreign.name()
    );
    if let Some(refusal) = foreign.refusal(&text) {
        let _ = write.write_all(&refusal).await;
    }
    let _ = write.shutdown().await;
}

/// A client the hello welcomed.
struct Welcomed {
    /// The protocol version the connection speaks.
    version: u16,
    /// The name the client gave in its hello.
    client: String,
}

/// Reads the hello and answers it; the client and the connection's protocol version if it may go
/// on to requests.
async fn handshake<R: AsyncRead + Unpin, W: AsyncWrite + Unpin>(
    shared: &Shared,
    connection: &mut Connection<R>,
    codec: &mut ServerHandshakeCodec,
    write: &mut W,
    (peer, displaced): (SocketAddr, &CancellationToken),
) -> Option<Welcomed> {
    // (`displaced` is a child of the shutdown token: cancelled by it too.)
    let read = tokio::select! {
        () = displaced.cancelled() => return None,
        read = time::timeout(HELLO_TIMEOUT, connection.read_frame(codec)) => read,
    };
    // Another protocol's first bytes: an HTTP or Redis request read as a frame too long, or a
    // Kafka request's header at the start of a frame that is no hello.
    let foreign = match &read {
        Ok(Err(ProtocolError::FrameTooLarge { size, .. })) => Foreign::from_length(*size),
        Ok(Ok(Some(broker_proto::Decoded::Malformed {
            leading_u64: Some(leading),
            ..
        }))) => Foreign::from_body(&leading.to_le_bytes()).filter(|&kind| kind == Foreign::Kafka),
        _ => None,
    };
    if let Some(foreign) = foreign {
        refuse_foreign(shared, write, peer, foreign).await;
        return None;
    }
    let token = shared.config.auth_token.as_ref();
    let mut client = String::new();
    let reply = match read {
        Err(_) => {
            warn!(peer = %peer, cause = "no hello in time", "closing connection");
            refused(shared, "no_hello");
            return None;
        }
        Ok(Ok(None)) => return None,
        // Logged with the refusal below.
        Ok(Err(ProtocolError::FrameTooLarge { size, limit })) => {
            HelloReply::Refused(ErrorReply::TooLarge {
                what: "frame".into(),
                size,
                limit,
            })
        }
        Ok(Err(cause)) => {
            warn!(peer = %peer, cause = %cause, "reading the hello failed");
            return None;
        }
        Ok(Ok(Some(broker_proto::Decoded::Malformed { reason, .. }))) => HelloReply::Refused(
            ErrorReply::UnsupportedProtocol(format!("malformed hello: {reason}")),
        ),
        Ok(Ok(Some(broker_proto::Decoded::Message(hello)))) => {
            match check_hello(&hello, token).and_then(|()| check_serving(shared)) {
                Ok(()) => {
                    trace!(peer = %peer, client = %hello.client, version = hello.version, "hello");
                    client = hello.client;
                    HelloReply::Welcome {
                        // A newer client gets this server's newest version, and may speak it or
                        // close.
                        version: hello.version.min(PROTOCOL_VERSION),
                        server: SERVER_NAME.into(),
                        limits: shared.config.limits(),
                    }
                }
                Err(refusal) => HelloReply::Refused(refusal),
            }
        }
    };
    let welcomed = match &reply {
        HelloReply::Welcome { version, .. } => Some(Welcomed {
            version: *version,
            client,
        }),
        HelloReply::Refused(_) => None,
    };
    if let HelloReply::Refused(refusal) = &reply {
        warn!(peer = %peer, cause = %refusal, "refusing connection");
        refused(
            shared,
            match refusal {
                ErrorReply::Unauthenticated(_) => "unauthenticated",
                ErrorReply::TooLarge { .. } => "hello_too_large",
                _ => "unsupported_protocol",
            },
        );
    }
    let mut buffer = BytesMut::new();
    if let Err(cause) = codec.encode(&reply, &mut buffer) {
        error!(peer = %peer, cause = %cause, "cannot encode the hello reply");
        return None;
    }
    // The flush matters for TLS, which may keep records back until flushed.
    let written = async {
        write.write_all(&buffer).await?;
        write.flush().await
    };
    if let Err(cause) = written.await {
        warn!(peer = %peer, cause = %cause, "writing the hello reply failed");
        return None;
    }
    if welcomed.is_none() {
        // Closing anyway; the peer may already be gone.
        let _ = write.shutdown().await;
    }
    welcomed
}

/// Whether the server accepts a hello: the magic, a version it speaks (any from
/// [`OLDEST_PROTOCOL_VERSION`] on: a newer client is welcomed in this server's newest), then,
/// when the server has a token, the hello's token (compared in constant time; the refusal
/// never repeats it).
fn check_hello(hello: &Hello, token: Option<&AuthToken>) -> Result<(), ErrorReply> {
    if hello.magic != MAGIC {
        return Err(ErrorReply::UnsupportedProtocol(format!(
            "bad magic {:?}, expected {:?}",
            hello.magic, MAGIC
        )));
    }
    if hello.version < OLDEST_PROTOCOL_VERSION {
        return Err(ErrorReply::UnsupportedProtocol(format!(
            "protocol version {} is not supported; this server speaks versions \
             {OLDEST_PROTOCOL_VERSION} to {PROTOCOL_VERSION}",
            hello.version
        )));
    }
    if let Some(token) = token {
        if !token.matches(hello.auth_token.as_deref()) {
            let why = match hello.auth_token {
                None => "this server requires an auth token and the hello has none",
                Some(_) => "wrong auth token",
            };
            return Err(ErrorReply::Unauthenticated(why.into()));
        }
    }
    Ok(())
}

/// Refuses every connection of a cluster node whose consensus engine failed: it serves
/// nothing until it is restarted, and a health check (`broker ping`) must say so.
fn check_serving(shared: &Shared) -> Result<(), ErrorReply> {
    match shared.cluster().and_then(broker_cluster::Cluster::failure) {
        None => Ok(()),
        Some(cause) => Err(ErrorReply::Storage(format!(
            "this node's consensus engine failed ({cause}); it serves nothing until it is \
             restarted"
        ))),
    }
}

/// Reads, applies and answers requests until the peer closes, a protocol error, a write error
/// or shutdown; then answers parked requests at once, flushes and closes. Returns how many
/// requests it read.
async fn serve_requests<R, W>(
    shared: &Arc<Shared>,
    id: u64,
    mut connection: Connection<R>,
    mut codec: ServerCodec,
    write: W,
    peer: SocketAddr,
) -> u64
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let max_in_flight = shared.config.max_in_flight;
    let (outgoing, responses) = mpsc::channel(max_in_flight);
    let closing = shared.shutdown.child_token();
    let writer = shared.tracker.spawn(write_responses(
        write,
        responses,
        codec.twin(),
        closing.clone(),
        peer,
        shared.config.write_timeout,
        shared
            .metrics
            .as_ref()
            .map(|metrics| metrics.byte_counters(Listener::Broker).1),
    ));
    let reply_to = ReplyTo {
        connection: id,
        outgoing,
        closing,
        memory: shared
            .request_memory
            .for_connection(shared.config.connection_request_memory()),
    };
    let in_flight = Arc::new(Semaphore::new(max_in_flight));
    let mut requests = 0;
    let ended = read_requests(
        shared,
        &reply_to,
        &mut connection,
        &mut codec,
        &in_flight,
        &mut requests,
    )
    .await;
    if let Err(cause) = ended {
        match &cause {
            // An idle connection, or a frame that never finished: routine, not a fault.
            ProtocolError::Io(error) if error.kind() == std::io::ErrorKind::TimedOut => {
                info!(peer = %peer, cause = %cause, "closing a connection that timed out");
            }
            _ => warn!(peer = %peer, cause = %cause, "closing connection after a protocol error"),
        }
        if let ProtocolError::FrameTooLarge { size, limit } = cause {
            let refusal = ResponseFrame {
                correlation_id: 0,
                result: Err(ErrorReply::TooLarge {
                    what: "frame".into(),
                    size,
                    limit,
                }),
            };
            // Best effort: if the writer's queue is full the peer is not reading anyway.
            let _ = reply_to
                .outgoing
                .try_send(Outgoing::ready(vec![refusal], Vec::new()));
        }
    }
    reply_to.closing.cancel();
    drop(reply_to);
    if writer.await.is_err() {
        error!(peer = %peer, "the writer task failed");
    }
    requests
}

/// The read loop: waits for an in-flight permit, reads one frame (with room for it in the
/// process's request memory, and for its answer when that carries records), drains every frame
/// already buffered that has room now (one permit each), applies them all under one lock and
/// hands the responses to the writer, counting them in `requests`. Returns `Ok` when the peer
/// closes or the connection is closing.
async fn read_requests<R: AsyncRead + Unpin>(
    shared: &Arc<Shared>,
    reply_to: &ReplyTo,
    connection: &mut Connection<R>,
    codec: &mut ServerCodec,
    in_flight: &Arc<Semaphore>,
    requests: &mut u64,
) -> Result<(), ProtocolError> {
    // Made once: a cancellation future registers with its token when first polled.
    let closing = reply_to.closing.cancelled();
    tokio::pin!(closing);
    let (config, memory) = (&shared.config, &reply_to.memory);
    // A buffered frame whose answer found no room while its batch was gathered: the first of
    // the next batch, which waits for that room.
    let mut carried: Option<(Decoded<RequestFrame>, RequestPermit)> = None;
    // One answer that grows with the state (a description of every topic, ...) at a time: a
    // client pipelining such requests without reading the answers makes the server build one,
    // not as many as it may have requests in flight.
    let large_answers = Arc::new(Semaphore::new(1));
    loop {
        let (mut first, mut first_permit) = match carried.take() {
            Some(frame) => frame,
            None => {
                let permit = tokio::select! {
                    biased;
                    () = &mut closing => return Ok(()),
                    permit = Arc::clone(in_flight).acquire_owned() => match permit {
                        Ok(permit) => permit,
                        // The semaphore is never closed.
                        Err(_) => return Ok(()),
                    },
                };
                // Besides the permit just taken, any taken is a request still outstanding:
                // waiting for it is not idleness.
                let outstanding =
                    || in_flight.available_permits() + 1 < shared.config.max_in_flight;
                let (idle, frame) = (shared.config.idle_timeout, shared.config.read_timeout);
                let first = tokio::select! {
                    biased;
                    () = &mut closing => return Ok(()),
                    frame = connection.read_request(codec, memory, idle, frame, outstanding) => frame,
                };
                let Some((first, room)) = first? else {
                    return Ok(());
                };
                (first, RequestPermit::new(permit, room).counting_answers())
            }
        };
        let answer_room = tokio::select! {
            biased;
            () = &mut closing => return Ok(()),
            room = answers::room_for(config, memory, first_permit.frame_bytes(), &mut first) => room,
        };
        first_permit.hold_answer_room(answer_room);
        if answers::grows_with_state(&first) {
            let turn = tokio::select! {
                biased;
                () = &mut closing => return Ok(()),
                turn = Arc::clone(&large_answers).acquire_owned() => match turn {
                    Ok(turn) => turn,
                    // The semaphore is never closed.
                    Err(_) => return Ok(()),
                },
            };
            first_permit = first_permit.with_large_answer(turn);
        }
        let mut frames = vec![(first, first_permit)];
        let mut fatal = None;
        while let Ok(permit) = Arc::clone(in_flight).try_acquire_owned() {
            match connection.buffered_frame(codec, memory) {
                Ok(Some((mut frame, room))) => {
                    let mut permit = RequestPermit::new(permit, room).counting_answers();
                    match answers::room_now_for(config, memory, permit.frame_bytes(), &mut frame) {
                        Ok(answer_room) => permit.hold_answer_room(answer_room),
                        Err(answers::NoRoom) => {
                            carried = Some((frame, permit));
                            break;
                        }
                    }
                    if answers::grows_with_state(&frame) {
                        match Arc::clone(&large_answers).try_acquire_owned() {
                            Ok(turn) => permit = permit.with_large_answer(turn),
                            // The next batch starts with it, once the answer before is written.
                            Err(_) => {
                                carried = Some((frame, permit));
                                break;
                            }
                        }
                    }
                    frames.push((frame, permit));
                }
                Ok(None) => break,
                Err(cause) => {
                    fatal = Some(cause);
                    break;
                }
            }
        }
        *requests += frames.len() as u64;
        if !submit(shared, reply_to, frames).await {
            // The writer is gone (write error); it has logged why.
            return Ok(());
        }
        if let Some(cause) = fatal {
            return Err(cause);
        }
    }
}
