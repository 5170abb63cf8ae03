//! The Agora containerizer: the containers an agent runs its executors
//! and tasks in, as Mesos's `src/slave/containerizer/` is for its agent.
//! The agent's core decides what runs; the containerizer carries it out
//! through one narrow face, [`Containerizer`]: launch, wait, kill,
//! recover and usage (see [`containers`]).
//!
//! Behind the face, each part is a module named for it:
//! - [`images`]: command tasks in images, from a pull to a container
//!   waiting for its executor to start it, and their end;
//! - [`isolation`]: what `--isolation` selects (nothing enforced with
//!   `posix`, a cgroup per run with `cgroups`, v1 or v2), and
//!   [`monitor`]: what containers used, in Mesos's names;
//! - [`provisioner`]: Docker and OCI images pulled from registries (or
//!   imported from archives) into a content-addressed layer store, handed
//!   back as layers and a runtime config;
//! - [`runtime`]: a container run from an OCI bundle by `crun`, watched
//!   by `conmon`, on an overlay of an image's layers;
//! - [`volumes`]: a container's volumes checked and turned into mounts;
//! - [`network`]: a container attached to CNI networks.
//!
//! Nothing here needs a master or an agent: its tests make real cgroups,
//! containers, registries and networks (as root, where the host has
//! them; each says why it skips otherwise) and fake cgroup trees of plain
//! files.

pub mod containers;
pub mod images;
pub mod isolation;
pub mod monitor;
pub mod network;
pub mod provisioner;
pub mod runtime;
mod sys;
pub mod volumes;

pub use containers::{Containerizer, Holder, LaunchError, LimitWatch, Owner, RunContainer};
pub use images::{ImageContainers, ImageTask, ImagesConfig, PrepareError, Prepared};
pub use isolation::{CgroupsConfig, CgroupsError, ContainerStats, Isolation, Limitation, Limits};
pub use monitor::{Statistics, Usage};
pub use network::{
    AttachRequest, Attachment, NetworkChoice, NetworkError, Networks, NetworksConfig,
};
pub use provisioner::{ProvisionError, ProvisionedImage, Provisioner};
pub use runtime::{Container, ContainerSpec, Exit, Runtime, RuntimeConfig, RuntimeError};
pub use volumes::{Volume, VolumePolicy};
