//! `agora-execute`: run K copies of a shell command on an Agora cluster and
//! print every status update. Exits 0 only when all K finished.
//!
//! With `--state-file` (and `--failover-timeout`) it survives its own
//! death: run it again with the same state file (and `--framework-id`) and
//! it takes the framework over, reconciles what it had launched and
//! launches only the rest. `--ledger` records everything it saw.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use agora_examples::cli::{init_logging, parse_duration};
use agora_examples::execute::{execute, ExecuteOptions};
use agora_proto::{FrameworkId, Resources};
use clap::Parser;

/// Run a shell command as K tasks on an Agora cluster.
#[derive(Parser, Debug)]
#[command(name = "agora-execute", version)]
struct Args {
    /// Master address, HOST:PORT, or etcd://HOST:PORT/PREFIX to follow
    /// the leading master of a high-availability cluster (feature `etcd`).
    #[arg(long)]
    master: String,
    /// Framework name; tasks are NAME-0 .. NAME-(K-1).
    #[arg(long, default_value = "agora-execute")]
    name: String,
    /// Shell command each task runs.
    #[arg(long)]
    command: String,
    /// Resources of each task, in Mesos syntax.
    #[arg(long, default_value = "cpus:0.1;mem:32", value_parser = Resources::parse)]
    resources: Resources,
    /// Number of tasks.
    #[arg(long, default_value_t = 1)]
    instances: usize,
    /// Role to run in.
    #[arg(long)]
    role: Option<String>,
    /// Ask agents to checkpoint the tasks (survive agent restarts).
    #[arg(long)]
    checkpoint: bool,
    /// How long the master keeps the tasks if this process goes away.
    #[arg(long, default_value = "0s", value_parser = parse_duration)]
    failover_timeout: Duration,
    /// Give up after this long (e.g. 10m).
    #[arg(long, value_parser = parse_duration)]
    timeout: Option<Duration>,
    /// Take over this existing framework (scheduler failover) instead of
    /// registering a new one.
    #[arg(long)]
    framework_id: Option<String>,
    /// Append every launch and status update received to this file, one
    /// JSON object per line.
    #[arg(long)]
    ledger: Option<PathBuf>,
    /// Durable record of launched and finished instances; a restart with
    /// the same file launches only what was never launched.
    #[arg(long)]
    state_file: Option<PathBuf>,
    /// Reconcile launched instances silent for this long.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    reconcile_interval: Duration,
    /// Principal to authenticate as (with --secret-file or AGORA_SECRET).
    #[arg(long, env = "AGORA_PRINCIPAL")]
    principal: Option<String>,
    /// File holding the principal's secret.
    #[arg(long)]
    secret_file: Option<PathBuf>,
    #[command(flatten)]
    tls: agora_net::TlsFlags,
    /// Print only the summary.
    #[arg(long)]
    quiet: bool,
    /// Log as JSON lines.
    #[arg(long)]
    log_json: bool,
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    init_logging(args.log_json);
    let instances = args.instances;
    let credential =
        match agora_proto::Credential::from_flags(args.principal, args.secret_file.as_deref()) {
            Ok(credential) => credential,
            Err(e) => {
                eprintln!("agora-execute: {e}");
                return ExitCode::from(2);
            }
        };
    let tls = match args.tls.options().client() {
        Ok(tls) => tls,
        Err(e) => {
            eprintln!("agora-execute: {e}");
            return ExitCode::from(2);
        }
    };
    let opts = ExecuteOptions {
        master: args.master,
        name: args.name,
        command: args.command,
        resources: args.resources,
        instances,
        role: args.role,
        checkpoint: args.checkpoint,
        failover_timeout: args.failover_timeout.as_secs_f64(),
        timeout: args.timeout,
        print_updates: !args.quiet,
        framework_id: args.framework_id.map(FrameworkId::new),
        ledger: args.ledger,
        state_file: args.state_file,
        reconcile_interval: args.reconcile_interval,
        on_state: None,
        credential,
        tls,
    };
    match execute(opts).await {
        Ok(report) => {
            println!("{}", report.summary(instances));
            if report.success(instances) {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(e) => {
            eprintln!("agora-execute: {e:#}");
            ExitCode::FAILURE
        }
    }
}
