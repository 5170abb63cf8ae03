//! Identity against real processes (issue 25): a framework id belongs to
//! the principal that subscribed it and an agent id to the principal that
//! registered it, whoever asks and through whichever door; agents
//! register only under the `register_agents` ACL and within the
//! registration bounds; an operator's TEARDOWN needs a principal whenever
//! the master has credentials, and the operator event stream shows only
//! what its subscriber may view. Each attack is played as an attacker
//! would (the native SDK, pymesos, raw WebSocket and HTTP clients), then
//! the victim is checked to be untouched.

mod support;

use std::sync::mpsc;
use std::time::{Duration, Instant};

use agora_proto::{
    basic_authorization, CommandInfo, Credential, Filters, FrameworkId, FrameworkInfo, Offer,
    Resources, TaskId, TaskInfo, TaskState,
};
use agora_scheduler::{DriverConfig, SchedulerDriver};
use futures::{SinkExt, StreamExt};
use support::{wait_for, wait_until, Recorder, SchedEvent, TestCluster};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;

const AGENT: &str = "cpus:4;mem:4096";

/// Everyone's secrets, in files the processes read.
struct Secrets {
    dir: tempfile::TempDir,
}

impl Secrets {
    fn new() -> Secrets {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("credentials"),
            "alice a-secret\nbob b-secret\nagent g-secret\nops o-secret\n",
        )
        .unwrap();
        for (name, secret) in [("agent", "g-secret"), ("alice", "a-secret")] {
            std::fs::write(dir.path().join(name), format!("{secret}\n")).unwrap();
        }
        Secrets { dir }
    }

    fn credentials(&self) -> String {
        self.dir.path().join("credentials").display().to_string()
    }

    /// The file holding `principal`'s secret (agent, alice).
    fn secret_file(&self, principal: &str) -> String {
        self.dir.path().join(principal).display().to_string()
    }

    fn write(&self, name: &str, text: &str) -> String {
        let path = self.dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        path.display().to_string()
    }
}

fn secret(principal: &str) -> &'static str {
    match principal {
        "alice" => "a-secret",
        "bob" => "b-secret",
        "agent" => "g-secret",
        _ => "o-secret",
    }
}

fn authorization(principal: &str) -> String {
    basic_authorization(principal, secret(principal))
}

fn framework_as(
    master: &str,
    principal: &str,
    mut info: FrameworkInfo,
) -> (SchedulerDriver, mpsc::Receiver<SchedEvent>) {
    let (tx, rx) = mpsc::channel();
    let mut config = DriverConfig::new(master);
    config.credential = Some(Credential {
        principal: principal.into(),
        secret: secret(principal).into(),
    });
    info.failover_timeout = 3600.0;
    let driver = SchedulerDriver::new(Recorder(tx), info, config);
    driver.start().expect("driver start");
    (driver, rx)
}

fn registered(events: &mpsc::Receiver<SchedEvent>) -> FrameworkId {
    wait_for(events, Duration::from_secs(30), |e| match e {
        SchedEvent::Registered(id) => Some(id.clone()),
        _ => None,
    })
}

fn sleep_task(id: &str, offer: &Offer, secs: u32) -> TaskInfo {
    TaskInfo {
        container: None,
        allocation_role: None,
        launch_stamp: None,
        name: id.into(),
        task_id: TaskId::new(id),
        agent_id: offer.agent_id.clone(),
        resources: Resources::parse("cpus:0.5;mem:64").unwrap(),
        executor: None,
        command: Some(CommandInfo::shell(format!("sleep {secs}"))),
        data: None,
        kill_grace_period: None,
        labels: Default::default(),
        task_group: None,
    }
}

/// Launches `ids` (sleeping `secs`) on the framework's next offer and
/// waits until each runs.
fn launch_and_run(
    driver: &SchedulerDriver,
    events: &mpsc::Receiver<SchedEvent>,
    ids: &[&str],
    secs: u32,
) {
    let offer = wait_for(events, Duration::from_secs(30), |e| match e {
        SchedEvent::Offers(offers) => offers.first().cloned(),
        _ => None,
    });
    let tasks = ids.iter().map(|id| sleep_task(id, &offer, secs)).collect();
    driver
        .launch_tasks(std::slice::from_ref(&offer.id), tasks, Filters::default())
        .unwrap();
    let mut running = std::collections::BTreeSet::new();
    while running.len() < ids.len() {
        let (id, state) = wait_for(events, Duration::from_secs(30), |e| match e {
            SchedEvent::Update(s) => Some((s.task_id.to_string(), s.state)),
            _ => None,
        });
        assert_eq!(state, TaskState::Running, "{id} should run");
        running.insert(id);
    }
}

