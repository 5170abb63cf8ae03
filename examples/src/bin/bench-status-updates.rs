//! `bench-status-updates`: acknowledged status updates per second, end to
//! end: executor → agent (checkpoint) → master → scheduler → acknowledgement
//! back to the agent.
//!
//! One process runs a master and an agent (in-process, on 127.0.0.1
//! ephemeral ports) and a framework (agora-scheduler, implicit
//! acknowledgements, `checkpoint` as asked). The agent forks this same
//! binary as the executor (`bench-status-updates __bench-executor`), which
//! waits for all `--tasks` tasks and then sends `--updates-per-task`
//! updates per task (TASK_RUNNING with data, the last one TASK_FINISHED),
//! round robin over the tasks, keeping at most `--window` updates that the
//! scheduler has not received yet in flight. The scheduler tells the
//! executor how many it has received over a side TCP connection (flow
//! control only; it carries no update).
//!
//! Measured: throughput of updates whose scheduler acknowledgement reached
//! the agent (the agent's `status_updates_acknowledged` counter), latency
//! executor send → scheduler callback, and executor send → agent
//! `ACKNOWLEDGED` (the checkpoint hop), as p50/p99.
//!
//! With `--api both` (the default) each checkpoint mode runs twice, with
//! the framework on the native scheduler SDK and on the Mesos v1 HTTP
//! scheduler API (`--api v1`): SUBSCRIBE as a RecordIO stream in
//! `--codec` (protobuf, mesos-go's default, or json), and one ACKNOWLEDGE
//! POST per update carrying the `Mesos-Stream-Id`, up to
//! `--calls-in-flight` at once on keep-alive connections. The executor
//! stays native (it speaks Agora's executor API whichever API launched
//! it). The table then gives v1 ÷ native against the target ratio 0.8.
//!
//! ```text
//! cargo run --release -p agora-examples --bin bench-status-updates -- --tasks 500 --updates-per-task 100
//! ```

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Condvar, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use agora_examples::bench_api::{self, Action, Api, BenchFramework, Framework, Runs};
use agora_examples::mesos_v1_client as v1c;
use agora_examples::secure::{Secure, Security};
use agora_executor::{Executor, ExecutorDriver};
use agora_mesos_proto::Codec;
use agora_proto::{
    AgentId, CommandInfo, ExecutorId, ExecutorInfo, Filters, FrameworkId, FrameworkInfo,
    MasterInfo, Offer, Resources, Source, TaskId, TaskInfo, TaskState, TaskStatus,
};
use agora_scheduler::{Scheduler, SchedulerDriver};
use anyhow::{bail, Context};
use clap::Parser;

// The allocator the agora-master and agora-agent binaries use.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// First argument of the executor mode.
const EXECUTOR_ARG: &str = "__bench-executor";
/// The throughput the issue asks for.
const TARGET_PER_SEC: f64 = 20_000.0;
/// The Mesos v1 API's updates/s must be at least this share of the
/// native API's in the same checkpoint mode.
const TARGET_V1_RATIO: f64 = 0.8;
/// Issue 15: with TLS and authentication, within 0.8x of plain.
const TARGET_SECURE_RATIO: f64 = 0.8;
const ENV_FEEDBACK: &str = "BENCH_FEEDBACK";
const ENV_TASKS: &str = "BENCH_TASKS";
const ENV_UPDATES: &str = "BENCH_UPDATES";
const ENV_WINDOW: &str = "BENCH_WINDOW";
const ENV_DATA: &str = "BENCH_DATA_BYTES";

