//! A fetch-mode consumer: group `audit` of topic `orders` reads records in order, many at a time,
//! and commits its offsets every second and when it closes. It counts what it read and stops
//! after two seconds without a new record. Run the producer example first:
//!
//! ```sh
//! cargo run --example fetch -p broker-client
//! ```

use std::time::Duration;

use broker_client::{Client, ConsumeMode, Consumer, GroupSetting, StartAt};

#[tokio::main]
async fn main() -> Result<(), broker_client::Error> {
    let addr = std::env::var("BROKER_ADDR").unwrap_or_else(|_| "127.0.0.1:9092".to_owned());
    let client = Client::connect(addr.as_str()).await?;
    let mut consumer = Consumer::builder("orders", "audit")
        .mode(ConsumeMode::Fetch)
        .max_records(1_000)
        .max_wait(Duration::from_secs(2))
        .auto_commit(Some(Duration::from_secs(1)))
        // A new group reads everything retained (the default, said here to show where a
        // group's start is chosen); an existing one goes on from its committed offsets.
        .group_settings(vec![GroupSetting::StartAt(StartAt::Earliest)])
        .start(client)
        .await?;
    let mut read = 0u64;
    let mut bytes = 0u64;
    loop {
        let batch = consumer.next_batch().await?;
        if batch.is_empty() {
            break;
        }
        read += batch.len() as u64;
        bytes += batch
            .iter()
            .map(|record| record.payload.len() as u64)
            .sum::<u64>();
    }
    println!("read {read} records ({bytes} payload bytes); committing and leaving");
    consumer.close().await
}
