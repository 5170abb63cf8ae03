//! `agora-minijob`: a mini job runtime on `agora-workers`, the way Flink
//! uses a cluster manager.
//!
//! A job is S subtasks, each with the hosts its inputs live on. The
//! runtime (the *leader*) declares workers through a [`WorkerManager`]
//! — one spec per input host, preferring that host, K slots each — so
//! that delay scheduling lands them near the data. Each worker is this
//! same binary in `worker` mode: it registers with the runtime over TCP
//! (one JSON object per line), and the runtime places subtasks in its
//! slots with a [`SlotPool`] by the locality of their inputs. A worker
//! runs a subtask by printing `subtask I on host H` and reports it done.
//! Workers lost with their agent are replaced (the manager's declared
//! counts) and their unfinished subtasks placed again.
//!
//! With `--etcd` the runtime is a leader contender
//! ([`agora_workers::election`]): run two, and killing the leader hands
//! the job to the other. The new leader recovers the launched workers
//! from the fenced etcd worker store; the workers follow the leader key
//! to the new runtime and re-register with the subtasks they finished.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use agora_proto::Resources;
use agora_workers::manager::{ManagerEvent, ManagerOptions};
use agora_workers::slots::{Location, LocationConstraint, SlotPool, SlotRequest};
use agora_workers::{
    DriverOptions, FinalStatus, Locality, TerminationCause, WorkerId, WorkerManager, WorkerSpec,
    WorkerStore,
};
use anyhow::{bail, Context};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::time::Instant;

/// The runtime's options (the binary's flags).
#[derive(Debug, Clone)]
pub struct MinijobOptions {
    /// Master `HOST:PORT` (or `etcd://…` with the etcd feature).
    pub master: String,
    /// Number of subtasks (S).
    pub subtasks: usize,
    /// Slots per worker (K).
    pub slots_per_worker: usize,
    /// Resources of each worker.
    pub worker_resources: Resources,
    /// Wait per locality level.
    pub locality_wait: Duration,
    /// Lines `subtask host[,host…]`; without it inputs are spread over
    /// the agents' host names.
    pub inputs: Option<PathBuf>,
    /// How long each subtask runs.
    pub subtask_duration: Duration,
    /// The worker store (file mode).
    pub state_file: Option<PathBuf>,
    /// Program and leading arguments that start a worker (default: this
    /// binary with `worker`).
    pub worker_command: Vec<String>,
    /// Give up after this long.
    pub timeout: Duration,
    /// etcd `HOST:PORT`: run as a leader contender.
    pub etcd: Option<String>,
    /// Key prefix in etcd.
    pub etcd_prefix: String,
    /// Lease of the runtime's leadership.
    pub etcd_lease_ttl: Duration,
    /// The master's failover timeout for this framework.
    pub failover_timeout: Duration,
}

/// The final summary (`--json`).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Summary {
    /// Subtasks in the job.
    pub subtasks: usize,
    /// Subtasks finished.
    pub finished: usize,
    /// Workers placed (by this leader, replacements included).
    pub workers_started: usize,
    /// Workers lost (agent lost, failed, lost after reconciliation).
    pub workers_lost: usize,
    /// Subtask placements by locality.
    pub locality: BTreeMap<String, usize>,
    /// Time from request to registration with the runtime, per worker.
    pub time_to_workers_ms: Percentiles,
    /// Recovered workers (from an earlier leader).
    pub workers_recovered: usize,
}

/// p50 and p99 in milliseconds.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Percentiles {
    /// Median.
    pub p50: f64,
    /// 99th percentile.
    pub p99: f64,
}

/// Runtime ↔ worker messages, one JSON object per line.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Message {
    /// Worker → runtime, first line.
    Register {
        /// `AGORA_WORKER_ID`.
        worker_id: String,
        /// `AGORA_WORKER_HOST`.
        host: String,
        /// `AGORA_WORKER_RACK`.
        #[serde(default)]
        rack: Option<String>,
        /// Slots offered.
        slots: usize,
        /// Subtasks this worker finished before (for a new leader).
        #[serde(default)]
        done: Vec<usize>,
    },
    /// Runtime → worker.
    Run {
        /// The subtask.
        subtask: usize,
        /// How long to run it.
        duration_ms: u64,
    },
    /// Worker → runtime.
    Done {
        /// The subtask.
        subtask: usize,
    },
}

