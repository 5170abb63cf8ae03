//! The thread that owns every executor process: it creates sandboxes,
//! spawns, signals and reaps, so none of that blocking work runs on the
//! core's loop or on the async threads.
//!
//! The core sends it [`Request`]s and hears back through its own queue:
//! [`Input::ExecutorLaunched`] once a launch succeeded or failed, and
//! [`Input::ExecutorExited`] once a process ended (a watcher task per
//! process awaits its pidfd). An exited child is not reaped until the
//! core sends [`Request::Release`]: until then its pid cannot be reused,
//! so killing what is left of its session cannot hit anyone else.
//! Requests that arrive together are handled together, with one pass over
//! `/proc` for all the sessions they signal.
//!
//! Under `--isolation cgroups` each run also has a container
//! ([`crate::isolation::cgroups`]): created before the spawn, which
//! happens inside it; watched for out-of-memory kills
//! ([`Input::ContainerLimited`]); killed whole when the run is
//! released or killed; removed once empty.

use agora_proto::hash::{HashMap, HashSet};
use std::sync::mpsc as std_mpsc;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use tokio::sync::{mpsc, oneshot};

use crate::core::{ExecKey, Input, TaskEntry};
use crate::isolation::cgroups::{Cgroups, Container, OomEvent};
use crate::isolation::{Limitation, Limits};
use crate::launcher::{self, LaunchSpec, Process};
use crate::shell::CoreEvent;
use crate::status_updates::StreamKey;
use crate::users::{RunAs, UserPolicy};

/// What the core asks of the process thread.
#[derive(Debug)]
pub enum Request {
    /// Create the sandbox, fetch the spec's URIs into it (on a thread of
    /// their own, which asks for the launch again once they are there)
    /// and start the executor.
    Launch {
        key: ExecKey,
        run_id: String,
        spec: LaunchSpec,
    },
    /// Re-attach to an executor found alive after a restart.
    Adopt {
        key: ExecKey,
        run_id: String,
        pid: u32,
        start_time: Option<u64>,
    },
    /// Grow the limits of a run's container (a task joined its executor).
    Update { run_id: String, limits: Limits },
    /// Create a directory (a command task's sandbox, which its command
    /// executor also creates if it gets there first) for a task of a
    /// framework naming `user`.
    CreateDir {
        path: std::path::PathBuf,
        user: String,
    },
    /// Create command task `key`'s sandbox (owned by the user its
    /// framework names, when the agent switches users) and fetch `uris`
    /// into it, on a thread of their own, then tell the core
    /// ([`Input::TaskFetched`]).
    Fetch {
        key: StreamKey,
        sandbox: std::path::PathBuf,
        uris: Vec<agora_proto::FetchUri>,
        user: String,
    },
    /// Make command task `key` a container of its own, `name`, with
    /// `limits` (given to the user its framework names when the agent
    /// switches users), watched for out-of-memory kills, then tell the
    /// core ([`Input::TaskFetched`], with the files its process enters it
    /// through). Handled by the containers thread, apart from sandboxes
    /// and executors.
    TaskContainer {
        key: StreamKey,
        name: String,
        limits: Limits,
        user: String,
    },
    /// Kill command task `key`'s container whole (its process, and
    /// whatever left its session), then remove it, and tell the core
    /// ([`Input::TaskContainerEnded`]).
    EndTaskContainer { key: StreamKey, name: String },
    /// Watch again the container `name` of command task `key`, recovered
    /// alive after a restart.
    AdoptTaskContainer { key: StreamKey, name: String },
    /// Command task `key`'s container ran out of memory: it is killed
    /// whole (the task then ends, and [`Request::EndTaskContainer`]
    /// reports the limitation).
    TaskOutOfMemory { key: StreamKey },
    /// End the executor's whole session: SIGTERM now, SIGKILL once
    /// `grace` has passed with the executor still running.
    Terminate { run_id: String, grace: Duration },
    /// The core is done with an exited executor: kill what is left of its
    /// session and reap it.
    Release { run_id: String },
    /// Stop these executors and reap them, then answer: the ones asked
    /// to shut down (`true`) get `grace` to exit on their own and then
    /// SIGTERM, the others SIGTERM at once; whatever still runs
    /// `overrun` after that gets SIGKILL. Used when the agent stops.
    StopAll {
        runs: Vec<(String, bool)>,
        grace: Duration,
        overrun: Duration,
        done: oneshot::Sender<()>,
    },
}

/// The core's handle on the process thread (and the containers thread,
/// which makes and ends the containers of command tasks).
#[derive(Clone)]
pub(crate) struct Processes {
    tx: Arc<std_mpsc::Sender<Request>>,
    /// The containers threads; a task's requests all go to one of them.
    containers: Arc<Vec<Arc<std_mpsc::Sender<Request>>>>,
}

/// Threads that make and end task containers: the kernel sometimes takes
/// milliseconds over a cgroup operation (waiting, not computing), which
/// one thread would make every task wait for.
const CONTAINER_THREADS: usize = 4;

