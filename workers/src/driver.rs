//! [`WorkerDriver`]: the shell around [`WorkerCore`] — a thread that owns
//! the core, the worker store and a [`SchedulerDriver`], and carries out
//! what the core decides.
//!
//! Threads: [`WorkerDriver::initialize`] spawns one thread running a
//! current-thread tokio runtime (the driver's *main thread*, in Flink's
//! terms). Driver methods and the scheduler SDK's callbacks only push a
//! command into its unbounded queue and return, so they may be called
//! from anywhere, including from inside [`WorkerEventHandler`] callbacks,
//! which run on that thread. The thread drains every queued command
//! before acting, so a burst of requests costs one store write (group
//! commit) and one revive.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::thread;
use std::time::Duration;

use agora_proto::{
    AgentId, ExecutorId, Filters, FrameworkId, FrameworkInfo, MasterInfo, Offer, OfferId,
    TaskStatus,
};
use agora_scheduler::{DriverConfig, Scheduler, SchedulerDriver};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;

use crate::core::{Action, CoreConfig, Event, WorkerCore};
use crate::events::{FatalError, WorkerEventHandler, WorkerHandle, WorkerId};
use crate::spec::WorkerSpec;
use crate::store::{StoreOp, WorkerStore};
use crate::{DriverOptions, FinalStatus, RequestError, WorkerError};

/// Commands drained per wake-up before acting.
const DRAIN: usize = 4096;

/// Identifies one request for [`WorkerDriver::cancel`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RequestId(pub u64);

/// The driver of a job runtime's workers (Flink's
/// `ResourceManagerDriver`): requests and releases workers on an Agora
/// cluster and reports what becomes of them to a [`WorkerEventHandler`].
/// Cheap to clone; every clone is the same driver.
///
/// ```no_run
/// use std::sync::Arc;
/// use agora_workers::{DriverOptions, MemoryStore, WorkerDriver, WorkerEventHandler, WorkerSpec};
/// use agora_workers::proto::Resources;
///
/// struct Log;
/// impl WorkerEventHandler for Log {}
///
/// # async fn example() {
/// let driver = WorkerDriver::initialize(
///     DriverOptions::new("127.0.0.1:5050", "my-runtime"),
///     Box::new(MemoryStore::default()),
///     Arc::new(Log),
/// )
/// .unwrap();
/// let spec = WorkerSpec::new("taskmanager", Resources::parse("cpus:1;mem:512").unwrap(), "./tm.sh")
///     .prefer_host("host-7", 1.0);
/// let worker = driver.request_worker(spec).await.unwrap();
/// println!("{} runs on {} ({})", worker.id, worker.hostname, worker.locality);
/// driver.release_worker(&worker.id).unwrap();
/// # }
/// ```
#[derive(Clone)]
pub struct WorkerDriver {
    inner: Arc<Inner>,
}

/// A request's result: completes with the worker once its task is about
/// to be sent, or fails (cancelled, deregistered, driver stopped).
#[must_use = "a request is served whether or not its future is polled; keep it to learn the worker"]
pub struct WorkerFuture {
    request: RequestId,
    rx: oneshot::Receiver<Result<WorkerHandle, RequestError>>,
}

struct Inner {
    commands: mpsc::UnboundedSender<Command>,
    shared: Mutex<Shared>,
    ended: watch::Sender<bool>,
    next_request: AtomicU64,
}

#[derive(Default)]
struct Shared {
    framework_id: Option<FrameworkId>,
    attempt: u64,
    end: Option<String>,
    thread: Option<thread::JoinHandle<()>>,
}

enum Command {
    Request {
        request: RequestId,
        spec: WorkerSpec,
        reply: oneshot::Sender<Result<WorkerHandle, RequestError>>,
    },
    Cancel(RequestId),
    Release(WorkerId),
    Deregister {
        status: FinalStatus,
        diagnostics: Option<String>,
        done: oneshot::Sender<()>,
    },
    Terminate {
        done: oneshot::Sender<()>,
    },
    Offers(Vec<Offer>),
    Status(TaskStatus),
    AgentLost(AgentId),
    Subscribed(Option<FrameworkId>),
    Disconnected,
    SchedulerError(String),
}

