//! The containerizer's face: the containers of an agent's executor runs
//! and command tasks, whichever isolation makes them.
//!
//! The agent decides; a [`Containerizer`] carries out:
//! - **launch**: [`Containerizer::launch`] makes an executor run's
//!   container with its [`Limits`] and starts the run's process into it
//!   (the caller's spawn, told where the process must be born);
//!   [`Containerizer::prepare`] makes a command task's container, which
//!   the task's process enters itself through its
//!   [`RunContainer::entry_files`];
//! - **wait**: [`RunContainer::limit_watch`] completes with the
//!   [`Limitation`] a run's container reaches (it ran out of memory); a
//!   command task's container calls back when it does;
//! - **kill**: [`RunContainer::kill`] kills every process of a container,
//!   those that left their session or double-forked included;
//!   [`Containerizer::destroy`], [`Containerizer::retire`] and
//!   [`Containerizer::remove`] end it;
//! - **recover**: after an agent restart, [`Containerizer::recover`]
//!   destroys the containers no live run holds (orphans) and
//!   [`Containerizer::recovered`] gives back a live run's;
//! - **usage**: [`Containerizer::usage`] reads what a run's container
//!   used (see [`crate::monitor`]).
//!
//! With `--isolation posix` there are no containers: a launch only starts
//! the process, and nothing is enforced. With `--isolation cgroups` a
//! container is a cgroup ([`crate::isolation`]); on cgroup v1 an ended
//! container that nothing of its run shows in is kept as a spare and
//! given to the next run with the same limits (a container costs the
//! kernel the making and freeing of a cgroup in every hierarchy), for at
//! most [`SPARE_IDLE`]. Containers whose processes are still dying are
//! removed later: each handle ([`Containerizer::handle`], one per thread)
//! retries its own in [`Containerizer::tidy`].
//!
//! Blocking: every call but the watches reads or writes cgroup files, so
//! the agent makes them off its async threads, on threads that entered
//! its Tokio runtime (the watches run on it).

use std::io;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tokio::io::unix::AsyncFd;

use crate::isolation::cgroups::{Cgroups, Container, OomEvent};
use crate::isolation::{CgroupsConfig, CgroupsError, Isolation, Limitation, Limits};
use crate::monitor::Statistics;
use crate::sys;

/// Makes, watches and ends the containers of one agent. Each thread
/// that uses it holds a handle of its own ([`Containerizer::handle`]):
/// the handles share the cgroups and the spare containers, and each
/// retries the removals it started.
pub struct Containerizer {
    /// `None` under `--isolation posix`.
    cgroups: Option<Arc<Cgroups>>,
    /// Empty containers kept for reuse, shared by every handle.
    spares: SparePool,
    /// This handle's containers waiting for their last process to go.
    removals: Removals,
}

/// The user a container is given to, for a process of theirs to enter
/// it (see [`Containerizer::delegates`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Owner {
    /// User id.
    pub uid: u32,
    /// Group id.
    pub gid: u32,
}

/// What a container holds: how its limitation reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Holder {
    /// An executor run (the executor and the tasks it runs itself).
    Executor,
    /// A command task of a shared command executor.
    Task,
}

/// Why a launch failed; nothing of the container is left.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    /// The container could not be made.
    #[error("cannot create the container: {0}")]
    Create(io::Error),
    /// The container could not be given to the run's user.
    #[error("cannot give the container to its user: {0}")]
    Delegate(io::Error),
    /// The process could not be started into it (the spawn's own error).
    #[error(transparent)]
    Start(io::Error),
}

/// A run's container, made by a launch or recovered after a restart.
pub struct RunContainer {
    container: Arc<Container>,
    holder: Holder,
    /// Its limits as written; `None` when unknown (recovered).
    limits: Option<Limits>,
    /// Given to the run's user (or recovered): never reused.
    delegated: bool,
    /// Out-of-memory kills it had counted before the run (a reused
    /// task container's).
    oom_base: u64,
    /// A task container that may be reused: its process is told its
    /// lasting name.
    lasting: bool,
    /// A task container's out-of-memory watch.
    watch: Option<OomWatch>,
}

/// Watches a run's container for the limits it reaches, from an async
/// task (see [`RunContainer::limit_watch`]).
pub struct LimitWatch {
    container: Arc<Container>,
    /// `None` when the kernel would not give a descriptor to watch: the
    /// container is then checked when the run ends.
    oom: Option<AsyncFd<OwnedFd>>,
    holder: Holder,
    oom_base: u64,
}

