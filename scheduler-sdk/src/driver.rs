//! [`SchedulerDriver`]: the handle users hold, the callback thread that
//! runs their [`Scheduler`], and the network loop that carries out what
//! the sans-IO [`DriverCore`] decides.
//!
//! Threads: `start` spawns one thread that owns a current-thread tokio
//! runtime running the network loop, and one callback thread. Driver
//! methods push a [`Command`] into an unbounded channel read by the network
//! loop and return at once; the loop pushes [`Callback`]s into a channel read
//! by the callback thread. Neither side ever waits for the other, which is
//! why calling the driver from a callback cannot deadlock.

use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, PoisonError};
use std::thread::{self, ThreadId};
use std::time::Duration;

use agora_proto::scheduler::{Call, ReconcileTask, ResourceRequest};
use agora_proto::{
    AgentId, ExecutorId, Filters, FrameworkId, FrameworkInfo, OfferId, TaskId, TaskInfo,
    TaskStatus, MAX_FRAME_BYTES,
};
use futures::{SinkExt, StreamExt};
use tokio::net::TcpStream;
use tokio::sync::mpsc::{self, UnboundedReceiver, UnboundedSender};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};
use tracing::Instrument;

use crate::endpoint::{Endpoint, LeaderChanged};
use crate::state::{Action, Callback, Command, DriverCore, Outcome};
use crate::{DriverConfig, DriverError, DriverStatus, Scheduler};

/// Longest wait for the TCP and WebSocket handshake with the master.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest wait for one frame to be written (this bounds `stop(false)`'s
/// wait for `TEARDOWN`).
const SEND_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest wait for the close handshake when the driver ends.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(1);
/// How often the core's clock rules (heartbeat timeout) are checked.
const TICK: Duration = Duration::from_millis(500);
/// Most queued commands folded into one write after the one that woke the
/// network loop.
const COMMAND_BATCH: usize = 256;

/// Handle to a scheduler driver: the framework's connection to the master.
///
/// Cheap to clone; every clone is the same driver. Methods never block on
/// the network: they queue a call and return, so they may be called from
/// any thread, from async code and from inside [`Scheduler`] callbacks.
/// Calls fail with [`DriverError::NotRunning`] unless the driver is
/// running. Dropping the handles does not stop a started driver; call
/// [`SchedulerDriver::stop`] or [`SchedulerDriver::abort`].
#[derive(Clone)]
pub struct SchedulerDriver {
    inner: Arc<Inner>,
}

struct Inner {
    config: DriverConfig,
    /// The scheduler and framework until `start` takes them.
    pending: Mutex<Option<(Box<dyn Scheduler>, FrameworkInfo)>>,
    shared: Mutex<Shared>,
    changed: Condvar,
    done: watch::Sender<bool>,
    commands: OnceLock<UnboundedSender<Command>>,
}

struct Shared {
    status: DriverStatus,
    /// The user stopped or aborted the driver: deliver no more callbacks.
    halted: bool,
    io_done: bool,
    callbacks_done: bool,
    framework_id: Option<FrameworkId>,
    callback_thread: Option<ThreadId>,
}

/// What the network loop does after carrying out some actions.
enum Flow {
    Continue,
    Reconnect,
    Finish(Outcome),
}

type Ws = WebSocketStream<MaybeTlsStream<TcpStream>>;
type WsSink = futures::stream::SplitSink<Ws, Message>;

/// The network loop's context.
struct Io {
    inner: Arc<Inner>,
    callbacks: std::sync::mpsc::Sender<Callback>,
}

/// Marks the network loop or the callback thread as finished when
/// dropped, including by a panic.
struct DoneGuard {
    inner: Arc<Inner>,
    io: bool,
}

// === impl SchedulerDriver ===

