//! Containers as cgroup v1 directories, written directly through the
//! cgroup file system.
//!
//! Each container is a directory named after its executor run under
//! `<hierarchy>/<agent's own cgroup>/<--cgroups-root>/` of each controller
//! the agent needs: `cpu` (shares, CFS quota), `cpuacct` (CPU time),
//! `memory` (hard limit, out-of-memory events), `pids` (`pids.max`) and
//! `freezer` (a kill that reaches every process). The hierarchies are
//! found in `/proc/self/mountinfo`, so controllers mounted separately (as
//! `cpu` and `cpuacct` are on some hosts) or together both work.
//!
//! An executor is born inside its container: the process thread moves
//! itself (its own thread id, through each `tasks` file) into the
//! container, spawns the executor, which inherits the thread's cgroups at
//! `clone`, and moves itself back. So no instruction of the executor ever
//! runs outside the container, and the spawn stays a `posix_spawn`.
//!
//! Files are written directly rather than through `cgroups-rs`: about a
//! dozen files are used, the hierarchies must be found from mountinfo
//! with controllers mounted separately (`cgroups-rs` 0.5 assumes its own
//! layout under `/sys/fs/cgroup`), and the launch path must stay a few
//! writes long.

use std::io::{self, Read};
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde::Serialize;

use super::mountinfo;
use super::{CgroupsConfig, Limits};
use crate::sys;

/// The controllers a container is made of, in this order.
pub(crate) const CONTROLLERS: [&str; 5] = ["cpu", "cpuacct", "memory", "pids", "freezer"];
const CPU: usize = 0;
const CPUACCT: usize = 1;
const MEMORY: usize = 2;
const PIDS: usize = 3;
const FREEZER: usize = 4;

/// CFS period, as in Mesos.
const CFS_PERIOD_US: u64 = 100_000;
/// Smallest CFS quota, as in Mesos.
const MIN_CFS_QUOTA_US: u64 = 1_000;
/// Smallest `cpu.shares`.
const MIN_SHARES: u64 = 2;
/// Smallest memory limit, as in Mesos.
const MIN_MEMORY_BYTES: u64 = 32 << 20;
/// How long a freeze may take before the kill goes ahead without it.
const FREEZE_TIMEOUT: Duration = Duration::from_secs(1);

/// Why cgroups isolation cannot be used: the agent refuses to start.
#[derive(Debug, thiserror::Error)]
pub enum CgroupsError {
    /// A needed controller has no v1 hierarchy mounted.
    #[error("--isolation cgroups needs the {controller} controller, but no cgroup v1 hierarchy in /proc/self/mountinfo has it{hint}; mount it or run with --isolation posix")]
    MissingController {
        /// The controller.
        controller: &'static str,
        /// What the host has instead.
        hint: String,
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
    /// `--cgroups-root` is not a plain name.
    #[error("invalid --cgroups-root {0:?}: use names of letters, digits, '-', '_' and '.' separated by '/'")]
    BadRoot(String),
}

/// The cgroup hierarchies the agent puts containers in.
#[derive(Debug)]
pub(crate) struct Cgroups {
    /// Per controller, the directory holding the containers.
    base: [PathBuf; 5],
    /// Per controller, the agent's own cgroup (where the process thread
    /// returns after a spawn).
    own: [PathBuf; 5],
    config: CgroupsConfig,
}

/// One container: a cgroup per controller.
#[derive(Debug)]
pub(crate) struct Container {
    name: String,
    dirs: [PathBuf; 5],
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
    /// Finds the hierarchies of the needed controllers from
    /// `/proc/self/mountinfo` and creates `--cgroups-root` under the
    /// agent's own cgroup in each: an error names the first controller
    /// that is missing or not writable.
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
    fn discover_in(
        config: &CgroupsConfig,
        mountinfo_text: &str,
        cgroup_text: &str,
    ) -> Result<Cgroups, CgroupsError> {
        let mounts = mountinfo::cgroup_mounts(mountinfo_text);
        let own = mountinfo::process_cgroups(cgroup_text);
        // Every controller is looked for before anything is created.
        let mut own_dirs: [PathBuf; 5] = Default::default();
        for (i, controller) in CONTROLLERS.iter().enumerate() {
            let Some(mount) = mounts
                .iter()
                .find(|m| !m.unified && m.controllers.iter().any(|c| c == controller))
            else {
                let v2_only = mounts
                    .iter()
                    .any(|m| m.unified && m.mount_point == Path::new("/sys/fs/cgroup"));
                let hint = if v2_only {
                    " (this host has only the unified cgroup v2 hierarchy, which this agent does not drive yet)".to_string()
                } else {
                    String::new()
                };
                return Err(CgroupsError::MissingController { controller, hint });
            };
            // The agent's own cgroup in that hierarchy, seen through the
            // mount (or the mount's root when it is not visible there).
            own_dirs[i] = own
                .iter()
                .find(|(_, cs, _)| cs.iter().any(|c| c == controller))
                .and_then(|(_, _, path)| {
                    mountinfo::cgroup_dir(&mount.mount_point, &mount.root, path)
                })
                .unwrap_or_else(|| mount.mount_point.clone());
        }
        let mut base: [PathBuf; 5] = Default::default();
        for (i, controller) in CONTROLLERS.iter().enumerate() {
            let dir = &own_dirs[i];
            let root = dir.join(&config.root);
            if let Err(source) = std::fs::create_dir_all(&root) {
                return Err(CgroupsError::NotWritable {
                    controller,
                    path: root,
                    source,
                });
            }
            let tasks = dir.join("tasks");
            if let Err(source) = std::fs::OpenOptions::new().write(true).open(&tasks) {
                return Err(CgroupsError::NotWritable {
                    controller,
                    path: tasks,
                    source,
                });
            }
            base[i] = root;
        }
        if config.enable_cfs && !base[CPU].join("cpu.cfs_quota_us").exists() {
            return Err(CgroupsError::MissingFile {
                path: base[CPU].join("cpu.cfs_quota_us"),
                hint:
                    " (a kernel without CFS bandwidth control); run with --cgroups-enable-cfs=false",
            });
        }
        Ok(Cgroups {
            base,
            own: own_dirs,
            config: config.clone(),
        })
    }

