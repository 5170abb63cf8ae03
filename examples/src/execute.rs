//! Run K copies of a shell command on the cluster through the built-in
//! command executor, print every status update, and report how they ended.
//!
//! This is the smallest useful framework: it packs as many instances into
//! each offer as fit, declines what it cannot use, suppresses offers once
//! everything is launched, and tears itself down when every instance has
//! reached a terminal state.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use agora_proto::{
    AgentId, CommandInfo, ExecutorId, Filters, FrameworkId, FrameworkInfo, MasterInfo, Offer,
    OfferId, Resources, TaskId, TaskInfo, TaskState, TaskStatus,
};
use agora_scheduler::{DriverConfig, DriverStatus, Scheduler, SchedulerDriver};
use anyhow::bail;

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
}

/// How a run ended.
#[derive(Debug, Clone, Default)]
pub struct ExecuteReport {
    /// Instances that reached TASK_FINISHED.
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

#[derive(Default)]
struct Job {
    pending: VecDeque<usize>,
    launched: usize,
    terminal: BTreeMap<TaskId, TaskState>,
    report: ExecuteReport,
    suppressed: bool,
}

struct ExecuteScheduler {
    opts: ExecuteOptions,
    job: Arc<Mutex<Job>>,
    started: Instant,
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
            name: format!("{} instance {index}", self.opts.name),
            task_id: TaskId::new(format!("{}-{index}", self.opts.name)),
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
        }
    }
}

impl Scheduler for ExecuteScheduler {
    fn registered(
        &mut self,
        _driver: &SchedulerDriver,
        framework_id: &FrameworkId,
        master: &MasterInfo,
    ) {
        if self.opts.print_updates {
            println!(
                "registered as {framework_id} with master {}",
                master.address
            );
        }
        self.job.lock().expect("job lock").report.framework_id = Some(framework_id.clone());
    }

    fn resource_offers(&mut self, driver: &SchedulerDriver, offers: Vec<Offer>) {
        let mut job = self.job.lock().expect("job lock");
        for offer in offers {
            let mut left = offer.resources.clone();
            let mut tasks = Vec::new();
            while let Some(&index) = job.pending.front() {
                match left.checked_sub(&self.opts.resources) {
                    Ok(rest) => {
                        left = rest;
                        job.pending.pop_front();
                        tasks.push(self.task_for(index, &offer.agent_id));
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
            } else {
                job.launched += tasks.len();
                let _ = driver.launch_tasks(
                    std::slice::from_ref(&offer.id),
                    tasks,
                    Filters {
                        refuse_seconds: Some(1.0),
                    },
                );
            }
        }
        if job.pending.is_empty() && !job.suppressed {
            job.suppressed = true;
            let _ = driver.suppress_offers();
        }
    }

    fn offer_rescinded(&mut self, _driver: &SchedulerDriver, _offer_id: &OfferId) {}

    fn status_update(&mut self, driver: &SchedulerDriver, status: &TaskStatus) {
        if self.opts.print_updates {
            let message = status
                .message
                .as_deref()
                .map(|m| format!(" ({m})"))
                .unwrap_or_default();
            println!("{} {}{}", status.task_id, status.state, message);
        }
        let mut job = self.job.lock().expect("job lock");
        job.report.updates += 1;
        job.report
            .history
            .entry(status.task_id.clone())
            .or_default()
            .push(status.state);
        if !status.state.is_terminal() || job.terminal.contains_key(&status.task_id) {
            return;
        }
        job.terminal.insert(status.task_id.clone(), status.state);
        *job.report.terminal.entry(status.state).or_default() += 1;
        if status.state == TaskState::Finished {
            job.report.finished += 1;
        }
        if job.terminal.len() == self.opts.instances {
            job.report.elapsed = self.started.elapsed();
            let _ = driver.stop(false);
        }
    }

    fn agent_lost(&mut self, _driver: &SchedulerDriver, agent_id: &AgentId) {
        if self.opts.print_updates {
            println!("agent {agent_id} lost");
        }
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
        self.job.lock().expect("job lock").report.error = Some(message.to_string());
    }
}

/// Runs the job to completion (or until `timeout`) and reports how it ended.
pub async fn execute(opts: ExecuteOptions) -> anyhow::Result<ExecuteReport> {
    if opts.instances == 0 {
        bail!("--instances must be at least 1");
    }
    if opts.resources.is_empty() {
        bail!("--resources must name at least one resource, e.g. 'cpus:0.1;mem:32'");
    }
    let mut framework = FrameworkInfo::new(opts.name.clone());
    framework.checkpoint = opts.checkpoint;
    framework.failover_timeout = opts.failover_timeout;
    framework.roles = opts.role.iter().cloned().collect();
    framework.user = std::env::var("USER").unwrap_or_default();
    let job = Arc::new(Mutex::new(Job {
        pending: (0..opts.instances).collect(),
        ..Job::default()
    }));
    let scheduler = ExecuteScheduler {
        opts: opts.clone(),
        job: job.clone(),
        started: Instant::now(),
    };
    let driver = SchedulerDriver::new(scheduler, framework, DriverConfig::new(opts.master.clone()));
    driver.start()?;
    let status = match opts.timeout {
        Some(limit) => match tokio::time::timeout(limit, driver.join_async()).await {
            Ok(status) => status,
            Err(_) => {
                let _ = driver.stop(false);
                let _ = tokio::time::timeout(Duration::from_secs(5), driver.join_async()).await;
                let job = job.lock().expect("job lock");
                bail!(
                    "timed out after {:.1} s: {}",
                    limit.as_secs_f64(),
                    job.report.summary(opts.instances)
                );
            }
        },
        None => driver.join_async().await,
    };
    let mut report = job.lock().expect("job lock").report.clone();
    if status == DriverStatus::Aborted && report.error.is_none() {
        report.error = Some("scheduler driver aborted".to_string());
    }
    Ok(report)
}