impl SchedulerDriver {
    /// A driver for `framework` that will run `scheduler`'s callbacks. Set
    /// `framework.id` to fail over to (take over) an existing framework.
    /// Nothing happens until [`SchedulerDriver::start`].
    pub fn new(scheduler: impl Scheduler, framework: FrameworkInfo, config: DriverConfig) -> Self {
        let (done, _) = watch::channel(false);
        SchedulerDriver {
            inner: Arc::new(Inner {
                config,
                shared: Mutex::new(Shared {
                    status: DriverStatus::NotStarted,
                    halted: false,
                    io_done: false,
                    callbacks_done: false,
                    framework_id: framework.id.clone(),
                    callback_thread: None,
                }),
                pending: Mutex::new(Some((Box::new(scheduler), framework))),
                changed: Condvar::new(),
                done,
                commands: OnceLock::new(),
            }),
        }
    }

    /// Starts connecting to the master and returns at once.
    ///
    /// Fails with [`DriverError::InvalidMaster`] when
    /// [`DriverConfig::master`] is not `HOST:PORT` or a `ws://` URL, and
    /// with [`DriverError::AlreadyStarted`] on a second call.
    pub fn start(&self) -> Result<(), DriverError> {
        let url = Endpoint::parse(&self.inner.config.master)
            .ok_or_else(|| DriverError::InvalidMaster(self.inner.config.master.clone()))?;
        let mut shared = self.inner.lock();
        if shared.status != DriverStatus::NotStarted {
            return Err(DriverError::AlreadyStarted);
        }
        let (scheduler, framework) = lock(&self.inner.pending)
            .take()
            .ok_or(DriverError::AlreadyStarted)?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .thread_name("agora-scheduler-driver")
            .build()?;
        let (command_tx, command_rx) = mpsc::unbounded_channel();
        let (callback_tx, callback_rx) = std::sync::mpsc::channel();
        let core = DriverCore::new(framework.clone(), &self.inner.config);
        // `start` runs once (status checked above), so the cell is empty.
        let _ = self.inner.commands.set(command_tx);

        let driver = self.clone();
        let callback_thread = thread::Builder::new()
            .name("agora-scheduler-callbacks".into())
            .spawn(move || callback_loop(driver, scheduler, callback_rx))?;
        shared.callback_thread = Some(callback_thread.thread().id());

        let io = Io {
            inner: self.inner.clone(),
            callbacks: callback_tx,
        };
        let span = tracing::info_span!("scheduler_driver", framework = %framework.name, framework_id = framework.id.as_ref().map(tracing::field::display));
        let spawned = thread::Builder::new()
            .name("agora-scheduler-io".into())
            .spawn(move || {
                let _guard = DoneGuard {
                    inner: io.inner.clone(),
                    io: true,
                };
                runtime.block_on(io.run(core, url, command_rx).instrument(span));
            });
        if let Err(error) = spawned {
            // The callback thread ends when its channel closes (the
            // sender went down with the closure).
            shared.status = DriverStatus::Aborted;
            shared.io_done = true;
            return Err(error.into());
        }
        shared.status = DriverStatus::Running;
        Ok(())
    }

    /// Stops the driver. `failover = false` sends `TEARDOWN` first (the
    /// master kills the framework's tasks and forgets it); the network
    /// loop waits at most 5 s for it to be written. `failover = true` just
    /// disconnects: the tasks keep running for
    /// [`FrameworkInfo::failover_timeout`] so another scheduler can take
    /// over with the same framework id. No callbacks are made after this
    /// returns (one already running completes). Returns
    /// [`DriverStatus::Stopped`]; [`SchedulerDriver::join`] returns once the
    /// connection is closed.
    pub fn stop(&self, failover: bool) -> Result<DriverStatus, DriverError> {
        self.halt(DriverStatus::Stopped, Command::Stop { failover })
    }

    /// Aborts the driver: closes the connection without tearing the
    /// framework down and makes no more callbacks. [`SchedulerDriver::join`]
    /// then returns [`DriverStatus::Aborted`].
    pub fn abort(&self) -> Result<DriverStatus, DriverError> {
        self.halt(DriverStatus::Aborted, Command::Abort)
    }

