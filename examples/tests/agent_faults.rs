//! Fault injection around the agent, on real processes on 127.0.0.1: the
//! agent SIGKILLed mid-job and restarted on the same work dir (once, and
//! repeatedly in a soak), and an executor SIGKILLed mid-job.
//!
//! Every job runs on `ledger-executor`, which writes each update it sends
//! (and each acknowledgement it gets) to a ledger in its sandbox before
//! handing it to its driver. The check compares the ledgers with what the
//! scheduler received: every update an executor sent arrives, in order per
//! task (duplicates only where at-least-once allows: a repeat of the latest
//! one), nothing arrives that no one sent, and every task reaches exactly
//! one terminal state.
//!
//! An executor whose agent is down for long keeps what it sends; more than
//! a frame's worth of it (16 MiB) must still get through when the agent
//! comes back.

mod support;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

use agora_proto::{
    CommandInfo, ExecutorId, ExecutorInfo, Filters, FrameworkInfo, Reason, Resources, Source,
    TaskId, TaskInfo, TaskState, TaskStatus,
};
use agora_scheduler::SchedulerDriver;
use support::{bin, http_get, start_framework, wait_until, SchedEvent, TestCluster};

const AGENT: &str = "cpus:32;mem:32768;disk:4096;ports:[31000-32000]";
/// Fast retries so a lost message costs little test time.
const AGENT_FLAGS: &[&str] = &[
    "--status-update-retry-min",
    "200ms",
    "--status-update-retry-max",
    "2s",
];

/// One job: `tasks` tasks spread over `executors` ledger executors.
struct Job {
    name: &'static str,
    tasks: usize,
    executors: usize,
    updates: u32,
    delay_ms: u64,
    /// Delay between the updates of the first executor's tasks (0: `delay_ms`),
    /// so a test can kill that executor while its tasks surely run.
    slow_delay_ms: u64,
    /// Bytes of `data` in each update.
    bytes: usize,
}

/// What the scheduler saw.
#[derive(Default)]
struct Seen {
    /// Per task, every update in arrival order.
    updates: HashMap<TaskId, Vec<TaskStatus>>,
    executors_lost: Vec<ExecutorId>,
    received: usize,
}

/// A ledger line.
#[derive(Debug, Clone)]
struct Sent {
    uuid: String,
    seq: u64,
    acked: bool,
}

/// The counts of one check, printed by each test.
#[derive(Debug, Default)]
#[allow(dead_code)] // Read through `Debug` in the tests' output.
struct Counts {
    tasks: usize,
    sent: usize,
    acked_by_agent: usize,
    received: usize,
    duplicates: usize,
    agent_generated: usize,
    lost: usize,
}

// === impl Job ===

impl Job {
    fn task_name(&self, i: usize) -> String {
        format!("{}-{i:04}", self.name)
    }

    fn executor_of(&self, i: usize) -> String {
        format!("{}-exec-{}", self.name, i % self.executors)
    }

    fn delay_ms(&self, i: usize) -> u64 {
        if i.is_multiple_of(self.executors) && self.slow_delay_ms > 0 {
            self.slow_delay_ms
        } else {
            self.delay_ms
        }
    }

    fn task(&self, i: usize, offer: &agora_proto::Offer) -> TaskInfo {
        let program = bin("ledger-executor").display().to_string();
        TaskInfo {
            container: None,
            allocation_role: None,
            launch_stamp: None,
            name: self.task_name(i),
            task_id: TaskId::new(self.task_name(i)),
            agent_id: offer.agent_id.clone(),
            resources: Resources::parse("cpus:0.01;mem:1").unwrap(),
            executor: Some(ExecutorInfo {
                container: None,
                executor_id: ExecutorId::new(self.executor_of(i)),
                framework_id: None,
                command: CommandInfo::program(program),
                resources: Resources::parse("cpus:0.1;mem:16").unwrap(),
                name: "ledger".into(),
                source: self.name.into(),
                api: Default::default(),
                shutdown_grace_period: None,
                data: None,
                labels: Default::default(),
            }),
            command: None,
            data: Some(
                format!(
                    "updates={};delay_ms={};bytes={}",
                    self.updates,
                    self.delay_ms(i),
                    self.bytes
                )
                .as_str()
                .into(),
            ),
            kill_grace_period: Some(1.0),
            labels: BTreeMap::new(),
            task_group: None,
        }
    }

