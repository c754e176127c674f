//! A multi-threaded stress test: eight threads share one `Arc<EventBroker>` and mix every call
//! (publish and keyed publish, join and leave, poll, ack and retry, fetch and commit, lag,
//! committed, end offsets, describe), each logging what it saw with tickets taken from a global
//! counter just before and just after every call, so that each call's linearization point lies
//! between its two tickets. After the threads finish (a watchdog turns a deadlock into a
//! failure), one thread drains every group and the logs are checked against invariants that hold
//! exactly under the contract:
//!
//! - the successful publishes of each partition got distinct, consecutive offsets `0..end`;
//! - every delivered or fetched record carries the payload published at its offset;
//! - a group-partition offset is never delivered again while an earlier delivery of it may still
//!   be in flight (no retry of it and no membership change could have come in between);
//! - for each group-partition offset, successful acks and retries never outnumber deliveries
//!   (an ack and a retry of one delivery never both succeed), and a thread that tries both on
//!   its own delivery sees at most one succeed;
//! - after draining, every record was acknowledged exactly once by every polling group (all
//!   groups exist before the first publish), every group's committed offset is the end offset,
//!   and retention has released every record.

#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Barrier, Mutex};
use std::thread;
use std::time::Duration;

use broker_core::{hash, Assignor, BrokerDescription, BrokerError, EventBroker, KeyHash};

const TOPIC: &str = "stress";
const PARTITIONS: i32 = 4;
const CAPACITY: i32 = 8;
const THREADS: usize = 8;
const ITERATIONS: usize = 30_000;
/// Groups consumed with poll, ack and retry (round-robin). Every member joins "p0" before the
/// threads start and never leaves it, so "p0" never rebalances while they run (their later
/// joins are repeated joins, which change nothing): there, only a retry can end a delivery
/// before its offset is delivered again. "p1" churns.
const POLL_GROUPS: [&str; 2] = ["p0", "p1"];
const STABLE_GROUP: &str = "p0";
const CHURN_GROUP: &str = "p1";
/// The group consumed with fetch and commit (range).
const FETCH_GROUP: &str = "f0";

static TICKETS: AtomicU64 = AtomicU64::new(0);

fn ticket() -> u64 {
    TICKETS.fetch_add(1, Ordering::SeqCst)
}

/// Runs `call` between two tickets: its linearization point lies in `(start, end)`.
fn timed<T>(call: impl FnOnce() -> T) -> (T, Span) {
    let start = ticket();
    let result = call();
    let end = ticket();
    (result, Span { start, end })
}

#[derive(Debug, Clone, Copy)]
struct Span {
    start: u64,
    end: u64,
}

impl Span {
    /// Whether this call may have taken effect after `earlier` began and before `later` ended.
    fn may_fall_between(self, earlier: Span, later: Span) -> bool {
        self.end > earlier.start && self.start < later.end
    }
}

/// A group, partition and offset: one record as one group consumes it.
type Key = (String, i32, i64);

#[derive(Debug, Clone)]
struct Delivery {
    key: Key,
    member: String,
    span: Span,
}

#[derive(Debug, Clone)]
struct Settle {
    key: Key,
    member: String,
    ack: bool,
    succeeded: bool,
    span: Span,
}

/// Everything one thread saw.
#[derive(Debug, Default)]
struct Log {
    published: Vec<(i32, i64, Vec<u8>)>,
    deliveries: Vec<Delivery>,
    settles: Vec<Settle>,
    /// Join and leave calls on polling groups, whatever they returned.
    membership: Vec<(String, Span)>,
    /// Records returned by fetch, as (partition, offset, payload).
    fetched: Vec<(i32, i64, Vec<u8>)>,
}

/// A small deterministic generator (xorshift64*), one per thread.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len() as u64) as usize]
    }
}

/// Deliveries not yet settled, shared by the threads that use one member id.
type Pending = Arc<Mutex<Vec<Delivery>>>;

struct Worker {
    id: usize,
    broker: Arc<EventBroker>,
    /// This thread's member id; threads 4 and 5, and 6 and 7, share one.
    member: String,
    shared_member: bool,
    pending: Pending,
    rng: Rng,
    log: Log,
    sequence: u64,
}

