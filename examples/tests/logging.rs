//! Logs as operators read them: a master and an agent started with
//! `--log-format json` write one JSON object per line, and the lines about
//! a task carry its id (and its framework's and agent's) as fields, not
//! only inside the message text.

mod support;

use std::path::Path;
use std::time::Duration;

use serde_json::Value;
use support::TestCluster;

/// The JSON lines of a process log (the first line is the address the
/// process printed on stdout).
fn json_lines(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).expect("log");
    text.lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

/// The first line whose message is `message`.
fn line<'a>(lines: &'a [Value], message: &str) -> Option<&'a Value> {
    lines.iter().find(|l| l["fields"]["message"] == message)
}

#[test]
fn json_log_lines_about_a_task_carry_its_ids() {
    let json = ["--log-format", "json"];
    let cluster = TestCluster::start_full(1, "cpus:2;mem:1024", &json, &json);
    let (ok, out, err) = cluster.run_bin(
        "agora-execute",
        &[
            "--master",
            &cluster.master_address(),
            "--name",
            "logged",
            "--command",
            "true",
            "--resources",
            "cpus:0.1;mem:32",
            "--instances",
            "2",
            "--timeout",
            "60s",
        ],
        Duration::from_secs(90),
    );
    assert!(
        ok,
        "agora-execute failed\nstdout:\n{out}\nstderr:\n{err}\n{}",
        cluster.logs()
    );

    let master = json_lines(&cluster.dir.path().join("master.log"));
    assert!(!master.is_empty(), "{}", cluster.logs());
    for l in &master {
        assert!(l["level"].is_string() && l["timestamp"].is_string(), "{l}");
    }
    let launch = line(&master, "launching task")
        .unwrap_or_else(|| panic!("no launch logged\n{}", cluster.logs()));
    let fields = &launch["fields"];
    assert!(
        fields["task_id"]
            .as_str()
            .is_some_and(|id| id.starts_with("logged")),
        "{launch}"
    );
    assert!(fields["framework_id"].is_string(), "{launch}");
    assert!(fields["agent_id"].is_string(), "{launch}");

    let agent = json_lines(&cluster.dir.path().join("agent-0.log"));
    let running = line(&agent, "running task")
        .unwrap_or_else(|| panic!("no task start logged\n{}", cluster.logs()));
    for id in ["task_id", "framework_id", "executor_id"] {
        assert!(running["fields"][id].is_string(), "{id} in {running}");
    }
}