    /// Runs the job to completion (every task terminal), calling `fault`
    /// after each received update; fails after `timeout`.
    fn run(
        &self,
        cluster: &mut TestCluster,
        timeout: Duration,
        mut fault: impl FnMut(&mut TestCluster, &Seen),
    ) -> (SchedulerDriver, Seen) {
        let mut info = FrameworkInfo::new(self.name);
        info.checkpoint = true;
        info.failover_timeout = 60.0;
        let (driver, rx) = start_framework(&cluster.master_address(), info);
        let mut seen = Seen::default();
        let mut next = 0;
        let mut terminal: HashSet<TaskId> = HashSet::new();
        let deadline = Instant::now() + timeout;
        while terminal.len() < self.tasks {
            let event = next_event(&rx, deadline, || {
                format!(
                    "{}: {} of {} tasks terminal after {timeout:?}\n{}",
                    self.name,
                    terminal.len(),
                    self.tasks,
                    cluster.logs()
                )
            });
            match event {
                SchedEvent::Offers(offers) => {
                    for offer in offers {
                        if next >= self.tasks {
                            let _ = driver.decline_offer(&offer.id, Filters::default());
                            continue;
                        }
                        let tasks: Vec<TaskInfo> =
                            (next..self.tasks).map(|i| self.task(i, &offer)).collect();
                        next = self.tasks;
                        driver
                            .launch_tasks(
                                std::slice::from_ref(&offer.id),
                                tasks,
                                Filters::default(),
                            )
                            .expect("launch");
                    }
                }
                SchedEvent::Update(status) => {
                    if status.state.is_terminal() {
                        terminal.insert(status.task_id.clone());
                    }
                    seen.received += 1;
                    seen.updates
                        .entry(status.task_id.clone())
                        .or_default()
                        .push(status);
                    fault(cluster, &seen);
                }
                SchedEvent::ExecutorLost(executor_id, _, _) => {
                    seen.executors_lost.push(executor_id)
                }
                _ => {}
            }
        }
        // Late duplicates (resent heads whose ack crossed a restart) may
        // still be in flight; take what is already queued.
        while let Ok(event) = rx.recv_timeout(Duration::from_millis(300)) {
            match event {
                SchedEvent::Update(status) => {
                    seen.received += 1;
                    seen.updates
                        .entry(status.task_id.clone())
                        .or_default()
                        .push(status);
                }
                SchedEvent::ExecutorLost(executor_id, _, _) => {
                    seen.executors_lost.push(executor_id)
                }
                _ => {}
            }
        }
        (driver, seen)
    }
}

fn next_event(
    rx: &Receiver<SchedEvent>,
    deadline: Instant,
    why: impl Fn() -> String,
) -> SchedEvent {
    let left = deadline.saturating_duration_since(Instant::now());
    match rx.recv_timeout(left) {
        Ok(event) => event,
        Err(_) => panic!("{}", why()),
    }
}

/// Every ledger under `root`, by task: the updates sent in order.
fn ledgers(root: &Path) -> HashMap<TaskId, Vec<Sent>> {
    let mut out: HashMap<TaskId, Vec<Sent>> = HashMap::new();
    let mut acked: HashSet<String> = HashSet::new();
    for path in walk(root)
        .into_iter()
        .filter(|p| p.file_name().is_some_and(|n| n == "ledger.jsonl"))
    {
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        for line in text.lines() {
            // A line torn by a SIGKILL of the executor is not a sent update.
            let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
                continue;
            };
            let uuid = v["uuid"].as_str().unwrap_or_default().to_string();
            match v["event"].as_str() {
                Some("sent") => out
                    .entry(TaskId::new(v["task"].as_str().unwrap_or_default()))
                    .or_default()
                    .push(Sent {
                        uuid,
                        seq: v["seq"].as_u64().unwrap_or_default(),
                        acked: false,
                    }),
                Some("acked") => {
                    acked.insert(uuid);
                }
                _ => {}
            }
        }
    }
    for sent in out.values_mut() {
        sent.sort_by_key(|s| s.seq);
        for s in sent.iter_mut() {
            s.acked = acked.contains(&s.uuid);
        }
    }
    out
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                out.extend(walk(&path));
            } else {
                out.push(path);
            }
        }
    }
    out
}

