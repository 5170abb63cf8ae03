//! Manifests, manifest lists and image configs (Docker's schema 2 and
//! OCI's, which share their shape), read with `oci-spec`'s types.

use oci_spec::image::{Descriptor, ImageConfiguration, ImageIndex, ImageManifest};
use serde::{Deserialize, Serialize};

use super::error::Failure;
use super::reference::is_sha256;

/// The parts of an image's config a container runs with.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageConfig {
    /// `Entrypoint` (`None` when the image sets none).
    pub entrypoint: Option<Vec<String>>,
    /// `Cmd` (`None` when the image sets none).
    pub cmd: Option<Vec<String>>,
    /// `Env`, `NAME=VALUE` each.
    pub env: Vec<String>,
    /// `WorkingDir`.
    pub working_dir: Option<String>,
    /// `User` (`name`, `uid`, `name:group`, `uid:gid`, ...).
    pub user: Option<String>,
    /// `Volumes`: the container paths, sorted.
    pub volumes: Vec<String>,
    /// `ExposedPorts`: `PORT/PROTO` each, sorted.
    pub exposed_ports: Vec<String>,
}

/// An operating system and CPU, as image indexes name them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Platform {
    /// `linux`.
    pub os: String,
    /// Go's name of the CPU: `amd64`, `arm64`, `arm`, `386`, ...
    pub architecture: String,
    /// `v7`, `v8`, ... where the architecture has variants.
    pub variant: Option<String>,
}

/// A manifest as served: one image, or a list of per-platform images.
pub(crate) enum Manifest {
    Image(Box<ImageManifest>),
    Index(Box<ImageIndex>),
}

/// An image's layers, bottom first, and its config.
pub(crate) struct Resolved {
    /// Each layer's blob descriptor and diff id (the digest of its
    /// uncompressed tar, from the config's `rootfs.diff_ids`).
    pub layers: Vec<(Descriptor, String)>,
    pub config: ImageConfig,
}

// === impl Platform ===

impl Platform {
    /// The platform this agent runs on.
    pub fn host() -> Platform {
        let (architecture, variant) = match std::env::consts::ARCH {
            "x86_64" => ("amd64", None),
            "aarch64" => ("arm64", Some("v8")),
            "arm" => ("arm", Some("v7")),
            "x86" => ("386", None),
            "powerpc64" if cfg!(target_endian = "little") => ("ppc64le", None),
            "loongarch64" => ("loong64", None),
            other => (other, None),
        };
        Platform {
            os: std::env::consts::OS.to_string(),
            architecture: architecture.to_string(),
            variant: variant.map(str::to_string),
        }
    }
}

impl std::fmt::Display for Platform {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.os, self.architecture)?;
        if let Some(variant) = &self.variant {
            write!(f, "/{variant}")?;
        }
        Ok(())
    }
}

// === impl Manifest ===

impl Manifest {
    /// Reads a manifest or manifest list.
    pub fn parse(bytes: &[u8]) -> Result<Manifest, Failure> {
        #[derive(Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Head {
            schema_version: Option<u32>,
            media_type: Option<String>,
            manifests: Option<serde_json::Value>,
        }
        let head: Head = serde_json::from_slice(bytes)
            .map_err(|e| Failure::BadImage(format!("manifest is not JSON: {e}")))?;
        if head.schema_version == Some(1)
            || head
                .media_type
                .as_deref()
                .is_some_and(|m| m.starts_with("application/vnd.docker.distribution.manifest.v1"))
        {
            return Err(Failure::Unsupported(
                "Docker schema 1 manifests (push the image again with a current client)".into(),
            ));
        }
        if head.schema_version != Some(2) {
            return Err(Failure::BadImage(format!(
                "manifest schemaVersion is {:?}, not 2",
                head.schema_version
            )));
        }
        if head.manifests.is_some() {
            serde_json::from_slice(bytes)
                .map(|i| Manifest::Index(Box::new(i)))
                .map_err(|e| Failure::BadImage(format!("manifest list: {e}")))
        } else {
            serde_json::from_slice(bytes)
                .map(|m| Manifest::Image(Box::new(m)))
                .map_err(|e| Failure::BadImage(format!("manifest: {e}")))
        }
    }
}

