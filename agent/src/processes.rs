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

use agora_proto::hash::HashMap;
use std::sync::mpsc as std_mpsc;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use tokio::sync::{mpsc, oneshot};

use crate::core::{ExecKey, Input};
use crate::launcher::{self, LaunchSpec, Process};
use crate::shell::CoreEvent;
use crate::status_updates::StreamKey;

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
    /// Create a directory (a command task's sandbox, which its command
    /// executor also creates if it gets there first).
    CreateDir { path: std::path::PathBuf },
    /// Create command task `key`'s sandbox and fetch `uris` into it, on a
    /// thread of their own, then tell the core ([`Input::TaskFetched`]).
    Fetch {
        key: StreamKey,
        sandbox: std::path::PathBuf,
        uris: Vec<agora_proto::FetchUri>,
    },
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

/// The core's handle on the process thread.
#[derive(Clone)]
pub(crate) struct Processes {
    tx: Arc<std_mpsc::Sender<Request>>,
}

/// What a launch gave the core.
#[derive(Debug, Clone, Copy)]
pub struct Started {
    pub pid: u32,
    pub start_time: Option<u64>,
}

struct Entry {
    key: ExecKey,
    process: Process,
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
}

// === impl Processes ===

impl Processes {
    /// Starts the thread; it ends when every handle is dropped.
    pub(crate) fn start(core: mpsc::Sender<CoreEvent>) -> std::io::Result<Processes> {
        let (tx, rx) = std_mpsc::channel();
        let tx = Arc::new(tx);
        let keeper = Keeper {
            core,
            requests: Arc::downgrade(&tx),
            runtime: tokio::runtime::Handle::current(),
            processes: HashMap::default(),
            escalations: Vec::new(),
        };
        std::thread::Builder::new()
            .name("agora-processes".into())
            .spawn(move || keeper.run(rx))?;
        Ok(Processes { tx })
    }

    pub(crate) fn send(&self, request: Request) {
        // The thread outlives the core; a send fails only once it is gone,
        // when nothing is left to do.
        let _ = self.tx.send(request);
    }
}

// === impl Keeper ===

impl Keeper {
    fn run(mut self, rx: std_mpsc::Receiver<Request>) {
        // Exit watches register with the runtime's reactor from here.
        let runtime = self.runtime.clone();
        let _entered = runtime.enter();
        loop {
            let next = self.escalations.iter().map(|(at, _)| *at).min();
            let first = match next {
                Some(at) => match rx.recv_timeout(at.saturating_duration_since(Instant::now())) {
                    Ok(request) => Some(request),
                    Err(std_mpsc::RecvTimeoutError::Timeout) => None,
                    Err(std_mpsc::RecvTimeoutError::Disconnected) => return,
                },
                None => match rx.recv() {
                    Ok(request) => Some(request),
                    Err(_) => return,
                },
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
                Request::CreateDir { path } => {
                    if let Err(e) = std::fs::create_dir_all(&path) {
                        tracing::warn!(path = %path.display(), error = %e, "cannot create a task sandbox");
                    }
                }
                Request::Fetch { key, sandbox, uris } => self.fetch_task(key, sandbox, uris),
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
            }
        }
    }

    fn launch(&mut self, key: ExecKey, run_id: String, spec: LaunchSpec) {
        if !spec.fetch.is_empty() {
            return self.fetch(key, run_id, spec);
        }
        let launched = std::fs::create_dir_all(&spec.sandbox)
            .map_err(|e| format!("cannot create sandbox {}: {e}", spec.sandbox.display()))
            .and_then(|()| {
                Process::spawn(&spec).map_err(|e| format!("cannot start {:?}: {e}", spec.program))
            });
        let result = match launched {
            Ok(process) => {
                let started = Started {
                    pid: process.pid(),
                    start_time: process.start_time(),
                };
                self.watch(key.clone(), run_id.clone(), process);
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

    /// Fetches a command task's URIs into its sandbox on a thread of its
    /// own and tells the core how that went.
    fn fetch_task(
        &mut self,
        key: StreamKey,
        sandbox: std::path::PathBuf,
        uris: Vec<agora_proto::FetchUri>,
    ) {
        let core = self.core.clone();
        let runtime = self.runtime.clone();
        let failed = (key.clone(), core.clone());
        let spawned = std::thread::Builder::new()
            .name("agora-fetcher".into())
            .spawn(move || {
                let result = std::fs::create_dir_all(&sandbox)
                    .map_err(|e| format!("cannot create sandbox {}: {e}", sandbox.display()))
                    .and_then(|()| {
                        crate::fetch::fetch_all(&uris, &sandbox, &runtime)
                            .map_err(|e| e.to_string())
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
            Some(process) => self.watch(key, run_id, process),
            None => {
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

    /// Keeps `process` and starts the task that reports its exit.
    fn watch(&mut self, key: ExecKey, run_id: String, process: Process) {
        let watch = process.exit_watch();
        let child = process.is_child();
        self.processes.insert(
            run_id.clone(),
            Entry {
                key: key.clone(),
                process,
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
            watch.exited().await;
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
                entry.process.signal_group(Signal::SIGKILL);
                entry.process.reap();
            }
        }
    }
}

/// Whether the session named by the process's pid is still its own: for
/// a child it is (its unreaped leader holds the id); for a re-attached
/// process only while no other process has taken that pid.
fn session_is_ours(process: &Process) -> bool {
    process.is_child()
        || launcher::proc_stat(process.pid() as i32)
            .is_none_or(|s| Some(s.start_time) == process.start_time())
}
