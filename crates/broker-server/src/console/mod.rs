//! The web console (`--console-listen`): a read-only view of the broker for operators, served
//! by the server itself over HTTP (HTTPS with the server's TLS identity).
//!
//! The page and its script are compiled into the binary; they ask the server's JSON API
//! (`/api/...`) for what they show, which the server reads as a Kafka client's requests are
//! read: through the same path as the broker's own clients (validation, the log, the
//! cluster's routing). Nothing the console can ask changes the broker.
//!
//! With an auth token, every API call needs it: as `Authorization: Bearer TOKEN`, or the
//! session cookie that signing in with the token on the page sets (the cookie's expiry signed
//! with a key derived from the token and a secret the server draws at start-up, so the cookie
//! says nothing about the token, and the server keeps no sessions). Without a token, requests
//! must be addressed to an IP address or `localhost`: a web page the operator visits cannot
//! reach the console by pointing a name of its own at it (DNS rebinding).

mod history;
mod views;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use broker_cluster::wall_clock_ms;
use broker_core::{Command, Outcome, TopicDescription};
use broker_kafka::Backend;
use broker_proto::ErrorReply;
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::header::{self, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use ring::hmac;
use serde::Serialize;
use tokio::net::TcpListener;
use tracing::warn;

use self::history::History;
use self::views::Wanted;
use crate::kafka::ServerBackend;
use crate::shared::Shared;
use crate::AuthToken;

/// How often the history samples every topic's end offsets and every group's lag.
pub(crate) const SAMPLE_EVERY: Duration = Duration::from_secs(5);

/// How many samples of each series the history keeps: the last 10 minutes.
const SAMPLES_KEPT: usize = 120;

/// Most records of a partition the records page shows at once.
const MAX_RECORDS_SHOWN: i32 = 100;

/// The most bytes of records one records page reads.
const RECORDS_PAGE_BYTES: u64 = 1 << 20;

/// Most bytes of a request's body (the sign-in form).
const MAX_BODY_BYTES: usize = 4096;

/// How long a request's body may take to arrive.
const BODY_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a request with a wrong token (a sign-in, or an API call's bearer token) waits
/// before it is answered: guessing the token through the console takes that long a guess.
const WRONG_TOKEN_DELAY: Duration = Duration::from_millis(500);

/// The session cookie's name.
const COOKIE: &str = "broker_console";

/// How long a session cookie lasts.
const SESSION_LIFE_MS: i64 = 12 * 60 * 60 * 1000;

/// The page, its script and its style, compiled in.
const INDEX_HTML: &str = include_str!("assets/index.html");
const CONSOLE_JS: &str = include_str!("assets/console.js");
const CONSOLE_CSS: &str = include_str!("assets/console.css");

/// Whether a request may read the broker.
enum Access {
    /// It carries the token or a valid session, or the server has no token.
    Granted,
    /// It carries neither.
    NoToken,
    /// It carries a token that is not the server's.
    WrongToken,
}

/// What the console's requests share.
struct Console {
    shared: Arc<Shared>,
    /// The server, as a client of its own.
    backend: ServerBackend,
    history: Mutex<History>,
    /// Whether the listener speaks TLS (the session cookie is then `Secure`).
    tls: bool,
    /// The key session cookies are signed with (`None` without an auth token).
    sessions: Option<hmac::Key>,
    /// Requests with a wrong token since the last warning about them.
    wrong_tokens: AtomicU64,
    /// When the last warning about a wrong token was logged, in milliseconds since the epoch.
    wrong_token_logged_ms: AtomicI64,
}

/// Serves the console on `listener` until the server shuts down, and samples the history
/// meanwhile.
pub(crate) async fn serve(listener: TcpListener, shared: Arc<Shared>) {
    if shared.config.auth_token.is_none() {
        if let Ok(local) = listener.local_addr() {
            if !local.ip().is_loopback() {
                warn!(
                    address = %local,
                    "the console listens beyond loopback and no auth token is configured: \
                     anyone who can reach it may read every record"
                );
            }
        }
    }
    let tls = shared.config.tls.clone();
    let sessions = match &shared.config.auth_token {
        None => None,
        Some(token) => match session_key(token) {
            Some(key) => Some(key),
            None => {
                warn!("the console is off: no random numbers to sign its sessions with");
                return;
            }
        },
    };
    let console = Arc::new(Console {
        backend: ServerBackend::new(Arc::clone(&shared), shared.new_connection_id()),
        shared: Arc::clone(&shared),
        history: Mutex::new(History::new(SAMPLES_KEPT)),
        tls: tls.is_some(),
        sessions,
        wrong_tokens: AtomicU64::new(0),
        wrong_token_logged_ms: AtomicI64::new(i64::MIN),
    });
    shared.tracker.spawn(sample(Arc::clone(&console)));
    crate::http::serve(listener, shared, tls, "console", move |request| {
        let console = Arc::clone(&console);
        async move { console.answer(request).await }
    })
    .await;
}

/// Samples every topic this node holds into the history each [`SAMPLE_EVERY`], until the
/// server shuts down.
async fn sample(console: Arc<Console>) {
    let mut ticks = tokio::time::interval(SAMPLE_EVERY);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = console.shared.shutdown.cancelled() => return,
            _ = ticks.tick() => {}
        }
        // Describing takes the shards' locks: on a thread of its own, not on one of the
        // runtime's workers.
        let shared = Arc::clone(&console.shared);
        if let Ok(topics) = tokio::task::spawn_blocking(move || held_topics(&shared)).await {
            console.history().record(wall_clock_ms(), &topics);
        }
    }
}

