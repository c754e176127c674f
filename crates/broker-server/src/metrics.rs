//! The server's counters and histograms, updated where things happen (requests, connections,
//! bytes, records, expired sessions, fsyncs) when the metrics endpoint is on (see `exporter`,
//! which serves them with what the broker holds). Without `--metrics-listen` there is no
//! [`Metrics`] and nothing is counted.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use broker_core::{CommandKind, Outcome};
use broker_kafka::{ApiKey, ResponseError};
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

/// Labels of a connection or byte counter: the listener.
type ListenerLabels = [(&'static str, &'static str); 1];

/// Labels of a Kafka request counter: its API (`produce`, `fetch`, ...).
type ApiLabels = [(&'static str, String); 1];

/// Labels of a Kafka error counter: the API and the error (`message_too_large`, ...).
type ApiErrorLabels = [(&'static str, String); 2];

/// Which port a connection came in on: the `listener` label's values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Listener {
    /// The broker's own protocol (`--listen`).
    Broker,
    /// Kafka's wire protocol (`--kafka-listen`).
    Kafka,
}

impl Listener {
    const ALL: [Listener; 2] = [Listener::Broker, Listener::Kafka];

    fn labels(self) -> ListenerLabels {
        let name = match self {
            Listener::Broker => "broker",
            Listener::Kafka => "kafka",
        };
        [("listener", name)]
    }
}

/// Why a connection may be refused before its first request: the `reason` label's values.
pub(crate) const REFUSAL_REASONS: [&str; 6] = [
    "unauthenticated",
    "unsupported_protocol",
    "hello_too_large",
    "no_hello",
    "tls_handshake",
    "displaced",
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
    /// Connections open now, by listener.
    connections_open: Family<ListenerLabels, Gauge>,
    /// Connections accepted, in all, by listener.
    connections: Family<ListenerLabels, Counter>,
    /// Connections refused before their first request, by reason.
    connections_refused: Family<ReasonLabels, Counter>,
    /// Bytes read from clients, by listener.
    bytes_in: Family<ListenerLabels, Counter>,
    /// Bytes written to clients, by listener.
    bytes_out: Family<ListenerLabels, Counter>,
    /// Kafka requests answered, by API.
    kafka_requests: Family<ApiLabels, Counter>,
    /// The counters of `kafka_requests` of each API the listener serves (its key and name),
    /// then of `unknown`: a request updates its counter without building a label.
    kafka_apis: Vec<(Option<ApiKey>, String, Counter)>,
    /// Errors in Kafka answers (the request's own, its partitions', ...), by API and error.
    kafka_errors: Family<ApiErrorLabels, Counter>,
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
    /// Times a batch of publishes waited for the disk (records not yet written, or a checkpoint).
    held_back: Counter,
    /// Records read from segment files for deliveries before the lock was taken.
    read_ahead: Counter,
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

/// A family with each listener's series from the start, at zero.
fn per_listener<M: Default + Clone + prometheus_client::metrics::TypedMetric>(
) -> Family<ListenerLabels, M> {
    let family = Family::<ListenerLabels, M>::default();
    for listener in Listener::ALL {
        drop(family.get_or_create(&listener.labels()));
    }
    family
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
        // Every API's series exists from the start, at zero.
        let kafka_requests = Family::<ApiLabels, Counter>::default();
        Metrics {
            commands,
            requests_family,
            requests,
            latency_family,
            latency,
            errors: Family::default(),
            malformed: Counter::default(),
            connections_open: per_listener(),
            connections: per_listener(),
            connections_refused: {
                let reasons = Family::<ReasonLabels, Counter>::default();
                // Every reason's series exists from the start, at zero, for alerts.
                for reason in REFUSAL_REASONS {
                    drop(reasons.get_or_create(&[("reason", reason)]));
                }
                reasons
            },
            bytes_in: per_listener(),
            bytes_out: per_listener(),
            kafka_apis: broker_kafka::supported_apis()
                .iter()
                .map(|api| Some(api.key))
                .chain([None])
                .map(|api| {
                    let name = api.map_or_else(
                        || "unknown".to_owned(),
                        |api| snake_case(&format!("{api:?}")),
                    );
                    let counter = kafka_requests
                        .get_or_create(&[("api", name.clone())])
                        .clone();
                    (api, name, counter)
                })
                .collect(),
            kafka_requests,
            kafka_errors: Family::default(),
            published: Counter::default(),
            refused: Counter::default(),
            delivered: Counter::default(),
            acknowledged: Counter::default(),
            retried: Counter::default(),
            sessions_expired: Counter::default(),
            held_back: Counter::default(),
            read_ahead: Counter::default(),
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

    /// A connection was accepted on `listener`; the guard counts it open until dropped.
    pub(crate) fn connection_opened(self: &Arc<Self>, listener: Listener) -> OpenConnection {
        self.connections.get_or_create(&listener.labels()).inc();
        let open = self
            .connections_open
            .get_or_create(&listener.labels())
            .clone();
        open.inc();
        OpenConnection(open)
    }

    /// A connection was refused before its first request, for `reason`.
    pub(crate) fn connection_refused(&self, reason: &'static str) {
        self.connections_refused
            .get_or_create(&[("reason", reason)])
            .inc();
    }

    /// The byte counters of `listener`'s connections: read from clients, written to them.
    pub(crate) fn byte_counters(&self, listener: Listener) -> (Counter, Counter) {
        (
            self.bytes_in.get_or_create(&listener.labels()).clone(),
            self.bytes_out.get_or_create(&listener.labels()).clone(),
        )
    }

    /// A Kafka request of `api` (`None`: one the listener does not know) was answered, with
    /// `errors` in its answer.
    pub(crate) fn kafka_answered(&self, api: Option<ApiKey>, errors: &[ResponseError]) {
        // The last entry, `unknown`, counts what the listener does not serve.
        let Some((_, name, counter)) = self
            .kafka_apis
            .iter()
            .find(|(key, _, _)| *key == api)
            .or(self.kafka_apis.last())
        else {
            return;
        };
        counter.inc();
        for error in errors {
            self.kafka_errors
                .get_or_create(&[
                    ("api", name.clone()),
                    ("error", snake_case(&format!("{error:?}"))),
                ])
                .inc();
        }
    }

    /// `count` members were removed because their sessions timed out.
    pub(crate) fn sessions_expired(&self, count: u64) {
        self.sessions_expired.inc_by(count);
    }

    /// A batch of publishes waited for the disk (records held in memory past the budget).
    pub(crate) fn held_back(&self) {
        self.held_back.inc();
    }

    /// `count` records were read from segment files for a delivery before its lock was taken.
    pub(crate) fn read_ahead(&self, count: usize) {
        self.read_ahead.inc_by(count as u64);
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
            "Client connections open now, by listener (broker or kafka)",
            self.connections_open.clone(),
        );
        registry.register(
            "connections",
            "Client connections accepted, by listener (broker or kafka)",
            self.connections.clone(),
        );
        registry.register(
            "connections_refused",
            "Connections refused before their first request, by reason",
            self.connections_refused.clone(),
        );
        registry.register_with_unit(
            "received",
            "Bytes read from clients, by listener (broker or kafka)",
            Unit::Bytes,
            self.bytes_in.clone(),
        );
        registry.register_with_unit(
            "sent",
            "Bytes written to clients, by listener (broker or kafka)",
            Unit::Bytes,
            self.bytes_out.clone(),
        );
        registry.register(
            "kafka_requests",
            "Requests answered by the Kafka listener, by API (unknown: an API key or version \
             it does not serve)",
            self.kafka_requests.clone(),
        );
        registry.register(
            "kafka_errors",
            "Errors in the Kafka listener's answers (the request's own and each of its \
             topics', partitions', groups' and members'), by API and Kafka error",
            self.kafka_errors.clone(),
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
            (
                "publishes_held_back",
                "Waits of a batch of publishes for the disk (with a data directory: records not \
                 yet written to their segment files past half of what --max-memory lets memory \
                 hold, or with --fsync always, records held in memory past it while a checkpoint \
                 runs; with --shards, one per shard of the batch's topics that is over its part)",
                &self.held_back,
            ),
            (
                "records_read_ahead",
                "Records read from segment files for fetches and polls of group members \
                 (consumers of records that left memory, with a data directory) before the \
                 broker's lock was taken to apply them",
                &self.read_ahead,
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

/// Counts a connection open (in its listener's gauge) for as long as it lives.
#[derive(Debug)]
pub(crate) struct OpenConnection(Gauge);

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.0.dec();
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

    #[test]
    fn kafka_requests_and_errors_are_counted_by_api_and_error() {
        let metrics = Metrics::default();
        metrics.kafka_answered(Some(ApiKey::Produce), &[]);
        metrics.kafka_answered(
            Some(ApiKey::Produce),
            &[
                ResponseError::MessageTooLarge,
                ResponseError::MessageTooLarge,
            ],
        );
        metrics.kafka_answered(None, &[ResponseError::UnsupportedVersion]);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &metrics.registry()).unwrap();
        for line in [
            "broker_kafka_requests_total{api=\"produce\"} 2",
            "broker_kafka_requests_total{api=\"unknown\"} 1",
            "broker_kafka_errors_total{api=\"produce\",error=\"message_too_large\"} 2",
            "broker_kafka_errors_total{api=\"unknown\",error=\"unsupported_version\"} 1",
            "broker_connections_total{listener=\"kafka\"} 0",
            "broker_received_bytes_total{listener=\"broker\"} 0",
        ] {
            assert!(text.contains(line), "{line} in\n{text}");
        }
    }
}
