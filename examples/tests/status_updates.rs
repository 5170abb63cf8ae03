//! Each status update reaches the scheduler once (issue 25, item 8).
//!
//! 2,000 tasks run through the native scheduler SDK on two agents while
//! the master is stopped (SIGSTOP) for 20 s mid-job. Meanwhile the tasks
//! that were running end, their agents retry the unacknowledged updates
//! into the stopped master's socket (every second: short retry flags) and
//! the scheduler asks for reconciliation of every task it has not seen
//! end. Once the master runs again (SIGCONT) and the job is done, the
//! scheduler reconciles all 2,000 tasks (the master remembers only the
//! last 1,000 completed ones and answers `TASK_LOST` for the others).
//!
//! The `Scheduler` must have seen each task's terminal state exactly
//! once, and no (task, uuid) twice; the master must have forwarded each
//! reliable update once (its `sent` counter equals the distinct updates
//! delivered).

mod support;

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use agora_proto::{
    AgentId, CommandInfo, ExecutorId, ExecutorInfo, Filters, FrameworkId, FrameworkInfo,
    MasterInfo, Offer, Reason, Resources, Source, TaskId, TaskInfo, TaskState, TaskStatus,
};
use agora_scheduler::{DriverConfig, Scheduler, SchedulerDriver};
use nix::sys::signal::Signal;
use support::*;

const TASKS: usize = 2000;
const AGENT: &str = "cpus:8;mem:16384;disk:1024";
/// Retries well inside the pause, so every update in flight is retried.
const AGENT_FLAGS: &[&str] = &[
    "--status-update-retry-min",
    "1s",
    "--status-update-retry-max",
    "2s",
];
const MASTER_FLAGS: &[&str] = &["--allocation-interval", "200ms"];
/// How long the master is stopped: the 20 s.
const PAUSE: Duration = Duration::from_secs(20);
/// Terminal tasks before the pause.
const DONE_BEFORE_PAUSE: usize = 400;
const PROBE: &str = "once-probe";

/// What the scheduler saw of one update.
#[derive(Debug, Clone)]
struct Seen {
    state: TaskState,
    uuid: Option<String>,
    #[allow(dead_code)] // shown in failure messages
    source: Source,
    reason: Option<Reason>,
}

#[derive(Default)]
struct Job {
    pending: VecDeque<usize>,
    launched: HashMap<TaskId, AgentId>,
    updates: BTreeMap<TaskId, Vec<Seen>>,
}

impl Job {
    fn terminal(&self) -> usize {
        self.updates
            .iter()
            .filter(|(id, seen)| id.as_str() != PROBE && seen.iter().any(|s| s.state.is_terminal()))
            .count()
    }

    /// Launched tasks the scheduler has not seen end.
    fn open(&self) -> Vec<(TaskId, Option<AgentId>)> {
        self.launched
            .iter()
            .filter(|(id, _)| {
                !self
                    .updates
                    .get(*id)
                    .is_some_and(|seen| seen.iter().any(|s| s.state.is_terminal()))
            })
            .map(|(id, agent)| (id.clone(), Some(agent.clone())))
            .collect()
    }
}

struct Once {
    executor: String,
    job: Arc<Mutex<Job>>,
}

impl Scheduler for Once {
    fn registered(&mut self, _d: &SchedulerDriver, _f: &FrameworkId, _m: &MasterInfo) {}