/// Every topic of the groups this node holds a copy of (every topic, for a server that runs
/// alone), from its own copies: read without asking any other node, so that sampling costs
/// the cluster nothing. A node holding no copy of a group (a cluster with fewer replicas than
/// nodes) has no history of its topics.
fn held_topics(shared: &Shared) -> Vec<TopicDescription> {
    let mut topics = Vec::new();
    for (shard, broker) in shared.shards.all().iter().enumerate() {
        let held = shard == 0 || shared.group(shard).is_none_or(|group| group.is_member());
        if held {
            topics.extend(broker.lock().describe().topics);
        }
    }
    topics
}

impl Console {
    /// The history, even if a thread panicked while holding it (it holds plain numbers).
    fn history(&self) -> std::sync::MutexGuard<'_, History> {
        self.history
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The answer to one request.
    async fn answer(&self, request: Request<Incoming>) -> Response<Full<Bytes>> {
        if self.sessions.is_none() && !host_is_address(request.headers()) {
            let mut refused = error(
                StatusCode::MISDIRECTED_REQUEST,
                "without an auth token the console answers only requests addressed to an IP \
                 address or localhost (so that no web page can reach it through a name of its \
                 own); open it by IP address, or start the server with --auth-token-file",
            );
            secure_headers(refused.headers_mut());
            return refused;
        }
        let path = request.uri().path().to_owned();
        let query = query(request.uri().query());
        let method = request.method().clone();
        let mut response = match (&method, path.as_str()) {
            (&Method::GET | &Method::HEAD, "/" | "/index.html") => {
                asset(INDEX_HTML, "text/html; charset=utf-8")
            }
            (&Method::GET | &Method::HEAD, "/console.js") => {
                asset(CONSOLE_JS, "text/javascript; charset=utf-8")
            }
            (&Method::GET | &Method::HEAD, "/console.css") => {
                asset(CONSOLE_CSS, "text/css; charset=utf-8")
            }
            (&Method::POST, "/api/login") => self.sign_in(request).await,
            (&Method::POST, "/api/logout") => self.sign_out(),
            (&Method::GET | &Method::HEAD, api) if api.starts_with("/api/") => {
                match self.access(&request) {
                    Access::Granted => self.api(api, &query).await,
                    Access::NoToken => error(
                        StatusCode::UNAUTHORIZED,
                        "sign in with the broker's auth token",
                    ),
                    Access::WrongToken => {
                        let peer = request.extensions().get::<SocketAddr>().copied();
                        self.wrong_token(peer, "request").await
                    }
                }
            }
            (_, "/" | "/index.html" | "/console.js" | "/console.css")
            | (_, "/api/login" | "/api/logout") => {
                error(StatusCode::METHOD_NOT_ALLOWED, "method not allowed")
            }
            (_, api) if api.starts_with("/api/") => {
                error(StatusCode::METHOD_NOT_ALLOWED, "the API only reads: GET")
            }
            _ => error(StatusCode::NOT_FOUND, "no such page"),
        };
        secure_headers(response.headers_mut());
        response
    }

