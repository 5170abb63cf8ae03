//! Operators on a real agent: with `--authenticate-http` every endpoint
//! but the probes and the executor APIs needs a principal and secret from
//! `--credentials` (401 with a challenge otherwise), and the
//! `access_sandboxes` ACL decides who reads a framework's sandboxes by the
//! user it runs as (403 otherwise).

mod support;

use agora_proto::agent::Event as AgentEvent;
use agora_proto::{basic_authorization, Credentials};
use support::*;

const ACLS: &str = r#"{"access_sandboxes": [
    {"principals": {"values": ["ops"]}, "users": {"type": "ANY"}},
    {"principals": {"type": "ANY"}, "users": {"type": "NONE"}}
]}"#;

async fn get_as(
    addr: std::net::SocketAddr,
    path: &str,
    authorization: Option<&str>,
) -> agora_client::Response {
    let mut http = agora_client::Http::new();
    if let Some(a) = authorization {
        http = http.with_authorization(a).unwrap();
    }
    agora_client::AgentClient::with_http(http, addr)
        .get(path)
        .await
        .unwrap()
}

#[tokio::test]
async fn operators_authenticate_and_sandboxes_follow_the_acls() {
    let dir = tempfile::tempdir().unwrap();
    let script = sleeper_script(dir.path());
    let work = dir.path().join("work");
    let master = FakeMaster::bind().await;
    let mut config = config(&master.addr(), &work, &script);
    config.credentials = Some(Credentials::parse("ops o-secret\ndev d-secret\n").unwrap());
    config.authenticate_http = true;
    config.acls = std::sync::Arc::new(agora_proto::acls::Acls::parse(ACLS).unwrap());
    let agent = Agent::start(config).await;
    let mut conn = master.accept().await;
    conn.register("agent-1").await;
    let mut info = framework("fw-1", false);
    info.user = "alice".into();
    conn.send(&AgentEvent::RunTask {
        framework: info,
        task: command_task("task-1"),
    })
    .await;
    command_executor_env(&work, "fw-1").await;
    let ops = basic_authorization("ops", "o-secret");
    let dev = basic_authorization("dev", "d-secret");

    // The sandbox, as ops sees it in /state.
    let mut sandbox = None;
    for _ in 0..200 {
        let state: serde_json::Value = get_as(agent.addr, "/state", Some(&ops))
            .await
            .json()
            .unwrap();
        if let Some(path) = state["frameworks"][0]["executors"][0]["sandbox"].as_str() {
            assert_eq!(state["frameworks"][0]["user"], "alice");
            sandbox = Some(std::path::PathBuf::from(path));
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    let sandbox = sandbox.expect("the executor's sandbox in /state");
    for _ in 0..200 {
        if sandbox.is_dir() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    std::fs::write(sandbox.join("stdout"), "secret output\n").unwrap();

    // Without credentials, or with wrong ones: 401 with a challenge.
    for path in [
        "/state",
        "/metrics",
        "/containers",
        "/files/fw-1/task-1/stdout",
    ] {
        let answer = get_as(agent.addr, path, None).await;
        assert_eq!(answer.status, 401, "{path}");
        assert_eq!(
            answer.header("www-authenticate"),
            Some("Basic realm=\"agora\""),
            "{path}"
        );
        let wrong = basic_authorization("ops", "guess");
        assert_eq!(
            get_as(agent.addr, path, Some(&wrong)).await.status,
            401,
            "{path}"
        );
    }
    // Probes stay open.
    assert_eq!(get_as(agent.addr, "/health", None).await.status, 200);
    assert_eq!(get_as(agent.addr, "/version", None).await.status, 200);
    // Authenticated: served; Bearer (the secret as a token) too.
    assert_eq!(get_as(agent.addr, "/metrics", Some(&dev)).await.status, 200);
    assert_eq!(
        get_as(agent.addr, "/state", Some("Bearer d-secret"))
            .await
            .status,
        200
    );
    // The v1 operator API, as /state: 401 without credentials.
    let call = |authorization: Option<String>| async move {
        let mut headers = vec![("content-type", "application/json".to_string())];
        if let Some(a) = authorization {
            headers.push(("authorization", a));
        }
        let headers: Vec<(&str, &str)> = headers.iter().map(|(n, v)| (*n, v.as_str())).collect();
        agora_client::Http::new()
            .request(
                agora_client::Method::POST,
                agent.addr,
                "/api/v1",
                &headers,
                Some(br#"{"type":"GET_TASKS"}"#.to_vec()),
            )
            .await
            .unwrap()
            .status
    };
    assert_eq!(call(None).await, 401);
    assert_eq!(call(Some(dev.clone())).await, 200);
    // The sandbox: ops may read alice's, dev may not.
    let answer = get_as(agent.addr, "/files/fw-1/task-1/stdout", Some(&ops)).await;
    assert_eq!(answer.status, 200);
    assert!(answer.text().contains("secret output"), "{}", answer.text());
    let answer = get_as(agent.addr, "/files/fw-1/task-1/stdout", Some(&dev)).await;
    assert_eq!(answer.status, 403);
    assert!(!answer.text().contains("secret output"));
    assert!(
        answer.text().contains("access_sandboxes"),
        "{}",
        answer.text()
    );
    let answer = get_as(agent.addr, "/files/fw-1/task-1", Some("Bearer d-secret")).await;
    assert_eq!(answer.status, 403);
    agent.stop().await;
}

#[tokio::test]
async fn an_executor_connection_that_never_subscribes_is_closed() {
    let dir = tempfile::tempdir().unwrap();
    let script = sleeper_script(dir.path());
    let master = FakeMaster::bind().await;
    let mut config = config(&master.addr(), &dir.path().join("work"), &script);
    config.executor_subscribe_timeout = std::time::Duration::from_millis(500);
    let agent = Agent::start(config).await;
    let started = std::time::Instant::now();
    let mut silent = ExecClient::connect(&format!("ws://{}/api/executor", agent.addr)).await;
    let frame = silent.next_raw().await;
    let elapsed = started.elapsed();
    match frame {
        Some(tokio_tungstenite::tungstenite::Message::Close(Some(close))) => {
            assert_eq!(u16::from(close.code), 1008);
            assert!(close.reason.contains("no SUBSCRIBE"), "{}", close.reason);
        }
        other => panic!("expected a close frame, got {other:?}"),
    }
    assert!(
        elapsed >= std::time::Duration::from_millis(450),
        "{elapsed:?}"
    );
    // The agent serves on.
    assert_eq!(agent.get("/health").await.0, 200);
    agent.stop().await;
}