/// Where the runtime is: a fixed address or the leader key in etcd.
#[derive(Debug, Clone)]
pub enum RuntimeAddress {
    /// `HOST:PORT`.
    Fixed(String),
    /// etcd endpoint and prefix.
    #[cfg(feature = "etcd")]
    Etcd(String, String),
}

// === parsing ===

/// Reads an inputs file: lines `subtask host[,host…]`, `#` comments.
pub fn parse_inputs(text: &str, subtasks: usize) -> anyhow::Result<Vec<Vec<String>>> {
    let mut inputs = vec![Vec::new(); subtasks];
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (index, hosts) = line
            .split_once(char::is_whitespace)
            .with_context(|| format!("line {}: expected `subtask host[,host…]`", n + 1))?;
        let index: usize = index
            .parse()
            .with_context(|| format!("line {}: {index:?} is not a subtask number", n + 1))?;
        if index >= subtasks {
            bail!("line {}: subtask {index} is outside 0..{subtasks}", n + 1);
        }
        inputs[index] = hosts
            .split(',')
            .map(str::trim)
            .filter(|h| !h.is_empty())
            .map(String::from)
            .collect();
    }
    Ok(inputs)
}

/// The agents' host names and racks from the master's `/state`.
async fn agent_hosts(master: &str) -> anyhow::Result<BTreeMap<String, Option<String>>> {
    let addr: SocketAddr = master
        .parse()
        .with_context(|| format!("--master {master}: inputs can only be spread over the agents of a HOST:PORT master; give --inputs"))?;
    let state = agora_client::MasterClient::new(addr).state().await?;
    let mut hosts = BTreeMap::new();
    for agent in state["agents"].as_array().into_iter().flatten() {
        let Some(host) = agent["hostname"].as_str() else {
            continue;
        };
        let rack = agent["attributes"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|a| a["name"] == "rack")
            .and_then(|a| a["text"].as_str().map(String::from));
        hosts.insert(host.to_string(), rack);
    }
    if hosts.is_empty() {
        bail!("the master lists no agents");
    }
    Ok(hosts)
}

fn percentiles(mut values: Vec<f64>) -> Percentiles {
    if values.is_empty() {
        return Percentiles::default();
    }
    values.sort_by(f64::total_cmp);
    let at = |q: f64| values[((values.len() as f64 - 1.0) * q).round() as usize];
    Percentiles {
        p50: at(0.5),
        p99: at(0.99),
    }
}

// === the runtime ===

/// Runs the job as the only runtime (file store), to completion.
pub async fn run(opts: MinijobOptions) -> anyhow::Result<Summary> {
    let store: Box<dyn WorkerStore> = match &opts.state_file {
        Some(path) => Box::new(agora_workers::FileStore::open(path)?),
        None => Box::new(agora_workers::MemoryStore::default()),
    };
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let address = RuntimeAddress::Fixed(listener.local_addr()?.to_string());
    let job = Job::prepare(&opts, &address).await?;
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    let _keep = stop_tx;
    job.run(&opts, store, listener, address, stop).await
}

/// The job's plan: inputs per subtask and a spec per input host.
struct Job {
    inputs: Vec<Vec<String>>,
    racks: BTreeMap<String, Option<String>>,
    specs: Vec<(WorkerSpec, usize)>,
}

/// What the runtime's loop hears.
enum Note {
    Registered {
        id: WorkerId,
        host: String,
        rack: Option<String>,
        slots: usize,
        done: Vec<usize>,
        writer: mpsc::UnboundedSender<Message>,
    },
    Done(WorkerId, usize),
    Gone(WorkerId),
}

