//! Recognising another protocol where one of the broker's was expected: a `curl` or a
//! `redis-cli` at the broker's port, a Kafka client at the broker's port, or a broker client at
//! the metrics port. Each is an easy mistake once a server listens on several ports, and a frame
//! length read from `"GET "` or `"*1\r\n"` helps nobody: the peer is told, and the log says what
//! was seen.

/// The first four bytes of the HTTP requests and responses a broker may meet.
const HTTP_STARTS: [&[u8; 4]; 8] = [
    b"GET ", b"HEAD", b"POST", b"PUT ", b"DELE", b"OPTI", b"PATC", b"HTTP",
];

/// The inline commands of Redis's protocol a probe sends without an array (`PING` typed into
/// `nc`, a health check).
const RESP_INLINE: [&[u8; 4]; 4] = [b"PING", b"ping", b"INFO", b"info"];

/// The APIs a Kafka client asks first on a new connection: ApiVersions, Metadata (older
/// clients), SaslHandshake.
const KAFKA_FIRST_APIS: [i16; 3] = [18, 3, 17];

/// The newest version of those APIs a Kafka client may ask for, with room for later ones.
const KAFKA_NEWEST_VERSION: i16 = 20;

/// A protocol a peer spoke that is not the one its port serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Foreign {
    /// An HTTP request or response.
    Http,
    /// Redis's protocol (RESP): an array of commands, or an inline `PING`.
    Redis,
    /// A Kafka request.
    Kafka,
    /// The broker's own protocol: its hello.
    Broker,
}

impl Foreign {
    /// The protocol's name, for logs and messages.
    pub fn name(self) -> &'static str {
        match self {
            Foreign::Http => "HTTP",
            Foreign::Redis => "Redis's protocol (RESP)",
            Foreign::Kafka => "Kafka's protocol",
            Foreign::Broker => "the broker's own protocol",
        }
    }

    /// Where a client speaking this protocol goes instead, for the log and the refusal.
    pub fn where_to_go(self) -> &'static str {
        match self {
            Foreign::Http => {
                "the web console is served over HTTP on the port given to --console-listen, and \
                 metrics on the one given to --metrics-listen"
            }
            Foreign::Redis => {
                "this is no Redis server: the broker's command and client connect to the port \
                 given to --listen"
            }
            Foreign::Kafka => "Kafka's clients connect to the port given to --kafka-listen",
            Foreign::Broker => "the broker's clients connect to the port given to --listen",
        }
    }

    /// The protocol whose message `first` (at least the first four bytes a peer sent) starts,
    /// when those bytes cannot start a length-prefixed frame of the broker or of Kafka (no frame
    /// is that long): HTTP or Redis's protocol.
    pub fn from_start(first: &[u8]) -> Option<Foreign> {
        let start = first.get(..4)?;
        if HTTP_STARTS.iter().any(|http| start == &http[..]) {
            return Some(Foreign::Http);
        }
        let array = start[0] == b'*' && start[1].is_ascii_digit();
        if array || RESP_INLINE.iter().any(|inline| start == &inline[..]) {
            return Some(Foreign::Redis);
        }
        None
    }

    /// [`Foreign::from_start`] for the big-endian `u32` `length` a frame's first four bytes
    /// were read as.
    pub fn from_length(length: u64) -> Option<Foreign> {
        u32::try_from(length)
            .ok()
            .and_then(|length| Foreign::from_start(&length.to_be_bytes()))
    }

    /// The protocol of a frame whose body starts with `body` (at least its first eight bytes,
    /// after the length): a Kafka request's header (API key, version and correlation id) of an
    /// API a client asks first, or the broker's hello (its magic, `BRKR`).
    pub fn from_body(body: &[u8]) -> Option<Foreign> {
        let header = body.get(..8)?;
        if header.starts_with(b"BRKR") {
            return Some(Foreign::Broker);
        }
        let api = i16::from_be_bytes([header[0], header[1]]);
        let version = i16::from_be_bytes([header[2], header[3]]);
        (KAFKA_FIRST_APIS.contains(&api) && (0..=KAFKA_NEWEST_VERSION).contains(&version))
            .then_some(Foreign::Kafka)
    }

    /// What a peer speaking this protocol is told before its connection closes, so that `curl`
    /// or `redis-cli` shows `text` (an HTTP 400 response, a Redis error); `None` for the
    /// binary protocols, whose clients would misread anything but their own answers.
    pub fn refusal(self, text: &str) -> Option<Vec<u8>> {
        match self {
            Foreign::Http => Some(
                format!(
                    "HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain\r\nConnection: \
                     close\r\nContent-Length: {}\r\n\r\n{text}\n",
                    text.len() + 1
                )
                .into_bytes(),
            ),
            Foreign::Redis => Some(format!("-ERR {text}\r\n").into_bytes()),
            Foreign::Kafka | Foreign::Broker => None,
        }
    }
}

