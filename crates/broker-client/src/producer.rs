//! [`Producer`]: records sent from any number of tasks, gathered into batches per partition,
//! stored exactly once, retried while their partition is full, each answered when it is stored.

use std::collections::VecDeque;
use std::future::Future;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use broker_core::{
    hash, BrokerError, Command, KeyHash, PartitionBatch, PublishRecord, TopicSettings,
    MAX_BATCH_RECORDS,
};
use futures::stream::{FuturesUnordered, StreamExt};
use tokio::sync::{mpsc, oneshot, Notify};
use tokio::time::Instant;

use crate::{Client, Error, ProducerError};

/// Where a record was stored.
///
/// ```no_run
/// # async fn run(producer: broker_client::Producer) -> Result<(), broker_client::ProducerError> {
/// use broker_client::PublishRecord;
///
/// let stored = producer.send("orders", PublishRecord::keyed(Some(b"alice"), "order 1")).await?;
/// println!("stored at partition {} offset {}", stored.partition, stored.offset);
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Stored {
    /// The partition.
    pub partition: i32,
    /// The record's offset there.
    pub offset: i64,
}

/// How a [`Producer`] batches and retries; see [`Producer::builder`].
///
/// ```no_run
/// use std::time::Duration;
///
/// use broker_client::{Client, Producer};
///
/// # async fn run() -> Result<(), broker_client::Error> {
/// let producer = Producer::builder()
///     .linger(Duration::from_millis(5))
///     .batch_records(500)
///     .batch_bytes(256 * 1024)
///     .delivery_timeout(Duration::from_secs(30))
///     .build(Client::connect("127.0.0.1:9092").await?);
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct ProducerBuilder {
    linger: Duration,
    batch_records: usize,
    batch_bytes: usize,
    delivery_timeout: Duration,
}

impl Default for ProducerBuilder {
    fn default() -> Self {
        ProducerBuilder {
            linger: Duration::ZERO,
            batch_records: 1_000,
            batch_bytes: 1024 * 1024,
            delivery_timeout: Duration::from_secs(120),
        }
    }
}

impl ProducerBuilder {
    /// How long a partition's batch waits for more records once it has one (Kafka's
    /// `linger.ms`). Zero by default: a batch goes as soon as the partition's previous one is
    /// answered, with every record sent meanwhile, so batches grow with the load by
    /// themselves; a linger gathers bigger ones under a light load, at that much latency.
    ///
    /// ```
    /// # use std::time::Duration;
    /// // Wait up to 5 ms for more records to a partition before sending its batch.
    /// let builder = broker_client::Producer::builder().linger(Duration::from_millis(5));
    /// ```
    #[must_use]
    pub fn linger(mut self, linger: Duration) -> Self {
        self.linger = linger;
        self
    }

    /// Most records of one partition in one request, 1 to 10,000 (1,000 by default). A request
    /// carries the batches of several partitions, up to 10,000 records and the server's frame
    /// limit in all: the partitions left out go in the next request.
    ///
    /// ```
    /// let builder = broker_client::Producer::builder().batch_records(100);
    /// ```
    #[must_use]
    pub fn batch_records(mut self, records: usize) -> Self {
        self.batch_records = records.clamp(1, broker_core::MAX_BATCH_RECORDS);
        self
    }

    /// Most payload, key and header bytes of one partition in one request, past the first
    /// record (1 MiB by default). A request holds no more than the server's frame limit in
    /// all: the partitions left out go in the next request.
    ///
    /// ```
    /// let builder = broker_client::Producer::builder().batch_bytes(64 * 1024);
    /// ```
    #[must_use]
    pub fn batch_bytes(mut self, bytes: usize) -> Self {
        self.batch_bytes = bytes.max(1);
        self
    }

    /// How long a record may take to be stored, retries included (Kafka's
    /// `delivery.timeout.ms`): past it, a record still refused because its partition is full
    /// fails with [`ProducerError::Full`], one that could not be sent with
    /// [`ProducerError::Timeout`]. 2 minutes by default.
    ///
    /// ```
    /// # use std::time::Duration;
    /// // Give up on a record after 10 s instead of 2 minutes.
    /// let builder = broker_client::Producer::builder().delivery_timeout(Duration::from_secs(10));
    /// ```
    #[must_use]
    pub fn delivery_timeout(mut self, timeout: Duration) -> Self {
        self.delivery_timeout = timeout;
        self
    }

    /// A producer sending through `client` (which it shares: clones of one client share one
    /// connection).
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), broker_client::Error> {
    /// use broker_client::{Client, Producer};
    ///
    /// let client = Client::connect("127.0.0.1:9092").await?;
    /// let producer = Producer::builder().build(client.clone());
    /// // The client is still there for other calls, on the same connection.
    /// let description = client.describe_topic("orders").await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn build(self, client: Client) -> Producer {
        Producer {
            inner: Arc::new(Inner {
                client,
                id: random_id(),
                settings: self,
                topics: Mutex::new(hashbrown::HashMap::new()),
                unsettled: Arc::new(Unsettled::default()),
            }),
        }
    }
}

