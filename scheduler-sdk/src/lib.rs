#![warn(missing_docs)]
//! Agora's scheduler SDK: what a framework links against to talk to the
//! master.
//!
//! A framework implements [`Scheduler`] (callbacks for registration, offers,
//! status updates, failures) and hands it to a [`SchedulerDriver`], which
//! owns the connection to the master at `ws://MASTER/api/scheduler`:
//!
//! - it subscribes, remembers the framework id it is given and re-subscribes
//!   with it after every reconnect (exponential backoff between
//!   [`DriverConfig::reconnect_backoff_min`] and
//!   [`DriverConfig::reconnect_backoff_max`]);
//! - it treats a master that sends no heartbeat for three heartbeat
//!   intervals as gone, and reconnects;
//! - calls made while disconnected are queued and sent once subscribed
//!   again, except launches and declines on offers: those offers are void,
//!   so a dropped launch yields a driver-generated `TASK_DROPPED` update for
//!   each of its tasks;
//! - with implicit acknowledgements (the default) each reliable status
//!   update is acknowledged when [`Scheduler::status_update`] returns;
//! - each status update reaches [`Scheduler::status_update`] once: a copy
//!   of an update already delivered (same task, same uuid) is not
//!   delivered again, nor is the master's word (a reconciliation answer,
//!   `TASK_LOST`) about a task launched through this driver whose own
//!   terminal update was delivered. The driver remembers this for its
//!   latest [`DriverConfig::remembered_tasks`] tasks, across reconnections
//!   and master failovers; a new scheduler process starts afresh, and may
//!   see again what its predecessor was delivered (Mesos's at-least-once).
//!
//! The driver runs its network loop on a tokio runtime of its own (on its
//! own thread) and the scheduler's callbacks on a second thread, one at a
//! time. Driver methods only queue work and return, so they may be called
//! from any thread, from async code, and from inside callbacks.
//!
//! The sans-IO core of the driver (connection and subscription state,
//! queued calls, acknowledgements) lives in a private module and is unit
//! tested without sockets.

mod delivered;
mod driver;
mod endpoint;
// Its types are public only to the simulation (feature `sim`).
#[cfg(feature = "sim")]
#[allow(missing_docs)]
pub mod sim;
#[cfg_attr(feature = "sim", allow(missing_docs))]
mod state;

use std::time::Duration;

pub use agora_proto as proto;
pub use agora_proto::scheduler::{ReconcileTask, ResourceRequest};
pub use agora_proto::{
    AgentId, Bytes, CommandInfo, ExecutorId, ExecutorInfo, Filters, FrameworkId, FrameworkInfo,
    MasterInfo, Offer, OfferId, Reason, Resources, Source, TaskId, TaskInfo, TaskState, TaskStatus,
};
pub use driver::SchedulerDriver;