    /// The directory holding the containers of `controller`.
    pub(crate) fn base(&self, controller: &str) -> Option<&Path> {
        let i = CONTROLLERS.iter().position(|c| *c == controller)?;
        Some(&self.base[i])
    }

    /// Creates the container `name` (an executor's run id) with `limits`.
    pub(crate) fn create(&self, name: &str, limits: &Limits) -> io::Result<(Container, Limits)> {
        let container = self.container(name);
        for dir in container.unique_dirs() {
            match std::fs::create_dir(dir) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) => {
                    let _ = container.remove();
                    return Err(io::Error::new(
                        e.kind(),
                        format!("cannot create cgroup {}: {e}", dir.display()),
                    ));
                }
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
        container
            .dirs
            .iter()
            .any(|d| d.is_dir())
            .then_some(container)
    }

    /// The names of every container under `--cgroups-root`, in any
    /// controller.
    pub(crate) fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .base
            .iter()
            .filter_map(|base| std::fs::read_dir(base).ok())
            .flat_map(|entries| {
                entries.filter_map(|e| {
                    let e = e.ok()?;
                    e.file_type().ok()?.is_dir().then_some(())?;
                    e.file_name().into_string().ok()
                })
            })
            .collect();
        names.sort();
        names.dedup();
        names
    }

    /// Runs `spawn` on this thread while the thread is in `container`,
    /// so a process it starts is born there; the thread returns to the
    /// agent's own cgroups afterwards.
    pub(crate) fn spawn_inside<T>(
        &self,
        container: &Container,
        spawn: impl FnOnce() -> io::Result<T>,
    ) -> io::Result<T> {
        let tid = sys::gettid().to_string();
        let mut entered = Vec::new();
        for (i, dir) in container.dirs.iter().enumerate() {
            if entered.iter().any(|j: &usize| container.dirs[*j] == *dir) {
                continue;
            }
            if let Err(e) = std::fs::write(dir.join("tasks"), &tid) {
                self.leave(&tid, &entered);
                return Err(io::Error::new(
                    e.kind(),
                    format!("cannot enter cgroup {}: {e}", dir.display()),
                ));
            }
            entered.push(i);
        }
        let result = spawn();
        self.leave(&tid, &entered);
        result
    }

