//! The image provisioner (Mesos's `provisioner/docker`): a task's image
//! reference in, the image's layers and runtime config out.
//!
//! [`Provisioner::provision`] resolves a Docker or OCI reference against
//! its registry (or `--docker-registry`), picks this agent's platform out
//! of a manifest list, and makes sure every layer is in the store,
//! unpacked and checked; it returns a [`ProvisionedImage`]: the layer
//! directories, bottom first (overlayfs lowerdirs, or input to
//! [`ProvisionedImage::copy_into`] for the copy backend), and the
//! [`ImageConfig`]. The image's layers are held while the
//! `ProvisionedImage` lives; image GC ([`Provisioner::gc`], also run
//! after each provision when `--image-gc-watermark` is set) removes only
//! layers no live image holds.
//!
//! Guarantees:
//! - every blob is checked against its digest, and every layer against
//!   its diff id, before it is used;
//! - a layer is fetched once however many provisions want it at the same
//!   time (the others wait for it), and once fetched serves every image
//!   that has it;
//! - nothing half-written enters the store (see `store`);
//! - a failure is a [`ProvisionError`] naming the image and the cause,
//!   within `--image-pull-timeout`.
//!
//! Images come from registries (`oci-client`) or from archives
//! ([`Provisioner::import`]: `docker save` and OCI-layout tarballs).

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use oci_client::Reference;
use serde::{Deserialize, Serialize};
use tokio::sync::OwnedMutexGuard;

use credentials::Credentials;
use image::Manifest;
use reference::{ImageName, Target};
use registry::{Limited, Registries, MAX_METADATA};
use store::{Lease, Record, Store};

mod archive;
mod credentials;
mod error;
mod image;
mod layer;
mod reference;
mod registry;
mod store;

pub use error::{ConfigError, Failure, ProvisionError};
pub use image::{ImageConfig, Platform};
pub use layer::apply_by_copy;
pub use store::GcReport;

/// Mesos's `--docker-registry` default: Docker Hub.
pub const DEFAULT_DOCKER_REGISTRY: &str = "https://registry-1.docker.io";
/// Bytes of a layer blob in flight between its download and its
/// unpacking.
const STREAM_BUFFER: usize = 1 << 20;
/// `--image-pull-timeout` unless set.
pub const DEFAULT_IMAGE_PULL_TIMEOUT: Duration = Duration::from_secs(300);

/// The provisioner's settings, named after the agent flags that give
/// them.
#[derive(Debug, Clone)]
pub struct Config {
    /// `--image-providers`: which kinds of image tasks may name (none:
    /// images are refused).
    pub image_providers: Vec<Provider>,
    /// `--docker-registry`: where Docker names without a registry host
    /// are pulled from (`https://HOST[:PORT]`, or `http://` for plain
    /// HTTP).
    pub docker_registry: String,
    /// `--docker-insecure-registries`: `HOST:PORT`s reached over TLS
    /// without verifying their certificate, or else over plain HTTP.
    pub docker_insecure_registries: Vec<String>,
    /// `--docker-config`: Docker's `config.json` with credentials in
    /// `auths`.
    pub docker_config: Option<PathBuf>,
    /// `--docker-store-dir`: the layer store (default
    /// `WORK_DIR/store/docker`).
    pub docker_store_dir: PathBuf,
    /// `--image-gc-watermark`: bytes the store may take before
    /// unreferenced layers are removed (none: never).
    pub image_gc_watermark: Option<u64>,
    /// `--image-pull-timeout`: how long a provision may take.
    pub image_pull_timeout: Duration,
    /// `--image-provisioner-backend`: how layers make a root file
    /// system, hence the form their whiteouts are stored in.
    pub image_provisioner_backend: Backend,
    /// The platform chosen out of manifest lists (this agent's).
    pub platform: Platform,
}

/// A kind of image (Mesos's `Image.Type`, with OCI for APPC).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Provider {
    /// A Docker image reference; names without a registry host come
    /// from `--docker-registry`.
    Docker,
    /// An OCI image reference, which names its registry.
    Oci,
}

