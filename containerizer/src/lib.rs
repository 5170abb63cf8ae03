//! Agora's containerizer: tasks run in the images they name, in
//! namespaces of their own, with volumes (Mesos's unified containerizer,
//! `src/slave/containerizer/`). [`runtime`] runs a container from an OCI
//! bundle with `crun` (watched by `conmon`); [`volumes`] checks a
//! container's volumes and turns them into mounts.

pub mod network;
pub mod runtime;
pub mod volumes;

pub use network::{
    AttachRequest, Attachment, NetworkChoice, NetworkError, Networks, NetworksConfig,
};
pub use runtime::{Container, ContainerSpec, Exit, Runtime, RuntimeConfig, RuntimeError};
pub use volumes::{Volume, VolumePolicy};
