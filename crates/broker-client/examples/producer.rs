//! A producer: four tasks send keyed orders through one `Producer`, which batches them per
//! partition, stores each exactly once and answers each with where it was stored. Run it with a
//! server listening on 127.0.0.1:9092 (or at `BROKER_ADDR`), with how many records to send
//! (10,000 by default) and the topic (`orders` by default):
//!
//! ```sh
//! cargo run --release --bin broker-server -- --listen 127.0.0.1:9092 &
//! cargo run --example producer -p broker-client -- 100000 orders
//! ```

use std::time::{Duration, Instant};

use broker_client::{Client, KeyHash, Producer, PublishRecord, Retention, TopicSetting};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let addr = std::env::var("BROKER_ADDR").unwrap_or_else(|_| "127.0.0.1:9092".to_owned());
    let count: usize = match std::env::args().nth(1) {
        Some(count) => count.parse()?,
        None => 10_000,
    };
    let topic = std::env::args()
        .nth(2)
        .unwrap_or_else(|| "orders".to_owned());
    let client = Client::connect(addr.as_str()).await?;
    // Limits retention keeps the newest records whether or not anyone consumed them, so the
    // example never fills a partition; `broker create` offers the same settings.
    let limits = [TopicSetting::Retention(Retention::Limits)];
    client
        .create_topic(&topic, 3, KeyHash::default(), &limits)
        .await?;
    let producer = Producer::builder()
        .delivery_timeout(Duration::from_secs(30))
        .build(client);

    let started = Instant::now();
    let tasks: Vec<_> = (0..4)
        .map(|task| {
            let producer = producer.clone();
            let topic = topic.clone();
            tokio::spawn(async move {
                // Queue every send at once: they are batched as soon as they are called, and
                // the records of one customer keep their order.
                let sends: Vec<_> = (0..count / 4)
                    .map(|i| {
                        let customer = format!("customer-{}", i % 100);
                        let order = format!("order {task}-{i}");
                        producer.send(
                            &topic,
                            PublishRecord::keyed(Some(customer.as_bytes()), order),
                        )
                    })
                    .collect();
                futures::future::try_join_all(sends).await
            })
        })
        .collect();
    let mut stored = 0;
    for task in tasks {
        stored += task.await??.len();
    }
    producer.flush().await;
    let elapsed = started.elapsed();
    println!(
        "producer {:016x} stored {stored} records in {elapsed:.2?} ({:.0} records/s)",
        producer.id(),
        stored as f64 / elapsed.as_secs_f64()
    );
    Ok(())
}
