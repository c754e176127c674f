//! A minimal HTTP client for the tests of the metrics endpoint and the console (one request
//! per connection), and a reader of the samples of the metrics pages.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// `GET path` over HTTP/1.1 with `accept` as the Accept header (none if empty): the status
/// line, the headers and the body.
pub fn get(addr: SocketAddr, path: &str, accept: &str) -> (String, String, String) {
    let accept = [("Accept", accept)];
    let headers = if accept[0].1.is_empty() {
        &[][..]
    } else {
        &accept[..]
    };
    request(addr, "GET", path, headers, "")
}

/// `method path` over HTTP/1.1 with `headers` (and `Host: addr` unless they name a host) and
/// `body`: the status line, the headers (in lower case) and the body.
pub fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (String, String, String) {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    // Addressed to `addr` unless `headers` name another host.
    let host = match headers
        .iter()
        .any(|(name, _)| name.eq_ignore_ascii_case("host"))
    {
        true => String::new(),
        false => format!("Host: {addr}\r\n"),
    };
    let headers: String = headers
        .iter()
        .map(|(name, value)| format!("{name}: {value}\r\n"))
        .collect();
    let length = if body.is_empty() {
        String::new()
    } else {
        format!("Content-Length: {}\r\n", body.len())
    };
    // In one write: a server that answers from a request's first bytes (the broker's port
    // telling an HTTP client where the metrics are) closes without reading more, and a write
    // after that fails (`write!` would write the pieces one by one). Its answer still counts.
    let request = format!(
        "{method} {path} HTTP/1.1\r\n{host}Connection: close\r\n{headers}{length}\r\n{body}"
    );
    let written = stream.write_all(request.as_bytes());
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    let (head, body) = answer
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("no HTTP answer ({written:?}): {answer:?}"));
    let (status, headers) = head.split_once("\r\n").unwrap_or((head, ""));
    (status.to_owned(), headers.to_lowercase(), body.to_owned())
}

/// The value of the sample `series` (its name, and its labels as written) in a metrics page.
///
/// # Panics
/// If the page has no such sample, showing the page.
pub fn sample(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("no sample {series} in\n{text}"))
        .parse()
        .unwrap()
}
