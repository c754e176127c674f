//! What an operator sees of a running broker: its metrics endpoint (scraped over HTTP and
//! checked with `promtool`), its log lines (their events, their format, the checks on the log
//! filter) and its start-up errors, through the real binary.

#![allow(clippy::unwrap_used)]

use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::process::Stdio;
use std::time::Duration;

use broker_client::Client;
use broker_testkit::http::{get as http_get, sample};
use broker_testkit::process::{refused_start_with, ServerProcess};
use serde_json::Value;

/// How long a server that must refuse to start may take.
const REFUSAL_LIMIT: Duration = Duration::from_secs(20);

/// Starts a server logging to a file, runs `work` against it, stops it and returns its log.
async fn logged<F, Fut>(extra: &[&str], work: F) -> String
where
    F: FnOnce(Client, SocketAddr) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("server.log");
    let mut server = ServerProcess::start_with(
        extra,
        &[],
        Stdio::from(std::fs::File::create(&log).unwrap()),
    );
    let client = Client::connect(server.addr).await.unwrap();
    work(client, server.addr).await;
    assert!(server.terminate(Duration::from_secs(20)).success());
    std::fs::read_to_string(&log).unwrap()
}

#[tokio::test]
async fn info_logs_what_changed_topics_and_groups_as_json_lines() {
    let log = logged(&["--log-format", "json"], |client, _| async move {
        client.create("orders", 2).await.unwrap();
        client.join("orders", "billing", "a").await.unwrap();
        client.join("orders", "billing", "b").await.unwrap();
        client.leave("orders", "billing", "b").await.unwrap();
        client.leave("orders", "billing", "a").await.unwrap();
        // Re-creating an existing topic changes nothing and logs nothing.
        assert!(!client.create("orders", 2).await.unwrap());
        client.delete_group("orders", "billing").await.unwrap();
        client.delete_topic("orders").await.unwrap();
    })
    .await;
    let lines: Vec<Value> = log
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}")))
        .collect();
    let events: Vec<(String, String)> = lines
        .iter()
        .filter(|line| line["target"] == "broker_server::audit")
        .map(|line| {
            assert_eq!(line["level"], "INFO", "{line}");
            assert_eq!(line["topic"], "orders", "{line}");
            let message = line["message"].as_str().unwrap().to_owned();
            let assignment = line["assignment"].as_str().unwrap_or_default().to_owned();
            (message, assignment)
        })
        .collect();
    let expected = [
        ("topic created", ""),
        ("member joined; group rebalanced", "a=[0, 1]"),
        ("member joined; group rebalanced", "a=[0] b=[1]"),
        ("member left; group rebalanced", "a=[0, 1]"),
        ("member left; group rebalanced", "no members"),
        ("group deleted", ""),
        ("topic deleted", ""),
    ];
    let expected: Vec<(String, String)> = expected
        .iter()
        .map(|(message, assignment)| (message.to_string(), assignment.to_string()))
        .collect();
    assert_eq!(events, expected, "{log}");
}

#[tokio::test]
async fn at_debug_a_connection_that_only_says_hello_logs_nothing() {
    let log = logged(&["--log-level", "debug"], |client, addr| async move {
        // Health checks: connect, hello, close.
        for _ in 0..5 {
            drop(Client::connect(addr).await.unwrap());
        }
        client.create("t", 1).await.unwrap();
        drop(client);
        // The closed connection is logged when the server notices.
        tokio::time::sleep(Duration::from_millis(200)).await;
    })
    .await;
    let closed: Vec<&str> = log
        .lines()
        .filter(|line| line.contains("connection closed"))
        .collect();
    assert_eq!(closed.len(), 1, "{log}");
    assert!(closed[0].contains("requests=1"), "{log}");
    assert!(!log.contains("connection opened"), "{log}");
}

#[test]
fn an_unknown_log_level_or_directive_refuses_to_start() {
    for (args, env, said) in [
        (
            &["--log-level", "verbose"][..],
            &[][..],
            "'verbose' for '--log-level",
        ),
        (&[], &[("BROKER_LOG_LEVEL", "loud")][..], "BROKER_LOG_LEVEL"),
        (
            &[],
            &[("RUST_LOG", "info,broker_server=chatty")],
            "invalid RUST_LOG",
        ),
        (&["--log-format", "xml"], &[], "'xml' for '--log-format"),
    ] {
        let refusal = refused_start_with(args, env, REFUSAL_LIMIT);
        assert_eq!(
            refusal.status.code(),
            Some(2),
            "{args:?} {env:?}: {refusal:?}"
        );
        assert!(
            refusal.stderr.contains(said),
            "{args:?} {env:?}: {refusal:?}"
        );
    }
}

