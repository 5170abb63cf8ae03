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

mod agents;
pub mod allocator;
mod config;
mod event_loop;
mod frameworks;
mod http;
mod master;
mod offers;
mod state;
mod tasks;

use std::future::Future;
use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use agora_proto::MasterInfo;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

pub use config::Config;

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
    /// Serving on the listener failed.
    #[error("server error: {0}")]
    Io(#[from] std::io::Error),
}

/// Runs a master on `listener` until `shutdown` completes, then closes
/// every connection (code 1001) and returns.
pub async fn run(
    listener: tokio::net::TcpListener,
    config: Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), MasterError> {
    config.validate().map_err(MasterError::InvalidConfig)?;
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
    let allocator = DrfAllocator::new(AllocatorOptions::from(&config));
    let master = master::Master::new(config.clone(), info, Box::new(allocator), Instant::now());
    let (input_tx, input_rx) = mpsc::channel(config.event_queue_capacity);
    let (snapshot_tx, snapshot_rx) = watch::channel(Arc::new(master.snapshot()));
    let token = CancellationToken::new();
    let registry: http::Registry = Arc::default();

    let state_task = tokio::spawn(event_loop::run(
        master,
        input_rx,
        registry.clone(),
        snapshot_tx,
        config.state_snapshot_interval,
        token.clone(),
    ));
    let app = http::AppState {
        inputs: input_tx,
        registry,
        next_conn: Arc::new(AtomicU64::new(1)),
        snapshot: snapshot_rx,
        shutdown: token.clone(),
        queue_capacity: config.connection_queue_capacity,
    };
    let trigger = token.clone();
    tokio::spawn(async move {
        shutdown.await;
        trigger.cancel();
    });
    let server = axum::serve(listener, http::router(app))
        .with_graceful_shutdown(token.clone().cancelled_owned());
    let mut server = tokio::spawn(async move { server.await });
    let result = tokio::select! {
        r = &mut server => r,
        _ = token.cancelled() => match tokio::time::timeout(SHUTDOWN_GRACE, &mut server).await {
            Ok(r) => r,
            Err(_) => {
                server.abort();
                Ok(Ok(()))
            }
        },
    };
    token.cancel();
    let _ = tokio::time::timeout(SHUTDOWN_GRACE, state_task).await;
    tracing::info!("master stopped");
    match result {
        Ok(r) => r.map_err(MasterError::Io),
        Err(e) => Err(MasterError::Io(std::io::Error::other(e))),
    }
}
