//! Criterion benchmarks of the core alone: what a call costs before any network is involved.

use std::collections::BTreeMap;
use std::hint::black_box;

use broker_core::{
    BrokerState, EventBroker, GroupSetting, KeyHash, PartitionBatch, PublishRecord, Retention,
    Revision, TopicName, TopicSetting,
};
use bytes::Bytes;
use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};

const PAYLOAD: &[u8] = &[b'x'; 100];

/// A broker with one 64-partition topic "t" and one group "g" whose only member is "m".
fn broker_with_group(capacity: i32) -> EventBroker {
    let broker = EventBroker::new(capacity).expect("valid capacity");
    broker.create("t", 64).expect("valid topic");
    broker.join("t", "g", "m").expect("valid join");
    broker
}

fn publish(c: &mut Criterion) {
    let payload = Bytes::from_static(PAYLOAD);
    let mut group = c.benchmark_group("publish");
    // Each iteration fills a fresh 1,000-record partition: 1,000 publishes, none refused.
    group.throughput(Throughput::Elements(1_000));
    group.bench_function("1,000 publishes of 100 B into a bounded partition", |b| {
        b.iter_batched_ref(
            || {
                let broker = EventBroker::new(1_000).expect("valid capacity");
                broker.create("t", 1).expect("valid topic");
                broker
            },
            |broker| {
                for _ in 0..1_000 {
                    black_box(
                        broker
                            .publish("t", 0, payload.clone())
                            .expect("known topic"),
                    );
                }
            },
            BatchSize::SmallInput,
        )
    });
    group.finish();
}

/// What a `Producer` with one record in flight per partition sends: one idempotent request of
/// 64 batches of one record, one batch per partition. Limits retention (the oldest of 1,000 per
/// partition leave) keeps every iteration's records stored.
fn publish_idempotent(c: &mut Criterion) {
    let payload = Bytes::from_static(PAYLOAD);
    let mut group = c.benchmark_group("publish_idempotent");
    group.throughput(Throughput::Elements(64));
    group.bench_function("64 batches of one record, 64 partitions", |b| {
        let broker = EventBroker::new(1_000).expect("valid capacity");
        let settings = [
            TopicSetting::Retention(Retention::Limits),
            TopicSetting::MaxRecords(1_000),
        ];
        broker
            .create_topic("t", 64, KeyHash::default(), &settings)
            .expect("valid topic");
        let mut sequence = 0;
        b.iter(|| {
            let batches = (0..64)
                .map(|partition| PartitionBatch {
                    partition,
                    sequence,
                    records: vec![PublishRecord::to_partition(partition, payload.clone())],
                })
                .collect();
            sequence += 1;
            black_box(
                broker
                    .publish_idempotent("t", 7, batches)
                    .expect("a valid request"),
            );
        })
    });
    group.finish();
}

/// Publishes a record to partition 0 of "t", polls it as member "m" of "g" and acknowledges it.
fn publish_poll_ack(broker: &EventBroker, payload: &Bytes) {
    broker
        .publish("t", 0, payload.clone())
        .expect("known topic");
    let records = broker.poll("t", "g", "m", 1).expect("valid poll");
    let record = &records[0];
    assert!(broker
        .ack("t", "g", "m", record.partition, record.offset)
        .expect("valid ack"));
}

fn poll_ack(c: &mut Criterion) {
    let payload = Bytes::from_static(PAYLOAD);
    let mut group = c.benchmark_group("poll_ack");
    group.throughput(Throughput::Elements(1));
    group.bench_function("publish + poll(1) + ack, one partition", |b| {
        let broker = broker_with_group(1_000);
        b.iter(|| publish_poll_ack(&broker, &payload))
    });
    // A consumer's round over 64 partitions: settle the 64 deliveries of the last round and
    // take the next 64, as 64 acks and a poll, or as one ack_and_poll.
    group.throughput(Throughput::Elements(64));
    // Settles the deliveries taken in the last round and takes the next: (partition, offset)s.
    type Settle = fn(&EventBroker, &[(i32, i64)]) -> Vec<(i32, i64)>;
    let round = |settle: Settle| {
        let payload = payload.clone();
        move |b: &mut criterion::Bencher<'_>| {
            let broker = broker_with_group(1_000);
            let mut taken = Vec::new();
            b.iter(|| {
                for partition in 0..64 {
                    broker
                        .publish("t", partition, payload.clone())
                        .expect("known topic");
                }
                taken = settle(&broker, &taken);
                assert_eq!(taken.len(), 64);
            })
        }
    };
    group.bench_function(
        "64 partitions: 64 publishes + 64 acks + poll(64)",
        round(|broker, taken| {
            for &(partition, offset) in taken {
                assert!(broker
                    .ack("t", "g", "m", partition, offset)
                    .expect("valid ack"));
            }
            let records = broker.poll("t", "g", "m", 64).expect("valid poll");
            records.iter().map(|r| (r.partition, r.offset)).collect()
        }),
    );
    group.bench_function(
        "64 partitions: 64 publishes + ack_and_poll(64 acks, 64)",
        round(|broker, taken| {
            let (acked, records) = broker
                .ack_and_poll("t", "g", "m", taken, 64)
                .expect("valid ack_and_poll");
            assert!(!acked.contains(&false));
            records.iter().map(|r| (r.partition, r.offset)).collect()
        }),
    );
    group.finish();
}

