//! The metrics endpoint (`--metrics-listen`): [`Metrics`] and what the broker holds, in
//! Prometheus's text format at `/metrics` over HTTP/1.1.
//!
//! What the broker holds (per partition: offsets, records and bytes retained; per group and
//! partition: committed offset, lag, deliveries in flight; the memory budget) is read from the
//! state at each scrape, so a deleted topic or group leaves no stale series behind. Labels are
//! commands, error kinds, topics, partitions and groups: bounded by the broker's limits on
//! topics, partitions and groups.
//!
//! The registry encodes OpenMetrics, which Prometheus asks for first; a scraper that does not
//! (`curl`, `promtool check metrics`, older collectors) gets the classic text format 0.0.4,
//! whose counters are named with their `_total` suffix in `# HELP` and `# TYPE` as well.

use std::sync::{Arc, Weak};

use broker_cluster::Cluster;
use broker_core::{BrokerDescription, GroupDescription, TopicDescription};
use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::{Registry, Unit};
use tokio::net::TcpListener;

use crate::metrics::Metrics;
use crate::process_metrics::{gauge, single_gauge, ProcessCollector, ResourcesCollector};
use crate::shared::Shared;

/// The content type of the OpenMetrics text format, which Prometheus asks for first.
const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The content type of Prometheus's classic text format.
const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Reads what the broker holds at each scrape: per partition, per group and partition, and the
/// memory budget.
#[derive(Debug)]
struct StateCollector {
    /// The server; gone once it shut down (then nothing is reported).
    shared: Weak<Shared>,
}

/// One gauge family written by [`StateCollector`]: its name, help and samples.
struct GaugeFamily<L> {
    name: &'static str,
    help: &'static str,
    unit: Option<Unit>,
    samples: Vec<(L, i64)>,
}

impl<L: prometheus_client::encoding::EncodeLabelSet> GaugeFamily<L> {
    fn new(name: &'static str, help: &'static str, unit: Option<Unit>) -> Self {
        GaugeFamily {
            name,
            help,
            unit,
            samples: Vec::new(),
        }
    }

    fn encode(&self, encoder: &mut DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let mut family = encoder.encode_descriptor(
            self.name,
            self.help,
            self.unit.as_ref(),
            MetricType::Gauge,
        )?;
        for (labels, value) in &self.samples {
            ConstGauge::new(*value).encode(family.encode_family(labels)?)?;
        }
        Ok(())
    }
}

