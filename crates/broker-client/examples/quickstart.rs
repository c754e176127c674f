//! The client example of docs/rust-client.md: create a topic, publish by key, consume in ack mode, and see a
//! typed broker error. Run it with a server listening on 127.0.0.1:9092 (or at `BROKER_ADDR`):
//!
//! ```sh
//! cargo run --release --bin broker-server -- --listen 127.0.0.1:9092 &
//! cargo run --example quickstart -p broker-client
//! ```

use std::time::Duration;

use broker_client::{BrokerError, Client, Error};

#[tokio::main]
async fn main() -> Result<(), Error> {
    let addr = std::env::var("BROKER_ADDR").unwrap_or_else(|_| "127.0.0.1:9092".to_owned());
    let client = Client::connect(addr.as_str()).await?;
    client.create("quickstart", 3).await?;
    // Join before publishing: records stay until every existing group has consumed them.
    client.join("quickstart", "billing", "billing-1").await?;

    let (partition, offset) = client
        .publish_keyed("quickstart", Some(b"alice"), "hello")
        .await?;
    if offset < 0 {
        println!("partition {partition} is full: nothing stored (consume first)");
    } else {
        println!("stored at {partition}@{offset}");
    }

    // Ack mode: one in-flight record per partition, acknowledged when done.
    let records = client
        .poll_wait(
            "quickstart",
            "billing",
            "billing-1",
            64,
            Duration::from_secs(5),
        )
        .await?;
    for record in &records {
        println!(
            "{}@{}: {:?}",
            record.partition, record.offset, record.payload
        );
        let (partition, offset) = (record.partition, record.offset);
        client
            .ack("quickstart", "billing", "billing-1", partition, offset)
            .await?;
    }
    client.leave("quickstart", "billing", "billing-1").await?;

    // Broker errors are typed: InvalidArgument for any bad input, and nothing changed.
    match client.create("not a valid name!", 1).await {
        Err(Error::Broker(BrokerError::InvalidArgument(why))) => println!("refused: {why}"),
        other => println!("unexpected: {other:?}"),
    }
    Ok(())
}