/// Compares ledgers with what the scheduler saw. For tasks of
/// `killed_executors`, only updates the agent acknowledged are owed (the
/// others died with the executor); for all others every sent update is.
fn check(job: &Job, cluster: &TestCluster, seen: &Seen, killed_executors: &[String]) -> Counts {
    let sent = ledgers(cluster.dir.path());
    let mut counts = Counts {
        tasks: job.tasks,
        received: seen.received,
        ..Counts::default()
    };
    let mut problems = Vec::new();
    for i in 0..job.tasks {
        let task = TaskId::new(job.task_name(i));
        let killed = killed_executors.contains(&job.executor_of(i));
        let ledger = sent.get(&task).cloned().unwrap_or_default();
        let received = seen.updates.get(&task).cloned().unwrap_or_default();
        counts.sent += ledger.len();
        counts.acked_by_agent += ledger.iter().filter(|s| s.acked).count();
        let seq_of: HashMap<&str, u64> = ledger.iter().map(|s| (s.uuid.as_str(), s.seq)).collect();
        let got: HashSet<&str> = received.iter().filter_map(|s| s.uuid.as_deref()).collect();
        counts.duplicates += received.len() - got.len();
        for s in &ledger {
            if !got.contains(s.uuid.as_str()) && (!killed || s.acked) {
                counts.lost += 1;
                problems.push(format!(
                    "{task}: update seq {} ({}) never arrived",
                    s.seq, s.uuid
                ));
            }
        }
        // In order: executor updates arrive with non-decreasing sequence
        // numbers (a repeat of the latest is an at-least-once duplicate).
        let mut last = None;
        for status in &received {
            let uuid = status.uuid.as_deref().unwrap_or_default();
            match seq_of.get(uuid) {
                Some(&seq) => {
                    if last.is_some_and(|l| seq < l) {
                        problems.push(format!("{task}: seq {seq} arrived after seq {last:?}"));
                    }
                    last = Some(seq);
                }
                None if status.source == Source::SourceAgent => counts.agent_generated += 1,
                None => problems.push(format!("{task}: update {uuid} was never sent")),
            }
        }
        let terminal: HashSet<(TaskState, &str)> = received
            .iter()
            .filter(|s| s.state.is_terminal())
            .map(|s| (s.state, s.uuid.as_deref().unwrap_or_default()))
            .collect();
        if terminal.len() != 1 {
            problems.push(format!("{task}: terminal updates {terminal:?}"));
        }
    }
    assert!(
        problems.is_empty(),
        "{} problems (counts {counts:?}):\n{}",
        problems.len(),
        problems[..problems.len().min(30)].join("\n")
    );
    counts
}

/// Executors the agent runs, from its `/state`: (executor id, pid, task states).
fn agent_executors(cluster: &TestCluster) -> Vec<(String, i32, Vec<String>)> {
    let Ok((200, body)) = http_get(cluster.agents[0].addr, "/state") else {
        return Vec::new();
    };
    let state: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
    let mut out = Vec::new();
    for fw in state["frameworks"].as_array().into_iter().flatten() {
        for ex in fw["executors"].as_array().into_iter().flatten() {
            let (Some(id), Some(pid)) = (ex["id"].as_str(), ex["pid"].as_i64()) else {
                continue;
            };
            let states = ex["tasks"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|t| t["state"].as_str().map(str::to_string))
                .collect();
            out.push((id.to_string(), pid as i32, states));
        }
    }
    out
}

