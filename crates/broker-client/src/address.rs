//! [`ServerAddress`]: an address to connect to, which also knows the host name it was given
//! as, so TLS can verify the server's certificate against it.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};

use tokio::net::ToSocketAddrs;

/// Anything [`ToSocketAddrs`] accepts (`SocketAddr`, `(host, port)`, ...), and text in every form
/// the `broker` command takes: `"host:port"`, `"[::1]:9092"`, `":9092"` (this machine) and a
/// host alone (`"broker"`, port 9092). It also names the host part: the server name TLS
/// verifies unless [`crate::ClientBuilder::tls_server_name`] says otherwise.
///
/// ```no_run
/// # async fn run() -> Result<(), broker_client::Error> {
/// use broker_client::Client;
/// use std::net::SocketAddr;
///
/// let by_name = Client::connect("broker.internal:9092").await?;
/// let this_machine = Client::connect(":9092").await?;
/// let by_socket_address = Client::connect(SocketAddr::from(([127, 0, 0, 1], 9092))).await?;
/// # Ok(())
/// # }
/// ```
pub trait ServerAddress: ToSocketAddrs {
    /// The host part: `"broker.example"` for `"broker.example:9092"`, `"::1"` for
    /// `"[::1]:9092"`, `"127.0.0.1"` for `":9092"`, the IP address of a socket address; `None`
    /// when there is none.
    fn host(&self) -> Option<String>;

    /// The address as text, when it is text: the client completes it (`":9092"`, a host alone)
    /// before resolving it. `None` for addresses that are not text.
    fn as_text(&self) -> Option<&str> {
        None
    }
}

impl ServerAddress for str {
    fn host(&self) -> Option<String> {
        // A list (the nodes of a cluster) is named by its first address.
        let first = self.split(',').next().unwrap_or(self);
        let address = broker_net::connect_address(first).ok()?;
        broker_net::host_of(&address).map(str::to_owned)
    }

    fn as_text(&self) -> Option<&str> {
        Some(self)
    }
}

impl ServerAddress for String {
    fn host(&self) -> Option<String> {
        self.as_str().host()
    }

    fn as_text(&self) -> Option<&str> {
        Some(self)
    }
}

impl<T: ServerAddress + ?Sized> ServerAddress for &T {
    fn host(&self) -> Option<String> {
        (**self).host()
    }

    fn as_text(&self) -> Option<&str> {
        (**self).as_text()
    }
}

impl ServerAddress for &[SocketAddr] {
    fn host(&self) -> Option<String> {
        self.first().map(|address| address.ip().to_string())
    }
}

impl ServerAddress for (&str, u16) {
    fn host(&self) -> Option<String> {
        Some(self.0.to_owned())
    }
}

impl ServerAddress for (String, u16) {
    fn host(&self) -> Option<String> {
        Some(self.0.clone())
    }
}

/// Socket addresses and IP-and-port pairs: the host is the IP address.
macro_rules! ip_hosts {
    ($($address:ty => |$it:ident| $ip:expr;)*) => {$(
        impl ServerAddress for $address {
            fn host(&self) -> Option<String> {
                let $it = self;
                Some($ip.to_string())
            }
        }
    )*};
}

ip_hosts! {
    SocketAddr => |it| it.ip();
    SocketAddrV4 => |it| it.ip();
    SocketAddrV6 => |it| it.ip();
    (IpAddr, u16) => |it| it.0;
    (Ipv4Addr, u16) => |it| it.0;
    (Ipv6Addr, u16) => |it| it.0;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_is_the_part_before_the_port() {
        assert_eq!(
            "broker.example:9092".host().as_deref(),
            Some("broker.example")
        );
        assert_eq!("127.0.0.1:1".host().as_deref(), Some("127.0.0.1"));
        assert_eq!("[::1]:9092".host().as_deref(), Some("::1"));
        assert_eq!(
            String::from("localhost:1").host().as_deref(),
            Some("localhost")
        );
        // The forms the command line takes: a host alone, and `:PORT` for this machine.
        assert_eq!("no-port".host().as_deref(), Some("no-port"));
        assert_eq!(":9092".host().as_deref(), Some("127.0.0.1"));
        assert_eq!("".host(), None);
    }

    #[test]
    fn socket_addresses_name_their_ip() {
        let address = SocketAddr::from(([127, 0, 0, 1], 9092));
        assert_eq!(address.host().as_deref(), Some("127.0.0.1"));
        assert_eq!(("broker", 1).host().as_deref(), Some("broker"));
    }
}