/// Benchmark of acknowledged status updates per second.
#[derive(Parser, Debug, Clone)]
#[command(name = "bench-status-updates")]
struct Args {
    /// Concurrent tasks (the agent keeps one update per task in flight).
    #[arg(long, default_value_t = 500)]
    tasks: usize,
    /// Updates each task sends (the last is TASK_FINISHED).
    #[arg(long, default_value_t = 100)]
    updates_per_task: usize,
    /// Most updates sent but not yet received by the scheduler.
    #[arg(long, default_value_t = 2000)]
    window: usize,
    /// Whether the framework checkpoints: on, off, or both (two runs).
    #[arg(long, default_value = "both")]
    checkpoint: String,
    /// Bytes of data in each update.
    #[arg(long, default_value_t = 64)]
    data_bytes: usize,
    /// The agent's --status-update-retry-min for the run.
    #[arg(long, default_value = "10s", value_parser = agora_examples::cli::parse_duration)]
    retry_min: Duration,
    /// Give up after this long.
    #[arg(long, default_value = "300s", value_parser = agora_examples::cli::parse_duration)]
    timeout: Duration,
    /// The scheduler API the framework uses: native (the SDK over
    /// WebSocket), v1 (the Mesos v1 HTTP scheduler API) or both (each
    /// checkpoint mode run with each, side by side, with v1 ÷ native).
    #[arg(long, default_value = "both", value_parser = bench_api::parse_apis)]
    api: bench_api::Apis,
    /// Codec of the v1 API: protobuf (mesos-go's default) or json.
    #[arg(long, default_value = "protobuf", value_parser = bench_api::parse_codec)]
    codec: Codec,
    /// v1 API: most calls (ACKNOWLEDGE…) in flight at once.
    #[arg(long, default_value_t = v1c::DEFAULT_CALLS_IN_FLIGHT)]
    calls_in_flight: usize,
    /// v1 API: the HTTP of its calls: 1.1-pipelined (calls written back
    /// to back on keep-alive connections, up to 128 unanswered on each),
    /// 1.1 (as most Mesos clients speak it: a keep-alive connection per
    /// call in flight) or 2 (cleartext, every call a stream of one
    /// connection).
    #[arg(long, default_value = "1.1-pipelined")]
    http: v1c::HttpVersion,
    /// plain, secure (mutual TLS with a throwaway CA, and authentication
    /// of the framework, the agent and operators) or both (each run both
    /// ways, with secure ÷ plain against 0.8). Secure runs use the native
    /// API only.
    #[arg(long, default_value = "plain", value_parser = agora_examples::secure::parse_security)]
    security: std::vec::Vec<Security>,
    /// Run every mode this many times, the compared runs (APIs, plain
    /// and secure) taking turns; the ratios compare the medians, with the
    /// range over the runs beside them.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    repeat: u32,
}

/// One run's figures.
#[derive(Debug, Clone)]
struct Figures {
    api: Api,
    security: Security,
    checkpoint: bool,
    total: u64,
    secs: f64,
    to_scheduler: Percentiles,
    agent_ack: Percentiles,
    wal_syncs: u64,
}

#[derive(Debug, Clone, Copy, Default)]
struct Percentiles {
    p50_us: u64,
    p99_us: u64,
    max_us: u64,
}

