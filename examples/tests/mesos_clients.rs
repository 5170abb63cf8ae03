//! Mesos frameworks run on Agora unchanged (issue 13, master side): real
//! Mesos client libraries drive real `agora-master` and `agora-agent`
//! processes through the Mesos v1 scheduler API.
//!
//! - pymesos 0.3.15 (`mesos/pymesos_framework.py`): a job of command
//!   tasks to TASK_FINISHED, explicit and implicit reconciliation, kill,
//!   teardown; the same as a PARTITION_AWARE framework; scheduler
//!   failover with the same framework id; a master restart with the
//!   framework re-subscribing by itself.
//! - mesoshttp 0.4.2 (`mesos/mesoshttp_framework.py`): command tasks,
//!   explicit reconciliation, kill, teardown.
//!
//! The Python clients live in the venv `.ci/run` builds
//! (`/opt/agora-mesos-venv`, or `$AGORA_MESOS_VENV`). Without it the tests
//! are skipped with a message, except under `CI=true`, where they fail.

mod support;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use support::TestCluster;

const AGENT: &str = "cpus:2;mem:2048;disk:1024;ports:[31000-31100]";
const MASTER_FLAGS: &[&str] = &["--allocation-interval", "200ms"];
const SCRIPT_TIMEOUT: Duration = Duration::from_secs(120);

/// The venv's python, or `None` (skip) outside CI when it is missing.
fn python() -> Option<PathBuf> {
    let venv = std::env::var_os("AGORA_MESOS_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/opt/agora-mesos-venv"));
    let python = venv.join("bin/python");
    let usable = python.is_file()
        && Command::new(&python)
            .args(["-c", "import pymesos, mesoshttp"])
            .status()
            .is_ok_and(|s| s.success());
    if usable {
        return Some(python);
    }
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "the Mesos client venv {} (pymesos, mesoshttp) is missing; .ci/run builds it; under CI=true this fails the run",
        venv.display()
    );
    eprintln!(
        "skipping: the Mesos client venv {} is missing (.ci/run builds it)",
        venv.display()
    );
    None
}

fn script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/mesos")
        .join(name)
}

/// A client script running in the background, its JSON lines on a channel.
struct Client {
    child: Child,
    lines: mpsc::Receiver<serde_json::Value>,
    seen: Vec<serde_json::Value>,
    stderr: PathBuf,
}

impl Client {
    fn start(python: &Path, dir: &Path, name: &str, args: &[&str]) -> Client {
        let stderr = dir.join(format!(
            "{name}-{}.stderr",
            args.join("-").replace(['/', ':'], "_")
        ));
        let mut child = Command::new(python)
            .arg(script(name))
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&stderr).expect("stderr file"))
            .spawn()
            .expect("start the client script");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                match serde_json::from_str(&line) {
                    Ok(value) => {
                        if tx.send(value).is_err() {
                            break;
                        }
                    }
                    Err(_) => eprintln!("client: {line}"),
                }
            }
        });
        Client {
            child,
            lines,
            seen: Vec::new(),
            stderr,
        }
    }

    fn context(&self) -> String {
        format!(
            "events: {:#?}\nstderr:\n{}",
            self.seen,
            std::fs::read_to_string(&self.stderr).unwrap_or_default()
        )
    }

    /// Waits for an event named `event`.
    fn expect(&mut self, event: &str, cluster: &TestCluster) -> serde_json::Value {
        let deadline = Instant::now() + SCRIPT_TIMEOUT;
        while Instant::now() < deadline {
            match self.lines.recv_timeout(Duration::from_millis(200)) {
                Ok(value) => {
                    self.seen.push(value.clone());
                    if value["event"] == "failed" {
                        panic!(
                            "client failed: {value}\n{}\n{}",
                            self.context(),
                            cluster.logs()
                        );
                    }
                    if value["event"] == event {
                        return value;
                    }
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
            }
        }
        panic!(
            "no {event:?} from the client\n{}\n{}",
            self.context(),
            cluster.logs()
        );
    }

    /// Waits for the script to exit successfully.
    fn finish(mut self, cluster: &TestCluster) -> Vec<serde_json::Value> {
        self.expect("done", cluster);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                assert!(
                    status.success(),
                    "client exited with {status}\n{}",
                    self.context()
                );
                break;
            }
            assert!(
                Instant::now() < deadline,
                "client did not exit\n{}",
                self.context()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        while let Ok(value) = self.lines.try_recv() {
            self.seen.push(value);
        }
        std::mem::take(&mut self.seen)
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn updates<'a>(events: &'a [serde_json::Value], task: &str) -> Vec<&'a str> {
    events
        .iter()
        .filter(|e| e["event"] == "update" && e["task_id"] == task)
        .filter_map(|e| e["state"].as_str())
        .collect()
}

