//! Mesos frameworks run on Agora unchanged (issue 13): real Mesos client
//! libraries drive real `agora-master` and `agora-agent` processes
//! through the Mesos v1 scheduler API, and their executors through the
//! agent's Mesos v1 executor API.
//!
//! - pymesos 0.3.15 (`mesos/pymesos_framework.py`): a job of command
//!   tasks to TASK_FINISHED, a command task running the script its
//!   `CommandInfo.uris` fetched into its sandbox, explicit and implicit reconciliation, kill,
//!   teardown; the same as a PARTITION_AWARE framework; scheduler
//!   failover with the same framework id; a master restart with the
//!   framework re-subscribing by itself.
//! - pymesos with a custom executor (`mesos/pymesos_executor_framework.py`
//!   and `mesos/pymesos_executor.py`, a `MesosExecutorDriver` fetched
//!   into the sandbox through `CommandInfo.uris`): tasks to
//!   TASK_FINISHED, framework messages both ways, kill, a LAUNCH_GROUP of
//!   two tasks on a custom executor that gets them in one LAUNCH_GROUP
//!   and finishes both (and sees its ExecutorInfo's data, labels and
//!   shutdown grace period), a task whose executor cannot be fetched
//!   failing with the URI named.
//! - mesoshttp 0.4.2 (`mesos/mesoshttp_framework.py`): command tasks,
//!   explicit reconciliation, kill, teardown (mesoshttp cannot ask for an
//!   implicit reconciliation: its `reconcile([])` sends nothing);
//!   scheduler failover with the same framework id; a master restart
//!   with the framework re-subscribing by itself (after mesoshttp's
//!   10 s `WAIT_TIME`).
//!
//! The Python clients live in the venv `.ci/run` builds
//! (`/opt/agora-mesos-venv`, or `$AGORA_MESOS_VENV`). Without it the tests
//! are skipped with a message, except under `CI=true`, where they fail.

mod support;

use support::mesos::{self, frameworks, python, updates, Client};
use support::TestCluster;

const AGENT: &str = "cpus:2;mem:2048;disk:1024;ports:[31000-31100]";
const MASTER_FLAGS: &[&str] = &["--allocation-interval", "200ms"];
/// Agents reconnect quickly to a restarted master.
const AGENT_FLAGS: &[&str] = &["--reconnect-backoff-max", "300ms"];

/// Waits until the master's `/master/state` says `check`.
fn wait_state(cluster: &TestCluster, what: &str, check: impl Fn(&serde_json::Value) -> bool) {
    support::mesos::wait_state(cluster.master.addr, what, &|| cluster.logs(), check)
}

