//! What the listener runs the broker's commands through.

use std::future::Future;
use std::time::Duration;

use broker_core::{Command, EventBroker, Outcome};
use broker_proto::ErrorReply;

/// Runs the broker's commands for one Kafka connection: the server implements it with the same
/// path a native connection's requests take (validation, the log, waits, the cluster).
pub trait Backend: Send + Sync {
    /// Applies `command` and answers as the server answers a native request of it: a read
    /// that finds no record waits up to `max_wait` (bounded by the server's limit) for one.
    fn call(
        &self,
        command: Command,
        max_wait: Duration,
    ) -> impl Future<Output = Result<Outcome, ErrorReply>> + Send;

    /// Whether a connection must authenticate (SASL/PLAIN) before anything but the API
    /// versions.
    fn requires_authentication(&self) -> bool;

    /// Whether `password` authenticates a connection (compared in constant time).
    fn authenticate(&self, password: &str) -> bool;
}

/// The broker in memory, in this process, as a backend: each command applied at once (a read
/// that finds nothing answers at once), with no authentication. For tests and tools that serve
/// Kafka's clients without a server.
impl Backend for EventBroker {
    async fn call(&self, command: Command, _max_wait: Duration) -> Result<Outcome, ErrorReply> {
        self.apply(command).map_err(ErrorReply::from)
    }

    fn requires_authentication(&self) -> bool {
        false
    }

    fn authenticate(&self, _password: &str) -> bool {
        true
    }
}
