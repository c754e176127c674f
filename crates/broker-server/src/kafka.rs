//! The Kafka listener (`--kafka-listen`): Kafka clients' connections, each served by
//! `broker_kafka`, whose commands take the path a native connection's requests take
//! (`server::submit`): the same validation, log, waits and metrics. In a cluster of several
//! groups, the coordinator's and controller's commands about a topic another node leads are
//! checked alike and applied at that node (see `Backend::call_anywhere`).

use std::sync::Arc;
use std::time::Duration;

use broker_cluster::NodeId;
use broker_core::{Command, Outcome, TopicDescription};
use broker_kafka::{ApiKey, Backend, ClusterView, KafkaError, KafkaSettings, ResponseError};
use broker_proto::{Decoded, ErrorReply, RequestFrame};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tracing::{debug, trace, warn};

use crate::arrivals::Arriving;
use crate::counted::Counted;
use crate::intake::{accept_tls, next_connection, submit};
use crate::metrics::Listener;
use crate::reply::{Outgoing, ReplyTo, RequestPermit};
use crate::shared::Shared;

/// How long every exchange with a node must have failed before Kafka's Metadata stops listing
/// it as a broker: more than a moment of load, less than a client's patience.
const BROKER_DOWN_AFTER: Duration = Duration::from_secs(5);

/// The broker id Metadata gives a server that runs alone.
const SINGLE_NODE_ID: i32 = 0;

/// The log directory DescribeLogDirs names for a server without a data directory.
const IN_MEMORY_LOG_DIR: &str = "(memory: no --data-dir)";

/// What Metadata answers as the cluster id.
const CLUSTER_ID: &str = "broker-server";

/// The listener's settings from the server's configuration: in a cluster, the node's id is its
/// broker id (`Config::check_kafka` made sure it is one).
fn settings(shared: &Shared) -> KafkaSettings {
    let node_id = shared
        .config
        .cluster
        .as_ref()
        .map_or(SINGLE_NODE_ID, |cluster| {
            i32::try_from(cluster.node_id).unwrap_or(SINGLE_NODE_ID)
        });
    KafkaSettings {
        node_id,
        cluster_id: CLUSTER_ID.to_owned(),
        advertise: shared.config.kafka_advertise.clone(),
        max_frame_bytes: shared.config.max_frame_bytes,
        max_record_bytes: shared.config.max_payload_bytes as u64,
        max_partitions: i32::try_from(shared.config.limits.max_partitions).unwrap_or(i32::MAX),
        log_dir: shared.config.data_dir.as_ref().map_or_else(
            || IN_MEMORY_LOG_DIR.to_owned(),
            |dir| dir.display().to_string(),
        ),
        auto_create_partitions: shared.config.kafka_auto_create_partitions,
        names: shared.config.names,
        idle_timeout: shared.config.idle_timeout,
        read_timeout: shared.config.read_timeout,
        write_timeout: shared.config.write_timeout,
    }
}

/// Accepts Kafka connections until the server shuts down, each holding one of the server's
/// connection slots (`connections`, shared with the broker's own listener).
pub(crate) async fn serve(shared: Arc<Shared>, listener: TcpListener, connections: Arc<Semaphore>) {
    let settings = Arc::new(settings(&shared));
    loop {
        let (stream, _, permit) = tokio::select! {
            () = shared.shutdown.cancelled() => return,
            next = next_connection(&shared, &listener, &connections) => match next {
                Some(next) => next,
                // The slots are never closed.
                None => return,
            },
        };
        let id = shared.new_connection_id();
        shared.tracker.spawn(handle(
            Arc::clone(&shared),
            Arc::clone(&settings),
            id,
            stream,
            permit,
        ));
    }
}

