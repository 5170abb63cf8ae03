//! `agora`: list a cluster's agents, frameworks and tasks, read a task's
//! logs, run a job (`agora execute`, as `agora-execute`) or, built with
//! the `local` feature, a whole local cluster (`agora local`, as
//! `agora-local`). Without that feature the CLI links neither the master
//! nor the agent.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use agora_cli::{
    agent_action, execute_with_progress, list_all, master, print_items, task_log, AgentAction,
    AGENT_COLUMNS, FRAMEWORK_COLUMNS, QUOTA_COLUMNS, TASK_COLUMNS, WEIGHT_COLUMNS,
};
use agora_examples::cli::{init_logging, parse_duration};
use agora_examples::execute::ExecuteOptions;
#[cfg(feature = "local")]
use agora_examples::local::{LocalCluster, LocalOptions, COMMAND_EXECUTOR_ARG};
use agora_proto::{FrameworkId, Resources};
use clap::{Args as ClapArgs, Parser, Subcommand};

/// The Agora command line.
#[derive(Parser, Debug)]
#[command(name = "agora", version)]
struct Cli {
    /// Master address, HOST:PORT (or etcd://HOST:PORT/PREFIX in builds with
    /// the `etcd` feature: the current leader).
    #[arg(
        long,
        global = true,
        env = "AGORA_MASTER",
        default_value = "127.0.0.1:5050"
    )]
    master: String,
    /// Print JSON instead of a table.
    #[arg(long, global = true)]
    json: bool,
    /// Log as JSON lines (filter with RUST_LOG).
    #[arg(long, global = true)]
    log_json: bool,
    /// Principal to authenticate as (with --secret-file or AGORA_SECRET);
    /// with `local`, the one principal of an authenticating cluster.
    #[arg(long, global = true, env = "AGORA_PRINCIPAL")]
    principal: Option<String>,
    /// File holding the principal's secret.
    #[arg(long, global = true)]
    secret_file: Option<PathBuf>,
    #[command(flatten)]
    tls: agora_net::TlsFlags,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// List agents.
    Agents {
        /// Only agents whose id, hostname or address contains this.
        #[arg(long)]
        filter: Option<String>,
    },
    /// List frameworks.
    Frameworks {
        /// Only frameworks whose id or name contains this.
        #[arg(long)]
        filter: Option<String>,
    },
    /// List tasks (active ones, then recently completed ones).
    Tasks {
        /// Only tasks in these states (comma-separated: running, finished,
        /// TASK_FAILED, active, terminal, …).
        #[arg(long)]
        state: Option<String>,
        /// Only tasks of this framework.
        #[arg(long)]
        framework: Option<String>,
        /// Only tasks on this agent.
        #[arg(long)]
        agent: Option<String>,
        /// Only tasks whose id or name contains this.
        #[arg(long)]
        filter: Option<String>,
    },
    /// One task.
    Task {
        #[command(subcommand)]
        command: TaskCommand,
    },
    /// Container images on an agent.
    Image {
        #[command(subcommand)]
        command: ImageCommand,
    },
    /// Drain, deactivate, reactivate or mark gone an agent.
    Agent {
        #[command(subcommand)]
        command: AgentCommand,
    },
    /// Roles' quotas: guarantees and limits (the v1 operator API's
    /// GET_QUOTA, UPDATE_QUOTA).
    Quota {
        #[command(subcommand)]
        command: QuotaCommand,
    },
    /// Roles' weights (GET_WEIGHTS, UPDATE_WEIGHTS).
    Weights {
        #[command(subcommand)]
        command: WeightsCommand,
    },
    /// Run a shell command as K tasks, with a progress bar (as agora-execute).
    Execute(ExecuteArgs),
    /// Start a master and N agents on 127.0.0.1 (as agora-local).
    #[cfg(feature = "local")]
    Local(LocalArgs),
}

#[derive(Subcommand, Debug)]
enum AgentCommand {
    /// No new tasks; the agent's tasks are killed after the grace period
    /// (at once without one); then it is DRAINED.
    Drain {
        /// The agent's id.
        agent_id: String,
        /// How long tasks may run on before they are killed (e.g. 30s).
        #[arg(long, value_parser = parse_duration)]
        grace: Option<Duration>,
        /// Mark the agent gone once it is drained.
        #[arg(long)]
        mark_gone: bool,
    },
    /// No offers of the agent's resources; its tasks go on.
    Deactivate {
        /// The agent's id.
        agent_id: String,
    },
    /// Offered again (ends a drain or a deactivation).
    Reactivate {
        /// The agent's id.
        agent_id: String,
    },
    /// The agent's tasks end (TASK_GONE_BY_OPERATOR) and it is refused
    /// from then on.
    MarkGone {
        /// The agent's id.
        agent_id: String,
    },
}