impl Worker {
    fn run(mut self) -> Log {
        for _ in 0..ITERATIONS {
            match self.rng.below(100) {
                0..=19 => self.publish(),
                20..=27 => self.publish_keyed(),
                28..=32 => self.join(),
                33..=36 => self.leave(),
                37..=54 => self.poll(),
                55..=61 => self.settle_pending(),
                62..=74 => self.fetch(),
                75..=81 => self.commit(),
                82..=89 => self.read_offsets(),
                90..=91 => check_description(&self.broker.describe()),
                _ => self.settle_at_random(),
            }
        }
        self.log
    }

    fn payload(&mut self) -> Vec<u8> {
        self.sequence += 1;
        format!("{}:{}", self.id, self.sequence).into_bytes()
    }

    fn publish(&mut self) {
        let partition = self.rng.below(PARTITIONS as u64) as i32;
        let payload = self.payload();
        let offset = self
            .broker
            .publish(TOPIC, partition, payload.clone())
            .unwrap();
        assert!(offset >= -1);
        if offset >= 0 {
            self.log.published.push((partition, offset, payload));
        }
    }

    fn publish_keyed(&mut self) {
        let key = format!("k{}", self.rng.below(10));
        let keyed = self.rng.below(2) == 0;
        let payload = self.payload();
        let (partition, offset) = self
            .broker
            .publish_keyed(TOPIC, keyed.then_some(key.as_bytes()), payload.clone())
            .unwrap();
        if keyed {
            let expected =
                hash::partition_for(KeyHash::Murmur2, key.as_bytes(), PARTITIONS as usize);
            assert_eq!(partition as usize, expected, "key {key}");
        }
        assert!((0..PARTITIONS).contains(&partition));
        if offset >= 0 {
            self.log.published.push((partition, offset, payload));
        }
    }

    fn join(&mut self) {
        if self.rng.below(3) == 0 {
            let assignor = if self.rng.below(2) == 0 {
                Assignor::Range
            } else {
                Assignor::RoundRobin
            };
            let result = self
                .broker
                .join_with(TOPIC, FETCH_GROUP, &self.member, assignor);
            match assignor {
                Assignor::Range => assert!(result.is_ok(), "{result:?}"),
                _ => assert!(
                    matches!(result, Err(BrokerError::InvalidArgument(_))),
                    "{result:?}"
                ),
            }
            return;
        }
        let group = *self.rng.pick(&POLL_GROUPS);
        let (partitions, span) = timed(|| self.broker.join(TOPIC, group, &self.member));
        let partitions = partitions.unwrap();
        assert!(partitions.windows(2).all(|w| w[0] < w[1]), "{partitions:?}");
        if group != STABLE_GROUP {
            self.log.membership.push((group.to_owned(), span));
        }
    }

    fn leave(&mut self) {
        if self.rng.below(3) == 0 {
            self.broker.leave(TOPIC, FETCH_GROUP, &self.member).unwrap();
            return;
        }
        let (left, span) = timed(|| self.broker.leave(TOPIC, CHURN_GROUP, &self.member));
        left.unwrap();
        self.log.membership.push((CHURN_GROUP.to_owned(), span));
    }

    fn poll(&mut self) {
        let group = *self.rng.pick(&POLL_GROUPS);
        let max_records = 1 + self.rng.below(4) as i32;
        let (records, span) = timed(|| {
            if self.rng.below(4) == 0 {
                let max_bytes = self.rng.below(8);
                self.broker
                    .poll_limited(TOPIC, group, &self.member, max_records, Some(max_bytes))
            } else {
                self.broker.poll(TOPIC, group, &self.member, max_records)
            }
        });
        let records = records.unwrap();
        assert!(records.len() <= max_records as usize);
        assert!(
            records.windows(2).all(|w| w[0].partition < w[1].partition),
            "one record per partition, ascending: {records:?}"
        );
        for record in records {
            let delivery = Delivery {
                key: (group.to_owned(), record.partition, record.offset),
                member: self.member.clone(),
                span,
            };
            self.log.deliveries.push(delivery.clone());
            self.log
                .fetched
                .push((record.partition, record.offset, record.payload.to_vec()));
            match self.rng.below(10) {
                0..=4 => {
                    self.settle(&delivery, true);
                }
                5..=6 => {
                    self.settle(&delivery, false);
                }
                7 => self.settle_twice(&delivery),
                _ => self.pending.lock().unwrap().push(delivery),
            }
        }
    }

