//! The Agora agent: runs on every machine of the cluster, registers its
//! resources with the master, forks the executors that run tasks, and
//! delivers their tasks' status updates to the master reliably.
//!
//! [`run`] serves one port: the executor WebSocket (`/api/executor`) and
//! HTTP `/health`, `/state` and `/version`. It keeps a connection to the
//! master's `/api/agent`, re-registering after every drop. All state lives
//! in the core, a sans-IO state machine (inputs and the time in, actions
//! out) split by domain noun; one task, the shell, feeds it and carries out
//! its actions, with processes spawned, signalled and reaped on a thread of
//! their own and checkpoints written on another. The status update streams
//! are a sans-IO state machine in [`status_updates`]; frameworks that set
//! `checkpoint` have their executors, tasks and updates checkpointed under
//! `WORK_DIR/meta` so a restarted agent recovers them (see
//! [`RecoverMode`]). `/state` and `/metrics` are served from a snapshot the
//! shell publishes, never built on the core per request.
//!
//! ```no_run
//! # async fn demo() -> Result<(), agora_agent::AgentError> {
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:5051").await?;
//! let config = agora_agent::Config::new("127.0.0.1:5050", "/var/lib/agora".into());
//! agora_agent::run(listener, config, async { let _ = tokio::signal::ctrl_c().await; }).await
//! # }
//! ```

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

mod checkpoint;
mod config;
mod core;
mod fetch;
pub mod files;
mod http;
mod identity;
pub mod isolation;
pub mod launcher;
mod master_link;
pub mod paths;
mod processes;
mod shell;
#[cfg(feature = "sim")]
pub mod sim;
pub mod status_updates;
mod sys;
pub mod users;
mod wal;

pub use agora_proto::{parse_duration, DurationError};
pub use config::{
    Config, RecoverMode, DEFAULT_COMMAND_EXECUTOR_TASKS, DEFAULT_CORE_QUEUE,
    DEFAULT_EXECUTOR_HEARTBEAT_INTERVAL, DEFAULT_EXECUTOR_OUTBOX, DEFAULT_MASTER_OUTBOX,
};
pub use isolation::{CgroupsConfig, Isolation};
pub use users::UserPolicy;