    /// Blocks until the driver has stopped or aborted and its threads are
    /// done, and says which. Returns [`DriverStatus::NotStarted`] at once
    /// for a driver never started. Called from a callback it waits for the
    /// network loop only (a callback cannot wait for itself).
    pub fn join(&self) -> DriverStatus {
        let mut shared = self.inner.lock();
        if shared.status == DriverStatus::NotStarted {
            return shared.status;
        }
        let on_callback_thread = shared.callback_thread == Some(thread::current().id());
        while !(shared.io_done && (shared.callbacks_done || on_callback_thread)) {
            shared = self
                .inner
                .changed
                .wait(shared)
                .unwrap_or_else(PoisonError::into_inner);
        }
        shared.status
    }

    /// [`SchedulerDriver::join`] for async callers: waits without blocking
    /// the caller's runtime.
    pub async fn join_async(&self) -> DriverStatus {
        if self.status() == DriverStatus::NotStarted {
            return DriverStatus::NotStarted;
        }
        let mut done = self.inner.done.subscribe();
        // The sender lives in `inner`, which `self` keeps alive.
        let _ = done.wait_for(|done| *done).await;
        self.status()
    }

    /// [`SchedulerDriver::start`], then [`SchedulerDriver::join`].
    pub fn run(&self) -> Result<DriverStatus, DriverError> {
        self.start()?;
        Ok(self.join())
    }

    /// The driver's current status.
    pub fn status(&self) -> DriverStatus {
        self.inner.lock().status
    }

    /// The framework's id: the configured one, or the one the master
    /// assigned once subscribed.
    pub fn framework_id(&self) -> Option<FrameworkId> {
        self.inner.lock().framework_id.clone()
    }

    /// Launches `tasks` on `offer_ids` (offers of one agent). Resources
    /// left unused are declined with `filters`. When the driver is not
    /// subscribed the offers are void: nothing is sent, and each task gets
    /// a `TASK_DROPPED` update (reason `REASON_INVALID_OFFERS`, message
    /// "driver disconnected").
    pub fn launch_tasks(
        &self,
        offer_ids: &[OfferId],
        tasks: Vec<TaskInfo>,
        filters: Filters,
    ) -> Result<(), DriverError> {
        self.enqueue(Command::Launch {
            offer_ids: offer_ids.to_vec(),
            tasks,
            filters,
        })
    }

    /// Declines an offer; its agent's resources are not offered to this
    /// framework again for `filters.refuse_seconds` (default 5 s). Dropped
    /// when disconnected (the offer is void anyway).
    pub fn decline_offer(&self, offer_id: &OfferId, filters: Filters) -> Result<(), DriverError> {
        self.enqueue(Command::Decline {
            offer_ids: vec![offer_id.clone()],
            filters,
        })
    }

    /// Asks the master to kill a task; a `TASK_KILLED` (or, for a task the
    /// master does not know, `TASK_LOST`) update follows.
    pub fn kill_task(&self, task_id: &TaskId) -> Result<(), DriverError> {
        self.call(Call::Kill {
            task_id: task_id.clone(),
            agent_id: None,
        })
    }

    /// Clears the framework's offer filters and resumes offers after
    /// [`SchedulerDriver::suppress_offers`].
    pub fn revive_offers(&self) -> Result<(), DriverError> {
        self.call(Call::Revive { roles: Vec::new() })
    }

    /// Stops offers to the framework until [`SchedulerDriver::revive_offers`].
    pub fn suppress_offers(&self) -> Result<(), DriverError> {
        self.call(Call::Suppress { roles: Vec::new() })
    }

    /// Asks for the latest state of tasks, answered with status updates
    /// (reason `REASON_RECONCILIATION`). Empty = implicit reconciliation of
    /// all the framework's tasks.
    pub fn reconcile_tasks(&self, tasks: &[(TaskId, Option<AgentId>)]) -> Result<(), DriverError> {
        self.call(Call::Reconcile {
            tasks: tasks
                .iter()
                .map(|(task_id, agent_id)| ReconcileTask {
                    task_id: task_id.clone(),
                    agent_id: agent_id.clone(),
                })
                .collect(),
        })
    }

