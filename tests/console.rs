//! The web console (`--console-listen`) of the real binary: its HTTP API and sign-in, checked
//! against the broker's state through the real client, and its pages driven in headless
//! Chromium (`tests/console/browser.py`, through chromedriver).
//!
//! Without Chromium and chromedriver the browser test says so and passes, unless
//! `BROKER_REQUIRE_BROWSER` is set, as CI sets it. With `BROKER_CONSOLE_SCREENSHOTS=DIR` it
//! saves a screenshot of each page there (the README's come from it).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::process::Command;

use broker_client::{
    BrokerDescription, Client, GroupSetting, Header, PublishRecord, TopicDescription, TopicName,
};
use broker_testkit::certs::TestPki;
use broker_testkit::cluster::Nodes;
use broker_testkit::http::request;
use broker_testkit::process::ServerProcess;
use serde_json::{json, Value};

const TOKEN: &str = "console-secret";
const BROWSER: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../tests/console/browser.py"
);

/// A server with the console, signed with `TOKEN`, and a client of it.
async fn server(dir: &tempfile::TempDir) -> (ServerProcess, Client) {
    let token = dir.path().join("token");
    std::fs::write(&token, TOKEN).unwrap();
    let token = token.to_str().unwrap();
    // Members stay for the whole test, however slow the browser is to start.
    let server = ServerProcess::start(&[
        "--console-listen",
        "127.0.0.1:0",
        "--auth-token-file",
        token,
        "--session-timeout-ms",
        "600000",
    ]);
    let client = Client::builder()
        .auth_token(TOKEN)
        .connect(server.addr_string())
        .await
        .unwrap();
    (server, client)
}

/// The records published to partition 1 of `orders`: (key, payload, header value).
fn partition_one() -> Vec<(&'static str, Vec<u8>, &'static str)> {
    vec![
        ("customer-7", b"order 1".to_vec(), "web"),
        ("customer-8", b"order 2".to_vec(), "shop"),
        ("customer-7", vec![0xff, 0x00, 0x01], "batch"),
    ]
}

/// Topics, records with keys and headers, a group with a dead-letter topic that received a
/// record, another group, and 60 topics more: enough for a second page of topics.
async fn fill(client: &Client) {
    client.create("orders", 3).await.unwrap();
    client.create("orders-dead", 1).await.unwrap();
    for n in 0..60 {
        client.create(&format!("load-{n:02}"), 1).await.unwrap();
    }
    let records = partition_one()
        .into_iter()
        .map(|(key, payload, source)| PublishRecord {
            partition: Some(1),
            key: Some(key.as_bytes().to_vec().into()),
            payload: payload.into(),
            headers: vec![Header {
                name: "source".to_owned(),
                value: Some(source.as_bytes().to_vec().into()),
            }],
            timestamp_ms: None,
        })
        .collect();
    client.publish_batch("orders", records).await.unwrap();
    for n in 0..4 {
        client
            .publish("orders", 0, format!("plain {n}"))
            .await
            .unwrap();
    }
    // A group that consumes nothing yet, so that the topic keeps every record (interest
    // retention).
    client.join("orders", "audit", "a1").await.unwrap();
    let dead_letter = [
        GroupSetting::MaxDeliveries(1),
        GroupSetting::DeadLetter(TopicName::new("orders-dead").unwrap()),
    ];
    client
        .join_group("orders", "billing", "m1", None, &dead_letter)
        .await
        .unwrap();
    // Delivered once and released: past its last delivery, it goes to the dead-letter topic.
    let delivered = client.poll("orders", "billing", "m1", 1).await.unwrap();
    let record = &delivered[0];
    client
        .retry("orders", "billing", "m1", record.partition, record.offset)
        .await
        .unwrap();
}

/// `GET path` of the console with `headers`: status line, headers, body.
fn get(console: SocketAddr, path: &str, headers: &[(&str, &str)]) -> (String, String, String) {
    request(console, "GET", path, headers, "")
}

