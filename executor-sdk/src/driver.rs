//! [`ExecutorDriver`]: the handle users hold, the callback thread that
//! runs their [`Executor`], and the network loop that carries out what the
//! sans-IO [`DriverCore`] decides.
//!
//! Threads: `start` spawns one thread that owns a current-thread tokio
//! runtime running the network loop, and one callback thread. Driver
//! methods push a [`Command`] into an unbounded channel read by the network
//! loop and return at once; the loop pushes [`Callback`]s into a channel read
//! by the callback thread. Neither side waits for the other, so calling the
//! driver from a callback cannot deadlock.

use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, PoisonError};
use std::thread::{self, ThreadId};
use std::time::Duration;

use agora_proto::{AgentId, TaskState, TaskStatus, MAX_FRAME_BYTES};
use futures::{SinkExt, StreamExt};
use tokio::net::TcpStream;
use tokio::sync::mpsc::{self, UnboundedReceiver, UnboundedSender};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};
use tracing::Instrument;

use crate::state::{check_update_size, Action, Callback, Command, DriverCore, Outcome};
use crate::{DriverStatus, Executor, ExecutorConfig, ExecutorError};

/// Longest wait for the TCP and WebSocket handshake with the agent.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest wait for one frame to be written.
const SEND_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest wait for the close handshake when the driver ends.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(1);
/// How often the core's clock rules (flush bound) are checked.
const TICK: Duration = Duration::from_millis(100);
/// Most queued commands handled (and their frames written) in one go.
const COMMAND_BATCH: usize = 256;

/// Handle to an executor driver: the executor's connection to its agent.
///
/// Cheap to clone; every clone is the same driver. Methods never block on
/// the network: they queue work and return, so they may be called from any
/// thread, from async code and from inside [`Executor`] callbacks. Calls
/// fail with [`ExecutorError::NotRunning`] unless the driver is running.
#[derive(Clone)]
pub struct ExecutorDriver {
    inner: Arc<Inner>,
}

struct Inner {
    config: ExecutorConfig,
    /// The executor until `start` takes it.
    pending: Mutex<Option<Box<dyn Executor>>>,
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
    agent_id: Option<AgentId>,
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
    /// TLS to a `wss://` agent.
    tls: Option<Arc<agora_net::tls::rustls::ClientConfig>>,
}

/// Marks the network loop or the callback thread as finished when
/// dropped, including by a panic.
struct DoneGuard {
    inner: Arc<Inner>,
    io: bool,
}

// === impl ExecutorDriver ===

impl ExecutorDriver {
    /// A driver that will run `executor`'s callbacks. Nothing happens
    /// until [`ExecutorDriver::start`].
    pub fn new(executor: impl Executor, config: ExecutorConfig) -> Self {
        let (done, _) = watch::channel(false);
        ExecutorDriver {
            inner: Arc::new(Inner {
                shared: Mutex::new(Shared {
                    status: DriverStatus::NotStarted,
                    halted: false,
                    io_done: false,
                    callbacks_done: false,
                    agent_id: config.agent_id.clone(),
                    callback_thread: None,
                }),
                config,
                pending: Mutex::new(Some(Box::new(executor))),
                changed: Condvar::new(),
                done,
                commands: OnceLock::new(),
            }),
        }
    }

    /// [`ExecutorDriver::new`] with [`ExecutorConfig::from_env`].
    pub fn from_env(executor: impl Executor) -> Result<Self, ExecutorError> {
        Ok(Self::new(executor, ExecutorConfig::from_env()?))
    }

