//! Containers as cgroups, written directly through the cgroup file
//! system: which cgroup version drives them, and the one face the
//! containerizer uses whichever it is.
//!
//! A container is an executor run's cgroup (one per controller on cgroup
//! v1, one directory on v2) with the run's limits: CPU weight and a CFS
//! quota, a hard memory limit with out-of-memory detection, a pids limit.
//! The executor is born inside it ([`Cgroups::spawn_inside`]), and it is
//! killed whole and removed when the run ends.
//!
//! [`Cgroups::discover`] reads `/proc/self/mountinfo` and
//! `/proc/self/cgroup` and picks the driver:
//! - [`cgroups_v1`](super::cgroups_v1) when every v1 controller it needs
//!   (`cpu`, `cpuacct`, `memory`, `pids`, `freezer`) has a v1 hierarchy
//!   mounted: v1 hosts, and hybrid ones, whose unified hierarchy then
//!   cannot have those controllers (a controller is bound to one
//!   hierarchy);
//! - otherwise [`cgroups_v2`](super::cgroups_v2) on a cgroup2 mount that
//!   offers `cpu`, `memory` and `pids`.
//!
//! When neither can be used the agent refuses to start and names the
//! missing or unwritable controller.
//!
//! Files are written directly rather than through `cgroups-rs`: about a
//! dozen files are used, the hierarchies must be found from mountinfo
//! with controllers mounted separately (`cgroups-rs` 0.5 assumes its own
//! layout under `/sys/fs/cgroup`), and the launch path must stay a few
//! writes long.

use std::io::{self, Read};
use std::os::fd::{BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Serialize;

use super::{cgroups_v1 as v1, cgroups_v2 as v2};
use super::{mountinfo, CgroupsConfig, Limits};

/// CFS period, as in Mesos.
pub(super) const CFS_PERIOD_US: u64 = 100_000;
/// Smallest CFS quota, as in Mesos.
pub(super) const MIN_CFS_QUOTA_US: u64 = 1_000;
/// Smallest `cpu.shares` (v1; v2's `cpu.weight` is mapped from it).
pub(super) const MIN_SHARES: u64 = 2;
/// Largest `cpu.shares` (the kernel's; v2's largest `cpu.weight` is
/// mapped from it).
pub(super) const MAX_SHARES: u64 = 262_144;
/// Smallest memory limit, as in Mesos.
pub(super) const MIN_MEMORY_BYTES: u64 = 32 << 20;
/// How long a freeze may take before the kill goes ahead without it.
pub(super) const FREEZE_TIMEOUT: Duration = Duration::from_secs(1);

/// Why cgroups isolation cannot be used: the agent refuses to start.
#[derive(Debug, thiserror::Error)]
pub enum CgroupsError {
    /// A needed controller has no v1 hierarchy mounted (and the host
    /// offers no cgroup v2 hierarchy with the controllers either).
    #[error("--isolation cgroups needs the {controller} controller, but no cgroup v1 hierarchy in /proc/self/mountinfo has it{hint}; mount it or run with --isolation posix")]
    MissingController {
        /// The controller.
        controller: &'static str,
        /// What the host has instead.
        hint: String,
    },
    /// A needed controller is not offered by the cgroup v2 hierarchy (on
    /// a host with no v1 hierarchy of the needed controllers).
    #[error("--isolation cgroups needs the {controller} controller, but the cgroup v2 hierarchy does not offer it: {path} lists {offered:?} (and no cgroup v1 hierarchy has it); enable it in the parent cgroup's cgroup.subtree_control or run with --isolation posix")]
    MissingV2Controller {
        /// The controller.
        controller: &'static str,
        /// The `cgroup.controllers` file read.
        path: PathBuf,
        /// What it lists.
        offered: String,
    },
    /// A needed controller's directory cannot be created or written.
    #[error("--isolation cgroups cannot use the {controller} controller: {path}: {source}; run the agent as root (or give it that cgroup)")]
    NotWritable {
        /// The controller.
        controller: &'static str,
        /// The directory or file.
        path: PathBuf,
        /// The OS error.
        source: io::Error,
    },
    /// A needed cgroup v2 controller cannot be enabled for the cgroups
    /// below a directory (its `cgroup.subtree_control`).
    #[error(
        "--isolation cgroups cannot enable the {controller} controller in {path}: {source}{hint}"
    )]
    CannotEnable {
        /// The controller.
        controller: &'static str,
        /// The `cgroup.subtree_control` file.
        path: PathBuf,
        /// The OS error.
        source: io::Error,
        /// What to do about it.
        hint: &'static str,
    },
    /// The cgroup v2 directory that holds the containers cannot be created
    /// or written.
    #[error("--isolation cgroups cannot use the cgroup v2 hierarchy: {path}: {source}; run the agent as root (or give it that cgroup)")]
    V2NotWritable {
        /// The directory or file.
        path: PathBuf,
        /// The OS error.
        source: io::Error,
    },
    /// A needed controller file is missing (a kernel built without it).
    #[error("--isolation cgroups: {path} does not exist{hint}")]
    MissingFile {
        /// The file.
        path: PathBuf,
        /// What to do about it.
        hint: &'static str,
    },
    /// `/proc` could not be read.
    #[error("--isolation cgroups: cannot read {path}: {source}")]
    Proc {
        /// The file.
        path: &'static str,
        /// The OS error.
        source: io::Error,
    },
    /// `--cgroups-root` cannot be given the agent's CPU weight.
    #[error("--isolation cgroups cannot give --cgroups-root the weight of the agent's cpus: {0}")]
    RootWeight(io::Error),
    /// `--cgroups-root` is not a plain name.
    #[error("invalid --cgroups-root {0:?}: use names of letters, digits, '-', '_' and '.' separated by '/'")]
    BadRoot(String),
}