    fn leave(&self, tid: &str, entered: &[usize]) {
        for i in entered {
            if let Err(e) = std::fs::write(self.own[*i].join("tasks"), tid) {
                tracing::error!(cgroup = %self.own[*i].display(), error = %e, "the process thread cannot return to the agent's cgroup");
            }
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
        let limits = match &written {
            Some(old) => old.max(limits),
            None => *limits,
        };
        if written == Some(limits) {
            return Ok(limits);
        }
        let first = written.is_none();
        let shares = ((1024.0 * limits.cpus).floor() as u64).max(MIN_SHARES);
        write(&container.dirs[CPU], "cpu.shares", shares)?;
        if self.config.enable_cfs {
            let quota = ((CFS_PERIOD_US as f64 * limits.cpus).round() as u64).max(MIN_CFS_QUOTA_US);
            if first {
                write(&container.dirs[CPU], "cpu.cfs_period_us", CFS_PERIOD_US)?;
            }
            write(&container.dirs[CPU], "cpu.cfs_quota_us", quota)?;
        }
        let bytes = ((limits.mem_mib * 1024.0 * 1024.0) as u64).max(MIN_MEMORY_BYTES);
        let memory = &container.dirs[MEMORY];
        // memory.memsw (with swap) must never be below memory.limit: lower
        // the limit first, raise memsw first.
        let memsw = memory.join("memory.memsw.limit_in_bytes").exists();
        if memsw && !first {
            write(memory, "memory.memsw.limit_in_bytes", bytes)?;
        }
        write(memory, "memory.limit_in_bytes", bytes)?;
        write(memory, "memory.soft_limit_in_bytes", bytes)?;
        if memsw && first {
            write(memory, "memory.memsw.limit_in_bytes", bytes)?;
        }
        let pids = limits.pids.unwrap_or(self.config.pids_max);
        write(&container.dirs[PIDS], "pids.max", pids)?;
        Ok(limits)
    }

    /// Kills and removes every container under `--cgroups-root`, then
    /// the root itself: `Err` names what could not be removed.
    pub(crate) fn destroy_all(&self) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(10);
        for name in self.names() {
            let Some(container) = self.open(&name) else {
                continue;
            };
            loop {
                container.kill_all();
                match container.remove() {
                    Ok(true) => break,
                    Ok(false) if Instant::now() < deadline => {
                        std::thread::sleep(Duration::from_millis(10))
                    }
                    Ok(false) => return Err(format!("container {name} still holds processes")),
                    Err(e) => return Err(format!("container {name}: {e}")),
                }
            }
        }
        let mut dirs: Vec<&PathBuf> = self.base.iter().collect();
        dirs.dedup();
        for dir in dirs {
            match std::fs::remove_dir(dir) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(format!("{}: {e}", dir.display())),
            }
        }
        Ok(())
    }

    fn container(&self, name: &str) -> Container {
        Container {
            name: name.to_string(),
            dirs: std::array::from_fn(|i| self.base[i].join(name)),
        }
    }
}

// === impl Container ===

impl Container {
    /// Its name (the executor's run id).
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// Its directory in `controller`'s hierarchy.
    pub(crate) fn dir(&self, controller: &str) -> Option<&Path> {
        let i = CONTROLLERS.iter().position(|c| *c == controller)?;
        Some(&self.dirs[i])
    }

    fn unique_dirs(&self) -> Vec<&PathBuf> {
        let mut dirs: Vec<&PathBuf> = Vec::with_capacity(5);
        for dir in &self.dirs {
            if !dirs.contains(&dir) {
                dirs.push(dir);
            }
        }
        dirs
    }

    /// An eventfd that becomes readable when the container's memory
    /// cgroup has an out-of-memory event (or is removed).
    pub(crate) fn oom_eventfd(&self) -> io::Result<OwnedFd> {
        let efd = sys::eventfd()?;
        let control = std::fs::File::open(self.dirs[MEMORY].join("memory.oom_control"))?;
        std::fs::write(
            self.dirs[MEMORY].join("cgroup.event_control"),
            format!("{} {}", efd.as_raw_fd(), control.as_raw_fd()),
        )?;
        Ok(efd)
    }

    /// Out-of-memory kills in the container so far.
    pub(crate) fn oom_kills(&self) -> u64 {
        read_keyed(&self.dirs[MEMORY].join("memory.oom_control"), "oom_kill").unwrap_or(0)
    }

    /// The hard memory limit and the most memory used at once, in bytes.
    pub(crate) fn memory_limit_and_peak(&self) -> (u64, u64) {
        let dir = &self.dirs[MEMORY];
        (
            read_u64(&dir.join("memory.limit_in_bytes")).unwrap_or(0),
            read_u64(&dir.join("memory.max_usage_in_bytes")).unwrap_or(0),
        )
    }