impl Job {
    async fn prepare(opts: &MinijobOptions, address: &RuntimeAddress) -> anyhow::Result<Job> {
        if opts.subtasks == 0 || opts.slots_per_worker == 0 {
            bail!("--subtasks and --slots-per-worker must be at least 1");
        }
        let (inputs, racks) = match &opts.inputs {
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .with_context(|| format!("reading {}", path.display()))?;
                let inputs = parse_inputs(&text, opts.subtasks)?;
                let racks = agent_hosts(&opts.master).await.unwrap_or_default();
                (inputs, racks)
            }
            None => {
                let racks = agent_hosts(&opts.master).await?;
                let hosts: Vec<&String> = racks.keys().collect();
                let inputs = (0..opts.subtasks)
                    .map(|i| vec![hosts[i % hosts.len()].clone()])
                    .collect();
                (inputs, racks)
            }
        };
        // One spec per first input host; subtasks without inputs share one.
        let mut per_host: BTreeMap<String, usize> = BTreeMap::new();
        for hosts in &inputs {
            *per_host
                .entry(hosts.first().cloned().unwrap_or_default())
                .or_default() += 1;
        }
        let mut program = opts.worker_command.clone();
        let mut command = program
            .drain(..)
            .map(|a| shell_quote(&a))
            .collect::<Vec<_>>()
            .join(" ");
        command.push_str(&format!(" --slots {}", opts.slots_per_worker));
        match address {
            RuntimeAddress::Fixed(a) => command.push_str(&format!(" --runtime {a}")),
            #[cfg(feature = "etcd")]
            RuntimeAddress::Etcd(endpoint, prefix) => command.push_str(&format!(
                " --etcd {} --etcd-prefix {}",
                shell_quote(endpoint),
                shell_quote(prefix)
            )),
        }
        let specs = per_host
            .into_iter()
            .map(|(host, count)| {
                let name = if host.is_empty() {
                    "worker@any".to_string()
                } else {
                    format!("worker@{host}")
                };
                let mut spec =
                    WorkerSpec::new(name, opts.worker_resources.clone(), command.clone())
                        .locality_wait(opts.locality_wait);
                if !host.is_empty() {
                    spec = spec.prefer_host(host, 1.0);
                }
                (spec, count.div_ceil(opts.slots_per_worker))
            })
            .collect();
        Ok(Job {
            inputs,
            racks,
            specs,
        })
    }

    /// Runs the job until every subtask finished (or the timeout, or
    /// `stop` — leadership revoked).
    async fn run(
        &self,
        opts: &MinijobOptions,
        store: Box<dyn WorkerStore>,
        listener: TcpListener,
        address: RuntimeAddress,
        mut stop: tokio::sync::watch::Receiver<bool>,
    ) -> anyhow::Result<Summary> {
        let mut options = DriverOptions::new(opts.master.clone(), "agora-minijob");
        options.locality_wait = opts.locality_wait;
        options.failover_timeout = opts.failover_timeout;
        let (manager, mut events) = WorkerManager::start(
            options,
            store,
            ManagerOptions::default(),
            &tokio::runtime::Handle::current(),
        )?;
        let (notes_tx, mut notes) = mpsc::unbounded_channel();
        let accept = tokio::spawn(accept_workers(listener, notes_tx));
        let _ = address;
        let started = Instant::now();
        let mut summary = Summary {
            subtasks: opts.subtasks,
            ..Summary::default()
        };
        for level in Locality::ALL {
            summary.locality.insert(level.as_str().into(), 0);
        }
        let mut pool = SlotPool::new();
        let mut writers: HashMap<WorkerId, mpsc::UnboundedSender<Message>> = HashMap::new();
        let mut finished: BTreeSet<usize> = BTreeSet::new();
        let mut running: BTreeMap<usize, WorkerId> = BTreeMap::new();
        let mut requested_at: HashMap<WorkerId, Instant> = HashMap::new();
        let mut waits: Vec<f64> = Vec::new();
        let mut lost_at: Vec<Instant> = Vec::new();
        let mut declared = false;
        // Delay scheduling for slots too: a subtask takes a slot off its
        // inputs' host only after waiting the locality wait.
        let mut waiting_since: HashMap<usize, Instant> = HashMap::new();
        let mut tick = tokio::time::interval(Duration::from_millis(100));
        let deadline = tokio::time::sleep(opts.timeout);
        tokio::pin!(deadline);
        loop {
            tokio::select! {
                event = events.recv() => {
                    let Some(event) = event else { break };
                    match event {
                        ManagerEvent::Recovered(workers) => {
                            summary.workers_recovered += workers.len();
                            println!("recovered {} workers of an earlier attempt", workers.len());
                            for w in workers {
                                requested_at.insert(w.id, Instant::now());
                            }
                            if !declared {
                                declared = true;
                                for (spec, count) in &self.specs {
                                    manager.declare(spec.clone(), *count);
                                }
                            }
                        }
                        ManagerEvent::WorkerStarted(handle) => {
                            summary.workers_started += 1;
                            let from = lost_at.pop().unwrap_or(started);
                            requested_at.insert(handle.id.clone(), from);
                        }
                        ManagerEvent::WorkerTerminated { id, cause, diagnostics } => {
                            if matches!(cause, TerminationCause::AgentLost | TerminationCause::Failed | TerminationCause::LostAfterReconciliation) {
                                summary.workers_lost += 1;
                                lost_at.push(Instant::now());
                                println!("worker {id} lost ({cause}: {diagnostics}); replacing it");
                            }
                            pool.remove_worker(&id);
                            writers.remove(&id);
                            running.retain(|_, w| *w != id);
                        }
                        ManagerEvent::Fatal(message) => bail!("the worker driver failed: {message}"),
                        _ => {}
                    }
                }
                note = notes.recv() => {
                    let Some(note) = note else { break };
                    match note {
                        Note::Registered { id, host, rack, slots, done, writer } => {
                            if let Some(at) = requested_at.get(&id) {
                                waits.push(at.elapsed().as_secs_f64() * 1000.0);
                            }
                            finished.extend(done.into_iter().filter(|s| *s < opts.subtasks));
                            manager.worker_registered(&id);
                            pool.add_worker(id.clone(), host, rack, slots);
                            writers.insert(id, writer);
                        }
                        Note::Done(id, subtask) => {
                            if running.get(&subtask) == Some(&id) {
                                running.remove(&subtask);
                                let _ = pool.free(&id);
                            }
                            finished.insert(subtask);
                        }
                        Note::Gone(id) => {
                            if pool.contains(&id) {
                                pool.remove_worker(&id);
                                writers.remove(&id);
                                running.retain(|_, w| *w != id);
                            }
                        }
                    }
                }
                _ = tick.tick() => {}
                _ = &mut deadline => {
                    accept.abort();
                    bail!("the job did not finish within {:?}: {} of {} subtasks done", opts.timeout, finished.len(), opts.subtasks);
                }
                _ = stop.changed() => {
                    accept.abort();
                    manager.terminate().await;
                    bail!("leadership revoked");
                }
            }
            // Place every runnable subtask in the closest free slot.
            for (subtask, hosts) in self.inputs.iter().enumerate() {
                if finished.contains(&subtask) || running.contains_key(&subtask) {
                    continue;
                }
                let request = SlotRequest {
                    inputs: hosts
                        .iter()
                        .map(|h| {
                            Some(Location {
                                worker: None,
                                host: h.clone(),
                                rack: self.racks.get(h).cloned().flatten(),
                            })
                        })
                        .collect(),
                    constraint: LocationConstraint::Any,
                };
                let Ok(slot) = pool.allocate(&request) else {
                    break;
                };
                let since = *waiting_since.entry(subtask).or_insert_with(Instant::now);
                if !hosts.is_empty()
                    && slot.locality > Locality::Host
                    && since.elapsed() < opts.locality_wait
                {
                    let _ = pool.free(&slot.worker);
                    continue;
                }
                let Some(writer) = writers.get(&slot.worker) else {
                    let _ = pool.free(&slot.worker);
                    continue;
                };
                let duration_ms = opts.subtask_duration.as_millis() as u64;
                if writer
                    .send(Message::Run {
                        subtask,
                        duration_ms,
                    })
                    .is_err()
                {
                    let _ = pool.free(&slot.worker);
                    continue;
                }
                *summary
                    .locality
                    .entry(slot.locality.as_str().into())
                    .or_default() += 1;
                running.insert(subtask, slot.worker);
                waiting_since.remove(&subtask);
            }
            if finished.len() >= opts.subtasks {
                break;
            }
        }
        accept.abort();
        summary.finished = finished.len();
        summary.time_to_workers_ms = percentiles(waits);
        manager
            .deregister(
                FinalStatus::Succeeded,
                Some("every subtask finished".into()),
            )
            .await?;
        Ok(summary)
    }
}

