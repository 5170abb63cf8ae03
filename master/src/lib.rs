//! The Agora master: turns the resources agents advertise into offers for
//! frameworks, tracks tasks, and relays status updates, acknowledgements
//! and messages between schedulers and agents.
//!
//! [`run`] serves everything on one listener: WebSockets at
//! `/api/scheduler` and `/api/agent` (the behaviour contract is
//! `docs/protocol.md`) and HTTP `/health`, `/version` and `/state`.
//! Inside, one task owns all state as a sans-IO state machine (`master`);
//! connection tasks only parse, forward and write; the [`allocator`]
//! (default: hierarchical weighted DRF with quota) is a pure component behind a trait.
//! With a work directory, the `registry` keeps admitted agents,
//! frameworks and removed ids durable (written before the master acts on
//! a change) and a restarted master recovers them.
//! With the `etcd` feature and [`Config`]'s `etcd` set, several masters
//! campaign for leadership in etcd and the leader keeps the registry
//! there (`ha`; see `docs/protocol.md`, "High availability").

/// Authorization rules: they live in `agora-proto`, shared with the agent.
pub use agora_proto::acls;
mod agents;
pub mod allocator;
#[doc(hidden)]
pub mod bench;
mod config;
mod drain;
mod event_loop;
mod frameworks;
#[cfg(feature = "etcd")]
mod ha;
mod http;
mod master;
mod metrics;
mod offers;
mod quota;
mod registry;
#[cfg(feature = "sim")]
pub mod sim;
mod state;
mod tasks;
mod tracked;

use std::future::Future;
use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use agora_proto::MasterInfo;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

pub use config::{
    AgentBounds, Config, DEFAULT_MAX_AGENT_ATTRIBUTES, DEFAULT_MAX_AGENT_RANGES,
    DEFAULT_MAX_AGENT_RESOURCES, DEFAULT_MAX_AGENT_RESOURCE_ENTRIES, DEFAULT_MAX_AGENT_SET_ITEMS,
    DEFAULT_MAX_AGENT_TEXT_BYTES, DEFAULT_MAX_CONNECTIONS_PER_PEER, DEFAULT_MAX_FAILOVER_TIMEOUT,
    DEFAULT_OPERATOR_STREAM_BACKLOG,
};
#[cfg(feature = "etcd")]
pub use config::{EtcdOptions, DEFAULT_ETCD_LEASE_TTL};
pub use registry::RegistryError;

use registry::Registry as _;

use allocator::{AllocatorOptions, DrfAllocator};