fn main() -> ExitCode {
    if std::env::args().nth(1).as_deref() == Some(EXECUTOR_ARG) {
        return executor_main();
    }
    let args = Args::parse();
    agora_examples::cli::init_logging(false);
    let modes: Vec<bool> = match args.checkpoint.as_str() {
        "on" => vec![true],
        "off" => vec![false],
        "both" => vec![true, false],
        other => {
            eprintln!("bench-status-updates: --checkpoint must be on, off or both, not {other:?}");
            return ExitCode::FAILURE;
        }
    };
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("bench-status-updates: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut results = Vec::new();
    let rounds = args.repeat;
    for &checkpoint in &modes {
        for round in 1..=rounds {
            for &security in &args.security {
                for &api in &args.api.0 {
                    if security == Security::Secure && api == Api::V1 {
                        continue;
                    }
                    eprintln!(
                        "running {} updates, checkpoint {}, {api} API, {security} (run {round} of {rounds})",
                        args.tasks * args.updates_per_task,
                        if checkpoint { "on" } else { "off" }
                    );
                    match runtime.block_on(run(&args, checkpoint, api, security)) {
                        Ok(f) => results.push(f),
                        Err(e) => {
                            eprintln!("bench-status-updates: {e:#}");
                            return ExitCode::FAILURE;
                        }
                    }
                }
            }
        }
    }
    println!(
        "\nstatus updates end to end: {} tasks x {} updates, window {}, {} B data; v1 codec {}, {} calls in flight",
        args.tasks,
        args.updates_per_task,
        args.window,
        args.data_bytes,
        args.codec.media_type(),
        args.calls_in_flight
    );
    println!(
        "{:<6} {:<9} {:<10} {:>9} {:>8} {:>12} {:>9} {:>10} {:>10} {:>10} {:>10} {:>10} {:>12}",
        "api",
        "security",
        "checkpoint",
        "updates",
        "secs",
        "acked/s",
        "vs 20k",
        "e2e p50",
        "e2e p99",
        "ack p50",
        "ack p99",
        "fsyncs",
        "updates/sync"
    );
    for f in &results {
        let rate = f.total as f64 / f.secs;
        println!(
            "{:<6} {:<9} {:<10} {:>9} {:>8.2} {:>12.0} {:>8.2}x {:>8.2}ms {:>8.2}ms {:>8.2}ms {:>8.2}ms {:>10} {:>12.1}",
            f.api,
            f.security,
            if f.checkpoint { "on" } else { "off" },
            f.total,
            f.secs,
            rate,
            rate / TARGET_PER_SEC,
            ms(f.to_scheduler.p50_us),
            ms(f.to_scheduler.p99_us),
            ms(f.agent_ack.p50_us),
            ms(f.agent_ack.p99_us),
            f.wal_syncs,
            if f.wal_syncs > 0 {
                f.total as f64 / f.wal_syncs as f64
            } else {
                0.0
            },
        );
    }
    println!("(e2e = executor send -> scheduler callback; ack = executor send -> agent ACKNOWLEDGED; max e2e {:.1} ms)",
        results.iter().map(|f| ms(f.to_scheduler.max_us)).fold(0.0, f64::max));
    // The median over a mode's runs, and their range.
    let rate_of = |api: Api, checkpoint: bool, security: Security| {
        Runs::of(
            results
                .iter()
                .filter(|f| f.api == api && f.checkpoint == checkpoint && f.security == security)
                .map(|f| f.total as f64 / f.secs)
                .collect(),
        )
    };
    if args.security.len() == 2 && args.api.0.contains(&Api::Native) {
        println!(
            "\ntls+auth ÷ plain (acked/s, native API; medians of {rounds} run(s), range in brackets), target ≥ {TARGET_SECURE_RATIO}:\n{:<10} {:>22} {:>22} {:>7} {:>7}",
            "checkpoint", "plain/s", "secure/s", "ratio", "target"
        );
        for &checkpoint in &modes {
            let (Some(plain), Some(secure)) = (
                rate_of(Api::Native, checkpoint, Security::Plain),
                rate_of(Api::Native, checkpoint, Security::Secure),
            ) else {
                continue;
            };
            let ratio = secure.median / plain.median;
            println!(
                "{:<10} {:>22} {:>22} {ratio:>7.2} {:>7}",
                if checkpoint { "on" } else { "off" },
                plain.to_string(),
                secure.to_string(),
                bench_api::verdict(ratio >= TARGET_SECURE_RATIO)
            );
        }
    }
    if args.api.0.contains(&Api::Native)
        && args.api.0.contains(&Api::V1)
        && args.security.contains(&Security::Plain)
    {
        let rate_of = |api: Api, checkpoint: bool| rate_of(api, checkpoint, Security::Plain);
        println!(
            "\nv1 ÷ native (acked/s; medians of {rounds} run(s), range in brackets), target ≥ {TARGET_V1_RATIO}:\n{:<10} {:>22} {:>22} {:>7} {:>7}",
            "checkpoint", "native/s", "v1/s", "ratio", "target"
        );
        let mut met = true;
        for &checkpoint in &modes {
            let (Some(native), Some(v1)) = (
                rate_of(Api::Native, checkpoint),
                rate_of(Api::V1, checkpoint),
            ) else {
                continue;
            };
            let ratio = v1.median / native.median;
            met &= ratio >= TARGET_V1_RATIO;
            println!(
                "{:<10} {:>22} {:>22} {ratio:>7.2} {:>7}",
                if checkpoint { "on" } else { "off" },
                native.to_string(),
                v1.to_string(),
                bench_api::verdict(ratio >= TARGET_V1_RATIO)
            );
        }
        println!(
            "v1 ÷ native ≥ {TARGET_V1_RATIO} in every mode: {}",
            bench_api::verdict(met)
        );
    }
    ExitCode::SUCCESS
}

fn ms(us: u64) -> f64 {
    us as f64 / 1000.0
}

fn unix_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or_default()
}

