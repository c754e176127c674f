//! What the listener's unit tests share.

use std::time::Duration;

use broker_core::{Command, EventBroker, Outcome, TopicDescription};
use broker_proto::ErrorReply;

use crate::Backend;

/// The broker in memory behind the token `secret`: connections must authenticate.
pub(crate) struct Locked(pub(crate) EventBroker);

impl Backend for Locked {
    async fn call(&self, command: Command, max_wait: Duration) -> Result<Outcome, ErrorReply> {
        self.0.call(command, max_wait).await
    }

    async fn topics(&self) -> Result<Vec<TopicDescription>, ErrorReply> {
        self.0.topics().await
    }

    fn cluster(&self) -> Option<crate::ClusterView> {
        None
    }

    fn coordinates_groups(&self) -> bool {
        true
    }

    fn requires_authentication(&self) -> bool {
        true
    }

    fn authenticate(&self, password: &str) -> bool {
        password == "secret"
    }
}