#[test]
fn two_listeners_on_one_address_refuse_to_start_naming_both() {
    let refusal = refused_start_with(
        &[
            "--kafka-listen",
            "127.0.0.1:19555",
            "--metrics-listen",
            "127.0.0.1:19555",
        ],
        &[],
        REFUSAL_LIMIT,
    );
    assert_eq!(refusal.status.code(), Some(2), "{refusal:?}");
    assert!(
        refusal.stderr.contains(
            "--metrics-listen and --kafka-listen are both 127.0.0.1:19555: each listener needs \
             a port of its own"
        ),
        "{refusal:?}"
    );
}

#[test]
fn a_bad_value_in_an_environment_variable_names_the_variable() {
    let refusal = refused_start_with(&[], &[("BROKER_CAPACITY", "abc")], REFUSAL_LIMIT);
    assert_eq!(refusal.status.code(), Some(2), "{refusal:?}");
    assert!(
        refusal.stderr.starts_with(
            "error: invalid value \"abc\" in the environment variable BROKER_CAPACITY \
             (the variable of --capacity)"
        ),
        "{refusal:?}"
    );
    // The same value given as the flag names the flag.
    let refusal = refused_start_with(&["--capacity", "abc"], &[], REFUSAL_LIMIT);
    assert!(
        refusal.stderr.contains("'abc' for '--capacity"),
        "{refusal:?}"
    );
}

/// Checks `text` with `promtool check metrics`.
fn promtool_check(text: &str) {
    promtool(&["check", "metrics"], text);
}

