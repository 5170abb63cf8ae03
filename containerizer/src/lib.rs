//! Agora's containerizer: tasks run in the images they name, in
//! namespaces of their own, with volumes (Mesos's unified containerizer,
//! `src/slave/containerizer/`). The [`provisioner`] pulls Docker and OCI
//! images (from registries or archives) into a content-addressed layer
//! store and hands back their layers and runtime config; [`runtime`] runs
//! a container from an OCI bundle with `crun` (watched by `conmon`);
//! [`volumes`] checks a container's volumes and turns them into mounts;
//! [`network`] attaches a container to CNI networks.

pub mod network;
pub mod provisioner;
pub mod runtime;
pub mod volumes;

pub use network::{
    AttachRequest, Attachment, NetworkChoice, NetworkError, Networks, NetworksConfig,
};
pub use provisioner::{ProvisionError, ProvisionedImage, Provisioner};
pub use runtime::{Container, ContainerSpec, Exit, Runtime, RuntimeConfig, RuntimeError};
pub use volumes::{Volume, VolumePolicy};