fn percentiles(mut v: Vec<u64>) -> Percentiles {
    if v.is_empty() {
        return Percentiles::default();
    }
    v.sort_unstable();
    let at = |q: f64| v[((v.len() as f64 * q) as usize).min(v.len() - 1)];
    Percentiles {
        p50_us: at(0.50),
        p99_us: at(0.99),
        max_us: *v.last().unwrap_or(&0),
    }
}

// --- the benchmark driver ---

async fn run(
    args: &Args,
    checkpoint: bool,
    api: Api,
    security: Security,
) -> anyhow::Result<Figures> {
    let work = std::env::temp_dir().join(format!(
        "agora-bench-status-{}-{}-{api}-{security}",
        std::process::id(),
        checkpoint
    ));
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work)?;
    let secure = match security {
        Security::Plain => None,
        Security::Secure => Some(Secure::create(&work.join("secure"))?),
    };
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let wait_stop = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let master_addr = listener.local_addr()?;
    let mut master_config = agora_master::Config {
        work_dir: Some(work.join("master")),
        ..agora_master::Config::default()
    };
    if let Some(secure) = &secure {
        secure.master_config(&mut master_config);
    }
    let master = tokio::spawn(agora_master::run(
        listener,
        master_config,
        wait_stop(stop_rx.clone()),
    ));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let agent_addr = listener.local_addr()?;
    let exe = std::env::current_exe().context("locating this executable")?;
    let mut config = agora_agent::Config::new(master_addr.to_string(), work.join("agent"));
    config.resources = Resources::parse("cpus:64;mem:65536;disk:1024")?;
    config.hostname = "localhost".into();
    config.command_executor = vec![exe.display().to_string(), "__unused".into()];
    config.users = agora_agent::UserPolicy::agent_user();
    config.status_update_retry_min = args.retry_min;
    config.status_update_retry_max = args.retry_min.max(Duration::from_secs(600));
    if let Some(secure) = &secure {
        secure.agent_config(&mut config);
    }
    let agent = tokio::spawn(agora_agent::run(
        listener,
        config,
        wait_stop(stop_rx.clone()),
    ));
    let master_client = match &secure {
        Some(secure) => secure.master_client(master_addr)?,
        None => agora_client::MasterClient::new(master_addr),
    };
    agora_examples::local::wait_for_agents_with(&master_client, 1, Duration::from_secs(30)).await?;

    // The side channel that paces the executor.
    let feedback = TcpListener::bind("127.0.0.1:0")?;
    let feedback_addr = feedback.local_addr()?;
    let received = Arc::new(AtomicU64::new(0));
    let (count_tx, count_rx) = mpsc::channel::<u64>();
    let (report_tx, report_rx) = mpsc::channel::<String>();
    std::thread::spawn(move || feedback_server(feedback, count_rx, report_tx));

    let total = (args.tasks * args.updates_per_task) as u64;
    let (lat_tx, lat_rx) = mpsc::channel::<Vec<u64>>();
    let scheduler = BenchScheduler {
        args: args.clone(),
        exe: exe.display().to_string(),
        feedback: feedback_addr,
        launched: false,
        received: received.clone(),
        count_tx,
        latencies: Vec::with_capacity(total as usize),
        total,
        lat_tx: Some(lat_tx),
    };
    let mut info = FrameworkInfo::new("bench-status-updates");
    info.checkpoint = checkpoint;
    let framework = Framework::start(
        scheduler,
        info,
        master_addr,
        api,
        bench_api::V1Options {
            codec: args.codec,
            calls_in_flight: args.calls_in_flight,
            http: args.http,
        },
        secure.as_ref(),
    )
    .await?;

    // Throughput: from the first update at the scheduler until the agent
    // has every acknowledgement.
    let deadline = Instant::now() + args.timeout;
    let mut first: Option<Instant> = None;
    let (acked_at, wal_syncs) = loop {
        if let Some(e) = framework.failed() {
            bail!("the {api} framework failed: {e:#}");
        }
        if Instant::now() > deadline {
            bail!(
                "timed out: scheduler received {} of {total}",
                received.load(Ordering::Relaxed)
            );
        }
        if first.is_none() && received.load(Ordering::Relaxed) > 0 {
            first = Some(Instant::now());
        }
        // The agent's /state is asked only once the scheduler has seen
        // every update: polling it during the run would load the agent.
        if first.is_some() && received.load(Ordering::Relaxed) >= total {
            if let Ok(state) = master_client.agent(agent_addr).state().await {
                let acked = state["status_updates_acknowledged"].as_u64().unwrap_or(0);
                if acked >= total {
                    let syncs = state["checkpoint"]["wal_syncs"].as_u64().unwrap_or(0);
                    break (Instant::now(), syncs);
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    };
    let secs = (acked_at - first.unwrap_or(acked_at))
        .as_secs_f64()
        .max(1e-6);
    let to_scheduler = tokio::task::spawn_blocking(move || {
        lat_rx
            .recv_timeout(Duration::from_secs(10))
            .unwrap_or_default()
    })
    .await?;
    let report = tokio::task::spawn_blocking(move || {
        report_rx
            .recv_timeout(Duration::from_secs(10))
            .unwrap_or_default()
    })
    .await?;
    let agent_ack: Vec<u64> = report
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    framework.stop().await;
    let _ = stop_tx.send(true);
    let _ = tokio::time::timeout(Duration::from_secs(10), agent).await;
    let _ = tokio::time::timeout(Duration::from_secs(10), master).await;
    let _ = std::fs::remove_dir_all(&work);
    Ok(Figures {
        security,
        api,
        checkpoint,
        total,
        secs,
        to_scheduler: percentiles(to_scheduler),
        agent_ack: Percentiles {
            p50_us: agent_ack.first().copied().unwrap_or(0),
            p99_us: agent_ack.get(1).copied().unwrap_or(0),
            max_us: agent_ack.get(2).copied().unwrap_or(0),
        },
        wal_syncs: if checkpoint { wal_syncs } else { 0 },
    })
}

/// Accepts the executor's connection; writes it the scheduler's received
/// count (8 bytes, big endian) whenever it changes, and forwards the one
/// report line the executor sends at the end.
fn feedback_server(
    listener: TcpListener,
    counts: mpsc::Receiver<u64>,
    report: mpsc::Sender<String>,
) {
    let Ok((stream, _)) = listener.accept() else {
        return;
    };
    let _ = stream.set_nodelay(true);
    if let Ok(reader) = stream.try_clone() {
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(reader).read_line(&mut line);
            let _ = report.send(line);
        });
    }
    let mut stream = stream;
    while let Ok(mut n) = counts.recv() {
        n = counts.try_iter().last().unwrap_or(n).max(n);
        if stream.write_all(&n.to_be_bytes()).is_err() {
            return;
        }
    }
}