    fn resource_offers(&mut self, driver: &SchedulerDriver, offers: Vec<Offer>) {
        let task_resources = Resources::parse("cpus:0.025;mem:4").unwrap();
        let executor_resources = Resources::parse("cpus:0.1;mem:64").unwrap();
        let mut job = self.job.lock().unwrap();
        for offer in offers {
            // The executor's share is taken once per offer: a simple,
            // safe over-estimate when it already runs there.
            let mut left = offer
                .resources
                .checked_sub(&executor_resources)
                .unwrap_or_default();
            let mut tasks = Vec::new();
            while let Some(&i) = job.pending.front() {
                let Ok(rest) = left.checked_sub(&task_resources) else {
                    break;
                };
                left = rest;
                job.pending.pop_front();
                let id = TaskId::new(format!("once-{i}"));
                job.launched.insert(id.clone(), offer.agent_id.clone());
                tasks.push(TaskInfo {
                    container: None,
                    allocation_role: None,
                    launch_stamp: None,
                    name: id.to_string(),
                    task_id: id,
                    agent_id: offer.agent_id.clone(),
                    resources: task_resources.clone(),
                    executor: Some(ExecutorInfo {
                        container: None,
                        executor_id: ExecutorId::new("once-executor"),
                        framework_id: None,
                        command: CommandInfo::program(self.executor.clone()),
                        resources: executor_resources.clone(),
                        name: "once".into(),
                        source: "status_updates".into(),
                        api: Default::default(),
                        shutdown_grace_period: None,
                        data: None,
                        labels: Default::default(),
                    }),
                    command: None,
                    // Long enough that hundreds run across the pause.
                    data: Some(format!("run /bin/sleep {}", 2 + i % 3).into_bytes().into()),
                    kill_grace_period: None,
                    labels: BTreeMap::new(),
                    task_group: None,
                });
            }
            let refuse = Filters {
                refuse_seconds: Some(0.1),
            };
            if tasks.is_empty() {
                let _ = driver.decline_offer(&offer.id, refuse);
            } else {
                let _ = driver.launch_tasks(std::slice::from_ref(&offer.id), tasks, refuse);
            }
        }
    }

    fn status_update(&mut self, _d: &SchedulerDriver, status: &TaskStatus) {
        self.job
            .lock()
            .unwrap()
            .updates
            .entry(status.task_id.clone())
            .or_default()
            .push(Seen {
                state: status.state,
                uuid: status.uuid.clone(),
                source: status.source,
                reason: status.reason,
            });
    }
}

/// The master's `agora_master_status_updates_total{event="EVENT"}`.
fn status_updates(cluster: &TestCluster, event: &str) -> u64 {
    let (_, text) = cluster.get("/metrics").expect("GET /metrics");
    let series = format!("agora_master_status_updates_total{{event=\"{event}\"}}");
    text.lines()
        .find(|l| l.starts_with(&series))
        .and_then(|l| l.split_whitespace().last())
        .and_then(|v| v.parse::<f64>().ok())
        .map_or(0, |v| v as u64)
}

/// Live status update streams of every agent.
fn agent_streams(cluster: &TestCluster) -> u64 {
    cluster
        .agents
        .iter()
        .map(|agent| {
            http_get(agent.addr, "/state")
                .ok()
                .and_then(|(_, body)| serde_json::from_str::<serde_json::Value>(&body).ok())
                .and_then(|state| state["status_update_streams"].as_u64())
                .unwrap_or(u64::MAX / 4)
        })
        .sum()
}

