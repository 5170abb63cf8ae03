//! The cgroup v2 driver behind [`super::cgroups`]: containers as
//! directories of the unified hierarchy.
//!
//! Each container is one directory, `<cgroup2 mount>/<--cgroups-root>/<run
//! id>`, with the `cpu`, `memory` and `pids` controllers enabled down to
//! it through the `cgroup.subtree_control` of the mount's cgroup and of
//! each directory of `--cgroups-root`. The root goes under the mount
//! point, not under the agent's own cgroup as on v1: v2 lets a cgroup
//! other than the hierarchy's root enable controllers for its children
//! only while it holds no process itself, and the agent's own cgroup
//! holds the agent (Mesos and Docker's cgroupfs driver do the same).
//!
//! - CPU: `cpu.weight` mapped from v1's shares (`1024 × cpus`) as runc
//!   does, and with `--cgroups-enable-cfs` `cpu.max` `"<quota> <period>"`.
//! - Memory: `memory.max`, and `memory.swap.max` 0 where the kernel has
//!   swap accounting. Out-of-memory kills are counted in `memory.events`
//!   (`oom_kill`), which the agent watches with inotify: v2 has no
//!   eventfd.
//! - pids: `pids.max`.
//!
//! An executor is born inside its container: the process thread starts
//! it with `clone3(CLONE_INTO_CGROUP)` (Linux 5.7) given the container's
//! directory. v1's way, the thread entering the container around the
//! spawn, does not exist on v2: a process's threads are all in one
//! cgroup, so moving the thread (writing its id to `cgroup.procs`) moves
//! the whole agent, whose threads would count against the container's
//! `pids.max` and whose allocations would be charged to it meanwhile.
//!
//! A kill writes `cgroup.kill` (Linux 5.14); older kernels freeze the
//! cgroup (`cgroup.freeze`), SIGKILL every pid in `cgroup.procs` and
//! thaw it, as v1 does with the freezer.

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use super::cgroups::{
    parse_keyed, read_keyed, read_small, read_u64, shares_of, write, CgroupsError, ContainerStats,
    OomEvent, CFS_PERIOD_US, FREEZE_TIMEOUT, MAX_SHARES, MIN_CFS_QUOTA_US, MIN_MEMORY_BYTES,
    MIN_SHARES,
};
use super::cgroups_v1;
use super::mountinfo::{self, CgroupMount};
use super::{CgroupsConfig, Limits};

/// The controllers a container needs.
pub(crate) const CONTROLLERS: [&str; 3] = ["cpu", "memory", "pids"];

/// Largest `cpu.weight`.
const MAX_WEIGHT: u64 = 10_000;

/// The directory the agent puts containers in.
#[derive(Debug)]
pub(crate) struct Cgroups {
    /// `<mount>/<--cgroups-root>`.
    base: PathBuf,
    config: CgroupsConfig,
}

/// One container: a cgroup v2 directory.
#[derive(Debug)]
pub(crate) struct Container {
    name: String,
    dir: PathBuf,
    /// The most `memory.current` seen, on kernels without `memory.peak`
    /// (before 5.19).
    peak_seen: AtomicU64,
}

/// The mount point of the cgroup2 hierarchy (the one the agent's own
/// cgroup is visible in, when there are several mounts): the directory
/// `--cgroups-root` goes in. `own` are the lines of `/proc/self/cgroup`.
pub(crate) fn hierarchy(
    mounts: &[CgroupMount],
    own: &[(u32, Vec<String>, String)],
) -> Option<PathBuf> {
    let own = own
        .iter()
        .find(|(id, controllers, _)| *id == 0 && controllers.is_empty())
        .map(|(_, _, path)| path.as_str());
    let unified = || mounts.iter().filter(|m| m.unified);
    unified()
        .find(|m| own.is_some_and(|p| mountinfo::cgroup_dir(&m.mount_point, &m.root, p).is_some()))
        .or_else(|| unified().next())
        .map(|m| m.mount_point.clone())
}