/// Forwards the scheduler SDK's callbacks to the driver thread.
struct Forward(mpsc::UnboundedSender<Command>);

/// The driver thread's state besides the core.
struct Shell {
    store: Box<dyn WorkerStore>,
    handler: Arc<dyn WorkerEventHandler>,
    scheduler: Option<SchedulerDriver>,
    futures: HashMap<WorkerId, oneshot::Sender<Result<WorkerHandle, RequestError>>>,
    requests: HashMap<RequestId, WorkerId>,
    inner: Arc<Inner>,
}

/// How the driver thread's loop goes on.
enum Flow {
    Continue,
    End(String),
}

// === impl WorkerDriver ===

impl WorkerDriver {
    /// Starts the driver: loads `store`, reports the previous attempt's
    /// workers to `handler`, and registers the framework (as the stored
    /// framework id when there is one, so the master fails the framework
    /// over to this process). Returns at once; requests made meanwhile
    /// are served after recovery.
    pub fn initialize(
        options: DriverOptions,
        store: Box<dyn WorkerStore>,
        handler: Arc<dyn WorkerEventHandler>,
    ) -> Result<WorkerDriver, WorkerError> {
        if options.master.trim().is_empty() {
            return Err(WorkerError::InvalidMaster(options.master));
        }
        let (commands, rx) = mpsc::unbounded_channel();
        let (ended, _) = watch::channel(false);
        let inner = Arc::new(Inner {
            commands,
            shared: Mutex::new(Shared::default()),
            ended,
            next_request: AtomicU64::new(1),
        });
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let thread_inner = inner.clone();
        let handle = thread::Builder::new()
            .name("agora-worker-driver".into())
            .spawn(move || {
                let end = runtime.block_on(run(options, store, handler, thread_inner.clone(), rx));
                tracing::info!(reason = %end, "worker driver ended");
                thread_inner.lock().end = Some(end);
                thread_inner.ended.send_replace(true);
            })?;
        inner.lock().thread = Some(handle);
        Ok(WorkerDriver { inner })
    }

    /// Requests one worker. The future completes with the worker once its
    /// placement is decided and durable, before its task is sent; failures
    /// after that come as `on_worker_terminated`.
    pub fn request_worker(&self, spec: WorkerSpec) -> WorkerFuture {
        let request = RequestId(self.inner.next_request.fetch_add(1, Ordering::Relaxed));
        let (reply, rx) = oneshot::channel();
        // A driver that has ended drops the command, and the future fails.
        let _ = self.inner.commands.send(Command::Request {
            request,
            spec,
            reply,
        });
        WorkerFuture { request, rx }
    }

    /// Withdraws a request not placed yet (its future fails with
    /// [`RequestError::Cancelled`]); a request already placed is unaffected.
    pub fn cancel(&self, request: RequestId) -> Result<(), WorkerError> {
        self.send(Command::Cancel(request))
    }

    /// Releases a worker: its intent becomes Released in the store, then
    /// its task is killed, again every kill retry interval until the
    /// master reports it ended; `on_worker_terminated` says `Killed`.
    pub fn release_worker(&self, id: &WorkerId) -> Result<(), WorkerError> {
        self.send(Command::Release(id.clone()))
    }

    /// Ends the application: every pending request fails with
    /// [`RequestError::Deregistered`], the store is cleared, and the
    /// framework is torn down (the master kills every worker). Waits until
    /// that is done.
    pub async fn deregister(
        &self,
        status: FinalStatus,
        diagnostics: Option<String>,
    ) -> Result<(), WorkerError> {
        let (done, rx) = oneshot::channel();
        self.send(Command::Deregister {
            status,
            diagnostics,
            done,
        })?;
        let _ = rx.await;
        self.wait().await;
        Ok(())
    }

