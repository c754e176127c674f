//! [`Client`]: the broker's calls as typed async methods over one shared, pipelined connection.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

#[cfg(doc)]
use broker_core::EventBroker;
use broker_core::{
    Assignor, BrokerDescription, BrokerMetadata, BrokerRecord, ClusterMember, ClusterStatus,
    Command, GroupSetting, GroupStatus, KafkaGroupDescription, KeyHash, Outcome, PartitionBatch,
    PartitionLag, PartitionRead, ProducerState, PublishRecord, ResetTo, TopicDescription,
    TopicSetting,
};
use broker_proto::{ErrorReply, ServerLimits};
use bytes::Bytes;
use tokio::sync::{Semaphore, TryAcquireError};
use tokio::time::Instant;

use crate::connection::{Connection, Identity};
use crate::tls::Tls;
use crate::Error;

/// A connection to a broker server, shared by every clone.
///
/// Each method mirrors the `broker_core::EventBroker` method of the same name, with the same
/// arguments and results; broker errors arrive as [`Error::Broker`]. Any number of tasks may
/// call through one client (or its clones) at once: requests are pipelined on one TCP
/// connection and matched to their responses by correlation id, so a slow call (such as a
/// waiting poll) does not hold up the others.
///
/// # Lost connections
///
/// When the connection dies (the server closes it, an I/O error, a response the client cannot
/// frame), every call in flight fails at once with [`Error::ConnectionLost`], and the next call
/// opens a new connection to the same address. Group membership is **not** restored: members
/// belong to the server, which removes them after its session timeout.
///
/// A poll (or ack-and-poll) that failed with `ConnectionLost` or [`Error::Timeout`] may have
/// reserved records whose answer never arrived: they stay in flight to the member, and a later
/// `poll` never hands an in-flight record to its own member again. After such a failure an
/// ack-mode consumer should `join` again (harmless if it is still a member) and call
/// [`Client::redeliver`] instead of `poll`: it releases the member's deliveries in flight and
/// polls again, so those records come back first. A fetch whose answer was lost has moved
/// the member's positions past records it never got, and a member still in the group keeps
/// them when it joins again: a fetch-mode consumer first moves them back to the group's
/// committed offsets (`reset_group` with `ResetTo::ShiftBy(0)` over the partitions it holds,
/// which never moves a committed offset), then joins, as [`crate::Consumer`] does.
///
/// # Examples
///
/// ```no_run
/// use broker_client::Client;
///
/// # async fn run() -> Result<(), broker_client::Error> {
/// let client = Client::connect("127.0.0.1:9092").await?;
/// client.create("orders", 3).await?;
/// let offset = client.publish("orders", 0, "hello").await?;
/// let partitions = client.join("orders", "billing", "m1").await?;
/// for record in client.poll("orders", "billing", "m1", 10).await? {
///     client
///         .ack("orders", "billing", "m1", record.partition, record.offset)
///         .await?;
/// }
/// # let _ = (offset, partitions);
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    addrs: Vec<SocketAddr>,
    // Each address given as text, with what it resolved to: a node named by the text a
    // cluster gives for it is reached without asking the resolver again (a resolver may take
    // seconds to give up on the name of a node that is down).
    named: Vec<(String, Vec<SocketAddr>)>,
    identity: Identity,
    tls: Option<Tls>,
    request_timeout: Duration,
    connect_timeout: Duration,
    in_flight: Semaphore,
    next_id: AtomicU64,
    // A std `Mutex`: it only guards swapping an `Arc`, never spans an `.await`.
    current: Mutex<Arc<Connection>>,
    // Held across the `.await`s of opening a connection, on purpose (so an async mutex): the
    // callers that find the connection dead wait for one reconnection instead of each opening
    // their own. It holds why the last reconnection failed, if it did.
    reconnecting: tokio::sync::Mutex<Option<String>>,
    // How many reconnections have failed: a caller that waited through a failed one shares its
    // failure instead of trying again at once, so a dead server costs one connect timeout, not
    // one per waiting caller.
    failed_reconnects: AtomicU64,
    // Whether the server is a cluster (several addresses were given, or a follower refused a
    // call): calls a follower refuses are sent again to the leader.
    cluster: AtomicBool,
    // In a cluster whose topics have leaders of their own (several groups), the connection to
    // each topic's leader, learnt from its `NotLeader`: a topic's calls go there, the others
    // to `current`. A std `Mutex`, never held across an `.await`.
    routes: Mutex<BTreeMap<String, Arc<Connection>>>,
}

/// How a client reaches its server, resolved by its builder: what [`Client::start`] opens the
/// first connection with, and every reconnection after it.
#[derive(Debug)]
pub(crate) struct Settings {
    /// The server's socket addresses, tried in order.
    pub(crate) addrs: Vec<SocketAddr>,
    /// The addresses given as text, each with what it resolved to.
    pub(crate) named: Vec<(String, Vec<SocketAddr>)>,
    /// Whether they are the nodes of a cluster.
    pub(crate) cluster: bool,
    /// What the client says in its hello.
    pub(crate) identity: Identity,
    /// TLS, when the server speaks it.
    pub(crate) tls: Option<Tls>,
    /// How long a call may take beyond its wait.
    pub(crate) request_timeout: Duration,
    /// How long opening a connection may take.
    pub(crate) connect_timeout: Duration,
    /// Calls in flight at most.
    pub(crate) max_in_flight: usize,
}

impl Client {
    /// Opens the first connection with `settings`.
    pub(crate) async fn start(settings: Settings) -> Result<Client, Error> {
        let Settings {
            addrs,
            named,
            cluster,
            identity,
            tls,
            request_timeout,
            connect_timeout,
            max_in_flight,
        } = settings;
        let connection = Connection::open(&addrs, &identity, tls.as_ref(), connect_timeout).await?;
        Ok(Client {
            inner: Arc::new(Inner {
                addrs,
                named,
                identity,
                tls,
                request_timeout,
                connect_timeout,
                in_flight: Semaphore::new(max_in_flight),
                next_id: AtomicU64::new(1),
                current: Mutex::new(Arc::new(connection)),
                reconnecting: tokio::sync::Mutex::new(None),
                failed_reconnects: AtomicU64::new(0),
                cluster: AtomicBool::new(cluster),
                routes: Mutex::default(),
            }),
        })
    }

    /// The limits the server announced when the current connection opened.
    ///
    /// ```no_run
    /// # async fn run(client: broker_client::Client) -> Result<(), broker_client::Error> {
    /// let limits = client.server_limits();
    /// println!("records of up to {} bytes", limits.max_payload_bytes);
    /// # Ok(())
    /// # }
    /// ```
    pub fn server_limits(&self) -> ServerLimits {
        self.inner.current().limits()
    }

    /// The server's name and version, as its welcome gave them (`broker-server/0.1.0`).
    ///
    /// ```no_run
    /// # async fn run(client: broker_client::Client) -> Result<(), broker_client::Error> {
    /// println!("connected to {}", client.server_name());
    /// # Ok(())
    /// # }
    /// ```
    pub fn server_name(&self) -> String {
        self.inner.current().server().to_owned()
    }

    /// The address of the server the current connection is open to: of a cluster's nodes,
    /// the one this client talks to now (the leader, once a call has found it).
    ///
    /// ```no_run
    /// # async fn run(client: broker_client::Client) -> Result<(), broker_client::Error> {
    /// println!("talking to {}", client.server_addr());
    /// # Ok(())
    /// # }
    /// ```
    pub fn server_addr(&self) -> SocketAddr {
        self.inner.current().peer()
    }

    /// Sends one command and returns the server's outcome; every typed method goes through
    /// here. `max_wait` matters only to `Poll` and `Fetch`: when nothing is available the
    /// server waits up to that long (at most its `max_wait_ms` limit, whole milliseconds) for a
    /// record before answering; [`Duration::ZERO`] answers at once. The call's timeout is the
    /// request timeout plus `max_wait`.
    ///
    /// Dropping the returned future abandons the call: the client forgets it (its answer, if
    /// one comes, is discarded), but the server may already have applied it.
    ///
    /// # Errors
    ///
    /// [`Error::Broker`] when the broker refuses the command, [`Error::Server`] when the server
    /// does, [`Error::ConnectionLost`] when the connection dies before the answer,
    /// [`Error::Timeout`] when the answer is late, [`Error::Io`] or [`Error::Refused`] when the
    /// reconnection this call attempts fails (calls that waited for it get
    /// [`Error::ConnectionLost`]), [`Error::Protocol`] for an answer the client cannot decode.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use broker_client::{Client, Command, Outcome};
    ///
    /// # async fn run(client: Client) -> Result<(), broker_client::Error> {
    /// let command = Command::EndOffset { topic: "orders".into(), partition: 0 };
    /// if let Outcome::Offset(end) = client.send(command, Duration::ZERO).await? {
    ///     println!("end offset {end}");
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub async fn send(&self, command: Command, max_wait: Duration) -> Result<Outcome, Error> {
        self.send_kept(&command, max_wait).await
    }

    /// [`Client::send`] of a command the caller keeps: it is encoded from the reference.
    async fn send_kept(&self, command: &Command, max_wait: Duration) -> Result<Outcome, Error> {
        let max_wait_ms = u32::try_from(max_wait.as_millis()).unwrap_or(u32::MAX);
        let limit = self
            .inner
            .request_timeout
            .saturating_add(Duration::from_millis(u64::from(max_wait_ms)));
        let deadline = crate::deadline::after(Instant::now(), limit);
        // Boxed: the call's state is large, and the futures of the typed calls that wrap this
        // one (and of their callers) stay small, so moving them, as pipelining callers do into
        // their `FuturesUnordered`, copies a pointer instead of the whole state.
        Box::pin(self.inner.call(command, max_wait_ms, deadline)).await
    }