    /// The pids in the container (its freezer cgroup).
    pub(crate) fn pids(&self) -> Vec<i32> {
        std::fs::read_to_string(self.dirs[FREEZER].join("cgroup.procs"))
            .map(|text| text.lines().filter_map(|l| l.trim().parse().ok()).collect())
            .unwrap_or_default()
    }

    /// Kills every process of the container, including those that left
    /// its session or double-forked: freeze (so none can fork or be
    /// missed), SIGKILL each, thaw (so the signals are delivered).
    /// Returns how many were signalled.
    pub(crate) fn kill_all(&self) -> usize {
        let freezer = &self.dirs[FREEZER];
        if !freezer.is_dir() {
            return 0;
        }
        let mut signalled = 0;
        for _ in 0..3 {
            let frozen = freeze(freezer);
            let pids = self.pids();
            if pids.is_empty() {
                let _ = write(freezer, "freezer.state", "THAWED");
                break;
            }
            for pid in &pids {
                if *pid > 1 && kill(Pid::from_raw(*pid), Signal::SIGKILL).is_ok() {
                    signalled += 1;
                }
            }
            let _ = write(freezer, "freezer.state", "THAWED");
            if frozen {
                break;
            }
        }
        signalled
    }

    /// Removes the container's cgroups: `Ok(false)` while some still hold
    /// processes (retry once they are gone).
    pub(crate) fn remove(&self) -> io::Result<bool> {
        let mut busy = false;
        for dir in self.unique_dirs() {
            match std::fs::remove_dir(dir) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) => busy = true,
                Err(e) => return Err(e),
            }
        }
        Ok(!busy)
    }

    /// What the container used so far.
    pub(crate) fn stats(&self) -> ContainerStats {
        let cpu = &self.dirs[CPU];
        let cpuacct = &self.dirs[CPUACCT];
        let memory = &self.dirs[MEMORY];
        let pids = &self.dirs[PIDS];
        let ticks = clock_ticks();
        let quota = read_i64(&cpu.join("cpu.cfs_quota_us")).unwrap_or(-1);
        let period = read_u64(&cpu.join("cpu.cfs_period_us")).unwrap_or(CFS_PERIOD_US);
        let cpus_limit = if quota > 0 && period > 0 {
            quota as f64 / period as f64
        } else {
            read_u64(&cpu.join("cpu.shares")).unwrap_or(0) as f64 / 1024.0
        };
        let cpu_stat = cpu.join("cpu.stat");
        ContainerStats {
            cpus_user_time_secs: read_keyed(&cpuacct.join("cpuacct.stat"), "user").unwrap_or(0)
                as f64
                / ticks,
            cpus_system_time_secs: read_keyed(&cpuacct.join("cpuacct.stat"), "system").unwrap_or(0)
                as f64
                / ticks,
            cpus_limit,
            cpus_nr_periods: read_keyed(&cpu_stat, "nr_periods").unwrap_or(0),
            cpus_nr_throttled: read_keyed(&cpu_stat, "nr_throttled").unwrap_or(0),
            cpus_throttled_time_secs: read_keyed(&cpu_stat, "throttled_time").unwrap_or(0) as f64
                / 1e9,
            mem_total_bytes: read_u64(&memory.join("memory.usage_in_bytes")).unwrap_or(0),
            mem_max_bytes: read_u64(&memory.join("memory.max_usage_in_bytes")).unwrap_or(0),
            mem_limit_bytes: read_u64(&memory.join("memory.limit_in_bytes")).unwrap_or(0),
            mem_oom_kills: self.oom_kills(),
            processes: read_u64(&pids.join("pids.current")).unwrap_or(0),
            processes_limit: read_u64(&pids.join("pids.max")).unwrap_or(0),
            processes_limit_hits: read_keyed(&pids.join("pids.events"), "max").unwrap_or(0),
        }
    }
}