    /// Whether `request` may read: it carries the auth token (as `Authorization: Bearer`) or a
    /// session signed with it; always, when the server has none.
    fn access(&self, request: &Request<Incoming>) -> Access {
        let (Some(token), Some(key)) = (&self.shared.config.auth_token, &self.sessions) else {
            return Access::Granted;
        };
        let headers = request.headers();
        let bearer = headers
            .get(header::AUTHORIZATION)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| {
                // The scheme's name is case-insensitive (RFC 9110).
                // The token as given after the spaces that follow the scheme: a token may
                // start or end with spaces of its own.
                let (scheme, token) = value.split_once(' ')?;
                scheme
                    .eq_ignore_ascii_case("bearer")
                    .then(|| token.trim_start_matches(' '))
            });
        if bearer.is_some() {
            return match token.matches(bearer) {
                true => Access::Granted,
                false => Access::WrongToken,
            };
        }
        let signed_in = headers
            .get_all(header::COOKIE)
            .iter()
            .filter_map(|value| value.to_str().ok())
            .flat_map(|value| value.split(';'))
            .filter_map(|pair| pair.trim().strip_prefix(COOKIE)?.strip_prefix('='))
            .any(|session| valid_session(key, session, wall_clock_ms()));
        match signed_in {
            true => Access::Granted,
            false => Access::NoToken,
        }
    }

    /// Answers a request that presented a wrong token: after [`WRONG_TOKEN_DELAY`], logged
    /// with its peer (one line a second at most, counting those it stands for).
    async fn wrong_token(&self, peer: Option<SocketAddr>, how: &str) -> Response<Full<Bytes>> {
        // One line a second at most, with how many came since the last one.
        let now = wall_clock_ms();
        self.wrong_tokens.fetch_add(1, Ordering::Relaxed);
        let last = self.wrong_token_logged_ms.load(Ordering::Relaxed);
        let log_now = now >= last.saturating_add(1000)
            && self
                .wrong_token_logged_ms
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok();
        if log_now {
            // This one included.
            let wrong_tokens = self.wrong_tokens.swap(0, Ordering::Relaxed);
            warn!(
                peer = ?peer,
                wrong_tokens,
                "a console {how} with a wrong token (wrong_tokens: how many since the last such \
                 line, at most one a second)"
            );
        }
        tokio::time::sleep(WRONG_TOKEN_DELAY).await;
        error(
            StatusCode::UNAUTHORIZED,
            "that is not the broker's auth token",
        )
    }

    /// `POST /api/login` with the token as the body: sets the session cookie if it is the
    /// token.
    async fn sign_in(&self, request: Request<Incoming>) -> Response<Full<Bytes>> {
        let (Some(token), Some(key)) = (&self.shared.config.auth_token, &self.sessions) else {
            return empty(StatusCode::NO_CONTENT);
        };
        let peer = request.extensions().get::<SocketAddr>().copied();
        let collected = tokio::time::timeout(
            BODY_TIMEOUT,
            Limited::new(request.into_body(), MAX_BODY_BYTES).collect(),
        )
        .await;
        let body = match collected {
            Ok(Ok(body)) => body.to_bytes(),
            Ok(Err(_)) => return error(StatusCode::PAYLOAD_TOO_LARGE, "the token is too long"),
            Err(_) => return error(StatusCode::REQUEST_TIMEOUT, "the token took too long"),
        };
        // A line break a paste brings along is not part of the token (as in a token file).
        let presented = std::str::from_utf8(&body)
            .unwrap_or_default()
            .trim_end_matches(['\r', '\n']);
        if !token.matches(Some(presented)) {
            return self.wrong_token(peer, "sign-in").await;
        }
        let expires = wall_clock_ms().saturating_add(SESSION_LIFE_MS);
        let cookie = format!(
            "{COOKIE}={}; Path=/; Max-Age={}; HttpOnly; SameSite=Strict{}",
            session(key, expires),
            SESSION_LIFE_MS / 1000,
            if self.tls { "; Secure" } else { "" }
        );
        let mut response = empty(StatusCode::NO_CONTENT);
        if let Ok(cookie) = HeaderValue::from_str(&cookie) {
            response.headers_mut().insert(header::SET_COOKIE, cookie);
        }
        response
    }

    /// `POST /api/logout`: forgets the session cookie.
    fn sign_out(&self) -> Response<Full<Bytes>> {
        let mut response = empty(StatusCode::NO_CONTENT);
        let cookie = format!("{COOKIE}=; Path=/; Max-Age=0; HttpOnly; SameSite=Strict");
        if let Ok(cookie) = HeaderValue::from_str(&cookie) {
            response.headers_mut().insert(header::SET_COOKIE, cookie);
        }
        response
    }

    /// One call of the API.
    async fn api(&self, path: &str, query: &HashMap<String, String>) -> Response<Full<Bytes>> {
        let answered = match path {
            "/api/overview" => self.overview().await,
            "/api/topics" => {
                self.with_topics(|topics| json(&views::topic_rows(topics, &wanted(query))))
                    .await
            }
            "/api/groups" => {
                let kafka = self.shared.kafka.groups.groups();
                self.with_topics(|topics| json(&views::group_rows(topics, &kafka, &wanted(query))))
                    .await
            }
            "/api/dead-letters" => {
                self.with_topics(|topics| json(&views::dead_letter_rows(topics)))
                    .await
            }
            "/api/topic" => self.topic(query).await,
            "/api/records" => self.records(query).await,
            "/api/cluster" => Ok(self.cluster()),
            _ => Err(Refusal::new(StatusCode::NOT_FOUND, "no such API call")),
        };
        answered.unwrap_or_else(|refusal| error(refusal.status, &refusal.message))
    }

    /// Every topic, as this node describes them (gathered from each group, in a cluster).
    async fn topics(&self) -> Result<Vec<TopicDescription>, Refusal> {
        self.backend
            .topics()
            .await
            .map_err(|refusal| refused(&refusal))
    }

    /// `answer` of every topic.
    async fn with_topics(
        &self,
        answer: impl FnOnce(&[TopicDescription]) -> Response<Full<Bytes>>,
    ) -> Result<Response<Full<Bytes>>, Refusal> {
        Ok(answer(&self.topics().await?))
    }

    /// `/api/overview`: the server and the sums over what it holds.
    async fn overview(&self) -> Result<Response<Full<Bytes>>, Refusal> {
        #[derive(Serialize)]
        struct Overview {
            version: &'static str,
            node_id: Option<u64>,
            data_dir: Option<String>,
            topics: usize,
            partitions: usize,
            records: u64,
            bytes: u64,
            groups: usize,
            dead_letter_topics: usize,
            auth: bool,
        }
        let topics = self.topics().await?;
        let config = &self.shared.config;
        Ok(json(&Overview {
            version: env!("CARGO_PKG_VERSION"),
            node_id: config.cluster.as_ref().map(|cluster| cluster.node_id),
            data_dir: config
                .data_dir
                .as_ref()
                .map(|dir| dir.display().to_string()),
            topics: topics.len(),
            partitions: topics.iter().map(|topic| topic.partitions.len()).sum(),
            records: topics.iter().map(TopicDescription::records).sum(),
            bytes: topics.iter().map(|topic| topic.retained_bytes).sum(),
            groups: topics.iter().map(|topic| topic.groups.len()).sum(),
            dead_letter_topics: views::dead_letter_rows(&topics).len(),
            auth: config.auth_token.is_some(),
        }))
    }

    /// `/api/topic?name=T`: one topic, whole, with its history.
    async fn topic(
        &self,
        query: &HashMap<String, String>,
    ) -> Result<Response<Full<Bytes>>, Refusal> {
        let name = required(query, "name")?;
        let topics = self.topics().await?;
        let topic = match topics.iter().find(|topic| topic.name == name) {
            Some(topic) => topic.clone(),
            // Not in the gathering (which leaves out a group whose leader did not answer, in
            // a cluster): asked of its own group's leader, which knows whether it exists.
            None => match self
                .at_leader(
                    name,
                    Command::Describe {
                        topic: Some(name.to_owned()),
                    },
                )
                .await?
            {
                Outcome::Description(described) => described
                    .topics
                    .into_iter()
                    .find(|topic| topic.name == name)
                    .ok_or_else(|| {
                        Refusal::new(StatusCode::NOT_FOUND, format!("unknown topic {name:?}"))
                    })?,
                other => return Err(unexpected("a description", &other)),
            },
        };
        let history = self.history().of(name);
        Ok(json(&views::topic_page(
            topic,
            &topics,
            &self.shared.kafka.groups.groups(),
            history,
            SAMPLE_EVERY.as_millis() as u64,
        )))
    }

    /// `/api/records?topic=T&partition=P&limit=N`: the partition's latest N records (20 by
    /// default, at most [`MAX_RECORDS_SHOWN`]).
    async fn records(
        &self,
        query: &HashMap<String, String>,
    ) -> Result<Response<Full<Bytes>>, Refusal> {
        let topic = required(query, "topic")?.to_owned();
        let partition: i32 = number(query, "partition", 0)?;
        let limit: i32 = number(query, "limit", 20)?;
        if !(1..=MAX_RECORDS_SHOWN).contains(&limit) {
            return Err(Refusal::new(
                StatusCode::BAD_REQUEST,
                format!("limit must be 1 to {MAX_RECORDS_SHOWN}"),
            ));
        }
        // The partition's end first, then its last records up to it: as many as fit the
        // byte budget (fewer, newest kept, when they do not).
        let end = match self
            .at_leader(
                &topic,
                Command::EndOffset {
                    topic: topic.clone(),
                    partition,
                },
            )
            .await?
        {
            Outcome::Offset(end) => end,
            other => return Err(unexpected("an end offset", &other)),
        };
        let mut wanted = limit;
        let read = loop {
            let from = end.saturating_sub(i64::from(wanted)).max(0);
            let read = self
                .read(&topic, partition, from, wanted, RECORDS_PAGE_BYTES)
                .await?;
            let reached = read
                .records
                .last()
                .map_or(read.end_offset, |last| last.offset + 1);
            if reached >= end || wanted == 1 {
                break read;
            }
            wanted = (wanted / 2).max(1);
        };
        Ok(json(&views::records_page(
            &topic,
            partition,
            read.start_offset,
            read.end_offset,
            &read.records,
        )))
    }

    /// Reads up to `max_records` records of `partition` of `topic` from `offset` (from its
    /// earliest record when that is later), within `max_bytes` but for the first record.
    async fn read(
        &self,
        topic: &str,
        partition: i32,
        offset: i64,
        max_records: i32,
        max_bytes: u64,
    ) -> Result<broker_core::PartitionRead, Refusal> {
        let command = Command::Read {
            topic: topic.to_owned(),
            partition,
            offset,
            max_records,
            max_bytes: Some(max_bytes),
        };
        match self.at_leader(topic, command).await? {
            Outcome::Read(read) => Ok(read),
            other => Err(unexpected("a read", &other)),
        }
    }

    /// Applies `command`, about `topic`, at the node that leads the topic's group: here, or
    /// (on a follower of a cluster's group, whose copy may lag its leader's) through the
    /// cluster.
    async fn at_leader(&self, topic: &str, command: Command) -> Result<Outcome, Refusal> {
        let outcome = match crate::data_groups::serving_group(&self.shared, topic) {
            Some(group) if !group.is_leader() => {
                match crate::dispatch::checked(&self.shared, command) {
                    Ok(command) => crate::data_groups::apply_at_leader(&group, command).await,
                    Err(refusal) => Err(refusal),
                }
            }
            _ => self.backend.call(command, Duration::ZERO).await,
        };
        outcome.map_err(|refusal| refused(&refusal))
    }

    /// `/api/cluster`: this node's view of the cluster and of each group it holds a copy of;
    /// `null` for a server that runs alone.
    fn cluster(&self) -> Response<Full<Bytes>> {
        #[derive(Serialize)]
        struct ClusterView {
            cluster: Option<broker_core::ClusterStatus>,
            groups: Vec<broker_core::GroupStatus>,
            shards: usize,
        }
        let cluster = self.shared.cluster();
        json(&ClusterView {
            cluster: cluster.map(crate::cluster_admin::status),
            groups: match cluster {
                Some(_) => crate::cluster_admin::groups_status(&self.shared),
                None => Vec::new(),
            },
            shards: self.shared.shards.all().len(),
        })
    }
}