fn shell_quote(text: &str) -> String {
    if !text.is_empty()
        && text
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "/._-:".contains(c))
    {
        text.to_string()
    } else {
        format!("'{}'", text.replace('\'', r"'\''"))
    }
}

/// Accepts worker connections and turns their lines into notes.
async fn accept_workers(listener: TcpListener, notes: mpsc::UnboundedSender<Note>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            return;
        };
        tokio::spawn(serve_worker(stream, notes.clone()));
    }
}

async fn serve_worker(stream: TcpStream, notes: mpsc::UnboundedSender<Note>) {
    let (read, mut write) = stream.into_split();
    let mut lines = tokio::io::BufReader::new(read).lines();
    let Ok(Some(first)) = lines.next_line().await else {
        return;
    };
    let Ok(Message::Register {
        worker_id,
        host,
        rack,
        slots,
        done,
    }) = serde_json::from_str::<Message>(&first)
    else {
        return;
    };
    let id = WorkerId::new(worker_id);
    let (writer, mut outbox) = mpsc::unbounded_channel::<Message>();
    tokio::spawn(async move {
        while let Some(message) = outbox.recv().await {
            let mut line = serde_json::to_string(&message).unwrap_or_default();
            line.push('\n');
            if write.write_all(line.as_bytes()).await.is_err() {
                return;
            }
        }
    });
    let _ = notes.send(Note::Registered {
        id: id.clone(),
        host,
        rack,
        slots,
        done,
        writer,
    });
    while let Ok(Some(line)) = lines.next_line().await {
        if let Ok(Message::Done { subtask }) = serde_json::from_str(&line) {
            let _ = notes.send(Note::Done(id.clone(), subtask));
        }
    }
    let _ = notes.send(Note::Gone(id));
}