/// Reads events until every task of `ids` finished; panics on any other
/// terminal state, a disconnection or an error.
fn finish(events: &mpsc::Receiver<SchedEvent>, ids: &[&str], within: Duration) {
    let mut finished = std::collections::BTreeSet::new();
    while finished.len() < ids.len() {
        let event = wait_for(events, within, |e| Some(e.clone()));
        match event {
            SchedEvent::Update(s) if s.state == TaskState::Finished => {
                finished.insert(s.task_id.to_string());
            }
            SchedEvent::Update(s) if s.state.is_terminal() => {
                panic!("{} ended {:?}: {:?}", s.task_id, s.state, s.message)
            }
            SchedEvent::Disconnected | SchedEvent::Error(_) | SchedEvent::AgentLost(_) => {
                panic!("the victim was touched: {event:?}")
            }
            _ => {}
        }
    }
}

/// The framework of `/state` with id `fid`.
fn framework_state(cluster: &TestCluster, fid: &FrameworkId) -> serde_json::Value {
    cluster.state()["frameworks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["id"] == fid.as_str())
        .cloned()
        .unwrap_or_else(|| panic!("framework {fid} is not in /state"))
}

type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// A raw WebSocket to the master's `path`, as `principal` (Basic).
async fn connect_as(addr: &str, path: &str, principal: Option<&str>) -> Ws {
    let mut request = format!("ws://{addr}{path}").into_client_request().unwrap();
    if let Some(principal) = principal {
        request
            .headers_mut()
            .insert("authorization", authorization(principal).parse().unwrap());
    }
    let (ws, _) = tokio_tungstenite::connect_async(request)
        .await
        .expect("websocket connect");
    ws
}

/// The master's answer to a forged registration sent on `ws`: the first
/// event, and whether the master then closed the connection.
async fn answer(ws: &mut Ws, frame: String) -> (serde_json::Value, bool) {
    ws.send(Message::text(frame)).await.unwrap();
    let mut first = None;
    loop {
        let next = tokio::time::timeout(Duration::from_secs(30), ws.next())
            .await
            .expect("an answer within 30 s");
        match next {
            Some(Ok(Message::Text(text))) => {
                let event: serde_json::Value = serde_json::from_str(&text).unwrap();
                if first.is_none() {
                    first = Some(event);
                }
            }
            Some(Ok(Message::Close(_))) | None | Some(Err(_)) => {
                return (first.expect("an event before the close"), true)
            }
            Some(Ok(_)) => {}
        }
    }
}

fn register_frame(agent_id: Option<&str>, resources: serde_json::Value) -> String {
    let mut info = serde_json::json!({
        "hostname": "forged",
        "address": "127.0.0.1:1",
        "resources": resources,
    });
    if let Some(id) = agent_id {
        info["id"] = serde_json::json!(id);
    }
    serde_json::json!({"type": "REGISTER", "protocol": agora_proto::PROTOCOL_VERSION, "agent_info": info})
        .to_string()
}

fn scalars() -> serde_json::Value {
    serde_json::json!([{"name": "cpus", "scalar": 4.0}, {"name": "mem", "scalar": 4096.0}])
}

/// Posts a Mesos v1 scheduler SUBSCRIBE as `principal` and reads the
/// stream's events until an ERROR or SUBSCRIBED.
fn v1_subscribe_as(master: std::net::SocketAddr, principal: &str, fid: &FrameworkId) -> String {
    let call = serde_json::json!({
        "type": "SUBSCRIBE",
        "framework_id": {"value": fid.as_str()},
        "subscribe": {"framework_info": {
            "user": "", "name": "bob", "id": {"value": fid.as_str()}, "failover_timeout": 60.0,
        }},
    });
    let auth = authorization(principal);
    agora_client::blocking::block_on(async move {
        let headers = [
            ("authorization", auth.as_str()),
            ("content-type", "application/json"),
            ("accept", "application/json"),
        ];
        let mut stream = agora_client::Http::new()
            .stream(
                agora_client::Method::POST,
                master,
                "/api/v1/scheduler",
                &headers,
                Some(call.to_string().into_bytes()),
            )
            .await
            .unwrap();
        assert_eq!(stream.status, 200);
        let mut reader = agora_mesos_proto::recordio::Reader::new();
        loop {
            let chunk = tokio::time::timeout(Duration::from_secs(30), stream.chunk())
                .await
                .expect("an event within 30 s")
                .unwrap()
                .expect("the stream ends after its last event");
            reader.feed(&chunk);
            while let Some(record) = reader.next_record().unwrap() {
                let event: serde_json::Value = serde_json::from_slice(&record).unwrap();
                match event["type"].as_str() {
                    Some("ERROR") => return event["error"]["message"].as_str().unwrap().into(),
                    Some("SUBSCRIBED") => panic!("bob subscribed as alice's framework"),
                    _ => {}
                }
            }
        }
    })
}

/// alice subscribes a framework through the Mesos v1 API: its id, its
/// stream id and the open stream.
async fn v1_subscribe(master: std::net::SocketAddr) -> (String, String, agora_client::Streaming) {
    let call = serde_json::json!({
        "type": "SUBSCRIBE",
        "subscribe": {"framework_info": {"user": "", "name": "alice-v1", "failover_timeout": 60.0}},
    });
    let auth = authorization("alice");
    let headers = [
        ("authorization", auth.as_str()),
        ("content-type", "application/json"),
        ("accept", "application/json"),
    ];
    let mut stream = agora_client::Http::new()
        .stream(
            agora_client::Method::POST,
            master,
            "/api/v1/scheduler",
            &headers,
            Some(call.to_string().into_bytes()),
        )
        .await
        .unwrap();
    assert_eq!(stream.status, 200);
    let stream_id = stream
        .headers
        .get("mesos-stream-id")
        .and_then(|v| v.to_str().ok())
        .expect("a stream id")
        .to_string();
    let mut reader = agora_mesos_proto::recordio::Reader::new();
    loop {
        let chunk = tokio::time::timeout(Duration::from_secs(30), stream.chunk())
            .await
            .expect("SUBSCRIBED within 30 s")
            .unwrap()
            .expect("the stream stays open");
        reader.feed(&chunk);
        while let Some(record) = reader.next_record().unwrap() {
            let event: serde_json::Value = serde_json::from_slice(&record).unwrap();
            if event["type"] == "SUBSCRIBED" {
                let fid = event["subscribed"]["framework_id"]["value"]
                    .as_str()
                    .unwrap()
                    .to_string();
                return (fid, stream_id, stream);
            }
        }
    }
}

#[test]
fn no_principal_takes_over_another_principals_framework_or_agent() {
    let secrets = Secrets::new();
    let credentials = secrets.credentials();
    let agent_secret = secrets.secret_file("agent");
    let cluster = TestCluster::start_full(
        1,
        AGENT,
        &[
            "--credentials",
            &credentials,
            "--authenticate-frameworks",
            "--authenticate-agents",
        ],
        &["--principal", "agent", "--secret-file", &agent_secret],
    );
    let master = cluster.master_address();
    let agent_id = cluster.state()["agents"][0]["id"]
        .as_str()
        .unwrap()
        .to_string();

    // alice's job: four tasks that run for a while.
    let (alice, alice_events) = framework_as(&master, "alice", FrameworkInfo::new("alice-job"));
    let fid = registered(&alice_events);
    let ids = ["a0", "a1", "a2", "a3"];
    launch_and_run(&alice, &alice_events, &ids, 20);
    let started = Instant::now();

    // bob, with the native SDK, names alice's framework: refused.
    let mut info = FrameworkInfo::new("bob");
    info.id = Some(fid.clone());
    let (bob, bob_events) = framework_as(&master, "bob", info);
    let error = wait_for(&bob_events, Duration::from_secs(30), |e| match e {
        SchedEvent::Error(message) => Some(message.clone()),
        SchedEvent::Registered(_) | SchedEvent::Reregistered => {
            panic!("bob subscribed as alice's framework")
        }
        _ => None,
    });
    assert!(
        error.contains("another principal") && error.contains(fid.as_str()),
        "{error}"
    );
    let _ = bob.abort();

    // bob through the Mesos v1 API: the stream answers ERROR and ends.
    let error = v1_subscribe_as(cluster.master.addr, "bob", &fid);
    assert!(error.contains("another principal"), "{error}");

    // bob through pymesos.
    if let Some(python) = support::mesos::python() {
        let mut client = support::mesos::Client::python(
            &python,
            "pymesos_framework.py",
            &[&master, "takeover", fid.as_str(), "bob", "b-secret"],
            cluster.dir.path(),
        );
        let refused = client.expect("refused", &|| cluster.logs());
        assert!(
            refused["message"]
                .as_str()
                .unwrap_or_default()
                .contains("another principal"),
            "{refused}"
        );
    }

    // alice's framework credential re-registers as the live agent:
    // refused, and the agent keeps its connection.
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let (event, closed) = runtime.block_on(async {
        let mut ws = connect_as(&master, "/api/agent", Some("alice")).await;
        answer(&mut ws, register_frame(Some(&agent_id), scalars())).await
    });
    assert_eq!(
        (event["type"].as_str(), event["fatal"].as_bool()),
        (Some("ERROR"), Some(true)),
        "{event}"
    );
    assert!(
        event["message"]
            .as_str()
            .unwrap_or_default()
            .contains("another principal"),
        "{event}"
    );
    assert!(closed);

    // A v1 stream id is no credential: bob's call naming alice's v1
    // framework and its stream id is refused, and the framework stays.
    let (v1_fid, stream_id, stream) = runtime.block_on(v1_subscribe(cluster.master.addr));
    let call = serde_json::json!({"type": "TEARDOWN", "framework_id": {"value": v1_fid}});
    let post = |principal: &str| {
        let auth = authorization(principal);
        agora_client::blocking::request(
            agora_client::Method::POST,
            cluster.master.addr,
            "/api/v1/scheduler",
            &[
                ("authorization", auth.as_str()),
                ("content-type", "application/json"),
                ("mesos-stream-id", stream_id.as_str()),
            ],
            Some(call.to_string().into_bytes()),
        )
        .unwrap()
    };
    let refused = post("bob");
    assert_eq!(refused.status, 403, "{}", refused.text());
    std::thread::sleep(Duration::from_millis(500));
    let listed = cluster.state()["frameworks"]
        .as_array()
        .unwrap()
        .iter()
        .any(|f| f["id"] == v1_fid.as_str());
    assert!(listed, "bob tore down alice's v1 framework");
    assert_eq!(post("alice").status, 202);
    drop(stream);
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "the attacks took longer than alice's tasks run: the test proves nothing"
    );

    // The victims are untouched: alice is alice's and still subscribed,
    // the agent still connected with alice's tasks running; the job
    // finishes with every task TASK_FINISHED.
    let state = framework_state(&cluster, &fid);
    assert_eq!(state["principal"], "alice", "{state}");
    assert_eq!(state["connected"], true, "{state}");
    assert_eq!(state["tasks"].as_array().unwrap().len(), 4, "{state}");
    assert!(
        state["tasks"]
            .as_array()
            .unwrap()
            .iter()
            .all(|t| t["state"] == "TASK_RUNNING"),
        "{state}"
    );
    let agents = cluster.state()["agents"].clone();
    assert_eq!(agents[0]["connected"], true, "{agents}");
    finish(&alice_events, &ids, Duration::from_secs(60));
    // Each refusal counted (a client may try again after its refusal).
    let metrics = cluster.get("/metrics").unwrap().1;
    for (reason, least) in [("framework_principal", 2), ("agent_principal", 1)] {
        let line = format!("agora_master_identity_refusals_total{{reason=\"{reason}\"}} ");
        let count: u64 = metrics
            .lines()
            .find_map(|l| l.strip_prefix(&line))
            .and_then(|n| n.parse().ok())
            .unwrap_or_default();
        assert!(count >= least, "{reason}: {metrics}");
    }
    let _ = alice.stop(false);
}

