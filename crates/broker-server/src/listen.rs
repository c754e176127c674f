//! `--listen` addresses: `:PORT` for every interface, `HOST:PORT`, `[IPv6]:PORT` (the forms are
//! `broker_net::listen_address`'s), resolved to the socket addresses to bind.

use std::net::SocketAddr;

use tokio::net::lookup_host;

use crate::ServerError;

/// Checks a listen address's form, then resolves host names; returns every address found.
///
/// # Errors
/// [`ServerError::InvalidAddress`] when the address is malformed or resolves to nothing.
pub async fn resolve_listen_addr(address: &str) -> Result<Vec<SocketAddr>, ServerError> {
    let normalized = broker_net::listen_address(address)?;
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

    #[tokio::test]
    async fn resolves_literals_and_names() {
        let found = resolve_listen_addr(":9092").await.unwrap();
        assert_eq!(found, vec!["0.0.0.0:9092".parse().unwrap()]);
        let found = resolve_listen_addr("[::1]:7").await.unwrap();
        assert_eq!(found, vec!["[::1]:7".parse().unwrap()]);
        let found = resolve_listen_addr("localhost:0").await.unwrap();
        assert!(found.iter().all(|address| address.ip().is_loopback()));
    }

    #[tokio::test]
    async fn malformed_addresses_are_refused_before_resolving() {
        for address in ["9092", "host:x", "::1:9092"] {
            assert!(matches!(
                resolve_listen_addr(address).await,
                Err(ServerError::InvalidAddress { .. })
            ));
        }
    }
}
