//! Draining, deactivating and marking agents gone, against a real master
//! (with credentials: these calls change the cluster), real agents and a
//! real framework, through the `agora agent` command and raw v1 operator
//! calls in JSON as Mesos's tools send them: a drained agent's long task
//! is killed with `REASON_AGENT_DRAINING` after the grace period and not
//! before, nothing new lands there meanwhile, `drain_info` goes DRAINING
//! then DRAINED, and a reactivated agent is offered again; an agent
//! marked gone loses its tasks and its id; anonymous calls, unknown agent
//! ids and negative grace periods are refused with a clear error.

mod support;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

use agora_proto::{Filters, FrameworkInfo, Offer, Reason, TaskState};
use support::{bin, command_task, start_framework, wait_for, wait_until, SchedEvent, TestCluster};

const AGENT: &str = "cpus:2;mem:1024";
const SECRET: &str = "ops-secret";

/// A master that knows principal `ops`, and two agents.
fn cluster() -> (TestCluster, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let secrets = dir.path();
    let credentials = secrets.join("credentials.json");
    std::fs::write(
        &credentials,
        format!(r#"{{"credentials":[{{"principal":"ops","secret":"{SECRET}"}}]}}"#),
    )
    .unwrap();
    let secret_file = secrets.join("ops.secret");
    std::fs::write(&secret_file, SECRET).unwrap();
    let credentials = credentials.display().to_string();
    let cluster = TestCluster::start_with(
        2,
        AGENT,
        &[
            "--credentials",
            &credentials,
            "--allocation-interval",
            "200ms",
        ],
    );
    cluster.wait_agents(2);
    (cluster, dir)
}

/// `POST /api/v1` with a JSON body, as Mesos's tools send it: status, body.
fn post_v1(addr: SocketAddr, body: &serde_json::Value, auth: bool) -> (u16, String) {
    use std::io::{Read, Write};
    let body = serde_json::to_vec(body).unwrap();
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut head = format!(
        "POST /api/v1 HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Type: application/json\r\nAccept: application/json\r\nContent-Length: {}\r\n",
        body.len()
    );
    if auth {
        let credential = agora_proto::Credential {
            principal: "ops".into(),
            secret: SECRET.into(),
        };
        head.push_str(&format!(
            "Authorization: {}\r\n",
            credential.authorization()
        ));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).unwrap();
    stream.write_all(&body).unwrap();
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).unwrap();
    let text = String::from_utf8_lossy(&raw).into_owned();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or("");
    (status, body.to_string())
}

