//! TLS for Agora's listeners and clients, with rustls on the `ring`
//! provider (TLS 1.2 and 1.3 only).
//!
//! A process is given PEM files: its certificate chain and key
//! (`--tls-cert`, `--tls-key`) and the CA it trusts (`--tls-ca`). A
//! server with a CA asks clients for a certificate and, with
//! `--tls-require-client-cert`, refuses those without one the CA signed
//! (at the handshake). A TLS server refuses plaintext clients unless
//! `--tls-allow-plaintext` (no silent downgrade). Clients trust only the
//! CA they are given (or the server's own certificate with it) and
//! present their certificate when they have one.
//!
//! [`LocalPki`] makes a throwaway CA and certificates, for
//! `agora-local --tls` and tests.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use tokio_rustls::TlsAcceptor;

pub use rustls;

/// TLS settings of a process (its flags).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsOptions {
    /// PEM certificate chain (leaf first): turns TLS on for listeners.
    pub cert: Option<PathBuf>,
    /// PEM private key of `cert`.
    pub key: Option<PathBuf>,
    /// PEM CA certificate(s) trusted for peers.
    pub ca: Option<PathBuf>,
    /// A server refuses clients without a certificate signed by `ca`.
    pub require_client_cert: bool,
    /// A TLS server also serves plaintext clients on the same port.
    pub allow_plaintext: bool,
}

/// Why TLS cannot be set up.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file cannot be read or holds nothing usable.
    #[error("{path}: {reason}")]
    File {
        /// The file.
        path: String,
        /// What is wrong.
        reason: String,
    },
    /// The settings do not fit together, or rustls refuses them.
    #[error("TLS: {0}")]
    Config(String),
}

/// A listener's TLS: the acceptor and whether plaintext is let through.
pub struct ServerTls {
    pub(crate) acceptor: TlsAcceptor,
    pub(crate) allow_plaintext: bool,
}

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerTls")
            .field("allow_plaintext", &self.allow_plaintext)
            .finish_non_exhaustive()
    }
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn file_error(path: &Path, reason: impl std::fmt::Display) -> TlsError {
    TlsError::File {
        path: path.display().to_string(),
        reason: reason.to_string(),
    }
}

fn certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| file_error(path, e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| file_error(path, e))?;
    if certs.is_empty() {
        return Err(file_error(path, "no PEM certificate in it"));
    }
    Ok(certs)
}

fn key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| file_error(path, e))
}

fn roots(path: &Path) -> Result<Arc<RootCertStore>, TlsError> {
    let mut roots = RootCertStore::empty();
    for cert in certs(path)? {
        roots.add(cert).map_err(|e| file_error(path, e))?;
    }
    Ok(Arc::new(roots))
}

impl TlsOptions {
    /// Whether listeners speak TLS.
    pub fn enabled(&self) -> bool {
        self.cert.is_some()
    }

    /// Checks that the flags fit together.
    pub fn validate(&self) -> Result<(), String> {
        if self.cert.is_some() != self.key.is_some() {
            return Err("--tls-cert and --tls-key go together".into());
        }
        if self.require_client_cert && (self.ca.is_none() || self.cert.is_none()) {
            return Err(
                "--tls-require-client-cert needs --tls-cert, --tls-key and --tls-ca".into(),
            );
        }
        if self.allow_plaintext && self.cert.is_none() {
            return Err("--tls-allow-plaintext needs --tls-cert and --tls-key".into());
        }
        Ok(())
    }

    /// The listener side: `None` without a certificate (plaintext only).
    pub fn server(&self) -> Result<Option<Arc<ServerTls>>, TlsError> {
        self.validate().map_err(TlsError::Config)?;
        let (Some(cert), Some(key_path)) = (&self.cert, &self.key) else {
            return Ok(None);
        };
        let builder = ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::Config(e.to_string()))?;
        let builder = match &self.ca {
            Some(ca) => {
                let verifier = WebPkiClientVerifier::builder_with_provider(roots(ca)?, provider());
                let verifier = if self.require_client_cert {
                    verifier
                } else {
                    verifier.allow_unauthenticated()
                };
                builder.with_client_cert_verifier(
                    verifier
                        .build()
                        .map_err(|e| TlsError::Config(e.to_string()))?,
                )
            }
            None => builder.with_no_client_auth(),
        };
        let mut config = builder
            .with_single_cert(certs(cert)?, key(key_path)?)
            .map_err(|e| file_error(cert, format!("certificate and key do not fit: {e}")))?;
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(Some(Arc::new(ServerTls {
            acceptor: TlsAcceptor::from(Arc::new(config)),
            allow_plaintext: self.allow_plaintext,
        })))
    }

    /// The client side: `None` without a CA (plaintext); else trusting
    /// `ca` and presenting `cert` when set.
    pub fn client(&self) -> Result<Option<Arc<ClientConfig>>, TlsError> {
        self.validate().map_err(TlsError::Config)?;
        let Some(ca) = &self.ca else {
            return Ok(None);
        };
        let builder = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::Config(e.to_string()))?
            .with_root_certificates(roots(ca)?);
        let config = match (&self.cert, &self.key) {
            (Some(cert), Some(key_path)) => builder
                .with_client_auth_cert(certs(cert)?, key(key_path)?)
                .map_err(|e| file_error(cert, format!("certificate and key do not fit: {e}")))?,
            _ => builder.with_no_client_auth(),
        };
        Ok(Some(Arc::new(config)))
    }
}

/// A throwaway certificate authority: certificates it issues are trusted
/// by whoever trusts its [`LocalPki::ca_pem`].
pub struct LocalPki {
    ca: rcgen::Certificate,
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
}

