//! What an operator sees of a running broker: its log lines (their events, their format, the
//! checks on the log filter) and its start-up errors, through the real binary.

#![allow(clippy::unwrap_used)]

use std::net::SocketAddr;
use std::process::Stdio;
use std::time::Duration;

use broker_client::Client;
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