    /// [`EventBroker::create`] over the network: creates `topic` with `partition_count`
    /// partitions and the default key hash; `false` if it already exists.
    ///
    /// # Errors
    ///
    /// [`Error::Broker`] when the broker refuses the call, as [`EventBroker::create`] says;
    /// otherwise as [`Client::send`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run(client: broker_client::Client) -> Result<(), broker_client::Error> {
    /// if !client.create("orders", 3).await? {
    ///     println!("orders existed already");
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub async fn create(&self, topic: &str, partition_count: i32) -> Result<bool, Error> {
        self.create_with(topic, partition_count, KeyHash::default())
            .await
    }

    /// [`EventBroker::create_with`] over the network: [`Client::create`] with the hash keyed
    /// publishes use to pick a partition.
    ///
    /// # Errors
    ///
    /// As [`Client::create`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run(client: broker_client::Client) -> Result<(), broker_client::Error> {
    /// use broker_client::KeyHash;
    ///
    /// // Keys go to the partitions Kafka's default partitioner would pick.
    /// client.create_with("orders", 3, KeyHash::Murmur2).await?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn create_with(
        &self,
        topic: &str,
        partition_count: i32,
        key_hash: KeyHash,
    ) -> Result<bool, Error> {
        self.create_topic(topic, partition_count, key_hash, &[])
            .await
    }

    /// [`EventBroker::create_topic`] over the network: [`Client::create_with`] with the topic's
    /// retention settings (interest or limits, maximum records, bytes and age, what a full
    /// partition discards).
    ///
    /// # Errors
    ///
    /// As [`Client::create`], and `InvalidArgument` for settings that make no sense.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run(client: broker_client::Client) -> Result<(), broker_client::Error> {
    /// use broker_client::{KeyHash, Retention, TopicSetting};
    ///
    /// // Records stay a day, whatever the groups have consumed.
    /// let settings = [
    ///     TopicSetting::Retention(Retention::Limits),
    ///     TopicSetting::MaxAgeMs(24 * 60 * 60 * 1000),
    /// ];
    /// client.create_topic("audit", 2, KeyHash::default(), &settings).await?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn create_topic(
        &self,
        topic: &str,
        partition_count: i32,
        key_hash: KeyHash,
        settings: &[TopicSetting],
    ) -> Result<bool, Error> {
        let command = Command::Create {
            topic: topic.to_owned(),
            partition_count,
            key_hash,
            settings: settings.to_vec(),
        };
        match self.send(command, Duration::ZERO).await? {
            Outcome::Created(created) => Ok(created),
            other => Err(unexpected("create", &other)),
        }
    }

    /// [`EventBroker::add_partitions`] over the network: gives `topic` `partition_count`
    /// partitions in all (never fewer); returns the count. Keys may move to other partitions.
    ///
    /// # Errors
    ///
    /// [`Error::Broker`] when the broker refuses the call, as [`EventBroker::add_partitions`]
    /// says; otherwise as [`Client::send`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run(client: broker_client::Client) -> Result<(), broker_client::Error> {
    /// let count = client.add_partitions("orders", 6).await?;
    /// assert!(count >= 6);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn add_partitions(&self, topic: &str, partition_count: i32) -> Result<i32, Error> {
        let command = Command::AddPartitions {
            topic: topic.to_owned(),
            partition_count,
        };
        match self.send(command, Duration::ZERO).await? {
            Outcome::PartitionCount(count) => Ok(count),
            other => Err(unexpected("add_partitions", &other)),
        }
    }

    /// [`EventBroker::delete_topic`] over the network: deletes `topic` with its records and
    /// groups; `false` if there was none. Its waiting consumers are answered at once.
    ///
    /// # Errors
    ///
    /// [`Error::Broker`] when the broker refuses the call, as [`EventBroker::delete_topic`]
    /// says; otherwise as [`Client::send`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run(client: broker_client::Client) -> Result<(), broker_client::Error> {
    /// if client.delete_topic("orders").await? {
    ///     println!("deleted");
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub async fn delete_topic(&self, topic: &str) -> Result<bool, Error> {
        let command = Command::DeleteTopic {
            topic: topic.to_owned(),
        };
        match self.send(command, Duration::ZERO).await? {
            Outcome::Deleted(deleted) => Ok(deleted),
            other => Err(unexpected("delete_topic", &other)),
        }
    }

    /// [`EventBroker::delete_group`] over the network: deletes a group without members and its
    /// committed offsets; `false` if there was none.
    ///
    /// # Errors
    ///
    /// [`Error::Broker`] when the broker refuses the call, as [`EventBroker::delete_group`]
    /// says (a group with members is refused); otherwise as [`Client::send`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run(client: broker_client::Client) -> Result<(), broker_client::Error> {
    /// client.delete_group("orders", "billing").await?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn delete_group(&self, topic: &str, group: &str) -> Result<bool, Error> {
        let command = Command::DeleteGroup {
            topic: topic.to_owned(),
            group: group.to_owned(),
        };
        match self.send(command, Duration::ZERO).await? {
            Outcome::Deleted(deleted) => Ok(deleted),
            other => Err(unexpected("delete_group", &other)),
        }
    }

    /// [`EventBroker::purge`] over the network: removes the records of `partition` below
    /// `before`; returns the partition's earliest retained offset now.
    ///
    /// # Errors
    ///
    /// [`Error::Broker`] when the broker refuses the call, as [`EventBroker::purge`] says;
    /// otherwise as [`Client::send`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run(client: broker_client::Client) -> Result<(), broker_client::Error> {
    /// // Drops partition 0's records below offset 100.
    /// let earliest = client.purge("orders", 0, 100).await?;
    /// println!("partition 0 now starts at {earliest}");
    /// # Ok(())
    /// # }
    /// ```
    pub async fn purge(&self, topic: &str, partition: i32, before: i64) -> Result<i64, Error> {
        let command = Command::Purge {
            topic: topic.to_owned(),
            partition,
            before,
        };
        match self.send(command, Duration::ZERO).await? {
            Outcome::Offset(offset) => Ok(offset),
            other => Err(unexpected("purge", &other)),
        }
    }

    /// [`EventBroker::reset_group`] over the network: moves `group`'s committed offsets on
    /// `partitions` (all with `None`) to `to`, atomically; returns the group's progress on each
    /// partition reset.
    ///
    /// # Errors
    ///
    /// [`Error::Broker`] when the broker refuses the call, as [`EventBroker::reset_group`]
    /// says; otherwise as [`Client::send`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run(client: broker_client::Client) -> Result<(), broker_client::Error> {
    /// use broker_client::ResetTo;
    ///
    /// // Replays every partition from its earliest record.
    /// for row in client.reset_group("orders", "billing", None, ResetTo::Earliest).await? {
    ///     println!("partition {}: {} records to read", row.partition, row.lag);
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub async fn reset_group(
        &self,
        topic: &str,
        group: &str,
        partitions: Option<&[i32]>,
        to: ResetTo,
    ) -> Result<Vec<PartitionLag>, Error> {
        let command = Command::ResetGroup {
            topic: topic.to_owned(),
            group: group.to_owned(),
            partitions: partitions.map(<[i32]>::to_vec),
            to,
        };
        match self.send(command, Duration::ZERO).await? {
            Outcome::Lag(rows) => Ok(rows),
            other => Err(unexpected("reset_group", &other)),
        }
    }

    /// [`EventBroker::offset_for_time`] over the network: the first offset of `partition` whose
    /// record's time is at or after `timestamp_ms` (the end offset if none is).
    ///
    /// # Errors
    ///
    /// [`Error::Broker`] when the broker refuses the call, as
    /// [`EventBroker::offset_for_time`] says; otherwise as [`Client::send`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run(client: broker_client::Client) -> Result<(), broker_client::Error> {
    /// use std::time::{Duration, SystemTime, UNIX_EPOCH};
    ///
    /// let since_epoch = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
    /// let an_hour_ago = (since_epoch - Duration::from_secs(3600)).as_millis() as i64;
    /// let offset = client.offset_for_time("orders", 0, an_hour_ago).await?;
    /// println!("partition 0 from an hour ago starts at {offset}");
    /// # Ok(())
    /// # }
    /// ```
    pub async fn offset_for_time(
        &self,
        topic: &str,
        partition: i32,
        timestamp_ms: i64,
    ) -> Result<i64, Error> {
        let command = Command::OffsetForTime {
            topic: topic.to_owned(),
            partition,
            timestamp_ms,
        };
        match self.send(command, Duration::ZERO).await? {
            Outcome::Offset(offset) => Ok(offset),
            other => Err(unexpected("offset_for_time", &other)),
        }
    }

    /// [`EventBroker::commit_group`] over the network: stores `group`'s committed offsets on
    /// the partitions of `offsets` (partition, offset) from outside its members, creating the
    /// group (with no members) if needed. Needs a server of protocol version 6.
    ///
    /// # Errors
    ///
    /// [`Error::Broker`] when the broker refuses the call, as [`EventBroker::commit_group`]
    /// says; otherwise as [`Client::send`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run(client: broker_client::Client) -> Result<(), broker_client::Error> {
    /// // The group "billing" reads partition 0 from offset 42 and partition 1 from 7 on.
    /// client.commit_group("orders", "billing", &[(0, 42), (1, 7)]).await?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn commit_group(
        &self,
        topic: &str,
        group: &str,
        offsets: &[(i32, i64)],
    ) -> Result<(), Error> {
        let command = Command::CommitGroup {
            topic: topic.to_owned(),
            group: group.to_owned(),
            offsets: offsets.to_vec(),
        };
        match self.send(command, Duration::ZERO).await? {
            Outcome::Committed => Ok(()),
            other => Err(unexpected("commit_group", &other)),
        }
    }

    /// [`EventBroker::read`] over the network: up to `max_records` records of `partition` from
    /// `offset`, without a group, with the partition's start and end offsets. When there is
    /// nothing at `offset` yet (it is the end offset), waits up to `max_wait` (capped by the
    /// server's limit) for a record to arrive; `Duration::ZERO` never waits. Needs a server of
    /// protocol version 6.
    ///
    /// # Errors
    ///
    /// [`Error::Broker`] when the broker refuses the call, as [`EventBroker::read`] says;
    /// otherwise as [`Client::send`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example(client: broker_client::Client) -> Result<(), broker_client::Error> {
    /// let mut offset = 0;
    /// loop {
    ///     let read = client.read("orders", 0, offset, 100, std::time::Duration::from_secs(1)).await?;
    ///     for record in &read.records {
    ///         println!("{} {:?}", record.offset, record.payload);
    ///     }
    ///     offset = read.records.last().map_or(offset.max(read.start_offset), |r| r.offset + 1);
    /// }
    /// # }
    /// ```
    pub async fn read(
        &self,
        topic: &str,
        partition: i32,
        offset: i64,
        max_records: i32,
        max_wait: Duration,
    ) -> Result<PartitionRead, Error> {
        let command = Command::Read {
            topic: topic.to_owned(),
            partition,
            offset,
            max_records,
            max_bytes: None,
        };
        match self.send(command, max_wait).await? {
            Outcome::Read(read) => Ok(read),
            other => Err(unexpected("read", &other)),
        }
    }

    /// [`EventBroker::join`] over the network: joins `group` and returns the member's partitions.
    ///
    /// # Errors
    ///
    /// [`Error::Broker`] when the broker refuses the call, as [`EventBroker::join`] says;
    /// otherwise as [`Client::send`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run(client: broker_client::Client) -> Result<(), broker_client::Error> {
    /// let partitions = client.join("orders", "billing", "billing-1").await?;
    /// println!("billing-1 reads partitions {partitions:?}");
    /// # Ok(())
    /// # }
    /// ```
    pub async fn join(&self, topic: &str, group: &str, member: &str) -> Result<Vec<i32>, Error> {
        self.join_group(topic, group, member, None, &[]).await
    }

    /// [`EventBroker::join_with`] over the network: [`Client::join`] naming the group's assignor.
    ///
    /// # Errors
    ///
    /// As [`Client::join`], and `InvalidArgument` if the group uses another assignor.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run(client: broker_client::Client) -> Result<(), broker_client::Error> {
    /// use broker_client::Assignor;
    ///
    /// client.join_with("orders", "billing", "billing-1", Assignor::Range).await?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn join_with(
        &self,
        topic: &str,
        group: &str,
        member: &str,
        assignor: Assignor,
    ) -> Result<Vec<i32>, Error> {
        self.join_group(topic, group, member, Some(assignor), &[])
            .await
    }

    /// [`EventBroker::join_group`] over the network: [`Client::join_with`] (or
    /// [`Client::join`], with no assignor) with the settings a new group gets: where it starts
    /// (earliest or latest) and its acknowledgement timeout.
    ///
    /// # Errors
    ///
    /// As [`Client::join_with`], and `InvalidArgument` for settings other than the existing
    /// group's.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run(client: broker_client::Client) -> Result<(), broker_client::Error> {
    /// use broker_client::{GroupSetting, StartAt};
    ///
    /// // A new group starts at the end, and a record not acknowledged within 30 s goes back.
    /// let settings = [
    ///     GroupSetting::StartAt(StartAt::Latest),
    ///     GroupSetting::AckTimeoutMs(30_000),
    /// ];
    /// client.join_group("orders", "alerts", "alerts-1", None, &settings).await?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn join_group(
        &self,
        topic: &str,
        group: &str,
        member: &str,
        assignor: Option<Assignor>,
        settings: &[GroupSetting],
    ) -> Result<Vec<i32>, Error> {
        let command = Command::Join {
            topic: topic.to_owned(),
            group: group.to_owned(),
            member: member.to_owned(),
            assignor,
            settings: settings.to_vec(),
        };
        match self.send(command, Duration::ZERO).await? {
            Outcome::Partitions(partitions) => Ok(partitions),
            other => Err(unexpected("join", &other)),
        }
    }

    /// [`EventBroker::leave`] over the network: leaves `group`; `false` if not a member.
    ///
    /// # Errors
    ///
    /// [`Error::Broker`] when the broker refuses the call, as [`EventBroker::leave`] says;
    /// otherwise as [`Client::send`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run(client: broker_client::Client) -> Result<(), broker_client::Error> {
    /// client.leave("orders", "billing", "billing-1").await?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn leave(&self, topic: &str, group: &str, member: &str) -> Result<bool, Error> {
        let command = Command::Leave {
            topic: topic.to_owned(),
            group: group.to_owned(),
            member: member.to_owned(),
        };
        match self.send(command, Duration::ZERO).await? {
            Outcome::Left(left) => Ok(left),
            other => Err(unexpected("leave", &other)),
        }
    }

    /// [`EventBroker::publish`] over the network: the record's offset, or `-1` when the partition
    /// is full.
    ///
    /// # Errors
    ///
    /// [`Error::Broker`] when the broker refuses the call, as [`EventBroker::publish`] says;
    /// [`Error::Server`] with `TooLarge` for a payload over the server's limit; otherwise as
    /// [`Client::send`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run(client: broker_client::Client) -> Result<(), broker_client::Error> {
    /// let offset = client.publish("orders", 0, "order 1").await?;
    /// if offset < 0 {
    ///     println!("partition 0 is full");
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub async fn publish(
        &self,
        topic: &str,
        partition: i32,
        payload: impl Into<Bytes>,
    ) -> Result<i64, Error> {
        let command = Command::Publish {
            topic: topic.to_owned(),
            partition,
            payload: payload.into(),
        };
        match self.send(command, Duration::ZERO).await? {
            Outcome::Published(offset) => Ok(offset),
            other => Err(unexpected("publish", &other)),
        }
    }

    /// [`EventBroker::publish_keyed`] over the network: the partition and offset (`-1` when
    /// full).
    ///
    /// # Errors
    ///
    /// As [`Client::publish`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run(client: broker_client::Client) -> Result<(), broker_client::Error> {
    /// // Every record of one key goes to the same partition, in order.
    /// let (partition, offset) = client.publish_keyed("orders", Some(b"alice"), "order 1").await?;
    /// if offset >= 0 {
    ///     println!("stored at {partition}@{offset}");
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub async fn publish_keyed(
        &self,
        topic: &str,
        key: Option<&[u8]>,
        payload: impl Into<Bytes>,
    ) -> Result<(i32, i64), Error> {
        let command = Command::PublishKeyed {
            topic: topic.to_owned(),
            key: key.map(Bytes::copy_from_slice),
            payload: payload.into(),
        };
        match self.send(command, Duration::ZERO).await? {
            Outcome::PublishedKeyed { partition, offset } => Ok((partition, offset)),
            other => Err(unexpected("publish_keyed", &other)),
        }
    }

    /// [`EventBroker::publish_batch`] over the network: many records in one request, applied
    /// atomically; each record's partition and offset (`-1` where full). One request per batch
    /// instead of one per record is the fast way to publish a stream.
    ///
    /// # Errors
    ///
    /// [`Error::Broker`] when the broker refuses the batch, as [`EventBroker::publish_batch`]
    /// says (nothing is published then); [`Error::Server`] with `TooLarge` when a record exceeds the
    /// payload limit or the batch the frame limit; otherwise as [`Client::send`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run(client: broker_client::Client) -> Result<(), broker_client::Error> {
    /// use broker_client::PublishRecord;
    ///
    /// let records = vec![
    ///     PublishRecord::keyed(Some(b"alice"), "order 1"),
    ///     PublishRecord::to_partition(1, "order 2"),
    /// ];
    /// // Refused together, or each record answered with its offset (-1: its partition was
    /// // full, and it was not stored).
    /// let stored = client.publish_batch("orders", records).await?;
    /// assert_eq!(stored.len(), 2);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn publish_batch(
        &self,
        topic: &str,
        records: Vec<PublishRecord>,
    ) -> Result<Vec<(i32, i64)>, Error> {
        let command = Command::PublishBatch {
            topic: topic.to_owned(),
            records,
        };
        match self.send(command, Duration::ZERO).await? {
            Outcome::PublishedBatch(placed) => Ok(placed),
            other => Err(unexpected("publish_batch", &other)),
        }
    }

    /// [`EventBroker::publish_until_full`] over the network: [`Client::publish_batch`], except
    /// that a partition that refuses a record (`-1`, full) takes none of the batch's later
    /// records, so each partition keeps the batch's order with no gap. Needs a server of
    /// protocol version 8.
    ///
    /// # Errors
    ///
    /// As [`Client::publish_batch`].
    ///
    /// ```no_run
    /// # async fn run(client: broker_client::Client) -> Result<(), broker_client::Error> {
    /// use broker_client::PublishRecord;
    ///
    /// let records = vec![
    ///     PublishRecord::to_partition(0, "first"),
    ///     PublishRecord::to_partition(0, "second"),
    /// ];
    /// let placed = client.publish_until_full("orders", records).await?;
    /// // A partition's records not stored are its last ones: send them again later, in order.
    /// let stored = placed.iter().take_while(|(_, offset)| *offset >= 0).count();
    /// println!("{stored} of 2 stored");
    /// # Ok(())
    /// # }
    /// ```
    pub async fn publish_until_full(
        &self,
        topic: &str,
        records: Vec<PublishRecord>,
    ) -> Result<Vec<(i32, i64)>, Error> {
        let command = Command::PublishUntilFull {
            topic: topic.to_owned(),
            records,
        };
        match self.send(command, Duration::ZERO).await? {
            Outcome::PublishedBatch(placed) => Ok(placed),
            other => Err(unexpected("publish_until_full", &other)),
        }
    }

    /// [`EventBroker::publish_idempotent`] over the network: each batch to its partition, its
    /// records numbered from its sequence for `producer`, each stored at most once however
    /// often it is sent. [`crate::Producer`] does the numbering, batching and retrying.
    ///
    /// # Errors
    ///
    /// [`Error::Broker`] when the broker refuses the call, as
    /// [`EventBroker::publish_idempotent`] says; otherwise as [`Client::publish`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run(client: broker_client::Client) -> Result<(), broker_client::Error> {
    /// use broker_client::{PartitionBatch, PublishRecord};
    ///
    /// let batch = || PartitionBatch {
    ///     partition: 0,
    ///     sequence: 0,
    ///     records: vec![PublishRecord::to_partition(0, "order 1")],
    /// };
    /// // A producer's id is drawn at random, once per producer.
    /// let producer: u64 = random_id();
    /// let first = client.publish_idempotent("orders", producer, vec![batch()]).await?;
    /// // Sent again (after a timeout, say): answered with the same offset, stored once.
    /// let again = client.publish_idempotent("orders", producer, vec![batch()]).await?;
    /// assert_eq!(first, again);
    /// # fn random_id() -> u64 { 7 }
    /// # Ok(())
    /// # }
    /// ```
    pub async fn publish_idempotent(
        &self,
        topic: &str,
        producer: u64,
        batches: Vec<PartitionBatch>,
    ) -> Result<Vec<(i32, i64)>, Error> {
        let command = Command::PublishIdempotent {
            topic: topic.to_owned(),
            producer,
            batches,
        };
        self.publish_idempotent_kept(&command).await
    }

    /// [`Client::publish_idempotent`] of a `PublishIdempotent` command the caller keeps, to send
    /// it again unchanged if its fate is unknown.
    pub(crate) async fn publish_idempotent_kept(
        &self,
        command: &Command,
    ) -> Result<Vec<(i32, i64)>, Error> {
        match self.send_kept(command, Duration::ZERO).await? {
            Outcome::PublishedBatch(placed) => Ok(placed),
            other => Err(unexpected("publish_idempotent", &other)),
        }
    }

    /// [`EventBroker::poll`] over the network. Never waits: `[]` when nothing is eligible.
    ///
    /// # Errors
    ///
    /// [`Error::Broker`] when the broker refuses the call, as [`EventBroker::poll`] says;
    /// otherwise as [`Client::send`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run(client: broker_client::Client) -> Result<(), broker_client::Error> {
    /// for record in client.poll("orders", "billing", "billing-1", 16).await? {
    ///     println!("{}@{}: {:?}", record.partition, record.offset, record.payload);
    ///     client
    ///         .ack("orders", "billing", "billing-1", record.partition, record.offset)
    ///         .await?;
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub async fn poll(
        &self,
        topic: &str,
        group: &str,
        member: &str,
        max_records: i32,
    ) -> Result<Vec<BrokerRecord>, Error> {
        self.poll_wait(topic, group, member, max_records, Duration::ZERO)
            .await
    }

    /// [`Client::poll`] that, when nothing is eligible, waits up to `max_wait` (capped by the
    /// server's limit) and answers as soon as a record is; `[]` if none came in time.
    ///
    /// # Errors
    ///
    /// As [`Client::poll`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::time::Duration;
    ///
    /// # async fn run(client: broker_client::Client) -> Result<(), broker_client::Error> {
    /// loop {
    ///     let records = client
    ///         .poll_wait("orders", "billing", "m1", 16, Duration::from_secs(5))
    ///         .await?;
    ///     for record in records {
    ///         client.ack("orders", "billing", "m1", record.partition, record.offset).await?;
    ///     }
    /// }
    /// # }
    /// ```
    pub async fn poll_wait(
        &self,
        topic: &str,
        group: &str,
        member: &str,
        max_records: i32,
        max_wait: Duration,
    ) -> Result<Vec<BrokerRecord>, Error> {
        let command = Command::Poll {
            topic: topic.to_owned(),
            group: group.to_owned(),
            member: member.to_owned(),
            max_records,
            max_bytes: None,
        };
        match self.send(command, max_wait).await? {
            Outcome::Records(records) => Ok(records),
            other => Err(unexpected("poll", &other)),
        }
    }

    /// [`EventBroker::ack_and_poll`] over the network: the last round's acknowledgements and the
    /// next poll in one request and one round trip.
    ///
    /// # Errors
    ///
    /// [`Error::Broker`] when the broker refuses the call, as [`EventBroker::ack_and_poll`] says;
    /// otherwise as [`Client::send`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run(client: broker_client::Client) -> Result<(), broker_client::Error> {
    /// let mut acks = Vec::new();
    /// loop {
    ///     let (_, records) = client
    ///         .ack_and_poll("orders", "billing", "billing-1", &acks, 16)
    ///         .await?;
    ///     if records.is_empty() {
    ///         break;
    ///     }
    ///     acks = records.iter().map(|record| (record.partition, record.offset)).collect();
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub async fn ack_and_poll(
        &self,
        topic: &str,
        group: &str,
        member: &str,
        acks: &[(i32, i64)],
        max_records: i32,
    ) -> Result<(Vec<bool>, Vec<BrokerRecord>), Error> {
        self.ack_and_poll_wait(topic, group, member, acks, max_records, Duration::ZERO)
            .await
    }

    /// [`Client::ack_and_poll`] whose poll, when nothing is eligible, waits up to `max_wait`
    /// (capped by the server's limit) as [`Client::poll_wait`]. The acknowledgements take effect at
    /// once, before the wait.
    ///
    /// # Errors
    ///
    /// As [`Client::ack_and_poll`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::time::Duration;
    ///
    /// # async fn run(client: broker_client::Client) -> Result<(), broker_client::Error> {
    /// let mut done: Vec<(i32, i64)> = Vec::new();
    /// loop {
    ///     let (_, records) = client
    ///         .ack_and_poll_wait("orders", "billing", "m1", &done, 64, Duration::from_secs(5))
    ///         .await?;
    ///     done = records.iter().map(|r| (r.partition, r.offset)).collect();
    ///     // ... handle `records` before the next round acknowledges them ...
    /// }
    /// # }
    /// ```
    pub async fn ack_and_poll_wait(
        &self,
        topic: &str,
        group: &str,
        member: &str,
        acks: &[(i32, i64)],
        max_records: i32,
        max_wait: Duration,
    ) -> Result<(Vec<bool>, Vec<BrokerRecord>), Error> {
        let command = Command::AckAndPoll {
            topic: topic.to_owned(),
            group: group.to_owned(),
            member: member.to_owned(),
            acks: acks.to_vec(),
            max_records,
            max_bytes: None,
        };
        match self.send(command, max_wait).await? {
            Outcome::AckedAndPolled { acked, records } => Ok((acked, records)),
            other => Err(unexpected("ack_and_poll", &other)),
        }
    }

    /// [`EventBroker::redeliver`] over the network: releases the member's deliveries in flight
    /// and polls again, so the records a lost poll answer had reserved come back first. Never waits.
    ///
    /// # Errors
    ///
    /// [`Error::Broker`] when the broker refuses the call, as [`EventBroker::redeliver`] says;
    /// otherwise as [`Client::send`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use broker_client::{Client, Error};
    ///
    /// # async fn run(client: Client) -> Result<(), Error> {
    /// let records = match client.poll_wait("orders", "billing", "m1", 16, Duration::from_secs(5)).await {
    ///     Ok(records) => records,
    ///     // The answer may have been lost after the server reserved records: get them back.
    ///     Err(Error::ConnectionLost(_) | Error::Timeout) => {
    ///         client.join("orders", "billing", "m1").await?;
    ///         client.redeliver("orders", "billing", "m1", 16).await?
    ///     }
    ///     Err(other) => return Err(other),
    /// };
    /// # let _ = records;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn redeliver(
        &self,
        topic: &str,
        group: &str,
        member: &str,
        max_records: i32,
    ) -> Result<Vec<BrokerRecord>, Error> {
        let command = Command::Redeliver {
            topic: topic.to_owned(),
            group: group.to_owned(),
            member: member.to_owned(),
            max_records,
            max_bytes: None,
        };
        match self.send(command, Duration::ZERO).await? {
            Outcome::Records(records) => Ok(records),
            other => Err(unexpected("redeliver", &other)),
        }
    }

    /// [`EventBroker::ack`] over the network: `false`, changing nothing, on any mismatch.
    ///
    /// # Errors
    ///
    /// [`Error::Broker`] when the broker refuses the call, as [`EventBroker::ack`] says;
    /// otherwise as [`Client::send`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run(client: broker_client::Client) -> Result<(), broker_client::Error> {
    /// for record in client.poll("orders", "billing", "billing-1", 1).await? {
    ///     let acknowledged = client
    ///         .ack("orders", "billing", "billing-1", record.partition, record.offset)
    ///         .await?;
    ///     assert!(acknowledged);
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub async fn ack(
        &self,
        topic: &str,
        group: &str,
        member: &str,
        partition: i32,
        offset: i64,
    ) -> Result<bool, Error> {
        let command = Command::Ack {
            topic: topic.to_owned(),
            group: group.to_owned(),
            member: member.to_owned(),
            partition,
            offset,
        };
        match self.send(command, Duration::ZERO).await? {
            Outcome::Acked(acked) => Ok(acked),
            other => Err(unexpected("ack", &other)),
        }
    }

    /// [`EventBroker::retry`] over the network: `false`, changing nothing, on any mismatch.
    ///
    /// # Errors
    ///
    /// [`Error::Broker`] when the broker refuses the call, as [`EventBroker::retry`] says;
    /// otherwise as [`Client::send`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run(client: broker_client::Client) -> Result<(), broker_client::Error> {
    /// for record in client.poll("orders", "billing", "billing-1", 1).await? {
    ///     // Not handled now: delivered again (to this member or another).
    ///     client
    ///         .retry("orders", "billing", "billing-1", record.partition, record.offset)
    ///         .await?;
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub async fn retry(
        &self,
        topic: &str,
        group: &str,
        member: &str,
        partition: i32,
        offset: i64,
    ) -> Result<bool, Error> {
        let command = Command::Retry {
            topic: topic.to_owned(),
            group: group.to_owned(),
            member: member.to_owned(),
            partition,
            offset,
        };
        match self.send(command, Duration::ZERO).await? {
            Outcome::Retried(retried) => Ok(retried),
            other => Err(unexpected("retry", &other)),
        }
    }

    /// Replaces the settings of an existing group (an empty list: the defaults): its
    /// acknowledgement timeout, maximum of deliveries and dead-letter topic, as if it had been
    /// created with them; where it starts cannot change. Returns its settings now. Needs a
    /// server of protocol version 4.
    ///
    /// # Errors
    ///
    /// [`Error::Broker`] with `InvalidArgument` for an unknown topic or group, settings a join
    /// would refuse, or another start; otherwise as [`Client::send`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example(client: broker_client::Client) -> Result<(), broker_client::Error> {
    /// use broker_client::{GroupSetting, TopicName};
    /// let dead_letter = TopicName::new("orders-dlq").map_err(broker_client::Error::Broker)?;
    /// client
    ///     .configure_group(
    ///         "orders",
    ///         "billing",
    ///         &[GroupSetting::MaxDeliveries(5), GroupSetting::DeadLetter(dead_letter)],
    ///     )
    ///     .await?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn configure_group(
        &self,
        topic: &str,
        group: &str,
        settings: &[GroupSetting],
    ) -> Result<Vec<GroupSetting>, Error> {
        let command = Command::ConfigureGroup {
            topic: topic.to_owned(),
            group: group.to_owned(),
            settings: settings.to_vec(),
        };
        match self.send(command, Duration::ZERO).await? {
            Outcome::GroupSettings(settings) => Ok(settings),
            other => Err(unexpected("configure_group", &other)),
        }
    }

    /// Changes the settings of an existing topic: those `settings` names (its maximum of
    /// records, bytes and age, what a full partition discards), the others as they are.
    /// Its retention, interest or limits, cannot change. The new settings hold at once: with
    /// limits retention that discards old records, a lowered limit removes the oldest records
    /// now, and records past a lowered age leave now; with interest retention or discard new,
    /// a partition past a lowered limit keeps its records and refuses new ones until consumers
    /// catch up. Returns the topic's settings now. Needs a server of protocol version 9 (an
    /// older one answers [`Error::Server`] with `MalformedRequest`).
    ///
    /// # Errors
    ///
    /// [`Error::Broker`] with `InvalidArgument` for an unknown topic, the other retention, or
    /// settings a create would refuse; otherwise as [`Client::send`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example(client: broker_client::Client) -> Result<(), broker_client::Error> {
    /// use broker_client::{TopicSetting, TopicSettings};
    /// let now = client
    ///     .configure_topic(
    ///         "orders",
    ///         &[TopicSetting::MaxRecords(100_000), TopicSetting::MaxAgeMs(86_400_000)],
    ///     )
    ///     .await?;
    /// println!("{}", TopicSettings::from_list(&now).map_err(broker_client::Error::Broker)?);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn configure_topic(
        &self,
        topic: &str,
        settings: &[TopicSetting],
    ) -> Result<Vec<TopicSetting>, Error> {
        let command = Command::ConfigureTopic {
            topic: topic.to_owned(),
            settings: settings.to_vec(),
        };
        match self.send(command, Duration::ZERO).await? {
            Outcome::TopicSettings(settings) => Ok(settings),
            other => Err(unexpected("configure_topic", &other)),
        }
    }

    /// What the node this client is connected to knows of its cluster: its role, term, log
    /// and applied indexes, and every member (with, from the leader, how far each has the
    /// log). Answered by whichever node is asked, never redirected: connect to each member in
    /// turn to see them all. Needs a server of protocol version 5.
    ///
    /// # Errors
    ///
    /// [`Error::Broker`] with `InvalidArgument` from a server that runs alone; otherwise as
    /// [`Client::send`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example(client: broker_client::Client) -> Result<(), broker_client::Error> {
    /// let status = client.cluster_status().await?;
    /// println!("node {} is {:?} in term {}", status.node_id, status.role, status.term);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn cluster_status(&self) -> Result<ClusterStatus, Error> {
        match self.send(Command::ClusterStatus, Duration::ZERO).await? {
            Outcome::ClusterStatus(status) => Ok(status),
            other => Err(unexpected("cluster_status", &other)),
        }
    }

    /// The consumer groups that Kafka's clients joined through the server's Kafka listener
    /// (`broker-server --kafka-listen`), by name, each with its state, generation, assignor and
    /// members, and the partitions each member was assigned. Their committed offsets are the
    /// broker's groups of the same names ([`Client::describe`] shows them with no members of
    /// their own). Empty when the listener is off. In a cluster, asked of the node that
    /// coordinates Kafka's groups (the first group's leader; the client follows `NotLeader`
    /// there). Needs a server of protocol version 15 (an older one answers [`Error::Server`]
    /// with `MalformedRequest`).
    ///
    /// # Errors
    ///
    /// As [`Client::send`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example(client: broker_client::Client) -> Result<(), broker_client::Error> {
    /// for group in client.kafka_groups().await? {
    ///     for member in &group.members {
    ///         println!("{}: {} from {}", group.name, member.client_id, member.client_host);
    ///     }
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub async fn kafka_groups(&self) -> Result<Vec<KafkaGroupDescription>, Error> {
        match self.send(Command::KafkaGroups, Duration::ZERO).await? {
            Outcome::KafkaGroups(groups) => Ok(groups),
            other => Err(unexpected("kafka_groups", &other)),
        }
    }

    /// What the node this client is connected to knows of each Raft group it holds a copy of
    /// (every group, unless groups have fewer replicas than the cluster has nodes:
    /// `broker-server --cluster-replicas`), in a cluster that spreads its topics over several
    /// (`broker-server --cluster-data-groups`):
    /// for each, by ascending id, the node's role in it, the group's term, leader, log and
    /// members (with, from the group's leader, how far each has the group's log), and the
    /// topics the group holds. A cluster of one group answers its first group alone. Answered
    /// by whichever node is asked, never redirected. Needs a server of protocol version 10 (an
    /// older one answers [`Error::Server`] with `MalformedRequest`).
    ///
    /// # Errors
    ///
    /// [`Error::Broker`] with `InvalidArgument` from a server that runs alone; otherwise as
    /// [`Client::send`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example(client: broker_client::Client) -> Result<(), broker_client::Error> {
    /// for group in client.groups_status().await? {
    ///     println!("group {} led by {:?}: {:?}", group.group, group.status.leader, group.topics);
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub async fn groups_status(&self) -> Result<Vec<GroupStatus>, Error> {
        match self.send(Command::GroupsStatus, Duration::ZERO).await? {
            Outcome::GroupsStatus(groups) => Ok(groups),
            other => Err(unexpected("groups_status", &other)),
        }
    }

    /// Adds node `node_id` to the cluster, reached by its peers at `peer_addr` and by clients
    /// at `client_addr` (each `HOST:PORT`). The node must be running, started to join
    /// (`broker-server --cluster-join`); it catches up with the log, then votes. Answers with
    /// the members once it votes, which can take as long as copying the broker's state to it
    /// (the server gives up after 20 seconds: the node keeps catching up, and adding it again
    /// finishes the job). Needs a server of protocol version 5.
    ///
    /// # Errors
    ///
    /// [`Error::Broker`] with `InvalidArgument` for an address that is not `HOST:PORT`, a node
    /// id that is a member at other addresses, a node that did not catch up in time, or a
    /// server that runs alone; otherwise as [`Client::send`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example(client: broker_client::Client) -> Result<(), broker_client::Error> {
    /// let members = client.add_node(4, "10.0.0.4:9093", "10.0.0.4:9092").await?;
    /// assert!(members.iter().any(|member| member.node_id == 4 && member.voter));
    /// # Ok(())
    /// # }
    /// ```
    pub async fn add_node(
        &self,
        node_id: u64,
        peer_addr: &str,
        client_addr: &str,
    ) -> Result<Vec<ClusterMember>, Error> {
        let command = Command::AddNode {
            node_id,
            peer_addr: peer_addr.to_owned(),
            client_addr: client_addr.to_owned(),
        };
        match self.send(command, Duration::ZERO).await? {
            Outcome::Members(members) => Ok(members),
            other => Err(unexpected("add_node", &other)),
        }
    }

    /// Removes node `node_id` from the cluster: it no longer votes nor receives the log (stop
    /// its process afterwards). Answers with the members once the change is committed. Needs
    /// a server of protocol version 5.
    ///
    /// # Errors
    ///
    /// [`Error::Broker`] with `InvalidArgument` for a node that is not a member or is the last
    /// voter, a change a majority did not commit in time, or a server that runs alone;
    /// otherwise as [`Client::send`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example(client: broker_client::Client) -> Result<(), broker_client::Error> {
    /// let members = client.remove_node(3).await?;
    /// assert!(members.iter().all(|member| member.node_id != 3));
    /// # Ok(())
    /// # }
    /// ```
    pub async fn remove_node(&self, node_id: u64) -> Result<Vec<ClusterMember>, Error> {
        match self
            .send(Command::RemoveNode { node_id }, Duration::ZERO)
            .await?
        {
            Outcome::Members(members) => Ok(members),
            other => Err(unexpected("remove_node", &other)),
        }
    }

    /// Makes voter `node_id` the cluster's leader. The leader stops taking changes, waits
    /// until the node holds its whole log and the voters' promise to follow the old leader has
    /// run out (twice the election timeout, and a 200 ms margin: 1.2 seconds with the default
    /// timeouts), then has
    /// it elected; calls made meanwhile wait for the new leader, as after a failover. Answers
    /// with what the old leader knows of the cluster once it follows the new one. Naming the
    /// leader itself changes nothing. Needs a server of protocol version 7.
    ///
    /// # Errors
    ///
    /// [`Error::Broker`] with `InvalidArgument`, saying why: a node that is not a voter or does
    /// not answer, a membership change or another hand-over under way, a node that did not
    /// catch up in time (the old leader leads on), one that did not win (the message says
    /// which node leads), or a server that runs alone; otherwise as [`Client::send`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example(client: broker_client::Client) -> Result<(), broker_client::Error> {
    /// let status = client.transfer_leadership(2).await?;
    /// assert_eq!(status.leader, Some(2));
    /// # Ok(())
    /// # }
    /// ```
    pub async fn transfer_leadership(&self, node_id: u64) -> Result<ClusterStatus, Error> {
        match self
            .send(Command::TransferLeadership { node_id }, Duration::ZERO)
            .await?
        {
            Outcome::ClusterStatus(status) => Ok(status),
            other => Err(unexpected("transfer_leadership", &other)),
        }
    }

    /// Moves `topic`, with its records, consumer groups, committed offsets, deliveries in
    /// flight and idempotent producers' sequences, to Raft group `group` of a cluster that
    /// spreads its topics over several (`broker-server --cluster-data-groups`); asked of any
    /// node. Its clients go on meanwhile: their calls about it are answered `NotLeader` for
    /// the moment it takes, and this client's handles ask again, as after a failover. Answers
    /// where clients find the topic once its new group serves it (at once when it is there
    /// already). Its records travel in pieces, each an entry of the new group's log; the nodes
    /// hold the topic in memory while it moves, so one holding more than 256 MiB of records is
    /// refused. Needs a server of protocol version 13.
    ///
    /// # Errors
    ///
    /// [`Error::Broker`] with `InvalidArgument`, saying why: an unknown topic or group, a topic
    /// too large, one tied to another by a dead-letter topic (they live in one group), a node
    /// of an earlier release in the cluster, a cluster of one group, or a server that runs
    /// alone; [`Error::Server`] with `Pending` when the move has not ended within 20 seconds
    /// (it goes on); otherwise as [`Client::send`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example(client: broker_client::Client) -> Result<(), broker_client::Error> {
    /// let placed = client.move_topic("orders", 3).await?;
    /// println!("orders is served by node {:?}", placed.topics[0].leader);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn move_topic(&self, topic: &str, group: u32) -> Result<BrokerMetadata, Error> {
        let command = Command::MoveTopic {
            topic: topic.to_owned(),
            group,
        };
        match self.send(command, Duration::ZERO).await? {
            Outcome::Metadata(metadata) => Ok(metadata),
            other => Err(unexpected("move_topic", &other)),
        }
    }

    /// Where to find `topic` (or every topic, with `None`): the nodes of the cluster with
    /// their client addresses, and the node serving each topic. A server that runs alone lists
    /// no nodes and serves every topic itself (`leader` is `None`). Needs a server of protocol
    /// version 5.
    ///
    /// # Errors
    ///
    /// [`Error::Broker`] with `InvalidArgument` for an unknown topic; otherwise as
    /// [`Client::send`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example(client: broker_client::Client) -> Result<(), broker_client::Error> {
    /// let metadata = client.metadata(Some("orders")).await?;
    /// for topic in &metadata.topics {
    ///     println!("{} has {} partitions", topic.topic, topic.partition_count);
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub async fn metadata(&self, topic: Option<&str>) -> Result<BrokerMetadata, Error> {
        let command = Command::Metadata {
            topic: topic.map(str::to_owned),
        };
        match self.send(command, Duration::ZERO).await? {
            Outcome::Metadata(metadata) => Ok(metadata),
            other => Err(unexpected("metadata", &other)),
        }
    }

    /// [`Client::retry`], after which the record is delivered again no earlier than `delay`
    /// from now (the server's clock, in milliseconds): its partition delivers nothing else to
    /// the group meanwhile, so order is kept, as NATS's negative acknowledgement with a delay.
    /// A record that has had its group's maximum of deliveries goes to the group's dead-letter
    /// topic instead. Needs a server of protocol version 4.
    ///
    /// # Errors
    ///
    /// As [`Client::retry`]; [`Error::Refused`] with `MalformedRequest` from a server older
    /// than protocol version 4.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example(client: broker_client::Client) -> Result<(), broker_client::Error> {
    /// use std::time::Duration;
    /// let released = client
    ///     .retry_after("orders", "billing", "billing-1", 0, 41, Duration::from_secs(30))
    ///     .await?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn retry_after(
        &self,
        topic: &str,
        group: &str,
        member: &str,
        partition: i32,
        offset: i64,
        delay: Duration,
    ) -> Result<bool, Error> {
        let command = Command::RetryAfter {
            topic: topic.to_owned(),
            group: group.to_owned(),
            member: member.to_owned(),
            partition,
            offset,
            delay_ms: u64::try_from(delay.as_millis()).unwrap_or(u64::MAX),
        };
        match self.send(command, Duration::ZERO).await? {
            Outcome::Retried(retried) => Ok(retried),
            other => Err(unexpected("retry_after", &other)),
        }
    }

    /// [`EventBroker::fetch`] over the network. Never waits: `[]` when there is nothing new.
    ///
    /// # Errors
    ///
    /// [`Error::Broker`] when the broker refuses the call, as [`EventBroker::fetch`] says;
    /// otherwise as [`Client::send`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run(client: broker_client::Client) -> Result<(), broker_client::Error> {
    /// client.join("orders", "reports", "reports-1").await?;
    /// let records = client.fetch("orders", "reports", "reports-1", 100).await?;
    /// // Fetch mode: the group's position moves on when it commits.
    /// client.commit("orders", "reports", "reports-1", None).await?;
    /// println!("{} records", records.len());
    /// # Ok(())
    /// # }
    /// ```
    pub async fn fetch(
        &self,
        topic: &str,
        group: &str,
        member: &str,
        max_records: i32,
    ) -> Result<Vec<BrokerRecord>, Error> {
        self.fetch_wait(topic, group, member, max_records, Duration::ZERO)
            .await
    }

    /// [`Client::fetch`] that, when there is nothing new, waits up to `max_wait` (capped by the
    /// server's limit) and answers as soon as a record arrives; `[]` if none came in time.
    ///
    /// # Errors
    ///
    /// As [`Client::fetch`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run(client: broker_client::Client) -> Result<(), broker_client::Error> {
    /// use std::time::Duration;
    ///
    /// client.join("orders", "reports", "reports-1").await?;
    /// let records = client
    ///     .fetch_wait("orders", "reports", "reports-1", 100, Duration::from_secs(1))
    ///     .await?;
    /// println!("{} records", records.len());
    /// # Ok(())
    /// # }
    /// ```
    pub async fn fetch_wait(
        &self,
        topic: &str,
        group: &str,
        member: &str,
        max_records: i32,
        max_wait: Duration,
    ) -> Result<Vec<BrokerRecord>, Error> {
        let command = Command::Fetch {
            topic: topic.to_owned(),
            group: group.to_owned(),
            member: member.to_owned(),
            max_records,
            max_bytes: None,
        };
        match self.send(command, max_wait).await? {
            Outcome::Records(records) => Ok(records),
            other => Err(unexpected("fetch", &other)),
        }
    }

    /// [`EventBroker::commit`] over the network: stores the member's fetch positions (`None`) or
    /// exactly `offsets`, all or nothing.
    ///
    /// # Errors
    ///
    /// [`Error::Broker`] when the broker refuses the call, as [`EventBroker::commit`] says;
    /// otherwise as [`Client::send`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run(client: broker_client::Client) -> Result<(), broker_client::Error> {
    /// use std::collections::BTreeMap;
    ///
    /// client.join("orders", "reports", "reports-1").await?;
    /// client.fetch("orders", "reports", "reports-1", 100).await?;
    /// // Everything fetched, or chosen offsets (partition 0 read up to offset 10, excluded).
    /// client.commit("orders", "reports", "reports-1", None).await?;
    /// let offsets = BTreeMap::from([(0, 10)]);
    /// client.commit("orders", "reports", "reports-1", Some(offsets)).await?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn commit(
        &self,
        topic: &str,
        group: &str,
        member: &str,
        offsets: Option<BTreeMap<i32, i64>>,
    ) -> Result<(), Error> {
        let command = Command::Commit {
            topic: topic.to_owned(),
            group: group.to_owned(),
            member: member.to_owned(),
            offsets,
        };
        match self.send(command, Duration::ZERO).await? {
            Outcome::Committed => Ok(()),
            other => Err(unexpected("commit", &other)),
        }
    }

    /// [`EventBroker::assignment`] over the network: the member's partitions, ascending.
    ///
    /// # Errors
    ///
    /// [`Error::Broker`] when the broker refuses the call, as [`EventBroker::assignment`] says;
    /// otherwise as [`Client::send`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run(client: broker_client::Client) -> Result<(), broker_client::Error> {
    /// let partitions = client.assignment("orders", "billing", "billing-1").await?;
    /// println!("billing-1 reads {partitions:?}");
    /// # Ok(())
    /// # }
    /// ```
    pub async fn assignment(
        &self,
        topic: &str,
        group: &str,
        member: &str,
    ) -> Result<Vec<i32>, Error> {
        let command = Command::Assignment {
            topic: topic.to_owned(),
            group: group.to_owned(),
            member: member.to_owned(),
        };
        match self.send(command, Duration::ZERO).await? {
            Outcome::Partitions(partitions) => Ok(partitions),
            other => Err(unexpected("assignment", &other)),
        }
    }

    /// [`EventBroker::committed`] over the network: the group's committed offset on `partition`.
    ///
    /// # Errors
    ///
    /// [`Error::Broker`] when the broker refuses the call, as [`EventBroker::committed`] says;
    /// otherwise as [`Client::send`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run(client: broker_client::Client) -> Result<(), broker_client::Error> {
    /// let committed = client.committed("orders", "billing", 0).await?;
    /// println!("billing has read partition 0 up to {committed}");
    /// # Ok(())
    /// # }
    /// ```
    pub async fn committed(&self, topic: &str, group: &str, partition: i32) -> Result<i64, Error> {
        let command = Command::Committed {
            topic: topic.to_owned(),
            group: group.to_owned(),
            partition,
        };
        match self.send(command, Duration::ZERO).await? {
            Outcome::Offset(offset) => Ok(offset),
            other => Err(unexpected("committed", &other)),
        }
    }

    /// [`EventBroker::end_offset`] over the network: the offset the next record gets.
    ///
    /// # Errors
    ///
    /// [`Error::Broker`] when the broker refuses the call, as [`EventBroker::end_offset`] says;
    /// otherwise as [`Client::send`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run(client: broker_client::Client) -> Result<(), broker_client::Error> {
    /// let end = client.end_offset("orders", 0).await?;
    /// println!("the next record of partition 0 gets offset {end}");
    /// # Ok(())
    /// # }
    /// ```
    pub async fn end_offset(&self, topic: &str, partition: i32) -> Result<i64, Error> {
        let command = Command::EndOffset {
            topic: topic.to_owned(),
            partition,
        };
        match self.send(command, Duration::ZERO).await? {
            Outcome::Offset(offset) => Ok(offset),
            other => Err(unexpected("end_offset", &other)),
        }
    }

    /// [`EventBroker::producers`] over the network: the idempotent producers a partition
    /// remembers (such as a [`crate::Producer`] with idempotence), by ascending id, each with
    /// the sequence number it must send next there. Needs a server of protocol version 14 (an
    /// older one answers [`Error::Server`] with `MalformedRequest`).
    ///
    /// # Errors
    ///
    /// [`Error::Broker`] with `InvalidArgument` for an unknown topic or a partition it does not
    /// have; otherwise as [`Client::send`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run(client: broker_client::Client) -> Result<(), broker_client::Error> {
    /// for state in client.producers("orders", 0).await? {
    ///     println!("producer {} sends number {} next", state.producer, state.next_sequence);
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub async fn producers(
        &self,
        topic: &str,
        partition: i32,
    ) -> Result<Vec<ProducerState>, Error> {
        let command = Command::Producers {
            topic: topic.to_owned(),
            partition,
        };
        match self.send(command, Duration::ZERO).await? {
            Outcome::Producers(states) => Ok(states),
            other => Err(unexpected("producers", &other)),
        }
    }

    /// [`EventBroker::delete_offsets`] over the network: `group`'s offsets on `partitions` go
    /// back to where the group starts, stored no more, as Kafka's OffsetDelete does. Returns
    /// the group's progress on each. Needs a server of protocol version 14 (an older one
    /// answers [`Error::Server`] with `MalformedRequest`).
    ///
    /// # Errors
    ///
    /// [`Error::Broker`] with `InvalidArgument` for an unknown topic or group, a group with
    /// members, or a partition the topic does not have or named twice; otherwise as
    /// [`Client::send`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run(client: broker_client::Client) -> Result<(), broker_client::Error> {
    /// client.delete_offsets("orders", "billing", &[2]).await?;
    /// assert_eq!(client.stored_offsets("orders", "billing").await?[2], None);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn delete_offsets(
        &self,
        topic: &str,
        group: &str,
        partitions: &[i32],
    ) -> Result<Vec<PartitionLag>, Error> {
        let command = Command::DeleteOffsets {
            topic: topic.to_owned(),
            group: group.to_owned(),
            partitions: partitions.to_vec(),
        };
        match self.send(command, Duration::ZERO).await? {
            Outcome::Lag(rows) => Ok(rows),
            other => Err(unexpected("delete_offsets", &other)),
        }
    }

    /// [`EventBroker::stored_offsets`] over the network: by partition, the offset the group
    /// stored there (a commit, an acknowledgement, a reset, a record moved to its dead-letter
    /// topic), or `None` where it holds only where it started, as Kafka's committed offsets
    /// are. Needs a server of protocol version 14
    /// (an older one answers [`Error::Server`] with `MalformedRequest`).
    ///
    /// # Errors
    ///
    /// [`Error::Broker`] with `InvalidArgument` for a malformed identifier or an unknown topic;
    /// otherwise as [`Client::send`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run(client: broker_client::Client) -> Result<(), broker_client::Error> {
    /// for (partition, stored) in client.stored_offsets("orders", "billing").await?.iter().enumerate() {
    ///     match stored {
    ///         Some(offset) => println!("partition {partition}: committed {offset}"),
    ///         None => println!("partition {partition}: nothing committed yet"),
    ///     }
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub async fn stored_offsets(
        &self,
        topic: &str,
        group: &str,
    ) -> Result<Vec<Option<i64>>, Error> {
        let command = Command::StoredOffsets {
            topic: topic.to_owned(),
            group: group.to_owned(),
        };
        match self.send(command, Duration::ZERO).await? {
            Outcome::StoredOffsets(offsets) => Ok(offsets),
            other => Err(unexpected("stored_offsets", &other)),
        }
    }

    /// [`EventBroker::lag`] over the network: `end_offset - committed` for every partition.
    ///
    /// # Errors
    ///
    /// [`Error::Broker`] when the broker refuses the call, as [`EventBroker::lag`] says;
    /// otherwise as [`Client::send`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run(client: broker_client::Client) -> Result<(), broker_client::Error> {
    /// let behind: i64 = client.lag("orders", "billing").await?.iter().map(|row| row.lag).sum();
    /// println!("billing is {behind} records behind");
    /// # Ok(())
    /// # }
    /// ```
    pub async fn lag(&self, topic: &str, group: &str) -> Result<Vec<PartitionLag>, Error> {
        let command = Command::Lag {
            topic: topic.to_owned(),
            group: group.to_owned(),
        };
        match self.send(command, Duration::ZERO).await? {
            Outcome::Lag(lag) => Ok(lag),
            other => Err(unexpected("lag", &other)),
        }
    }

    /// [`EventBroker::describe`] over the network: every topic and its groups.
    ///
    /// # Errors
    ///
    /// As [`Client::send`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run(client: broker_client::Client) -> Result<(), broker_client::Error> {
    /// for topic in client.describe().await?.topics {
    ///     println!("{}: {} partitions", topic.name, topic.partitions.len());
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub async fn describe(&self) -> Result<BrokerDescription, Error> {
        match self
            .send(Command::Describe { topic: None }, Duration::ZERO)
            .await?
        {
            Outcome::Description(description) => Ok(description),
            other => Err(unexpected("describe", &other)),
        }
    }

    /// [`EventBroker::describe`] over the network, for one topic and its groups.
    ///
    /// # Errors
    ///
    /// [`Error::Broker`] with `InvalidArgument` for a malformed or unknown topic; otherwise as
    /// [`Client::send`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run(client: broker_client::Client) -> Result<(), broker_client::Error> {
    /// let topic = client.describe_topic("orders").await?;
    /// println!("{} bytes retained", topic.retained_bytes);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn describe_topic(&self, topic: &str) -> Result<TopicDescription, Error> {
        let command = Command::Describe {
            topic: Some(topic.to_owned()),
        };
        match self.send(command, Duration::ZERO).await? {
            Outcome::Description(description) => {
                description.topics.into_iter().next().ok_or_else(|| {
                    Error::Protocol(format!("the description of {topic:?} has no topic"))
                })
            }
            other => Err(unexpected("describe_topic", &other)),
        }
    }
}

