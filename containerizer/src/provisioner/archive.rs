//! Image archives for hosts without a registry: `docker save` tarballs
//! (`manifest.json` naming each image's config and layer tars) and
//! OCI image layouts in a tarball (`oci-layout`, `index.json`,
//! `blobs/sha256/…`), either possibly gzip-compressed.
//!
//! The archive is read in place: its entries are found once, then each
//! file is read at its offset. Every blob named by a digest is checked
//! against it, and every layer against the diff id its config gives,
//! before it enters the store.

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::path::Path;

use oci_spec::image::{ImageIndex, ImageManifest};
use serde::Deserialize;
use sha2::{Digest, Sha256};

use super::error::{chain, Failure};
use super::image::{self, Manifest, Platform};
use super::reference::{is_sha256, ImageName};
use super::registry::MAX_METADATA;
use super::store::Staging;
use super::Provider;

/// An image found in an archive: its names (store keys, possibly none)
/// and its layers with what they must hash to.
pub(crate) struct ArchivedImage {
    pub names: Vec<String>,
    /// The manifest's digest (OCI layouts only).
    pub digest: Option<String>,
    pub config: image::ImageConfig,
    pub layers: Vec<ArchivedLayer>,
}

/// A layer file in the archive.
pub(crate) struct ArchivedLayer {
    /// Where its bytes are in the (uncompressed) archive.
    pub offset: u64,
    pub size: u64,
    /// Its blob digest, when the archive names it by one.
    pub blob: Option<String>,
    pub diff_id: String,
}

/// An archive, opened: the file and where each entry's bytes are.
pub(crate) struct Archive {
    file: File,
    entries: HashMap<String, (u64, u64)>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct SavedImage {
    config: String,
    #[serde(default)]
    repo_tags: Option<Vec<String>>,
    layers: Vec<String>,
}

// === impl Archive ===

impl Archive {
    /// Opens `path`; a gzip-compressed archive is first uncompressed into
    /// `staging`.
    pub fn open(path: &Path, staging: &Staging) -> Result<Archive, Failure> {
        let unreadable = |e: io::Error| Failure::BadImage(format!("cannot read the archive: {e}"));
        let mut file = File::open(path).map_err(unreadable)?;
        let mut magic = [0u8; 2];
        let n = file.read(&mut magic).map_err(unreadable)?;
        file.seek(SeekFrom::Start(0)).map_err(unreadable)?;
        if n == 2 && magic == [0x1f, 0x8b] {
            let plain = staging.path().join("archive.tar");
            let mut out = File::options()
                .create_new(true)
                .read(true)
                .write(true)
                .open(&plain)
                .map_err(|e| Failure::store(&plain, &e))?;
            io::copy(&mut flate2::read::MultiGzDecoder::new(file), &mut out).map_err(|e| {
                if super::error::is_disk_full(&e) {
                    Failure::store(&plain, &e)
                } else {
                    Failure::BadImage(format!("the archive's gzip stream: {e}"))
                }
            })?;
            out.seek(SeekFrom::Start(0)).map_err(unreadable)?;
            file = out;
        }
        let mut entries = HashMap::new();
        {
            let mut tar = tar::Archive::new(&mut file);
            let bad = |e: io::Error| Failure::BadImage(format!("not a tar archive: {e}"));
            for entry in tar.entries_with_seek().map_err(bad)? {
                let entry = entry.map_err(bad)?;
                if !matches!(
                    entry.header().entry_type(),
                    tar::EntryType::Regular | tar::EntryType::Continuous
                ) {
                    continue;
                }
                let name = entry.path().map_err(bad)?;
                let name = name.to_string_lossy();
                let name = name.trim_start_matches("./").to_string();
                entries.insert(name, (entry.raw_file_position(), entry.size()));
            }
        }
        Ok(Archive { file, entries })
    }

    /// The images the archive holds.
    pub fn images(&mut self, platform: &Platform) -> Result<Vec<ArchivedImage>, Failure> {
        if self.entries.contains_key("manifest.json") {
            self.docker_images()
        } else if self.entries.contains_key("oci-layout") && self.entries.contains_key("index.json")
        {
            self.oci_images(platform)
        } else {
            Err(Failure::BadImage(
                "neither a docker save archive (no manifest.json) nor an OCI image layout \
                 (no oci-layout and index.json)"
                    .into(),
            ))
        }
    }