struct BenchScheduler {
    args: Args,
    exe: String,
    feedback: SocketAddr,
    launched: bool,
    received: Arc<AtomicU64>,
    count_tx: mpsc::Sender<u64>,
    latencies: Vec<u64>,
    total: u64,
    lat_tx: Option<mpsc::Sender<Vec<u64>>>,
}

impl BenchFramework for BenchScheduler {
    fn offers(&mut self, offers: Vec<Offer>) -> Vec<Action> {
        let mut actions = Vec::new();
        for offer in offers {
            if self.launched {
                actions.push(Action::Decline {
                    offer_id: offer.id,
                    filters: Filters::default(),
                });
                continue;
            }
            self.launched = true;
            let environment = [
                (ENV_FEEDBACK, self.feedback.to_string()),
                (ENV_TASKS, self.args.tasks.to_string()),
                (ENV_UPDATES, self.args.updates_per_task.to_string()),
                (ENV_WINDOW, self.args.window.to_string()),
                (ENV_DATA, self.args.data_bytes.to_string()),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect();
            let executor = ExecutorInfo {
                container: None,
                executor_id: ExecutorId::new("bench"),
                framework_id: None,
                command: CommandInfo {
                    value: self.exe.clone(),
                    shell: false,
                    arguments: vec![self.exe.clone(), EXECUTOR_ARG.into()],
                    environment,
                    uris: Vec::new(),
                },
                resources: Resources::parse("cpus:0.1;mem:32").unwrap_or_default(),
                name: "bench executor".into(),
                source: "bench".into(),
                api: Default::default(),
                shutdown_grace_period: None,
                data: None,
                labels: Default::default(),
            };
            let tasks = (0..self.args.tasks)
                .map(|i| TaskInfo {
                    container: None,
                    allocation_role: None,
                    launch_stamp: None,
                    name: format!("t{i}"),
                    task_id: TaskId::new(format!("t{i:05}")),
                    agent_id: offer.agent_id.clone(),
                    resources: Resources::parse("cpus:0.01;mem:1").unwrap_or_default(),
                    executor: Some(executor.clone()),
                    command: None,
                    data: None,
                    kill_grace_period: None,
                    labels: Default::default(),
                    task_group: None,
                })
                .collect();
            actions.push(Action::Launch {
                offer_id: offer.id,
                tasks,
                filters: Filters::default(),
            });
        }
        actions
    }

    fn update(&mut self, status: &TaskStatus) {
        let now = unix_micros();
        if let Some(sent) = status
            .data
            .as_ref()
            .and_then(|d| std::str::from_utf8(&d.0).ok())
            .and_then(|s| s.split(' ').next())
            .and_then(|s| s.parse::<u64>().ok())
        {
            self.latencies.push(now.saturating_sub(sent));
        }
        let n = self.received.fetch_add(1, Ordering::Relaxed) + 1;
        let _ = self.count_tx.send(n);
        if n >= self.total {
            if let Some(tx) = self.lat_tx.take() {
                let _ = tx.send(std::mem::take(&mut self.latencies));
            }
        }
    }
}

impl Scheduler for BenchScheduler {
    fn registered(&mut self, _d: &SchedulerDriver, _f: &FrameworkId, _m: &MasterInfo) {}