/// Waits until the master's `/master/state` says `check`.
fn wait_state(cluster: &TestCluster, what: &str, check: impl Fn(&serde_json::Value) -> bool) {
    support::wait_until(
        Duration::from_secs(20),
        what,
        || cluster.logs(),
        || {
            let (code, body) = support::http_get(cluster.master.addr, "/master/state").ok()?;
            let state: serde_json::Value = serde_json::from_str(&body).ok()?;
            (code == 200 && check(&state)).then_some(())
        },
    )
}

fn frameworks(state: &serde_json::Value) -> &Vec<serde_json::Value> {
    state["frameworks"].as_array().expect("frameworks")
}

#[test]
fn pymesos_job_reconciliation_kill_and_teardown() {
    let Some(python) = python() else { return };
    let cluster = TestCluster::start_with(2, AGENT, MASTER_FLAGS);
    let master = cluster.master_address();
    for (scenario, unknown) in [("job", "TASK_LOST"), ("job-pa", "TASK_UNKNOWN")] {
        let client = Client::start(
            &python,
            cluster.dir.path(),
            "pymesos_framework.py",
            &[&master, scenario],
        );
        let events = client.finish(&cluster);
        for i in 0..5 {
            let states = updates(&events, &format!("job-{i}"));
            assert_eq!(
                states.last(),
                Some(&"TASK_FINISHED"),
                "{scenario}: job-{i} went {states:?}"
            );
        }
        assert_eq!(updates(&events, "no-such-task"), [unknown], "{scenario}");
        assert_eq!(
            updates(&events, "long"),
            ["TASK_RUNNING", "TASK_RUNNING", "TASK_KILLED"],
            "{scenario}"
        );
    }
    // pymesos tears the frameworks down when it stops.
    wait_state(&cluster, "both frameworks torn down", |s| {
        frameworks(s).is_empty()
    });
}

#[test]
fn pymesos_scheduler_failover_keeps_the_framework_and_its_task() {
    let Some(python) = python() else { return };
    let cluster = TestCluster::start_with(1, AGENT, MASTER_FLAGS);
    let master = cluster.master_address();
    let mut first = Client::start(
        &python,
        cluster.dir.path(),
        "pymesos_framework.py",
        &[&master, "failover-1"],
    );
    let ready = first.expect("ready", &cluster);
    let framework_id = ready["framework_id"]
        .as_str()
        .expect("framework id")
        .to_string();
    let _ = first.child.wait();
    // The scheduler is gone without a teardown: the framework waits for it.
    wait_state(&cluster, "the framework disconnected, its task kept", |s| {
        frameworks(s).iter().any(|f| {
            f["id"] == framework_id.as_str()
                && f["connected"] == false
                && f["tasks"].as_array().is_some_and(|t| t.len() == 1)
        })
    });
    let second = Client::start(
        &python,
        cluster.dir.path(),
        "pymesos_framework.py",
        &[&master, "failover-2", &framework_id],
    );
    let events = second.finish(&cluster);
    assert_eq!(
        updates(&events, "survivor"),
        ["TASK_RUNNING", "TASK_KILLED"]
    );
    wait_state(&cluster, "the framework torn down", |s| {
        frameworks(s).is_empty()
    });
}

#[test]
fn pymesos_resubscribes_after_a_master_restart() {
    let Some(python) = python() else { return };
    let mut cluster = TestCluster::start_full(
        1,
        AGENT,
        MASTER_FLAGS,
        &["--reconnect-backoff-max", "300ms"],
    );
    let master = cluster.master_address();
    let mut client = Client::start(
        &python,
        cluster.dir.path(),
        "pymesos_framework.py",
        &[&master, "restart"],
    );
    client.expect("ready", &cluster);
    cluster.master.restart_same_port();
    client.expect("reregistered", &cluster);
    let events = client.finish(&cluster);
    assert_eq!(
        updates(&events, "steady").last(),
        Some(&"TASK_KILLED"),
        "{events:#?}"
    );
}

#[test]
fn mesoshttp_job_reconciliation_kill_and_teardown() {
    let Some(python) = python() else { return };
    let cluster = TestCluster::start_with(1, AGENT, MASTER_FLAGS);
    let url = format!("http://{}", cluster.master_address());
    let client = Client::start(
        &python,
        cluster.dir.path(),
        "mesoshttp_framework.py",
        &[&url],
    );
    let events = client.finish(&cluster);
    for i in 0..3 {
        assert_eq!(
            updates(&events, &format!("short-{i}")).last(),
            Some(&"TASK_FINISHED")
        );
    }
    assert_eq!(updates(&events, "never-launched"), ["TASK_LOST"]);
    assert_eq!(updates(&events, "long").last(), Some(&"TASK_KILLED"));
    wait_state(&cluster, "the framework torn down", |s| {
        frameworks(s).is_empty()
    });
}