/// A framework's scheduler: the callbacks the [`SchedulerDriver`] makes.
///
/// Callbacks run one at a time on the driver's callback thread, never on
/// the network task: a slow callback delays later callbacks, not the
/// connection (heartbeats and acknowledgements keep flowing). All methods
/// have empty default bodies. Every callback gets the driver, so it can
/// launch tasks, acknowledge updates or stop the driver from inside.
///
/// # Example
///
/// A scheduler that runs one `echo` task on the first offer that fits and
/// stops once the task is done:
///
/// ```no_run
/// use agora_scheduler::proto::{CommandInfo, Filters, Resources, TaskInfo, TaskStatus};
/// use agora_scheduler::{DriverConfig, FrameworkInfo, Offer, Scheduler, SchedulerDriver, TaskId};
///
/// struct Hello {
///     launched: bool,
/// }
///
/// impl Scheduler for Hello {
///     fn resource_offers(&mut self, driver: &SchedulerDriver, offers: Vec<Offer>) {
///         let needed = Resources::parse("cpus:0.1;mem:32").unwrap();
///         for offer in offers {
///             if self.launched || !offer.resources.contains(&needed) {
///                 let _ = driver.decline_offer(&offer.id, Filters::default());
///                 continue;
///             }
///             let task = TaskInfo {
///                 allocation_role: None,
///                 launch_stamp: None,
///                 name: "hello".into(),
///                 task_id: TaskId::new("hello-1"),
///                 agent_id: offer.agent_id.clone(),
///                 resources: needed.clone(),
///                 executor: None,
///                 command: Some(CommandInfo {
///                     value: "echo hello".into(),
///                     ..CommandInfo::default()
///                 }),
///                 data: None,
///                 kill_grace_period: None,
///                 labels: Default::default(),
///                 task_group: None,
///                 container: None,
///             };
///             let _ = driver.launch_tasks(&[offer.id.clone()], vec![task], Filters::default());
///             self.launched = true;
///         }
///     }
///
///     fn status_update(&mut self, driver: &SchedulerDriver, status: &TaskStatus) {
///         println!("{} is {}", status.task_id, status.state);
///         if status.state.is_terminal() {
///             // Returning acknowledges the update; stop(false) tears the
///             // framework down once it has been sent.
///             let _ = driver.stop(false);
///         }
///     }
///
///     fn error(&mut self, _driver: &SchedulerDriver, message: &str) {
///         eprintln!("driver aborted: {message}");
///     }
/// }
///
/// let driver = SchedulerDriver::new(
///     Hello { launched: false },
///     FrameworkInfo::new("hello"),
///     DriverConfig::new("127.0.0.1:5050"),
/// );
/// let status = driver.run().expect("valid master address");
/// println!("driver ended: {status:?}");
/// ```
#[allow(unused_variables)]
pub trait Scheduler: Send + 'static {
    /// The framework subscribed for the first time through this driver
    /// (with a new id, or — when [`FrameworkInfo::id`] was set — taking
    /// over an existing framework).
    fn registered(
        &mut self,
        driver: &SchedulerDriver,
        framework_id: &FrameworkId,
        master: &MasterInfo,
    ) {
    }

    /// The driver re-subscribed after a lost connection (possibly to a
    /// restarted master). Offers made before the disconnection are void.
    fn reregistered(&mut self, driver: &SchedulerDriver, master: &MasterInfo) {}

    /// The connection to the master dropped; the driver is reconnecting.
    /// Outstanding offers are void from now on.
    fn disconnected(&mut self, driver: &SchedulerDriver) {}

    /// New offers. Each stays valid until it is used, declined, rescinded
    /// or the driver disconnects.
    fn resource_offers(&mut self, driver: &SchedulerDriver, offers: Vec<Offer>) {}

    /// An offer was withdrawn; launching on it now yields `TASK_DROPPED`.
    fn offer_rescinded(&mut self, driver: &SchedulerDriver, offer_id: &OfferId) {}

    /// A task changed state. With implicit acknowledgements (the default),
    /// returning from this callback acknowledges the update; if the driver
    /// is stopped or aborted during the callback it is not acknowledged and
    /// the master re-sends it later. In explicit mode call
    /// [`SchedulerDriver::acknowledge_status_update`]. Updates without a
    /// uuid (master- or driver-generated) need no acknowledgement.
    ///
    /// Each update comes once per driver: a re-sent copy (same task and
    /// uuid) is not delivered again, and once the terminal update of a
    /// task launched through this driver has been delivered (its own, with
    /// a uuid), nothing without a uuid about it is (reconciliation answers,
    /// reason `REASON_RECONCILIATION`, included) until the task id is
    /// launched again. See [`DriverConfig::remembered_tasks`] for how far
    /// back the driver remembers, and `docs/sdk.md` for the details.
    fn status_update(&mut self, driver: &SchedulerDriver, status: &TaskStatus) {}

    /// Bytes from an executor. Best effort: do not expect a message to be
    /// retransmitted.
    fn framework_message(
        &mut self,
        driver: &SchedulerDriver,
        executor_id: &ExecutorId,
        agent_id: &AgentId,
        data: &[u8],
    ) {
    }

    /// An agent was removed; its tasks are lost (their `TASK_LOST` updates
    /// arrive separately).
    fn agent_lost(&mut self, driver: &SchedulerDriver, agent_id: &AgentId) {}

    /// An executor exited; `status` is its wait status when known.
    fn executor_lost(
        &mut self,
        driver: &SchedulerDriver,
        executor_id: &ExecutorId,
        agent_id: &AgentId,
        status: Option<i32>,
    ) {
    }

    /// An unrecoverable error (e.g. the master refused or removed the
    /// framework). The driver has already aborted when this is called.
    fn error(&mut self, driver: &SchedulerDriver, message: &str) {}
}

