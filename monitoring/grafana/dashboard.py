#!/usr/bin/env python3
"""Writes monitoring/grafana/dashboards/broker.json, the broker's Grafana dashboard, from the
panels listed here: edit this file, run it, and commit both (CI checks that the JSON is what
this script writes, and tests/operability.rs that every series it asks for is one the server
serves).

    monitoring/grafana/dashboard.py            # writes the JSON
    monitoring/grafana/dashboard.py --check    # fails if the JSON is not what it would write
"""

import json
import pathlib
import sys

# (title, unit, [(PromQL, legend)], description), row by row; each row's panels share its width.
# Every node of a cluster reports the same topics, groups and dead letters (its copy of the
# state): those are taken once (`max` over the nodes) before they are added up. Requests,
# connections and published records are counted by the node that served them: those add up.
ROWS = [
    ("Traffic", [
        ("Requests per second, by command", "reqps",
         [("sum by (command) (rate(broker_requests_total[1m]))", "{{command}}")],
         "Requests answered on the broker's port, by wire command."),
        ("Refused requests per second", "reqps",
         [("sum by (command, error) (rate(broker_request_errors_total[1m]))", "{{command}}: {{error}}")],
         "Requests refused, by command and error kind."),
        ("Request latency, p99", "s",
         [("histogram_quantile(0.99, sum by (le, command) (rate(broker_request_duration_seconds_bucket[5m])))", "{{command}}")],
         "Arrival to answer, fsync included; long polls are not timed."),
        ("Records per second", "cps",
         [("sum(rate(broker_records_published_total[1m]))", "published"),
          ("sum(rate(broker_records_delivered_total[1m]))", "delivered"),
          ("sum(rate(broker_records_acknowledged_total[1m]))", "acknowledged"),
          ("sum(rate(broker_records_refused_total[1m]))", "refused (full)")],
         "Records stored, handed to consumers, acknowledged, refused by a full partition or budget."),
    ]),
    ("Consumers", [
        ("Lag by group", "short",
         [("sum by (topic, group) (max by (topic, group, partition) (broker_group_lag))", "{{topic}} / {{group}}")],
         "Records each group has yet to consume, over its partitions."),
        ("In flight by group", "short",
         [("sum by (topic, group) (max by (topic, group, partition) (broker_group_in_flight))", "{{topic}} / {{group}}")],
         "Deliveries waiting for an acknowledgement (ack mode)."),
        ("Members by group", "short",
         [("max by (topic, group) (broker_group_members)", "{{topic}} / {{group}}")],
         "Members of each consumer group."),
        ("Dead letters per second", "cps",
         [("max(rate(broker_records_dead_lettered_total[5m]))", "moved to a dead-letter topic"),
          ("max(rate(broker_records_dead_letter_refused_total[5m]))", "refused by it")],
         "Records past their last delivery."),
    ]),
    ("Topics", [
        ("Retained bytes by topic", "bytes",
         [("sum by (topic) (max by (topic, partition) (broker_partition_retained_bytes))", "{{topic}}")],
         "Payload, key and header bytes each topic retains."),
        ("Retained records by topic", "short",
         [("sum by (topic) (max by (topic, partition) (broker_partition_records))", "{{topic}}")],
         "Records each topic retains."),
        ("Publishes held back for the disk", "ops",
         [("sum(rate(broker_publishes_held_back_total[1m]))", "waits")],
         "With a data directory: batches that waited because records not yet on disk passed what --max-memory allows."),
        ("Records read ahead from disk", "ops",
         [("sum(rate(broker_records_read_ahead_total[1m]))", "records")],
         "With a data directory: records of group members' fetches and polls read from segment files before the lock."),
    ]),
    ("Connections", [
        ("Open connections", "short",
         [("sum by (listener) (broker_connections_open)", "{{listener}}")],
         "Client connections open, on the broker's port and the Kafka listener."),
        ("Bytes per second", "Bps",
         [("sum by (listener) (rate(broker_received_bytes_total[1m]))", "received ({{listener}})"),
          ("sum by (listener) (rate(broker_sent_bytes_total[1m]))", "sent ({{listener}})")],
         "Bytes read from and written to clients."),
        ("Refused connections per second", "cps",
         [("sum by (reason) (rate(broker_connections_refused_total[5m]))", "{{reason}}")],
         "Connections refused before their first request."),
        ("Kafka requests per second", "reqps",
         [("sum by (api) (rate(broker_kafka_requests_total[1m]))", "{{api}}")],
         "Requests answered by the Kafka listener, by API."),
    ]),
    ("Resources", [
        ("Memory", "bytes",
         [("process_resident_memory_bytes", "resident ({{instance}})"),
          ("broker_memory_used_bytes", "records retained ({{instance}})"),
          ("broker_memory_budget_bytes", "--max-memory ({{instance}})"),
          ("broker_request_memory_bytes", "requests being read ({{instance}})")],
         "The process's resident memory, and the budgets it is held to."),
        ("CPU", "percentunit",
         [("rate(process_cpu_seconds_total[1m])", "{{instance}}")],
         "CPU time per second, every thread (1 is one core)."),
        ("Data directory", "bytes",
         [("broker_data_dir_bytes", "used ({{instance}})"),
          ("broker_data_dir_free_bytes", "free ({{instance}})")],
         "Bytes of the data directory's files, and free on its file system."),
        ("Fsync latency, p99", "s",
         [("histogram_quantile(0.99, sum by (le, instance) (rate(broker_fsync_duration_seconds_bucket[5m])))", "{{instance}}")],
         "Each fsync of the log."),
    ]),
    ("Cluster", [
        ("Leader (node id)", "none",
         [("broker_cluster_leader_id", "first group, seen by {{instance}}"),
          ("broker_cluster_group_leader_id", "group {{group}}, seen by {{instance}}")],
         "The leader each node knows, of the first group and of each further group (0: none)."),
        ("Term", "none",
         [("broker_cluster_term", "first group, {{instance}}"),
          ("broker_cluster_group_term", "group {{group}}, {{instance}}")],
         "A term that climbs means elections."),
        ("Entries behind the leader", "short",
         [("broker_cluster_last_log_index - on (instance) group_right () broker_cluster_replicated_index", "first group, node {{node}}"),
          ("broker_cluster_group_last_log_index - on (instance, group) group_right () broker_cluster_group_replicated_index", "group {{group}}, node {{node}}")],
         "On each group's leader: how many entries of its log each node has yet to receive."),
        ("Peers reachable", "none",
         [("broker_cluster_peer_reachable", "{{instance}} to node {{node}}")],
         "1 where a node reaches another, 0 where it cannot."),
    ]),
]

