//! Quota and weights at run time, against a real master and agents: an
//! operator sets a limit with `UPDATE_QUOTA` (raw JSON over HTTP, as a
//! Mesos client sends it), a framework in the role is never offered more
//! than the limit, `GET_QUOTA`, `GET_WEIGHTS` and `GET_ROLES` answer as
//! Mesos does, writes without a principal (or by one the ACLs refuse)
//! are refused while the master has credentials, bad quotas are refused
//! naming what is wrong, and the quota and weight survive a restart of
//! the master (its registry in `--work-dir`).

mod support;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use agora_proto::{basic_authorization, FrameworkInfo, OfferId};
use serde_json::{json, Value};
use support::{start_framework, wait_until, SchedEvent, TestCluster};

const AGENT: &str = "cpus:2;mem:1024;disk:1024";

fn post(cluster: &TestCluster, authorization: Option<&str>, call: &Value) -> (u16, String) {
    let mut headers = vec![
        ("content-type", "application/json"),
        ("accept", "application/json"),
    ];
    headers.extend(authorization.map(|a| ("authorization", a)));
    let response = agora_client::blocking::request(
        agora_client::Method::POST,
        cluster.master.addr,
        "/api/v1",
        &headers,
        Some(serde_json::to_vec(call).unwrap()),
    )
    .expect("POST /api/v1");
    (response.status, response.text())
}

fn get(cluster: &TestCluster, authorization: &str, kind: &str) -> Value {
    let (status, body) = post(cluster, Some(authorization), &json!({ "type": kind }));
    assert_eq!(status, 200, "{kind}: {body}");
    serde_json::from_str(&body).expect("JSON answer")
}

fn update_quota(role: &str, guarantees: Value, limits: Value) -> Value {
    json!({
        "type": "UPDATE_QUOTA",
        "update_quota": {
            "quota_configs": [{"role": role, "guarantees": guarantees, "limits": limits}]
        }
    })
}

/// The `limits` of `role` in a GET_QUOTA answer.
fn limits_of(answer: &Value, role: &str) -> Option<Value> {
    answer["get_quota"]["status"]["configs"]
        .as_array()?
        .iter()
        .find(|c| c["role"] == role)
        .map(|c| c["limits"].clone())
}