/// Where the agent puts containers, and which cgroup version drives them.
// One per agent, behind an `Arc`: the size of the v1 variant costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub(crate) enum Cgroups {
    /// A hierarchy per controller.
    V1(v1::Cgroups),
    /// The unified hierarchy.
    V2(v2::Cgroups),
}

/// One container.
#[derive(Debug)]
pub(crate) enum Container {
    /// A cgroup per controller.
    V1(v1::Container),
    /// One cgroup v2 directory.
    V2(v2::Container),
}

/// What a readable [`Container::oom_fd`] meant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OomEvent {
    /// The container ran out of memory.
    OutOfMemory,
    /// Something else (another memory event): keep watching.
    Nothing,
    /// The container's cgroup is gone: no event is coming.
    Removed,
}

/// What a container used, as `/monitor/statistics` reports it (Mesos's
/// `ResourceStatistics` names where there is one).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ContainerStats {
    /// CPU time in user mode.
    pub cpus_user_time_secs: f64,
    /// CPU time in the kernel.
    pub cpus_system_time_secs: f64,
    /// `cpus` the container is limited to (its CFS quota, or its shares
    /// without CFS).
    pub cpus_limit: f64,
    /// CFS periods that have elapsed.
    pub cpus_nr_periods: u64,
    /// CFS periods in which the container was throttled.
    pub cpus_nr_throttled: u64,
    /// Total time the container was throttled.
    pub cpus_throttled_time_secs: f64,
    /// Memory in use now.
    pub mem_total_bytes: u64,
    /// Most memory in use at once.
    pub mem_max_bytes: u64,
    /// The hard memory limit.
    pub mem_limit_bytes: u64,
    /// Out-of-memory kills in the container.
    pub mem_oom_kills: u64,
    /// Processes and threads now.
    pub processes: u64,
    /// `pids.max`.
    pub processes_limit: u64,
    /// Forks refused at `pids.max`.
    pub processes_limit_hits: u64,
}

// === impl Cgroups ===

