#!/usr/bin/env python3
"""Real Kafka clients against broker-server's Kafka listener, for tests/kafka.rs.

Each subcommand runs one scenario with confluent-kafka (librdkafka) or kafka-python, checks what
it can itself, and prints one JSON object with what it saw, for the Rust test to check against
the broker's own client. Every wait is bounded; a failure exits non-zero saying why.

    clients.py produce BOOTSTRAP TOPIC COUNT [--compression C] [--partitioner P]
                       [--idempotent] [--pace-ms MS]
    clients.py consume BOOTSTRAP TOPIC PARTITIONS COUNT [--reset earliest|latest]
    clients.py python-roundtrip BOOTSTRAP TOPIC COUNT
    clients.py python-group BOOTSTRAP TOPIC GROUP COUNT
    clients.py assigned-commit BOOTSTRAP TOPIC GROUP PARTITION OFFSET
    clients.py aio-roundtrip BOOTSTRAP TOPIC GROUP COUNT
    clients.py offsets-for-time BOOTSTRAP TOPIC PARTITION TIMESTAMP_MS
    clients.py create BOOTSTRAP TOPIC PARTITIONS
    clients.py group BOOTSTRAP TOPIC GROUP COUNT [--consumers N]
    clients.py hold BOOTSTRAP TOPIC GROUP
    clients.py delete-records BOOTSTRAP TOPIC PARTITION OFFSET
    clients.py groups BOOTSTRAP GROUP
    clients.py configs BOOTSTRAP TOPIC
    clients.py secure BOOTSTRAP TOPIC --protocol P [--password TOKEN] [--ca FILE]
    clients.py refusals BOOTSTRAP TOPIC --payloads P [P ...] [--headers N] [--timeout-ms MS]
    clients.py transactional BOOTSTRAP

KDEBUG=eos,msg,protocol (librdkafka's debug contexts) makes `produce` log what its producer does
to its standard error, which a failing test prints.
"""

import argparse
import json
import os
import sys
import time

PATIENCE_S = 20
START = time.time()


def fail(message):
    print(message, file=sys.stderr)
    sys.exit(1)


def produce(args):
    from confluent_kafka import Producer

    config = {
        "bootstrap.servers": args.bootstrap,
        "linger.ms": 5,
        "compression.type": args.compression,
        "message.timeout.ms": PATIENCE_S * 1000,
    }
    if args.partitioner:
        config["partitioner"] = args.partitioner
    if os.environ.get("KDEBUG"):
        config["debug"] = os.environ["KDEBUG"]
    if args.idempotent:
        config.update({"enable.idempotence": True, "message.timeout.ms": 60_000})
    producer = Producer(config)
    delivered = []
    errors = []

    def report(error, message):
        if error is not None:
            errors.append(str(error))
        else:
            delivered.append(
                {
                    "key": message.key().decode(),
                    "partition": message.partition(),
                    "offset": message.offset(),
                }
            )

    # In the past: the broker caps a time ahead of its clock at its clock.
    now = int(time.time() * 1000) - 60_000
    for i in range(args.count):
        if args.pace_ms and i % 10 == 0:
            time.sleep(args.pace_ms / 1000)
            producer.poll(0)
        producer.produce(
            args.topic,
            key=f"key-{i}",
            value=f"value-{i}",
            headers=[("index", str(i).encode()), ("empty", None)],
            timestamp=now + i,
            on_delivery=report,
        )
    if producer.flush(60 if args.idempotent else PATIENCE_S) != 0:
        fail("records still waiting after the flush")
    if errors:
        fail(f"delivery errors: {errors[:3]}")
    print(json.dumps({"delivered": delivered, "first_timestamp": now}))