impl Inner {
    fn lock_routes(&self) -> MutexGuard<'_, BTreeMap<String, Arc<Connection>>> {
        // A map of `Arc`s, each entry replaced whole.
        self.routes.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The live connection to `topic`'s leader, if a `NotLeader` named one (a dead one is
    /// forgotten: the topic's calls go to the current connection again).
    fn route(&self, topic: &str) -> Option<Arc<Connection>> {
        let mut routes = self.lock_routes();
        let routed = routes.get(topic)?;
        if routed.is_closed() {
            routes.remove(topic);
            return None;
        }
        Some(Arc::clone(routed))
    }

    /// A live connection this client has open to one of `addrs` already, if any.
    fn open_connection_to(&self, addrs: &[SocketAddr]) -> Option<Arc<Connection>> {
        let current = self.current();
        if !current.is_closed() && addrs.contains(&current.peer()) {
            return Some(current);
        }
        let routes = self.lock_routes();
        routes
            .values()
            .find(|routed| !routed.is_closed() && addrs.contains(&routed.peer()))
            .map(Arc::clone)
    }

    fn lock_current(&self) -> MutexGuard<'_, Arc<Connection>> {
        // The guarded value is an `Arc` that is only ever replaced whole.
        self.current.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn current(&self) -> Arc<Connection> {
        Arc::clone(&self.lock_current())
    }

