//! Run K copies of a shell command on the cluster through the built-in
//! command executor, print every status update, and report how they ended.
//!
//! This is the smallest useful framework: it packs as many instances into
//! each offer as fit, declines what it cannot use, suppresses offers once
//! everything is launched, and tears itself down when every instance has
//! reached a terminal state.
//!
//! It is also the reference for surviving its own failure:
//!
//! - `state_file` is the framework's durable record: the framework id, each
//!   instance launched (written *before* the launch is sent, fsync + rename)
//!   and each terminal state. A process restarted with the same state file
//!   (and framework id) re-subscribes as that framework, launches only the
//!   instances never launched, and reconciles those launched but not yet
//!   terminal instead of launching them again.
//! - After every (re-)subscription and then every `reconcile_interval`, the
//!   instances launched but silent for that long are reconciled
//!   explicitly, so a launch or an update lost in a failure is resolved by
//!   the master's answer instead of waited for forever.
//! - `ledger` is an append-only JSON-lines log of everything the scheduler
//!   saw (each update before it is acknowledged, each launch before it is
//!   sent): the evidence tests use to check that no update was lost or
//!   reordered.
//!
//! An instance gets exactly one terminal state: a task that ends `TASK_LOST`
//! or `TASK_DROPPED` is not relaunched under the same id.

use std::collections::{BTreeMap, VecDeque};
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use agora_proto::{
    AgentId, CommandInfo, ExecutorId, Filters, FrameworkId, FrameworkInfo, MasterInfo, Offer,
    OfferId, Resources, TaskId, TaskInfo, TaskState, TaskStatus,
};
use agora_scheduler::{DriverConfig, DriverStatus, Scheduler, SchedulerDriver};
use anyhow::{bail, Context};
use serde_json::{json, Value};

/// Default for [`ExecuteOptions::reconcile_interval`].
pub const DEFAULT_RECONCILE_INTERVAL: Duration = Duration::from_secs(10);

/// What to run.
#[derive(Debug, Clone)]
pub struct ExecuteOptions {
    /// Master `HOST:PORT`.
    pub master: String,
    /// Framework name; task ids are `NAME-0` … `NAME-(K-1)`.
    pub name: String,
    /// Shell command run by each instance.
    pub command: String,
    /// Resources of each instance.
    pub resources: Resources,
    /// Number of instances (K).
    pub instances: usize,
    /// Role to run in (default `*`).
    pub role: Option<String>,
    /// Ask agents to checkpoint the tasks.
    pub checkpoint: bool,
    /// Seconds the master keeps the tasks if this process disconnects.
    pub failover_timeout: f64,
    /// Give up (and tear the framework down) after this long.
    pub timeout: Option<Duration>,
    /// Print each status update to stdout.
    pub print_updates: bool,
    /// Subscribe as this existing framework (scheduler failover). Taken
    /// from `state_file` when that names one and this is `None`.
    pub framework_id: Option<FrameworkId>,
    /// Append every launch and received status update here, one JSON
    /// object per line, flushed before the update is acknowledged.
    pub ledger: Option<PathBuf>,
    /// The framework's durable record of launched and terminal instances.
    pub state_file: Option<PathBuf>,
    /// How long a launched instance may stay silent before it is
    /// reconciled explicitly (default 10 s).
    pub reconcile_interval: Duration,
    /// Called with each instance's task id and state as the job moves:
    /// `TASK_STAGING` when it is launched, then every status update
    /// (possibly repeated). For progress displays; `None` by default.
    pub on_state: Option<StateHook>,
    /// Authenticate as this principal (a master with
    /// `--authenticate-frameworks`).
    pub credential: Option<agora_proto::Credential>,
    /// TLS to the master (`wss://`).
    pub tls: Option<std::sync::Arc<agora_net::tls::rustls::ClientConfig>>,
}

/// A callback for [`ExecuteOptions::on_state`]. It runs on the driver's
/// callback thread and must not block.
#[derive(Clone)]
pub struct StateHook(pub Arc<StateFn>);

