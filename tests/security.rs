//! Who may come in, against the real binaries: `broker-server` with an auth token (from the
//! environment or a file) and with TLS (`--tls-cert`/`--tls-key`, certificates made by rcgen at
//! test time), the `broker` CLI and the Rust client against it, the token never in the logs,
//! the start-up warning of an open server, and bad security settings refused at start-up.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use broker_client::{Client, Error, ErrorReply};
use broker_testkit::certs::TestPki;
use broker_testkit::{process::server_binary, process::ServerProcess};

const TOKEN: &str = "correct-horse-battery-staple";
const WRONG: &str = "incorrect-donkey-guess";

/// Every variable of the security settings, removed so the caller's environment cannot leak in.
const SECURITY_ENV: [&str; 7] = [
    "BROKER_AUTH_TOKEN",
    "BROKER_AUTH_TOKEN_FILE",
    "BROKER_TLS_CA",
    "BROKER_TLS_SERVER_NAME",
    "BROKER_TLS_CERT",
    "BROKER_TLS_KEY",
    "BROKER_ADDR",
];

/// Runs `broker` with `args` and `env` and waits for it.
fn broker(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_broker"));
    for name in SECURITY_ENV {
        command.env_remove(name);
    }
    command
        .args(args)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .output()
        .expect("run broker")
}

/// Runs `broker-server` with `args` and `env`, expecting it to refuse to start.
fn server_refuses(args: &[&str], env: &[(&str, &str)]) -> String {
    let mut command = Command::new(server_binary());
    for name in SECURITY_ENV {
        command.env_remove(name);
    }
    let output = command
        .args(["--listen", "127.0.0.1:0"])
        .args(args)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .output()
        .expect("run broker-server");
    assert_eq!(output.status.code(), Some(2), "{output:?}");
    String::from_utf8(output.stderr).unwrap()
}

fn stdout(output: &Output) -> String {
    assert_eq!(output.status.code(), Some(0), "{output:?}");
    String::from_utf8(output.stdout.clone()).unwrap()
}

/// Asserts `broker` failed with exit status 1 and one `error:` line, and returns the line.
fn one_error_line(output: &Output) -> String {
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    let stderr = String::from_utf8(output.stderr.clone()).unwrap();
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.starts_with("error: "), "{stderr}");
    stderr
}

#[tokio::test]
async fn the_token_is_required_refusals_are_logged_and_it_never_is() {
    let pki = TestPki::new(&["localhost"]);
    let log = pki.path("server.log");
    let mut server = ServerProcess::start_with(
        &[],
        &[("BROKER_AUTH_TOKEN", TOKEN)],
        Stdio::from(std::fs::File::create(&log).unwrap()),
    );
    let addr = server.addr_string();

    for builder in [Client::builder(), Client::builder().auth_token(WRONG)] {
        let refused = builder.connect(server.addr).await;
        assert!(
            matches!(refused, Err(Error::Refused(ErrorReply::Unauthenticated(_)))),
            "{refused:?}"
        );
    }
    let client = Client::builder()
        .auth_token(TOKEN)
        .connect(server.addr)
        .await
        .unwrap();
    assert!(client.create("guarded", 1).await.unwrap());

    // The CLI: refused without the token, in one line that says what to do; in with it.
    let refused = broker(&["--addr", &addr, "describe"], &[]);
    let line = one_error_line(&refused);
    assert!(line.contains("auth token"), "{line}");
    let refused = broker(
        &["--addr", &addr, "describe"],
        &[("BROKER_AUTH_TOKEN", WRONG)],
    );
    assert!(one_error_line(&refused).contains("wrong auth token"));
    let token_file = pki.path("token");
    std::fs::write(&token_file, format!("{TOKEN}\n")).unwrap();
    let token_file = token_file.to_str().unwrap();
    for (args, env) in [
        (
            vec!["--addr", &addr, "describe"],
            vec![("BROKER_AUTH_TOKEN", TOKEN)],
        ),
        (
            vec!["--addr", &addr, "--auth-token-file", token_file, "describe"],
            vec![],
        ),
        (
            vec!["--addr", &addr, "describe"],
            vec![("BROKER_AUTH_TOKEN_FILE", token_file)],
        ),
    ] {
        assert!(stdout(&broker(&args, &env)).contains("guarded"));
    }

    server.terminate(Duration::from_secs(10));
    let log = std::fs::read_to_string(&log).unwrap();
    assert!(log.contains("refusing connection"), "{log}");
    assert!(log.contains("unauthenticated"), "{log}");
    assert!(
        log.contains("127.0.0.1:"),
        "the peer address is logged: {log}"
    );
    assert!(!log.contains(TOKEN), "the token leaked into the log: {log}");
    assert!(
        !log.contains(WRONG),
        "a presented token leaked into the log: {log}"
    );
}