impl Cgroups {
    /// Finds the cgroup hierarchies from `/proc/self/mountinfo`, picks
    /// the cgroup version (v1 when its controllers are mounted, else v2)
    /// and creates `--cgroups-root` there: an error names the first
    /// controller that is missing or not writable.
    pub(crate) fn discover(config: &CgroupsConfig) -> Result<Cgroups, CgroupsError> {
        let valid = !config.root.is_empty()
            && config.root.split('/').all(|part| {
                !part.is_empty()
                    && !part.starts_with('.')
                    && part
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
            });
        if !valid {
            return Err(CgroupsError::BadRoot(config.root.clone()));
        }
        let read = |path: &'static str| {
            std::fs::read_to_string(path).map_err(|source| CgroupsError::Proc { path, source })
        };
        Self::discover_in(
            config,
            &read("/proc/self/mountinfo")?,
            &read("/proc/self/cgroup")?,
        )
    }

    /// [`Cgroups::discover`] given the texts of `/proc/self/mountinfo`
    /// and `/proc/self/cgroup`.
    pub(super) fn discover_in(
        config: &CgroupsConfig,
        mountinfo_text: &str,
        cgroup_text: &str,
    ) -> Result<Cgroups, CgroupsError> {
        let mounts = mountinfo::cgroup_mounts(mountinfo_text);
        let own = mountinfo::process_cgroups(cgroup_text);
        let Some(missing) = v1::missing_controller(&mounts) else {
            return v1::Cgroups::discover_in(config, &mounts, &own).map(Cgroups::V1);
        };
        // Some v1 controllers mounted: a v1 or hybrid host, where the
        // unified hierarchy is only used if it has all it takes.
        let v1_in_use = mounts.iter().any(|m| {
            !m.unified
                && m.controllers
                    .iter()
                    .any(|c| v1::CONTROLLERS.contains(&c.as_str()))
        });
        let mut hint = String::new();
        if let Some(parent) = v2::hierarchy(&mounts, &own) {
            let offered = v2::offered(&parent);
            if !v1_in_use || v2::missing_controller(&offered).is_none() {
                return v2::Cgroups::discover_in(config, &parent).map(Cgroups::V2);
            }
            hint = format!(
                " (nor does the unified cgroup v2 hierarchy at {}, which offers {:?})",
                parent.display(),
                offered.join(" ")
            );
        }
        Err(CgroupsError::MissingController {
            controller: missing,
            hint,
        })
    }

    /// Gives `--cgroups-root` the CPU weight of `cpus`, the CPUs the
    /// agent offers (`cpu.shares` on v1, `cpu.weight` on v2), and returns
    /// what it wrote.
    ///
    /// Left at the default, every container of the agent together would
    /// weigh as much as one process outside it: whenever the machine is
    /// busy, the tasks that were given `cpus` CPUs would share about one
    /// CPU's worth of time against the agent's, the master's or any
    /// daemon's threads. Kubernetes gives its `kubepods` cgroup the
    /// node's allocatable CPUs the same way. Each container's own shares
    /// (and CFS quota) still divide the root's time among the tasks.
    pub(crate) fn weigh_root(&self, cpus: f64) -> Result<u64, CgroupsError> {
        match self {
            Cgroups::V1(c) => c.weigh_root(cpus),
            Cgroups::V2(c) => c.weigh_root(cpus),
        }
        .map_err(CgroupsError::RootWeight)
    }

    /// `"v1"` or `"v2"`.
    pub(crate) fn version(&self) -> &'static str {
        match self {
            Cgroups::V1(_) => "v1",
            Cgroups::V2(_) => "v2",
        }
    }

    /// Whether a container can be handed to a user (for a process of
    /// theirs to enter it, [`Container::delegate`]): on cgroup v1 a
    /// process may move itself into a cgroup whose `tasks` file it can
    /// write; on v2 it would also need the `cgroup.procs` of the cgroup
    /// above every container.
    pub(crate) fn delegates(&self) -> bool {
        matches!(self, Cgroups::V1(_))
    }

    /// Whether ended containers are kept for reuse: on cgroup v1 where
    /// its directories take the extended attribute that names the run a
    /// reused container holds (v2 would need its memory peak and CPU time
    /// counted from a base: not yet).
    pub(crate) fn reuses(&self) -> bool {
        match self {
            Cgroups::V1(c) => c.reuses(),
            Cgroups::V2(_) => false,
        }
    }

    /// The directory holding the containers of `controller`.
    pub(crate) fn base(&self, controller: &str) -> Option<&Path> {
        match self {
            Cgroups::V1(c) => c.base(controller),
            Cgroups::V2(c) => c.base(controller),
        }
    }

    /// Creates the container `name` (an executor's run id) with `limits`.
    pub(crate) fn create(&self, name: &str, limits: &Limits) -> io::Result<(Container, Limits)> {
        match self {
            Cgroups::V1(c) => c.create(name, limits).map(|(c, l)| (Container::V1(c), l)),
            Cgroups::V2(c) => c.create(name, limits).map(|(c, l)| (Container::V2(c), l)),
        }
    }

    /// An empty `container`, now holding run `run` (cgroup v1): a
    /// container kept for reuse costs an extended attribute, not the
    /// kernel's making and freeing of a cgroup in every hierarchy. (Not
    /// on v2 yet, whose containers are not reused.)
    pub(crate) fn reassign(&self, container: &Container, run: &str) -> io::Result<Container> {
        match (self, container) {
            (Cgroups::V1(c), Container::V1(container)) => {
                c.reassign(container, run).map(Container::V1)
            }
            _ => Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "only cgroup v1 containers are reused",
            )),
        }
    }

    /// The container run `name` holds, if it exists (after an agent
    /// restart, once [`Cgroups::names`] has been read).
    pub(crate) fn open(&self, name: &str) -> Option<Container> {
        match self {
            Cgroups::V1(c) => c.open(name).map(Container::V1),
            Cgroups::V2(c) => c.open(name).map(Container::V2),
        }
    }

    /// The runs that hold the containers under `--cgroups-root` (a
    /// container not reused: the run it is named after).
    pub(crate) fn names(&self) -> Vec<String> {
        match self {
            Cgroups::V1(c) => c.names(),
            Cgroups::V2(c) => c.names(),
        }
    }

    /// Runs `spawn` (which starts one process, on this thread) so that
    /// the process it starts is born in `container`: on cgroup v1 the
    /// thread enters the container while `spawn` runs (`spawn` is given
    /// `None`); on v2 `spawn` is given the container's directory, to spawn
    /// the process into with `clone3` and `CLONE_INTO_CGROUP`.
    pub(crate) fn spawn_inside<T>(
        &self,
        container: &Container,
        spawn: impl FnOnce(Option<BorrowedFd<'_>>) -> io::Result<T>,
    ) -> io::Result<T> {
        match (self, container) {
            (Cgroups::V1(c), Container::V1(container)) => c.spawn_inside(container, spawn),
            (Cgroups::V2(c), Container::V2(container)) => c.spawn_inside(container, spawn),
            _ => Err(mismatch()),
        }
    }

    /// Writes `limits`, grown to at least `written` (the ones written
    /// before, if any), and returns what is now written.
    pub(crate) fn set_limits(
        &self,
        container: &Container,
        written: Option<Limits>,
        limits: &Limits,
    ) -> io::Result<Limits> {
        match (self, container) {
            (Cgroups::V1(c), Container::V1(container)) => c.set_limits(container, written, limits),
            (Cgroups::V2(c), Container::V2(container)) => c.set_limits(container, written, limits),
            _ => Err(mismatch()),
        }
    }

    /// Kills and removes every container under `--cgroups-root`, then
    /// the root itself: `Err` names what could not be removed.
    pub(crate) fn destroy_all(&self) -> Result<(), String> {
        match self {
            Cgroups::V1(c) => c.destroy_all(),
            Cgroups::V2(c) => c.destroy_all(),
        }
    }
}