    /// A reader of layer `layer`'s bytes.
    pub fn layer_reader(&self, layer: &ArchivedLayer) -> io::Result<impl Read + '_> {
        let mut file = &self.file;
        file.seek(SeekFrom::Start(layer.offset))?;
        Ok(file.take(layer.size))
    }

    fn docker_images(&mut self) -> Result<Vec<ArchivedImage>, Failure> {
        let saved: Vec<SavedImage> = serde_json::from_slice(&self.small("manifest.json")?)
            .map_err(|e| Failure::BadImage(format!("manifest.json: {e}")))?;
        let mut images = Vec::new();
        for image in saved {
            let config_bytes = self.small(&image.config)?;
            // The config's file is named by its digest.
            if let Some(hex) = digest_in_name(&image.config) {
                check(&config_bytes, &format!("sha256:{hex}"), "config")?;
            }
            let config = image::parse_config(&config_bytes)?;
            let diff_ids = config.rootfs().diff_ids();
            if diff_ids.len() != image.layers.len() {
                return Err(Failure::BadImage(format!(
                    "{} lists {} layers but its config's rootfs.diff_ids has {}",
                    image.config,
                    image.layers.len(),
                    diff_ids.len()
                )));
            }
            let mut layers = Vec::new();
            for (file, diff_id) in image.layers.iter().zip(diff_ids) {
                check_diff_id(diff_id)?;
                let (offset, size) = self.entry(file)?;
                layers.push(ArchivedLayer {
                    offset,
                    size,
                    blob: digest_in_name(file).map(|hex| format!("sha256:{hex}")),
                    diff_id: diff_id.clone(),
                });
            }
            let mut names = Vec::new();
            for tag in image.repo_tags.unwrap_or_default() {
                let name = ImageName::parse(Provider::Docker, familiar(&tag))
                    .map_err(|e| Failure::BadImage(format!("RepoTags {tag:?}: {e}")))?;
                names.push(name.key());
            }
            images.push(ArchivedImage {
                names,
                digest: None,
                config: image::runtime_config(&config),
                layers,
            });
        }
        Ok(images)
    }

