//! Mesos frameworks on mesos-go run on Agora unchanged (issue 13, master
//! side): a scheduler written with mesos-go's v1 library
//! (`tests/mesos-go/scheduler`, in the library's idioms: httpsched
//! caller, controller loop, event rules) drives real `agora-master` and
//! `agora-agent` processes through the Mesos v1 scheduler API, with the
//! protobuf codec (mesos-go's default, proto2 required fields enforced on
//! every event) and with JSON:
//!
//! - a job of command tasks to TASK_FINISHED, explicit reconciliation of
//!   an unknown task (TASK_LOST, or TASK_UNKNOWN for a PARTITION_AWARE
//!   framework), implicit reconciliation, kill, SUPPRESS, TEARDOWN;
//! - scheduler failover: a second process re-subscribes with the first
//!   one's framework id, finds its task by reconciliation and kills it;
//! - a master restart: the controller re-subscribes by itself with the
//!   same framework id and the task is found again;
//! - a custom executor written with mesos-go's executor library
//!   (`tests/mesos-go/executor`, protobuf, as mesos-go's executors are),
//!   fetched by the agent through `CommandInfo.uris` and speaking the
//!   agent's Mesos v1 executor API: tasks to TASK_FINISHED, a framework
//!   message each way, a task killed.
//!
//! Each test builds the scheduler with `go build` in GOPATH mode against
//! Debian's `golang-github-mesos-mesos-go-dev` (`.ci/run` installs it and
//! `golang-go`); without them the tests are skipped with a message,
//! except under `CI=true`, where they fail.

mod support;

use support::mesos::{
    self, frameworks, go_executor, go_scheduler, updates, wait_state, Client, GoCodec,
};
use support::TestCluster;

const AGENT: &str = "cpus:2;mem:2048;disk:1024;ports:[31000-31100]";
const MASTER_FLAGS: &[&str] = &["--allocation-interval", "200ms"];

fn job(codec: GoCodec) {
    let Some(scheduler) = go_scheduler() else {
        return;
    };
    let cluster = TestCluster::start_with(2, AGENT, MASTER_FLAGS);
    let logs = || cluster.logs();
    let master = cluster.master_address();
    for (scenario, unknown) in [("job", "TASK_LOST"), ("job-pa", "TASK_UNKNOWN")] {
        let client = Client::go(
            &scheduler,
            codec,
            &master,
            scenario,
            &[],
            cluster.dir.path(),
        );
        let events = client.finish(&logs);
        for i in 0..5 {
            let states = updates(&events, &format!("job-{i}"));
            assert_eq!(
                states,
                ["TASK_RUNNING", "TASK_FINISHED"],
                "{scenario}: job-{i}"
            );
        }
        assert_eq!(updates(&events, "no-such-task"), [unknown], "{scenario}");
        assert_eq!(
            updates(&events, "long"),
            ["TASK_RUNNING", "TASK_RUNNING", "TASK_KILLED"],
            "{scenario}"
        );
        // Every update from an executor came with a uuid (and was
        // acknowledged by AckStatusUpdates); the master's own did not.
        for event in events.iter().filter(|e| e["event"] == "update") {
            let from_executor = event["source"] == "SOURCE_EXECUTOR";
            assert_eq!(event["reliable"], from_executor, "{scenario}: {event}");
        }
    }
    wait_state(
        cluster.master.addr,
        "both frameworks torn down",
        &logs,
        |s| frameworks(s).is_empty(),
    );
}

fn failover(codec: GoCodec) {
    let Some(scheduler) = go_scheduler() else {
        return;
    };
    let cluster = TestCluster::start_with(1, AGENT, MASTER_FLAGS);
    let master = cluster.master_address();
    let dir = cluster.dir.path().to_path_buf();
    mesos::failover_keeps_the_framework_and_its_task(&cluster, |scenario, id| {
        let extra: Vec<&str> = id.map(|id| vec!["-framework-id", id]).unwrap_or_default();
        Client::go(&scheduler, codec, &master, scenario, &extra, &dir)
    });
}

fn master_restart(codec: GoCodec) {
    let Some(scheduler) = go_scheduler() else {
        return;
    };
    let mut cluster = TestCluster::start_full(
        1,
        AGENT,
        MASTER_FLAGS,
        &["--reconnect-backoff-max", "300ms"],
    );
    let master = cluster.master_address();
    let client = Client::go(
        &scheduler,
        codec,
        &master,
        "restart",
        &[],
        cluster.dir.path(),
    );
    mesos::resubscribes_after_a_master_restart(&mut cluster, client);
}

#[test]
fn mesos_go_protobuf_job_reconciliation_kill_and_teardown() {
    job(GoCodec::Protobuf);
}

#[test]
fn mesos_go_json_job_reconciliation_kill_and_teardown() {
    job(GoCodec::Json);
}

#[test]
fn mesos_go_protobuf_scheduler_failover_keeps_the_framework_and_its_task() {
    failover(GoCodec::Protobuf);
}

#[test]
fn mesos_go_json_scheduler_failover_keeps_the_framework_and_its_task() {
    failover(GoCodec::Json);
}

#[test]
fn mesos_go_protobuf_resubscribes_after_a_master_restart() {
    master_restart(GoCodec::Protobuf);
}

#[test]
fn mesos_go_json_resubscribes_after_a_master_restart() {
    master_restart(GoCodec::Json);
}

fn custom_executor(codec: GoCodec) {
    let (Some(scheduler), Some(executor)) = (go_scheduler(), go_executor()) else {
        return;
    };
    let cluster = TestCluster::start_with(1, AGENT, MASTER_FLAGS);
    let logs = || cluster.logs();
    let executor_path = executor.path.display().to_string();
    let client = Client::go(
        &scheduler,
        codec,
        &cluster.master_address(),
        "executor",
        &["-executor", &executor_path],
        cluster.dir.path(),
    );
    let events = client.finish(&logs);
    for i in 0..3 {
        assert_eq!(
            updates(&events, &format!("work-{i}")),
            ["TASK_RUNNING", "TASK_FINISHED"],
            "work-{i}"
        );
    }
    assert_eq!(updates(&events, "long"), ["TASK_RUNNING", "TASK_KILLED"]);
    for event in events.iter().filter(|e| e["event"] == "update") {
        assert_eq!(event["source"], "SOURCE_EXECUTOR", "{event}");
        assert_eq!(event["reliable"], true, "{event}");
    }
    let answer = events
        .iter()
        .find(|e| e["event"] == "message")
        .expect("the executor's message");
    assert_eq!(answer["executor_id"], "go-exec");
    assert_eq!(answer["data"], "pong: ping");
    wait_state(cluster.master.addr, "the framework torn down", &logs, |s| {
        frameworks(s).is_empty()
    });
}

#[test]
fn mesos_go_protobuf_custom_executor_runs_tasks_and_exchanges_messages() {
    custom_executor(GoCodec::Protobuf);
}

#[test]
fn mesos_go_json_scheduler_with_a_protobuf_executor() {
    custom_executor(GoCodec::Json);
}
