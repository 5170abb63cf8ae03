//! The master's HTTP surface on a real in-process master with a fake
//! agent and scheduler speaking WebSocket: the JSON shape of `/state`,
//! `/api/v1/*`, `/health` and `/events` (key sets and types, not volatile
//! values), the counters and gauges of `/metrics`, and the embedded UI.

use std::collections::BTreeSet;
use std::time::Duration;

use agora_proto::{agent, scheduler, AgentInfo, FrameworkInfo, Resources, PROTOCOL_VERSION};
use futures::{SinkExt, StreamExt};
use serde_json::Value;
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

type Ws = WebSocketStream<MaybeTlsStream<TcpStream>>;

const WAIT: Duration = Duration::from_secs(10);

async fn send<T: serde::Serialize>(ws: &mut Ws, msg: &T) {
    ws.send(Message::Text(agora_proto::encode(msg).into()))
        .await
        .unwrap();
}

async fn next<T: agora_proto::Message>(ws: &mut Ws) -> T {
    loop {
        match tokio::time::timeout(WAIT, ws.next()).await.unwrap() {
            Some(Ok(Message::Text(t))) => return agora_proto::decode(t.as_str()).unwrap(),
            Some(Ok(Message::Ping(_) | Message::Pong(_))) => continue,
            other => panic!("expected a text frame, got {other:?}"),
        }
    }
}

/// `GET path` with extra header lines (`Name: value\r\n` each): (status
/// code, the answer's header fields as `name: value` lines, body).
async fn get(addr: std::net::SocketAddr, path: &str, headers: &str) -> (u16, String, String) {
    let fields: Vec<(&str, &str)> = headers
        .lines()
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim(), v.trim()))
        .collect();
    let response = agora_client::Http::new()
        .with_timeout(WAIT)
        .request(agora_client::Method::GET, addr, path, &fields, None)
        .await
        .unwrap();
    (response.status, head(&response.headers), response.text())
}

fn head(headers: &agora_client::HeaderMap) -> String {
    headers
        .iter()
        .map(|(n, v)| format!("{n}: {}\n", v.to_str().unwrap_or("")))
        .collect()
}

async fn get_json(addr: std::net::SocketAddr, path: &str) -> Value {
    let (code, _, body) = get(addr, path, "").await;
    assert_eq!(code, 200, "{path}: {body}");
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("{path}: {e}: {body}"))
}

/// The keys of a JSON object.
fn keys(v: &Value) -> BTreeSet<String> {
    v.as_object()
        .unwrap_or_else(|| panic!("not an object: {v}"))
        .keys()
        .cloned()
        .collect()
}

fn set(names: &[&str]) -> BTreeSet<String> {
    names.iter().map(|s| s.to_string()).collect()
}