    /// Stops the driver in failover mode: workers keep running (for the
    /// failover timeout) for the next attempt or leader to recover;
    /// pending requests fail with [`RequestError::Stopped`]. Waits until
    /// the driver has stopped.
    pub async fn terminate(&self) {
        let (done, rx) = oneshot::channel();
        if self.send(Command::Terminate { done }).is_ok() {
            let _ = rx.await;
        }
        self.wait().await;
    }

    /// Waits until the driver has ended and returns why.
    pub async fn wait(&self) -> String {
        let mut ended = self.inner.ended.subscribe();
        let _ = ended.wait_for(|e| *e).await;
        let handle = self.inner.lock().thread.take();
        if let Some(handle) = handle {
            let _ = tokio::task::spawn_blocking(move || handle.join()).await;
        }
        self.inner.lock().end.clone().unwrap_or_default()
    }

    /// Why the driver ended, once it has.
    pub fn ended(&self) -> Option<String> {
        self.inner.lock().end.clone()
    }

    /// The framework id, once known.
    pub fn framework_id(&self) -> Option<FrameworkId> {
        self.inner.lock().framework_id.clone()
    }

    /// This driver's attempt number (known once the store is loaded).
    pub fn attempt(&self) -> u64 {
        self.inner.lock().attempt
    }

    fn send(&self, command: Command) -> Result<(), WorkerError> {
        if let Some(end) = self.ended() {
            return Err(WorkerError::Stopped(end));
        }
        self.inner
            .commands
            .send(command)
            .map_err(|_| WorkerError::Stopped("the driver has ended".into()))
    }
}

impl std::fmt::Debug for WorkerDriver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let shared = self.inner.lock();
        f.debug_struct("WorkerDriver")
            .field("framework_id", &shared.framework_id)
            .field("attempt", &shared.attempt)
            .field("end", &shared.end)
            .finish()
    }
}

// === impl WorkerFuture ===

impl WorkerFuture {
    /// The request, for [`WorkerDriver::cancel`].
    pub fn request_id(&self) -> RequestId {
        self.request
    }
}

impl Future for WorkerFuture {
    type Output = Result<WorkerHandle, RequestError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.rx)
            .poll(cx)
            .map(|r| r.unwrap_or(Err(RequestError::Stopped)))
    }
}

impl std::fmt::Debug for WorkerFuture {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkerFuture")
            .field("request", &self.request)
            .finish()
    }
}

// === impl Inner ===

