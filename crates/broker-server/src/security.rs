//! Who may come in: the shared secret a hello must carry ([`AuthToken`]) and the TLS identity
//! the server presents ([`ServerTls`]).

use std::fmt;
use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use subtle::ConstantTimeEq;
use tokio_rustls::TlsAcceptor;

use crate::ServerError;

/// The shared secret every client must present in its hello.
///
/// Its `Debug` form never shows the secret, so a configuration can be logged. Comparison takes
/// the same time whatever the presented token's bytes (only its length may show).
#[derive(Clone)]
pub struct AuthToken(String);

impl AuthToken {
    /// A token from its text, as given.
    ///
    /// # Errors
    /// [`ServerError::InvalidConfig`] if the token is empty.
    pub fn new(token: impl Into<String>) -> Result<AuthToken, ServerError> {
        let token = token.into();
        if token.is_empty() {
            return Err(ServerError::InvalidConfig("the auth token is empty".into()));
        }
        Ok(AuthToken(token))
    }

    /// The token from `file` (when given) or from the `BROKER_AUTH_TOKEN` environment variable
    /// (see `broker_net::auth_token`); `None` when neither is set.
    ///
    /// # Errors
    /// [`ServerError::Token`] when both are set, the file cannot be read, or the token is empty.
    pub fn load(file: Option<&Path>) -> Result<Option<AuthToken>, ServerError> {
        Ok(broker_net::auth_token(file)?.map(AuthToken))
    }

    /// The secret itself, for the links between the nodes of a cluster.
    pub(crate) fn secret(&self) -> &str {
        &self.0
    }

    /// Whether `presented` is the token, compared in constant time.
    pub fn matches(&self, presented: Option<&str>) -> bool {
        presented.is_some_and(|presented| bool::from(self.0.as_bytes().ct_eq(presented.as_bytes())))
    }
}

impl fmt::Debug for AuthToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("AuthToken(<redacted>)")
    }
}

/// Two configurations with tokens are equal when the tokens are (in constant time).
impl PartialEq for AuthToken {
    fn eq(&self, other: &Self) -> bool {
        self.matches(Some(&other.0))
    }
}

impl Eq for AuthToken {}

/// The server's TLS identity: a certificate chain and its private key, ready to accept
/// connections. Cheap to clone (one shared `rustls::ServerConfig`).
#[derive(Clone)]
pub struct ServerTls {
    config: Arc<rustls::ServerConfig>,
}

impl ServerTls {
    /// Uses a ready-made rustls configuration (for client certificates, ALPN, other crypto).
    pub fn new(config: Arc<rustls::ServerConfig>) -> ServerTls {
        ServerTls { config }
    }

    /// Builds the identity from PEM text: `cert_chain` holds the server's certificate first,
    /// then any intermediates; `key` holds one PKCS#8, PKCS#1 or SEC1 private key. TLS 1.2 and
    /// 1.3 with the `ring` crypto provider, no client certificates.
    ///
    /// # Errors
    /// [`ServerError::InvalidConfig`] if either holds no usable item or the key does not fit the
    /// certificate.
    pub fn from_pem(cert_chain: &[u8], key: &[u8]) -> Result<ServerTls, ServerError> {
        let invalid = |what: String| ServerError::InvalidConfig(what);
        let certs = CertificateDer::pem_slice_iter(cert_chain)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|error| invalid(format!("bad TLS certificate PEM: {error}")))?;
        if certs.is_empty() {
            return Err(invalid("no certificate in the TLS certificate PEM".into()));
        }
        let key = PrivateKeyDer::from_pem_slice(key)
            .map_err(|error| invalid(format!("bad TLS private key PEM: {error}")))?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|error| invalid(format!("TLS set-up failed: {error}")))?
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .map_err(|error| {
                invalid(format!("the TLS key does not fit the certificate: {error}"))
            })?;
        Ok(ServerTls::new(Arc::new(config)))
    }

    /// [`ServerTls::from_pem`] with the PEM read from two files.
    ///
    /// # Errors
    /// [`ServerError::InvalidConfig`] if a file cannot be read, or as [`ServerTls::from_pem`].
    pub fn from_pem_files(cert_chain: &Path, key: &Path) -> Result<ServerTls, ServerError> {
        let read = |path: &Path, what: &str| {
            std::fs::read(path).map_err(|error| {
                ServerError::InvalidConfig(format!(
                    "cannot read the TLS {what} {}: {error}",
                    path.display()
                ))
            })
        };
        ServerTls::from_pem(&read(cert_chain, "certificate")?, &read(key, "key")?).map_err(
            |error| match error {
                ServerError::InvalidConfig(why) => ServerError::InvalidConfig(format!(
                    "{why} (certificate file {}, key file {})",
                    cert_chain.display(),
                    key.display()
                )),
                other => other,
            },
        )
    }

    /// The acceptor that runs the server side of a TLS handshake.
    pub(crate) fn acceptor(&self) -> TlsAcceptor {
        TlsAcceptor::from(Arc::clone(&self.config))
    }

    /// The rustls configuration, which a cluster node's peer port serves too.
    pub(crate) fn config(&self) -> Arc<rustls::ServerConfig> {
        Arc::clone(&self.config)
    }
}