/// Freezes a freezer cgroup: `true` once it reports FROZEN, `false` if it
/// did not within [`FREEZE_TIMEOUT`] (retrying with a thaw in between, as
/// Mesos does for kernels that leave a freeze stuck).
fn freeze(dir: &Path) -> bool {
    let deadline = Instant::now() + FREEZE_TIMEOUT;
    let mut pause = Duration::from_micros(100);
    while Instant::now() < deadline {
        if write(dir, "freezer.state", "FROZEN").is_err() {
            return false;
        }
        let settle = Instant::now() + Duration::from_millis(50);
        while Instant::now() < settle {
            match std::fs::read_to_string(dir.join("freezer.state")) {
                Ok(state) if state.trim() == "FROZEN" => return true,
                Ok(_) => std::thread::sleep(pause),
                Err(_) => return false,
            }
            pause = (pause * 2).min(Duration::from_millis(5));
        }
        let _ = write(dir, "freezer.state", "THAWED");
    }
    false
}

fn write(dir: &Path, file: &str, value: impl std::fmt::Display) -> io::Result<()> {
    let path = dir.join(file);
    std::fs::write(&path, value.to_string())
        .map_err(|e| io::Error::new(e.kind(), format!("cannot write {}: {e}", path.display())))
}

fn read_small(path: &Path) -> Option<String> {
    let mut text = String::new();
    std::fs::File::open(path)
        .ok()?
        .take(64 * 1024)
        .read_to_string(&mut text)
        .ok()?;
    Some(text)
}

fn read_u64(path: &Path) -> Option<u64> {
    read_small(path)?.trim().parse().ok()
}

fn read_i64(path: &Path) -> Option<i64> {
    read_small(path)?.trim().parse().ok()
}

/// The value of `key` in a flat keyed file (`key value` per line).
fn read_keyed(path: &Path, key: &str) -> Option<u64> {
    parse_keyed(&read_small(path)?, key)
}

fn parse_keyed(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let (k, v) = line.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok())?
    })
}