/// `GET path` of the API with the token: its JSON.
fn api(console: SocketAddr, path: &str) -> Value {
    let bearer = format!("Bearer {TOKEN}");
    let (status, _, body) = get(console, path, &[("Authorization", &bearer)]);
    assert!(status.contains("200"), "{path}: {status} {body}");
    serde_json::from_str(&body).unwrap()
}

#[tokio::test]
async fn the_api_answers_what_the_broker_holds_to_those_with_the_token() {
    let dir = tempfile::tempdir().unwrap();
    let (server, client) = server(&dir).await;
    let console = server.console_addr.unwrap();
    fill(&client).await;

    // The page and its files need no token; they hold no data.
    let (status, headers, body) = get(console, "/", &[]);
    assert!(status.contains("200"), "{status}");
    assert!(headers.contains("content-type: text/html"), "{headers}");
    assert!(
        headers.contains("content-security-policy: default-src 'self'"),
        "{headers}"
    );
    assert!(headers.contains("x-frame-options: deny"), "{headers}");
    assert!(body.contains("console.js"));
    assert!(get(console, "/console.js", &[]).0.contains("200"));
    assert!(get(console, "/console.css", &[]).0.contains("200"));

    // The API needs the token: none, a wrong one, then the right one.
    let (status, _, body) = get(console, "/api/topics", &[]);
    assert!(status.contains("401"), "{status}");
    assert!(body.contains("auth token"), "{body}");
    // A wrong token is answered after half a second, so that guessing it takes that long a
    // guess.
    let wrong = [("Authorization", "Bearer not-the-token")];
    let asked = std::time::Instant::now();
    assert!(get(console, "/api/topics", &wrong).0.contains("401"));
    assert!(asked.elapsed() >= std::time::Duration::from_millis(450));
    let topics = api(console, "/api/topics?per_page=100");
    assert_eq!(topics["total"], 62);
    // The scheme's name in any case.
    let lower = format!("bearer {TOKEN}");
    assert!(get(console, "/api/overview", &[("Authorization", &lower)])
        .0
        .contains("200"));

    // Signing in with a wrong token sets nothing; with the token, a cookie that opens the API.
    let (status, headers, _) = request(console, "POST", "/api/login", &[], "wrong");
    assert!(status.contains("401"), "{status}");
    assert!(!headers.contains("set-cookie"), "{headers}");
    let (status, headers, _) = request(console, "POST", "/api/login", &[], TOKEN);
    assert!(status.contains("204"), "{status}");
    let cookie = headers
        .lines()
        .find_map(|line| line.strip_prefix("set-cookie: "))
        .expect("a session cookie");
    assert!(cookie.contains("httponly") && cookie.contains("samesite=strict"));
    let session = cookie.split(';').next().unwrap();
    assert!(
        !session.contains(TOKEN),
        "the cookie carries the token: {session}"
    );
    let (status, _, _) = get(console, "/api/overview", &[("Cookie", session)]);
    assert!(status.contains("200"), "{status}");
    // A forged session is refused: a later expiry with the tag, or another tag.
    let (expiry, tag) = session
        .strip_prefix("broker_console=")
        .unwrap()
        .split_once('.')
        .unwrap();
    let later = format!(
        "broker_console={}.{tag}",
        expiry.parse::<i64>().unwrap() + 1
    );
    let other_tag = format!("broker_console={expiry}.{}", "0".repeat(tag.len()));
    for forged in [later, other_tag] {
        assert!(get(console, "/api/overview", &[("Cookie", &forged)])
            .0
            .contains("401"));
    }

    // What each call answers is the broker's state.
    let described = client.describe().await.unwrap();
    let orders = topic(&described, "orders");
    let page = api(console, "/api/topic?name=orders");
    assert_eq!(
        page["partitions"],
        serde_json::to_value(&orders.partitions).unwrap()
    );
    let groups: Vec<&str> = page["groups"]
        .as_array()
        .unwrap()
        .iter()
        .map(|group| group["name"].as_str().unwrap())
        .collect();
    assert_eq!(groups, ["audit", "billing"]);
    assert_eq!(page["dead_letter_for"], json!([]));
    let overview = api(console, "/api/overview");
    assert_eq!(overview["topics"], 62);
    assert_eq!(overview["groups"], 2);
    assert_eq!(overview["dead_letter_topics"], 1);
    let dead = api(console, "/api/dead-letters");
    assert_eq!(
        dead,
        json!([{ "topic": "orders-dead", "records": 1, "bytes": dead_bytes(&described), "groups": ["orders/billing"] }])
    );
    let found = api(console, "/api/groups?q=bill");
    assert_eq!(found["total"], 1);
    assert_eq!(found["items"][0]["dead_letter"], "orders-dead");

    // The latest records, with their keys and headers, as text and hex.
    let records = api(console, "/api/records?topic=orders&partition=1&limit=2");
    let shown = records["records"].as_array().unwrap();
    assert_eq!(shown.len(), 2);
    assert_eq!(shown[0]["offset"], 1);
    assert_eq!(shown[0]["payload"]["text"], "order 2");
    assert_eq!(shown[0]["key"]["text"], "customer-8");
    assert_eq!(shown[0]["headers"][0]["value"]["text"], "shop");
    assert_eq!(shown[1]["payload"]["hex"], "ff0001");
    assert_eq!(shown[1]["payload"]["text"], Value::Null);
    assert_eq!(records["end_offset"], 3);

    // Bad asks are answered clearly.
    let bearer = format!("Bearer {TOKEN}");
    let auth = [("Authorization", bearer.as_str())];
    for (path, status, says) in [
        ("/api/records?topic=orders&partition=9", "404", "partition"),
        ("/api/records?topic=orders&limit=0", "400", "limit"),
        ("/api/records?topic=orders&partition=x", "400", "partition"),
        ("/api/topic", "400", "name is missing"),
        ("/api/topic?name=", "400", "name is missing"),
        ("/api/topic?name=nope", "404", "unknown topic \"nope\""),
        ("/api/records?topic=nope", "404", "unknown topic \"nope\""),
        ("/api/nothing", "404", "no such API call"),
    ] {
        let (answered, _, body) = get(console, path, &auth);
        assert!(answered.contains(status), "{path}: {answered} {body}");
        let said: Value = serde_json::from_str(&body).unwrap();
        assert!(
            said["error"].as_str().unwrap().contains(says),
            "{path}: {body}"
        );
    }
    let (status, _, _) = request(console, "POST", "/api/topics", &auth, "");
    assert!(status.contains("405"), "{status}");
    assert!(get(console, "/nothing", &[]).0.contains("404"));
}

