//! `agora-minijob`: a mini job runtime on `agora-workers` (see
//! `agora_examples::minijob`). Runs S subtasks in workers placed near
//! their inputs; exits 0 only when every subtask finished.
//!
//! `agora-minijob worker …` is the worker the runtime launches.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use agora_examples::cli::{init_logging, parse_duration};
use agora_examples::minijob::{self, MinijobOptions, RuntimeAddress};
use agora_proto::Resources;
use anyhow::Context;
use clap::{Parser, Subcommand};

/// Run a job of S subtasks in workers placed by the locality of their inputs.
#[derive(Parser, Debug)]
#[command(name = "agora-minijob", version)]
struct Args {
    #[command(subcommand)]
    mode: Option<Mode>,
    /// Master address, HOST:PORT (or etcd://HOST:PORT/PREFIX, feature etcd).
    #[arg(long)]
    master: Option<String>,
    /// Number of subtasks.
    #[arg(long, default_value_t = 10)]
    subtasks: usize,
    /// Slots per worker (subtasks a worker runs at once).
    #[arg(long, default_value_t = 2)]
    slots_per_worker: usize,
    /// Resources of each worker, Mesos syntax.
    #[arg(long, default_value = "cpus:0.1;mem:32", value_parser = Resources::parse)]
    worker_resources: Resources,
    /// Wait per locality level (HOST → RACK → ANY) before taking a worse placement.
    #[arg(long, default_value = "3s", value_parser = parse_duration)]
    locality_wait: Duration,
    /// Inputs: lines `subtask host[,host…]`; default: spread over the agents' hosts.
    #[arg(long)]
    inputs: Option<PathBuf>,
    /// How long each subtask runs.
    #[arg(long, default_value = "100ms", value_parser = parse_duration)]
    subtask_duration: Duration,
    /// Durable worker store (file mode): a restarted runtime recovers its workers.
    #[arg(long)]
    state_file: Option<PathBuf>,
    /// Give up after this long.
    #[arg(long, default_value = "5m", value_parser = parse_duration)]
    timeout: Duration,
    /// How long the master keeps the workers if the runtime goes away.
    #[arg(long, default_value = "7d", value_parser = parse_duration)]
    failover_timeout: Duration,
    /// Run as a leader contender on etcd (HOST:PORT or http://HOST:PORT; feature etcd).
    #[arg(long)]
    etcd: Option<String>,
    /// Key prefix of the election and the worker store in etcd.
    #[arg(long, default_value = "/agora-minijob")]
    etcd_prefix: String,
    /// Lease of the runtime's leadership.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    etcd_lease_ttl: Duration,
    /// Print a JSON summary at the end.
    #[arg(long)]
    json: bool,
}

#[derive(Subcommand, Debug)]
enum Mode {
    /// Run as a worker (launched by the runtime).
    Worker {
        /// The runtime's HOST:PORT.
        #[arg(long)]
        runtime: Option<String>,
        /// Follow the runtime leader in etcd at HOST:PORT instead.
        #[arg(long)]
        etcd: Option<String>,
        /// Key prefix of the election.
        #[arg(long, default_value = "/agora-minijob")]
        etcd_prefix: String,
        /// Slots this worker offers.
        #[arg(long, default_value_t = 2)]
        slots: usize,
    },
}

fn main() -> ExitCode {
    let args = Args::parse();
    init_logging(false);
    match run(args) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("agora-minijob: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: Args) -> anyhow::Result<bool> {
    if let Some(Mode::Worker {
        runtime,
        etcd,
        etcd_prefix,
        slots,
    }) = args.mode
    {
        #[cfg(not(feature = "etcd"))]
        let _ = etcd_prefix;
        let address = match (runtime, etcd) {
            (Some(r), _) => RuntimeAddress::Fixed(r),
            #[cfg(feature = "etcd")]
            (None, Some(e)) => {
                RuntimeAddress::Etcd(e.trim_start_matches("http://").to_string(), etcd_prefix)
            }
            _ => anyhow::bail!("give --runtime HOST:PORT (or --etcd with the etcd feature)"),
        };
        minijob::run_worker(address, slots)?;
        return Ok(true);
    }
    let master = args.master.clone().context("--master is required")?;
    let exe = std::env::current_exe().context("locating this executable")?;
    let opts = MinijobOptions {
        master,
        subtasks: args.subtasks,
        slots_per_worker: args.slots_per_worker,
        worker_resources: args.worker_resources.clone(),
        locality_wait: args.locality_wait,
        inputs: args.inputs.clone(),
        subtask_duration: args.subtask_duration,
        state_file: args.state_file.clone(),
        worker_command: vec![exe.display().to_string(), "worker".into()],
        timeout: args.timeout,
        etcd: args.etcd.clone(),
        etcd_prefix: args.etcd_prefix.clone(),
        etcd_lease_ttl: args.etcd_lease_ttl,
        failover_timeout: args.failover_timeout,
    };
    let runtime = tokio::runtime::Runtime::new()?;
    let summary = runtime.block_on(async {
        if opts.etcd.is_some() {
            #[cfg(feature = "etcd")]
            return minijob::run_elected(opts).await;
            #[cfg(not(feature = "etcd"))]
            anyhow::bail!("this agora-minijob was built without etcd support (feature `etcd`)");
        }
        minijob::run(opts).await.map(Some)
    })?;
    let Some(summary) = summary else {
        return Ok(true);
    };
    if args.json {
        println!("{}", serde_json::to_string(&summary)?);
    } else {
        println!(
            "finished {}/{} subtasks; {} workers started, {} lost; locality {:?}; time to workers p50 {:.0} ms, p99 {:.0} ms",
            summary.finished,
            summary.subtasks,
            summary.workers_started,
            summary.workers_lost,
            summary.locality,
            summary.time_to_workers_ms.p50,
            summary.time_to_workers_ms.p99
        );
    }
    Ok(summary.finished == summary.subtasks)
}
