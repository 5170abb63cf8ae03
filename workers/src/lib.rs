#![warn(missing_docs)]
//! Workers for job runtimes on Agora: what a runtime such as Flink needs
//! from a cluster manager, built on the scheduler SDK so that a runtime
//! writes no offer handling, placement, failover or recovery itself.
//!
//! - [`WorkerDriver`] (Flink's `ResourceManagerDriver`): request a worker
//!   for a [`WorkerSpec`] and get a future of its [`WorkerHandle`];
//!   release it; deregister; terminate. A [`WorkerEventHandler`] hears
//!   recovered workers, terminations (exactly once each, with a
//!   [`TerminationCause`]), connection changes and fatal errors.
//! - [`placement`]: hard constraints and weighted preferences, resolved by
//!   delay scheduling (LOCAL → HOST → RACK → ANY, one locality wait per
//!   level). Offers are never held: each is used or declined in the round
//!   it arrives in; offers are suppressed while nothing is pending.
//! - [`store`]: the write-ahead worker store (New → Launched → Released)
//!   in a local file or in etcd, and recovery after a runtime restart.
//! - [`manager`] (Flink's `ActiveResourceManager`, optional): declared
//!   counts per spec, registration timeout, start-failure rate limit,
//!   replacement of lost workers.
//! - [`election`] (feature `etcd`): the runtime as a leader contender,
//!   with a leader epoch that fences the store.
//! - [`slots`]: a slot pool over registered workers that places a job's
//!   subtasks by the locations of their inputs.
//!
//! The deciding parts (the driver's core, placement, the manager's core,
//! the slot pool) are sans-IO state machines, tested with injected clocks.
//! `docs/workers.md` describes the guarantees and defaults.

mod core;
mod driver;
#[cfg(feature = "etcd")]
pub mod election;
mod events;
pub mod manager;
pub mod placement;
pub mod slots;
mod spec;
pub mod store;

use std::time::Duration;

pub use agora_proto as proto;
pub use driver::{RequestId, WorkerDriver, WorkerFuture};
pub use events::{
    ConnectionState, FatalError, TerminationCause, WorkerEventHandler, WorkerHandle, WorkerId,
};
pub use manager::{ManagerEvent, ManagerOptions, WorkerManager};
pub use placement::{Constraint, Locality, Placement, Preferences};
pub use spec::{
    Artifact, Launch, WorkerSpec, ENV_PORT_PREFIX, ENV_WORKER_AGENT, ENV_WORKER_HOST,
    ENV_WORKER_ID, ENV_WORKER_RACK, SPEC_LABEL,
};
pub use store::{FileStore, MemoryStore, StoreError, WorkerStore};

/// How a [`WorkerDriver`] reaches the master and behaves.
#[derive(Debug, Clone)]
pub struct DriverOptions {
    /// The master, as for the scheduler SDK: `HOST:PORT`, a `ws://` URL,
    /// or (feature `etcd`) `etcd://HOST:PORT/PREFIX`.
    pub master: String,
    /// The framework's name.
    pub framework_name: String,
    /// The role to run in (default `*`).
    pub role: Option<String>,
    /// Host the runtime runs on (informational).
    pub hostname: String,
    /// Principal and secret for a master that authenticates frameworks
    /// (the principal is also the framework's). Default none.
    pub credential: Option<proto::Credential>,
    /// The runtime's web UI, shown by the master. Default none.
    pub webui_url: Option<String>,
    /// How long the master keeps the workers of a disconnected runtime.
    /// Default one week (Flink's and the Mesos HA guide's advice).
    pub failover_timeout: Duration,
    /// Default wait per locality level. Default 3 s (Spark's `spark.locality.wait`).
    pub locality_wait: Duration,
    /// Refuse filter for offers no pending request can use. Default 30 s
    /// (a new request revives offers at once).
    pub refuse_unusable: Duration,
    /// Refuse filter for offers while nothing is pending. Default 60 s.
    pub refuse_idle: Duration,
    /// Interval between kills of a released worker still reported alive. Default 5 s.
    pub kill_retry: Duration,
    /// How long a launched worker may go without any report before it is
    /// reconciled. Default 30 s.
    pub launch_timeout: Duration,
    /// First interval of explicit reconciliation retries. Default 5 s.
    pub reconcile_backoff_min: Duration,
    /// Cap of the doubling reconciliation interval (±20 % jitter). Default 60 s.
    pub reconcile_backoff_max: Duration,
    /// The agent attribute that names its rack. Default `rack`.
    pub rack_attribute: String,
    /// How often the driver checks its timers. Default 100 ms.
    pub tick: Duration,
    /// Cap of the scheduler SDK's reconnect backoff. Default 5 s.
    pub reconnect_backoff_max: Duration,
    /// Seed of the reconciliation jitter.
    pub seed: u64,
}

/// The final status reported when deregistering.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinalStatus {
    /// The application succeeded.
    Succeeded,
    /// It failed.
    Failed,
    /// It was cancelled.
    Canceled,
    /// Unknown.
    Unknown,
}

/// Why a request's future failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    /// [`WorkerDriver::cancel`] withdrew it.
    #[error("the request was cancelled")]
    Cancelled,
    /// The application deregistered.
    #[error("the application deregistered")]
    Deregistered,
    /// The driver stopped (terminated, or its leadership was revoked);
    /// request again from the current driver.
    #[error("the worker driver stopped")]
    Stopped,
    /// The driver stopped on a fatal error.
    #[error("the worker driver failed: {0}")]
    Fatal(String),
}

/// Why a driver call was refused.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    /// The driver has ended (terminated, deregistered, deposed or failed).
    #[error("the worker driver has stopped: {0}")]
    Stopped(String),
    /// The master address is empty.
    #[error("invalid master address {0:?}")]
    InvalidMaster(String),
    /// The driver's thread or runtime could not be created.
    #[error("cannot start the worker driver: {0}")]
    Io(#[from] std::io::Error),
    /// The worker store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

// === impl DriverOptions ===

impl DriverOptions {
    /// Default failover timeout: one week.
    pub const DEFAULT_FAILOVER_TIMEOUT: Duration = Duration::from_secs(7 * 24 * 3600);
    /// Default locality wait per level.
    pub const DEFAULT_LOCALITY_WAIT: Duration = Duration::from_secs(3);

    /// Options for the master at `master` and a framework called `name`,
    /// with the defaults elsewhere.
    pub fn new(master: impl Into<String>, name: impl Into<String>) -> Self {
        DriverOptions {
            master: master.into(),
            framework_name: name.into(),
            role: None,
            hostname: String::new(),
            credential: None,
            webui_url: None,
            failover_timeout: Self::DEFAULT_FAILOVER_TIMEOUT,
            locality_wait: Self::DEFAULT_LOCALITY_WAIT,
            refuse_unusable: Duration::from_secs(30),
            refuse_idle: Duration::from_secs(60),
            kill_retry: Duration::from_secs(5),
            launch_timeout: Duration::from_secs(30),
            reconcile_backoff_min: Duration::from_secs(5),
            reconcile_backoff_max: Duration::from_secs(60),
            rack_attribute: "rack".into(),
            tick: Duration::from_millis(100),
            reconnect_backoff_max: Duration::from_secs(5),
            seed: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(0),
        }
    }
}
