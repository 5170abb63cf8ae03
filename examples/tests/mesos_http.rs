//! The rest of Mesos's HTTP surface that real clients read, against a real
//! master and agent:
//!
//! - `/slaves`, `/frameworks` and `/tasks` (and their `/master/...`
//!   forms) in Mesos's JSON, with `/tasks`'s `framework_id`, `task_id`,
//!   `order`, `limit` and `offset`, behind the same `--authenticate-http`
//!   and view ACLs as `/master/state`;
//! - every status update of a task in `statuses` (not `[]` while it
//!   runs), and no resource written as `-0.0`;
//! - a SUBSCRIBE whose repeated fields hold bare values (`"roles": "x"`,
//!   `"capabilities": {...}`), read as Mesos's parser reads them;
//! - the scheduler event stream as one RecordIO record per HTTP chunk,
//!   read with a raw socket that parses the chunked encoding itself,
//!   through a burst of status updates.

mod support;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use agora_proto::{basic_authorization, Filters, FrameworkInfo, TaskState};
use serde_json::{json, Value};
use support::{command_task, start_framework, wait_for, SchedEvent, TestCluster};

const AGENT: &str = "cpus:8;mem:4096;disk:1024;ports:[31000-31100]";

const ACLS: &str = r#"{
  "view_tasks": [
    {"principals": {"values": ["ops"]}, "users": {"type": "ANY"}},
    {"principals": {"type": "ANY"}, "users": {"type": "NONE"}}
  ]
}"#;

/// `GET path` as `authorization` (none: anonymous): status and body.
fn get(cluster: &TestCluster, path: &str, authorization: Option<&str>) -> (u16, String) {
    let headers: Vec<(&str, &str)> = authorization
        .iter()
        .map(|a| ("authorization", *a))
        .collect();
    let response = agora_client::blocking::request(
        agora_client::Method::GET,
        cluster.master_address(),
        path,
        &headers,
        None,
    )
    .expect(path);
    (response.status, response.text())
}

/// `GET path` as `authorization`, which must answer 200 with JSON free of
/// negative zeros.
fn get_json(cluster: &TestCluster, path: &str, authorization: &str) -> Value {
    let (status, body) = get(cluster, path, Some(authorization));
    assert_eq!(status, 200, "GET {path}: {body}");
    let value: Value = serde_json::from_str(&body).expect("JSON");
    assert_no_negative_zero(&value, path);
    value
}

fn assert_no_negative_zero(value: &Value, path: &str) {
    match value {
        Value::Number(n) => {
            let x = n.as_f64().unwrap_or(1.0);
            assert!(!(x == 0.0 && x.is_sign_negative()), "{path} writes a -0.0");
        }
        Value::Array(items) => items.iter().for_each(|v| assert_no_negative_zero(v, path)),
        Value::Object(map) => map.values().for_each(|v| assert_no_negative_zero(v, path)),
        _ => {}
    }
}

fn ids(tasks: &Value) -> Vec<String> {
    tasks
        .as_array()
        .expect("tasks")
        .iter()
        .map(|t| t["id"].as_str().expect("task id").to_string())
        .collect()
}

fn states(task: &Value) -> Vec<String> {
    task["statuses"]
        .as_array()
        .expect("statuses")
        .iter()
        .map(|s| s["state"].as_str().expect("state").to_string())
        .collect()
}

