//! [`Consumer`]: a member of a consumer group that stays one, through lost connections and server
//! restarts, and hands its records to the service as a stream or in batches.

use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::ops::Deref;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use broker_core::{
    Assignor, BrokerError, BrokerRecord, GroupSetting, ResetTo, MAX_ACKS, MAX_FETCH_RECORDS,
    MAX_POLL_RECORDS,
};
use futures::stream::{BoxStream, StreamExt};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::producer::random_id;
use crate::{Client, Error};

/// How a [`Consumer`] takes its records.
///
/// ```
/// use broker_client::{ConsumeMode, Consumer};
///
/// let builder = Consumer::builder("orders", "analytics").mode(ConsumeMode::Fetch);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ConsumeMode {
    /// Each record is acknowledged (or retried) through its [`Delivery`]; a partition has one
    /// record in flight at a time, and an unacknowledged one comes back.
    #[default]
    Ack,
    /// Records are read in order, many per partition at once, and the group's offsets are
    /// committed on an interval ([`ConsumerBuilder::auto_commit`]), on request
    /// ([`Consumer::commit`]) and on close (see [`ConsumerBuilder::auto_commit`]).
    Fetch,
}

/// Where a [`Consumer`] stands, as [`Consumer::status`] reports it.
///
/// ```no_run
/// # async fn run(consumer: broker_client::Consumer) {
/// let mut status = consumer.status();
/// while status.changed().await.is_ok() {
///     let now = status.borrow().clone();
///     match now.reconnecting {
///         Some(reason) => eprintln!("reconnecting: {reason}"),
///         None => println!("partitions {:?} ({} re-joins)", now.assignment, now.rejoins),
///     }
/// }
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsumerStatus {
    /// The partitions the group gives this member now, ascending; `[]` while it has none (more
    /// members than partitions) or is re-joining.
    pub assignment: Vec<i32>,
    /// Why the consumer is re-connecting, while it is: the error its last call met.
    pub reconnecting: Option<String>,
    /// How many times the consumer has re-joined after losing the server.
    pub rejoins: u64,
}

/// The settings of a [`Consumer`]; [`Consumer::builder`] makes one.
///
/// ```no_run
/// use std::time::Duration;
///
/// use broker_client::{Client, ConsumeMode, Consumer, GroupSetting, StartAt};
///
/// # async fn run() -> Result<(), broker_client::Error> {
/// let consumer = Consumer::builder("orders", "analytics")
///     .member("analytics-1")
///     .mode(ConsumeMode::Fetch)
///     .max_records(1_000)
///     .max_wait(Duration::from_millis(500))
///     .auto_commit(Some(Duration::from_secs(1)))
///     .group_settings(vec![GroupSetting::StartAt(StartAt::Earliest)])
///     .start(Client::connect("127.0.0.1:9092").await?)
///     .await?;
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct ConsumerBuilder {
    topic: String,
    group: String,
    member: Option<String>,
    mode: ConsumeMode,
    max_records: i32,
    max_wait: Duration,
    auto_commit: Option<Duration>,
    assignor: Option<Assignor>,
    settings: Vec<GroupSetting>,
}

impl ConsumerBuilder {
    /// The member id (1 to 64 letters, digits, `_` and `-`; also `.` and up to 249 characters
    /// on a server started with `--names kafka`); a random `consumer-…` id by default.
    /// Give a stable one to find the member in `broker describe` and to take its place again
    /// after a crash.
    ///
    /// ```
    /// let builder = broker_client::Consumer::builder("orders", "billing").member("billing-1");
    /// ```
    #[must_use]
    pub fn member(mut self, member: impl Into<String>) -> Self {
        self.member = Some(member.into());
        self
    }

    /// Ack mode (the default) or fetch mode.
    ///
    /// ```
    /// use broker_client::{ConsumeMode, Consumer};
    ///
    /// let builder = Consumer::builder("orders", "billing").mode(ConsumeMode::Ack);
    /// ```
    #[must_use]
    pub fn mode(mut self, mode: ConsumeMode) -> Self {
        self.mode = mode;
        self
    }

    /// Most records one request takes: ack mode 1 to 64, fetch mode 1 to 10,000 (64 by
    /// default); [`ConsumerBuilder::start`] refuses other values.
    ///
    /// ```
    /// let builder = broker_client::Consumer::builder("orders", "billing").max_records(16);
    /// ```
    #[must_use]
    pub fn max_records(mut self, records: i32) -> Self {
        self.max_records = records;
        self
    }

    /// How long one request waits on the server for records to arrive (1 s by default, capped
    /// by the server's limit; zero answers at once). The consumer checks its assignment
    /// between requests this often (at most once a second), and once a second while a longer
    /// request waits, so that [`Consumer::status`] shows a rebalance within about a second.
    ///
    /// ```
    /// # use std::time::Duration;
    /// let builder = broker_client::Consumer::builder("orders", "billing").max_wait(Duration::from_secs(5));
    /// ```
    #[must_use]
    pub fn max_wait(mut self, wait: Duration) -> Self {
        self.max_wait = wait;
        self
    }