impl Inner {
    fn lock(&self) -> std::sync::MutexGuard<'_, Shared> {
        self.shared.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

// === impl Forward ===

impl Scheduler for Forward {
    fn registered(&mut self, _d: &SchedulerDriver, framework_id: &FrameworkId, _m: &MasterInfo) {
        let _ = self.0.send(Command::Subscribed(Some(framework_id.clone())));
    }
    fn reregistered(&mut self, _d: &SchedulerDriver, _m: &MasterInfo) {
        let _ = self.0.send(Command::Subscribed(None));
    }
    fn disconnected(&mut self, _d: &SchedulerDriver) {
        let _ = self.0.send(Command::Disconnected);
    }
    fn resource_offers(&mut self, _d: &SchedulerDriver, offers: Vec<Offer>) {
        let _ = self.0.send(Command::Offers(offers));
    }
    fn offer_rescinded(&mut self, _d: &SchedulerDriver, _offer_id: &OfferId) {
        // Offers are never held past the round they arrive in.
    }
    fn status_update(&mut self, _d: &SchedulerDriver, status: &TaskStatus) {
        let _ = self.0.send(Command::Status(status.clone()));
    }
    fn agent_lost(&mut self, _d: &SchedulerDriver, agent_id: &AgentId) {
        let _ = self.0.send(Command::AgentLost(agent_id.clone()));
    }
    fn executor_lost(
        &mut self,
        _d: &SchedulerDriver,
        _executor_id: &ExecutorId,
        _agent_id: &AgentId,
        _status: Option<i32>,
    ) {
        // The command executor's exit yields a terminal update for its task.
    }
    fn error(&mut self, _d: &SchedulerDriver, message: &str) {
        let _ = self.0.send(Command::SchedulerError(message.to_string()));
    }
}

// === the driver thread ===

async fn run(
    options: DriverOptions,
    mut store: Box<dyn WorkerStore>,
    handler: Arc<dyn WorkerEventHandler>,
    inner: Arc<Inner>,
    mut rx: mpsc::UnboundedReceiver<Command>,
) -> String {
    let mut core = WorkerCore::new(CoreConfig::from(&options));
    let state = match store.load() {
        Ok(state) => state,
        Err(e) => {
            let error = FatalError::Store(e.to_string());
            handler.on_error(&error);
            fail_queued(&mut rx);
            return error.to_string();
        }
    };
    let mut shell = Shell {
        store,
        handler,
        scheduler: None,
        futures: HashMap::new(),
        requests: HashMap::new(),
        inner: inner.clone(),
    };
    let recovered = core.recover(state, Instant::now());
    {
        let mut shared = inner.lock();
        shared.attempt = core.attempt();
        shared.framework_id = core.framework_id().cloned();
    }
    if let Flow::End(end) = shell.execute(&mut core, recovered) {
        fail_queued(&mut rx);
        return end;
    }
    let mut info = FrameworkInfo::new(options.framework_name.clone());
    info.id = core.framework_id().cloned();
    info.failover_timeout = options.failover_timeout.as_secs_f64();
    info.checkpoint = true;
    if let Some(role) = &options.role {
        info.roles = vec![role.clone()];
    }
    info.hostname = options.hostname.clone();
    info.webui_url = options.webui_url.clone();
    info.principal = options.credential.as_ref().map(|c| c.principal.clone());
    let mut config = DriverConfig::new(options.master.clone());
    config.credential = options.credential.clone();
    config.implicit_acknowledgements = false;
    config.reconnect_backoff_max = options.reconnect_backoff_max;
    let scheduler = SchedulerDriver::new(Forward(inner.commands.clone()), info, config);
    if let Err(e) = scheduler.start() {
        let actions = core.stop(RequestError::Fatal(e.to_string()));
        shell.execute(&mut core, actions);
        fail_queued(&mut rx);
        return format!("cannot start the scheduler driver: {e}");
    }
    shell.scheduler = Some(scheduler);

    let mut tick = tokio::time::interval(options.tick);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let mut actions = Vec::new();
        let mut ending: Option<Ending> = None;
        tokio::select! {
            command = rx.recv() => {
                // `inner` (held by this thread too) keeps a sender alive.
                let Some(command) = command else {
                    return shell.finish(&mut core, None);
                };
                let now = Instant::now();
                ending = shell.on_command(&mut core, command, now, &mut actions);
                for _ in 0..DRAIN {
                    if ending.is_some() {
                        break;
                    }
                    let Ok(command) = rx.try_recv() else { break };
                    ending = shell.on_command(&mut core, command, now, &mut actions);
                }
            }
            _ = tick.tick() => {
                actions.extend(core.on_tick(Instant::now()));
            }
        }
        if ending.is_none() {
            actions.extend(core.flush());
        }
        if let Flow::End(end) = shell.execute(&mut core, actions) {
            fail_queued(&mut rx);
            return end;
        }
        if let Some(ending) = ending {
            let end = shell.finish(&mut core, Some(ending));
            fail_queued(&mut rx);
            return end;
        }
    }
}

/// Why the loop stops.
enum Ending {
    Terminate(Option<oneshot::Sender<()>>),
    Deregister {
        status: FinalStatus,
        diagnostics: Option<String>,
        done: oneshot::Sender<()>,
    },
    SchedulerError(String),
}