#[test]
fn a_master_paused_mid_job_delivers_each_update_once() {
    let cluster = TestCluster::start_full(2, AGENT, MASTER_FLAGS, AGENT_FLAGS);
    let job = Arc::new(Mutex::new(Job {
        pending: (0..TASKS).collect(),
        ..Job::default()
    }));
    let driver = SchedulerDriver::new(
        Once {
            executor: bin("test-executor").display().to_string(),
            job: job.clone(),
        },
        FrameworkInfo::new("once"),
        DriverConfig::new(cluster.master_address()),
    );
    driver.start().expect("driver start");
    let context = |cluster: &TestCluster| cluster.logs();

    wait_until(
        Duration::from_secs(180),
        &format!("{DONE_BEFORE_PAUSE} tasks to end before the pause"),
        || context(&cluster),
        || (job.lock().unwrap().terminal() >= DONE_BEFORE_PAUSE).then_some(()),
    );
    let running_at_pause = job.lock().unwrap().open().len();
    cluster.master.signal(Signal::SIGSTOP);
    let paused = Instant::now();
    // Halfway through, the scheduler asks about every task it has not
    // seen end: the call waits in the stopped master's socket.
    std::thread::sleep(PAUSE / 2);
    let open = job.lock().unwrap().open();
    let _ = driver.reconcile_tasks(&open);
    std::thread::sleep(PAUSE.saturating_sub(paused.elapsed()));
    cluster.master.signal(Signal::SIGCONT);
    assert!(
        running_at_pause >= 100,
        "only {running_at_pause} tasks ran when the master stopped: the pause tests little"
    );

    wait_until(
        Duration::from_secs(300),
        "every task to end",
        || {
            format!(
                "{} of {TASKS} ended\n{}",
                job.lock().unwrap().terminal(),
                context(&cluster)
            )
        },
        || (job.lock().unwrap().terminal() >= TASKS).then_some(()),
    );
    // Every agent's streams drained: no retry is still on its way.
    wait_until(
        Duration::from_secs(60),
        "the agents' status update streams to drain",
        || format!("{} streams\n{}", agent_streams(&cluster), context(&cluster)),
        || (agent_streams(&cluster) == 0).then_some(()),
    );
    // Reconcile every task, then a task the master never knew: its answer
    // comes after all the others on the connection.
    let mut all: Vec<(TaskId, Option<AgentId>)> = job
        .lock()
        .unwrap()
        .launched
        .iter()
        .map(|(id, agent)| (id.clone(), Some(agent.clone())))
        .collect();
    all.push((TaskId::new(PROBE), None));
    driver.reconcile_tasks(&all).expect("reconcile");
    wait_until(
        Duration::from_secs(60),
        "the answer about the probe task",
        || context(&cluster),
        || {
            job.lock()
                .unwrap()
                .updates
                .contains_key(&TaskId::new(PROBE))
                .then_some(())
        },
    );
    let forwarded = status_updates(&cluster, "sent");
    let repeated = status_updates(&cluster, "repeated");
    let _ = driver.stop(false);

    let job = job.lock().unwrap();
    let mut twice = Vec::new();
    let mut terminal_again = Vec::new();
    let mut not_finished = Vec::new();
    let mut reliable = 0u64;
    for (task, seen) in job.updates.iter().filter(|(id, _)| id.as_str() != PROBE) {
        let mut uuids = HashSet::new();
        for s in seen {
            if let Some(uuid) = &s.uuid {
                reliable += 1;
                if !uuids.insert(uuid) {
                    twice.push(format!("{task}: {seen:?}"));
                }
            }
        }
        let terminal: Vec<&Seen> = seen.iter().filter(|s| s.state.is_terminal()).collect();
        if terminal.len() != 1 {
            terminal_again.push(format!("{task}: {seen:?}"));
        }
        if terminal
            .first()
            .is_none_or(|s| s.state != TaskState::Finished)
        {
            not_finished.push(format!("{task}: {seen:?}"));
        }
    }
    let answers = job
        .updates
        .values()
        .flatten()
        .filter(|s| s.reason == Some(Reason::ReasonReconciliation))
        .count();
    eprintln!(
        "once: {running_at_pause} tasks ran at the pause; {reliable} reliable updates delivered, \
         {forwarded} forwarded by the master, {repeated} agents' re-sends not forwarded, \
         {answers} reconciliation answers delivered; {} tasks with a uuid twice, {} with other \
         than one terminal update",
        twice.len(),
        terminal_again.len()
    );
    assert!(
        not_finished.is_empty(),
        "{} tasks did not finish first, e.g. {:?}",
        not_finished.len(),
        not_finished.first()
    );
    assert!(
        twice.is_empty() && terminal_again.is_empty(),
        "{} tasks saw an update twice, {} saw other than one terminal update; e.g.\n{}\n{}",
        twice.len(),
        terminal_again.len(),
        twice.iter().take(3).cloned().collect::<Vec<_>>().join("\n"),
        terminal_again
            .iter()
            .take(3)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert_eq!(
        job.updates.len(),
        TASKS + 1,
        "every task (and the probe) was heard of"
    );
    assert_eq!(
        forwarded, reliable,
        "the master forwarded {forwarded} updates for {reliable} distinct ones"
    );
}