#[tokio::test]
async fn with_tls_the_console_speaks_https_and_its_session_cookie_is_secure() {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, ServerName};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let pki = TestPki::new(&["127.0.0.1"]);
    let token = pki.path("token");
    std::fs::write(&token, TOKEN).unwrap();
    let server = ServerProcess::start(&[
        "--console-listen",
        "127.0.0.1:0",
        "--auth-token-file",
        token.to_str().unwrap(),
        "--tls-cert",
        pki.cert_file.to_str().unwrap(),
        "--tls-key",
        pki.key_file.to_str().unwrap(),
    ]);
    let console = server.console_addr.unwrap();
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(pki.ca_pem.as_bytes()) {
        roots.add(cert.unwrap()).unwrap();
    }
    let config = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config));
    let stream = tokio::net::TcpStream::connect(console).await.unwrap();
    let name = ServerName::try_from("127.0.0.1").unwrap();
    let mut tls = connector.connect(name, stream).await.unwrap();
    let sign_in = format!(
        "POST /api/login HTTP/1.1\r\nHost: {console}\r\nConnection: close\r\n\
         Content-Length: {}\r\n\r\n{TOKEN}",
        TOKEN.len()
    );
    tls.write_all(sign_in.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    // The server may close without a TLS close_notify: what came before counts.
    let _ = tls.read_to_end(&mut answer).await;
    let answer = String::from_utf8_lossy(&answer).to_lowercase();
    assert!(answer.starts_with("http/1.1 204"), "{answer}");
    let cookie = answer
        .lines()
        .find_map(|line| line.strip_prefix("set-cookie: "))
        .expect("a session cookie");
    assert!(cookie.contains("; secure"), "{cookie}");
    // Plain HTTP gets no answer from it.
    let mut plain = tokio::net::TcpStream::connect(console).await.unwrap();
    let _ = plain
        .write_all(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        .await;
    let mut refused = Vec::new();
    let _ = plain.read_to_end(&mut refused).await;
    assert!(!String::from_utf8_lossy(&refused).contains("200 OK"));
}

#[tokio::test]
async fn without_a_token_the_console_is_open() {
    let server = ServerProcess::start(&["--console-listen", "127.0.0.1:0"]);
    let console = server.console_addr.unwrap();
    let client = Client::connect(server.addr_string()).await.unwrap();
    client.create("t", 2).await.unwrap();
    let (status, _, body) = get(console, "/api/topics", &[]);
    assert!(status.contains("200"), "{status}");
    assert!(body.contains("\"name\":\"t\""), "{body}");
    let cluster = api(console, "/api/cluster");
    assert_eq!(cluster["cluster"], Value::Null);
    // A request addressed to a name (a web page pointing a name of its own at the console)
    // is refused, page and API alike.
    for path in ["/", "/api/topics"] {
        let (status, _, body) = get(console, path, &[("Host", "attacker.example")]);
        assert!(status.contains("421"), "{path}: {status}");
        assert!(body.contains("--auth-token-file"), "{body}");
    }
}

/// `GET path` of the API with the token, asked again for up to 20 seconds until it answers
/// 200 with what `done` accepts (a cluster's node may lag, or its groups elect): its JSON.
fn eventually(console: SocketAddr, path: &str, done: impl Fn(&Value) -> bool) -> Value {
    let bearer = format!("Bearer {TOKEN}");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let (status, _, body) = get(console, path, &[("Authorization", &bearer)]);
        let answer: Option<Value> = serde_json::from_str(&body).ok();
        match answer {
            Some(answer) if status.contains("200") && done(&answer) => return answer,
            _ => {
                assert!(
                    std::time::Instant::now() < deadline,
                    "{console}{path}: still {status} {body}"
                );
                std::thread::sleep(std::time::Duration::from_millis(200));
            }
        }
    }
}

