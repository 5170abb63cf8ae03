//! `agora-flink-bridge`: started by Flink's Agora resource manager
//! driver; JSON lines on stdin/stdout (see the crate docs and
//! `docs/flink.md`). Logs go to stderr.

use std::path::PathBuf;
use std::time::Duration;

use agora_flink_bridge::{BridgeOptions, StoreChoice};
use agora_workers::proto::Credential;
use agora_workers::DriverOptions;
use anyhow::Context;
use clap::Parser;

/// Requests and releases Flink TaskManagers on an Agora cluster for one
/// JobManager, speaking JSON lines on stdin/stdout; exits when stdin closes.
#[derive(Parser, Debug)]
#[command(name = "agora-flink-bridge", version)]
struct Args {
    /// The Agora master: `HOST:PORT`, a `ws://` URL, or `etcd://HOST:PORT/PREFIX`.
    #[arg(long)]
    master: String,
    /// The framework's name.
    #[arg(long, default_value = "flink")]
    name: String,
    /// The role to run in.
    #[arg(long)]
    role: Option<String>,
    /// The principal for a master that authenticates frameworks.
    #[arg(long, requires = "secret_file")]
    principal: Option<String>,
    /// A file holding the principal's secret (first line).
    #[arg(long, requires = "principal")]
    secret_file: Option<PathBuf>,
    /// This JobManager's host (the framework's `hostname`).
    #[arg(long, default_value = "")]
    hostname: String,
    /// The JobManager's web UI, shown by the master.
    #[arg(long)]
    webui_url: Option<String>,
    /// Seconds the master keeps the TaskManagers of a JobManager that is gone.
    #[arg(long, default_value_t = 7.0 * 24.0 * 3600.0)]
    failover_timeout: f64,
    /// Wait per locality level, in milliseconds.
    #[arg(long, default_value_t = 3000)]
    locality_wait_ms: u64,
    /// The worker store: `memory`, `file:PATH` or `etcd://HOST:PORT/PREFIX`.
    #[arg(long, default_value = "memory")]
    store: StoreChoice,
    /// Lease of the etcd store's election, in milliseconds.
    #[arg(long, default_value_t = 5000)]
    election_ttl_ms: u64,
    /// How long to wait to win the etcd store's election, in milliseconds.
    #[arg(long, default_value_t = 60_000)]
    election_timeout_ms: u64,
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let args = Args::parse();
    if !(args.failover_timeout.is_finite() && args.failover_timeout >= 0.0) {
        anyhow::bail!("--failover-timeout must be a number of seconds ≥ 0");
    }
    let mut driver = DriverOptions::new(&args.master, &args.name);
    driver.role = args.role.clone();
    driver.hostname = args.hostname.clone();
    driver.webui_url = args.webui_url.clone();
    driver.failover_timeout = Duration::from_secs_f64(args.failover_timeout);
    driver.locality_wait = Duration::from_millis(args.locality_wait_ms);
    if let (Some(principal), Some(path)) = (&args.principal, &args.secret_file) {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading the secret file {}", path.display()))?;
        let secret = text.lines().next().unwrap_or("").to_string();
        driver.credential = Some(Credential {
            principal: principal.clone(),
            secret,
        });
    }
    let options = BridgeOptions {
        driver,
        store: args.store,
        election_ttl: Duration::from_millis(args.election_ttl_ms),
        election_timeout: Duration::from_millis(args.election_timeout_ms),
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let outcome = runtime.block_on(async {
        // SIGTERM or SIGINT (a JobManager stopped from its terminal) is a
        // terminate: the TaskManagers stay for the next attempt.
        let shutdown = async {
            use tokio::signal::unix::{signal, SignalKind};
            match (
                signal(SignalKind::terminate()),
                signal(SignalKind::interrupt()),
            ) {
                (Ok(mut term), Ok(mut int)) => {
                    tokio::select! {
                        _ = term.recv() => {}
                        _ = int.recv() => {}
                    }
                }
                _ => std::future::pending().await,
            }
        };
        agora_flink_bridge::run(
            options,
            tokio::io::BufReader::new(tokio::io::stdin()),
            tokio::io::stdout(),
            shutdown,
        )
        .await
    });
    tracing::info!(reason = %outcome.reason, "the bridge ended");
    // stdin's reader may still be blocked in a read: do not wait for it.
    runtime.shutdown_timeout(Duration::from_millis(100));
    std::process::exit(if outcome.failed { 1 } else { 0 });
}