/// The key session cookies are signed with: an HMAC-SHA256 key derived from the token and
/// a random secret of this process (so a cookie cannot be used to test guesses of the token,
/// and a restart ends every session). `None` if the system gives no random numbers.
fn session_key(token: &AuthToken) -> Option<hmac::Key> {
    let secret: [u8; 32] = ring::rand::generate(&ring::rand::SystemRandom::new())
        .ok()?
        .expose();
    let derive = hmac::Key::new(hmac::HMAC_SHA256, &secret);
    let mut context = hmac::Context::with_key(&derive);
    context.update(b"broker console session key\0");
    context.update(token.secret().as_bytes());
    Some(hmac::Key::new(hmac::HMAC_SHA256, context.sign().as_ref()))
}

/// The session value that expires at `expires_ms`: the expiry and its HMAC with `key`.
fn session(key: &hmac::Key, expires_ms: i64) -> String {
    let tag = hmac::sign(key, expires_ms.to_string().as_bytes());
    format!("{expires_ms}.{}", views::hex(tag.as_ref()))
}

/// Whether `session` was made by [`session`] with `key` and has not expired at `now_ms`.
fn valid_session(key: &hmac::Key, session: &str, now_ms: i64) -> bool {
    let Some((expires, tag)) = session.split_once('.') else {
        return false;
    };
    let Ok(expires_ms) = expires.parse::<i64>() else {
        return false;
    };
    let tag: Option<Vec<u8>> = (0..tag.len())
        .step_by(2)
        .map(|at| u8::from_str_radix(tag.get(at..at + 2)?, 16).ok())
        .collect();
    let Some(tag) = tag else {
        return false;
    };
    now_ms < expires_ms && hmac::verify(key, expires.as_bytes(), &tag).is_ok()
}

