//! Recognising a TCP connection that is connected to itself.
//!
//! Connecting to a port of this host that nothing listens on can open a connection from that
//! same port to itself: the kernel picks the connecting end's port from the ephemeral range,
//! where servers started on port 0 listen too, and a connection whose two ends are one socket
//! completes as a "simultaneous open". It answers every request with the request itself, and
//! while it lasts it holds the port, so a server restarting there cannot listen. A client that
//! reconnects to a stopped server, or a node that reconnects to a stopped peer, must close such a
//! connection at once and count the attempt as refused.

use std::io;
use std::net::SocketAddr;

/// `Ok` unless a connection whose own end is `local` and whose other end is `peer` is connected
/// to itself; then a `ConnectionRefused` error saying that nothing listens on `peer`, so that the
/// caller drops the connection and tries again later, as after any refused attempt.
///
/// # Errors
/// `ConnectionRefused` when `local` and `peer` are one address.
pub fn refuse_self_connection(local: SocketAddr, peer: SocketAddr) -> io::Result<()> {
    if local == peer {
        return Err(io::Error::new(
            io::ErrorKind::ConnectionRefused,
            format!("nothing listens on {peer}: the connection reached its own port"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::io::{Read, Write};
    use std::net::TcpStream;

    use socket2::{Domain, Socket, Type};

    /// A socket bound to a free port of 127.0.0.1 and connected to that same address: what a
    /// reconnect meets when the kernel gives it the port of the server it reconnects to.
    fn connected_to_itself() -> TcpStream {
        let socket = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
        socket
            .bind(&SocketAddr::from(([127, 0, 0, 1], 0)).into())
            .unwrap();
        let own = socket.local_addr().unwrap();
        socket.connect(&own).unwrap();
        socket.into()
    }

    #[test]
    fn a_connection_to_itself_is_refused_and_says_where_nothing_listens() {
        let mut stream = connected_to_itself();
        let (local, peer) = (stream.local_addr().unwrap(), stream.peer_addr().unwrap());
        // It is a working connection, answering each request with the request itself.
        stream.write_all(b"hello").unwrap();
        let mut echoed = [0; 5];
        stream.read_exact(&mut echoed).unwrap();
        assert_eq!(&echoed, b"hello");

        let refused = refuse_self_connection(local, peer).unwrap_err();
        assert_eq!(refused.kind(), io::ErrorKind::ConnectionRefused);
        assert!(refused.to_string().contains(&peer.to_string()), "{refused}");
    }

    #[test]
    fn a_connection_to_a_listening_server_is_kept() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let stream = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (local, peer) = (stream.local_addr().unwrap(), stream.peer_addr().unwrap());
        assert!(refuse_self_connection(local, peer).is_ok());
    }
}