/// A master and one agent. The agent listens on a fixed port (a free one,
/// found by binding port 0): its executors know the agent by that address,
/// so a restarted agent must come back on it for them to re-subscribe.
fn cluster() -> TestCluster {
    let mut cluster = TestCluster::start(0, AGENT);
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let work_dir = cluster.dir.path().join("agent-0");
    std::fs::create_dir_all(&work_dir).expect("agent dir");
    let mut args: Vec<String> = [
        "--master",
        &cluster.master_address(),
        "--listen",
        &format!("127.0.0.1:{port}"),
        "--work-dir",
        &work_dir.display().to_string(),
        "--resources",
        AGENT,
        "--command-executor",
        &bin("agora-command-executor").display().to_string(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.extend(AGENT_FLAGS.iter().map(|s| s.to_string()));
    args.extend(agora_examples::local::agent_user_flags());
    let log = cluster.dir.path().join("agent-0.log");
    cluster.agents.push(support::Proc::spawn(
        "agent 0",
        &bin("agora-agent"),
        &args,
        &work_dir,
        &log,
    ));
    cluster.wait_agents(1);
    cluster
}

#[test]
fn agent_sigkill_mid_job_and_restart_loses_nothing() {
    let mut cluster = cluster();
    let job = Job {
        name: "agentkill",
        tasks: 120,
        executors: 12,
        updates: 5,
        delay_ms: 20,
        slow_delay_ms: 0,
        bytes: 0,
    };
    let started = Instant::now();
    let mut restarted = false;
    let (driver, seen) = job.run(&mut cluster, Duration::from_secs(45), |cluster, seen| {
        if !restarted && seen.received >= 150 {
            restarted = true;
            cluster.agents[0].restart();
        }
    });
    assert!(restarted, "the job ended before the fault");
    let counts = check(&job, &cluster, &seen, &[]);
    eprintln!(
        "agent SIGKILL+restart: {counts:?} in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    assert_eq!(counts.sent, job.tasks * job.updates as usize);
    let _ = driver.stop(false);
}

#[test]
fn executor_sigkill_fails_its_tasks_and_reports_executor_lost() {
    let mut cluster = cluster();
    let job = Job {
        name: "execkill",
        tasks: 120,
        executors: 12,
        updates: 6,
        delay_ms: 60,
        slow_delay_ms: 1500,
        bytes: 0,
    };
    let started = Instant::now();
    let mut victim: Option<String> = None;
    let (driver, seen) = job.run(&mut cluster, Duration::from_secs(45), |cluster, seen| {
        if victim.is_none() && seen.received >= 100 {
            // The first executor's tasks take 1.5 s per update: once one of
            // them is seen running, killing it surely cuts tasks short.
            let slow = job.executor_of(0);
            let running = (0..job.tasks)
                .filter(|i| job.executor_of(*i) == slow)
                .any(|i| seen.updates.contains_key(&TaskId::new(job.task_name(i))));
            if running {
                if let Some((id, pid, _)) = agent_executors(cluster)
                    .into_iter()
                    .find(|(id, _, _)| *id == slow)
                {
                    let _ = nix::sys::signal::kill(
                        nix::unistd::Pid::from_raw(pid),
                        nix::sys::signal::Signal::SIGKILL,
                    );
                    victim = Some(id);
                }
            }
        }
    });
    let victim = victim.expect("no executor was killed");
    let counts = check(&job, &cluster, &seen, std::slice::from_ref(&victim));
    assert!(
        seen.executors_lost.iter().any(|e| e.as_str() == victim),
        "executor_lost for {victim} did not reach the scheduler: {:?}",
        seen.executors_lost
    );
    let mut failed = 0;
    for i in 0..job.tasks {
        let updates = &seen.updates[&TaskId::new(job.task_name(i))];
        let last = updates
            .iter()
            .rev()
            .find(|s| s.state.is_terminal())
            .unwrap();
        if job.executor_of(i) == victim {
            if last.state == TaskState::Failed {
                assert_eq!(
                    last.reason,
                    Some(Reason::ReasonExecutorTerminated),
                    "{last:?}"
                );
                assert_eq!(last.source, Source::SourceAgent);
                failed += 1;
            }
        } else {
            assert_eq!(last.state, TaskState::Finished, "{last:?}");
        }
    }
    assert!(failed > 0, "no task of the killed executor failed");
    eprintln!(
        "executor SIGKILL ({victim}): {failed} tasks failed; {counts:?} in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    let _ = driver.stop(false);
}

#[test]
fn soak_thousands_of_updates_through_repeated_agent_restarts() {
    let mut cluster = cluster();
    let job = Job {
        name: "soak",
        tasks: 200,
        executors: 20,
        updates: 15,
        delay_ms: 15,
        slow_delay_ms: 0,
        bytes: 0,
    };
    let started = Instant::now();
    let restarts_wanted = 5;
    let mut restarts = 0;
    let (driver, seen) = job.run(&mut cluster, Duration::from_secs(55), |cluster, seen| {
        if restarts < restarts_wanted && seen.received >= 300 * (restarts + 1) {
            restarts += 1;
            cluster.agents[0].restart();
        }
    });
    assert_eq!(
        restarts, restarts_wanted,
        "the job ended before every restart"
    );
    let counts = check(&job, &cluster, &seen, &[]);
    eprintln!(
        "soak, {restarts} agent restarts: {counts:?} in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    assert_eq!(counts.sent, job.tasks * job.updates as usize);
    assert_eq!(counts.lost, 0);
    let _ = driver.stop(false);
}

/// An executor whose agent is down keeps every update it sends. Here far
/// more than a frame's worth (16 MiB) piles up before the agent comes back
/// on its port: the executor re-subscribes listing the oldest updates and
/// sends the rest after, so every one arrives, in order per task, and is
/// acknowledged to the executor.
#[test]
fn more_than_a_frame_of_updates_piled_up_during_an_agent_outage_all_arrive() {
    let mut cluster = cluster();
    // 4 tasks x 80 updates x 64 KiB: 20 MiB of data, 27 MiB of base64.
    let job = Job {
        name: "backlog",
        tasks: 4,
        executors: 1,
        updates: 80,
        delay_ms: 40,
        slow_delay_ms: 0,
        bytes: 64 * 1024,
    };
    let all = job.tasks * job.updates as usize;
    let started = Instant::now();
    let mut piled_up = None;
    let (driver, seen) = job.run(&mut cluster, Duration::from_secs(120), |cluster, seen| {
        if piled_up.is_some() || seen.received == 0 {
            return;
        }
        cluster.agents[0].kill();
        let root = cluster.dir.path().to_path_buf();
        let ledger = wait_until(
            Duration::from_secs(30),
            "the executor to send every update while its agent is down",
            || {
                format!(
                    "{:?}",
                    ledgers(&root).values().map(Vec::len).collect::<Vec<_>>()
                )
            },
            || {
                let ledger = ledgers(&root);
                (ledger.values().map(Vec::len).sum::<usize>() == all).then_some(ledger)
            },
        );
        let unacknowledged = ledger.values().flatten().filter(|s| !s.acked).count();
        piled_up = Some(unacknowledged);
        cluster.agents[0].start();
    });
    let unacknowledged = piled_up.expect("the job ended before the agent was stopped");
    let pending_bytes = unacknowledged * job.bytes.div_ceil(3) * 4;
    assert!(
        pending_bytes > agora_proto::MAX_FRAME_BYTES,
        "only {unacknowledged} updates ({pending_bytes} bytes) piled up"
    );
    let counts = check(&job, &cluster, &seen, &[]);
    eprintln!(
        "{unacknowledged} updates ({} MiB) piled up during an agent outage: {counts:?} in {:.1} s",
        pending_bytes >> 20,
        started.elapsed().as_secs_f64()
    );
    assert_eq!(counts.sent, all);
    assert_eq!(counts.lost, 0);
    assert_eq!(
        counts.acked_by_agent, all,
        "every update acknowledged to the executor"
    );
    let _ = driver.stop(false);
}