def consume(args):
    from confluent_kafka import Consumer, TopicPartition, OFFSET_BEGINNING, OFFSET_END

    consumer = Consumer(
        {
            "bootstrap.servers": args.bootstrap,
            "group.id": "unused-by-assign",
            "enable.auto.commit": False,
            "auto.offset.reset": args.reset,
        }
    )
    start = {"earliest": OFFSET_BEGINNING, "latest": OFFSET_END, "stored": None}[args.start]
    if start is None:
        # The position comes from auto.offset.reset: offset 0, which may have left.
        consumer.assign([TopicPartition(args.topic, p, 0) for p in range(args.partitions)])
    else:
        consumer.assign([TopicPartition(args.topic, p, start) for p in range(args.partitions)])
    records = []
    deadline = time.time() + PATIENCE_S
    while len(records) < args.count and time.time() < deadline:
        message = consumer.poll(0.5)
        if message is None:
            continue
        if message.error():
            fail(f"consume error: {message.error()}")
        records.append(
            {
                "partition": message.partition(),
                "offset": message.offset(),
                "key": None if message.key() is None else message.key().decode(),
                "value": message.value().decode(),
                "headers": [
                    [name, None if value is None else value.decode()]
                    for name, value in (message.headers() or [])
                ],
                "timestamp": message.timestamp()[1],
            }
        )
    # Nothing more arrives than asked for within a short wait.
    extra = consumer.poll(1.0)
    consumer.close()
    if len(records) < args.count:
        fail(f"consumed {len(records)} of {args.count} records in {PATIENCE_S}s")
    if extra is not None and not extra.error():
        fail(f"an unexpected record at {extra.partition()}/{extra.offset()}")
    print(json.dumps({"records": records}))


def python_roundtrip(args):
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition

    producer = KafkaProducer(bootstrap_servers=args.bootstrap, linger_ms=5)
    futures = [
        producer.send(
            args.topic,
            key=f"k{i}".encode(),
            value=f"v{i}".encode(),
            headers=[("n", str(i).encode())],
            partition=i % 2,
        )
        for i in range(args.count)
    ]
    producer.flush(PATIENCE_S)
    sent = [future.get(timeout=PATIENCE_S) for future in futures]
    producer.close()
    consumer = KafkaConsumer(
        bootstrap_servers=args.bootstrap,
        enable_auto_commit=False,
        consumer_timeout_ms=PATIENCE_S * 1000,
    )
    consumer.assign([TopicPartition(args.topic, 0), TopicPartition(args.topic, 1)])
    consumer.seek_to_beginning()
    got = []
    for message in consumer:
        got.append(
            {
                "partition": message.partition,
                "offset": message.offset,
                "key": message.key.decode(),
                "value": message.value.decode(),
                "headers": [
                    [name, None if value is None else value.decode()]
                    for name, value in message.headers
                ],
            }
        )
        if len(got) == args.count:
            break
    consumer.close()
    if len(got) != args.count:
        fail(f"kafka-python consumed {len(got)} of {args.count}")
    print(
        json.dumps(
            {
                "sent": [{"partition": s.partition, "offset": s.offset} for s in sent],
                "records": got,
            }
        )
    )


def python_group(args):
    """A kafka-python consumer of GROUP, alone in it, with the default settings, consumes
    COUNT records of TOPIC and commits them."""
    from kafka import KafkaConsumer

    consumer = KafkaConsumer(
        args.topic,
        bootstrap_servers=args.bootstrap,
        group_id=args.group,
        auto_offset_reset="earliest",
        consumer_timeout_ms=PATIENCE_S * 1000,
    )
    got = []
    for message in consumer:
        got.append({"partition": message.partition, "offset": message.offset})
        if len(got) == args.count:
            break
    consumer.commit()
    consumer.close()
    if len(got) != args.count:
        fail(f"kafka-python's group consumer got {len(got)} of {args.count}")
    print(json.dumps({"records": got}))


def assigned_commit(args):
    """A kafka-python consumer that reads PARTITION of TOPIC with `assign` (no member of any
    group) commits OFFSET for GROUP: the commit's error, if any, and what GROUP has committed
    there afterwards."""
    from kafka import KafkaConsumer, TopicPartition
    from kafka.structs import OffsetAndMetadata

    consumer = KafkaConsumer(
        bootstrap_servers=args.bootstrap, group_id=args.group, enable_auto_commit=False
    )
    partition = TopicPartition(args.topic, args.partition)
    consumer.assign([partition])
    try:
        consumer.commit({partition: OffsetAndMetadata(args.offset, "", -1)})
        error = None
    except Exception as refused:  # the client's error for the answer's code
        error = type(refused).__name__
    committed = consumer.committed(partition)
    consumer.close()
    print(json.dumps({"error": error, "committed": committed}))