#[derive(Subcommand, Debug)]
enum QuotaCommand {
    /// Every role's quota.
    Get,
    /// Set a role's quota (neither --guarantee nor --limit: remove it).
    Set {
        /// The role.
        role: String,
        /// Guaranteed resources, NAME:VALUE;… (cpus, mem, disk, gpus).
        #[arg(long)]
        guarantee: Option<String>,
        /// Most the role is allocated, NAME:VALUE;… (0 is a limit too).
        #[arg(long)]
        limit: Option<String>,
        /// Skip the check that guarantees fit in the cluster.
        #[arg(long)]
        force: bool,
    },
}

#[derive(Subcommand, Debug)]
enum WeightsCommand {
    /// The roles whose weight was set.
    Get,
    /// Set weights: ROLE=WEIGHT …
    Set {
        #[arg(required = true)]
        weights: Vec<String>,
    },
}

#[derive(Subcommand, Debug)]
enum TaskCommand {
    /// Print a task's stdout (or --file stderr) from its sandbox.
    Log {
        /// The task's id.
        task_id: String,
        /// The task's framework, when several have a task of that id.
        #[arg(long)]
        framework: Option<String>,
        /// Sandbox file to read.
        #[arg(long, default_value = "stdout")]
        file: String,
        /// Keep printing output until the task ends.
        #[arg(long, short)]
        follow: bool,
    },
}

#[derive(Subcommand, Debug)]
enum ImageCommand {
    /// Import a `docker save` or OCI-layout tarball into an agent's image
    /// store (for hosts without a registry); tasks then name its images.
    Import {
        /// The archive.
        file: PathBuf,
        /// The agent, HOST:PORT (its --listen address).
        #[arg(long)]
        agent: String,
    },
}

#[derive(ClapArgs, Debug)]
struct JobArgs {
    /// Shell command each task runs.
    #[arg(long)]
    command: String,
    /// Number of tasks.
    #[arg(long, default_value_t = 1)]
    instances: usize,
    /// Resources of each task, in Mesos syntax.
    #[arg(long, default_value = "cpus:0.1;mem:32", value_parser = Resources::parse)]
    resources: Resources,
    /// Give up after this long (e.g. 10m).
    #[arg(long, value_parser = parse_duration)]
    timeout: Option<Duration>,
    /// Print every status update above the progress bar.
    #[arg(long, short)]
    verbose: bool,
}

#[derive(ClapArgs, Debug)]
struct ExecuteArgs {
    #[command(flatten)]
    job: JobArgs,
    /// Framework name; tasks are NAME-0 .. NAME-(K-1).
    #[arg(long, default_value = "agora-execute")]
    name: String,
    /// Role to run in.
    #[arg(long)]
    role: Option<String>,
    /// Ask agents to checkpoint the tasks.
    #[arg(long)]
    checkpoint: bool,
    /// How long the master keeps the tasks if this process goes away.
    #[arg(long, default_value = "0s", value_parser = parse_duration)]
    failover_timeout: Duration,
    /// Take over this existing framework (scheduler failover).
    #[arg(long)]
    framework_id: Option<String>,
    /// Append every launch and status update to this JSON-lines file.
    #[arg(long)]
    ledger: Option<PathBuf>,
    /// Durable record of launched and finished instances (see agora-execute).
    #[arg(long)]
    state_file: Option<PathBuf>,
}

#[cfg(feature = "local")]
#[derive(ClapArgs, Debug)]
struct LocalArgs {
    /// Number of agents.
    #[arg(long, default_value_t = 3)]
    agents: usize,
    /// Resources of each agent, in Mesos syntax.
    #[arg(long, default_value = "cpus:4;mem:4096;disk:16384;ports:[31000-32000]", value_parser = Resources::parse)]
    agent_resources: Resources,
    /// Master address (default: 127.0.0.1 on a free port).
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: std::net::SocketAddr,
    /// Work directory (default: a new temp directory, removed on exit).
    #[arg(long)]
    work_dir: Option<PathBuf>,
    /// Run this shell command as a job, then exit with its result.
    #[arg(long)]
    command: Option<String>,
    /// Number of tasks of the job.
    #[arg(long, default_value_t = 1)]
    instances: usize,
    /// Resources of each task of the job.
    #[arg(long, default_value = "cpus:0.1;mem:32", value_parser = Resources::parse)]
    resources: Resources,
    /// Give up on the job after this long.
    #[arg(long, default_value = "10m", value_parser = parse_duration)]
    timeout: Duration,
    /// Print every status update of the job.
    #[arg(long, short)]
    verbose: bool,
    /// TLS everywhere, with a throwaway CA made in the work directory.
    #[arg(long)]
    tls: bool,
}