/// Sends records to a broker the way a service wants to: from any number of tasks at once,
/// gathered into one request per partition (per its linger time and batch size), each stored
/// exactly once, the records of one partition in the order they were sent, a full partition
/// retried with back-off, and each record answered with where it was stored.
///
/// Exactly once: the producer has a random id and numbers the records of each partition; the
/// broker stores a record it already has (a batch sent again after a timeout or a lost
/// connection) only once, and answers with its first offset. The connection is re-opened as
/// [`Client`] does. Placement is as [`Client::publish_keyed`]: a key picks the partition with
/// the topic's key hash, no key goes round-robin, [`PublishRecord::partition`] names one. A
/// producer learns a topic's partitions when it first sends to it; after partitions are added
/// to a topic, a new producer sees them.
///
/// Clones share one producer (its id, its connection and its batches): give each task of a
/// service a clone rather than a producer of its own, so that all their records to a partition
/// go in one batch, as Kafka advises one producer per process.
///
/// ```no_run
/// use broker_client::{Client, Producer, PublishRecord};
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let producer = Producer::builder().build(Client::connect("127.0.0.1:9092").await?);
/// let stored = producer
///     .send("orders", PublishRecord::keyed(Some(b"alice"), "order 1"))
///     .await?;
/// println!("partition {} offset {}", stored.partition, stored.offset);
/// // Many at once: each send is gathered into batches as soon as it is called.
/// let sends: Vec<_> = (0..100)
///     .map(|i| producer.send("orders", PublishRecord::keyed(None, format!("order {i}"))))
///     .collect();
/// for sent in futures::future::join_all(sends).await {
///     sent?;
/// }
/// producer.flush().await;
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct Producer {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    client: Client,
    /// The id the broker knows this producer by.
    id: u64,
    settings: ProducerBuilder,
    /// Looked up on every send: hashed with foldhash, not SipHash.
    topics: Mutex<hashbrown::HashMap<String, Topic>>,
    /// Records sent and not yet answered, for `flush`.
    unsettled: Arc<Unsettled>,
}

/// A topic a producer sends to.
#[derive(Debug)]
enum Topic {
    /// Being looked up; the records sent meanwhile wait here, in the order they were sent.
    LookingUp(Vec<Queued>),
    /// Known: records go to the inbox of its sending task.
    Known(TopicSender),
}

/// A topic's placement of records, and the inbox of its sending task.
#[derive(Debug)]
struct TopicSender {
    key_hash: KeyHash,
    partitions: usize,
    /// The most bytes a partition keeps, if the topic has such a limit: a larger record could
    /// never be stored.
    max_bytes: Option<u64>,
    /// The most bytes of payload, key and headers of one record the server takes, as it said
    /// when the topic was looked up.
    max_payload: usize,
    inbox: Arc<Inbox>,
    next_keyless: AtomicUsize,
}

impl Drop for TopicSender {
    fn drop(&mut self) {
        // The producer is gone: the sending task sends what it has, then ends.
        self.inbox.close();
    }
}

/// Records on their way to a topic's sending task, with the index of their partition. The
/// task takes them all at once, and is woken only by the first record after it took them: a
/// lock and a push per record, where a channel costs a slot, a permit and a wake attempt per
/// record.
#[derive(Debug, Default)]
struct Inbox {
    state: Mutex<InboxState>,
    ready: Notify,
}

#[derive(Debug, Default)]
struct InboxState {
    records: Vec<(usize, Queued)>,
    /// No record comes any more.
    closed: bool,
}

impl Inbox {
    /// Adds a record for `partition`, or answers it [`ProducerError::Closed`] if the inbox is
    /// closed.
    fn push(&self, partition: usize, queued: Queued) {
        let mut state = lock(&self.state);
        if state.closed {
            drop(state);
            queued.waiter.answer.send(Err(ProducerError::Closed));
            return;
        }
        let first = state.records.is_empty();
        state.records.push((partition, queued));
        drop(state);
        if first {
            self.ready.notify_one();
        }
    }

    fn close(&self) {
        lock(&self.state).closed = true;
        self.ready.notify_one();
    }

    /// Closes the inbox for good when the sending task ends, or is dropped with its runtime: the
    /// records left in it, and any sent later, are answered [`ProducerError::Closed`] instead of
    /// waiting for ever.
    fn shut(&self) {
        let left = {
            let mut state = lock(&self.state);
            state.closed = true;
            std::mem::take(&mut state.records)
        };
        for (_, queued) in left {
            queued.waiter.answer.send(Err(ProducerError::Closed));
        }
    }

