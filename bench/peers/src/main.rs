//! `peers`: end-to-end consumer-group throughput of Redis Streams and NATS JetStream, the
//! counterparts of `broker bench ack` and `broker bench fetch`, from compiled clients on one
//! thread (as `broker bench --threads 1`). Producers publish `--records` records of `--size`
//! bytes with `--depth` publishes in flight each; consumers read batches of `--batch` and
//! acknowledge them. Prints one JSON object: records/s published AND acknowledged (published
//! only, with `--consumers 0`).
//!
//!   peers redis --port 6379 --records 1000000 --producers 2 --consumers 2 --batch 100
//!   peers nats --port 4222 --records 1000000 --producers 2 --consumers 2 --batch 100

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use bytes::Bytes;
use clap::{Args, Parser, Subcommand};
use futures::StreamExt;

#[derive(Parser)]
struct Cli {
    #[command(subcommand)]
    server: Server,
}

#[derive(Subcommand)]
enum Server {
    /// Redis Streams: XADD pipelined by --depth; XREADGROUP COUNT --batch, one XACK per batch
    /// sent with the next read.
    Redis(Load),
    /// NATS JetStream: asynchronous publishes, --depth acknowledgements awaited at a time; a
    /// durable pull consumer with explicit acks, fetching --batch messages at a time.
    Nats(Load),
}

#[derive(Args, Clone)]
struct Load {
    /// The server's port on 127.0.0.1.
    #[arg(long)]
    port: u16,
    #[arg(long, default_value_t = 200_000)]
    records: u64,
    #[arg(long, default_value_t = 100)]
    size: usize,
    #[arg(long, default_value_t = 1)]
    producers: u64,
    #[arg(long, default_value_t = 1)]
    consumers: u64,
    #[arg(long, default_value_t = 64)]
    depth: u64,
    #[arg(long, default_value_t = 100)]
    batch: usize,
    /// Give up after this many seconds (every load here stops by itself).
    #[arg(long, default_value_t = 300)]
    limit_secs: u64,
}

impl Load {
    /// How many records producer `index` publishes.
    fn share(&self, index: u64) -> u64 {
        self.records / self.producers + u64::from(index < self.records % self.producers)
    }
}

const STREAM: &str = "bench-e2e";
const GROUP: &str = "bench";

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let (load, elapsed) = runtime.block_on(async {
        match cli.server {
            Server::Redis(load) => {
                let limit = Duration::from_secs(load.limit_secs);
                let elapsed = tokio::time::timeout(limit, redis_load(&load))
                    .await
                    .context("the run took longer than --limit-secs")??;
                anyhow::Ok((load, elapsed))
            }
            Server::Nats(load) => {
                let limit = Duration::from_secs(load.limit_secs);
                let elapsed = tokio::time::timeout(limit, nats_load(&load))
                    .await
                    .context("the run took longer than --limit-secs")??;
                anyhow::Ok((load, elapsed))
            }
        }
    })?;
    println!(
        "{}",
        serde_json::json!({
            "records": load.records,
            "elapsed_secs": elapsed.as_secs_f64(),
            "records_per_sec": load.records as f64 / elapsed.as_secs_f64(),
        })
    );
    Ok(())
}

