//! Speaks the protocol from raw bytes written by hand from `proto.md` alone (no broker crate is
//! used to encode or decode), against the real `broker-server` binary: the proof that proto.md
//! is enough to write a client in another language, and that bad input only ever affects the
//! connection that sent it.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use broker_testkit::process::ServerProcess;

/// Little-endian body builder, following proto.md section 2.
#[derive(Default)]
struct Body(Vec<u8>);

impl Body {
    fn u8(mut self, v: u8) -> Self {
        self.0.push(v);
        self
    }
    fn u16(mut self, v: u16) -> Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn u32(mut self, v: u32) -> Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn i32(mut self, v: i32) -> Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn u64(mut self, v: u64) -> Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn i64(mut self, v: i64) -> Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn bytes(mut self, v: &[u8]) -> Self {
        self.0.extend_from_slice(&(v.len() as u64).to_le_bytes());
        self.0.extend_from_slice(v);
        self
    }
    fn string(self, v: &str) -> Self {
        self.bytes(v.as_bytes())
    }
    /// The whole frame: u32 big-endian length, then the body.
    fn frame(&self) -> Vec<u8> {
        let mut frame = (self.0.len() as u32).to_be_bytes().to_vec();
        frame.extend_from_slice(&self.0);
        frame
    }
}

/// A request frame: correlation id, max_wait_ms 0, then the command's index and fields.
fn request(correlation_id: u64, command: u32) -> Body {
    Body::default().u64(correlation_id).u32(0).u32(command)
}

/// Little-endian reader over a response body.
struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn take(&mut self, n: usize) -> &[u8] {
        let (head, tail) = self.0.split_at(n);
        self.0 = tail;
        head
    }
    fn u8(&mut self) -> u8 {
        self.take(1)[0]
    }
    fn u16(&mut self) -> u16 {
        u16::from_le_bytes(self.take(2).try_into().unwrap())
    }
    fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.take(4).try_into().unwrap())
    }
    fn i32(&mut self) -> i32 {
        i32::from_le_bytes(self.take(4).try_into().unwrap())
    }
    fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.take(8).try_into().unwrap())
    }
    fn i64(&mut self) -> i64 {
        i64::from_le_bytes(self.take(8).try_into().unwrap())
    }
    fn bytes(&mut self) -> Vec<u8> {
        let n = self.u64() as usize;
        self.take(n).to_vec()
    }
    fn string(&mut self) -> String {
        String::from_utf8(self.bytes()).unwrap()
    }
    fn done(&self) {
        assert!(self.0.is_empty(), "{} unread bytes", self.0.len());
    }
}

struct Conn(TcpStream);

impl Conn {
    /// Connects and completes the handshake (proto.md section 3).
    fn open(server: &ServerProcess) -> Conn {
        let mut conn = Conn::raw(server);
        conn.send(&hello(1));
        let body = conn.read_frame().expect("a hello reply");
        let mut r = Reader(&body);
        assert_eq!(r.u32(), 0, "Welcome");
        assert_eq!(r.u16(), 1, "version");
        assert!(r.string().starts_with("broker-server/"));
        for _ in 0..5 {
            assert!(r.u32() > 0, "every limit is positive");
        }
        r.done();
        conn
    }

    fn raw(server: &ServerProcess) -> Conn {
        let stream = TcpStream::connect(server.addr).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        Conn(stream)
    }

    fn send(&mut self, bytes: &[u8]) {
        self.0.write_all(bytes).unwrap();
    }

    /// One frame's body, or `None` on a clean end of stream.
    fn read_frame(&mut self) -> Option<Vec<u8>> {
        let mut length = [0u8; 4];
        match self.0.read_exact(&mut length) {
            Ok(()) => {}
            Err(e) if e.kind() == ErrorKind::UnexpectedEof => return None,
            Err(e) if e.kind() == ErrorKind::ConnectionReset => return None,
            Err(e) => panic!("read: {e}"),
        }
        let mut body = vec![0u8; u32::from_be_bytes(length) as usize];
        self.0.read_exact(&mut body).unwrap();
        Some(body)
    }

    /// Sends a request and returns the response body after checking its correlation id.
    fn call(&mut self, correlation_id: u64, request: Body) -> Vec<u8> {
        self.send(&request.frame());
        self.response(correlation_id)
    }

    fn response(&mut self, correlation_id: u64) -> Vec<u8> {
        let body = self.read_frame().expect("a response");
        let mut r = Reader(&body);
        assert_eq!(r.u64(), correlation_id);
        body[8..].to_vec()
    }

