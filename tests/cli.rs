//! The real `broker` command line against the real `broker-server`: every subcommand as a user
//! types it (with `--addr`), what it prints, and its exit status (0 success, 1 refused or
//! unreachable with one `error: ...` line, 2 bad arguments).
//!
//! The server binary is the one `cargo test --workspace` (or `cargo build -p broker-server`)
//! builds beside this test. Every command runs under a time limit; nothing sleeps to wait.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use broker_testkit::process::ServerProcess;
use serde_json::{json, Value};

/// The longest any one `broker` command may take.
const LIMIT: Duration = Duration::from_secs(20);

/// What one run of `broker` did.
#[derive(Debug)]
struct Run {
    code: Option<i32>,
    /// Standard output as text (invalid UTF-8 replaced).
    stdout: String,
    /// Standard output as it was written.
    stdout_bytes: Vec<u8>,
    stderr: String,
}

impl Run {
    /// Asserts success and returns standard output.
    #[track_caller]
    fn ok(&self) -> &str {
        assert_eq!(self.code, Some(0), "{self:#?}");
        &self.stdout
    }

    /// Standard output's lines.
    fn lines(&self) -> Vec<&str> {
        self.stdout.lines().collect()
    }

    /// Asserts exit status 1 with exactly one line on standard error, `error: ...`, and
    /// returns it.
    #[track_caller]
    fn one_error_line(&self) -> &str {
        assert_eq!(self.code, Some(1), "{self:#?}");
        let lines: Vec<&str> = self.stderr.lines().collect();
        assert_eq!(lines.len(), 1, "{self:#?}");
        assert!(lines[0].starts_with("error: "), "{self:#?}");
        assert!(!lines[0].contains("Error {"), "a debug dump: {self:#?}");
        lines[0]
    }
}

fn broker_command() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_broker"));
    command.env_remove("BROKER_ADDR").env_remove("RUST_LOG");
    command
}

/// Runs `command` with `input` on standard input, within `LIMIT`.
fn run_command(mut command: Command, input: impl AsRef<[u8]>) -> Run {
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start broker");
    let mut stdin = child.stdin.take().unwrap();
    let input = input.as_ref().to_vec();
    let writer = std::thread::spawn(move || {
        let _ = stdin.write_all(&input);
    });
    let reader = |mut pipe: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            pipe.read_to_end(&mut bytes).expect("read broker output");
            bytes
        })
    };
    let stdout = reader(Box::new(child.stdout.take().unwrap()));
    let stderr = reader(Box::new(child.stderr.take().unwrap()));
    let status = wait_within_limit(&mut child, &format!("{command:?}"));
    writer.join().unwrap();
    let stdout_bytes = stdout.join().unwrap();
    Run {
        code: status.code(),
        stdout: String::from_utf8_lossy(&stdout_bytes).into_owned(),
        stdout_bytes,
        stderr: String::from_utf8_lossy(&stderr.join().unwrap()).into_owned(),
    }
}