    /// Fetch mode: how often the records handed out are committed, at the next batch asked for
    /// once this long has passed since the last commit, and on close (5 s by default). `None`
    /// commits only on [`Consumer::commit`] and [`Consumer::commit_offsets`], never by itself,
    /// as Kafka's consumer without `enable.auto.commit`.
    ///
    /// ```
    /// use broker_client::{ConsumeMode, Consumer};
    ///
    /// // Commit only when the service says so, through `Consumer::commit`.
    /// let builder = Consumer::builder("orders", "analytics")
    ///     .mode(ConsumeMode::Fetch)
    ///     .auto_commit(None);
    /// ```
    #[must_use]
    pub fn auto_commit(mut self, interval: Option<Duration>) -> Self {
        self.auto_commit = interval;
        self
    }

    /// The assignor of the group if this creates it; an existing group must use it.
    ///
    /// ```
    /// use broker_client::{Assignor, Consumer};
    ///
    /// let builder = Consumer::builder("orders", "billing").assignor(Assignor::Range);
    /// ```
    #[must_use]
    pub fn assignor(mut self, assignor: Assignor) -> Self {
        self.assignor = Some(assignor);
        self
    }

    /// The settings of the group if this creates it (where it starts, its acknowledgement
    /// timeout); an existing group must have them.
    ///
    /// ```
    /// use broker_client::{Consumer, GroupSetting, StartAt};
    ///
    /// let builder = Consumer::builder("orders", "billing").group_settings(vec![
    ///     GroupSetting::StartAt(StartAt::Earliest),
    ///     GroupSetting::AckTimeoutMs(30_000),
    ///     GroupSetting::MaxDeliveries(5),
    /// ]);
    /// ```
    #[must_use]
    pub fn group_settings(mut self, settings: Vec<GroupSetting>) -> Self {
        self.settings = settings;
        self
    }

    /// Joins the group through `client` and returns the consumer.
    ///
    /// # Errors
    /// `InvalidArgument` for a number of records out of range; whatever the join meets: the server cannot be reached, the topic does not exist, the
    /// group has other settings or its maximum of members, a malformed name.
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), broker_client::Error> {
    /// use broker_client::{Client, Consumer};
    ///
    /// let client = Client::connect("127.0.0.1:9092").await?;
    /// let consumer = Consumer::builder("orders", "billing").start(client).await?;
    /// println!("joined as {}", consumer.member());
    /// # Ok(())
    /// # }
    /// ```
    pub async fn start(self, client: Client) -> Result<Consumer, Error> {
        check_max_records(self.mode, self.max_records)?;
        let member = self
            .member
            .clone()
            .unwrap_or_else(|| format!("consumer-{:016x}", random_id()));
        let membership = Arc::new(Membership {
            client,
            mode: self.mode,
            later: Mutex::new(Vec::new()),
            unsettled: std::sync::atomic::AtomicBool::new(false),
            topic: self.topic.clone(),
            group: self.group.clone(),
            member,
        });
        let (status, _) = watch::channel(ConsumerStatus {
            assignment: Vec::new(),
            reconnecting: None,
            rejoins: 0,
        });
        let mut consumer = Consumer {
            membership,
            settings: self,
            status,
            joined: false,
            recover: true,
            checked: Instant::now(),
            committed: Instant::now(),
            closed: false,
            pending: None,
            kept: Vec::new(),
        };
        consumer.join().await?;
        Ok(consumer)
    }
}

/// Who a consumer is: what each [`Delivery`] needs to acknowledge itself.
#[derive(Debug)]
struct Membership {
    client: Client,
    mode: ConsumeMode,
    /// Acknowledgements queued by [`Delivery::ack_later`], sent with the next poll.
    later: Mutex<Vec<(i32, i64)>>,
    /// A delivery could not be settled (the server was not reached): it is still reserved to
    /// the member, and no poll would give it back. The consumer's next take asks for it again.
    unsettled: std::sync::atomic::AtomicBool,
    topic: String,
    group: String,
    member: String,
}

impl Membership {
    /// The client, and the topic, group and member every call names.
    fn names(&self) -> (&Client, &str, &str, &str) {
        (&self.client, &self.topic, &self.group, &self.member)
    }

    /// The acknowledgements [`Delivery::ack_later`] queued, at most [`MAX_ACKS`] (the rest
    /// wait for the next request).
    fn take_later(&self) -> Vec<(i32, i64)> {
        let mut later = self.later.lock().unwrap_or_else(PoisonError::into_inner);
        let first = later.len().min(MAX_ACKS);
        let rest = later.split_off(first);
        std::mem::replace(&mut *later, rest)
    }

