#![warn(missing_docs)]
//! Agora's executor SDK: what an executor links against to talk to the
//! agent that forked it, plus the built-in command executor.
//!
//! An executor implements [`Executor`] (callbacks for registration, task
//! launches and kills, messages and shutdown) and hands it to an
//! [`ExecutorDriver`], which owns the connection to the agent at
//! `AGORA_AGENT_ENDPOINT` (see [`proto::env`]):
//!
//! - it subscribes with its framework and executor ids and the agent's
//!   token, listing every status update and task the agent has not
//!   acknowledged yet;
//! - [`ExecutorDriver::send_status_update`] keeps each update until the
//!   agent answers `ACKNOWLEDGED`, and re-sends the unacknowledged ones, in
//!   order, after a reconnect: the oldest in the next `SUBSCRIBE`, as many
//!   as fit in half a frame, the rest as `UPDATE` calls after it (an update
//!   larger than [`MAX_STATUS_UPDATE_BYTES`] is refused);
//! - when the connection drops it reconnects with backoff (until
//!   [`ExecutorConfig::recovery_timeout`]) if the framework checkpoints,
//!   and aborts otherwise;
//! - [`ExecutorDriver::stop`] (and a `SHUTDOWN` from the agent) waits,
//!   bounded by the shutdown grace period, until every update sent has been
//!   acknowledged.
//!
//! Like the scheduler SDK, the driver runs its network loop on a tokio
//! runtime of its own thread and the executor's callbacks, one at a time,
//! on a callback thread; driver methods only queue work and return.
//!
//! [`command::run`] is the built-in command executor that runs a task's
//! [`CommandInfo`] (the `agora-command-executor` binary).

pub mod command;
mod config;
mod driver;
// Its types are public only to the simulation (feature `sim`).
#[cfg(feature = "sim")]
#[allow(missing_docs)]
pub mod sim;
mod spawn;
#[cfg_attr(feature = "sim", allow(missing_docs))]
mod state;

pub use agora_proto as proto;
pub use agora_proto::{
    AgentId, Bytes, CommandInfo, ExecutorId, ExecutorInfo, FrameworkId, FrameworkInfo, Reason,
    Source, TaskId, TaskInfo, TaskState, TaskStatus,
};
pub use config::ExecutorConfig;
pub use driver::ExecutorDriver;
pub use state::MAX_STATUS_UPDATE_BYTES;

/// Where the agent placed a task apart from its executor (see
/// [`Executor::launch_task_in`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Placement {
    /// A sandbox made for this task alone, to run it in.
    pub sandbox: Option<std::path::PathBuf>,
    /// Files the task's process writes `0` into before it runs anything,
    /// so that it is born in the container the agent made for this task
    /// alone (cgroup v1 `tasks` files or a cgroup v2 `cgroup.procs`).
    /// Empty when the task runs in its executor's container.
    pub cgroups: Vec<std::path::PathBuf>,
    /// A name that container keeps while the agent renames it from one
    /// task to the next: the files of `cgroups` can be kept open under
    /// it. `None` for a container that is never reused.
    pub container: Option<String>,
}