/// Kills and removes each container `names` opens (one version's
/// driver), retrying a removal while processes are still leaving for up
/// to 10 s: `Err` names the container that could not be removed.
pub(super) fn kill_and_remove_each<C>(
    names: Vec<String>,
    open: impl Fn(&str) -> Option<C>,
    kill_all: impl Fn(&C),
    remove: impl Fn(&C) -> io::Result<bool>,
) -> Result<(), String> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    for name in names {
        let Some(container) = open(&name) else {
            continue;
        };
        loop {
            kill_all(&container);
            match remove(&container) {
                Ok(true) => break,
                Ok(false) if std::time::Instant::now() < deadline => {
                    std::thread::sleep(std::time::Duration::from_millis(10))
                }
                Ok(false) => return Err(format!("container {name} still holds processes")),
                Err(e) => return Err(format!("container {name}: {e}")),
            }
        }
    }
    Ok(())
}

fn mismatch() -> io::Error {
    io::Error::other("a container of one cgroup version handed to the driver of the other")
}

// === impl Container ===

impl Container {
    /// The run it holds (an executor's or a command task's run id).
    pub(crate) fn name(&self) -> &str {
        match self {
            Container::V1(c) => c.name(),
            Container::V2(c) => c.name(),
        }
    }

    /// The files a process writes `0` into to move itself into the
    /// container: `tasks` in each v1 hierarchy (which moves the calling
    /// thread: all of a process that has one, and without the kernel's
    /// lock on every thread group), `cgroup.procs` on v2.
    pub(crate) fn entry_files(&self) -> Vec<PathBuf> {
        match self {
            Container::V1(c) => c.entry_files(),
            Container::V2(c) => c.entry_files(),
        }
    }