#[tokio::test]
async fn each_node_of_a_cluster_shows_the_whole_cluster() {
    let nodes = Nodes::start_with(
        3,
        None,
        &[
            "--console-listen",
            "127.0.0.1:0",
            "--metrics-listen",
            "127.0.0.1:0",
            "--cluster-data-groups",
            "3",
        ],
    );
    // Topics created once every group has a leader are spread over the groups.
    nodes.spread(3, std::time::Duration::from_secs(30));
    let client = nodes.client().await;
    let names = ["north", "south", "east", "west"];
    for name in names {
        client.create(name, 1).await.unwrap();
        client
            .publish(name, 0, format!("from {name}"))
            .await
            .unwrap();
    }
    for node in nodes.running.iter().flatten() {
        let console = node.console_addr.unwrap();
        // Every topic, whichever group holds it.
        eventually(console, "/api/topics", |topics| {
            topics["total"] == names.len()
        });
        // The nodes, and the groups this node holds a copy of (every group: three replicas).
        let cluster = eventually(console, "/api/cluster", |cluster| {
            cluster["cluster"]["leader"].is_u64()
                && cluster["groups"].as_array().map(Vec::len) == Some(3)
        });
        assert_eq!(cluster["cluster"]["members"].as_array().unwrap().len(), 3);
        let placed: usize = cluster["groups"]
            .as_array()
            .unwrap()
            .iter()
            .map(|group| group["topics"].as_array().unwrap().len())
            .sum();
        assert_eq!(placed, names.len(), "{cluster}");
        // Each topic's page and records, read where its group's leader is.
        for name in names {
            let path = format!("/api/topic?name={name}");
            eventually(console, &path, |topic| topic["name"] == name);
            let path = format!("/api/records?topic={name}&partition=0");
            let records = eventually(console, &path, |_| true);
            assert_eq!(
                records["records"][0]["payload"]["text"],
                format!("from {name}")
            );
        }
    }
}

