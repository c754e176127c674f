//! Taking connections in and their requests to the broker, for both listeners (the broker's own
//! protocol in `server`, Kafka's in `kafka`): accepting with back-off, the TLS handshake, and a
//! batch of requests submitted to the broker with its answers handed to the connection's writer.

use std::net::SocketAddr;
use std::sync::Arc;

use crate::reply::RequestPermit;
use broker_proto::{Decoded, RequestFrame};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::{self, Duration, Instant};
use tokio_rustls::server::TlsStream;
use tracing::{error, warn};

use crate::dispatch::{apply_batch, apply_batch_replicated, finish_reads, settle, Applied};
use crate::reply::{Outgoing, ReplyTo};
use crate::shared::Shared;
use crate::{cluster_admin, waiter, ServerTls};

/// How long a new connection may take to complete its TLS handshake, when TLS is on.
const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The longest pause between retries of a failing `accept`.
const MAX_ACCEPT_BACKOFF: Duration = Duration::from_secs(1);

/// Accepts one connection, backing off and retrying on errors (such as running out of file
/// descriptors) instead of giving up.
pub(crate) async fn accept(listener: &TcpListener) -> (TcpStream, SocketAddr) {
    let mut backoff = Duration::from_millis(1);
    loop {
        match listener.accept().await {
            Ok(accepted) => return accepted,
            Err(cause) => {
                error!(cause = %cause, backoff_ms = backoff.as_millis() as u64, "accept failed; retrying");
                time::sleep(backoff).await;
                backoff = (backoff * 2).min(MAX_ACCEPT_BACKOFF);
            }
        }
    }
}

/// The next connection to serve on `listener`, with its slot among `connections`. A
/// connection accepted while every slot is taken waits for one (the others wait in the listen
/// backlog); but first, the oldest connection still arriving (see `arrivals`), if any, is
/// closed to give it its slot, and so again every [`DISPLACE_AGAIN`] while it waits (the slot
/// given back went to an earlier waiter, or the connections arriving were not noted yet).
/// `None` if the slots are closed (they never are). Cancel safe but for a connection accepted
/// and not yet returned, which is then closed.
pub(crate) async fn next_connection(
    shared: &Shared,
    listener: &TcpListener,
    connections: &Arc<Semaphore>,
) -> Option<(TcpStream, SocketAddr, OwnedSemaphorePermit)> {
    let (stream, peer) = accept(listener).await;
    loop {
        if let Ok(permit) = Arc::clone(connections).try_acquire_owned() {
            return Some((stream, peer, permit));
        }
        if shared.arrivals.displace_oldest() {
            refused(shared, "displaced");
        }
        // The displaced connection gives its slot back as it closes (slots go to those
        // waiting for one in turn).
        tokio::select! {
            permit = Arc::clone(connections).acquire_owned() => {
                return Some((stream, peer, permit.ok()?));
            }
            () = time::sleep(DISPLACE_AGAIN) => {}
        }
    }
}

/// How often a connection waiting for a slot closes the oldest connection still arriving
/// again (see [`next_connection`]).
const DISPLACE_AGAIN: Duration = Duration::from_secs(1);

/// Runs the server side of the TLS handshake; `None` (logged) if it fails, outlasts
/// [`TLS_HANDSHAKE_TIMEOUT`] or `closing` (a child of the server's shutdown token) is
/// cancelled first.
pub(crate) async fn accept_tls(
    shared: &Shared,
    tls: &ServerTls,
    stream: TcpStream,
    peer: SocketAddr,
    closing: &tokio_util::sync::CancellationToken,
) -> Option<TlsStream<TcpStream>> {
    let accepted = tokio::select! {
        () = closing.cancelled() => return None,
        accepted = time::timeout(TLS_HANDSHAKE_TIMEOUT, tls.acceptor().accept(stream)) => accepted,
    };
    match accepted {
        Ok(Ok(stream)) => Some(stream),
        Ok(Err(cause)) => {
            warn!(peer = %peer, cause = %cause, "TLS handshake failed; closing connection");
            refused(shared, "tls_handshake");
            None
        }
        Err(_) => {
            warn!(peer = %peer, cause = "no TLS handshake in time", "closing connection");
            refused(shared, "tls_handshake");
            None
        }
    }
}