#[test]
fn only_agents_the_register_agents_acl_lists_register() {
    let secrets = Secrets::new();
    let credentials = secrets.credentials();
    let acls = secrets.write(
        "acls.json",
        r#"{"register_agents": [
              {"principals": {"values": ["agent"]}, "agents": {"type": "ANY"}},
              {"principals": {"type": "ANY"}, "agents": {"type": "NONE"}}]}"#,
    );
    let mut cluster = TestCluster::start_with(
        0,
        AGENT,
        &[
            "--credentials",
            &credentials,
            "--authenticate-agents",
            "--acls",
            &acls,
        ],
    );
    let master = cluster.master_address();
    // Anonymous: refused at the door (401), by a real agent and a forged one.
    cluster.add_agent(AGENT, &[]);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let refused = runtime.block_on(async {
        tokio_tungstenite::connect_async(format!("ws://{master}/api/agent")).await
    });
    match refused {
        Err(tokio_tungstenite::tungstenite::Error::Http(response)) => {
            assert_eq!(response.status(), 401)
        }
        other => panic!("an anonymous agent connected: {:?}", other.map(|_| ())),
    }
    // A framework's credential the ACL does not list: refused by name.
    let alice_secret = secrets.secret_file("alice");
    cluster.add_agent(
        AGENT,
        &["--principal", "alice", "--secret-file", &alice_secret],
    );
    let (event, closed) = runtime.block_on(async {
        let mut ws = connect_as(&master, "/api/agent", Some("alice")).await;
        answer(&mut ws, register_frame(None, scalars())).await
    });
    assert_eq!(event["fatal"], true, "{event}");
    assert!(
        event["message"]
            .as_str()
            .unwrap_or_default()
            .contains("register_agents"),
        "{event}"
    );
    assert!(closed);
    // The listed principal registers.
    let agent_secret = secrets.secret_file("agent");
    cluster.add_agent(
        AGENT,
        &["--principal", "agent", "--secret-file", &agent_secret],
    );
    cluster.wait_agents(1);
    std::thread::sleep(Duration::from_secs(1));
    let agents = cluster.state()["agents"].as_array().unwrap().len();
    assert_eq!(agents, 1, "{}", cluster.logs());
    wait_until(
        Duration::from_secs(20),
        "the refused agent to log why",
        || cluster.logs(),
        || {
            cluster.agents[1]
                .log_tail()
                .contains("register_agents")
                .then_some(())
        },
    );
}

