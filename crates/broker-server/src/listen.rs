//! `--listen` addresses: `:PORT` for every interface, `HOST:PORT`, `[IPv6]:PORT`.

use std::net::SocketAddr;

use tokio::net::lookup_host;

use crate::ServerError;

/// Rewrites a listen address into the `HOST:PORT` form the resolver takes: `:9092` becomes
/// `0.0.0.0:9092`; anything else must already have a host and a numeric port.
///
/// # Errors
/// [`ServerError::InvalidAddress`] when the port is missing or not a number 0 to 65535, or the
/// host is empty or an unbracketed IPv6 address.
pub fn normalize_listen_addr(address: &str) -> Result<String, ServerError> {
    let invalid = |reason: &str| ServerError::InvalidAddress {
        address: address.to_owned(),
        reason: reason.to_owned(),
    };
    let (host, port) = address
        .rsplit_once(':')
        .ok_or_else(|| invalid("expected HOST:PORT or :PORT"))?;
    port.parse::<u16>()
        .map_err(|_| invalid("the port must be a number from 0 to 65535"))?;
    if host.is_empty() {
        return Ok(format!("0.0.0.0:{port}"));
    }
    if host.contains(':') && !(host.starts_with('[') && host.ends_with(']')) {
        return Err(invalid("write IPv6 addresses in brackets, as [::1]:9092"));
    }
    if host == "[]" {
        return Err(invalid("empty IPv6 address"));
    }
    Ok(format!("{host}:{port}"))
}

/// [`normalize_listen_addr`], then resolves host names; returns every address found.
///
/// # Errors
/// [`ServerError::InvalidAddress`] when the address is malformed or resolves to nothing.
pub async fn resolve_listen_addr(address: &str) -> Result<Vec<SocketAddr>, ServerError> {
    let normalized = normalize_listen_addr(address)?;
    let invalid = |reason: String| ServerError::InvalidAddress {
        address: address.to_owned(),
        reason,
    };
    let found: Vec<SocketAddr> = lookup_host(normalized.as_str())
        .await
        .map_err(|error| invalid(error.to_string()))?
        .collect();
    if found.is_empty() {
        return Err(invalid("the host name resolves to no address".into()));
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn bare_port_means_every_interface() {
        assert_eq!(normalize_listen_addr(":9092").unwrap(), "0.0.0.0:9092");
    }

    #[test]
    fn host_and_port_pass_through() {
        for address in ["127.0.0.1:0", "[::1]:9092", "localhost:80", "0.0.0.0:65535"] {
            assert_eq!(normalize_listen_addr(address).unwrap(), address);
        }
    }

    #[test]
    fn malformed_addresses_are_refused() {
        for address in [
            "", "9092", "host:", "host:x", ":65536", "::1:9092", "[]:1", "a:-1",
        ] {
            assert!(
                matches!(
                    normalize_listen_addr(address),
                    Err(ServerError::InvalidAddress { .. })
                ),
                "{address:?}"
            );
        }
    }

    #[tokio::test]
    async fn resolves_literals_and_names() {
        let found = resolve_listen_addr(":9092").await.unwrap();
        assert_eq!(found, vec!["0.0.0.0:9092".parse().unwrap()]);
        let found = resolve_listen_addr("[::1]:7").await.unwrap();
        assert_eq!(found, vec!["[::1]:7".parse().unwrap()]);
        let found = resolve_listen_addr("localhost:0").await.unwrap();
        assert!(found.iter().all(|address| address.ip().is_loopback()));
    }
}