#[test]
fn slaves_frameworks_and_tasks_as_mesos_serves_them() {
    let secrets = tempfile::tempdir().unwrap();
    let credentials = secrets.path().join("credentials");
    std::fs::write(&credentials, "ops o-secret\ndev d-secret\n").unwrap();
    let acls = secrets.path().join("acls.json");
    std::fs::write(&acls, ACLS).unwrap();
    let (credentials, acls) = (
        credentials.display().to_string(),
        acls.display().to_string(),
    );
    let ops = basic_authorization("ops", "o-secret");
    let dev = basic_authorization("dev", "d-secret");
    let cluster = TestCluster::start_as(
        1,
        AGENT,
        &[
            "--credentials",
            &credentials,
            "--authenticate-http",
            "--acls",
            &acls,
        ],
        &[],
        Some(ops.clone()),
    );

    // Three tasks, launched one after another: two keep running, one ends.
    let (driver, events) = start_framework(&cluster.master_address(), FrameworkInfo::new("lister"));
    let framework_id = wait_for(&events, Duration::from_secs(20), |e| match e {
        SchedEvent::Registered(id) => Some(id.to_string()),
        _ => None,
    });
    // Offers that arrive while an update is awaited are kept for the next.
    let mut offered: Option<agora_proto::Offer> = None;
    for (id, command) in [("a", "sleep 60"), ("b", "true"), ("c", "sleep 60")] {
        let offer = match offered.take() {
            Some(offer) => offer,
            None => wait_for(&events, Duration::from_secs(20), |e| match e {
                SchedEvent::Offers(offers) => offers.first().cloned(),
                _ => None,
            }),
        };
        let task = command_task(id, &offer, command, "cpus:0.5;mem:32");
        driver
            .launch_tasks(
                std::slice::from_ref(&offer.id),
                vec![task],
                Filters {
                    refuse_seconds: Some(0.0),
                },
            )
            .unwrap();
        let settled = if command == "true" {
            TaskState::Finished
        } else {
            TaskState::Running
        };
        wait_for(&events, Duration::from_secs(30), |e| match e {
            SchedEvent::Update(s) if s.task_id.as_str() == id && s.state == settled => Some(()),
            SchedEvent::Offers(offers) => {
                if let Some(offer) = offers.first() {
                    offered = Some(offer.clone());
                }
                None
            }
            _ => None,
        });
        // Distinct first-update times, for the order of `/tasks`.
        std::thread::sleep(Duration::from_millis(20));
    }

    // Without credentials: 401, as /master/state.
    for path in [
        "/slaves",
        "/master/slaves",
        "/frameworks",
        "/master/frameworks",
        "/tasks",
        "/master/tasks",
    ] {
        let (status, body) = get(&cluster, path, None);
        assert_eq!(status, 401, "GET {path} without credentials: {body}");
    }

    // The snapshot catches up with the updates within its interval.
    let deadline = Instant::now() + Duration::from_secs(10);
    let tasks = loop {
        let tasks = get_json(&cluster, "/tasks", &ops);
        let settled = tasks["tasks"].as_array().is_some_and(|list| {
            list.len() == 3
                && list.iter().all(|t| {
                    let last = states(t).last().cloned();
                    last.as_deref() == Some(t["state"].as_str().unwrap_or(""))
                })
        });
        if settled {
            break tasks;
        }
        assert!(
            Instant::now() < deadline,
            "/tasks never settled: {tasks}\n{}",
            cluster.logs()
        );
        std::thread::sleep(Duration::from_millis(100));
    };

    // `/tasks`: newest first by default, each with every update it had.
    assert_eq!(ids(&tasks["tasks"]), ["c", "b", "a"], "{tasks}");
    for task in tasks["tasks"].as_array().unwrap() {
        let states = states(task);
        let id = task["id"].as_str().unwrap();
        let ending = if id == "b" {
            "TASK_FINISHED"
        } else {
            "TASK_RUNNING"
        };
        assert_eq!(states.last().map(String::as_str), Some(ending), "{task}");
        assert_eq!(task["framework_id"], framework_id.as_str(), "{task}");
        assert_eq!(task["role"], "*", "{task}");
        assert_eq!(task["resources"]["cpus"], 0.5, "{task}");
        assert_eq!(task["resources"]["gpus"], 0.0, "{task}");
        for status in task["statuses"].as_array().unwrap() {
            assert!(status["timestamp"].as_f64().unwrap() > 1.0e9, "{status}");
        }
    }
    let b = &tasks["tasks"][1];
    assert!(states(b).len() >= 2, "b ran, then finished: {b}");
    let ascending = get_json(&cluster, "/master/tasks?order=asc", &ops);
    assert_eq!(ids(&ascending["tasks"]), ["a", "b", "c"], "{ascending}");
    let page = get_json(&cluster, "/tasks?order=asc&offset=1&limit=1", &ops);
    assert_eq!(ids(&page["tasks"]), ["b"], "{page}");
    let past = get_json(&cluster, "/tasks?offset=3", &ops);
    assert_eq!(ids(&past["tasks"]), Vec::<String>::new(), "{past}");
    let one = get_json(
        &cluster,
        &format!("/tasks?framework_id={framework_id}&task_id=c"),
        &ops,
    );
    assert_eq!(ids(&one["tasks"]), ["c"], "{one}");
    let other = get_json(&cluster, "/tasks?framework_id=nope", &ops);
    assert_eq!(ids(&other["tasks"]), Vec::<String>::new(), "{other}");
    // A limit that is no count is Mesos's default (100).
    let all = get_json(&cluster, "/tasks.json?limit=many", &ops);
    assert_eq!(ids(&all["tasks"]).len(), 3, "{all}");

    // `/master/state` shows the same statuses while the tasks run.
    let state = get_json(&cluster, "/master/state", &ops);
    let framework = &state["frameworks"][0];
    let running = framework["tasks"].as_array().expect("tasks");
    assert_eq!(running.len(), 2, "{framework}");
    for task in running {
        assert_eq!(
            states(task).last().map(String::as_str),
            Some("TASK_RUNNING"),
            "{task}"
        );
    }

    // `/frameworks`: the framework as `/master/state` shows it.
    for path in ["/frameworks", "/master/frameworks"] {
        let frameworks = get_json(&cluster, path, &ops);
        assert_eq!(
            frameworks["frameworks"].as_array().unwrap().len(),
            1,
            "{frameworks}"
        );
        let f = &frameworks["frameworks"][0];
        assert_eq!(f["id"], framework_id.as_str(), "{f}");
        assert_eq!(f["name"], "lister", "{f}");
        assert_eq!(f["tasks"], framework["tasks"], "{f}");
        assert_eq!(
            frameworks["completed_frameworks"],
            json!([]),
            "{frameworks}"
        );
        assert_eq!(
            frameworks["unregistered_frameworks"],
            json!([]),
            "{frameworks}"
        );
    }
    let none = get_json(&cluster, "/frameworks?framework_id=nope", &ops);
    assert_eq!(none["frameworks"], json!([]), "{none}");

    // `/slaves`: the agent as `/master/state` shows it, with the full
    // resource lists.
    let agent_id = state["slaves"][0]["id"]
        .as_str()
        .expect("agent id")
        .to_string();
    for path in ["/slaves", "/master/slaves"] {
        let slaves = get_json(&cluster, path, &ops);
        let list = slaves["slaves"].as_array().expect("slaves");
        assert_eq!(list.len(), 1, "{slaves}");
        let s = &list[0];
        assert_eq!(s["id"], agent_id.as_str(), "{s}");
        assert_eq!(s["resources"]["cpus"], 8.0, "{s}");
        assert_eq!(s["used_resources"]["cpus"], 1.0, "{s}");
        assert_eq!(s["resources"]["gpus"], 0.0, "{s}");
        assert!(s["pid"].as_str().unwrap().starts_with("slave(1)@"), "{s}");
        let unreserved = s["unreserved_resources_full"]
            .as_array()
            .expect("full list");
        assert!(
            unreserved
                .iter()
                .any(|r| r["name"] == "cpus" && r["scalar"]["value"] == 8.0),
            "{s}"
        );
        let used = s["used_resources_full"].as_array().expect("full list");
        assert!(used.iter().any(|r| r["name"] == "cpus"), "{s}");
        assert_eq!(slaves["recovered_slaves"], json!([]), "{slaves}");
    }
    let none = get_json(&cluster, "/slaves?slave_id=nope", &ops);
    assert_eq!(none["slaves"], json!([]), "{none}");

    // dev may not view these tasks: none in `/tasks`, nor in the
    // framework `/frameworks` and `/master/state` show it.
    let hidden = get_json(&cluster, "/tasks", &dev);
    assert_eq!(hidden["tasks"], json!([]), "{hidden}");
    for path in ["/frameworks", "/master/state"] {
        let seen = get_json(&cluster, path, &dev);
        for f in seen["frameworks"].as_array().unwrap() {
            assert_eq!(f["tasks"], json!([]), "{path}: {f}");
            assert_eq!(f["completed_tasks"], json!([]), "{path}: {f}");
        }
    }
    drop(driver);
}