/// The resident set of process `pid`, in bytes.
fn rss(pid: i32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap();
    kib * 1024
}

/// Bytes of every file under `dir`.
fn bytes_under(dir: &std::path::Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| match e.metadata() {
            Ok(m) if m.is_dir() => bytes_under(&e.path()),
            Ok(m) => m.len(),
            Err(_) => 0,
        })
        .sum()
}

#[test]
fn oversize_agents_are_refused_and_cost_the_master_nothing() {
    // The default master (no flags): the bounds hold for anyone.
    let cluster = TestCluster::start(1, AGENT);
    let master = cluster.master_address();
    let registry = cluster.master.work_dir.join("registry");
    std::thread::sleep(Duration::from_secs(1));
    let (rss_before, registry_before) = (rss(cluster.master.pid()), bytes_under(&registry));
    let huge_set: Vec<String> = (0..1_000_000).map(|i| format!("g{i}")).collect();
    let mut set = scalars();
    set.as_array_mut()
        .unwrap()
        .push(serde_json::json!({"name": "gpus", "set": huge_set}));
    let set_frame = register_frame(None, set);
    assert!(
        set_frame.len() < agora_proto::MAX_FRAME_BYTES,
        "fits a frame"
    );
    let mut ports = scalars();
    ports
        .as_array_mut()
        .unwrap()
        .push(serde_json::json!({"name": "ports", "ranges": [[0u64, u64::MAX]]}));
    let ports_frame = register_frame(None, ports);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let mut forged = Vec::new();
        for i in 0..6 {
            let frame = set_frame.clone();
            let master = master.clone();
            forged.push(tokio::spawn(async move {
                let mut ws = connect_as(&master, "/api/agent", None).await;
                let _ = i;
                answer(&mut ws, frame).await
            }));
        }
        for answer in forged {
            let (event, closed) = answer.await.unwrap();
            assert_eq!(event["fatal"], true, "{event}");
            // Refused while it decodes: no set of a million is ever built.
            let message = event["message"].as_str().unwrap_or_default();
            assert!(
                message.contains("registration refused")
                    && message.contains("more than 65536 ranges or set items"),
                "{message}"
            );
            assert!(closed);
        }
        let mut ws = connect_as(&master, "/api/agent", None).await;
        let (event, _) = answer(&mut ws, ports_frame).await;
        let message = event["message"].as_str().unwrap_or_default();
        assert!(message.contains("highest port 65535"), "{message}");
    });
    // Nothing kept: the registry is as it was, one agent listed, and the
    // memory the decoding took is given back.
    assert_eq!(bytes_under(&registry), registry_before);
    assert_eq!(cluster.state()["agents"].as_array().unwrap().len(), 1);
    let rss_after = wait_until(
        Duration::from_secs(20),
        "the master's memory to settle",
        || format!("before {rss_before}, now {}", rss(cluster.master.pid())),
        || {
            let now = rss(cluster.master.pid());
            (now < rss_before + 32 * 1024 * 1024).then_some(now)
        },
    );
    eprintln!(
        "master RSS before {} MB, after six 1,000,000-item agents {} MB",
        rss_before >> 20,
        rss_after >> 20
    );
}