/// `name`'s description.
fn topic<'a>(described: &'a BrokerDescription, name: &str) -> &'a TopicDescription {
    described
        .topics
        .iter()
        .find(|topic| topic.name == name)
        .unwrap()
}

/// The bytes the dead-letter topic retains.
fn dead_bytes(described: &BrokerDescription) -> u64 {
    topic(described, "orders-dead").retained_bytes
}

/// Whether Chromium and chromedriver can run here. Without them the caller skips, unless
/// `BROKER_REQUIRE_BROWSER` is set.
fn browser_installed() -> bool {
    let runs = |program: &str| {
        Command::new(program)
            .arg("--version")
            .output()
            .is_ok_and(|output| output.status.success())
    };
    let found = runs("chromedriver") && (runs("chromium") || runs("chromium-browser"));
    assert!(
        found || std::env::var_os("BROKER_REQUIRE_BROWSER").is_none(),
        "a browser is required (BROKER_REQUIRE_BROWSER): chromium and chromedriver (Debian: \
         chromium, chromium-driver)"
    );
    found
}

/// Numbers as the console writes them (`1,234`).
fn number(n: impl Into<i128>) -> String {
    let digits = n.into().to_string();
    let (sign, digits) = digits
        .strip_prefix('-')
        .map_or(("", digits.as_str()), |rest| ("-", rest));
    let mut grouped = String::new();
    for (at, digit) in digits.chars().enumerate() {
        if at > 0 && (digits.len() - at) % 3 == 0 {
            grouped.push(',');
        }
        grouped.push(digit);
    }
    format!("{sign}{grouped}")
}

