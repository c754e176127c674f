//! The README's client example: create a topic, publish by key, consume in ack mode, and see a
//! typed broker error. Run it with a server listening on 127.0.0.1:9092:
//!
//! ```sh
//! cargo run --release --bin broker-server -- --listen 127.0.0.1:9092 &
//! cargo run --example quickstart -p broker-client
//! ```

use std::time::Duration;

use broker_client::{BrokerError, Client, Error};

#[tokio::main]
async fn main() -> Result<(), Error> {
    let client = Client::connect("127.0.0.1:9092").await?;
    client.create("orders", 3).await?;
    let (partition, offset) = client
        .publish_keyed("orders", Some(b"alice"), "hello")
        .await?;
    println!("stored at {partition}@{offset}");

    // Ack mode: one in-flight record per partition, acknowledged when done.
    client.join("orders", "billing", "billing-1").await?;
    let records = client
        .poll_wait("orders", "billing", "billing-1", 64, Duration::from_secs(5))
        .await?;
    for record in &records {
        println!(
            "{}@{}: {:?}",
            record.partition, record.offset, record.payload
        );
        client
            .ack(
                "orders",
                "billing",
                "billing-1",
                record.partition,
                record.offset,
            )
            .await?;
    }

    // Broker errors are typed: the network form of the seed's invalid-argument exception.
    match client.create("not a valid name!", 1).await {
        Err(Error::Broker(BrokerError::InvalidArgument(why))) => println!("refused: {why}"),
        other => println!("unexpected: {other:?}"),
    }
    Ok(())
}