/// What a launch gave the core.
#[derive(Debug, Clone, Copy)]
pub struct Started {
    pub pid: u32,
    pub start_time: Option<u64>,
}

struct Entry {
    key: ExecKey,
    process: Process,
    container: Option<Arc<Container>>,
    /// The container's limits as written.
    limits: Option<Limits>,
    /// Whether the container was given to the executor's user (then it
    /// is not reused).
    delegated: bool,
}

struct Keeper {
    core: mpsc::Sender<CoreEvent>,
    /// The thread's own queue, for fetchers to hand a launch back once
    /// its URIs are in the sandbox (weak: the thread still ends when the
    /// last [`Processes`] is dropped).
    requests: Weak<std_mpsc::Sender<Request>>,
    runtime: tokio::runtime::Handle,
    processes: HashMap<String, Entry>,
    /// Executors to SIGKILL at these times if still running.
    escalations: Vec<(Instant, String)>,
    cgroups: Option<Arc<Cgroups>>,
    removals: Removals,
    /// Whom executors run as.
    users: UserPolicy,
    /// Empty containers kept for reuse, shared with the containers
    /// threads.
    spares: SparePool,
}

/// The thread that makes and ends the containers of command tasks (that
/// run in a shared command executor): on the launch path of every such
/// task, so apart from sandboxes and executor spawns.
struct ContainerKeeper {
    core: mpsc::Sender<CoreEvent>,
    /// Its own queue, for out-of-memory watches to report to.
    requests: Weak<std_mpsc::Sender<Request>>,
    runtime: tokio::runtime::Handle,
    cgroups: Option<Arc<Cgroups>>,
    users: UserPolicy,
    containers: HashMap<StreamKey, TaskContainer>,
    /// Empty containers kept for reuse (cgroup v1), shared by the
    /// containers threads and the process thread.
    spares: SparePool,
    removals: Removals,
}

/// Empty containers kept for reuse (cgroup v1), oldest first: an ended
/// task's or executor's, for the next task or executor with the same
/// limits.
#[derive(Clone, Default)]
struct SparePool(Arc<std::sync::Mutex<std::collections::VecDeque<Spare>>>);

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
    /// The task it reports to; `None` while the container is a spare.
    task: Arc<std::sync::Mutex<Option<StreamKey>>>,
    handle: tokio::task::AbortHandle,
}

/// A command task's container.
struct TaskContainer {
    container: Arc<Container>,
    limits: Limits,
    /// Out-of-memory kills it had counted before the task (a reused
    /// container's).
    oom_base: u64,
    /// Given to the task's user: not reused.
    delegated: bool,
    /// Its out-of-memory watch.
    watch: Option<OomWatch>,
}

/// Spare containers an agent keeps at most.
const MAX_SPARES: usize = 256;
/// How long a spare container is kept unused.
const SPARE_IDLE: Duration = Duration::from_secs(5);

/// Containers to remove once their last process is gone: next attempt,
/// attempts so far.
#[derive(Default)]
struct Removals(Vec<(Instant, u32, Arc<Container>)>);

/// Creates `sandbox` (and its parents) for an executor or task: owned by
/// `user`, with whatever is already in it, when the agent switches to
/// that user.
fn create_sandbox(sandbox: &std::path::Path, user: Option<&RunAs>) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    let created = match user {
        Some(user) => user.create_dir(sandbox),
        None => std::fs::create_dir_all(sandbox),
    };
    // Its user's and its group's alone (Mesos's sandboxes under
    // --switch_user): a task of another user cannot read it.
    created
        .and_then(|()| {
            std::fs::set_permissions(sandbox, std::fs::Permissions::from_mode(SANDBOX_MODE))
        })
        .map_err(|e| {
            crate::disk::saw(&e);
            format!("cannot create sandbox {}: {e}", sandbox.display())
        })
}

/// The mode of a sandbox directory.
pub(crate) const SANDBOX_MODE: u32 = 0o750;

/// Time between attempts to remove a container whose processes are still
/// dying.
const REMOVAL_RETRY: Duration = Duration::from_millis(20);
/// Attempts after which a container that cannot be removed is left (and
/// logged); it is destroyed as an orphan when the agent restarts.
const REMOVAL_ATTEMPTS: u32 = 500;

// === impl Processes ===