WIDTH = 24


def panel(ident, title, unit, targets, description, x, y, width):
    return {
        "id": ident,
        "type": "timeseries",
        "title": title,
        "description": description,
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "gridPos": {"x": x, "y": y, "w": width, "h": 8},
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "options": {"legend": {"displayMode": "list", "placement": "bottom"},
                    "tooltip": {"mode": "multi"}},
        "targets": [
            {"refId": chr(ord("A") + index), "expr": expr, "legendFormat": legend,
             "datasource": {"type": "prometheus", "uid": "${datasource}"}}
            for index, (expr, legend) in enumerate(targets)
        ],
    }


def dashboard():
    panels = []
    ident = 1
    y = 0
    for row_title, row_panels in ROWS:
        panels.append({"id": ident, "type": "row", "title": row_title, "collapsed": False,
                       "gridPos": {"x": 0, "y": y, "w": WIDTH, "h": 1}, "panels": []})
        ident += 1
        y += 1
        width = WIDTH // len(row_panels)
        for index, (title, unit, targets, description) in enumerate(row_panels):
            panels.append(panel(ident, title, unit, targets, description, index * width, y, width))
            ident += 1
        y += 8
    return {
        "uid": "broker-overview",
        "title": "Broker",
        "description": "broker-server: traffic, consumers, topics, connections, resources and "
                       "the cluster, from the metrics endpoint (--metrics-listen).",
        "tags": ["broker"],
        "timezone": "",
        "schemaVersion": 39,
        "version": 1,
        "editable": True,
        "refresh": "10s",
        "time": {"from": "now-30m", "to": "now"},
        "templating": {"list": [{
            "name": "datasource", "label": "Prometheus", "type": "datasource",
            "query": "prometheus", "current": {}, "hide": 0,
        }]},
        "panels": panels,
    }


def main():
    path = pathlib.Path(__file__).parent / "dashboards" / "broker.json"
    text = json.dumps(dashboard(), indent=2) + "\n"
    if sys.argv[1:] == ["--check"]:
        if path.read_text() != text:
            sys.exit(f"{path} is not what {__file__} writes: run it and commit the result")
        return
    path.write_text(text)


if __name__ == "__main__":
    main()