    fn oci_images(&mut self, platform: &Platform) -> Result<Vec<ArchivedImage>, Failure> {
        #[derive(Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Layout {
            image_layout_version: String,
        }
        let layout: Layout = serde_json::from_slice(&self.small("oci-layout")?)
            .map_err(|e| Failure::BadImage(format!("oci-layout: {e}")))?;
        if !layout.image_layout_version.starts_with("1.") {
            return Err(Failure::Unsupported(format!(
                "OCI image layout version {}",
                layout.image_layout_version
            )));
        }
        let index: ImageIndex = serde_json::from_slice(&self.small("index.json")?)
            .map_err(|e| Failure::BadImage(format!("index.json: {e}")))?;
        let mut images = Vec::new();
        for top in index.manifests() {
            let annotations = top.annotations().clone().unwrap_or_default();
            // containerd's full name first; the OCI ref name when it is a
            // whole reference rather than a bare tag.
            let name = annotations
                .get("io.containerd.image.name")
                .or_else(|| {
                    annotations
                        .get("org.opencontainers.image.ref.name")
                        .filter(|n| n.contains(':') || n.contains('/') || n.contains('@'))
                })
                .cloned();
            let mut digest = top.digest().to_string();
            let mut manifest = Manifest::parse(&self.blob(&digest)?)?;
            if let Manifest::Index(nested) = &manifest {
                digest = image::select(nested, platform)?.digest().to_string();
                manifest = Manifest::parse(&self.blob(&digest)?)?;
            }
            let Manifest::Image(manifest) = manifest else {
                return Err(Failure::BadImage(format!(
                    "{digest}: a manifest list within a manifest list"
                )));
            };
            let mut names = Vec::new();
            if let Some(name) = name {
                let parsed = ImageName::parse(Provider::Docker, familiar(&name))
                    .map_err(|e| Failure::BadImage(format!("image name {name:?}: {e}")))?;
                names.push(parsed.key());
            }
            images.push(self.oci_image(&manifest, names, digest)?);
        }
        Ok(images)
    }

    fn oci_image(
        &mut self,
        manifest: &ImageManifest,
        names: Vec<String>,
        digest: String,
    ) -> Result<ArchivedImage, Failure> {
        let config = self.blob(manifest.config().digest().as_ref())?;
        let resolved = image::resolve(manifest, &config)?;
        let mut layers = Vec::new();
        for (descriptor, diff_id) in resolved.layers {
            let blob = descriptor.digest().to_string();
            let (offset, size) = self.entry(&blob_path(&blob)?)?;
            layers.push(ArchivedLayer {
                offset,
                size,
                blob: Some(blob),
                diff_id,
            });
        }
        Ok(ArchivedImage {
            names,
            digest: Some(digest),
            config: resolved.config,
            layers,
        })
    }

    /// Blob `digest` of an OCI layout, checked against it.
    fn blob(&mut self, digest: &str) -> Result<Vec<u8>, Failure> {
        let bytes = self.small(&blob_path(digest)?)?;
        check(&bytes, digest, "blob")?;
        Ok(bytes)
    }

    fn entry(&self, name: &str) -> Result<(u64, u64), Failure> {
        let name = name.trim_start_matches("./");
        self.entries
            .get(name)
            .copied()
            .ok_or_else(|| Failure::BadImage(format!("the archive has no file {name:?}")))
    }

    /// A metadata file's bytes (at most [`MAX_METADATA`]).
    fn small(&mut self, name: &str) -> Result<Vec<u8>, Failure> {
        let (offset, size) = self.entry(name)?;
        if size > MAX_METADATA {
            return Err(Failure::BadImage(format!(
                "{name} is {size} bytes (metadata is at most {MAX_METADATA})"
            )));
        }
        let mut bytes = Vec::with_capacity(size as usize);
        self.file
            .seek(SeekFrom::Start(offset))
            .and_then(|_| (&mut self.file).take(size).read_to_end(&mut bytes))
            .map_err(|e| Failure::BadImage(format!("{name}: {}", chain(&e))))?;
        Ok(bytes)
    }
}

/// `blobs/sha256/<hex>` of `digest`.
fn blob_path(digest: &str) -> Result<String, Failure> {
    if !is_sha256(digest) {
        return Err(Failure::Unsupported(format!(
            "blob digest {digest:?} (only sha256 digests are supported)"
        )));
    }
    Ok(format!("blobs/sha256/{}", &digest["sha256:".len()..]))
}

/// The 64-hex digest a `docker save` file is named by, if it is
/// (`<hex>.json`, `blobs/sha256/<hex>`).
fn digest_in_name(name: &str) -> Option<&str> {
    let base = name.rsplit('/').next()?;
    let hex = base.strip_suffix(".json").unwrap_or(base);
    let digest = format!("sha256:{hex}");
    (is_sha256(&digest) && (name.starts_with("blobs/sha256/") || base.ends_with(".json")))
        .then_some(hex)
}

fn check(bytes: &[u8], digest: &str, what: &'static str) -> Result<(), Failure> {
    let actual = format!("sha256:{}", hex::encode(Sha256::digest(bytes)));
    if actual == digest {
        Ok(())
    } else {
        Err(Failure::DigestMismatch {
            what,
            expected: digest.to_string(),
            actual,
        })
    }
}

fn check_diff_id(diff_id: &str) -> Result<(), Failure> {
    if is_sha256(diff_id) {
        Ok(())
    } else {
        Err(Failure::Unsupported(format!(
            "layer diff id {diff_id:?} (only sha256 digests are supported)"
        )))
    }
}

/// An archive's image name as Docker shows it: `docker.io/` (which
/// skopeo and containerd write) names Docker Hub, the registry of names
/// without a host, so `docker.io/app:1` is stored as `app:1` and a task
/// naming `app:1` finds it.
fn familiar(name: &str) -> &str {
    name.strip_prefix("docker.io/")
        .or_else(|| name.strip_prefix("index.docker.io/"))
        .unwrap_or(name)
}