// === the runtime as a leader contender ===

/// Runs the job as one of several contenders on etcd; returns the
/// summary when this process led the job to its end, or `None` when
/// another leader finished it.
#[cfg(feature = "etcd")]
pub async fn run_elected(opts: MinijobOptions) -> anyhow::Result<Option<Summary>> {
    use agora_workers::election::{ElectionOptions, LeaderContender, LeaderElection, LeaderEpoch};

    struct Contender(mpsc::UnboundedSender<Option<LeaderEpoch>>);
    impl LeaderContender for Contender {
        fn grant_leadership(&self, epoch: LeaderEpoch) {
            let _ = self.0.send(Some(epoch));
        }
        fn revoke_leadership(&self) {
            let _ = self.0.send(None);
        }
    }

    let endpoint = opts.etcd.clone().context("--etcd is required")?;
    let endpoint = endpoint.trim_start_matches("http://").to_string();
    let mut election_options = ElectionOptions::new(endpoint.clone(), opts.etcd_prefix.clone());
    election_options.lease_ttl = opts.etcd_lease_ttl;
    let (grants, mut granted) = mpsc::unbounded_channel();
    let election = Arc::new(LeaderElection::start(
        election_options,
        Arc::new(Contender(grants)),
    )?);
    let done_key = format!("{}/job-done", opts.etcd_prefix.trim_end_matches('/'));
    let client = agora_etcd::Client::new(&endpoint)?;
    let deadline = Instant::now() + opts.timeout;
    loop {
        if Instant::now() >= deadline {
            bail!("no leader finished the job within {:?}", opts.timeout);
        }
        let finished_elsewhere = client
            .get(done_key.as_bytes())
            .await
            .ok()
            .flatten()
            .is_some();
        if finished_elsewhere {
            println!("another leader finished the job");
            return Ok(None);
        }
        let epoch = match tokio::time::timeout(Duration::from_millis(300), granted.recv()).await {
            Ok(Some(Some(epoch))) => epoch,
            Ok(Some(None)) | Err(_) => continue,
            Ok(None) => bail!("the election stopped"),
        };
        println!("leading the job with epoch {}", epoch.0);
        let store = agora_workers::store::EtcdStore::new(
            &endpoint,
            &opts.etcd_prefix,
            election.leader_key(),
            epoch,
        )?;
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let address = listener.local_addr()?.to_string();
        let job = Job::prepare(
            &opts,
            &RuntimeAddress::Etcd(endpoint.clone(), opts.etcd_prefix.clone()),
        )
        .await?;
        let (stop_tx, stop) = tokio::sync::watch::channel(false);
        // Leadership is confirmed (the address published) only once the
        // runtime is up; a revoke meanwhile stops it.
        let confirm = election.clone();
        let addr = address.clone();
        let confirmed =
            tokio::task::spawn_blocking(move || confirm.confirm_leadership(epoch, &addr)).await??;
        if !confirmed {
            continue;
        }
        let watch_revoke = async {
            while let Some(grant) = granted.recv().await {
                if grant.is_none() {
                    let _ = stop_tx.send(true);
                    return;
                }
            }
        };
        let outcome = tokio::select! {
            outcome = job.run(&opts, Box::new(store), listener, RuntimeAddress::Fixed(address), stop.clone()) => outcome,
            _ = watch_revoke => Err(anyhow::anyhow!("leadership revoked")),
        };
        match outcome {
            Ok(summary) => {
                client
                    .txn_if_created_at(
                        election.leader_key().as_bytes(),
                        epoch.0,
                        &[agora_etcd::TxnOp::Put {
                            key: done_key.clone().into_bytes(),
                            value: b"done".to_vec(),
                            lease: 0,
                        }],
                    )
                    .await?;
                return Ok(Some(summary));
            }
            Err(e) => {
                eprintln!("agora-minijob: lost the lead ({e}); standing by");
            }
        }
    }
}

