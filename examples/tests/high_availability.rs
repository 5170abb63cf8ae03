//! High availability (issue 5): three masters campaigning in one etcd,
//! agents and an `agora-execute` job that find the leader through
//! `--master etcd://…`, and the leader killed, frozen or cut off from
//! etcd; and Mesos clients (pymesos, mesoshttp, mesos-go) given only a
//! standby's address, which redirects them to the leader. Each test
//! starts its own etcd on 127.0.0.1 ephemeral ports with its own data
//! dir.
//!
//! Needs the `etcd` feature and the `etcd` binary (Debian's
//! `etcd-server`). Without the binary the tests are skipped with a
//! message, except under `CI=true`, where a missing etcd fails them.

#![cfg(feature = "etcd")]

mod support;

use std::net::SocketAddr;
use std::process::Command;
use std::time::{Duration, Instant};

use agora_etcd::testing::TestEtcd as Etcd;
use agora_etcd::TxnOp;
use agora_proto::LeaderInfo;
use nix::sys::signal::Signal;
use support::ledger::Ledger;
use support::{bin, http_get, process_alive, wait_until, Background, Proc};

const PREFIX: &str = "/agora";
const AGENT: &str = "cpus:2;mem:4096;disk:4096;ports:[31000-32000]";
const INSTANCES: usize = 200;
const AGENT_FLAGS: &[&str] = &[
    "--status-update-retry-min",
    "200ms",
    "--status-update-retry-max",
    "1s",
    "--reconnect-backoff-max",
    "300ms",
    "--executor-shutdown-grace-period",
    "1s",
];
const JOB_TIMEOUT: Duration = Duration::from_secs(150);

/// Masters, agents and etcd, as real processes.
struct HaCluster {
    dir: tempfile::TempDir,
    etcd: Etcd,
    masters: Vec<Proc>,
    agents: Vec<Proc>,
}

// === impl HaCluster ===

impl HaCluster {
    /// etcd, `masters` masters and `agents` agents following the leader.
    fn start(masters: usize, agents: usize) -> Option<HaCluster> {
        let dir = tempfile::Builder::new()
            .prefix("agora-ha-")
            .tempdir()
            .expect("temp dir");
        let etcd = Etcd::start(dir.path())?;
        let mut cluster = HaCluster {
            dir,
            etcd,
            masters: Vec::new(),
            agents: Vec::new(),
        };
        for _ in 0..masters {
            cluster.add_master();
        }
        cluster.wait_leader(|_| true);
        for i in 0..agents {
            cluster.add_agent(i);
        }
        cluster.wait_agents(agents);
        Some(cluster)
    }

    fn etcd_url(&self) -> String {
        format!("etcd://{}{PREFIX}", self.etcd.endpoint)
    }

