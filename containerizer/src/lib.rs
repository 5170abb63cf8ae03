//! Agora's containerizer (Mesos's `src/slave/containerizer/`): runs
//! tasks in the images they name. The [`provisioner`] pulls Docker and
//! OCI images (from registries or archives) into a content-addressed
//! layer store and hands back their layers and runtime config.

pub mod provisioner;

pub use provisioner::{ProvisionError, ProvisionedImage, Provisioner};