/// What a command task container's out-of-memory watch calls; `false`
/// ends the watch.
type Report = Box<dyn Fn() -> bool + Send>;

/// Empty containers kept for reuse (cgroup v1), oldest first: an ended
/// task's or executor's, for the next task or executor with the same
/// limits.
#[derive(Clone, Default)]
struct SparePool(Arc<Mutex<std::collections::VecDeque<Spare>>>);

/// An empty container kept for reuse.
struct Spare {
    container: Arc<Container>,
    limits: Limits,
    /// When it was last used.
    at: Instant,
    /// Its out-of-memory watch, kept for the next task.
    watch: Option<OomWatch>,
}

/// A task container's out-of-memory watch, kept with the container from
/// one task to the next (registering one costs an eventfd, two opens and
/// a write). Dropping it ends the watch and closes its eventfd.
struct OomWatch {
    /// What it calls for the task it watches; `None` while the container
    /// is a spare.
    report: Arc<Mutex<Option<Report>>>,
    handle: tokio::task::AbortHandle,
}

/// Spare containers an agent keeps at most.
pub const MAX_SPARES: usize = 256;
/// How long a spare container is kept unused.
pub const SPARE_IDLE: Duration = Duration::from_secs(5);

/// Containers to remove once their last process is gone: next attempt,
/// attempts so far.
#[derive(Default)]
struct Removals(Vec<(Instant, u32, Arc<Container>)>);

/// Time between attempts to remove a container whose processes are still
/// dying.
const REMOVAL_RETRY: Duration = Duration::from_millis(20);
/// Attempts after which a container that cannot be removed is left (and
/// logged); it is destroyed as an orphan when the agent restarts.
const REMOVAL_ATTEMPTS: u32 = 500;

// === impl Containerizer ===

impl Containerizer {
    /// Sets up `isolation`: under `--isolation cgroups`, finds the cgroup
    /// hierarchies, creates `--cgroups-root` and gives it the CPU weight
    /// of `cpus` (the CPUs the agent offers, which the containers together
    /// weigh); an error names what is missing. Logs what it enforces.
    pub fn start(
        isolation: Isolation,
        config: &CgroupsConfig,
        cpus: f64,
    ) -> Result<Containerizer, CgroupsError> {
        let cgroups = match isolation {
            Isolation::Posix => {
                tracing::info!("--isolation posix: cpus, mem and the other resources are bookkeeping only; nothing is enforced");
                None
            }
            Isolation::Cgroups => {
                let cgroups = Cgroups::discover(config)?;
                let root_weight = cgroups.weigh_root(cpus)?;
                tracing::info!(cgroups = cgroups.version(), root_weight, memory = %cgroups.base("memory").map(|p| p.display().to_string()).unwrap_or_default(), cfs = config.enable_cfs, pids_max = config.pids_max, "--isolation cgroups: each executor run gets a cgroup of its own");
                Some(Arc::new(cgroups))
            }
        };
        Ok(Containerizer {
            cgroups,
            spares: SparePool::default(),
            removals: Removals::default(),
        })
    }

    /// Another handle, for another thread: the same cgroups and spares,
    /// removals of its own.
    pub fn handle(&self) -> Containerizer {
        Containerizer {
            cgroups: self.cgroups.clone(),
            spares: self.spares.clone(),
            removals: Removals::default(),
        }
    }

    /// Whether runs get containers (`--isolation cgroups`).
    pub fn isolates(&self) -> bool {
        self.cgroups.is_some()
    }

    /// Whether a container can be handed to a user, for a process of
    /// theirs to enter it: on cgroup v1 a process may move itself into a
    /// cgroup whose `tasks` file it can write; on v2 it would also need
    /// the `cgroup.procs` of the cgroup above every container.
    pub fn delegates(&self) -> bool {
        self.cgroups.as_ref().is_some_and(|c| c.delegates())
    }

    /// Whether ended containers are kept for reuse (cgroup v1, where its
    /// directories take the extended attribute that names the run a
    /// reused container holds).
    pub fn reuses(&self) -> bool {
        self.cgroups.as_ref().is_some_and(|c| c.reuses())
    }