/// The manifest of `index` for `platform`: an exact variant match, else
/// one without a variant, else the first for the OS and architecture.
pub(crate) fn select(index: &ImageIndex, platform: &Platform) -> Result<Descriptor, Failure> {
    let matching: Vec<&Descriptor> = index
        .manifests()
        .iter()
        .filter(|d| {
            d.platform().as_ref().is_some_and(|p| {
                p.os().to_string() == platform.os
                    && p.architecture().to_string() == platform.architecture
            })
        })
        .collect();
    let variant = |d: &Descriptor| d.platform().as_ref().and_then(|p| p.variant().clone());
    let chosen = matching
        .iter()
        .find(|d| platform.variant.is_some() && variant(d) == platform.variant)
        .or_else(|| matching.iter().find(|d| variant(d).is_none()))
        .or_else(|| matching.first());
    match chosen {
        Some(d) => Ok((*d).clone()),
        None => {
            let available: Vec<String> = index
                .manifests()
                .iter()
                .filter_map(|d| d.platform().as_ref())
                .map(|p| {
                    let mut s = format!("{}/{}", p.os(), p.architecture());
                    if let Some(v) = p.variant() {
                        s.push('/');
                        s.push_str(v);
                    }
                    s
                })
                .collect();
            Err(Failure::NoPlatform {
                platform: platform.to_string(),
                available: if available.is_empty() {
                    "none with a platform".into()
                } else {
                    available.join(", ")
                },
            })
        }
    }
}

/// Pairs `manifest`'s layers with `config`'s diff ids and reads the
/// config's runtime part.
pub(crate) fn resolve(manifest: &ImageManifest, config: &[u8]) -> Result<Resolved, Failure> {
    let parsed = parse_config(config)?;
    let diff_ids = parsed.rootfs().diff_ids();
    let layers = manifest.layers();
    if layers.len() != diff_ids.len() {
        return Err(Failure::BadImage(format!(
            "the manifest has {} layers but the config's rootfs.diff_ids has {}",
            layers.len(),
            diff_ids.len()
        )));
    }
    for (layer, diff_id) in layers.iter().zip(diff_ids) {
        check_layer(layer)?;
        if !is_sha256(diff_id) {
            return Err(Failure::Unsupported(format!(
                "layer diff id {diff_id:?} (only sha256 digests are supported)"
            )));
        }
    }
    Ok(Resolved {
        layers: layers
            .iter()
            .cloned()
            .zip(diff_ids.iter().cloned())
            .collect(),
        config: runtime_config(&parsed),
    })
}

/// Reads an image config.
pub(crate) fn parse_config(config: &[u8]) -> Result<ImageConfiguration, Failure> {
    serde_json::from_slice(config).map_err(|e| Failure::BadImage(format!("image config: {e}")))
}

/// The runtime part of a config.
pub(crate) fn runtime_config(parsed: &ImageConfiguration) -> ImageConfig {
    let Some(c) = parsed.config() else {
        return ImageConfig::default();
    };
    let sorted = |v: &Option<Vec<String>>| {
        let mut v = v.clone().unwrap_or_default();
        v.sort();
        v
    };
    ImageConfig {
        entrypoint: c.entrypoint().clone(),
        cmd: c.cmd().clone(),
        env: c.env().clone().unwrap_or_default(),
        working_dir: c.working_dir().clone().filter(|w| !w.is_empty()),
        user: c.user().clone().filter(|u| !u.is_empty()),
        volumes: sorted(c.volumes()),
        exposed_ports: sorted(c.exposed_ports()),
    }
}

