#!/usr/bin/env python3
"""End-to-end Redis Streams consumer-group throughput, the counterpart of `broker bench ack` and
`broker bench fetch`: producers XADD 100-byte records with pipelined requests, consumers read
them with XREADGROUP (COUNT per batch) and acknowledge each batch with one XACK pipelined with
the next read. Prints one JSON object: records/s published AND acknowledged.

Used by bench/compare.sh; needs the `redis` Python package and a running redis-server.
"""

import argparse
import json
import multiprocessing as mp
import time

import redis

STREAM = "bench-e2e"
GROUP = "bench"


def produce(port, count, size, depth, start_event):
    r = redis.Redis(port=port)
    payload = b"x" * size
    start_event.wait()
    sent = 0
    while sent < count:
        n = min(depth, count - sent)
        pipe = r.pipeline(transaction=False)
        for _ in range(n):
            pipe.xadd(STREAM, {"f": payload})
        pipe.execute()
        sent += n


def consume(port, name, batch, total, acked, start_event):
    r = redis.Redis(port=port)
    start_event.wait()
    pending_ids = []
    while True:
        with acked.get_lock():
            if acked.value >= total:
                break
        pipe = r.pipeline(transaction=False)
        if pending_ids:
            pipe.xack(STREAM, GROUP, *pending_ids)
        pipe.xreadgroup(GROUP, name, {STREAM: ">"}, count=batch, block=100)
        results = pipe.execute()
        if pending_ids:
            with acked.get_lock():
                acked.value += results[0]
        reply = results[-1]
        pending_ids = [entry_id for _, entries in (reply or []) for entry_id, _ in entries]
    if pending_ids:
        r.xack(STREAM, GROUP, *pending_ids)


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--producers", type=int, default=1)
    parser.add_argument("--consumers", type=int, default=1)
    parser.add_argument("--depth", type=int, default=64)
    parser.add_argument("--batch", type=int, default=100)
    args = parser.parse_args()

    r = redis.Redis(port=args.port)
    r.delete(STREAM)
    r.xgroup_create(STREAM, GROUP, id="0", mkstream=True)

    start_event = mp.Event()
    acked = mp.Value("q", 0)
    share = [args.records // args.producers + (1 if i < args.records % args.producers else 0)
             for i in range(args.producers)]
    processes = [mp.Process(target=produce, args=(args.port, n, args.size, args.depth, start_event))
                 for n in share]
    processes += [mp.Process(target=consume,
                             args=(args.port, f"c{i}", args.batch, args.records, acked, start_event))
                  for i in range(args.consumers)]
    for p in processes:
        p.start()
    started = time.perf_counter()
    start_event.set()
    for p in processes:
        p.join()
    elapsed = time.perf_counter() - started
    r.delete(STREAM)
    print(json.dumps({
        "records": args.records,
        "acknowledged": acked.value,
        "elapsed_secs": elapsed,
        "records_per_sec": args.records / elapsed,
    }))


if __name__ == "__main__":
    main()
