//! The Mesos v1 operator API's SUBSCRIBE event stream, read by real
//! clients: pymesos 0.3.15's `MesosOperatorMasterDriver` (JSON, at
//! `/api/v1/operator`) and a mesos-go watcher in the style of mesos-go's
//! mwatch (`tests/mesos-go/operator`: httpmaster sender, protobuf, proto2
//! required fields enforced). Both subscribe to one master and must see,
//! in order: SUBSCRIBED with the cluster's state, an agent joining
//! (AGENT_ADDED), frameworks arriving, running tasks to TASK_FINISHED
//! and leaving (FRAMEWORK_ADDED, TASK_ADDED, TASK_UPDATED,
//! FRAMEWORK_REMOVED), and the agent leaving (AGENT_REMOVED).
//!
//! A client whose tool is missing (the venv, or Go with mesos-go) is left
//! out with a message, except under `CI=true`, where that fails.

mod support;

use std::collections::HashSet;
use std::time::Duration;

use support::mesos::{go_operator, python, Client};
use support::TestCluster;

const AGENT: &str = "cpus:2;mem:2048;disk:1024;ports:[31000-31100]";
/// Agents that stop answering are removed within about a second.
const MASTER_FLAGS: &[&str] = &[
    "--allocation-interval",
    "200ms",
    "--agent-ping-interval",
    "300ms",
    "--max-missed-pings",
    "3",
];

fn agent_ids(cluster: &TestCluster) -> HashSet<String> {
    cluster.state()["agents"]
        .as_array()
        .expect("agents")
        .iter()
        .filter_map(|a| a["id"].as_str().map(str::to_string))
        .collect()
}

#[test]
fn operator_subscribers_see_agents_frameworks_and_tasks_come_and_go() {
    let python = python();
    let go = go_operator();
    if python.is_none() && go.is_none() {
        return;
    }
    let mut cluster = TestCluster::start_with(1, AGENT, MASTER_FLAGS);
    let master = cluster.master_address();
    let dir = cluster.dir.path().to_path_buf();
    let mut watchers: Vec<(&str, Client)> = Vec::new();
    if let Some(python) = &python {
        let client = Client::python(python, "pymesos_operator.py", &[&master], &dir);
        watchers.push(("pymesos", client));
    }
    if let Some(go) = &go {
        let url = format!("http://{master}/api/v1");
        let client = Client::start(&go.path, &["-url", &url], &dir, "mesos-go-operator");
        watchers.push(("mesos-go", client));
    }
    for (name, watcher) in &mut watchers {
        let logs = || cluster.logs();
        let state = watcher.expect("state", &logs);
        assert_eq!(state["agents"], 1, "{name}: {state}");
        let subscribed = watcher.expect("subscribed", &logs);
        assert_eq!(subscribed["agents"], 1, "{name}: {subscribed}");
        assert_eq!(subscribed["frameworks"], 0, "{name}: {subscribed}");
    }

    // An agent joins.
    let before = agent_ids(&cluster);
    let joined = cluster.add_agent(AGENT, &[]);
    cluster.wait_agents(2);
    let new_agent = agent_ids(&cluster)
        .difference(&before)
        .next()
        .expect("the new agent's id")
        .clone();
    for (name, watcher) in &mut watchers {
        let added = watcher.expect("agent_added", &|| cluster.logs());
        assert_eq!(added["id"], new_agent.as_str(), "{name}: {added}");
    }

    // Frameworks run tasks and go away: "op"'s tasks live long enough to
    // be seen running, "blink"'s may come and go between two snapshots
    // of the master's state; each is added once and ends TASK_FINISHED.
    for (framework, command, instances) in [("op", "sleep 0.3", 2), ("blink", "true", 3)] {
        let (ok, out, err) = cluster.run_bin(
            "agora-execute",
            &[
                "--master",
                &master,
                "--name",
                framework,
                "--command",
                command,
                "--instances",
                &instances.to_string(),
                "--timeout",
                "60s",
            ],
            Duration::from_secs(90),
        );
        assert!(ok, "agora-execute failed\n{out}\n{err}");
        for (name, watcher) in &mut watchers {
            let logs = || cluster.logs();
            let added = watcher.expect_that(
                &format!("framework_added {framework}"),
                |v| v["event"] == "framework_added" && v["name"] == framework,
                &logs,
            );
            let id = added["id"].as_str().expect("framework id").to_string();
            watcher.expect_that(
                &format!("framework_removed {framework}"),
                |v| v["event"] == "framework_removed" && v["id"] == id.as_str(),
                &logs,
            );
            let seen = watcher.seen();
            for i in 0..instances {
                let task = format!("{framework}-{i}");
                let of_task = |v: &&serde_json::Value| {
                    v["task_id"] == task.as_str() && v["framework_id"] == id.as_str()
                };
                let added = seen
                    .iter()
                    .filter(|v| v["event"] == "task_added")
                    .filter(of_task)
                    .count();
                assert_eq!(added, 1, "{name}: {task} added once: {seen:#?}");
                let last = seen
                    .iter()
                    .filter(|v| v["event"] == "task_added" || v["event"] == "task_updated")
                    .rfind(of_task)
                    .expect("events of the task");
                assert_eq!(last["state"], "TASK_FINISHED", "{name}: {task}: {seen:#?}");
            }
        }
    }

    // The agent leaves.
    cluster.agents[joined].kill();
    for (name, watcher) in &mut watchers {
        let removed = watcher.expect("agent_removed", &|| cluster.logs());
        assert_eq!(removed["id"], new_agent.as_str(), "{name}: {removed}");
    }
}