    /// The live connection, reconnecting first if the current one died.
    async fn connection(&self) -> Result<Arc<Connection>, Error> {
        let current = self.current();
        if !current.is_closed() {
            return Ok(current);
        }
        let failures_seen = self.failed_reconnects.load(Ordering::Acquire);
        let mut last_failure = self.reconnecting.lock().await;
        // Another caller may have reconnected, or failed to, while this one waited.
        let current = self.current();
        if !current.is_closed() {
            return Ok(current);
        }
        if self.failed_reconnects.load(Ordering::Acquire) != failures_seen {
            if let Some(reason) = last_failure.as_deref() {
                return Err(Error::ConnectionLost(format!(
                    "reconnecting failed: {reason}"
                )));
            }
        }
        // A cluster's node that went away is likely gone for a while: the others first.
        let addrs = match self.cluster.load(Ordering::Relaxed) {
            true => last_resort(&self.addrs, current.peer()),
            false => self.addrs.clone(),
        };
        tracing::debug!(?addrs, "reconnecting");
        let opened = Connection::open(
            &addrs,
            &self.identity,
            self.tls.as_ref(),
            self.connect_timeout,
        )
        .await;
        match opened {
            Ok(fresh) => {
                let fresh = Arc::new(fresh);
                *self.lock_current() = Arc::clone(&fresh);
                *last_failure = None;
                Ok(fresh)
            }
            Err(error) => {
                *last_failure = Some(error.to_string());
                self.failed_reconnects.fetch_add(1, Ordering::Release);
                Err(error)
            }
        }
    }