/// Runs `promtool` with `args` and `input` on its standard input, and fails unless it
/// succeeds. Without promtool (Debian's `prometheus` package) on the PATH, fails if
/// `BROKER_REQUIRE_PROMTOOL` is set (as CI sets it) and otherwise says it skipped the check.
fn promtool(args: &[&str], input: &str) {
    let spawned = std::process::Command::new("promtool")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    let mut child = match spawned {
        Ok(child) => child,
        Err(error) if std::env::var_os("BROKER_REQUIRE_PROMTOOL").is_none() => {
            eprintln!("promtool not run ({error}): install Debian's prometheus package");
            return;
        }
        Err(error) => panic!("promtool is required (BROKER_REQUIRE_PROMTOOL): {error}"),
    };
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    let output = child.wait_with_output().unwrap();
    assert!(
        output.status.success(),
        "promtool {args:?}: {}{}\n{input}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

#[tokio::test]
async fn metrics_are_served_over_http_follow_the_broker_and_pass_promtool() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = ServerProcess::start(&[
        "--metrics-listen",
        "127.0.0.1:0",
        "--data-dir",
        dir.path().to_str().unwrap(),
        "--fsync",
        "always",
    ]);
    let metrics = server.metrics_addr.unwrap();
    let client = Client::connect(server.addr).await.unwrap();
    client.create("orders", 2).await.unwrap();
    client.join("orders", "billing", "a").await.unwrap();
    for payload in ["x", "y", "z"] {
        client.publish("orders", 0, payload).await.unwrap();
    }
    let records = client.poll("orders", "billing", "a", 1).await.unwrap();
    assert_eq!(records.len(), 1);
    assert!(client.ack("orders", "billing", "a", 0, 0).await.unwrap());
    assert!(client.publish("nosuch", 0, "x").await.is_err());

    let (status, headers, text) = http_get(metrics, "/metrics", "");
    assert_eq!(status, "HTTP/1.1 200 OK");
    assert!(
        headers.contains("content-type: text/plain; version=0.0.4"),
        "{headers}"
    );
    promtool_check(&text);
    for (series, value) in [
        ("broker_records_published_total", 3.0),
        ("broker_records_delivered_total", 1.0),
        ("broker_records_acknowledged_total", 1.0),
        ("broker_requests_total{command=\"publish\"}", 4.0),
        ("broker_requests_total{command=\"ack\"}", 1.0),
        (
            "broker_request_errors_total{command=\"publish\",error=\"invalid_argument\"}",
            1.0,
        ),
        (
            "broker_request_duration_seconds_count{command=\"publish\"}",
            4.0,
        ),
        ("broker_connections_open{listener=\"broker\"}", 1.0),
        ("broker_connections_open{listener=\"kafka\"}", 0.0),
        ("broker_records_refused_total", 0.0),
        (
            "broker_group_members{topic=\"orders\",group=\"billing\"}",
            1.0,
        ),
        ("broker_topic_shard{topic=\"orders\"}", 0.0),
        (
            "broker_connections_refused_total{reason=\"unauthenticated\"}",
            0.0,
        ),
        (
            "broker_partition_end_offset{topic=\"orders\",partition=\"0\"}",
            3.0,
        ),
        // The acknowledged record left: its only group consumed it.
        (
            "broker_partition_records{topic=\"orders\",partition=\"0\"}",
            2.0,
        ),
        (
            "broker_partition_earliest_offset{topic=\"orders\",partition=\"0\"}",
            1.0,
        ),
        (
            "broker_group_committed_offset{topic=\"orders\",group=\"billing\",partition=\"0\"}",
            1.0,
        ),
        (
            "broker_group_lag{topic=\"orders\",group=\"billing\",partition=\"0\"}",
            2.0,
        ),
        (
            "broker_group_in_flight{topic=\"orders\",group=\"billing\",partition=\"0\"}",
            0.0,
        ),
    ] {
        assert_eq!(sample(&text, series), value, "{series}");
    }
    assert!(sample(&text, "broker_received_bytes_total{listener=\"broker\"}") > 0.0);
    assert!(sample(&text, "broker_sent_bytes_total{listener=\"broker\"}") > 0.0);
    // Every change was fsynced before it was answered.
    assert!(
        sample(&text, "broker_fsync_duration_seconds_count") >= 5.0,
        "{text}"
    );
    // What every exporter says of its process, under the usual names, and the broker's build
    // and disk.
    let pid = server.pid();
    let resident = sample(&text, "process_resident_memory_bytes");
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let now_kib: f64 = status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
        .unwrap();
    assert!(
        resident > 1e6 && (resident - now_kib * 1024.0).abs() < 64e6,
        "resident {resident}, /proc says {now_kib} KiB"
    );
    assert!(sample(&text, "process_virtual_memory_bytes") >= resident);
    assert!(sample(&text, "process_cpu_seconds_total") > 0.0);
    let open = sample(&text, "process_open_fds");
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count() as f64;
    assert!(
        open >= 5.0 && (open - fds).abs() <= 4.0,
        "{open} fds, /proc lists {fds}"
    );
    assert!(sample(&text, "process_max_fds") >= open);
    let started = sample(&text, "process_start_time_seconds");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    assert!(
        started <= now && now - started < 600.0,
        "started at {started}, now {now}"
    );
    assert_eq!(
        sample(
            &text,
            &format!(
                "broker_build_info{{version=\"{}\"}}",
                env!("CARGO_PKG_VERSION")
            )
        ),
        1.0
    );
    let held = broker_testkit::files::every_file(dir.path())
        .values()
        .map(Vec::len)
        .sum::<usize>() as f64;
    let reported = sample(&text, "broker_data_dir_bytes");
    assert!(
        reported > 0.0 && (reported - held).abs() < 1e6,
        "the data directory holds {held} bytes, the metric says {reported}"
    );
    assert!(sample(&text, "broker_data_dir_free_bytes") > 0.0);

    // Prometheus asks for OpenMetrics first, and gets it.
    let (_, headers, text) = http_get(
        metrics,
        "/metrics",
        "application/openmetrics-text;version=1.0.0,text/plain;q=0.5",
    );
    assert!(
        headers.contains("content-type: application/openmetrics-text"),
        "{headers}"
    );
    assert!(text.ends_with("# EOF\n"), "{text}");
    assert!(text.contains("# TYPE broker_requests counter"), "{text}");

    // A deleted topic leaves no series behind; other paths are not found.
    client.leave("orders", "billing", "a").await.unwrap();
    client.delete_group("orders", "billing").await.unwrap();
    client.delete_topic("orders").await.unwrap();
    let (_, _, text) = http_get(metrics, "/metrics", "");
    assert!(!text.contains("topic=\"orders\""), "{text}");
    let (status, _, _) = http_get(metrics, "/", "");
    assert_eq!(status, "HTTP/1.1 404 Not Found");
    drop(client);
    assert!(server.terminate(Duration::from_secs(20)).success());
}

#[tokio::test]
async fn a_poison_record_goes_to_the_dead_letter_topic_and_a_delayed_retry_waits_its_turn() {
    use broker_client::{GroupSetting, TopicName};
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("server.log");
    let mut server = ServerProcess::start_with(
        &["--metrics-listen", "127.0.0.1:0"],
        &[],
        Stdio::from(std::fs::File::create(&log).unwrap()),
    );
    let client = Client::connect(server.addr).await.unwrap();
    client.create("jobs", 1).await.unwrap();
    let settings = [
        GroupSetting::MaxDeliveries(2),
        GroupSetting::DeadLetter(TopicName::new("jobs-dlq").unwrap()),
    ];
    client
        .join_group("jobs", "workers", "w", None, &settings)
        .await
        .unwrap();
    for payload in ["poison", "fine"] {
        client.publish("jobs", 0, payload).await.unwrap();
    }
    // Two deliveries, each retried: the second retry moves it on.
    for count in 1..=2 {
        let records = client.poll("jobs", "workers", "w", 1).await.unwrap();
        assert_eq!(records[0].payload, "poison");
        assert_eq!(records[0].delivery_count, count);
        assert!(client.retry("jobs", "workers", "w", 0, 0).await.unwrap());
    }
    let records = client.poll("jobs", "workers", "w", 1).await.unwrap();
    assert_eq!(records[0].payload, "fine");
    assert!(client.ack("jobs", "workers", "w", 0, 1).await.unwrap());
    client.join("jobs-dlq", "audit", "a").await.unwrap();
    let dead = client.fetch("jobs-dlq", "audit", "a", 10).await.unwrap();
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].payload, "poison");
    let reason = dead[0]
        .headers
        .iter()
        .find(|header| header.name == "dead-letter.reason")
        .and_then(|header| header.value.clone());
    assert_eq!(reason, Some("retried".into()));
    let description = client.describe_topic("jobs").await.unwrap();
    assert_eq!(description.groups[0].settings, settings);

    // A delayed retry: nothing until the delay ends, then a waiting poll gets it again.
    client.publish("jobs", 0, "later").await.unwrap();
    let records = client.poll("jobs", "workers", "w", 1).await.unwrap();
    assert_eq!(records[0].payload, "later");
    let delay = Duration::from_millis(300);
    assert!(client
        .retry_after("jobs", "workers", "w", 0, 2, delay)
        .await
        .unwrap());
    assert!(client
        .poll("jobs", "workers", "w", 1)
        .await
        .unwrap()
        .is_empty());
    // Other requests keep arriving while the poll waits (each moves the broker's clock): the
    // end of the delay still wakes it, rather than the wait ending with nothing.
    let busy = Client::connect(server.addr).await.unwrap();
    let chatter = tokio::spawn(async move {
        for _ in 0..500 {
            if busy.end_offset("jobs", 0).await.is_err() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    });
    let records = client
        .poll_wait("jobs", "workers", "w", 1, Duration::from_secs(20))
        .await
        .unwrap();
    chatter.abort();
    assert_eq!(records.len(), 1, "the wait ended with nothing");
    assert_eq!(records[0].payload, "later");
    assert_eq!(records[0].delivery_count, 2);

    let (_, _, text) = http_get(server.metrics_addr.unwrap(), "/metrics", "");
    assert_eq!(
        sample(&text, "broker_records_dead_lettered_total"),
        1.0,
        "{text}"
    );
    promtool_check(&text);
    drop(client);
    assert!(server.terminate(Duration::from_secs(20)).success());
    let log = std::fs::read_to_string(&log).unwrap();
    let line = log
        .lines()
        .find(|line| line.contains("record dead-lettered"))
        .unwrap_or_else(|| panic!("no dead letter logged:\n{log}"));
    assert!(line.contains("dead_letter=\"jobs-dlq\""), "{line}");
    assert!(line.contains("reason=\"retried\""), "{line}");
    let created = log
        .lines()
        .find(|line| line.contains("dead-letter topic created"))
        .unwrap_or_else(|| panic!("the dead-letter topic's creation was not logged:\n{log}"));
    assert!(created.contains("topic=\"jobs-dlq\""), "{created}");
    assert!(created.contains("group=\"workers\""), "{created}");
}