    /// Starts connecting to the agent and returns at once. Fails with
    /// [`ExecutorError::InvalidEndpoint`] when the endpoint is not a
    /// `ws://` URL and with [`ExecutorError::AlreadyStarted`] on a second
    /// call.
    pub fn start(&self) -> Result<(), ExecutorError> {
        let url = self.inner.config.agent_endpoint.trim().to_string();
        if !valid_endpoint(&url) {
            return Err(ExecutorError::InvalidEndpoint(url));
        }
        let tls = if url.starts_with("wss://") {
            match self.inner.config.tls.client() {
                Ok(Some(tls)) => Some(tls),
                Ok(None) => {
                    return Err(ExecutorError::Tls(format!(
                        "{url} needs TLS: {} is not set",
                        agora_proto::env::TLS_CA
                    )))
                }
                Err(e) => return Err(ExecutorError::Tls(e.to_string())),
            }
        } else {
            None
        };
        let mut shared = self.inner.lock();
        if shared.status != DriverStatus::NotStarted {
            return Err(ExecutorError::AlreadyStarted);
        }
        let executor = lock(&self.inner.pending)
            .take()
            .ok_or(ExecutorError::AlreadyStarted)?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .thread_name("agora-executor-driver")
            .build()?;
        let (command_tx, command_rx) = mpsc::unbounded_channel();
        let (callback_tx, callback_rx) = std::sync::mpsc::channel();
        let core = DriverCore::new(self.inner.config.clone(), Instant::now());
        // `start` runs once (status checked above), so the cell is empty.
        let _ = self.inner.commands.set(command_tx);

        let driver = self.clone();
        let callback_thread = thread::Builder::new()
            .name("agora-executor-callbacks".into())
            .spawn(move || callback_loop(driver, executor, callback_rx))?;
        shared.callback_thread = Some(callback_thread.thread().id());

        let io = Io {
            inner: self.inner.clone(),
            callbacks: callback_tx,
            tls,
        };
        let span = tracing::info_span!(
            "executor_driver",
            framework_id = %self.inner.config.framework_id,
            executor_id = %self.inner.config.executor_id,
        );
        let spawned = thread::Builder::new()
            .name("agora-executor-io".into())
            .spawn(move || {
                let _guard = DoneGuard {
                    inner: io.inner.clone(),
                    io: true,
                };
                runtime.block_on(io.run(core, url, command_rx).instrument(span));
            });
        if let Err(error) = spawned {
            shared.status = DriverStatus::Aborted;
            shared.io_done = true;
            return Err(error.into());
        }
        shared.status = DriverStatus::Running;
        Ok(())
    }

    /// Stops the driver: waits (bounded by the shutdown grace period)
    /// until every update sent has been acknowledged, then disconnects. No
    /// callbacks are made after this returns. Returns
    /// [`DriverStatus::Stopped`]; [`ExecutorDriver::join`] returns once the
    /// flush is over.
    ///
    /// Updates are not given up because the agent is away: stopped while
    /// disconnected (the agent restarting), or disconnected during the
    /// flush, the driver goes on reconnecting, bounded by
    /// [`ExecutorConfig::recovery_timeout`], re-subscribes with the
    /// unacknowledged updates and then waits up to the grace period for
    /// their acknowledgements. Without checkpointing a lost connection
    /// ends the flush, as it ends a running driver. What is left
    /// unacknowledged when the driver gives up is logged.
    pub fn stop(&self) -> Result<DriverStatus, ExecutorError> {
        self.halt(DriverStatus::Stopped, Command::Stop)
    }

    /// Aborts the driver: disconnects at once (unacknowledged updates stay
    /// with the agent's own bookkeeping) and makes no more callbacks.
    pub fn abort(&self) -> Result<DriverStatus, ExecutorError> {
        self.halt(DriverStatus::Aborted, Command::Abort)
    }

    /// Blocks until the driver has stopped or aborted and its threads are
    /// done, and says which. Returns [`DriverStatus::NotStarted`] at once
    /// for a driver never started. Called from a callback it waits for the
    /// network loop only.
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

    /// [`ExecutorDriver::join`] for async callers: waits without blocking
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

    /// [`ExecutorDriver::start`], then [`ExecutorDriver::join`].
    pub fn run(&self) -> Result<DriverStatus, ExecutorError> {
        self.start()?;
        Ok(self.join())
    }

    /// The driver's current status.
    pub fn status(&self) -> DriverStatus {
        self.inner.lock().status
    }

    /// The agent's id: the configured one, or the one the agent sent when
    /// the driver subscribed.
    pub fn agent_id(&self) -> Option<AgentId> {
        self.inner.lock().agent_id.clone()
    }

    /// The configuration the driver was created with.
    pub fn config(&self) -> &ExecutorConfig {
        &self.inner.config
    }

    /// Sends a status update reliably. Fills in uuid (if absent),
    /// timestamp (if unset), `source = SOURCE_EXECUTOR`, executor id and
    /// agent id, and keeps the update until the agent acknowledges it
    /// (re-sending it after a reconnect). Updates of one task are delivered
    /// in the order they are sent. `TASK_STAGING` is refused: that state
    /// belongs to the master. So is an update larger than
    /// [`crate::MAX_STATUS_UPDATE_BYTES`] once encoded
    /// ([`ExecutorError::UpdateTooLarge`]): no frame could carry it.
    pub fn send_status_update(&self, status: TaskStatus) -> Result<(), ExecutorError> {
        if let Err(size) = check_update_size(&status) {
            return Err(ExecutorError::UpdateTooLarge {
                task_id: status.task_id,
                size,
                max: crate::MAX_STATUS_UPDATE_BYTES,
            });
        }
        if status.state == TaskState::Staging {
            return Err(ExecutorError::InvalidUpdate(format!(
                "task {}: executors cannot send TASK_STAGING",
                status.task_id
            )));
        }
        if let Err(error) = status.task_id.validate() {
            return Err(ExecutorError::InvalidUpdate(format!(
                "task id {:?}: {error}",
                status.task_id.as_str()
            )));
        }
        self.enqueue(Command::Update(status))
    }