    fn assert_closed(&mut self) {
        assert!(self.read_frame().is_none(), "the server should close");
    }
}

fn hello(version: u16) -> Vec<u8> {
    Body::default()
        .u8(b'B')
        .u8(b'R')
        .u8(b'K')
        .u8(b'R')
        .u16(version)
        .string("raw-test")
        .u8(0) // auth_token: None
        .frame()
}

/// Reads `Ok(outcome)` and checks the outcome's index.
fn ok(body: &[u8], outcome: u32) -> Reader<'_> {
    let mut r = Reader(body);
    assert_eq!(r.u32(), 0, "Ok");
    assert_eq!(r.u32(), outcome, "outcome index");
    r
}

/// Reads `Err(code)`.
fn err(body: &[u8], code: u32) -> Reader<'_> {
    let mut r = Reader(body);
    assert_eq!(r.u32(), 1, "Err");
    assert_eq!(r.u32(), code, "error code");
    r
}

fn create(topic: &str, partitions: i32) -> Body {
    request(1, 0).string(topic).i32(partitions).u32(0)
}

fn publish(id: u64, topic: &str, partition: i32, payload: &[u8]) -> Body {
    request(id, 3).string(topic).i32(partition).bytes(payload)
}

fn end_offset(id: u64, topic: &str, partition: i32) -> Body {
    request(id, 12).string(topic).i32(partition)
}

fn member_call(id: u64, command: u32, topic: &str, group: &str, member: &str) -> Body {
    request(id, command)
        .string(topic)
        .string(group)
        .string(member)
}

fn read_offset(conn: &mut Conn, topic: &str) -> i64 {
    let body = conn.call(99, end_offset(99, topic, 0));
    let mut r = ok(&body, 9);
    let offset = r.i64();
    r.done();
    offset
}

/// Reads a `Records` outcome's records as (partition, offset, payload).
fn records(mut r: Reader<'_>, topic: &str) -> Vec<(i32, i64, Vec<u8>)> {
    let count = r.u64();
    let out = (0..count)
        .map(|_| {
            assert_eq!(r.string(), topic);
            let partition = r.i32();
            let offset = r.i64();
            assert_eq!(r.u8(), 0, "no key");
            (partition, offset, r.bytes())
        })
        .collect();
    r.done();
    out
}

#[test]
fn worked_example_in_hand_written_bytes() {
    let server = ServerProcess::start(&["--capacity", "2"]);
    let mut conn = Conn::open(&server);

    let body = conn.call(1, create("orders", 1));
    assert_eq!(ok(&body, 0).u8(), 1, "created");
    let body = conn.call(2, publish(2, "orders", 0, b"a"));
    assert_eq!(ok(&body, 3).i64(), 0);
    let body = conn.call(3, publish(3, "orders", 0, b"b"));
    assert_eq!(ok(&body, 3).i64(), 1);
    // Join: topic, group, member, assignor None.
    let body = conn.call(4, member_call(4, 1, "orders", "billing", "m1").u8(0));
    let mut r = ok(&body, 1);
    assert_eq!((r.u64(), r.i32()), (1, 0), "partitions [0]");
    r.done();
    // Poll: max_records 2, max_bytes None.
    let poll = || member_call(5, 5, "orders", "billing", "m1").i32(2).u8(0);
    let body = conn.call(5, poll());
    assert_eq!(records(ok(&body, 5), "orders"), vec![(0, 0, b"a".to_vec())]);
    let body = conn.call(
        6,
        member_call(6, 7, "orders", "billing", "m1").i32(0).i64(0),
    );
    assert_eq!(ok(&body, 7).u8(), 1, "retried");
    let body = conn.call(5, poll());
    assert_eq!(records(ok(&body, 5), "orders"), vec![(0, 0, b"a".to_vec())]);
    let body = conn.call(
        7,
        member_call(7, 6, "orders", "billing", "m1").i32(0).i64(0),
    );
    assert_eq!(ok(&body, 6).u8(), 1, "acked");
    let body = conn.call(5, poll());
    assert_eq!(records(ok(&body, 5), "orders"), vec![(0, 1, b"b".to_vec())]);
    // A third publish fills nothing: capacity 2 holds "b" only after "a" left, so it fits.
    let body = conn.call(8, publish(8, "orders", 0, b"c"));
    assert_eq!(ok(&body, 3).i64(), 2);
    let body = conn.call(9, publish(9, "orders", 0, b"d"));
    assert_eq!(ok(&body, 3).i64(), -1, "full partition");
}