    /// Swaps the records waiting with `into` (empty, its capacity kept for the next time);
    /// whether the inbox is closed.
    fn take(&self, into: &mut Vec<(usize, Queued)>) -> bool {
        let mut state = lock(&self.state);
        std::mem::swap(&mut state.records, into);
        state.closed
    }
}

/// A record waiting to be stored, and who waits for the answer.
#[derive(Debug)]
struct Queued {
    record: PublishRecord,
    waiter: Waiter,
}

/// A record's sender, waiting for its answer while the record is on its way in a request.
#[derive(Debug)]
struct Waiter {
    sent_at: Instant,
    /// The record's payload, key and header bytes.
    size: usize,
    deadline: Instant,
    answer: Answer,
}

/// How many records are sent and not yet answered, and a notification when that becomes zero.
#[derive(Debug, Default)]
struct Unsettled {
    count: AtomicUsize,
    settled: Notify,
}

/// What became of one record sent with [`Producer::send_reported`]: the tag it was sent with,
/// and where it was stored or why it was not.
///
/// ```no_run
/// # async fn run(producer: broker_client::Producer) {
/// use broker_client::PublishRecord;
/// use tokio::sync::mpsc;
///
/// let (deliveries, mut reports) = mpsc::unbounded_channel();
/// producer.send_reported("orders", PublishRecord::keyed(None, "order 7"), 7_u32, &deliveries);
/// drop(deliveries);
/// while let Some(report) = reports.recv().await {
///     match report.result {
///         Ok(stored) => println!("order {} at {}@{}", report.tag, stored.partition, stored.offset),
///         Err(error) => eprintln!("order {} not stored: {error}", report.tag),
///     }
/// }
/// # }
/// ```
#[derive(Debug)]
pub struct DeliveryReport<T> {
    /// The tag given to [`Producer::send_reported`] with the record.
    pub tag: T,
    /// Where the record was stored, or why it was not (as [`Producer::send`] answers).
    pub result: Result<Stored, ProducerError>,
}

/// Reports a record's result into a channel (never runs code of the caller's, so it may be
/// called with the producer's locks held).
type Report = Box<dyn FnOnce(Result<Stored, ProducerError>) + Send>;

/// Where a record's result goes: the future [`Producer::send`] returned, or a channel of
/// [`DeliveryReport`] reports.
enum Reply {
    Future(oneshot::Sender<Result<Stored, ProducerError>>),
    Report(Report),
}

impl std::fmt::Debug for Reply {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Reply::Future(_) => "Future",
            Reply::Report(_) => "Report",
        })
    }
}

/// Where a record's answer goes. The record counts as unsettled until it is answered (or its
/// answer is dropped), whether or not anyone still awaits its `send`.
#[derive(Debug)]
struct Answer {
    reply: Option<Reply>,
    unsettled: Arc<Unsettled>,
}

impl Answer {
    fn new(
        unsettled: &Arc<Unsettled>,
    ) -> (Answer, oneshot::Receiver<Result<Stored, ProducerError>>) {
        let (reply, receiver) = oneshot::channel();
        (Answer::to(unsettled, Reply::Future(reply)), receiver)
    }

    fn to(unsettled: &Arc<Unsettled>, reply: Reply) -> Answer {
        unsettled.count.fetch_add(1, Ordering::AcqRel);
        Answer {
            reply: Some(reply),
            unsettled: Arc::clone(unsettled),
        }
    }

    /// Answers the sender, if it still waits.
    fn send(mut self, result: Result<Stored, ProducerError>) {
        match self.reply.take() {
            // The sender may have dropped its future: the record is answered all the same.
            Some(Reply::Future(reply)) => drop(reply.send(result)),
            Some(Reply::Report(report)) => report(result),
            None => {}
        }
    }
}

impl Drop for Answer {
    fn drop(&mut self) {
        if self.unsettled.count.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.unsettled.settled.notify_waiters();
        }
    }
}

