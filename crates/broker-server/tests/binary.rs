//! Runs the real `broker-server` binary: readiness line, one request, SIGTERM, exit 0.

#![allow(clippy::unwrap_used)]

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Command as Process, Stdio};

use broker_core::Outcome;
use broker_testkit::raw::{call, connect, create};

const BINARY: &str = env!("CARGO_BIN_EXE_broker-server");

#[tokio::test]
async fn the_binary_serves_and_exits_cleanly_on_sigterm() {
    let mut child = Process::new(BINARY)
        .args([
            "--listen",
            "127.0.0.1:0",
            "--capacity",
            "10",
            "--worker-threads",
            "1",
        ])
        .env_remove("RUST_LOG")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let line = tokio::task::spawn_blocking(move || {
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line).unwrap();
        line
    })
    .await
    .unwrap();
    let addr: SocketAddr = line
        .trim_end()
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
        .parse()
        .unwrap();
    assert_ne!(addr.port(), 0);

    let mut client = connect(addr).await;
    assert_eq!(
        call(&mut client, create("t", 1)).await,
        Ok(Outcome::Created(true))
    );

    let killed = Process::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let status = tokio::task::spawn_blocking(move || child.wait().unwrap())
        .await
        .unwrap();
    assert_eq!(status.code(), Some(0), "{status:?}");
}

#[test]
fn bad_flags_exit_with_code_2() {
    for args in [
        vec!["--capacity", "0"],
        vec!["--listen", "nonsense"],
        vec!["--max-in-flight", "0"],
        vec!["--worker-threads", "0"],
        vec!["--worker-threads", "5000"],
        vec!["--no-such-flag"],
    ] {
        let output = Process::new(BINARY)
            .args(&args)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert_eq!(output.status.code(), Some(2), "{args:?}: {output:?}");
        assert!(output.stdout.is_empty(), "{args:?}");
        assert!(!output.stderr.is_empty(), "{args:?}");
    }
}

#[test]
fn help_documents_every_flag_and_its_environment_variable() {
    let output = Process::new(BINARY).arg("--help").output().unwrap();
    assert!(output.status.success());
    let help = String::from_utf8(output.stdout).unwrap();
    for needle in [
        "--capacity",
        "BROKER_CAPACITY",
        "--listen",
        "BROKER_LISTEN",
        "--max-frame-bytes",
        "--max-payload-bytes",
        "--max-connections",
        "--max-in-flight",
        "--max-wait-ms",
        "--session-timeout-ms",
        "--leave-on-disconnect",
        "--log-level",
        "BROKER_LOG_LEVEL",
        "--worker-threads",
        "BROKER_WORKER_THREADS",
        "Examples:",
    ] {
        assert!(help.contains(needle), "--help lacks {needle}:\n{help}");
    }
}

#[tokio::test]
async fn the_binary_serves_when_nobody_reads_its_standard_output() {
    let mut child = KillOnDrop(
        Process::new(BINARY)
            .args(["--listen", "127.0.0.1:0", "--worker-threads", "1"])
            .env_remove("RUST_LOG")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    // The reader of its standard output is gone before it prints its address.
    drop(child.0.stdout.take());
    let stderr = child.0.stderr.take().unwrap();
    let read = tokio::task::spawn_blocking(move || {
        let mut lines = BufReader::new(stderr).lines().map_while(Result::ok);
        let started = lines
            .by_ref()
            .find(|line| line.contains("broker-server started"))
            .unwrap();
        let warned = lines.find(|line| line.contains("cannot print the listening addresses"));
        (started, warned)
    });
    // (Killed on the way out, the server closes its standard error and the reader ends.)
    let (started, warned) = tokio::time::timeout(std::time::Duration::from_secs(30), read)
        .await
        .expect("the server logs its start and the warning within 30 s")
        .unwrap();
    assert!(warned.is_some(), "no warning after {started:?}");
    let addr: SocketAddr = started
        .split_whitespace()
        .find_map(|field| field.strip_prefix("listen="))
        .unwrap_or_else(|| panic!("no address in {started:?}"))
        .parse()
        .unwrap();
    let mut client = connect(addr).await;
    assert_eq!(
        call(&mut client, create("t", 1)).await,
        Ok(Outcome::Created(true))
    );
}

/// A child process killed when the test ends, passed or not.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