/// Waits for `child` (the broker command `what`) to exit, killing it past `LIMIT`.
fn wait_within_limit(child: &mut std::process::Child, what: &str) -> std::process::ExitStatus {
    let deadline = Instant::now() + LIMIT;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("broker {what} took longer than {LIMIT:?}");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// `broker --addr ADDR args...` with nothing on standard input.
fn broker(server: &ServerProcess, args: &[&str]) -> Run {
    broker_with_input(server, args, "")
}

/// `broker --addr ADDR args...` with `input` on standard input.
fn broker_with_input(server: &ServerProcess, args: &[&str], input: impl AsRef<[u8]>) -> Run {
    let mut command = broker_command();
    command.args(["--addr", &server.addr_string()]).args(args);
    run_command(command, input)
}

/// `broker args...` without an address.
fn broker_alone(args: &[&str]) -> Run {
    let mut command = broker_command();
    command.args(args);
    run_command(command, "")
}

/// `broker describe TOPIC --json`, parsed.
fn describe_json(server: &ServerProcess, topic: &str) -> Value {
    let run = broker(server, &["describe", topic, "--json"]);
    let text = run.ok();
    // The fields in the order the description has them (scripts diff the text).
    let at = |key: &str| text.find(&format!("\"{key}\":"));
    assert!(
        at("name") < at("key_hash") && at("key_hash") < at("partitions"),
        "{text}"
    );
    serde_json::from_str(text).expect("describe --json prints JSON")
}

/// End offsets of every partition of `topic`, from `describe --json`.
fn end_offsets(server: &ServerProcess, topic: &str) -> Vec<i64> {
    describe_json(server, topic)["topics"][0]["partitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["end_offset"].as_i64().unwrap())
        .collect()
}

#[test]
fn create_makes_a_topic_and_says_when_it_already_exists() {
    let server = ServerProcess::start(&[]);
    let run = broker(&server, &["create", "orders", "--partitions", "3"]);
    assert_eq!(run.ok(), "created topic orders with 3 partitions\n");
    // Again as asked, or without naming the partitions: it exists, which is what was wanted.
    for again in [
        &["create", "orders", "--partitions", "3"][..],
        &["create", "orders"],
    ] {
        let again = broker(&server, again);
        assert_eq!(
            again.ok(),
            "topic orders already exists as asked: 3 partitions, interest retention\n"
        );
    }
    // Other partitions than it has: an error that says what it has.
    let other = broker(&server, &["create", "orders", "--partitions", "5"]);
    assert_eq!(
        other.one_error_line(),
        "error: topic orders already exists with 3 partitions, not 5: add --add-partitions to \
         grow it"
    );
    assert_eq!(
        end_offsets(&server, "orders"),
        [0, 0, 0],
        "kept its 3 partitions"
    );
    // BROKER_ADDR instead of --addr.
    let mut command = broker_command();
    command
        .env("BROKER_ADDR", server.addr_string())
        .args(["create", "other"]);
    let run = run_command(command, "");
    assert_eq!(run.ok(), "created topic other with 1 partition\n");
}

#[test]
fn publish_takes_payloads_from_arguments_or_one_record_per_line_of_stdin() {
    let server = ServerProcess::start(&[]);
    broker(&server, &["create", "t", "--partitions", "2"]).ok();
    let run = broker(
        &server,
        &["publish", "t", "a", "b", "c", "--partition", "1"],
    );
    assert_eq!(
        run.lines(),
        [
            "published to t partition 1 offset 0",
            "published to t partition 1 offset 1",
            "published to t partition 1 offset 2",
        ]
    );
    run.ok();
    assert_eq!(end_offsets(&server, "t"), [0, 3]);

    // No payload arguments: each line of standard input is a record, round-robin.
    let run = broker_with_input(
        &server,
        &["publish", "t", "--json"],
        "one\ntwo\nthree\nfour\n",
    );
    run.ok();
    let published: Vec<Value> = run
        .lines()
        .iter()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    assert_eq!(published.len(), 4);
    assert!(published.iter().all(|p| p["topic"] == "t"));
    assert_eq!(end_offsets(&server, "t"), [2, 5]);

    // Keyless records go to consecutive partitions.
    let partitions: Vec<i64> = published
        .iter()
        .map(|p| p["partition"].as_i64().unwrap())
        .collect();
    assert_ne!(partitions[0], partitions[1], "{partitions:?}");
    assert_eq!(partitions[0], partitions[2], "{partitions:?}");
    assert_eq!(partitions[1], partitions[3], "{partitions:?}");

    // What was stored is what was sent, in order: each stdin line is one record.
    let consumed = broker(
        &server,
        &["consume", "t", "-g", "g", "-m", "m", "--mode", "fetch"],
    );
    consumed.ok();
    // Fetch mode prints ascending partitions, each in offset order.
    let lines = consumed.lines();
    let (first, second) = if partitions[0] == 0 {
        ("one", "two")
    } else {
        ("two", "one")
    };
    let (third, fourth) = if partitions[0] == 0 {
        ("three", "four")
    } else {
        ("four", "three")
    };
    assert_eq!(
        lines,
        [
            format!("[0@0] {first}"),
            format!("[0@1] {third}"),
            "[1@0] a".to_owned(),
            "[1@1] b".to_owned(),
            "[1@2] c".to_owned(),
            format!("[1@3] {second}"),
            format!("[1@4] {fourth}"),
        ]
    );
}

#[test]
fn publish_stores_each_line_of_standard_input_as_it_comes() {
    let server = ServerProcess::start(&[]);
    broker(&server, &["create", "t", "--retention", "limits"]).ok();
    let mut command = broker_command();
    command.args(["--addr", &server.addr_string(), "publish", "t", "--quiet"]);
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start broker");
    let mut stdin = child.stdin.take().unwrap();
    // Two lines, and the input left open: both are stored while it waits for more.
    stdin.write_all(b"first\nsecond\n").unwrap();
    stdin.flush().unwrap();
    let stored = (0..100).any(|_| {
        std::thread::sleep(Duration::from_millis(100));
        end_offsets(&server, "t") == [2]
    });
    drop(stdin);
    let status = wait_within_limit(&mut child, "publish, once its input ended,");
    assert!(stored, "the lines were not stored before the input ended");
    assert!(status.success());
    assert_eq!(
        payloads(&server, "t"),
        [b"first".to_vec(), b"second".to_vec()]
    );
}

#[test]
fn a_key_routes_records_where_kafkas_partitioner_would() {
    let server = ServerProcess::start(&[]);
    broker(&server, &["create", "keyed", "--partitions", "7"]).ok();
    // Kafka: murmur2("21") = -973932308, & 0x7fffffff = 1173551340, % 7 = 3.
    let run = broker(&server, &["publish", "keyed", "x", "y", "--key", "21"]);
    assert_eq!(
        run.lines(),
        [
            "published to keyed partition 3 offset 0",
            "published to keyed partition 3 offset 1"
        ]
    );
    // murmur2("foobar") = -790332482 -> partition 0 of 7.
    let run = broker(&server, &["publish", "keyed", "z", "--key", "foobar"]);
    assert_eq!(run.lines(), ["published to keyed partition 0 offset 0"]);
    // Records print with their key.
    let consumed = broker(&server, &["consume", "keyed", "-g", "g", "-m", "m"]);
    assert_eq!(
        consumed.lines(),
        ["[0@0 foobar] z", "[3@0 21] x", "[3@1 21] y"]
    );
}

#[test]
fn consume_in_ack_mode_prints_each_record_acknowledges_it_and_stops_when_none_is_left() {
    let server = ServerProcess::start(&[]);
    broker(&server, &["create", "t", "--partitions", "2"]).ok();
    broker(&server, &["publish", "t", "a0", "a1", "--partition", "0"]).ok();
    broker(&server, &["publish", "t", "b0", "--partition", "1"]).ok();
    let run = broker(&server, &["consume", "t", "--group", "g", "--member", "m"]);
    // One record in flight per partition: each round takes the next of every partition.
    assert_eq!(run.lines(), ["[0@0] a0", "[1@0] b0", "[0@1] a1"]);
    assert!(run.stderr.contains("joined"), "{run:#?}");
    run.ok();
    // Everything was acknowledged: a second run prints nothing, and the lag is 0.
    let again = broker(&server, &["consume", "t", "--group", "g", "--member", "m"]);
    assert_eq!(again.ok(), "");
    let lag: Value =
        serde_json::from_str(broker(&server, &["lag", "t", "-g", "g", "--json"]).ok()).unwrap();
    assert_eq!(lag[0]["committed"], 2);
    assert_eq!(lag[1]["committed"], 1);
    assert!(lag.as_array().unwrap().iter().all(|l| l["lag"] == 0));
    // The consumer left its group at the end.
    let group = &describe_json(&server, "t")["topics"][0]["groups"][0];
    assert_eq!(group["name"], "g");
    assert_eq!(group["members"].as_array().unwrap().len(), 0);
}

#[test]
fn consume_in_fetch_mode_prints_json_lines_and_commits() {
    let server = ServerProcess::start(&[]);
    broker(&server, &["create", "t", "--partitions", "2"]).ok();
    broker(&server, &["publish", "t", "k-record", "--key", "21"]).ok();
    broker(&server, &["publish", "t", "p0", "--partition", "0"]).ok();
    broker(&server, &["publish", "t", "p1", "--partition", "1"]).ok();
    let args = [
        "consume",
        "t",
        "-g",
        "analytics",
        "-m",
        "a1",
        "--mode",
        "fetch",
        "--json",
    ];
    let run = broker(&server, &args);
    run.ok();
    let records: Vec<Value> = run
        .lines()
        .iter()
        .map(|line| serde_json::from_str(line).expect("one JSON object per line"))
        .collect();
    // murmur2("21") % 2 = 0: the keyed record is partition 0's first.
    assert_eq!(records.len(), 3);
    assert_eq!(records[0]["topic"], "t");
    assert_eq!(records[0]["partition"], 0);
    assert_eq!(records[0]["offset"], 0);
    assert_eq!(records[0]["key"], "21");
    assert_eq!(records[0]["payload"], "k-record");
    assert_eq!(records[1]["payload"], "p0");
    assert_eq!(records[1]["key"], Value::Null);
    assert_eq!(records[2]["partition"], 1);
    assert_eq!(records[2]["payload"], "p1");
    // Committed: the group resumes after what was printed.
    let again = broker(&server, &args);
    assert_eq!(again.ok(), "");
    broker(&server, &["publish", "t", "later", "--partition", "1"]).ok();
    let third = broker(&server, &args);
    let later: Value = serde_json::from_str(third.ok().trim()).unwrap();
    assert_eq!(later["payload"], "later");
    assert_eq!(later["offset"], 1);
}

#[test]
fn two_groups_consume_the_same_records_independently() {
    let server = ServerProcess::start(&[]);
    broker(&server, &["create", "t", "--partitions", "3"]).ok();
    // Records stay until every group of the topic has consumed them, so the groups exist
    // before anyone consumes (a group outlives its last member).
    for group in ["billing", "analytics", "audit"] {
        broker(&server, &["join", "t", "-g", group, "-m", "x"]).ok();
        broker(&server, &["leave", "t", "-g", group, "-m", "x"]).ok();
    }
    broker_with_input(&server, &["publish", "t"], "1\n2\n3\n4\n5\n6\n").ok();
    let billing = broker(&server, &["consume", "t", "-g", "billing", "-m", "b1"]);
    let analytics = broker(
        &server,
        &[
            "consume",
            "t",
            "-g",
            "analytics",
            "-m",
            "a1",
            "--mode",
            "fetch",
        ],
    );
    let sorted = |run: &Run| {
        let mut payloads: Vec<String> = run
            .ok()
            .lines()
            .map(|l| l.split_once("] ").unwrap().1.to_owned())
            .collect();
        payloads.sort_unstable();
        payloads
    };
    assert_eq!(sorted(&billing), ["1", "2", "3", "4", "5", "6"]);
    assert_eq!(sorted(&analytics), ["1", "2", "3", "4", "5", "6"]);
    // Both consuming did not take anything from a third group either; once it has consumed
    // them too, the records leave.
    let third = broker(&server, &["consume", "t", "-g", "audit", "-m", "x"]);
    assert_eq!(sorted(&third).len(), 6);
    let json = describe_json(&server, "t");
    assert_eq!(json["topics"][0]["retained_bytes"], 0, "{json:#}");
}

#[test]
fn consume_count_stops_after_that_many_records_and_the_rest_stay_for_the_next_run() {
    let server = ServerProcess::start(&[]);
    broker(&server, &["create", "t"]).ok();
    for group in ["g-ack", "g-fetch"] {
        broker(&server, &["join", "t", "-g", group, "-m", "m"]).ok();
        broker(&server, &["leave", "t", "-g", group, "-m", "m"]).ok();
    }
    broker_with_input(&server, &["publish", "t"], "r0\nr1\nr2\nr3\nr4\n").ok();
    for mode in ["ack", "fetch"] {
        let group = format!("g-{mode}");
        let args = ["consume", "t", "-g", &group, "-m", "m", "--mode", mode];
        let first = broker(&server, &[&args[..], &["--count", "2"]].concat());
        assert_eq!(first.lines(), ["[0@0] r0", "[0@1] r1"], "{mode}");
        let second = broker(&server, &[&args[..], &["-n", "2"]].concat());
        assert_eq!(second.lines(), ["[0@2] r2", "[0@3] r3"], "{mode}");
        let rest = broker(&server, &args);
        assert_eq!(rest.lines(), ["[0@4] r4"], "{mode}");
    }
}

#[test]
fn describe_prints_tables_and_json() {
    let server = ServerProcess::start(&["--capacity", "10"]);
    assert!(broker(&server, &["describe"]).ok().contains("no topics"));
    broker(&server, &["create", "orders", "--partitions", "2"]).ok();
    broker(
        &server,
        &["publish", "orders", "abc", "defg", "--partition", "0"],
    )
    .ok();
    broker(&server, &["join", "orders", "-g", "billing", "-m", "m1"]).ok();
    broker(&server, &["join", "orders", "-g", "billing", "-m", "m2"]).ok();
    broker(
        &server,
        &[
            "consume", "orders", "-g", "billing", "-m", "m1", "-n", "1", "--stay",
        ],
    )
    .ok();

    // billing is the topic's only group: the record it acknowledged ("abc") has left.
    let text = broker(&server, &["describe"]);
    let text = text.ok();
    assert!(
        text.contains(
            "topic orders: 2 partitions, key hash murmur2, interest retention, 4 bytes retained"
        ),
        "{text}"
    );
    assert!(
        text.contains("group billing (round-robin): m1 [0], m2 [1]"),
        "{text}"
    );
    let header = |words: &[&str]| {
        text.lines()
            .any(|line| line.split_whitespace().eq(words.iter().copied()))
    };
    assert!(
        header(&["PARTITION", "EARLIEST", "END", "RECORDS", "BYTES"]),
        "{text}"
    );
    assert!(
        header(&[
            "PARTITION",
            "OWNER",
            "COMMITTED",
            "POSITION",
            "IN-FLIGHT",
            "LAG"
        ]),
        "{text}"
    );
    // Partition 0: earliest 1, end 2, 1 record, 4 bytes; billing committed 1 of it.
    assert!(header(&["0", "1", "2", "1", "4"]), "{text}");
    assert!(header(&["0", "m1", "1", "1", "-", "1"]), "{text}");
    assert!(header(&["1", "m2", "0", "0", "-", "0"]), "{text}");

    let json = describe_json(&server, "orders");
    assert_eq!(json["capacity_per_partition"], 10);
    let topic = &json["topics"][0];
    assert_eq!(topic["name"], "orders");
    assert_eq!(topic["retained_bytes"], 4);
    assert_eq!(topic["partitions"][0]["earliest_offset"], 1);
    assert_eq!(topic["partitions"][0]["end_offset"], 2);
    assert_eq!(topic["partitions"][0]["records"], 1);
    assert_eq!(topic["partitions"][1]["end_offset"], 0);
    let group = &topic["groups"][0];
    assert_eq!(group["name"], "billing");
    // Named as in the text output and the --assignor flag.
    assert_eq!(group["assignor"], "round-robin");
    assert_eq!(group["members"][0]["member"], "m1");
    assert_eq!(group["members"][0]["partitions"], json!([0]));
    assert_eq!(group["partitions"][0]["committed"], 1);
    assert_eq!(group["partitions"][0]["lag"], 1);
    assert_eq!(group["partitions"][0]["owner"], "m1");
    // The whole broker as JSON has the same topic.
    let all: Value = serde_json::from_str(broker(&server, &["describe", "--json"]).ok()).unwrap();
    assert_eq!(all["topics"][0], *topic);
    // An unknown topic is refused.
    broker(&server, &["describe", "nope"]).one_error_line();
}

#[test]
fn lag_shows_end_minus_committed_per_partition() {
    let server = ServerProcess::start(&[]);
    broker(&server, &["create", "t", "--partitions", "2"]).ok();
    broker(
        &server,
        &["publish", "t", "a", "b", "c", "--partition", "0"],
    )
    .ok();
    broker(&server, &["publish", "t", "d", "--partition", "1"]).ok();
    broker(
        &server,
        &[
            "consume", "t", "-g", "g", "-m", "m", "--mode", "fetch", "-n", "2",
        ],
    )
    .ok();
    let run = broker(&server, &["lag", "t", "-g", "g"]);
    let text = run.ok();
    assert!(
        text.starts_with("group g on topic t: total lag 2\n"),
        "{text}"
    );
    let row = |words: &[&str]| {
        text.lines()
            .any(|line| line.split_whitespace().eq(words.iter().copied()))
    };
    assert!(row(&["PARTITION", "COMMITTED", "END", "LAG"]), "{text}");
    assert!(row(&["0", "2", "3", "1"]), "{text}");
    assert!(row(&["1", "0", "1", "1"]), "{text}");
    let json: Value =
        serde_json::from_str(broker(&server, &["lag", "t", "-g", "g", "--json"]).ok()).unwrap();
    assert_eq!(
        json,
        json!([
            {"partition": 0, "committed": 2, "end_offset": 3, "lag": 1, "skipped": 0},
            {"partition": 1, "committed": 0, "end_offset": 1, "lag": 1, "skipped": 0},
        ])
    );
    // A group that does not exist is an error that names the groups there are.
    let none = broker(&server, &["lag", "t", "-g", "nobody", "--json"]);
    assert_eq!(
        none.one_error_line(),
        "error: group nobody does not exist on topic t (its groups: g)"
    );
    assert_eq!(none.stdout, "");
}

#[test]
fn join_and_leave_print_the_assignment_and_rebalance() {
    let server = ServerProcess::start(&[]);
    broker(&server, &["create", "t", "--partitions", "3"]).ok();
    let a = broker(&server, &["join", "t", "-g", "g", "-m", "a"]);
    assert_eq!(a.ok(), "a joined group g on t: partitions [0, 1, 2]\n");
    let b = broker(&server, &["join", "t", "--group", "g", "--member", "b"]);
    assert_eq!(b.ok(), "b joined group g on t: partitions [1]\n");
    let left = broker(&server, &["leave", "t", "-g", "g", "-m", "a"]);
    assert_eq!(left.ok(), "a left group g on t\n");
    let members = &describe_json(&server, "t")["topics"][0]["groups"][0]["members"];
    assert_eq!(members[0]["member"], "b");
    assert_eq!(members[0]["partitions"], json!([0, 1, 2]));
    let again = broker(&server, &["leave", "t", "-g", "g", "-m", "a"]);
    assert!(again.ok().contains("not a member"), "{again:#?}");
    // The group's assignor is fixed: naming another is refused.
    let refused = broker(
        &server,
        &["join", "t", "-g", "g", "-m", "c", "--assignor", "range"],
    );
    assert!(
        refused.one_error_line().contains("invalid argument"),
        "{refused:#?}"
    );
    let range = broker(
        &server,
        &["join", "t", "-g", "r", "-m", "c", "--assignor", "range"],
    );
    assert_eq!(range.ok(), "c joined group r on t: partitions [0, 1, 2]\n");
}

#[test]
fn size_prints_the_sizing_example() {
    let run = broker_alone(&[
        "size",
        "--message-bytes",
        "1500",
        "--rate",
        "2000",
        "--retention",
        "3d",
        "--replication",
        "3",
        "--headroom",
        "30",
    ]);
    let text = run.ok();
    let line = |label: &str| {
        text.lines()
            .find(|l| l.starts_with(label))
            .unwrap_or_else(|| panic!("{text}"))
    };
    assert!(
        line("written per second:").contains(" 3,000,000 bytes"),
        "{text}"
    );
    assert!(
        line("one copy").contains(" 777,600,000,000 bytes"),
        "{text}"
    );
    assert!(
        line("x 3 replicas:").contains(" 2,332,800,000,000 bytes"),
        "{text}"
    );
    assert!(
        line("with 30% headroom:").contains(" 3,032,640,000,000 bytes"),
        "{text}"
    );
    let json: Value = serde_json::from_str(
        broker_alone(&[
            "size",
            "--message-bytes",
            "1500",
            "--rate",
            "2000",
            "--retention",
            "72h",
            "--replication",
            "3",
            "--json",
        ])
        .ok(),
    )
    .unwrap();
    assert_eq!(json["replicated_bytes"], 2_332_800_000_000_u64);
    assert_eq!(json["with_headroom_bytes"], 2_332_800_000_000_u64);
    // Past 64 bits: one error line, not a wrapped number.
    let overflow = broker_alone(&[
        "size",
        "--message-bytes",
        "18446744073709551615",
        "--rate",
        "2",
        "--retention",
        "1s",
    ]);
    overflow.one_error_line();
    // No copy at all is a bad argument; one is said so.
    let small = [
        "size",
        "--message-bytes",
        "100",
        "--rate",
        "2",
        "--retention",
        "1s",
    ];
    let none = broker_alone(&[&small[..], &["--replication", "0"]].concat());
    assert_eq!(none.code, Some(2), "{none:#?}");
    let one = broker_alone(&small);
    assert!(one.ok().contains("x 1 replica:"), "{one:#?}");
}

#[test]
fn exit_codes_are_1_for_refusals_and_unreachable_servers_and_2_for_bad_arguments() {
    let server = ServerProcess::start(&[]);
    broker(&server, &["create", "t"]).ok();
    // Refused by the broker: one line, exit 1, nothing on stdout.
    for args in [
        &["create", "bad name"][..],
        &["create", "x", "--partitions", "65"],
        &["publish", "nope", "x"],
        &["publish", "t", "x", "--partition", "5"],
        &["consume", "bad/topic", "-g", "g", "-m", "m"],
        &["lag", "nope", "-g", "g"],
    ] {
        let run = broker(&server, args);
        let line = run.one_error_line();
        assert!(line.contains("invalid argument"), "{args:?}: {run:#?}");
        assert_eq!(run.stdout, "", "{args:?}");
    }
    // Nobody listens on a port that was just freed.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = format!("127.0.0.1:{port}");
    let run = broker_alone(&["--addr", &addr, "describe"]);
    let line = run.one_error_line();
    assert!(line.contains("cannot reach broker-server"), "{run:#?}");
    assert!(line.contains(&addr), "{run:#?}");
    // Bad command lines never reach the server.
    for args in [
        &["publish", "t", "--bogus"][..],
        &["create"],
        &["create", "t", "--partitions", "many"],
        &["consume", "t", "-g", "g"],
        &["consume", "t", "-g", "g", "-m", "m", "--mode", "sideways"],
        &["consume", "t", "-g", "g", "-m", "m", "--batch", "0"],
        &["consume", "t", "-g", "g", "-m", "m", "--ack-timeout", "0s"],
        &[
            "consume",
            "t",
            "-g",
            "g",
            "-m",
            "m",
            "--max-deliveries",
            "1",
            "--dead-letter",
            "a b",
        ],
        &["publish", "t", "x", "--key", "k", "--partition", "0"],
        &["nonsense"],
        &[],
    ] {
        let run = broker(&server, args);
        assert_eq!(run.code, Some(2), "{args:?}: {run:#?}");
    }
    let help = broker_alone(&["--help"]);
    assert!(help.ok().contains("Examples:"), "{help:#?}");
}

#[test]
fn a_batch_too_large_for_ack_mode_exits_2_before_joining() {
    let server = ServerProcess::start(&[]);
    broker(&server, &["create", "t"]).ok();
    // Ack mode reserves at most 64 records per poll: refused before the member joins.
    let run = broker(
        &server,
        &["consume", "t", "-g", "g", "-m", "m", "--batch", "65"],
    );
    // Bad arguments, as clap says of its own: exit 2, the error, then the usage.
    assert_eq!(run.code, Some(2), "{run:#?}");
    assert_eq!(run.stdout, "");
    assert_eq!(
        run.stderr.lines().next(),
        Some("error: --batch in ack mode is at most 64 (a poll takes one record per partition)")
    );
    assert!(run.stderr.contains("Usage: broker consume"), "{run:#?}");
    let groups = &describe_json(&server, "t")["topics"][0]["groups"];
    assert_eq!(groups, &json!([]), "{groups:#}");
}

/// The payloads of every record of partition 0 of `topic`, read exactly as stored.
fn payloads(server: &ServerProcess, topic: &str) -> Vec<Vec<u8>> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let client = broker_client::Client::connect(server.addr).await.unwrap();
        client.join(topic, "payload-check", "reader").await.unwrap();
        let records = client
            .fetch(topic, "payload-check", "reader", 1000)
            .await
            .unwrap();
        records
            .into_iter()
            .map(|record| record.payload.to_vec())
            .collect()
    })
}

