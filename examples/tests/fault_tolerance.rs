//! Fault injection on real processes (issue 3, scenarios 3–6): a job of
//! 100 short command tasks run by `agora-execute` while one process dies,
//! freezes or loses frames. Each test then checks, from the scheduler's
//! ledger, the promise to framework writers: every task reached exactly
//! one terminal state, every command task that ran was seen `TASK_RUNNING`
//! before its terminal state, nothing arrived out of order, and no task
//! was launched twice. Duplicates are counted (at-least-once allows them).
//!
//! Timeouts are shortened with flags so each test takes seconds; every
//! wait is bounded.

mod support;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use support::ledger::{Check, Ledger};
use support::lossy_proxy::{LossyProxy, ProxyConfig};
use support::{bin, wait_until, Background, TestCluster};

const AGENT: &str = "cpus:4;mem:4096;disk:4096;ports:[31000-32000]";
const INSTANCES: usize = 100;
/// Fast retries and reconnects, so recovery takes seconds.
const AGENT_FLAGS: &[&str] = &[
    "--status-update-retry-min",
    "200ms",
    "--status-update-retry-max",
    "1s",
    "--reconnect-backoff-max",
    "500ms",
    "--executor-shutdown-grace-period",
    "1s",
];
const MASTER_FLAGS: &[&str] = &["--allocation-interval", "200ms"];
/// Bound on one job, failures included.
const JOB_TIMEOUT: Duration = Duration::from_secs(90);

/// One `agora-execute` job with a ledger and a state file.
struct Job {
    name: String,
    master: String,
    command: String,
    dir: PathBuf,
    ledger: PathBuf,
    state_file: PathBuf,
}

// === impl Job ===

impl Job {
    fn new(cluster: &TestCluster, name: &str, command: &str) -> Job {
        Job {
            name: name.to_string(),
            master: cluster.master_address(),
            command: command.to_string(),
            dir: cluster.dir.path().to_path_buf(),
            ledger: cluster.dir.path().join(format!("{name}.ledger")),
            state_file: cluster.dir.path().join(format!("{name}.state")),
        }
    }