/// A response read off a raw socket: the status line's code, the
/// headers, and a reader of what follows them.
struct RawResponse {
    status: u16,
    headers: Vec<(String, String)>,
    reader: BufReader<TcpStream>,
}

impl RawResponse {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The next chunk of a chunked body (`None` at its end).
    fn chunk(&mut self) -> Option<Vec<u8>> {
        let mut line = String::new();
        self.reader.read_line(&mut line).expect("chunk size line");
        let size = usize::from_str_radix(line.trim().split(';').next().unwrap(), 16)
            .unwrap_or_else(|_| panic!("bad chunk size line {line:?}"));
        if size == 0 {
            return None;
        }
        let mut data = vec![0; size + 2];
        self.reader.read_exact(&mut data).expect("chunk data");
        assert_eq!(&data[size..], b"\r\n", "a chunk ends with CRLF");
        data.truncate(size);
        Some(data)
    }

    /// The next chunk, which must hold exactly one complete RecordIO
    /// record: its event.
    fn event(&mut self) -> Value {
        let chunk = self.chunk().expect("the stream goes on");
        let newline = chunk
            .iter()
            .position(|&b| b == b'\n')
            .expect("a record starts with its length and a newline");
        let length: usize = std::str::from_utf8(&chunk[..newline])
            .unwrap()
            .parse()
            .expect("record length");
        assert_eq!(
            chunk.len() - newline - 1,
            length,
            "one chunk, one whole record: {:?}",
            String::from_utf8_lossy(&chunk)
        );
        serde_json::from_slice(&chunk[newline + 1..]).expect("event JSON")
    }
}

