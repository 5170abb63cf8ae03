//! A whole cluster in one process: a master and N agents, each on its own
//! 127.0.0.1 port, sharing a work directory. Agents fork the command
//! executor from this same binary (`agora-local __command-executor`), so a
//! newcomer needs nothing but `cargo run`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use agora_proto::{Attributes, Resources};
use anyhow::{bail, Context};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// The first argument that makes a multi-call binary act as the command executor.
pub const COMMAND_EXECUTOR_ARG: &str = "__command-executor";

/// How to lay out the local cluster.
#[derive(Debug, Clone)]
pub struct LocalOptions {
    /// Number of agents.
    pub agents: usize,
    /// Resources each agent advertises.
    pub agent_resources: Resources,
    /// Where the master and agents keep their state.
    pub work_dir: PathBuf,
    /// The master's address (port 0 picks a free one).
    pub master_listen: SocketAddr,
    /// Program and leading arguments agents run as the command executor.
    pub command_executor: Vec<String>,
    /// Give agent `i` the host name `PREFIXi` (default: all `localhost`),
    /// so placement by host can be seen on one machine.
    pub hostname_prefix: Option<String>,
    /// Turn authentication on, with this as the one principal: the
    /// master authenticates frameworks, agents and HTTP operators, and
    /// the agents (and [`LocalCluster::master_client`]) present it.
    pub credential: Option<agora_proto::Credential>,
    /// Turn TLS on everywhere with a throwaway CA made in
    /// `work_dir/tls` (see [`LocalCluster::tls`]).
    pub tls: bool,
}

/// A running local cluster. Dropping it without [`LocalCluster::shutdown`]
/// stops the servers when the runtime ends.
pub struct LocalCluster {
    /// Where the master serves.
    pub master_addr: SocketAddr,
    /// Where each agent serves.
    pub agent_addrs: Vec<SocketAddr>,
    /// The principal everything authenticates as, when authentication is on.
    pub credential: Option<agora_proto::Credential>,
    /// With TLS: the files (`ca` is what clients trust) and the client
    /// side of them.
    pub tls: Option<(
        agora_net::TlsOptions,
        std::sync::Arc<agora_net::tls::rustls::ClientConfig>,
    )>,
    stop_agents: watch::Sender<bool>,
    stop_master: watch::Sender<bool>,
    agent_tasks: Vec<JoinHandle<()>>,
    master_task: JoinHandle<()>,
}

// === impl LocalOptions ===

impl LocalOptions {
    /// `agents` agents of `cpus:4;mem:4096;disk:16384;ports:[31000-32000]`
    /// under `work_dir`, the master on an ephemeral port, and this binary as
    /// command executor.
    pub fn new(agents: usize, work_dir: PathBuf) -> anyhow::Result<Self> {
        let exe = std::env::current_exe().context("locating this executable")?;
        Ok(LocalOptions {
            agents,
            agent_resources: Resources::parse("cpus:4;mem:4096;disk:16384;ports:[31000-32000]")?,
            work_dir,
            master_listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            command_executor: vec![exe.display().to_string(), COMMAND_EXECUTOR_ARG.to_string()],
            hostname_prefix: None,
            credential: None,
            tls: false,
        })
    }
}

// === impl LocalCluster ===