/// Whether a request with `headers` is addressed (its `Host`) to an IP address or to
/// `localhost`, rather than to a name that a web page could point at this server.
fn host_is_address(headers: &hyper::HeaderMap) -> bool {
    let Some(host) = headers
        .get(header::HOST)
        .and_then(|host| host.to_str().ok())
    else {
        return false;
    };
    let host = match host.rsplit_once(':') {
        // `[::1]:8080`, `127.0.0.1:8080`, `localhost:8080`; a bare IPv6 address has colons too.
        Some((name, port)) if port.chars().all(|c| c.is_ascii_digit()) && !name.ends_with(':') => {
            name
        }
        _ => host,
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost") || host.parse::<std::net::IpAddr>().is_ok()
}

/// A query string's parameters, decoded (a name given twice: its last value).
fn query(query: Option<&str>) -> HashMap<String, String> {
    form_urlencoded::parse(query.unwrap_or_default().as_bytes())
        .into_owned()
        .collect()
}

/// The rows a list call asks for: `q`, `page` and `per_page`, with defaults for those missing
/// or not numbers.
fn wanted(query: &HashMap<String, String>) -> Wanted {
    let number = |name: &str, default: usize| {
        query
            .get(name)
            .and_then(|value| value.parse().ok())
            .unwrap_or(default)
    };
    Wanted::new(
        query.get("q").map_or("", String::as_str),
        number("page", 1),
        number("per_page", views::DEFAULT_PER_PAGE),
    )
}

/// The parameter `name`, which the call needs.
fn required<'a>(query: &'a HashMap<String, String>, name: &str) -> Result<&'a str, Refusal> {
    query
        .get(name)
        .map(String::as_str)
        .filter(|value| !value.is_empty())
        .ok_or_else(|| Refusal::new(StatusCode::BAD_REQUEST, format!("{name} is missing")))
}