/// Serves one Kafka connection to its end. `_permit` is its connection slot.
async fn handle(
    shared: Arc<Shared>,
    settings: Arc<KafkaSettings>,
    id: u64,
    stream: TcpStream,
    _permit: OwnedSemaphorePermit,
) {
    let (Ok(peer), Ok(local)) = (stream.peer_addr(), stream.local_addr()) else {
        return;
    };
    trace!(peer = %peer, connection = id, "Kafka connection opened");
    let _open = shared
        .metrics
        .as_ref()
        .map(|metrics| metrics.connection_opened(Listener::Kafka));
    let counters = || {
        shared
            .metrics
            .as_ref()
            .map(|metrics| metrics.byte_counters(Listener::Kafka))
    };
    if let Err(cause) = stream.set_nodelay(true) {
        debug!(peer = %peer, cause = %cause, "cannot set TCP_NODELAY");
    }
    let backend = ServerBackend::new(Arc::clone(&shared), id);
    let closing = backend.closing.clone();
    // Until its first request reaches the broker, a new connection may be displaced by another
    // (which closes it).
    let backend = backend.arriving(shared.arrivals.arriving(id, closing.clone()));
    let addresses = (local, peer);
    let served = match &shared.config.tls {
        None => {
            broker_kafka::serve_connection(
                Counted::new(stream, counters()),
                addresses,
                &backend,
                &shared.kafka,
                &settings,
                shared.request_memory.clone(),
                closing.cancelled(),
            )
            .await
        }
        Some(tls) => {
            let Some(stream) = accept_tls(&shared, tls, stream, peer, &closing).await else {
                return;
            };
            broker_kafka::serve_connection(
                Counted::new(stream, counters()),
                addresses,
                &backend,
                &shared.kafka,
                &settings,
                shared.request_memory.clone(),
                closing.cancelled(),
            )
            .await
        }
    };
    // Requests still waiting answer at once, to nobody.
    closing.cancel();
    match served {
        Ok(requests) => debug!(peer = %peer, connection = id, requests, "Kafka connection closed"),
        Err(KafkaError::Foreign(foreign)) => {
            warn!(
                peer = %peer,
                "refusing a client speaking {} on the Kafka listener: {}",
                foreign.name(),
                foreign.where_to_go()
            );
            if let Some(metrics) = &shared.metrics {
                metrics.connection_refused("unsupported_protocol");
            }
        }
        Err(cause @ KafkaError::FrameTooLarge { .. }) => warn!(
            peer = %peer,
            cause = %cause,
            "closing a Kafka connection whose request is over the limit (--max-frame-bytes; 64 \
             KiB before it authenticates): keep the client's requests within it (a producer's \
             max.request.size or message.max.bytes)"
        ),
        Err(refusal @ (KafkaError::Unauthenticated | KafkaError::WrongPassword)) => {
            let cause = match refusal {
                KafkaError::WrongPassword => "a SASL/PLAIN password that is not the auth token",
                _ => "a request before SASL/PLAIN authentication with the auth token",
            };
            warn!(peer = %peer, cause, "refusing a Kafka connection");
            if let Some(metrics) = &shared.metrics {
                metrics.connection_refused("unauthenticated");
            }
        }
        Err(cause) => {
            debug!(peer = %peer, connection = id, cause = %cause, "Kafka connection closed")
        }
    }
}

/// The server behind one Kafka connection (or the console): each call is a request of a
/// connection of its own id, submitted as a native connection's are.
pub(crate) struct ServerBackend {
    shared: Arc<Shared>,
    connection: u64,
    /// Bounds the calls outstanding at once (waiting reads included).
    in_flight: Arc<Semaphore>,
    /// Cancelled when the connection ends or the server shuts down.
    closing: CancellationToken,
    /// A Kafka connection's note that it has not said who it is yet (see `arrivals`), dropped
    /// once a request past ApiVersions and authentication is answered; none for the console.
    arriving: std::sync::Mutex<Option<Arriving>>,
    /// Whether `arriving` is empty: read first, so that the lock is taken once, not at every
    /// request.
    arrived: std::sync::atomic::AtomicBool,
}

impl ServerBackend {
    /// This backend, noted as arriving until its first call (`arriving`).
    fn arriving(self, arriving: Arriving) -> ServerBackend {
        ServerBackend {
            arriving: std::sync::Mutex::new(Some(arriving)),
            arrived: std::sync::atomic::AtomicBool::new(false),
            ..self
        }
    }