/// `POST path` with a JSON `body` on a fresh socket, read up to the body.
fn raw_post(address: &str, path: &str, body: &str, extra: &[(&str, &str)]) -> RawResponse {
    let mut stream = TcpStream::connect(address).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut request = format!(
        "POST {path} HTTP/1.1\r\nHost: {address}\r\nContent-Type: application/json\r\nAccept: application/json\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (name, value) in extra {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    request.push_str(body);
    stream.write_all(request.as_bytes()).expect("write");
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    reader.read_line(&mut line).expect("status line");
    let status: u16 = line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("bad status line {line:?}"));
    let mut headers = Vec::new();
    loop {
        let mut line = String::new();
        reader.read_line(&mut line).expect("header line");
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        if let Some((name, value)) = line.split_once(':') {
            headers.push((name.trim().to_string(), value.trim().to_string()));
        }
    }
    RawResponse {
        status,
        headers,
        reader,
    }
}

#[test]
fn bare_repeated_values_subscribe_and_each_chunk_holds_one_record() {
    let cluster = TestCluster::start_with(1, AGENT, &["--allocation-interval", "100ms"]);
    let master = cluster.master_address();
    // `roles` a bare string, `capabilities` a bare object: Mesos's parser
    // reads each as a list of one.
    let subscribe = r#"{"type":"SUBSCRIBE","subscribe":{"framework_info":{"user":"root","name":"bare","roles":"x","capabilities":{"type":"MULTI_ROLE"}}}}"#;
    let mut stream = raw_post(&master, "/api/v1/scheduler", subscribe, &[]);
    assert_eq!(stream.status, 200);
    assert_eq!(stream.header("content-type"), Some("application/json"));
    assert!(
        stream
            .header("transfer-encoding")
            .is_some_and(|v| v.eq_ignore_ascii_case("chunked")),
        "{:?}",
        stream.headers
    );
    let stream_id = stream
        .header("mesos-stream-id")
        .expect("stream id")
        .to_string();
    let subscribed = stream.event();
    assert_eq!(subscribed["type"], "SUBSCRIBED", "{subscribed}");
    let framework_id = subscribed["subscribed"]["framework_id"]["value"]
        .as_str()
        .expect("framework id")
        .to_string();
    let offer = loop {
        let event = stream.event();
        if event["type"] == "OFFERS" {
            break event["offers"]["offers"][0].clone();
        }
    };
    let allocated = &offer["allocation_info"]["role"];
    assert_eq!(allocated, "x", "{offer}");

    // A burst: twenty tasks at once, each sending its updates.
    const TASKS: usize = 20;
    let tasks: Vec<Value> = (0..TASKS)
        .map(|i| {
            json!({
                "name": format!("t{i}"),
                "task_id": {"value": format!("t{i}")},
                "agent_id": offer["agent_id"],
                "resources": [
                    {"name": "cpus", "type": "SCALAR", "scalar": {"value": 0.1}, "allocation_info": {"role": "x"}},
                    {"name": "mem", "type": "SCALAR", "scalar": {"value": 16}, "allocation_info": {"role": "x"}},
                ],
                "command": {"value": "true"},
            })
        })
        .collect();
    let accept = json!({
        "type": "ACCEPT",
        "framework_id": {"value": framework_id},
        "accept": {
            "offer_ids": [offer["id"]],
            "operations": [{"type": "LAUNCH", "launch": {"task_infos": tasks}}],
        },
    })
    .to_string();
    let answer = agora_client::blocking::request(
        agora_client::Method::POST,
        &master,
        "/api/v1/scheduler",
        &[
            ("content-type", "application/json"),
            ("mesos-stream-id", stream_id.as_str()),
        ],
        Some(accept.into_bytes()),
    )
    .expect("ACCEPT");
    assert_eq!(answer.status, 202, "{}", answer.text());

    // Every chunk that follows holds one whole record, through to every
    // task's end.
    let mut finished = std::collections::HashSet::new();
    let mut updates = 0;
    let deadline = Instant::now() + Duration::from_secs(60);
    while finished.len() < TASKS {
        assert!(
            Instant::now() < deadline,
            "only {finished:?} finished\n{}",
            cluster.logs()
        );
        let event = stream.event();
        if event["type"] != "UPDATE" {
            continue;
        }
        updates += 1;
        let status = &event["update"]["status"];
        let id = status["task_id"]["value"].as_str().unwrap().to_string();
        // Each task's next update comes once this one is acknowledged.
        let acknowledge = json!({
            "type": "ACKNOWLEDGE",
            "framework_id": {"value": framework_id},
            "acknowledge": {"agent_id": status["agent_id"], "task_id": status["task_id"], "uuid": status["uuid"]},
        })
        .to_string();
        let answer = agora_client::blocking::request(
            agora_client::Method::POST,
            &master,
            "/api/v1/scheduler",
            &[
                ("content-type", "application/json"),
                ("mesos-stream-id", stream_id.as_str()),
            ],
            Some(acknowledge.into_bytes()),
        )
        .expect("ACKNOWLEDGE");
        assert_eq!(answer.status, 202, "{}", answer.text());
        match status["state"].as_str().unwrap() {
            "TASK_FINISHED" => {
                finished.insert(id);
            }
            "TASK_STARTING" | "TASK_RUNNING" => {}
            other => panic!("task {id} ended {other}: {status}"),
        }
    }
    assert!(updates >= 2 * TASKS, "{updates} updates");

    // The framework subscribed in role x.
    let (status, body) = cluster.get("/master/frameworks").unwrap();
    assert_eq!(status, 200, "{body}");
    let frameworks: Value = serde_json::from_str(&body).unwrap();
    let f = &frameworks["frameworks"][0];
    assert_eq!(f["id"], framework_id.as_str(), "{f}");
    assert!(f["role"] == "x" || f["roles"] == json!(["x"]), "{f}");
}