    /// The name of its directories: that of the run it was made for,
    /// which a reused container keeps.
    pub(crate) fn dir_name(&self) -> &str {
        match self {
            Container::V1(c) => c.lasting_name(),
            Container::V2(c) => c.name(),
        }
    }

    /// Gives the files of [`Container::entry_files`] to `uid`/`gid`, so a
    /// process of theirs can enter the container (cgroup v1 only; see
    /// [`Cgroups::delegates`]).
    pub(crate) fn delegate(&self, uid: u32, gid: u32) -> io::Result<()> {
        for file in self.entry_files() {
            std::os::unix::fs::chown(&file, Some(uid), Some(gid)).map_err(|e| {
                io::Error::new(e.kind(), format!("cannot chown {}: {e}", file.display()))
            })?;
        }
        Ok(())
    }

    /// A descriptor that becomes readable when the container may have had
    /// an out-of-memory event: an eventfd on `memory.oom_control` (v1),
    /// an inotify watch of `memory.events` (v2). [`Container::oom_event`]
    /// says what it meant.
    pub(crate) fn oom_fd(&self) -> io::Result<OwnedFd> {
        match self {
            Container::V1(c) => c.oom_eventfd(),
            Container::V2(c) => c.oom_inotify(),
        }
    }

    /// What a readable [`Container::oom_fd`] meant; drains it.
    pub(crate) fn oom_event(&self, fd: BorrowedFd<'_>) -> OomEvent {
        match self {
            Container::V1(c) => c.oom_event(fd),
            Container::V2(c) => c.oom_event(fd),
        }
    }

    /// Forgets the peaks and CPU time counted so far (for a container
    /// reused for another task; v1 only, where they can be reset).
    pub(crate) fn reset_usage(&self) {
        if let Container::V1(c) = self {
            c.reset_usage();
        }
    }

    /// Forks refused at the container's pids limit so far.
    pub(crate) fn pids_limit_hits(&self) -> u64 {
        match self {
            Container::V1(c) => c.pids_limit_hits(),
            Container::V2(c) => c.pids_limit_hits(),
        }
    }

    /// Out-of-memory kills in the container so far.
    pub(crate) fn oom_kills(&self) -> u64 {
        match self {
            Container::V1(c) => c.oom_kills(),
            Container::V2(c) => c.oom_kills(),
        }
    }