/// The number `name`, or `default` when it is not given.
fn number<T: std::str::FromStr>(
    query: &HashMap<String, String>,
    name: &str,
    default: T,
) -> Result<T, Refusal> {
    match query.get(name) {
        None => Ok(default),
        Some(value) => value.parse().map_err(|_| {
            Refusal::new(
                StatusCode::BAD_REQUEST,
                format!("{name} must be a number, not {value:?}"),
            )
        }),
    }
}

/// Why an API call is answered with an error: its status and what it says.
#[derive(Debug)]
struct Refusal {
    status: StatusCode,
    message: String,
}

impl Refusal {
    fn new(status: StatusCode, message: impl Into<String>) -> Refusal {
        Refusal {
            status,
            message: message.into(),
        }
    }
}

/// An answer of the broker that is not the one asked for, as an error.
fn unexpected(wanted: &str, outcome: &Outcome) -> Refusal {
    Refusal::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        format!("{wanted} was asked for and {outcome:?} answered"),
    )
}

/// A refusal of the broker as an answer: the broker's own message, with the status that fits.
fn refused(refusal: &ErrorReply) -> Refusal {
    let status = match refusal {
        ErrorReply::InvalidArgument(_) | ErrorReply::NotAssigned { .. } => StatusCode::NOT_FOUND,
        ErrorReply::NotLeader { .. } | ErrorReply::ShuttingDown => StatusCode::SERVICE_UNAVAILABLE,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    };
    let message = match refusal {
        ErrorReply::NotLeader {
            leader: Some(leader),
        } => format!(
            "the node that serves this now (clients reach it at {leader}) did not answer \
             through this one: try again in a moment, or open that node's console"
        ),
        ErrorReply::NotLeader { leader: None } => {
            "the cluster is electing a leader: try again in a moment".to_owned()
        }
        ErrorReply::InvalidArgument(why) => why.clone(),
        other => other.to_string(),
    };
    Refusal::new(status, message)
}