def aio_roundtrip(args):
    """aiokafka: an idempotent producer sends COUNT keyed records with a header and a time to
    partitions 0 and 1 by turns; then a consumer of GROUP, alone in it, consumes them from the
    earliest and commits."""
    import asyncio

    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

    async def run():
        producer = AIOKafkaProducer(bootstrap_servers=args.bootstrap, enable_idempotence=True)
        await producer.start()
        try:
            now = int(time.time() * 1000) - 60_000
            sent = await asyncio.wait_for(
                asyncio.gather(
                    *[
                        await producer.send(
                            args.topic,
                            key=f"k{i}".encode(),
                            value=f"v{i}".encode(),
                            headers=[("n", str(i).encode())],
                            partition=i % 2,
                            timestamp_ms=now + i,
                        )
                        for i in range(args.count)
                    ]
                ),
                PATIENCE_S,
            )
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer(
            args.topic,
            bootstrap_servers=args.bootstrap,
            group_id=args.group,
            auto_offset_reset="earliest",
            enable_auto_commit=False,
        )
        await consumer.start()
        got = []
        try:
            deadline = time.time() + PATIENCE_S
            while len(got) < args.count and time.time() < deadline:
                batches = await consumer.getmany(timeout_ms=500)
                for messages in batches.values():
                    got.extend(
                        {
                            "partition": m.partition,
                            "offset": m.offset,
                            "key": m.key.decode(),
                            "timestamp": m.timestamp,
                            "headers": [[name, value.decode()] for name, value in m.headers],
                        }
                        for m in messages
                    )
            await consumer.commit()
        finally:
            await consumer.stop()
        if len(got) != args.count:
            fail(f"aiokafka's group consumer got {len(got)} of {args.count}")
        return {
            "sent": [{"partition": s.partition, "offset": s.offset} for s in sent],
            "records": got,
            "first_timestamp": now,
        }

    print(json.dumps(asyncio.run(run())))


def offsets_for_time(args):
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": args.bootstrap, "group.id": "unused"})
    found = consumer.offsets_for_times(
        [TopicPartition(args.topic, args.partition, args.timestamp)], timeout=PATIENCE_S
    )
    low, high = consumer.get_watermark_offsets(
        TopicPartition(args.topic, args.partition), timeout=PATIENCE_S
    )
    consumer.close()
    print(json.dumps({"offset": found[0].offset, "low": low, "high": high}))


def group(args):
    """N consumers of one group subscribe to TOPIC (or to several, comma-separated), the second
    joining once the first has its partitions, and together consume COUNT records, committing
    each one; then they leave."""
    from confluent_kafka import Consumer

    def consumer(name, events):
        def assigned(_, partitions):
            events.append({"consumer": name, "assigned": sorted(p.partition for p in partitions), "at": round(time.time() - START, 2)})

        def revoked(_, partitions):
            events.append({"consumer": name, "revoked": sorted(p.partition for p in partitions)})

        c = Consumer(
            {
                "bootstrap.servers": args.bootstrap,
                "group.id": args.group,
                "client.id": name,
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
                "session.timeout.ms": 6000,
                "heartbeat.interval.ms": 500,
                "partition.assignment.strategy": "range",
            }
        )
        c.subscribe(args.topic.split(","), on_assign=assigned, on_revoke=revoked)
        return c

    events = []
    consumers = [consumer("c0", events)]
    records = []
    deadline = time.time() + 60
    while len(records) < args.count and time.time() < deadline:
        for index, c in enumerate(consumers):
            message = c.poll(0.2)
            if message is None:
                continue
            if message.error():
                fail(f"consume error: {message.error()}")
            records.append(
                {
                    "consumer": index,
                    "topic": message.topic(),
                    "partition": message.partition(),
                    "offset": message.offset(),
                }
            )
            c.commit(message=message, asynchronous=False)
        # The next consumer joins once the first has consumed some records.
        if len(consumers) < args.consumers and len(records) >= args.count // 4:
            consumers.append(consumer(f"c{len(consumers)}", events))
    for c in consumers:
        c.close()
        events.append({"closed": round(time.time() - START, 2)})
    if len(records) < args.count:
        fail(f"consumed {len(records)} of {args.count} records in 60s: {events}")
    print(json.dumps({"records": records, "events": events}))