#[test]
fn publish_reads_standard_input_as_bytes_split_at_the_delimiter() {
    let server = ServerProcess::start(&[]);
    for topic in ["lines", "nul", "whole"] {
        broker(&server, &["create", topic]).ok();
    }
    // Lines: not UTF-8, empty, ending in \r\n, and a last one without a line break.
    let run = broker_with_input(&server, &["publish", "lines"], b"a\n\xff\xfe\n\nb\r\nc");
    assert_eq!(run.lines().len(), 5, "{run:#?}");
    run.ok();
    assert_eq!(
        payloads(&server, "lines"),
        [&b"a"[..], b"\xff\xfe", b"", b"b", b"c"]
    );
    // NUL-terminated, nothing else removed.
    broker_with_input(
        &server,
        &["publish", "nul", "--delimiter", "\\0"],
        b"x\r\n\0y\0",
    )
    .ok();
    assert_eq!(payloads(&server, "nul"), [&b"x\r\n"[..], b"y"]);
    // All of standard input as one record.
    broker_with_input(&server, &["publish", "whole", "--binary"], b"1\n2\n\0").ok();
    assert_eq!(payloads(&server, "whole"), [&b"1\n2\n\0"[..]]);
    // A delimiter is one character; neither option goes with payload arguments.
    for args in [
        &["publish", "nul", "--delimiter", "ab"][..],
        &["publish", "nul", "--delimiter", ",", "x"],
        &["publish", "nul", "--binary", "x"],
    ] {
        let run = broker(&server, args);
        assert_eq!(run.code, Some(2), "{run:#?}");
    }
}

