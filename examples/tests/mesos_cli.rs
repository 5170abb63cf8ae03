//! The Mesos CLI on Agora (issue 28): avmesos-cli 1.3 (PyPI's maintained
//! `mesos-cli`, the Mesos project's Python CLI), unpatched, reads a real
//! `agora-master` with an agent, a framework and its tasks: `agent list`
//! (`/slaves`), `framework list` and `framework inspect`
//! (`/master/frameworks/`), `task list` and `task inspect`
//! (`/tasks?order=asc&limit=-1`). Each answer must name the agent, the
//! framework and the tasks the test started.
//!
//! `task exec` and `task attach` are not tested: they need the agent's
//! container exec calls (`LAUNCH_NESTED_CONTAINER_SESSION`,
//! `ATTACH_CONTAINER_INPUT`/`OUTPUT`), which Agora does not carry out yet.
//!
//! The CLI lives in the venv `.ci/run` builds (`/opt/agora-mesos-cli-venv`,
//! or `$AGORA_MESOS_CLI_VENV`), run as `python -m avmesos.cli.mesos-cli`
//! (its `mesos-cli` script calls whatever `python` is on `PATH`). Without
//! it the test is skipped with a message, except under `CI=true`, where it
//! fails.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use agora_proto::{Filters, FrameworkInfo, TaskState};
use support::mesos::mesos_cli_python;
use support::{command_task, start_framework, wait_for, SchedEvent, TestCluster};

const AGENT: &str = "cpus:2;mem:2048;disk:1024;ports:[31000-31100]";
const MASTER_FLAGS: &[&str] = &["--allocation-interval", "200ms"];
const CLI_TIMEOUT: Duration = Duration::from_secs(60);

/// The Mesos CLI, configured for one master.
struct Cli {
    python: PathBuf,
    config: PathBuf,
    home: PathBuf,
}

impl Cli {
    /// Writes the CLI's TOML config (`[master] address`) under `dir`.
    fn new(python: PathBuf, dir: &Path, master: &str) -> Cli {
        let home = dir.join("cli-home");
        std::fs::create_dir_all(&home).unwrap();
        let config = dir.join("mesos-cli.toml");
        std::fs::write(&config, format!("[master]\naddress = \"{master}\"\n")).unwrap();
        Cli {
            python,
            config,
            home,
        }
    }

    /// Runs `mesos-cli ARGS`; panics unless it exits 0. Returns stdout.
    fn run(&self, args: &[&str], logs: &dyn Fn() -> String) -> String {
        let mut child = Command::new(&self.python)
            .args(["-m", "avmesos.cli.mesos-cli"])
            .args(args)
            .env("MESOS_CLI_CONFIG", &self.config)
            .env("HOME", &self.home)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start the Mesos CLI");
        let deadline = Instant::now() + CLI_TIMEOUT;
        while child.try_wait().expect("wait for the Mesos CLI").is_none() {
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("mesos-cli {args:?} ran over {CLI_TIMEOUT:?}\n{}", logs());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let out = child.wait_with_output().expect("the Mesos CLI's output");
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(
            out.status.success(),
            "mesos-cli {args:?} failed ({}):\nstdout: {stdout}\nstderr: {stderr}\n{}",
            out.status,
            logs()
        );
        stdout
    }

    /// Runs `mesos-cli ARGS` and parses its stdout as one JSON value.
    fn json(&self, args: &[&str], logs: &dyn Fn() -> String) -> serde_json::Value {
        let out = self.run(args, logs);
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("mesos-cli {args:?}: {e}: {out}"))
    }
}

/// The table row (split on runs of spaces) whose first cell is `first`.
fn row<'a>(table: &'a str, first: &str) -> Option<Vec<&'a str>> {
    table
        .lines()
        .map(|line| line.split_whitespace().collect::<Vec<_>>())
        .find(|cells| cells.first() == Some(&first))
}