/// The function inside a [`StateHook`].
pub type StateFn = dyn Fn(&TaskId, TaskState) + Send + Sync;

impl std::fmt::Debug for StateHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StateHook")
    }
}

/// How a run ended.
#[derive(Debug, Clone, Default)]
pub struct ExecuteReport {
    /// Instances that reached TASK_FINISHED (including, after a restart,
    /// those the state file records as finished).
    pub finished: usize,
    /// Count of terminal states per state.
    pub terminal: BTreeMap<TaskState, usize>,
    /// Status updates received.
    pub updates: usize,
    /// Wall time from start to the last terminal update.
    pub elapsed: Duration,
    /// The framework id the master assigned.
    pub framework_id: Option<FrameworkId>,
    /// The states each task went through, in arrival order.
    pub history: BTreeMap<TaskId, Vec<TaskState>>,
    /// Why the driver aborted, if it did.
    pub error: Option<String>,
}

/// Where one instance is.
#[derive(Debug, Clone, PartialEq)]
enum Instance {
    /// Never launched.
    Pending,
    /// Launched on an agent; `heard` is when it was launched or last had
    /// an update (for reconciliation).
    Launched { agent_id: AgentId, heard: Instant },
    /// Reached this terminal state.
    Terminal(TaskState),
}

/// The durable record behind [`ExecuteOptions::state_file`].
#[derive(Debug, Default)]
struct StateFile {
    path: Option<PathBuf>,
    framework_id: Option<FrameworkId>,
    launched: BTreeMap<usize, AgentId>,
    terminal: BTreeMap<usize, TaskState>,
}

/// The append-only record behind [`ExecuteOptions::ledger`].
struct Ledger {
    file: Option<File>,
}

struct Job {
    name: String,
    instances: Vec<Instance>,
    pending: VecDeque<usize>,
    durable: StateFile,
    ledger: Ledger,
    report: ExecuteReport,
    suppressed: bool,
    done: bool,
}

struct ExecuteScheduler {
    opts: ExecuteOptions,
    job: Arc<Mutex<Job>>,
    started: Instant,
}

// === impl ExecuteOptions ===

impl ExecuteOptions {
    /// Options for `instances` copies of `command` on `master`, with the
    /// defaults of `agora-execute`'s flags: name `agora-execute`,
    /// `cpus:0.1;mem:32` each, no checkpointing, failover timeout 0, no
    /// timeout, updates printed, no framework id, ledger or state file.
    pub fn new(master: impl Into<String>, command: impl Into<String>, instances: usize) -> Self {
        ExecuteOptions {
            master: master.into(),
            name: "agora-execute".to_string(),
            command: command.into(),
            resources: Resources::parse("cpus:0.1;mem:32").unwrap_or_default(),
            instances,
            role: None,
            checkpoint: false,
            failover_timeout: 0.0,
            timeout: None,
            print_updates: true,
            framework_id: None,
            ledger: None,
            state_file: None,
            reconcile_interval: DEFAULT_RECONCILE_INTERVAL,
            on_state: None,
            credential: None,
            tls: None,
        }
    }
}

// === impl ExecuteReport ===

impl ExecuteReport {
    /// Whether every instance finished successfully.
    pub fn success(&self, instances: usize) -> bool {
        self.error.is_none() && self.finished == instances
    }

    /// One line: `finished 10/10 (TASK_FAILED: 0 …) in 1.2 s`.
    pub fn summary(&self, instances: usize) -> String {
        let mut line = format!("finished {}/{}", self.finished, instances);
        let others: Vec<String> = self
            .terminal
            .iter()
            .filter(|(state, _)| **state != TaskState::Finished)
            .map(|(state, n)| format!("{state}: {n}"))
            .collect();
        if !others.is_empty() {
            line.push_str(&format!(" ({})", others.join(", ")));
        }
        line.push_str(&format!(
            ", {} updates in {:.2} s",
            self.updates,
            self.elapsed.as_secs_f64()
        ));
        line
    }
}