/// A certificate and its key, PEM.
#[derive(Clone)]
pub struct Issued {
    /// The certificate.
    pub cert_pem: String,
    /// Its private key.
    pub key_pem: String,
}

impl LocalPki {
    /// A new CA named `name`.
    pub fn new(name: &str) -> Result<LocalPki, TlsError> {
        let err = |e: rcgen::Error| TlsError::Config(e.to_string());
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).map_err(err)?;
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        params.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::DigitalSignature,
        ];
        let key = rcgen::KeyPair::generate().map_err(err)?;
        let ca = params.self_signed(&key).map_err(err)?;
        Ok(LocalPki {
            ca,
            issuer: rcgen::Issuer::new(params, key),
        })
    }

    /// The CA certificate, PEM.
    pub fn ca_pem(&self) -> String {
        self.ca.pem()
    }

    /// A certificate for `names` (DNS names or IP addresses), good for
    /// both server and client authentication.
    pub fn issue(&self, names: &[&str]) -> Result<Issued, TlsError> {
        let err = |e: rcgen::Error| TlsError::Config(e.to_string());
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let mut params = rcgen::CertificateParams::new(names.clone()).map_err(err)?;
        if let Some(first) = names.first() {
            params
                .distinguished_name
                .push(rcgen::DnType::CommonName, first.as_str());
        }
        params.use_authority_key_identifier_extension = true;
        params.key_usages = vec![rcgen::KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![
            rcgen::ExtendedKeyUsagePurpose::ServerAuth,
            rcgen::ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let key = rcgen::KeyPair::generate().map_err(err)?;
        let cert = params.signed_by(&key, &self.issuer).map_err(err)?;
        Ok(Issued {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }

    /// Writes the CA and a certificate for `names` into `dir` as
    /// `ca.pem`, `NAME.pem` and `NAME-key.pem` (mode 0600), and returns
    /// the options that use them.
    pub fn write(&self, dir: &Path, name: &str, names: &[&str]) -> Result<TlsOptions, TlsError> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let issued = self.issue(names)?;
        std::fs::create_dir_all(dir).map_err(|e| file_error(dir, e))?;
        let ca = dir.join("ca.pem");
        std::fs::write(&ca, self.ca_pem()).map_err(|e| file_error(&ca, e))?;
        let cert = dir.join(format!("{name}.pem"));
        std::fs::write(&cert, &issued.cert_pem).map_err(|e| file_error(&cert, e))?;
        let key = dir.join(format!("{name}-key.pem"));
        std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&key)
            .and_then(|mut f| f.write_all(issued.key_pem.as_bytes()))
            .map_err(|e| file_error(&key, e))?;
        Ok(TlsOptions {
            cert: Some(cert),
            key: Some(key),
            ca: Some(ca),
            ..TlsOptions::default()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_must_fit_together() {
        let with = |f: fn(&mut TlsOptions)| {
            let mut o = TlsOptions::default();
            f(&mut o);
            o.validate()
        };
        assert!(with(|_| {}).is_ok());
        assert!(with(|o| o.cert = Some("c".into())).is_err());
        assert!(with(|o| o.require_client_cert = true).is_err());
        assert!(with(|o| o.allow_plaintext = true).is_err());
    }

    #[test]
    fn a_local_pki_makes_server_and_client_configs() {
        let dir = tempfile::tempdir().unwrap();
        let pki = LocalPki::new("test CA").unwrap();
        let mut options = pki
            .write(dir.path(), "server", &["localhost", "127.0.0.1"])
            .unwrap();
        assert!(options.server().unwrap().is_some());
        assert!(options.client().unwrap().is_some());
        options.require_client_cert = true;
        assert!(options.server().unwrap().is_some());
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(options.key.as_ref().unwrap())
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        // A key that is not the certificate's, or a file with no PEM.
        let other = pki.write(&dir.path().join("other"), "x", &["x"]).unwrap();
        let mismatched = TlsOptions {
            key: other.key.clone(),
            ..options.clone()
        };
        let error = mismatched.server().unwrap_err().to_string();
        assert!(error.contains("do not fit"), "{error}");
        let junk = dir.path().join("junk.pem");
        std::fs::write(&junk, "not pem").unwrap();
        let error = TlsOptions {
            ca: Some(junk),
            ..options
        }
        .server()
        .unwrap_err()
        .to_string();
        assert!(error.contains("junk.pem"), "{error}");
    }
}

/// The TLS flags every binary takes (flatten into its clap `Parser`).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct TlsFlags {
    /// PEM certificate chain: serve TLS (https://, wss://) with it, and
    /// present it as a client certificate.
    #[arg(long, env = "AGORA_TLS_CERT")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert.
    #[arg(long, env = "AGORA_TLS_KEY")]
    pub tls_key: Option<PathBuf>,
    /// PEM CA certificate trusted for peers: a client with it speaks TLS
    /// (and trusts only servers this CA signed); a server with it asks
    /// clients for a certificate.
    #[arg(long, env = "AGORA_TLS_CA")]
    pub tls_ca: Option<PathBuf>,
    /// Refuse clients without a certificate --tls-ca signed.
    #[arg(long)]
    pub tls_require_client_cert: bool,
    /// Also serve plaintext clients on the TLS port.
    #[arg(long)]
    pub tls_allow_plaintext: bool,
}

impl TlsFlags {
    /// The options these flags say.
    pub fn options(&self) -> TlsOptions {
        TlsOptions {
            cert: self.tls_cert.clone(),
            key: self.tls_key.clone(),
            ca: self.tls_ca.clone(),
            require_client_cert: self.tls_require_client_cert,
            allow_plaintext: self.tls_allow_plaintext,
        }
    }
}
