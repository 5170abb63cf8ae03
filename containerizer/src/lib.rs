//! The Agora containerizer: the containers an agent runs its executors
//! and command tasks in, as Mesos's `src/slave/containerizer/` is for
//! its agent. The agent's core decides what runs; the containerizer
//! carries it out through one narrow face, [`Containerizer`]: launch,
//! wait, kill, recover and usage (see [`containers`]).
//!
//! Behind the face, each part is a module named for it: [`isolation`]
//! (what `--isolation` selects: nothing enforced with `posix`, a cgroup
//! per run with `cgroups`, v1 or v2) and [`monitor`] (what containers
//! used, in Mesos's names). Images (`provisioner`), the OCI runtime
//! (`runtime`), networks (`network`) and volumes (`volumes`) come as
//! parts of their own.
//!
//! Nothing here needs a master or an agent: its tests make real cgroups
//! (as root, where the host has them) and fake cgroup trees of plain
//! files.

pub mod containers;
pub mod isolation;
pub mod monitor;
mod sys;

pub use containers::{Containerizer, Holder, LaunchError, LimitWatch, Owner, RunContainer};
pub use isolation::{CgroupsConfig, CgroupsError, ContainerStats, Isolation, Limitation, Limits};
pub use monitor::{Statistics, Usage};