/// How a container's root file system is made from layers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    /// The layers are overlayfs lower directories (whiteouts stored as
    /// overlayfs reads them; needs root).
    Overlay,
    /// The layers are copied one over another into the container's root
    /// ([`apply_by_copy`]).
    Copy,
}

/// Whether a tag already in the store is used as is (Mesos's
/// `Image.cached`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pull {
    /// Use the store's image of that name if there is one (`cached:
    /// true`, the default).
    IfMissing,
    /// Ask the registry what the name means now (`cached: false`);
    /// layers already in the store are not fetched again.
    Always,
}

/// An image ready to run: its layers are held (not collected) until
/// this and its clones are dropped.
#[derive(Clone)]
pub struct ProvisionedImage {
    /// The store's name of the image (`library/busybox:1`,
    /// `127.0.0.1:5000/app@sha256:…`).
    pub name: String,
    /// The image manifest's digest (none for an image imported from a
    /// `docker save` archive).
    pub digest: Option<String>,
    /// The unpacked layers, bottom first (overlayfs's `lowerdir` lists
    /// them top first: reversed).
    pub layers: Vec<PathBuf>,
    /// How the layers' whiteouts are stored.
    pub backend: Backend,
    /// Entrypoint, Cmd, Env, WorkingDir, User, Volumes, ExposedPorts.
    pub config: ImageConfig,
    _lease: Arc<Lease>,
}

/// An image an archive held, now in the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImportedImage {
    /// The names it can be provisioned by (empty when the archive gave
    /// none).
    pub names: Vec<String>,
    /// Its manifest's digest (OCI layouts only).
    pub digest: Option<String>,
    /// How many layers it has.
    pub layers: usize,
}

/// Pulls and unpacks images into a shared layer store. Cheap to clone.
#[derive(Clone)]
pub struct Provisioner {
    inner: Arc<Inner>,
}

struct Inner {
    config: Config,
    registries: Registries,
    store: Arc<Store>,
    /// Root: ownership, extended attributes and device nodes are kept.
    privileged: bool,
    /// One fetch per layer (by diff id) at a time.
    fetching: KeyedLocks,
    /// One resolution per image name at a time.
    resolving: KeyedLocks,
}

/// Async locks by name, forgotten when no one holds or waits for them.
#[derive(Default)]
struct KeyedLocks {
    locks: std::sync::Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

struct KeyGuard<'a> {
    locks: &'a KeyedLocks,
    key: String,
    guard: Option<OwnedMutexGuard<()>>,
}

// === impl Config ===

impl Config {
    /// Mesos's defaults for an agent whose `--work-dir` is `work_dir`:
    /// no image provider (images refused), Docker Hub, no insecure
    /// registry, no credentials, the store in `WORK_DIR/store/docker`,
    /// no GC, a 5-minute pull timeout, the overlay backend as root and
    /// copy otherwise.
    pub fn new(work_dir: &Path) -> Config {
        Config {
            image_providers: Vec::new(),
            docker_registry: DEFAULT_DOCKER_REGISTRY.to_string(),
            docker_insecure_registries: Vec::new(),
            docker_config: None,
            docker_store_dir: work_dir.join("store").join("docker"),
            image_gc_watermark: None,
            image_pull_timeout: DEFAULT_IMAGE_PULL_TIMEOUT,
            image_provisioner_backend: if nix::unistd::geteuid().is_root() {
                Backend::Overlay
            } else {
                Backend::Copy
            },
            platform: Platform::host(),
        }
    }
}

// === impl Provider ===

impl Provider {
    /// Parses `--image-providers`' comma-separated list (`docker,oci`;
    /// case-insensitive, as Mesos's `DOCKER,APPC`).
    pub fn parse_list(list: &str) -> Result<Vec<Provider>, ConfigError> {
        list.split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(Provider::from_str)
            .collect()
    }
}

impl FromStr for Provider {
    type Err = ConfigError;

    fn from_str(s: &str) -> Result<Provider, ConfigError> {
        match s.to_ascii_lowercase().as_str() {
            "docker" => Ok(Provider::Docker),
            "oci" => Ok(Provider::Oci),
            _ => Err(ConfigError::Flag {
                flag: "--image-providers",
                message: format!("unknown image provider {s:?} (docker, oci)"),
            }),
        }
    }
}

