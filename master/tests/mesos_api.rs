//! The Mesos v1 front door of an in-process master, spoken to over raw
//! HTTP/1.1: the SUBSCRIBE stream's shape (status, content type, stream
//! id, chunked RecordIO, SUBSCRIBED then HEARTBEAT, in protobuf), the
//! status codes Mesos gives bad requests, and the operator API and
//! scraped endpoints.

use std::time::Duration;

use agora_mesos_proto::v1::scheduler::{call, event};
use agora_mesos_proto::{recordio, v1, Codec};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const WAIT: Duration = Duration::from_secs(10);

async fn start() -> (std::net::SocketAddr, tokio::sync::oneshot::Sender<()>) {
    start_with(agora_master::Config::default()).await
}

async fn start_with(
    config: agora_master::Config,
) -> (std::net::SocketAddr, tokio::sync::oneshot::Sender<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(agora_master::run(listener, config, async move {
        let _ = stopped.await;
    }));
    (addr, stop)
}

/// A whole (non-streaming) response: status, head, body.
async fn request(
    addr: std::net::SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> (u16, String, Vec<u8>) {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).await.unwrap();
    let _ = stream.write_all(body).await;
    let mut raw = Vec::new();
    let _ = tokio::time::timeout(WAIT, stream.read_to_end(&mut raw)).await;
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n").expect("head");
    let head = String::from_utf8_lossy(&raw[..split]).to_string();
    let status = head[9..12].parse().unwrap();
    (status, head, raw[split + 4..].to_vec())
}

fn subscribe_call(framework_id: Option<&str>) -> v1::scheduler::Call {
    subscribe_call_named(framework_id, "raw")
}

fn subscribe_call_named(framework_id: Option<&str>, name: &str) -> v1::scheduler::Call {
    let mut c = v1::scheduler::Call {
        framework_id: framework_id.map(|v| v1::FrameworkId { value: v.into() }),
        subscribe: Some(call::Subscribe {
            framework_info: v1::FrameworkInfo {
                user: "u".into(),
                name: name.into(),
                id: framework_id.map(|v| v1::FrameworkId { value: v.into() }),
                ..Default::default()
            },
            ..Default::default()
        }),
        ..Default::default()
    };
    c.set_type(call::Type::Subscribe);
    c
}

/// Opens a protobuf SUBSCRIBE stream; returns it, its head and the first
/// events (decoded from the chunked RecordIO body).
async fn subscribe(addr: std::net::SocketAddr) -> (TcpStream, String, Vec<v1::scheduler::Event>) {
    subscribe_named(addr, "raw").await
}

/// [`subscribe`] as a framework named `name`.
async fn subscribe_named(
    addr: std::net::SocketAddr,
    name: &str,
) -> (TcpStream, String, Vec<v1::scheduler::Event>) {
    let body = Codec::Protobuf
        .encode(&subscribe_call_named(None, name))
        .unwrap();
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "POST /api/v1/scheduler HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/x-protobuf\r\nAccept: application/x-protobuf\r\nAccept: application/x-protobuf\r\nConnection: close\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    stream.write_all(&body).await.unwrap();
    let mut raw = Vec::new();
    let mut events = Vec::new();
    let deadline = tokio::time::Instant::now() + WAIT;
    while events.len() < 2 {
        let mut buf = [0u8; 4096];
        let n = tokio::time::timeout_at(deadline, stream.read(&mut buf))
            .await
            .expect("events in time")
            .unwrap();
        assert!(n > 0, "stream closed: {}", String::from_utf8_lossy(&raw));
        raw.extend_from_slice(&buf[..n]);
        events = stream_records(&raw)
            .iter()
            .map(|record| Codec::Protobuf.decode(record).unwrap())
            .collect();
    }
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
    let head = String::from_utf8_lossy(&raw[..split]).to_string();
    (stream, head, events)
}