#[test]
fn broker_errors_arrive_as_numbered_codes() {
    let server = ServerProcess::start(&[]);
    let mut conn = Conn::open(&server);
    let body = conn.call(1, create("bad topic", 1));
    let mut r = err(&body, 0);
    assert!(r.string().contains("bad topic"));
    r.done();
    conn.call(1, create("t", 2));
    let body = conn.call(2, publish(2, "t", 2, b"x"));
    err(&body, 0);
    // Commit with offsets {0: 1} by a non-member: NotAssigned { partition: 0 }.
    let commit = member_call(3, 9, "t", "g", "m").u8(1).u64(1).i32(0).i64(1);
    let body = conn.call(3, commit);
    let mut r = err(&body, 1);
    assert_eq!(r.i32(), 0);
    r.done();
}

#[test]
fn pipelined_requests_in_one_write_are_answered_in_order() {
    let server = ServerProcess::start(&["--capacity", "1000"]);
    let mut conn = Conn::open(&server);
    conn.call(1, create("t", 1));
    let mut batch = Vec::new();
    for id in 0..500u64 {
        batch.extend_from_slice(&publish(1_000 + id, "t", 0, &id.to_le_bytes()).frame());
    }
    conn.send(&batch);
    for id in 0..500u64 {
        let body = conn.response(1_000 + id);
        assert_eq!(ok(&body, 3).i64(), id as i64);
    }
}

#[test]
fn an_unknown_command_is_answered_and_the_connection_goes_on() {
    let server = ServerProcess::start(&[]);
    let mut conn = Conn::open(&server);
    let body = conn.call(77, request(77, 9_999));
    err(&body, 2);
    // Trailing bytes after a valid message are malformed too.
    let body = conn.call(1, create("t", 1).u8(0));
    err(&body, 2);
    let body = conn.call(1, create("t", 1));
    assert_eq!(ok(&body, 0).u8(), 1, "the connection still works");
}

#[test]
fn a_wrong_version_or_magic_is_refused_and_closed() {
    let server = ServerProcess::start(&[]);
    let mut conn = Conn::raw(&server);
    conn.send(&hello(0));
    let body = conn.read_frame().expect("a refusal");
    let mut r = Reader(&body);
    assert_eq!(r.u32(), 1, "Refused");
    assert_eq!(r.u32(), 3, "UnsupportedProtocol");
    conn.assert_closed();

    let mut conn = Conn::raw(&server);
    let mut bad_magic = hello(1);
    bad_magic[4] = b'X';
    conn.send(&bad_magic);
    let body = conn.read_frame().expect("a refusal");
    assert_eq!(Reader(&body).u32(), 1, "Refused");
    conn.assert_closed();
}

