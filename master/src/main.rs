//! `agora-master`: flags → [`agora_master::Config`] → [`agora_master::run`].

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use agora_proto::parse_duration;
use anyhow::Context as _;
use clap::{Parser, ValueEnum};

// mimalloc rather than the system allocator: the message paths allocate
// and free small buffers per frame (JSON, ids); bench-status-updates runs
// 15-35% faster with it.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The Agora master: turns agents' resources into offers for frameworks.
#[derive(Debug, Parser)]
#[command(name = "agora-master", version)]
struct Flags {
    /// Address to serve WebSockets and HTTP on.
    #[arg(long, default_value = "127.0.0.1:5050")]
    listen: SocketAddr,
    #[command(flatten)]
    tls: agora_net::TlsFlags,
    #[command(flatten)]
    limits: agora_net::LimitFlags,
    /// Directory for the master's own files, including the registry of
    /// admitted agents and frameworks that a restarted master reloads.
    #[arg(long)]
    work_dir: Option<PathBuf>,
    /// Period of the regular allocation cycle (500ms, 5s, 2m, 1h or seconds).
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    allocation_interval: Duration,
    /// Delay of the extra allocation after resources free up (coalesces bursts).
    #[arg(long, default_value = "20ms", value_parser = parse_duration)]
    allocation_batch_window: Duration,
    /// How often agents are pinged.
    #[arg(long, default_value = "15s", value_parser = parse_duration)]
    agent_ping_interval: Duration,
    /// Unanswered pings after which an agent is removed.
    #[arg(long, default_value_t = 5)]
    max_missed_pings: u32,
    /// How often schedulers get a heartbeat.
    #[arg(long, default_value = "15s", value_parser = parse_duration)]
    heartbeat_interval: Duration,
    /// Rescind offers outstanding longer than this and re-offer their
    /// resources, so no framework hoards them; 0 never rescinds.
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    offer_timeout: Duration,
    /// refuse_seconds for declines and launches without a filter.
    #[arg(long, default_value_t = agora_proto::DEFAULT_REFUSE_SECONDS)]
    default_refuse_seconds: f64,
    /// Principals and secrets: Mesos's JSON format
    /// (`{"credentials":[{"principal":"p","secret":"s"}]}`) or one
    /// `principal secret` pair per line.
    #[arg(long)]
    credentials: Option<PathBuf>,
    /// Schedulers must authenticate (`Authorization: Basic`, on the
    /// native WebSocket and the Mesos v1 API) with --credentials.
    #[arg(long)]
    authenticate_frameworks: bool,
    /// Agents must authenticate with --credentials; others are not
    /// registered.
    #[arg(long)]
    authenticate_agents: bool,
    /// Operators must authenticate (Basic or Bearer) on every HTTP
    /// endpoint but /health, /version and /redirect.
    #[arg(long)]
    authenticate_http: bool,
    /// How long a new connection has to send its first frame (SUBSCRIBE,
    /// REGISTER) or finish its TLS handshake before it is closed.
    #[arg(long, default_value = "15s", value_parser = parse_duration)]
    authentication_timeout: Duration,
    /// Authorization rules: JSON (Mesos's ACL format: register_frameworks,
    /// register_agents, run_tasks, teardown_frameworks, view_frameworks,
    /// view_tasks, with `permissive`) or the file holding it. Once given,
    /// an operator may tear down only frameworks of its own principal
    /// unless a teardown_frameworks rule says otherwise.
    #[arg(long)]
    acls: Option<String>,
    /// The most an agent may offer of each scalar named (e.g.
    /// `cpus:1024;mem:16777216`): an agent registering with more is
    /// refused.
    #[arg(long, default_value = agora_master::DEFAULT_MAX_AGENT_RESOURCES, value_parser = parse_resources)]
    max_agent_resources: agora_proto::Resources,
    /// Resource entries (one per name, role and kind) an agent may
    /// register with.
    #[arg(long, default_value_t = agora_master::DEFAULT_MAX_AGENT_RESOURCE_ENTRIES)]
    max_agent_resource_entries: usize,
    /// Items of one set resource an agent may register with.
    #[arg(long, default_value_t = agora_master::DEFAULT_MAX_AGENT_SET_ITEMS)]
    max_agent_set_items: usize,
    /// Ranges of one range resource an agent may register with.
    #[arg(long, default_value_t = agora_master::DEFAULT_MAX_AGENT_RANGES)]
    max_agent_ranges: usize,
    /// Attributes an agent may register with.
    #[arg(long, default_value_t = agora_master::DEFAULT_MAX_AGENT_ATTRIBUTES)]
    max_agent_attributes: usize,
    /// Bytes of one name or text in an agent's registration (resource
    /// names, roles, set items, attributes, hostname, address).
    #[arg(long, default_value_t = agora_master::DEFAULT_MAX_AGENT_TEXT_BYTES)]
    max_agent_text_bytes: usize,
    /// Connections not yet authenticated, subscribed or registered open
    /// at once from one peer address; past it a new one closes the
    /// oldest of them.
    #[arg(long, default_value_t = agora_master::DEFAULT_MAX_CONNECTIONS_PER_PEER)]
    max_connections_per_peer: usize,
    /// Smallest cpus worth offering.
    #[arg(long, default_value_t = 0.01)]
    min_offer_cpus: f64,
    /// Smallest mem (MiB) worth offering.
    #[arg(long, default_value_t = 32.0)]
    min_offer_mem: f64,
    /// DRF weights per role, e.g. `web=2,batch=0.5` (others weigh 1).
    #[arg(long, value_parser = parse_weights, default_value = "")]
    weights: BTreeMap<String, f64>,
    /// Guaranteed minimum for a role, allocated before fair sharing:
    /// `ROLE=RESOURCES` with scalar resources in the agent syntax, e.g.
    /// `--quota 'web=cpus:4;mem:1024'`. Repeat the flag, or separate roles
    /// with `,`: `--quota 'web=cpus:4;mem:1024,batch=cpus:2'`.
    #[arg(long = "quota", value_name = "ROLE=RESOURCES", value_parser = parse_quotas)]
    quotas: Vec<Vec<(String, agora_proto::Resources)>>,
    /// How long a framework known only from agents' reports waits for its scheduler.
    #[arg(long, default_value = "10m", value_parser = parse_duration)]
    recovered_framework_timeout: Duration,
    /// After a restart, how long agents in the registry have to
    /// re-register before they are removed (needs --work-dir).
    #[arg(long, default_value = "10m", value_parser = parse_duration)]
    agent_reregister_timeout: Duration,
    /// Completed tasks kept for /state and reconciliation.
    #[arg(long, default_value_t = 1000)]
    max_completed_tasks: usize,
    /// Removed frameworks kept for /state and the operator API.
    #[arg(long, default_value_t = 50)]
    max_completed_frameworks: usize,
    /// Removed agent ids remembered (refused with SHUTDOWN).
    #[arg(long, default_value_t = 100_000)]
    max_removed_agents: usize,
    /// Frames queued towards one connection before a non-reading peer is dropped.
    #[arg(long, default_value_t = 10_000)]
    connection_queue_capacity: usize,
    /// Bytes of events an operator event stream (SUBSCRIBE on /api/v1)
    /// may have waiting for its reader; past it the stream is cut off.
    #[arg(long, default_value_t = agora_master::DEFAULT_OPERATOR_STREAM_BACKLOG)]
    operator_stream_backlog: usize,
    /// The longest a disconnected framework is kept for its scheduler,
    /// whatever failover_timeout it asks for.
    #[arg(long, default_value = "7d", value_parser = parse_duration)]
    max_failover_timeout: Duration,
    /// Disconnected frameworks kept for their schedulers at once; past
    /// it the one disconnected longest is removed.
    #[arg(long, default_value_t = 1000)]
    max_disconnected_frameworks: usize,
    /// Bytes of FrameworkInfo (as JSON) disconnected frameworks may hold
    /// in all; past it the one disconnected longest is removed.
    #[arg(long, default_value_t = 64 * 1024 * 1024)]
    max_disconnected_framework_bytes: usize,
    /// Calls queued towards the state task.
    #[arg(long, default_value_t = 8192)]
    event_queue_capacity: usize,
    /// Least time between two /state snapshots.
    #[arg(long, default_value = "100ms", value_parser = parse_duration)]
    state_snapshot_interval: Duration,
    /// High availability: campaign for leadership in the etcd at this
    /// client URL (e.g. http://127.0.0.1:2379) and keep the registry there.
    /// A master that loses leadership exits non-zero: run it under a
    /// supervisor that restarts it.
    #[cfg(feature = "etcd")]
    #[arg(long, value_name = "URL")]
    etcd: Option<String>,
    /// Prefix of this cluster's keys in etcd (with --etcd).
    #[cfg(feature = "etcd")]
    #[arg(long, default_value = "/agora", requires = "etcd")]
    etcd_prefix: String,
    /// TTL of the leader's lease (with --etcd): a dead leader is replaced
    /// within about this long; whole seconds.
    #[cfg(feature = "etcd")]
    #[arg(long, default_value = "2s", value_parser = parse_duration, requires = "etcd")]
    etcd_lease_ttl: Duration,
    /// Log format (filter with RUST_LOG).
    #[arg(long, value_enum, default_value_t = LogFormat::Text, env = "AGORA_LOG_FORMAT")]
    log_format: LogFormat,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

fn parse_resources(text: &str) -> Result<agora_proto::Resources, String> {
    agora_proto::Resources::parse(text).map_err(|e| e.to_string())
}

fn parse_weights(text: &str) -> Result<BTreeMap<String, f64>, String> {
    let mut out = BTreeMap::new();
    for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (role, weight) = part
            .split_once('=')
            .ok_or_else(|| format!("{part:?}: expected role=weight"))?;
        let weight: f64 = weight
            .trim()
            .parse()
            .map_err(|_| format!("{part:?}: weight must be a number"))?;
        out.insert(role.trim().to_string(), weight);
    }
    Ok(out)
}

