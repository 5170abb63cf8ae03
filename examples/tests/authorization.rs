//! Authorization against real processes: a master with `--acls` lets a
//! principal register only in the roles the rules give it, refuses a
//! launch as a user its principal may not run as (`TASK_ERROR`,
//! `REASON_TASK_UNAUTHORIZED`, resources offered again), and shows a
//! framework's tasks in `/state` only to the principals that may view
//! them.

mod support;

use std::sync::mpsc;
use std::time::Duration;

use agora_proto::{
    basic_authorization, CommandInfo, Credential, Filters, FrameworkInfo, Reason, Resources,
    TaskId, TaskInfo, TaskState,
};
use agora_scheduler::{DriverConfig, SchedulerDriver};
use support::{wait_for, Recorder, SchedEvent, TestCluster};

const AGENT: &str = "cpus:2;mem:1024";

const ACLS: &str = r#"{
  "register_frameworks": [
    {"principals": {"values": ["web"]}, "roles": {"values": ["web"]}},
    {"principals": {"type": "ANY"}, "roles": {"type": "NONE"}}
  ],
  "run_tasks": [
    {"principals": {"type": "NONE"}, "users": {"values": ["forbidden"]}}
  ],
  "teardown_frameworks": [
    {"principals": {"values": ["ops"]}, "framework_principals": {"type": "ANY"}},
    {"principals": {"type": "ANY"}, "framework_principals": {"type": "NONE"}}
  ],
  "view_tasks": [
    {"principals": {"values": ["ops"]}, "users": {"type": "ANY"}},
    {"principals": {"type": "ANY"}, "users": {"type": "NONE"}}
  ]
}"#;

fn framework(
    master: &str,
    user: &str,
    role: &str,
) -> (SchedulerDriver, mpsc::Receiver<SchedEvent>) {
    let (tx, rx) = mpsc::channel();
    let mut info = FrameworkInfo::new(format!("{user}-{role}"));
    info.user = user.into();
    info.roles = vec![role.into()];
    let mut config = DriverConfig::new(master);
    config.credential = Some(Credential {
        principal: "web".into(),
        secret: "w-secret".into(),
    });
    let driver = SchedulerDriver::new(Recorder(tx), info, config);
    driver.start().expect("driver start");
    (driver, rx)
}

fn task(id: &str, offer: &agora_proto::Offer) -> TaskInfo {
    TaskInfo {
        container: None,
        allocation_role: None,
        launch_stamp: None,
        name: id.into(),
        task_id: TaskId::new(id),
        agent_id: offer.agent_id.clone(),
        resources: Resources::parse("cpus:1;mem:128").unwrap(),
        executor: None,
        command: Some(CommandInfo::shell("sleep 600")),
        data: None,
        kill_grace_period: None,
        labels: Default::default(),
        task_group: None,
    }
}

fn offer(events: &mpsc::Receiver<SchedEvent>) -> agora_proto::Offer {
    wait_for(events, Duration::from_secs(20), |e| match e {
        SchedEvent::Offers(offers) => offers.first().cloned(),
        _ => None,
    })
}

fn update(events: &mpsc::Receiver<SchedEvent>, id: &str) -> agora_proto::TaskStatus {
    wait_for(events, Duration::from_secs(20), |e| match e {
        SchedEvent::Update(s) if s.task_id.as_str() == id => Some(s.clone()),
        _ => None,
    })
}