/// Fails every request still queued once the driver has ended.
fn fail_queued(rx: &mut mpsc::UnboundedReceiver<Command>) {
    rx.close();
    while let Ok(command) = rx.try_recv() {
        match command {
            Command::Request { reply, .. } => {
                let _ = reply.send(Err(RequestError::Stopped));
            }
            Command::Deregister { done, .. } | Command::Terminate { done } => {
                let _ = done.send(());
            }
            _ => {}
        }
    }
}

// === impl Shell ===

impl Shell {
    /// Feeds one command to the core; returns how the loop must end, if it must.
    fn on_command(
        &mut self,
        core: &mut WorkerCore,
        command: Command,
        now: Instant,
        actions: &mut Vec<Action>,
    ) -> Option<Ending> {
        match command {
            Command::Request {
                request,
                spec,
                reply,
            } => {
                let (id, out) = core.request(spec, now);
                self.requests.insert(request, id.clone());
                self.futures.insert(id, reply);
                actions.extend(out);
            }
            Command::Cancel(request) => {
                if let Some(id) = self.requests.get(&request) {
                    actions.extend(core.cancel(id));
                }
            }
            Command::Release(id) => actions.extend(core.release(&id, now)),
            Command::Offers(offers) => actions.extend(core.on_offers(offers, now)),
            Command::Status(status) => actions.extend(core.on_status(status, now)),
            Command::AgentLost(agent) => actions.extend(core.on_agent_lost(&agent)),
            Command::Subscribed(fid) => {
                actions.extend(core.on_subscribed(fid, now));
                self.inner.lock().framework_id = core.framework_id().cloned();
            }
            Command::Disconnected => actions.extend(core.on_disconnected()),
            Command::Deregister {
                status,
                diagnostics,
                done,
            } => {
                return Some(Ending::Deregister {
                    status,
                    diagnostics,
                    done,
                })
            }
            Command::Terminate { done } => return Some(Ending::Terminate(Some(done))),
            Command::SchedulerError(message) => return Some(Ending::SchedulerError(message)),
        }
        None
    }

    /// Carries out the core's actions in order; consecutive persists are
    /// written as one batch.
    fn execute(&mut self, core: &mut WorkerCore, actions: Vec<Action>) -> Flow {
        let mut batch: Vec<StoreOp> = Vec::new();
        let mut actions = actions.into_iter().peekable();
        while let Some(action) = actions.next() {
            if let Action::Persist(ops) = action {
                batch.extend(ops);
                if matches!(actions.peek(), Some(Action::Persist(_))) {
                    continue;
                }
                if let Err(e) = self.store.apply(&batch) {
                    let error = FatalError::Store(e.to_string());
                    tracing::error!(%error, "the worker store failed; stopping in failover mode");
                    let failed = core.stop(RequestError::Fatal(error.to_string()));
                    self.run_plain(failed);
                    self.handler.on_error(&error);
                    if let Some(s) = &self.scheduler {
                        let _ = s.abort();
                    }
                    return Flow::End(error.to_string());
                }
                batch.clear();
                continue;
            }
            self.run_one(action);
        }
        Flow::Continue
    }

    /// Actions without store writes (failing futures on the way out).
    fn run_plain(&mut self, actions: Vec<Action>) {
        for action in actions {
            if !matches!(action, Action::Persist(_)) {
                self.run_one(action);
            }
        }
    }

