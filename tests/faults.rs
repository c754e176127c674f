//! Faults of the disk under the real `broker-server`: every write of the process made to fail
//! for a while (`prlimit --fsize`, the same as a full disk: writes fail with EFBIG, and the
//! server handles SIGXFSZ instead of dying), then allowed again. While writes fail the server
//! refuses changes; once they succeed it takes them again, whatever else failed meanwhile
//! (its own log lines on the same disk), session expiry catches up, and answers keep their
//! request order throughout.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use broker_client::{Client, Error, ErrorReply};
use broker_testkit::process::ServerProcess;
use broker_testkit::raw::{connect as raw, publish, recv, send};

/// How long a test waits for something that should happen quickly before it fails.
const PATIENCE: Duration = Duration::from_secs(30);

/// Sets the soft file-size limit of process `pid` (the hard limit stays unlimited, so it can be
/// raised again): `Some(1)` makes every write past the first byte of a file fail.
fn limit_file_size(pid: u32, bytes: Option<u64>) {
    let soft = bytes.map_or("unlimited".to_owned(), |bytes| bytes.to_string());
    let status = Command::new("prlimit")
        .args([
            "--pid",
            &pid.to_string(),
            &format!("--fsize={soft}:unlimited"),
        ])
        .status()
        .expect("run prlimit (util-linux)");
    assert!(status.success(), "prlimit failed");
}

fn start(dir: &Path, extra: &[&str], stderr: Stdio) -> ServerProcess {
    let mut args = vec!["--data-dir", dir.to_str().unwrap()];
    args.extend_from_slice(extra);
    ServerProcess::start_with(&args, &[], stderr)
}

async fn connect(server: &ServerProcess) -> Client {
    Client::builder()
        .request_timeout(Duration::from_secs(60))
        .connect(server.addr_string().as_str())
        .await
        .expect("connect to broker-server")
}

/// Waits until the server refuses changes because its log cannot be written. The probe, a
/// create of the existing topic `t`, changes nothing and so is answered at once when the log is
/// fine: it never waits for the disk.
async fn until_refused(client: &Client) {
    let deadline = Instant::now() + PATIENCE;
    loop {
        match client.create("t", 1).await {
            Err(Error::Server(ErrorReply::Storage(_))) => return,
            Ok(false) => {}
            other => panic!("unexpected {other:?}"),
        }
        assert!(
            Instant::now() < deadline,
            "the server never refused a change"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Publishes until the server accepts a change again.
async fn until_accepted(client: &Client) -> i64 {
    let deadline = Instant::now() + PATIENCE;
    loop {
        match client.publish("t", 0, "again").await {
            Ok(offset) => return offset,
            Err(Error::Server(ErrorReply::Storage(why))) => {
                assert!(
                    Instant::now() < deadline,
                    "changes still refused after writes were allowed again: {why}"
                );
            }
            Err(other) => panic!("unexpected {other:?}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The server's standard error is a file on the disk that fills up: reporting the failed log
/// write fails too. That must not stop the log writer: once space returns, changes are accepted
/// again.
#[tokio::test]
async fn a_failing_log_line_never_stops_the_log_writer() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let err = std::fs::File::create(dir.path().join("err.log")).unwrap();
    let server = start(&data, &[], Stdio::from(err));
    let client = connect(&server).await;
    client.create("t", 1).await.unwrap();
    assert_eq!(client.publish("t", 0, "before").await.unwrap(), 0);

    limit_file_size(server.pid(), Some(1));
    // Applied before the log noticed: answered once its entry is written. (On a connection of
    // its own: answers keep request order, so later ones on its connection would wait too.)
    let writer = connect(&server).await;
    let pending = tokio::spawn(async move { writer.publish("t", 0, "during").await });
    until_refused(&client).await;
    limit_file_size(server.pid(), None);

    assert_eq!(pending.await.unwrap().unwrap(), 1);
    assert!(until_accepted(&client).await > 1);
    // The log lines that could be written say what happened.
    let log = std::fs::read_to_string(dir.path().join("err.log")).unwrap();
    assert!(log.contains("accepting changes"), "{log}");
}

/// Session expiry while the log refuses writes: no member may stay in its group without a
/// session. Members whose leave could not be logged keep their sessions and are removed once
/// writes succeed again.
#[tokio::test]
async fn members_expiring_while_the_log_fails_are_removed_once_it_recovers() {
    const GROUPS: usize = 10;
    const MEMBERS: usize = 1_000;
    let dir = tempfile::tempdir().unwrap();
    let timeout_ms = 1_000;
    let server = start(
        dir.path(),
        &["--session-timeout-ms", &timeout_ms.to_string()],
        Stdio::null(),
    );
    let client = connect(&server).await;
    client.create("t", 4).await.unwrap();
    let joins = (0..GROUPS).flat_map(|group| {
        let client = client.clone();
        (0..MEMBERS).map(move |member| {
            let client = client.clone();
            async move {
                client
                    .join("t", &format!("g{group}"), &format!("m{member}"))
                    .await
            }
        })
    });
    for joined in futures::future::join_all(joins).await {
        joined.unwrap();
    }
    // Every write fails from now on; the members go silent and time out while the server
    // tries to remove them.
    limit_file_size(server.pid(), Some(1));
    let reader = connect(&server).await;
    let members = || async {
        let description = reader.describe().await.unwrap();
        description.topics[0]
            .groups
            .iter()
            .map(|group| group.members.len())
            .sum::<usize>()
    };
    // Wait until removal was attempted (some leaves went through, or the log refused them).
    let deadline = Instant::now() + PATIENCE;
    while members().await == GROUPS * MEMBERS {
        assert!(Instant::now() < deadline, "no member was ever removed");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_millis(3 * timeout_ms)).await;
    limit_file_size(server.pid(), None);
    let deadline = Instant::now() + PATIENCE;
    loop {
        let left = members().await;
        if left == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{left} members stayed in their groups after writes succeeded again"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Answers to non-waiting requests come back in request order, also while a change waits for
/// a log that cannot be written: a later read is answered after the change, not before it.
#[tokio::test]
async fn answers_keep_request_order_while_log_writes_fail() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path(), &[], Stdio::null());
    let client = connect(&server).await;
    client.create("t", 1).await.unwrap();
    let mut conn = raw(server.addr).await;
    limit_file_size(server.pid(), Some(1));
    send(&mut conn, 1, 0, publish("t", 0, "first")).await;
    // The publish is applied and waits for its entry; the log write fails meanwhile.
    until_refused(&client).await;
    let end_offset = broker_client::Command::EndOffset {
        topic: "t".into(),
        partition: 0,
    };
    send(&mut conn, 2, 0, end_offset).await;
    let early = tokio::time::timeout(Duration::from_millis(500), recv(&mut conn)).await;
    assert!(
        early.is_err(),
        "answered before the publish ahead of it: {early:?}"
    );
    limit_file_size(server.pid(), None);
    let first = recv(&mut conn).await;
    let second = recv(&mut conn).await;
    assert_eq!(
        (first.correlation_id, second.correlation_id),
        (1, 2),
        "{first:?} {second:?}"
    );
    assert_eq!(first.result, Ok(broker_client::Outcome::Published(0)));
}