    fn settle(&mut self, delivery: &Delivery, ack: bool) -> bool {
        let (group, partition, offset) = &delivery.key;
        let (result, span) = timed(|| {
            if ack {
                self.broker
                    .ack(TOPIC, group, &delivery.member, *partition, *offset)
            } else {
                self.broker
                    .retry(TOPIC, group, &delivery.member, *partition, *offset)
            }
        });
        let succeeded = result.unwrap();
        self.log.settles.push(Settle {
            key: delivery.key.clone(),
            member: delivery.member.clone(),
            ack,
            succeeded,
            span,
        });
        succeeded
    }

    /// Tries both ack and retry on one delivery, in a random order: at most one may succeed.
    /// Only a thread with a member id of its own can assert that directly (with a shared id,
    /// the other thread may poll the same offset again in between); the aggregate check after
    /// the run covers both.
    fn settle_twice(&mut self, delivery: &Delivery) {
        let ack_first = self.rng.below(2) == 0;
        let first = self.settle(delivery, ack_first);
        let second = self.settle(delivery, !ack_first);
        if !self.shared_member {
            assert!(
                !(first && second),
                "ack and retry both succeeded: {delivery:?}"
            );
        }
    }

    /// Settles a delivery polled earlier by this member id. Sometimes leaves it in the list,
    /// so that the other thread sharing the id may race to settle the same delivery.
    fn settle_pending(&mut self) {
        let delivery = {
            let mut pending = self.pending.lock().unwrap();
            if pending.is_empty() {
                return;
            }
            let index = self.rng.below(pending.len() as u64) as usize;
            if self.rng.below(3) == 0 {
                pending[index].clone()
            } else {
                pending.swap_remove(index)
            }
        };
        let ack = self.rng.below(3) != 0;
        self.settle(&delivery, ack);
    }

    /// Acks or retries a made-up delivery; it succeeds only if it happens to be in flight.
    fn settle_at_random(&mut self) {
        let delivery = Delivery {
            key: (
                (*self.rng.pick(&POLL_GROUPS)).to_owned(),
                self.rng.below(PARTITIONS as u64) as i32,
                self.rng.below(40) as i64,
            ),
            member: self.member.clone(),
            span: Span { start: 0, end: 0 },
        };
        let ack = self.rng.below(2) == 0;
        self.settle(&delivery, ack);
    }

    fn fetch(&mut self) {
        let max_records = 1 + self.rng.below(10) as i32;
        let records = if self.rng.below(4) == 0 {
            let max_bytes = self.rng.below(12);
            self.broker.fetch_limited(
                TOPIC,
                FETCH_GROUP,
                &self.member,
                max_records,
                Some(max_bytes),
            )
        } else {
            self.broker
                .fetch(TOPIC, FETCH_GROUP, &self.member, max_records)
        }
        .unwrap();
        assert!(records.len() <= max_records as usize);
        for pair in records.windows(2) {
            let (a, b) = (&pair[0], &pair[1]);
            assert!(
                a.partition < b.partition
                    || (a.partition == b.partition && a.offset + 1 == b.offset),
                "fetch order: {records:?}"
            );
        }
        for record in records {
            self.log
                .fetched
                .push((record.partition, record.offset, record.payload.to_vec()));
        }
    }

    fn commit(&mut self) {
        if self.rng.below(2) == 0 {
            self.broker
                .commit(TOPIC, FETCH_GROUP, &self.member, None)
                .unwrap();
            return;
        }
        // Commit the current committed offset of the partitions this member owned a moment
        // ago: the assignment may have changed since, so NotAssigned is a valid answer, and
        // committing an offset at or below the end keeps within the decided contract.
        let owned = self
            .broker
            .assignment(TOPIC, FETCH_GROUP, &self.member)
            .unwrap();
        let offsets: BTreeMap<i32, i64> = owned
            .iter()
            .map(|&p| (p, self.broker.committed(TOPIC, FETCH_GROUP, p).unwrap()))
            .collect();
        let first_partition = offsets.keys().next().copied();
        match self
            .broker
            .commit(TOPIC, FETCH_GROUP, &self.member, Some(offsets))
        {
            Ok(()) => {}
            Err(BrokerError::NotAssigned { partition }) => {
                assert!(
                    owned.contains(&partition),
                    "{partition} {first_partition:?}"
                );
            }
            Err(other) => panic!("commit: {other:?}"),
        }
    }