/// Whether `first` (at least the first four bytes a peer sent) starts an HTTP request or
/// response rather than a frame of the broker's protocol (no frame is that long).
pub fn looks_like_http(first: &[u8]) -> bool {
    Foreign::from_start(first) == Some(Foreign::Http)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http_is_recognised_from_its_first_bytes_or_from_the_length_they_make() {
        assert!(looks_like_http(b"GET /metrics HTTP/1.1\r\n"));
        assert!(looks_like_http(b"HTTP/1.1 400 Bad Request\r\n"));
        assert!(!looks_like_http(b"GE"));
        assert!(!looks_like_http(&[0, 0, 0, 42, 1, 2]));
        assert_eq!(Foreign::from_length(1_195_725_856), Some(Foreign::Http)); // "GET "
        assert_eq!(Foreign::from_length(1_213_486_160), Some(Foreign::Http)); // "HTTP"
        assert_eq!(Foreign::from_length(42), None);
        assert_eq!(Foreign::from_length(u64::MAX), None);
    }

    #[test]
    fn redis_is_recognised_from_a_command_array_or_an_inline_ping() {
        // redis-cli's PING: an array of one bulk string.
        assert_eq!(
            Foreign::from_start(b"*1\r\n$4\r\nPING\r\n"),
            Some(Foreign::Redis)
        );
        assert_eq!(Foreign::from_start(b"PING\r\n"), Some(Foreign::Redis));
        assert_eq!(
            Foreign::from_length(u64::from(u32::from_be_bytes(*b"*3\r\n"))),
            Some(Foreign::Redis)
        );
        assert_eq!(Foreign::from_start(b"*x\r\n"), None);
    }

    #[test]
    fn a_kafka_request_header_or_the_brokers_hello_is_recognised_from_a_body() {
        // ApiVersions version 3, correlation id 1.
        assert_eq!(
            Foreign::from_body(&[0, 18, 0, 3, 0, 0, 0, 1, 0, 7]),
            Some(Foreign::Kafka)
        );
        // Metadata version 0.
        assert_eq!(
            Foreign::from_body(&[0, 3, 0, 0, 0, 0, 0, 1]),
            Some(Foreign::Kafka)
        );
        // Produce is no first request; a version past any Kafka's is no Kafka.
        assert_eq!(Foreign::from_body(&[0, 0, 0, 3, 0, 0, 0, 1]), None);
        assert_eq!(Foreign::from_body(&[0, 18, 1, 0, 0, 0, 0, 1]), None);
        assert_eq!(
            Foreign::from_body(b"BRKR\x07\x00\x03cli"),
            Some(Foreign::Broker)
        );
        assert_eq!(Foreign::from_body(&[0, 18]), None);
    }

    #[test]
    fn http_and_redis_peers_are_told_in_their_own_protocol() {
        let http = String::from_utf8(Foreign::Http.refusal("not here").unwrap()).unwrap();
        assert!(http.starts_with("HTTP/1.1 400 Bad Request\r\n"), "{http}");
        assert!(
            http.ends_with("Content-Length: 9\r\n\r\nnot here\n"),
            "{http}"
        );
        assert_eq!(
            Foreign::Redis.refusal("not here").unwrap(),
            b"-ERR not here\r\n"
        );
        assert_eq!(Foreign::Kafka.refusal("not here"), None);
    }
}