#[test]
fn bad_input_on_one_connection_changes_nothing_and_others_are_still_served() {
    let server = ServerProcess::start(&[]);
    let mut good = Conn::open(&server);
    good.call(1, create("t", 1));
    good.call(2, publish(2, "t", 0, b"kept"));
    assert_eq!(read_offset(&mut good, "t"), 1);

    // An oversized length prefix: TooLarge to correlation 0, then the connection closes.
    let mut conn = Conn::open(&server);
    conn.send(&u32::MAX.to_be_bytes());
    let body = conn.read_frame().expect("a TooLarge answer");
    let mut r = Reader(&body);
    assert_eq!(r.u64(), 0, "correlation id 0");
    let mut r = err(&body[8..], 4);
    assert_eq!(r.string(), "frame");
    conn.assert_closed();

    // An HTTP request instead of a hello: an HTTP answer that says where HTTP is served.
    let mut conn = Conn::raw(&server);
    conn.send(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n");
    let mut answer = String::new();
    conn.0.read_to_string(&mut answer).unwrap();
    assert!(
        answer.starts_with("HTTP/1.1 400 Bad Request\r\n"),
        "{answer}"
    );
    assert!(answer.contains("--metrics-listen"), "{answer}");

    // A truncated frame, then a disconnect in the middle of it.
    let mut conn = Conn::open(&server);
    let frame = publish(5, "t", 0, b"never stored").frame();
    conn.send(&frame[..frame.len() - 3]);
    drop(conn);

    // A hello cut short.
    let mut conn = Conn::raw(&server);
    conn.send(&hello(1)[..6]);
    drop(conn);

    assert_eq!(read_offset(&mut good, "t"), 1, "nothing was applied");
    let body = good.call(3, publish(3, "t", 0, b"still served"));
    assert_eq!(ok(&body, 3).i64(), 1);
}

#[test]
fn a_batch_publish_in_hand_written_bytes_places_each_record() {
    let server = ServerProcess::start(&[]);
    let mut conn = Conn::open(&server);
    conn.call(1, create("t", 7));
    // PublishBatch [15]: topic, then Vec<PublishRecord { partition, key, payload }>.
    let batch = request(2, 15)
        .string("t")
        .u64(3)
        .u8(1)
        .i32(6)
        .u8(0)
        .bytes(b"explicit")
        .u8(0)
        .u8(1)
        .bytes(b"21")
        .bytes(b"keyed")
        .u8(0)
        .u8(0)
        .bytes(b"round-robin");
    let body = conn.call(2, batch);
    let mut r = ok(&body, 12);
    assert_eq!(r.u64(), 3);
    // murmur2("21") & 0x7fffffff = 1173551340, and 1173551340 % 7 = 3; round-robin starts at 0.
    let placed: Vec<(i32, i64)> = (0..3).map(|_| (r.i32(), r.i64())).collect();
    r.done();
    assert_eq!(placed, vec![(6, 0), (3, 0), (0, 0)]);
}

#[test]
fn an_ack_and_poll_in_hand_written_bytes_acknowledges_then_polls() {
    let server = ServerProcess::start(&[]);
    let mut conn = Conn::open(&server);
    conn.call(1, create("t", 1));
    for (id, payload) in [(2, b"one"), (3, b"two")] {
        conn.call(id, publish(id, "t", 0, payload));
    }
    // Join [1] with assignor None.
    conn.call(4, member_call(4, 1, "t", "g", "m").u8(0));
    // AckAndPoll [16]: topic, group, member, acks Vec<(i32, i64)>, max_records, max_bytes.
    let ack_and_poll = |id, acks: &[(i32, i64)]| {
        let mut body = member_call(id, 16, "t", "g", "m").u64(acks.len() as u64);
        for &(partition, offset) in acks {
            body = body.i32(partition).i64(offset);
        }
        body.i32(8).u8(0)
    };
    let expect_record = |r: &mut Reader<'_>, offset: i64, payload: &[u8]| {
        assert_eq!(r.string(), "t");
        assert_eq!((r.i32(), r.i64(), r.u8()), (0, offset, 0));
        assert_eq!(r.bytes(), payload);
    };
    let body = conn.call(5, ack_and_poll(5, &[]));
    // AckedAndPolled [13]: acked Vec<bool>, then records Vec<BrokerRecord>.
    let mut r = ok(&body, 13);
    assert_eq!((r.u64(), r.u64()), (0, 1));
    expect_record(&mut r, 0, b"one");
    r.done();
    let body = conn.call(6, ack_and_poll(6, &[(0, 0), (0, 0)]));
    let mut r = ok(&body, 13);
    assert_eq!((r.u64(), r.u8(), r.u8()), (2, 1, 0));
    assert_eq!(r.u64(), 1);
    expect_record(&mut r, 1, b"two");
    r.done();
}

#[test]
fn an_oversized_hello_is_refused_with_a_hello_reply_as_proto_md_shows() {
    let server = ServerProcess::start(&[]);
    let mut conn = Conn::raw(&server);
    // Before the hello the server takes frames of at most 64 KiB: this one announces 100,000.
    conn.send(&100_000u32.to_be_bytes());
    let body = conn.read_frame().expect("a refusal");
    let expected: &[u8] = &[
        0x01, 0x00, 0x00, 0x00, // HelloReply [1] Refused
        0x04, 0x00, 0x00, 0x00, // ErrorReply code 4, TooLarge
        0x05, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, b'f', b'r', b'a', b'm', b'e', // what
        0xa0, 0x86, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, // size 100,000
        0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, // limit 65,536
    ];
    assert_eq!(body, expected);
    conn.assert_closed();
}

