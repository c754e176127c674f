//! The server's counters and histograms, updated where things happen (requests, connections,
//! bytes, records, expired sessions, fsyncs) when the metrics endpoint is on (see `exporter`,
//! which serves them with what the broker holds). Without `--metrics-listen` there is no
//! [`Metrics`] and nothing is counted.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use broker_core::{CommandKind, Outcome};
use broker_proto::ErrorReply;
use prometheus_client::encoding::{EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::{MetricType, TypedMetric};
use prometheus_client::registry::{Registry, Unit};
use strum::{EnumCount, IntoEnumIterator};

/// Labels of a per-command metric: `[("command", "publish_batch")]`.
type CommandLabels = [(&'static str, String); 1];

/// Labels of a request error: the command and the error's kind.
type ErrorLabels = [(&'static str, String); 2];

/// Labels of a refused connection: why.
type ReasonLabels = [(&'static str, &'static str); 1];

/// Why a connection may be refused before its first request: the `reason` label's values.
pub(crate) const REFUSAL_REASONS: [&str; 5] = [
    "unauthenticated",
    "unsupported_protocol",
    "hello_too_large",
    "no_hello",
    "tls_handshake",
];

/// The server's counters and histograms: cheap to update (an atomic add, or a short lock for a
/// histogram), shared by every task.
#[derive(Debug)]
pub(crate) struct Metrics {
    /// The commands' names, snake case, indexed by `CommandKind as usize`.
    commands: Vec<String>,
    /// Requests by command.
    requests_family: Family<CommandLabels, Counter>,
    /// The counters of `requests_family`, indexed by `CommandKind as usize`.
    requests: Vec<Counter>,
    /// Seconds from a request's arrival to its answer, by command.
    latency_family: Family<CommandLabels, LatencyHistogram, fn() -> LatencyHistogram>,
    /// The histograms of `latency_family`, indexed by `CommandKind as usize`.
    latency: Vec<LatencyHistogram>,
    /// Requests refused, by command and error kind.
    errors: Family<ErrorLabels, Counter>,
    /// Requests that did not decode.
    malformed: Counter,
    /// Connections open now.
    connections_open: Gauge,
    /// Connections accepted, in all.
    connections: Counter,
    /// Connections refused before their first request, by reason.
    connections_refused: Family<ReasonLabels, Counter>,
    /// Bytes read from clients.
    bytes_in: Counter,
    /// Bytes written to clients.
    bytes_out: Counter,
    /// Records stored by publishes.
    published: Counter,
    /// Records publishes refused (`-1`).
    refused: Counter,
    /// Records handed to consumers.
    delivered: Counter,
    /// Deliveries acknowledged.
    acknowledged: Counter,
    /// Deliveries released for redelivery by a retry.
    retried: Counter,
    /// Members removed because their session timed out.
    sessions_expired: Counter,
    /// Seconds each fsync of the log took.
    fsync: LatencyHistogram,
}

/// `PublishBatch` as `publish_batch`.
fn snake_case(name: &str) -> String {
    let mut snake = String::with_capacity(name.len() + 4);
    for (index, letter) in name.chars().enumerate() {
        if letter.is_ascii_uppercase() && index > 0 {
            snake.push('_');
        }
        snake.push(letter.to_ascii_lowercase());
    }
    snake
}

/// Upper bounds of the latency buckets in seconds: 20 µs to about 2.6 s, doubling.
const LATENCY_BOUNDS: [f64; 18] = [
    0.000_02, 0.000_04, 0.000_08, 0.000_16, 0.000_32, 0.000_64, 0.001_28, 0.002_56, 0.005_12,
    0.010_24, 0.020_48, 0.040_96, 0.081_92, 0.163_84, 0.327_68, 0.655_36, 1.310_72, 2.621_44,
];

fn latency_histogram() -> LatencyHistogram {
    LatencyHistogram::default()
}

/// A histogram of durations over [`LATENCY_BOUNDS`], updated without a lock and many
/// observations of the same duration at once (a batch of requests answered together): the
/// histogram of `prometheus-client` takes a lock for every observation, which costs throughput
/// when every request is timed. Clones share their counts.
#[derive(Debug, Clone, Default)]
pub(crate) struct LatencyHistogram {
    inner: Arc<HistogramCounts>,
}

/// The counts of a [`LatencyHistogram`]: one per bucket (the last for anything longer), and
/// the sum in nanoseconds.
#[derive(Debug, Default)]
struct HistogramCounts {
    buckets: [AtomicU64; LATENCY_BOUNDS.len() + 1],
    sum_nanos: AtomicU64,
}

impl LatencyHistogram {
    /// `count` observations of `took`.
    pub(crate) fn observe_n(&self, took: Duration, count: u64) {
        let seconds = took.as_secs_f64();
        let bucket = LATENCY_BOUNDS
            .iter()
            .position(|&bound| seconds <= bound)
            .unwrap_or(LATENCY_BOUNDS.len());
        self.inner.buckets[bucket].fetch_add(count, Ordering::Relaxed);
        let nanos = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
        self.inner
            .sum_nanos
            .fetch_add(nanos.saturating_mul(count), Ordering::Relaxed);
    }
}

impl TypedMetric for LatencyHistogram {
    const TYPE: MetricType = MetricType::Histogram;
}

impl EncodeMetric for LatencyHistogram {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        let counts: Vec<u64> = self
            .inner
            .buckets
            .iter()
            .map(|bucket| bucket.load(Ordering::Relaxed))
            .collect();
        // The last bucket is everything longer: its bound is +Inf, written as f64::MAX.
        let buckets: Vec<(f64, u64)> = LATENCY_BOUNDS
            .iter()
            .copied()
            .chain(std::iter::once(f64::MAX))
            .zip(counts.iter().copied())
            .collect();
        let sum = self.inner.sum_nanos.load(Ordering::Relaxed) as f64 / 1e9;
        encoder.encode_histogram::<NoLabelSet>(sum, counts.iter().sum(), &buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        Self::TYPE
    }
}

impl Default for Metrics {
    fn default() -> Self {
        let commands: Vec<String> = CommandKind::iter()
            .map(|kind| snake_case(kind.name()))
            .collect();
        let requests_family = Family::<CommandLabels, Counter>::default();
        let latency_family =
            Family::<CommandLabels, LatencyHistogram, fn() -> LatencyHistogram>::new_with_constructor(
                latency_histogram,
            );
        // Every command's series exists from the start (at zero), and its counter and
        // histogram are kept by index: a request updates them without a map lookup.
        let requests = commands
            .iter()
            .map(|name| {
                requests_family
                    .get_or_create(&[("command", name.clone())])
                    .clone()
            })
            .collect();
        let latency = commands
            .iter()
            .map(|name| {
                latency_family
                    .get_or_create(&[("command", name.clone())])
                    .clone()
            })
            .collect();
        Metrics {
            commands,
            requests_family,
            requests,
            latency_family,
            latency,
            errors: Family::default(),
            malformed: Counter::default(),
            connections_open: Gauge::default(),
            connections: Counter::default(),
            connections_refused: {
                let reasons = Family::<ReasonLabels, Counter>::default();
                // Every reason's series exists from the start, at zero, for alerts.
                for reason in REFUSAL_REASONS {
                    drop(reasons.get_or_create(&[("reason", reason)]));
                }
                reasons
            },
            bytes_in: Counter::default(),
            bytes_out: Counter::default(),
            published: Counter::default(),
            refused: Counter::default(),
            delivered: Counter::default(),
            acknowledged: Counter::default(),
            retried: Counter::default(),
            sessions_expired: Counter::default(),
            fsync: latency_histogram(),
        }
    }
}

impl Metrics {
    /// Requests answered together (a batch), each with its kind (`None` for one that did not
    /// decode) and result, `elapsed` after they arrived; `None` for requests that waited for
    /// records (their time is mostly the wait the client asked for, so it is left out of the
    /// latency histogram). Each counter is updated once per batch.
    pub(crate) fn answered<'a>(
        &self,
        answered: impl IntoIterator<Item = (Option<CommandKind>, &'a Result<Outcome, ErrorReply>)>,
        elapsed: Option<Duration>,
    ) {
        let mut per_kind = [0u64; CommandKind::COUNT];
        let mut malformed = 0;
        let mut records = [0u64; 5];
        for (kind, result) in answered {
            let Some(kind) = kind else {
                malformed += 1;
                continue;
            };
            per_kind[kind as usize] += 1;
            match result {
                Ok(outcome) => {
                    let counts = outcome.record_counts();
                    let each = [
                        counts.published,
                        counts.refused,
                        counts.delivered,
                        counts.acknowledged,
                        counts.retried,
                    ];
                    for (total, count) in records.iter_mut().zip(each) {
                        *total += count;
                    }
                }
                Err(refusal) => {
                    let command = self.commands[kind as usize].clone();
                    self.errors
                        .get_or_create(&[
                            ("command", command),
                            ("error", snake_case(refusal.name())),
                        ])
                        .inc();
                }
            }
        }
        for (index, &count) in per_kind.iter().enumerate().filter(|(_, &count)| count > 0) {
            self.requests[index].inc_by(count);
            if let Some(elapsed) = elapsed {
                self.latency[index].observe_n(elapsed, count);
            }
        }
        let counters = [
            &self.published,
            &self.refused,
            &self.delivered,
            &self.acknowledged,
            &self.retried,
        ];
        for (counter, &count) in counters.into_iter().zip(&records) {
            if count > 0 {
                counter.inc_by(count);
            }
        }
        if malformed > 0 {
            self.malformed.inc_by(malformed);
        }
    }

    /// A connection was accepted; the guard counts it open until dropped.
    pub(crate) fn connection_opened(self: &Arc<Self>) -> OpenConnection {
        self.connections.inc();
        self.connections_open.inc();
        OpenConnection(Arc::clone(self))
    }

    /// A connection was refused before its first request, for `reason`.
    pub(crate) fn connection_refused(&self, reason: &'static str) {
        self.connections_refused
            .get_or_create(&[("reason", reason)])
            .inc();
    }

    /// The byte counters: read from clients, written to them.
    pub(crate) fn byte_counters(&self) -> (Counter, Counter) {
        (self.bytes_in.clone(), self.bytes_out.clone())
    }

    /// `count` members were removed because their sessions timed out.
    pub(crate) fn sessions_expired(&self, count: u64) {
        self.sessions_expired.inc_by(count);
    }

    /// An fsync of the log took `took`.
    pub(crate) fn fsynced(&self, took: Duration) {
        self.fsync.observe_n(took, 1);
    }

    /// A registry of these metrics (the exporter adds what it reads from the broker).
    pub(crate) fn registry(&self) -> Registry {
        let mut registry = Registry::with_prefix("broker");
        registry.register(
            "requests",
            "Requests answered, by command",
            self.requests_family.clone(),
        );
        registry.register_with_unit(
            "request_duration",
            "Time from a request's arrival to its answer, including an fsync it waits for, by \
             command (requests that waited for records are not included)",
            Unit::Seconds,
            self.latency_family.clone(),
        );
        registry.register(
            "request_errors",
            "Requests refused, by command and error kind",
            self.errors.clone(),
        );
        registry.register(
            "malformed_requests",
            "Requests that did not decode (answered with malformed_request)",
            self.malformed.clone(),
        );
        registry.register(
            "connections_open",
            "Client connections open now",
            self.connections_open.clone(),
        );
        registry.register(
            "connections",
            "Client connections accepted",
            self.connections.clone(),
        );
        registry.register(
            "connections_refused",
            "Connections refused before their first request, by reason",
            self.connections_refused.clone(),
        );
        registry.register_with_unit(
            "received",
            "Bytes read from clients",
            Unit::Bytes,
            self.bytes_in.clone(),
        );
        registry.register_with_unit(
            "sent",
            "Bytes written to clients",
            Unit::Bytes,
            self.bytes_out.clone(),
        );
        for (name, help, counter) in [
            (
                "records_published",
                "Records stored by publishes",
                &self.published,
            ),
            (
                "records_refused",
                "Records publishes refused (answered -1: a full partition that refuses new \
                 records, the memory budget, a topic's byte limit)",
                &self.refused,
            ),
            (
                "records_delivered",
                "Records handed to consumers by polls, fetches and redeliveries",
                &self.delivered,
            ),
            (
                "records_acknowledged",
                "Deliveries acknowledged",
                &self.acknowledged,
            ),
            (
                "records_retried",
                "Deliveries released for redelivery by a retry",
                &self.retried,
            ),
            (
                "sessions_expired",
                "Members removed because their session timed out",
                &self.sessions_expired,
            ),
        ] {
            registry.register(name, help, counter.clone());
        }
        registry.register_with_unit(
            "fsync_duration",
            "Time each fsync of the log took (with a data directory)",
            Unit::Seconds,
            self.fsync.clone(),
        );
        registry
    }
}

/// Counts a connection open for as long as it lives.
#[derive(Debug)]
pub(crate) struct OpenConnection(Arc<Metrics>);

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.0.connections_open.dec();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_of_observations_lands_in_one_bucket_and_adds_to_the_sum() {
        let histogram = LatencyHistogram::default();
        histogram.observe_n(Duration::from_micros(30), 3);
        histogram.observe_n(Duration::from_secs(10), 1);
        let counts: Vec<u64> = histogram
            .inner
            .buckets
            .iter()
            .map(|bucket| bucket.load(Ordering::Relaxed))
            .collect();
        assert_eq!(
            counts[1], 3,
            "30 µs is in the bucket up to 40 µs: {counts:?}"
        );
        assert_eq!(
            counts[LATENCY_BOUNDS.len()],
            1,
            "past the last bound: {counts:?}"
        );
        assert_eq!(counts.iter().sum::<u64>(), 4);
        let sum = histogram.inner.sum_nanos.load(Ordering::Relaxed);
        assert_eq!(sum, 90_000 + 10_000_000_000);
    }

    #[test]
    fn command_names_are_snake_case() {
        assert_eq!(snake_case("PublishBatch"), "publish_batch");
        assert_eq!(snake_case("Ack"), "ack");
    }
}
