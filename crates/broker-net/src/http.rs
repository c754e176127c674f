//! Recognising HTTP where the broker's binary protocol was expected: a `curl` at the broker's
//! port, or a broker client at the metrics port. Both are easy mistakes once a server listens on
//! two ports, and a frame length read from `"GET "` or `"HTTP"` helps nobody.

/// The first four bytes of the HTTP requests and responses a broker may meet.
const HTTP_STARTS: [&[u8; 4]; 8] = [
    b"GET ", b"HEAD", b"POST", b"PUT ", b"DELE", b"OPTI", b"PATC", b"HTTP",
];

/// Whether `first` (at least the first four bytes a peer sent) starts an HTTP request or
/// response rather than a frame of the broker's protocol (no frame is that long).
pub fn looks_like_http(first: &[u8]) -> bool {
    first
        .get(..4)
        .is_some_and(|start| HTTP_STARTS.iter().any(|http| start == &http[..]))
}

/// Whether a frame length read as the big-endian `u32` `length` was in fact the start of an
/// HTTP request or response.
pub fn length_is_http(length: u64) -> bool {
    u32::try_from(length).is_ok_and(|length| looks_like_http(&length.to_be_bytes()))
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
        assert!(length_is_http(1_195_725_856)); // "GET "
        assert!(length_is_http(1_213_486_160)); // "HTTP"
        assert!(!length_is_http(42));
        assert!(!length_is_http(u64::MAX));
    }
}