/// Labels of a partition's series.
type PartitionLabels = [(&'static str, String); 2];

/// Labels of a group's partition's series.
type GroupLabels = [(&'static str, String); 3];

impl Collector for StateCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Some(shared) = self.shared.upgrade() else {
            return Ok(());
        };
        // Each shard's figures under one lock of it, so that they agree with each other.
        let mut budget = None;
        let mut used = 0;
        let (mut moved, mut refused) = (0, 0);
        let mut description = BrokerDescription::default();
        let mut placement = GaugeFamily::new(
            "topic_shard",
            "The shard that holds the topic (always 0 for a broker of one shard; in a cluster \
             of several groups, the group's number less one).",
            None,
        );
        for (shard, broker) in shared.shards.all().iter().enumerate() {
            // A group this node gave its copy of up (a cluster with fewer replicas than
            // nodes) stays in its memory until it is dropped, a few seconds later: its topics
            // are told by the nodes that hold it.
            let gave_up = shard > 0 && shared.group(shard).is_some_and(|group| !group.is_member());
            let broker = broker.lock();
            let (shard_budget, shard_used) = broker.memory();
            budget = match (budget, shard_budget) {
                (None, shard) => shard,
                (Some(total), shard) => Some(total + shard.unwrap_or(0)),
            };
            used += shard_used;
            let (shard_moved, shard_refused) = broker.dead_lettered();
            moved += shard_moved;
            refused += shard_refused;
            if gave_up {
                continue;
            }
            let held = broker.describe();
            description.capacity_per_partition = held.capacity_per_partition;
            for topic in &held.topics {
                placement
                    .samples
                    .push(([("topic", topic.name.clone())], gauge(shard as u64)));
            }
            description.topics.extend(held.topics);
        }
        placement.samples.sort_by(|a, b| a.0.cmp(&b.0));
        description.topics.sort_by(|a, b| a.name.cmp(&b.name));
        for (name, help, count) in [
            (
                "records_dead_lettered",
                "Records moved to a group's dead-letter topic after their last delivery.",
                moved,
            ),
            (
                "records_dead_letter_refused",
                "Times a record past its last delivery could not be moved to its dead-letter \
                 topic (it is delivered again instead; each attempt counts).",
                refused,
            ),
        ] {
            let counter = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
            ConstCounter::new(count).encode(counter)?;
        }
        let mut end = GaugeFamily::new(
            "partition_end_offset",
            "Offset the next record published to the partition gets.",
            None,
        );
        let mut earliest = GaugeFamily::new(
            "partition_earliest_offset",
            "Offset of the oldest record the partition retains.",
            None,
        );
        let mut records =
            GaugeFamily::new("partition_records", "Records the partition retains.", None);
        let mut bytes = GaugeFamily::new(
            "partition_retained",
            "Payload, key and header bytes the partition retains.",
            Some(Unit::Bytes),
        );
        let mut committed = GaugeFamily::new(
            "group_committed_offset",
            "The group's committed offset on the partition.",
            None,
        );
        let mut lag = GaugeFamily::new(
            "group_lag",
            "Records of the partition the group has yet to consume.",
            None,
        );
        let mut in_flight = GaugeFamily::new(
            "group_in_flight",
            "Records of the partition delivered to the group and not yet acknowledged (ack \
             mode: 0 or 1).",
            None,
        );
        let mut members = GaugeFamily::new("group_members", "Members of the group.", None);
        for topic in &description.topics {
            for partition in &topic.partitions {
                let labels: PartitionLabels = [
                    ("topic", topic.name.clone()),
                    ("partition", partition.partition.to_string()),
                ];
                end.samples.push((labels.clone(), partition.end_offset));
                earliest
                    .samples
                    .push((labels.clone(), partition.earliest_offset));
                records
                    .samples
                    .push((labels.clone(), gauge(partition.records)));
                bytes
                    .samples
                    .push((labels, gauge(partition.retained_bytes)));
            }
            for group in &topic.groups {
                let labels: [(&'static str, String); 2] =
                    [("topic", topic.name.clone()), ("group", group.name.clone())];
                members
                    .samples
                    .push((labels, gauge(group.members.len() as u64)));
                for row in &group.partitions {
                    let labels = group_labels(topic, group, row.partition);
                    committed.samples.push((labels.clone(), row.committed));
                    lag.samples.push((labels.clone(), row.lag));
                    in_flight
                        .samples
                        .push((labels, i64::from(row.in_flight.is_some())));
                }
            }
        }
        for family in [&end, &earliest, &records, &bytes] {
            family.encode(&mut encoder)?;
        }
        for family in [&committed, &lag, &in_flight] {
            family.encode(&mut encoder)?;
        }
        members.encode(&mut encoder)?;
        placement.encode(&mut encoder)?;
        // Only a broker without a data directory keeps every record in memory, under a budget.
        if let Some(budget) = budget {
            single_gauge(
                &mut encoder,
                "memory_used",
                "Bytes retained in memory as --max-memory counts them: payload, key and header \
                 bytes, and 80 bytes for each record.",
                Some(Unit::Bytes),
                gauge(used),
            )?;
            single_gauge(
                &mut encoder,
                "memory_budget",
                "The most bytes retained in memory (--max-memory).",
                Some(Unit::Bytes),
                gauge(budget),
            )?;
        }
        if let Some(cluster) = shared.cluster() {
            encode_cluster(&mut encoder, cluster)?;
            encode_groups(&mut encoder, &shared)?;
        }
        Ok(())
    }
}

/// The node's view of its cluster: its role, the term, the indexes of its log, and on the
/// leader how far each node has the log.
fn encode_cluster(
    encoder: &mut DescriptorEncoder,
    cluster: &Cluster,
) -> Result<(), std::fmt::Error> {
    let status = cluster.status();
    for (name, help, value) in [
        (
            "cluster_leader",
            "1 on the node that leads the cluster now (and has heard from a majority), else 0.",
            // From the same view as the leader's id: a leader without its lease is a follower
            // there.
            i64::from(status.leader == Some(status.node_id)),
        ),
        (
            "cluster_leader_id",
            "The id of the node this node knows as the leader (0 when it knows none).",
            gauge(status.leader.unwrap_or(0)),
        ),
        ("cluster_term", "The current term.", gauge(status.term)),
        (
            "cluster_last_log_index",
            "The index of the last entry of this node's log (-1 when empty).",
            log_index(status.last_log_index),
        ),
        (
            "cluster_applied_index",
            "The index of the last entry applied to this node's broker (-1 before any).",
            log_index(status.applied_index),
        ),
    ] {
        single_gauge(encoder, name, help, None, value)?;
    }
    let mut replicated = GaugeFamily::new(
        "cluster_replicated_index",
        "On the leader: the index of the last entry each node is known to have (-1 before any).",
        None,
    );
    for (node, matched) in &status.replication {
        replicated
            .samples
            .push(([("node", node.to_string())], log_index(*matched)));
    }
    replicated.encode(encoder)?;
    let mut reachable = GaugeFamily::new(
        "cluster_peer_reachable",
        "1 for another member whose last exchange with this node succeeded (or that this node \
         has not needed yet), 0 for one it cannot reach now.",
        None,
    );
    for (node, _, _) in status
        .members
        .iter()
        .filter(|(node, _, _)| *node != status.node_id)
    {
        let up = !status.unreachable.contains(node);
        reachable
            .samples
            .push(([("node", node.to_string())], i64::from(up)));
    }
    reachable.encode(encoder)
}

/// Each group this node holds a copy of, in a cluster of several groups (`--cluster-data-groups`): its
/// leader, term and log indexes as this node sees them and, on the group's leader, how far each
/// member has its log. (The first group's are also [`encode_cluster`]'s, unlabelled.)
fn encode_groups(encoder: &mut DescriptorEncoder, shared: &Shared) -> Result<(), std::fmt::Error> {
    if shared.groups.is_empty() {
        return Ok(());
    }
    let mut leaders = GaugeFamily::new(
        "cluster_group_leader_id",
        "For each group this node holds a copy of: the id of the node this node knows as its leader (0 \
         when it knows none). The topics of shard n (broker_topic_shard) are group n + 1's.",
        None,
    );
    let mut terms = GaugeFamily::new(
        "cluster_group_term",
        "For each group this node holds a copy of: its current term.",
        None,
    );
    let mut last = GaugeFamily::new(
        "cluster_group_last_log_index",
        "For each group this node holds a copy of: the index of the last entry of this node's log of it \
         (-1 when empty).",
        None,
    );
    let mut applied = GaugeFamily::new(
        "cluster_group_applied_index",
        "For each group this node holds a copy of: the index of the last entry applied to this node's \
         copy (-1 before any).",
        None,
    );
    let mut replicated = GaugeFamily::new(
        "cluster_group_replicated_index",
        "On a group's leader: the index of the last entry of the group each member is known to \
         have (-1 before any).",
        None,
    );
    for shard in 0..shared.shards.all().len() {
        // (A group whose voters are other nodes is theirs to tell.)
        let Some(group) = shared
            .group(shard)
            .filter(|group| shard == 0 || group.is_member())
        else {
            continue;
        };
        let status = group.status();
        let id = group.group().to_string();
        let labels = [("group", id.clone())];
        leaders
            .samples
            .push((labels.clone(), gauge(status.leader.unwrap_or(0))));
        terms.samples.push((labels.clone(), gauge(status.term)));
        last.samples
            .push((labels.clone(), log_index(status.last_log_index)));
        applied
            .samples
            .push((labels, log_index(status.applied_index)));
        for (node, matched) in &status.replication {
            replicated.samples.push((
                [("group", id.clone()), ("node", node.to_string())],
                log_index(*matched),
            ));
        }
    }
    for family in [&leaders, &terms, &last, &applied] {
        family.encode(encoder)?;
    }
    replicated.encode(encoder)
}

/// A log index as a gauge: -1 for none.
fn log_index(index: Option<u64>) -> i64 {
    index.map_or(-1, gauge)
}

/// The labels of `group`'s series for `partition` of `topic`.
fn group_labels(topic: &TopicDescription, group: &GroupDescription, partition: i32) -> GroupLabels {
    [
        ("topic", topic.name.clone()),
        ("group", group.name.clone()),
        ("partition", partition.to_string()),
    ]
}

/// Serves `/metrics` on `listener` until the server shuts down: one task per scrape
/// connection (HTTP/1.1), each rendering the registry anew.
pub(crate) async fn serve(listener: TcpListener, shared: Arc<Shared>, metrics: Arc<Metrics>) {
    let mut registry = metrics.registry();
    registry.register_collector(Box::new(StateCollector {
        shared: Arc::downgrade(&shared),
    }));
    registry.register_collector(Box::new(ResourcesCollector::new(
        shared.request_memory.clone(),
        shared.config.data_dir.clone(),
    )));
    // The process's figures keep the names every exporter gives them, without the prefix.
    let mut process = Registry::default();
    process.register_collector(Box::new(ProcessCollector::new()));
    let renders = Arc::new(Renders {
        registries: [registry, process],
        last: std::sync::Mutex::new(Rendered::default()),
        started: std::sync::atomic::AtomicU64::new(0),
    });
    crate::http::serve(listener, shared, None, "metrics", move |request| {
        let renders = Arc::clone(&renders);
        async move {
            // Rendering takes the shards' locks and walks the data directory: on a thread of
            // its own, not on one of the runtime's workers.
            tokio::task::spawn_blocking(move || answer(&renders, &request))
                .await
                .unwrap_or_else(|_| {
                    plain(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        "cannot encode the metrics\n",
                    )
                })
        }
    })
    .await;
}

/// The registries, and the last rendering of them: renders are made one at a time, and the
/// requests that arrived while one was made share the next, so that however many clients ask
/// at once, the shards' locks are taken for one render at a time, and every answer is rendered
/// after its request arrived.
struct Renders {
    registries: [Registry; 2],
    /// Held while a render is made.
    last: std::sync::Mutex<Rendered>,
    /// How many renders were started.
    started: std::sync::atomic::AtomicU64,
}

/// A rendering of the registries as OpenMetrics text.
#[derive(Default)]
struct Rendered {
    /// Which render it was (from 1), by [`Renders::started`].
    number: u64,
    /// The text, or `None` if it could not be encoded.
    text: Option<Arc<str>>,
}

impl Renders {
    /// The registries rendered after now: by the next render, shared with every request that
    /// waits for it.
    fn render(&self) -> Option<Arc<str>> {
        use std::sync::atomic::Ordering::SeqCst;
        let asked_after = self.started.load(SeqCst);
        let mut last = self
            .last
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if last.number > asked_after {
            return last.text.clone();
        }
        let number = self.started.fetch_add(1, SeqCst) + 1;
        let mut text = String::new();
        let encoded = self
            .registries
            .iter()
            .try_for_each(|registry| {
                prometheus_client::encoding::text::encode_registry(&mut text, registry)
            })
            .and_then(|()| prometheus_client::encoding::text::encode_eof(&mut text));
        *last = Rendered {
            number,
            text: encoded.ok().map(|()| Arc::from(text)),
        };
        last.text.clone()
    }
}

/// The answer to one HTTP request: the metrics for `GET /metrics`, 404 or 405 otherwise.
fn answer(renders: &Renders, request: &Request<Incoming>) -> Response<Full<Bytes>> {
    if request.uri().path() != "/metrics" {
        return plain(
            StatusCode::NOT_FOUND,
            "not found: the metrics are at /metrics\n",
        );
    }
    if request.method() != Method::GET && request.method() != Method::HEAD {
        return plain(StatusCode::METHOD_NOT_ALLOWED, "only GET /metrics\n");
    }
    let Some(text) = renders.render() else {
        return plain(
            StatusCode::INTERNAL_SERVER_ERROR,
            "cannot encode the metrics\n",
        );
    };
    let accept: Vec<&str> = request
        .headers()
        .get_all(hyper::header::ACCEPT)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .collect();
    let openmetrics = prefers_openmetrics(&accept.join(","));
    let (body, content_type) = if openmetrics {
        (text.to_string(), OPENMETRICS)
    } else {
        (classic_text(&text), PROMETHEUS_TEXT)
    };
    let mut response = Response::new(Full::new(Bytes::from(body)));
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static(content_type),
    );
    response
}

/// A plain-text answer with `status`.
fn plain(status: StatusCode, text: &str) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(text.to_owned())));
    *response.status_mut() = status;
    response
}