#[tokio::test]
async fn deleting_a_topic_ends_its_members_sessions_without_a_removal_later() {
    // Sessions are checked every quarter of the timeout: a second is several checks past it.
    let log = logged(&["--session-timeout-ms", "200"], |client, _| async move {
        for topic in ["gone", "again"] {
            client.create(topic, 1).await.unwrap();
            client.join(topic, "g", "m").await.unwrap();
            assert!(client.delete_topic(topic).await.unwrap());
        }
        // A topic of the same name is a new topic: the old member is not in it.
        client.create("again", 1).await.unwrap();
        tokio::time::sleep(Duration::from_secs(1)).await;
        let description = client.describe_topic("again").await.unwrap();
        assert!(description.groups.is_empty(), "{description:?}");
    })
    .await;
    for removal in ["member removed by the server", "refused to remove a member"] {
        assert!(!log.contains(removal), "{removal}:\n{log}");
    }
    assert_eq!(log.matches("topic deleted").count(), 2, "{log}");
}

#[tokio::test]
async fn http_at_the_broker_port_and_the_broker_protocol_at_the_metrics_port_say_so() {
    let server = ServerProcess::start(&["--metrics-listen", "127.0.0.1:0"]);
    // Connections that never send a request do not keep a scrape out.
    let idle: Vec<TcpStream> = (0..8)
        .map(|_| TcpStream::connect(server.metrics_addr.unwrap()).unwrap())
        .collect();
    let (status, _, _) = http_get(server.metrics_addr.unwrap(), "/metrics", "");
    assert_eq!(status, "HTTP/1.1 200 OK");
    drop(idle);
    let (status, _, body) = http_get(server.addr, "/metrics", "");
    assert_eq!(status, "HTTP/1.1 400 Bad Request");
    assert!(body.contains("--metrics-listen"), "{body}");
    let refused = Client::connect(server.metrics_addr.unwrap()).await;
    match refused {
        Err(broker_client::Error::Protocol(why)) => assert!(why.contains("metrics"), "{why}"),
        other => panic!("expected a protocol error, got {other:?}"),
    }
    // The broker still serves its own clients.
    let client = Client::connect(server.addr).await.unwrap();
    assert!(client.create("t", 1).await.unwrap());
}

