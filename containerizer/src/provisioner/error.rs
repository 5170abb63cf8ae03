//! Why provisioning an image failed, and why the provisioner could not
//! start.

use std::path::PathBuf;
use std::time::Duration;

/// A provision or import that failed: the image (as the task named it,
/// or the archive's path) and the cause. Its text is meant for the
/// task's status message: "image busybox:1: no such image in
/// http://127.0.0.1:5000 (library/busybox:1)".
#[derive(Debug, thiserror::Error)]
#[error("image {image}: {cause}")]
pub struct ProvisionError {
    /// The image reference as given (or the archive imported).
    pub image: String,
    /// What went wrong.
    pub cause: Failure,
}

/// What went wrong while provisioning an image.
#[derive(Debug, thiserror::Error)]
pub enum Failure {
    /// The reference is not a Docker/OCI image reference.
    #[error("not an image reference: {0}")]
    InvalidReference(String),
    /// The image's provider is not in `--image-providers`.
    #[error("the {provider} image provider is not enabled (--image-providers {enabled})")]
    ProviderDisabled {
        /// The provider asked for.
        provider: String,
        /// The providers enabled, comma-separated (may be empty).
        enabled: String,
    },
    /// The registry (or the store, for an image that can only come from
    /// it) has no such repository, tag or manifest.
    #[error("no such image in {registry} ({name})")]
    NotFound {
        /// Where it was looked for.
        registry: String,
        /// The repository and tag or digest looked for.
        name: String,
    },
    /// The registry refused the credentials, or wants some and
    /// `--docker-config` has none for it.
    #[error("{registry} refused access ({detail})")]
    AuthRefused {
        /// The registry.
        registry: String,
        /// Whether credentials were sent, and what the registry said.
        detail: String,
    },
    /// The registry could not be reached (refused connection, TLS
    /// failure, connection lost mid-transfer).
    #[error("registry {registry} unreachable: {detail}")]
    RegistryDown {
        /// The registry.
        registry: String,
        /// The transport's error, with its causes.
        detail: String,
    },
    /// The registry answered something other than what the distribution
    /// API promises (a server error, a malformed answer).
    #[error("registry {registry} failed: {detail}")]
    Registry {
        /// The registry.
        registry: String,
        /// What it answered.
        detail: String,
    },
    /// Content does not hash to the digest that names it; it was not
    /// used.
    #[error("{what} {expected} does not match its digest (its content hashes to {actual}); it was not used")]
    DigestMismatch {
        /// Which content ("layer blob", "layer", "manifest", "config").
        what: &'static str,
        /// The digest that names it.
        expected: String,
        /// What it hashed to.
        actual: String,
    },
    /// The image's manifest list has no manifest for this agent's
    /// platform.
    #[error("no manifest for {platform} in the image's manifest list (it has {available})")]
    NoPlatform {
        /// This agent's platform (`linux/amd64`).
        platform: String,
        /// The platforms the list offers.
        available: String,
    },
    /// The image is well formed but uses something Agora does not carry
    /// out (a schema 1 manifest, a zstd layer, a foreign layer).
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// The manifest, config or a layer is malformed.
    #[error("malformed image: {0}")]
    BadImage(String),
    /// The layer store's file system is full.
    #[error("the layer store {} is full ({detail})", path.display())]
    DiskFull {
        /// Where writing failed.
        path: PathBuf,
        /// The error.
        detail: String,
    },
    /// The store could not be written or read for another reason.
    #[error("layer store {}: {detail}", path.display())]
    Store {
        /// The path involved.
        path: PathBuf,
        /// The error.
        detail: String,
    },
    /// Provisioning took longer than `--image-pull-timeout`.
    #[error("not provisioned within --image-pull-timeout ({0:?})")]
    Timeout(Duration),
}

/// Why the provisioner could not be set up from its configuration.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// A flag's value is not valid.
    #[error("{flag}: {message}")]
    Flag {
        /// The flag, as the agent spells it (`--docker-registry`).
        flag: &'static str,
        /// What is wrong with it.
        message: String,
    },
    /// The store directory could not be set up.
    #[error("--docker-store-dir {}: {message}", path.display())]
    Store {
        /// The directory.
        path: PathBuf,
        /// What failed.
        message: String,
    },
}

// === impl Failure ===

impl Failure {
    /// A store error for `path`: a full disk is [`Failure::DiskFull`].
    pub(crate) fn store(path: impl Into<PathBuf>, error: &std::io::Error) -> Failure {
        let path = path.into();
        let detail = chain(error);
        if is_disk_full(error) {
            Failure::DiskFull { path, detail }
        } else {
            Failure::Store { path, detail }
        }
    }

    /// This failure, about `image`.
    pub(crate) fn about(self, image: impl Into<String>) -> ProvisionError {
        ProvisionError {
            image: image.into(),
            cause: self,
        }
    }
}

/// Whether `error` (or the error it wraps) is ENOSPC or EDQUOT.
pub(crate) fn is_disk_full(error: &std::io::Error) -> bool {
    let mut current: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(e) = current {
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            if matches!(io.raw_os_error(), Some(libc::ENOSPC) | Some(libc::EDQUOT)) {
                return true;
            }
        }
        current = e.source();
    }
    false
}

/// `error` and its causes, joined by ": " (transport errors keep the
/// useful part in their sources).
pub(crate) fn chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut current = error.source();
    while let Some(e) = current {
        let next = e.to_string();
        if !text.contains(&next) {
            text.push_str(": ");
            text.push_str(&next);
        }
        current = e.source();
    }
    text
}