/// Posts an operator TEARDOWN of `fid` to `path` (the v1 operator API or
/// the native form endpoint) with `authorization`: the status.
fn teardown(
    cluster: &TestCluster,
    path: &str,
    fid: &FrameworkId,
    authorization: Option<&str>,
) -> u16 {
    let (body, content_type) = if path == "/api/v1" {
        (
            serde_json::json!({"type": "TEARDOWN", "teardown": {"framework_id": {"value": fid.as_str()}}})
                .to_string(),
            "application/json",
        )
    } else {
        (
            format!("frameworkId={fid}"),
            "application/x-www-form-urlencoded",
        )
    };
    let mut headers = vec![("content-type", content_type)];
    headers.extend(authorization.map(|a| ("authorization", a)));
    agora_client::blocking::request(
        agora_client::Method::POST,
        cluster.master.addr,
        path,
        &headers,
        Some(body.into_bytes()),
    )
    .unwrap()
    .status
}

#[test]
fn operator_teardown_needs_a_principal_and_is_the_owners_under_acls() {
    let secrets = Secrets::new();
    let credentials = secrets.credentials();
    // ACLs given, with no teardown rule: a framework is its principal's
    // to tear down. No --authenticate-http.
    let cluster = TestCluster::start_with(
        1,
        AGENT,
        &[
            "--credentials",
            &credentials,
            "--authenticate-frameworks",
            "--acls",
            "{}",
        ],
    );
    let master = cluster.master_address();
    let (alice, alice_events) = framework_as(&master, "alice", FrameworkInfo::new("alice"));
    let fid = registered(&alice_events);
    // (Teardowns read the snapshot, which follows within an interval.)
    wait_until(
        Duration::from_secs(10),
        "alice's framework in /state",
        || cluster.logs(),
        || {
            let state = cluster.state();
            let frameworks = state["frameworks"].as_array()?;
            frameworks
                .iter()
                .any(|f| f["id"] == fid.as_str())
                .then_some(())
        },
    );
    for path in ["/api/v1", "/master/teardown", "/teardown"] {
        // Anonymous, or with a wrong secret: 401 (reads stay open).
        assert_eq!(teardown(&cluster, path, &fid, None), 401, "{path}");
        let wrong = basic_authorization("alice", "guess");
        assert_eq!(teardown(&cluster, path, &fid, Some(&wrong)), 401, "{path}");
        // bob and ops: authenticated, not alice: 403.
        for who in ["bob", "ops"] {
            let auth = authorization(who);
            assert_eq!(
                teardown(&cluster, path, &fid, Some(&auth)),
                403,
                "{who} {path}"
            );
        }
    }
    assert_eq!(
        cluster.get("/state").unwrap().0,
        200,
        "reads need no principal"
    );
    assert_eq!(framework_state(&cluster, &fid)["connected"], true);
    // alice tears her own framework down.
    let auth = authorization("alice");
    assert_eq!(teardown(&cluster, "/api/v1", &fid, Some(&auth)), 200);
    let error = wait_for(&alice_events, Duration::from_secs(20), |e| match e {
        SchedEvent::Error(message) => Some(message.clone()),
        _ => None,
    });
    assert!(error.contains("torn down by an operator"), "{error}");
    let _ = alice.abort();
}