    /// The server as connection `connection` reaches it: at most `--max-in-flight` calls at
    /// once, each answered at the latest when the server shuts down.
    pub(crate) fn new(shared: Arc<Shared>, connection: u64) -> ServerBackend {
        ServerBackend {
            in_flight: Arc::new(Semaphore::new(shared.config.max_in_flight)),
            closing: shared.shutdown.child_token(),
            arriving: std::sync::Mutex::new(None),
            arrived: std::sync::atomic::AtomicBool::new(true),
            connection,
            shared,
        }
    }
}

impl Backend for ServerBackend {
    async fn call(&self, command: Command, max_wait: Duration) -> Result<Outcome, ErrorReply> {
        let permit = Arc::clone(&self.in_flight)
            .acquire_owned()
            .await
            .map_err(|_| ErrorReply::ShuttingDown)?;
        // One answer comes back, from `submit` or from the task that answers a waiting read.
        let (outgoing, mut answers) = mpsc::channel(1);
        let reply_to = ReplyTo {
            connection: self.connection,
            outgoing,
            closing: self.closing.clone(),
            // A Kafka connection reads its next request once this one is answered: it holds
            // one frame, and no answer takes room (see `RequestPermit::counts_answers`).
            memory: self.shared.request_memory.clone(),
        };
        let frame = RequestFrame {
            correlation_id: 0,
            max_wait_ms: u32::try_from(max_wait.as_millis()).unwrap_or(u32::MAX),
            command,
        };
        if !submit(
            &self.shared,
            &reply_to,
            // The frame's room is held by the connection, which reads one request at a time.
            vec![(Decoded::Message(frame), RequestPermit::new(permit, None))],
        )
        .await
        {
            return Err(ErrorReply::ShuttingDown);
        }
        drop(reply_to);
        let answers = match answers.recv().await {
            Some(Outgoing::Ready(answers)) => answers,
            Some(Outgoing::Deferred(deferred)) => deferred.await,
            None => return Err(ErrorReply::ShuttingDown),
        };
        answers
            .responses
            .into_iter()
            .next()
            .map_or(Err(ErrorReply::ShuttingDown), |response| response.result)
    }

    async fn call_anywhere(&self, command: Command) -> Result<Outcome, ErrorReply> {
        let Some(group) = crate::data_groups::leader_elsewhere(&self.shared, &command) else {
            return self.call(command, Duration::ZERO).await;
        };
        // Checked and bounded as the connection's other calls are.
        let command = crate::dispatch::checked(&self.shared, command)?;
        crate::replicated::every_node_applies(&self.shared, std::slice::from_ref(&command)).await?;
        let _permit = Arc::clone(&self.in_flight)
            .acquire_owned()
            .await
            .map_err(|_| ErrorReply::ShuttingDown)?;
        crate::data_groups::apply_at_leader(&group, command).await
    }

    async fn speaks(&self, version: u16) -> bool {
        // The first group has every node.
        match self.shared.cluster() {
            Some(first) => first.check_commands(version).await.is_ok(),
            None => true,
        }
    }

    async fn topics(&self) -> Result<Vec<TopicDescription>, ErrorReply> {
        if self.shared.cluster().is_some() {
            // Any node answers Metadata, from its own copy of each group it holds one of (see
            // `Backend::topics`), and from the leader of each other group.
            let mut topics = Vec::new();
            for (shard, broker) in self.shared.shards.all().iter().enumerate() {
                match self.shared.group(shard) {
                    Some(group) if shard > 0 && !group.is_member() => {
                        // A group electing its leader now is left out of this answer: its
                        // topics' clients ask for the metadata again, as after any error.
                        match crate::data_groups::describe_group(&self.shared, shard, None).await {
                            Ok(description) => topics.extend(description.topics),
                            Err(refusal) => tracing::debug!(
                                %refusal,
                                group = group.group(),
                                "Metadata without the topics of a group whose leader did not answer"
                            ),
                        }
                    }
                    // A group this node does not host now (not yet, or while it drops its copy):
                    // left out, as one electing.
                    None if shard > 0 => {}
                    _ => topics.extend(broker.lock().describe().topics),
                }
            }
            topics.sort_by(|a, b| a.name.cmp(&b.name));
            // A topic moving is held by two groups for a moment, alike: listed once.
            topics.dedup_by(|a, b| a.name == b.name);
            return Ok(topics);
        }
        match self
            .call(Command::Describe { topic: None }, Duration::ZERO)
            .await?
        {
            Outcome::Description(description) => Ok(description.topics),
            other => Err(ErrorReply::Storage(format!(
                "a description was asked for and {other:?} answered"
            ))),
        }
    }

