//! TLS server configs from PEM files, for every listener that offers TLS (MQTT, WebSocket,
//! Kafka): rustls with the `ring` provider, no OpenSSL.

use std::path::Path;
use std::sync::Arc;

use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::{self, ServerConfig};

/// A certificate or key that cannot be used; `key` is the config key to name.
#[derive(Debug)]
pub struct TlsError {
    pub key: String,
    pub detail: String,
}

impl std::fmt::Display for TlsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.key, self.detail)
    }
}

impl std::error::Error for TlsError {}

/// A TLS server config from PEM files: a certificate chain (leaf first) and a private key
/// (PKCS#8, PKCS#1 or SEC1). `table` is the config table, for error messages.
pub fn acceptor(table: &str, cert_file: &Path, key_file: &Path) -> Result<TlsAcceptor, TlsError> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let err = |field: &str, detail: String| TlsError { key: format!("{table}.{field}"), detail };
    let certs = CertificateDer::pem_file_iter(cert_file)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|e| err("cert_file", format!("{}: {e}", cert_file.display())))?;
    if certs.is_empty() {
        return Err(err("cert_file", format!("{}: no CERTIFICATE in the file", cert_file.display())));
    }
    let private_key =
        PrivateKeyDer::from_pem_file(key_file).map_err(|e| err("key_file", format!("{}: {e}", key_file.display())))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| err("cert_file", e.to_string()))?
        .with_no_client_auth()
        .with_single_cert(certs, private_key)
        .map_err(|e| err("key_file", format!("does not fit the certificate: {e}")))?;
    Ok(TlsAcceptor::from(Arc::new(config)))
}