    /// Launches run `run`: in a container with `limits` when runs get
    /// containers and `limits` is given (a spare with the same limits
    /// when the run is the agent's own user's, else a new one, given to
    /// `owner` where containers can be), and `start` starts the run's
    /// process. `start` is told where the process must be born: `Some`,
    /// a cgroup v2 directory (spawn it there with `clone3` and
    /// `CLONE_INTO_CGROUP`); `None`, where the calling thread is (on
    /// cgroup v1 it has entered the container until `start` returns).
    /// A run given to `owner` never has its container reused.
    pub fn launch<T>(
        &mut self,
        run: &str,
        limits: Option<&Limits>,
        owner: Option<Owner>,
        start: impl FnOnce(Option<BorrowedFd<'_>>) -> io::Result<T>,
    ) -> Result<(T, Option<RunContainer>), LaunchError> {
        let (Some(cgroups), Some(limits)) = (&self.cgroups, limits) else {
            return start(None).map(|t| (t, None)).map_err(LaunchError::Start);
        };
        // An ended executor's or task's empty container with the same
        // limits, when the executor runs as the agent's user.
        let reused = owner
            .is_none()
            .then(|| self.spares.reuse(cgroups, limits, run, &mut self.removals))
            .flatten();
        let (container, written) = match reused {
            // A task's spare's out-of-memory watch ends here (dropped):
            // an executor's container is not watched that way.
            Some((container, _watch)) => (container, *limits),
            None => cgroups.create(run, limits).map_err(LaunchError::Create)?,
        };
        if let Some(owner) = owner.filter(|_| cgroups.delegates()) {
            // The user's processes may then move between it and their
            // tasks' containers.
            if let Err(e) = container.delegate(owner.uid, owner.gid) {
                let _ = container.remove();
                return Err(LaunchError::Delegate(e));
            }
        }
        match cgroups.spawn_inside(&container, start) {
            Ok(started) => Ok((
                started,
                Some(RunContainer {
                    container: Arc::new(container),
                    holder: Holder::Executor,
                    limits: Some(written),
                    delegated: owner.is_some(),
                    oom_base: 0,
                    lasting: false,
                    watch: None,
                }),
            )),
            Err(e) => {
                let _ = container.remove();
                Err(LaunchError::Start(e))
            }
        }
    }

    /// Makes command task container `run` with `limits` (a spare with the
    /// same limits, with its watch, when the task is the agent's own
    /// user's; else a new one, given to `owner`), for the task's process
    /// to enter through [`RunContainer::entry_files`]; `None` when runs
    /// get no containers. Until it is destroyed, an out-of-memory kill in
    /// it calls `on_limit` (on the runtime: it must not block), which
    /// should have it killed whole.
    pub fn prepare(
        &mut self,
        run: &str,
        limits: &Limits,
        owner: Option<Owner>,
        on_limit: impl Fn() -> bool + Send + 'static,
    ) -> Result<Option<RunContainer>, LaunchError> {
        let Some(cgroups) = self.cgroups.clone() else {
            return Ok(None);
        };
        // A spare with the same limits, when the task's user is the
        // agent's.
        let reused = owner
            .is_none()
            .then(|| self.spares.reuse(&cgroups, limits, run, &mut self.removals))
            .flatten();
        let (container, watch) = match reused {
            Some(reused) => reused,
            None => {
                let (container, _) = cgroups.create(run, limits).map_err(LaunchError::Create)?;
                (container, None)
            }
        };
        if let Some(owner) = owner {
            if let Err(e) = container.delegate(owner.uid, owner.gid) {
                let _ = container.remove();
                return Err(LaunchError::Delegate(e));
            }
        }
        let mut task = RunContainer {
            container: Arc::new(container),
            holder: Holder::Task,
            limits: Some(*limits),
            delegated: owner.is_some(),
            oom_base: 0,
            // Only for a container that may be reused: never one given to
            // a user, nor any where the agent reuses none.
            lasting: owner.is_none() && cgroups.reuses(),
            watch,
        };
        self.watch(&mut task, on_limit);
        Ok(Some(task))
    }

    /// Has an out-of-memory kill in command task container `task` call
    /// `on_limit` until it is destroyed: through its watch from a
    /// previous task, or a new one (for a container recovered after a
    /// restart). Kills counted before are not the task's.
    pub fn watch(&self, task: &mut RunContainer, on_limit: impl Fn() -> bool + Send + 'static) {
        let report: Report = Box::new(on_limit);
        task.watch = match task.watch.take() {
            Some(watch) => {
                watch.report_to(Some(report));
                Some(watch)
            }
            None => OomWatch::start(&task.container, report),
        };
        task.oom_base = task.container.oom_kills();
    }

    /// Grows the limits of `run`'s container to `limits` (limits only
    /// grow while a container runs).
    pub fn update(&self, run: &mut RunContainer, limits: &Limits) -> io::Result<()> {
        let Some(cgroups) = &self.cgroups else {
            return Ok(());
        };
        run.limits = Some(cgroups.set_limits(&run.container, run.limits, limits)?);
        Ok(())
    }

    /// Destroys every container under `--cgroups-root` that no live run
    /// holds (`live` says which runs are): left by an agent that died,
    /// their runs are not going to be recovered.
    pub fn recover(&mut self, live: impl Fn(&str) -> bool) {
        let Some(cgroups) = self.cgroups.clone() else {
            return;
        };
        for name in cgroups.names() {
            if live(&name) {
                continue;
            }
            let Some(container) = cgroups.open(&name) else {
                continue;
            };
            let killed = container.kill_all();
            tracing::info!(container = %name, killed, "destroying an orphan container");
            self.removals.remove(Arc::new(container), 0);
        }
    }

    /// The container of run `run`, found after a restart, if it has one.
    /// Its limits are unknown here: it is not reused.
    pub fn recovered(&self, run: &str, holder: Holder) -> Option<RunContainer> {
        let container = self.cgroups.as_ref()?.open(run)?;
        Some(RunContainer {
            container: Arc::new(container),
            holder,
            limits: None,
            delegated: true,
            oom_base: 0,
            lasting: false,
            watch: None,
        })
    }

    /// Kills `run`'s container whole (whatever of its run is left) and
    /// keeps it for reuse when nothing was left in it and nothing of the
    /// run shows in it, else removes it. Returns the limitation the run
    /// reached there, if any.
    pub fn destroy(&mut self, run: RunContainer) -> Option<Limitation> {
        if let Some(watch) = &run.watch {
            // No longer the run's, whatever comes.
            watch.report_to(None);
        }
        let container = run.container;
        let killed = container.kill_all();
        let oom_kills = container.oom_kills();
        let limitation =
            (oom_kills > run.oom_base).then(|| memory_limitation(&container, run.holder));
        // Kept for another run if nothing was left in it (`kill_all`
        // finds no process before it signals any) and nothing of this
        // run shows in it.
        let clean =
            killed == 0 && !run.delegated && oom_kills == 0 && container.pids_limit_hits() == 0;
        let reusable = clean && self.reuses();
        self.spares.keep(
            container,
            run.limits.filter(|_| reusable),
            run.watch,
            &mut self.removals,
        );
        limitation
    }

    /// Keeps an ended run's container as a spare when nothing is left in
    /// it (not even an unreaped process) and nothing of the run shows in
    /// it, else removes it: for a container whose processes are gone
    /// (killed with [`RunContainer::kill`], reaped).
    pub fn retire(&mut self, run: RunContainer) {
        let reusable = !run.delegated
            && self.reuses()
            && run.container.surely_empty()
            && run.container.oom_kills() == 0
            && run.container.pids_limit_hits() == 0;
        self.spares.keep(
            run.container,
            run.limits.filter(|_| reusable),
            run.watch,
            &mut self.removals,
        );
    }

    /// Removes `run`'s container (kill it first), never keeping it: for
    /// an agent that stops.
    pub fn remove(&mut self, run: RunContainer) {
        self.removals.remove(run.container, 0);
    }

    /// What run `run`'s container has used so far, if it has one.
    pub fn usage(&self, run: &str) -> Option<Statistics> {
        let container = self.cgroups.as_ref()?.open(run)?;
        Some(Statistics {
            cgroup: container.dir_name().to_string(),
            stats: container.stats(),
        })
    }

    /// When [`Containerizer::tidy`] has something to do next.
    pub fn next_tidy(&self) -> Option<Instant> {
        self.removals
            .next()
            .into_iter()
            .chain(self.spares.next_expiry())
            .min()
    }

    /// Removes the spares kept unused too long, and tries again to
    /// remove the containers that still held dying processes.
    pub fn tidy(&mut self) {
        for spare in self.spares.expired() {
            self.removals.remove(spare.container, 0);
        }
        self.removals.retry();
    }

    /// Gives the removals still pending up to `within` (the agent is
    /// stopping).
    pub fn finish(&mut self, within: Duration) {
        let deadline = Instant::now() + within;
        while !self.removals.is_empty() && Instant::now() < deadline {
            std::thread::sleep(REMOVAL_RETRY);
            self.removals.retry();
        }
    }
}

// === impl RunContainer ===

impl RunContainer {
    /// The run it holds.
    pub fn name(&self) -> &str {
        self.container.name()
    }