#[test]
fn consume_raw_prints_payloads_exactly_and_publish_reads_them_back() {
    let server = ServerProcess::start(&[]);
    for topic in ["bytes", "copy"] {
        // Limits retention: every group below reads every record.
        let create = [
            "create",
            topic,
            "--partitions",
            "1",
            "--retention",
            "limits",
        ];
        broker(&server, &create).ok();
    }
    let records: [&[u8]; 3] = [b"\xff\xfe\x01abc", b"two\nlines", b""];
    for record in records {
        broker_with_input(&server, &["publish", "bytes", "--binary"], record).ok();
    }
    let consume = |topic: &str, group: &str, extra: &[&str]| {
        let mut args = vec!["consume", topic, "-g", group, "-m", "m"];
        args.extend_from_slice(extra);
        broker(&server, &args)
    };
    // Each payload as it was published, then the delimiter.
    let raw = consume("bytes", "nul", &["--raw", "--delimiter", "\\0"]);
    raw.ok();
    assert_eq!(raw.stdout_bytes, b"\xff\xfe\x01abc\0two\nlines\0\0");
    // A newline by default; what --raw prints, --delimiter publishes back unchanged.
    let lines = consume("bytes", "lines", &["--raw", "--mode", "fetch"]);
    lines.ok();
    assert_eq!(lines.stdout_bytes, b"\xff\xfe\x01abc\ntwo\nlines\n\n");
    broker_with_input(
        &server,
        &["publish", "copy", "--delimiter", "\\0"],
        &raw.stdout_bytes,
    )
    .ok();
    assert_eq!(payloads(&server, "copy"), records);
    // Text and JSON replace what is not UTF-8; --raw goes with neither JSON nor a delimiter
    // alone.
    let json = consume("bytes", "json", &["--json", "-n", "1"]);
    assert!(
        json.ok()
            .contains("\"payload\":\"\u{fffd}\u{fffd}\\u0001abc\""),
        "{json:#?}"
    );
    for extra in [
        &["--raw", "--json"][..],
        &["--delimiter", "\\0"],
        &["-n", "0"],
    ] {
        let refused = consume("bytes", "bad", extra);
        assert_eq!(refused.code, Some(2), "{refused:#?}");
    }
    // Settings of deliveries do not go with fetch mode.
    let fetch = [
        "--mode",
        "fetch",
        "--max-deliveries",
        "3",
        "--dead-letter",
        "dl",
    ];
    let refused = consume("bytes", "bad", &fetch);
    assert_eq!(refused.code, Some(2), "{refused:#?}");
    assert!(refused.stderr.contains("are for ack mode"), "{refused:#?}");
}

#[test]
fn publish_json_prints_every_record_refused_ones_too_and_goes_on() {
    let server = ServerProcess::start(&["--capacity", "2", "--max-payload-bytes", "10"]);
    broker(&server, &["create", "t"]).ok();
    let run = broker(
        &server,
        &["publish", "t", "a", "0123456789abc", "b", "c", "--json"],
    );
    assert_eq!(run.code, Some(1), "{run:#?}");
    let printed: Vec<Value> = run
        .lines()
        .iter()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    assert_eq!(
        printed,
        [
            json!({"record": 1, "topic": "t", "partition": 0, "offset": 0}),
            json!({"record": 2, "topic": "t", "partition": null, "offset": null,
                   "error": "too large: a record's payload, key and headers are 13 bytes, the limit is 10"}),
            json!({"record": 3, "topic": "t", "partition": 0, "offset": 1}),
            json!({"record": 4, "topic": "t", "partition": 0, "offset": null,
                   "error": "partition 0 of t is full"}),
        ]
    );
    assert!(
        run.stderr
            .contains("record 4 not stored: partition 0 of t is full"),
        "{run:#?}"
    );
    assert!(
        run.stderr.lines().last().unwrap().starts_with(
            "error: 2 of 4 records were not stored: 1 because their partition was full"
        ),
        "{run:#?}"
    );
    // --quiet: one line at the end, or only the error that counts what was not stored.
    broker(&server, &["create", "fresh"]).ok();
    let run = broker_with_input(&server, &["publish", "fresh", "--quiet"], "a\nb\n");
    assert_eq!(run.ok(), "published 2 records to fresh\n", "{run:#?}");
    let run = broker(&server, &["publish", "t", "x", "--quiet"]);
    assert!(
        run.one_error_line()
            .starts_with("error: 1 of 1 records were not stored"),
        "{run:#?}"
    );
    assert_eq!(run.stdout, "");
}

#[test]
fn publishing_into_a_full_partition_exits_1_and_says_the_partition_is_full() {
    let server = ServerProcess::start(&["--capacity", "2"]);
    broker(&server, &["create", "t"]).ok();
    let run = broker(&server, &["publish", "t", "a", "b", "c"]);
    assert_eq!(run.code, Some(1), "{run:#?}");
    assert_eq!(
        run.lines(),
        [
            "published to t partition 0 offset 0",
            "published to t partition 0 offset 1"
        ]
    );
    assert!(run.stderr.contains("partition 0 of t is full"), "{run:#?}");
    let last = run.stderr.lines().last().unwrap();
    assert!(
        last.starts_with("error: ") && last.contains("full") && last.contains("--max-memory"),
        "{run:#?}"
    );
    assert_eq!(end_offsets(&server, "t"), [2]);
    // Once a group has consumed them, there is room again.
    broker(&server, &["consume", "t", "-g", "g", "-m", "m"]).ok();
    assert!(broker(&server, &["publish", "t", "c"])
        .ok()
        .contains("offset 2"));
    // A record larger than a partition may keep is not "full": it can never be stored.
    let create = [
        "create",
        "small",
        "--retention",
        "limits",
        "--max-bytes",
        "10",
    ];
    broker(&server, &create).ok();
    let run = broker(&server, &["publish", "small", "0123456789", "0123456789x"]);
    assert_eq!(run.code, Some(1), "{run:#?}");
    assert_eq!(run.lines(), ["published to small partition 0 offset 0"]);
    assert!(
        run.stderr.contains(
            "record 2 not stored: its 11 bytes are more than a partition of small keeps \
             (--max-bytes 10): it can never be stored"
        ),
        "{run:#?}"
    );
    assert!(
        run.stderr
            .contains("1 because they are larger than the topic's --max-bytes"),
        "{run:#?}"
    );
    assert!(!run.stderr.contains("full"), "{run:#?}");
}

#[test]
fn consume_follow_survives_a_server_restart_and_ctrl_c_exits_130_with_the_count() {
    let dir = tempfile::tempdir().unwrap();
    let args = ["--data-dir", dir.path().to_str().unwrap()];
    let mut server = ServerProcess::start(&args);
    broker(&server, &["create", "live"]).ok();
    let mut follower = Running::start(
        &server,
        &["consume", "live", "-g", "g", "-m", "m", "--follow"],
    );
    let (joined, before) = follower.next_line("stderr");
    assert!(
        joined.contains("joined group g on live"),
        "{joined:?} after {before:?}"
    );
    assert!(before.is_empty(), "printed before joining: {before:?}");

    let published = Instant::now();
    broker(&server, &["publish", "live", "hello"]).ok();
    let (line, skipped) = follower.next_line("stdout");
    assert_eq!(line, "[0@0] hello", "skipped {skipped:?}");
    // Woken by the publish, not by the end of its 5-second wait and a new poll.
    let took = published.elapsed();
    assert!(took < Duration::from_secs(4), "the record took {took:?}");

    // The acknowledgement rides on the follower's next poll: once it is applied, nothing is
    // in flight, so the restart below redelivers nothing.
    let deadline = Instant::now() + Duration::from_secs(30);
    while describe_json(&server, "live")["topics"][0]["groups"][0]["partitions"][0]["committed"]
        != 1
    {
        assert!(
            Instant::now() < deadline,
            "the record was never acknowledged"
        );
        std::thread::sleep(Duration::from_millis(20));
    }

    // The server restarts (on the same address and data) under the follower, which carries on.
    let addr = server.addr;
    server.kill();
    let (lost, _) = follower.next_line("stderr");
    assert!(lost.contains("trying again"), "{lost:?}");
    let server = ServerProcess::start_on(addr, &args);
    let (found, _) = follower.next_line("stderr");
    assert_eq!(found, "consuming again");
    broker(&server, &["publish", "live", "again"]).ok();
    let (line, skipped) = follower.next_line("stdout");
    assert_eq!(line, "[0@1] again", "skipped {skipped:?}");
    assert!(
        follower.child.try_wait().unwrap().is_none(),
        "--follow stopped by itself"
    );

    // Ctrl-C: it says how many records it consumed, leaves the group and exits with 130.
    let status = Command::new("kill")
        .args(["-INT", &follower.child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let (interrupted, _) = follower.next_line("stderr");
    assert_eq!(interrupted, "interrupted");
    let (count, _) = follower.next_line("stderr");
    assert_eq!(count, "consumed 2 records");
    let exit = follower.child.wait().unwrap();
    assert_eq!(exit.code(), Some(130));
    let group = &describe_json(&server, "live")["topics"][0]["groups"][0];
    assert_eq!(group["members"], json!([]), "{group}");
}

#[test]
fn consume_without_follow_stops_with_the_error_when_the_server_cannot_serve_it() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    // A checkpoint after every log entry: the records move to segment files at once.
    let args = [
        "--data-dir",
        data.to_str().unwrap(),
        "--snapshot-log-bytes",
        "1",
    ];
    let mut server = ServerProcess::start(&args);
    broker(&server, &["create", "cold", "--retention", "limits"]).ok();
    let input: String = (0..20).map(|i| format!("record {i}\n")).collect();
    broker_with_input(&server, &["publish", "cold", "--quiet"], input).ok();
    assert!(server.terminate(LIMIT).success());
    // Damage the last record on disk: it fails its checksum when a consumer reaches it.
    let segments: Vec<std::path::PathBuf> = walk(&data.join("records"))
        .into_iter()
        .filter(|path| path.extension().is_some_and(|ext| ext == "rec"))
        .collect();
    let segment = segments
        .iter()
        .max_by_key(|path| std::fs::metadata(path).unwrap().len())
        .expect("a record segment");
    let mut bytes = std::fs::read(segment).unwrap();
    assert!(bytes.len() > 64, "{segment:?} holds no records");
    *bytes.last_mut().unwrap() ^= 0xff;
    std::fs::write(segment, bytes).unwrap();

    let server = ServerProcess::start(&args);
    let run = broker(&server, &["consume", "cold", "-g", "g", "-m", "m"]);
    assert_eq!(run.code, Some(1), "{run:#?}");
    assert!(run.stderr.contains("checksum"), "{run:#?}");
    // The damaged record's offset, for `broker purge --before` the one after it.
    assert!(run.stderr.contains("the record at offset "), "{run:#?}");
    assert!(run.stderr.contains("without --follow"), "{run:#?}");
    assert!(!run.stderr.contains("trying again"), "{run:#?}");
}

/// Every file under `dir`, at any depth.
fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files.extend(walk(&path));
        } else {
            files.push(path);
        }
    }
    files
}