    fn read_offsets(&mut self) {
        let group = *self.rng.pick(&["p0", "p1", "f0", "absent"]);
        let lag = self.broker.lag(TOPIC, group).unwrap();
        assert_eq!(lag.len(), PARTITIONS as usize);
        for (p, row) in lag.iter().enumerate() {
            assert_eq!(row.partition, p as i32);
            assert_eq!(row.lag, row.end_offset - row.committed);
            assert!(row.committed >= 0 && row.lag >= 0, "{row:?}");
        }
        let partition = self.rng.below(PARTITIONS as u64) as i32;
        let end = self.broker.end_offset(TOPIC, partition).unwrap();
        let committed = self.broker.committed(TOPIC, group, partition).unwrap();
        assert!(end >= 0 && committed >= 0);
        let assignment = self.broker.assignment(TOPIC, group, &self.member).unwrap();
        assert!(assignment.iter().all(|p| (0..PARTITIONS).contains(p)));
    }
}

/// Invariants any snapshot must satisfy.
fn check_description(description: &BrokerDescription) {
    let topic = &description.topics[0];
    assert_eq!(topic.name, TOPIC);
    let mut bytes = 0;
    for (p, partition) in topic.partitions.iter().enumerate() {
        assert_eq!(partition.partition, p as i32);
        assert!(partition.earliest_offset <= partition.end_offset);
        assert_eq!(
            partition.records,
            (partition.end_offset - partition.earliest_offset) as u64
        );
        assert!(partition.records <= CAPACITY as u64);
        bytes += partition.retained_bytes;
    }
    assert_eq!(topic.retained_bytes, bytes);
    for group in &topic.groups {
        for member in &group.members {
            for &p in &member.partitions {
                assert_eq!(
                    group.partitions[p as usize].owner.as_deref(),
                    Some(member.member.as_str())
                );
            }
        }
        let owned: usize = group.members.iter().map(|m| m.partitions.len()).sum();
        let expected = if group.members.is_empty() {
            0
        } else {
            PARTITIONS as usize
        };
        assert_eq!(owned, expected, "every partition has exactly one owner");
        for (p, state) in group.partitions.iter().enumerate() {
            let log = &topic.partitions[p];
            assert!(state.committed <= log.end_offset, "{state:?}");
            if POLL_GROUPS.contains(&group.name.as_str()) {
                // Retention never passes the committed offset of a group that only acks (an
                // explicit commit may move backwards, below what was released).
                assert!(state.committed >= log.earliest_offset, "{state:?}");
                // A polling group only ever has its next record in flight, by its owner.
                if let Some(offset) = state.in_flight {
                    assert_eq!(offset, state.committed, "{state:?}");
                    assert!(state.owner.is_some(), "{state:?}");
                }
            } else {
                // The fetching group never polls; it commits positions, or committed offsets
                // read a moment earlier (which may be stale, so commits may go backwards). An
                // explicit commit does not move the fetch position, so a stale one made after a
                // rebalance reset the positions may leave the committed offset above it: the
                // position is only bounded by the partition's end.
                assert_eq!(state.in_flight, None);
                assert!(state.position <= log.end_offset, "{state:?}");
            }
        }
    }
}