    /// Sends bytes to an executor. Best effort: not retransmitted.
    pub fn send_framework_message(
        &self,
        executor_id: &ExecutorId,
        agent_id: &AgentId,
        data: Vec<u8>,
    ) -> Result<(), DriverError> {
        self.call(Call::Message {
            agent_id: agent_id.clone(),
            executor_id: executor_id.clone(),
            data: data.into(),
        })
    }

    /// Tells the allocator what resources the framework wants.
    pub fn request_resources(&self, requests: Vec<ResourceRequest>) -> Result<(), DriverError> {
        self.call(Call::Request { requests })
    }

    /// Acknowledges a status update. Only meaningful with
    /// [`DriverConfig::implicit_acknowledgements`] off (in implicit mode
    /// the driver already acknowledges, and this is ignored). A no-op
    /// (`Ok`) for updates without uuid, which need no acknowledgement.
    pub fn acknowledge_status_update(&self, status: &TaskStatus) -> Result<(), DriverError> {
        if status.uuid.is_none() {
            return Ok(());
        }
        self.enqueue(Command::Acknowledge {
            status: status.clone(),
            implicit: false,
        })
    }

    fn call(&self, call: Call) -> Result<(), DriverError> {
        self.enqueue(Command::Call(call))
    }

    fn enqueue(&self, command: Command) -> Result<(), DriverError> {
        let status = self.status();
        if status != DriverStatus::Running {
            return Err(DriverError::NotRunning(status));
        }
        self.inner.send(command);
        Ok(())
    }

    fn halt(&self, to: DriverStatus, command: Command) -> Result<DriverStatus, DriverError> {
        {
            let mut shared = self.inner.lock();
            if shared.status != DriverStatus::Running {
                return Err(DriverError::NotRunning(shared.status));
            }
            shared.status = to;
            shared.halted = true;
        }
        self.inner.send(command);
        Ok(to)
    }
}

impl std::fmt::Debug for SchedulerDriver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let shared = self.inner.lock();
        f.debug_struct("SchedulerDriver")
            .field("master", &self.inner.config.master)
            .field("status", &shared.status)
            .field("framework_id", &shared.framework_id)
            .finish()
    }
}

// === impl Inner ===

impl Inner {
    fn lock(&self) -> MutexGuard<'_, Shared> {
        lock(&self.shared)
    }

    fn send(&self, command: Command) {
        if let Some(commands) = self.commands.get() {
            // Fails only once the network loop has ended, when the command
            // has nothing left to act on.
            let _ = commands.send(command);
        }
    }

    fn update(&self, f: impl FnOnce(&mut Shared)) {
        let mut shared = self.lock();
        f(&mut shared);
        if shared.io_done && shared.callbacks_done {
            self.done.send_replace(true);
        }
        self.changed.notify_all();
    }
}

// === impl DoneGuard ===

impl Drop for DoneGuard {
    fn drop(&mut self) {
        let panicked = thread::panicking();
        if panicked {
            tracing::error!(
                io = self.io,
                "a scheduler driver thread panicked; aborting the driver"
            );
            self.inner.send(Command::Abort);
        }
        self.inner.update(|shared| {
            if panicked && shared.status == DriverStatus::Running {
                shared.status = DriverStatus::Aborted;
            }
            if self.io {
                shared.io_done = true;
                // A driver that failed before starting its loop properly
                // must still report an end.
                if shared.status == DriverStatus::Running {
                    shared.status = DriverStatus::Aborted;
                }
            } else {
                shared.callbacks_done = true;
            }
        });
    }
}

// === impl Io ===