def hold(args):
    """One consumer of GROUP subscribes to TOPIC, prints its partitions once assigned, and
    stays until its standard input closes; then it leaves."""
    import threading

    from confluent_kafka import Consumer

    closed = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), closed.set()), daemon=True).start()
    assigned = []
    c = Consumer(
        {
            "bootstrap.servers": args.bootstrap,
            "group.id": args.group,
            "session.timeout.ms": 6000,
            "heartbeat.interval.ms": 500,
        }
    )
    c.subscribe(
        [args.topic],
        on_assign=lambda _, partitions: assigned.append(sorted(p.partition for p in partitions)),
    )
    deadline = time.time() + PATIENCE_S
    while not assigned and time.time() < deadline:
        c.poll(0.2)
    if not assigned:
        fail("no assignment in time")
    print(f"assigned {assigned[0]}", flush=True)
    deadline = time.time() + PATIENCE_S
    while not closed.is_set() and time.time() < deadline:
        c.poll(0.2)
    c.close()


def through_restart(args):
    """CONSUMERS consumers of GROUP (in this one process, polled in turn), committing only when
    their partitions are taken from them (auto-commit on, its timer too slow to fire) and
    fetching little ahead, consume COUNT records of TOPIC; once they consumed HALF it prints
    "consumed HALF" and waits for a line on standard input (while the caller restarts the
    server), then goes on. Reports each record consumed and whether partitions were revoked
    (committed first) or lost."""
    from confluent_kafka import Consumer

    events = []

    def consumer(name):
        def revoked(_, partitions):
            events.append({"consumer": name, "revoked": sorted(p.partition for p in partitions), "lost": False})

        def lost(_, partitions):
            events.append({"consumer": name, "revoked": sorted(p.partition for p in partitions), "lost": True})

        c = Consumer(
            {
                "bootstrap.servers": args.bootstrap,
                "group.id": args.group,
                "client.id": name,
                "enable.auto.commit": True,
                "auto.commit.interval.ms": 600000,
                "auto.offset.reset": "earliest",
                "session.timeout.ms": 10000,
                "heartbeat.interval.ms": 500,
                "reconnect.backoff.max.ms": 200,
                "queued.max.messages.kbytes": 1,
                "max.partition.fetch.bytes": 256,
            }
        )
        c.subscribe([args.topic], on_revoke=revoked, on_lost=lost)
        return c

    consumers = [consumer(f"c{index}") for index in range(args.consumers)]
    records = []
    told = False
    deadline = time.time() + 60
    while len(records) < args.count and time.time() < deadline:
        for c in consumers:
            message = c.poll(0.1)
            if message is None:
                continue
            if message.error():
                # The server going away and coming back is told as errors that are not fatal.
                if message.error().fatal():
                    fail(f"consume error: {message.error()}")
                events.append({"error": str(message.error())})
                continue
            records.append([message.partition(), message.offset()])
            if len(records) >= args.half and not told:
                print(f"consumed {args.half}", flush=True)
                told = True
                # Nothing more until the caller restarted the server.
                sys.stdin.readline()
    for c in consumers:
        c.close()
    print(json.dumps({"records": records, "events": events}), flush=True)


def delete_records(args):
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": args.bootstrap})
    futures = admin.delete_records(
        [TopicPartition(args.topic, args.partition, args.offset)], request_timeout=PATIENCE_S
    )
    (future,) = futures.values()
    print(json.dumps({"low_watermark": future.result(PATIENCE_S).low_watermark}))