/// The controllers `dir`'s `cgroup.controllers` lists (none when it
/// cannot be read).
pub(crate) fn offered(dir: &Path) -> Vec<String> {
    read_small(&dir.join("cgroup.controllers"))
        .unwrap_or_default()
        .split_whitespace()
        .map(str::to_string)
        .collect()
}

/// The first of [`CONTROLLERS`] not in `offered`.
pub(crate) fn missing_controller(offered: &[String]) -> Option<&'static str> {
    CONTROLLERS
        .iter()
        .copied()
        .find(|c| !offered.iter().any(|o| o == c))
}

/// `cpu.weight` for v1 `cpu.shares`, mapped as runc does: shares
/// 2..=262144 onto weight 1..=10000 (1024, one CPU, is weight 39).
pub(crate) fn weight_of_shares(shares: u64) -> u64 {
    let shares = shares.clamp(MIN_SHARES, MAX_SHARES);
    (1 + ((shares - 2) * (MAX_WEIGHT - 1)) / (MAX_SHARES - 2)).min(MAX_WEIGHT)
}

/// The CPUs a `cpu.weight` stands for (the inverse of
/// [`weight_of_shares`], to about 1 %).
fn cpus_of_weight(weight: u64) -> f64 {
    let shares = MIN_SHARES + weight.saturating_sub(1) * (MAX_SHARES - 2) / (MAX_WEIGHT - 1);
    shares as f64 / 1024.0
}

/// A number, or `u64::MAX` for `max` (no limit).
fn read_limit(path: &Path) -> Option<u64> {
    match read_small(path)?.trim() {
        "max" => Some(u64::MAX),
        n => n.parse().ok(),
    }
}

/// Enables [`CONTROLLERS`] for the cgroups below `dir`, each on its own
/// (so that an error names it), unless already enabled.
fn enable(dir: &Path) -> Result<(), CgroupsError> {
    let path = dir.join("cgroup.subtree_control");
    let enabled = read_small(&path).unwrap_or_default();
    for controller in CONTROLLERS {
        if enabled
            .split_whitespace()
            .any(|c| c.trim_start_matches('+') == controller)
        {
            continue;
        }
        // Appending, so that a plain file (a fake hierarchy in tests)
        // keeps every controller; the kernel reads each write alone.
        let written = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .and_then(|mut f| io::Write::write_all(&mut f, format!("+{controller}\n").as_bytes()));
        if let Err(source) = written {
            let hint = if source.raw_os_error() == Some(libc::EBUSY) {
                "; cgroup v2 lets a cgroup other than the root have controllers below it only while it holds no process itself: move its processes to a child cgroup"
            } else {
                "; run the agent as root (or give it that cgroup)"
            };
            return Err(CgroupsError::CannotEnable {
                controller,
                path,
                source,
                hint,
            });
        }
    }
    Ok(())
}

/// Freezes a cgroup: `true` once `cgroup.events` says it is frozen,
/// `false` if it did not within [`FREEZE_TIMEOUT`].
fn freeze(dir: &Path) -> bool {
    if write(dir, "cgroup.freeze", 1).is_err() {
        return false;
    }
    let deadline = Instant::now() + FREEZE_TIMEOUT;
    let mut pause = Duration::from_micros(100);
    while Instant::now() < deadline {
        match read_keyed(&dir.join("cgroup.events"), "frozen") {
            Some(1) => return true,
            Some(_) => std::thread::sleep(pause),
            None => return false,
        }
        pause = (pause * 2).min(Duration::from_millis(5));
    }
    false
}

// === impl Cgroups ===