/// How a [`SchedulerDriver`] reaches the master and behaves.
#[derive(Debug, Clone)]
pub struct DriverConfig {
    /// The master: `HOST:PORT` (the driver connects to
    /// `ws://HOST:PORT/api/scheduler`), or a full `ws://` URL (used as is;
    /// `/api/scheduler` is appended when it has no path). With the `etcd`
    /// feature also `etcd://HOST:PORT/PREFIX`: the driver reads the
    /// leading master from etcd before each connection attempt and, while
    /// connected, leaves a master that stopped leading, so it follows
    /// leader changes (re-subscribing as after any reconnect).
    pub master: String,
    /// Acknowledge each reliable status update when
    /// [`Scheduler::status_update`] returns. Default `true`.
    pub implicit_acknowledgements: bool,
    /// First delay before reconnecting after a lost connection. Default 100 ms.
    pub reconnect_backoff_min: Duration,
    /// Cap of the doubling reconnect delay. Default 5 s.
    pub reconnect_backoff_max: Duration,
    /// Principal and secret sent as `Authorization: Basic` when
    /// connecting, for a master with `--authenticate-frameworks`. A
    /// master that refuses them answers 401; the driver logs it and tries
    /// again after its backoff. Default none.
    pub credential: Option<agora_proto::Credential>,
    /// TLS to the master (`wss://`), trusting the CA this configuration
    /// holds (and presenting its client certificate, if any): see
    /// `agora_net::TlsOptions::client`. Default none: plaintext `ws://`.
    pub tls: Option<std::sync::Arc<rustls::ClientConfig>>,
    /// How many tasks the driver remembers what it delivered of (the
    /// latest uuids of each, and whether it ended), so that it delivers
    /// each update once: beyond it, the task remembered longest ago (since
    /// its launch, its first update or its end) is forgotten, and a late
    /// copy of one of its updates, or the master's answer about it, would
    /// be delivered. About 200 bytes a task.
    /// Default [`DriverConfig::DEFAULT_REMEMBERED_TASKS`].
    pub remembered_tasks: usize,
}

/// Where a driver is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DriverStatus {
    /// Created, `start` not called yet.
    NotStarted,
    /// Started and neither stopped nor aborted.
    Running,
    /// Aborted: by [`SchedulerDriver::abort`] or a fatal error.
    Aborted,
    /// Stopped by [`SchedulerDriver::stop`].
    Stopped,
}

/// Why a driver call was refused.
#[derive(Debug, thiserror::Error)]
pub enum DriverError {
    /// The driver is not running (not started yet, stopped or aborted).
    #[error("the driver is not running (status {0:?})")]
    NotRunning(DriverStatus),
    /// `start` (or `run`) was called on a driver that was already started.
    #[error("the driver was already started")]
    AlreadyStarted,
    /// The master address is neither `HOST:PORT` nor a `ws://` URL.
    #[error("invalid master address {0:?}: expected HOST:PORT, ws://HOST:PORT[/PATH] or (feature etcd) etcd://HOST:PORT/PREFIX")]
    InvalidMaster(String),
    /// The driver's threads or runtime could not be created.
    #[error("could not start the driver: {0}")]
    Io(#[from] std::io::Error),
}

// === impl DriverConfig ===

impl DriverConfig {
    /// Default reconnect backoff floor.
    pub const DEFAULT_RECONNECT_BACKOFF_MIN: Duration = Duration::from_millis(100);
    /// Default reconnect backoff cap.
    pub const DEFAULT_RECONNECT_BACKOFF_MAX: Duration = Duration::from_secs(5);
    /// Default of [`DriverConfig::remembered_tasks`]: ten times the
    /// completed tasks a master remembers by default.
    pub const DEFAULT_REMEMBERED_TASKS: usize = 10_000;

    /// A configuration for the master at `master` (`HOST:PORT` or a
    /// `ws://` URL) with the defaults elsewhere.
    pub fn new(master: impl Into<String>) -> Self {
        DriverConfig {
            master: master.into(),
            implicit_acknowledgements: true,
            reconnect_backoff_min: Self::DEFAULT_RECONNECT_BACKOFF_MIN,
            reconnect_backoff_max: Self::DEFAULT_RECONNECT_BACKOFF_MAX,
            credential: None,
            tls: None,
            remembered_tasks: Self::DEFAULT_REMEMBERED_TASKS,
        }
    }
}