#[test]
fn quota_limits_and_weights_at_run_time_survive_a_restart() {
    let secrets = tempfile::tempdir().unwrap();
    let credentials = secrets.path().join("credentials");
    std::fs::write(&credentials, "ops o-secret\nviewer v-secret\n").unwrap();
    let credentials = credentials.display().to_string();
    let acls = r#"{"update_quotas": [{"principals": {"values": ["ops"]}, "roles": {"type": "ANY"}},
                                     {"principals": {"type": "ANY"}, "roles": {"type": "NONE"}}],
                   "update_weights": [{"principals": {"values": ["ops"]}, "roles": {"type": "ANY"}},
                                      {"principals": {"type": "ANY"}, "roles": {"type": "NONE"}}]}"#;
    let mut cluster = TestCluster::start_with(
        2,
        AGENT,
        &[
            "--credentials",
            &credentials,
            "--acls",
            acls,
            "--allocation-interval",
            "100ms",
        ],
    );
    let ops = basic_authorization("ops", "o-secret");
    let viewer = basic_authorization("viewer", "v-secret");
    let limit = update_quota("limited", json!({}), json!({"cpus": {"value": 1.0}}));

    // A write needs a principal while the master has credentials, and
    // the ACLs' leave.
    let (status, body) = post(&cluster, None, &limit);
    assert_eq!(status, 401, "{body}");
    let (status, body) = post(&cluster, Some(&viewer), &limit);
    assert_eq!(status, 403, "{body}");
    let weights = json!({"type": "UPDATE_WEIGHTS",
                         "update_weights": {"weight_infos": [{"role": "limited", "weight": 2.5}]}});
    let (status, body) = post(&cluster, None, &weights);
    assert_eq!(status, 401, "{body}");

    // Refusals name what is wrong.
    for (call, expected) in [
        (
            update_quota(
                "limited",
                json!({"cpus": {"value": 2.0}}),
                json!({"cpus": {"value": 1.0}}),
            ),
            "above its limit",
        ),
        (
            update_quota("limited", json!({"bananas": {"value": 1.0}}), json!({})),
            "unknown resource \"bananas\"",
        ),
        (
            update_quota("limited", json!({}), json!({"mem": {"value": -1.0}})),
            "non-negative",
        ),
        (update_quota("../x", json!({}), json!({})), "invalid role"),
        (update_quota("*", json!({}), json!({})), "invalid role"),
        (
            update_quota("big", json!({"cpus": {"value": 100.0}}), json!({})),
            "set 'force'",
        ),
        (
            json!({"type": "UPDATE_WEIGHTS",
                   "update_weights": {"weight_infos": [{"role": "limited", "weight": 0.0}]}}),
            "positive number",
        ),
    ] {
        let (status, body) = post(&cluster, Some(&ops), &call);
        assert_eq!(status, 400, "{call}: {body}");
        assert!(body.contains(expected), "{call}: {body}");
    }

    // The limit, and a weight.
    let (status, body) = post(&cluster, Some(&ops), &limit);
    assert_eq!(status, 200, "{body}");
    let (status, body) = post(&cluster, Some(&ops), &weights);
    assert_eq!(status, 200, "{body}");
    let quota = wait_until(
        Duration::from_secs(10),
        "GET_QUOTA shows the limit",
        || cluster.logs(),
        || limits_of(&get(&cluster, &viewer, "GET_QUOTA"), "limited"),
    );
    assert_eq!(quota, json!({"cpus": {"value": 1.0}}));
    let answer = get(&cluster, &viewer, "GET_WEIGHTS");
    assert_eq!(answer["type"], "GET_WEIGHTS");
    assert_eq!(
        answer["get_weights"]["weight_infos"],
        json!([{"role": "limited", "weight": 2.5}]),
        "{answer}"
    );

    // A framework in the role: never offered more cpus than the limit,
    // though 4 are free. Offers are kept (not declined), so what it holds
    // is everything offered less what was rescinded.
    let mut info = FrameworkInfo::new("limited-framework");
    info.roles = vec!["limited".into()];
    let (driver, events) = start_framework(&cluster.master_address(), info);
    let mut held: HashMap<OfferId, f64> = HashMap::new();
    let mut most: f64 = 0.0;
    let until = Instant::now() + Duration::from_secs(3);
    while let Some(left) = until.checked_duration_since(Instant::now()) {
        match events.recv_timeout(left) {
            Ok(SchedEvent::Offers(offers)) => {
                for offer in offers {
                    assert_eq!(offer.allocation_role.as_deref(), Some("limited"));
                    held.insert(offer.id.clone(), offer.resources.cpus());
                }
            }
            Ok(SchedEvent::Rescinded(id)) => {
                held.remove(&id);
            }
            Ok(_) => {}
            Err(_) => break,
        }
        most = most.max(held.values().sum());
    }
    assert!(most > 0.0, "the framework got no cpus at all");
    assert!(most <= 1.0 + 1e-9, "offered {most} cpus over a limit of 1");

    let roles = get(&cluster, &viewer, "GET_ROLES");
    let role = roles["get_roles"]["roles"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == "limited")
        .cloned()
        .unwrap_or_else(|| panic!("no role 'limited' in {roles}"));
    assert_eq!(role["weight"], 2.5, "{role}");
    assert_eq!(
        role["frameworks"].as_array().map(Vec::len),
        Some(1),
        "{role}"
    );
    let _ = driver.stop(false);

    // A restarted master has them from its registry.
    cluster.master.restart_same_port();
    cluster.wait_agents(2);
    let quota = wait_until(
        Duration::from_secs(10),
        "GET_QUOTA after a restart",
        || cluster.logs(),
        || limits_of(&get(&cluster, &viewer, "GET_QUOTA"), "limited"),
    );
    assert_eq!(quota, json!({"cpus": {"value": 1.0}}));
    let answer = get(&cluster, &viewer, "GET_WEIGHTS");
    assert_eq!(
        answer["get_weights"]["weight_infos"],
        json!([{"role": "limited", "weight": 2.5}]),
        "{answer}"
    );

    // Removing the quota (no guarantees, no limits) is kept too.
    let (status, body) = post(
        &cluster,
        Some(&ops),
        &update_quota("limited", json!({}), json!({})),
    );
    assert_eq!(status, 200, "{body}");
    wait_until(
        Duration::from_secs(10),
        "GET_QUOTA without it",
        || cluster.logs(),
        || {
            limits_of(&get(&cluster, &viewer, "GET_QUOTA"), "limited")
                .is_none()
                .then_some(())
        },
    );

    // The CLI: `agora quota` and `agora weights`, as the operator.
    let secret = secrets.path().join("ops-secret");
    std::fs::write(&secret, "o-secret\n").unwrap();
    let master = cluster.master_address();
    let secret = secret.display().to_string();
    let agora = |args: &[&str]| {
        let mut all = vec![
            "--master",
            &master,
            "--principal",
            "ops",
            "--secret-file",
            &secret,
        ];
        all.extend_from_slice(args);
        let (ok, out, err) = cluster.run_bin("agora", &all, Duration::from_secs(20));
        assert!(ok, "agora {args:?}: {err}");
        out
    };
    agora(&[
        "quota",
        "set",
        "batch",
        "--guarantee",
        "cpus:1",
        "--limit",
        "cpus:2;mem:0",
    ]);
    agora(&["weights", "set", "batch=3", "web=0.5"]);
    let listed = wait_until(
        Duration::from_secs(10),
        "agora quota get",
        || cluster.logs(),
        || {
            let out = agora(&["quota", "get", "--json"]);
            out.contains("batch").then_some(out)
        },
    );
    let rows: Value = serde_json::from_str(&listed).expect("JSON rows");
    assert_eq!(
        rows,
        json!([{"role": "batch", "guarantees": "cpus:1.0", "limits": "cpus:2.0;mem:0.0"}])
    );
    let table = agora(&["weights", "get"]);
    assert!(table.contains("batch") && table.contains("web"), "{table}");
    // Anonymous, the CLI is refused too.
    let (ok, _, err) = cluster.run_bin(
        "agora",
        &["--master", &master, "weights", "set", "batch=1"],
        Duration::from_secs(20),
    );
    assert!(!ok && err.contains("401"), "{err}");
}
