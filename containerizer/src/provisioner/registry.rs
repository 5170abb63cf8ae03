//! Registries: which client (verified TLS, unverified TLS, plain HTTP)
//! and which credentials each registry host gets, and the distribution
//! API's answers turned into [`Failure`]s.
//!
//! Requests go through `oci-client` (Docker registry v2 / OCI
//! distribution: token and basic auth, redirects, digest checks of
//! manifests and blobs as they stream). A host of
//! `--docker-insecure-registries` is tried over TLS without verifying
//! its certificate, then over plain HTTP (Docker's order); the scheme
//! that answered is remembered. The default registry is plain HTTP when
//! `--docker-registry` says `http://`.

use std::collections::{HashMap, HashSet};
use std::pin::Pin;
use std::sync::Mutex;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures::future::BoxFuture;
use oci_client::client::{ClientConfig, ClientProtocol};
use oci_client::errors::{OciDistributionError, OciErrorCode};
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference};
use tokio::io::AsyncWrite;

use super::credentials::Credentials;
use super::error::{chain, is_disk_full, Failure};

/// How long connecting to a registry may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a registry may send nothing in the middle of an answer.
const READ_TIMEOUT: Duration = Duration::from_secs(60);
/// Largest manifest or image config read (Docker's own limit is 4 MiB).
pub(crate) const MAX_METADATA: u64 = 8 << 20;

/// The manifest types asked for: image manifests and manifest lists,
/// Docker's and OCI's. Docker's schema 1 is not among them.
const ACCEPT: &[&str] = &[
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
];

/// The registries an agent pulls from.
pub(crate) struct Registries {
    /// `--docker-registry`'s `HOST[:PORT]`.
    default_host: String,
    /// Whether `--docker-registry` is `http://`.
    default_plain: bool,
    insecure: HashSet<String>,
    credentials: Credentials,
    verified: Client,
    unverified: Client,
    plain: Client,
    /// The scheme each insecure host answered on.
    found: Mutex<HashMap<String, Scheme>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scheme {
    Verified,
    Unverified,
    Plain,
}

/// An [`AsyncWrite`] that refuses more bytes than a blob's descriptor
/// gives (a registry cannot fill the disk or memory with an endless
/// answer).
pub(crate) struct Limited<W> {
    inner: W,
    left: u64,
    what: &'static str,
}

// === impl Registries ===

impl Registries {
    /// Clients for `default_url` (`http[s]://HOST[:PORT][/]`) and the
    /// insecure hosts; the error names what is wrong.
    pub fn new(
        default_url: &str,
        insecure: &[String],
        credentials: Credentials,
    ) -> Result<Registries, String> {
        let (default_plain, rest) = if let Some(rest) = default_url.strip_prefix("http://") {
            (true, rest)
        } else if let Some(rest) = default_url.strip_prefix("https://") {
            (false, rest)
        } else {
            return Err(format!("{default_url:?} is not an http:// or https:// URL"));
        };
        let default_host = rest.strip_suffix('/').unwrap_or(rest);
        if default_host.is_empty() || default_host.contains('/') {
            return Err(format!(
                "{default_url:?}: give the registry's scheme and HOST[:PORT] only (no path)"
            ));
        }
        let client = |protocol: ClientProtocol, unverified: bool| {
            Client::try_from(ClientConfig {
                protocol,
                accept_invalid_certificates: unverified,
                connect_timeout: Some(CONNECT_TIMEOUT),
                read_timeout: Some(READ_TIMEOUT),
                user_agent: concat!("agora-containerizer/", env!("CARGO_PKG_VERSION")),
                // Manifest lists are resolved here, for the agent's platform.
                platform_resolver: None,
                ..ClientConfig::default()
            })
            .map_err(|e| format!("cannot make a registry client: {}", chain(&e)))
        };
        Ok(Registries {
            default_host: default_host.to_string(),
            default_plain,
            insecure: insecure.iter().cloned().collect(),
            credentials,
            verified: client(ClientProtocol::Https, false)?,
            unverified: client(ClientProtocol::Https, true)?,
            plain: client(ClientProtocol::Http, false)?,
            found: Mutex::new(HashMap::new()),
        })
    }