    /// Kills every process of the container, including those that left
    /// their session or double-forked. Returns how many were signalled.
    pub fn kill(&self) -> usize {
        self.container.kill_all()
    }

    /// The files a process writes `0` into to move itself into the
    /// container (`tasks` in each v1 hierarchy, `cgroup.procs` on v2).
    pub fn entry_files(&self) -> Vec<PathBuf> {
        self.container.entry_files()
    }

    /// The name its directories keep while it is reused for other runs,
    /// for a process that keeps [`RunContainer::entry_files`] open; only
    /// for a command task container that may be reused.
    pub fn lasting_name(&self) -> Option<&str> {
        self.lasting.then(|| self.container.dir_name())
    }

    /// A watch of the limits the container reaches, for an async task
    /// awaiting its run (an out-of-memory watch that cannot be had is
    /// logged, and the container checked when the run ends).
    pub fn limit_watch(&self) -> LimitWatch {
        let oom = self
            .container
            .oom_fd()
            .and_then(sys::register_readable)
            .map_err(|e| {
                tracing::warn!(container = self.name(), error = %e, "cannot listen for the container's out-of-memory events; checked at exit only");
            })
            .ok();
        LimitWatch {
            container: self.container.clone(),
            oom,
            holder: self.holder,
            oom_base: self.oom_base,
        }
    }
}

// === impl LimitWatch ===

impl LimitWatch {
    /// Completes with the limitation once the container runs out of
    /// memory (on cgroup v1 as the kernel's out-of-memory handling
    /// starts, before a process of it is killed); never when it cannot be
    /// watched or is removed first.
    pub async fn wait(&self) -> Limitation {
        if let Some(oom) = &self.oom {
            out_of_memory(oom, &self.container, true).await;
            return memory_limitation(&self.container, self.holder);
        }
        std::future::pending().await
    }