/// Why the agent could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// The configuration is unusable.
    #[error("invalid configuration: {0}")]
    InvalidConfig(String),
    /// The work dir cannot be created or used.
    #[error("work dir {path}: {source}; check that it exists and is writable")]
    WorkDir {
        /// The work dir.
        path: std::path::PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// A socket or thread could not be set up.
    #[error("I/O error: {0}")]
    Io(#[from] std::io::Error),
    /// `--isolation cgroups` cannot be used on this machine.
    #[error(transparent)]
    Isolation(#[from] isolation::CgroupsError),
    /// The master refused this agent with a fatal error.
    #[error("the master refused this agent: {0}")]
    Refused(String),
}

/// What every connection task shares: the configuration, the agent's
/// addresses and the connection id counter.
#[derive(Clone)]
pub(crate) struct Shared {
    pub(crate) config: Arc<Config>,
    /// The address the agent listens on.
    pub(crate) listen: SocketAddr,
    /// `ws://host:port/api/executor`, given to executors.
    pub(crate) executor_endpoint: String,
    next_conn: Arc<AtomicU64>,
    /// Counters for `/metrics` that the core bumps.
    pub(crate) counters: Arc<Counters>,
    /// Signs and checks executor tokens.
    pub(crate) identity: Arc<identity::ExecutorIdentity>,
    /// TLS to the master (`--tls-ca`, with `--tls-cert` as the client
    /// certificate), or plaintext.
    pub(crate) client_tls: Option<Arc<agora_net::tls::rustls::ClientConfig>>,
    /// Under `--isolation cgroups`, whether the agent can hand a task's
    /// container to the user the task runs as (cgroup v1: its `tasks`
    /// files; v2 would need the cgroup above every container).
    pub(crate) delegates_cgroups: bool,
}

/// Status update deliveries the core counts for `/metrics`.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    /// Unacknowledged updates sent to the master again when their retry
    /// interval ran out.
    pub(crate) updates_retried_timeout: AtomicU64,
    /// Heads of unacknowledged streams sent to the master when the agent
    /// (re-)registered.
    pub(crate) updates_resent_registered: AtomicU64,
}

impl Counters {
    pub(crate) fn retried_on_timeout(&self) {
        self.updates_retried_timeout.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn resent_on_registration(&self) {
        self.updates_resent_registered
            .fetch_add(1, Ordering::Relaxed);
    }
}

impl Shared {
    pub(crate) fn next_conn_id(&self) -> u64 {
        self.next_conn.fetch_add(1, Ordering::Relaxed)
    }
}

/// Runs an agent on `listener` until `shutdown` completes (or the master
/// refuses the agent). On shutdown, executors of frameworks that
/// checkpoint keep running so a restarted agent can recover them (with
/// [`RecoverMode::Reconnect`]); all others are killed.
pub async fn run(
    listener: tokio::net::TcpListener,
    mut config: Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), AgentError> {
    if config.master.trim().is_empty() {
        return Err(AgentError::InvalidConfig("master address is empty".into()));
    }
    if config.command_executor.first().is_none_or(|p| p.is_empty()) {
        return Err(AgentError::InvalidConfig(
            "command executor program is empty".into(),
        ));
    }
    std::fs::create_dir_all(&config.work_dir).map_err(|source| AgentError::WorkDir {
        path: config.work_dir.clone(),
        source,
    })?;
    // Sandboxes handed to executors must be absolute paths.
    config.work_dir =
        std::fs::canonicalize(&config.work_dir).map_err(|source| AgentError::WorkDir {
            path: config.work_dir.clone(),
            source,
        })?;
    if config.users.switches() {
        tracing::info!(
            allow_root_tasks = config.users.allow_root_tasks,
            "executors run as the user their framework names"
        );
        if let Some(dir) = users::untraversable_ancestor(&config.work_dir) {
            tracing::warn!(directory = %dir.display(), "other users cannot pass through this directory above the work dir: executors that run as another user than the agent's will fail to start (give it o+x)");
        }
    } else {
        tracing::info!(
            allow_root_tasks = config.users.allow_root_tasks,
            uid = nix::unistd::Uid::effective().as_raw(),
            "executors run as the agent's own user"
        );
    }
    let cgroups = match config.isolation {
        Isolation::Posix => {
            tracing::info!("--isolation posix: cpus, mem and the other resources are bookkeeping only; nothing is enforced");
            None
        }
        Isolation::Cgroups => {
            let cgroups = isolation::cgroups::Cgroups::discover(&config.cgroups)?;
            // The containers together weigh the cpus the agent offers.
            let root_weight = cgroups.weigh_root(config.resources.cpus())?;
            tracing::info!(cgroups = cgroups.version(), root_weight, memory = %cgroups.base("memory").map(|p| p.display().to_string()).unwrap_or_default(), cfs = config.cgroups.enable_cfs, pids_max = config.cgroups.pids_max, "--isolation cgroups: each executor run gets a cgroup of its own");
            Some(Arc::new(cgroups))
        }
    };
    agora_net::doors::warn(&config.open_doors());
    let local = listener.local_addr()?;
    let server_tls = config
        .tls
        .server()
        .map_err(|e| AgentError::InvalidConfig(e.to_string()))?;
    let client_tls = config
        .tls
        .client()
        .map_err(|e| AgentError::InvalidConfig(e.to_string()))?;
    let ws_scheme = if server_tls.is_some() { "wss" } else { "ws" };
    let identity =
        identity::ExecutorIdentity::load(config.executor_secret_key.as_deref(), &config.work_dir)
            .map_err(|e| AgentError::InvalidConfig(format!("executor secret key: {e}")))?;
    let shared = Shared {
        listen: local,
        executor_endpoint: format!(
            "{ws_scheme}://{}/api/executor",
            loopback_if_unspecified(local)
        ),
        config: Arc::new(config),
        next_conn: Arc::new(AtomicU64::new(1)),
        counters: Arc::default(),
        identity: Arc::new(identity),
        client_tls,
        delegates_cgroups: cgroups.as_ref().is_some_and(|c| c.delegates()),
    };
    let (writer, streams) =
        checkpoint::Writer::start(&shared.config.work_dir).map_err(|source| {
            AgentError::WorkDir {
                path: shared.config.work_dir.clone(),
                source,
            }
        })?;
    let (core_tx, core_rx) = mpsc::channel(shared.config.core_queue.max(1));
    let recovered = core::Recovered::load(&shared.config.work_dir, streams);
    // Containers of executors found alive are re-adopted; any other under
    // --cgroups-root is an orphan, destroyed before anything starts.
    let processes = processes::Processes::start(
        core_tx.clone(),
        cgroups.clone(),
        shared.config.users,
        &recovered.alive,
    )?;
    let (now, wall) = (tokio::time::Instant::now(), agora_proto::now_timestamp());
    let mut core = core::Core::new(shared.clone(), rand::random(), now, wall);
    core.recover(recovered, now, wall);
    let (snapshots, snapshot) = tokio::sync::watch::channel(Arc::new(serde_json::Value::Null));
    let mut shell = shell::Shell::new(core, core_tx.clone(), writer, processes, snapshots);
    shell.flush();

    let cancel = CancellationToken::new();
    let monitor = isolation::monitor::Monitor::new(cgroups.clone());
    let app = http::router(
        shared.clone(),
        core_tx.clone(),
        snapshot.clone(),
        monitor.clone(),
    );
    let server = tokio::spawn(agora_net::serve(
        listener,
        app,
        cancel.clone(),
        agora_net::ServeOptions {
            tls: server_tls,
            ..agora_net::ServeOptions::default()
        },
    ));
    let usage = tokio::spawn(monitor.report(snapshot, core_tx.clone(), cancel.clone()));
    let link = tokio::spawn(master_link::run(shared.clone(), core_tx, cancel.clone()));
    tracing::info!(address = %local, master = %shared.config.master, "agent started");

    let stop = shell.run(core_rx, shutdown).await;
    cancel.cancel();
    let _ = link.await;
    let _ = usage.await;
    let mut server = server;
    if tokio::time::timeout(Duration::from_secs(2), &mut server)
        .await
        .is_err()
    {
        server.abort();
    }
    tracing::info!("agent stopped");
    match stop {
        core::Stop::Requested => Ok(()),
        core::Stop::Refused(message) => Err(AgentError::Refused(message)),
    }
}

fn loopback_if_unspecified(addr: SocketAddr) -> SocketAddr {
    if addr.ip().is_unspecified() {
        SocketAddr::new(std::net::Ipv4Addr::LOCALHOST.into(), addr.port())
    } else {
        addr
    }
}

impl Shared {
    /// `IP:PORT` of the agent for executors of the Mesos v1 executor API
    /// (`MESOS_AGENT_ENDPOINT`): the listen address, loopback when it is
    /// the wildcard.
    pub(crate) fn mesos_agent_endpoint(&self) -> String {
        loopback_if_unspecified(self.listen).to_string()
    }

    /// `IP:PORT` the master and clients reach this agent at: the advertised
    /// IP and port when given, else the listen address; a wildcard listen
    /// address is replaced by `via`, the local address of the connection to
    /// the master, which the master and its clients can route to (and,
    /// before any connection, by the host name).
    pub(crate) fn advertised_address(&self, via: Option<std::net::IpAddr>) -> String {
        let config = &self.config;
        let port = config.advertise_port.unwrap_or(self.listen.port());
        let ip = config
            .advertise_ip
            .or_else(|| (!self.listen.ip().is_unspecified()).then_some(self.listen.ip()))
            .or(via);
        match ip {
            Some(ip) => SocketAddr::new(ip, port).to_string(),
            None => format!("{}:{port}", config.hostname),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shared(listen: &str, config: impl FnOnce(&mut Config)) -> Shared {
        let mut c = Config::new("127.0.0.1:5050", std::env::temp_dir());
        c.hostname = "box".into();
        config(&mut c);
        Shared {
            config: Arc::new(c),
            listen: listen.parse().unwrap(),
            executor_endpoint: String::new(),
            next_conn: Arc::default(),
            counters: Arc::default(),
            identity: Arc::new(identity::ExecutorIdentity::new(&[1; 32])),
            client_tls: None,
            delegates_cgroups: false,
        }
    }

    #[test]
    fn the_advertised_address_is_one_clients_can_reach() {
        let via = Some("10.1.2.3".parse().unwrap());
        // A wildcard listen address: the address the master sees.
        let s = shared("0.0.0.0:5051", |_| {});
        assert_eq!(s.advertised_address(via), "10.1.2.3:5051");
        assert_eq!(
            s.advertised_address(None),
            "box:5051",
            "before any connection"
        );
        // A specific listen address is reachable as it is.
        let s = shared("192.168.7.9:6000", |_| {});
        assert_eq!(s.advertised_address(via), "192.168.7.9:6000");
        // --advertise-ip and --advertise-port win.
        let s = shared("0.0.0.0:5051", |c| {
            c.advertise_ip = Some("203.0.113.5".parse().unwrap());
            c.advertise_port = Some(15051);
        });
        assert_eq!(s.advertised_address(via), "203.0.113.5:15051");
        let s = shared("[::]:5051", |_| {});
        let v6 = Some("fd00::7".parse().unwrap());
        assert_eq!(s.advertised_address(v6), "[fd00::7]:5051");
    }
}