impl Io {
    async fn run(
        self,
        mut core: DriverCore,
        endpoint: Endpoint,
        mut commands: UnboundedReceiver<Command>,
    ) {
        tracing::debug!(%endpoint, "scheduler driver started");
        // The master last lost or not reached, so detection can wait for
        // a different leader.
        let mut previous: Option<String> = None;
        let outcome = 'driver: loop {
            let connecting = async {
                let (url, leader_changed) = endpoint.resolve(previous.as_deref()).await?;
                previous = Some(url.clone());
                let authorization = self
                    .inner
                    .config
                    .credential
                    .as_ref()
                    .map(agora_proto::Credential::authorization);
                let tls = self.inner.config.tls.clone();
                let ws = connect(&url, authorization.as_deref(), tls)
                    .await
                    .map_err(|e| {
                        if let ConnectError::Answered(_) = e {
                            // Alive but not serving yet (a new leader loading
                            // its registry): try it again after the backoff
                            // instead of waiting for another leader.
                            previous = None;
                        }
                        format!("{url}: {e}")
                    })?;
                Ok::<_, String>((ws, leader_changed))
            };
            tokio::pin!(connecting);
            let ws = loop {
                tokio::select! {
                    result = &mut connecting => match result {
                        Ok(ws) => break Some(ws),
                        Err(error) => {
                            tracing::warn!(%endpoint, %error, "cannot connect to the master");
                            break None;
                        }
                    },
                    command = commands.recv() => {
                        let actions = core.on_command(command.unwrap_or(Command::Abort));
                        if let Flow::Finish(outcome) = self.apply(actions, None).await {
                            break 'driver outcome;
                        }
                    }
                }
            };
            if let Some((ws, leader_changed)) = ws {
                if let Flow::Finish(outcome) = self
                    .serve(&mut core, ws, &mut commands, leader_changed)
                    .await
                {
                    break 'driver outcome;
                }
                self.apply(core.on_disconnected(), None).await;
            }
            let delay = core.next_backoff(agora_discovery::random_sample());
            tracing::debug!(?delay, "reconnecting to the master after a delay");
            let sleep = tokio::time::sleep(delay);
            tokio::pin!(sleep);
            loop {
                tokio::select! {
                    _ = &mut sleep => break,
                    command = commands.recv() => {
                        let actions = core.on_command(command.unwrap_or(Command::Abort));
                        if let Flow::Finish(outcome) = self.apply(actions, None).await {
                            break 'driver outcome;
                        }
                    }
                }
            }
        };
        tracing::info!(?outcome, "scheduler driver ended");
    }

    /// Runs one connection until it drops or the driver ends.
    async fn serve(
        &self,
        core: &mut DriverCore,
        ws: Ws,
        commands: &mut UnboundedReceiver<Command>,
        mut leader_changed: LeaderChanged,
    ) -> Flow {
        let (mut sink, mut stream) = ws.split();
        tracing::info!("connected to the master; subscribing");
        let mut flow = self
            .apply(core.on_connected(Instant::now()), Some(&mut sink))
            .await;
        let mut tick = tokio::time::interval(TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        while matches!(flow, Flow::Continue) {
            let actions = tokio::select! {
                frame = stream.next() => match frame {
                    Some(Ok(Message::Text(text))) => core.on_frame(text.as_str(), Instant::now()),
                    Some(Ok(Message::Binary(_))) => {
                        tracing::warn!("ignoring a binary frame from the master");
                        Vec::new()
                    }
                    Some(Ok(Message::Close(frame))) => {
                        tracing::info!(?frame, "the master closed the connection");
                        flow = Flow::Reconnect;
                        break;
                    }
                    Some(Ok(_)) => Vec::new(),
                    Some(Err(error)) => {
                        tracing::warn!(%error, "connection to the master failed");
                        flow = Flow::Reconnect;
                        break;
                    }
                    None => {
                        tracing::info!("connection to the master ended");
                        flow = Flow::Reconnect;
                        break;
                    }
                },
                command = commands.recv() => {
                    let mut actions = core.on_command(command.unwrap_or(Command::Abort));
                    // Commands that queued meanwhile (acknowledgements,
                    // mostly) go out in the same write.
                    for _ in 0..COMMAND_BATCH {
                        if actions.iter().any(|a| matches!(a, Action::Reconnect(_) | Action::Finish(_))) {
                            break;
                        }
                        let Ok(command) = commands.try_recv() else { break };
                        actions.extend(core.on_command(command));
                    }
                    actions
                }
                _ = tick.tick() => core.on_tick(Instant::now()),
                _ = &mut leader_changed => {
                    tracing::info!("this master no longer leads; reconnecting to the new leader");
                    flow = Flow::Reconnect;
                    break;
                }
            };
            flow = self.apply(actions, Some(&mut sink)).await;
        }
        match flow {
            Flow::Finish(_) => {
                let _ = tokio::time::timeout(CLOSE_TIMEOUT, sink.close()).await;
            }
            _ => {
                // Drop the connection without waiting for a peer that may
                // be gone.
                let _ = tokio::time::timeout(Duration::from_millis(100), sink.close()).await;
            }
        }
        flow
    }

    /// Carries out the core's actions in order.
    async fn apply(&self, actions: Vec<Action>, mut sink: Option<&mut WsSink>) -> Flow {
        let mut flow = Flow::Continue;
        let mut unflushed = false;
        for action in actions {
            match action {
                Action::Send(call) => {
                    let Some(sink) = sink.as_deref_mut() else {
                        tracing::debug!("no connection to send a call on");
                        continue;
                    };
                    if matches!(flow, Flow::Reconnect) {
                        continue;
                    }
                    let frame = Message::text(agora_proto::encode(&call));
                    match tokio::time::timeout(SEND_TIMEOUT, sink.feed(frame)).await {
                        Ok(Ok(())) => unflushed = true,
                        Ok(Err(error)) => {
                            tracing::warn!(%error, "cannot write to the master");
                            flow = Flow::Reconnect;
                        }
                        Err(_) => {
                            tracing::warn!(timeout = ?SEND_TIMEOUT, "writing to the master timed out");
                            flow = Flow::Reconnect;
                        }
                    }
                }
                Action::Callback(callback) => {
                    // Fails only if the callback thread is gone (it
                    // panicked), which has aborted the driver.
                    let _ = self.callbacks.send(callback);
                }
                Action::FrameworkId(id) => {
                    tracing::Span::current().record("framework_id", tracing::field::display(&id));
                    tracing::info!(framework_id = %id, "subscribed");
                    self.inner.update(|shared| shared.framework_id = Some(id));
                }
                Action::Reconnect(reason) => {
                    tracing::warn!(%reason, "dropping the connection to the master");
                    flow = Flow::Reconnect;
                }
                Action::Finish(outcome) => {
                    self.inner.update(|shared| {
                        if shared.status == DriverStatus::Running {
                            shared.status = match outcome {
                                Outcome::Stopped => DriverStatus::Stopped,
                                Outcome::Aborted => DriverStatus::Aborted,
                            };
                        }
                    });
                    flow = Flow::Finish(outcome);
                }
            }
        }
        if unflushed && !matches!(flow, Flow::Reconnect) {
            if let Some(sink) = sink {
                match tokio::time::timeout(SEND_TIMEOUT, sink.flush()).await {
                    Ok(Ok(())) => {}
                    Ok(Err(error)) => {
                        tracing::warn!(%error, "cannot write to the master");
                        if matches!(flow, Flow::Continue) {
                            flow = Flow::Reconnect;
                        }
                    }
                    Err(_) => {
                        tracing::warn!(timeout = ?SEND_TIMEOUT, "writing to the master timed out");
                        if matches!(flow, Flow::Continue) {
                            flow = Flow::Reconnect;
                        }
                    }
                }
            }
        }
        flow
    }
}