fn parse_quotas(text: &str) -> Result<Vec<(String, agora_proto::Resources)>, String> {
    let mut out = Vec::new();
    for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (role, resources) = part.split_once('=').ok_or_else(|| {
            format!("{part:?}: expected ROLE=RESOURCES, e.g. web=cpus:4;mem:1024")
        })?;
        let resources = agora_proto::Resources::parse(resources.trim())
            .map_err(|e| format!("{part:?}: {e}"))?;
        out.push((role.trim().to_string(), resources));
    }
    Ok(out)
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
    tracing::info!("shutdown signal received");
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let flags = Flags::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match flags.log_format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
    let config = agora_master::Config {
        work_dir: flags.work_dir,
        allocation_interval: flags.allocation_interval,
        allocation_batch_window: flags.allocation_batch_window,
        agent_ping_interval: flags.agent_ping_interval,
        max_missed_pings: flags.max_missed_pings,
        heartbeat_interval: flags.heartbeat_interval,
        offer_timeout: (!flags.offer_timeout.is_zero()).then_some(flags.offer_timeout),
        default_refuse_seconds: flags.default_refuse_seconds,
        min_offer_cpus: flags.min_offer_cpus,
        min_offer_mem: flags.min_offer_mem,
        role_weights: flags.weights,
        role_quotas: flags.quotas.into_iter().flatten().collect(),
        role_limits: Default::default(),
        recovered_framework_timeout: flags.recovered_framework_timeout,
        agent_reregister_timeout: flags.agent_reregister_timeout,
        credentials: match &flags.credentials {
            Some(path) => Some(agora_proto::Credentials::load(path)?),
            None => None,
        },
        authenticate_frameworks: flags.authenticate_frameworks,
        authenticate_agents: flags.authenticate_agents,
        authenticate_http: flags.authenticate_http,
        authentication_timeout: flags.authentication_timeout,
        tls: flags.tls.options(),
        acls: match &flags.acls {
            Some(acls) => std::sync::Arc::new(
                agora_master::acls::Acls::load(acls).map_err(anyhow::Error::msg)?,
            ),
            None => std::sync::Arc::default(),
        },
        max_agent_resources: flags.max_agent_resources,
        agent_bounds: agora_master::AgentBounds {
            max_resource_entries: flags.max_agent_resource_entries,
            max_set_items: flags.max_agent_set_items,
            max_ranges: flags.max_agent_ranges,
            max_attributes: flags.max_agent_attributes,
            max_text_bytes: flags.max_agent_text_bytes,
        },
        max_completed_tasks: flags.max_completed_tasks,
        max_completed_frameworks: flags.max_completed_frameworks,
        max_removed_agents: flags.max_removed_agents,
        connection_queue_capacity: flags.connection_queue_capacity,
        max_connections_per_peer: flags.max_connections_per_peer,
        event_queue_capacity: flags.event_queue_capacity,
        limits: flags.limits.limits(),
        operator_stream_backlog: flags.operator_stream_backlog,
        max_failover_timeout: flags.max_failover_timeout,
        max_disconnected_frameworks: flags.max_disconnected_frameworks,
        max_disconnected_framework_bytes: flags.max_disconnected_framework_bytes,
        state_snapshot_interval: flags.state_snapshot_interval,
        #[cfg(feature = "etcd")]
        etcd: flags.etcd.map(|endpoint| agora_master::EtcdOptions {
            endpoint,
            prefix: flags.etcd_prefix,
            lease_ttl: flags.etcd_lease_ttl,
        }),
    };
    config
        .validate()
        .map_err(|e| anyhow::anyhow!("invalid flags: {e}"))?;
    let listener = tokio::net::TcpListener::bind(flags.listen)
        .await
        .with_context(|| format!("cannot listen on {}", flags.listen))?;
    let address = listener.local_addr()?;
    println!("agora-master listening on {address}");
    agora_master::run(listener, config, shutdown_signal()).await?;
    Ok(())
}