#[test]
fn acls_decide_roles_users_and_views() {
    let secrets = tempfile::tempdir().unwrap();
    let credentials = secrets.path().join("credentials");
    std::fs::write(&credentials, "web w-secret\nops o-secret\ndev d-secret\n").unwrap();
    let acls = secrets.path().join("acls.json");
    std::fs::write(&acls, ACLS).unwrap();
    let (credentials, acls) = (
        credentials.display().to_string(),
        acls.display().to_string(),
    );
    let cluster = TestCluster::start_with(
        1,
        AGENT,
        &[
            "--credentials",
            &credentials,
            "--authenticate-frameworks",
            "--acls",
            &acls,
        ],
    );
    let master = cluster.master_address();

    // web may register in role web, not in role batch.
    let (batch, batch_events) = framework(&master, "guest", "batch");
    let error = wait_for(&batch_events, Duration::from_secs(20), |e| match e {
        SchedEvent::Error(message) => Some(message.clone()),
        SchedEvent::Registered(_) => panic!("registered in a role the ACLs refuse"),
        _ => None,
    });
    assert!(
        error.contains("not authorized") && error.contains("register_frameworks"),
        "{error}"
    );

    // A launch as a user no principal may run as: TASK_ERROR,
    // REASON_TASK_UNAUTHORIZED, and the resources come back whole.
    let (forbidden, forbidden_events) = framework(&master, "forbidden", "web");
    let first = offer(&forbidden_events);
    forbidden
        .launch_tasks(
            std::slice::from_ref(&first.id),
            vec![task("nope", &first)],
            Filters {
                refuse_seconds: Some(0.0),
            },
        )
        .unwrap();
    let status = update(&forbidden_events, "nope");
    assert_eq!(status.state, TaskState::Error);
    assert_eq!(status.reason, Some(Reason::ReasonTaskUnauthorized));
    assert!(
        status
            .message
            .as_deref()
            .unwrap_or_default()
            .contains("run_tasks"),
        "{status:?}"
    );
    let again = offer(&forbidden_events);
    assert_eq!(again.resources, first.resources, "offered again whole");
    let _ = forbidden.abort();

    // A user web may run as: the task runs.
    let (guest, guest_events) = framework(&master, "guest", "web");
    let offer = offer(&guest_events);
    guest
        .launch_tasks(
            std::slice::from_ref(&offer.id),
            vec![task("ok", &offer)],
            Filters::default(),
        )
        .unwrap();
    assert_eq!(update(&guest_events, "ok").state, TaskState::Running);

    // /state: ops sees the task; dev and an anonymous reader see the
    // framework with no tasks.
    let tasks_seen = |authorization: Option<String>| {
        let headers: Vec<(&str, &str)> = authorization
            .iter()
            .map(|a| ("authorization", a.as_str()))
            .collect();
        let response = agora_client::blocking::request(
            agora_client::Method::GET,
            cluster.master.addr,
            "/state",
            &headers,
            None,
        )
        .unwrap();
        assert_eq!(response.status, 200);
        let state: serde_json::Value = response.json().unwrap();
        // None while the framework is not listed yet.
        state["frameworks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["name"] == "guest-web")
            .map(|f| f["tasks"].as_array().unwrap().len())
    };
    // (The snapshot follows the master within a publish interval.)
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while tasks_seen(Some(basic_authorization("ops", "o-secret"))) != Some(1)
        && std::time::Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(
        tasks_seen(Some(basic_authorization("ops", "o-secret"))),
        Some(1)
    );
    assert_eq!(
        tasks_seen(Some(basic_authorization("dev", "d-secret"))),
        Some(0)
    );
    assert_eq!(tasks_seen(None), Some(0));

    // Teardown by an operator: dev may not (403), ops may (200): the
    // scheduler hears it and the framework is gone.
    let fid = cluster.state()["frameworks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["name"] == "guest-web")
        .unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    let teardown = |authorization: String, path: &str, body: String, content_type: &str| {
        agora_client::blocking::request(
            agora_client::Method::POST,
            cluster.master.addr,
            path,
            &[
                ("authorization", &authorization),
                ("content-type", content_type),
            ],
            Some(body.into_bytes()),
        )
        .unwrap()
        .status
    };
    let form = format!("frameworkId={fid}");
    let dev = basic_authorization("dev", "d-secret");
    let ops = basic_authorization("ops", "o-secret");
    let form_type = "application/x-www-form-urlencoded";
    assert_eq!(
        teardown(dev.clone(), "/master/teardown", form.clone(), form_type),
        403
    );
    let call =
        serde_json::json!({"type": "TEARDOWN", "teardown": {"framework_id": {"value": fid}}});
    assert_eq!(
        teardown(dev, "/api/v1", call.to_string(), "application/json"),
        403
    );
    assert_eq!(
        teardown(
            ops.clone(),
            "/master/teardown",
            "frameworkId=nope".into(),
            form_type
        ),
        400
    );
    assert_eq!(
        teardown(ops, "/api/v1", call.to_string(), "application/json"),
        200
    );
    let error = wait_for(&guest_events, Duration::from_secs(20), |e| match e {
        SchedEvent::Error(message) => Some(message.clone()),
        _ => None,
    });
    assert!(error.contains("torn down by an operator"), "{error}");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while cluster.state()["frameworks"]
        .as_array()
        .unwrap()
        .iter()
        .any(|f| f["id"] == fid.as_str())
    {
        assert!(std::time::Instant::now() < deadline, "the framework stays");
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = guest.abort();
    let _ = batch.abort();
}
