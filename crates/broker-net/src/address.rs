//! The forms an address takes: `HOST:PORT`, `[IPv6]:PORT`, `:PORT`, and (to connect) `HOST`
//! alone. Both functions return `HOST:PORT` text that a resolver takes; neither resolves.

/// The port a broker listens on when an address names none.
pub const DEFAULT_PORT: u16 = 9092;

/// Why an address was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid address {address:?}: {reason}")]
pub struct AddressError {
    /// The address as given.
    pub address: String,
    /// What is wrong with it.
    pub reason: String,
}

/// An address to listen on: `:PORT` means every interface (`0.0.0.0:PORT`); anything else must
/// be `HOST:PORT` or `[IPv6]:PORT`. Port 0 asks the system for a free port.
///
/// # Errors
/// [`AddressError`] when the port is missing or not a number 0 to 65535, or the host is empty
/// or an unbracketed IPv6 address.
pub fn listen_address(address: &str) -> Result<String, AddressError> {
    let (host, port) =
        split(address)?.ok_or_else(|| refuse(address, "expected HOST:PORT or :PORT"))?;
    Ok(match host {
        "" => format!("0.0.0.0:{port}"),
        host => format!("{host}:{port}"),
    })
}

/// An address to connect to: `:PORT` means this machine (`127.0.0.1:PORT`, as a server started
/// with `--listen :PORT` is reached from it), a host alone (`broker`, `10.0.0.7`, `::1`) gets
/// [`DEFAULT_PORT`], and `HOST:PORT` or `[IPv6]:PORT` are taken as they are. Surrounding spaces
/// are ignored.
///
/// # Errors
/// [`AddressError`] when the address is empty or its port is not a number 0 to 65535.
pub fn connect_address(address: &str) -> Result<String, AddressError> {
    let trimmed = address.trim();
    if trimmed.is_empty() {
        return Err(refuse(
            address,
            "an address is HOST:PORT, [IPv6]:PORT, :PORT or HOST",
        ));
    }
    if trimmed.starts_with('[') && trimmed.ends_with(']') && trimmed.len() > 2 {
        return Ok(format!("{trimmed}:{DEFAULT_PORT}"));
    }
    match split(trimmed) {
        Ok(Some(("", port))) => Ok(format!("127.0.0.1:{port}")),
        Ok(Some((host, port))) => Ok(format!("{host}:{port}")),
        Ok(None) => Ok(format!("{trimmed}:{DEFAULT_PORT}")),
        // Several colons and no brackets: an IPv6 address alone.
        Err(_) if trimmed.parse::<std::net::Ipv6Addr>().is_ok() => {
            Ok(format!("[{trimmed}]:{DEFAULT_PORT}"))
        }
        Err(error) => Err(AddressError {
            address: address.to_owned(),
            reason: error.reason,
        }),
    }
}

/// A list of addresses separated by commas (the nodes of a cluster: `a:9092,b:9092`), each
/// completed as [`connect_address`] does; a single address is a list of one.
///
/// # Errors
/// The first address that [`connect_address`] refuses, or an empty list.
pub fn connect_addresses(list: &str) -> Result<String, AddressError> {
    let addresses = list
        .split(',')
        .map(str::trim)
        .filter(|address| !address.is_empty())
        .map(connect_address)
        .collect::<Result<Vec<_>, _>>()?;
    if addresses.is_empty() {
        return Err(refuse(
            list,
            "an address is HOST:PORT, [IPv6]:PORT, :PORT or HOST (several separated by commas)",
        ));
    }
    Ok(addresses.join(","))
}

/// The host part of a `HOST:PORT` or `[IPv6]:PORT` address (`"::1"` for `"[::1]:9092"`), or
/// `None` when there is none: the name TLS verifies the server's certificate against.
pub fn host_of(address: &str) -> Option<&str> {
    let (host, _port) = address.rsplit_once(':')?;
    let host = host
        .strip_prefix('[')
        .and_then(|host| host.strip_suffix(']'))
        .unwrap_or(host);
    (!host.is_empty()).then_some(host)
}

/// Splits `HOST:PORT` (the host possibly empty or bracketed); `None` when there is no colon.
fn split(address: &str) -> Result<Option<(&str, u16)>, AddressError> {
    let Some((host, port)) = address.rsplit_once(':') else {
        return Ok(None);
    };
    let port: u16 = port
        .parse()
        .map_err(|_| refuse(address, "the port must be a number from 0 to 65535"))?;
    if host.contains(':') && !(host.starts_with('[') && host.ends_with(']')) {
        return Err(refuse(
            address,
            "write IPv6 addresses in brackets, as [::1]:9092",
        ));
    }
    if host == "[]" {
        return Err(refuse(address, "empty IPv6 address"));
    }
    Ok(Some((host, port)))
}

fn refuse(address: &str, reason: &str) -> AddressError {
    AddressError {
        address: address.to_owned(),
        reason: reason.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn lists_of_addresses_complete_each_one() {
        assert_eq!(connect_addresses("a:1").unwrap(), "a:1");
        assert_eq!(
            connect_addresses(" a:1, :2 ,b").unwrap(),
            "a:1,127.0.0.1:2,b:9092"
        );
        assert!(connect_addresses(" , ").is_err());
        assert!(connect_addresses("a:1,b:x").is_err());
    }

    #[test]
    fn a_bare_port_listens_on_every_interface() {
        assert_eq!(listen_address(":9092").unwrap(), "0.0.0.0:9092");
    }

    #[test]
    fn listen_hosts_and_ports_pass_through() {
        for address in ["127.0.0.1:0", "[::1]:9092", "localhost:80", "0.0.0.0:65535"] {
            assert_eq!(listen_address(address).unwrap(), address);
        }
    }

    #[test]
    fn malformed_listen_addresses_are_refused() {
        for address in [
            "", "9092", "host", "host:", "host:x", ":65536", "::1:9092", "[]:1", "a:-1",
        ] {
            assert!(listen_address(address).is_err(), "{address:?}");
        }
    }

    #[test]
    fn connect_addresses_are_completed_like_listen_addresses() {
        for (given, completed) in [
            (":9092", "127.0.0.1:9092"),
            (" :7 ", "127.0.0.1:7"),
            ("broker", "broker:9092"),
            ("10.0.0.7", "10.0.0.7:9092"),
            ("::1", "[::1]:9092"),
            ("[::1]", "[::1]:9092"),
            ("[::1]:7", "[::1]:7"),
            ("broker.internal:7", "broker.internal:7"),
        ] {
            assert_eq!(connect_address(given).unwrap(), completed, "{given:?}");
        }
    }

    #[test]
    fn malformed_connect_addresses_are_refused() {
        for address in ["", "  ", "host:x", "host:70000", "::1:zz", "[]:1"] {
            assert!(connect_address(address).is_err(), "{address:?}");
        }
    }

    #[test]
    fn the_host_is_the_part_before_the_port() {
        assert_eq!(host_of("broker.example:9092"), Some("broker.example"));
        assert_eq!(host_of("127.0.0.1:1"), Some("127.0.0.1"));
        assert_eq!(host_of("[::1]:9092"), Some("::1"));
        assert_eq!(host_of("no-port"), None);
        assert_eq!(host_of(":9092"), None);
    }
}