impl fmt::Display for Provider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Provider::Docker => "docker",
            Provider::Oci => "oci",
        })
    }
}

// === impl Backend ===

impl FromStr for Backend {
    type Err = ConfigError;

    fn from_str(s: &str) -> Result<Backend, ConfigError> {
        match s {
            "overlay" => Ok(Backend::Overlay),
            "copy" => Ok(Backend::Copy),
            _ => Err(ConfigError::Flag {
                flag: "--image-provisioner-backend",
                message: format!("unknown backend {s:?} (overlay, copy)"),
            }),
        }
    }
}

// === impl ProvisionedImage ===

impl ProvisionedImage {
    /// Builds a root file system at `rootfs` by copying the layers one
    /// over another (the copy backend; blocking).
    pub fn copy_into(&self, rootfs: &Path) -> std::io::Result<()> {
        if self.backend != Backend::Copy {
            return Err(std::io::Error::other(
                "layers unpacked for the overlay backend are not copied (their whiteouts are device nodes)",
            ));
        }
        apply_by_copy(&self.layers, rootfs, nix::unistd::geteuid().is_root())
    }
}

impl fmt::Debug for ProvisionedImage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProvisionedImage")
            .field("name", &self.name)
            .field("digest", &self.digest)
            .field("layers", &self.layers)
            .field("backend", &self.backend)
            .field("config", &self.config)
            .finish()
    }
}

// === impl Provisioner ===