#[tokio::test]
async fn a_restart_does_not_report_dead_letters_again_and_a_refused_one_is_a_warning() {
    use broker_client::{GroupSetting, TopicName};
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let data = data.to_str().unwrap();
    let args = ["--metrics-listen", "127.0.0.1:0", "--data-dir", data];
    let first_log = dir.path().join("first.log");
    let mut server = ServerProcess::start_with(
        &args,
        &[],
        Stdio::from(std::fs::File::create(&first_log).unwrap()),
    );
    let client = Client::connect(server.addr).await.unwrap();
    client.create("jobs", 1).await.unwrap();
    // A dead-letter topic that takes one record and refuses the next.
    let full = [
        broker_client::TopicSetting::Retention(broker_client::Retention::Limits),
        broker_client::TopicSetting::MaxRecords(1),
        broker_client::TopicSetting::Discard(broker_client::Discard::New),
    ];
    client
        .create_topic("dlq", 1, broker_client::KeyHash::Murmur2, &full)
        .await
        .unwrap();
    let settings = [
        GroupSetting::MaxDeliveries(1),
        GroupSetting::DeadLetter(TopicName::new("dlq").unwrap()),
    ];
    client
        .join_group("jobs", "g", "w", None, &settings)
        .await
        .unwrap();
    for (offset, payload) in ["first", "second"].into_iter().enumerate() {
        client.publish("jobs", 0, payload).await.unwrap();
        let records = client.poll("jobs", "g", "w", 1).await.unwrap();
        assert_eq!(records[0].payload, payload);
        assert!(client
            .retry("jobs", "g", "w", 0, offset as i64)
            .await
            .unwrap());
    }
    let (_, _, text) = http_get(server.metrics_addr.unwrap(), "/metrics", "");
    assert_eq!(
        sample(&text, "broker_records_dead_lettered_total"),
        1.0,
        "{text}"
    );
    assert_eq!(
        sample(&text, "broker_records_dead_letter_refused_total"),
        1.0,
        "{text}"
    );
    drop(client);
    assert!(server.terminate(Duration::from_secs(20)).success());
    let first = std::fs::read_to_string(&first_log).unwrap();
    assert!(first.contains("record dead-lettered"), "{first}");
    assert!(
        first.contains("cannot take a record past its last delivery"),
        "{first}"
    );

    // The restart replays the log: what it moved is not news.
    let second_log = dir.path().join("second.log");
    let mut server = ServerProcess::start_with(
        &args,
        &[],
        Stdio::from(std::fs::File::create(&second_log).unwrap()),
    );
    let (_, _, text) = http_get(server.metrics_addr.unwrap(), "/metrics", "");
    assert_eq!(
        sample(&text, "broker_records_dead_lettered_total"),
        0.0,
        "{text}"
    );
    assert_eq!(
        sample(&text, "broker_records_dead_letter_refused_total"),
        0.0,
        "{text}"
    );
    assert!(server.terminate(Duration::from_secs(20)).success());
    let second = std::fs::read_to_string(&second_log).unwrap();
    assert!(!second.contains("dead-letter"), "{second}");
}