/// `POST /api/v1` on the agent with a JSON call, accepting `accept`.
fn agent_call(agent: &str, call: &Value, accept: &str) -> agora_client::Response {
    agora_client::blocking::request(
        agora_client::Method::POST,
        agent,
        "/api/v1",
        &[("content-type", "application/json"), ("accept", accept)],
        Some(call.to_string().into_bytes()),
    )
    .expect("agent operator call")
}

#[test]
fn the_agents_operator_api_answers_its_read_calls_and_refuses_the_rest() {
    use agora_mesos_proto::v1::agent::Response as AgentResponse;
    use agora_mesos_proto::Codec;

    let cluster = TestCluster::start(1, AGENT);
    let (driver, events) = start_framework(&cluster.master_address(), FrameworkInfo::new("looker"));
    let framework_id = wait_for(&events, Duration::from_secs(20), |e| match e {
        SchedEvent::Registered(id) => Some(id.to_string()),
        _ => None,
    });
    let offer = wait_for(&events, Duration::from_secs(20), |e| match e {
        SchedEvent::Offers(offers) => offers.first().cloned(),
        _ => None,
    });
    let task = command_task("long", &offer, "sleep 60", "cpus:0.5;mem:32");
    driver
        .launch_tasks(
            std::slice::from_ref(&offer.id),
            vec![task],
            Filters::default(),
        )
        .unwrap();
    wait_for(&events, Duration::from_secs(30), |e| match e {
        SchedEvent::Update(s) if s.task_id.as_str() == "long" && s.state == TaskState::Running => {
            Some(())
        }
        _ => None,
    });
    let state = cluster.state();
    let agent = state["agents"][0]["address"]
        .as_str()
        .expect("agent address")
        .to_string();
    let agent_id = state["agents"][0]["id"]
        .as_str()
        .expect("agent id")
        .to_string();

    // JSON: GET_TASKS, GET_FRAMEWORKS, GET_EXECUTORS, GET_CONTAINERS.
    let answer = agent_call(&agent, &json!({"type": "GET_TASKS"}), "application/json");
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert_eq!(answer.header("content-type"), Some("application/json"));
    let tasks: Value = serde_json::from_str(&answer.text()).unwrap();
    assert_eq!(tasks["type"], "GET_TASKS", "{tasks}");
    let launched = &tasks["get_tasks"]["launched_tasks"];
    assert_eq!(launched.as_array().map(Vec::len), Some(1), "{tasks}");
    assert_eq!(launched[0]["task_id"]["value"], "long", "{tasks}");
    assert_eq!(launched[0]["state"], "TASK_RUNNING", "{tasks}");
    assert_eq!(
        launched[0]["agent_id"]["value"],
        agent_id.as_str(),
        "{tasks}"
    );
    assert_eq!(
        launched[0]["framework_id"]["value"],
        framework_id.as_str(),
        "{tasks}"
    );
    assert!(
        launched[0]["resources"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["name"] == "cpus" && r["scalar"]["value"] == 0.5),
        "{tasks}"
    );

    let answer = agent_call(
        &agent,
        &json!({"type": "GET_FRAMEWORKS"}),
        "application/json",
    );
    let frameworks: Value = serde_json::from_str(&answer.text()).unwrap();
    let f = &frameworks["get_frameworks"]["frameworks"][0]["framework_info"];
    assert_eq!(f["id"]["value"], framework_id.as_str(), "{frameworks}");
    assert_eq!(f["name"], "looker", "{frameworks}");

    let answer = agent_call(
        &agent,
        &json!({"type": "GET_EXECUTORS"}),
        "application/json",
    );
    let executors: Value = serde_json::from_str(&answer.text()).unwrap();
    let e = &executors["get_executors"]["executors"][0]["executor_info"];
    assert_eq!(e["executor_id"]["value"], "long", "{executors}");
    assert_eq!(
        e["framework_id"]["value"],
        framework_id.as_str(),
        "{executors}"
    );

    // `show_nested` changes nothing: no nested containers exist.
    let answer = agent_call(
        &agent,
        &json!({"type": "GET_CONTAINERS", "get_containers": {"show_nested": true}}),
        "application/json",
    );
    assert_eq!(answer.status, 200, "{}", answer.text());
    let containers: Value = serde_json::from_str(&answer.text()).unwrap();
    let c = &containers["get_containers"]["containers"][0];
    assert_eq!(c["executor_id"]["value"], "long", "{containers}");
    assert_eq!(
        c["framework_id"]["value"],
        framework_id.as_str(),
        "{containers}"
    );
    assert!(
        c["container_id"]["value"]
            .as_str()
            .is_some_and(|id| !id.is_empty()),
        "{containers}"
    );

    // Protobuf: GET_STATE holds the three lists.
    let answer = agent_call(
        &agent,
        &json!({"type": "GET_STATE"}),
        "application/x-protobuf",
    );
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert_eq!(
        answer.header("content-type"),
        Some("application/x-protobuf")
    );
    let response: AgentResponse = Codec::Protobuf.decode(&answer.body).expect("GET_STATE");
    let got = response.get_state.expect("get_state");
    assert_eq!(
        got.get_tasks.unwrap().launched_tasks[0].task_id.value,
        "long"
    );
    assert_eq!(got.get_executors.unwrap().executors.len(), 1);
    assert_eq!(
        got.get_frameworks.unwrap().frameworks[0]
            .framework_info
            .name,
        "looker"
    );

    // Any other call type: 501 naming it.
    for call in [
        "GET_HEALTH",
        "LAUNCH_NESTED_CONTAINER_SESSION",
        "KILL_CONTAINER",
    ] {
        let answer = agent_call(&agent, &json!({"type": call}), "application/json");
        assert_eq!(answer.status, 501, "{call}: {}", answer.text());
        assert!(answer.text().contains(call), "{call}: {}", answer.text());
    }
    drop(driver);
}