    fn add_master(&mut self) -> usize {
        let i = self.masters.len();
        let work_dir = self.dir.path().join(format!("master-{i}"));
        std::fs::create_dir_all(&work_dir).expect("master dir");
        let args: Vec<String> = [
            "--listen",
            "127.0.0.1:0",
            "--work-dir",
            &work_dir.display().to_string(),
            "--etcd",
            &format!("http://{}", self.etcd.endpoint),
            "--etcd-prefix",
            PREFIX,
            "--etcd-lease-ttl",
            "2s",
            "--allocation-interval",
            "200ms",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let log = self.dir.path().join(format!("master-{i}.log"));
        self.masters.push(Proc::spawn(
            &format!("master {i}"),
            &bin("agora-master"),
            &args,
            &work_dir,
            &log,
        ));
        i
    }

    fn add_agent(&mut self, i: usize) {
        let work_dir = self.dir.path().join(format!("agent-{i}"));
        std::fs::create_dir_all(&work_dir).expect("agent dir");
        let mut args: Vec<String> = [
            "--master",
            &self.etcd_url(),
            "--listen",
            "127.0.0.1:0",
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
        let log = self.dir.path().join(format!("agent-{i}.log"));
        self.agents.push(Proc::spawn(
            &format!("agent {i}"),
            &bin("agora-agent"),
            &args,
            &work_dir,
            &log,
        ));
    }

    /// Index of the master whose address is in the leader key, if any.
    fn leader(&self) -> Option<usize> {
        let key = agora_discovery::leader_key(PREFIX);
        let record = self.etcd.client().get(key.as_bytes()).ok()??;
        let leader: LeaderInfo = serde_json::from_slice(&record.value).ok()?;
        self.masters
            .iter()
            .position(|m| m.addr.to_string() == leader.address)
    }

    /// Waits for a leader that `accept` takes, serving (its gate open).
    fn wait_leader(&self, accept: impl Fn(usize) -> bool) -> usize {
        wait_until(
            Duration::from_secs(20),
            "a serving leader",
            || self.logs(),
            || {
                let i = self.leader().filter(|i| accept(*i))?;
                let (code, _) = http_get(self.masters[i].addr, "/state").ok()?;
                (code == 200).then_some(i)
            },
        )
    }

    fn wait_agents(&self, n: usize) {
        wait_until(
            Duration::from_secs(30),
            &format!("{n} agents at the leader"),
            || self.logs(),
            || {
                let i = self.leader()?;
                let (_, body) = http_get(self.masters[i].addr, "/state").ok()?;
                let state = serde_json::from_str(&body).ok()?;
                (agora_examples::local::connected_agents(&state) >= n).then_some(())
            },
        );
    }

    fn logs(&self) -> String {
        let mut out = String::new();
        for p in self.masters.iter().chain(&self.agents) {
            out.push_str(&format!("--- {} ---\n{}\n", p.name, p.log_tail()));
        }
        out
    }

    /// Kills the leader and returns (its index, the new leader, the time
    /// from the kill to the new leader's first offer).
    fn kill_leader(&mut self) -> (usize, usize, Duration) {
        let old = self.leader().expect("a leader");
        self.masters[old].kill();
        let killed = Instant::now();
        let (new, _) = wait_until(
            Duration::from_secs(20),
            "an offer from a new leader",
            || self.logs(),
            || {
                let new = self.leader().filter(|i| *i != old)?;
                (offers_made(self.masters[new].addr)? > 0.0).then_some((new, ()))
            },
        );
        (old, new, killed.elapsed())
    }
}

impl Drop for HaCluster {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("{}", self.logs());
        }
        for p in self.agents.iter_mut().chain(self.masters.iter_mut()) {
            p.signal(Signal::SIGCONT);
            p.terminate(Duration::from_secs(5));
        }
        support::kill_sandboxed_processes(self.dir.path());
    }
}

/// `agora_master_offers_total{event="made"}` from `/metrics`.
fn offers_made(addr: SocketAddr) -> Option<f64> {
    let (code, body) = http_get(addr, "/metrics").ok()?;
    if code != 200 {
        return None;
    }
    body.lines()
        .find(|l| l.starts_with("agora_master_offers_total{event=\"made\"}"))
        .and_then(|l| l.split_whitespace().last())
        .and_then(|v| v.parse().ok())
}