    /// One call: an in-flight slot, a live connection, a correlation id, the answer.
    ///
    /// The deadline covers the whole call. The common path (a free slot, a live connection)
    /// sets no timer: the connection's reader answers `Timeout` to calls past their deadline;
    /// only waiting for a slot or reconnecting is bounded by a timer of its own.
    async fn call(
        &self,
        command: &Command,
        max_wait_ms: u32,
        deadline: Instant,
    ) -> Result<Outcome, Error> {
        let closed = || Error::ConnectionLost("the client is closed".to_owned());
        let _slot = match self.in_flight.try_acquire() {
            Ok(slot) => slot,
            Err(TryAcquireError::Closed) => return Err(closed()),
            Err(TryAcquireError::NoPermits) => {
                tokio::time::timeout_at(deadline, Box::pin(self.in_flight.acquire()))
                    .await
                    .map_err(|_| Error::Timeout)?
                    .map_err(|_| closed())?
            }
        };
        let mut redirects = 0;
        // How long `NotLeader` answers are followed: the request timeout, not the wait a poll
        // or fetch may add to it (a waiting call answered `NotLeader` did not wait).
        let follow_until = deadline
            .checked_sub(Duration::from_millis(u64::from(max_wait_ms)))
            .unwrap_or(deadline);
        let topic = command.topic();
        loop {
            // (A single server never names another leader: no lookup for it.)
            let routed = match self.cluster.load(Ordering::Relaxed) {
                true => topic.and_then(|topic| self.route(topic)),
                false => None,
            };
            let current = match routed {
                Some(routed) => routed,
                None => self.current(),
            };
            let connection = if current.is_closed() {
                // Boxed, as waiting for a slot above: kept inline, the rare paths' futures would
                // make every call's future as large (reconnecting includes a TLS handshake), to
                // be moved on every call.
                tokio::time::timeout_at(deadline, Box::pin(self.connection()))
                    .await
                    .map_err(|_| Error::Timeout)??
            } else {
                current
            };
            let id = self.next_id.fetch_add(1, Ordering::Relaxed);
            let follow = self.cluster.load(Ordering::Relaxed);
            let leader = match connection.call(id, command, max_wait_ms, deadline).await {
                Err(Error::Server(ErrorReply::NotLeader { leader })) => leader,
                answered => return answered,
            };
            // A follower applied nothing: move to the leader, then send the call again, until
            // the request timeout (long enough for an election, or for a topic's move between
            // groups). Nodes that disagree on the leader (an election is
            // under way) are asked again after a pause, not in a tight loop. Past the timeout,
            // the call fails with `NotLeader`, which says that nothing was applied.
            self.cluster.store(true, Ordering::Relaxed);
            if redirects > 0 {
                tokio::time::sleep_until(follow_until.min(Instant::now() + ELECTION_PAUSE)).await;
            }
            let moved = Box::pin(self.follow_leader(&connection, topic, leader.as_deref()));
            let followed = tokio::time::timeout_at(follow_until, moved).await;
            if !follow || (!matches!(followed, Ok(Ok(()))) && Instant::now() >= follow_until) {
                return Err(Error::Server(ErrorReply::NotLeader { leader }));
            }
            followed.map_err(|_| Error::Timeout)??;
            redirects += 1;
        }
    }