    /// `--docker-registry`'s `HOST[:PORT]`.
    pub fn default_host(&self) -> &str {
        &self.default_host
    }

    /// The manifest (or manifest list) `reference` names, and its digest
    /// (checked against the reference's digest and the registry's
    /// `Docker-Content-Digest`).
    pub async fn manifest(&self, reference: &Reference) -> Result<(Bytes, String), Failure> {
        let host = reference.registry().to_string();
        let auth = self.credentials.for_host(&host);
        self.attempt(&host, &auth, |client| {
            let auth = auth.clone();
            Box::pin(async move { client.pull_manifest_raw(reference, &auth, ACCEPT).await })
        })
        .await
    }

    /// Streams blob `digest` of `reference`'s repository into `out`,
    /// failing if it does not hash to `digest`.
    pub async fn blob<W>(&self, reference: &Reference, digest: &str, out: W) -> Result<(), Failure>
    where
        W: AsyncWrite + Send,
    {
        let host = reference.registry().to_string();
        let auth = self.credentials.for_host(&host);
        if self.schemes(&host).len() > 1 {
            // `out` can be streamed into once: find the scheme first.
            self.attempt(&host, &auth, |client| {
                let auth = auth.clone();
                Box::pin(async move {
                    client
                        .auth(reference, &auth, oci_client::RegistryOperation::Pull)
                        .await
                        .map(drop)
                })
            })
            .await?;
        }
        let mut out = Some(out);
        self.attempt(&host, &auth, |client| {
            let out = out.take();
            let auth = auth.clone();
            Box::pin(async move {
                // Token or basic auth is set up by a manifest request
                // first; a blob request alone would go anonymous.
                client
                    .store_auth_if_needed(reference.resolve_registry(), &auth)
                    .await;
                match out {
                    Some(out) => client.pull_blob(reference, digest, out).await,
                    None => Err(OciDistributionError::GenericError(Some(
                        "the blob's scheme changed while it was fetched".into(),
                    ))),
                }
            })
        })
        .await
    }