async fn redis_load(load: &Load) -> anyhow::Result<Duration> {
    use redis::streams::{StreamReadOptions, StreamReadReply};
    use redis::AsyncCommands;

    let client = redis::Client::open(format!("redis://127.0.0.1:{}/", load.port))?;
    let connect = || client.get_multiplexed_async_connection();
    let mut admin = connect().await?;
    let _: () = admin.del(STREAM).await?;
    let _: () = admin.xgroup_create_mkstream(STREAM, GROUP, "0").await?;
    let acked = Arc::new(AtomicU64::new(0));
    let payload = Bytes::from(vec![b'x'; load.size]);
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for index in 0..load.producers {
        let (mut connection, payload, share, depth) =
            (connect().await?, payload.clone(), load.share(index), load.depth);
        tasks.spawn(async move {
            let mut sent = 0;
            while sent < share {
                let n = depth.min(share - sent);
                let mut pipe = redis::pipe();
                for _ in 0..n {
                    pipe.cmd("XADD")
                        .arg(STREAM)
                        .arg("*")
                        .arg("f")
                        .arg(payload.as_ref())
                        .ignore();
                }
                let () = pipe.query_async(&mut connection).await?;
                sent += n;
            }
            anyhow::Ok(())
        });
    }
    for index in 0..load.consumers {
        let (mut connection, acked, total, batch) =
            (connect().await?, Arc::clone(&acked), load.records, load.batch);
        tasks.spawn(async move {
            let name = format!("c{index}");
            let options = StreamReadOptions::default()
                .group(GROUP, &name)
                .count(batch)
                .block(100);
            let mut pending: Vec<String> = Vec::new();
            while acked.load(Ordering::SeqCst) < total {
                let mut pipe = redis::pipe();
                if !pending.is_empty() {
                    pipe.xack(STREAM, GROUP, &pending);
                }
                pipe.xread_options(&[STREAM], &[">"], &options);
                let (count, reply): (u64, Option<StreamReadReply>) = if pending.is_empty() {
                    let (reply,): (Option<StreamReadReply>,) =
                        pipe.query_async(&mut connection).await?;
                    (0, reply)
                } else {
                    pipe.query_async(&mut connection).await?
                };
                acked.fetch_add(count, Ordering::SeqCst);
                pending = reply
                    .into_iter()
                    .flat_map(|reply| reply.keys)
                    .flat_map(|key| key.ids)
                    .map(|entry| entry.id)
                    .collect();
            }
            anyhow::Ok(())
        });
    }
    while let Some(done) = tasks.join_next().await {
        done??;
    }
    let elapsed = started.elapsed();
    let _: () = admin.del(STREAM).await?;
    Ok(elapsed)
}

async fn nats_load(load: &Load) -> anyhow::Result<Duration> {
    use async_nats::jetstream::{self, consumer::pull, consumer::AckPolicy, stream};

    let url = format!("nats://127.0.0.1:{}", load.port);
    let client = async_nats::connect(&url).await?;
    let js = jetstream::new(client);
    let _ = js.delete_stream(STREAM).await;
    let stream = js
        .create_stream(stream::Config {
            name: STREAM.to_owned(),
            subjects: vec![format!("{STREAM}.>")],
            storage: stream::StorageType::Memory,
            ..Default::default()
        })
        .await?;
    let consumer: jetstream::consumer::PullConsumer = stream
        .create_consumer(pull::Config {
            durable_name: Some(GROUP.to_owned()),
            ack_policy: AckPolicy::Explicit,
            max_ack_pending: 100_000,
            ..Default::default()
        })
        .await?;
    let acked = Arc::new(AtomicU64::new(0));
    let payload = Bytes::from(vec![b'x'; load.size]);
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for index in 0..load.producers {
        let js = jetstream::new(async_nats::connect(&url).await?);
        let (payload, share, depth) = (payload.clone(), load.share(index), load.depth as usize);
        tasks.spawn(async move {
            let mut in_flight = std::collections::VecDeque::new();
            for _ in 0..share {
                if in_flight.len() >= depth {
                    let ack: jetstream::context::PublishAckFuture =
                        in_flight.pop_front().context("an acknowledgement in flight")?;
                    ack.await?;
                }
                in_flight.push_back(js.publish(format!("{STREAM}.{index}"), payload.clone()).await?);
            }
            for ack in in_flight {
                ack.await?;
            }
            anyhow::Ok(())
        });
    }
    for _ in 0..load.consumers {
        let (consumer, acked, total, batch) =
            (consumer.clone(), Arc::clone(&acked), load.records, load.batch);
        tasks.spawn(async move {
            while acked.load(Ordering::SeqCst) < total {
                let mut messages = consumer
                    .fetch()
                    .max_messages(batch)
                    .expires(Duration::from_millis(100))
                    .messages()
                    .await?;
                while let Some(message) = messages.next().await {
                    let message = message.map_err(|error| anyhow::anyhow!(error))?;
                    message.ack().await.map_err(|error| anyhow::anyhow!(error))?;
                    acked.fetch_add(1, Ordering::SeqCst);
                }
            }
            anyhow::Ok(())
        });
    }
    while let Some(done) = tasks.join_next().await {
        done??;
    }
    let elapsed = started.elapsed();
    if load.consumers > 0 && acked.load(Ordering::SeqCst) < load.records {
        bail!("not every record was acknowledged");
    }
    js.delete_stream(STREAM).await?;
    Ok(elapsed)
}