impl Provisioner {
    /// A provisioner for `config`: reads `--docker-config`, opens the
    /// store (removing what a crash left half-done) and installs ring as
    /// rustls's process-wide crypto provider if none is.
    pub fn new(config: Config) -> Result<Provisioner, ConfigError> {
        // oci-client's HTTP client (reqwest) takes rustls's default
        // provider; the workspace builds rustls with ring only.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let credentials = match &config.docker_config {
            Some(path) => Credentials::load(path).map_err(|message| ConfigError::Flag {
                flag: "--docker-config",
                message: format!("{}: {message}", path.display()),
            })?,
            None => Credentials::default(),
        };
        for host in &config.docker_insecure_registries {
            if host.is_empty() || host.contains('/') {
                return Err(ConfigError::Flag {
                    flag: "--docker-insecure-registries",
                    message: format!("{host:?} is not HOST or HOST:PORT"),
                });
            }
        }
        let privileged = nix::unistd::geteuid().is_root();
        if config.image_provisioner_backend == Backend::Overlay && !privileged {
            return Err(ConfigError::Flag {
                flag: "--image-provisioner-backend",
                message: "overlay needs root (its whiteouts are device nodes and trusted.* \
                          attributes): run the agent as root or use copy"
                    .into(),
            });
        }
        let registries = Registries::new(
            &config.docker_registry,
            &config.docker_insecure_registries,
            credentials,
        )
        .map_err(|message| ConfigError::Flag {
            flag: "--docker-registry",
            message,
        })?;
        let store = Store::open(&config.docker_store_dir, config.image_provisioner_backend)
            .map_err(|e| ConfigError::Store {
                path: config.docker_store_dir.clone(),
                message: e.to_string(),
            })?;
        Ok(Provisioner {
            inner: Arc::new(Inner {
                privileged,
                config,
                registries,
                store: Arc::new(store),
                fetching: KeyedLocks::default(),
                resolving: KeyedLocks::default(),
            }),
        })
    }

    /// The settings in force.
    pub fn config(&self) -> &Config {
        &self.inner.config
    }

    /// Makes the image `reference` of kind `provider` ready: from the
    /// store when it has that name (and `pull` is [`Pull::IfMissing`]),
    /// else from its registry, fetching only the layers the store lacks.
    /// Fails with the image and the cause, within
    /// `--image-pull-timeout`.
    pub async fn provision(
        &self,
        provider: Provider,
        reference: &str,
        pull: Pull,
    ) -> Result<ProvisionedImage, ProvisionError> {
        let timeout = self.inner.config.image_pull_timeout;
        let image = tokio::time::timeout(timeout, self.resolve(provider, reference, pull))
            .await
            .unwrap_or(Err(Failure::Timeout(timeout)))
            .map_err(|cause| cause.about(reference))?;
        self.collect_if_needed().await;
        Ok(image)
    }

    /// Imports the images of `archive` (a `docker save` or OCI-layout
    /// tarball, possibly gzip-compressed) into the store, under the
    /// names it gives them; layers the store has are not unpacked again.
    /// For hosts without a registry (`agora image import FILE`).
    pub async fn import(&self, archive: &Path) -> Result<Vec<ImportedImage>, ProvisionError> {
        let this = self.clone();
        let path = archive.to_path_buf();
        let imported = tokio::task::spawn_blocking(move || this.import_blocking(&path))
            .await
            .unwrap_or_else(|e| Err(Failure::BadImage(format!("the import stopped: {e}"))))
            .map_err(|cause| cause.about(format!("archive {}", archive.display())))?;
        self.collect_if_needed().await;
        Ok(imported)
    }

    /// Removes layers no image in use holds, least recently used first,
    /// until the store is under `--image-gc-watermark` (nothing without
    /// one).
    pub async fn gc(&self) -> GcReport {
        let Some(watermark) = self.inner.config.image_gc_watermark else {
            return GcReport {
                size: self.inner.store.size(),
                ..GcReport::default()
            };
        };
        let store = self.inner.store.clone();
        tokio::task::spawn_blocking(move || store.gc(watermark))
            .await
            .unwrap_or_default()
    }

    /// Bytes the store's layers take.
    pub fn store_size(&self) -> u64 {
        self.inner.store.size()
    }

    async fn collect_if_needed(&self) {
        if let Some(watermark) = self.inner.config.image_gc_watermark {
            if self.inner.store.size() > watermark {
                let report = self.gc().await;
                if !report.removed.is_empty() {
                    tracing::info!(
                        layers = report.removed.len(),
                        freed = report.freed,
                        size = report.size,
                        "image GC removed unused layers"
                    );
                }
            }
        }
    }

    async fn resolve(
        &self,
        provider: Provider,
        reference: &str,
        pull: Pull,
    ) -> Result<ProvisionedImage, Failure> {
        let inner = &self.inner;
        if !inner.config.image_providers.contains(&provider) {
            return Err(Failure::ProviderDisabled {
                provider: provider.to_string(),
                enabled: inner
                    .config
                    .image_providers
                    .iter()
                    .map(Provider::to_string)
                    .collect::<Vec<_>>()
                    .join(","),
            });
        }
        let name = ImageName::parse(provider, reference).map_err(Failure::InvalidReference)?;
        let key = name.key();
        let _resolving = inner.resolving.lock(&key).await;
        if pull == Pull::IfMissing {
            if let Some(image) = self.cached(&key) {
                return Ok(image);
            }
        }
        let host = name
            .registry
            .clone()
            .unwrap_or_else(|| inner.registries.default_host().to_string());
        let named = match &name.target {
            Target::Tag(tag) => {
                Reference::with_tag(host.clone(), name.repository.clone(), tag.clone())
            }
            Target::Digest(digest) => {
                Reference::with_digest(host.clone(), name.repository.clone(), digest.clone())
            }
        };
        let not_found = |failure: Failure| match failure {
            Failure::NotFound { registry, .. } => Failure::NotFound {
                registry,
                name: name.path(),
            },
            other => other,
        };
        let (bytes, mut digest) = inner.registries.manifest(&named).await.map_err(not_found)?;
        let manifest = match Manifest::parse(&bytes)? {
            Manifest::Image(manifest) => manifest,
            Manifest::Index(index) => {
                let chosen = image::select(&index, &inner.config.platform)?;
                let by_digest = named.clone_with_digest(chosen.digest().to_string());
                let (bytes, chosen_digest) = inner.registries.manifest(&by_digest).await?;
                digest = chosen_digest;
                match Manifest::parse(&bytes)? {
                    Manifest::Image(manifest) => manifest,
                    Manifest::Index(_) => {
                        return Err(Failure::BadImage(format!(
                            "{digest}: a manifest list within a manifest list"
                        )))
                    }
                }
            }
        };
        let config_descriptor = manifest.config();
        if config_descriptor.size() > MAX_METADATA {
            return Err(Failure::BadImage(format!(
                "the image config is {} bytes (at most {MAX_METADATA})",
                config_descriptor.size()
            )));
        }
        let mut config = Limited::new(Vec::new(), config_descriptor.size(), "the image config");
        inner
            .registries
            .blob(&named, config_descriptor.digest().as_ref(), &mut config)
            .await
            .map_err(|f| match f {
                Failure::DigestMismatch {
                    expected, actual, ..
                } => Failure::DigestMismatch {
                    what: "config",
                    expected,
                    actual,
                },
                other => other,
            })?;
        let resolved = image::resolve(&manifest, &config.into_inner())?;
        let diff_ids: Vec<String> = resolved.layers.iter().map(|(_, d)| d.clone()).collect();
        let lease = inner.store.pin(&diff_ids);
        futures::future::try_join_all(
            resolved
                .layers
                .iter()
                .map(|(blob, diff_id)| self.fetch_layer(&named, blob, diff_id)),
        )
        .await?;
        let record = Record {
            key,
            digest: Some(digest),
            layers: diff_ids,
            config: resolved.config,
        };
        inner
            .store
            .save_record(&record)
            .map_err(|e| Failure::store(&inner.config.docker_store_dir, &e))?;
        Ok(self.image(record, lease))
    }

    /// The store's image `key`, held, if all its layers are there.
    fn cached(&self, key: &str) -> Option<ProvisionedImage> {
        let store = &self.inner.store;
        let record = store.record(key)?;
        let lease = store.pin(&record.layers);
        record
            .layers
            .iter()
            .all(|l| store.has_layer(l))
            .then(|| self.image(record, lease))
    }

    fn image(&self, record: Record, lease: Lease) -> ProvisionedImage {
        ProvisionedImage {
            layers: record
                .layers
                .iter()
                .map(|l| self.inner.store.rootfs(l))
                .collect(),
            name: record.key,
            digest: record.digest,
            backend: self.inner.config.image_provisioner_backend,
            config: record.config,
            _lease: Arc::new(lease),
        }
    }

    /// Makes sure layer `diff_id` is in the store: fetched from
    /// `reference`'s repository as blob `blob`, unpacked and checked in
    /// staging, then moved in. Concurrent calls for one layer fetch it
    /// once.
    async fn fetch_layer(
        &self,
        reference: &Reference,
        blob: &oci_spec::image::Descriptor,
        diff_id: &str,
    ) -> Result<(), Failure> {
        let inner = &self.inner;
        if inner.store.has_layer(diff_id) {
            return Ok(());
        }
        let _fetching = inner.fetching.lock(diff_id).await;
        if inner.store.has_layer(diff_id) {
            return Ok(());
        }
        let store_dir = &inner.config.docker_store_dir;
        let staging = inner
            .store
            .staging()
            .map_err(|e| Failure::store(store_dir, &e))?;
        let rootfs = staging.path().join("rootfs");
        std::fs::create_dir(&rootfs).map_err(|e| Failure::store(&rootfs, &e))?;
        // The blob is unpacked as it arrives (download and unpacking
        // overlap), and kept only if both its digest and its diff id
        // check out.
        let (writer, reader) = tokio::io::duplex(STREAM_BUFFER);
        let input = tokio_util::io::SyncIoBridge::new(reader);
        let backend = inner.config.image_provisioner_backend;
        let privileged = inner.privileged;
        let blob_digest = blob.digest().to_string();
        let layer_id = diff_id.to_string();
        // The unpacking thread owns the staging directory: if this
        // provision is dropped (timeout), the thread still ends (its
        // input ends) and removes it, or hands it back whole.
        let unpacking = tokio::task::spawn_blocking(move || {
            let expected = layer::Expected {
                blob: Some(&blob_digest),
                diff_id: &layer_id,
            };
            layer::unpack(input, &expected, &rootfs, backend, privileged).map(|()| staging)
        });
        let downloaded = inner
            .registries
            .blob(
                reference,
                blob.digest().as_ref(),
                Limited::new(writer, blob.size(), "a layer blob"),
            )
            .await;
        let unpacked = unpacking
            .await
            .unwrap_or_else(|e| Err(Failure::BadImage(format!("unpacking stopped: {e}"))));
        // The registry's failure (down, digest) is the cause; unpacking
        // then only saw a cut stream.
        downloaded?;
        let staging = unpacked?;
        let store = inner.store.clone();
        let diff_id = diff_id.to_string();
        tokio::task::spawn_blocking(move || {
            let rootfs = staging.path().join("rootfs");
            store
                .commit_layer(staging, &diff_id)
                .map_err(|e| Failure::store(&rootfs, &e))
        })
        .await
        .unwrap_or_else(|e| Err(Failure::BadImage(format!("storing the layer stopped: {e}"))))
    }

    fn import_blocking(&self, path: &Path) -> Result<Vec<ImportedImage>, Failure> {
        let inner = &self.inner;
        let store_dir = &inner.config.docker_store_dir;
        let work = inner
            .store
            .staging()
            .map_err(|e| Failure::store(store_dir, &e))?;
        let mut archive = archive::Archive::open(path, &work)?;
        let images = archive.images(&inner.config.platform)?;
        let mut imported = Vec::new();
        for image in images {
            let diff_ids: Vec<String> = image.layers.iter().map(|l| l.diff_id.clone()).collect();
            let _lease = inner.store.pin(&diff_ids);
            for layer in &image.layers {
                if inner.store.has_layer(&layer.diff_id) {
                    continue;
                }
                let _fetching = inner.fetching.lock_blocking(&layer.diff_id);
                if inner.store.has_layer(&layer.diff_id) {
                    continue;
                }
                let staging = inner
                    .store
                    .staging()
                    .map_err(|e| Failure::store(store_dir, &e))?;
                let rootfs = staging.path().join("rootfs");
                std::fs::create_dir(&rootfs).map_err(|e| Failure::store(&rootfs, &e))?;
                let input = archive
                    .layer_reader(layer)
                    .map_err(|e| Failure::BadImage(format!("cannot read the archive: {e}")))?;
                let expected = layer::Expected {
                    blob: layer.blob.as_deref(),
                    diff_id: &layer.diff_id,
                };
                layer::unpack(
                    input,
                    &expected,
                    &rootfs,
                    inner.config.image_provisioner_backend,
                    inner.privileged,
                )?;
                inner
                    .store
                    .commit_layer(staging, &layer.diff_id)
                    .map_err(|e| Failure::store(&rootfs, &e))?;
            }
            for name in &image.names {
                let record = Record {
                    key: name.clone(),
                    digest: image.digest.clone(),
                    layers: diff_ids.clone(),
                    config: image.config.clone(),
                };
                inner
                    .store
                    .save_record(&record)
                    .map_err(|e| Failure::store(store_dir, &e))?;
            }
            imported.push(ImportedImage {
                names: image.names,
                digest: image.digest,
                layers: diff_ids.len(),
            });
        }
        Ok(imported)
    }
}

