//! A minimal HTTP client for the tests of the metrics endpoint: one request per connection.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// `GET path` over HTTP/1.1 with `accept` as the Accept header (none if empty): the status
/// line, the headers and the body.
pub fn get(addr: SocketAddr, path: &str, accept: &str) -> (String, String, String) {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let accept = if accept.is_empty() {
        String::new()
    } else {
        format!("Accept: {accept}\r\n")
    };
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: broker\r\nConnection: close\r\n{accept}\r\n"
    )
    .unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    let (head, body) = answer.split_once("\r\n\r\n").unwrap();
    let (status, headers) = head.split_once("\r\n").unwrap_or((head, ""));
    (status.to_owned(), headers.to_lowercase(), body.to_owned())
}