impl Cgroups {
    /// Checks that the cgroup2 hierarchy's cgroup at `parent` offers the
    /// needed controllers, creates `--cgroups-root` in it and enables the
    /// controllers down to it: an error names the first controller that
    /// is missing or cannot be enabled.
    pub(crate) fn discover_in(
        config: &CgroupsConfig,
        parent: &Path,
    ) -> Result<Cgroups, CgroupsError> {
        let offered = offered(parent);
        if let Some(controller) = missing_controller(&offered) {
            return Err(CgroupsError::MissingV2Controller {
                controller,
                path: parent.join("cgroup.controllers"),
                offered: offered.join(" "),
            });
        }
        let mut dir = parent.to_path_buf();
        enable(&dir)?;
        for part in config.root.split('/') {
            dir.push(part);
            match std::fs::create_dir(&dir) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(source) => return Err(CgroupsError::V2NotWritable { path: dir, source }),
            }
            enable(&dir)?;
        }
        let procs = dir.join("cgroup.procs");
        if let Err(source) = std::fs::OpenOptions::new().write(true).open(&procs) {
            return Err(CgroupsError::V2NotWritable {
                path: procs,
                source,
            });
        }
        if config.enable_cfs && !dir.join("cpu.max").exists() {
            return Err(CgroupsError::MissingFile {
                path: dir.join("cpu.max"),
                hint:
                    " (a kernel without CFS bandwidth control); run with --cgroups-enable-cfs=false",
            });
        }
        Ok(Cgroups {
            base: dir,
            config: config.clone(),
        })
    }

    /// The directory holding the containers (the same for every
    /// controller).
    pub(crate) fn base(&self, controller: &str) -> Option<&Path> {
        cgroups_v1::CONTROLLERS
            .contains(&controller)
            .then_some(self.base.as_path())
    }

    /// Writes the `cpu.weight` of `cpus` into `--cgroups-root` (see
    /// [`super::cgroups::Cgroups::weigh_root`]).
    pub(crate) fn weigh_root(&self, cpus: f64) -> io::Result<u64> {
        let weight = weight_of_shares(shares_of(cpus));
        write(&self.base, "cpu.weight", weight)?;
        Ok(weight)
    }

    /// Creates the container `name` (an executor's run id) with `limits`.
    pub(crate) fn create(&self, name: &str, limits: &Limits) -> io::Result<(Container, Limits)> {
        let container = self.container(name);
        match std::fs::create_dir(&container.dir) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => {
                return Err(io::Error::new(
                    e.kind(),
                    format!("cannot create cgroup {}: {e}", container.dir.display()),
                ))
            }
        }
        match self.set_limits(&container, None, limits) {
            Ok(written) => Ok((container, written)),
            Err(e) => {
                let _ = container.remove();
                Err(e)
            }
        }
    }

    /// The container `name` if it exists (after an agent restart).
    pub(crate) fn open(&self, name: &str) -> Option<Container> {
        let container = self.container(name);
        container.dir.is_dir().then_some(container)
    }

    /// The names of every container under `--cgroups-root`.
    pub(crate) fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(&self.base)
            .into_iter()
            .flatten()
            .filter_map(|e| {
                let e = e.ok()?;
                e.file_type().ok()?.is_dir().then_some(())?;
                e.file_name().into_string().ok()
            })
            .collect();
        names.sort();
        names
    }

    /// Runs `spawn` on this thread with the container's directory, for
    /// the process it starts to be born in `container` (`clone3` into
    /// that directory).
    pub(crate) fn spawn_inside<T>(
        &self,
        container: &Container,
        spawn: impl FnOnce(Option<BorrowedFd<'_>>) -> io::Result<T>,
    ) -> io::Result<T> {
        let dir = std::fs::File::open(&container.dir).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("cannot enter cgroup {}: {e}", container.dir.display()),
            )
        })?;
        spawn(Some(dir.as_fd()))
    }

    /// Writes `limits`, grown to at least `written` (the ones written
    /// before, if any), and returns what is now written.
    pub(crate) fn set_limits(
        &self,
        container: &Container,
        written: Option<Limits>,
        limits: &Limits,
    ) -> io::Result<Limits> {
        let limits = match &written {
            Some(old) => old.max(limits),
            None => *limits,
        };
        if written == Some(limits) {
            return Ok(limits);
        }
        let dir = &container.dir;
        write(dir, "cpu.weight", weight_of_shares(shares_of(limits.cpus)))?;
        if self.config.enable_cfs {
            let quota = ((CFS_PERIOD_US as f64 * limits.cpus).round() as u64).max(MIN_CFS_QUOTA_US);
            write(dir, "cpu.max", format!("{quota} {CFS_PERIOD_US}"))?;
        }
        let bytes = ((limits.mem_mib * 1024.0 * 1024.0) as u64).max(MIN_MEMORY_BYTES);
        write(dir, "memory.max", bytes)?;
        // No swap, as v1's memsw limit equal to the memory limit.
        if written.is_none() && dir.join("memory.swap.max").exists() {
            write(dir, "memory.swap.max", 0)?;
        }
        write(dir, "pids.max", limits.pids.unwrap_or(self.config.pids_max))?;
        Ok(limits)
    }

    /// Kills and removes every container under `--cgroups-root`, then
    /// the root itself: `Err` names what could not be removed.
    pub(crate) fn destroy_all(&self) -> Result<(), String> {
        super::cgroups::kill_and_remove_each(
            self.names(),
            |name| self.open(name),
            |container| {
                container.kill_all();
            },
            Container::remove,
        )?;
        match std::fs::remove_dir(&self.base) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(format!("{}: {e}", self.base.display())),
        }
    }

    fn container(&self, name: &str) -> Container {
        Container {
            name: name.to_string(),
            dir: self.base.join(name),
            peak_seen: AtomicU64::new(0),
        }
    }
}