/// `agora --master M --principal ops --secret-file F ARGS`: success, output.
fn agora(cluster: &TestCluster, secret_file: &Path, args: &[&str]) -> (bool, String) {
    let out = std::process::Command::new(bin("agora"))
        .args(["--master", &cluster.master_address()])
        .args(["--principal", "ops", "--secret-file"])
        .arg(secret_file)
        .args(args)
        .output()
        .expect("run agora");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

fn agent_in_state(cluster: &TestCluster, id: &str) -> Option<serde_json::Value> {
    cluster.state()["agents"]
        .as_array()?
        .iter()
        .find(|a| a["id"] == id)
        .cloned()
}

fn drain_state(cluster: &TestCluster, id: &str) -> Option<String> {
    agent_in_state(cluster, id).and_then(|a| a["drain_info"]["state"].as_str().map(str::to_string))
}

fn next_offers(events: &Receiver<SchedEvent>) -> Vec<Offer> {
    wait_for(events, Duration::from_secs(20), |e| match e {
        SchedEvent::Offers(offers) => Some(offers.clone()),
        _ => None,
    })
}

#[test]
fn a_drained_agents_task_is_killed_after_the_grace_and_the_agent_is_offered_again_once_reactivated()
{
    let (cluster, secrets) = cluster();
    let secret_file = secrets.path().join("ops.secret");
    let (driver, events) = start_framework(&cluster.master_address(), FrameworkInfo::new("drain"));
    let no_refusal = Filters {
        refuse_seconds: Some(0.0),
    };
    let offer = next_offers(&events).remove(0);
    let drained = offer.agent_id.as_str().to_string();
    let long = command_task("long", &offer, "sleep 600", "cpus:1;mem:64");
    driver
        .launch_tasks(std::slice::from_ref(&offer.id), vec![long], no_refusal)
        .unwrap();
    wait_for(&events, Duration::from_secs(20), |e| match e {
        SchedEvent::Update(s) if s.task_id.as_str() == "long" => {
            assert_eq!(s.state, TaskState::Running, "{s:?}\n{}", cluster.logs());
            Some(())
        }
        _ => None,
    });

    // Anonymous: refused, the master has credentials.
    let drain = serde_json::json!({
        "type": "DRAIN_AGENT",
        "drain_agent": {"agent_id": {"value": drained}, "max_grace_period": "3s"}
    });
    let (status, body) = post_v1(cluster.master.addr, &drain, false);
    assert_eq!(status, 401, "{body}");
    assert_eq!(drain_state(&cluster, &drained), None);
    // A negative grace period and an unknown agent: refused, saying why.
    let negative = serde_json::json!({
        "type": "DRAIN_AGENT",
        "drain_agent": {"agent_id": {"value": drained}, "max_grace_period": "-1s"}
    });
    let (status, body) = post_v1(cluster.master.addr, &negative, true);
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("must not be negative"), "{body}");
    let (ok, out) = agora(&cluster, &secret_file, &["agent", "drain", "no-such-agent"]);
    assert!(
        !ok && out.contains("No agent found") && out.contains("no-such-agent"),
        "{out}"
    );

    let (ok, out) = agora(
        &cluster,
        &secret_file,
        &["agent", "drain", &drained, "--grace", "3s"],
    );
    assert!(ok, "{out}");
    let drained_at = Instant::now();
    wait_until(
        Duration::from_secs(5),
        "DRAINING in /state",
        || cluster.logs(),
        || (drain_state(&cluster, &drained).as_deref() == Some("DRAINING")).then_some(()),
    );
    let agent = agent_in_state(&cluster, &drained).unwrap();
    assert_eq!(agent["deactivated"], true);
    assert_eq!(
        agent["drain_info"]["config"]["max_grace_period"]["nanoseconds"],
        3_000_000_000i64
    );
    // GET_AGENTS as a Mesos client reads it.
    let (status, body) = post_v1(
        cluster.master.addr,
        &serde_json::json!({"type": "GET_AGENTS"}),
        false,
    );
    assert_eq!(status, 200, "{body}");
    let agents: serde_json::Value = serde_json::from_str(&body).unwrap();
    let listed = agents["get_agents"]["agents"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["agent_info"]["id"]["value"] == drained.as_str())
        .cloned()
        .expect("the drained agent in GET_AGENTS");
    assert_eq!(listed["drain_info"]["state"], "DRAINING", "{listed}");
    assert_eq!(listed["deactivated"], true, "{listed}");

    // Until the task ends, nothing of the drained agent is offered: an
    // offer of it still queued here from before the drain must be
    // rescinded (the drain rescinds what is outstanding), and no other
    // comes. The other agent's offers are declined so they keep coming.
    let mut stale: Vec<agora_proto::OfferId> = Vec::new();
    let killed = loop {
        match events.recv_timeout(Duration::from_secs(20)) {
            Ok(SchedEvent::Offers(offers)) => {
                for o in offers {
                    if o.agent_id.as_str() == drained {
                        stale.push(o.id.clone());
                    } else {
                        driver.decline_offer(&o.id, no_refusal).unwrap();
                    }
                }
            }
            Ok(SchedEvent::Rescinded(id)) => stale.retain(|o| *o != id),
            Ok(SchedEvent::Update(s)) if s.task_id.as_str() == "long" => break s,
            Ok(_) => {}
            Err(e) => panic!("no end of the long task: {e}\n{}", cluster.logs()),
        }
    };
    assert!(
        stale.is_empty(),
        "offers of the draining agent not rescinded: {stale:?}"
    );
    let after = drained_at.elapsed();
    assert_eq!(killed.state, TaskState::Killed, "{killed:?}");
    assert_eq!(
        killed.reason,
        Some(Reason::ReasonAgentDraining),
        "{killed:?}"
    );
    assert!(
        after >= Duration::from_millis(2900),
        "killed after {after:?}"
    );
    wait_until(
        Duration::from_secs(10),
        "DRAINED in /state",
        || cluster.logs(),
        || (drain_state(&cluster, &drained).as_deref() == Some("DRAINED")).then_some(()),
    );

    let (ok, out) = agora(&cluster, &secret_file, &["agent", "reactivate", &drained]);
    assert!(ok, "{out}");
    wait_for(&events, Duration::from_secs(20), |e| match e {
        SchedEvent::Offers(offers) => {
            let mine = offers.iter().any(|o| o.agent_id.as_str() == drained);
            for o in offers {
                let _ = driver.decline_offer(&o.id, no_refusal);
            }
            mine.then_some(())
        }
        _ => None,
    });
    wait_until(
        Duration::from_secs(5),
        "no drain_info in /state",
        || cluster.logs(),
        || drain_state(&cluster, &drained).is_none().then_some(()),
    );
    assert_eq!(
        agent_in_state(&cluster, &drained).unwrap()["deactivated"],
        false
    );
    let _ = driver.stop(false);
}

