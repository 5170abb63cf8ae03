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
//! Under `--isolation cgroups` each run also has a container, which the
//! [`Containerizer`] makes and ends: created before the spawn, which
//! happens inside it; watched for out-of-memory kills
//! ([`Input::ContainerLimited`]); killed whole when the run is
//! released or killed; kept for reuse or removed once empty.

use agora_proto::hash::{HashMap, HashSet};
use std::sync::mpsc as std_mpsc;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use tokio::sync::mpsc;

use agora_containerizer::{
    Containerizer, Holder, LaunchError, Limitation, Limits, Owner, RunContainer,
};

use crate::launcher::{self, LaunchSpec, Process};
use crate::messages::{CoreEvent, ExecKey, ImageRun, Input, Request, Started, TaskEntry};
use crate::status_updates::StreamKey;
use crate::users::{RunAs, UserPolicy};

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

struct Entry {
    key: ExecKey,
    process: Process,
    container: Option<RunContainer>,
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
    /// The executors' containers (a handle of its own).
    containerizer: Containerizer,
    /// Whom executors run as.
    users: UserPolicy,
    /// Command tasks' image containers (`--image-providers`).
    images: Option<agora_containerizer::ImageContainers>,
}

/// The thread that makes and ends the containers of command tasks (that
/// run in a shared command executor): on the launch path of every such
/// task, so apart from sandboxes and executor spawns.
struct ContainerKeeper {
    core: mpsc::Sender<CoreEvent>,
    /// Its own queue, for out-of-memory watches to report to.
    requests: Weak<std_mpsc::Sender<Request>>,
    runtime: tokio::runtime::Handle,
    /// The tasks' containers (a handle of its own, sharing the spare
    /// containers with the process thread and the other containers
    /// threads).
    containerizer: Containerizer,
    users: UserPolicy,
    containers: HashMap<StreamKey, RunContainer>,
}

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

// === impl Processes ===

impl Processes {
    /// Starts the thread; it ends when every handle is dropped. Every
    /// container not named in `keep` (the run ids of executors recovered
    /// alive) is destroyed first.
    pub(crate) fn start(
        core: mpsc::Sender<CoreEvent>,
        containerizer: Containerizer,
        images: Option<agora_containerizer::ImageContainers>,
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
            containerizer,
            users,
            images,
        };
        keeper.containerizer.recover(|run| keep.contains(run));
        let mut containers_txs = Vec::with_capacity(CONTAINER_THREADS);
        for _ in 0..CONTAINER_THREADS {
            let (containers_tx, containers_rx) = std_mpsc::channel();
            let containers_tx = Arc::new(containers_tx);
            let containers = ContainerKeeper {
                core: keeper.core.clone(),
                requests: Arc::downgrade(&containers_tx),
                runtime: keeper.runtime.clone(),
                containerizer: keeper.containerizer.handle(),
                users,
                containers: HashMap::default(),
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
    /// Pulls the image of command task `key` and makes its container, on
    /// the runtime (a pull takes as long as the registry does), then
    /// tells the core.
    fn prepare_image(&self, key: StreamKey, task: agora_containerizer::ImageTask) {
        let core = self.core.clone();
        let images = self.images.clone();
        self.runtime.spawn(async move {
            let result = match images {
                None => Err("images are not enabled on this agent (--image-providers)".into()),
                Some(images) => {
                    // The sandbox may still be on its way (its request
                    // went to another thread).
                    match tokio::fs::create_dir_all(&task.sandbox).await {
                        Err(e) => Err(format!(
                            "cannot create sandbox {}: {e}",
                            task.sandbox.display()
                        )),
                        Ok(()) => images
                            .prepare(task)
                            .await
                            .map(|prepared| ImageRun {
                                id: prepared.id,
                                command: prepared.command,
                                pid: prepared.pid,
                            })
                            .map_err(|e| e.to_string()),
                    }
                }
            };
            let _ = core
                .send(CoreEvent::Input(Input::ImagePrepared { key, result }))
                .await;
        });
    }

    /// Destroys command task `key`'s image container `id`, then tells the
    /// core.
    fn end_image_container(&self, key: StreamKey, id: String) {
        let core = self.core.clone();
        let images = self.images.clone();
        self.runtime.spawn(async move {
            if let Some(images) = images {
                if let Err(error) = images.destroy(&id).await {
                    tracing::warn!(container = %id, %error, "destroying a task's image container");
                }
            }
            let _ = core
                .send(CoreEvent::Input(Input::TaskContainerEnded {
                    key,
                    limitation: None,
                }))
                .await;
        });
    }

    fn run(mut self, rx: std_mpsc::Receiver<Request>) {
        // Exit watches register with the runtime's reactor from here.
        let runtime = self.runtime.clone();
        let _entered = runtime.enter();
        loop {
            let next = self
                .escalations
                .iter()
                .map(|(at, _)| *at)
                .chain(self.containerizer.next_tidy())
                .min();
            let Ok(first) = next_request(&rx, next) else {
                return;
            };
            let batch: Vec<Request> = first.into_iter().chain(rx.try_iter()).collect();
            self.handle(batch);
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
                Request::PrepareImage { key, task } => self.prepare_image(key, *task),
                Request::EndImageContainer { key, id } => self.end_image_container(key, id),
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
                            container.kill();
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
                        container.kill();
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
                    // Kept as a spare when nothing of the executor is left
                    // or shows in it.
                    self.containerizer.retire(container);
                }
            }
        }
        self.containerizer.tidy();
    }