/// How long shutdown waits for connections and the state task to finish.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// Why the master could not run.
#[derive(Debug, thiserror::Error)]
pub enum MasterError {
    /// A configuration value is unusable; the text says which.
    #[error("invalid configuration: {0}")]
    InvalidConfig(String),
    /// The work directory could not be created.
    #[error("cannot create work directory {path}: {source}")]
    WorkDir {
        /// The directory.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The registry in the work directory could not be loaded or written
    /// (a failed write stops the master: it does not act on changes it
    /// cannot keep).
    #[error("registry: {0}")]
    Registry(#[from] RegistryError),
    /// This master was the leader and lost its lease (it was cut off
    /// from etcd, or frozen past the lease's TTL): it stopped acting at
    /// once. Restart it to campaign again.
    #[cfg(feature = "etcd")]
    #[error("deposed: {0}")]
    Deposed(String),
    /// Serving on the listener failed.
    #[error("server error: {0}")]
    Io(#[from] std::io::Error),
}

/// Runs a master on `listener` until `shutdown` completes, then closes
/// every connection (code 1001) and returns.
///
/// With [`Config`]'s `etcd` set (feature `etcd`), the master serves at
/// once as a standby and acts only once it has won the leader election;
/// it returns [`MasterError::Deposed`] when it loses leadership.
pub async fn run(
    listener: tokio::net::TcpListener,
    config: Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), MasterError> {
    config.validate().map_err(MasterError::InvalidConfig)?;
    let tls = config
        .tls
        .server()
        .map_err(|e| MasterError::InvalidConfig(e.to_string()))?;
    if let Some(dir) = &config.work_dir {
        std::fs::create_dir_all(dir).map_err(|source| MasterError::WorkDir {
            path: dir.clone(),
            source,
        })?;
    }
    let address = listener.local_addr()?;
    let info = MasterInfo {
        id: uuid::Uuid::new_v4().to_string(),
        address: address.to_string(),
        version: agora_proto::VERSION.to_string(),
    };
    tracing::info!(master_id = %info.id, %address, "master starting");
    let open_doors = config.open_doors();
    agora_net::doors::warn(&open_doors);
    #[cfg(feature = "etcd")]
    let election = match &config.etcd {
        Some(options) => {
            let me = agora_proto::LeaderInfo {
                address: info.address.clone(),
                master_id: info.id.clone(),
            };
            let (election, role) = ha::Election::new(options, me)
                .map_err(|e| MasterError::InvalidConfig(e.to_string()))?;
            Some((election, role))
        }
        None => None,
    };
    #[cfg(feature = "etcd")]
    let high_availability = election.is_some();
    #[cfg(not(feature = "etcd"))]
    let high_availability = false;

    let allocator = DrfAllocator::new(AllocatorOptions::from(&config));
    let mut master = master::Master::new(config.clone(), info, Box::new(allocator), Instant::now());
    let store: Option<Box<dyn registry::Registry>> = match &config.work_dir {
        Some(dir) if !high_availability => {
            let mut store =
                registry::FileRegistry::open(&dir.join("registry"), config.max_removed_agents)?;
            if let Some(t) = store.truncation() {
                master.metrics.registry_truncations.inc();
                master.metrics.registry_truncated_bytes.add(t.bytes);
            }
            master.recover(store.state(), Instant::now(), agora_proto::now_timestamp());
            // Teardowns decided at recovery are durable before serving.
            store.apply(&master.take_registry_ops())?;
            master.take_outputs();
            Some(Box::new(store))
        }
        _ => None,
    };
    let (input_tx, input_rx) = mpsc::channel(config.event_queue_capacity);
    let mut builder = state::StateBuilder::default();
    builder.apply(master.full_state_delta());
    master.mark_published();
    let (snapshot_tx, snapshot_rx) = watch::channel(Arc::new(builder.build()));
    #[allow(unused_mut)]
    let mut publisher = state::Publisher::spawn(builder, snapshot_tx)?;
    let metrics = master.metrics.clone();
    let token = CancellationToken::new();
    let registry: http::Registry = Arc::default();
    let net = Arc::new(agora_net::NetStats::default());

    let app = http::AppState {
        inputs: input_tx,
        registry: registry.clone(),
        next_conn: Arc::new(AtomicU64::new(1)),
        snapshot: snapshot_rx,
        shutdown: token.clone(),
        queue_capacity: config.connection_queue_capacity,
        first_frame_timeout: config.authentication_timeout,
        metrics,
        bodies: agora_net::Bodies::new(&config.limits, net.clone()),
        net: net.clone(),
        operator_stream_backlog: config.operator_stream_backlog,
        open_doors: agora_net::doors::names(&open_doors),
        auth: Arc::new(http::Authentication {
            credentials: config.credentials.clone(),
            frameworks: config.authenticate_frameworks,
            agents: config.authenticate_agents,
            http: config.authenticate_http,
            acls: config.acls.clone(),
        }),
    };
    #[allow(unused_mut)]
    let mut router = http::router(app);
    #[cfg(feature = "etcd")]
    let election = election.map(|(election, role)| {
        router =
            std::mem::take(&mut router).layer(axum::middleware::from_fn_with_state(role, ha::gate));
        election
    });

    let state_token = token.clone();
    let snapshot_interval = config.state_snapshot_interval;
    #[cfg(feature = "etcd")]
    let removed_capacity = config.max_removed_agents;
    let state_task = tokio::spawn(async move {
        #[cfg(feature = "etcd")]
        if let Some(election) = election {
            let Some(won) = election.campaign(removed_capacity, &state_token).await else {
                return Ok(());
            };
            let won = match won {
                Ok(won) => won,
                Err(e) => {
                    state_token.cancel();
                    return Err(MasterError::Registry(e));
                }
            };
            let mut store = won.store;
            master.recover(store.state(), Instant::now(), agora_proto::now_timestamp());
            let ops = master.take_registry_ops();
            if let Err(e) = event_loop::persist(&mut store, &ops) {
                state_token.cancel();
                return Err(MasterError::Registry(e));
            }
            master.take_outputs();
            publisher.publish(master.state_delta()).await;
            election.open();
            tracing::info!("leading: serving schedulers and agents");
            let lease = won.lease;
            let result = event_loop::run(
                master,
                input_rx,
                Some(Box::new(store)),
                registry,
                publisher,
                snapshot_interval,
                state_token,
                Some(Box::new(lease.clone())),
            )
            .await;
            return match (result, lease.lost_reason()) {
                (Err(registry::RegistryError::NotLeader(reason)), _) | (_, Some(reason)) => {
                    Err(MasterError::Deposed(reason))
                }
                (r, None) => r.map_err(MasterError::Registry),
            };
        }
        event_loop::run(
            master,
            input_rx,
            store,
            registry,
            publisher,
            snapshot_interval,
            state_token,
            None,
        )
        .await
        .map_err(MasterError::Registry)
    });
    let trigger = token.clone();
    tokio::spawn(async move {
        shutdown.await;
        trigger.cancel();
    });
    if tls.is_some() {
        tracing::info!(
            require_client_cert = config.tls.require_client_cert,
            allow_plaintext = config.tls.allow_plaintext,
            "serving TLS"
        );
    }
    let mut server = tokio::spawn(agora_net::serve(
        listener,
        router,
        token.clone(),
        agora_net::ServeOptions {
            per_peer: config.max_connections_per_peer,
            limits: config.limits.clone(),
            tls,
            handshake_timeout: config.authentication_timeout,
            stats: net,
        },
    ));
    let result = tokio::select! {
        r = &mut server => r,
        _ = token.cancelled() => match tokio::time::timeout(SHUTDOWN_GRACE, &mut server).await {
            Ok(r) => r,
            Err(_) => {
                server.abort();
                Ok(())
            }
        },
    };
    token.cancel();
    if let Ok(Ok(Err(e))) = tokio::time::timeout(SHUTDOWN_GRACE, state_task).await {
        return Err(e);
    }
    tracing::info!("master stopped");
    result.map_err(|e| MasterError::Io(std::io::Error::other(e)))
}