/// Opens the WebSocket with Agora's frame limits.
/// Why a connection attempt failed.
#[derive(Debug)]
enum ConnectError {
    /// The master answered the upgrade with an HTTP status: it is alive
    /// but does not serve schedulers (yet).
    Answered(String),
    /// No connection, or no answer in time.
    Unreachable(String),
}

impl std::fmt::Display for ConnectError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ConnectError::Answered(text) | ConnectError::Unreachable(text) => f.write_str(text),
        }
    }
}

async fn connect(
    url: &str,
    authorization: Option<&str>,
    tls: Option<std::sync::Arc<rustls::ClientConfig>>,
) -> Result<Ws, ConnectError> {
    use tokio_tungstenite::tungstenite::client::IntoClientRequest as _;
    let config = WebSocketConfig::default()
        .max_message_size(Some(MAX_FRAME_BYTES))
        .max_frame_size(Some(MAX_FRAME_BYTES));
    // With TLS the same endpoint is reached as wss://.
    let url = match (&tls, url.strip_prefix("ws://")) {
        (Some(_), Some(rest)) => format!("wss://{rest}"),
        _ => url.to_string(),
    };
    let connector = tls.map(tokio_tungstenite::Connector::Rustls);
    let mut request = url
        .as_str()
        .into_client_request()
        .map_err(|e| ConnectError::Unreachable(e.to_string()))?;
    if let Some(value) = authorization {
        let value = value.parse().map_err(|_| {
            ConnectError::Unreachable("the credential is not a valid header".into())
        })?;
        request.headers_mut().insert("authorization", value);
    }
    match tokio::time::timeout(
        CONNECT_TIMEOUT,
        tokio_tungstenite::connect_async_tls_with_config(request, Some(config), true, connector),
    )
    .await
    {
        Ok(Ok((ws, _response))) => Ok(ws),
        Ok(Err(error @ tokio_tungstenite::tungstenite::Error::Http(_))) => {
            Err(ConnectError::Answered(error.to_string()))
        }
        Ok(Err(error)) => Err(ConnectError::Unreachable(error.to_string())),
        Err(_) => Err(ConnectError::Unreachable(format!(
            "no answer within {CONNECT_TIMEOUT:?}"
        ))),
    }
}