    /// Sends the queued acknowledgements on their own (on close).
    async fn flush_later(&self) -> Result<(), Error> {
        loop {
            let acks = self.take_later();
            if acks.is_empty() {
                return Ok(());
            }
            let sent = acks.iter().map(|&(partition, offset)| {
                self.client
                    .ack(&self.topic, &self.group, &self.member, partition, offset)
            });
            futures::future::try_join_all(sent).await?;
        }
    }
}

/// A record handed out by a [`Consumer`]; it dereferences to its [`BrokerRecord`].
///
/// ```no_run
/// # async fn run(mut consumer: broker_client::Consumer) -> Result<(), broker_client::Error> {
/// for delivery in consumer.next_batch().await? {
///     // A `Delivery` reads as the record it carries.
///     println!("{}@{} key {:?}", delivery.partition, delivery.offset, delivery.key);
///     delivery.ack_later();
/// }
/// # Ok(())
/// # }
/// ```
pub struct Delivery {
    record: BrokerRecord,
    membership: Arc<Membership>,
}

impl fmt::Debug for Delivery {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.record.fmt(f)
    }
}

impl Deref for Delivery {
    type Target = BrokerRecord;

    fn deref(&self) -> &BrokerRecord {
        &self.record
    }
}

impl Delivery {
    /// The record.
    ///
    /// ```no_run
    /// # fn run(delivery: broker_client::Delivery) {
    /// let payload: &[u8] = &delivery.record().payload;
    /// # }
    /// ```
    pub fn record(&self) -> &BrokerRecord {
        &self.record
    }

    /// The record, without the handle.
    ///
    /// ```no_run
    /// # fn run(delivery: broker_client::Delivery) {
    /// delivery.ack_later();
    /// // Kept after the handle is gone, for a later batch of work.
    /// let record = delivery.into_record();
    /// # }
    /// ```
    pub fn into_record(self) -> BrokerRecord {
        self.record
    }

    /// Ack mode: the record is done with; the group's committed offset moves past it and its
    /// partition's next record can be delivered. `false` when this call did not acknowledge it,
    /// and it will be delivered again: its partition moved to another member, the consumer
    /// re-joined after losing the server, or the server could not be reached (the consumer's
    /// next batch then asks for it again; an acknowledgement whose answer was lost is tried
    /// again, and then answers `false` if the first attempt had made it). In fetch mode records are not acknowledged one by one, and
    /// this is always `false`.
    ///
    /// # Errors
    /// What a retry cannot mend, as [`Client::ack`] says (the topic was deleted, say).
    ///
    /// ```no_run
    /// # async fn run(delivery: broker_client::Delivery) -> Result<(), broker_client::Error> {
    /// if !delivery.ack().await? {
    ///     // Too late: it will be delivered again, maybe to another member.
    ///     eprintln!("record {}@{} comes again", delivery.partition, delivery.offset);
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub async fn ack(&self) -> Result<bool, Error> {
        self.settle(Settle::Ack).await
    }

    /// Ack mode: acknowledges the record with the consumer's next request for records (or when
    /// it closes), in the same round trip: the fast way to acknowledge many records, with no
    /// answer for each. An acknowledgement that does not match (the partition moved, the
    /// server was lost before it went) leaves the record to be delivered again, as
    /// [`Delivery::ack`] answering `false` would. Nothing in fetch mode.
    ///
    /// ```no_run
    /// # async fn run(mut consumer: broker_client::Consumer) -> Result<(), broker_client::Error> {
    /// loop {
    ///     for delivery in consumer.next_batch().await? {
    ///         println!("{:?}", delivery.payload);
    ///         // Sent with the next `next_batch`, in the same request.
    ///         delivery.ack_later();
    ///     }
    /// }
    /// # }
    /// ```
    pub fn ack_later(&self) {
        if self.membership.mode == ConsumeMode::Ack {
            let mut later = self
                .membership
                .later
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            later.push((self.record.partition, self.record.offset));
        }
    }

    /// Ack mode: the record failed; it is delivered again (to this member or, after a
    /// rebalance, another) before anything later in its partition. `false` as
    /// [`Delivery::ack`].
    ///
    /// # Errors
    /// As [`Delivery::ack`].
    ///
    /// ```no_run
    /// # async fn run(delivery: broker_client::Delivery) -> Result<(), broker_client::Error> {
    /// if delivery.payload.is_empty() {
    ///     // Not ready to handle it: give it back, to be delivered again.
    ///     delivery.retry().await?;
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub async fn retry(&self) -> Result<bool, Error> {
        self.settle(Settle::Retry).await
    }

