//! Bad input against the real master: malformed frames, unknown message
//! types, impossible resources, oversized frames and peers that vanish
//! mid-message each get a clear answer, and the master keeps serving.

mod support;

use std::io::Write;
use std::time::Duration;

use futures::{SinkExt, StreamExt};
use support::TestCluster;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::Message;

const AGENT: &str = "cpus:2;mem:2048;disk:1024";

type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

async fn connect(addr: &str, path: &str) -> Ws {
    let (ws, _) = tokio_tungstenite::connect_async(format!("ws://{addr}{path}"))
        .await
        .expect("websocket connect");
    ws
}

/// The next text frame, as JSON.
async fn next_json(ws: &mut Ws) -> serde_json::Value {
    loop {
        let msg = tokio::time::timeout(Duration::from_secs(10), ws.next())
            .await
            .expect("an answer within 10 s")
            .expect("connection open")
            .expect("frame");
        if let Message::Text(text) = msg {
            let value: serde_json::Value = serde_json::from_str(&text).expect("master sends JSON");
            if value["type"] != "HEARTBEAT" {
                return value;
            }
        }
    }
}

async fn expect_error(ws: &mut Ws, needle: &str) -> serde_json::Value {
    let event = next_json(ws).await;
    assert_eq!(event["type"], "ERROR", "{event}");
    let message = event["message"].as_str().unwrap_or_default().to_lowercase();
    assert!(
        message.contains(needle),
        "error {message:?} should mention {needle:?}"
    );
    event
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_frames_get_errors_and_the_master_keeps_serving() {
    let cluster = tokio::task::spawn_blocking(|| TestCluster::start(1, AGENT))
        .await
        .unwrap();
    let addr = cluster.master_address();

    let mut ws = connect(&addr, "/api/scheduler").await;
    ws.send(Message::text("this is not json")).await.unwrap();
    let e = expect_error(&mut ws, "malformed").await;
    assert_eq!(e["fatal"], false);
    ws.send(Message::text(r#"{"type":"FLY_TO_THE_MOON"}"#))
        .await
        .unwrap();
    expect_error(&mut ws, "fly_to_the_moon").await;
    ws.send(Message::text(r#"{"type":"DECLINE","offer_ids":[]}"#))
        .await
        .unwrap();
    expect_error(&mut ws, "subscribe").await;
    ws.send(Message::binary(vec![1u8, 2, 3])).await.unwrap();
    expect_error(&mut ws, "binary").await;
    // The same connection still subscribes fine afterwards.
    ws.send(Message::text(
        r#"{"type":"SUBSCRIBE","protocol":1,"framework_info":{"name":"raw","user":"t"}}"#,
    ))
    .await
    .unwrap();
    let subscribed = next_json(&mut ws).await;
    assert_eq!(subscribed["type"], "SUBSCRIBED", "{subscribed}");
    // A launch with impossible resources is refused as malformed.
    ws.send(Message::text(
        r#"{"type":"LAUNCH","offer_ids":["nope"],"tasks":[{"name":"t","task_id":"t","agent_id":"a","resources":[{"name":"cpus","scalar":-1}]}]}"#,
    ))
    .await
    .unwrap();
    let e = loop {
        let e = next_json(&mut ws).await;
        if e["type"] == "ERROR" {
            break e;
        }
    };
    assert!(e["message"].as_str().unwrap().contains("cpus"), "{e}");

    // An agent registering impossible resources is refused with a reason:
    // the agent cannot fix its own configuration, so this is fatal.
    let mut agent = connect(&addr, "/api/agent").await;
    agent
        .send(Message::text(
            r#"{"type":"REGISTER","protocol":1,"agent_info":{"hostname":"h","address":"127.0.0.1:1","resources":[{"name":"cpus","scalar":"abc"}]}}"#,
        ))
        .await
        .unwrap();
    let e = expect_error(&mut agent, "registration refused").await;
    assert_eq!(e["fatal"], true, "{e}");
    // Absurd amounts (above the master's --max-agent-resources, by
    // default 64 Ki cpus) are refused the same way, and never offered.
    let mut agent = connect(&addr, "/api/agent").await;
    agent
        .send(Message::text(
            r#"{"type":"REGISTER","protocol":1,"agent_info":{"hostname":"forged","address":"127.0.0.1:1","resources":[{"name":"cpus","scalar":1000000},{"name":"mem","scalar":1024}]}}"#,
        ))
        .await
        .unwrap();
    let e = expect_error(&mut agent, "--max-agent-resources").await;
    assert_eq!(e["fatal"], true, "{e}");
    assert!(
        e["message"].as_str().unwrap().contains("cpus:1000000"),
        "{e}"
    );
    let state = {
        let cluster = &cluster;
        tokio::task::block_in_place(|| cluster.state())
    };
    let hostnames: Vec<&str> = state["agents"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|a| a["hostname"].as_str())
        .collect();
    assert!(!hostnames.contains(&"forged"), "{hostnames:?}");

    let mut agent = connect(&addr, "/api/agent").await;
    // A wrong protocol version is fatal.
    agent
        .send(Message::text(
            r#"{"type":"REGISTER","protocol":999,"agent_info":{"hostname":"h","address":"127.0.0.1:1","resources":[]}}"#,
        ))
        .await
        .unwrap();
    let e = next_json(&mut agent).await;
    assert_eq!(e["type"], "ERROR", "{e}");
    assert_eq!(e["fatal"], true, "{e}");

    // An oversized frame closes that one connection with 1009.
    let mut big = connect(&addr, "/api/scheduler").await;
    let huge = format!(
        r#"{{"type":"SUBSCRIBE","pad":"{}"}}"#,
        "x".repeat(17 * 1024 * 1024)
    );
    let _ = big.send(Message::text(huge)).await;
    let closed = tokio::time::timeout(Duration::from_secs(20), async {
        while let Some(msg) = big.next().await {
            match msg {
                Ok(Message::Close(Some(frame))) => return Some(frame.code),
                Ok(_) => continue,
                Err(_) => return None,
            }
        }
        None
    })
    .await
    .expect("the oversized connection is closed");
    if let Some(code) = closed {
        assert_eq!(code, CloseCode::Size);
    }

    // A peer that vanishes mid-message: half a WebSocket frame, then EOF.
    {
        let mut raw = std::net::TcpStream::connect(&addr).unwrap();
        write!(
            raw,
            "GET /api/scheduler HTTP/1.1\r\nHost: {addr}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
        )
        .unwrap();
        // A masked text frame header announcing 1000 bytes, and 10 of them.
        raw.write_all(&[0x81, 0xFE, 0x03, 0xE8, 1, 2, 3, 4])
            .unwrap();
        raw.write_all(&[b'x'; 10]).unwrap();
    }

    // The first connection still works: tear its framework down through
    // it, which also gives the offer it holds back to the cluster.
    ws.send(Message::text(r#"{"type":"TEARDOWN"}"#))
        .await
        .unwrap();
    let e = loop {
        let e = next_json(&mut ws).await;
        if e["type"] == "ERROR" {
            break e;
        }
    };
    assert_eq!(e["fatal"], true, "{e}");

    // And a whole job runs.
    let (ok, out, err) = tokio::task::spawn_blocking(move || {
        let result = cluster.run_bin(
            "agora-execute",
            &[
                "--master",
                &addr,
                "--command",
                "true",
                "--instances",
                "3",
                "--timeout",
                "60s",
            ],
            Duration::from_secs(90),
        );
        drop(cluster);
        result
    })
    .await
    .unwrap();
    assert!(
        ok,
        "a job after the bad input failed\nstdout:\n{out}\nstderr:\n{err}"
    );
    assert!(out.contains("finished 3/3"), "{out}");
}

/// Whether the master has closed `stream` (end of file or a reset), or
/// keeps it open (nothing to read yet).
fn closed_by_peer(stream: &std::net::TcpStream) -> bool {
    use std::io::Read;
    stream.set_nonblocking(true).unwrap();
    let mut byte = [0u8; 1];
    let mut reader = stream;
    match reader.read(&mut byte) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => e.kind() != std::io::ErrorKind::WouldBlock,
    }
}

#[test]
fn connections_from_one_address_are_capped_and_other_addresses_still_get_in() {
    let cluster = TestCluster::start_with(1, AGENT, &["--max-connections-per-peer", "100"]);
    let addr: std::net::SocketAddr = cluster.master_address().parse().unwrap();
    // The agent's connection from 127.0.0.1 is established (registered):
    // it does not count. Past 100 idle connections, each new one closes
    // the oldest.
    let mut held: Vec<std::net::TcpStream> = (0..120)
        .map(|_| std::net::TcpStream::connect(addr).expect("connect"))
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    let open: Vec<bool> = held.iter().map(|s| !closed_by_peer(s)).collect();
    assert_eq!(
        open.iter().filter(|o| **o).count(),
        100,
        "connections left open from 127.0.0.1"
    );
    assert!(
        open[20..].iter().all(|o| *o),
        "the newest 100 stay open: {open:?}"
    );

    // Another address is served meanwhile.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut other = rt
        .block_on(async {
            let socket = tokio::net::TcpSocket::new_v4()?;
            socket.bind("127.0.0.2:0".parse().unwrap())?;
            socket.connect(addr).await?.into_std()
        })
        .expect("connect from 127.0.0.2");
    other.set_nonblocking(false).unwrap();
    other
        .write_all(b"GET /health HTTP/1.1\r\nHost: m\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut answer = String::new();
    std::io::Read::read_to_string(&mut other, &mut answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");

    // Once they are closed, the address gets in again, and the agent
    // stayed registered throughout.
    held.clear();
    support::wait_until(
        Duration::from_secs(10),
        "GET /state from 127.0.0.1 after closing the held connections",
        String::new,
        || {
            let (code, body) = support::http_get(addr, "/state").ok()?;
            let state: serde_json::Value = serde_json::from_str(&body).ok()?;
            (code == 200 && state["agents"].as_array()?.len() == 1).then_some(())
        },
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_websocket_that_never_subscribes_is_closed_at_the_authentication_deadline() {
    let cluster = tokio::task::spawn_blocking(|| {
        TestCluster::start_with(1, AGENT, &["--authentication-timeout", "1s"])
    })
    .await
    .unwrap();
    let addr = cluster.master_address();
    let started = std::time::Instant::now();
    let mut silent = connect(&addr, "/api/scheduler").await;
    // Another client is served meanwhile, and subscribes.
    let mut other = connect(&addr, "/api/scheduler").await;
    let subscribe = serde_json::json!({
        "type": "SUBSCRIBE",
        "protocol": agora_proto::PROTOCOL_VERSION,
        "framework_info": {"user": "u", "name": "prompt"},
    });
    other
        .send(Message::Text(subscribe.to_string().into()))
        .await
        .unwrap();
    assert_eq!(next_json(&mut other).await["type"], "SUBSCRIBED");
    // The silent one is closed with a policy close, within the timeout
    // and a margin.
    let close = loop {
        match tokio::time::timeout(Duration::from_secs(5), silent.next())
            .await
            .expect("closed within the deadline and a margin")
        {
            Some(Ok(Message::Close(frame))) => break frame,
            Some(Ok(_)) => continue,
            other => panic!("{other:?}"),
        }
    };
    let elapsed = started.elapsed();
    assert!(elapsed >= Duration::from_millis(900), "{elapsed:?}");
    let frame = close.expect("a close frame with a reason");
    assert_eq!(frame.code, CloseCode::Policy);
    assert!(
        frame.reason.contains("nothing received"),
        "{}",
        frame.reason
    );
    // The subscribed one is still served.
    other
        .send(Message::Text(r#"{"type":"REVIVE","roles":[]}"#.into()))
        .await
        .unwrap();
    drop(cluster);
}
