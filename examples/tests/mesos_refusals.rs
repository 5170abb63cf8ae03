//! Nothing a Mesos framework sends is silently ignored (issue 25): a real
//! pymesos 0.3.15 framework (`mesos/pymesos_refusals.py`) against real
//! `agora-master` and `agora-agent` processes asks for what Agora does not
//! carry out, and hears each refusal by name.
//!
//! - A task in a Docker container (alpine:3.19, a host volume at `/data`)
//!   with a Docker daemon option (`docker.parameters`) and a task with a
//!   failing COMMAND health check come back `TASK_ERROR` /
//!   `REASON_TASK_INVALID`, "ContainerInfo.DockerInfo.parameters is not
//!   supported" and "TaskInfo.health_check is not supported", while the
//!   plain task of the same ACCEPT finishes (and nothing ran on the host
//!   in place of the container).
//! - An ACCEPT with a RESERVE operation beside a LAUNCH is answered `400`
//!   naming RESERVE (pymesos raises it), its task is `TASK_ERROR` naming
//!   RESERVE, and a later offer of the agent holds the refused offer's
//!   resources.
//! - A task with a key `TaskInfo` does not have ("contaner"): the same,
//!   the key named.
//! - A task whose `allocation_info` names a role its offer was not
//!   allocated to: `TASK_ERROR` naming both; a LAUNCH_GROUP whose DEFAULT
//!   executor has a `name`: both tasks `TASK_ERROR` naming the field; a
//!   DEFAULT group without: both finish.
//!
//! Skipped with a message without the venv, except under `CI=true`.

mod support;

use support::mesos::{python, Client};
use support::TestCluster;

const AGENT: &str = "cpus:2;mem:2048;disk:1024;ports:[31000-31100]";
const MASTER_FLAGS: &[&str] = &["--allocation-interval", "200ms"];

/// The last update of `task` the client printed.
fn last_update<'a>(events: &'a [serde_json::Value], task: &str) -> &'a serde_json::Value {
    events
        .iter()
        .rev()
        .find(|e| e["event"] == "update" && e["task_id"] == task)
        .unwrap_or_else(|| panic!("no update of {task}: {events:?}"))
}

#[test]
fn pymesos_hears_every_refusal_by_name_and_gets_its_offers_back() {
    let Some(python) = python() else { return };
    let cluster = TestCluster::start_with(1, AGENT, MASTER_FLAGS);
    let master = cluster.master_address();
    let client = Client::python(
        &python,
        "pymesos_refusals.py",
        &[&master],
        cluster.dir.path(),
    );
    let events = client.finish(&|| cluster.logs());
    let refused = |task: &str, message: &str| {
        let status = last_update(&events, task);
        assert_eq!(status["state"], "TASK_ERROR", "{task}: {status}");
        assert_eq!(status["reason"], "REASON_TASK_INVALID", "{task}: {status}");
        let said = status["message"].as_str().unwrap_or_default();
        assert!(said.contains(message), "{task}: {said:?} lacks {message:?}");
    };
    refused(
        "in-docker",
        "ContainerInfo.DockerInfo.parameters is not supported",
    );
    refused("health-checked", "TaskInfo.health_check is not supported");
    assert_eq!(last_update(&events, "plain")["state"], "TASK_FINISHED");
    refused(
        "beside-reserve",
        "Offer.Operation.type RESERVE is not supported: the whole ACCEPT is refused",
    );
    refused("misspelt", "unrecognized field name 'contaner'");
    let calls: Vec<&str> = events
        .iter()
        .filter(|e| e["event"] == "call_refused")
        .filter_map(|e| e["message"].as_str())
        .collect();
    assert_eq!(calls.len(), 2, "{calls:?}");
    assert!(
        calls[0].contains("400") && calls[0].contains("RESERVE is not supported"),
        "{calls:?}"
    );
    assert!(
        calls[1].contains("400") && calls[1].contains("'contaner'"),
        "{calls:?}"
    );
    let back: Vec<&str> = events
        .iter()
        .filter(|e| e["event"] == "offer_back")
        .filter_map(|e| e["after"].as_str())
        .collect();
    assert_eq!(back, ["RESERVE", "unknown key"]);
    refused(
        "other-role",
        "allocated to role \"not-mine\" (allocation_info.role)",
    );
    for task in ["named-1", "named-2"] {
        let status = last_update(&events, task);
        assert_eq!(status["state"], "TASK_ERROR", "{task}: {status}");
        assert_eq!(
            status["reason"], "REASON_TASK_GROUP_INVALID",
            "{task}: {status}"
        );
        let said = status["message"].as_str().unwrap_or_default();
        assert!(
            said.contains("ExecutorInfo.name is not supported for a DEFAULT executor"),
            "{task}: {said:?}"
        );
    }
    for task in ["group-1", "group-2"] {
        assert_eq!(
            last_update(&events, task)["state"],
            "TASK_FINISHED",
            "{task}"
        );
    }
}