    /// [`Delivery::retry`], delivered again no earlier than `delay` from now (see
    /// [`Client::retry_after`]): its partition waits for it, nothing later comes first.
    ///
    /// # Errors
    /// As [`Delivery::ack`].
    ///
    /// ```no_run
    /// # async fn run(delivery: broker_client::Delivery) -> Result<(), broker_client::Error> {
    /// use std::time::Duration;
    ///
    /// // A downstream service is down: try this record again in 30 s.
    /// delivery.retry_after(Duration::from_secs(30)).await?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn retry_after(&self, delay: Duration) -> Result<bool, Error> {
        self.settle(Settle::RetryAfter(delay)).await
    }

    async fn settle(&self, how: Settle) -> Result<bool, Error> {
        if self.membership.mode == ConsumeMode::Fetch {
            return Ok(false);
        }
        let (client, topic, group, member) = self.membership.names();
        let (partition, offset) = (self.record.partition, self.record.offset);
        let settled = with_retries("settling a delivery", || async {
            match how {
                Settle::Ack => client.ack(topic, group, member, partition, offset).await,
                Settle::Retry => client.retry(topic, group, member, partition, offset).await,
                Settle::RetryAfter(delay) => {
                    client
                        .retry_after(topic, group, member, partition, offset, delay)
                        .await
                }
            }
        })
        .await;
        match settled {
            // Still not reached: the delivery is released by its timeout, as unsettled, or
            // asked for again by the consumer's next take (without a timeout, no poll would
            // give it back).
            Err(error) if error.is_retriable() => {
                self.membership
                    .unsettled
                    .store(true, std::sync::atomic::Ordering::Relaxed);
                Ok(false)
            }
            settled => settled,
        }
    }
}

/// How a [`Delivery`] is settled.
#[derive(Debug, Clone, Copy)]
enum Settle {
    Ack,
    Retry,
    RetryAfter(Duration),
}

/// The shortest time between two checks of a consumer's assignment.
const MIN_ASSIGNMENT_CHECK: Duration = Duration::from_secs(1);

/// Makes `call` up to [`SETTLE_ATTEMPTS`] times while it fails for a passing reason
/// ([`Error::is_retriable`]: a connection lost in a blip, say), waiting [`backoff`] between
/// attempts; answers its last result. Only for calls that change nothing more when made twice.
async fn with_retries<T, F>(what: &str, mut call: impl FnMut() -> F) -> Result<T, Error>
where
    F: std::future::Future<Output = Result<T, Error>>,
{
    let mut attempt = 0;
    loop {
        match call().await {
            Err(error) if error.is_retriable() && attempt + 1 < SETTLE_ATTEMPTS => {
                tracing::debug!(%error, attempt, "{what} failed; trying again");
                tokio::time::sleep(backoff(attempt)).await;
                attempt += 1;
            }
            answered => return answered,
        }
    }
}

/// How many times [`Delivery::ack`] and [`Delivery::retry`], and the commit and leave of
/// [`Consumer::close`], try to reach the server.
const SETTLE_ATTEMPTS: u32 = 3;

/// A member of a consumer group that behaves as a service wants: it joins when it starts,
/// keeps its session alive while it waits for records (long polls), and leaves on
/// [`Consumer::close`] or when dropped. When it loses the server (a cut connection, a server
/// restart, a server that is shutting down), it reconnects with back-off, joins again and
/// resumes from the group's committed offsets, without the service doing anything; the status
/// ([`Consumer::status`]) says while it does.
///
/// Delivery is at least once: records handed out and not yet acknowledged (ack mode) or
/// committed (fetch mode) when the server is lost, or when the group rebalances, are delivered
/// again. In ack mode, a record acknowledged too late answers `false` to
/// [`Delivery::ack`].
///
/// ```no_run
/// use broker_client::{Client, Consumer};
/// use futures::StreamExt;
///
/// # async fn run() -> Result<(), broker_client::Error> {
/// let client = Client::connect("127.0.0.1:9092").await?;
/// let mut consumer = Consumer::builder("orders", "billing").start(client).await?;
/// let mut assignment = consumer.status();
/// tokio::spawn(async move {
///     while assignment.changed().await.is_ok() {
///         println!("partitions now {:?}", assignment.borrow().assignment);
///     }
/// });
/// let mut records = consumer.stream();
/// while let Some(delivery) = records.next().await {
///     let delivery = delivery?;
///     println!("{}@{}: {:?}", delivery.partition, delivery.offset, delivery.payload);
///     delivery.ack().await?;
/// }
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct Consumer {
    membership: Arc<Membership>,
    settings: ConsumerBuilder,
    status: watch::Sender<ConsumerStatus>,
    /// Whether the member is known to be in the group on the current connection.
    joined: bool,
    /// Whether the next take first gets back what this member may hold without knowing: the
    /// records a lost answer carried (after losing the server), or those an earlier consumer
    /// with the same member id left in flight (at start).
    recover: bool,
    /// When the assignment was last checked.
    checked: Instant,
    /// When the fetch positions were last committed.
    committed: Instant,
    closed: bool,
    /// The request of the last take, while its answer has not been taken.
    pending: Option<Pending>,
    /// Records the server handed to the member that were not handed out yet: the answer of a
    /// take given up on, awaited to commit.
    kept: Vec<BrokerRecord>,
}

