//! `bench-workers`: how fast `agora-workers` gets N workers running.
//!
//! Starts a local cluster (one master and five agents with distinct host
//! names on two racks, in this process), warms it with one small round,
//! then for each N requests N workers through a [`WorkerDriver`] at
//! once, each preferring one of the five hosts in turn, and measures:
//!
//! - the time from the first `request_worker` to the last worker
//!   `TASK_RUNNING` (the target: 500 in under 2 s);
//! - per worker, request → future completed (placement) and future →
//!   running (launch), p50/p99: where the time goes;
//! - the locality hit rate (LOCAL or HOST) under load.
//!
//! Figures are printed next to their targets; nothing here is a test.

use std::collections::HashMap;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agora_examples::local::{LocalCluster, LocalOptions, COMMAND_EXECUTOR_ARG};
use agora_proto::Resources;
use agora_workers::{
    DriverOptions, FinalStatus, Locality, MemoryStore, WorkerDriver, WorkerEventHandler,
    WorkerHandle, WorkerId, WorkerSpec,
};
use clap::Parser;
use tokio::time::Instant;

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Time N workers from request to running on a warm local cluster.
#[derive(Parser, Debug)]
#[command(name = "bench-workers")]
struct Args {
    /// Worker counts to measure, in order.
    #[arg(long, value_delimiter = ',', default_value = "50,500")]
    workers: Vec<usize>,
    /// Agents in the local cluster.
    #[arg(long, default_value_t = 5)]
    agents: usize,
    /// Locality wait per level.
    #[arg(long, default_value = "1s", value_parser = agora_examples::cli::parse_duration)]
    locality_wait: Duration,
    /// Target for the largest N: all running within this.
    #[arg(long, default_value = "2s", value_parser = agora_examples::cli::parse_duration)]
    target: Duration,
}

/// Records when each worker reported running.
#[derive(Default)]
struct Clock {
    running: Mutex<HashMap<WorkerId, Instant>>,
}

impl WorkerEventHandler for Clock {
    fn on_worker_running(&self, worker: &WorkerHandle) {
        if let Ok(mut r) = self.running.lock() {
            r.insert(worker.id.clone(), Instant::now());
        }
    }
}

struct Round {
    n: usize,
    total: Duration,
    placed: Vec<f64>,
    launched: Vec<f64>,
    end_to_end: Vec<f64>,
    local_or_host: usize,
}