/// A random producer id: the process's random hashing keys over the time, the process id and
/// a counter.
pub(crate) fn random_id() -> u64 {
    static COUNT: AtomicU64 = AtomicU64::new(0);
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u64(COUNT.fetch_add(1, Ordering::Relaxed));
    hasher.write_u32(std::process::id());
    if let Ok(since) = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
        hasher.write_u128(since.as_nanos());
    }
    hasher.finish()
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Nothing panics while holding it.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Producer {
    /// The settings of a new producer; [`ProducerBuilder::build`] makes it.
    ///
    /// ```
    /// let builder = broker_client::Producer::builder();
    /// ```
    pub fn builder() -> ProducerBuilder {
        ProducerBuilder::default()
    }

    /// The id the broker knows this producer by (random, chosen when it was built).
    ///
    /// ```no_run
    /// # fn run(producer: broker_client::Producer) {
    /// println!("producer {:016x}", producer.id());
    /// # }
    /// ```
    pub fn id(&self) -> u64 {
        self.inner.id
    }

    /// Sends `record` to `topic`: the returned future resolves once it is stored (with where)
    /// or has definitely failed. The record is queued when `send` is called, so that records
    /// sent one after another from one task are batched and keep their order per partition;
    /// dropping the future does not withdraw it.
    ///
    /// # Errors
    /// [`ProducerError::Full`] or [`ProducerError::Timeout`] after the delivery timeout,
    /// [`ProducerError::Refused`] at once for a record the broker refuses (an unknown topic or
    /// partition, a record over the payload limit), [`ProducerError::Closed`] if the producer
    /// is dropped first.
    ///
    /// ```no_run
    /// # async fn run(producer: broker_client::Producer) -> Result<(), broker_client::ProducerError> {
    /// use broker_client::{Header, PublishRecord};
    ///
    /// let record = PublishRecord::keyed(Some(b"alice"), "order 1")
    ///     .with_headers(vec![Header::new("source", "web")]);
    /// let stored = producer.send("orders", record).await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn send(
        &self,
        topic: &str,
        record: PublishRecord,
    ) -> impl Future<Output = Result<Stored, ProducerError>> + Send + 'static {
        let (answer, receiver) = Answer::new(&self.inner.unsettled);
        self.queue(topic, record, answer);
        async move { receiver.await.unwrap_or(Err(ProducerError::Closed)) }
    }

    /// Sends `record` to `topic` as [`Producer::send`] does, but reports its result as a
    /// [`DeliveryReport`] with `tag` into `deliveries` instead of returning a future: a program
    /// sending many records need not keep a future per record, and reads the reports where and
    /// when it likes (as a delivery report callback of other clients, run by the reader's own
    /// task). Every record sent is reported exactly once, in the order its partition stored
    /// them; a report whose receiver is gone is dropped. [`Producer::flush`] waits for these
    /// records too.
    ///
    /// ```no_run
    /// # async fn run(producer: broker_client::Producer) {
    /// use broker_client::PublishRecord;
    /// use tokio::sync::mpsc;
    ///
    /// let (deliveries, mut reports) = mpsc::unbounded_channel();
    /// for i in 0..1_000 {
    ///     let record = PublishRecord::keyed(None, format!("order {i}"));
    ///     producer.send_reported("orders", record, i, &deliveries);
    /// }
    /// drop(deliveries);
    /// while let Some(delivery) = reports.recv().await {
    ///     if let Err(error) = delivery.result {
    ///         eprintln!("order {} not stored: {error}", delivery.tag);
    ///     }
    /// }
    /// # }
    /// ```
    pub fn send_reported<T: Send + 'static>(
        &self,
        topic: &str,
        record: PublishRecord,
        tag: T,
        deliveries: &mpsc::UnboundedSender<DeliveryReport<T>>,
    ) {
        let deliveries = deliveries.clone();
        let report: Report = Box::new(move |result| {
            // The receiver may be gone: nobody wants the report.
            let _ = deliveries.send(DeliveryReport { tag, result });
        });
        let answer = Answer::to(&self.inner.unsettled, Reply::Report(report));
        self.queue(topic, record, answer);
    }

    /// Queues `record` for `topic`, answered through `answer`.
    fn queue(&self, topic: &str, record: PublishRecord, answer: Answer) {
        let now = Instant::now();
        let queued = Queued {
            waiter: Waiter {
                sent_at: now,
                size: record.size(),
                deadline: crate::deadline::after(now, self.inner.settings.delivery_timeout),
                answer,
            },
            record,
        };
        self.inner.queue(topic, queued);
    }

    /// Waits until every record sent so far is stored or has failed, whether or not its `send`
    /// is still awaited.
    ///
    /// ```no_run
    /// # async fn run(producer: broker_client::Producer) {
    /// use broker_client::PublishRecord;
    ///
    /// for i in 0..1_000 {
    ///     // Not awaited: each record is answered all the same.
    ///     drop(producer.send("orders", PublishRecord::keyed(None, format!("order {i}"))));
    /// }
    /// producer.flush().await;
    /// # }
    /// ```
    pub async fn flush(&self) {
        loop {
            let settled = self.inner.unsettled.settled.notified();
            if self.inner.unsettled.count.load(Ordering::Acquire) == 0 {
                return;
            }
            settled.await;
        }
    }
}

impl Inner {
    /// Queues `queued` for `topic`: on its partition when the topic is known, otherwise behind
    /// the records waiting for the topic to be looked up (the first of them starts the lookup).
    fn queue(self: &Arc<Self>, topic: &str, queued: Queued) {
        let mut topics = lock(&self.topics);
        match topics.get_mut(topic) {
            Some(Topic::Known(sender)) => sender.queue(queued),
            Some(Topic::LookingUp(waiting)) => waiting.push(queued),
            None => {
                topics.insert(topic.to_owned(), Topic::LookingUp(vec![queued]));
                tokio::spawn(Arc::clone(self).look_up(topic.to_owned()));
            }
        }
    }