/// A take's request on its way, on a task of its own.
#[derive(Debug)]
struct Pending {
    answer: tokio::task::JoinHandle<Result<Vec<BrokerRecord>, Error>>,
    /// Whether it commits the positions before it fetches.
    commit: bool,
}

/// The request of one take: in ack mode, the acknowledgements queued and a poll, or (when the
/// member may hold records it does not know of: `recover`) those acknowledgements alone and a
/// redelivery; in fetch mode a fetch, after a commit of the positions when `commit`.
async fn request(
    membership: Arc<Membership>,
    mode: ConsumeMode,
    recover: bool,
    commit: bool,
    (max, wait): (i32, Duration),
) -> Result<Vec<BrokerRecord>, Error> {
    let (client, topic, group, member) = membership.names();
    match (mode, recover) {
        // Records reserved to this member by a lost answer (or by an earlier consumer of
        // the same member id) would never come back to it by a poll: get them back, once
        // the acknowledgements queued are sent (the redelivery releases what is still in
        // flight).
        (ConsumeMode::Ack, true) => {
            membership.flush_later().await?;
            client.redeliver(topic, group, member, max).await
        }
        (ConsumeMode::Ack, false) => {
            let acks = membership.take_later();
            client
                .ack_and_poll_wait(topic, group, member, &acks, max, wait)
                .await
                .map(|(_, records)| records)
        }
        (ConsumeMode::Fetch, _) if commit => {
            // One write: the server commits, then fetches.
            let (committed, records) = tokio::join!(
                client.commit(topic, group, member, None),
                client.fetch_wait(topic, group, member, max, wait)
            );
            committed.and(records)
        }
        (ConsumeMode::Fetch, _) => client.fetch_wait(topic, group, member, max, wait).await,
    }
}

/// Checks the member's partitions once a second and publishes a change in `status`, for as
/// long as it is polled. A failed check or an empty assignment is left to the round, which
/// re-joins when needed.
async fn watch_assignment(
    membership: &Membership,
    status: &watch::Sender<ConsumerStatus>,
) -> std::convert::Infallible {
    let (client, topic, group, member) = membership.names();
    loop {
        tokio::time::sleep(MIN_ASSIGNMENT_CHECK).await;
        let Ok(partitions) = client.assignment(topic, group, member).await else {
            continue;
        };
        if partitions.is_empty() {
            continue;
        }
        status.send_if_modified(|status| {
            let changed = status.assignment != partitions;
            status.assignment = partitions;
            changed
        });
    }
}

/// The back-off between attempts to reach the server again: doubling from 50 ms to 3.2 s.
fn backoff(attempt: u32) -> Duration {
    Duration::from_millis(50 << attempt.min(6))
}

impl Consumer {
    /// The settings of a consumer of `topic` in `group`; [`ConsumerBuilder::start`] starts it.
    ///
    /// ```
    /// let builder = broker_client::Consumer::builder("orders", "billing");
    /// ```
    pub fn builder(topic: impl Into<String>, group: impl Into<String>) -> ConsumerBuilder {
        ConsumerBuilder {
            topic: topic.into(),
            group: group.into(),
            member: None,
            mode: ConsumeMode::Ack,
            max_records: 64,
            max_wait: Duration::from_secs(1),
            auto_commit: Some(Duration::from_secs(5)),
            assignor: None,
            settings: Vec::new(),
        }
    }

