//! The cgroup v1 driver behind [`super::cgroups`]: containers as cgroup
//! v1 directories, written directly through the cgroup file system.
//!
//! Each container is a directory named after the run it was made for under
//! `<hierarchy>/<agent's own cgroup>/<--cgroups-root>/` of each controller
//! the agent needs: `cpu` (shares, CFS quota), `cpuacct` (CPU time),
//! `memory` (hard limit, out-of-memory events), `pids` (`pids.max`) and
//! `freezer` (a kill that reaches every process). The hierarchies are
//! found in `/proc/self/mountinfo`, so controllers mounted separately (as
//! `cpu` and `cpuacct` are on some hosts) or together both work.
//!
//! A container kept for reuse keeps its directories' name: the run it
//! holds next is written in its `cpu` directory's extended attribute
//! [`RUN_XATTR`] (renaming five directories cost half of what a reused
//! container costs the agent), and the agent finds it by that run through
//! [`Holders`], which it learns again from the attributes when it starts.
//!
//! An executor is born inside its container: the process thread moves
//! itself (writing `0`, the calling thread, into each `tasks` file) into the
//! container, spawns the executor, which inherits the thread's cgroups at
//! `clone`, and moves itself back. So no instruction of the executor ever
//! runs outside the container, and the spawn stays a `posix_spawn`.
//!
//! Files are written directly rather than through `cgroups-rs`: about a
//! dozen files are used, the hierarchies must be found from mountinfo
//! with controllers mounted separately (`cgroups-rs` 0.5 assumes its own
//! layout under `/sys/fs/cgroup`), and the launch path must stay a few
//! writes long.

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use super::cgroups::{
    parse_keyed, read_i64, read_keyed, read_u64, shares_of, write, CgroupsError, ContainerStats,
    OomEvent, CFS_PERIOD_US, FREEZE_TIMEOUT, MIN_CFS_QUOTA_US, MIN_MEMORY_BYTES,
};
use super::mountinfo::{self, CgroupMount};
use super::{CgroupsConfig, Limits};
use crate::sys;

/// The controllers a container is made of, in this order.
pub(crate) const CONTROLLERS: [&str; 5] = ["cpu", "cpuacct", "memory", "pids", "freezer"];
const CPU: usize = 0;
const CPUACCT: usize = 1;
const MEMORY: usize = 2;
const PIDS: usize = 3;
const FREEZER: usize = 4;

/// The extended attribute of a reused container's `cpu` directory that
/// names the run it holds now (`trusted.`: only a process with
/// `CAP_SYS_ADMIN` can write it).
const RUN_XATTR: &str = "trusted.agora.run";

/// Which runs hold containers made for other runs, both ways: a
/// container is found by the run it holds, and a directory named after
/// a run that no longer holds it is not that run's.
#[derive(Debug, Default)]
struct Holders {
    /// Run → the directories' name of the container it holds.
    dir_of: HashMap<String, String>,
    /// Directories' name → the run that holds it now.
    run_in: HashMap<String, String>,
}

/// The cgroup hierarchies the agent puts containers in.
#[derive(Debug)]
pub(crate) struct Cgroups {
    /// Per controller, the directory holding the containers.
    base: [PathBuf; 5],
    /// Per controller, the agent's own cgroup (where the process thread
    /// returns after a spawn).
    own: [PathBuf; 5],
    /// Which controllers' hierarchies are the first with their directory
    /// (bit `i` for controller `i`; controllers mounted together share
    /// one): what is created, entered or removed once.
    distinct: u8,
    /// Reused containers, by the run they hold (shared with each
    /// container, which forgets itself when removed).
    holders: Arc<Mutex<Holders>>,
    /// Whether the `cpu` hierarchy takes [`RUN_XATTR`] (found at
    /// discovery): without it, containers are not reused.
    xattrs: bool,
    config: CgroupsConfig,
}

/// One container: a cgroup per controller.
#[derive(Debug)]
pub(crate) struct Container {
    name: String,
    dirs: [PathBuf; 5],
    /// [`Cgroups::distinct`].
    distinct: u8,
    /// [`Cgroups::holders`].
    holders: Arc<Mutex<Holders>>,
    /// Its files used on every task's way, open; shared with the same
    /// container holding later runs.
    kept: Arc<Kept>,
}