#[test]
fn top_keeps_looking_through_a_server_restart() {
    let dir = tempfile::tempdir().unwrap();
    let args = ["--data-dir", dir.path().to_str().unwrap()];
    let mut server = ServerProcess::start(&args);
    broker(&server, &["create", "watched", "--partitions", "2"]).ok();
    let top = Running::start(&server, &["top", "--interval", "1s", "--count", "2"]);
    // The line of the topic in the next view on standard output. The server is killed well
    // within the second between the first view and the next look.
    let next_view = || loop {
        let (line, _) = top.next_line("stdout");
        if line.trim_start().starts_with("watched") {
            return line;
        }
    };
    next_view();

    let addr = server.addr;
    server.kill();
    let (lost, _) = top.next_line("stderr");
    assert!(
        lost.starts_with("warning: ") && lost.ends_with("trying again every 1s"),
        "{lost:?}"
    );
    let server = ServerProcess::start_on(addr, &args);
    let (found, _) = top.next_line("stderr");
    assert_eq!(found, "reachable again");
    broker(&server, &["publish", "watched", "after the restart"]).ok();
    next_view();
    let mut top = top;
    let exit = top.child.wait().unwrap();
    assert_eq!(exit.code(), Some(0), "top stopped after its two views");
}

/// A `broker` command left running, its output lines read by threads onto one channel so that
/// every wait for a line is bounded. Killed when dropped, if still running.
struct Running {
    child: std::process::Child,
    lines: mpsc::Receiver<(&'static str, String)>,
}

impl Running {
    /// Starts `broker --addr ADDR args...`.
    fn start(server: &ServerProcess, args: &[&str]) -> Running {
        let mut child = broker_command()
            .args(["--addr", &server.addr_string()])
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start broker");
        let (tx, lines) = mpsc::channel();
        let forward = |name: &'static str, pipe: Box<dyn Read + Send>, tx: mpsc::Sender<_>| {
            std::thread::spawn(move || {
                for line in BufReader::new(pipe).lines() {
                    let Ok(line) = line else { break };
                    if tx.send((name, line)).is_err() {
                        break;
                    }
                }
            })
        };
        forward("stdout", Box::new(child.stdout.take().unwrap()), tx.clone());
        forward("stderr", Box::new(child.stderr.take().unwrap()), tx);
        Running { child, lines }
    }

