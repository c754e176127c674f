//! `broker bench publish --wire`: publish requests written to the socket as frames, with no
//! typed client in between, to measure the server alone, as `redis-benchmark` measures Redis.
//!
//! Each connection keeps `depth` requests in flight: it writes what is missing in one write,
//! waits for a response, takes every response already read, and writes again. The server
//! answers non-waiting requests in order (proto.md), so send times queue in request order.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::time::Instant;

use anyhow::{bail, Context};
use broker_client::{Command, Outcome};
use broker_proto::{
    ClientCodec, ClientHandshakeCodec, Decoded, Hello, HelloReply, RequestFrame, ResponseFrame,
    PROTOCOL_VERSION,
};
use futures::{FutureExt, SinkExt, StreamExt};
use hdrhistogram::Histogram;
use tokio::net::TcpStream;
use tokio_util::codec::Framed;

use super::load::{encode_payload, new_histogram, Producer};

/// The largest frame this load generator reads: responses to publishes are a few bytes.
const MAX_FRAME: usize = 1 << 20;

/// Publishes the producer's share over a connection of its own to `addr`, presenting
/// `auth_token`; returns the latency of every request.
pub(crate) async fn produce(
    addr: &str,
    auth_token: Option<String>,
    p: Producer,
) -> anyhow::Result<Histogram<u64>> {
    let mut connection = connect(addr, auth_token).await?;
    let mut latency = new_histogram();
    // (correlation id, send time) of the requests in flight, oldest first.
    let mut in_flight: VecDeque<(u64, Instant)> = VecDeque::with_capacity(p.depth);
    let mut next = 0u64;
    loop {
        let stop = p.deadline.is_some_and(|d| Instant::now() >= d);
        while !stop && in_flight.len() < p.depth && next < p.share {
            let sent = Instant::now();
            let nanos = u64::try_from(sent.saturating_duration_since(p.shared.start).as_nanos())
                .unwrap_or(u64::MAX);
            let command = Command::Publish {
                topic: p.topic.clone(),
                partition: ((u64::from(p.index) + next) % p.partitions as u64) as i32,
                payload: encode_payload(p.size, p.index, next, nanos),
            };
            // Correlation id 0 means "unreadable request" in responses: ids start at 1.
            connection
                .feed(RequestFrame {
                    correlation_id: next + 1,
                    max_wait_ms: 0,
                    command,
                })
                .await?;
            in_flight.push_back((next + 1, sent));
            next += 1;
        }
        SinkExt::<RequestFrame>::flush(&mut connection).await?;
        if in_flight.is_empty() {
            return Ok(latency);
        }
        let first = connection.next().await;
        let mut response = Some(first);
        while let Some(answer) = response {
            let frame = match answer {
                Some(Ok(Decoded::Message(frame))) => frame,
                Some(Ok(Decoded::Malformed { reason, .. })) => {
                    bail!("undecodable response: {reason}")
                }
                Some(Err(error)) => return Err(error).context("reading responses"),
                None => bail!("the server closed the connection"),
            };
            let (id, sent) = in_flight.pop_front().context("a response to no request")?;
            account(&p, id, sent, frame, &mut latency)?;
            // Every response already read, without waiting for more.
            response = if in_flight.is_empty() {
                None
            } else {
                connection.next().now_or_never()
            };
        }
    }
}

/// Counts one response to the publish `id` sent at `sent`.
fn account(
    p: &Producer,
    id: u64,
    sent: Instant,
    frame: ResponseFrame,
    latency: &mut Histogram<u64>,
) -> anyhow::Result<()> {
    if frame.correlation_id != id {
        bail!(
            "response {} where {id} was due: the server answered out of order",
            frame.correlation_id
        );
    }
    let nanos = u64::try_from(sent.elapsed().as_nanos()).unwrap_or(u64::MAX);
    let _ = latency.record(nanos.max(1));
    let counter = match frame.result {
        Ok(Outcome::Published(offset)) if offset >= 0 => &p.shared.published,
        Ok(Outcome::Published(_)) => &p.shared.refused,
        Ok(other) => bail!("unexpected answer to a publish: {other:?}"),
        Err(refusal) => bail!("the server refused a publish: {refusal}"),
    };
    counter.fetch_add(1, Ordering::Relaxed);
    p.shared.requests.fetch_add(1, Ordering::Relaxed);
    Ok(())
}

/// Opens a connection and exchanges hellos (proto.md, section 3).
async fn connect(
    addr: &str,
    auth_token: Option<String>,
) -> anyhow::Result<Framed<TcpStream, ClientCodec>> {
    let stream = broker_net::connect(addr)
        .await
        .with_context(|| format!("cannot connect to {addr}"))?;
    stream.set_nodelay(true)?;
    let mut handshake = Framed::new(stream, ClientHandshakeCodec::new(MAX_FRAME));
    handshake
        .send(Hello::new("broker bench --wire", auth_token))
        .await?;
    match handshake.next().await {
        Some(Ok(Decoded::Message(HelloReply::Welcome { version, .. })))
            if version == PROTOCOL_VERSION => {}
        Some(Ok(Decoded::Message(HelloReply::Welcome { version, .. }))) => {
            bail!("the server speaks protocol version {version}, not {PROTOCOL_VERSION}")
        }
        Some(Ok(Decoded::Message(HelloReply::Refused(reply)))) => {
            bail!("the server refused the connection: {reply}")
        }
        Some(Ok(Decoded::Malformed { reason, .. })) => bail!(
            "this port does not speak the broker's protocol: is it the broker's client port \
             (--listen)? (undecodable hello reply: {reason})"
        ),
        Some(Err(error)) => return Err(error).context("reading the hello reply"),
        None => bail!("the server closed the connection before answering the hello"),
    }
    Ok(handshake.map_codec(|codec| codec.retype()))
}
