//! An ack-mode worker: a `Consumer` in group `billing` of topic `orders` that handles each record
//! and acknowledges it, or asks for it again when handling fails. Start several to share the
//! partitions; each prints its partitions when the group rebalances. It rides out server
//! restarts by itself; Ctrl-C leaves the group. Run the producer example first:
//!
//! ```sh
//! cargo run --example worker -p broker-client
//! ```

use broker_client::{Client, Consumer, Delivery};
use futures::StreamExt;

/// Handles one order; an order whose payload says "fail" fails.
async fn handle(delivery: &Delivery) -> Result<(), String> {
    let order = String::from_utf8_lossy(&delivery.payload);
    if order.contains("fail") {
        return Err(format!("cannot bill {order}"));
    }
    println!("{}@{}: billed {order}", delivery.partition, delivery.offset);
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), broker_client::Error> {
    let addr = std::env::var("BROKER_ADDR").unwrap_or_else(|_| "127.0.0.1:9092".to_owned());
    let client = Client::connect(addr.as_str()).await?;
    let mut consumer = Consumer::builder("orders", "billing").start(client).await?;
    println!("{} joined billing", consumer.member());

    let mut status = consumer.status();
    tokio::spawn(async move {
        while status.changed().await.is_ok() {
            let now = status.borrow_and_update().clone();
            match now.reconnecting {
                Some(why) => println!("lost the server ({why}); reconnecting"),
                None => println!("partitions now {:?}", now.assignment),
            }
        }
    });

    let mut records = consumer.stream();
    // One signal future for the whole loop, so that a Ctrl-C while a record is handled counts.
    let mut interrupted = std::pin::pin!(tokio::signal::ctrl_c());
    loop {
        let delivery = tokio::select! {
            next = records.next() => match next {
                Some(delivery) => delivery?,
                None => break,
            },
            _ = &mut interrupted => break,
        };
        match handle(&delivery).await {
            Ok(()) => {
                delivery.ack().await?;
            }
            Err(why) => {
                println!("{why}: delivered again later");
                delivery.retry().await?;
            }
        }
    }
    drop(records);
    consumer.close().await
}