    /// The limitation the container reached so far, if any: for a run
    /// that ended before [`LimitWatch::wait`] saw it.
    pub fn reached(&self) -> Option<Limitation> {
        (self.container.oom_kills() > self.oom_base)
            .then(|| memory_limitation(&self.container, self.holder))
    }
}

// === impl SparePool ===

impl SparePool {
    fn lock(&self) -> std::sync::MutexGuard<'_, std::collections::VecDeque<Spare>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The most recently kept spare with `limits`, now holding run
    /// `name`, its usage reset, with its out-of-memory watch. One that
    /// cannot be given to it goes to `removals`.
    fn reuse(
        &self,
        cgroups: &Cgroups,
        limits: &Limits,
        name: &str,
        removals: &mut Removals,
    ) -> Option<(Container, Option<OomWatch>)> {
        let spare = {
            let mut spares = self.lock();
            let i = spares.iter().rposition(|spare| spare.limits == *limits)?;
            spares.remove(i)?
        };
        match cgroups.reassign(&spare.container, name) {
            Ok(container) => {
                container.reset_usage();
                Some((container, spare.watch))
            }
            Err(e) => {
                tracing::warn!(container = spare.container.name(), error = %e, "cannot reuse a spare container; removing it");
                removals.remove(spare.container, 0);
                None
            }
        }
    }

    /// Keeps `container` (with `watch`) for the next one with `limits`;
    /// without `limits` (not reusable) it goes to `removals`, as does the
    /// oldest spare when there are too many.
    fn keep(
        &self,
        container: Arc<Container>,
        limits: Option<Limits>,
        watch: Option<OomWatch>,
        removals: &mut Removals,
    ) {
        let Some(limits) = limits else {
            drop(watch);
            return removals.remove(container, 0);
        };
        let oldest = {
            let mut spares = self.lock();
            spares.push_back(Spare {
                container,
                limits,
                at: Instant::now(),
                watch,
            });
            (spares.len() > MAX_SPARES)
                .then(|| spares.pop_front())
                .flatten()
        };
        if let Some(oldest) = oldest {
            removals.remove(oldest.container, 0);
        }
    }

    /// When the oldest spare has been unused too long.
    fn next_expiry(&self) -> Option<Instant> {
        self.lock().front().map(|spare| spare.at + SPARE_IDLE)
    }

