//! What the listener's unit tests share.

use std::time::Duration;

use broker_core::{Command, EventBroker, Outcome, TopicDescription};
use broker_proto::ErrorReply;

use crate::Backend;

/// The broker in memory as a backend a test shapes: behind a token, or standing for a cluster
/// with a node of an earlier release.
pub(crate) struct Shaped {
    /// The broker.
    pub(crate) broker: EventBroker,
    /// The token connections must authenticate with, if any.
    token: Option<&'static str>,
    /// The newest protocol version whose commands every node takes.
    speaks_up_to: u16,
}

impl Shaped {
    /// The broker behind the token `secret`: connections must authenticate.
    pub(crate) fn locked(broker: EventBroker) -> Shaped {
        Shaped {
            broker,
            token: Some("secret"),
            speaks_up_to: u16::MAX,
        }
    }

    /// The broker as a cluster with a node of the release before protocol version `version`:
    /// the commands that version added are never sent to it (a test fails if one is).
    pub(crate) fn before(broker: EventBroker, version: u16) -> Shaped {
        Shaped {
            broker,
            token: None,
            speaks_up_to: version - 1,
        }
    }
}

impl Backend for Shaped {
    async fn call(&self, command: Command, max_wait: Duration) -> Result<Outcome, ErrorReply> {
        assert!(
            command.since_version() <= self.speaks_up_to,
            "{command:?} sent to a node of an earlier release"
        );
        self.broker.call(command, max_wait).await
    }

    async fn speaks(&self, version: u16) -> bool {
        version <= self.speaks_up_to
    }

    async fn topics(&self) -> Result<Vec<TopicDescription>, ErrorReply> {
        self.broker.topics().await
    }

    fn cluster(&self) -> Option<crate::ClusterView> {
        None
    }

    fn coordinates_groups(&self) -> bool {
        true
    }

    fn requires_authentication(&self) -> bool {
        self.token.is_some()
    }

    fn authenticate(&self, password: &str) -> bool {
        self.token == Some(password)
    }
}

/// The methods of a [`Backend`] over the broker in memory in `self.broker`, alone (no cluster,
/// no token): for test backends that change only how calls are made.
macro_rules! alone_in_memory {
    () => {
        async fn topics(&self) -> Result<Vec<TopicDescription>, ErrorReply> {
            self.broker.topics().await
        }

        fn cluster(&self) -> Option<crate::ClusterView> {
            None
        }

        fn coordinates_groups(&self) -> bool {
            true
        }

        fn requires_authentication(&self) -> bool {
            false
        }

        fn authenticate(&self, _password: &str) -> bool {
            true
        }
    };
}

pub(crate) use alone_in_memory;

/// `assignment` as a Kafka consumer group's leader encodes it for SyncGroup at `version`
/// (with some user data after it).
pub(crate) fn consumer_assignment(version: i16, assignment: &[(&str, &[i32])]) -> bytes::Bytes {
    use kafka_protocol::messages::consumer_protocol_assignment::TopicPartition;
    use kafka_protocol::messages::{ConsumerProtocolAssignment, TopicName};
    use kafka_protocol::protocol::{Encodable, StrBytes};
    let message = ConsumerProtocolAssignment::default()
        .with_assigned_partitions(
            assignment
                .iter()
                .map(|(topic, partitions)| {
                    TopicPartition::default()
                        .with_topic(TopicName(StrBytes::from_string((*topic).to_owned())))
                        .with_partitions(partitions.to_vec())
                })
                .collect(),
        )
        .with_user_data(Some(bytes::Bytes::from_static(b"user data")));
    let mut bytes = version.to_be_bytes().to_vec();
    message
        .encode(&mut bytes, version)
        .expect("an assignment encodes");
    bytes.into()
}