    /// Looks `topic` up (again while the server cannot be reached, until the first waiting
    /// record's delivery timeout), starts a sending task per partition and queues the records
    /// that waited, in the order they were sent; or fails them all.
    async fn look_up(self: Arc<Self>, topic: String) {
        let mut attempt = 0;
        let description = loop {
            let error = match self.client.describe_topic(&topic).await {
                // A topic has at least one partition: records could go nowhere.
                Ok(description) if description.partitions.is_empty() => {
                    break Err(Error::Protocol(format!(
                        "the server described topic {topic:?} without partitions"
                    )))
                }
                Ok(description) => break Ok(description),
                Err(error) => error,
            };
            let give_up = !error.is_retriable()
                || match lock(&self.topics).get(&topic) {
                    Some(Topic::LookingUp(waiting)) => waiting
                        .first()
                        .is_none_or(|queued| queued.waiter.deadline <= Instant::now()),
                    _ => true,
                };
            if give_up {
                break Err(error);
            }
            tokio::time::sleep(backoff(attempt)).await;
            attempt += 1;
        };
        let mut topics = lock(&self.topics);
        let Some(Topic::LookingUp(waiting)) = topics.remove(&topic) else {
            return;
        };
        match description {
            Ok(description) => {
                let partitions = description.partitions.len();
                let max_bytes = TopicSettings::from_list(&description.settings)
                    .ok()
                    .and_then(|settings| settings.max_bytes);
                let inbox = Arc::new(Inbox::default());
                tokio::spawn(send_topic(
                    self.client.clone(),
                    self.id,
                    topic.clone(),
                    partitions,
                    self.settings.clone(),
                    // Shut even if the task is dropped before it first runs.
                    ShutOnDrop(Arc::clone(&inbox)),
                ));
                let sender = TopicSender {
                    key_hash: description.key_hash,
                    partitions,
                    max_bytes,
                    max_payload: self.client.server_limits().max_payload_bytes as usize,
                    inbox,
                    next_keyless: AtomicUsize::new(0),
                };
                for queued in waiting {
                    sender.queue(queued);
                }
                topics.insert(topic, Topic::Known(sender));
            }
            Err(error) => {
                for queued in waiting {
                    let last = error.copy();
                    let failure = if error.is_retriable() {
                        ProducerError::Timeout { last }
                    } else {
                        ProducerError::Refused(last)
                    };
                    queued.waiter.answer.send(Err(failure));
                }
            }
        }
    }
}

impl TopicSender {
    /// Queues a record on its partition, or answers it at once when it names a partition the
    /// topic does not have or is larger than a partition of the topic keeps.
    fn queue(&self, mut queued: Queued) {
        let size = queued.waiter.size;
        if size > self.max_payload {
            // Refused alone: in a request, the server would refuse every record beside it.
            let refused = Error::Broker(BrokerError::InvalidArgument(format!(
                "a record of {size} bytes (payload, key and headers) is larger than the \
                 server takes ({} bytes)",
                self.max_payload
            )));
            queued
                .waiter
                .answer
                .send(Err(ProducerError::Refused(refused)));
            return;
        }
        if let Some(max) = self.max_bytes.filter(|&max| size as u64 > max) {
            let refused = Error::Broker(BrokerError::InvalidArgument(format!(
                "a record of {size} bytes can never be stored: a partition of the topic keeps \
                 at most {max} bytes"
            )));
            queued
                .waiter
                .answer
                .send(Err(ProducerError::Refused(refused)));
            return;
        }
        let count = self.partitions;
        let partition = match (queued.record.partition, &queued.record.key) {
            (Some(partition), _) => {
                match usize::try_from(partition)
                    .ok()
                    .filter(|&partition| partition < count)
                {
                    Some(partition) => partition,
                    None => {
                        let refused = Error::Broker(BrokerError::InvalidArgument(format!(
                            "partition {partition} does not exist: the topic has partitions 0 to {}",
                            count - 1
                        )));
                        queued
                            .waiter
                            .answer
                            .send(Err(ProducerError::Refused(refused)));
                        return;
                    }
                }
            }
            (None, Some(key)) => hash::partition_for(self.key_hash, key, count),
            (None, None) => self.next_keyless.fetch_add(1, Ordering::Relaxed) % count,
        };
        queued.record.partition = None;
        self.inbox.push(partition, queued);
    }
}

/// The back-off between attempts of a batch: doubling from 1 ms to 256 ms (so that a batch is
/// tried again within a quarter of a second of its partition's room, or of a new leader).
fn backoff(attempt: u32) -> Duration {
    Duration::from_millis(1 << attempt.min(8))
}