    fn cluster(&self) -> Option<ClusterView> {
        let cluster = self.shared.cluster()?;
        let status = cluster.status();
        let broker_id = |id: NodeId| i32::try_from(id).ok();
        // A node that thinks it leads but lost its lease names no leader there.
        let leader = status.leader;
        let topic_groups = crate::data_groups::topic_groups(&self.shared);
        let voters = status.members.iter().filter(|(_, _, voter)| *voter).count();
        // A new topic goes to the group holding the fewest partitions: the first (every node)
        // or, with several groups, one of --cluster-replicas voters.
        let new_topic_copies = match self.shared.shards.all().len() {
            1 => voters,
            _ => voters.min(crate::data_groups::replicas_of(&self.shared)),
        };
        // As Kafka lists the brokers that are up: a node this one has failed to reach for a
        // while is left out, so that clients asking every broker (admin tools listing groups)
        // do not wait on one that is down; a node this one knows to lead a group stays (its
        // clients are sent there).
        let mut down = cluster.unreachable_for(BROKER_DOWN_AFTER);
        for leader in topic_groups
            .values()
            .filter_map(|group| group.leader)
            .chain(leader)
        {
            down.remove(&leader);
        }
        Some(ClusterView {
            brokers: cluster
                .kafka_addresses()
                .into_iter()
                .filter(|(id, _)| !down.contains(id))
                .filter_map(|(id, address)| {
                    let (host, port) = address.rsplit_once(':')?;
                    Some((broker_id(id)?, host.to_owned(), port.parse().ok()?))
                })
                .collect(),
            leader: leader.and_then(broker_id),
            replicas: status
                .members
                .iter()
                .filter(|(_, _, voter)| *voter)
                .filter_map(|(id, _, _)| broker_id(*id))
                .collect(),
            topic_leaders: topic_groups
                .iter()
                .map(|(topic, group)| (topic.clone(), group.leader.and_then(broker_id)))
                .collect(),
            topic_replicas: topic_groups
                .into_iter()
                .map(|(topic, group)| {
                    let voters = group.voters.into_iter().filter_map(broker_id).collect();
                    (topic, voters)
                })
                .collect(),
            new_topic_copies,
        })
    }

    /// The first group's leader coordinates every Kafka group, whichever groups hold its
    /// topics: its commits reach them through `call_anywhere`.
    fn coordinates_groups(&self) -> bool {
        self.shared
            .cluster()
            .is_none_or(|cluster| cluster.is_leader())
    }

    fn requires_authentication(&self) -> bool {
        self.shared.config.auth_token.is_some()
    }

    fn authenticate(&self, password: &str) -> bool {
        self.shared
            .config
            .auth_token
            .as_ref()
            .is_none_or(|token| token.matches(Some(password)))
    }

    fn answered(&self, api: Option<ApiKey>, errors: impl FnOnce() -> Vec<ResponseError>) {
        // A request past ApiVersions and authentication: the client said what it wants, and
        // its connection is no longer displaced by a new one.
        if !self.arrived.load(std::sync::atomic::Ordering::Relaxed)
            && api.is_some_and(|api| {
                !matches!(
                    api,
                    ApiKey::ApiVersions | ApiKey::SaslHandshake | ApiKey::SaslAuthenticate
                )
            })
        {
            self.arrived
                .store(true, std::sync::atomic::Ordering::Relaxed);
            let mut arriving = self
                .arriving
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            // (Displaced meanwhile, its closing token is cancelled: it closes.)
            if let Some(arriving) = arriving.take() {
                let _arrived = arriving.arrived();
            }
        }
        if let Some(metrics) = &self.shared.metrics {
            metrics.kafka_answered(api, &errors());
        }
    }
}