// === impl KeyedLocks ===

impl KeyedLocks {
    fn get(&self, key: &str) -> Arc<tokio::sync::Mutex<()>> {
        self.map().entry(key.to_string()).or_default().clone()
    }

    async fn lock(&self, key: &str) -> KeyGuard<'_> {
        let guard = self.get(key).lock_owned().await;
        KeyGuard {
            locks: self,
            key: key.to_string(),
            guard: Some(guard),
        }
    }

    /// Blocks until `key` is free (from a thread that is not async).
    fn lock_blocking(&self, key: &str) -> KeyGuard<'_> {
        let guard = self.get(key).blocking_lock_owned();
        KeyGuard {
            locks: self,
            key: key.to_string(),
            guard: Some(guard),
        }
    }

    /// Drops `key`'s lock if no one holds or waits for it.
    fn forget_if_idle(&self, key: &str) {
        let mut map = self.map();
        if map.get(key).is_some_and(|l| Arc::strong_count(l) == 1) {
            map.remove(key);
        }
    }

    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<tokio::sync::Mutex<()>>>> {
        self.locks.lock().expect("keyed locks poisoned")
    }
}

impl Drop for KeyGuard<'_> {
    fn drop(&mut self) {
        drop(self.guard.take());
        self.locks.forget_if_idle(&self.key);
    }
}
