//! What a task or executor runs in: its container (Mesos's
//! `ContainerInfo`), the image its root file system comes from, its
//! volumes and networks, and what the agent reports back about it
//! (`ContainerStatus`).
//!
//! A task without a `container` runs on the host's file system, as
//! before. With one, the agent runs it through its containerizer (an OCI
//! runtime over the image's layers) when `--image-providers` enables the
//! image's kind; an agent without it refuses the task
//! (`TASK_FAILED`, `REASON_CONTAINER_LAUNCH_FAILED`, naming the flag).

use serde::{Deserialize, Serialize};

/// A task's or executor's container (Mesos's `ContainerInfo`). Both
/// types run on the agent's OCI runtime: `DOCKER` names its image in
/// Docker's way, as Mesos's unified containerizer runs Docker images
/// without a Docker daemon.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContainerInfo {
    /// `MESOS` or `DOCKER`.
    #[serde(rename = "type")]
    pub kind: ContainerType,
    /// The image whose layers make the root file system (`None`: the
    /// host's file system, with the volumes mounted in a namespace of
    /// the container's own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<Image>,
    /// Volumes mounted into the container.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<Volume>,
    /// Networks to join (CNI); empty: the host's network.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub network_infos: Vec<NetworkInfo>,
    /// The container's hostname (`None`: the host's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
}

/// Which kind of container a task asks for (Mesos's
/// `ContainerInfo.Type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ContainerType {
    /// Mesos's unified containerizer (`ContainerInfo.mesos`).
    Mesos,
    /// A Docker image (`ContainerInfo.docker`), run on the same OCI
    /// runtime (no Docker daemon).
    Docker,
    /// A type this version does not know.
    #[serde(other)]
    Unknown,
}

/// A container image (Mesos's `Image`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Image {
    /// `DOCKER` or `OCI`.
    #[serde(rename = "type")]
    pub kind: ImageType,
    /// The reference: `busybox:1.36`, `127.0.0.1:5000/app@sha256:…`. A
    /// Docker name without a registry host comes from the agent's
    /// `--docker-registry`.
    pub name: String,
    /// Use the agent's stored image of that name when it has one
    /// (Mesos's `Image.cached`, default true); `false` asks the registry
    /// again (Docker's `force_pull_image`).
    #[serde(default = "yes", skip_serializing_if = "is_true")]
    pub cached: bool,
}

/// The kind of an image reference (Mesos's `Image.Type`, with OCI for
/// APPC).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ImageType {
    /// A Docker image reference.
    Docker,
    /// An OCI image reference, which names its registry.
    Oci,
    /// A type this version does not know.
    #[serde(other)]
    Unknown,
}

/// A volume of a container (Mesos's `Volume`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Volume {
    /// Where it appears: absolute in the container's root, or relative
    /// to the sandbox.
    pub container_path: String,
    /// `RW` or `RO`.
    pub mode: VolumeMode,
    /// What is mounted there.
    pub source: VolumeSource,
}

/// A volume's access mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum VolumeMode {
    /// Read-write.
    Rw,
    /// Read-only.
    Ro,
}

/// What a volume mounts (Mesos's `Volume.Source`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "SCREAMING_SNAKE_CASE")]
pub enum VolumeSource {
    /// A path on the host (`--allowed-host-paths` limits which).
    HostPath {
        /// Absolute host path.
        path: String,
    },
    /// A path in a sandbox: the container's own (`SELF`) or its
    /// parent's (`PARENT`, so the tasks of a group share it).
    SandboxPath {
        /// Whose sandbox.
        of: SandboxOf,
        /// Relative path in it.
        path: String,
    },
    /// A source this version does not know.
    #[serde(other)]
    Unknown,
}

/// Whose sandbox a `SANDBOX_PATH` volume is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum SandboxOf {
    /// The container's own.
    #[serde(rename = "SELF")]
    Own,
    /// The parent container's (a task group's executor).
    Parent,
}

/// A network a container joins (Mesos's `NetworkInfo`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetworkInfo {
    /// The CNI network's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The container's addresses on it (reported in
    /// [`ContainerStatus::network_infos`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ip_addresses: Vec<String>,
}

/// What the agent reports about a task's container (Mesos's
/// `ContainerStatus`), in the task's updates.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContainerStatus {
    /// The container's id on its agent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container_id: Option<String>,
    /// The networks the container is on, with its addresses.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub network_infos: Vec<NetworkInfo>,
    /// The container's first process, as the host sees it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub executor_pid: Option<u32>,
}

fn yes() -> bool {
    true
}

fn is_true(b: &bool) -> bool {
    *b
}

// === impl ContainerInfo ===

impl ContainerInfo {
    /// A container of `image` (a Docker reference) with no volume.
    pub fn docker(image: impl Into<String>) -> ContainerInfo {
        ContainerInfo {
            kind: ContainerType::Mesos,
            image: Some(Image {
                kind: ImageType::Docker,
                name: image.into(),
                cached: true,
            }),
            volumes: Vec::new(),
            network_infos: Vec::new(),
            hostname: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_container_reads_and_writes_mesos_shaped_json() {
        let json = r#"{"type":"DOCKER","image":{"type":"DOCKER","name":"busybox:1"},
            "volumes":[{"container_path":"/data","mode":"RO","source":{"type":"HOST_PATH","path":"/srv"}},
                       {"container_path":"/shared","mode":"RW","source":{"type":"SANDBOX_PATH","of":"SELF","path":"out"}}]}"#;
        let info: ContainerInfo = serde_json::from_str(json).unwrap();
        assert_eq!(info.kind, ContainerType::Docker);
        assert!(info.image.as_ref().unwrap().cached);
        assert_eq!(
            info.volumes[1].source,
            VolumeSource::SandboxPath {
                of: SandboxOf::Own,
                path: "out".into()
            }
        );
        let back: ContainerInfo =
            serde_json::from_str(&serde_json::to_string(&info).unwrap()).unwrap();
        assert_eq!(back, info);
    }
}