/// An operator event stream read as `principal`: the events, as JSON.
struct OperatorStream {
    events: mpsc::Receiver<serde_json::Value>,
    seen: Vec<serde_json::Value>,
}

impl OperatorStream {
    fn subscribe(cluster: &TestCluster, principal: &str) -> OperatorStream {
        let (tx, events) = mpsc::channel();
        let (addr, auth) = (cluster.master.addr, authorization(principal));
        std::thread::spawn(move || {
            agora_client::blocking::block_on(async move {
                let headers = [
                    ("authorization", auth.as_str()),
                    ("content-type", "application/json"),
                    ("accept", "application/json"),
                ];
                let mut stream = agora_client::Http::new()
                    .stream(
                        agora_client::Method::POST,
                        addr,
                        "/api/v1",
                        &headers,
                        Some(br#"{"type":"SUBSCRIBE"}"#.to_vec()),
                    )
                    .await
                    .unwrap();
                assert_eq!(stream.status, 200);
                let mut reader = agora_mesos_proto::recordio::Reader::new();
                while let Ok(Some(chunk)) = stream.chunk().await {
                    reader.feed(&chunk);
                    while let Ok(Some(record)) = reader.next_record() {
                        let event = serde_json::from_slice(&record).unwrap();
                        if tx.send(event).is_err() {
                            return;
                        }
                    }
                }
            })
        });
        OperatorStream {
            events,
            seen: Vec::new(),
        }
    }

    /// Reads until an event whose text contains `needle`.
    fn wait_for(&mut self, needle: &str, what: &str) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Ok(event) = self.events.recv_timeout(Duration::from_millis(100)) {
                let found = event.to_string().contains(needle);
                self.seen.push(event);
                if found {
                    return;
                }
            }
        }
        panic!("no {what} on the operator stream: {:#?}", self.seen);
    }

    /// Everything read so far and until now, as text.
    fn text(&mut self) -> String {
        while let Ok(event) = self.events.try_recv() {
            self.seen.push(event);
        }
        serde_json::Value::from(self.seen.clone()).to_string()
    }
}

#[test]
fn operators_see_only_what_the_view_acls_give_them_in_every_form() {
    let secrets = Secrets::new();
    let credentials = secrets.credentials();
    let acls = secrets.write(
        "acls.json",
        r#"{"view_frameworks": [
              {"principals": {"values": ["ops"]}, "users": {"type": "ANY"}},
              {"principals": {"values": ["bob"]}, "users": {"values": ["bob"]}},
              {"principals": {"type": "ANY"}, "users": {"type": "NONE"}}],
            "view_tasks": [
              {"principals": {"values": ["ops"]}, "users": {"type": "ANY"}},
              {"principals": {"values": ["bob"]}, "users": {"values": ["bob"]}},
              {"principals": {"type": "ANY"}, "users": {"type": "NONE"}}]}"#,
    );
    let cluster = TestCluster::start_with(
        2,
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
    let mut ops = OperatorStream::subscribe(&cluster, "ops");
    let mut bob_view = OperatorStream::subscribe(&cluster, "bob");
    ops.wait_for("SUBSCRIBED", "SUBSCRIBED");
    bob_view.wait_for("SUBSCRIBED", "SUBSCRIBED");

    let mut info = FrameworkInfo::new("alice-secret-job");
    info.user = "alice".into();
    let (alice, alice_events) = framework_as(&master, "alice", info);
    let alice_fid = registered(&alice_events);
    launch_and_run(&alice, &alice_events, &["alice-secret-task"], 300);
    let mut info = FrameworkInfo::new("bob-job");
    info.user = "bob".into();
    let (bob, bob_events) = framework_as(&master, "bob", info);
    let bob_fid = registered(&bob_events);
    launch_and_run(&bob, &bob_events, &["bob-task"], 300);

    // ops sees both frameworks and both tasks come; bob sees his own.
    ops.wait_for("alice-secret-task", "alice's task");
    ops.wait_for("bob-task", "bob's task");
    bob_view.wait_for("bob-task", "bob's task");
    // Whatever bob's stream carried by now, nothing of alice's.
    std::thread::sleep(Duration::from_secs(1));
    let seen = bob_view.text();
    for secret in [alice_fid.as_str(), "alice-secret-job", "alice-secret-task"] {
        assert!(
            !seen.contains(secret),
            "bob's stream shows {secret}: {seen}"
        );
    }
    assert!(seen.contains(bob_fid.as_str()));

    // The one-shot reads agree, bob's summary counting his own only.
    let get = |path: &str, principal: &str| -> serde_json::Value {
        let auth = authorization(principal);
        agora_client::blocking::request(
            agora_client::Method::GET,
            cluster.master.addr,
            path,
            &[("authorization", auth.as_str())],
            None,
        )
        .unwrap()
        .json()
        .unwrap()
    };
    let summary = |principal: &str| get("/api/v1/summary", principal)["summary"].clone();
    assert_eq!(summary("ops")["frameworks"], 2);
    assert_eq!(summary("bob")["frameworks"], 1);
    assert_eq!(summary("bob")["tasks_active"], 1);
    assert_eq!(summary("alice")["frameworks"], 0);
    for path in [
        "/api/v1/agents",
        "/api/v1/frameworks",
        "/api/v1/tasks",
        "/state",
    ] {
        let text = get(path, "bob").to_string();
        assert!(!text.contains(alice_fid.as_str()), "{path}: {text}");
        assert!(!text.contains("alice-secret"), "{path}: {text}");
    }
    let call = |kind: &str| {
        let auth = authorization("bob");
        let body = serde_json::json!({ "type": kind }).to_string();
        agora_client::blocking::request(
            agora_client::Method::POST,
            cluster.master.addr,
            "/api/v1",
            &[
                ("authorization", auth.as_str()),
                ("content-type", "application/json"),
                ("accept", "application/json"),
            ],
            Some(body.into_bytes()),
        )
        .unwrap()
        .text()
    };
    for kind in [
        "GET_STATE",
        "GET_FRAMEWORKS",
        "GET_TASKS",
        "GET_EXECUTORS",
        "GET_AGENTS",
    ] {
        let text = call(kind);
        assert!(!text.contains(alice_fid.as_str()), "{kind}: {text}");
    }
    let _ = alice.abort();
    let _ = bob.abort();
}