/// Whether an `Accept` header asks for OpenMetrics: it names `application/openmetrics-text` with
/// a quality above zero and at least that of any `text/plain` (or `*/*`) it names.
fn prefers_openmetrics(accept: &str) -> bool {
    let mut openmetrics = 0.0_f64;
    let mut text = 0.0_f64;
    for range in accept.split(',') {
        let mut parts = range.split(';').map(str::trim);
        let media = parts.next().unwrap_or_default().to_ascii_lowercase();
        let quality = parts
            .filter_map(|parameter| parameter.strip_prefix("q="))
            .find_map(|q| q.parse::<f64>().ok())
            .unwrap_or(1.0);
        match media.as_str() {
            "application/openmetrics-text" => openmetrics = openmetrics.max(quality),
            "text/plain" | "*/*" => text = text.max(quality),
            _ => {}
        }
    }
    openmetrics > 0.0 && openmetrics >= text
}

/// OpenMetrics text as Prometheus's classic text format: a counter's `# HELP` and `# TYPE`
/// name its samples' name (with `_total`), and there are no `# UNIT` lines and no `# EOF`.
/// Everything else (samples, gauges, histograms, escaping) is the same in both.
fn classic_text(openmetrics: &str) -> String {
    let counters: std::collections::HashSet<&str> = openmetrics
        .lines()
        .filter_map(|line| line.strip_prefix("# TYPE ")?.strip_suffix(" counter"))
        .collect();
    let mut classic = String::with_capacity(openmetrics.len() + 16 * counters.len());
    for line in openmetrics.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        let described = ["# HELP ", "# TYPE "].into_iter().find_map(|prefix| {
            let rest = line.strip_prefix(prefix)?;
            let (name, tail) = rest.split_once(' ')?;
            counters
                .contains(name)
                .then(|| format!("{prefix}{name}_total {tail}"))
        });
        match described {
            Some(renamed) => classic.push_str(&renamed),
            None => classic.push_str(line),
        }
        classic.push('\n');
    }
    classic
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_request_alone_gets_a_render_made_after_it_arrived() {
        let renders = Renders {
            registries: [Registry::default(), Registry::default()],
            last: std::sync::Mutex::new(Rendered::default()),
            started: std::sync::atomic::AtomicU64::new(0),
        };
        assert!(renders.render().is_some());
        assert!(renders.render().is_some());
        // None was in progress when the second arrived: it made its own.
        assert_eq!(renders.started.load(std::sync::atomic::Ordering::SeqCst), 2);
    }

    #[test]
    fn openmetrics_is_served_when_it_is_preferred() {
        // What Prometheus sends.
        assert!(prefers_openmetrics(
            "application/openmetrics-text;version=1.0.0;q=0.5,text/plain;version=0.0.4;q=0.4,*/*;q=0.1"
        ));
        assert!(prefers_openmetrics("application/openmetrics-text"));
        assert!(!prefers_openmetrics(""));
        assert!(!prefers_openmetrics("*/*"));
        assert!(!prefers_openmetrics("application/openmetrics-text;q=0"));
        assert!(!prefers_openmetrics(
            "text/plain;q=1,application/openmetrics-text;q=0.1"
        ));
    }

    #[test]
    fn classic_text_names_counters_with_their_suffix_and_drops_what_it_lacks() {
        let openmetrics = "# HELP broker_requests Requests.\n\
                           # TYPE broker_requests counter\n\
                           broker_requests_total{command=\"ack\"} 3\n\
                           # HELP broker_sent_bytes Bytes.\n\
                           # TYPE broker_sent_bytes counter\n\
                           # UNIT broker_sent_bytes bytes\n\
                           broker_sent_bytes_total 10\n\
                           # HELP broker_group_lag Lag.\n\
                           # TYPE broker_group_lag gauge\n\
                           broker_group_lag{topic=\"t\"} 2\n\
                           # EOF\n";
        assert_eq!(
            classic_text(openmetrics),
            "# HELP broker_requests_total Requests.\n\
             # TYPE broker_requests_total counter\n\
             broker_requests_total{command=\"ack\"} 3\n\
             # HELP broker_sent_bytes_total Bytes.\n\
             # TYPE broker_sent_bytes_total counter\n\
             broker_sent_bytes_total 10\n\
             # HELP broker_group_lag Lag.\n\
             # TYPE broker_group_lag gauge\n\
             broker_group_lag{topic=\"t\"} 2\n"
        );
    }
}