    /// Changes the most records each later batch holds (see
    /// [`ConsumerBuilder::max_records`]): to take exactly as many as are still wanted, so that
    /// none is delivered that is not handled (in ack mode, a delivery left unacknowledged is
    /// delivered again, and counts towards the group's maximum of deliveries).
    ///
    /// # Errors
    /// [`BrokerError::InvalidArgument`] for a count outside 1 to the mode's maximum
    /// ([`MAX_POLL_RECORDS`] in ack mode, [`MAX_FETCH_RECORDS`] in fetch mode); the consumer
    /// keeps the count it had.
    ///
    /// ```no_run
    /// # async fn run(mut consumer: broker_client::Consumer) -> Result<(), broker_client::Error> {
    /// // The last three records wanted.
    /// consumer.set_max_records(3)?;
    /// let batch = consumer.next_batch().await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn set_max_records(&mut self, records: i32) -> Result<(), Error> {
        check_max_records(self.settings.mode, records)?;
        self.settings.max_records = records;
        Ok(())
    }

    /// The member id this consumer joined as.
    ///
    /// ```no_run
    /// # fn run(consumer: broker_client::Consumer) {
    /// println!("consuming as {}", consumer.member());
    /// # }
    /// ```
    pub fn member(&self) -> &str {
        &self.membership.member
    }

    /// A watch of where the consumer stands: its current partitions (updated when the group
    /// rebalances, checked once per [`ConsumerBuilder::max_wait`] while it takes records, but
    /// not more than once a second),
    /// and whether it is reconnecting.
    ///
    /// ```no_run
    /// # fn run(consumer: broker_client::Consumer) {
    /// println!("partitions now {:?}", consumer.status().borrow().assignment);
    /// # }
    /// ```
    pub fn status(&self) -> watch::Receiver<ConsumerStatus> {
        self.status.subscribe()
    }

    /// The next records: waits up to the consumer's maximum wait for some to arrive and
    /// returns them (`[]` if none came). Commits first in fetch mode when the auto-commit
    /// interval has passed. Losing the server is not an error: the consumer reconnects and
    /// re-joins (which may take longer than the wait). Cancel safe: a call given up on (its
    /// future dropped by a `select!` or a timeout) loses nothing; the next call gets back the
    /// records the server may have handed to it, and no commit moves past them meanwhile.
    ///
    /// # Errors
    /// What a retry cannot mend: the topic or group was deleted, the group refuses the member
    /// (other settings, its maximum of members), the server refuses the client (wrong token).
    ///
    /// ```no_run
    /// # async fn run(mut consumer: broker_client::Consumer) -> Result<(), broker_client::Error> {
    /// loop {
    ///     let batch = consumer.next_batch().await?;
    ///     for delivery in &batch {
    ///         delivery.ack_later();
    ///     }
    /// }
    /// # }
    /// ```
    pub async fn next_batch(&mut self) -> Result<Vec<Delivery>, Error> {
        let mut attempt = 0;
        loop {
            match self.take().await {
                Ok(records) => {
                    self.status
                        .send_if_modified(|status| status.reconnecting.take().is_some());
                    let membership = &self.membership;
                    return Ok(records
                        .into_iter()
                        .map(|record| Delivery {
                            record,
                            membership: Arc::clone(membership),
                        })
                        .collect());
                }
                Err(error) if error.is_retriable() => {
                    tracing::debug!(%error, attempt, "consumer lost the server; reconnecting");
                    self.joined = false;
                    self.recover = true;
                    self.status.send_modify(|status| {
                        status.assignment.clear();
                        status.reconnecting = Some(error.to_string());
                    });
                    tokio::time::sleep(backoff(attempt)).await;
                    attempt += 1;
                }
                Err(error) => return Err(error),
            }
        }
    }

    /// The records one at a time, for as long as the consumer lives: each batch of
    /// [`Consumer::next_batch`] in order, waiting as long as it takes for the next record. An
    /// error is given once and the stream goes on.
    ///
    /// ```no_run
    /// # async fn run(mut consumer: broker_client::Consumer) -> Result<(), broker_client::Error> {
    /// use futures::StreamExt;
    ///
    /// let mut records = consumer.stream().take(100);
    /// while let Some(delivery) = records.next().await {
    ///     delivery?.ack().await?;
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub fn stream(&mut self) -> BoxStream<'_, Result<Delivery, Error>> {
        futures::stream::unfold(
            (self, VecDeque::new()),
            |(consumer, mut ready)| async move {
                loop {
                    if let Some(delivery) = ready.pop_front() {
                        return Some((Ok(delivery), (consumer, ready)));
                    }
                    match consumer.next_batch().await {
                        Ok(batch) => ready.extend(batch),
                        Err(error) => return Some((Err(error), (consumer, ready))),
                    }
                }
            },
        )
        .boxed()
    }

    /// Fetch mode: commits the group's offsets just past every record handed out so far.
    /// Nothing to do in ack mode, where each acknowledgement commits.
    ///
    /// # Errors
    /// As [`Client::commit`], once a connection lost in a blip was tried again (a few times).
    ///
    /// ```no_run
    /// # async fn run(mut consumer: broker_client::Consumer) -> Result<(), broker_client::Error> {
    /// // A consumer built with `.mode(ConsumeMode::Fetch).auto_commit(None)`.
    /// let batch = consumer.next_batch().await?;
    /// println!("{} records handled", batch.len());
    /// consumer.commit().await?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn commit(&mut self) -> Result<(), Error> {
        if self.settings.mode != ConsumeMode::Fetch || !self.joined {
            return Ok(());
        }
        // A take given up on may have moved the positions past records not handed out yet.
        let not_past = self.settle_pending().await?;
        let (client, topic, group, member) = self.membership.names();
        // Again after a connection lost in a blip: committing the same positions twice is
        // harmless.
        with_retries("committing", || client.commit(topic, group, member, None)).await?;
        if !not_past.is_empty() {
            with_retries("committing", || {
                client.commit(topic, group, member, Some(not_past.clone()))
            })
            .await?;
        }
        self.committed = Instant::now();
        Ok(())
    }

    /// Fetch mode: commits exactly `offsets` (partition to the next offset to consume), as
    /// [`Client::commit`] with offsets does: for a service that finished only some of the
    /// records handed out. The next automatic commit moves past every record handed out again.
    ///
    /// # Errors
    /// As [`Client::commit`]; `NotAssigned` for a partition this member does not own;
    /// `InvalidArgument` in ack mode, where a group's offsets move as its records are
    /// acknowledged (nothing is sent).
    ///
    /// ```no_run
    /// # async fn run(mut consumer: broker_client::Consumer) -> Result<(), broker_client::Error> {
    /// use std::collections::BTreeMap;
    ///
    /// // Partition 3 is done up to offset 41: its next record to consume is 42.
    /// consumer.commit_offsets(BTreeMap::from([(3, 42)])).await?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn commit_offsets(&mut self, offsets: BTreeMap<i32, i64>) -> Result<(), Error> {
        if self.settings.mode != ConsumeMode::Fetch {
            return Err(Error::Broker(BrokerError::InvalidArgument(
                "commit_offsets is for a consumer in fetch mode: in ack mode the group's offsets \
                 move as its records are acknowledged"
                    .to_owned(),
            )));
        }
        let (client, topic, group, member) = self.membership.names();
        client.commit(topic, group, member, Some(offsets)).await?;
        self.committed = Instant::now();
        Ok(())
    }

    /// Sends the acknowledgements [`Delivery::ack_later`] queued (ack mode) or commits (fetch
    /// mode with automatic commits), and leaves the group, so that the others take its
    /// partitions over at once.
    ///
    /// # Errors
    /// As [`Client::commit`] and [`Client::leave`]; the member leaves even when the commit
    /// fails, and the error is the commit's.
    ///
    /// ```no_run
    /// # async fn run(consumer: broker_client::Consumer) -> Result<(), broker_client::Error> {
    /// // On shutdown: the group's other members take the partitions over at once.
    /// consumer.close().await?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn close(mut self) -> Result<(), Error> {
        self.closed = true;
        let committed = self.settle().await;
        let (client, topic, group, member) = self.membership.names();
        let left = with_retries("leaving the group", || client.leave(topic, group, member)).await;
        committed.and(left.map(drop))
    }

    /// As [`Consumer::close`], without leaving the group: the member keeps its partitions until
    /// the server removes it after its session timeout (or another consumer with its member id
    /// takes its place).
    ///
    /// # Errors
    /// As [`Client::commit`].
    ///
    /// ```no_run
    /// # async fn run(consumer: broker_client::Consumer) -> Result<(), broker_client::Error> {
    /// // A restart under the same member id follows: keep the partitions meanwhile.
    /// consumer.close_and_stay().await?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn close_and_stay(mut self) -> Result<(), Error> {
        self.closed = true;
        self.settle().await
    }

    /// Sends the queued acknowledgements, and commits if the consumer commits by itself.
    async fn settle(&mut self) -> Result<(), Error> {
        self.membership.flush_later().await?;
        if self.settings.auto_commit.is_none() {
            return Ok(());
        }
        self.commit().await
    }

    /// One round: joins if needed, checks the assignment when due, commits when due, then
    /// takes records. While a request waits longer than [`MIN_ASSIGNMENT_CHECK`] for records,
    /// the assignment is checked beside it once a second, so that a rebalance shows in the
    /// status while the consumer waits.
    async fn take(&mut self) -> Result<Vec<BrokerRecord>, Error> {
        if !self.kept.is_empty() {
            return Ok(std::mem::take(&mut self.kept));
        }
        if self.pending.is_none() {
            if !self.joined {
                self.join().await?;
            } else if self.checked.elapsed() >= self.settings.max_wait.max(MIN_ASSIGNMENT_CHECK) {
                self.check_assignment().await?;
            }
            let commit = self.settings.mode == ConsumeMode::Fetch
                && self
                    .settings
                    .auto_commit
                    .is_some_and(|interval| self.committed.elapsed() >= interval);
            // A delivery an acknowledgement could not settle is still reserved to the member,
            // and no poll would give it back.
            let unsettled = self
                .membership
                .unsettled
                .swap(false, std::sync::atomic::Ordering::Relaxed);
            let request = request(
                Arc::clone(&self.membership),
                self.settings.mode,
                self.recover || unsettled,
                commit,
                (self.settings.max_records, self.settings.max_wait),
            );
            // On a task of its own: a take given up on (its future dropped by a `select!` or
            // a timeout) leaves its request on its way, and the next take gets its answer,
            // with whatever records the server handed to the member meanwhile.
            self.pending = Some(Pending {
                answer: tokio::spawn(request),
                commit,
            });
        }
        let Some(pending) = self.pending.as_mut() else {
            unreachable!("a take's request was just made");
        };
        let answer = if self.settings.max_wait > MIN_ASSIGNMENT_CHECK {
            tokio::select! {
                answer = &mut pending.answer => answer,
                never = watch_assignment(&self.membership, &self.status) => match never {},
            }
        } else {
            (&mut pending.answer).await
        };
        let commit = pending.commit;
        self.pending = None;
        let records = answer.map_err(|stopped| {
            Error::ConnectionLost(format!("the consumer's request stopped: {stopped}"))
        })??;
        if commit {
            self.committed = Instant::now();
        }
        self.recover = false;
        Ok(records)
    }

    /// The answer of a take given up on (see [`Consumer::take`]), awaited: its records, which
    /// the server handed to the member, are kept to be handed out first; returns the first
    /// offset of each of their partitions, past which a commit of the positions must not move
    /// (the server's positions are past them). Empty when no take is on its way.
    async fn settle_pending(&mut self) -> Result<BTreeMap<i32, i64>, Error> {
        let Some(pending) = self.pending.take() else {
            return Ok(BTreeMap::new());
        };
        let records = pending.answer.await.map_err(|stopped| {
            Error::ConnectionLost(format!("the consumer's request stopped: {stopped}"))
        })??;
        let mut first = BTreeMap::new();
        for record in &records {
            first.entry(record.partition).or_insert(record.offset);
        }
        self.kept.extend(records);
        Ok(first)
    }

    /// Joins the group (again). In fetch mode, at start and after losing the server, a member
    /// that is still in the group first has its positions moved back to the group's committed
    /// offsets: a fetch answer that was lost (or an earlier consumer of the same member id) had
    /// moved them past records this consumer never got. (A member that joins anew needs
    /// nothing: joining rebalances, and a rebalance moves positions to the committed offsets.)
    async fn join(&mut self) -> Result<(), Error> {
        let (client, topic, group, member) = self.membership.names();
        if self.settings.mode == ConsumeMode::Fetch && self.recover {
            let held = client.assignment(topic, group, member).await?;
            if !held.is_empty() {
                // Shifting by nothing moves positions to the committed offsets and never moves
                // a committed offset, even if a partition changed hands meanwhile.
                client
                    .reset_group(topic, group, Some(&held), ResetTo::ShiftBy(0))
                    .await?;
            }
        }
        let partitions = client
            .join_group(
                topic,
                group,
                member,
                self.settings.assignor,
                &self.settings.settings,
            )
            .await?;
        let rejoin = self.status.borrow().reconnecting.is_some();
        self.joined = true;
        self.checked = Instant::now();
        self.status.send_if_modified(|status| {
            let changed = status.assignment != partitions || rejoin;
            status.assignment = partitions;
            if rejoin {
                status.rejoins += 1;
            }
            changed
        });
        Ok(())
    }

    /// Asks for the member's partitions; none means it may have been removed (its session
    /// expired), and it joins again, which changes nothing if it was still there.
    async fn check_assignment(&mut self) -> Result<(), Error> {
        let (client, topic, group, member) = self.membership.names();
        let partitions = client.assignment(topic, group, member).await?;
        if partitions.is_empty() {
            return self.join().await;
        }
        self.checked = Instant::now();
        self.status.send_if_modified(|status| {
            let changed = status.assignment != partitions;
            status.assignment = partitions;
            changed
        });
        Ok(())
    }
}