#[tokio::test]
async fn tls_with_a_token_end_to_end_through_the_cli_and_the_client() {
    let pki = TestPki::new(&["localhost"]);
    let token_file = pki.path("token");
    std::fs::write(&token_file, TOKEN).unwrap();
    let (cert, key, ca) = (
        pki.cert_file.to_str().unwrap(),
        pki.key_file.to_str().unwrap(),
        pki.ca_file.to_str().unwrap(),
    );
    let log = pki.path("server.log");
    let mut server = ServerProcess::start_with(
        &[
            "--tls-cert",
            cert,
            "--tls-key",
            key,
            "--auth-token-file",
            token_file.to_str().unwrap(),
        ],
        &[],
        Stdio::from(std::fs::File::create(&log).unwrap()),
    );
    // The certificate names localhost; so does the address here.
    let addr = format!("localhost:{}", server.addr.port());
    let secure = [("BROKER_AUTH_TOKEN", TOKEN)];

    let ok = |args: &[&str]| {
        let mut all = vec!["--addr", &addr, "--tls-ca", ca];
        all.extend_from_slice(args);
        stdout(&broker(&all, &secure))
    };
    ok(&["create", "orders", "--partitions", "2"]);
    ok(&["publish", "orders", "first", "second", "--key", "alice"]);
    let consumed = ok(&["consume", "orders", "--group", "billing", "--member", "b1"]);
    assert!(
        consumed.contains("first") && consumed.contains("second"),
        "{consumed}"
    );
    let bench = ok(&[
        "bench",
        "ack",
        "--producers",
        "2",
        "--consumers",
        "2",
        "--records",
        "200",
    ]);
    assert!(!bench.is_empty());
    // The name may also be given, with the IP address as the address.
    let by_ip = broker(
        &[
            "--addr",
            &server.addr_string(),
            "--tls-ca",
            ca,
            "--tls-server-name",
            "localhost",
            "describe",
        ],
        &secure,
    );
    assert!(stdout(&by_ip).contains("orders"));

    // Plain TCP, a wrong name, an unknown CA: one clear line each, exit status 1.
    let plain = one_error_line(&broker(&["--addr", &addr, "describe"], &secure));
    assert!(
        plain.contains("without TLS") && plain.contains("--tls-ca"),
        "{plain}"
    );
    assert!(!plain.contains("over TLS"), "{plain}");
    let wrong_name = one_error_line(&broker(
        &[
            "--addr",
            &addr,
            "--tls-ca",
            ca,
            "--tls-server-name",
            "broker.example",
            "describe",
        ],
        &secure,
    ));
    assert!(wrong_name.contains("not valid for"), "{wrong_name}");
    assert!(wrong_name.contains("TLS server name"), "{wrong_name}");
    let stranger = TestPki::new(&["localhost"]);
    let unknown_ca = one_error_line(&broker(
        &[
            "--addr",
            &addr,
            "--tls-ca",
            stranger.ca_file.to_str().unwrap(),
            "describe",
        ],
        &secure,
    ));
    assert!(
        unknown_ca
            .contains("not verifiably signed by a certificate authority in the trusted CA file"),
        "{unknown_ca}"
    );

    // The server kept serving through all that: the Rust client still gets in.
    let client = Client::builder()
        .tls_ca_file(&pki.ca_file)
        .auth_token(TOKEN)
        .connect(addr.as_str())
        .await
        .unwrap();
    assert_eq!(
        client.end_offset("orders", 0).await.unwrap()
            + client.end_offset("orders", 1).await.unwrap(),
        2
    );

    // Each failed handshake was logged with the peer and the cause.
    server.terminate(Duration::from_secs(10));
    let log = std::fs::read_to_string(&log).unwrap();
    let failures: Vec<&str> = log
        .lines()
        .filter(|line| line.contains("TLS handshake failed"))
        .collect();
    assert_eq!(failures.len(), 3, "{log}");
    for line in failures {
        assert!(
            line.contains("peer=127.0.0.1:") && line.contains("cause="),
            "{line}"
        );
    }
    assert!(!log.contains(TOKEN), "the token leaked into the log: {log}");
}