#[test]
fn concurrent_calls_keep_every_invariant() {
    let broker = Arc::new(EventBroker::new(CAPACITY).unwrap());
    assert!(broker.create(TOPIC, PARTITIONS).unwrap());
    // Every group exists before the first publish, with no members.
    for group in POLL_GROUPS {
        broker.join(TOPIC, group, "seed").unwrap();
        assert!(broker.leave(TOPIC, group, "seed").unwrap());
    }
    broker
        .join_with(TOPIC, FETCH_GROUP, "seed", Assignor::Range)
        .unwrap();
    assert!(broker.leave(TOPIC, FETCH_GROUP, "seed").unwrap());

    let shared: Vec<Pending> = (0..THREADS / 2).map(|_| Pending::default()).collect();
    let start = Arc::new(Barrier::new(THREADS));
    let mut setup = Log::default();
    let (done, finished) = mpsc::channel();
    let handles: Vec<_> = (0..THREADS)
        .map(|id| {
            // Threads 0 to 3 have member ids of their own; 4 and 5 share one, as do 6 and 7.
            let (member, shared_member, pending) = if id < 4 {
                (format!("u{id}"), false, Pending::default())
            } else {
                (format!("s{}", id / 2), true, Arc::clone(&shared[id / 2]))
            };
            let (joined, span) = timed(|| broker.join(TOPIC, STABLE_GROUP, &member));
            joined.unwrap();
            setup.membership.push((STABLE_GROUP.to_owned(), span));
            let worker = Worker {
                id,
                broker: Arc::clone(&broker),
                member,
                shared_member,
                pending,
                rng: Rng(0x9e37_79b9_7f4a_7c15 ^ (id as u64 + 1)),
                log: Log::default(),
                sequence: 0,
            };
            let done = done.clone();
            let start = Arc::clone(&start);
            thread::spawn(move || {
                start.wait();
                let log = worker.run();
                done.send(()).unwrap();
                log
            })
        })
        .collect();
    drop(done);
    for _ in 0..THREADS {
        // A watchdog, not a wait for readiness: a deadlock fails here instead of hanging. A
        // thread that panicked never reports; joining it below shows its panic.
        match finished.recv_timeout(Duration::from_secs(120)) {
            Ok(()) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
            Err(mpsc::RecvTimeoutError::Timeout) => panic!("threads did not finish: deadlock?"),
        }
    }
    let mut logs: Vec<Log> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    check_description(&broker.describe());

    let mut drain = Log::default();
    drain_everything(&broker, &mut drain);
    logs.push(drain);
    logs.push(setup);
    check_logs(&broker, &logs);
}

/// Single-threaded: every member leaves, one member per group consumes to the end.
fn drain_everything(broker: &EventBroker, log: &mut Log) {
    for group in POLL_GROUPS.iter().chain([&FETCH_GROUP]) {
        let description = broker.describe();
        let members: Vec<String> = description.topics[0]
            .groups
            .iter()
            .find(|g| g.name == *group)
            .unwrap()
            .members
            .iter()
            .map(|m| m.member.clone())
            .collect();
        for member in members {
            let (left, span) = timed(|| broker.leave(TOPIC, group, &member));
            assert!(left.unwrap());
            log.membership.push(((*group).to_owned(), span));
        }
        let (partitions, span) = timed(|| broker.join(TOPIC, group, "drainer"));
        assert_eq!(partitions.unwrap(), (0..PARTITIONS).collect::<Vec<_>>());
        log.membership.push(((*group).to_owned(), span));
    }
    for group in POLL_GROUPS {
        loop {
            let (records, span) = timed(|| broker.poll(TOPIC, group, "drainer", 64));
            let records = records.unwrap();
            if records.is_empty() {
                break;
            }
            for record in records {
                let key = (group.to_owned(), record.partition, record.offset);
                log.deliveries.push(Delivery {
                    key: key.clone(),
                    member: "drainer".to_owned(),
                    span,
                });
                log.fetched
                    .push((record.partition, record.offset, record.payload.to_vec()));
                let (acked, span) =
                    timed(|| broker.ack(TOPIC, group, "drainer", record.partition, record.offset));
                assert!(acked.unwrap());
                log.settles.push(Settle {
                    key,
                    member: "drainer".to_owned(),
                    ack: true,
                    succeeded: true,
                    span,
                });
            }
        }
    }
    loop {
        let records = broker.fetch(TOPIC, FETCH_GROUP, "drainer", 1_000).unwrap();
        if records.is_empty() {
            break;
        }
        for record in records {
            log.fetched
                .push((record.partition, record.offset, record.payload.to_vec()));
        }
    }
    broker.commit(TOPIC, FETCH_GROUP, "drainer", None).unwrap();
}