/// The files of a container read or written for every task it holds,
/// each opened the first time it is used and then kept: opening a cgroup
/// file costs about ten times reading or writing an open one, which is
/// what the launch path of a command task in a reused container is made
/// of.
#[derive(Debug, Default)]
struct Kept {
    /// The name the container was created with.
    first_name: String,
    /// `pids.current`. (Not `cgroup.procs`: on cgroup v1 an open
    /// `cgroup.procs` goes on reading the list it loaded first.)
    pids_current: OnceLock<File>,
    /// `memory.oom_control`.
    oom_control: OnceLock<File>,
    /// `memory.max_usage_in_bytes`.
    max_usage: OnceLock<File>,
    /// `cpuacct.usage`.
    cpu_usage: OnceLock<File>,
    /// `pids.events`.
    pids_events: OnceLock<File>,
}

// === impl Cgroups ===

impl Cgroups {
    /// Finds the hierarchies of the needed controllers from
    /// `/proc/self/mountinfo` and creates `--cgroups-root` under the
    /// agent's own cgroup in each: an error names the first controller
    /// that is missing or not writable. `mounts` and `own` are the cgroup
    /// mounts of `/proc/self/mountinfo` and the lines of
    /// `/proc/self/cgroup`.
    pub(crate) fn discover_in(
        config: &CgroupsConfig,
        mounts: &[CgroupMount],
        own: &[(u32, Vec<String>, String)],
    ) -> Result<Cgroups, CgroupsError> {
        // Every controller is looked for before anything is created.
        let mut own_dirs: [PathBuf; 5] = Default::default();
        for (i, controller) in CONTROLLERS.iter().enumerate() {
            let Some(mount) = mounts
                .iter()
                .find(|m| !m.unified && m.controllers.iter().any(|c| c == controller))
            else {
                return Err(CgroupsError::MissingController {
                    controller,
                    hint: String::new(),
                });
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
        let distinct = (0..base.len())
            .filter(|&i| !base[..i].contains(&base[i]))
            .fold(0, |mask, i| mask | 1 << i);
        // Whether a directory there takes the run attribute (kernfs has
        // taken `trusted.` attributes since cgroups were built on it).
        let xattrs = set_xattr(&base[CPU], RUN_XATTR, "").is_ok()
            && xattr::remove(&base[CPU], RUN_XATTR).is_ok();
        if !xattrs {
            tracing::warn!(dir = %base[CPU].display(), "the cgroup file system takes no {RUN_XATTR} extended attribute: ended containers are removed, not reused");
        }
        Ok(Cgroups {
            distinct,
            xattrs,
            holders: Arc::default(),
            base,
            own: own_dirs,
            config: config.clone(),
        })
    }

    /// See [`super::cgroups::Cgroups::reuses`].
    pub(crate) fn reuses(&self) -> bool {
        self.xattrs
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

    /// `container` (empty), now holding run `run`: its directories keep
    /// their name, the run goes into [`RUN_XATTR`].
    pub(crate) fn reassign(&self, container: &Container, run: &str) -> io::Result<Container> {
        let dir = container.lasting_name();
        set_xattr(&container.dirs[CPU], RUN_XATTR, run)?;
        {
            let mut holders = lock(&self.holders);
            if holders
                .dir_of
                .get(&container.name)
                .is_some_and(|d| d == dir)
            {
                holders.dir_of.remove(&container.name);
            }
            holders.dir_of.insert(run.to_string(), dir.to_string());
            holders.run_in.insert(dir.to_string(), run.to_string());
        }
        Ok(Container {
            name: run.to_string(),
            dirs: container.dirs.clone(),
            distinct: container.distinct,
            holders: container.holders.clone(),
            kept: container.kept.clone(),
        })
    }

    /// The container run `name` holds, if it exists.
    pub(crate) fn open(&self, name: &str) -> Option<Container> {
        let dir = {
            let holders = lock(&self.holders);
            match holders.dir_of.get(name) {
                Some(dir) => dir.clone(),
                // Made for `name`, and held by another run now.
                None if holders.run_in.contains_key(name) => return None,
                None => name.to_string(),
            }
        };
        let mut container = self.container(&dir);
        container.name = name.to_string();
        container
            .dirs
            .iter()
            .any(|d| d.is_dir())
            .then_some(container)
    }

    /// The runs that hold the containers under `--cgroups-root` (found
    /// in any controller): a reused container's from its [`RUN_XATTR`],
    /// learnt for [`Cgroups::open`]; another's is its name.
    pub(crate) fn names(&self) -> Vec<String> {
        let mut dirs: Vec<String> = self
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
        dirs.sort();
        dirs.dedup();
        let mut holders = lock(&self.holders);
        let mut runs: Vec<String> = dirs
            .into_iter()
            .map(
                |dir| match get_xattr(&self.base[CPU].join(&dir), RUN_XATTR) {
                    Some(run) if run != dir => {
                        holders.dir_of.insert(run.clone(), dir.clone());
                        holders.run_in.insert(dir, run.clone());
                        run
                    }
                    _ => dir,
                },
            )
            .collect();
        runs.sort();
        runs
    }

    /// Runs `spawn` on this thread while the thread is in `container`,
    /// so a process it starts is born there; the thread returns to the
    /// agent's own cgroups afterwards.
    pub(crate) fn spawn_inside<T>(
        &self,
        container: &Container,
        spawn: impl FnOnce(Option<BorrowedFd<'_>>) -> io::Result<T>,
    ) -> io::Result<T> {
        // `0` is the calling thread: moving it alone does not take the
        // kernel's lock on every thread group of the machine, which
        // naming it by its id does.
        let tid = "0";
        let mut entered = Vec::new();
        for i in container.distinct_indices() {
            let dir = &container.dirs[i];
            if let Err(e) = std::fs::write(dir.join("tasks"), tid) {
                self.leave(tid, &entered);
                return Err(io::Error::new(
                    e.kind(),
                    format!("cannot enter cgroup {}: {e}", dir.display()),
                ));
            }
            entered.push(i);
        }
        let result = spawn(None);
        self.leave(tid, &entered);
        result
    }

    fn leave(&self, tid: &str, entered: &[usize]) {
        for i in entered {
            if let Err(e) = std::fs::write(self.own[*i].join("tasks"), tid) {
                tracing::error!(cgroup = %self.own[*i].display(), error = %e, "the process thread cannot return to the agent's cgroup");
            }
        }
    }

    /// Writes the `cpu.shares` of `cpus` into `--cgroups-root` (see
    /// [`super::cgroups::Cgroups::weigh_root`]).
    pub(crate) fn weigh_root(&self, cpus: f64) -> io::Result<u64> {
        let shares = shares_of(cpus);
        write(&self.base[CPU], "cpu.shares", shares)?;
        Ok(shares)
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
        write(&container.dirs[CPU], "cpu.shares", shares_of(limits.cpus))?;
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
        super::cgroups::kill_and_remove_each(
            self.names(),
            |name| self.open(name),
            |container| {
                container.kill_all();
            },
            Container::remove,
        )?;
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
            distinct: self.distinct,
            holders: self.holders.clone(),
            kept: Arc::new(Kept {
                first_name: name.to_string(),
                ..Kept::default()
            }),
        }
    }
}

// === impl Container ===

impl Container {
    /// The run it holds.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// Its directory in `controller`'s hierarchy.
    #[cfg(test)]
    pub(crate) fn dir(&self, controller: &str) -> Option<&Path> {
        let i = CONTROLLERS.iter().position(|c| *c == controller)?;
        Some(&self.dirs[i])
    }

    /// The controllers whose directories are its distinct ones.
    fn distinct_indices(&self) -> impl Iterator<Item = usize> + Clone {
        let distinct = self.distinct;
        (0..self.dirs.len()).filter(move |i| distinct & (1 << i) != 0)
    }

    /// Its directories, each once.
    fn unique_dirs(&self) -> impl Iterator<Item = &PathBuf> {
        self.distinct_indices().map(|i| &self.dirs[i])
    }

    /// The name of its directories: the run it was made for, whichever
    /// it holds now.
    pub(crate) fn lasting_name(&self) -> &str {
        &self.kept.first_name
    }

    /// Its file `file` of controller `i`, open for reading or writing
    /// (`write`), kept in `slot`.
    fn kept<'a>(
        &self,
        slot: &'a OnceLock<File>,
        i: usize,
        file: &str,
        write: bool,
    ) -> io::Result<&'a File> {
        if let Some(open) = slot.get() {
            return Ok(open);
        }
        let open = std::fs::OpenOptions::new()
            .read(!write)
            .write(write)
            .open(self.dirs[i].join(file))?;
        Ok(slot.get_or_init(|| open))
    }

    /// The text of a kept file, read from its start again (`None` once
    /// the cgroup is gone).
    fn read_kept(&self, slot: &OnceLock<File>, i: usize, file: &str) -> Option<String> {
        let file = self.kept(slot, i, file, false).ok()?;
        let mut text = Vec::with_capacity(256);
        let mut chunk = [0u8; 4096];
        loop {
            match file.read_at(&mut chunk, text.len() as u64) {
                Ok(0) => break,
                Ok(n) => text.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return None,
            }
        }
        String::from_utf8(text).ok()
    }

    /// Forgets its memory peak and CPU time so far.
    pub(crate) fn reset_usage(&self) {
        let kept = &self.kept;
        for (slot, i, file) in [
            (&kept.max_usage, MEMORY, "memory.max_usage_in_bytes"),
            (&kept.cpu_usage, CPUACCT, "cpuacct.usage"),
        ] {
            if let Ok(file) = self.kept(slot, i, file, true) {
                let _ = file.write_at(b"0", 0);
            }
        }
    }

    /// Its `tasks` file in each hierarchy.
    pub(crate) fn entry_files(&self) -> Vec<PathBuf> {
        self.unique_dirs().map(|d| d.join("tasks")).collect()
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

    /// What a readable [`Container::oom_eventfd`] means. Reads its
    /// counter, so it is not readable again until the next event; the
    /// kernel also signals it when the cgroup is removed, which is no
    /// out-of-memory event.
    pub(crate) fn oom_event(&self, eventfd: BorrowedFd<'_>) -> OomEvent {
        let mut counter = [0u8; 8];
        let signalled = nix::unistd::read(eventfd, &mut counter).is_ok_and(|n| n == 8);
        // Through its kept file.
        if self.oom_control().is_none() {
            OomEvent::Removed
        } else if signalled {
            OomEvent::OutOfMemory
        } else {
            OomEvent::Nothing
        }
    }

    /// Its `memory.oom_control`, through the kept file (`None` once the
    /// cgroup is gone).
    fn oom_control(&self) -> Option<String> {
        self.read_kept(&self.kept.oom_control, MEMORY, "memory.oom_control")
    }

    /// Forks refused at its `pids.max` so far.
    pub(crate) fn pids_limit_hits(&self) -> u64 {
        self.read_kept(&self.kept.pids_events, PIDS, "pids.events")
            .and_then(|text| parse_keyed(&text, "max"))
            .unwrap_or(0)
    }

    /// Out-of-memory kills in the container so far.
    pub(crate) fn oom_kills(&self) -> u64 {
        self.oom_control()
            .and_then(|text| parse_keyed(&text, "oom_kill"))
            .unwrap_or(0)
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

    /// Whether it surely holds no process (not even one exited and not
    /// yet reaped), from its kept `pids.current`.
    pub(crate) fn surely_empty(&self) -> bool {
        self.read_kept(&self.kept.pids_current, PIDS, "pids.current")
            .and_then(|text| text.trim().parse::<u64>().ok())
            == Some(0)
    }

    /// Kills every process of the container, including those that left
    /// its session or double-forked: freeze (so none can fork or be
    /// missed), SIGKILL each, thaw (so the signals are delivered).
    /// Returns how many were signalled.
    pub(crate) fn kill_all(&self) -> usize {
        let freezer = &self.dirs[FREEZER];
        if self.surely_empty() || !freezer.is_dir() || self.pids().is_empty() {
            // Nothing to kill, and nothing left to fork.
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
        if !busy {
            let dir = self.lasting_name();
            let mut holders = lock(&self.holders);
            if let Some(run) = holders.run_in.remove(dir) {
                if holders.dir_of.get(&run).is_some_and(|d| d == dir) {
                    holders.dir_of.remove(&run);
                }
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
            processes_limit_hits: self.pids_limit_hits(),
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

/// `USER_HZ`, the unit of `cpuacct.stat`.
fn clock_ticks() -> f64 {
    match nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK) {
        Ok(Some(n)) if n > 0 => n as f64,
        _ => 100.0,
    }
}

/// The first of [`CONTROLLERS`] that no v1 hierarchy in `mounts` has.
pub(crate) fn missing_controller(mounts: &[CgroupMount]) -> Option<&'static str> {
    CONTROLLERS.iter().copied().find(|controller| {
        !mounts
            .iter()
            .any(|m| !m.unified && m.controllers.iter().any(|c| c == controller))
    })
}

fn lock(holders: &Mutex<Holders>) -> std::sync::MutexGuard<'_, Holders> {
    holders.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Sets extended attribute `name` of `path` to `value`.
fn set_xattr(path: &Path, name: &str, value: &str) -> io::Result<()> {
    xattr::set(path, name, value.as_bytes()).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("cannot set {name} of {}: {e}", path.display()),
        )
    })
}

/// Extended attribute `name` of `path`, if it has it (as text).
fn get_xattr(path: &Path, name: &str) -> Option<String> {
    let value = xattr::get(path, name).ok()??;
    String::from_utf8(value).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::isolation::cgroups::tests::{is_alive, sh, TestCgroups};

    /// The v1 driver of `cgroups`; `None` (with the reason printed) on a
    /// host whose containers are cgroup v2 ones.
    fn v1<'a>(cgroups: &'a TestCgroups, test: &str) -> Option<&'a Cgroups> {
        match &cgroups.0 {
            crate::isolation::cgroups::Cgroups::V1(v1) => Some(v1),
            crate::isolation::cgroups::Cgroups::V2(_) => {
                eprintln!("skipping {test}: the agent drives cgroup v2 on this host");
                None
            }
        }
    }

    #[test]
    fn a_reused_container_is_found_by_the_run_it_holds_after_a_restart() {
        let Some(cg) = TestCgroups::new("holders") else {
            return;
        };
        let Some(cg) = v1(&cg, "holders") else {
            return;
        };
        let limits = Limits {
            cpus: 0.1,
            mem_mib: 32.0,
            pids: None,
        };
        assert!(
            cg.reuses(),
            "this kernel's cgroup v1 takes trusted. attributes"
        );
        let (first, _) = cg.create("run-a", &limits).unwrap();
        let second = cg.reassign(&first, "run-b").unwrap();
        let third = cg.reassign(&second, "run-c").unwrap();
        assert_eq!(third.name(), "run-c");
        assert_eq!(third.lasting_name(), "run-a");
        assert_eq!(third.dirs, first.dirs, "the directories keep their name");
        // Found by the run it holds, not by those it held.
        assert_eq!(cg.open("run-c").unwrap().dirs, first.dirs);
        assert!(cg.open("run-b").is_none());
        assert!(cg.open("run-a").is_none());
        // An agent that starts again (knowing nothing of the reuse)
        // learns it from the attribute.
        let again = Cgroups {
            base: cg.base.clone(),
            own: cg.own.clone(),
            distinct: cg.distinct,
            xattrs: cg.xattrs,
            holders: Arc::default(),
            config: cg.config.clone(),
        };
        assert_eq!(again.names(), vec!["run-c".to_string()]);
        let found = again.open("run-c").expect("found by its run");
        assert_eq!(found.dirs, first.dirs);
        assert!(again.open("run-a").is_none());
        // Removed, it is forgotten.
        assert!(found.remove().unwrap());
        assert!(again.open("run-c").is_none());
        assert!(lock(&again.holders).dir_of.is_empty());
        assert!(lock(&again.holders).run_in.is_empty());
    }

    #[test]
    fn executors_are_born_in_their_container_and_killed_whole() {
        let Some(cg) = TestCgroups::new("born") else {
            return;
        };
        let Some(cg) = v1(&cg, "born") else {
            return;
        };
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
            .spawn_inside(&container, |birth| {
                sh("setsid sleep 1000 & sleep 1000", sandbox.path()).start(birth)
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
            assert!(!is_alive(pid as u32), "{pid} survived");
        }
    }
}