fn metric(text: &str, series: &str) -> f64 {
    text.lines()
        .find(|l| l.starts_with(series) && l[series.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no series {series} in\n{text}"))
}

struct Cluster {
    addr: std::net::SocketAddr,
    agent: Ws,
    sched: Ws,
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<Result<(), agora_master::MasterError>>,
}

/// A master with one agent and one framework whose task `t1` is running.
async fn cluster_with_a_running_task() -> Cluster {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let config = agora_master::Config {
        allocation_interval: Duration::from_millis(100),
        state_snapshot_interval: Duration::from_millis(20),
        ..Default::default()
    };
    let task = tokio::spawn(agora_master::run(listener, config, async move {
        let _ = stopped.await;
    }));
    let connect = |path: &'static str| async move {
        tokio_tungstenite::connect_async(format!("ws://{addr}{path}"))
            .await
            .unwrap()
            .0
    };
    let mut agent_ws = connect("/api/agent").await;
    let attributes = agora_proto::Attributes::parse("rack:r1").unwrap();
    send(
        &mut agent_ws,
        &agent::Call::Register {
            protocol: PROTOCOL_VERSION,
            agent_info: AgentInfo {
                id: None,
                hostname: "h1".into(),
                address: "127.0.0.1:1".into(),
                resources: Resources::parse("cpus:2;mem:1024;disk:100").unwrap(),
                attributes,
            },
            tasks: vec![],
            executors: vec![],
            frameworks: vec![],
        },
    )
    .await;
    let agent_id = match next(&mut agent_ws).await {
        agent::Event::Registered { agent_id, .. } => agent_id,
        e => panic!("{e:?}"),
    };
    let mut sched = connect("/api/scheduler").await;
    let mut info = FrameworkInfo::new("web-fw");
    info.roles = vec!["web".into()];
    send(
        &mut sched,
        &scheduler::Call::Subscribe {
            protocol: PROTOCOL_VERSION,
            framework_info: info,
            force: false,
        },
    )
    .await;
    let framework_id = match next(&mut sched).await {
        scheduler::Event::Subscribed { framework_id, .. } => framework_id,
        e => panic!("{e:?}"),
    };
    let offer = loop {
        if let scheduler::Event::Offers { mut offers } = next(&mut sched).await {
            break offers.remove(0);
        }
    };
    let task_info = agora_proto::TaskInfo {
        container: None,
        allocation_role: None,
        launch_stamp: None,
        name: "first task".into(),
        task_id: "t1".into(),
        agent_id: agent_id.clone(),
        resources: Resources::parse("cpus:1;mem:128").unwrap(),
        executor: None,
        command: Some(agora_proto::CommandInfo {
            value: "true".into(),
            ..Default::default()
        }),
        data: None,
        kill_grace_period: None,
        labels: Default::default(),
        task_group: None,
    };
    send(
        &mut sched,
        &scheduler::Call::Launch {
            offer_ids: vec![offer.id],
            tasks: vec![task_info],
            filters: Default::default(),
        },
    )
    .await;
    loop {
        match next(&mut agent_ws).await {
            agent::Event::RunTask { .. } => break,
            agent::Event::Ping => continue,
            e => panic!("{e:?}"),
        }
    }
    let status = agora_proto::TaskStatus::new(
        "t1".into(),
        agora_proto::TaskState::Running,
        agora_proto::Source::SourceExecutor,
    )
    .with_new_uuid();
    let uuid = status.uuid.clone().unwrap();
    send(
        &mut agent_ws,
        &agent::Call::StatusUpdate {
            framework_id: framework_id.clone(),
            status,
        },
    )
    .await;
    loop {
        match next(&mut sched).await {
            scheduler::Event::Update { .. } => break,
            scheduler::Event::Offers { .. } | scheduler::Event::Heartbeat => continue,
            e => panic!("{e:?}"),
        }
    }
    send(
        &mut sched,
        &scheduler::Call::Acknowledge {
            agent_id,
            task_id: "t1".into(),
            uuid,
        },
    )
    .await;
    // An undecodable frame, for the error counter.
    sched.send(Message::Text("nonsense".into())).await.unwrap();
    let _: scheduler::Event = next(&mut sched).await;
    // Wait for a snapshot that shows the running task.
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let s = get_json(addr, "/state").await;
        if s["frameworks"][0]["tasks"][0]["state"] == "TASK_RUNNING" {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "task never running: {s}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Cluster {
        addr,
        agent: agent_ws,
        sched,
        stop,
        task,
    }
}

impl Cluster {
    async fn stop(self) {
        drop(self.agent);
        drop(self.sched);
        let _ = self.stop.send(());
        let r = tokio::time::timeout(WAIT, self.task)
            .await
            .unwrap()
            .unwrap();
        assert!(r.is_ok(), "{r:?}");
    }
}

#[tokio::test]
async fn state_has_the_documented_shape() {
    let c = cluster_with_a_running_task().await;
    let s = get_json(c.addr, "/state").await;
    assert_eq!(
        keys(&s),
        set(&[
            "master",
            "started_at",
            "generated_at",
            "summary",
            "agents",
            "frameworks",
            "roles",
            "offers",
            "completed_tasks",
            "removed_agents"
        ])
    );
    assert_eq!(keys(&s["master"]), set(&["id", "address", "version"]));
    assert_eq!(
        keys(&s["summary"]),
        set(&[
            "agents_connected",
            "agents_disconnected",
            "frameworks",
            "frameworks_connected",
            "tasks_by_state",
            "completed_by_state",
            "tasks_active",
            "offers_outstanding",
            "cpus_total",
            "cpus_used",
            "cpus_offered",
            "mem_total",
            "mem_used",
            "mem_offered",
            "disk_total",
            "disk_used",
            "disk_offered"
        ])
    );
    assert_eq!(s["summary"]["tasks_by_state"]["TASK_RUNNING"], 1);
    assert_eq!(s["summary"]["cpus_total"], 2.0);
    assert_eq!(s["summary"]["cpus_used"], 1.0);
    let agent = &s["agents"][0];
    assert_eq!(
        keys(agent),
        set(&[
            "id",
            "hostname",
            "address",
            "connected",
            "total",
            "used",
            "offered",
            "attributes",
            "tasks",
            "executors",
            "registered_at",
            "deactivated"
        ])
    );
    assert_eq!(agent["deactivated"], false);
    assert_eq!(keys(&agent["total"]), set(&["text", "list"]));
    assert!(agent["total"]["text"].is_string() && agent["total"]["list"].is_array());
    assert_eq!(agent["address"], "127.0.0.1:1");
    let fw = &s["frameworks"][0];
    assert_eq!(
        keys(fw),
        set(&[
            "id",
            "name",
            "principal",
            "roles",
            "connected",
            "suppressed",
            "recovered",
            "failover_timeout",
            "offers",
            "used",
            "offered",
            "shares",
            "tasks",
            "registered_at"
        ])
    );
    assert!(fw["shares"]["web"].is_number(), "{fw}");
    assert!(
        fw["shares"]["web"].as_f64().unwrap() >= 0.5,
        "cpus 1 of 2: {fw}"
    );
    let task = &fw["tasks"][0];
    assert_eq!(
        keys(task),
        set(&[
            "id",
            "name",
            "framework_id",
            "state",
            "agent_id",
            "executor_id",
            "resources"
        ])
    );
    // A command task runs in an executor named after it.
    assert_eq!(task["executor_id"], "t1");
    let role = s["roles"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == "web")
        .unwrap();
    assert_eq!(keys(role), set(&["name", "weight", "share", "frameworks"]));
    assert!(role["share"].is_number());
    c.stop().await;
}

#[tokio::test]
async fn metrics_count_what_happened() {
    let c = cluster_with_a_running_task().await;
    let (code, head, text) = get(c.addr, "/metrics", "").await;
    assert_eq!(code, 200);
    assert!(
        head.to_ascii_lowercase()
            .contains("text/plain; version=0.0.4"),
        "{head}"
    );
    assert_eq!(
        metric(&text, "agora_master_agents{state=\"connected\"}"),
        1.0
    );
    assert_eq!(
        metric(&text, "agora_master_agents{state=\"disconnected\"}"),
        0.0
    );
    assert_eq!(
        metric(&text, "agora_master_frameworks{state=\"connected\"}"),
        1.0
    );
    assert_eq!(
        metric(&text, "agora_master_tasks{state=\"TASK_RUNNING\"}"),
        1.0
    );
    assert!(metric(&text, "agora_master_offers_total{event=\"made\"}") >= 1.0);
    assert_eq!(
        metric(&text, "agora_master_offers_total{event=\"accepted\"}"),
        1.0
    );
    assert_eq!(metric(&text, "agora_master_tasks_launched_total"), 1.0);
    assert_eq!(
        metric(
            &text,
            "agora_master_status_updates_total{event=\"received\"}"
        ),
        1.0
    );
    assert_eq!(
        metric(&text, "agora_master_status_updates_total{event=\"sent\"}"),
        1.0
    );
    assert_eq!(
        metric(&text, "agora_master_status_updates_total{event=\"acked\"}"),
        1.0
    );
    assert!(
        metric(
            &text,
            "agora_master_messages_in_total{channel=\"scheduler\"}"
        ) >= 4.0
    );
    assert!(metric(&text, "agora_master_messages_out_total{channel=\"agent\"}") >= 2.0);
    assert_eq!(
        metric(&text, "agora_master_errors_total{kind=\"decode\"}"),
        1.0
    );
    assert_eq!(metric(&text, "agora_master_cpus{kind=\"total\"}"), 2.0);
    assert_eq!(metric(&text, "agora_master_cpus{kind=\"used\"}"), 1.0);
    let cycles = metric(&text, "agora_master_allocation_cycle_seconds_count");
    assert!(cycles >= 1.0);
    assert_eq!(
        metric(
            &text,
            "agora_master_allocation_cycle_seconds_bucket{le=\"+Inf\"}"
        ),
        cycles
    );
    // Every sample line belongs to a declared metric.
    let declared: BTreeSet<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split(' ').next())
        .collect();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let name = line.split(['{', ' ']).next().unwrap();
        let base = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| name.strip_suffix(s))
            .filter(|b| declared.contains(b))
            .unwrap_or(name);
        assert!(declared.contains(base), "undeclared {line}");
    }
    c.stop().await;
}

