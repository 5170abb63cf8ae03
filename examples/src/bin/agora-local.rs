//! `agora-local`: a master and N agents on 127.0.0.1 in one command.
//!
//! With `--command CMD --instances K` it runs that job (like
//! `agora-execute`) and exits with its result; without, it serves until
//! Ctrl-C and prints the addresses.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use agora_examples::cli::{init_logging, parse_duration};
use agora_examples::execute::{execute, ExecuteOptions};
use agora_examples::local::{LocalCluster, LocalOptions, COMMAND_EXECUTOR_ARG};
use agora_proto::Resources;
use clap::Parser;

// mimalloc rather than the system allocator: the message paths allocate
// and free small buffers per frame (JSON, ids); bench-status-updates runs
// 15-35% faster with it.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Start a local Agora cluster, optionally run one job on it.
#[derive(Parser, Debug)]
#[command(name = "agora-local", version)]
struct Args {
    /// Number of agents.
    #[arg(long, default_value_t = 3)]
    agents: usize,
    /// Resources of each agent, in Mesos syntax.
    #[arg(long, default_value = "cpus:4;mem:4096;disk:16384;ports:[31000-32000]", value_parser = Resources::parse)]
    agent_resources: Resources,
    /// Master address (default: 127.0.0.1 on a free port).
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: std::net::SocketAddr,
    /// Work directory (default: a new directory under the system temp dir,
    /// removed on exit).
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
    /// Turn authentication on with this one principal (secret from
    /// --secret-file or AGORA_SECRET): the master authenticates the job,
    /// the agents and HTTP operators, and they present it.
    #[arg(long, env = "AGORA_PRINCIPAL")]
    principal: Option<String>,
    /// File holding the principal's secret.
    #[arg(long)]
    secret_file: Option<PathBuf>,
    /// TLS everywhere (https://, wss://), with a throwaway CA and
    /// certificates made in the work directory's tls/ (its ca.pem is what
    /// clients trust).
    #[arg(long)]
    tls: bool,
    /// Print only the job's summary.
    #[arg(long)]
    quiet: bool,
    /// Log as JSON lines.
    #[arg(long)]
    log_json: bool,
}

fn main() -> ExitCode {
    if std::env::args().nth(1).as_deref() == Some(COMMAND_EXECUTOR_ARG) {
        return agora_executor::command::run();
    }
    let args = Args::parse();
    init_logging(args.log_json);
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("agora-local: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(serve(args)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("agora-local: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn serve(args: Args) -> anyhow::Result<ExitCode> {
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
    opts.tls = args.tls;
    opts.credential =
        agora_proto::Credential::from_flags(args.principal.clone(), args.secret_file.as_deref())
            .map_err(anyhow::Error::msg)?;
    let cluster = LocalCluster::start(opts).await?;
    let code = match &args.command {
        Some(command) => {
            let report = execute(ExecuteOptions {
                master: cluster.master_addr.to_string(),
                name: "agora-local".to_string(),
                command: command.clone(),
                resources: args.resources.clone(),
                instances: args.instances,
                role: None,
                checkpoint: false,
                // The master lives in this process, so the framework can
                // never outlive it by much: a timeout only lets the
                // scheduler reconnect after a dropped connection (a master
                // starved of CPU for longer than three heartbeats) and
                // carry on with its tasks instead of losing the job.
                failover_timeout: 300.0,
                timeout: Some(args.timeout),
                print_updates: !args.quiet,
                credential: cluster.credential.clone(),
                tls: cluster.tls.as_ref().map(|(_, client)| client.clone()),
                ..ExecuteOptions::new(
                    cluster.master_addr.to_string(),
                    command.clone(),
                    args.instances,
                )
            })
            .await;
            match report {
                Ok(report) => {
                    println!("{}", report.summary(args.instances));
                    if report.success(args.instances) {
                        ExitCode::SUCCESS
                    } else {
                        ExitCode::FAILURE
                    }
                }
                Err(e) => {
                    eprintln!("agora-local: {e:#}");
                    ExitCode::FAILURE
                }
            }
        }
        None => {
            let scheme = if cluster.tls.is_some() {
                "https"
            } else {
                "http"
            };
            println!(
                "master: {} (web: {scheme}://{}/state)",
                cluster.master_addr, cluster.master_addr
            );
            for (i, addr) in cluster.agent_addrs.iter().enumerate() {
                println!("agent {i}: {addr}");
            }
            println!("work dir: {}", work_dir.display());
            let tls_flags = match &cluster.tls {
                Some((options, _)) => format!(
                    " --tls-ca {}",
                    options
                        .ca
                        .as_ref()
                        .map(|p| p.display().to_string())
                        .unwrap_or_default()
                ),
                None => String::new(),
            };
            println!(
                "try: cargo run -p agora-examples --bin agora-execute -- --master {}{tls_flags} --command 'echo hi' --instances 5",
                cluster.master_addr
            );
            println!("Ctrl-C to stop");
            tokio::signal::ctrl_c().await?;
            ExitCode::SUCCESS
        }
    };
    cluster.shutdown().await;
    if remove_after {
        let _ = std::fs::remove_dir_all(&work_dir);
    }
    Ok(code)
}
