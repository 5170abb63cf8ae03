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
//! their own and checkpoints written on another. The core, the shell, the
//! process thread and the HTTP handlers speak in the messages of one module
//! below them all (`messages`), so the core imports nothing above it.
//! Containers are the containerizer's ([`agora_containerizer`]): the
//! process thread has it launch, watch, kill and recover them, and
//! `/monitor/statistics` reads their usage through it. The
//! status update streams are a sans-IO state machine in
//! [`status_updates`]; frameworks that set `checkpoint` have their
//! executors, tasks and updates checkpointed under `WORK_DIR/meta` so a
//! restarted agent recovers them (see [`RecoverMode`]). `/state` and
//! `/metrics` are served from a snapshot the shell publishes, never built
//! on the core per request.
//!
//! ```no_run
//! # async fn demo() -> Result<(), agora_agent::AgentError> {
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:5051").await?;
//! let config = agora_agent::Config::new("127.0.0.1:5050", "/var/lib/agora".into());
//! agora_agent::run(listener, config, async { let _ = tokio::signal::ctrl_c().await; }).await
//! # }
//! ```

use std::future::Future;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

mod checkpoint;
mod config;
mod core;
pub mod disk;
mod fetch;
pub mod files;
mod gc;
mod http;
mod identity;
pub mod launcher;
pub mod logrotate;
mod master_link;
mod messages;
mod monitor;
pub mod paths;
mod processes;
mod shared;
mod shell;
#[cfg(feature = "sim")]
pub mod sim;
pub mod status_updates;
mod sys;
pub mod users;
mod wal;

pub use agora_containerizer::isolation;
pub use agora_proto::{parse_duration, DurationError};
pub use config::{
    Config, RecoverMode, DEFAULT_COMMAND_EXECUTOR_TASKS, DEFAULT_CORE_QUEUE,
    DEFAULT_EXECUTOR_HEARTBEAT_INTERVAL, DEFAULT_EXECUTOR_OUTBOX, DEFAULT_MASTER_OUTBOX,
};
pub use gc::{max_age as gc_max_age, DEFAULT_GC_DELAY, DEFAULT_GC_DISK_HEADROOM};
pub use isolation::{CgroupsConfig, Isolation};
pub use users::UserPolicy;

use shared::{loopback_if_unspecified, Shared};

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
    // The checkpoints hold executor tokens and tasks' commands: the
    // agent's alone, whatever the umask made of the directory.
    let meta = paths::meta_root(&config.work_dir);
    std::fs::create_dir_all(&meta)
        .and_then(|()| {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&meta, std::fs::Permissions::from_mode(0o700))
        })
        .map_err(|source| AgentError::WorkDir {
            path: meta.clone(),
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
    // The containers together weigh the cpus the agent offers.
    let containerizer = agora_containerizer::Containerizer::start(
        config.isolation,
        &config.cgroups,
        config.resources.cpus(),
    )?;
    let images = start_images(&config)?;
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
        delegates_cgroups: containerizer.delegates(),
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
    let monitor = monitor::Monitor::new(containerizer.handle());
    let processes = processes::Processes::start(
        core_tx.clone(),
        containerizer,
        images.clone(),
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
    let net = Arc::new(agora_net::NetStats::default());
    let app = http::router(
        shared.clone(),
        core_tx.clone(),
        snapshot.clone(),
        monitor.clone(),
        net.clone(),
        images,
    );
    let server = tokio::spawn(agora_net::serve(
        listener,
        app,
        cancel.clone(),
        agora_net::ServeOptions {
            tls: server_tls,
            limits: shared.config.limits.clone(),
            stats: net,
            ..agora_net::ServeOptions::default()
        },
    ));
    let usage = tokio::spawn(monitor.report(snapshot.clone(), core_tx.clone(), cancel.clone()));
    let disk = tokio::spawn(disk::run(
        disk::Watch::new(&shared.config),
        shared.config.disk_check_interval,
        core_tx.clone(),
        cancel.clone(),
    ));
    let gc = tokio::spawn(gc::run(
        gc::Collector::new(
            &shared.config.work_dir,
            shared.config.gc_delay,
            shared.config.gc_disk_headroom,
        ),
        shared.config.disk_check_interval,
        snapshot.clone(),
        cancel.clone(),
    ));
    let link = tokio::spawn(master_link::run(shared.clone(), core_tx, cancel.clone()));
    tracing::info!(address = %local, master = %shared.config.master, "agent started");

    let stop = shell.run(core_rx, shutdown).await;
    cancel.cancel();
    let _ = link.await;
    let _ = usage.await;
    let _ = disk.await;
    let _ = gc.await;
    let mut server = server;
    if tokio::time::timeout(Duration::from_secs(2), &mut server)
        .await
        .is_err()
    {
        server.abort();
    }
    tracing::info!("agent stopped");
    match stop {
        messages::Stop::Requested => Ok(()),
        messages::Stop::Refused(message) => Err(AgentError::Refused(message)),
    }
}

/// Images, when `--image-providers` enables them: the layer store under
/// `--docker-store-dir`, the runtime's state under `WORK_DIR/runtime`
/// and the containers' run directories under `WORK_DIR/containers`
/// (crun and conmon must be installed). Without providers, none: tasks
/// that name an image are refused.
fn start_images(
    config: &Config,
) -> Result<Option<agora_containerizer::ImageContainers>, AgentError> {
    if config.images.image_providers.is_empty() {
        return Ok(None);
    }
    let mut runtime = agora_containerizer::RuntimeConfig::new(config.work_dir.join("runtime"));
    runtime.volume_policy.allowed_host_paths = config.allowed_host_paths.clone();
    let images = agora_containerizer::ImageContainers::start(agora_containerizer::ImagesConfig {
        provisioner: config.images.clone(),
        runtime,
        runs_dir: config.work_dir.join("containers"),
        cgroups_root: (config.isolation == Isolation::Cgroups).then(|| config.cgroups.root.clone()),
    })
    .map_err(|e| AgentError::InvalidConfig(format!("images (--image-providers): {e}")))?;
    let providers: Vec<String> = config
        .images
        .image_providers
        .iter()
        .map(|p| p.to_string())
        .collect();
    tracing::info!(providers = %providers.join(","), registry = %config.images.docker_registry, store = %config.images.docker_store_dir.display(), "command tasks that name an image run in it (crun)");
    Ok(Some(images))
}
