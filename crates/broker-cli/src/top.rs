//! `broker top`: a live view of a broker, refreshed every interval: per topic how fast records
//! arrive and what is retained, per group how fast it consumes, its lag and deliveries in
//! flight, and, from the server's metrics endpoint when given, connections and requests.
//!
//! Rates are differences between two samples an interval apart: records published are the
//! growth of the partitions' end offsets, records consumed the growth of the group's committed
//! offsets (a reset that moves them back counts as nothing consumed).

use std::collections::HashMap;
use std::io::IsTerminal;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use broker_client::{BrokerDescription, Client, KafkaGroupDescription};
use bytes::Bytes;
use comfy_table::{presets::NOTHING, Table};
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use serde::Serialize;

use crate::cli::TopArgs;
use crate::size::{human, with_thousands};

/// How long a scrape of the metrics endpoint may take.
const SCRAPE_TIMEOUT: Duration = Duration::from_secs(5);

/// What one look at the broker saw.
struct Sample {
    at: Instant,
    description: BrokerDescription,
    /// The consumer groups of Kafka's clients, whose members the broker's groups of the same
    /// names do not list.
    kafka: Vec<KafkaGroupDescription>,
    /// Sums of the metrics endpoint's series by name, when it was asked.
    metrics: Option<HashMap<String, f64>>,
}

/// One topic's line.
#[derive(Debug, Serialize)]
struct TopicRow {
    topic: String,
    partitions: usize,
    published_per_s: f64,
    records: u64,
    retained_bytes: u64,
}

/// One group's line.
#[derive(Debug, Serialize)]
struct GroupRow {
    topic: String,
    group: String,
    /// Its members consuming the topic: the broker's, or Kafka's clients' for a consumer
    /// group of theirs.
    members: usize,
    /// Whether its members are Kafka's clients.
    kafka: bool,
    consumed_per_s: f64,
    lag: i64,
    in_flight: usize,
}

/// What the server's metrics say, per second where it is a rate.
#[derive(Debug, Serialize)]
struct ServerRow {
    connections: u64,
    requests_per_s: f64,
    received_bytes_per_s: f64,
    sent_bytes_per_s: f64,
}

/// The view between two samples.
#[derive(Debug, Serialize)]
struct View {
    interval_s: f64,
    server: Option<ServerRow>,
    topics: Vec<TopicRow>,
    groups: Vec<GroupRow>,
}

/// Runs `broker top` against `client` until interrupted, `--count` views were shown, or (with
/// `--json`) one view was printed. Once the first look succeeded, a broker (or metrics
/// endpoint) that cannot be reached, as while its server restarts, is said once on standard
/// error and looked at again every interval; views resume from its first answer after that.
pub async fn run(client: &Client, args: TopArgs) -> anyhow::Result<()> {
    let mut before = sample(client, args.metrics.as_deref()).await?;
    let terminal = std::io::stdout().is_terminal() && !args.json;
    let mut shown = 0u64;
    let mut unreachable = false;
    loop {
        tokio::select! {
            () = tokio::time::sleep(args.interval) => {}
            _ = tokio::signal::ctrl_c() => return Ok(()),
        }
        let after = match sample(client, args.metrics.as_deref()).await {
            Ok(after) => after,
            Err(error) if !args.json && is_transient(&error) => {
                if !std::mem::replace(&mut unreachable, true) {
                    eprintln!(
                        "warning: {error:#}; trying again every {}",
                        humantime::format_duration(args.interval)
                    );
                }
                continue;
            }
            Err(error) => return Err(error),
        };
        if std::mem::take(&mut unreachable) {
            eprintln!("reachable again");
            // Rates over the gap would mix counts from before and after a restart: they are
            // measured from here.
            before = after;
            continue;
        }
        let view = view(&before, &after);
        if args.json {
            outln!("{}", serde_json::to_string(&view)?)?;
            return Ok(());
        }
        if terminal {
            // Clear the screen and go home, as top does.
            print!("\x1b[2J\x1b[H");
        } else if shown > 0 {
            outln!()?;
        }
        print!("{}", view_text(&view, &client.server_name()));
        shown += 1;
        if args.count.is_some_and(|count| shown >= count) {
            return Ok(());
        }
        before = after;
    }
}

/// Whether `error` (of a look at the broker) may pass by itself: the server or its metrics
/// endpoint could not be reached or did not answer in time, rather than refused the request.
fn is_transient(error: &anyhow::Error) -> bool {
    error.chain().any(|cause| {
        cause
            .downcast_ref::<broker_client::Error>()
            .is_some_and(broker_client::Error::is_retriable)
            || cause.is::<std::io::Error>()
            || cause.is::<tokio::time::error::Elapsed>()
            || cause.is::<hyper::Error>()
    })
}

