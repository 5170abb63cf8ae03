//! Resource isolation of executors and tasks: what `--isolation` selects
//! and what a container's limits are.
//!
//! With [`Isolation::Posix`] (the default, as in Mesos) nothing is
//! enforced: `cpus` and `mem` are bookkeeping only. With
//! [`Isolation::Cgroups`] each executor run gets a container of its own
//! ([`cgroups`]: a cgroup under each needed controller on cgroup v1, one
//! directory on cgroup v2), which the executor is born in, whose limits
//! follow the resources of the executor and its tasks, and which is
//! killed and removed as a whole when the run ends.

use agora_proto::Resources;

pub(crate) mod cgroups;
mod cgroups_v1;
mod cgroups_v2;
mod mountinfo;

pub use cgroups::{CgroupsError, ContainerStats};

/// How executors are isolated (`--isolation`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Isolation {
    /// No enforcement: resources are bookkeeping only (today's behaviour,
    /// and Mesos's default `posix/cpu,posix/mem`).
    #[default]
    Posix,
    /// A cgroup per executor run (cgroup v1 or v2, whichever the host
    /// offers): CPU shares (a weight on v2) and a CFS quota, a memory
    /// limit with out-of-memory detection, a pids limit, and a kill that
    /// reaches every process of the container.
    Cgroups,
}

/// Settings of the cgroups isolation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupsConfig {
    /// Name of the cgroup that holds the containers (`--cgroups-root`):
    /// under the agent's own in each v1 hierarchy, under the cgroup2 mount
    /// point on v2.
    pub root: String,
    /// Enforce a hard CFS quota of `cpus` (`--cgroups-enable-cfs`).
    pub enable_cfs: bool,
    /// `pids.max` of a container whose resources have no `pids`
    /// (`--cgroups-pids-max`).
    pub pids_max: u64,
}

/// Default of [`CgroupsConfig::root`].
pub const DEFAULT_CGROUPS_ROOT: &str = "agora";
/// Default of [`CgroupsConfig::pids_max`].
pub const DEFAULT_CGROUPS_PIDS_MAX: u64 = 4096;

/// What a container is limited to, from the resources of its executor and
/// tasks.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Limits {
    /// CPUs (shares and, with CFS, quota).
    pub cpus: f64,
    /// Memory, MiB.
    pub mem_mib: f64,
    /// Processes and threads; `None`: the configured default.
    pub pids: Option<u64>,
}

/// Why a container was ended by the agent rather than by its executor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limitation {
    /// The task reason the executor's tasks end with.
    pub reason: agora_proto::Reason,
    /// What happened, for the tasks' status message.
    pub message: String,
}

/// Whether `--isolation cgroups` can be used here with `--cgroups-root
/// root`: root, and the needed controllers present and writable. `Err`
/// says why not (tests print it when they skip). Leaves nothing behind.
pub fn check_cgroups(root: &str) -> Result<(), String> {
    if !nix::unistd::Uid::effective().is_root() {
        return Err("not running as root".into());
    }
    let config = CgroupsConfig {
        root: root.to_string(),
        ..Default::default()
    };
    cgroups::Cgroups::discover(&config)
        .map_err(|e| e.to_string())?
        .destroy_all()
}

/// Kills every process of every container under `--cgroups-root root`
/// and removes them and the root (for tests, and for operators retiring
/// an agent).
pub fn destroy_cgroups_root(root: &str) -> Result<(), String> {
    let config = CgroupsConfig {
        root: root.to_string(),
        ..Default::default()
    };
    cgroups::Cgroups::discover(&config)
        .map_err(|e| e.to_string())?
        .destroy_all()
}

// === impl Isolation ===

impl std::str::FromStr for Isolation {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "posix" => Ok(Isolation::Posix),
            "cgroups" => Ok(Isolation::Cgroups),
            other => Err(format!("invalid isolation {other:?}: use posix or cgroups")),
        }
    }
}

impl std::fmt::Display for Isolation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Isolation::Posix => "posix",
            Isolation::Cgroups => "cgroups",
        })
    }
}

// === impl CgroupsConfig ===

impl Default for CgroupsConfig {
    fn default() -> Self {
        CgroupsConfig {
            root: DEFAULT_CGROUPS_ROOT.to_string(),
            enable_cfs: true,
            pids_max: DEFAULT_CGROUPS_PIDS_MAX,
        }
    }
}

// === impl Limits ===

impl Limits {
    /// The limits of `resources`.
    pub fn of(resources: &Resources) -> Limits {
        Limits::of_all([resources])
    }

    /// The limits of all of `resources` together (an executor's plus its
    /// tasks'): their cpus, mem and pids summed, without building the
    /// sum of the resources.
    pub fn of_all<'a>(resources: impl IntoIterator<Item = &'a Resources>) -> Limits {
        let (mut cpus, mut mem_mib, mut pids) = (0.0, 0.0, 0.0);
        for r in resources {
            cpus += r.cpus();
            mem_mib += r.mem();
            pids += r.scalar("pids");
        }
        Limits {
            cpus,
            mem_mib,
            pids: (pids >= 1.0).then_some(pids as u64),
        }
    }

    /// The larger of each limit: a container's limits only grow while it
    /// runs (lowering a memory limit below what is in use fails, and a
    /// task that ends does not take its memory with it at once).
    pub fn max(&self, other: &Limits) -> Limits {
        Limits {
            cpus: self.cpus.max(other.cpus),
            mem_mib: self.mem_mib.max(other.mem_mib),
            pids: match (self.pids, other.pids) {
                (Some(a), Some(b)) => Some(a.max(b)),
                (a, b) => a.or(b),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn isolation_parses_and_prints() {
        assert_eq!("posix".parse::<Isolation>(), Ok(Isolation::Posix));
        assert_eq!("cgroups".parse::<Isolation>(), Ok(Isolation::Cgroups));
        assert!("docker".parse::<Isolation>().is_err());
        assert_eq!(Isolation::Cgroups.to_string(), "cgroups");
        assert_eq!(Isolation::default(), Isolation::Posix);
    }

    #[test]
    fn limits_come_from_resources_and_only_grow() {
        let r = Resources::parse("cpus:0.6;mem:96;pids:64").unwrap();
        let l = Limits::of(&r);
        assert_eq!(l.cpus, 0.6);
        assert_eq!(l.mem_mib, 96.0);
        assert_eq!(l.pids, Some(64));
        let small = Limits::of(&Resources::parse("cpus:0.1;mem:32").unwrap());
        assert_eq!(small.pids, None);
        assert_eq!(small.max(&l), l);
        assert_eq!(l.max(&small), l);
    }
}