/// A topic's sending task: keeps the queued records of each partition, and sends the batches
/// of every partition that is ready in one request. A partition is ready when it has records,
/// no request of it is on its way (so its records are stored in the order they were sent), its
/// back-off after being full has passed and, with a linger, its first record waited that long
/// or its batch is full. Ends when the producer is dropped and every record is answered.
async fn send_topic(
    client: Client,
    producer: u64,
    topic: String,
    partitions: usize,
    settings: ProducerBuilder,
    inbox: ShutOnDrop,
) {
    let mut waiting: Vec<VecDeque<Queued>> = (0..partitions).map(|_| VecDeque::new()).collect();
    // A partition's numbering is here while no request of it is on its way.
    let mut idle: Vec<Option<Numbering>> = (0..partitions)
        .map(|_| Some(Numbering { producer, next: 0 }))
        .collect();
    // After a partition was full: when it may be tried again, and how many times it was.
    let mut not_before: Vec<Option<Instant>> = vec![None; partitions];
    let mut full_attempts: Vec<u32> = vec![0; partitions];
    // Partitions that may be ready: they received records or an answer, or were waiting.
    let mut touched: Vec<usize> = Vec::new();
    let mut later: Vec<usize> = Vec::new();
    let mut on_their_way = FuturesUnordered::new();
    let mut received = Vec::new();
    let mut open = true;
    loop {
        let now = Instant::now();
        let mut parts: Vec<Part> = Vec::new();
        let mut room = RequestRoom::of(&client);
        for partition in touched.drain(..).chain(std::mem::take(&mut later)) {
            let records = &mut waiting[partition];
            let Some(front) = records.front() else {
                continue;
            };
            if idle[partition].is_none() {
                continue;
            }
            let mut ready_at = not_before[partition];
            if open && !settings.is_full(records) {
                ready_at = ready_at.max(Some(crate::deadline::after(
                    front.waiter.sent_at,
                    settings.linger,
                )));
            }
            if ready_at.is_some_and(|at| at > now) {
                later.push(partition);
                continue;
            }
            let Some(numbering) = idle[partition].take() else {
                continue;
            };
            let Some((records, waiters)) = settings.take_batch(records, &mut room) else {
                // The request is full: the partition goes in the next one.
                idle[partition] = Some(numbering);
                later.push(partition);
                continue;
            };
            parts.push(Part {
                partition,
                numbering,
                records,
                waiters,
            });
        }
        // One request per producer id (they differ only after a request timed out).
        while let Some(first) = parts.first() {
            let id = first.numbering.producer;
            let request = if parts.iter().all(|part| part.numbering.producer == id) {
                std::mem::take(&mut parts)
            } else {
                let (request, rest): (Vec<Part>, Vec<Part>) = parts
                    .into_iter()
                    .partition(|part| part.numbering.producer == id);
                parts = rest;
                request
            };
            on_their_way.push(store(&client, &topic, request));
        }
        later.sort_unstable();
        later.dedup();
        if !open && on_their_way.is_empty() && waiting.iter().all(VecDeque::is_empty) {
            return;
        }
        let wake_at = later
            .iter()
            .filter_map(|&partition| {
                let front = waiting[partition].front()?;
                let lingered = (open && !settings.is_full(&waiting[partition]))
                    .then(|| crate::deadline::after(front.waiter.sent_at, settings.linger));
                not_before[partition].max(lingered)
            })
            .min();
        tokio::select! {
            Some(settled) = on_their_way.next(), if !on_their_way.is_empty() => {
                let now = Instant::now();
                for Settled { partition, numbering, full, stored } in settled {
                    idle[partition] = Some(numbering);
                    if stored || full.is_empty() {
                        full_attempts[partition] = 0;
                        not_before[partition] = None;
                    }
                    if !full.is_empty() {
                        not_before[partition] = Some(now + backoff(full_attempts[partition]));
                        full_attempts[partition] += 1;
                        for queued in full.into_iter().rev() {
                            waiting[partition].push_front(queued);
                        }
                    }
                    touched.push(partition);
                }
            }
            () = inbox.0.ready.notified(), if open => {
                let closed = inbox.0.take(&mut received);
                for (partition, queued) in received.drain(..) {
                    waiting[partition].push_back(queued);
                    touched.push(partition);
                }
                // Swapped back into the inbox next time: not kept at the size of a burst.
                received.shrink_to(INBOX_KEPT);
                if closed {
                    // The producer is gone: what is queued still goes, without lingering.
                    open = false;
                    touched.extend(0..partitions);
                }
            },
            () = sleep_until_some(wake_at) => {}
        }
        touched.sort_unstable();
        touched.dedup();
    }
}

/// How many entries the vectors a topic's records pass through keep room for between bursts.
const INBOX_KEPT: usize = 4_096;

/// Shuts a sending task's inbox when the task ends or is dropped.
struct ShutOnDrop(Arc<Inbox>);

impl Drop for ShutOnDrop {
    fn drop(&mut self) {
        self.0.shut();
    }
}