// === impl ExecuteScheduler ===

impl ExecuteScheduler {
    fn task_for(&self, index: usize, agent_id: &AgentId) -> TaskInfo {
        TaskInfo {
            container: None,
            allocation_role: None,
            launch_stamp: None,
            name: format!("{} instance {index}", self.opts.name),
            task_id: task_id(&self.opts.name, index),
            agent_id: agent_id.clone(),
            resources: self.opts.resources.clone(),
            executor: None,
            command: Some(CommandInfo {
                value: self.opts.command.clone(),
                shell: true,
                ..CommandInfo::default()
            }),
            data: None,
            kill_grace_period: None,
            labels: BTreeMap::new(),
            task_group: None,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Job> {
        self.job
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// After a (re-)subscription: reconcile every instance launched but
    /// not terminal, and stop if nothing is left to do.
    fn resume(&mut self, driver: &SchedulerDriver) {
        let mut job = self.lock();
        let tasks = job.take_silent(Instant::now(), Duration::ZERO);
        if !tasks.is_empty() {
            if self.opts.print_updates {
                println!("reconciling {} launched instances", tasks.len());
            }
            let _ = driver.reconcile_tasks(&tasks);
        }
        self.finish_if_done(&mut job, driver);
    }

    fn finish_if_done(&self, job: &mut Job, driver: &SchedulerDriver) {
        if job.done || job.durable.terminal.len() < self.opts.instances {
            return;
        }
        job.done = true;
        job.report.elapsed = self.started.elapsed();
        let _ = driver.stop(false);
    }
}

impl Scheduler for ExecuteScheduler {
    fn registered(
        &mut self,
        driver: &SchedulerDriver,
        framework_id: &FrameworkId,
        master: &MasterInfo,
    ) {
        if self.opts.print_updates {
            println!(
                "registered as {framework_id} with master {}",
                master.address
            );
        }
        {
            let mut job = self.lock();
            job.report.framework_id = Some(framework_id.clone());
            job.ledger.record(json!({
                "event": "registered",
                "framework_id": framework_id.as_str(),
            }));
            if job.durable.framework_id.as_ref() != Some(framework_id) {
                job.durable.framework_id = Some(framework_id.clone());
                if let Err(e) = job.durable.save(&self.opts) {
                    // Without the id a restart cannot take the tasks over.
                    eprintln!("agora-execute: cannot save the state file: {e}");
                }
            }
        }
        self.resume(driver);
    }

    fn reregistered(&mut self, driver: &SchedulerDriver, master: &MasterInfo) {
        if self.opts.print_updates {
            println!("re-registered with master {}", master.address);
        }
        self.lock()
            .ledger
            .record(json!({ "event": "reregistered" }));
        self.resume(driver);
    }

    fn disconnected(&mut self, _driver: &SchedulerDriver) {
        if self.opts.print_updates {
            println!("disconnected from the master");
        }
    }

    fn resource_offers(&mut self, driver: &SchedulerDriver, offers: Vec<Offer>) {
        let mut job = self.lock();
        for offer in offers {
            let mut left = offer.resources.clone();
            let mut tasks = Vec::new();
            while let Some(&index) = job.pending.front() {
                match left.checked_sub(&self.opts.resources) {
                    Ok(rest) => {
                        left = rest;
                        job.pending.pop_front();
                        tasks.push((index, self.task_for(index, &offer.agent_id)));
                    }
                    Err(_) => break,
                }
            }
            if tasks.is_empty() {
                let refuse = if job.pending.is_empty() { 3600.0 } else { 1.0 };
                let _ = driver.decline_offer(
                    &offer.id,
                    Filters {
                        refuse_seconds: Some(refuse),
                    },
                );
                continue;
            }
            // Write ahead: a restarted process must know these were
            // launched, or it would launch them a second time.
            for (index, _) in &tasks {
                job.durable.launched.insert(*index, offer.agent_id.clone());
            }
            if let Err(e) = job.durable.save(&self.opts) {
                eprintln!("agora-execute: cannot save the state file ({e}); not launching");
                for (index, _) in tasks.iter().rev() {
                    job.durable.launched.remove(index);
                    job.pending.push_front(*index);
                }
                let _ = driver.decline_offer(
                    &offer.id,
                    Filters {
                        refuse_seconds: Some(1.0),
                    },
                );
                continue;
            }
            let now = Instant::now();
            for (index, task) in &tasks {
                job.instances[*index] = Instance::Launched {
                    agent_id: offer.agent_id.clone(),
                    heard: now,
                };
                job.ledger.record(json!({
                    "event": "launch",
                    "task_id": task.task_id.as_str(),
                    "agent_id": offer.agent_id.as_str(),
                }));
                if let Some(hook) = &self.opts.on_state {
                    (hook.0)(&task.task_id, TaskState::Staging);
                }
            }
            let _ = driver.launch_tasks(
                std::slice::from_ref(&offer.id),
                tasks.into_iter().map(|(_, task)| task).collect(),
                Filters {
                    refuse_seconds: Some(1.0),
                },
            );
        }
        if job.pending.is_empty() && !job.suppressed {
            job.suppressed = true;
            let _ = driver.suppress_offers();
        }
    }

    fn offer_rescinded(&mut self, _driver: &SchedulerDriver, _offer_id: &OfferId) {}

    fn status_update(&mut self, driver: &SchedulerDriver, status: &TaskStatus) {
        if self.opts.print_updates {
            println!("{}", update_line(status));
        }
        if let Some(hook) = &self.opts.on_state {
            (hook.0)(&status.task_id, status.state);
        }
        let mut job = self.lock();
        // Recorded before this callback returns, that is before the
        // driver acknowledges the update.
        job.ledger.update(status);
        job.report.updates += 1;
        job.report
            .history
            .entry(status.task_id.clone())
            .or_default()
            .push(status.state);
        let Some(index) =
            instance_index(&self.opts.name, &status.task_id).filter(|i| *i < self.opts.instances)
        else {
            return;
        };
        match &mut job.instances[index] {
            Instance::Terminal(_) => return,
            Instance::Launched { heard, .. } => *heard = Instant::now(),
            Instance::Pending => {}
        }
        if !status.state.is_terminal() {
            return;
        }
        job.instances[index] = Instance::Terminal(status.state);
        job.durable.terminal.insert(index, status.state);
        if let Err(e) = job.durable.save(&self.opts) {
            // Not fatal: after a restart the instance is reconciled and
            // its terminal state learnt again.
            eprintln!("agora-execute: cannot save the state file: {e}");
        }
        *job.report.terminal.entry(status.state).or_default() += 1;
        if status.state == TaskState::Finished {
            job.report.finished += 1;
        }
        self.finish_if_done(&mut job, driver);
    }

    fn agent_lost(&mut self, _driver: &SchedulerDriver, agent_id: &AgentId) {
        if self.opts.print_updates {
            println!("agent {agent_id} lost");
        }
        self.lock().ledger.record(json!({
            "event": "agent_lost",
            "agent_id": agent_id.as_str(),
        }));
    }

    fn executor_lost(
        &mut self,
        _driver: &SchedulerDriver,
        _executor_id: &ExecutorId,
        _agent_id: &AgentId,
        _status: Option<i32>,
    ) {
    }

    fn error(&mut self, _driver: &SchedulerDriver, message: &str) {
        eprintln!("framework error: {message}");
        let mut job = self.lock();
        job.ledger
            .record(json!({ "event": "error", "message": message }));
        job.report.error = Some(message.to_string());
    }
}

// === impl StateFile ===

impl StateFile {
    /// Loads `path` if it exists (an absent file is an empty record).
    fn load(path: Option<&Path>, opts: &ExecuteOptions) -> anyhow::Result<StateFile> {
        let mut state = StateFile {
            path: path.map(Path::to_path_buf),
            ..StateFile::default()
        };
        let Some(path) = path else {
            return Ok(state);
        };
        let text = match std::fs::read_to_string(path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(state),
            Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
        };
        let value: Value = serde_json::from_str(&text)
            .with_context(|| format!("{} is not a state file", path.display()))?;
        if value["name"].as_str() != Some(opts.name.as_str())
            || value["instances"].as_u64() != Some(opts.instances as u64)
        {
            bail!(
                "{} records a job {:?} of {} instances, not {:?} of {}: use another state file",
                path.display(),
                value["name"],
                value["instances"],
                opts.name,
                opts.instances
            );
        }
        state.framework_id = value["framework_id"].as_str().map(FrameworkId::new);
        if let Some(launched) = value["launched"].as_object() {
            for (index, agent) in launched {
                if let (Ok(index), Some(agent)) = (index.parse::<usize>(), agent.as_str()) {
                    if index < opts.instances {
                        state.launched.insert(index, AgentId::new(agent));
                    }
                }
            }
        }
        if let Some(terminal) = value["terminal"].as_object() {
            for (index, task_state) in terminal {
                let parsed = serde_json::from_value::<TaskState>(task_state.clone());
                if let (Ok(index), Ok(task_state)) = (index.parse::<usize>(), parsed) {
                    if index < opts.instances && task_state.is_terminal() {
                        state.terminal.insert(index, task_state);
                    }
                }
            }
        }
        Ok(state)
    }

    /// Writes the record durably: a temporary file, fsync, rename over
    /// the old one, fsync of the directory. A no-op without a path.
    fn save(&self, opts: &ExecuteOptions) -> std::io::Result<()> {
        let Some(path) = &self.path else {
            return Ok(());
        };
        let launched: serde_json::Map<String, Value> = self
            .launched
            .iter()
            .map(|(i, a)| (i.to_string(), json!(a.as_str())))
            .collect();
        let terminal: serde_json::Map<String, Value> = self
            .terminal
            .iter()
            .map(|(i, s)| (i.to_string(), json!(s)))
            .collect();
        let value = json!({
            "name": opts.name,
            "instances": opts.instances,
            "framework_id": self.framework_id.as_ref().map(|f| f.as_str().to_string()),
            "launched": launched,
            "terminal": terminal,
        });
        let tmp = path.with_extension("tmp");
        {
            let mut file = File::create(&tmp)?;
            file.write_all(value.to_string().as_bytes())?;
            file.sync_all()?;
        }
        std::fs::rename(&tmp, path)?;
        let dir = path
            .parent()
            .filter(|d| !d.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        File::open(dir)?.sync_all()
    }
}

// === impl Ledger ===

impl Ledger {
    fn open(path: Option<&Path>) -> anyhow::Result<Ledger> {
        let file = match path {
            Some(path) => Some(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)
                    .with_context(|| format!("opening ledger {}", path.display()))?,
            ),
            None => None,
        };
        Ok(Ledger { file })
    }

    /// Appends one line in one write (the file is unbuffered, so the line
    /// is with the kernel when this returns and survives a SIGKILL).
    fn record(&mut self, mut line: Value) {
        let Some(file) = self.file.as_mut() else {
            return;
        };
        line["at"] = json!(agora_proto::now_timestamp());
        let mut text = line.to_string();
        text.push('\n');
        if let Err(e) = file.write_all(text.as_bytes()) {
            eprintln!("agora-execute: cannot write the ledger: {e}");
        }
    }

    fn update(&mut self, status: &TaskStatus) {
        self.record(json!({
            "event": "update",
            "task_id": status.task_id.as_str(),
            "state": status.state,
            "uuid": status.uuid,
            "source": status.source,
            "reason": status.reason,
            "agent_id": status.agent_id.as_ref().map(|a| a.as_str()),
            "message": status.message,
        }));
    }
}

// === impl Job ===

impl Job {
    /// Instances launched but not terminal, and silent for at least
    /// `quiet`, with their agents; marks them as just heard of.
    fn take_silent(&mut self, now: Instant, quiet: Duration) -> Vec<(TaskId, Option<AgentId>)> {
        let name = self.name.clone();
        let mut out = Vec::new();
        for (index, instance) in self.instances.iter_mut().enumerate() {
            if let Instance::Launched { agent_id, heard } = instance {
                if now.saturating_duration_since(*heard) >= quiet {
                    *heard = now;
                    out.push((task_id(&name, index), Some(agent_id.clone())));
                }
            }
        }
        out
    }
}
/// The task id of instance `index`: `NAME-index`.
fn task_id(name: &str, index: usize) -> TaskId {
    TaskId::new(format!("{name}-{index}"))
}

/// The instance a task id of this job names.
fn instance_index(name: &str, task_id: &TaskId) -> Option<usize> {
    task_id
        .as_str()
        .strip_prefix(name)?
        .strip_prefix('-')?
        .parse()
        .ok()
}

/// Runs the job to completion (or until `timeout`) and reports how it ended.
pub async fn execute(opts: ExecuteOptions) -> anyhow::Result<ExecuteReport> {
    if opts.instances == 0 {
        bail!("--instances must be at least 1");
    }
    if opts.resources.is_empty() {
        bail!("--resources must name at least one resource, e.g. 'cpus:0.1;mem:32'");
    }
    if opts.reconcile_interval.is_zero() {
        bail!("--reconcile-interval must be positive");
    }
    let durable = StateFile::load(opts.state_file.as_deref(), &opts)?;
    let framework_id = match (&opts.framework_id, &durable.framework_id) {
        (Some(given), Some(saved)) if given != saved => {
            bail!("--framework-id {given} differs from {saved} recorded in the state file")
        }
        (given, saved) => given.clone().or_else(|| saved.clone()),
    };
    let ledger = Ledger::open(opts.ledger.as_deref())?;

    let now = Instant::now();
    let mut report = ExecuteReport {
        framework_id: framework_id.clone(),
        ..ExecuteReport::default()
    };
    let mut instances = vec![Instance::Pending; opts.instances];
    let mut pending = VecDeque::new();
    for (index, instance) in instances.iter_mut().enumerate() {
        if let Some(state) = durable.terminal.get(&index) {
            *instance = Instance::Terminal(*state);
            *report.terminal.entry(*state).or_default() += 1;
            if *state == TaskState::Finished {
                report.finished += 1;
            }
        } else if let Some(agent_id) = durable.launched.get(&index) {
            *instance = Instance::Launched {
                agent_id: agent_id.clone(),
                heard: now,
            };
        } else {
            pending.push_back(index);
        }
    }

    let mut framework = FrameworkInfo::new(opts.name.clone());
    framework.id = framework_id;
    framework.checkpoint = opts.checkpoint;
    framework.failover_timeout = opts.failover_timeout;
    framework.roles = opts.role.iter().cloned().collect();
    framework.user = std::env::var("USER").unwrap_or_default();
    let job = Arc::new(Mutex::new(Job {
        name: opts.name.clone(),
        instances,
        pending,
        durable,
        ledger,
        report,
        suppressed: false,
        done: false,
    }));
    let scheduler = ExecuteScheduler {
        opts: opts.clone(),
        job: job.clone(),
        started: now,
    };
    let mut config = DriverConfig::new(opts.master.clone());
    config.credential = opts.credential.clone();
    config.tls = opts.tls.clone();
    let driver = SchedulerDriver::new(scheduler, framework, config);
    driver.start()?;
    let reconciler = tokio::spawn(reconcile_loop(
        driver.clone(),
        job.clone(),
        opts.reconcile_interval,
    ));
    let status = match opts.timeout {
        Some(limit) => match tokio::time::timeout(limit, driver.join_async()).await {
            Ok(status) => status,
            Err(_) => {
                reconciler.abort();
                let _ = driver.stop(false);
                let _ = tokio::time::timeout(Duration::from_secs(5), driver.join_async()).await;
                let job = job
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                bail!(
                    "timed out after {:.1} s: {}",
                    limit.as_secs_f64(),
                    job.report.summary(opts.instances)
                );
            }
        },
        None => driver.join_async().await,
    };
    reconciler.abort();
    let mut report = job
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .report
        .clone();
    if status == DriverStatus::Aborted && report.error.is_none() {
        report.error = Some("scheduler driver aborted".to_string());
    }
    Ok(report)
}

/// How a status update is printed: `TASK STATE`, then the reason and the
/// message when there are, as in
/// `t-0 TASK_FAILED REASON_CONTAINER_LIMITATION_MEMORY: Memory limit …`.
pub fn update_line(status: &TaskStatus) -> String {
    let reason = status
        .reason
        .and_then(|r| serde_json::to_value(r).ok())
        .and_then(|v| v.as_str().map(str::to_string));
    let mut line = format!("{} {}", status.task_id, status.state);
    match (reason, status.message.as_deref()) {
        (Some(reason), Some(message)) => {
            line.push_str(&format!(" {reason}: {message}"));
        }
        (Some(reason), None) => line.push_str(&format!(" {reason}")),
        (None, Some(message)) => line.push_str(&format!(" ({message})")),
        (None, None) => {}
    }
    line
}

/// Every `interval`, reconciles the instances launched but silent for
/// that long: a launch or update lost to a failure shows up as the
/// master's answer (the task's state, or `TASK_LOST` for a task it does
/// not know).
async fn reconcile_loop(driver: SchedulerDriver, job: Arc<Mutex<Job>>, interval: Duration) {
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        tick.tick().await;
        if driver.status() != DriverStatus::Running {
            return;
        }
        let tasks = job
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take_silent(Instant::now(), interval);
        if !tasks.is_empty() {
            tracing::info!(tasks = tasks.len(), "reconciling silent instances");
            let _ = driver.reconcile_tasks(&tasks);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn updates_print_their_reason() {
        let mut status = TaskStatus::new(
            TaskId::new("t-0"),
            agora_proto::TaskState::Failed,
            agora_proto::Source::SourceAgent,
        );
        assert_eq!(update_line(&status), "t-0 TASK_FAILED");
        status.message = Some("Memory limit exceeded".into());
        assert_eq!(
            update_line(&status),
            "t-0 TASK_FAILED (Memory limit exceeded)"
        );
        status.reason = Some(agora_proto::Reason::ReasonContainerLimitationMemory);
        assert_eq!(
            update_line(&status),
            "t-0 TASK_FAILED REASON_CONTAINER_LIMITATION_MEMORY: Memory limit exceeded"
        );
    }

    #[test]
    fn instance_ids_round_trip() {
        assert_eq!(instance_index("job", &task_id("job", 17)), Some(17));
        assert_eq!(instance_index("job", &TaskId::new("jobx-1")), None);
        assert_eq!(instance_index("job", &TaskId::new("other-1")), None);
    }

    #[test]
    fn state_file_round_trips_and_checks_the_job() {
        let dir = std::env::temp_dir().join(format!("agora-execute-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("state.json");
        let opts = ExecuteOptions {
            name: "job".into(),
            ..ExecuteOptions::new("127.0.0.1:5050", "true", 4)
        };
        let mut state = StateFile::load(Some(&path), &opts).unwrap();
        assert!(state.launched.is_empty() && state.framework_id.is_none());
        state.framework_id = Some(FrameworkId::new("fw-1"));
        state.launched.insert(0, AgentId::new("a1"));
        state.launched.insert(2, AgentId::new("a2"));
        state.terminal.insert(0, TaskState::Finished);
        state.save(&opts).unwrap();

        let loaded = StateFile::load(Some(&path), &opts).unwrap();
        assert_eq!(loaded.framework_id, Some(FrameworkId::new("fw-1")));
        assert_eq!(loaded.launched, state.launched);
        assert_eq!(loaded.terminal, state.terminal);

        let other = ExecuteOptions::new("127.0.0.1:5050", "true", 5);
        assert!(StateFile::load(Some(&path), &other).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
