//! The server's counters and histograms, updated where things happen (requests, connections,
//! bytes, records, expired sessions, fsyncs) when the metrics endpoint is on (see `exporter`,
//! which serves them with what the broker holds). Without `--metrics-listen` there is no
//! [`Metrics`] and nothing is counted.

use std::sync::Arc;
use std::time::Duration;

use broker_core::{CommandKind, Outcome};
use broker_proto::ErrorReply;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::{Registry, Unit};
use strum::IntoEnumIterator;

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
    latency_family: Family<CommandLabels, Histogram, fn() -> Histogram>,
    /// The histograms of `latency_family`, indexed by `CommandKind as usize`.
    latency: Vec<Histogram>,
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
    fsync: Histogram,
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

/// Latency buckets from 20 µs to about 2.6 s, doubling.
fn latency_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.000_02, 2.0, 18))
}

impl Default for Metrics {
    fn default() -> Self {
        let commands: Vec<String> = CommandKind::iter()
            .map(|kind| snake_case(kind.name()))
            .collect();
        let requests_family = Family::<CommandLabels, Counter>::default();
        let latency_family =
            Family::<CommandLabels, Histogram, fn() -> Histogram>::new_with_constructor(
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
    /// A request of `kind` was answered with `result`, `elapsed` after it arrived; `None` for
    /// one that waited for records (its time is mostly the wait the client asked for, so it is
    /// left out of the latency histogram).
    pub(crate) fn answered(
        &self,
        kind: CommandKind,
        result: &Result<Outcome, ErrorReply>,
        elapsed: Option<Duration>,
    ) {
        let index = kind as usize;
        if let Some(requests) = self.requests.get(index) {
            requests.inc();
        }
        if let (Some(latency), Some(elapsed)) = (self.latency.get(index), elapsed) {
            latency.observe(elapsed.as_secs_f64());
        }
        match result {
            Ok(outcome) => {
                let counts = outcome.record_counts();
                for (counter, count) in [
                    (&self.published, counts.published),
                    (&self.refused, counts.refused),
                    (&self.delivered, counts.delivered),
                    (&self.acknowledged, counts.acknowledged),
                    (&self.retried, counts.retried),
                ] {
                    if count > 0 {
                        counter.inc_by(count);
                    }
                }
            }
            Err(refusal) => {
                let command = self.commands.get(index).cloned().unwrap_or_default();
                self.errors
                    .get_or_create(&[("command", command), ("error", snake_case(refusal.name()))])
                    .inc();
            }
        }
    }

    /// A request did not decode.
    pub(crate) fn malformed(&self) {
        self.malformed.inc();
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
        self.fsync.observe(took.as_secs_f64());
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
    fn command_names_are_snake_case() {
        assert_eq!(snake_case("PublishBatch"), "publish_batch");
        assert_eq!(snake_case("Ack"), "ack");
    }
}