impl Processes {
    /// Starts the thread; it ends when every handle is dropped. With
    /// `cgroups`, every container not named in `keep` (the run ids of
    /// executors recovered alive) is destroyed first.
    pub(crate) fn start(
        core: mpsc::Sender<CoreEvent>,
        cgroups: Option<Arc<Cgroups>>,
        users: UserPolicy,
        keep: &HashSet<String>,
    ) -> std::io::Result<Processes> {
        let (tx, rx) = std_mpsc::channel();
        let tx = Arc::new(tx);
        let mut keeper = Keeper {
            core,
            requests: Arc::downgrade(&tx),
            runtime: tokio::runtime::Handle::current(),
            processes: HashMap::default(),
            escalations: Vec::new(),
            cgroups,
            removals: Removals::default(),
            users,
            spares: SparePool::default(),
        };
        keeper.destroy_orphans(keep);
        let mut containers_txs = Vec::with_capacity(CONTAINER_THREADS);
        let spares = keeper.spares.clone();
        for _ in 0..CONTAINER_THREADS {
            let (containers_tx, containers_rx) = std_mpsc::channel();
            let containers_tx = Arc::new(containers_tx);
            let containers = ContainerKeeper {
                core: keeper.core.clone(),
                requests: Arc::downgrade(&containers_tx),
                runtime: keeper.runtime.clone(),
                cgroups: keeper.cgroups.clone(),
                users,
                containers: HashMap::default(),
                spares: spares.clone(),
                removals: Removals::default(),
            };
            std::thread::Builder::new()
                .name("agora-containers".into())
                .spawn(move || containers.run(containers_rx))?;
            containers_txs.push(containers_tx);
        }
        std::thread::Builder::new()
            .name("agora-processes".into())
            .spawn(move || keeper.run(rx))?;
        Ok(Processes {
            tx,
            containers: Arc::new(containers_txs),
        })
    }

    pub(crate) fn send(&self, request: Request) {
        // The threads outlive the core; a send fails only once they are
        // gone, when nothing is left to do.
        let _ = match &request {
            Request::TaskContainer { key, .. }
            | Request::EndTaskContainer { key, .. }
            | Request::AdoptTaskContainer { key, .. }
            | Request::TaskOutOfMemory { key } => {
                use std::hash::{BuildHasher, BuildHasherDefault};
                let hash =
                    BuildHasherDefault::<std::collections::hash_map::DefaultHasher>::default()
                        .hash_one(key);
                self.containers[hash as usize % self.containers.len()].send(request)
            }
            _ => self.tx.send(request),
        };
    }
}

// === impl Keeper ===

impl Keeper {
    fn run(mut self, rx: std_mpsc::Receiver<Request>) {
        // Exit watches register with the runtime's reactor from here.
        let runtime = self.runtime.clone();
        let _entered = runtime.enter();
        loop {
            let next = self
                .escalations
                .iter()
                .map(|(at, _)| *at)
                .chain(self.removals.next())
                .chain(self.spares.next_expiry())
                .min();
            let Ok(first) = next_request(&rx, next) else {
                return;
            };
            let batch: Vec<Request> = first.into_iter().chain(rx.try_iter()).collect();
            self.handle(batch);
            for spare in self.spares.expired() {
                self.removals.remove(spare.container, 0);
            }
        }
    }

    fn handle(&mut self, batch: Vec<Request>) {
        let mut term: Vec<u32> = Vec::new();
        let mut kill: Vec<u32> = Vec::new();
        let mut release: Vec<String> = Vec::new();
        for request in batch {
            match request {
                Request::Launch { key, run_id, spec } => self.launch(key, run_id, spec),
                Request::Adopt {
                    key,
                    run_id,
                    pid,
                    start_time,
                } => self.adopt(key, run_id, pid, start_time),
                Request::Update { run_id, limits } => self.update(&run_id, &limits),
                Request::CreateDir { path, user } => {
                    let created = self
                        .users
                        .resolve(&user)
                        .and_then(|user| create_sandbox(&path, user.as_ref()));
                    if let Err(e) = created {
                        tracing::warn!(path = %path.display(), error = %e, "cannot create a task sandbox");
                    }
                }
                Request::Fetch {
                    key,
                    sandbox,
                    uris,
                    user,
                } => self.fetch_task(key, sandbox, uris, &user),
                Request::TaskContainer { .. }
                | Request::EndTaskContainer { .. }
                | Request::AdoptTaskContainer { .. }
                | Request::TaskOutOfMemory { .. } => {
                    unreachable!("task containers are the containers thread's")
                }
                Request::Terminate { run_id, grace } => {
                    if let Some(entry) = self.processes.get(&run_id) {
                        entry.process.signal_group(Signal::SIGTERM);
                        if session_is_ours(&entry.process) {
                            term.push(entry.process.pid());
                        }
                        self.escalations.push((Instant::now() + grace, run_id));
                    }
                }
                Request::Release { run_id } => {
                    if let Some(entry) = self.processes.get(&run_id) {
                        if let Some(container) = &entry.container {
                            container.kill_all();
                        }
                        entry.process.signal_group(Signal::SIGKILL);
                        if session_is_ours(&entry.process) {
                            kill.push(entry.process.pid());
                        }
                    }
                    release.push(run_id);
                }
                Request::StopAll {
                    runs,
                    grace,
                    overrun,
                    done,
                } => {
                    self.stop_all(&runs, grace, overrun);
                    let _ = done.send(());
                }
            }
        }
        let now = Instant::now();
        let (due, later): (Vec<_>, Vec<_>) = std::mem::take(&mut self.escalations)
            .into_iter()
            .partition(|(at, _)| *at <= now);
        self.escalations = later;
        for (_, run_id) in due {
            if let Some(entry) = self.processes.get(&run_id) {
                if entry.process.is_running() {
                    tracing::info!(framework_id = %entry.key.0, executor_id = %entry.key.1, "executor outlived its grace period; SIGKILL");
                    if let Some(container) = &entry.container {
                        container.kill_all();
                    }
                    entry.process.signal_group(Signal::SIGKILL);
                    if session_is_ours(&entry.process) {
                        kill.push(entry.process.pid());
                    }
                }
            }
        }
        if !term.is_empty() {
            launcher::signal_session_members(&term, Signal::SIGTERM);
        }
        if !kill.is_empty() {
            launcher::signal_session_members(&kill, Signal::SIGKILL);
        }
        for run_id in release {
            self.escalations.retain(|(_, r)| *r != run_id);
            if let Some(mut entry) = self.processes.remove(&run_id) {
                entry.process.reap();
                if let Some(container) = entry.container.take() {
                    self.retire(container, entry.limits, entry.delegated);
                }
            }
        }
        self.removals.retry();
    }