    fn run_one(&mut self, action: Action) {
        let scheduler = self.scheduler.as_ref();
        let filters = |d: Duration| Filters {
            refuse_seconds: Some(d.as_secs_f64()),
        };
        match action {
            Action::Persist(_) => {}
            Action::Complete { id, result } => {
                if let Some(reply) = self.futures.remove(&id) {
                    let _ = reply.send(result);
                }
                self.requests.retain(|_, w| *w != id);
            }
            Action::Launch {
                offer_id,
                tasks,
                refuse,
            } => {
                if let Some(s) = scheduler {
                    let _ = s.launch_tasks(&[offer_id], tasks, filters(refuse));
                }
            }
            Action::Decline { offer_ids, refuse } => {
                if let Some(s) = scheduler {
                    for offer_id in offer_ids {
                        let _ = s.decline_offer(&offer_id, filters(refuse));
                    }
                }
            }
            Action::Kill { task_id, .. } => {
                if let Some(s) = scheduler {
                    let _ = s.kill_task(&task_id);
                }
            }
            Action::Reconcile(tasks) => {
                if let Some(s) = scheduler {
                    let _ = s.reconcile_tasks(&tasks);
                }
            }
            Action::Suppress => {
                if let Some(s) = scheduler {
                    let _ = s.suppress_offers();
                }
            }
            Action::Revive => {
                if let Some(s) = scheduler {
                    let _ = s.revive_offers();
                }
            }
            Action::Acknowledge(status) => {
                if let Some(s) = scheduler {
                    let _ = s.acknowledge_status_update(&status);
                }
            }
            Action::Event(event) => match event {
                Event::Recovered(workers) => {
                    self.handler.on_previous_attempt_workers_recovered(workers)
                }
                Event::Running(worker) => self.handler.on_worker_running(&worker),
                Event::Terminated {
                    id,
                    cause,
                    diagnostics,
                } => self.handler.on_worker_terminated(&id, cause, &diagnostics),
                Event::Connection(state) => self.handler.on_connection(state),
            },
        }
    }

    /// Ends the loop as `ending` says and returns why it ended.
    fn finish(&mut self, core: &mut WorkerCore, ending: Option<Ending>) -> String {
        let scheduler = self.scheduler.take();
        match ending {
            None | Some(Ending::Terminate(None)) => {
                let actions = core.stop(RequestError::Stopped);
                self.run_plain(actions);
                stop_scheduler(scheduler, true);
                "terminated (every handle dropped)".into()
            }
            Some(Ending::Terminate(Some(done))) => {
                let actions = core.stop(RequestError::Stopped);
                self.run_plain(actions);
                stop_scheduler(scheduler, true);
                let _ = done.send(());
                "terminated".into()
            }
            Some(Ending::Deregister {
                status,
                diagnostics,
                done,
            }) => {
                tracing::info!(
                    ?status,
                    diagnostics = diagnostics.as_deref().unwrap_or(""),
                    "deregistering the application"
                );
                let actions = core.deregister();
                let flow = self.execute(core, actions);
                stop_scheduler(scheduler, false);
                let _ = done.send(());
                match flow {
                    Flow::End(end) => end,
                    Flow::Continue => format!("deregistered ({status:?})"),
                }
            }
            Some(Ending::SchedulerError(message)) => {
                let error = FatalError::Framework(message);
                let actions = core.stop(RequestError::Fatal(error.to_string()));
                self.run_plain(actions);
                self.handler.on_error(&error);
                error.to_string()
            }
        }
    }
}

/// Stops the scheduler driver (`failover`: keep the tasks) and waits for
/// it, without blocking this thread's runtime for more than its bounded
/// close.
fn stop_scheduler(scheduler: Option<SchedulerDriver>, failover: bool) {
    if let Some(s) = scheduler {
        let _ = s.stop(failover);
        s.join();
    }
}

// === impl CoreConfig ===

impl From<&DriverOptions> for CoreConfig {
    fn from(options: &DriverOptions) -> Self {
        CoreConfig {
            locality_wait: options.locality_wait,
            refuse_unusable: options.refuse_unusable,
            refuse_idle: options.refuse_idle,
            kill_retry: options.kill_retry,
            launch_timeout: options.launch_timeout,
            reconcile_min: options.reconcile_backoff_min,
            reconcile_max: options.reconcile_backoff_max,
            rack_attribute: options.rack_attribute.clone(),
            seed: options.seed,
        }
    }
}