fn main() -> ExitCode {
    if std::env::args().nth(1).as_deref() == Some(COMMAND_EXECUTOR_ARG) {
        return agora_executor::command::run();
    }
    let args = Args::parse();
    agora_examples::cli::init_logging(false);
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("bench-workers: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(bench(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench-workers: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn bench(args: Args) -> anyhow::Result<()> {
    let dir = tempfile::Builder::new()
        .prefix("bench-workers-")
        .tempdir()?;
    let mut options = LocalOptions::new(args.agents, dir.path().to_path_buf())?;
    options.agent_resources = Resources::parse("cpus:64;mem:65536;disk:16384;ports:[31000-32000]")?;
    options.hostname_prefix = Some("h".into());
    let cluster = LocalCluster::start(options).await?;
    let master = cluster.master_addr.to_string();
    println!(
        "bench-workers: {} agents (hosts h0..h{}, racks r0/r1), locality wait {:?}",
        args.agents,
        args.agents - 1,
        args.locality_wait
    );
    // Warm-up: the first forks and page-ins are not what we measure.
    round(&master, &args, 10, &cluster).await?;
    let mut results = Vec::new();
    for &n in &args.workers {
        results.push(round(&master, &args, n, &cluster).await?);
    }
    println!();
    println!(
        "{:>6} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>9}",
        "N", "all (s)", "/s", "place p50", "place p99", "run p50", "run p99", "e2e p99", "loc|host"
    );
    for r in &results {
        println!(
            "{:>6} {:>10.3} {:>10.0} {:>8.0}ms {:>8.0}ms {:>8.0}ms {:>8.0}ms {:>8.0}ms {:>8.1}%",
            r.n,
            r.total.as_secs_f64(),
            r.n as f64 / r.total.as_secs_f64(),
            pct(&r.placed, 0.5),
            pct(&r.placed, 0.99),
            pct(&r.launched, 0.5),
            pct(&r.launched, 0.99),
            pct(&r.end_to_end, 0.99),
            100.0 * r.local_or_host as f64 / r.n as f64
        );
    }
    if let Some(r) = results.iter().max_by_key(|r| r.n) {
        let ratio = r.total.as_secs_f64() / args.target.as_secs_f64();
        println!(
            "target: {} workers running in under {:?}: measured {:.3} s, {:.2}× the target ({})",
            r.n,
            args.target,
            r.total.as_secs_f64(),
            ratio,
            if ratio <= 1.0 { "met" } else { "missed" }
        );
        println!(
            "compare: YARN heartbeat 0.5 s per allocation round; Flink on Mesos gathered offers for 5 s"
        );
    }
    cluster.shutdown().await;
    Ok(())
}

async fn round(
    master: &str,
    args: &Args,
    n: usize,
    cluster: &LocalCluster,
) -> anyhow::Result<Round> {
    let clock = Arc::new(Clock::default());
    let mut options = DriverOptions::new(master, format!("bench-workers-{n}"));
    options.locality_wait = args.locality_wait;
    let driver =
        WorkerDriver::initialize(options, Box::new(MemoryStore::default()), clock.clone())?;
    let resources = Resources::parse("cpus:0.01;mem:8")?;
    let start = Instant::now();
    let futures: Vec<_> = (0..n)
        .map(|i| {
            let spec = WorkerSpec::new("bench", resources.clone(), "sleep 600")
                .prefer_host(format!("h{}", i % args.agents), 1.0);
            driver.request_worker(spec)
        })
        .collect();
    let mut handles = Vec::with_capacity(n);
    let mut placed = Vec::with_capacity(n);
    for f in futures {
        let handle = f.await?;
        placed.push((handle.clone(), start.elapsed()));
        handles.push(handle);
    }
    let deadline = start + Duration::from_secs(120);
    loop {
        let done = clock.running.lock().map(|r| r.len()).unwrap_or(0);
        if done >= n {
            break;
        }
        if Instant::now() > deadline {
            anyhow::bail!("only {done} of {n} workers running after 120 s");
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let running = clock.running.lock().map(|r| r.clone()).unwrap_or_default();
    let total = running
        .values()
        .max()
        .map(|t| *t - start)
        .unwrap_or_default();
    let mut r = Round {
        n,
        total,
        placed: Vec::new(),
        launched: Vec::new(),
        end_to_end: Vec::new(),
        local_or_host: 0,
    };
    for (handle, at) in placed {
        let ran = running.get(&handle.id).map(|t| *t - start).unwrap_or(total);
        r.placed.push(at.as_secs_f64() * 1000.0);
        r.launched
            .push((ran.saturating_sub(at)).as_secs_f64() * 1000.0);
        r.end_to_end.push(ran.as_secs_f64() * 1000.0);
        if matches!(handle.locality, Locality::Local | Locality::Host) {
            r.local_or_host += 1;
        }
    }
    println!(
        "N={n}: all running after {:.3} s; locality {:.1}% local|host",
        total.as_secs_f64(),
        100.0 * r.local_or_host as f64 / n as f64
    );
    driver
        .deregister(FinalStatus::Succeeded, Some("bench round done".into()))
        .await?;
    // The next round starts on an idle cluster.
    wait_idle(cluster).await;
    Ok(r)
}

/// Waits until the master lists no live task.
async fn wait_idle(cluster: &LocalCluster) {
    let deadline = Instant::now() + Duration::from_secs(60);
    let master = agora_client::MasterClient::new(cluster.master_addr);
    while Instant::now() < deadline {
        if let Ok(state) = master.state().await {
            let live = state["frameworks"]
                .as_array()
                .map(|f| {
                    f.iter()
                        .map(|f| f["tasks"].as_array().map_or(0, |t| t.len()))
                        .sum::<usize>()
                })
                .unwrap_or(0);
            if live == 0 {
                return;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn pct(values: &[f64], q: f64) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    v[((v.len() as f64 - 1.0) * q).round() as usize]
}