/// `value` as a JSON answer.
fn json(value: &impl Serialize) -> Response<Full<Bytes>> {
    match serde_json::to_vec(value) {
        Ok(body) => with_type(
            Response::new(Full::new(Bytes::from(body))),
            "application/json",
        ),
        Err(cause) => error(StatusCode::INTERNAL_SERVER_ERROR, &cause.to_string()),
    }
}

/// An error as a JSON answer: `{"error": message}` with `status`.
fn error(status: StatusCode, message: &str) -> Response<Full<Bytes>> {
    let body = serde_json::json!({ "error": message }).to_string();
    let mut response = with_type(
        Response::new(Full::new(Bytes::from(body))),
        "application/json",
    );
    *response.status_mut() = status;
    response
}

/// An answer without a body.
fn empty(status: StatusCode) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::new()));
    *response.status_mut() = status;
    response
}

/// One of the compiled-in files.
fn asset(body: &'static str, content_type: &'static str) -> Response<Full<Bytes>> {
    with_type(
        Response::new(Full::new(Bytes::from_static(body.as_bytes()))),
        content_type,
    )
}

/// `response` with its content type.
fn with_type(
    mut response: Response<Full<Bytes>>,
    content_type: &'static str,
) -> Response<Full<Bytes>> {
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

/// The headers every answer carries: only the console's own files run in the page, which no
/// other site may frame, and answers are never cached (they hold records).
fn secure_headers(headers: &mut hyper::HeaderMap) {
    for (name, value) in [
        (
            header::CONTENT_SECURITY_POLICY,
            "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'",
        ),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::X_FRAME_OPTIONS, "DENY"),
        (header::REFERRER_POLICY, "no-referrer"),
        (header::CACHE_CONTROL, "no-store"),
    ] {
        headers.insert(name, HeaderValue::from_static(value));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_is_valid_with_its_key_until_it_expires() {
        let token = AuthToken::new("s3cret").unwrap();
        let key = session_key(&token).unwrap();
        // Another token, or the same token in another process: another key.
        let others = [
            session_key(&AuthToken::new("another").unwrap()).unwrap(),
            session_key(&token).unwrap(),
        ];
        let value = session(&key, 10_000);
        assert!(valid_session(&key, &value, 9_999));
        assert!(!valid_session(&key, &value, 10_000));
        for other in &others {
            assert!(!valid_session(other, &value, 0));
        }
        // A later expiry with the same tag is refused.
        let (_, tag) = value.split_once('.').unwrap();
        assert!(!valid_session(&key, &format!("99999.{tag}"), 0));
        for broken in ["", "10000", "10000.", "x.00", "10000.zz", "10000.0"] {
            assert!(!valid_session(&key, broken, 0), "{broken}");
        }
    }

    #[test]
    fn without_a_token_only_requests_to_an_address_are_answered() {
        let addressed = |host: &str| {
            let request = Request::builder()
                .header(header::HOST, host)
                .body(())
                .unwrap();
            host_is_address(request.headers())
        };
        for host in [
            "127.0.0.1:8080",
            "127.0.0.1",
            "[::1]:8080",
            "localhost:8080",
            "LOCALHOST",
        ] {
            assert!(addressed(host), "{host}");
        }
        for host in [
            "evil.example:8080",
            "evil.example",
            "127.0.0.1.evil.example",
            "",
        ] {
            assert!(!addressed(host), "{host}");
        }
    }

    #[test]
    fn queries_are_decoded() {
        let decoded = query(Some("name=orders.v1&q=a%20b&page=2&name=last"));
        assert_eq!(decoded["name"], "last");
        assert_eq!(decoded["q"], "a b");
        assert_eq!(wanted(&decoded), Wanted::new("A B", 2, 50));
        assert!(number::<i32>(&query(Some("partition=x")), "partition", 0).is_err());
        assert_eq!(number::<i32>(&query(None), "partition", 7).unwrap(), 7);
    }
}