/// Counts a connection refused before its first request, when metrics are on.
pub(crate) fn refused(shared: &Shared, reason: &'static str) {
    if let Some(metrics) = &shared.metrics {
        metrics.connection_refused(reason);
    }
}

/// With a data directory, holds a batch that publishes records back while a shard it
/// publishes to holds more records in memory than its part of `--max-memory` allows, not yet
/// written to their segments (with `--fsync always`: while a checkpoint that takes them out of
/// memory runs): under a sustained load, publishers wait for the disk rather than the memory
/// growing with the load (see `JournalSettings::held_log_bytes`). Other batches go on.
async fn hold_back(shared: &Shared, frames: &[(Decoded<RequestFrame>, RequestPermit)]) {
    let mut shards: Vec<usize> = frames
        .iter()
        .filter_map(|(frame, _)| match frame {
            Decoded::Message(request) if request.command.largest_record().is_some() => request
                .command
                .topic()
                .map(|topic| shared.shards.shard_of(topic)),
            _ => None,
        })
        .collect();
    shards.dedup();
    for shard in shards {
        let Some(journal) = shared.shards.get(shard).journal() else {
            continue;
        };
        while journal.over_memory() {
            if let Some(metrics) = &shared.metrics {
                metrics.held_back();
            }
            tokio::select! {
                () = journal.room_made() => {}
                () = shared.shutdown.cancelled() => return,
            }
        }
    }
}

/// Applies a batch of requests of one connection (under one lock of the broker, one per run of
/// requests to the same shard with `--shards`, let go while the records of a delivery are read
/// from disk, or as one proposal to the cluster) and hands
/// their answers to the connection's writer through `reply_to`: at once, once durable, or, for
/// requests that wait or are about the cluster, from the tasks it spawns to answer them.
/// Returns `false` when the writer is gone.
pub(crate) async fn submit(
    shared: &Arc<Shared>,
    reply_to: &ReplyTo,
    frames: Vec<(Decoded<RequestFrame>, RequestPermit)>,
) -> bool {
    let may_wait = !reply_to.closing.is_cancelled();
    let mut applied = match shared.cluster() {
        Some(_) => apply_batch_replicated(shared, reply_to.connection, frames, may_wait).await,
        None => {
            hold_back(shared, &frames).await;
            let mut applied = Applied::arrived(shared, Instant::now());
            let mut frames = frames.into_iter();
            let mut resumed = None;
            while let Some(wanted) = apply_batch(
                shared,
                reply_to.connection,
                &mut frames,
                may_wait,
                &mut applied,
                resumed.take(),
            ) {
                // Waiting consumers need not wait for the disk either.
                shared.signals.wake(&std::mem::take(&mut applied.wake));
                resumed = Some(wanted.read(shared.metrics.as_deref()).await);
            }
            // Waiting consumers need not wait for this batch's reads from disk.
            shared.signals.wake(&std::mem::take(&mut applied.wake));
            finish_reads(shared, &mut applied, reply_to.connection).await;
            applied
        }
    };
    shared.signals.wake(&applied.wake);
    let deferred = settle(shared, &mut applied).await;
    if let Some(metrics) = &shared.metrics {
        // Deferred answers (the log is failing) are not counted.
        applied.count(metrics);
    }
    let answers = match deferred {
        Some(deferred) => Some(Outgoing::Deferred(deferred)),
        None if applied.responses.is_empty() => None,
        None => Some(Outgoing::ready(
            std::mem::take(&mut applied.responses),
            std::mem::take(&mut applied.permits),
        )),
    };
    for parked in applied.parked {
        shared
            .tracker
            .spawn(waiter::wait(Arc::clone(shared), reply_to.clone(), parked));
    }
    for request in applied.cluster_requests {
        shared.tracker.spawn(cluster_admin::answer(
            Arc::clone(shared),
            reply_to.clone(),
            request,
        ));
    }
    match answers {
        Some(answers) => reply_to.outgoing.send(answers).await.is_ok(),
        None => true,
    }
}