/// An executor: the callbacks the [`ExecutorDriver`] makes.
///
/// Callbacks run one at a time on the driver's callback thread, never on
/// the network task: a slow callback delays later callbacks, not the
/// connection (acknowledgements keep being processed). All methods have
/// empty default bodies.
///
/// # Example
///
/// An executor that "runs" each task by reporting it running and then
/// finished:
///
/// ```no_run
/// use agora_executor::{Executor, ExecutorDriver, Source, TaskInfo, TaskState, TaskStatus};
///
/// struct Instant;
///
/// impl Executor for Instant {
///     fn launch_task(&mut self, driver: &ExecutorDriver, task: TaskInfo) {
///         for state in [TaskState::Running, TaskState::Finished] {
///             let status = TaskStatus::new(task.task_id.clone(), state, Source::SourceExecutor);
///             // The driver fills in uuid, timestamp, executor and agent ids
///             // and re-sends the update until the agent acknowledges it.
///             driver.send_status_update(status).expect("driver running");
///         }
///     }
///
///     fn shutdown(&mut self, _driver: &ExecutorDriver) {
///         // Nothing to kill: every task already finished.
///     }
/// }
///
/// // Reads AGORA_AGENT_ENDPOINT, AGORA_FRAMEWORK_ID, ... set by the agent.
/// let driver = ExecutorDriver::from_env(Instant).expect("started by an agent");
/// let status = driver.run().expect("driver starts");
/// std::process::exit(if status == agora_executor::DriverStatus::Stopped { 0 } else { 1 });
/// ```
#[allow(unused_variables)]
pub trait Executor: Send + 'static {
    /// The driver subscribed with the agent for the first time.
    fn registered(
        &mut self,
        driver: &ExecutorDriver,
        executor: &ExecutorInfo,
        framework: &FrameworkInfo,
        agent_id: &AgentId,
    ) {
    }

    /// The driver subscribed again after a lost connection (e.g. the agent
    /// restarted and recovered this executor).
    fn reregistered(&mut self, driver: &ExecutorDriver, agent_id: &AgentId) {}

    /// The connection to the agent dropped. With checkpointing the driver
    /// is reconnecting; without, it aborts right after this.
    fn disconnected(&mut self, driver: &ExecutorDriver) {}

    /// Run a task. Report its progress with
    /// [`ExecutorDriver::send_status_update`]; every task must end with a
    /// terminal update.
    fn launch_task(&mut self, driver: &ExecutorDriver, task: TaskInfo) {}

    /// Run a task, given where the agent placed it when it placed it
    /// apart from its executor (the built-in command executor, which runs
    /// many command tasks, gets a sandbox per task, and under
    /// `--isolation cgroups` a container per task). The default ignores
    /// the placement and calls [`Executor::launch_task`].
    fn launch_task_in(&mut self, driver: &ExecutorDriver, task: TaskInfo, placement: &Placement) {
        let _ = placement;
        self.launch_task(driver, task)
    }

    /// Kill a task; send `TASK_KILLED` once it is gone.
    fn kill_task(&mut self, driver: &ExecutorDriver, task_id: &TaskId) {}

    /// Bytes from the scheduler. Best effort.
    fn framework_message(&mut self, driver: &ExecutorDriver, data: &[u8]) {}

    /// The agent acknowledged the update `uuid` of `task_id`: it is
    /// checkpointed (when the framework checkpoints) and the agent now
    /// delivers it to the scheduler reliably, so the driver no longer keeps
    /// it. Informational; not called for acknowledgements that arrive while
    /// the driver is stopping.
    fn status_update_acknowledged(
        &mut self,
        driver: &ExecutorDriver,
        task_id: &TaskId,
        uuid: &str,
    ) {
    }

    /// Kill all tasks and send their terminal updates; the driver stops
    /// after this returns and pending updates are acknowledged (bounded by
    /// the shutdown grace period, after which the agent kills the process
    /// group).
    fn shutdown(&mut self, driver: &ExecutorDriver) {}

    /// An unrecoverable error (refused subscription, lost agent). The
    /// driver has already aborted when this is called.
    fn error(&mut self, driver: &ExecutorDriver, message: &str) {}
}

/// Where a driver is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DriverStatus {
    /// Created, `start` not called yet.
    NotStarted,
    /// Started and neither stopped nor aborted.
    Running,
    /// Aborted: by [`ExecutorDriver::abort`], a fatal error or a lost agent.
    Aborted,
    /// Stopped by [`ExecutorDriver::stop`] or an agent's `SHUTDOWN`.
    Stopped,
}

/// What went wrong in the executor SDK.
#[derive(Debug, thiserror::Error)]
pub enum ExecutorError {
    /// A variable the agent sets for every executor is missing.
    #[error("environment variable {0} is not set; executors are started by an Agora agent, which sets it")]
    MissingEnv(&'static str),
    /// A variable the agent sets has a value the SDK cannot use.
    #[error("environment variable {name} has invalid value {value:?}: {reason}")]
    InvalidEnv {
        /// The variable.
        name: &'static str,
        /// Its value.
        value: String,
        /// What is wrong with it.
        reason: String,
    },
    /// [`ExecutorConfig::agent_endpoint`] is not a `ws://` or `wss://` URL.
    #[error("invalid agent endpoint {0:?}: expected ws://HOST:PORT/PATH or wss://HOST:PORT/PATH")]
    InvalidEndpoint(String),
    /// TLS to a `wss://` agent cannot be set up (see
    /// [`ExecutorConfig::tls`]).
    #[error("TLS to the agent: {0}")]
    Tls(String),
    /// A status update the driver refuses to send.
    #[error("invalid status update: {0}")]
    InvalidUpdate(String),
    /// A status update too large for any frame to carry: most of it is
    /// `data`; send bulk data another way (a file in the sandbox).
    #[error("status update for task {task_id} is {size} bytes encoded; the limit is {max}: keep large data out of TaskStatus.data (write it to a file in the sandbox)")]
    UpdateTooLarge {
        /// The task.
        task_id: TaskId,
        /// The update's size, encoded as JSON.
        size: usize,
        /// [`MAX_STATUS_UPDATE_BYTES`].
        max: usize,
    },
    /// The driver is not running (not started yet, stopped or aborted).
    #[error("the driver is not running (status {0:?})")]
    NotRunning(DriverStatus),
    /// `start` (or `run`) was called on a driver that was already started.
    #[error("the driver was already started")]
    AlreadyStarted,
    /// The driver's threads or runtime could not be created.
    #[error("could not start the driver: {0}")]
    Io(#[from] std::io::Error),
}