    /// Grows the limits of `run_id`'s container.
    fn update(&mut self, run_id: &str, limits: &Limits) {
        let Some(entry) = self.processes.get_mut(run_id) else {
            return;
        };
        let Some(container) = &mut entry.container else {
            return;
        };
        if let Err(e) = self.containerizer.update(container, limits) {
            tracing::warn!(framework_id = %entry.key.0, executor_id = %entry.key.1, error = %e, "cannot update the container's limits")
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
            self.spawn(&run_id, &spec, user.as_ref())
        });
        let result = match launched {
            Ok((process, container)) => {
                let started = Started {
                    pid: process.pid(),
                    start_time: process.start_time(),
                };
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
    /// limits (and the agent isolates with cgroups): a spare when it runs
    /// as the agent's user, else one given to its user where that can be
    /// done.
    fn spawn(
        &mut self,
        run_id: &str,
        spec: &LaunchSpec,
        user: Option<&RunAs>,
    ) -> Result<(Process, Option<RunContainer>), String> {
        let owner = user.map(|user| Owner {
            uid: user.uid,
            gid: user.gid,
        });
        // The loggers start here, outside the executor's container; the
        // executor gets the write ends of their pipes (dropped here once
        // it has its copies).
        let outputs = Process::start_loggers(spec, user)
            .map_err(|e| format!("cannot start the container logger: {e}"))?;
        let fds = outputs
            .as_ref()
            .map(|(out, err)| (std::os::fd::AsFd::as_fd(out), std::os::fd::AsFd::as_fd(err)));
        let start = |birth: Option<std::os::fd::BorrowedFd<'_>>| match birth {
            Some(cgroup) => crate::sys::spawn_into_cgroup(cgroup, || {
                Process::spawn_with_outputs(spec, user, fds)
            }),
            None => Process::spawn_with_outputs(spec, user, fds),
        };
        self.containerizer
            .launch(run_id, spec.limits.as_ref(), owner, start)
            .map_err(|e| match e {
                LaunchError::Create(e) => format!("cannot create the executor's container: {e}"),
                LaunchError::Delegate(e) => format!(
                    "cannot give the executor's container to user {:?}: {e}",
                    user.map_or("", |user| user.name.as_str())
                ),
                LaunchError::Start(e) => match user {
                    Some(user) => format!(
                        "cannot start {:?} as user {:?}: {e}",
                        spec.program, user.name
                    ),
                    None => format!("cannot start {:?}: {e}", spec.program),
                },
            })
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
                // Its limits are unknown here: not reused.
                let container = self.containerizer.recovered(&run_id, Holder::Executor);
                self.watch(key, run_id, process, container)
            }
            None => {
                if let Some(container) = self.containerizer.recovered(&run_id, Holder::Executor) {
                    container.kill();
                    self.containerizer.remove(container);
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
        container: Option<RunContainer>,
    ) {
        let watch = process.exit_watch();
        let child = process.is_child();
        let limits = container.as_ref().map(RunContainer::limit_watch);
        self.processes.insert(
            run_id.clone(),
            Entry {
                key: key.clone(),
                process,
                container,
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
            if let Some(limits) = &limits {
                tokio::select! {
                    _ = watch.exited() => {}
                    limitation = limits.wait() => {
                        limited = true;
                        report_limitation(&core, &key, &run_id, limitation).await;
                        watch.exited().await;
                    }
                }
            } else {
                watch.exited().await;
            }
            if let Some(limitation) = limits.filter(|_| !limited).and_then(|l| l.reached()) {
                report_limitation(&core, &key, &run_id, limitation).await;
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
                    container.kill();
                }
                entry.process.signal_group(Signal::SIGKILL);
                entry.process.reap();
                if let Some(container) = entry.container.take() {
                    self.containerizer.remove(container);
                }
            }
        }
        // The agent is stopping: give the last removals a moment.
        self.containerizer.finish(Duration::from_secs(1));
    }
}

// === impl ContainerKeeper ===

impl ContainerKeeper {
    fn run(mut self, rx: std_mpsc::Receiver<Request>) {
        let runtime = self.runtime.clone();
        let _entered = runtime.enter();
        loop {
            let next = self.containerizer.next_tidy();
            let Ok(request) = next_request(&rx, next) else {
                return;
            };
            for request in request.into_iter().chain(rx.try_iter()) {
                self.handle(request);
            }
            self.containerizer.tidy();
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
                if let Some(mut container) = self.containerizer.recovered(&name, Holder::Task) {
                    // Its limits are unknown here: not reused.
                    let on_limit = self.on_limit(&key);
                    self.containerizer.watch(&mut container, on_limit);
                    self.containers.insert(key, container);
                }
            }
            Request::TaskOutOfMemory { key } => {
                if let Some(container) = self.containers.get(&key) {
                    let killed = container.kill();
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
        let owner = user.map(|user| Owner {
            uid: user.uid,
            gid: user.gid,
        });
        let on_limit = self.on_limit(key);
        let prepared = self
            .containerizer
            .prepare(name, limits, owner, on_limit)
            .map_err(|e| match e {
                LaunchError::Delegate(e) => format!(
                    "cannot give the task's container to user {:?}: {e}",
                    user.map_or("", |user| user.name.as_str())
                ),
                LaunchError::Create(e) | LaunchError::Start(e) => {
                    format!("cannot create the task's container: {e}")
                }
            })?;
        let Some(container) = prepared else {
            return Ok(TaskEntry::default());
        };
        let entry = TaskEntry {
            files: container
                .entry_files()
                .iter()
                .map(|f| f.display().to_string())
                .collect(),
            lasting: container.lasting_name().map(str::to_string),
        };
        self.containers.insert(key.clone(), container);
        Ok(entry)
    }

    /// What an out-of-memory kill in command task `key`'s container
    /// does: has this thread kill the container whole (the task then
    /// ends, and [`Request::EndTaskContainer`] reports the limitation).
    fn on_limit(&self, key: &StreamKey) -> impl Fn() -> bool + Send + 'static {
        let (key, requests) = (key.clone(), self.requests.clone());
        move || match requests.upgrade() {
            Some(requests) => {
                let _ = requests.send(Request::TaskOutOfMemory { key: key.clone() });
                true
            }
            None => false,
        }
    }

    /// Kills command task `key`'s container whole, has it removed (or
    /// kept for another task), and tells the core whether it had run out
    /// of memory.
    fn end(&mut self, key: StreamKey, name: &str) {
        // Not watched (an agent restarted meanwhile): ended all the same.
        let task = self
            .containers
            .remove(&key)
            .or_else(|| self.containerizer.recovered(name, Holder::Task));
        let limitation = task.and_then(|task| self.containerizer.destroy(task));
        let _ = self
            .core
            .blocking_send(CoreEvent::Input(Input::TaskContainerEnded {
                key,
                limitation,
            }));
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

/// Tells the core that the run's container reached a limit.
async fn report_limitation(
    core: &mpsc::Sender<CoreEvent>,
    key: &ExecKey,
    run_id: &str,
    limitation: Limitation,
) {
    tracing::warn!(framework_id = %key.0, executor_id = %key.1, container = run_id, message = %limitation.message, "container reached its memory limit and will be destroyed");
    let _ = core
        .send(CoreEvent::Input(Input::ContainerLimited {
            key: key.clone(),
            run_id: run_id.to_string(),
            limitation,
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