// === impl Container ===

impl Container {
    /// Its name (the executor's run id).
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// Its directory, whichever controller is asked for.
    #[cfg(test)]
    pub(crate) fn dir(&self, controller: &str) -> Option<&Path> {
        cgroups_v1::CONTROLLERS
            .contains(&controller)
            .then_some(self.dir.as_path())
    }

    /// An inotify descriptor that becomes readable when `memory.events`
    /// changes (any memory event: [`Container::oom_event`] tells an
    /// out-of-memory kill apart).
    pub(crate) fn oom_inotify(&self) -> io::Result<OwnedFd> {
        let inotify = Inotify::init(InitFlags::IN_CLOEXEC | InitFlags::IN_NONBLOCK)?;
        inotify.add_watch(&self.dir.join("memory.events"), AddWatchFlags::IN_MODIFY)?;
        Ok(OwnedFd::from(inotify))
    }

    /// What a readable [`Container::oom_inotify`] means: drains it, then
    /// reads `memory.events` (inotify events carry no counts). `max` and
    /// `high` events (reclaim at the limit) change the file too and are
    /// no out-of-memory event.
    pub(crate) fn oom_event(&self, inotify: BorrowedFd<'_>) -> OomEvent {
        let mut events = [0u8; 1024];
        while nix::unistd::read(inotify, &mut events).is_ok_and(|n| n > 0) {}
        if !self.dir.exists() {
            OomEvent::Removed
        } else if self.oom_kills() > 0 {
            OomEvent::OutOfMemory
        } else {
            OomEvent::Nothing
        }
    }

    /// Out-of-memory kills in the container so far.
    pub(crate) fn oom_kills(&self) -> u64 {
        read_keyed(&self.dir.join("memory.events"), "oom_kill").unwrap_or(0)
    }

    /// The hard memory limit and the most memory used at once, in bytes:
    /// `memory.peak`, or without it the most `memory.current` the agent
    /// has read (a lower bound).
    pub(crate) fn memory_limit_and_peak(&self) -> (u64, u64) {
        let limit = read_limit(&self.dir.join("memory.max")).unwrap_or(0);
        let current = read_u64(&self.dir.join("memory.current")).unwrap_or(0);
        (limit, self.peak(current))
    }

    fn peak(&self, current: u64) -> u64 {
        match read_u64(&self.dir.join("memory.peak")) {
            Some(peak) => peak,
            None => self
                .peak_seen
                .fetch_max(current, Ordering::Relaxed)
                .max(current),
        }
    }

    /// The pids in the container.
    pub(crate) fn pids(&self) -> Vec<i32> {
        std::fs::read_to_string(self.dir.join("cgroup.procs"))
            .map(|text| text.lines().filter_map(|l| l.trim().parse().ok()).collect())
            .unwrap_or_default()
    }