#[test]
fn a_commit_map_whose_partitions_do_not_strictly_ascend_is_malformed() {
    let server = ServerProcess::start(&[]);
    let mut conn = Conn::open(&server);
    conn.call(1, create("t", 3));
    // Commits name offsets the partitions have: at most their end.
    for offset in 0..5 {
        assert_eq!(ok(&conn.call(1, publish(1, "t", 0, b"r")), 3).i64(), offset);
    }
    assert_eq!(ok(&conn.call(1, publish(1, "t", 2, b"r")), 3).i64(), 0);
    // Join [1]: topic, group, member, assignor None.
    let join = request(2, 1).string("t").string("g").string("m").u8(0);
    conn.call(2, join);
    // Commit [9]: topic, group, member, offsets Some(map of 2 entries).
    let commit = |id, entries: &[(i32, i64)]| {
        let mut body = request(id, 9)
            .string("t")
            .string("g")
            .string("m")
            .u8(1)
            .u64(entries.len() as u64);
        for &(partition, offset) in entries {
            body = body.i32(partition).i64(offset);
        }
        body
    };
    // Out of order, and a partition repeated: both malformed, nothing stored.
    err(&conn.call(3, commit(3, &[(2, 1), (0, 5)])), 2);
    err(&conn.call(4, commit(4, &[(1, 1), (1, 2)])), 2);
    // Strictly ascending: stored.
    let body = conn.call(5, commit(5, &[(0, 5), (2, 1)]));
    ok(&body, 8).done();
    // Committed [11] of partition 0 is 5.
    let body = conn.call(6, request(6, 11).string("t").string("g").i32(0));
    assert_eq!(ok(&body, 9).i64(), 5);
}

#[test]
fn other_protocols_at_either_port_are_told_where_to_go_in_one_log_line_each() {
    let log = tempfile::NamedTempFile::new().unwrap();
    let mut server = ServerProcess::start_with(
        &["--kafka-listen", "127.0.0.1:0"],
        &[],
        std::process::Stdio::from(log.reopen().unwrap()),
    );
    let answer = |addr: std::net::SocketAddr, bytes: &[u8]| {
        let mut stream = TcpStream::connect(addr).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        stream.write_all(bytes).unwrap();
        let mut answer = Vec::new();
        let _ = stream.read_to_end(&mut answer);
        String::from_utf8_lossy(&answer).into_owned()
    };
    let kafka = server.kafka_addr.unwrap();
    // redis-cli's PING, and one typed into nc: a Redis error saying what this port is.
    let redis = answer(server.addr, b"*1\r\n$4\r\nPING\r\n");
    assert!(
        redis.starts_with("-ERR This port speaks the broker's own protocol, not Redis"),
        "{redis}"
    );
    assert!(answer(server.addr, b"PING\r\n").starts_with("-ERR "));
    // A Kafka client's first request (ApiVersions v3): closed unanswered (a Kafka client would
    // misread any answer but its own).
    let api_versions = [0, 0, 0, 12, 0, 18, 0, 3, 0, 0, 0, 1, 0, 2, b'r', b'k'];
    assert_eq!(answer(server.addr, &api_versions), "");
    // At the Kafka port: HTTP and Redis are told; the broker's hello is answered as Kafka's
    // refusal of an unknown API (which the broker's client recognises).
    let http = answer(kafka, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n");
    assert!(http.starts_with("HTTP/1.1 400 Bad Request\r\n"), "{http}");
    assert!(
        http.contains("This port speaks Kafka's protocol, not HTTP; the web console is served"),
        "{http}"
    );
    let redis = answer(kafka, b"*1\r\n$4\r\nPING\r\n");
    assert!(
        redis.starts_with("-ERR This port speaks Kafka's protocol"),
        "{redis}"
    );
    let native = answer(kafka, &hello(1));
    assert!(!native.is_empty(), "answered");
    // Still served: an answer to the ApiVersions (its body is no version 3's: refused).
    let mut stream = TcpStream::connect(kafka).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    stream.write_all(&api_versions).unwrap();
    let mut length = [0; 4];
    stream.read_exact(&mut length).unwrap();
    assert!(u32::from_be_bytes(length) > 0);
    server.terminate(Duration::from_secs(10));
    let log = std::fs::read_to_string(log.path()).unwrap();
    let refusals: Vec<&str> = log.lines().filter(|line| line.contains("WARN")).collect();
    for (seen, port) in [
        (
            "speaking Redis's protocol (RESP): this port speaks the broker's own",
            2,
        ),
        (
            "speaking Kafka's protocol: this port speaks the broker's own",
            1,
        ),
        ("speaking HTTP on the Kafka listener", 1),
        ("speaking Redis's protocol (RESP) on the Kafka listener", 1),
        (
            "speaking the broker's own protocol on the Kafka listener",
            1,
        ),
    ] {
        assert_eq!(
            refusals.iter().filter(|line| line.contains(seen)).count(),
            port,
            "{seen} in\n{log}"
        );
    }
    assert_eq!(refusals.len(), 6, "one line per refused connection:\n{log}");
}