def groups(args):
    """Lists the groups (all of them, and those in state STABLE) and describes GROUP, through
    confluent-kafka's AdminClient and kafka-python's KafkaAdminClient."""
    from confluent_kafka import ConsumerGroupState
    from confluent_kafka.admin import AdminClient
    from kafka import KafkaAdminClient

    admin = AdminClient({"bootstrap.servers": args.bootstrap})

    def listed(**options):
        found = admin.list_consumer_groups(request_timeout=PATIENCE_S, **options).result()
        if found.errors:
            fail(f"list_consumer_groups: {found.errors}")
        return sorted([g.group_id, g.state.name] for g in found.valid)

    (described,) = admin.describe_consumer_groups([args.group]).values()
    described = described.result(PATIENCE_S)
    python_admin = KafkaAdminClient(bootstrap_servers=args.bootstrap)
    python_described = python_admin.describe_groups([args.group])[args.group]
    python_listed = python_admin.list_groups()
    python_stable = python_admin.list_groups(states_filter=["Stable"])
    python_admin.close()

    print(
        json.dumps(
            {
                "listed": listed(),
                "stable": listed(states={ConsumerGroupState.STABLE}),
                "state": described.state.name,
                "members": [
                    sorted([tp.topic, tp.partition] for tp in m.assignment.topic_partitions)
                    for m in described.members
                ],
                "python_listed": sorted(
                    [g["group_id"], g["group_state"]] for g in python_listed
                ),
                "python_stable": sorted(g["group_id"] for g in python_stable),
                "python_state": python_described["group_state"],
                "python_members": [
                    [[p["topic"], p["partitions"]] for p in m["member_assignment"]["assigned_partitions"]]
                    for m in python_described["members"]
                ],
            }
        )
    )


def configs(args):
    """TOPIC's configs as confluent-kafka's AdminClient and kafka-python's KafkaAdminClient
    describe them: {name: value} from each."""
    from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType
    from kafka.admin import ConfigResource as PythonResource
    from kafka.admin import ConfigResourceType, KafkaAdminClient

    admin = AdminClient({"bootstrap.servers": args.bootstrap})
    (future,) = admin.describe_configs(
        [ConfigResource(ResourceType.TOPIC, args.topic)], request_timeout=PATIENCE_S
    ).values()
    confluent = {name: entry.value for name, entry in future.result(PATIENCE_S).items()}
    python_admin = KafkaAdminClient(bootstrap_servers=args.bootstrap)
    described = python_admin.describe_configs(
        [PythonResource(ConfigResourceType.TOPIC, args.topic)], config_filter="All"
    )
    python_admin.close()
    (python,) = [topics[args.topic] for topics in described.values()]
    print(
        json.dumps(
            {
                "confluent": confluent,
                "python": {name: config["value"] for name, config in python.items()},
            }
        )
    )