/// Describes the broker and, with `metrics`, scrapes its endpoint.
async fn sample(client: &Client, metrics: Option<&str>) -> anyhow::Result<Sample> {
    let description = client.describe().await?;
    // (A view without them, when the server cannot say now, rather than a warning over the
    // screen: the next look asks again.)
    let kafka = crate::kafka_groups::kafka_groups(client)
        .await
        .unwrap_or_default();
    let metrics = match metrics {
        Some(addr) => Some(
            tokio::time::timeout(SCRAPE_TIMEOUT, scrape(addr))
                .await
                .with_context(|| format!("the metrics endpoint at {addr} did not answer"))??,
        ),
        None => None,
    };
    Ok(Sample {
        at: Instant::now(),
        description,
        kafka,
        metrics,
    })
}

/// `GET /metrics` from `addr` (`HOST:PORT`), as the sums of its series by metric name.
async fn scrape(addr: &str) -> anyhow::Result<HashMap<String, f64>> {
    let addr = broker_net::connect_address(addr)?;
    // Never keep a stopped server's port by reaching our own.
    let stream = broker_net::connect(&addr)
        .await
        .with_context(|| format!("cannot reach the metrics endpoint at {addr}"))?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .context("the metrics endpoint does not speak HTTP/1.1")?;
    tokio::spawn(connection);
    let request = hyper::Request::get("/metrics")
        .header(hyper::header::HOST, addr.as_str())
        .body(Empty::<Bytes>::new())?;
    let response = sender.send_request(request).await?;
    if !response.status().is_success() {
        bail!(
            "the metrics endpoint at {addr} answered {} (is it broker-server's --metrics-listen?)",
            response.status()
        );
    }
    let body = response.into_body().collect().await?.to_bytes();
    Ok(metric_sums(&String::from_utf8_lossy(&body)))
}

/// The samples of a metrics text summed by metric name (`broker_requests_total{...} 3` lines).
fn metric_sums(text: &str) -> HashMap<String, f64> {
    let mut sums = HashMap::new();
    for line in text.lines().filter(|line| !line.starts_with('#')) {
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let Ok(value) = value.parse::<f64>() else {
            continue;
        };
        let name = series.split('{').next().unwrap_or(series);
        *sums.entry(name.to_owned()).or_insert(0.0) += value;
    }
    sums
}

/// The view between `before` and `after`.
fn view(before: &Sample, after: &Sample) -> View {
    let seconds = after.at.duration_since(before.at).as_secs_f64().max(1e-3);
    let per_second =
        |now: i64, then: Option<i64>| then.map_or(0.0, |then| (now - then).max(0) as f64 / seconds);
    let mut topics = Vec::new();
    let mut groups = Vec::new();
    for topic in &after.description.topics {
        let earlier = before
            .description
            .topics
            .iter()
            .find(|old| old.name == topic.name);
        let ends = |t: &broker_client::TopicDescription| -> i64 {
            t.partitions.iter().map(|p| p.end_offset).sum()
        };
        topics.push(TopicRow {
            topic: topic.name.clone(),
            partitions: topic.partitions.len(),
            published_per_s: per_second(ends(topic), earlier.map(ends)),
            records: topic.records(),
            retained_bytes: topic.retained_bytes,
        });
        for group in &topic.groups {
            let committed = |g: &broker_client::GroupDescription| -> i64 {
                g.partitions.iter().map(|p| p.committed).sum()
            };
            let was = earlier
                .and_then(|t| t.groups.iter().find(|old| old.name == group.name))
                .map(committed);
            let kafka_group = crate::output::kafka_group_of(&after.kafka, &topic.name, group);
            groups.push(GroupRow {
                topic: topic.name.clone(),
                group: group.name.clone(),
                members: kafka_group
                    .as_ref()
                    .map_or(group.members.len(), |(kafka, members)| {
                        crate::output::kafka_member_count(kafka, members)
                    }),
                kafka: kafka_group.is_some(),
                consumed_per_s: per_second(committed(group), was),
                lag: group.lag(),
                in_flight: group.in_flight(),
            });
        }
    }
    let server = match (&before.metrics, &after.metrics) {
        (Some(then), Some(now)) => {
            let value =
                |sums: &HashMap<String, f64>, name: &str| sums.get(name).copied().unwrap_or(0.0);
            let rate = |name: &str| (value(now, name) - value(then, name)).max(0.0) / seconds;
            Some(ServerRow {
                // A gauge of whole connections, whatever the text's number format.
                connections: value(now, "broker_connections_open").max(0.0) as u64,
                requests_per_s: rate("broker_requests_total"),
                received_bytes_per_s: rate("broker_received_bytes_total"),
                sent_bytes_per_s: rate("broker_sent_bytes_total"),
            })
        }
        _ => None,
    };
    View {
        interval_s: seconds,
        server,
        topics,
        groups,
    }
}