#[test]
fn mesos_cli_lists_and_inspects_agents_frameworks_and_tasks() {
    let Some(python) = mesos_cli_python() else {
        return;
    };
    let cluster = TestCluster::start_with(1, AGENT, MASTER_FLAGS);
    let logs = || cluster.logs();
    let mut info = FrameworkInfo::new("cli-framework");
    info.hostname = "cli-scheduler-host".into();
    let (driver, events) = start_framework(&cluster.master_address(), info);
    let framework_id = wait_for(&events, Duration::from_secs(20), |e| match e {
        SchedEvent::Registered(id) => Some(id.to_string()),
        _ => None,
    });
    let offer = wait_for(&events, Duration::from_secs(20), |e| match e {
        SchedEvent::Offers(offers) => offers.first().cloned(),
        _ => None,
    });
    let tasks = [
        ("cli-sleeper-1", "sleep 300"),
        ("cli-sleeper-2", "sleep 300"),
        ("cli-done", "true"),
    ];
    driver
        .launch_tasks(
            std::slice::from_ref(&offer.id),
            tasks
                .iter()
                .map(|(id, command)| command_task(id, &offer, command, "cpus:0.25;mem:64"))
                .collect(),
            Filters {
                refuse_seconds: Some(0.0),
            },
        )
        .unwrap();
    // Both sleepers running, `cli-done` finished.
    let mut running = std::collections::HashSet::new();
    let mut done = false;
    while running.len() < 2 || !done {
        wait_for(&events, Duration::from_secs(30), |e| match e {
            SchedEvent::Update(s) => {
                match (s.task_id.as_str(), s.state) {
                    ("cli-done", TaskState::Finished) => done = true,
                    (id, TaskState::Running) if id != "cli-done" => {
                        running.insert(id.to_string());
                    }
                    (_, TaskState::Running) => {}
                    _ => panic!("{s:?}\n{}", logs()),
                }
                Some(())
            }
            _ => None,
        });
    }
    let agent_id = offer.agent_id.to_string();
    let cli = Cli::new(python, cluster.dir.path(), &cluster.master_address());

    // `agent list`: the agent's id, host name, active.
    let agents = cli.run(&["agent", "list"], &logs);
    let cells = row(&agents, &agent_id).unwrap_or_else(|| panic!("no {agent_id} in:\n{agents}"));
    assert_eq!(
        cells,
        [agent_id.as_str(), &offer.hostname, "True"],
        "{agents}"
    );

    // `framework list`: id, active, host name, name.
    let frameworks = cli.run(&["framework", "list"], &logs);
    let cells = row(&frameworks, &framework_id)
        .unwrap_or_else(|| panic!("no {framework_id} in:\n{frameworks}"));
    assert_eq!(
        cells,
        [
            framework_id.as_str(),
            "True",
            "cli-scheduler-host",
            "cli-framework"
        ],
        "{frameworks}"
    );

    // `framework inspect ID`: the framework's JSON without its tasks.
    let framework = cli.json(&["framework", "inspect", &framework_id], &logs);
    assert_eq!(framework["id"], framework_id.as_str(), "{framework}");
    assert_eq!(framework["name"], "cli-framework", "{framework}");
    assert_eq!(framework["hostname"], "cli-scheduler-host", "{framework}");
    assert_eq!(framework["active"], true, "{framework}");
    assert!(framework.get("tasks").is_none(), "{framework}");
    assert!(
        framework["used_resources"]["cpus"].as_f64() >= Some(0.5),
        "two sleepers' cpus: {framework}"
    );

    // `task list`: the running tasks; `--all` adds the finished one.
    let listed = cli.run(&["task", "list"], &logs);
    for id in ["cli-sleeper-1", "cli-sleeper-2"] {
        let cells = row(&listed, id).unwrap_or_else(|| panic!("no {id} in:\n{listed}"));
        // The fourth column, the executor, is left out: Mesos gives a
        // command task none (""), Agora the task id, as Mesos's agent
        // names a command executor.
        assert_eq!(cells[..3], [id, "TASK_RUNNING", &framework_id], "{listed}");
    }
    assert!(row(&listed, "cli-done").is_none(), "{listed}");
    let all = cli.run(&["task", "list", "--all"], &logs);
    let cells = row(&all, "cli-done").unwrap_or_else(|| panic!("no cli-done in:\n{all}"));
    assert_eq!(
        cells[..3],
        ["cli-done", "TASK_FINISHED", &framework_id],
        "{all}"
    );
    assert!(row(&all, "cli-sleeper-1").is_some(), "{all}");

    // `task inspect ID`: the task's JSON, as `/tasks` gives it.
    let task = cli.json(&["task", "inspect", "cli-sleeper-1"], &logs);
    assert_eq!(task["id"], "cli-sleeper-1", "{task}");
    assert_eq!(task["name"], "cli-sleeper-1", "{task}");
    assert_eq!(task["framework_id"], framework_id.as_str(), "{task}");
    assert_eq!(task["slave_id"], agent_id.as_str(), "{task}");
    assert_eq!(task["state"], "TASK_RUNNING", "{task}");
    assert_eq!(
        task["statuses"]
            .as_array()
            .and_then(|s| s.last())
            .map(|s| &s["state"]),
        Some(&serde_json::json!("TASK_RUNNING")),
        "{task}"
    );
    // An unknown task: Mesos's CLI prints nothing and exits 0.
    assert_eq!(cli.run(&["task", "inspect", "no-such-task"], &logs), "");

    drop(driver);
}