/// Runs the scheduler's callbacks, one at a time, until the network loop
/// ends.
fn callback_loop(
    driver: SchedulerDriver,
    mut scheduler: Box<dyn Scheduler>,
    callbacks: std::sync::mpsc::Receiver<Callback>,
) {
    let _guard = DoneGuard {
        inner: driver.inner.clone(),
        io: false,
    };
    for callback in callbacks {
        if driver.inner.lock().halted {
            continue;
        }
        let d = &driver;
        match callback {
            Callback::Registered {
                framework_id,
                master,
            } => scheduler.registered(d, &framework_id, &master),
            Callback::Reregistered { master } => scheduler.reregistered(d, &master),
            Callback::Disconnected => scheduler.disconnected(d),
            Callback::ResourceOffers(offers) => scheduler.resource_offers(d, offers),
            Callback::OfferRescinded(offer_id) => scheduler.offer_rescinded(d, &offer_id),
            Callback::StatusUpdate(status) => {
                scheduler.status_update(d, &status);
                if status.uuid.is_some() {
                    // The core drops this in explicit mode, and after a
                    // stop or abort made during the callback.
                    driver.inner.send(Command::Acknowledge {
                        status,
                        implicit: true,
                    });
                }
            }
            Callback::FrameworkMessage {
                executor_id,
                agent_id,
                data,
            } => scheduler.framework_message(d, &executor_id, &agent_id, &data),
            Callback::AgentLost(agent_id) => scheduler.agent_lost(d, &agent_id),
            Callback::ExecutorLost {
                executor_id,
                agent_id,
                status,
            } => scheduler.executor_lost(d, &executor_id, &agent_id, status),
            Callback::Error(message) => {
                tracing::error!(%message, "scheduler driver aborted");
                scheduler.error(d, &message);
            }
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}