    /// The next line it prints on `want` (`"stdout"` or `"stderr"`), within `LIMIT`, and
    /// the lines of the other stream it printed before it.
    fn next_line(&self, want: &str) -> (String, Vec<String>) {
        let deadline = Instant::now() + LIMIT;
        let mut skipped = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok((name, line)) if name == want => return (line, skipped),
                Ok((name, line)) => skipped.push(format!("{name}: {line}")),
                Err(err) => panic!("no {want} line ({err}); saw {skipped:?}"),
            }
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

#[test]
fn consume_follow_says_when_the_group_rebalances_while_it_waits() {
    let server = ServerProcess::start(&[]);
    broker(&server, &["create", "t", "--partitions", "4"]).ok();
    let first = Running::start(&server, &["consume", "t", "-g", "g", "-m", "a", "--follow"]);
    let (joined, _) = first.next_line("stderr");
    assert_eq!(joined, "a joined group g on t: partitions [0, 1, 2, 3]");
    // A second member takes half the partitions while the first waits for records, and gives
    // them back when it leaves.
    let second = Running::start(&server, &["consume", "t", "-g", "g", "-m", "b", "--follow"]);
    let (joined, _) = second.next_line("stderr");
    assert_eq!(joined, "b joined group g on t: partitions [1, 3]");
    let (line, _) = first.next_line("stderr");
    assert_eq!(line, "partitions now [0, 2]");
    drop(second);
    broker(&server, &["leave", "t", "-g", "g", "-m", "b"]).ok();
    let (line, _) = first.next_line("stderr");
    assert_eq!(line, "partitions now [0, 1, 2, 3]");
}

#[test]
fn bench_ack_consumes_every_record_exactly_once_in_order() {
    let server = ServerProcess::start(&[]);
    let run = broker(
        &server,
        &[
            "bench",
            "ack",
            "--records",
            "2000",
            "--producers",
            "2",
            "--consumers",
            "2",
            "--json",
        ],
    );
    let report: Value = serde_json::from_str(run.ok()).expect("bench --json prints JSON");
    assert_eq!(report["check_passed"], true, "{report:#}");
    assert_eq!(report["published"], 2000, "{report:#}");
    let group = &report["groups"][0];
    assert_eq!(group["consumed"], 2000, "{report:#}");
    assert_eq!(group["duplicates"], 0);
    assert_eq!(group["missing"], 0);
    assert_eq!(group["out_of_order"], 0);
    // The load generator's own CPU time over the run, user and system (Linux's /proc).
    for field in ["cpu_user_s", "cpu_system_s"] {
        let seconds = report[field].as_f64();
        assert!(seconds.is_some_and(|s| s >= 0.0), "{field}: {report:#}");
    }
}

#[test]
fn bench_through_the_producer_and_consumer_handles_consumes_every_record_exactly_once() {
    let server = ServerProcess::start(&[]);
    // The last run's producer tasks share one Producer.
    let runs = [
        ("ack", None),
        ("fetch", None),
        ("mixed", None),
        ("ack", Some("--shared-producer")),
    ];
    for (workload, shared) in runs {
        let mut args = vec![
            "bench",
            workload,
            "--handles",
            "--records",
            "3000",
            "--producers",
            "2",
            "--consumers",
            "2",
            "--json",
        ];
        args.extend(shared);
        let run = broker(&server, &args);
        let report: Value = serde_json::from_str(run.ok()).expect("bench --json prints JSON");
        assert_eq!(report["check_passed"], true, "{report:#}");
        assert_eq!(report["published"], 3000, "{report:#}");
        let through = match shared {
            Some(_) => "shared-producer",
            None => "producers",
        };
        assert_eq!(report["published_through"], through, "{report:#}");
        // Every record once, but for those a rebalance handed out again (a fetch-mode group
        // commits every few milliseconds: records fetched and not committed yet when its second
        // consumer joins come again, as at-least-once allows), which the bench counts apart.
        for group in report["groups"].as_array().unwrap() {
            let consumed = group["consumed"].as_u64().unwrap();
            let redelivered = group["redelivered"].as_u64().unwrap();
            assert_eq!(consumed - redelivered, 3000, "{report:#}");
            assert_eq!(group["missing"], 0, "{report:#}");
            assert_eq!(group["duplicates"], 0, "{report:#}");
        }
    }
    // Publishing alone into limits retention: every send is stored, none refused.
    let run = broker(
        &server,
        &[
            "bench",
            "publish",
            "--handles",
            "--records",
            "5000",
            "--retention",
            "limits",
            "--json",
        ],
    );
    let report: Value = serde_json::from_str(run.ok()).expect("bench --json prints JSON");
    assert_eq!(report["published"], 5000, "{report:#}");
    assert_eq!(report["publish_refused_full"], 0, "{report:#}");
    assert_eq!(report["retention"], "limits", "{report:#}");
    let refused = broker(&server, &["bench", "publish", "--handles", "--wire"]);
    assert_eq!(refused.code, Some(2), "{}", refused.stderr);
    let refused = broker(&server, &["bench", "publish", "--shared-producer"]);
    assert_eq!(refused.code, Some(2), "{}", refused.stderr);
    assert!(refused.stderr.contains("--handles"), "{}", refused.stderr);
    // --wire measures one server: a cluster's list of nodes is refused, saying so.
    let list = format!("{},{}", server.addr_string(), server.addr_string());
    let refused = broker_alone(&["bench", "publish", "--wire", "--addr", &list]);
    assert_eq!(refused.code, Some(1), "{}", refused.stderr);
    assert!(
        refused.stderr.contains("--wire talks to one server"),
        "{}",
        refused.stderr
    );
}

#[test]
fn bench_fetch_with_batches_on_one_thread_consumes_every_record_and_counts_its_requests() {
    let server = ServerProcess::start(&[]);
    let run = broker(
        &server,
        &[
            "bench",
            "fetch",
            "--records",
            "5000",
            "--publish-batch",
            "100",
            "--batch",
            "1000",
            "--consumers",
            "2",
            "--threads",
            "1",
            "--json",
        ],
    );
    let report: Value = serde_json::from_str(run.ok()).expect("bench --json prints JSON");
    assert_eq!(report["check_passed"], true, "{report:#}");
    assert_eq!(report["published_through"], "calls", "{report:#}");
    assert_eq!(report["publish_batch"], 100, "{report:#}");
    assert_eq!(report["retention"], "interest", "{report:#}");
    let group = &report["groups"][0];
    // Every record, and again those a consumer fetched without committing before the other
    // consumer's join moved its partition (fetch and commit delivers at least once).
    let redelivered = group["redelivered"].as_u64().unwrap();
    assert_eq!(group["consumed"], 5000 + redelivered, "{report:#}");
    assert_eq!(group["missing"], 0, "{report:#}");
    let requests = group["consume_requests"].as_u64().unwrap();
    assert!((5..=5000).contains(&requests), "{report:#}");
    // A batch is one publish request: 50 of 100 records, more only for retries of full ones.
    let publishes = report["publish_requests"].as_u64().unwrap();
    assert!((50..1000).contains(&publishes), "{report:#}");
}

#[test]
fn bench_publish_over_raw_frames_answers_every_request_and_refuses_other_workloads() {
    let server = ServerProcess::start(&["--capacity", "10"]);
    let run = broker(
        &server,
        &[
            "bench",
            "publish",
            "--wire",
            "--records",
            "3000",
            "--producers",
            "2",
            "--depth",
            "16",
            "--partitions",
            "4",
            "--json",
        ],
    );
    let report: Value = serde_json::from_str(run.ok()).expect("bench --json prints JSON");
    // 4 partitions of capacity 10 hold 40 records; every other publish is answered -1.
    assert_eq!(report["published"], 40, "{report:#}");
    assert_eq!(report["publish_refused_full"], 2960, "{report:#}");
    assert_eq!(report["published_through"], "wire", "{report:#}");
    // Contradicting or too-small arguments are bad arguments: exit 2, nothing run.
    for args in [
        &["bench", "ack", "--wire"][..],
        &["bench", "publish", "--wire", "--publish-batch", "64"],
        &["bench", "publish", "--depth", "0"],
        &["bench", "publish", "--size", "10"],
        &["bench", "publish", "--threads", "0"],
    ] {
        let refused = broker(&server, args);
        assert_eq!(refused.code, Some(2), "{args:?}: {refused:#?}");
        assert!(
            refused.stderr.starts_with("error: "),
            "{args:?}: {refused:#?}"
        );
    }
}

#[test]
fn create_sets_retention_and_adds_partitions_only_when_asked() {
    let server = ServerProcess::start(&[]);
    let run = broker(
        &server,
        &[
            "create",
            "clicks",
            "-p",
            "2",
            "--retention",
            "limits",
            "--max-records",
            "3",
            "--max-bytes",
            "1KiB",
            "--max-age",
            "1h",
        ],
    );
    assert_eq!(
        run.ok(),
        "created topic clicks with 2 partitions: limits retention, max 3 records, max 1024 \
         bytes, max age 1h\n"
    );
    let described = describe_json(&server, "clicks");
    assert_eq!(
        described["topics"][0]["settings"],
        json!([{"retention": "limits"}, {"max-records": 3}, {"max-bytes": 1024}, {"max-age-ms": 3_600_000}])
    );
    // Limits retention keeps the newest 3 records of a partition, consumed or not.
    broker_with_input(
        &server,
        &["publish", "clicks", "--partition", "0"],
        "a\nb\nc\nd\ne\n",
    )
    .ok();
    let partition = &describe_json(&server, "clicks")["topics"][0]["partitions"][0];
    assert_eq!(
        (&partition["earliest_offset"], &partition["end_offset"]),
        (&Value::from(2), &Value::from(5))
    );
    // Interest retention cannot discard old records: refused with the reason.
    let refused = broker(&server, &["create", "bad", "--discard", "old"]);
    assert!(
        refused.one_error_line().contains("limits retention"),
        "{refused:#?}"
    );
    // Other settings or another key hash for an existing topic change nothing, and fail
    // saying what the topic has.
    let other = broker(
        &server,
        &["create", "clicks", "-p", "2", "--max-records", "9"],
    );
    assert_eq!(
        other.one_error_line(),
        "error: topic clicks already exists with limits retention, max 3 records, max 1024 bytes, \
         max age 1h, not max 9 \
         records: create changes no setting of an existing topic (`broker configure` changes \
         its limits and --discard; its retention and key hash never change)"
    );
    let other = broker(&server, &["create", "clicks", "--key-hash", "fnv1a"]);
    assert!(
        other
            .one_error_line()
            .contains("already exists with key hash murmur2, not key hash fnv1a"),
        "{other:#?}"
    );
    // A larger --partitions fails without --add-partitions, and grows with it.
    let larger = broker(&server, &["create", "clicks", "-p", "4"]);
    assert!(
        larger.one_error_line().contains("add --add-partitions"),
        "{larger:#?}"
    );
    assert_eq!(end_offsets(&server, "clicks").len(), 2);
    let grown = broker(
        &server,
        &["create", "clicks", "-p", "4", "--add-partitions"],
    );
    assert_eq!(grown.ok(), "topic clicks now has 4 partitions (it had 2)\n");
    assert!(
        grown.stderr.contains("keys now map to other partitions"),
        "{grown:#?}"
    );
    assert_eq!(end_offsets(&server, "clicks"), [5, 0, 0, 0]);
    let fewer = broker(
        &server,
        &["create", "clicks", "-p", "3", "--add-partitions"],
    );
    assert!(
        fewer.one_error_line().contains("never removed"),
        "{fewer:#?}"
    );
    // The server's partition limit (64 by default) bounds a new topic and a grown one alike.
    broker(
        &server,
        &["create", "clicks", "-p", "65", "--add-partitions"],
    )
    .one_error_line();
}

#[test]
fn delete_removes_a_topic_and_purge_removes_records_below_an_offset() {
    let server = ServerProcess::start(&[]);
    broker(&server, &["create", "t", "-p", "2"]).ok();
    broker_with_input(
        &server,
        &["publish", "t", "--partition", "0"],
        "1\n2\n3\n4\n",
    )
    .ok();
    broker_with_input(&server, &["publish", "t", "--partition", "1"], "x\n").ok();
    let purged = broker(
        &server,
        &["purge", "t", "--partition", "0", "--before", "3"],
    );
    assert_eq!(purged.ok(), "t partition 0: earliest offset now 3\n");
    let json: Value =
        serde_json::from_str(broker(&server, &["purge", "t", "--before", "10", "--json"]).ok())
            .unwrap();
    assert_eq!(
        json,
        json!([
            {"partition": 0, "earliest_offset": 4},
            {"partition": 1, "earliest_offset": 1},
        ])
    );
    assert_eq!(broker(&server, &["delete", "t"]).ok(), "deleted topic t\n");
    assert_eq!(
        broker(&server, &["delete", "t"]).ok(),
        "topic t does not exist (nothing changed)\n"
    );
    assert!(broker(&server, &["describe", "t"])
        .one_error_line()
        .contains("unknown topic"));
}

#[test]
fn group_reset_replays_and_skips_and_group_delete_frees_the_records() {
    let server = ServerProcess::start(&[]);
    broker(&server, &["create", "t"]).ok();
    // A second group that consumes nothing keeps every record (interest retention), so g can
    // go back over them.
    broker(&server, &["join", "t", "-g", "keeper", "-m", "k"]).ok();
    broker(&server, &["leave", "t", "-g", "keeper", "-m", "k"]).ok();
    broker_with_input(&server, &["publish", "t"], "a\nb\nc\nd\n").ok();
    let consumed = broker(
        &server,
        &[
            "consume", "t", "-g", "g", "-m", "m", "--mode", "fetch", "--stay",
        ],
    );
    assert_eq!(consumed.lines().len(), 4, "{consumed:#?}");
    // Nothing left: lag 0.
    let lag: Value =
        serde_json::from_str(broker(&server, &["lag", "t", "-g", "g", "--json"]).ok()).unwrap();
    assert_eq!(lag[0]["lag"], 0);
    // Back two records.
    let reset = broker(
        &server,
        &["group", "reset", "t", "-g", "g", "--shift-by", "-2"],
    );
    assert!(reset.ok().contains("total lag 2"), "{reset:#?}");
    let again = broker(
        &server,
        &[
            "consume", "t", "-g", "g", "-m", "m", "--mode", "fetch", "--stay",
        ],
    );
    assert_eq!(again.lines(), ["[0@2] c", "[0@3] d"]);
    // To the start, as JSON.
    let json: Value = serde_json::from_str(
        broker(
            &server,
            &["group", "reset", "t", "-g", "g", "--to-earliest", "--json"],
        )
        .ok(),
    )
    .unwrap();
    assert_eq!(json[0]["committed"], 0);
    // Exactly one target.
    let both = broker(
        &server,
        &[
            "group",
            "reset",
            "t",
            "-g",
            "g",
            "--to-earliest",
            "--to-latest",
        ],
    );
    assert_eq!(both.code, Some(2), "{both:#?}");
    // g consumes everything again; the keeper still holds every record until it is deleted.
    let records = |server: &ServerProcess| {
        describe_json(server, "t")["topics"][0]["partitions"][0]["records"].clone()
    };
    broker(
        &server,
        &[
            "consume", "t", "-g", "g", "-m", "m", "--mode", "fetch", "--stay",
        ],
    )
    .ok();
    assert_eq!(records(&server), 4);
    broker(&server, &["group", "delete", "t", "-g", "keeper"]).ok();
    assert_eq!(records(&server), 0);
    // A group with a member cannot be deleted; once it left, it can.
    assert!(broker(&server, &["group", "delete", "t", "-g", "g"])
        .one_error_line()
        .contains("still has members (m)"));
    broker(&server, &["leave", "t", "-g", "g", "-m", "m"]).ok();
    assert_eq!(
        broker(&server, &["group", "delete", "t", "-g", "g"]).ok(),
        "deleted group g of t\n"
    );
    assert!(
        broker(&server, &["group", "reset", "t", "-g", "g", "--to-latest"])
            .one_error_line()
            .contains("group \"g\" does not exist on topic \"t\"")
    );
}

#[test]
fn consume_can_start_at_the_end_replay_from_the_beginning_and_show_headers_and_times() {
    let server = ServerProcess::start(&[]);
    broker(&server, &["create", "t"]).ok();
    // A group that keeps the record: a group that starts at the end has consumed it, and it
    // would leave with no other group.
    broker(&server, &["join", "t", "-g", "keeper", "-m", "k"]).ok();
    broker(
        &server,
        &[
            "publish",
            "t",
            "old",
            "--header",
            "trace=t-1",
            "--header",
            "flag",
        ],
    )
    .ok();
    // A group that starts at the end sees nothing already there.
    let latest = broker(
        &server,
        &[
            "consume",
            "t",
            "-g",
            "new",
            "-m",
            "m",
            "--start-at",
            "latest",
        ],
    );
    assert_eq!(latest.ok(), "");
    // Replaying from the beginning shows the record, with its headers and time in JSON.
    let replay = broker(
        &server,
        &[
            "consume",
            "t",
            "-g",
            "new",
            "-m",
            "m",
            "--from-beginning",
            "--json",
        ],
    );
    let record: Value = serde_json::from_str(replay.lines()[0]).unwrap();
    assert_eq!(record["payload"], "old");
    assert_eq!(
        record["headers"],
        json!([{"name": "trace", "value": "t-1"}, {"name": "flag", "value": null}])
    );
    assert_eq!(record["delivery_count"], 1);
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    let time = record["timestamp_ms"].as_i64().unwrap();
    assert!(time <= now_ms && time > now_ms - 60_000, "{record}");
    // Offsets by time: now is past every record, an hour ago before all of them.
    let offsets: Value =
        serde_json::from_str(broker(&server, &["offsets", "t", "--ago", "1h", "--json"]).ok())
            .unwrap();
    assert_eq!(offsets[0]["offset"], 0);
    let future: Value = serde_json::from_str(
        broker(
            &server,
            &["offsets", "t", "--at", "2999-01-01T00:00:00Z", "--json"],
        )
        .ok(),
    )
    .unwrap();
    assert_eq!(future[0]["offset"], 1);
    // Bad arguments exit 2, before anything is sent.
    let nameless = broker(&server, &["publish", "t", "x", "--header", "=v"]);
    assert_eq!(nameless.code, Some(2), "{nameless:#?}");
    assert!(nameless.stderr.contains("no name"), "{nameless:#?}");
    let whenless = broker(&server, &["offsets", "t"]);
    assert_eq!(whenless.code, Some(2), "{whenless:#?}");
    // A time with a zone offset is that instant.
    let zoned: Value = serde_json::from_str(
        broker(
            &server,
            &[
                "offsets",
                "t",
                "--at",
                "2999-01-01T01:00:00+01:00",
                "--json",
            ],
        )
        .ok(),
    )
    .unwrap();
    assert_eq!(zoned[0]["offset"], 1);
}

#[test]
fn bench_deletes_its_topic_unless_told_to_keep_it() {
    let server = ServerProcess::start(&[]);
    let args = [
        "bench",
        "ack",
        "--records",
        "200",
        "--partitions",
        "2",
        "--json",
    ];
    let topics = || -> Value {
        serde_json::from_str::<Value>(broker(&server, &["describe", "--json"]).ok()).unwrap()
            ["topics"]
            .clone()
    };
    broker(&server, &args).ok();
    assert_eq!(topics(), json!([]));
    let kept = [&args[..], &["--keep-topic"]].concat();
    broker(&server, &kept).ok();
    assert_eq!(topics().as_array().unwrap().len(), 1);
}

/// A reader that goes away (`broker ... | head`) ends the command quietly with success, without
/// a panic message.
#[test]
fn a_closed_standard_output_ends_the_command_quietly() {
    let mut child = broker_command()
        .args(["bench", "ping", "--records", "5000"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start broker");
    // Close the reading end before the report is written.
    drop(child.stdout.take());
    let output = child.wait_with_output().expect("wait for broker");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{output:?}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn pointed_at_another_port_of_the_server_it_says_first_what_answers_there() {
    let server = ServerProcess::start(&[
        "--kafka-listen",
        "127.0.0.1:0",
        "--metrics-listen",
        "127.0.0.1:0",
    ]);
    let kafka = server.kafka_addr.unwrap().to_string();
    let run = broker_alone(&["--addr", &kafka, "describe"]);
    let said = format!(
        "error: cannot talk to broker-server at {kafka}: this port does not speak the broker's \
         protocol: it answers as a Kafka listener does"
    );
    assert!(run.one_error_line().starts_with(&said), "{run:#?}");
    let metrics = server.metrics_addr.unwrap().to_string();
    let run = broker_alone(&["--addr", &metrics, "describe"]);
    let said = format!(
        "error: cannot talk to broker-server at {metrics}: the server answered in HTTP: is this \
         a broker's metrics endpoint (--metrics-listen)"
    );
    assert!(run.one_error_line().starts_with(&said), "{run:#?}");
}

#[test]
fn connection_options_go_before_or_after_the_command_and_only_where_they_are_used() {
    let server = ServerProcess::start(&[]);
    let addr = server.addr_string();
    broker(&server, &["create", "t"]).ok();
    // After the command as well as before it; the one nearer the command wins.
    broker_alone(&["describe", "t", "--addr", &addr]).ok();
    broker_alone(&["--addr", "127.0.0.1:1", "describe", "t", "--addr", &addr]).ok();
    let help = broker_alone(&["lag", "--help"]);
    assert!(help.ok().contains("Connection options:"), "{help:#?}");
    // `broker size` talks to nobody: connection options are bad arguments there.
    let run = broker_alone(&["size", "--rate", "1000/s", "--addr", &addr]);
    assert_eq!(run.code, Some(2), "{run:#?}");
    assert!(!broker_alone(&["size", "--help"]).ok().contains("--addr"));
    // A bad bench setting names the bench command in its usage line.
    let run = broker(&server, &["bench", "--size", "10"]);
    assert_eq!(run.code, Some(2), "{run:#?}");
    assert!(run.stderr.contains("Usage: broker bench"), "{run:#?}");
}

#[test]
fn ping_answers_with_the_server_version_and_its_limits() {
    let server = ServerProcess::start(&["--max-payload-bytes", "1000"]);
    let run = broker(&server, &["ping"]);
    let line = run.ok();
    assert!(line.starts_with("broker-server/"), "{run:#?}");
    assert!(line.contains(&server.addr_string()), "{run:#?}");
    assert!(line.contains("payloads up to 1000 bytes"), "{run:#?}");
    let run = broker(&server, &["ping", "--json"]);
    let json: Value = serde_json::from_str(run.ok()).unwrap();
    assert_eq!(json["addr"], json!(server.addr_string()), "{json:#}");
    assert_eq!(json["answered_by"], json!(server.addr_string()), "{json:#}");
    assert_eq!(json["limits"]["max_payload_bytes"], json!(1000), "{json:#}");
    assert!(json["elapsed_ms"].as_f64().unwrap() >= 0.0, "{json:#}");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let run = broker_alone(&["ping", "--addr", &format!("127.0.0.1:{port}")]);
    assert!(run.one_error_line().contains("cannot reach"), "{run:#?}");
    let run = broker_alone(&["ping", "--json", "--addr", &format!("127.0.0.1:{port}")]);
    assert_eq!(run.code, Some(1), "{run:#?}");
    let json: Value = serde_json::from_str(&run.stdout).unwrap();
    assert!(
        json["error"].as_str().unwrap().contains("cannot reach"),
        "{json:#}"
    );
}

#[test]
fn top_shows_topics_groups_and_with_metrics_the_connections() {
    let server = ServerProcess::start(&["--metrics-listen", "127.0.0.1:0"]);
    let metrics = server.metrics_addr.unwrap().to_string();
    broker(&server, &["create", "t", "--partitions", "2"]).ok();
    broker(&server, &["join", "t", "-g", "g", "-m", "a"]).ok();
    broker_with_input(&server, &["publish", "t"], "1\n2\n3\n").ok();
    let run = broker(
        &server,
        &[
            "top",
            "--json",
            "--interval",
            "100ms",
            "--metrics",
            &metrics,
        ],
    );
    let view: Value = serde_json::from_str(run.ok()).unwrap();
    assert_eq!(view["topics"][0]["topic"], json!("t"), "{view:#}");
    assert_eq!(view["topics"][0]["records"], json!(3), "{view:#}");
    assert_eq!(view["groups"][0]["lag"], json!(3), "{view:#}");
    assert_eq!(view["groups"][0]["members"], json!(1), "{view:#}");
    // Its own connection, at least.
    assert!(
        view["server"]["connections"].as_u64().unwrap() >= 1,
        "{view:#}"
    );
    // Without --metrics, no server line; --count bounds the views.
    let run = broker(&server, &["top", "--count", "2", "--interval", "100ms"]);
    let text = run.ok();
    assert_eq!(text.matches("PUBLISHED").count(), 2, "{text}");
    assert!(text.contains("--metrics-listen"), "{text}");
    for args in [
        &["top", "--interval", "0s"][..],
        &["top", "--json", "--count", "2"],
    ] {
        let run = broker(&server, args);
        assert_eq!(run.code, Some(2), "{args:?}: {run:#?}");
    }
    // Connection options before a command that talks to no server are refused too.
    let addr = server.addr_string();
    let run = broker_alone(&[
        "--addr",
        &addr,
        "size",
        "--message-bytes",
        "1",
        "--rate",
        "1",
        "--retention",
        "1d",
    ]);
    assert_eq!(run.code, Some(2), "{run:#?}");
    assert!(run.stderr.contains("talks to no server"), "{run:#?}");
}

#[test]
fn consume_can_create_a_group_with_a_dead_letter_topic_and_describe_shows_it() {
    let server = ServerProcess::start(&[]);
    broker(&server, &["create", "jobs"]).ok();
    let consume = |settings: &[&str]| {
        let args = [&["consume", "jobs", "-g", "g", "-m", "m"][..], settings].concat();
        broker(&server, &args)
    };
    let run = consume(&["--max-deliveries", "3"]);
    assert_eq!(run.code, Some(2), "{run:#?}");
    let run = consume(&["--max-deliveries", "3", "--dead-letter", "jobs"]);
    assert!(run.one_error_line().contains("dead-letter"), "{run:#?}");
    consume(&["--max-deliveries", "3", "--dead-letter", "jobs-dlq"]).ok();
    let text = broker(&server, &["describe", "jobs"]);
    assert!(
        text.ok()
            .contains("at most 3 deliveries, then to dead-letter topic jobs-dlq"),
        "{text:#?}"
    );
    let json = describe_json(&server, "jobs");
    assert_eq!(
        json["topics"][0]["groups"][0]["settings"],
        json!([{"max-deliveries": 3}, {"dead-letter": "jobs-dlq"}]),
        "{json:#}"
    );
    // Settings change later: those named, the others as they were.
    let configure = |change: &[&str]| {
        let args = [&["group", "configure", "jobs", "-g", "g"][..], change].concat();
        broker(&server, &args)
    };
    assert_eq!(
        configure(&["--ack-timeout", "5s"]).ok(),
        "group g on jobs: ack timeout 5s; at most 3 deliveries, then to dead-letter topic \
         jobs-dlq\n"
    );
    // One of the pair alone changes it when the group has a dead-letter topic.
    let run = configure(&["--max-deliveries", "1"]);
    assert!(run.ok().contains("at most 1 delivery, then"), "{run:#?}");
    // Nothing to change is a bad command line.
    assert_eq!(configure(&[]).code, Some(2));
    let run = configure(&["--no-dead-letter", "--json"]);
    assert_eq!(run.ok().trim(), r#"[{"ack-timeout-ms":5000}]"#);
    let run = configure(&["--max-deliveries", "2"]);
    assert!(run.one_error_line().contains("together"), "{run:#?}");
    let run = broker(
        &server,
        &[
            "group",
            "configure",
            "jobs",
            "-g",
            "nosuch",
            "--no-ack-timeout",
        ],
    );
    assert_eq!(
        run.one_error_line(),
        "error: group nosuch does not exist on topic jobs (its groups: g)"
    );
    // --retry-after retries instead of acknowledging: two deliveries, then the dead letter.
    broker(&server, &["create", "work"]).ok();
    broker(&server, &["publish", "work", "poison"]).ok();
    let run = broker(
        &server,
        &[
            "consume",
            "work",
            "-g",
            "w",
            "-m",
            "w1",
            "--max-deliveries",
            "2",
            "--dead-letter",
            "work-dlq",
            "--retry-after",
            "0s",
            "--count",
            "2",
        ],
    );
    assert_eq!(run.ok(), "[0@0] poison\n[0@0] poison\n", "{run:#?}");
    let run = broker(&server, &["consume", "work-dlq", "-g", "audit", "-m", "a"]);
    assert_eq!(run.ok(), "[0@0] poison\n", "{run:#?}");
    // --count takes no record it does not print: over three partitions, the fourth record
    // printed is the first one's second delivery, and the others, delivered once, stay.
    broker(&server, &["create", "jobs3", "--partitions", "3"]).ok();
    broker(&server, &["publish", "jobs3", "a", "b", "c"]).ok();
    let retried = [
        "consume",
        "jobs3",
        "-g",
        "w",
        "-m",
        "w1",
        "--max-deliveries",
        "2",
        "--dead-letter",
        "jobs3-dlq",
        "--retry-after",
        "0s",
        "--count",
        "4",
    ];
    let run = broker(&server, &retried);
    assert_eq!(run.ok(), "[0@0] a\n[1@0] b\n[2@0] c\n[0@0] a\n", "{run:#?}");
    let run = broker(&server, &["consume", "jobs3-dlq", "-g", "audit", "-m", "a"]);
    assert_eq!(run.ok(), "[0@0] a\n", "{run:#?}");
    let run = broker(
        &server,
        &[
            "consume",
            "work",
            "-g",
            "w",
            "-m",
            "w1",
            "--retry-after",
            "1s",
        ],
    );
    assert_eq!(run.code, Some(2), "{run:#?}");
    assert!(
        run.stderr
            .starts_with("error: --retry-after needs --count or --follow"),
        "{run:#?}"
    );
}

#[test]
fn a_cluster_node_whose_name_does_not_resolve_is_left_out_with_a_warning() {
    let server = ServerProcess::start(&[]);
    let mut command = broker_command();
    // `.invalid` never resolves (RFC 2606).
    let addresses = format!("no-such-node.invalid:9092,{}", server.addr_string());
    command.args(["--addr", &addresses, "ping"]);
    let run = run_command(command, "");
    assert_eq!(run.code, Some(0), "{run:#?}");
    assert!(
        run.stderr
            .contains("leaving out cluster node no-such-node.invalid:9092"),
        "{run:#?}"
    );
}

#[test]
fn configure_changes_the_limits_it_names_and_a_lowered_limit_holds_at_once() {
    let server = ServerProcess::start(&[]);
    broker(
        &server,
        &[
            "create",
            "clicks",
            "--retention",
            "limits",
            "--max-age",
            "1h",
        ],
    )
    .ok();
    broker_with_input(
        &server,
        &["publish", "clicks", "--partition", "0"],
        "a\nb\nc\nd\ne\n",
    )
    .ok();
    // The settings named change, the others stay; the oldest records leave at once.
    let run = broker(&server, &["configure", "clicks", "--max-records", "2"]);
    assert_eq!(
        run.ok(),
        "topic clicks: limits retention, max 2 records, max age 1h\n"
    );
    let partition = &describe_json(&server, "clicks")["topics"][0]["partitions"][0];
    assert_eq!(
        (&partition["earliest_offset"], &partition["end_offset"]),
        (&Value::from(3), &Value::from(5))
    );
    let run = broker(
        &server,
        &[
            "configure",
            "clicks",
            "--max-bytes",
            "1KiB",
            "--discard",
            "new",
            "--json",
        ],
    );
    assert_eq!(
        serde_json::from_str::<Value>(run.ok()).unwrap(),
        json!({"topic": "clicks", "settings": [
            {"retention": "limits"}, {"max-records": 2}, {"max-bytes": 1024},
            {"max-age-ms": 3_600_000}, {"discard": "new"}
        ]})
    );
    // Interest retention cannot discard old records; an unknown topic and no setting at all are
    // refused, each saying why.
    broker(&server, &["create", "orders"]).ok();
    let refused = broker(&server, &["configure", "orders", "--discard", "old"]);
    assert!(
        refused.one_error_line().contains("limits retention"),
        "{refused:#?}"
    );
    let refused = broker(&server, &["configure", "nosuch", "--max-records", "2"]);
    assert!(
        refused.one_error_line().contains("unknown topic"),
        "{refused:#?}"
    );
    let refused = broker(&server, &["configure", "clicks"]);
    assert_eq!(refused.code, Some(2), "{refused:#?}");
    assert!(
        refused
            .stderr
            .starts_with("error: name a setting to change"),
        "{refused:#?}"
    );
    // --help says what can change and what cannot.
    let help = broker_alone(&["configure", "--help"]);
    assert!(
        help.ok().contains("What cannot change: the retention"),
        "{help:#?}"
    );
}

#[test]
fn producers_lists_each_partitions_idempotent_producers_in_a_table_and_json() {
    let server = ServerProcess::start(&[]);
    broker(&server, &["create", "t", "--partitions", "2"]).ok();
    let none = broker(&server, &["producers", "t"]);
    assert!(
        none.ok().starts_with("t: no idempotent producers"),
        "{none:#?}"
    );
    // Two producers: 7 stores three records on partition 0 and one on partition 1, 9 two on 1.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let client = broker_client::Client::connect(server.addr).await.unwrap();
        let batch = |partition: i32, sequence: u64, count: usize| broker_client::PartitionBatch {
            partition,
            sequence,
            records: (0..count)
                .map(|_| broker_client::PublishRecord::to_partition(partition, "x"))
                .collect(),
        };
        client
            .publish_idempotent("t", 7, vec![batch(0, 0, 3), batch(1, 0, 1)])
            .await
            .unwrap();
        client
            .publish_idempotent("t", 9, vec![batch(1, 0, 2)])
            .await
            .unwrap();
    });
    let run = broker(&server, &["producers", "t"]);
    let text = run.ok();
    assert!(text.starts_with("t: idempotent producers\n"), "{text}");
    let rows: Vec<Vec<&str>> = text
        .lines()
        .skip(1)
        .map(|line| line.split_whitespace().collect())
        .collect();
    assert_eq!(
        rows.iter().map(|row| row[..4].to_vec()).collect::<Vec<_>>(),
        vec![
            vec!["PARTITION", "PRODUCER", "NEXT", "SEQUENCE"],
            vec!["0", "7", "3", "2"],
            vec!["1", "7", "1", "0"],
            vec!["1", "9", "2", "2"],
        ],
        "{text}"
    );
    let json: Value =
        serde_json::from_str(broker(&server, &["producers", "t", "-p", "1", "--json"]).ok())
            .unwrap();
    let rows = json.as_array().unwrap();
    assert_eq!(rows.len(), 2, "{json}");
    assert_eq!(rows[1]["producer"], 9);
    assert_eq!(rows[1]["next_sequence"], 2);
    assert_eq!(rows[1]["last_offset"], 2);
    assert!(rows[1]["last_seen_ms"].as_i64().unwrap() > 0, "{json}");
    // A partition the topic does not have, and a topic that does not exist, are refusals.
    let missing = broker(&server, &["producers", "t", "-p", "2"]);
    assert!(
        missing.one_error_line().contains("partition"),
        "{missing:#?}"
    );
    let unknown = broker(&server, &["producers", "nothing"]);
    assert!(unknown.one_error_line().contains("nothing"), "{unknown:#?}");
}

#[test]
fn group_delete_of_some_partitions_deletes_only_the_groups_offsets_there() {
    let server = ServerProcess::start(&[]);
    broker(
        &server,
        &["create", "t", "--partitions", "2", "--retention", "limits"],
    )
    .ok();
    broker(&server, &["publish", "t", "a", "b", "--partition", "0"]).ok();
    broker(&server, &["publish", "t", "c", "d", "--partition", "1"]).ok();
    broker(
        &server,
        &[
            "consume", "t", "-g", "g", "-m", "m", "--mode", "fetch", "-n", "4",
        ],
    )
    .ok();
    let run = broker(&server, &["group", "delete", "t", "-g", "g", "-p", "1"]);
    let text = run.ok();
    assert!(
        text.starts_with("deleted the offsets of group g of t on partition 1\n"),
        "{text}"
    );
    let row = |words: &[&str]| {
        text.lines()
            .any(|line| line.split_whitespace().eq(words.iter().copied()))
    };
    assert!(row(&["1", "0", "2", "2"]), "{text}");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let stored = runtime.block_on(async {
        let client = broker_client::Client::connect(server.addr).await.unwrap();
        client.stored_offsets("t", "g").await.unwrap()
    });
    assert_eq!(stored, [Some(2), None]);
    // The group is still there, with its offset on partition 0.
    let lag: Value =
        serde_json::from_str(broker(&server, &["lag", "t", "-g", "g", "--json"]).ok()).unwrap();
    assert_eq!(lag[0]["committed"], 2);
    // A partition the topic does not have, and a group with members, are refusals.
    let missing = broker(&server, &["group", "delete", "t", "-g", "g", "-p", "7"]);
    assert!(
        missing.one_error_line().contains("partition"),
        "{missing:#?}"
    );
    broker(&server, &["join", "t", "-g", "g", "-m", "m2"]).ok();
    let busy = broker(&server, &["group", "delete", "t", "-g", "g", "-p", "0"]);
    assert!(busy.one_error_line().contains("members"), "{busy:#?}");
}

#[test]
fn a_publish_refused_at_once_says_why_first() {
    let server = ServerProcess::start(&[]);
    let run = broker(&server, &["publish", "nosuch", "hello"]);
    let line = run.one_error_line();
    assert!(
        line.starts_with(
            "error: invalid argument: unknown topic \"nosuch\" (the first record was refused"
        ),
        "{run:#?}"
    );
}
