//! Certificates made at test time with rcgen: a certificate authority and a server
//! certificate it signed, as PEM text and as files in a temporary directory (removed on drop).

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};

/// A CA and a server certificate signed by it, with their files.
pub struct TestPki {
    /// The CA certificate, PEM.
    pub ca_pem: String,
    /// The server's certificate, PEM.
    pub cert_pem: String,
    /// The server's private key, PEM (PKCS#8).
    pub key_pem: String,
    /// `ca_pem` as a file.
    pub ca_file: PathBuf,
    /// `cert_pem` as a file.
    pub cert_file: PathBuf,
    /// `key_pem` as a file.
    pub key_file: PathBuf,
    dir: PathBuf,
}

impl TestPki {
    /// A fresh CA, and a server certificate for `names` (DNS names or IP addresses).
    pub fn new(names: &[&str]) -> TestPki {
        let ca_key = KeyPair::generate().unwrap();
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        // OpenSSL (librdkafka, in the Kafka listener's tests) refuses a CA without a name.
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "broker test CA");
        let ca_cert = ca_params.self_signed(&ca_key).unwrap();
        let issuer = Issuer::new(ca_params, ca_key);
        let server_key = KeyPair::generate().unwrap();
        let names: Vec<String> = names.iter().map(|name| (*name).to_owned()).collect();
        let server_cert = CertificateParams::new(names)
            .unwrap()
            .signed_by(&server_key, &issuer)
            .unwrap();

        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "broker-test-pki-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let pki = TestPki {
            ca_pem: ca_cert.pem(),
            cert_pem: server_cert.pem(),
            key_pem: server_key.serialize_pem(),
            ca_file: dir.join("ca.pem"),
            cert_file: dir.join("server.pem"),
            key_file: dir.join("server.key"),
            dir,
        };
        std::fs::write(&pki.ca_file, &pki.ca_pem).unwrap();
        std::fs::write(&pki.cert_file, &pki.cert_pem).unwrap();
        std::fs::write(&pki.key_file, &pki.key_pem).unwrap();
        pki
    }

    /// A path in this PKI's directory for a test's own file.
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }
}

impl Drop for TestPki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