    fn resource_offers(&mut self, driver: &SchedulerDriver, offers: Vec<Offer>) {
        for action in self.offers(offers) {
            action.apply_native(driver);
        }
    }

    fn status_update(&mut self, _d: &SchedulerDriver, status: &TaskStatus) {
        self.update(status);
    }

    fn agent_lost(&mut self, _d: &SchedulerDriver, agent_id: &AgentId) {
        eprintln!("bench: agent {agent_id} lost");
    }

    fn error(&mut self, _d: &SchedulerDriver, message: &str) {
        eprintln!("bench: scheduler error: {message}");
    }
}

// --- the executor mode ---

/// Sender state shared by the callback thread and the sending thread.
struct Flow {
    /// Updates the scheduler received (from the side channel).
    received: Mutex<u64>,
    changed: Condvar,
}

struct BenchExecutor {
    tasks: Arc<Mutex<Vec<TaskId>>>,
    expected: usize,
    start: Option<mpsc::Sender<()>>,
    sent_at: Arc<Mutex<HashMap<String, Instant>>>,
    ack_latencies: Arc<Mutex<Vec<u64>>>,
}

impl Executor for BenchExecutor {
    fn launch_task(&mut self, _driver: &ExecutorDriver, task: TaskInfo) {
        let mut tasks = self.tasks.lock().unwrap_or_else(|e| e.into_inner());
        tasks.push(task.task_id);
        if tasks.len() == self.expected {
            if let Some(start) = self.start.take() {
                let _ = start.send(());
            }
        }
    }