/// The `agora-execute` job, following the leader through etcd.
fn start_job(cluster: &HaCluster, name: &str, command: &str, instances: usize) -> Background {
    let dir = cluster.dir.path();
    let args: Vec<String> = [
        "--master",
        &cluster.etcd_url(),
        "--name",
        name,
        "--command",
        command,
        "--resources",
        "cpus:0.1;mem:32",
        "--instances",
        &instances.to_string(),
        "--checkpoint",
        "--failover-timeout",
        "60s",
        "--ledger",
        &dir.join(format!("{name}.ledger")).display().to_string(),
        "--state-file",
        &dir.join(format!("{name}.state")).display().to_string(),
        "--reconcile-interval",
        "2s",
        "--timeout",
        &format!("{}s", JOB_TIMEOUT.as_secs()),
        "--quiet",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    Background::spawn(name, &bin("agora-execute"), &args, dir)
}

fn ledger(cluster: &HaCluster, name: &str) -> Ledger {
    Ledger::read(&cluster.dir.path().join(format!("{name}.ledger")))
}

/// Waits for the job to end and checks its ledger: every task reached
/// exactly one terminal state, nothing arrived out of order, and every
/// task that was seen running finished (its updates crossed the
/// failovers). A launch that raced a failover (sent to a dying master, or
/// on an offer of the previous leader) ends `TASK_LOST`/`TASK_DROPPED`
/// without ever running; `agora-execute` does not relaunch those.
fn finish_job(cluster: &HaCluster, job: &mut Background, name: &str, instances: usize) {
    let status = job.wait(JOB_TIMEOUT + Duration::from_secs(15));
    let context = || format!("{}\n{}", job.output(), cluster.logs());
    assert!(status.is_some(), "agora-execute did not end\n{}", context());
    let ledger = ledger(cluster, name);
    let check = ledger.check(name, instances);
    check.assert_ok(&context());
    assert_eq!(check.tasks, instances, "{check}\n{}", context());
    for (task, updates) in &ledger.updates {
        if updates.iter().any(|u| u.state == "TASK_RUNNING") {
            assert!(
                updates.iter().any(|u| u.state == "TASK_FINISHED"),
                "{task} ran but did not finish: {updates:?}"
            );
        }
    }
    assert!(
        ledger.registrations >= 2,
        "the framework did not re-register"
    );
    eprintln!("{name}: {check}");
}

/// The leader is SIGKILLed five times while 200 tasks run (each time the
/// killed master is restarted as a fresh candidate, so three masters are
/// up): a standby takes over, agents and the framework re-register, and
/// the job ends with every task finished exactly once. Prints each
/// failover time (kill → first offer from the new leader) and the median.
#[test]
fn leader_sigkill_repeatedly_job_completes() {
    let Some(mut cluster) = HaCluster::start(3, 2) else {
        return;
    };
    let mut job = start_job(&cluster, "ha", "sleep 4", INSTANCES);
    wait_until(
        Duration::from_secs(60),
        "10 terminal tasks",
        || format!("{}\n{}", job.output(), cluster.logs()),
        || (ledger(&cluster, "ha").terminal_tasks() >= 10).then_some(()),
    );
    let mut times = Vec::new();
    for round in 0..5 {
        let (old, new, took) = cluster.kill_leader();
        eprintln!(
            "failover {}: master {old} killed, master {new} offered after {:.3} s",
            round + 1,
            took.as_secs_f64()
        );
        times.push(took);
        assert!(
            ledger(&cluster, "ha").terminal_tasks() < INSTANCES,
            "the job ended before failover {}: make it longer",
            round + 1
        );
        // Back to three masters: the killed one campaigns again.
        cluster.masters[old].restart();
        std::thread::sleep(Duration::from_millis(500));
    }
    finish_job(&cluster, &mut job, "ha", INSTANCES);
    // The operator's CLI follows the leader through etcd too.
    let out = Command::new(bin("agora"))
        .args(["--master", &cluster.etcd_url(), "--json", "agents"])
        .output()
        .expect("running agora");
    assert!(
        out.status.success(),
        "agora agents via etcd failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let agents: serde_json::Value =
        serde_json::from_slice(&out.stdout).expect("agora --json prints JSON");
    assert_eq!(agents.as_array().map(Vec::len), Some(2), "{agents}");
    times.sort();
    eprintln!(
        "failover times (kill → first offer from the new leader): {:?}; median {:.3} s",
        times.iter().map(|t| t.as_secs_f64()).collect::<Vec<_>>(),
        times[times.len() / 2].as_secs_f64()
    );
    assert!(
        times[times.len() / 2] < Duration::from_secs(5),
        "median failover {:?}",
        times[times.len() / 2]
    );
}

/// A leader frozen (SIGSTOP) past its lease is replaced; when it runs
/// again (SIGCONT) it must not act: it sees its lease ran out, sends
/// nothing and exits. The job still ends with every task finished once.
#[test]
fn deposed_leader_stops_without_acting() {
    let Some(cluster) = HaCluster::start(2, 2) else {
        return;
    };
    let mut job = start_job(&cluster, "frozen", "sleep 1", 60);
    wait_until(
        Duration::from_secs(60),
        "5 terminal tasks",
        || format!("{}\n{}", job.output(), cluster.logs()),
        || (ledger(&cluster, "frozen").terminal_tasks() >= 5).then_some(()),
    );
    let old = cluster.leader().expect("a leader");
    cluster.masters[old].signal(Signal::SIGSTOP);
    let new = cluster.wait_leader(|i| i != old);
    // Clients leave the frozen master for the new one.
    wait_until(
        Duration::from_secs(20),
        "offers from the new leader",
        || cluster.logs(),
        || (offers_made(cluster.masters[new].addr)? > 0.0).then_some(()),
    );
    cluster.masters[old].signal(Signal::SIGCONT);
    let pid = cluster.masters[old].pid();
    wait_until(
        Duration::from_secs(10),
        "the deposed leader to exit",
        || cluster.logs(),
        || (!process_alive(pid)).then_some(()),
    );
    let log = std::fs::read_to_string(cluster.dir.path().join(format!("master-{old}.log")))
        .unwrap_or_default();
    assert!(
        log.contains("acting no further") || log.contains("lost leadership"),
        "the deposed leader did not say why it stopped:\n{}",
        cluster.masters[old].log_tail()
    );
    assert_eq!(cluster.leader(), Some(new), "the leader key is untouched");
    finish_job(&cluster, &mut job, "frozen", 60);
}

/// etcd freezes: the leader cannot renew its lease and stops within the
/// TTL rather than go on alone; the standby does not take over while etcd
/// is down (no split brain). When etcd is back a leader is elected again.
#[test]
fn etcd_outage_stops_the_leader() {
    let Some(mut cluster) = HaCluster::start(2, 0) else {
        return;
    };
    let old = cluster.leader().expect("a leader");
    let other = 1 - old;
    let pid = cluster.masters[old].pid();
    cluster.etcd.signal(Signal::SIGSTOP);
    let stopped = Instant::now();
    wait_until(
        Duration::from_secs(10),
        "the leader to stop while etcd is down",
        || cluster.logs(),
        || (!process_alive(pid)).then_some(()),
    );
    eprintln!(
        "leader stopped {:.3} s after etcd froze",
        stopped.elapsed().as_secs_f64()
    );
    let (code, body) = http_get(cluster.masters[other].addr, "/api/v1/summary").expect("GET");
    assert_eq!(
        code, 503,
        "the standby must not serve while etcd is down: {body}"
    );
    cluster.etcd.signal(Signal::SIGCONT);
    cluster.masters[old].restart();
    cluster.wait_leader(|_| true);
}

/// The fence itself: once the leader key is re-created by someone else,
/// a transaction fenced on the old key's create revision writes nothing.
#[test]
fn registry_writes_are_fenced_by_the_leader_key() {
    let dir = tempfile::tempdir().expect("temp dir");
    let Some(etcd) = Etcd::start(dir.path()) else {
        return;
    };
    let client = etcd.client();
    let key = b"/fence/leader";
    let lease = client.grant(5).expect("grant");
    let won = client.create(key, b"a", lease).expect("create");
    assert!(won.succeeded);
    assert!(!client.create(key, b"b", 0).expect("create").succeeded);
    let write = |value: &[u8]| TxnOp::Put {
        key: b"/fence/registry/x".to_vec(),
        value: value.to_vec(),
        lease: 0,
    };
    assert!(
        client
            .txn_if_created_at(key, won.revision, &[write(b"1")])
            .expect("txn")
            .succeeded
    );
    client.revoke(lease).expect("revoke");
    assert!(client.create(key, b"b", 0).expect("create").succeeded);
    assert!(
        !client
            .txn_if_created_at(key, won.revision, &[write(b"2")])
            .expect("txn")
            .succeeded
    );
    let stored = client.get(b"/fence/registry/x").expect("get").expect("key");
    assert_eq!(stored.value, b"1");
}

/// Mesos clients given only a standby's address end up on the leader
/// (issue 13): the standby answers the scheduler API with `307` and
/// `Location: //LEADER/api/v1/scheduler`, as Mesos does, and pymesos,
/// mesoshttp and mesos-go (protobuf and JSON) follow it, subscribe at the
/// leader and run their job there: command tasks to TASK_FINISHED,
/// reconciliation, kill, teardown. A client whose tool is missing is
/// left out with a message, except under `CI=true`, where that fails.
#[test]
fn mesos_clients_follow_a_standby_to_the_leader() {
    use support::mesos::{self, Client, GoCodec};
    let python = mesos::python();
    let go = mesos::go_scheduler();
    if python.is_none() && go.is_none() {
        return;
    }
    let Some(cluster) = HaCluster::start(2, 1) else {
        return;
    };
    let leader = cluster.leader().expect("a leader");
    let leader_addr = cluster.masters[leader].addr;
    let standby = cluster.masters[1 - leader].addr;
    let logs = || cluster.logs();

    let subscribe =
        br#"{"type":"SUBSCRIBE","subscribe":{"framework_info":{"user":"","name":"raw"}}}"#;
    let (code, head) = mesos::http_post_head(
        standby,
        "/api/v1/scheduler",
        &[
            ("Content-Type", "application/json"),
            ("Accept", "application/json"),
        ],
        subscribe,
    )
    .expect("POST to the standby");
    assert_eq!(code, 307, "{head}");
    assert_eq!(
        mesos::header(&head, "location"),
        Some(format!("//{leader_addr}/api/v1/scheduler").as_str()),
        "{head}"
    );

    let dir = cluster.dir.path();
    let standby = standby.to_string();
    let check_job = |client: &str, events: &[serde_json::Value], tasks: &[&str]| {
        for task in tasks {
            assert_eq!(
                mesos::updates(events, task).last(),
                Some(&"TASK_FINISHED"),
                "{client}: {task}: {events:#?}"
            );
        }
        assert_eq!(
            mesos::updates(events, "long").last(),
            Some(&"TASK_KILLED"),
            "{client}: {events:#?}"
        );
    };
    let jobs = ["job-0", "job-1", "job-2", "job-3", "job-4"];
    if let Some(python) = &python {
        let events =
            Client::python(python, "pymesos_framework.py", &[&standby, "job"], dir).finish(&logs);
        check_job("pymesos", &events, &jobs);
        let url = format!("http://{standby}");
        let events = Client::python(python, "mesoshttp_framework.py", &[&url], dir).finish(&logs);
        check_job("mesoshttp", &events, &["short-0", "short-1", "short-2"]);
    }
    if let Some(go) = &go {
        for codec in [GoCodec::Protobuf, GoCodec::Json] {
            let events = Client::go(go, codec, &standby, "job", &[], dir).finish(&logs);
            check_job(&format!("mesos-go {}", codec.flag()), &events, &jobs);
        }
    }
    // Every framework was torn down at the leader; the standby is still
    // a standby.
    mesos::wait_state(leader_addr, "every framework torn down", &logs, |s| {
        mesos::frameworks(s).is_empty()
    });
    assert_eq!(cluster.leader(), Some(leader));
}