    /// The spares unused too long, taken out for removal.
    fn expired(&self) -> Vec<Spare> {
        let now = Instant::now();
        let mut spares = self.lock();
        let mut expired = Vec::new();
        while spares
            .front()
            .is_some_and(|spare| spare.at + SPARE_IDLE <= now)
        {
            expired.extend(spares.pop_front());
        }
        expired
    }
}

// === impl OomWatch ===

impl OomWatch {
    /// A new out-of-memory watch of `container`, calling `report` (`None`,
    /// logged, when the kernel will not give one: the container is then
    /// checked when its task ends).
    fn start(container: &Arc<Container>, report: Report) -> Option<OomWatch> {
        let oom = container
            .oom_fd()
            .and_then(sys::register_readable)
            .map_err(|e| {
                tracing::warn!(container = container.name(), error = %e, "cannot listen for the task container's out-of-memory events; checked when it ends");
            })
            .ok()?;
        let report = Arc::new(Mutex::new(Some(report)));
        let (owner, container) = (report.clone(), container.clone());
        let handle = tokio::runtime::Handle::current()
            .spawn(async move {
                while out_of_memory(&oom, &container, false).await {
                    let go_on = match &*owner.lock().unwrap_or_else(PoisonError::into_inner) {
                        Some(report) => report(),
                        None => true,
                    };
                    if !go_on {
                        break;
                    }
                }
            })
            .abort_handle();
        Some(OomWatch { report, handle })
    }

    /// Has the watch call `report` (`None`: nothing).
    fn report_to(&self, report: Option<Report>) {
        *self.report.lock().unwrap_or_else(PoisonError::into_inner) = report;
    }
}

impl Drop for OomWatch {
    fn drop(&mut self) {
        // Its eventfd closes with the watch's task.
        self.handle.abort();
    }
}

// === impl Removals ===

impl Removals {
    /// Removes `container`, or schedules another attempt while it still
    /// holds dying processes.
    fn remove(&mut self, container: Arc<Container>, attempts: u32) {
        match container.remove() {
            Ok(true) => {
                tracing::debug!(container = container.name(), "container removed");
            }
            Ok(false) if attempts < REMOVAL_ATTEMPTS => {
                if attempts % 50 == 49 {
                    // Something outlived the kill (a process that entered
                    // the container meanwhile): kill again.
                    container.kill_all();
                }
                self.0
                    .push((Instant::now() + REMOVAL_RETRY, attempts + 1, container));
            }
            Ok(false) => {
                tracing::error!(container = container.name(), pids = ?container.pids(), "container still holds processes; left for the next agent start to destroy");
            }
            Err(e) => {
                tracing::error!(container = container.name(), error = %e, "cannot remove container");
            }
        }
    }

    fn retry(&mut self) {
        let now = Instant::now();
        let (due, later): (Vec<_>, Vec<_>) = std::mem::take(&mut self.0)
            .into_iter()
            .partition(|(at, _, _)| *at <= now);
        self.0 = later;
        for (_, attempts, container) in due {
            self.remove(container, attempts);
        }
    }

