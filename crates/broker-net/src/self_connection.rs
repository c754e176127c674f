//! Recognising a TCP connection that is connected to itself, and having it reset when it is
//! closed, so that its port is free at once.
//!
//! Connecting to a port of this host that nothing listens on can open a connection from that
//! same port to itself: the kernel picks the connecting end's port from the ephemeral range,
//! where servers started on port 0 listen too, and a connection whose two ends are one socket
//! completes as a "simultaneous open". It answers every request with the request itself, and it
//! holds the port, so a server restarting there cannot listen: while it is open, and after a
//! plain close for as long as the kernel keeps a closed connection's port (TIME_WAIT, a minute
//! on Linux). A client that reconnects to a stopped server, or a node that reconnects to a
//! stopped peer, must reset such a connection at once and count the attempt as refused.

use std::io;
use std::time::Duration;

use socket2::SockRef;
use tokio::net::{TcpStream, ToSocketAddrs};

/// Opens a TCP connection to `addr`, as [`TcpStream::connect`] does, refusing (with
/// [`refuse_self_connection`]) one that reached its own port: what every client of a broker,
/// node or metrics endpoint that may be stopped should connect with.
///
/// # Errors
/// As [`TcpStream::connect`]; `ConnectionRefused` for a connection to itself.
pub async fn connect(addr: impl ToSocketAddrs) -> io::Result<TcpStream> {
    let stream = TcpStream::connect(addr).await?;
    refuse_self_connection(SockRef::from(&stream))?;
    Ok(stream)
}

/// `Ok` unless `socket` (a connected TCP socket) is connected to itself; then sets it to be
/// reset when it is closed (no lingering, no TIME_WAIT: its port is free as soon as the caller
/// drops it) and returns a `ConnectionRefused` error saying that nothing listens at its address,
/// so that the caller drops the connection and tries again later, as after any refused attempt.
///
/// # Errors
/// `ConnectionRefused` for a connection to itself; the error of reading the socket's addresses
/// or setting its linger, if that fails.
pub fn refuse_self_connection(socket: SockRef<'_>) -> io::Result<()> {
    let local = socket.local_addr()?.as_socket();
    let peer = socket.peer_addr()?.as_socket();
    let Some(peer) = peer.filter(|_| local == peer) else {
        return Ok(());
    };
    socket.set_linger(Some(Duration::ZERO))?;
    Err(io::Error::new(
        io::ErrorKind::ConnectionRefused,
        format!("nothing listens on {peer}: the connection reached its own port"),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::io::{Read, Write};
    use std::net::{SocketAddr, TcpListener, TcpStream};

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
    fn a_connection_to_itself_is_refused_and_its_port_is_free_once_dropped() {
        let mut stream = connected_to_itself();
        let addr = stream.peer_addr().unwrap();
        assert_eq!(stream.local_addr().unwrap(), addr);
        // It is a working connection, answering each request with the request itself.
        stream.write_all(b"hello").unwrap();
        let mut echoed = [0; 5];
        stream.read_exact(&mut echoed).unwrap();
        assert_eq!(&echoed, b"hello");

        let refused = refuse_self_connection(SockRef::from(&stream)).unwrap_err();
        assert_eq!(refused.kind(), io::ErrorKind::ConnectionRefused);
        assert!(refused.to_string().contains(&addr.to_string()), "{refused}");
        drop(stream);
        // A server restarting on the port can listen there at once.
        TcpListener::bind(addr).expect("the port is free once the connection is dropped");
    }

    #[test]
    fn a_connection_to_a_listening_server_is_kept() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut stream = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        assert!(refuse_self_connection(SockRef::from(&stream)).is_ok());
        let (mut accepted, _) = listener.accept().unwrap();
        stream.write_all(b"still open").unwrap();
        let mut read = [0; 10];
        accepted.read_exact(&mut read).unwrap();
        assert_eq!(&read, b"still open");
    }
}