/// The client side of TLS between the nodes of a cluster: trusts the CA certificates in the
/// PEM file `ca` (TLS 1.2 and 1.3, the `ring` provider).
///
/// # Errors
/// [`ServerError::InvalidConfig`] if the file cannot be read or holds no usable certificate.
pub(crate) fn peer_client_config(ca: &Path) -> Result<Arc<rustls::ClientConfig>, ServerError> {
    let invalid = |why: String| {
        ServerError::InvalidConfig(format!("--cluster-tls-ca {}: {why}", ca.display()))
    };
    let pem = std::fs::read(ca).map_err(|error| invalid(error.to_string()))?;
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(&pem) {
        let cert = cert.map_err(|error| invalid(format!("bad PEM: {error}")))?;
        roots
            .add(cert)
            .map_err(|error| invalid(format!("unusable CA certificate: {error}")))?;
    }
    if roots.is_empty() {
        return Err(invalid("no certificate in the file".to_owned()));
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|error| invalid(format!("TLS set-up failed: {error}")))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(config))
}

impl fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServerTls").finish_non_exhaustive()
    }
}

/// Two identities are equal when they share one rustls configuration.
impl PartialEq for ServerTls {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.config, &other.config)
    }
}

impl Eq for ServerTls {}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn token_matches_only_itself() {
        let token = AuthToken::new("s3cret").unwrap();
        assert!(token.matches(Some("s3cret")));
        for wrong in [
            None,
            Some(""),
            Some("s3cre"),
            Some("s3cret "),
            Some("S3cret"),
        ] {
            assert!(!token.matches(wrong), "{wrong:?}");
        }
    }

    #[test]
    fn token_debug_hides_the_secret() {
        let token = AuthToken::new("s3cret").unwrap();
        assert!(!format!("{token:?}").contains("s3cret"));
    }

    #[test]
    fn empty_token_is_refused() {
        assert!(AuthToken::new("").is_err());
    }

    #[test]
    fn token_file_loses_its_trailing_newline() {
        let path = std::env::temp_dir().join(format!("broker-token-{}", std::process::id()));
        std::fs::write(&path, "s3cret\n").unwrap();
        let token = AuthToken::load(Some(&path)).unwrap().unwrap();
        std::fs::write(&path, "\n").unwrap();
        let empty = AuthToken::load(Some(&path));
        std::fs::remove_file(&path).unwrap();
        assert!(token.matches(Some("s3cret")));
        assert!(empty.is_err());
    }

    #[test]
    fn tls_identity_loads_from_rcgen_pem() {
        let certified = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
        let tls = ServerTls::from_pem(
            certified.cert.pem().as_bytes(),
            certified.signing_key.serialize_pem().as_bytes(),
        );
        assert!(tls.is_ok());
    }

    #[test]
    fn tls_identity_refuses_garbage_and_mismatched_keys() {
        let one = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
        let other = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
        let cert = one.cert.pem();
        assert!(ServerTls::from_pem(b"not pem", b"not pem").is_err());
        assert!(ServerTls::from_pem(cert.as_bytes(), b"").is_err());
        assert!(ServerTls::from_pem(
            cert.as_bytes(),
            other.signing_key.serialize_pem().as_bytes()
        )
        .is_err());
    }
}