    /// Kills every process of the container, including those that left
    /// its session or double-forked: `cgroup.kill`, or where the kernel
    /// has none, [`Container::freeze_and_kill`]. Returns how many there
    /// were.
    pub(crate) fn kill_all(&self) -> usize {
        if !self.dir.is_dir() {
            return 0;
        }
        let pids = self.pids();
        if pids.is_empty() {
            return 0;
        }
        if self.dir.join("cgroup.kill").exists() && write(&self.dir, "cgroup.kill", 1).is_ok() {
            return pids.len();
        }
        self.freeze_and_kill()
    }

    /// Freeze (so none can fork or be missed), SIGKILL each, thaw (a
    /// frozen process dies of SIGKILL on v2, but thawing costs nothing).
    /// Returns how many were signalled.
    fn freeze_and_kill(&self) -> usize {
        let mut signalled = 0;
        for _ in 0..3 {
            let frozen = freeze(&self.dir);
            let pids = self.pids();
            for pid in &pids {
                if *pid > 1 && kill(Pid::from_raw(*pid), Signal::SIGKILL).is_ok() {
                    signalled += 1;
                }
            }
            let _ = write(&self.dir, "cgroup.freeze", 0);
            if frozen || pids.is_empty() {
                break;
            }
        }
        signalled
    }

    /// Forks refused at its `pids.max` so far.
    pub(crate) fn pids_limit_hits(&self) -> u64 {
        read_keyed(&self.dir.join("pids.events"), "max").unwrap_or(0)
    }

    /// Its `cgroup.procs`.
    pub(crate) fn entry_files(&self) -> Vec<PathBuf> {
        vec![self.dir.join("cgroup.procs")]
    }

    /// Removes the container's cgroup: `Ok(false)` while it still holds
    /// processes (retry once they are gone).
    pub(crate) fn remove(&self) -> io::Result<bool> {
        match std::fs::remove_dir(&self.dir) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(true),
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// What the container used so far.
    pub(crate) fn stats(&self) -> ContainerStats {
        let dir = &self.dir;
        let cpu_stat = read_small(&dir.join("cpu.stat")).unwrap_or_default();
        let cpu = |key| parse_keyed(&cpu_stat, key).unwrap_or(0);
        let (mem_limit_bytes, mem_max_bytes) = self.memory_limit_and_peak();
        ContainerStats {
            cpus_user_time_secs: cpu("user_usec") as f64 / 1e6,
            cpus_system_time_secs: cpu("system_usec") as f64 / 1e6,
            cpus_limit: self.cpus_limit(),
            cpus_nr_periods: cpu("nr_periods"),
            cpus_nr_throttled: cpu("nr_throttled"),
            cpus_throttled_time_secs: cpu("throttled_usec") as f64 / 1e6,
            mem_total_bytes: read_u64(&dir.join("memory.current")).unwrap_or(0),
            mem_max_bytes,
            mem_limit_bytes,
            mem_oom_kills: self.oom_kills(),
            processes: read_u64(&dir.join("pids.current")).unwrap_or(0),
            processes_limit: read_limit(&dir.join("pids.max")).unwrap_or(0),
            processes_limit_hits: self.pids_limit_hits(),
        }
    }

    /// Its CFS quota in CPUs, or without one what its weight stands for.
    fn cpus_limit(&self) -> f64 {
        let max = read_small(&self.dir.join("cpu.max")).unwrap_or_default();
        let mut fields = max.split_whitespace();
        let quota = fields.next().and_then(|q| q.parse::<u64>().ok());
        let period = fields.next().and_then(|p| p.parse::<u64>().ok());
        match (quota, period) {
            (Some(quota), Some(period)) if period > 0 => quota as f64 / period as f64,
            _ => read_u64(&self.dir.join("cpu.weight")).map_or(0.0, cpus_of_weight),
        }
    }
}

#[cfg(test)]
mod tests;