/// A log's text without its terminal colours.
fn plain(log: &str) -> String {
    let mut out = String::with_capacity(log.len());
    let mut chars = log.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // An escape sequence ends at its first letter.
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// `/health` as JSON from `addr` (over TLS with `tls`).
fn health_json(
    addr: std::net::SocketAddr,
    tls: Option<std::sync::Arc<agora_net::tls::rustls::ClientConfig>>,
) -> serde_json::Value {
    let http = match tls {
        Some(tls) => agora_client::Http::new().with_tls(tls),
        None => agora_client::Http::new(),
    };
    agora_client::blocking::block_on(async move {
        http.request(
            agora_client::Method::GET,
            addr,
            "/health",
            &[("accept", "application/json")],
            None,
        )
        .await
    })
    .unwrap()
    .json()
    .unwrap()
}

fn doors(health: &serde_json::Value) -> Vec<String> {
    health["open_doors"]
        .as_array()
        .unwrap_or_else(|| panic!("no open_doors: {health}"))
        .iter()
        .map(|d| d.as_str().unwrap().to_string())
        .collect()
}

#[test]
fn open_doors_are_warned_of_at_start_and_listed_in_health() {
    // Defaults: every door open, each warned of.
    let cluster = TestCluster::start(1, AGENT);
    let health = health_json(cluster.master.addr, None);
    assert_eq!(health["status"], "serving", "{health}");
    assert!(
        health["master_id"].is_string(),
        "today's fields stay: {health}"
    );
    let master_doors = doors(&health);
    assert_eq!(
        master_doors,
        [
            "no_tls",
            "unauthenticated_frameworks",
            "unauthenticated_agents",
            "unauthenticated_http",
            "unauthenticated_operator_writes"
        ]
    );
    let agent_addr = cluster.state()["agents"][0]["address"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    let agent_doors = doors(&health_json(agent_addr, None));
    assert_eq!(
        agent_doors,
        [
            "no_tls",
            "unverified_master",
            "unauthenticated_executors",
            "unauthenticated_http"
        ]
    );
    let (master_log, agent_log) = (
        plain(&cluster.master.log_tail()),
        plain(&cluster.agents[0].log_tail()),
    );
    for (log, doors) in [(&master_log, &master_doors), (&agent_log, &agent_doors)] {
        for door in doors {
            let warned = log
                .lines()
                .any(|l| l.contains("WARN") && l.contains(&format!("open_door={door}")));
            assert!(warned, "no warning of {door}:\n{log}");
        }
    }
    // The probe's plain answer is unchanged.
    assert_eq!(cluster.get("/health").unwrap(), (200, "ok".to_string()));

    // Every door closed: nothing listed, nothing warned of.
    let secrets = Secrets::new();
    let pki_dir = tempfile::tempdir().unwrap();
    let tls = agora_net::LocalPki::new("cluster CA")
        .unwrap()
        .write(pki_dir.path(), "node", &["localhost", "127.0.0.1"])
        .unwrap();
    let path = |p: &Option<std::path::PathBuf>| p.as_ref().unwrap().display().to_string();
    let tls_flags = [
        "--tls-cert".to_string(),
        path(&tls.cert),
        "--tls-key".to_string(),
        path(&tls.key),
        "--tls-ca".to_string(),
        path(&tls.ca),
    ];
    let credentials = secrets.credentials();
    let agent_secret = secrets.secret_file("agent");
    let mut master_flags: Vec<&str> = tls_flags.iter().map(String::as_str).collect();
    master_flags.extend([
        "--credentials",
        &credentials,
        "--authenticate-frameworks",
        "--authenticate-agents",
        "--authenticate-http",
    ]);
    let mut agent_flags: Vec<&str> = tls_flags.iter().map(String::as_str).collect();
    agent_flags.extend([
        "--principal",
        "agent",
        "--secret-file",
        &agent_secret,
        "--authenticate-executors",
        "--credentials",
        &credentials,
        "--authenticate-http",
    ]);
    let client = tls.client().unwrap().unwrap();
    let secure = TestCluster::start_secure(
        1,
        AGENT,
        &master_flags,
        &agent_flags,
        Some(authorization("ops")),
        Some(client.clone()),
    );
    let health = health_json(secure.master.addr, Some(client.clone()));
    assert_eq!(doors(&health), Vec::<String>::new(), "{health}");
    let agent_addr = secure.state()["agents"][0]["address"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(
        doors(&health_json(agent_addr, Some(client))),
        Vec::<String>::new()
    );
    assert!(!secure.master.log_tail().contains("open_door"));
    assert!(!secure.agents[0].log_tail().contains("open_door"));
}

/// The same refusal from a newly elected master, which knows alice's
/// framework from the registry in etcd alone (no agent reports it: it has
/// no tasks), while alice's scheduler is away.
#[cfg(feature = "etcd")]
#[test]
fn a_frameworks_principal_survives_a_master_failover() {
    use support::{bin, http_get, Proc};
    let dir = tempfile::tempdir().unwrap();
    let Some(etcd) = agora_etcd::testing::TestEtcd::start(dir.path()) else {
        return;
    };
    let secrets = Secrets::new();
    let credentials = secrets.credentials();
    let mut masters: Vec<Proc> = (0..2)
        .map(|i| {
            let work_dir = dir.path().join(format!("master-{i}"));
            std::fs::create_dir_all(&work_dir).unwrap();
            let args: Vec<String> = [
                "--listen",
                "127.0.0.1:0",
                "--work-dir",
                &work_dir.display().to_string(),
                "--etcd",
                &format!("http://{}", etcd.endpoint),
                "--etcd-lease-ttl",
                "2s",
                "--credentials",
                &credentials,
                "--authenticate-frameworks",
            ]
            .iter()
            .map(|s| s.to_string())
            .collect();
            Proc::spawn(
                &format!("master {i}"),
                &bin("agora-master"),
                &args,
                &work_dir,
                &dir.path().join(format!("master-{i}.log")),
            )
        })
        .collect();
    let logs = |masters: &[Proc]| {
        masters
            .iter()
            .map(|m| format!("--- {} ---\n{}\n", m.name, m.log_tail()))
            .collect::<String>()
    };
    let leader = |masters: &[Proc]| -> Option<usize> {
        let key = agora_discovery::leader_key("/agora");
        let record = etcd.client().get(key.as_bytes()).ok()??;
        let info: agora_proto::LeaderInfo = serde_json::from_slice(&record.value).ok()?;
        let i = masters
            .iter()
            .position(|m| m.addr.to_string() == info.address)?;
        (http_get(masters[i].addr, "/state").ok()?.0 == 200).then_some(i)
    };
    let first = wait_until(
        Duration::from_secs(30),
        "a leader",
        || logs(&masters),
        || leader(&masters),
    );
    let url = format!("etcd://{}/agora", etcd.endpoint);
    let (alice, alice_events) = framework_as(&url, "alice", FrameworkInfo::new("alice"));
    let fid = registered(&alice_events);
    // alice's scheduler dies (its framework waits out its failover
    // timeout), then so does the leader.
    let _ = alice.abort();
    masters[first].kill();
    let second = wait_until(
        Duration::from_secs(30),
        "a new leader",
        || logs(&masters),
        || leader(&masters).filter(|i| *i != first),
    );
    let new_state = || -> serde_json::Value {
        serde_json::from_str(&http_get(masters[second].addr, "/state").unwrap().1).unwrap()
    };
    let known = new_state()["frameworks"][0].clone();
    assert_eq!(
        (
            known["id"].as_str(),
            known["principal"].as_str(),
            known["connected"].as_bool()
        ),
        (Some(fid.as_str()), Some("alice"), Some(false)),
        "{known}"
    );
    let mut info = FrameworkInfo::new("bob");
    info.id = Some(fid.clone());
    let (bob, bob_events) = framework_as(&url, "bob", info);
    let error = wait_for(&bob_events, Duration::from_secs(30), |e| match e {
        SchedEvent::Error(message) => Some(message.clone()),
        SchedEvent::Registered(_) | SchedEvent::Reregistered => {
            panic!("bob took alice's framework after the failover")
        }
        _ => None,
    });
    assert!(error.contains("another principal"), "{error}");
    let _ = bob.abort();
    // alice's failover scheduler gets her framework back.
    let mut info = FrameworkInfo::new("alice");
    info.id = Some(fid.clone());
    let (alice, alice_events) = framework_as(&url, "alice", info);
    assert_eq!(registered(&alice_events), fid);
    let back = new_state()["frameworks"][0].clone();
    assert_eq!(back["principal"], "alice", "{back}");
    let _ = alice.stop(false);
    for m in &mut masters {
        m.terminate(Duration::from_secs(5));
    }
}