impl LocalCluster {
    /// Starts the master and agents and waits until every agent has registered.
    pub async fn start(opts: LocalOptions) -> anyhow::Result<Self> {
        if opts.agents == 0 {
            bail!("--agents must be at least 1");
        }
        std::fs::create_dir_all(&opts.work_dir)
            .with_context(|| format!("creating work dir {}", opts.work_dir.display()))?;
        let (stop_master, master_stopped) = watch::channel(false);
        let (stop_agents, agents_stopped) = watch::channel(false);
        let wait_stop = |mut rx: watch::Receiver<bool>| async move {
            let _ = rx.wait_for(|s| *s).await;
        };

        let listener = TcpListener::bind(opts.master_listen)
            .await
            .with_context(|| format!("binding the master to {}", opts.master_listen))?;
        let master_addr = listener.local_addr()?;
        let tls_options = if opts.tls {
            let pki = agora_net::LocalPki::new("agora-local CA")?;
            Some(pki.write(
                &opts.work_dir.join("tls"),
                "localhost",
                &["localhost", "127.0.0.1"],
            )?)
        } else {
            None
        };
        let tls = match &tls_options {
            Some(options) => {
                let client = options.client()?.context("a client of the local CA")?;
                Some((options.clone(), client))
            }
            None => None,
        };
        let authenticate = opts.credential.is_some();
        let master_config = agora_master::Config {
            work_dir: Some(opts.work_dir.join("master")),
            credentials: opts
                .credential
                .clone()
                .map(|c| agora_proto::Credentials::new(vec![c])),
            authenticate_frameworks: authenticate,
            authenticate_agents: authenticate,
            authenticate_http: authenticate,
            tls: tls_options.clone().unwrap_or_default(),
            ..agora_master::Config::default()
        };
        let shutdown = wait_stop(master_stopped);
        let master_task = tokio::spawn(async move {
            if let Err(e) = agora_master::run(listener, master_config, shutdown).await {
                eprintln!("master stopped: {e}");
            }
        });
        let mut agent_tasks = Vec::new();

        let mut agent_addrs = Vec::new();
        for i in 0..opts.agents {
            let listener = TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0))).await?;
            agent_addrs.push(listener.local_addr()?);
            let mut config = agora_agent::Config::new(
                master_addr.to_string(),
                opts.work_dir.join(format!("agent-{i}")),
            );
            config.resources = opts.agent_resources.clone();
            config.attributes = Attributes::parse(&format!("rack:r{};agent:{i}", i % 2))?;
            config.hostname = match &opts.hostname_prefix {
                Some(prefix) => format!("{prefix}{i}"),
                None => "localhost".to_string(),
            };
            config.command_executor = opts.command_executor.clone();
            // A local cluster runs its tasks as whoever starts it.
            config.users = agora_agent::UserPolicy::agent_user();
            config.credential = opts.credential.clone();
            config.tls = tls_options.clone().unwrap_or_default();
            let shutdown = wait_stop(agents_stopped.clone());
            agent_tasks.push(tokio::spawn(async move {
                if let Err(e) = agora_agent::run(listener, config, shutdown).await {
                    eprintln!("agent {i} stopped: {e}");
                }
            }));
        }
        let cluster = LocalCluster {
            master_addr,
            agent_addrs,
            credential: opts.credential.clone(),
            tls,
            stop_agents,
            stop_master,
            agent_tasks,
            master_task,
        };
        cluster
            .wait_for_agents(opts.agents, Duration::from_secs(30))
            .await?;
        Ok(cluster)
    }

    /// Waits until the master's `/state` lists `n` connected agents.
    pub async fn wait_for_agents(&self, n: usize, timeout: Duration) -> anyhow::Result<()> {
        wait_for_agents_with(&self.master_client()?, n, timeout).await
    }

    /// A client of the master, presenting the cluster's credential.
    pub fn master_client(&self) -> anyhow::Result<agora_client::MasterClient> {
        let mut http = agora_client::Http::new();
        if let Some((_, client)) = &self.tls {
            http = http.with_tls(client.clone());
        }
        if let Some(credential) = &self.credential {
            http = http.with_authorization(&credential.authorization())?;
        }
        Ok(agora_client::MasterClient::with_http(
            http,
            self.master_addr,
        ))
    }

    /// Stops the agents (which kill their executors), then the master.
    pub async fn shutdown(self) {
        let _ = self.stop_agents.send(true);
        for task in self.agent_tasks {
            let _ = tokio::time::timeout(Duration::from_secs(10), task).await;
        }
        let _ = self.stop_master.send(true);
        let _ = tokio::time::timeout(Duration::from_secs(10), self.master_task).await;
    }
}

/// The flags that make a real `agora-agent` run every task as the user
/// who starts it, root included (in process:
/// [`agora_agent::UserPolicy::agent_user`]), as a local cluster's agents
/// do: for the clusters of tests and benchmarks, where whoever starts the
/// cluster is whose tasks run.
pub fn agent_user_flags() -> Vec<String> {
    let mut flags = vec!["--switch-user=false".to_string()];
    if agora_agent::UserPolicy::agent_user().allow_root_tasks {
        flags.push("--allow-root-tasks".to_string());
    }
    flags
}

/// Number of connected agents in a master's `/state`.
pub fn connected_agents(state: &serde_json::Value) -> usize {
    state["agents"]
        .as_array()
        .map(|agents| {
            agents
                .iter()
                .filter(|a| a["connected"].as_bool().unwrap_or(true))
                .count()
        })
        .unwrap_or(0)
}

/// Polls `http://master/state` until it lists `n` connected agents.
pub async fn wait_for_agents(
    master: SocketAddr,
    n: usize,
    timeout: Duration,
) -> anyhow::Result<()> {
    wait_for_agents_with(&agora_client::MasterClient::new(master), n, timeout).await
}

/// [`wait_for_agents`] through `client`.
pub async fn wait_for_agents_with(
    client: &agora_client::MasterClient,
    n: usize,
    timeout: Duration,
) -> anyhow::Result<()> {
    let master = client.address();
    let deadline = Instant::now() + timeout;
    let mut seen = 0;
    while Instant::now() < deadline {
        if let Ok(state) = client.state().await {
            seen = connected_agents(&state);
            if seen >= n {
                return Ok(());
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    bail!(
        "only {seen} of {n} agents registered with {master} within {:.0} s",
        timeout.as_secs_f64()
    )
}