    /// Keeps an ended executor's container as a spare (cgroup v1) when
    /// nothing is left in it and nothing of the executor shows in it,
    /// else removes it.
    fn retire(&mut self, container: Arc<Container>, limits: Option<Limits>, delegated: bool) {
        let reusable = !delegated
            && self.cgroups.as_ref().is_some_and(|c| c.reuses())
            && container.surely_empty()
            && container.oom_kills() == 0
            && container.pids_limit_hits() == 0;
        self.spares.keep(
            container,
            limits.filter(|_| reusable),
            None,
            &mut self.removals,
        );
    }

    /// Destroys every container under `--cgroups-root` that is not named
    /// in `keep`: left by an agent that died, their executors are not
    /// going to be recovered.
    fn destroy_orphans(&mut self, keep: &HashSet<String>) {
        let Some(cgroups) = self.cgroups.clone() else {
            return;
        };
        for name in cgroups.names() {
            if keep.contains(&name) {
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

    /// Grows the limits of `run_id`'s container.
    fn update(&mut self, run_id: &str, limits: &Limits) {
        let Some(cgroups) = &self.cgroups else {
            return;
        };
        let Some(entry) = self.processes.get_mut(run_id) else {
            return;
        };
        let Some(container) = &entry.container else {
            return;
        };
        match cgroups.set_limits(container, entry.limits, limits) {
            Ok(written) => entry.limits = Some(written),
            Err(e) => {
                tracing::warn!(framework_id = %entry.key.0, executor_id = %entry.key.1, error = %e, "cannot update the container's limits")
            }
        }
    }

    fn launch(&mut self, key: ExecKey, run_id: String, mut spec: LaunchSpec) {
        let user = self.users.resolve(&spec.user);
        if user.is_ok() && !spec.fetch.is_empty() {
            return self.fetch(key, run_id, spec);
        }
        if let Ok(Some(_)) = &user {
            // The agent's own TLS key is not the user's to read; the
            // executor still verifies the agent with the CA.
            spec.secrets
                .retain(|(k, _)| k != agora_proto::env::TLS_CERT && k != agora_proto::env::TLS_KEY);
        }
        let launched = user.and_then(|user| {
            create_sandbox(&spec.sandbox, user.as_ref())?;
            let (process, container) = self.spawn(&run_id, &spec, user.as_ref())?;
            Ok((process, container, user.is_some()))
        });
        let result = match launched {
            Ok((process, container, delegated)) => {
                let started = Started {
                    pid: process.pid(),
                    start_time: process.start_time(),
                };
                // Given to the user it runs as (`delegated`): never
                // reused.
                let container = container.map(|(c, limits)| (c, Some(limits), delegated));
                self.watch(key.clone(), run_id.clone(), process, container);
                Ok(started)
            }
            Err(message) => Err(message),
        };
        let _ = self
            .core
            .blocking_send(CoreEvent::Input(Input::ExecutorLaunched {
                key,
                run_id,
                result,
            }));
    }

    /// Fetches the spec's URIs on a thread of its own, then asks for the
    /// launch again (with nothing left to fetch); a failed fetch is a
    /// failed launch.
    fn fetch(&mut self, key: ExecKey, run_id: String, mut spec: LaunchSpec) {
        let requests = self.requests.clone();
        let core = self.core.clone();
        let runtime = self.runtime.clone();
        let (failed_key, failed_run) = (key.clone(), run_id.clone());
        let spawned = std::thread::Builder::new()
            .name("agora-fetcher".into())
            .spawn(move || {
                let uris = std::mem::take(&mut spec.fetch);
                let fetched = std::fs::create_dir_all(&spec.sandbox)
                    .map_err(|e| format!("cannot create sandbox {}: {e}", spec.sandbox.display()))
                    .and_then(|()| {
                        crate::fetch::fetch_all(&uris, &spec.sandbox, &runtime)
                            .map_err(|e| e.to_string())
                    });
                match fetched {
                    Ok(()) => {
                        if let Some(requests) = requests.upgrade() {
                            let _ = requests.send(Request::Launch { key, run_id, spec });
                        }
                    }
                    Err(message) => {
                        tracing::warn!(framework_id = %key.0, executor_id = %key.1, %message, "fetching the executor's URIs failed");
                        let _ = core.blocking_send(CoreEvent::Input(Input::ExecutorLaunched {
                            key,
                            run_id,
                            result: Err(message),
                        }));
                    }
                }
            });
        if let Err(e) = spawned {
            let _ = self
                .core
                .blocking_send(CoreEvent::Input(Input::ExecutorLaunched {
                    key: failed_key,
                    run_id: failed_run,
                    result: Err(format!("cannot start a fetcher thread: {e}")),
                }));
        }
    }

    /// Starts the executor, in a container of its own when the spec has
    /// limits (and the agent isolates with cgroups).
    #[allow(clippy::type_complexity)]
    fn spawn(
        &mut self,
        run_id: &str,
        spec: &LaunchSpec,
        user: Option<&RunAs>,
    ) -> Result<(Process, Option<(Arc<Container>, Limits)>), String> {
        let failed = |e: std::io::Error| match user {
            Some(user) => format!(
                "cannot start {:?} as user {:?}: {e}",
                spec.program, user.name
            ),
            None => format!("cannot start {:?}: {e}", spec.program),
        };
        let (Some(cgroups), Some(limits)) = (&self.cgroups, &spec.limits) else {
            return Process::spawn_as(spec, user)
                .map(|p| (p, None))
                .map_err(failed);
        };
        // An ended executor's or task's empty container with the same
        // limits, when the executor runs as the agent's user.
        let reused = user
            .is_none()
            .then(|| {
                self.spares
                    .reuse(cgroups, limits, run_id, &mut self.removals)
            })
            .flatten();
        let (container, written) = match reused {
            // A task's spare's out-of-memory watch ends here (dropped):
            // an executor's container is not watched that way.
            Some((container, _watch)) => (container, *limits),
            None => cgroups
                .create(run_id, limits)
                .map_err(|e| format!("cannot create the executor's container: {e}"))?,
        };
        if let Some(user) = user.filter(|_| cgroups.delegates()) {
            // The user's processes may then move between it and their
            // tasks' containers.
            if let Err(e) = container.delegate(user.uid, user.gid) {
                let _ = container.remove();
                return Err(format!(
                    "cannot give the executor's container to user {:?}: {e}",
                    user.name
                ));
            }
        }
        match cgroups.spawn_inside(&container, || Process::spawn_as(spec, user)) {
            Ok(process) => Ok((process, Some((Arc::new(container), written)))),
            Err(e) => {
                let _ = container.remove();
                Err(failed(e))
            }
        }
    }

    /// Fetches a command task's URIs into its sandbox on a thread of its
    /// own and tells the core how that went.
    fn fetch_task(
        &mut self,
        key: StreamKey,
        sandbox: std::path::PathBuf,
        uris: Vec<agora_proto::FetchUri>,
        user: &str,
    ) {
        let core = self.core.clone();
        let user = self.users.resolve(user);
        if uris.is_empty() {
            // Only the sandbox to make: quick enough for this thread.
            let result = user
                .and_then(|user| create_sandbox(&sandbox, user.as_ref()))
                .map(|()| TaskEntry::default());
            let _ = core.blocking_send(CoreEvent::Input(Input::TaskFetched { key, result }));
            return;
        }
        let runtime = self.runtime.clone();
        let failed = (key.clone(), core.clone());
        let spawned = std::thread::Builder::new()
            .name("agora-fetcher".into())
            .spawn(move || {
                let result = user.and_then(|user| {
                    create_sandbox(&sandbox, None)?;
                    crate::fetch::fetch_all(&uris, &sandbox, &runtime)
                        .map_err(|e| e.to_string())?;
                    create_sandbox(&sandbox, user.as_ref())?;
                    Ok(TaskEntry::default())
                });
                let _ = core.blocking_send(CoreEvent::Input(Input::TaskFetched { key, result }));
            });
        if let Err(e) = spawned {
            let (key, core) = failed;
            let _ = core.blocking_send(CoreEvent::Input(Input::TaskFetched {
                key,
                result: Err(format!("cannot start a fetcher thread: {e}")),
            }));
        }
    }

    fn adopt(&mut self, key: ExecKey, run_id: String, pid: u32, start_time: Option<u64>) {
        match Process::adopt(pid, start_time) {
            Some(process) => {
                let container = self
                    .cgroups
                    .as_ref()
                    .and_then(|c| c.open(&run_id))
                    // Its limits are unknown here: not reused.
                    .map(|c| (Arc::new(c), None, true));
                self.watch(key, run_id, process, container)
            }
            None => {
                if let Some(container) = self.cgroups.as_ref().and_then(|c| c.open(&run_id)) {
                    container.kill_all();
                    self.removals.remove(Arc::new(container), 0);
                }
                let _ = self
                    .core
                    .blocking_send(CoreEvent::Input(Input::ExecutorExited {
                        key,
                        run_id,
                        code: None,
                        message: "exited (status unknown: not a child of this agent run)".into(),
                    }));
            }
        }
    }

    /// Keeps `process` and starts the task that reports its exit (and,
    /// first, an out-of-memory kill in its container).
    fn watch(
        &mut self,
        key: ExecKey,
        run_id: String,
        process: Process,
        container: Option<(Arc<Container>, Option<Limits>, bool)>,
    ) {
        let watch = process.exit_watch();
        let child = process.is_child();
        let (container, limits, delegated) = match container {
            Some((c, l, d)) => (Some(c), l, d),
            None => (None, None, false),
        };
        let oom = container.as_ref().and_then(|c| {
            c.oom_fd()
                .and_then(crate::sys::register_readable)
                .map_err(|e| {
                    tracing::warn!(framework_id = %key.0, executor_id = %key.1, error = %e, "cannot listen for the container's out-of-memory events; checked at exit only");
                })
                .ok()
        });
        self.processes.insert(
            run_id.clone(),
            Entry {
                key: key.clone(),
                process,
                container: container.clone(),
                limits,
                delegated,
            },
        );
        let core = self.core.clone();
        let watch = match watch {
            Ok(watch) => watch,
            Err(e) => {
                tracing::error!(framework_id = %key.0, executor_id = %key.1, error = %e, "cannot watch the executor's exit; treating it as exited");
                let _ = self
                    .core
                    .blocking_send(CoreEvent::Input(Input::ExecutorExited {
                        key,
                        run_id,
                        code: None,
                        message: format!("could not be watched: {e}"),
                    }));
                return;
            }
        };
        self.runtime.spawn(async move {
            let mut limited = false;
            if let (Some(oom), Some(container)) = (&oom, &container) {
                tokio::select! {
                    _ = watch.exited() => {}
                    _ = out_of_memory(oom, container, true) => {
                        limited = true;
                        report_limitation(&core, &key, &run_id, container).await;
                        watch.exited().await;
                    }
                }
            } else {
                watch.exited().await;
            }
            if let Some(container) = container.as_ref().filter(|c| !limited && c.oom_kills() > 0) {
                report_limitation(&core, &key, &run_id, container).await;
            }
            let (code, message) = match watch.exit_status() {
                Some(status) => (
                    launcher::wait_status_code(&status),
                    launcher::describe_exit(&status),
                ),
                None if child => (None, "exited (status unknown)".to_string()),
                None => (
                    None,
                    "exited (status unknown: not a child of this agent run)".to_string(),
                ),
            };
            let _ = core
                .send(CoreEvent::Input(Input::ExecutorExited {
                    key,
                    run_id,
                    code,
                    message,
                }))
                .await;
        });
    }

    fn stop_all(&mut self, runs: &[(String, bool)], grace: Duration, overrun: Duration) {
        let signal = |keeper: &Keeper, which: &dyn Fn(bool) -> bool, signal: Signal| {
            let mut sids = Vec::new();
            for (run_id, asked) in runs {
                let Some(entry) = keeper.processes.get(run_id) else {
                    continue;
                };
                if which(*asked) && entry.process.is_running() {
                    entry.process.signal_group(signal);
                    if session_is_ours(&entry.process) {
                        sids.push(entry.process.pid());
                    }
                }
            }
            launcher::signal_session_members(&sids, signal);
        };
        let running = |keeper: &Keeper| {
            runs.iter().any(|(r, _)| {
                keeper
                    .processes
                    .get(r)
                    .is_some_and(|e| e.process.is_running())
            })
        };
        let wait = |keeper: &Keeper, limit: Duration| {
            let deadline = Instant::now() + limit;
            while Instant::now() < deadline && running(keeper) {
                std::thread::sleep(Duration::from_millis(10));
            }
        };
        signal(self, &|asked| !asked, Signal::SIGTERM);
        wait(self, grace);
        signal(self, &|asked| asked, Signal::SIGTERM);
        wait(self, overrun);
        signal(self, &|_| true, Signal::SIGKILL);
        wait(self, Duration::from_secs(1));
        for (run_id, _) in runs {
            self.escalations.retain(|(_, r)| r != run_id);
            if let Some(mut entry) = self.processes.remove(run_id) {
                if let Some(container) = &entry.container {
                    container.kill_all();
                }
                entry.process.signal_group(Signal::SIGKILL);
                entry.process.reap();
                if let Some(container) = entry.container.take() {
                    self.removals.remove(container, 0);
                }
            }
        }
        // The agent is stopping: give the last removals a moment.
        let deadline = Instant::now() + Duration::from_secs(1);
        while !self.removals.is_empty() && Instant::now() < deadline {
            std::thread::sleep(REMOVAL_RETRY);
            self.removals.retry();
        }
    }
}

// === impl ContainerKeeper ===

impl ContainerKeeper {
    fn run(mut self, rx: std_mpsc::Receiver<Request>) {
        let runtime = self.runtime.clone();
        let _entered = runtime.enter();
        loop {
            let expiry = self.spares.next_expiry();
            let next = self.removals.next().into_iter().chain(expiry).min();
            let Ok(request) = next_request(&rx, next) else {
                return;
            };
            for request in request.into_iter().chain(rx.try_iter()) {
                self.handle(request);
            }
            for spare in self.spares.expired() {
                self.removals.remove(spare.container, 0);
            }
            self.removals.retry();
        }
    }

    fn handle(&mut self, request: Request) {
        match request {
            Request::TaskContainer {
                key,
                name,
                limits,
                user,
            } => {
                let result = self
                    .users
                    .resolve(&user)
                    .and_then(|user| self.create(&key, &name, &limits, user.as_ref()));
                let _ = self
                    .core
                    .blocking_send(CoreEvent::Input(Input::TaskFetched { key, result }));
            }
            Request::EndTaskContainer { key, name } => self.end(key, &name),
            Request::AdoptTaskContainer { key, name } => {
                if let Some(container) = self.cgroups.as_ref().and_then(|c| c.open(&name)) {
                    // Its limits are unknown here: not reused.
                    self.watch(key, Arc::new(container), Limits::default(), true, None);
                }
            }
            Request::TaskOutOfMemory { key } => {
                if let Some(TaskContainer { container, .. }) = self.containers.get(&key) {
                    let killed = container.kill_all();
                    tracing::warn!(framework_id = %key.0, task_id = %key.1, container = container.name(), killed, "the task's container ran out of memory; killed");
                }
            }
            other => tracing::error!(request = ?other, "not a request for the containers thread"),
        }
    }

    /// Creates command task `key`'s container `name` with `limits`, given
    /// to `user` when the executor runs as one, and watches it for
    /// out-of-memory kills. Returns the files its process enters it
    /// through.
    fn create(
        &mut self,
        key: &StreamKey,
        name: &str,
        limits: &Limits,
        user: Option<&RunAs>,
    ) -> Result<TaskEntry, String> {
        let Some(cgroups) = self.cgroups.clone() else {
            return Ok(TaskEntry::default());
        };
        // A spare with the same limits, when the task's user
        // is the agent's.
        let reused = user
            .is_none()
            .then(|| {
                self.spares
                    .reuse(&cgroups, limits, name, &mut self.removals)
            })
            .flatten();
        let (container, watch) = match reused {
            Some(reused) => reused,
            None => {
                let (container, _) = cgroups
                    .create(name, limits)
                    .map_err(|e| format!("cannot create the task's container: {e}"))?;
                (container, None)
            }
        };
        if let Some(user) = user {
            if let Err(e) = container.delegate(user.uid, user.gid) {
                let _ = container.remove();
                return Err(format!(
                    "cannot give the task's container to user {:?}: {e}",
                    user.name
                ));
            }
        }
        let entry = TaskEntry {
            files: container
                .entry_files()
                .iter()
                .map(|f| f.display().to_string())
                .collect(),
            // Only for a container that may be reused: never one given to
            // a user, nor any where the agent reuses none.
            lasting: (user.is_none() && cgroups.reuses()).then(|| container.dir_name().to_string()),
        };
        self.watch(
            key.clone(),
            Arc::new(container),
            *limits,
            user.is_some(),
            watch,
        );
        Ok(entry)
    }

    /// Keeps command task `key`'s container and, until the task ends,
    /// has an out-of-memory kill in it kill it whole: through `watch`,
    /// the container's watch from its previous task, or a new one.
    fn watch(
        &mut self,
        key: StreamKey,
        container: Arc<Container>,
        limits: Limits,
        delegated: bool,
        watch: Option<OomWatch>,
    ) {
        let watch = match watch {
            Some(watch) => {
                watch.report_to(Some(key.clone()));
                Some(watch)
            }
            None => self.watch_out_of_memory(&key, &container),
        };
        let oom_base = container.oom_kills();
        self.containers.insert(
            key,
            TaskContainer {
                container,
                limits,
                oom_base,
                delegated,
                watch,
            },
        );
    }

    /// Kills command task `key`'s container whole, has it removed, and
    /// tells the core whether it had run out of memory.
    fn end(&mut self, key: StreamKey, name: &str) {
        let task = self.containers.remove(&key).or_else(|| {
            // Not watched (an agent restarted meanwhile): ended all the
            // same.
            let container = self.cgroups.as_ref()?.open(name)?;
            Some(TaskContainer {
                container: Arc::new(container),
                limits: Limits::default(),
                oom_base: 0,
                delegated: true,
                watch: None,
            })
        });
        let mut limitation = None;
        if let Some(task) = task {
            if let Some(watch) = &task.watch {
                // No longer the task's, whatever comes.
                watch.report_to(None);
            }
            let container = task.container;
            let killed = container.kill_all();
            let oom_kills = container.oom_kills();
            if oom_kills > task.oom_base {
                let message = memory_limit_message(&container, "the task's mem");
                limitation = Some(Limitation {
                    reason: agora_proto::Reason::ReasonContainerLimitationMemory,
                    message,
                });
            }
            // Kept for another task if nothing was left in it (`kill_all`
            // finds no process before it signals any) and nothing of
            // this task shows in it.
            let clean = killed == 0
                && !task.delegated
                && oom_kills == 0
                && container.pids_limit_hits() == 0;
            self.retire(container, task.limits, clean, task.watch);
        }
        let _ = self
            .core
            .blocking_send(CoreEvent::Input(Input::TaskContainerEnded {
                key,
                limitation,
            }));
    }

    /// Keeps an ended task's empty container as a spare (cgroup v1, when
    /// `clean`), else removes it; the oldest spare goes when there are
    /// too many.
    fn retire(
        &mut self,
        container: Arc<Container>,
        limits: Limits,
        clean: bool,
        watch: Option<OomWatch>,
    ) {
        // Held by the ended task's run (which no task has now) until it
        // is reused. An agent that restarts destroys it as an orphan.
        let reusable = clean && self.cgroups.as_ref().is_some_and(|c| c.reuses());
        self.spares.keep(
            container,
            reusable.then_some(limits),
            watch,
            &mut self.removals,
        );
    }

    /// A new out-of-memory watch of command task `key`'s container
    /// (`None`, logged, when the kernel will not give one: the container
    /// is then checked when the task ends).
    fn watch_out_of_memory(&self, key: &StreamKey, container: &Arc<Container>) -> Option<OomWatch> {
        let oom = container
            .oom_fd()
            .and_then(crate::sys::register_readable)
            .map_err(|e| {
                tracing::warn!(framework_id = %key.0, task_id = %key.1, error = %e, "cannot listen for the task container's out-of-memory events; checked when it ends");
            })
            .ok()?;
        let task = Arc::new(std::sync::Mutex::new(Some(key.clone())));
        let requests = self.requests.clone();
        let (owner, container) = (task.clone(), container.clone());
        let handle = self
            .runtime
            .spawn(async move {
                while out_of_memory(&oom, &container, false).await {
                    let key = owner
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .clone();
                    match (key, requests.upgrade()) {
                        (Some(key), Some(requests)) => {
                            let _ = requests.send(Request::TaskOutOfMemory { key });
                        }
                        (_, None) => break,
                        (None, Some(_)) => {}
                    }
                }
            })
            .abort_handle();
        Some(OomWatch { task, handle })
    }
}

// === impl SparePool ===

impl SparePool {
    fn lock(&self) -> std::sync::MutexGuard<'_, std::collections::VecDeque<Spare>> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
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
    /// Has the watch report to task `task` (`None`: to nobody).
    fn report_to(&self, task: Option<StreamKey>) {
        *self
            .task
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = task;
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

/// The next request, waiting at most until `deadline` (`None` when it
/// passed first); `Err` once every sender is gone.
fn next_request(
    rx: &std_mpsc::Receiver<Request>,
    deadline: Option<Instant>,
) -> Result<Option<Request>, ()> {
    match deadline {
        Some(at) => match rx.recv_timeout(at.saturating_duration_since(Instant::now())) {
            Ok(request) => Ok(Some(request)),
            Err(std_mpsc::RecvTimeoutError::Timeout) => Ok(None),
            Err(std_mpsc::RecvTimeoutError::Disconnected) => Err(()),
        },
        None => rx.recv().map(Some).map_err(drop),
    }
}

/// Completes once the container ran out of memory (`true`). On cgroup v1
/// the kernel signals the eventfd as its out-of-memory handling starts
/// (before it kills a process, so before the executor can see one die);
/// on v2 `memory.events` changes, and the container tells whether it
/// counts an out-of-memory kill. Both also fire when the cgroup is
/// removed, which is not an out-of-memory event: then it completes with
/// `false`, or never when `forever`.
async fn out_of_memory(
    oom: &tokio::io::unix::AsyncFd<std::os::fd::OwnedFd>,
    container: &Container,
    forever: bool,
) -> bool {
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

/// Tells the core that the run's container ran out of memory.
async fn report_limitation(
    core: &mpsc::Sender<CoreEvent>,
    key: &ExecKey,
    run_id: &str,
    container: &Container,
) {
    let message = memory_limit_message(container, "the task's mem plus its executor's");
    tracing::warn!(framework_id = %key.0, executor_id = %key.1, container = container.name(), %message, "container reached its memory limit and will be destroyed");
    let _ = core
        .send(CoreEvent::Input(Input::ContainerLimited {
            key: key.clone(),
            run_id: run_id.to_string(),
            limitation: Limitation {
                reason: agora_proto::Reason::ReasonContainerLimitationMemory,
                message,
            },
        }))
        .await;
}

/// Whether the session named by the process's pid is still its own: for
/// a child it is (its unreaped leader holds the id); for a re-attached
/// process only while no other process has taken that pid.
fn session_is_ours(process: &Process) -> bool {
    process.is_child()
        || launcher::proc_stat(process.pid() as i32)
            .is_none_or(|s| Some(s.start_time) == process.start_time())
}