#[test]
fn an_agent_marked_gone_loses_its_tasks_and_its_id() {
    let (cluster, _secrets) = cluster();
    let (driver, events) = start_framework(&cluster.master_address(), FrameworkInfo::new("gone"));
    let offer = next_offers(&events).remove(0);
    let gone = offer.agent_id.as_str().to_string();
    let long = command_task("long", &offer, "sleep 600", "cpus:1;mem:64");
    driver
        .launch_tasks(
            std::slice::from_ref(&offer.id),
            vec![long],
            Filters::default(),
        )
        .unwrap();
    wait_for(&events, Duration::from_secs(20), |e| match e {
        SchedEvent::Update(s) if s.task_id.as_str() == "long" => {
            assert_eq!(s.state, TaskState::Running, "{s:?}");
            Some(())
        }
        _ => None,
    });
    let call = serde_json::json!({
        "type": "MARK_AGENT_GONE",
        "mark_agent_gone": {"agent_id": {"value": gone}}
    });
    let (status, body) = post_v1(cluster.master.addr, &call, false);
    assert_eq!(status, 401, "anonymous: {body}");
    let (status, body) = post_v1(cluster.master.addr, &call, true);
    assert_eq!(status, 200, "{body}");
    let lost = wait_for(&events, Duration::from_secs(20), |e| match e {
        SchedEvent::Update(s) if s.task_id.as_str() == "long" => Some(s.clone()),
        _ => None,
    });
    assert_eq!(lost.state, TaskState::Lost, "{lost:?}");
    assert_eq!(
        lost.reason,
        Some(Reason::ReasonAgentRemovedByOperator),
        "{lost:?}"
    );
    // The id is gone for good: the agent, shut down, registers anew
    // under another id; the old one is refused.
    wait_until(
        Duration::from_secs(20),
        "the agent back under a new id",
        || cluster.logs(),
        || {
            let state = cluster.state();
            let ids: Vec<String> = state["agents"]
                .as_array()?
                .iter()
                .filter_map(|a| a["id"].as_str().map(str::to_string))
                .collect();
            (ids.len() == 2 && !ids.contains(&gone)).then_some(())
        },
    );
    let (status, body) = post_v1(cluster.master.addr, &call, true);
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("No agent found"), "{body}");
    let _ = driver.stop(false);
}