    /// Replaces `stale`, a connection to a node that does not lead (for `topic`, when the
    /// call was about one), with one to the leader it named (its client address), or, when it
    /// knows none (an election is under way), with one to the next node after a pause. The
    /// topic's calls go to that leader from then on (a cluster of several groups has a leader
    /// per topic); so do the calls `stale` served as the current connection. A connection open
    /// to the leader already is shared. Callers that find another caller already moved share
    /// its move.
    async fn follow_leader(
        &self,
        stale: &Arc<Connection>,
        topic: Option<&str>,
        leader: Option<&str>,
    ) -> Result<(), Error> {
        // Whether another caller moved the calls `stale` served already.
        let moved_already = || {
            let current = self.current();
            match topic.and_then(|topic| self.route(topic)) {
                Some(routed) => !Arc::ptr_eq(&routed, stale),
                None => !Arc::ptr_eq(&current, stale) && !current.is_closed() && topic.is_none(),
            }
        };
        let turn = self.reconnecting.lock().await;
        let current = self.current();
        if moved_already() {
            return Ok(());
        }
        tracing::debug!(?leader, ?topic, "moving to the leader");
        if let Some(found) = self.resolve_leader(leader).await {
            let open = self.open_connection_to(&found);
            let fresh = match open {
                Some(open) => Ok(open),
                // The leader named may be the node that just went away (the others have not
                // noticed yet): not worth a full connect timeout.
                None => {
                    let limit = self.connect_timeout.min(LEADER_CONNECT_TIMEOUT);
                    Connection::open(&found, &self.identity, self.tls.as_ref(), limit)
                        .await
                        .map(Arc::new)
                }
            };
            if let Ok(fresh) = fresh {
                if let Some(topic) = topic {
                    self.lock_routes()
                        .insert(topic.to_owned(), Arc::clone(&fresh));
                }
                if Arc::ptr_eq(&current, stale) || current.is_closed() {
                    *self.lock_current() = fresh;
                }
                return Ok(());
            }
        }
        if let Some(topic) = topic {
            self.lock_routes().remove(topic);
        }
        // No leader known, or the one named is gone (its followers have not noticed yet): an
        // election is under way. Ask the nodes again after a pause, the one that did not lead
        // last. The pause is made without the turn: other callers are not held up one pause
        // each behind it, and one of them may have moved meanwhile.
        drop(turn);
        tokio::time::sleep(ELECTION_PAUSE).await;
        let _turn = self.reconnecting.lock().await;
        if moved_already() {
            return Ok(());
        }
        let nodes = last_resort(&self.addrs, stale.peer());
        let fresh = Connection::open(
            &nodes,
            &self.identity,
            self.tls.as_ref(),
            self.connect_timeout,
        )
        .await?;
        *self.lock_current() = Arc::new(fresh);
        Ok(())
    }
}