fn fetch_commit(c: &mut Criterion) {
    let payload = Bytes::from_static(PAYLOAD);
    let mut group = c.benchmark_group("fetch_commit");
    group.throughput(Throughput::Elements(100));
    group.bench_function("publish 100 + fetch(100) + commit, one partition", |b| {
        let broker = EventBroker::new(1_000).expect("valid capacity");
        broker.create("t", 1).expect("valid topic");
        broker.join("t", "g", "m").expect("valid join");
        b.iter(|| {
            for _ in 0..100 {
                broker
                    .publish("t", 0, payload.clone())
                    .expect("known topic");
            }
            let records = broker.fetch("t", "g", "m", 100).expect("valid fetch");
            assert_eq!(records.len(), 100);
            broker.commit("t", "g", "m", None).expect("member commit");
        })
    });
    group.bench_function("fetch(100) + explicit commit, one partition", |b| {
        let broker = EventBroker::new(1_000).expect("valid capacity");
        broker.create("t", 1).expect("valid topic");
        broker.join("t", "g", "m").expect("valid join");
        b.iter(|| {
            for _ in 0..100 {
                broker
                    .publish("t", 0, payload.clone())
                    .expect("known topic");
            }
            let records = broker.fetch("t", "g", "m", 100).expect("valid fetch");
            let last = records.last().expect("100 records").offset;
            broker
                .commit("t", "g", "m", Some(BTreeMap::from([(0, last + 1)])))
                .expect("owned partition");
        })
    });
    group.finish();
}

fn rebalance(c: &mut Criterion) {
    let mut group = c.benchmark_group("rebalance");
    let members: Vec<String> = (0..64).map(|i| format!("member-{i:02}")).collect();
    group.bench_function("join + leave with 64 members, 64 partitions", |b| {
        let broker = broker_with_group(1_000);
        for member in &members {
            broker.join("t", "g", member).expect("valid join");
        }
        b.iter(|| {
            broker.join("t", "g", "zz-newcomer").expect("valid join");
            broker.leave("t", "g", "zz-newcomer").expect("valid leave");
        })
    });
    group.finish();
}

/// What the rules of each revision cost a consumer in ack mode: publish, poll and ack in a
/// group with an acknowledgement timeout and a maximum of deliveries (whose poll, from
/// revision 1 on, first sends overdue last chances to the dead-letter topic), under the
/// original rules and the newest, side by side.
fn revisions(c: &mut Criterion) {
    let payload = Bytes::from_static(PAYLOAD);
    let mut group = c.benchmark_group("revisions");
    group.throughput(Throughput::Elements(1));
    for revision in [Revision::Original, Revision::NEWEST] {
        let name = format!("publish + poll(1) + ack, dead letters on, revision {revision}");
        group.bench_function(name, |b| {
            let mut state = BrokerState::new(1_000).expect("valid capacity");
            state.set_revision(revision);
            let broker = EventBroker::from_state(state);
            broker.create("t", 64).expect("valid topic");
            let settings = [
                GroupSetting::AckTimeoutMs(60_000),
                GroupSetting::MaxDeliveries(5),
                GroupSetting::DeadLetter(TopicName::new("t-dlq").expect("valid name")),
            ];
            broker
                .with_state(|state| state.join("t", "g", "m", None, &settings))
                .expect("valid join");
            b.iter(|| publish_poll_ack(&broker, &payload))
        });
    }
    group.finish();
}

criterion_group!(
    benches,
    publish,
    publish_idempotent,
    poll_ack,
    fetch_commit,
    rebalance,
    revisions
);
criterion_main!(benches);