fn check_logs(broker: &EventBroker, logs: &[Log]) {
    // Distinct consecutive offsets: the successful publishes of a partition are 0..end.
    let mut payloads: HashMap<(i32, i64), &[u8]> = HashMap::new();
    let mut unique_payloads = HashSet::new();
    let mut ends = Vec::new();
    for p in 0..PARTITIONS {
        let mut offsets: Vec<i64> = logs
            .iter()
            .flat_map(|l| &l.published)
            .filter(|(partition, _, _)| *partition == p)
            .map(|(_, offset, _)| *offset)
            .collect();
        offsets.sort_unstable();
        let end = broker.end_offset(TOPIC, p).unwrap();
        assert_eq!(offsets, (0..end).collect::<Vec<_>>(), "partition {p}");
        assert!(
            end > 2 * i64::from(CAPACITY),
            "too little traffic on {p}: {end}"
        );
        ends.push(end);
    }
    for (partition, offset, payload) in logs.iter().flat_map(|l| &l.published) {
        payloads.insert((*partition, *offset), payload);
        assert!(unique_payloads.insert(payload.clone()));
    }
    // Every record handed out carries the payload published at its offset.
    for (partition, offset, payload) in logs.iter().flat_map(|l| &l.fetched) {
        assert_eq!(payloads[&(*partition, *offset)], payload.as_slice());
    }

    let mut deliveries: HashMap<&Key, Vec<&Delivery>> = HashMap::new();
    for delivery in logs.iter().flat_map(|l| &l.deliveries) {
        deliveries.entry(&delivery.key).or_default().push(delivery);
    }
    let mut settles: HashMap<&Key, Vec<&Settle>> = HashMap::new();
    for settle in logs.iter().flat_map(|l| &l.settles).filter(|s| s.succeeded) {
        settles.entry(&settle.key).or_default().push(settle);
    }
    let mut membership: HashMap<&str, Vec<Span>> = HashMap::new();
    for (group, span) in logs.iter().flat_map(|l| &l.membership) {
        membership.entry(group.as_str()).or_default().push(*span);
    }

    // No double delivery: a later delivery of the same group-partition offset needs an end of
    // the earlier one that may have taken effect in between: a successful retry by the same
    // member, or a membership change of the group (which may have canceled it). An ack ends it
    // for good: the offset must never be delivered again.
    let mut churn_redeliveries = 0;
    let mut stable_redeliveries = 0;
    for (key, list) in &deliveries {
        let successes = settles.get(key).map_or(&[][..], Vec::as_slice);
        for first in list {
            for later in list.iter().filter(|d| d.span.start > first.span.end) {
                let retried = successes.iter().any(|s| {
                    !s.ack
                        && s.member == first.member
                        && s.span.may_fall_between(first.span, later.span)
                });
                let rebalanced = membership[key.0.as_str()]
                    .iter()
                    .any(|m| m.may_fall_between(first.span, later.span));
                stable_redeliveries += usize::from(key.0 == STABLE_GROUP && !rebalanced);
                churn_redeliveries += usize::from(key.0 == CHURN_GROUP && rebalanced);
                assert!(
                    retried || rebalanced,
                    "{key:?} delivered to {} at {:?} while {} still had it since {:?}",
                    later.member,
                    later.span,
                    first.member,
                    first.span
                );
            }
        }
    }
    assert!(
        stable_redeliveries > 0,
        "the run never redelivered anything in the stable group"
    );
    assert!(
        churn_redeliveries > 0,
        "the run never redelivered anything across a rebalance"
    );

    // One success per delivery at most; exactly one ack per record and polling group.
    let mut raced = 0;
    for group in POLL_GROUPS {
        for (p, &end) in ends.iter().enumerate() {
            for offset in 0..end {
                let key = (group.to_owned(), p as i32, offset);
                let successes = settles.get(&key).map_or(&[][..], Vec::as_slice);
                let delivered = deliveries.get(&key).map_or(0, Vec::len);
                assert!(
                    successes.len() <= delivered,
                    "{key:?}: {} successful acks and retries for {delivered} deliveries",
                    successes.len()
                );
                let acks = successes.iter().filter(|s| s.ack).count();
                assert_eq!(acks, 1, "{key:?} acknowledged {acks} times");
                raced += usize::from(successes.len() < delivered);
            }
        }
    }
    assert!(raced > 0, "no delivery was ever canceled or left unsettled");
    // Acks of offsets that were never published never succeed.
    for key in settles.keys() {
        assert!(key.2 < ends[key.1 as usize], "{key:?}");
    }

    // After draining: every group is at the end, nothing in flight, nothing retained.
    let description = broker.describe();
    check_description(&description);
    let topic = &description.topics[0];
    assert_eq!(topic.groups.len(), 3);
    for group in &topic.groups {
        for (p, state) in group.partitions.iter().enumerate() {
            assert_eq!(state.committed, ends[p], "{} {state:?}", group.name);
            assert_eq!(state.in_flight, None);
            assert_eq!(state.lag, 0);
        }
    }
    assert!(topic.partitions.iter().all(|p| p.records == 0));
    assert_eq!(topic.retained_bytes, 0);
}