impl Inner {
    /// The socket addresses of `leader`, a node's client address as a node named it: those it
    /// resolved to when the client was given the same text, else what the resolver answers
    /// within [`LEADER_LOOKUP_TIMEOUT`]. `None` for no leader, or one that cannot be found.
    async fn resolve_leader(&self, leader: Option<&str>) -> Option<Vec<SocketAddr>> {
        let leader = broker_net::connect_address(leader?).ok()?;
        if let Some((_, found)) = self.named.iter().find(|(name, _)| *name == leader) {
            return Some(found.clone());
        }
        let found = tokio::time::timeout(LEADER_LOOKUP_TIMEOUT, tokio::net::lookup_host(leader))
            .await
            .ok()?
            .ok()?;
        Some(found.collect())
    }
}

/// `addrs` with `last` moved to the end.
fn last_resort(addrs: &[SocketAddr], last: SocketAddr) -> Vec<SocketAddr> {
    let mut ordered: Vec<SocketAddr> = addrs.iter().copied().filter(|a| *a != last).collect();
    if addrs.contains(&last) {
        ordered.push(last);
    }
    ordered
}

/// How long a client asks the resolver for a leader's address that it was not given.
const LEADER_LOOKUP_TIMEOUT: Duration = Duration::from_secs(1);

/// How long a client tries to open a connection to the leader a node named, before it asks
/// the other nodes.
const LEADER_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// How long a client waits before asking the next node when a node knows no leader (an
/// election is under way; with the default timeouts one takes under a second).
const ELECTION_PAUSE: Duration = Duration::from_millis(100);

/// The error for an outcome of the wrong kind for `call`.
fn unexpected(call: &str, outcome: &Outcome) -> Error {
    Error::Protocol(format!("unexpected {} outcome for {call}", outcome.name()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_can_be_shared_between_tasks() {
        fn shareable<T: Clone + Send + Sync + 'static>() {}
        shareable::<Client>();
        fn error_is_sendable<T: std::error::Error + Send + Sync + 'static>() {}
        error_is_sendable::<Error>();
    }

    #[test]
    fn an_outcome_of_the_wrong_kind_is_a_protocol_error() {
        assert!(matches!(
            unexpected("publish", &Outcome::Acked(true)),
            Error::Protocol(message) if message == "unexpected Acked outcome for publish"
        ));
    }
}