/// The PromQL expressions of the Grafana dashboard in `monitoring/grafana/dashboards`.
fn dashboard_expressions() -> Vec<String> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../monitoring/grafana/dashboards/broker.json"
    );
    let dashboard: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    dashboard["panels"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|panel| panel["targets"].as_array().cloned().unwrap_or_default())
        .map(|target| target["expr"].as_str().unwrap().to_owned())
        .collect()
}

/// The metric names an expression asks for: the broker's and the process's.
fn metric_names(expression: &str) -> Vec<&str> {
    expression
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|word| word.starts_with("broker_") || word.starts_with("process_"))
        .collect()
}

#[tokio::test]
async fn the_dashboard_asks_only_for_series_the_server_serves_in_valid_promql() {
    let dir = tempfile::tempdir().unwrap();
    let members = format!(
        "1=127.0.0.1:{}/127.0.0.1:1",
        broker_testkit::cluster::free_addr().port()
    );
    // A node of a cluster of one with two groups, a Kafka listener and a data directory: every
    // family the dashboard shows.
    let server = ServerProcess::start(&[
        "--node-id",
        "1",
        "--cluster-members",
        &members,
        "--cluster-data-groups",
        "2",
        "--data-dir",
        dir.path().to_str().unwrap(),
        "--metrics-listen",
        "127.0.0.1:0",
        "--kafka-listen",
        "127.0.0.1:0",
    ]);
    let client = Client::connect(server.addr).await.unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    // Until the node leads both groups and knows where each topic lives (a moment after it
    // starts, longer on a loaded machine), calls are answered `NotLeader`.
    let set_up = || async {
        client.create("orders", 2).await?;
        client.join("orders", "billing", "a").await
    };
    while let Err(refusal) = set_up().await {
        assert!(
            std::time::Instant::now() < deadline,
            "a cluster of one never led: {refusal}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    client.publish("orders", 0, "x").await.unwrap();
    assert_eq!(
        client
            .poll("orders", "billing", "a", 1)
            .await
            .unwrap()
            .len(),
        1
    );
    // A refusal, for the families that appear with their first error.
    assert!(client.publish("missing", 0, "x").await.is_err());
    let (_, _, text) = http_get(server.metrics_addr.unwrap(), "/metrics", "");

    let expressions = dashboard_expressions();
    assert!(expressions.len() >= 20, "{expressions:?}");
    let served = |name: &str| {
        let family = ["_bucket", "_total"]
            .iter()
            .find_map(|suffix| name.strip_suffix(suffix))
            .unwrap_or(name);
        text.lines().any(|line| {
            line.split(['{', ' ']).next() == Some(name)
                || line.starts_with(&format!("# TYPE {family} "))
                || line.starts_with(&format!("# TYPE {name} "))
        })
    };
    for expression in &expressions {
        let names = metric_names(expression);
        assert!(!names.is_empty(), "{expression} names no metric");
        for name in names {
            assert!(
                served(name),
                "{name} (in {expression}) is not served:\n{text}"
            );
        }
    }
    // Each expression is valid PromQL: promtool checks them as recording rules.
    let mut rules = String::from("groups:\n  - name: dashboard\n    rules:\n");
    for (index, expression) in expressions.iter().enumerate() {
        rules.push_str(&format!(
            "      - record: dashboard:panel_{index}\n        expr: {}\n",
            serde_json::to_string(expression).unwrap()
        ));
    }
    let file = dir.path().join("dashboard-rules.yml");
    std::fs::write(&file, rules).unwrap();
    promtool(&["check", "rules", file.to_str().unwrap()], "");
}