/// `USER_HZ`, the unit of `cpuacct.stat`.
fn clock_ticks() -> f64 {
    match nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK) {
        Ok(Some(n)) if n > 0 => n as f64,
        _ => 100.0,
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::launcher::{LaunchSpec, Process};

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

    fn spec(script: &str, sandbox: &Path) -> LaunchSpec {
        LaunchSpec {
            program: "/bin/sh".into(),
            argv0: None,
            args: vec!["-c".into(), script.into()],
            env: vec![],
            sandbox: sandbox.to_path_buf(),
            fetch: Vec::new(),
            limits: None,
        }
    }

    #[test]
    fn executors_are_born_in_their_container_and_killed_whole() {
        let Some(cg) = TestCgroups::new("born") else {
            return;
        };
        let cg = &cg.0;
        let limits = Limits {
            cpus: 0.5,
            mem_mib: 64.0,
            pids: Some(64),
        };
        let (container, written) = cg.create("run-1", &limits).unwrap();
        assert_eq!(written, limits);
        let dir = container.dir("cpu").unwrap();
        assert_eq!(
            std::fs::read_to_string(dir.join("cpu.shares"))
                .unwrap()
                .trim(),
            "512"
        );
        assert_eq!(
            std::fs::read_to_string(dir.join("cpu.cfs_quota_us"))
                .unwrap()
                .trim(),
            "50000"
        );
        let mem = container.dir("memory").unwrap();
        assert_eq!(
            std::fs::read_to_string(mem.join("memory.limit_in_bytes"))
                .unwrap()
                .trim(),
            (64u64 << 20).to_string()
        );
        // Limits only grow.
        let grown = cg
            .set_limits(
                &container,
                Some(written),
                &Limits {
                    cpus: 1.0,
                    mem_mib: 32.0,
                    pids: None,
                },
            )
            .unwrap();
        assert_eq!(grown.cpus, 1.0);
        assert_eq!(grown.mem_mib, 64.0);

        let sandbox = tempfile::tempdir().unwrap();
        // A process that leaves the session, and one that stays.
        let mut process = cg
            .spawn_inside(&container, || {
                Process::spawn(&spec("setsid sleep 1000 & sleep 1000", sandbox.path()))
            })
            .unwrap();
        let own = std::fs::read_to_string(format!("/proc/{}/cgroup", process.pid())).unwrap();
        assert!(own.contains("/run-1"), "{own}");
        // The spawning thread went back.
        let thread = std::fs::read_to_string("/proc/thread-self/cgroup").unwrap();
        assert!(!thread.contains("/run-1"), "{thread}");
        let deadline = Instant::now() + Duration::from_secs(5);
        while container.pids().len() < 3 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        let pids = container.pids();
        assert_eq!(pids.len(), 3, "sh and two sleeps: {pids:?}");
        assert!(container.kill_all() >= 3);
        while process.reap().is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        while !container.remove().unwrap() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(!container.dir("freezer").unwrap().exists());
        for pid in pids {
            assert!(
                !crate::launcher::is_alive(pid as u32, None),
                "{pid} survived"
            );
        }
    }

    #[test]
    fn keyed_files_parse() {
        let text = "oom_kill_disable 0\nunder_oom 0\noom_kill 3\n";
        assert_eq!(parse_keyed(text, "oom_kill"), Some(3));
        assert_eq!(parse_keyed(text, "oom"), None);
        assert_eq!(parse_keyed("max 7\n", "max"), Some(7));
    }

    /// What entering a container costs on the launch path, three ways:
    /// plain `posix_spawn` (no container), the process thread entering
    /// the container around `posix_spawn` (what the agent does), and
    /// `fork` with a pre-exec step writing `cgroup.procs` (std's
    /// `pre_exec`). Prints; never gates. Run with
    /// `cargo test -p agora-agent spawn_cost -- --ignored --nocapture`.
    #[test]
    #[ignore]
    #[allow(unsafe_code)]
    fn spawn_cost() {
        use std::os::unix::process::CommandExt;
        let Some(cg) = TestCgroups::new("cost") else {
            return;
        };
        let cg = &cg.0;
        let sandbox = tempfile::tempdir().unwrap();
        let n = 200;
        let limits = Limits {
            cpus: 1.0,
            mem_mib: 64.0,
            pids: None,
        };
        let reap = |mut p: Process| {
            while p.reap().is_none() {
                std::thread::sleep(Duration::from_micros(200));
            }
        };
        let plain_spec = LaunchSpec {
            program: "/bin/true".into(),
            args: vec![],
            ..spec("", sandbox.path())
        };
        let started = Instant::now();
        for _ in 0..n {
            reap(Process::spawn(&plain_spec).unwrap());
        }
        let plain = started.elapsed() / n;
        let started = Instant::now();
        let mut inside_only = Duration::ZERO;
        for i in 0..n {
            let (c, _) = cg.create(&format!("c{i}"), &limits).unwrap();
            let t = Instant::now();
            let p = cg.spawn_inside(&c, || Process::spawn(&plain_spec)).unwrap();
            inside_only += t.elapsed();
            reap(p);
            c.kill_all();
            while !c.remove().unwrap() {}
        }
        let whole = started.elapsed() / n;
        let inside_only = inside_only / n;
        let fork_spawn = |tag: &str| {
            let started = Instant::now();
            let mut spawn_only = Duration::ZERO;
            for i in 0..n {
                let (c, _) = cg.create(&format!("{tag}{i}"), &limits).unwrap();
                let dirs: Vec<PathBuf> = c.unique_dirs().into_iter().cloned().collect();
                let t = Instant::now();
                // SAFETY: the pre-exec step only writes files (open,
                // write, close), all async-signal-safe system calls.
                let mut child = unsafe {
                    std::process::Command::new("/bin/true")
                        .pre_exec(move || {
                            for d in &dirs {
                                std::fs::write(d.join("cgroup.procs"), "0")?;
                            }
                            Ok(())
                        })
                        .spawn()
                        .unwrap()
                };
                spawn_only += t.elapsed();
                child.wait().unwrap();
                while !c.remove().unwrap() {}
            }
            (started.elapsed() / n, spawn_only / n)
        };
        let (forked_small, forked_small_only) = fork_spawn("s");
        // A big heap makes fork dearer, as in a busy agent.
        let ballast: Vec<u8> = vec![1; 256 << 20];
        let (forked, forked_only) = fork_spawn("f");
        drop(ballast);
        eprintln!(
            "per launch of /bin/true: posix_spawn {plain:?}; in a container: create+spawn+kill+remove {whole:?} (spawn inside {inside_only:?}); fork+pre_exec: whole {forked_small:?} (spawn {forked_small_only:?}), with a 256 MiB heap: whole {forked:?} (spawn {forked_only:?})"
        );
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
        assert!(
            err.to_string().contains("needs the pids controller"),
            "{err}"
        );
        assert!(!Path::new("/nonexistent").exists());
        let v2 = "41 31 0:38 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n";
        let text = Cgroups::discover_in(&config, v2, "0::/\n")
            .unwrap_err()
            .to_string();
        assert!(text.contains("needs the cpu controller"), "{text}");
        assert!(
            text.contains("only the unified cgroup v2 hierarchy"),
            "{text}"
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