    fn status_update_acknowledged(&mut self, _driver: &ExecutorDriver, _task: &TaskId, uuid: &str) {
        let sent = self
            .sent_at
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(uuid);
        if let Some(sent) = sent {
            self.ack_latencies
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(sent.elapsed().as_micros() as u64);
        }
    }
}

fn env_usize(name: &str) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn executor_main() -> ExitCode {
    let expected = env_usize(ENV_TASKS);
    let updates = env_usize(ENV_UPDATES);
    let window = env_usize(ENV_WINDOW).max(1) as u64;
    let data_bytes = env_usize(ENV_DATA);
    let feedback: Option<SocketAddr> = std::env::var(ENV_FEEDBACK)
        .ok()
        .and_then(|a| a.parse().ok());
    let Some(feedback) = feedback else {
        eprintln!("bench executor: {ENV_FEEDBACK} is not set");
        return ExitCode::FAILURE;
    };
    let stream = match TcpStream::connect(feedback) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("bench executor: cannot connect to {feedback}: {e}");
            return ExitCode::FAILURE;
        }
    };
    let _ = stream.set_nodelay(true);
    let flow = Arc::new(Flow {
        received: Mutex::new(0),
        changed: Condvar::new(),
    });
    {
        let flow = flow.clone();
        let mut reader = match stream.try_clone() {
            Ok(r) => r,
            Err(e) => {
                eprintln!("bench executor: {e}");
                return ExitCode::FAILURE;
            }
        };
        std::thread::spawn(move || {
            let mut buf = [0u8; 8];
            while reader.read_exact(&mut buf).is_ok() {
                let n = u64::from_be_bytes(buf);
                *flow.received.lock().unwrap_or_else(|e| e.into_inner()) = n;
                flow.changed.notify_all();
            }
        });
    }
    let (start_tx, start_rx) = mpsc::channel();
    let tasks = Arc::new(Mutex::new(Vec::new()));
    let sent_at = Arc::new(Mutex::new(HashMap::new()));
    let ack_latencies = Arc::new(Mutex::new(Vec::new()));
    let executor = BenchExecutor {
        tasks: tasks.clone(),
        expected,
        start: Some(start_tx),
        sent_at: sent_at.clone(),
        ack_latencies: ack_latencies.clone(),
    };
    let driver = match ExecutorDriver::from_env(executor) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("bench executor: {e}");
            return ExitCode::FAILURE;
        }
    };
    if let Err(e) = driver.start() {
        eprintln!("bench executor: {e}");
        return ExitCode::FAILURE;
    }
    if start_rx.recv_timeout(Duration::from_secs(120)).is_err() {
        eprintln!("bench executor: not every task arrived");
        let _ = driver.abort();
        return ExitCode::FAILURE;
    }
    let tasks = tasks.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let padding = "x".repeat(data_bytes.saturating_sub(24));
    let mut sent: u64 = 0;
    for seq in 0..updates {
        let state = if seq + 1 == updates {
            TaskState::Finished
        } else {
            TaskState::Running
        };
        for task in &tasks {
            {
                let mut received = flow.received.lock().unwrap_or_else(|e| e.into_inner());
                while sent.saturating_sub(*received) >= window {
                    received = flow
                        .changed
                        .wait_timeout(received, Duration::from_secs(1))
                        .map(|(g, _)| g)
                        .unwrap_or_else(|e| e.into_inner().0);
                }
            }
            let mut status =
                TaskStatus::new(task.clone(), state, Source::SourceExecutor).with_new_uuid();
            status.data = Some(format!("{} {padding}", unix_micros()).into_bytes().into());
            if let Some(uuid) = status.uuid.clone() {
                sent_at
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(uuid, Instant::now());
            }
            if driver.send_status_update(status).is_err() {
                eprintln!("bench executor: driver stopped");
                return ExitCode::FAILURE;
            }
            sent += 1;
        }
    }
    // Wait for the agent's acknowledgements, then report the checkpoint
    // hop's latency: "p50,p99,max" in microseconds.
    let deadline = Instant::now() + Duration::from_secs(120);
    while !sent_at.lock().unwrap_or_else(|e| e.into_inner()).is_empty() && Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(10));
    }
    let p = percentiles(std::mem::take(
        &mut *ack_latencies.lock().unwrap_or_else(|e| e.into_inner()),
    ));
    let mut stream = stream;
    let _ = writeln!(stream, "{},{},{}", p.p50_us, p.p99_us, p.max_us);
    let _ = driver.stop();
    driver.join();
    ExitCode::SUCCESS
}