#[test]
fn the_operator_stream_writes_each_record_in_a_chunk_of_its_own() {
    let cluster = TestCluster::start_with(1, AGENT, &["--allocation-interval", "100ms"]);
    let master = cluster.master_address();
    let mut stream = raw_post(&master, "/api/v1", r#"{"type":"SUBSCRIBE"}"#, &[]);
    assert_eq!(stream.status, 200);
    // SUBSCRIBED and the HEARTBEAT after it: two chunks.
    let subscribed = stream.event();
    assert_eq!(subscribed["type"], "SUBSCRIBED", "{subscribed}");
    let heartbeat = stream.event();
    assert_eq!(heartbeat["type"], "HEARTBEAT", "{heartbeat}");

    // A framework's tasks come and go: a burst of events per snapshot.
    let (ok, out, err) = cluster.run_bin(
        "agora-execute",
        &[
            "--master",
            &master,
            "--name",
            "burst",
            "--command",
            "true",
            "--instances",
            "6",
            "--timeout",
            "60s",
        ],
        Duration::from_secs(90),
    );
    assert!(ok, "agora-execute failed\n{out}\n{err}");
    let mut seen = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !seen.iter().any(|t| t == "FRAMEWORK_REMOVED") {
        assert!(Instant::now() < deadline, "{seen:?}\n{}", cluster.logs());
        let event = stream.event();
        seen.push(event["type"].as_str().unwrap_or_default().to_string());
    }
    let updates = seen
        .iter()
        .filter(|t| *t == "TASK_UPDATED" || *t == "TASK_ADDED")
        .count();
    assert!(updates >= 6, "{seen:?}");
}