// === the worker ===

/// Runs a worker: registers with the runtime (following the leader in
/// etcd), runs the subtasks it is given, and reconnects when the runtime
/// goes away. Blocks until killed.
pub fn run_worker(runtime: RuntimeAddress, slots: usize) -> anyhow::Result<()> {
    let id = std::env::var(agora_workers::ENV_WORKER_ID)
        .context("AGORA_WORKER_ID is not set: run workers through the runtime")?;
    let host = std::env::var(agora_workers::ENV_WORKER_HOST).unwrap_or_else(|_| "localhost".into());
    let rack = std::env::var(agora_workers::ENV_WORKER_RACK).ok();
    let done = Arc::new(std::sync::Mutex::new(Vec::<usize>::new()));
    loop {
        let Some(address) = resolve(&runtime) else {
            std::thread::sleep(Duration::from_millis(200));
            continue;
        };
        let Ok(stream) = std::net::TcpStream::connect(&address) else {
            std::thread::sleep(Duration::from_millis(200));
            continue;
        };
        let register = Message::Register {
            worker_id: id.clone(),
            host: host.clone(),
            rack: rack.clone(),
            slots,
            done: done.lock().map(|d| d.clone()).unwrap_or_default(),
        };
        let writer = Arc::new(std::sync::Mutex::new(stream.try_clone()?));
        if send(&writer, &register).is_err() {
            continue;
        }
        for line in BufReader::new(stream).lines() {
            let Ok(line) = line else { break };
            if let Ok(Message::Run {
                subtask,
                duration_ms,
            }) = serde_json::from_str(&line)
            {
                let (writer, done, host) = (writer.clone(), done.clone(), host.clone());
                std::thread::spawn(move || {
                    std::thread::sleep(Duration::from_millis(duration_ms));
                    println!("subtask {subtask} on host {host}");
                    if let Ok(mut d) = done.lock() {
                        d.push(subtask);
                    }
                    let _ = send(&writer, &Message::Done { subtask });
                });
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn send(writer: &std::sync::Mutex<std::net::TcpStream>, message: &Message) -> std::io::Result<()> {
    let mut line = serde_json::to_string(message).unwrap_or_default();
    line.push('\n');
    let mut w = writer
        .lock()
        .map_err(|_| std::io::Error::other("poisoned"))?;
    w.write_all(line.as_bytes())
}

fn resolve(runtime: &RuntimeAddress) -> Option<String> {
    match runtime {
        RuntimeAddress::Fixed(a) => Some(a.clone()),
        #[cfg(feature = "etcd")]
        RuntimeAddress::Etcd(endpoint, prefix) => {
            agora_workers::election::current_leader(endpoint, prefix)
                .ok()
                .flatten()
                .and_then(|l| l.address)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inputs_files_parse() {
        let inputs = parse_inputs("# job\n0 h1,h2\n2 h3\n", 3).unwrap();
        assert_eq!(
            inputs,
            vec![
                vec!["h1".to_string(), "h2".into()],
                vec![],
                vec!["h3".into()]
            ]
        );
        assert!(parse_inputs("5 h1", 3).is_err());
        assert!(parse_inputs("x h1", 3).is_err());
    }

    #[test]
    fn percentiles_of_a_few_values() {
        let p = percentiles(vec![5.0, 1.0, 3.0]);
        assert_eq!((p.p50, p.p99), (3.0, 5.0));
        assert_eq!(percentiles(Vec::new()), Percentiles::default());
    }
}