/// The complete RecordIO records in what a chunked response delivered so
/// far (nothing before its head is complete).
fn stream_records(raw: &[u8]) -> Vec<Vec<u8>> {
    let Some(split) = raw.windows(4).position(|w| w == b"\r\n\r\n") else {
        return Vec::new();
    };
    // De-chunk what arrived, then read RecordIO records.
    let mut body = &raw[split + 4..];
    let mut records = recordio::Reader::new();
    while let Some(line_end) = body.windows(2).position(|w| w == b"\r\n") {
        let size =
            usize::from_str_radix(std::str::from_utf8(&body[..line_end]).unwrap(), 16).unwrap();
        if body.len() < line_end + 2 + size + 2 {
            break;
        }
        records.feed(&body[line_end + 2..line_end + 2 + size]);
        body = &body[line_end + 2 + size + 2..];
    }
    let mut out = Vec::new();
    while let Some(record) = records.next_record().unwrap() {
        out.push(record.to_vec());
    }
    out
}

fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.eq_ignore_ascii_case(name).then_some(v.trim())
    })
}

#[tokio::test]
async fn subscribe_streams_protobuf_recordio_and_calls_need_the_stream_id() {
    let (addr, _stop) = start().await;
    let (_stream, head, events) = subscribe(addr).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert_eq!(
        header(&head, "content-type"),
        Some("application/x-protobuf")
    );
    assert_eq!(header(&head, "transfer-encoding"), Some("chunked"));
    assert_eq!(header(&head, "content-length"), None);
    let stream_id = header(&head, "mesos-stream-id")
        .expect("stream id")
        .to_string();
    assert_eq!(events[0].r#type(), event::Type::Subscribed);
    assert_eq!(events[1].r#type(), event::Type::Heartbeat);
    let subscribed = events[0].subscribed.clone().unwrap();
    let master = subscribed.master_info.unwrap();
    assert_eq!(master.port, u32::from(addr.port()));
    let fid = subscribed.framework_id.value;

    let json = |t: &str| format!(r#"{{"type":"{t}","framework_id":{{"value":"{fid}"}}}}"#);
    let ct = ("Content-Type", "application/json");
    // A call with the right stream id is accepted: exactly 202, empty body.
    let (code, _, body) = request(
        addr,
        "POST",
        "/api/v1/scheduler",
        &[ct, ("Mesos-Stream-Id", &stream_id)],
        json("REVIVE").as_bytes(),
    )
    .await;
    assert_eq!((code, body.len()), (202, 0));
    // Without it, or with another, 400; for a framework not subscribed, 403.
    let (code, _, _) = request(
        addr,
        "POST",
        "/api/v1/scheduler",
        &[ct],
        json("REVIVE").as_bytes(),
    )
    .await;
    assert_eq!(code, 400);
    let (code, _, _) = request(
        addr,
        "POST",
        "/api/v1/scheduler",
        &[ct, ("Mesos-Stream-Id", "other")],
        json("REVIVE").as_bytes(),
    )
    .await;
    assert_eq!(code, 400);
    let (code, _, _) = request(
        addr,
        "POST",
        "/api/v1/scheduler",
        &[ct, ("Mesos-Stream-Id", &stream_id)],
        br#"{"type":"REVIVE","framework_id":{"value":"nobody"}}"#,
    )
    .await;
    assert_eq!(code, 403);
    // An ACKNOWLEDGE whose uuid is not 16 bytes, and an unknown call.
    let ack = format!(
        r#"{{"type":"ACKNOWLEDGE","framework_id":{{"value":"{fid}"}},"acknowledge":{{"agent_id":{{"value":"a"}},"task_id":{{"value":"t"}},"uuid":"AAEC"}}}}"#
    );
    let (code, _, body) = request(
        addr,
        "POST",
        "/api/v1/scheduler",
        &[ct, ("Mesos-Stream-Id", &stream_id)],
        ack.as_bytes(),
    )
    .await;
    assert_eq!(code, 400, "{}", String::from_utf8_lossy(&body));
    let (code, _, _) = request(
        addr,
        "POST",
        "/api/v1/scheduler",
        &[ct, ("Mesos-Stream-Id", &stream_id)],
        json("UNKNOWN").as_bytes(),
    )
    .await;
    assert_eq!(code, 501);
    // A call type Agora does not carry out is 501 naming it, a field 400.
    let (code, _, body) = request(
        addr,
        "POST",
        "/api/v1/scheduler",
        &[ct, ("Mesos-Stream-Id", &stream_id)],
        json("UPDATE_FRAMEWORK").as_bytes(),
    )
    .await;
    assert_eq!(code, 501);
    assert_eq!(
        String::from_utf8_lossy(&body),
        "scheduler.Call.type UPDATE_FRAMEWORK is not supported"
    );
    let (code, _, body) = request(
        addr,
        "POST",
        "/api/v1/scheduler",
        &[ct, ("Mesos-Stream-Id", &stream_id)],
        format!(
            r#"{{"type":"KILL","framework_id":{{"value":"{fid}"}},"kill":{{"task_id":{{"value":"t"}},"kill_policy":{{}}}}}}"#
        )
        .as_bytes(),
    )
    .await;
    assert_eq!(code, 400);
    assert_eq!(
        String::from_utf8_lossy(&body),
        "scheduler.Call.Kill.kill_policy is not supported"
    );
    // mesoshttp's top-level "requests" is not Mesos's REQUEST shape.
    let (code, _, _) = request(
        addr,
        "POST",
        "/api/v1/scheduler",
        &[ct, ("Mesos-Stream-Id", &stream_id)],
        format!(r#"{{"type":"REQUEST","framework_id":{{"value":"{fid}"}},"requests":[]}}"#)
            .as_bytes(),
    )
    .await;
    assert_eq!(code, 400);
    // A SUBSCRIBE that carries a stream id, or whose ids disagree.
    let sub = Codec::Json.encode(&subscribe_call(None)).unwrap();
    let (code, _, _) = request(
        addr,
        "POST",
        "/api/v1/scheduler",
        &[ct, ("Mesos-Stream-Id", &stream_id)],
        &sub,
    )
    .await;
    assert_eq!(code, 400);
    let mut mismatched = subscribe_call(Some("a"));
    mismatched.framework_id = Some(v1::FrameworkId { value: "b".into() });
    let (code, _, _) = request(
        addr,
        "POST",
        "/api/v1/scheduler",
        &[ct],
        &Codec::Json.encode(&mismatched).unwrap(),
    )
    .await;
    assert_eq!(code, 400);
    // The master still serves the framework.
    let (code, _, _) = request(
        addr,
        "POST",
        "/api/v1/scheduler",
        &[ct, ("Mesos-Stream-Id", &stream_id)],
        json("SUPPRESS").as_bytes(),
    )
    .await;
    assert_eq!(code, 202);
}

#[tokio::test]
async fn bad_requests_get_mesos_status_codes() {
    let (addr, _stop) = start().await;
    let path = "/api/v1/scheduler";
    let (code, head, _) = request(addr, "GET", path, &[], b"").await;
    assert_eq!(code, 405);
    assert_eq!(header(&head, "allow"), Some("POST"));
    let (code, _, _) = request(addr, "POST", path, &[], b"{}").await;
    assert_eq!(code, 400, "no Content-Type");
    let (code, _, _) = request(addr, "POST", path, &[("Content-Type", "text/plain")], b"{}").await;
    assert_eq!(code, 415);
    let (code, _, body) = request(
        addr,
        "POST",
        path,
        &[("Content-Type", "application/json")],
        b"{\"type\":",
    )
    .await;
    assert_eq!(code, 400);
    assert!(String::from_utf8_lossy(&body).contains("Failed to parse"));
    let (code, _, body) = request(
        addr,
        "POST",
        path,
        &[("Content-Type", "application/json")],
        br#"{"type":"SUBSCRIBE","subscribe":{"framework_info":{"name":"x"}}}"#,
    )
    .await;
    assert_eq!(code, 400);
    assert!(String::from_utf8_lossy(&body).contains("subscribe.framework_info.user"));
    let (code, _, _) = request(
        addr,
        "POST",
        path,
        &[("Content-Type", "application/x-protobuf")],
        &[0xff, 0xff],
    )
    .await;
    assert_eq!(code, 400);
    let sub = Codec::Json.encode(&subscribe_call(None)).unwrap();
    let (code, _, _) = request(
        addr,
        "POST",
        path,
        &[
            ("Content-Type", "application/json"),
            ("Accept", "text/html"),
        ],
        &sub,
    )
    .await;
    assert_eq!(code, 406);
    let huge = vec![b' '; agora_proto::MAX_FRAME_BYTES + 10];
    let (code, _, _) = request(
        addr,
        "POST",
        path,
        &[("Content-Type", "application/json")],
        &huge,
    )
    .await;
    assert_eq!(code, 413);
    let (code, _, _) = request(
        addr,
        "POST",
        "/api/v1",
        &[("Content-Type", "application/json")],
        br#"{"type":"UPDATE_MAINTENANCE_SCHEDULE"}"#,
    )
    .await;
    assert_eq!(code, 501);
    for (call, status, answer) in [
        (
            r#"{"type":"START_MAINTENANCE"}"#,
            501,
            "master.Call.type START_MAINTENANCE is not supported",
        ),
        (
            r#"{"type":"RESERVE_RESOURCES"}"#,
            501,
            "master.Call.type RESERVE_RESOURCES is not supported",
        ),
        (
            r#"{"type":"GET_STATE","start_maintenance":{}}"#,
            400,
            "master.Call.start_maintenance is not supported",
        ),
    ] {
        let (code, _, body) = request(
            addr,
            "POST",
            "/api/v1",
            &[("Content-Type", "application/json")],
            call.as_bytes(),
        )
        .await;
        assert_eq!(code, status, "{call}");
        assert_eq!(String::from_utf8_lossy(&body), answer, "{call}");
    }
    // None of it hurt the master.
    let (code, _, body) = request(addr, "GET", "/master/health", &[], b"").await;
    assert_eq!(code, 200, "{}", String::from_utf8_lossy(&body));
}

#[tokio::test]
async fn operator_api_and_scraped_endpoints() {
    let (addr, _stop) = start().await;
    let (_stream, _, _) = subscribe(addr).await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    let ct = ("Content-Type", "application/json");
    let (code, head, body) =
        request(addr, "POST", "/api/v1", &[ct], br#"{"type":"GET_STATE"}"#).await;
    assert_eq!(code, 200);
    assert_eq!(header(&head, "content-type"), Some("application/json"));
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["type"], "GET_STATE");
    let frameworks = &v["get_state"]["get_frameworks"]["frameworks"];
    assert_eq!(frameworks[0]["framework_info"]["name"], "raw");
    // mesos-go asks for protobuf: the Content-Type is then exactly that.
    let (code, head, body) = request(
        addr,
        "POST",
        "/api/v1",
        &[
            ("Content-Type", "application/x-protobuf"),
            ("Accept", "application/x-protobuf"),
        ],
        &Codec::Protobuf
            .encode(&{
                let mut c = v1::master::Call::default();
                c.set_type(v1::master::call::Type::GetVersion);
                c
            })
            .unwrap(),
    )
    .await;
    assert_eq!(code, 200);
    assert_eq!(
        header(&head, "content-type"),
        Some("application/x-protobuf")
    );
    let r: v1::master::Response = Codec::Protobuf.decode(&body).unwrap();
    assert_eq!(
        r.get_version.unwrap().version_info.version,
        agora_mesos_proto::MESOS_API_VERSION
    );
    for (call, key) in [
        ("GET_HEALTH", "get_health"),
        ("GET_AGENTS", "get_agents"),
        ("GET_TASKS", "get_tasks"),
        ("GET_EXECUTORS", "get_executors"),
        ("GET_FRAMEWORKS", "get_frameworks"),
        ("GET_METRICS", "get_metrics"),
    ] {
        let (code, _, body) = request(
            addr,
            "POST",
            "/api/v1",
            &[ct],
            format!(r#"{{"type":"{call}"}}"#).as_bytes(),
        )
        .await;
        assert_eq!(code, 200, "{call}");
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert!(v.get(key).is_some(), "{call}: {v}");
    }
    for path in ["/master/state", "/state.json", "/master/state.json"] {
        let (code, _, body) = request(addr, "GET", path, &[], b"").await;
        assert_eq!(code, 200, "{path}");
        let s: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(s["leader"], format!("master@{addr}"));
        assert!(
            s["frameworks"][0].get("pid").is_none(),
            "HTTP frameworks have no pid"
        );
        assert!(s["slaves"].is_array());
    }
    let (code, _, body) = request(addr, "GET", "/master/state-summary", &[], b"").await;
    assert_eq!(code, 200);
    let s: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert!(s["frameworks"][0].get("TASK_RUNNING").is_some());
    let (code, _, body) = request(addr, "GET", "/metrics/snapshot", &[], b"").await;
    assert_eq!(code, 200);
    let m: serde_json::Value = serde_json::from_slice(&body).unwrap();
    for key in [
        "master/elected",
        "master/cpus_total",
        "master/frameworks_active",
        "master/tasks_running",
        "master/outstanding_offers",
    ] {
        assert!(m[key].is_number(), "{key}");
    }
    let (code, head, _) = request(addr, "GET", "/master/redirect", &[], b"").await;
    assert_eq!(code, 307);
    assert_eq!(
        header(&head, "location"),
        Some(format!("//{addr}").as_str())
    );
}

/// An operator SUBSCRIBE stream in JSON, read record by record.
struct OperatorEvents {
    stream: TcpStream,
    raw: Vec<u8>,
    taken: usize,
}

impl OperatorEvents {
    async fn open(addr: std::net::SocketAddr) -> OperatorEvents {
        let body = br#"{"type":"SUBSCRIBE"}"#;
        let mut stream = TcpStream::connect(addr).await.unwrap();
        let head = format!(
            "POST /api/v1 HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nAccept: application/json\r\nConnection: close\r\nContent-Length: {}\r\n\r\n",
            body.len()
        );
        stream.write_all(head.as_bytes()).await.unwrap();
        stream.write_all(body).await.unwrap();
        OperatorEvents {
            stream,
            raw: Vec::new(),
            taken: 0,
        }
    }

    /// The events that arrived whole so far (de-chunked, RecordIO).
    fn records(&self) -> Vec<serde_json::Value> {
        stream_records(&self.raw)
            .iter()
            .map(|record| serde_json::from_slice(record).unwrap())
            .collect()
    }

    /// The next event other than HEARTBEAT.
    async fn next(&mut self) -> serde_json::Value {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let records = self.records();
            while self.taken < records.len() {
                self.taken += 1;
                if records[self.taken - 1]["type"] != "HEARTBEAT" {
                    return records[self.taken - 1].clone();
                }
            }
            let mut buf = [0u8; 4096];
            let n = tokio::time::timeout_at(deadline, self.stream.read(&mut buf))
                .await
                .expect("an operator event in time")
                .unwrap();
            assert!(n > 0, "operator stream closed");
            self.raw.extend_from_slice(&buf[..n]);
        }
    }
}

/// A framework that subscribes and is torn down between two snapshots of
/// the master's state still reaches operator subscribers, in Mesos's
/// order: FRAMEWORK_ADDED, then FRAMEWORK_REMOVED; and GET_FRAMEWORKS
/// lists it among the completed frameworks.
#[tokio::test]
async fn operator_stream_reports_a_framework_that_came_and_went_between_snapshots() {
    let config = agora_master::Config {
        state_snapshot_interval: Duration::from_secs(2),
        ..Default::default()
    };
    let (addr, _stop) = start_with(config).await;
    let mut operator = OperatorEvents::open(addr).await;
    assert_eq!(operator.next().await["type"], "SUBSCRIBED");
    // A first framework: once the operator hears of it, a snapshot was
    // just published and the next one is two seconds away.
    let (_anchor, _, _) = subscribe_named(addr, "anchor").await;
    let added = operator.next().await;
    assert_eq!(added["type"], "FRAMEWORK_ADDED", "{added}");
    assert_eq!(
        added["framework_added"]["framework"]["framework_info"]["name"],
        "anchor"
    );
    let (_blink, head, events) = subscribe_named(addr, "blink").await;
    let stream_id = header(&head, "mesos-stream-id").unwrap().to_string();
    let fid = events[0].subscribed.clone().unwrap().framework_id.value;
    let (code, _, _) = request(
        addr,
        "POST",
        "/api/v1/scheduler",
        &[
            ("Content-Type", "application/json"),
            ("Mesos-Stream-Id", &stream_id),
        ],
        format!(r#"{{"type":"TEARDOWN","framework_id":{{"value":"{fid}"}}}}"#).as_bytes(),
    )
    .await;
    assert_eq!(code, 202);
    let added = operator.next().await;
    assert_eq!(added["type"], "FRAMEWORK_ADDED", "{added}");
    let info = &added["framework_added"]["framework"]["framework_info"];
    assert_eq!(
        (&info["name"], &info["id"]["value"]),
        (&"blink".into(), &fid.clone().into())
    );
    let removed = operator.next().await;
    assert_eq!(removed["type"], "FRAMEWORK_REMOVED", "{removed}");
    assert_eq!(
        removed["framework_removed"]["framework_info"]["id"]["value"],
        fid
    );
    let (code, _, body) = request(
        addr,
        "POST",
        "/api/v1",
        &[("Content-Type", "application/json")],
        br#"{"type":"GET_FRAMEWORKS"}"#,
    )
    .await;
    assert_eq!(code, 200);
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
    let completed = &v["get_frameworks"]["completed_frameworks"];
    assert_eq!(completed[0]["framework_info"]["id"]["value"], fid, "{v}");
    assert_eq!(completed[0]["active"], false);
    let (code, _, body) = request(addr, "GET", "/master/state", &[], b"").await;
    assert_eq!(code, 200);
    let state: serde_json::Value = serde_json::from_slice(&body).unwrap();
    let completed = &state["completed_frameworks"];
    assert_eq!(completed[0]["id"], fid, "{state}");
    assert_eq!(completed[0]["name"], "blink");
}

/// A SUBSCRIBE that asks for what Agora does not carry out (a capability,
/// a FrameworkInfo field, a Subscribe field) is answered ERROR naming it,
/// and the stream ends, as for an invalid FrameworkInfo.
#[tokio::test]
async fn a_subscription_asking_for_what_agora_does_not_do_is_refused_by_name() {
    let (addr, _stop) = start().await;
    let mut revocable = subscribe_call(None);
    if let Some(s) = revocable.subscribe.as_mut() {
        s.framework_info
            .capabilities
            .push(v1::framework_info::Capability {
                r#type: Some(v1::framework_info::capability::Type::RevocableResources as i32),
            });
    }
    let mut filtered = subscribe_call(None);
    if let Some(s) = filtered.subscribe.as_mut() {
        s.framework_info
            .offer_filters
            .insert("*".into(), v1::OfferFilters::default());
    }
    let mut suppressed = subscribe_call(None);
    if let Some(s) = suppressed.subscribe.as_mut() {
        s.suppressed_roles.push("*".into());
    }
    for (call, refusal) in [
        (
            revocable,
            "FrameworkInfo.Capability.type REVOCABLE_RESOURCES is not supported",
        ),
        (filtered, "FrameworkInfo.offer_filters is not supported"),
        (
            suppressed,
            "scheduler.Call.Subscribe.suppressed_roles is not supported",
        ),
    ] {
        let body = Codec::Json.encode(&call).unwrap();
        let mut stream = TcpStream::connect(addr).await.unwrap();
        let head = format!(
            "POST /api/v1/scheduler HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: {}\r\n\r\n",
            body.len()
        );
        stream.write_all(head.as_bytes()).await.unwrap();
        stream.write_all(&body).await.unwrap();
        let mut raw = Vec::new();
        tokio::time::timeout(WAIT, stream.read_to_end(&mut raw))
            .await
            .expect("the stream ends")
            .unwrap();
        let events: Vec<v1::scheduler::Event> = stream_records(&raw)
            .iter()
            .map(|record| Codec::Json.decode(record).unwrap())
            .collect();
        assert_eq!(events.len(), 1, "{events:?}");
        assert_eq!(events[0].r#type(), event::Type::Error);
        let message = &events[0].error.as_ref().unwrap().message;
        assert_eq!(message, &format!("Subscription refused: {refusal}"));
    }
}