/// Sleeps until `deadline`, or for ever without one.
async fn sleep_until_some(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

impl ProducerBuilder {
    /// Whether `records` fill a batch.
    fn is_full(&self, records: &VecDeque<Queued>) -> bool {
        records.len() >= self.batch_records
            || records
                .iter()
                .map(|queued| queued.waiter.size)
                .sum::<usize>()
                >= self.batch_bytes
    }

    /// The first records of `records` that fit in one batch and in what is left of the
    /// request's `room` (taken from it), apart from their waiters; `None` when not even the
    /// first fits in a request that already holds others.
    fn take_batch(
        &self,
        records: &mut VecDeque<Queued>,
        room: &mut RequestRoom,
    ) -> Option<(Vec<PublishRecord>, Vec<Waiter>)> {
        let mut bytes = 0;
        let mut wire = 0;
        let mut taken = 0;
        for queued in records.iter() {
            let on_the_wire = RequestRoom::wire_bytes(queued);
            if taken == self.batch_records
                || (taken > 0 && bytes >= self.batch_bytes)
                || taken == room.records
                || wire + on_the_wire > room.bytes
            {
                break;
            }
            bytes += queued.waiter.size;
            wire += on_the_wire;
            taken += 1;
        }
        if taken == 0 {
            if !room.is_untouched() {
                return None;
            }
            // Alone in its request, a record always goes (the server takes one of the largest
            // payload in a frame).
            taken = 1;
        }
        room.take(taken, wire);
        // Pushed one by one into vectors of the exact size: `unzip` would grow them by its
        // generic path, which cost more than the records' moves themselves.
        let mut batch = Vec::with_capacity(taken);
        let mut waiters = Vec::with_capacity(taken);
        for queued in records.drain(..taken) {
            batch.push(queued.record);
            waiters.push(queued.waiter);
        }
        Some((batch, waiters))
    }
}

/// What one request may still hold: the server refuses a publish of more than
/// [`MAX_BATCH_RECORDS`] records, and a frame larger than its limit, whole.
struct RequestRoom {
    records: usize,
    bytes: usize,
    untouched: (usize, usize),
}

impl RequestRoom {
    /// Wire bytes of a request besides its records (the command, the topic's name, each
    /// batch's partition and number), allowed for generously.
    const REQUEST_OVERHEAD: usize = 64 * 1024;

    /// Wire bytes of a record besides its payload, key and headers' names and values: the
    /// lengths and options of its fields, and of each header's.
    fn wire_bytes(queued: &Queued) -> usize {
        queued.waiter.size + 64 + 17 * queued.record.headers.len()
    }

    /// The room of a request to the server `client` is connected to.
    fn of(client: &Client) -> RequestRoom {
        let frame = client.server_limits().max_frame_bytes as usize;
        let records = MAX_BATCH_RECORDS;
        let bytes = frame.saturating_sub(Self::REQUEST_OVERHEAD).max(frame / 2);
        RequestRoom {
            records,
            bytes,
            untouched: (records, bytes),
        }
    }

    fn is_untouched(&self) -> bool {
        (self.records, self.bytes) == self.untouched
    }

    fn take(&mut self, records: usize, bytes: usize) {
        self.records = self.records.saturating_sub(records);
        self.bytes = self.bytes.saturating_sub(bytes);
    }
}

/// How the records of one partition are numbered: under which producer id, from which number.
#[derive(Debug)]
struct Numbering {
    producer: u64,
    /// The number of the next record stored.
    next: u64,
}

/// One partition's batch in a request: its records (until the request is made of them) and
/// their waiters, in the same order.
struct Part {
    partition: usize,
    numbering: Numbering,
    records: Vec<PublishRecord>,
    waiters: Vec<Waiter>,
}

/// What became of a partition's batch: its numbering (past what was stored), whether anything
/// was stored, and the records refused because the partition was full, still within their
/// delivery timeout, to be sent again after a back-off.
struct Settled {
    partition: usize,
    numbering: Numbering,
    stored: bool,
    full: Vec<Queued>,
}

/// Sends the batches of `parts` (all numbered under one producer id) in one request until it
/// is answered, answering each record stored, refused for good, or full past its delivery
/// timeout. A request whose fate is unknown (the connection was lost, the answer did not come)
/// is sent again, unchanged, until it is answered or the delivery timeout of one of its first
/// records passes; it then fails whole, and its partitions go on under a new producer id, so
/// that no later record can be taken for one of it. The records travel in the request, which
/// is kept to be sent again, not copied.
async fn store(client: &Client, topic: &str, mut parts: Vec<Part>) -> Vec<Settled> {
    let producer = parts.first().map_or(0, |part| part.numbering.producer);
    let batches = parts
        .iter_mut()
        .map(|part| PartitionBatch {
            partition: part.partition as i32,
            sequence: part.numbering.next,
            records: std::mem::take(&mut part.records),
        })
        .collect();
    let mut request = Command::PublishIdempotent {
        topic: topic.to_owned(),
        producer,
        batches,
    };
    let mut attempt = 0;
    let mut renumbered = false;
    loop {
        let error = match client.publish_idempotent_kept(&request).await {
            Ok(placed) => {
                let Command::PublishIdempotent { batches, .. } = request else {
                    unreachable!("the request is the idempotent publish made above")
                };
                return settle(topic, parts, batches, placed);
            }
            // Once an attempt's fate is unknown, no later error says that the records were not
            // stored (that attempt may have stored them): the request goes again until it is
            // answered or its time is up, and its numbers are then never used again.
            Err(error) if error.is_retriable() || attempt > 0 => error,
            // Refused whole at its first attempt: nothing of it was stored. A broker that no
            // longer knows the producer's numbering (restarted without its data, the topic made
            // anew, the producer forgotten among too many) refuses every number but 0: the
            // request goes once more, numbered from 0 under a new producer id.
            Err(Error::Broker(BrokerError::InvalidArgument(_))) if !renumbered => {
                renumbered = true;
                renumber(&mut parts, &mut request);
                continue;
            }
            Err(error) => {
                return parts
                    .into_iter()
                    .map(|part| {
                        for waiter in part.waiters {
                            let refused = ProducerError::Refused(error.copy());
                            waiter.answer.send(Err(refused));
                        }
                        Settled {
                            partition: part.partition,
                            numbering: part.numbering,
                            stored: false,
                            full: Vec::new(),
                        }
                    })
                    .collect();
            }
        };
        let now = Instant::now();
        let expired = parts.iter().any(|part| {
            part.waiters
                .first()
                .is_some_and(|waiter| waiter.deadline <= now)
        });
        if expired {
            // Maybe stored, maybe not: these numbers can never be used again.
            let renamed = random_id();
            return parts
                .into_iter()
                .map(|part| {
                    for waiter in part.waiters {
                        let timeout = ProducerError::Timeout { last: error.copy() };
                        waiter.answer.send(Err(timeout));
                    }
                    Settled {
                        partition: part.partition,
                        numbering: Numbering {
                            producer: renamed,
                            next: 0,
                        },
                        stored: false,
                        full: Vec::new(),
                    }
                })
                .collect();
        }
        tokio::time::sleep(backoff(attempt)).await;
        attempt += 1;
    }
}

/// Numbers the batches of `parts` and of `request` (made of them) from 0 under a new
/// producer id.
fn renumber(parts: &mut [Part], request: &mut Command) {
    let renamed = random_id();
    for part in parts.iter_mut() {
        part.numbering = Numbering {
            producer: renamed,
            next: 0,
        };
    }
    if let Command::PublishIdempotent {
        producer, batches, ..
    } = request
    {
        *producer = renamed;
        for batch in batches {
            batch.sequence = 0;
        }
    }
}

/// Answers the records of `parts` from the request's answer `placed` (each record's partition
/// and offset, batch after batch; `-1` for a record refused because its partition is full);
/// `batches` are the request's, whose records not stored go back to their waiters.
fn settle(
    topic: &str,
    parts: Vec<Part>,
    batches: Vec<PartitionBatch>,
    placed: Vec<(i32, i64)>,
) -> Vec<Settled> {
    let mut placed = placed.into_iter();
    let now = Instant::now();
    parts
        .into_iter()
        .zip(batches)
        .map(|(mut part, batch)| {
            // The records stored are a prefix: the first refused one was refused because the
            // partition is full, and so was every one after it.
            let mut stored = 0;
            let mut unstored = Vec::new();
            let waiters = std::mem::take(&mut part.waiters);
            for (waiter, record) in waiters.into_iter().zip(batch.records) {
                match placed.next() {
                    Some((partition, offset)) if offset >= 0 && unstored.is_empty() => {
                        waiter.answer.send(Ok(Stored { partition, offset }));
                        stored += 1;
                    }
                    // Refused, after a refused one, or (from a server that answers short)
                    // not answered: certainly not stored.
                    _ => unstored.push(Queued { record, waiter }),
                }
            }
            part.numbering.next += stored as u64;
            Settled {
                full: retry_or_fail(topic, part.partition, unstored, now),
                partition: part.partition,
                numbering: part.numbering,
                stored: stored > 0,
            }
        })
        .collect()
}

/// Of the records of `partition` refused because it is full (so certainly not stored), fails
/// those past their delivery timeout at `now` and returns the others, to be tried again.
fn retry_or_fail(topic: &str, partition: usize, full: Vec<Queued>, now: Instant) -> Vec<Queued> {
    // Nearly always empty: returned as it is, without going through `partition`'s machinery.
    if full.is_empty() {
        return full;
    }
    let (expired, again): (Vec<Queued>, Vec<Queued>) = full
        .into_iter()
        .partition(|queued| queued.waiter.deadline <= now);
    for queued in expired {
        queued.waiter.answer.send(Err(ProducerError::Full {
            topic: topic.to_owned(),
            partition: partition as i32,
        }));
    }
    again
}