    /// Starts (or, with `framework_id`, restarts as that framework) the job.
    fn start(&self, run: usize, framework_id: Option<&str>) -> Background {
        let mut args: Vec<String> = [
            "--master",
            &self.master,
            "--name",
            &self.name,
            "--command",
            &self.command,
            "--resources",
            "cpus:0.1;mem:32",
            "--instances",
            &INSTANCES.to_string(),
            "--checkpoint",
            "--failover-timeout",
            "60s",
            "--ledger",
            &self.ledger.display().to_string(),
            "--state-file",
            &self.state_file.display().to_string(),
            "--reconcile-interval",
            "2s",
            "--timeout",
            &format!("{}s", JOB_TIMEOUT.as_secs()),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        if let Some(id) = framework_id {
            args.push("--framework-id".into());
            args.push(id.into());
        }
        Background::spawn(
            &format!("{}-run{run}", self.name),
            &bin("agora-execute"),
            &args,
            &self.dir,
        )
    }

    fn ledger(&self) -> Ledger {
        Ledger::read(&self.ledger)
    }

    /// Waits until the scheduler has seen `n` terminal tasks.
    fn wait_terminal(&self, n: usize, context: impl Fn() -> String) {
        wait_until(
            Duration::from_secs(60),
            &format!("{n} terminal tasks in the ledger"),
            context,
            || (self.ledger().terminal_tasks() >= n).then_some(()),
        );
    }

    /// The framework id the state file records.
    fn framework_id(&self) -> Option<String> {
        let text = std::fs::read_to_string(&self.state_file).ok()?;
        let value: serde_json::Value = serde_json::from_str(&text).ok()?;
        value["framework_id"].as_str().map(str::to_string)
    }

    /// Waits for `run` to exit and checks the ledger; returns the check.
    fn finish(&self, run: &mut Background, cluster: &TestCluster, started: Instant) -> Check {
        let status = run.wait(JOB_TIMEOUT + Duration::from_secs(15));
        let context = format!("{}\n{}", run.output(), cluster.logs());
        assert!(status.is_some(), "agora-execute did not end\n{context}");
        let check = self.ledger().check(&self.name, INSTANCES);
        check.assert_ok(&context);
        assert_eq!(check.tasks, INSTANCES, "{check}\n{context}");
        eprintln!(
            "{}: {check}; {:.1} s",
            self.name,
            started.elapsed().as_secs_f64()
        );
        check
    }
}

fn cluster(master_flags: &[&str]) -> TestCluster {
    let mut flags = MASTER_FLAGS.to_vec();
    flags.extend_from_slice(master_flags);
    TestCluster::start_full(2, AGENT, &flags, AGENT_FLAGS)
}

fn agent_ids(cluster: &TestCluster) -> Vec<(String, String, bool)> {
    cluster.state()["agents"]
        .as_array()
        .map(|agents| {
            agents
                .iter()
                .map(|a| {
                    (
                        a["id"].as_str().unwrap_or_default().to_string(),
                        a["address"].as_str().unwrap_or_default().to_string(),
                        a["connected"].as_bool().unwrap_or(false),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// Scenario 3: the scheduler is SIGKILLed mid-job and restarted with the
/// same framework id within its failover timeout. It re-registers, gets the
/// updates that were pending, reconciles what it had launched, launches
/// only the rest, and the job completes with every task finished once.
#[test]
fn scheduler_sigkill_and_failover_with_same_framework_id() {
    let cluster = cluster(&[]);
    let job = Job::new(&cluster, "failover", "sleep 0.2");
    let started = Instant::now();
    let mut first = job.start(1, None);
    job.wait_terminal(25, || format!("{}\n{}", first.output(), cluster.logs()));
    first.kill();
    let before = job.ledger();
    let framework_id = job
        .framework_id()
        .expect("the state file records the framework id");
    // Updates keep flowing to the master meanwhile; they wait there.
    std::thread::sleep(Duration::from_millis(300));

    let mut second = job.start(2, Some(&framework_id));
    let check = job.finish(&mut second, &cluster, started);
    let after = job.ledger();
    assert_eq!(
        check.terminal.get("TASK_FINISHED").copied().unwrap_or(0)
            + check.terminal.get("TASK_LOST").copied().unwrap_or(0),
        INSTANCES,
        "{check}"
    );
    // A task may be TASK_LOST only if its launch never reached the master
    // (the scheduler died between recording and sending it).
    for (task, updates) in &after.updates {
        if updates.iter().any(|u| u.state == "TASK_LOST") {
            assert!(
                updates.iter().all(|u| u.source == "SOURCE_MASTER"),
                "{task} was lost although it ran: {updates:?}"
            );
        }
    }
    assert!(
        before.terminal_tasks() < INSTANCES,
        "the scheduler was killed too late to test anything"
    );
    assert!(
        read(&second.stdout).contains(&format!("registered as {framework_id}")),
        "the second scheduler did not take over {framework_id}\n{}",
        second.output()
    );
    // stop(false) at the end tore the framework down.
    wait_until(
        Duration::from_secs(10),
        "the framework to be torn down",
        || cluster.logs(),
        || {
            let state = cluster.state();
            let frameworks = state["frameworks"].as_array().cloned().unwrap_or_default();
            frameworks
                .iter()
                .all(|f| f["id"].as_str() != Some(framework_id.as_str()))
                .then_some(())
        },
    );
}

/// Scenario 4: the master is SIGKILLed mid-job and restarted on the same
/// port. Tasks keep running; agents and the scheduler reconnect and
/// re-register; updates sent meanwhile are delivered.
#[test]
fn master_sigkill_and_restart_on_the_same_port() {
    let mut cluster = cluster(&[]);
    let job = Job::new(&cluster, "restart", "sleep 0.3");
    let started = Instant::now();
    let mut run = job.start(1, None);
    job.wait_terminal(25, || format!("{}\n{}", run.output(), cluster.logs()));
    let before = job.ledger();
    let running_before: Vec<String> = before
        .updates
        .iter()
        .filter(|(_, u)| {
            u.iter().any(|u| u.state == "TASK_RUNNING")
                && !u.iter().any(|u| support::ledger::is_terminal(&u.state))
        })
        .map(|(t, _)| t.clone())
        .collect();
    let agents_before: Vec<String> = agent_ids(&cluster).into_iter().map(|a| a.0).collect();
    cluster.master.restart_same_port();
    let restarted = Instant::now();
    cluster.wait_agents(2);
    let reregistered = restarted.elapsed();
    let mut agents_after: Vec<String> = agent_ids(&cluster).into_iter().map(|a| a.0).collect();
    let mut sorted_before = agents_before.clone();
    sorted_before.sort();
    agents_after.sort();
    assert_eq!(
        sorted_before, agents_after,
        "agents must re-register with their ids"
    );

    let check = job.finish(&mut run, &cluster, started);
    let after = job.ledger();
    assert!(
        after.registrations >= 2,
        "the scheduler did not re-register"
    );
    // Tasks that were running when the master died kept running and
    // finished: their updates were delivered through the new master.
    for task in &running_before {
        let updates = &after.updates[task];
        assert!(
            updates.iter().any(|u| u.state == "TASK_FINISHED"),
            "{task} was running before the restart but did not finish: {updates:?}"
        );
    }
    eprintln!(
        "restart: agents re-registered {:.2} s after the restart; {} tasks were running across it; {check}",
        reregistered.as_secs_f64(),
        running_before.len()
    );
}

/// Scenario 5: an agent is frozen (SIGSTOP) past the ping timeout. The
/// master removes it: its tasks become TASK_LOST (REASON_AGENT_REMOVED) and
/// the scheduler hears agent_lost. Thawed (SIGCONT), the agent is told to
/// shut down, kills its executors, and registers as a new agent; its old
/// tasks are not resurrected (no second terminal state).
#[test]
fn agent_frozen_past_ping_timeout_is_removed_and_comes_back_new() {
    let cluster = cluster(&["--agent-ping-interval", "200ms", "--max-missed-pings", "5"]);
    let job = Job::new(&cluster, "frozen", "sleep 1");
    let started = Instant::now();
    let mut run = job.start(1, None);
    let victim = &cluster.agents[0];
    let victim_addr = victim.addr.to_string();
    let (victim_id, _, _) = agent_ids(&cluster)
        .into_iter()
        .find(|a| a.1 == victim_addr)
        .expect("the victim agent in /state");
    // Freeze it while it runs tasks.
    wait_until(
        Duration::from_secs(30),
        "tasks running on the victim",
        || format!("{}\n{}", run.output(), cluster.logs()),
        || {
            let ledger = job.ledger();
            let running = ledger
                .updates
                .values()
                .filter(|u| {
                    u.iter().any(|u| {
                        u.state == "TASK_RUNNING" && u.agent_id.as_deref() == Some(&victim_id)
                    })
                })
                .count();
            (running >= 5).then_some(())
        },
    );
    victim.signal(nix::sys::signal::Signal::SIGSTOP);
    let stopped = Instant::now();
    wait_until(
        Duration::from_secs(20),
        "agent_lost for the frozen agent",
        || format!("{}\n{}", run.output(), cluster.logs()),
        || job.ledger().agents_lost.contains(&victim_id).then_some(()),
    );
    let removed_after = stopped.elapsed();
    // Let its executors finish their commands while it is frozen: those
    // updates must never reach the scheduler.
    std::thread::sleep(Duration::from_millis(1200));
    victim.signal(nix::sys::signal::Signal::SIGCONT);

    let check = job.finish(&mut run, &cluster, started);
    let ledger = job.ledger();
    let lost: Vec<&String> = ledger
        .updates
        .iter()
        .filter(|(_, u)| {
            u.iter().any(|u| {
                u.state == "TASK_LOST" && u.reason.as_deref() == Some("REASON_AGENT_REMOVED")
            })
        })
        .map(|(t, _)| t)
        .collect();
    assert!(!lost.is_empty(), "no task was lost with the agent: {check}");
    for task in &lost {
        let updates = &ledger.updates[*task];
        assert!(
            updates
                .iter()
                .all(|u| u.agent_id.as_deref() == Some(&victim_id)),
            "{task}: {updates:?}"
        );
    }
    // The agent was told to shut down and came back under a new id.
    wait_until(
        Duration::from_secs(20),
        "the thawed agent to register as a new agent",
        || cluster.logs(),
        || {
            let agents = agent_ids(&cluster);
            agents
                .iter()
                .any(|a| a.1 == victim_addr && a.0 != victim_id && a.2)
                .then_some(())
        },
    );
    assert!(
        victim.log_tail().contains("master shut this agent down")
            || read(&cluster.dir.path().join("agent-0.log"))
                .contains("master shut this agent down"),
        "the agent was not shut down\n{}",
        cluster.logs()
    );
    assert!(
        !agent_ids(&cluster).iter().any(|a| a.0 == victim_id),
        "the removed agent id is back"
    );
    eprintln!(
        "frozen: agent removed {:.2} s after SIGSTOP; {} tasks lost with it; {check}",
        removed_after.as_secs_f64(),
        lost.len()
    );
}

/// Scenario 6: agents reach the master through a lossy link that delays
/// frames randomly and drops some (each drop cuts the connection, as a
/// real loss on TCP would). The first RUN_TASK, STATUS_UPDATE and
/// ACKNOWLEDGE are always among the dropped. The system converges: a lost
/// RUN_TASK makes the task TASK_LOST when the agent re-registers without
/// it; a lost STATUS_UPDATE or ACKNOWLEDGE is re-sent by the agent (the
/// scheduler may see a duplicate).
#[test]
fn lossy_link_between_agents_and_master_converges() {
    let mut cluster = TestCluster::start_full(0, AGENT, MASTER_FLAGS, &[]);
    let seed = std::env::var("AGORA_PROXY_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(1)
        });
    eprintln!("lossy link seed {seed} (set AGORA_PROXY_SEED to reproduce)");
    let proxy = LossyProxy::start(ProxyConfig {
        upstream: cluster.master.addr,
        drop_probability: 0.01,
        max_random_drops: 6,
        max_delay: Duration::from_millis(30),
        force_drop: vec![
            "RUN_TASK".into(),
            "STATUS_UPDATE".into(),
            "ACKNOWLEDGE".into(),
        ],
        seed,
    });
    let via = proxy.addr.to_string();
    for _ in 0..2 {
        cluster.add_agent_via(&via, AGENT, AGENT_FLAGS);
    }
    cluster.wait_agents(2);
    let job = Job::new(&cluster, "lossy", "sleep 0.1");
    let started = Instant::now();
    let mut run = job.start(1, None);
    let check = job.finish(&mut run, &cluster, started);
    let dropped = proxy.dropped();
    for kind in ["RUN_TASK", "STATUS_UPDATE", "ACKNOWLEDGE"] {
        assert!(
            dropped.iter().any(|d| d == kind),
            "no {kind} was dropped: {dropped:?}"
        );
    }
    let ledger = job.ledger();
    // Lost launches end TASK_LOST from the master, never after running.
    for (task, updates) in &ledger.updates {
        if updates.iter().any(|u| u.state == "TASK_LOST") {
            assert!(
                !updates.iter().any(|u| u.source == "SOURCE_EXECUTOR"),
                "{task} was lost although its executor reported: {updates:?}"
            );
        }
    }
    eprintln!(
        "lossy: {} connections, {} frames relayed, dropped {:?}; {check}",
        proxy
            .stats
            .connections
            .load(std::sync::atomic::Ordering::Relaxed),
        proxy
            .stats
            .relayed
            .load(std::sync::atomic::Ordering::Relaxed),
        dropped
    );
}