#[tokio::test]
async fn list_endpoints_page_and_filter() {
    let c = cluster_with_a_running_task().await;
    let page = get_json(c.addr, "/api/v1/tasks?state=running&limit=10").await;
    assert_eq!(keys(&page), set(&["total", "offset", "limit", "items"]));
    assert_eq!(page["total"], 1);
    let t = &page["items"][0];
    assert_eq!(t["id"], "t1");
    assert_eq!(t["agent_address"], "127.0.0.1:1");
    assert_eq!(t["agent_hostname"], "h1");
    assert!(t["executor_id"].is_string() && t["framework_id"].is_string());
    let none = get_json(c.addr, "/api/v1/tasks?state=finished").await;
    assert_eq!(none["total"], 0);
    let q = get_json(c.addr, "/api/v1/tasks?q=FIRST").await;
    assert_eq!(q["total"], 1);
    let past = get_json(c.addr, "/api/v1/tasks?offset=5").await;
    assert_eq!(
        (
            past["total"].as_u64(),
            past["items"].as_array().map(Vec::len)
        ),
        (Some(1), Some(0))
    );

    let agents = get_json(c.addr, "/api/v1/agents?q=h1").await;
    assert_eq!(agents["total"], 1);
    assert_eq!(agents["items"][0]["hostname"], "h1");
    assert_eq!(get_json(c.addr, "/api/v1/agents?q=nope").await["total"], 0);

    let fws = get_json(c.addr, "/api/v1/frameworks").await;
    let fw = &fws["items"][0];
    assert_eq!(fw["tasks"], 1);
    assert_eq!(fw["tasks_by_state"]["TASK_RUNNING"], 1);
    assert!(fw["shares"].is_object() && fw["used"]["text"].is_string());

    let summary = get_json(c.addr, "/api/v1/summary").await;
    assert_eq!(
        keys(&summary),
        set(&["master", "started_at", "generated_at", "summary", "roles"])
    );
    let (code, _, _) = get(c.addr, "/api/v1/tasks?limit=abc", "").await;
    assert_eq!(code, 400);
    c.stop().await;
}