    /// Sends bytes to the scheduler. Best effort: dropped while
    /// disconnected, not retransmitted.
    pub fn send_framework_message(&self, data: Vec<u8>) -> Result<(), ExecutorError> {
        self.enqueue(Command::Message(data))
    }

    fn enqueue(&self, command: Command) -> Result<(), ExecutorError> {
        let status = self.status();
        if status != DriverStatus::Running {
            return Err(ExecutorError::NotRunning(status));
        }
        self.inner.send(command);
        Ok(())
    }

    fn halt(&self, to: DriverStatus, command: Command) -> Result<DriverStatus, ExecutorError> {
        {
            let mut shared = self.inner.lock();
            if shared.status != DriverStatus::Running {
                return Err(ExecutorError::NotRunning(shared.status));
            }
            shared.status = to;
            shared.halted = true;
        }
        self.inner.send(command);
        Ok(to)
    }
}

impl std::fmt::Debug for ExecutorDriver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let shared = self.inner.lock();
        f.debug_struct("ExecutorDriver")
            .field("agent_endpoint", &self.inner.config.agent_endpoint)
            .field("executor_id", &self.inner.config.executor_id)
            .field("status", &shared.status)
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
                "an executor driver thread panicked; aborting the driver"
            );
            self.inner.send(Command::Abort);
        }
        self.inner.update(|shared| {
            if panicked && shared.status == DriverStatus::Running {
                shared.status = DriverStatus::Aborted;
            }
            if self.io {
                shared.io_done = true;
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
        url: String,
        mut commands: UnboundedReceiver<Command>,
    ) {
        tracing::debug!(%url, "executor driver started");
        let outcome = 'driver: loop {
            if let Flow::Finish(outcome) =
                self.apply(core.before_connect(Instant::now()), None).await
            {
                break 'driver outcome;
            }
            let connecting = connect(&url, self.tls.clone());
            tokio::pin!(connecting);
            let ws = loop {
                tokio::select! {
                    result = &mut connecting => match result {
                        Ok(ws) => break Some(ws),
                        Err(error) => {
                            tracing::warn!(%url, %error, "cannot connect to the agent");
                            break None;
                        }
                    },
                    command = commands.recv() => {
                        let actions = core.on_command(command.unwrap_or(Command::Abort), Instant::now());
                        if let Flow::Finish(outcome) = self.apply(actions, None).await {
                            break 'driver outcome;
                        }
                    }
                }
            };
            if let Some(ws) = ws {
                if let Flow::Finish(outcome) = self.serve(&mut core, ws, &mut commands).await {
                    break 'driver outcome;
                }
            }
            let actions = core.on_disconnected(Instant::now());
            if let Flow::Finish(outcome) = self.apply(actions, None).await {
                break 'driver outcome;
            }
            let delay = core.next_backoff(agora_discovery::random_sample());
            tracing::debug!(?delay, "reconnecting to the agent after a delay");
            let sleep = tokio::time::sleep(delay);
            tokio::pin!(sleep);
            loop {
                tokio::select! {
                    _ = &mut sleep => break,
                    command = commands.recv() => {
                        let actions = core.on_command(command.unwrap_or(Command::Abort), Instant::now());
                        if let Flow::Finish(outcome) = self.apply(actions, None).await {
                            break 'driver outcome;
                        }
                    }
                }
            }
        };
        tracing::info!(?outcome, "executor driver ended");
    }

    /// Runs one connection until it drops or the driver ends.
    async fn serve(
        &self,
        core: &mut DriverCore,
        ws: Ws,
        commands: &mut UnboundedReceiver<Command>,
    ) -> Flow {
        let (mut sink, mut stream) = ws.split();
        tracing::info!("connected to the agent; subscribing");
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
                        tracing::warn!("ignoring a binary frame from the agent");
                        Vec::new()
                    }
                    Some(Ok(Message::Close(frame))) => {
                        tracing::info!(?frame, "the agent closed the connection");
                        flow = Flow::Reconnect;
                        break;
                    }
                    Some(Ok(_)) => Vec::new(),
                    Some(Err(error)) => {
                        tracing::warn!(%error, "connection to the agent failed");
                        flow = Flow::Reconnect;
                        break;
                    }
                    None => {
                        tracing::info!("connection to the agent ended");
                        flow = Flow::Reconnect;
                        break;
                    }
                },
                command = commands.recv() => {
                    let now = Instant::now();
                    let mut actions = core.on_command(command.unwrap_or(Command::Abort), now);
                    // Take what else is queued, so a burst of updates goes
                    // out in one write.
                    for _ in 0..COMMAND_BATCH {
                        match commands.try_recv() {
                            Ok(command) => actions.extend(core.on_command(command, now)),
                            Err(_) => break,
                        }
                    }
                    actions
                }
                _ = tick.tick() => core.on_tick(Instant::now()),
            };
            flow = self.apply(actions, Some(&mut sink)).await;
        }
        let close = match flow {
            Flow::Finish(_) => CLOSE_TIMEOUT,
            _ => Duration::from_millis(100),
        };
        let _ = tokio::time::timeout(close, sink.close()).await;
        flow
    }

    /// Carries out the core's actions in order. Frames are queued on the
    /// sink and flushed once at the end, so a batch of calls costs one
    /// write.
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
                            tracing::warn!(%error, "cannot write to the agent");
                            flow = Flow::Reconnect;
                        }
                        Err(_) => {
                            tracing::warn!(timeout = ?SEND_TIMEOUT, "writing to the agent timed out");
                            flow = Flow::Reconnect;
                        }
                    }
                }
                Action::Callback(callback) => {
                    if let Callback::Registered { agent_id, .. }
                    | Callback::Reregistered(agent_id) = &callback
                    {
                        tracing::info!(agent_id = %agent_id, "subscribed");
                        let agent_id = agent_id.clone();
                        self.inner.update(|shared| shared.agent_id = Some(agent_id));
                    }
                    // Fails only if the callback thread is gone (it
                    // panicked), which has aborted the driver.
                    let _ = self.callbacks.send(callback);
                }
                Action::Reconnect(reason) => {
                    tracing::warn!(%reason, "dropping the connection to the agent");
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
                        tracing::warn!(%error, "cannot write to the agent");
                        if matches!(flow, Flow::Continue) {
                            flow = Flow::Reconnect;
                        }
                    }
                    Err(_) => {
                        tracing::warn!(timeout = ?SEND_TIMEOUT, "writing to the agent timed out");
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

/// `ws://` or `wss://` followed by something.
fn valid_endpoint(url: &str) -> bool {
    url.strip_prefix("ws://")
        .or_else(|| url.strip_prefix("wss://"))
        .is_some_and(|rest| !rest.is_empty() && !rest.chars().any(char::is_whitespace))
}

/// Opens the WebSocket with Agora's frame limits (over TLS with `tls`
/// for a `wss://` URL).
async fn connect(
    url: &str,
    tls: Option<std::sync::Arc<agora_net::tls::rustls::ClientConfig>>,
) -> Result<Ws, String> {
    let config = WebSocketConfig::default()
        .max_message_size(Some(MAX_FRAME_BYTES))
        .max_frame_size(Some(MAX_FRAME_BYTES));
    let connector = tls.map(tokio_tungstenite::Connector::Rustls);
    match tokio::time::timeout(
        CONNECT_TIMEOUT,
        tokio_tungstenite::connect_async_tls_with_config(url, Some(config), true, connector),
    )
    .await
    {
        Ok(Ok((ws, _response))) => Ok(ws),
        Ok(Err(error)) => Err(error.to_string()),
        Err(_) => Err(format!("no answer within {CONNECT_TIMEOUT:?}")),
    }
}

/// Runs the executor's callbacks, one at a time, until the network loop
/// ends.
fn callback_loop(
    driver: ExecutorDriver,
    mut executor: Box<dyn Executor>,
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
                executor: info,
                framework,
                agent_id,
            } => executor.registered(d, &info, &framework, &agent_id),
            Callback::Reregistered(agent_id) => executor.reregistered(d, &agent_id),
            Callback::Disconnected => executor.disconnected(d),
            Callback::LaunchTask { task, placement } => {
                executor.launch_task_in(d, task, &placement)
            }
            Callback::KillTask(task_id) => executor.kill_task(d, &task_id),
            Callback::FrameworkMessage(data) => executor.framework_message(d, &data),
            Callback::Acknowledged { task_id, uuid } => {
                executor.status_update_acknowledged(d, &task_id, &uuid)
            }
            Callback::Shutdown => {
                tracing::info!("the agent asked the executor to shut down");
                executor.shutdown(d);
                // The executor may have stopped the driver itself.
                let _ = driver.stop();
            }
            Callback::Error(message) => {
                tracing::error!(%message, "executor driver aborted");
                executor.error(d, &message);
            }
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::valid_endpoint;

    #[test]
    fn endpoints() {
        assert!(valid_endpoint("ws://127.0.0.1:5051/api/executor"));
        assert!(!valid_endpoint("ws://"));
        assert!(!valid_endpoint("http://x:1"));
        assert!(!valid_endpoint("ws://a b"));
    }
}