/// What each page must show, from the broker's state as the client describes it.
fn expected_pages(console: SocketAddr, described: &BrokerDescription) -> Value {
    let topics = &described.topics;
    let records =
        |topic: &TopicDescription| -> u64 { topic.partitions.iter().map(|p| p.records).sum() };
    let first_page: Vec<Value> = topics
        .iter()
        .take(50)
        .map(|topic| json!({ "name": topic.name, "partitions": topic.partitions.len(), "records": records(topic) }))
        .collect();
    let second_page: Vec<&str> = topics.iter().skip(50).map(|t| t.name.as_str()).collect();
    let found: Vec<&str> = topics
        .iter()
        .filter(|t| t.name.contains("orders"))
        .map(|t| t.name.as_str())
        .collect();
    let partitions: usize = topics.iter().map(|t| t.partitions.len()).sum();
    let all_records: u64 = topics.iter().map(records).sum();
    let groups: usize = topics.iter().map(|t| t.groups.len()).sum();
    let orders = topic(described, "orders");
    let group_rows: Vec<Vec<String>> = topics
        .iter()
        .flat_map(|topic| {
            topic.groups.iter().map(|group| {
                vec![
                    topic.name.clone(),
                    group.name.clone(),
                    number(group.members.len() as i64),
                    number(group.partitions.iter().map(|p| p.lag).sum::<i64>()),
                    number(
                        group
                            .partitions
                            .iter()
                            .filter(|p| p.in_flight.is_some())
                            .count() as i64,
                    ),
                    if group.name == "billing" {
                        "orders-dead".to_owned()
                    } else {
                        String::new()
                    },
                ]
            })
        })
        .collect();
    // Newest first, as the page lists them.
    let shown: Vec<Value> = partition_one()
        .into_iter()
        .enumerate()
        .rev()
        .map(|(offset, (key, payload, source))| {
            let hex: String = payload.iter().map(|b| format!("{b:02x}")).collect();
            // Shown as text when it is, and said to be binary when it is not.
            let text =
                String::from_utf8(payload).unwrap_or_else(|_| format!("binary, as hex:{hex}"));
            json!({ "offset": offset, "key": key, "text": text, "hex": hex, "headers": format!("source: {source}") })
        })
        .collect();
    json!({
        "url": format!("http://{console}/"),
        "token": TOKEN,
        "topics": {
            "first_page": first_page,
            "second_page": second_page,
            "page_of": format!("page 1 of 2 ({} in all)", topics.len()),
            "summary": format!("{} topics · {} partitions · {} records · {} groups",
                number(topics.len() as i64), number(partitions as i64), number(all_records), number(groups as i64)),
            "search": "orders",
            "found": found,
        },
        "topic": {
            "name": "orders",
            "settings": "interest retention",
            "partitions": orders.partitions.iter()
                .map(|p| vec![i64::from(p.partition), p.earliest_offset, p.end_offset, p.records as i64])
                .collect::<Vec<_>>(),
            "groups": orders.groups.iter().map(|group| json!({
                "name": group.name,
                "partitions": group.partitions.iter()
                    .map(|p| vec![i64::from(p.partition), p.committed, p.lag])
                    .collect::<Vec<_>>(),
            })).collect::<Vec<_>>(),
            "records_partition": 1,
            "records": shown,
        },
        "groups": group_rows,
        "dead_letters": [["orders-dead", "1", "orders/billing"]],
        "cluster": "This server runs alone, not as a node of a cluster; its topics are held by",
    })
}

#[tokio::test]
async fn a_browser_shows_the_broker_as_it_is() {
    if !browser_installed() {
        eprintln!("skipped: chromium and chromedriver are not installed");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (server, client) = server(&dir).await;
    fill(&client).await;
    let screenshots = std::env::var_os("BROKER_CONSOLE_SCREENSHOTS");
    if screenshots.is_some() {
        // For the pictures: traffic over a few of the history's samples, so that the charts
        // have lines (17 s, 85 small batches at most).
        let until = std::time::Instant::now() + std::time::Duration::from_secs(17);
        for batch in 0..85 {
            if std::time::Instant::now() > until {
                break;
            }
            // Within the partitions' capacity; the audit group consumes some as it goes.
            let records = (0..1 + batch % 3)
                .map(|n| PublishRecord::to_partition(n % 2 * 2, format!("event {batch}-{n}")))
                .collect();
            client.publish_batch("orders", records).await.unwrap();
            for record in client.poll("orders", "audit", "a1", 1).await.unwrap() {
                client
                    .ack("orders", "audit", "a1", record.partition, record.offset)
                    .await
                    .unwrap();
            }
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
    }
    let described = client.describe().await.unwrap();
    let expected = dir.path().join("expected.json");
    std::fs::write(
        &expected,
        expected_pages(server.console_addr.unwrap(), &described).to_string(),
    )
    .unwrap();
    let mut browser = Command::new("python3");
    browser.arg(BROWSER).arg(&expected);
    if let Some(screenshots) = screenshots {
        browser.arg("--screenshots").arg(screenshots);
    }
    let output = tokio::task::spawn_blocking(move || browser.output())
        .await
        .unwrap()
        .unwrap();
    assert!(
        output.status.success(),
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}