def alter_configs(args):
    """Changes TOPIC's configs with confluent-kafka's AdminClient: a validate_only change
    (retention.ms), an IncrementalAlterConfigs SET (retention.bytes 8), an AlterConfigs
    (broker.max.records 2), then what the broker refuses: an incremental DELETE, an unknown
    config, a broker's config. Reports None for each change made, or the error's name."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import (
        AdminClient,
        AlterConfigOpType,
        ConfigEntry,
        ConfigResource,
        ResourceType,
    )

    admin = AdminClient({"bootstrap.servers": args.bootstrap})

    def incremental(name, value, operation, validate_only=False):
        entry = ConfigEntry(name, value, incremental_operation=operation)
        resource = ConfigResource(ResourceType.TOPIC, args.topic, incremental_configs=[entry])
        return admin.incremental_alter_configs(
            [resource], validate_only=validate_only, request_timeout=PATIENCE_S
        )

    def legacy(resource):
        return admin.alter_configs([resource], request_timeout=PATIENCE_S)

    def outcome(futures):
        (future,) = futures.values()
        try:
            future.result(PATIENCE_S)
            return None
        except KafkaException as error:
            return error.args[0].name()

    report = {
        "validated": outcome(incremental("retention.ms", "1000", AlterConfigOpType.SET, True)),
        "incremental": outcome(incremental("retention.bytes", "8", AlterConfigOpType.SET)),
        "alter": outcome(
            legacy(
                ConfigResource(
                    ResourceType.TOPIC, args.topic, set_config={"broker.max.records": "2"}
                )
            )
        ),
        "deleted": outcome(incremental("retention.ms", None, AlterConfigOpType.DELETE)),
        "unknown": outcome(
            legacy(
                ConfigResource(ResourceType.TOPIC, args.topic, set_config={"segment.ms": "1000"})
            )
        ),
        "broker": outcome(
            legacy(
                ConfigResource(
                    ResourceType.BROKER, "0", set_config={"log.retention.ms": "1000"}
                )
            )
        ),
    }
    print(json.dumps(report))


def secure(args):
    """Produces three records and reads them back over SASL/PLAIN and TLS as asked; reports
    what came back, or the errors the clients reported (a wrong password)."""
    from confluent_kafka import Consumer, Producer, TopicPartition

    config = {"bootstrap.servers": args.bootstrap, "security.protocol": args.protocol}
    if args.password is not None:
        config.update(
            {"sasl.mechanism": "PLAIN", "sasl.username": "any", "sasl.password": args.password}
        )
    if args.ca is not None:
        # The chain is checked against the CA; the test certificate names localhost only.
        config.update({"ssl.ca.location": args.ca, "ssl.endpoint.identification.algorithm": "none"})
    errors = []
    producer = Producer(
        {**config, "message.timeout.ms": 5000, "error_cb": lambda e: errors.append(e.name())}
    )
    failed = []
    for i in range(3):
        producer.produce(
            args.topic,
            value=f"secret {i}",
            partition=0,
            on_delivery=lambda e, _: e is not None and failed.append(e.name()),
        )
    producer.flush(PATIENCE_S)
    if failed or errors:
        print(json.dumps({"errors": sorted(set(errors + failed))}))
        return
    consumer = Consumer({**config, "group.id": "unused"})
    consumer.assign([TopicPartition(args.topic, 0, 0)])
    values = []
    deadline = time.time() + PATIENCE_S
    while len(values) < 3 and time.time() < deadline:
        message = consumer.poll(0.5)
        if message is not None and not message.error():
            values.append(message.value().decode())
    consumer.close()
    print(json.dumps({"values": values}))


def create(args):
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": args.bootstrap})
    futures = admin.create_topics(
        [NewTopic(args.topic, num_partitions=args.partitions, replication_factor=1)],
        operation_timeout=PATIENCE_S,
    )
    errors = {}
    for topic, future in futures.items():
        try:
            future.result(PATIENCE_S)
        except Exception as error:  # noqa: BLE001 - reported to the test
            errors[topic] = str(error)
    metadata = admin.list_topics(timeout=PATIENCE_S)
    topic = metadata.topics.get(args.topic)
    print(
        json.dumps(
            {
                "errors": errors,
                "partitions": None if topic is None else len(topic.partitions),
                "brokers": [f"{b.host}:{b.port}" for b in metadata.brokers.values()],
            }
        )
    )


def admin(args):
    """Grows a topic, describes the cluster and deletes groups through librdkafka's admin
    client, and deletes groups' offsets on the topic through kafka-python's, reporting each
    outcome (an error's name, or null)."""
    from confluent_kafka.admin import AdminClient, NewPartitions

    admin_client = AdminClient({"bootstrap.servers": args.bootstrap})

    def outcome(future):
        try:
            future.result(PATIENCE_S)
            return None
        except Exception as error:  # noqa: BLE001 - reported to the test
            return error.args[0].name() if error.args and hasattr(error.args[0], "name") else str(error)

    grown = {
        str(count): outcome(admin_client.create_partitions([NewPartitions(args.topic, count)])[args.topic])
        for count in args.grow
    }
    metadata = admin_client.list_topics(timeout=PATIENCE_S)
    cluster = admin_client.describe_cluster(request_timeout=PATIENCE_S).result(PATIENCE_S)
    deleted = {}
    for group in args.delete_groups:
        deleted[group] = outcome(admin_client.delete_consumer_groups([group])[group])
    # kafka-python's admin client, for the log directories and offset deletions (librdkafka
    # has neither call).
    from kafka import TopicPartition
    from kafka.admin import KafkaAdminClient

    python_admin = KafkaAdminClient(bootstrap_servers=args.bootstrap)
    log_dirs = python_admin.describe_log_dirs()
    # GROUP:P1,P2,...: each partition's error name (null when deleted), or the request's error.
    offsets_deleted = {}
    for spec in args.delete_offsets:
        group, partitions = spec.split(":")
        asked = [TopicPartition(args.topic, int(partition)) for partition in partitions.split(",")]
        try:
            answered = python_admin.delete_group_offsets(group, asked)
            offsets_deleted[group] = {
                str(partition.partition): None if error.errno == 0 else error.__name__
                for partition, error in answered.items()
            }
        except Exception as error:  # noqa: BLE001 - reported to the test
            offsets_deleted[group] = type(error).__name__
    python_admin.close()
    print(
        json.dumps(
            {
                "grown": grown,
                "partitions": len(metadata.topics[args.topic].partitions),
                "cluster_id": cluster.cluster_id,
                "controller": cluster.controller.id if cluster.controller else None,
                "nodes": [f"{node.host}:{node.port}" for node in cluster.nodes],
                "deleted": deleted,
                "offsets_deleted": offsets_deleted,
                "log_dirs": log_dirs,
            }
        )
    )


def refusals(args):
    """Produces the payloads in one batch without idempotence; reports each one's error."""
    from confluent_kafka import Producer

    producer = Producer(
        {
            "bootstrap.servers": args.bootstrap,
            # Long enough that the payloads go in one batch on a loaded machine too (with a
            # shorter linger a stalled test process sent them in batches of their own).
            "linger.ms": 1000,
            "message.timeout.ms": args.timeout_ms,
            "enable.idempotence": False,
        }
    )
    errors = {}

    def report(error, message):
        errors[message.value().decode()] = None if error is None else error.name()

    headers = [(f"h{i}", b"v") for i in range(args.headers)]
    started = time.time()
    for payload in args.payloads:
        producer.produce(args.topic, value=payload, partition=0, headers=headers, on_delivery=report)
    if producer.flush(PATIENCE_S) != 0:
        fail("records still waiting after the flush")
    print(json.dumps({"errors": errors, "seconds": time.time() - started}))


def transactional(args):
    """Starts a transactional producer, which the broker refuses; reports how and how fast."""
    from confluent_kafka import KafkaException, Producer

    producer = Producer({"bootstrap.servers": args.bootstrap, "transactional.id": "tx"})
    started = time.time()
    try:
        producer.init_transactions(PATIENCE_S)
    except KafkaException as error:
        refusal = error.args[0]
        print(
            json.dumps(
                {
                    "error": refusal.name(),
                    "fatal": refusal.fatal(),
                    "seconds": time.time() - started,
                }
            )
        )
        return
    fail("init_transactions succeeded")


def main():
    parser = argparse.ArgumentParser()
    commands = parser.add_subparsers(dest="command", required=True)
    p = commands.add_parser("produce")
    p.add_argument("bootstrap")
    p.add_argument("topic")
    p.add_argument("count", type=int)
    p.add_argument("--compression", default="none")
    p.add_argument("--partitioner")
    p.add_argument("--idempotent", action="store_true")
    p.add_argument("--pace-ms", type=int, default=0, help="a pause before every 10 records")
    p.set_defaults(run=produce)
    p = commands.add_parser("admin")
    p.add_argument("bootstrap")
    p.add_argument("topic")
    p.add_argument("--grow", type=int, nargs="+", default=[])
    p.add_argument("--delete-groups", nargs="+", default=[])
    p.add_argument("--delete-offsets", nargs="+", default=[], metavar="GROUP:PARTITIONS")
    p.set_defaults(run=admin)
    p = commands.add_parser("refusals")
    p.add_argument("bootstrap")
    p.add_argument("topic")
    p.add_argument("--payloads", nargs="+", required=True)
    p.add_argument("--headers", type=int, default=0)
    p.add_argument("--timeout-ms", type=int, default=3000)
    p.set_defaults(run=refusals)
    p = commands.add_parser("transactional")
    p.add_argument("bootstrap")
    p.set_defaults(run=transactional)
    p = commands.add_parser("consume")
    p.add_argument("bootstrap")
    p.add_argument("topic")
    p.add_argument("partitions", type=int)
    p.add_argument("count", type=int)
    p.add_argument("--start", choices=["earliest", "latest", "stored"], default="earliest")
    p.add_argument("--reset", choices=["earliest", "latest"], default="earliest")
    p.set_defaults(run=consume)
    p = commands.add_parser("python-roundtrip")
    p.add_argument("bootstrap")
    p.add_argument("topic")
    p.add_argument("count", type=int)
    p.set_defaults(run=python_roundtrip)
    p = commands.add_parser("python-group")
    p.add_argument("bootstrap")
    p.add_argument("topic")
    p.add_argument("group")
    p.add_argument("count", type=int)
    p.set_defaults(run=python_group)
    p = commands.add_parser("assigned-commit")
    p.add_argument("bootstrap")
    p.add_argument("topic")
    p.add_argument("group")
    p.add_argument("partition", type=int)
    p.add_argument("offset", type=int)
    p.set_defaults(run=assigned_commit)
    p = commands.add_parser("aio-roundtrip")
    p.add_argument("bootstrap")
    p.add_argument("topic")
    p.add_argument("group")
    p.add_argument("count", type=int)
    p.set_defaults(run=aio_roundtrip)
    p = commands.add_parser("offsets-for-time")
    p.add_argument("bootstrap")
    p.add_argument("topic")
    p.add_argument("partition", type=int)
    p.add_argument("timestamp", type=int)
    p.set_defaults(run=offsets_for_time)
    p = commands.add_parser("group")
    p.add_argument("bootstrap")
    p.add_argument("topic")
    p.add_argument("group")
    p.add_argument("count", type=int)
    p.add_argument("--consumers", type=int, default=2)
    p.set_defaults(run=group)
    p = commands.add_parser("through-restart")
    p.add_argument("bootstrap")
    p.add_argument("topic")
    p.add_argument("group")
    p.add_argument("count", type=int)
    p.add_argument("half", type=int)
    p.add_argument("--consumers", type=int, default=1)
    p.set_defaults(run=through_restart)
    p = commands.add_parser("hold")
    p.add_argument("bootstrap")
    p.add_argument("topic")
    p.add_argument("group")
    p.set_defaults(run=hold)
    p = commands.add_parser("delete-records")
    p.add_argument("bootstrap")
    p.add_argument("topic")
    p.add_argument("partition", type=int)
    p.add_argument("offset", type=int)
    p.set_defaults(run=delete_records)
    p = commands.add_parser("groups")
    p.add_argument("bootstrap")
    p.add_argument("group")
    p.set_defaults(run=groups)
    p = commands.add_parser("configs")
    p.add_argument("bootstrap")
    p.add_argument("topic")
    p.set_defaults(run=configs)
    p = commands.add_parser("alter-configs")
    p.add_argument("bootstrap")
    p.add_argument("topic")
    p.set_defaults(run=alter_configs)
    p = commands.add_parser("secure")
    p.add_argument("bootstrap")
    p.add_argument("topic")
    p.add_argument("--protocol", required=True)
    p.add_argument("--password")
    p.add_argument("--ca")
    p.set_defaults(run=secure)
    p = commands.add_parser("create")
    p.add_argument("bootstrap")
    p.add_argument("topic")
    p.add_argument("partitions", type=int)
    p.set_defaults(run=create)
    args = parser.parse_args()
    args.run(args)


if __name__ == "__main__":
    main()