impl Drop for Consumer {
    /// Leaves the group (after committing, in fetch mode) from a task of the current runtime,
    /// unless [`Consumer::close`] did.
    fn drop(&mut self) {
        if self.closed {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let membership = Arc::clone(&self.membership);
        // Not past the records of a take on its way, which no one waits for any more: the
        // group's next member gets them from the committed offsets.
        let commit = self.settings.mode == ConsumeMode::Fetch
            && self.settings.auto_commit.is_some()
            && self.joined
            && self.pending.is_none();
        runtime.spawn(async move {
            let (client, topic, group, member) = membership.names();
            if let Err(error) = membership.flush_later().await {
                tracing::debug!(%error, "a dropped consumer could not acknowledge");
            }
            if commit {
                if let Err(error) = client.commit(topic, group, member, None).await {
                    tracing::debug!(%error, "a dropped consumer could not commit");
                }
            }
            if let Err(error) = client.leave(topic, group, member).await {
                tracing::debug!(%error, "a dropped consumer could not leave its group");
            }
        });
    }
}

/// Refuses a count of records per batch outside 1 to `mode`'s maximum.
fn check_max_records(mode: ConsumeMode, records: i32) -> Result<(), Error> {
    let (most, name) = match mode {
        ConsumeMode::Ack => (MAX_POLL_RECORDS, "ack"),
        ConsumeMode::Fetch => (MAX_FETCH_RECORDS, "fetch"),
    };
    if (1..=most).contains(&records) {
        return Ok(());
    }
    Err(Error::Broker(BrokerError::InvalidArgument(format!(
        "a consumer in {name} mode takes 1 to {most} records per request, not {records}"
    ))))
}