    /// When the next attempt is due.
    fn next(&self) -> Option<Instant> {
        self.0.iter().map(|(at, _, _)| *at).min()
    }

    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// Completes once the container ran out of memory (`true`). On cgroup v1
/// the kernel signals the eventfd as its out-of-memory handling starts
/// (before it kills a process, so before the executor can see one die);
/// on v2 `memory.events` changes, and the container tells whether it
/// counts an out-of-memory kill. Both also fire when the cgroup is
/// removed, which is not an out-of-memory event: then it completes with
/// `false`, or never when `forever`.
async fn out_of_memory(oom: &AsyncFd<OwnedFd>, container: &Container, forever: bool) -> bool {
    use std::os::fd::AsFd;
    loop {
        let Ok(mut guard) = oom.readable().await else {
            break;
        };
        let event = container.oom_event(oom.get_ref().as_fd());
        guard.clear_ready();
        match event {
            OomEvent::OutOfMemory => return true,
            OomEvent::Nothing => {}
            OomEvent::Removed => break,
        }
    }
    if forever {
        std::future::pending().await
    }
    false
}

/// What a container that ran out of memory is told: its limit (made of
/// `what`) and the most it used.
fn memory_limit_message(container: &Container, what: &str) -> String {
    let (limit, peak) = container.memory_limit_and_peak();
    let mib = |bytes: u64| bytes as f64 / (1024.0 * 1024.0);
    format!(
        "Memory limit exceeded: the container's limit is {:.0} MiB ({what}); it used {:.0} MiB at most, and the kernel killed a process of it for lack of memory",
        mib(limit),
        mib(peak)
    )
}

/// The limitation of a container that ran out of memory, holding what
/// `holder` says.
fn memory_limitation(container: &Container, holder: Holder) -> Limitation {
    let what = match holder {
        Holder::Executor => "the task's mem plus its executor's",
        Holder::Task => "the task's mem",
    };
    Limitation {
        reason: agora_proto::Reason::ReasonContainerLimitationMemory,
        message: memory_limit_message(container, what),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::isolation::cgroups::tests::{is_alive, sh, TestProcess};
    use crate::isolation::{check_cgroups, destroy_cgroups_root};

    /// A containerizer with `--isolation cgroups` under a root unique to
    /// this test (destroyed on drop), in a runtime of its own for the
    /// watches; `None` (with the reason printed) where cgroups cannot be
    /// used.
    struct Isolated {
        containerizer: Containerizer,
        root: String,
        runtime: tokio::runtime::Runtime,
    }

    impl Isolated {
        fn new(test: &str) -> Option<Isolated> {
            let root = format!("agora-test-{}-{test}", std::process::id());
            if let Err(why) = check_cgroups(&root) {
                eprintln!("skipping {test}: {why}");
                return None;
            }
            let runtime = tokio::runtime::Runtime::new().unwrap();
            let config = CgroupsConfig {
                root: root.clone(),
                ..Default::default()
            };
            let containerizer = Containerizer::start(Isolation::Cgroups, &config, 1.0).unwrap();
            Some(Isolated {
                containerizer,
                root,
                runtime,
            })
        }

        /// The same root, as an agent that restarted finds it.
        fn restarted(&self) -> Containerizer {
            let config = CgroupsConfig {
                root: self.root.clone(),
                ..Default::default()
            };
            Containerizer::start(Isolation::Cgroups, &config, 1.0).unwrap()
        }
    }

    impl Drop for Isolated {
        fn drop(&mut self) {
            if let Err(e) = destroy_cgroups_root(&self.root) {
                eprintln!("cleaning up test cgroups: {e}");
            }
        }
    }

    fn limits(mem_mib: f64) -> Limits {
        Limits {
            cpus: 0.1,
            mem_mib,
            pids: None,
        }
    }

    /// Starts `script` into run `run`'s new container.
    fn launch(
        containerizer: &mut Containerizer,
        run: &str,
        mem_mib: f64,
        script: &str,
        dir: &std::path::Path,
    ) -> (TestProcess, RunContainer) {
        let (process, container) = containerizer
            .launch(run, Some(&limits(mem_mib)), None, |birth| {
                sh(script, dir).start(birth)
            })
            .unwrap();
        (process, container.expect("a container"))
    }

    fn reap(process: &mut TestProcess) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while process.reap().is_none() {
            assert!(Instant::now() < deadline, "{} did not end", process.pid());
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    #[test]
    fn without_isolation_a_launch_only_starts_the_process() {
        let mut containerizer =
            Containerizer::start(Isolation::Posix, &CgroupsConfig::default(), 1.0).unwrap();
        assert!(!containerizer.isolates());
        let (birth, container) = containerizer
            .launch(
                "run",
                Some(&limits(64.0)),
                None,
                |birth| Ok(birth.is_some()),
            )
            .unwrap();
        assert!(!birth && container.is_none());
        let task = containerizer.prepare("task", &limits(64.0), None, || true);
        assert!(matches!(task, Ok(None)));
        assert!(containerizer.usage("run").is_none());
        let failed = containerizer.launch("run", None, None, |_| {
            Err::<(), _>(io::Error::from(io::ErrorKind::NotFound))
        });
        assert!(
            matches!(failed, Err(LaunchError::Start(e)) if e.kind() == io::ErrorKind::NotFound)
        );
    }

    #[test]
    fn a_run_is_born_in_its_container_killed_whole_and_its_container_reused() {
        let Some(mut isolated) = Isolated::new("face") else {
            return;
        };
        let _entered = isolated.runtime.enter();
        let z = &mut isolated.containerizer;
        let dir = tempfile::tempdir().unwrap();
        let (mut process, container) = launch(
            z,
            "run-0",
            48.0,
            "setsid sleep 1000 & sleep 1000",
            dir.path(),
        );
        assert_eq!(container.name(), "run-0");
        let own = std::fs::read_to_string(format!("/proc/{}/cgroup", process.pid())).unwrap();
        assert!(own.contains("/run-0"), "{own}");
        let deadline = Instant::now() + Duration::from_secs(5);
        let usage = loop {
            let usage = z.usage("run-0").expect("its usage");
            if usage.stats.processes >= 3 || Instant::now() > deadline {
                break usage;
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        assert_eq!(usage.cgroup, "run-0");
        assert_eq!(usage.stats.processes, 3, "sh and two sleeps");
        assert_eq!(usage.stats.mem_limit_bytes, 48 << 20);
        // The sleep that left the session dies too.
        assert!(container.kill() >= 3);
        reap(&mut process);
        let deadline = Instant::now() + Duration::from_secs(5);
        while z.usage("run-0").is_some_and(|u| u.stats.processes > 0) {
            assert!(Instant::now() < deadline, "processes left");
            std::thread::sleep(Duration::from_millis(10));
        }
        z.retire(container);
        // An ended run whose process was reaped: its container is kept
        // (where containers are reused) for the next run with the same
        // limits.
        let (mut process, container) = launch(z, "run-1", 64.0, "exec sleep 1000", dir.path());
        container.kill();
        reap(&mut process);
        z.retire(container);
        if !z.reuses() {
            z.finish(Duration::from_secs(5));
            assert!(z.usage("run-1").is_none(), "removed");
            return;
        }
        let (mut next, container) = launch(z, "run-2", 64.0, "sleep 1000", dir.path());
        let usage = z.usage("run-2").expect("its usage");
        assert_eq!(usage.cgroup, "run-1", "the same directories");
        assert!(z.usage("run-1").is_none());
        container.kill();
        reap(&mut next);
        // A run of other limits gets a container of its own.
        let (mut other, container) = launch(z, "run-3", 96.0, "sleep 1000", dir.path());
        assert_eq!(z.usage("run-3").unwrap().cgroup, "run-3");
        container.kill();
        reap(&mut other);
    }

    #[test]
    fn a_restart_keeps_live_runs_and_destroys_orphans() {
        let Some(mut isolated) = Isolated::new("recover") else {
            return;
        };
        let _entered = isolated.runtime.enter();
        let dir = tempfile::tempdir().unwrap();
        let z = &mut isolated.containerizer;
        let (mut live, _) = launch(z, "live", 64.0, "sleep 1000", dir.path());
        let (mut orphan, _) = launch(
            z,
            "orphan",
            64.0,
            "setsid sleep 1000 & sleep 1000",
            dir.path(),
        );
        let mut again = isolated.restarted();
        again.recover(|run| run == "live");
        reap(&mut orphan);
        again.finish(Duration::from_secs(5));
        assert!(again.usage("orphan").is_none(), "the orphan is gone");
        assert!(is_alive(live.pid()));
        let container = again.recovered("live", Holder::Executor).expect("found");
        assert!(again.recovered("orphan", Holder::Executor).is_none());
        container.kill();
        reap(&mut live);
        // Recovered, its limits are unknown: removed, never reused.
        again.retire(container);
        again.finish(Duration::from_secs(5));
        assert!(again.usage("live").is_none());
    }

    #[test]
    fn a_run_that_runs_out_of_memory_reaches_the_memory_limitation() {
        let Some(mut isolated) = Isolated::new("oom") else {
            return;
        };
        let runtime = isolated.runtime.handle().clone();
        let _entered = runtime.enter();
        let z = &mut isolated.containerizer;
        let dir = tempfile::tempdir().unwrap();
        // An executor run: its watch completes.
        let (mut process, container) = launch(z, "exec", 32.0, "exec tail /dev/zero", dir.path());
        let watch = container.limit_watch();
        let limitation = runtime
            .block_on(tokio::time::timeout(Duration::from_secs(30), watch.wait()))
            .expect("out of memory within 30 s");
        assert_eq!(
            limitation.reason,
            agora_proto::Reason::ReasonContainerLimitationMemory
        );
        assert!(
            limitation
                .message
                .contains("32 MiB (the task's mem plus its executor's)"),
            "{}",
            limitation.message
        );
        container.kill();
        reap(&mut process);
        assert!(watch.reached().is_some());
        z.retire(container);
        // A command task's container: the task's process enters it, and
        // the watch calls back.
        let (tx, rx) = std::sync::mpsc::channel();
        let task = z
            .prepare("task", &limits(32.0), None, move || tx.send(()).is_ok())
            .unwrap()
            .expect("a container");
        let files: Vec<String> = task
            .entry_files()
            .iter()
            .map(|f| f.display().to_string())
            .collect();
        let script = format!(
            "for f in {}; do echo 0 > $f; done; exec tail /dev/zero",
            files.join(" ")
        );
        let mut process = sh(&script, dir.path()).start(None).unwrap();
        rx.recv_timeout(Duration::from_secs(30))
            .expect("called back within 30 s");
        let limitation = z.destroy(task).expect("the memory limitation");
        assert!(
            limitation.message.contains("32 MiB (the task's mem)"),
            "{}",
            limitation.message
        );
        reap(&mut process);
        z.finish(Duration::from_secs(5));
        assert!(z.usage("task").is_none(), "not kept: it ran out of memory");
    }
}