/// A rate as a whole number with separators: `1,234/s`.
fn rate_text(per_second: f64) -> String {
    format!("{}/s", with_thousands(per_second.round() as u64))
}

/// Bytes in decimal units alone: `2.04 kB`.
fn bytes_text(bytes: u64) -> String {
    let text = human(bytes);
    match text.split_once(" (") {
        Some((decimal, _)) => decimal.to_owned(),
        None => text,
    }
}

/// The view as text: a server line, then a table of topics and one of groups.
fn view_text(view: &View, server_name: &str) -> String {
    let mut out = match &view.server {
        Some(server) => format!(
            "{server_name}: {} connection{} (this one included), {} requests, {} in, {} out\n",
            server.connections,
            if server.connections == 1 { "" } else { "s" },
            rate_text(server.requests_per_s),
            bytes_text(server.received_bytes_per_s.round() as u64) + "/s",
            bytes_text(server.sent_bytes_per_s.round() as u64) + "/s",
        ),
        None => format!(
            "{server_name} (connections and requests: start the server with --metrics-listen \
             and pass its address with --metrics)\n"
        ),
    };
    if view.topics.is_empty() {
        out.push_str("no topics\n");
        return out;
    }
    let mut topics = Table::new();
    topics.load_preset(NOTHING).set_header(vec![
        "TOPIC",
        "PARTITIONS",
        "PUBLISHED",
        "RECORDS",
        "RETAINED",
    ]);
    for row in &view.topics {
        topics.add_row(vec![
            row.topic.clone(),
            row.partitions.to_string(),
            rate_text(row.published_per_s),
            with_thousands(row.records),
            bytes_text(row.retained_bytes),
        ]);
    }
    out.push_str(&format!("\n{topics}\n"));
    if !view.groups.is_empty() {
        let mut groups = Table::new();
        groups.load_preset(NOTHING).set_header(vec![
            "TOPIC",
            "GROUP",
            "MEMBERS",
            "CONSUMED",
            "LAG",
            "IN FLIGHT",
        ]);
        for row in &view.groups {
            groups.add_row(vec![
                row.topic.clone(),
                row.group.clone(),
                match row.kafka {
                    true => format!("{} (Kafka)", row.members),
                    false => row.members.to_string(),
                },
                rate_text(row.consumed_per_s),
                with_thousands(row.lag.max(0) as u64),
                row.in_flight.to_string(),
            ]);
        }
        out.push_str(&format!("\n{groups}\n"));
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use serde_json::json;

    #[test]
    fn metric_text_is_summed_by_name() {
        let sums = metric_sums(
            "# HELP broker_requests_total Requests.\n\
             broker_requests_total{command=\"ack\"} 3\n\
             broker_requests_total{command=\"poll\"} 4\n\
             broker_connections_open 2\n",
        );
        assert_eq!(sums["broker_requests_total"], 7.0);
        assert_eq!(sums["broker_connections_open"], 2.0);
    }

    #[test]
    fn rates_are_growth_per_second_and_never_negative() {
        let description = |end: i64, committed: i64| -> BrokerDescription {
            serde_json::from_value(json!({
                "capacity_per_partition": 100,
                "topics": [{
                    "name": "t", "key_hash": "Murmur2", "settings": [], "retained_bytes": 0,
                    "partitions": [{"partition": 0, "earliest_offset": 0, "end_offset": end,
                                    "records": 0, "retained_bytes": 0,
                                    "earliest_timestamp_ms": null}],
                    "groups": [{"name": "g", "assignor": "RoundRobin", "settings": [],
                                "members": [], "partitions": [{"partition": 0, "owner": null,
                                "committed": committed, "position": committed,
                                "in_flight": null, "lag": end - committed, "deliveries": 0,
                                "skipped": 0}]}]
                }]
            }))
            .unwrap()
        };
        let at = Instant::now();
        let before = Sample {
            at,
            description: description(10, 8),
            kafka: Vec::new(),
            metrics: None,
        };
        let after = Sample {
            at: at + Duration::from_secs(2),
            description: description(30, 4),
            kafka: Vec::new(),
            metrics: None,
        };
        let view = serde_json::to_value(view(&before, &after)).unwrap();
        assert_eq!(view["topics"][0]["published_per_s"], json!(10.0));
        // A reset moved the committed offset back: nothing was consumed.
        assert_eq!(view["groups"][0]["consumed_per_s"], json!(0.0));
        assert_eq!(view["groups"][0]["lag"], json!(26));
        assert_eq!(view["server"], json!(null));
    }
}