    /// Runs `op` with the client(s) `host` may be reached with, in
    /// order, until one connects.
    async fn attempt<'a, T, F>(
        &'a self,
        host: &str,
        auth: &RegistryAuth,
        mut op: F,
    ) -> Result<T, Failure>
    where
        F: FnMut(&'a Client) -> BoxFuture<'a, Result<T, OciDistributionError>>,
    {
        let schemes = self.schemes(host);
        let mut tried = Vec::new();
        for scheme in schemes.iter().copied() {
            let client = match scheme {
                Scheme::Verified => &self.verified,
                Scheme::Unverified => &self.unverified,
                Scheme::Plain => &self.plain,
            };
            match op(client).await {
                Ok(value) => {
                    if schemes.len() > 1 {
                        self.found
                            .lock()
                            .expect("registry scheme map poisoned")
                            .insert(host.to_string(), scheme);
                    }
                    return Ok(value);
                }
                Err(OciDistributionError::RequestError(e)) if e.is_connect() => {
                    let label = match scheme {
                        Scheme::Plain => "http",
                        _ => "https",
                    };
                    tried.push(format!("{label}: {}", chain(&e)));
                }
                Err(e) => return Err(self.failure(host, auth, e)),
            }
        }
        let mut detail = tried.join("; ");
        if detail.contains("certificate") && !self.insecure.contains(host) {
            detail.push_str(
                " (a registry whose certificate this host does not trust must be listed in \
                 --docker-insecure-registries)",
            );
        }
        Err(Failure::RegistryDown {
            registry: host.to_string(),
            detail,
        })
    }

    fn schemes(&self, host: &str) -> Vec<Scheme> {
        if host == self.default_host && self.default_plain {
            return vec![Scheme::Plain];
        }
        if self.insecure.contains(host) {
            let found = self.found.lock().expect("registry scheme map poisoned");
            return match found.get(host) {
                Some(scheme) => vec![*scheme],
                None => vec![Scheme::Unverified, Scheme::Plain],
            };
        }
        vec![Scheme::Verified]
    }

    /// The [`Failure`] an answer from `host` means.
    fn failure(&self, host: &str, auth: &RegistryAuth, e: OciDistributionError) -> Failure {
        let registry = host.to_string();
        let refused = |said: String| {
            let sent = match auth {
                RegistryAuth::Anonymous => "no credentials for it in --docker-config".to_string(),
                RegistryAuth::Basic(user, _) => format!("user {user:?} of --docker-config"),
                RegistryAuth::Bearer(_) => "the registrytoken of --docker-config".to_string(),
            };
            Failure::AuthRefused {
                registry: registry.clone(),
                detail: format!("{sent}: {said}"),
            }
        };
        match e {
            OciDistributionError::UnauthorizedError { url } => {
                refused(format!("401 Unauthorized for {url}"))
            }
            OciDistributionError::AuthenticationFailure(reason) => refused(reason),
            OciDistributionError::RegistryError { envelope, url } => {
                let codes: Vec<&OciErrorCode> = envelope.errors.iter().map(|e| &e.code).collect();
                let text = envelope
                    .errors
                    .iter()
                    .map(|e| format!("{:?}: {}", e.code, e.message))
                    .collect::<Vec<_>>()
                    .join("; ");
                if codes.iter().any(|c| {
                    matches!(
                        c,
                        OciErrorCode::ManifestUnknown
                            | OciErrorCode::NameUnknown
                            | OciErrorCode::BlobUnknown
                            | OciErrorCode::NotFound
                    )
                }) {
                    Failure::NotFound {
                        registry,
                        name: url,
                    }
                } else if codes
                    .iter()
                    .any(|c| matches!(c, OciErrorCode::Unauthorized | OciErrorCode::Denied))
                {
                    refused(text)
                } else {
                    Failure::Registry {
                        registry,
                        detail: format!("{url}: {text}"),
                    }
                }
            }
            OciDistributionError::ServerError { code, url, message } => match code {
                404 => Failure::NotFound {
                    registry,
                    name: url,
                },
                401 | 403 => refused(format!("{code} for {url}: {}", short(&message))),
                _ => Failure::Registry {
                    registry,
                    detail: format!("{url} answered {code}: {}", short(&message)),
                },
            },
            OciDistributionError::DigestError(
                oci_client::errors::DigestError::VerificationError { expected, actual },
            ) => Failure::DigestMismatch {
                what: "blob",
                expected,
                actual,
            },
            OciDistributionError::RequestError(e) => Failure::RegistryDown {
                registry,
                detail: chain(&e),
            },
            OciDistributionError::IoError(e) => {
                if is_disk_full(&e) {
                    Failure::DiskFull {
                        path: std::path::PathBuf::from("(layer download)"),
                        detail: e.to_string(),
                    }
                } else {
                    Failure::Registry {
                        registry,
                        detail: chain(&e),
                    }
                }
            }
            other => Failure::Registry {
                registry,
                detail: chain(&other),
            },
        }
    }
}

/// `text`, cut to a line's worth.
fn short(text: &str) -> String {
    let text = text.trim();
    match text.char_indices().nth(200) {
        Some((i, _)) => format!("{}…", &text[..i]),
        None => text.to_string(),
    }
}

// === impl Limited ===

impl<W> Limited<W> {
    /// `inner`, taking at most `limit` bytes of `what`.
    pub fn new(inner: W, limit: u64, what: &'static str) -> Limited<W> {
        Limited {
            inner,
            left: limit,
            what,
        }
    }

    pub fn into_inner(self) -> W {
        self.inner
    }
}

impl<W: AsyncWrite + Unpin> AsyncWrite for Limited<W> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        if buf.len() as u64 > self.left {
            return Poll::Ready(Err(std::io::Error::other(format!(
                "{} is larger than the size its descriptor gives",
                self.what
            ))));
        }
        let this = &mut *self;
        let written = std::task::ready!(Pin::new(&mut this.inner).poll_write(cx, buf))?;
        this.left -= written as u64;
        Poll::Ready(Ok(written))
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
