//! Group churn, for BENCHMARKS.md: a member joins a new group of topic `churn` and leaves it
//! again, `GROUPS` times (10,000 by default), `IN_FLIGHT` pairs at a time on one connection
//! (500 by default). Every group stays on the topic after its member left, so the topic holds
//! more groups at each step; it prints the pairs per second over each band of 2,000 groups, to
//! show whether a join costs more on a topic with more groups. Against a server started with
//! `--max-groups-per-topic` above `GROUPS`; creates `churn` (1 partition) and deletes it at the
//! end.
//!
//! ```sh
//! broker-server --max-groups-per-topic 100000 2>server.log &
//! cargo run --release --example join_leave -p broker-client -- 20000 500
//! ```

use std::time::Instant;

use broker_client::Client;
use futures::future::try_join_all;

/// Groups per band of the report.
const BAND: u64 = 2_000;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let groups: u64 = args.next().map_or(Ok(10_000), |a| a.parse())?;
    let in_flight: u64 = args.next().map_or(Ok(500), |a| a.parse())?;
    if in_flight == 0 {
        return Err("IN_FLIGHT must be at least 1".into());
    }
    let addr = std::env::var("BROKER_ADDR").unwrap_or_else(|_| "127.0.0.1:9092".to_owned());
    let client = Client::connect(addr.as_str()).await?;
    client.create("churn", 1).await?;
    let mut band_start = Instant::now();
    let (mut done, mut reported) = (0, 0);
    while done < groups {
        let round = (done..groups.min(done + in_flight)).map(|n| {
            let client = &client;
            async move {
                let group = format!("g{n}");
                client.join("churn", &group, "m").await?;
                client.leave("churn", &group, "m").await
            }
        });
        try_join_all(round).await?;
        done = groups.min(done + in_flight);
        if done - reported >= BAND || done == groups {
            let rate = (done - reported) as f64 / band_start.elapsed().as_secs_f64();
            println!("groups {reported:>6} to {done:>6}: {rate:>9.0} pairs/s");
            (reported, band_start) = (done, Instant::now());
        }
    }
    client.delete_topic("churn").await?;
    Ok(())
}
