//! TLS for the client: which certificate authorities vouch for servers, and which name the
//! server's certificate must carry.

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;

use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, ServerName};
use tokio_rustls::rustls::{self, ClientConfig, RootCertStore};
use tokio_rustls::TlsConnector;

use crate::Error;

/// Where the client's trust in servers comes from, as the builder was told.
#[derive(Clone)]
pub(crate) enum TlsTrust {
    /// A PEM file of CA certificates, read when the client connects.
    CaFile(PathBuf),
    /// A complete rustls configuration given by the caller.
    Config(Arc<ClientConfig>),
}

impl fmt::Debug for TlsTrust {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TlsTrust::CaFile(path) => f.debug_tuple("CaFile").field(path).finish(),
            TlsTrust::Config(_) => f.write_str("Config(..)"),
        }
    }
}

/// A ready TLS set-up: the connector, and the server name every handshake verifies.
#[derive(Clone)]
pub(crate) struct Tls {
    connector: TlsConnector,
    server_name: ServerName<'static>,
}

impl Tls {
    /// Loads `trust` and checks `server_name` (a DNS name or an IP address).
    pub(crate) fn new(trust: &TlsTrust, server_name: &str) -> Result<Tls, Error> {
        let config =
            match trust {
                TlsTrust::Config(config) => Arc::clone(config),
                TlsTrust::CaFile(path) => {
                    let pem = std::fs::read(path).map_err(|error| {
                        Error::Tls(format!(
                            "cannot read the CA file {}: {error}",
                            path.display()
                        ))
                    })?;
                    Arc::new(config_from_ca_pem(&pem).map_err(|why| {
                        Error::Tls(format!("bad CA file {}: {why}", path.display()))
                    })?)
                }
            };
        let server_name = ServerName::try_from(server_name.to_owned()).map_err(|_| {
            Error::Tls(format!(
                "{server_name:?} is not a valid server name for TLS"
            ))
        })?;
        Ok(Tls {
            connector: TlsConnector::from(config),
            server_name,
        })
    }

    /// Runs the client side of the handshake on `stream`, verifying the server's certificate
    /// against the trusted CAs and the server name.
    pub(crate) async fn connect(&self, stream: TcpStream) -> Result<TlsStream<TcpStream>, Error> {
        self.connector
            .connect(self.server_name.clone(), stream)
            .await
            .map_err(|error| {
                let refused = error
                    .get_ref()
                    .and_then(|inner| inner.downcast_ref::<rustls::Error>());
                let Some(refused) = refused else {
                    // The connection failed under the handshake (reset, closed, timed out), as
                    // it may before any handshake: as passing as over plain TCP.
                    return Error::Io(error);
                };
                let hint = certificate_hint(refused)
                    .map(|hint| format!(" ({hint})"))
                    .unwrap_or_default();
                Error::Tls(format!(
                    "handshake with {} failed: {error}{hint}",
                    self.server_name.to_str()
                ))
            })
    }
}

/// What to do about a server certificate the client refused, for the refusals a first TLS
/// set-up commonly meets.
fn certificate_hint(error: &rustls::Error) -> Option<&'static str> {
    use rustls::CertificateError;
    let rustls::Error::InvalidCertificate(refused) = error else {
        return None;
    };
    match refused {
        // A signature that does not check: an authority of the same name, another key.
        CertificateError::UnknownIssuer | CertificateError::BadSignature => Some(
            "the server's certificate is not verifiably signed by a certificate authority in \
             the trusted CA file",
        ),
        CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. } => {
            Some(
                "the server's certificate does not carry the name connected to: connect by a \
                 name it carries, or give that name as the TLS server name",
            )
        }
        CertificateError::Expired | CertificateError::ExpiredContext { .. } => {
            Some("the server's certificate has expired")
        }
        CertificateError::Other(other) if other.to_string().contains("CaUsedAsEndEntity") => Some(
            "the server presents a certificate authority's own certificate (CA:TRUE): \
                 give the server a certificate that authority signed, and its clients the \
                 authority's",
        ),
        _ => None,
    }
}

impl fmt::Debug for Tls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tls")
            .field("server_name", &self.server_name)
            .finish_non_exhaustive()
    }
}

/// A client configuration trusting exactly the CA certificates in `pem` (TLS 1.2 and 1.3, the
/// `ring` provider, no client certificate).
fn config_from_ca_pem(pem: &[u8]) -> Result<ClientConfig, String> {
    let mut roots = RootCertStore::empty();
    for certificate in CertificateDer::pem_slice_iter(pem) {
        let certificate = certificate.map_err(|error| error.to_string())?;
        roots.add(certificate).map_err(|error| error.to_string())?;
    }
    if roots.is_empty() {
        return Err("no certificate in it".to_owned());
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    Ok(ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|error| error.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth())
}
