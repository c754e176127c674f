#!/usr/bin/env python3
"""Kafka's clients (confluent-kafka, librdkafka) against the Kafka listener, for bench/kafka.sh:
produce RECORDS records of SIZE bytes, or consume them all, and print one JSON line with the
records per second. Every wait is bounded."""

import json
import sys
import time

from confluent_kafka import Consumer, Producer, TopicPartition


def produce(bootstrap, topic, records, size):
    producer = Producer(
        {"bootstrap.servers": bootstrap, "linger.ms": 5, "batch.size": 1_000_000, "acks": 1}
    )
    value = b"x" * size
    failed = []
    started = time.perf_counter()
    for i in range(records):
        while True:
            try:
                producer.produce(topic, value, on_delivery=lambda e, _: e and failed.append(e))
                break
            except BufferError:
                producer.poll(0.01)
        if i % 10_000 == 0:
            producer.poll(0)
    if producer.flush(120) != 0 or failed:
        sys.exit(f"produce failed: {failed[:3]}")
    elapsed = time.perf_counter() - started
    print(json.dumps({"records": records, "seconds": elapsed, "per_second": records / elapsed}))


def consume(bootstrap, topic, records, partitions):
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "bench", "enable.auto.commit": False}
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    got = 0
    started = time.perf_counter()
    deadline = time.time() + 120
    while got < records and time.time() < deadline:
        for message in consumer.consume(10_000, 0.5):
            if not message.error():
                got += 1
    elapsed = time.perf_counter() - started
    consumer.close()
    if got < records:
        sys.exit(f"consumed {got} of {records}")
    print(json.dumps({"records": got, "seconds": elapsed, "per_second": got / elapsed}))


if __name__ == "__main__":
    command, bootstrap, topic, records, extra = sys.argv[1:6]
    if command == "produce":
        produce(bootstrap, topic, int(records), int(extra))
    else:
        consume(bootstrap, topic, int(records), int(extra))