/// Refuses layers Agora cannot unpack or fetch, by media type.
fn check_layer(layer: &Descriptor) -> Result<(), Failure> {
    let media = layer.media_type().to_string();
    if media.contains("foreign") || layer.urls().as_ref().is_some_and(|u| !u.is_empty()) {
        return Err(Failure::Unsupported(format!(
            "foreign layer {} ({media}) fetched from URLs outside the registry",
            layer.digest()
        )));
    }
    if media.contains("zstd") {
        return Err(Failure::Unsupported(format!(
            "zstd-compressed layer {} ({media})",
            layer.digest()
        )));
    }
    if !is_sha256(layer.digest().as_ref()) {
        return Err(Failure::Unsupported(format!(
            "layer digest {} (only sha256 digests are supported)",
            layer.digest()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn docker_configs_read_with_nulls_and_go_maps() {
        let config = br#"{
            "architecture": "amd64", "os": "linux",
            "config": {"Entrypoint": null, "Cmd": ["sh"], "Env": ["PATH=/bin"],
                       "WorkingDir": "", "User": "1000:1000",
                       "Volumes": {"/data": {}, "/cache": {}}, "ExposedPorts": {"80/tcp": {}},
                       "Labels": null, "OnBuild": null, "Image": "sha256:00"},
            "rootfs": {"type": "layers", "diff_ids": []},
            "history": [{"created_by": "x", "empty_layer": true}]
        }"#;
        let parsed = parse_config(config).unwrap();
        let c = runtime_config(&parsed);
        assert_eq!(c.entrypoint, None);
        assert_eq!(c.cmd, Some(vec!["sh".to_string()]));
        assert_eq!(c.env, vec!["PATH=/bin".to_string()]);
        assert_eq!(c.working_dir, None);
        assert_eq!(c.user.as_deref(), Some("1000:1000"));
        assert_eq!(c.volumes, vec!["/cache".to_string(), "/data".to_string()]);
        assert_eq!(c.exposed_ports, vec!["80/tcp".to_string()]);
    }

    #[test]
    fn platforms_are_chosen_by_os_architecture_then_variant() {
        let index: ImageIndex = serde_json::from_value(serde_json::json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.index.v1+json",
            "manifests": [
                {"mediaType": "application/vnd.oci.image.manifest.v1+json", "size": 1,
                 "digest": format!("sha256:{}", "1".repeat(64)),
                 "platform": {"os": "linux", "architecture": "arm", "variant": "v6"}},
                {"mediaType": "application/vnd.oci.image.manifest.v1+json", "size": 1,
                 "digest": format!("sha256:{}", "2".repeat(64)),
                 "platform": {"os": "linux", "architecture": "arm", "variant": "v7"}},
                {"mediaType": "application/vnd.oci.image.manifest.v1+json", "size": 1,
                 "digest": format!("sha256:{}", "3".repeat(64)),
                 "platform": {"os": "linux", "architecture": "amd64"}},
                {"mediaType": "application/vnd.oci.image.manifest.v1+json", "size": 1,
                 "digest": format!("sha256:{}", "4".repeat(64)),
                 "platform": {"os": "unknown", "architecture": "unknown"}}
            ]
        }))
        .unwrap();
        let platform = |arch: &str, variant: Option<&str>| Platform {
            os: "linux".into(),
            architecture: arch.into(),
            variant: variant.map(str::to_string),
        };
        let digest = |p: Platform| select(&index, &p).map(|d| d.digest().to_string());
        assert_eq!(
            digest(platform("arm", Some("v7"))).unwrap(),
            format!("sha256:{}", "2".repeat(64))
        );
        assert_eq!(
            digest(platform("amd64", None)).unwrap(),
            format!("sha256:{}", "3".repeat(64))
        );
        match digest(platform("s390x", None)) {
            Err(Failure::NoPlatform {
                platform,
                available,
            }) => {
                assert_eq!(platform, "linux/s390x");
                assert!(available.contains("linux/arm/v7") && available.contains("linux/amd64"));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn schema_1_is_refused_by_name() {
        let err = Manifest::parse(br#"{"schemaVersion": 1, "fsLayers": []}"#)
            .err()
            .unwrap();
        assert!(err.to_string().contains("schema 1"), "{err}");
    }
}