#[test]
fn pymesos_job_reconciliation_kill_and_teardown() {
    let Some(python) = python() else { return };
    let cluster = TestCluster::start_with(2, AGENT, MASTER_FLAGS);
    let master = cluster.master_address();
    for (scenario, unknown) in [("job", "TASK_LOST"), ("job-pa", "TASK_UNKNOWN")] {
        let client = Client::python(
            &python,
            "pymesos_framework.py",
            &[&master, scenario],
            cluster.dir.path(),
        );
        let events = client.finish(&|| cluster.logs());
        for i in 0..5 {
            let states = updates(&events, &format!("job-{i}"));
            assert_eq!(
                states.last(),
                Some(&"TASK_FINISHED"),
                "{scenario}: job-{i} went {states:?}"
            );
        }
        let fetched = updates(&events, "fetched");
        assert_eq!(
            fetched.last(),
            Some(&"TASK_FINISHED"),
            "{scenario}: the task with a URI went {fetched:?}"
        );
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
    let dir = cluster.dir.path().to_path_buf();
    mesos::failover_keeps_the_framework_and_its_task(&cluster, |scenario, id| {
        let mut args = vec![master.as_str(), scenario];
        args.extend(id);
        Client::python(&python, "pymesos_framework.py", &args, &dir)
    });
}

#[test]
fn pymesos_resubscribes_after_a_master_restart() {
    let Some(python) = python() else { return };
    let mut cluster = TestCluster::start_full(1, AGENT, MASTER_FLAGS, AGENT_FLAGS);
    let master = cluster.master_address();
    let client = Client::python(
        &python,
        "pymesos_framework.py",
        &[&master, "restart"],
        cluster.dir.path(),
    );
    mesos::resubscribes_after_a_master_restart(&mut cluster, client);
}

#[test]
fn pymesos_custom_executor_runs_tasks_exchanges_messages_and_is_killed() {
    let Some(python) = python() else { return };
    let cluster = TestCluster::start_with(1, AGENT, MASTER_FLAGS);
    let master = cluster.master_address();
    let client = Client::python(
        &python,
        "pymesos_executor_framework.py",
        &[&master],
        cluster.dir.path(),
    );
    let events = client.finish(&|| cluster.logs());
    for i in 0..3 {
        assert_eq!(
            updates(&events, &format!("work-{i}")),
            ["TASK_RUNNING", "TASK_FINISHED"],
            "work-{i}"
        );
    }
    assert_eq!(updates(&events, "long"), ["TASK_RUNNING", "TASK_KILLED"]);
    for id in ["grp-1", "grp-2"] {
        assert_eq!(
            updates(&events, id),
            ["TASK_RUNNING", "TASK_FINISHED"],
            "{id}"
        );
    }
    let report = events
        .iter()
        .find(|e| e["event"] == "message" && e["executor_id"] == "py-group")
        .expect("the group executor's report");
    assert_eq!(
        report["data"],
        "group grp-1,grp-2; data group executor data; labels team=blue; grace 3secs"
    );
    // Every update of the executor's tasks came from it, reliably.
    for event in events
        .iter()
        .filter(|e| e["event"] == "update" && e["task_id"] != "unfetchable")
    {
        assert_eq!(event["source"], "SOURCE_EXECUTOR", "{event}");
        assert_eq!(event["reliable"], true, "{event}");
    }
    let answer = events
        .iter()
        .find(|e| e["event"] == "message")
        .expect("the executor's message");
    assert_eq!(answer["executor_id"], "py-exec");
    assert_eq!(answer["data"], "pong: ping [long]");
    let failed: Vec<&serde_json::Value> = events
        .iter()
        .filter(|e| e["event"] == "update" && e["task_id"] == "unfetchable")
        .collect();
    assert_eq!(failed.len(), 1, "{failed:?}");
    assert_eq!(failed[0]["state"], "TASK_FAILED");
    assert_eq!(failed[0]["reason"], "REASON_CONTAINER_LAUNCH_FAILED");
    wait_state(&cluster, "the framework torn down", |s| {
        frameworks(s).is_empty()
    });
}

#[test]
fn mesoshttp_job_reconciliation_kill_and_teardown() {
    let Some(python) = python() else { return };
    let cluster = TestCluster::start_with(1, AGENT, MASTER_FLAGS);
    let url = format!("http://{}", cluster.master_address());
    let client = Client::python(
        &python,
        "mesoshttp_framework.py",
        &[&url],
        cluster.dir.path(),
    );
    let events = client.finish(&|| cluster.logs());
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

#[test]
fn mesoshttp_scheduler_failover_keeps_the_framework_and_its_task() {
    let Some(python) = python() else { return };
    let cluster = TestCluster::start_with(1, AGENT, MASTER_FLAGS);
    let url = format!("http://{}", cluster.master_address());
    let dir = cluster.dir.path().to_path_buf();
    mesos::failover_keeps_the_framework_and_its_task(&cluster, |scenario, id| {
        let mut args = vec![url.as_str(), scenario];
        args.extend(id);
        Client::python(&python, "mesoshttp_framework.py", &args, &dir)
    });
}

#[test]
fn mesoshttp_resubscribes_after_a_master_restart() {
    let Some(python) = python() else { return };
    let mut cluster = TestCluster::start_full(1, AGENT, MASTER_FLAGS, AGENT_FLAGS);
    let url = format!("http://{}", cluster.master_address());
    let client = Client::python(
        &python,
        "mesoshttp_framework.py",
        &[&url, "restart"],
        cluster.dir.path(),
    );
    mesos::resubscribes_after_a_master_restart(&mut cluster, client);
}