fn main() -> ExitCode {
    // `agora local` starts agents that fork this binary as the command executor.
    #[cfg(feature = "local")]
    if std::env::args().nth(1).as_deref() == Some(COMMAND_EXECUTOR_ARG) {
        return agora_executor::command::run();
    }
    let cli = Cli::parse();
    init_logging(cli.log_json);
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("agora: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(code) => code,
        // `agora tasks | head`: the reader went away; not an error.
        Err(e)
            if e.chain().any(|c| {
                c.downcast_ref::<std::io::Error>()
                    .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
            }) =>
        {
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("agora: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn query(pairs: &[(&str, &Option<String>)]) -> String {
    pairs
        .iter()
        .filter_map(|(k, v)| {
            v.as_deref()
                .map(|v| format!("{k}={}", agora_cli::encode(v)))
        })
        .collect::<Vec<_>>()
        .join("&")
}

async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    let credential =
        agora_proto::Credential::from_flags(cli.principal.clone(), cli.secret_file.as_deref())
            .map_err(anyhow::Error::msg)?;
    let tls = cli.tls.options().client()?;
    match cli.command {
        Command::Agents { filter } => {
            let master = master(&cli.master, credential.as_ref(), tls.as_ref()).await?;
            let items = list_all(&master, "/api/v1/agents", &query(&[("q", &filter)])).await?;
            print_items(&items, AGENT_COLUMNS, cli.json)?;
        }
        Command::Frameworks { filter } => {
            let master = master(&cli.master, credential.as_ref(), tls.as_ref()).await?;
            let items = list_all(&master, "/api/v1/frameworks", &query(&[("q", &filter)])).await?;
            print_items(&items, FRAMEWORK_COLUMNS, cli.json)?;
        }
        Command::Tasks {
            state,
            framework,
            agent,
            filter,
        } => {
            let master = master(&cli.master, credential.as_ref(), tls.as_ref()).await?;
            let q = query(&[
                ("state", &state),
                ("framework_id", &framework),
                ("agent_id", &agent),
                ("q", &filter),
            ]);
            let items = list_all(&master, "/api/v1/tasks", &q).await?;
            print_items(&items, TASK_COLUMNS, cli.json)?;
        }
        Command::Task {
            command:
                TaskCommand::Log {
                    task_id,
                    framework,
                    file,
                    follow,
                },
        } => {
            let master = master(&cli.master, credential.as_ref(), tls.as_ref()).await?;
            task_log(&master, &task_id, framework.as_deref(), &file, follow).await?;
        }
        Command::Image {
            command: ImageCommand::Import { file, agent },
        } => {
            let imported =
                agora_cli::import_image(&agent, &file, credential.as_ref(), tls.as_ref()).await?;
            if cli.json {
                println!("{imported}");
            } else {
                for image in imported["images"].as_array().into_iter().flatten() {
                    let names: Vec<&str> = image["names"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter_map(|n| n.as_str())
                        .collect();
                    println!(
                        "imported {} ({} layers)",
                        if names.is_empty() {
                            image["digest"]
                                .as_str()
                                .unwrap_or("an unnamed image")
                                .to_string()
                        } else {
                            names.join(", ")
                        },
                        image["layers"]
                    );
                }
            }
        }
        Command::Agent { command } => {
            let (agent_id, action) = match command {
                AgentCommand::Drain {
                    agent_id,
                    grace,
                    mark_gone,
                } => (agent_id, AgentAction::Drain { grace, mark_gone }),
                AgentCommand::Deactivate { agent_id } => (agent_id, AgentAction::Deactivate),
                AgentCommand::Reactivate { agent_id } => (agent_id, AgentAction::Reactivate),
                AgentCommand::MarkGone { agent_id } => (agent_id, AgentAction::MarkGone),
            };
            let master = master(&cli.master, credential.as_ref(), tls.as_ref()).await?;
            agent_action(&master, &agent_id, &action).await?;
            println!("agent {agent_id}: {action:?} accepted");
        }
        Command::Quota { command } => {
            let master = master(&cli.master, credential.as_ref(), tls.as_ref()).await?;
            match command {
                QuotaCommand::Get => print_items(
                    &agora_cli::quota_get(&master).await?,
                    QUOTA_COLUMNS,
                    cli.json,
                )?,
                QuotaCommand::Set {
                    role,
                    guarantee,
                    limit,
                    force,
                } => {
                    agora_cli::quota_set(
                        &master,
                        &role,
                        guarantee.as_deref(),
                        limit.as_deref(),
                        force,
                    )
                    .await?
                }
            }
        }
        Command::Weights { command } => {
            let master = master(&cli.master, credential.as_ref(), tls.as_ref()).await?;
            match command {
                WeightsCommand::Get => print_items(
                    &agora_cli::weights_get(&master).await?,
                    WEIGHT_COLUMNS,
                    cli.json,
                )?,
                WeightsCommand::Set { weights } => {
                    agora_cli::weights_set(&master, &weights).await?
                }
            }
        }
        Command::Execute(args) => {
            let opts = ExecuteOptions {
                name: args.name,
                resources: args.job.resources,
                role: args.role,
                checkpoint: args.checkpoint,
                failover_timeout: args.failover_timeout.as_secs_f64(),
                timeout: args.job.timeout,
                framework_id: args.framework_id.map(FrameworkId::new),
                ledger: args.ledger,
                state_file: args.state_file,
                credential,
                tls,
                ..ExecuteOptions::new(cli.master.clone(), args.job.command, args.job.instances)
            };
            return job(opts, args.job.verbose, cli.json).await;
        }
        #[cfg(feature = "local")]
        Command::Local(args) => return local(args, credential, cli.json).await,
    }
    Ok(ExitCode::SUCCESS)
}

/// Runs a job and prints its summary (or the report as JSON).
async fn job(opts: ExecuteOptions, verbose: bool, json: bool) -> anyhow::Result<ExitCode> {
    let instances = opts.instances;
    let report = execute_with_progress(opts, verbose).await?;
    if json {
        let terminal: serde_json::Map<String, serde_json::Value> = report
            .terminal
            .iter()
            .map(|(s, n)| (s.to_string(), (*n).into()))
            .collect();
        println!(
            "{}",
            serde_json::json!({
                "framework_id": report.framework_id,
                "instances": instances,
                "finished": report.finished,
                "terminal": terminal,
                "updates": report.updates,
                "elapsed_seconds": report.elapsed.as_secs_f64(),
                "error": report.error,
            })
        );
    } else {
        println!("{}", report.summary(instances));
    }
    Ok(if report.success(instances) {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

#[cfg(feature = "local")]
async fn local(
    args: LocalArgs,
    credential: Option<agora_proto::Credential>,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let (work_dir, remove_after) = match &args.work_dir {
        Some(dir) => (dir.clone(), false),
        None => (
            std::env::temp_dir().join(format!("agora-local-{}", std::process::id())),
            true,
        ),
    };
    let mut opts = LocalOptions::new(args.agents, work_dir.clone())?;
    opts.agent_resources = args.agent_resources.clone();
    opts.master_listen = args.listen;
    opts.credential = credential;
    opts.tls = args.tls;
    let cluster = LocalCluster::start(opts).await?;
    let master = cluster.master_addr.to_string();
    let result = match &args.command {
        Some(command) => {
            let opts = ExecuteOptions {
                name: "agora-local".to_string(),
                resources: args.resources.clone(),
                timeout: Some(args.timeout),
                credential: cluster.credential.clone(),
                tls: cluster.tls.as_ref().map(|(_, client)| client.clone()),
                ..ExecuteOptions::new(master.clone(), command.clone(), args.instances)
            };
            job(opts, args.verbose, json).await
        }
        None => {
            println!("master: {master} (web UI: http://{master}/)");
            for (i, addr) in cluster.agent_addrs.iter().enumerate() {
                println!("agent {i}: {addr}");
            }
            println!("work dir: {}", work_dir.display());
            println!("try: agora --master {master} execute --command 'echo hi' --instances 5");
            println!("Ctrl-C to stop");
            wait_for_stop().await;
            Ok(ExitCode::SUCCESS)
        }
    };
    cluster.shutdown().await;
    if remove_after {
        let _ = std::fs::remove_dir_all(&work_dir);
    }
    result
}

/// Ctrl-C or SIGTERM.
#[cfg(feature = "local")]
async fn wait_for_stop() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term => {}
    }
}