    /// The hard memory limit and the most memory used at once, in bytes.
    pub(crate) fn memory_limit_and_peak(&self) -> (u64, u64) {
        match self {
            Container::V1(c) => c.memory_limit_and_peak(),
            Container::V2(c) => c.memory_limit_and_peak(),
        }
    }

    /// Whether it surely holds no process, not even one exited and not
    /// yet reaped (cgroup v1; `false` on v2, whose containers are not
    /// reused).
    pub(crate) fn surely_empty(&self) -> bool {
        match self {
            Container::V1(c) => c.surely_empty(),
            Container::V2(_) => false,
        }
    }

    /// The pids in the container.
    pub(crate) fn pids(&self) -> Vec<i32> {
        match self {
            Container::V1(c) => c.pids(),
            Container::V2(c) => c.pids(),
        }
    }

    /// Kills every process of the container, including those that left
    /// its session or double-forked. Returns how many were signalled.
    pub(crate) fn kill_all(&self) -> usize {
        match self {
            Container::V1(c) => c.kill_all(),
            Container::V2(c) => c.kill_all(),
        }
    }

    /// Removes the container's cgroups: `Ok(false)` while some still hold
    /// processes (retry once they are gone).
    pub(crate) fn remove(&self) -> io::Result<bool> {
        match self {
            Container::V1(c) => c.remove(),
            Container::V2(c) => c.remove(),
        }
    }

    /// What the container used so far.
    pub(crate) fn stats(&self) -> ContainerStats {
        match self {
            Container::V1(c) => c.stats(),
            Container::V2(c) => c.stats(),
        }
    }
}

/// The `cpu.shares` that stand for `cpus` (v2's `cpu.weight` is mapped
/// from them).
pub(super) fn shares_of(cpus: f64) -> u64 {
    ((1024.0 * cpus).floor() as u64).clamp(MIN_SHARES, MAX_SHARES)
}

pub(super) fn write(dir: &Path, file: &str, value: impl std::fmt::Display) -> io::Result<()> {
    let path = dir.join(file);
    std::fs::write(&path, value.to_string())
        .map_err(|e| io::Error::new(e.kind(), format!("cannot write {}: {e}", path.display())))
}

pub(super) fn read_small(path: &Path) -> Option<String> {
    let mut text = String::new();
    std::fs::File::open(path)
        .ok()?
        .take(64 * 1024)
        .read_to_string(&mut text)
        .ok()?;
    Some(text)
}

pub(super) fn read_u64(path: &Path) -> Option<u64> {
    read_small(path)?.trim().parse().ok()
}

pub(super) fn read_i64(path: &Path) -> Option<i64> {
    read_small(path)?.trim().parse().ok()
}

/// The value of `key` in a flat keyed file (`key value` per line).
pub(super) fn read_keyed(path: &Path, key: &str) -> Option<u64> {
    parse_keyed(&read_small(path)?, key)
}