#[tokio::test]
async fn health_events_and_ui() {
    let c = cluster_with_a_running_task().await;
    let (code, _, body) = get(c.addr, "/health", "").await;
    assert_eq!((code, body.as_str()), (200, "ok"));
    let (code, _, body) = get(c.addr, "/health", "Accept: application/json\r\n").await;
    assert_eq!(code, 200);
    let h: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        keys(&h),
        set(&[
            "status",
            "master_id",
            "address",
            "uptime_seconds",
            "open_doors"
        ])
    );
    assert_eq!(h["status"], "serving");
    // A test master has no TLS and no authentication: every door is open.
    assert_eq!(
        h["open_doors"],
        serde_json::json!([
            "no_tls",
            "unauthenticated_frameworks",
            "unauthenticated_agents",
            "unauthenticated_http",
            "unauthenticated_operator_writes"
        ]),
    );

    // The first server-sent event comes at once.
    let mut stream = agora_client::Http::new()
        .stream(
            agora_client::Method::GET,
            c.addr,
            "/events",
            &[("accept", "text/event-stream")],
            None,
        )
        .await
        .unwrap();
    let mut raw = Vec::new();
    let event = tokio::time::timeout(WAIT, async {
        loop {
            let chunk = stream.chunk().await.unwrap().expect("events stream ended");
            raw.extend_from_slice(&chunk);
            let text = String::from_utf8_lossy(&raw).to_string();
            if let Some(start) = text.find("event: summary\ndata: ") {
                let rest = &text[start + "event: summary\ndata: ".len()..];
                if let Some(end) = rest.find('\n') {
                    return rest[..end].to_string();
                }
            }
        }
    })
    .await
    .unwrap();
    let head = head(&stream.headers);
    assert!(head.contains("text/event-stream"), "{head}");
    let e: Value = serde_json::from_str(&event).unwrap();
    assert_eq!(e["summary"]["tasks_active"], 1);

    let (code, head, html) = get(c.addr, "/", "").await;
    assert_eq!(code, 200);
    assert!(head.contains("text/html"));
    assert!(html.contains("/ui/app.js") && html.contains("/ui/style.css"));
    assert!(
        !html.contains("http://") && !html.contains("https://"),
        "no CDN"
    );
    let (code, _, js) = get(c.addr, "/ui/app.js", "").await;
    assert_eq!(code, 200);
    assert!(js.contains("EventSource"));
    assert_eq!(get(c.addr, "/ui/style.css", "").await.0, 200);
    assert_eq!(get(c.addr, "/ui/secret", "").await.0, 404);
    drop(stream);
    c.stop().await;
}