#[test]
fn a_server_presenting_its_certificate_authority_as_its_certificate_is_explained() {
    // What `openssl req -x509` makes by default: a self-signed certificate with CA:TRUE,
    // given to the server as its certificate and to clients as the CA.
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(vec!["localhost".to_owned()]).unwrap();
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let cert = params.self_signed(&key).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (cert_file, key_file) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
    std::fs::write(&cert_file, cert.pem()).unwrap();
    std::fs::write(&key_file, key.serialize_pem()).unwrap();
    let (cert_file, key_file) = (cert_file.to_str().unwrap(), key_file.to_str().unwrap());
    let server = ServerProcess::start(&["--tls-cert", cert_file, "--tls-key", key_file]);
    let addr = format!("localhost:{}", server.addr.port());
    let refused = one_error_line(&broker(
        &["--addr", &addr, "--tls-ca", cert_file, "describe"],
        &[],
    ));
    assert!(
        refused.contains("presents a certificate authority's own certificate"),
        "{refused}"
    );
}

/// Starts the server on every interface with `env`, makes one call (so start-up is over) and
/// returns what it logged.
fn start_up_log(env: &[(&str, &str)]) -> String {
    let mut command = Command::new(server_binary());
    for name in SECURITY_ENV {
        command.env_remove(name);
    }
    let mut child = command
        .args(["--listen", "0.0.0.0:0"])
        .envs(env.iter().copied())
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start broker-server");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let port = line
        .trim()
        .strip_prefix("listening on 0.0.0.0:")
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"));
    // Served one call: the server is past its start-up checks and has logged their warnings.
    let addr = format!("127.0.0.1:{port}");
    stdout(&broker(&["--addr", &addr, "describe"], env));
    child.kill().unwrap();
    let output = child.wait_with_output().unwrap();
    String::from_utf8(output.stderr).unwrap()
}

#[test]
fn an_open_server_beyond_loopback_warns_at_start_up() {
    let open = start_up_log(&[]);
    assert!(open.contains("no auth token"), "{open}");
    let guarded = start_up_log(&[("BROKER_AUTH_TOKEN", TOKEN)]);
    assert!(!guarded.contains("no auth token"), "{guarded}");
}

#[test]
fn bad_security_settings_stop_the_server_at_start_up() {
    let pki = TestPki::new(&["localhost"]);
    let empty = pki.path("empty");
    std::fs::write(&empty, "\n").unwrap();
    let empty = empty.to_str().unwrap();
    let (cert, key) = (
        pki.cert_file.to_str().unwrap(),
        pki.key_file.to_str().unwrap(),
    );

    let both = server_refuses(
        &["--auth-token-file", empty],
        &[("BROKER_AUTH_TOKEN", TOKEN)],
    );
    assert!(both.contains("not both"), "{both}");
    assert!(server_refuses(&["--auth-token-file", empty], &[]).contains("empty"));
    assert!(server_refuses(&[], &[("BROKER_AUTH_TOKEN", "")]).contains("empty"));
    assert!(server_refuses(&["--auth-token-file", "/nonexistent/token"], &[]).contains("token"));
    assert!(server_refuses(&["--tls-cert", cert], &[]).contains("--tls-key"));
    // A file holding no certificate, or no key: the server names both files.
    let no_cert = server_refuses(&["--tls-cert", key, "--tls-key", key], &[]);
    assert!(no_cert.contains("no certificate"), "{no_cert}");
    assert!(
        no_cert.contains(&format!("certificate file {key}")),
        "{no_cert}"
    );
    let no_key = server_refuses(&["--tls-cert", cert, "--tls-key", cert], &[]);
    assert!(no_key.contains("key"), "{no_key}");
    assert!(no_key.contains(&format!("key file {cert}")), "{no_key}");
}