pub(super) fn parse_keyed(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let (k, v) = line.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok())?
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    /// Cgroups under a root unique to this test, destroyed on drop; `None`
    /// (with the reason printed) where cgroups cannot be used.
    pub(crate) struct TestCgroups(pub(crate) Cgroups);

    impl TestCgroups {
        pub(crate) fn new(test: &str) -> Option<TestCgroups> {
            let root = format!("agora-test-{}-{test}", std::process::id());
            match crate::isolation::check_cgroups(&root) {
                Ok(()) => {}
                Err(why) => {
                    eprintln!("skipping {test}: {why}");
                    return None;
                }
            }
            let config = CgroupsConfig {
                root,
                ..Default::default()
            };
            Some(TestCgroups(
                Cgroups::discover(&config).expect("discovered before"),
            ))
        }
    }

    impl Drop for TestCgroups {
        fn drop(&mut self) {
            if let Err(e) = self.0.destroy_all() {
                eprintln!("cleaning up test cgroups: {e}");
            }
        }
    }

    /// What a test starts: `program` with `args`, in `dir`.
    pub(crate) struct Spawn {
        pub(crate) program: String,
        pub(crate) args: Vec<String>,
        pub(crate) dir: PathBuf,
    }

    /// `/bin/sh -c script`, in `dir`.
    pub(crate) fn sh(script: &str, dir: &Path) -> Spawn {
        Spawn {
            program: "/bin/sh".into(),
            args: vec!["-c".into(), script.into()],
            dir: dir.to_path_buf(),
        }
    }

    impl Spawn {
        /// Starts it where [`Cgroups::spawn_inside`] says: where this
        /// thread is (`None`), or moved into the cgroup v2 directory
        /// `birth` before it runs its program (the agent's own spawner
        /// uses `clone3` there instead).
        #[allow(unsafe_code)]
        pub(crate) fn start(&self, birth: Option<BorrowedFd<'_>>) -> io::Result<TestProcess> {
            use std::os::unix::process::CommandExt;
            let mut command = std::process::Command::new(&self.program);
            command
                .args(&self.args)
                .current_dir(&self.dir)
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null());
            // Open until the spawn returns.
            let procs = match birth {
                Some(dir) => Some(
                    std::fs::OpenOptions::new()
                        .write(true)
                        .open(format!("/proc/self/fd/{}/cgroup.procs", dir.as_raw_fd()))?,
                ),
                None => None,
            };
            if let Some(fd) = procs.as_ref().map(|f| f.as_raw_fd()) {
                // SAFETY: the step only calls write(2), which is
                // async-signal-safe, on a descriptor opened before the
                // fork.
                unsafe {
                    command.pre_exec(move || {
                        if libc::write(fd, b"0".as_ptr().cast(), 1) < 0 {
                            return Err(io::Error::last_os_error());
                        }
                        Ok(())
                    });
                }
            }
            command.spawn().map(TestProcess)
        }
    }

    /// A process a test started.
    #[derive(Debug)]
    pub(crate) struct TestProcess(std::process::Child);

    impl TestProcess {
        pub(crate) fn pid(&self) -> u32 {
            self.0.id()
        }

        /// Reaps it once it exited.
        pub(crate) fn reap(&mut self) -> Option<std::process::ExitStatus> {
            self.0.try_wait().ok().flatten()
        }
    }

    /// Whether `pid` is a live process (not a zombie).
    pub(crate) fn is_alive(pid: u32) -> bool {
        std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
            stat.rsplit_once(')')
                .is_some_and(|(_, rest)| !rest.trim_start().starts_with('Z'))
        })
    }

    /// A fake cgroup2 mount at `dir`, made of plain files: the kernel's
    /// part of a root cgroup that offers `controllers`, and of the
    /// `--cgroups-root` directory `root` below it (as the kernel would
    /// fill it once the controllers are enabled).
    pub(crate) fn fake_cgroup2(dir: &Path, controllers: &str, root: &str) {
        std::fs::write(dir.join("cgroup.controllers"), format!("{controllers}\n")).unwrap();
        std::fs::write(dir.join("cgroup.subtree_control"), "").unwrap();
        let root = dir.join(root);
        std::fs::create_dir_all(&root).unwrap();
        for file in ["cgroup.subtree_control", "cgroup.procs", "cpu.max"] {
            std::fs::write(root.join(file), "").unwrap();
        }
        std::fs::write(root.join("cgroup.controllers"), format!("{controllers}\n")).unwrap();
    }

    /// A fake set of cgroup v1 hierarchies under `dir`, one per needed
    /// controller, as mountinfo lines.
    fn fake_v1(dir: &Path) -> String {
        let mut mountinfo = String::new();
        for (i, controller) in v1::CONTROLLERS.iter().enumerate() {
            let mount = dir.join(controller);
            std::fs::create_dir_all(&mount).unwrap();
            std::fs::write(mount.join("tasks"), "").unwrap();
            mountinfo.push_str(&format!(
                "{} 31 0:{} / {} rw - cgroup cgroup rw,{controller}\n",
                40 + i,
                30 + i,
                mount.display()
            ));
        }
        mountinfo
    }

    #[test]
    fn keyed_files_parse() {
        let text = "oom_kill_disable 0\nunder_oom 0\noom_kill 3\n";
        assert_eq!(parse_keyed(text, "oom_kill"), Some(3));
        assert_eq!(parse_keyed(text, "oom"), None);
        assert_eq!(parse_keyed("max 7\n", "max"), Some(7));
    }

    #[test]
    fn a_hybrid_host_is_driven_as_v1_and_a_v2_only_host_as_v2() {
        let tmp = tempfile::tempdir().unwrap();
        let config = CgroupsConfig {
            enable_cfs: false,
            ..Default::default()
        };
        // Hybrid: the v1 controllers mounted, and a unified hierarchy that
        // (in this fake) would offer them too.
        let unified = tmp.path().join("unified");
        std::fs::create_dir(&unified).unwrap();
        fake_cgroup2(&unified, "cpu memory pids", &config.root);
        let hybrid = format!(
            "{}50 31 0:50 / {} rw - cgroup2 cgroup2 rw\n",
            fake_v1(tmp.path()),
            unified.display()
        );
        let cgroups = Cgroups::discover_in(&config, &hybrid, "0::/\n").unwrap();
        assert_eq!(cgroups.version(), "v1");
        assert_eq!(
            cgroups.base("memory"),
            Some(tmp.path().join("memory/agora").as_path())
        );
        // v2 only.
        let v2_only = format!(
            "50 31 0:50 / {} rw - cgroup2 cgroup2 rw\n",
            unified.display()
        );
        let cgroups = Cgroups::discover_in(&config, &v2_only, "0::/\n").unwrap();
        assert_eq!(cgroups.version(), "v2");
        assert_eq!(
            cgroups.base("memory"),
            Some(unified.join("agora").as_path())
        );
        assert_eq!(cgroups.base("cpu"), cgroups.base("pids"));
    }

    #[test]
    fn a_missing_controller_is_named() {
        let config = CgroupsConfig::default();
        // Everything but pids: refused before anything is created.
        let mountinfo = "\
32 31 0:29 / /nonexistent/cpu rw - cgroup cgroup rw,cpu,cpuacct
35 31 0:32 / /nonexistent/memory rw - cgroup cgroup rw,memory
37 31 0:34 / /nonexistent/freezer rw - cgroup cgroup rw,freezer
41 31 0:38 / /nonexistent/unified rw - cgroup2 cgroup2 rw
";
        let err = Cgroups::discover_in(&config, mountinfo, "0::/\n").unwrap_err();
        assert!(
            matches!(
                err,
                CgroupsError::MissingController {
                    controller: "pids",
                    ..
                }
            ),
            "{err}"
        );
        let text = err.to_string();
        assert!(text.contains("needs the pids controller"), "{text}");
        assert!(
            text.contains("nor does the unified cgroup v2 hierarchy at /nonexistent/unified"),
            "{text}"
        );
        assert!(!Path::new("/nonexistent").exists());
        // A v2-only host whose hierarchy offers none of them.
        let v2 = "41 31 0:38 / /nonexistent/v2 rw - cgroup2 cgroup2 rw\n";
        let err = Cgroups::discover_in(&config, v2, "0::/\n").unwrap_err();
        assert!(
            matches!(
                err,
                CgroupsError::MissingV2Controller {
                    controller: "cpu",
                    ..
                }
            ),
            "{err}"
        );
        // Neither.
        let err = Cgroups::discover_in(&config, "", "").unwrap_err();
        assert!(
            err.to_string().contains("needs the cpu controller"),
            "{err}"
        );
    }

    #[test]
    fn bad_roots_are_refused() {
        for root in ["", "/abs", "a//b", "../up", "a/.b", "sp ace"] {
            let config = CgroupsConfig {
                root: root.into(),
                ..Default::default()
            };
            assert!(
                matches!(Cgroups::discover(&config), Err(CgroupsError::BadRoot(_))),
                "{root:?}"
            );
        }
    }
}
