//! `GET /files/…` on a real agent: a launched executor's sandbox files are
//! readable with offsets, directory listings work, and every attempt to
//! leave the sandbox (`..` in any spelling, absolute paths, symlinks planted
//! in the sandbox, invalid ids) is refused with 403 or 404. Also the JSON
//! shape of the agent's `/metrics` and `/state` additions.

mod support;

use agora_proto::agent::Event as AgentEvent;
use support::*;

/// The keys of a JSON object, sorted.
fn keys(v: &serde_json::Value) -> Vec<String> {
    let mut k: Vec<String> = v
        .as_object()
        .unwrap_or_else(|| panic!("not an object: {v}"))
        .keys()
        .cloned()
        .collect();
    k.sort();
    k
}

#[tokio::test]
async fn sandbox_files_are_served_and_confined() {
    let dir = tempfile::tempdir().unwrap();
    let script = sleeper_script(dir.path());
    let work = dir.path().join("work");
    let master = FakeMaster::bind().await;
    let agent = Agent::start(config(&master.addr(), &work, &script)).await;
    let mut conn = master.accept().await;
    conn.register("agent-1").await;
    conn.send(&AgentEvent::RunTask {
        framework: framework("fw-1", false),
        task: command_task("task-1"),
    })
    .await;
    command_executor_env(&work, "fw-1").await;
    // The task's own sandbox, which the agent makes; write what a command
    // would.
    let state = agent
        .state_when(|s| s["frameworks"][0]["executors"][0]["sandbox"].is_string())
        .await;
    let sandbox = std::path::PathBuf::from(
        state["frameworks"][0]["executors"][0]["sandbox"]
            .as_str()
            .unwrap(),
    );
    for _ in 0..200 {
        if sandbox.is_dir() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    std::fs::write(sandbox.join("stdout"), "started\n").unwrap();
    std::fs::write(sandbox.join("stderr"), "").unwrap();
    std::fs::write(sandbox.join("data.txt"), "0123456789").unwrap();

    // A whole file, then windows of it.
    let (code, body) = agent.get("/files/fw-1/task-1/stdout").await;
    assert_eq!(code, 200, "{body}");
    let chunk: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        keys(&chunk),
        ["data", "eof", "length", "offset", "path", "run_id", "size"]
    );
    assert!(chunk["data"].as_str().unwrap().contains("started"));
    assert_eq!(chunk["eof"], true);
    let (code, body) = agent
        .get("/files/fw-1/task-1/data.txt?offset=3&length=4")
        .await;
    assert_eq!(code, 200);
    let chunk: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(chunk["data"], "3456");
    assert_eq!(chunk["offset"], 3);
    assert_eq!(chunk["length"], 4);
    assert_eq!(chunk["size"], 10);
    assert_eq!(chunk["eof"], false);
    let (_, body) = agent.get("/files/fw-1/task-1/data.txt?offset=50").await;
    let chunk: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        (chunk["data"].as_str(), chunk["eof"].as_bool()),
        (Some(""), Some(true))
    );

    // The sandbox's root, listed.
    let (code, body) = agent.get("/files/fw-1/task-1").await;
    assert_eq!(code, 200, "{body}");
    let listing: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(keys(&listing), ["entries", "path", "run_id"]);
    let names: Vec<&str> = listing["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    assert!(
        names.contains(&"stdout") && names.contains(&"stderr"),
        "{names:?}"
    );
    assert_eq!(
        keys(&listing["entries"][0]),
        ["dir", "mtime", "name", "size"]
    );

    // Secrets outside the sandbox, and symlinks an executor could plant.
    let secret = dir.path().join("secret.txt");
    std::fs::write(&secret, "top secret").unwrap();
    std::os::unix::fs::symlink(&secret, sandbox.join("leak")).unwrap();
    std::os::unix::fs::symlink(dir.path(), sandbox.join("up")).unwrap();
    std::os::unix::fs::symlink("../../../../../../..", sandbox.join("rel")).unwrap();
    // A symlink that stays inside is fine.
    std::os::unix::fs::symlink("data.txt", sandbox.join("alias")).unwrap();
    let (code, body) = agent.get("/files/fw-1/task-1/alias").await;
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("0123456789"));

    let escapes = [
        "/files/fw-1/task-1/../../../../../secret.txt",
        "/files/fw-1/task-1/%2e%2e/%2e%2e/secret.txt",
        "/files/fw-1/task-1/..%2f..%2fsecret.txt",
        "/files/fw-1/task-1//etc/passwd",
        "/files/fw-1/task-1/%2fetc%2fpasswd",
        "/files/fw-1/task-1/./stdout",
        "/files/fw-1/task-1/leak",
        "/files/fw-1/task-1/up/secret.txt",
        "/files/fw-1/task-1/rel/etc/passwd",
        "/files/fw-1/task-1/stdout?run=..",
        "/files/../../secret.txt",
        "/files/fw-1/../../secret.txt",
        "/files/%2e%2e/task-1/stdout",
        "/files/fw-1/%2e%2e/stdout",
    ];
    for path in escapes {
        let (code, body) = agent.get(path).await;
        assert!(code == 403 || code == 404, "{path} answered {code}: {body}");
        assert!(!body.contains("top secret"), "{path} leaked: {body}");
        assert!(!body.contains("root:"), "{path} leaked: {body}");
    }
    // The planted symlinks are refused as escapes (403), not as missing.
    for path in ["leak", "up/secret.txt"] {
        let (code, _) = agent.get(&format!("/files/fw-1/task-1/{path}")).await;
        assert_eq!(code, 403, "{path}");
    }
    // A sibling directory whose path starts with the sandbox's (a string
    // prefix check would let it through; the check is by components).
    let run = sandbox.file_name().unwrap().to_str().unwrap().to_string();
    let sibling = sandbox.with_file_name(format!("{run}-evil"));
    std::fs::create_dir_all(&sibling).unwrap();
    std::fs::write(sibling.join("secret.txt"), "top secret").unwrap();
    std::os::unix::fs::symlink(&sibling, sandbox.join("sib")).unwrap();
    for path in [
        format!("/files/fw-1/task-1/sib/secret.txt?run={run}"),
        format!("/files/fw-1/task-1/sib?run={run}"),
    ] {
        let (code, body) = agent.get(&path).await;
        assert_eq!(code, 403, "{path}: {body}");
        assert!(!body.contains("top secret"), "{path} leaked: {body}");
    }
    std::fs::remove_dir_all(&sibling).unwrap();
    // Only the master's web UI (its origin) may read answers from a
    // page: its Origin is echoed, never `*`; another site's gets nothing.
    let http = agora_client::Http::new();
    let master_origin = format!("http://{}", master.addr());
    for (origin, allowed) in [
        (master_origin.as_str(), true),
        ("http://evil.example", false),
        ("null", false),
    ] {
        let answer = http
            .request(
                agora_client::Method::GET,
                agent.addr,
                "/files/fw-1/task-1/stdout",
                &[("Origin", origin)],
                None,
            )
            .await
            .unwrap();
        assert_eq!(answer.status, 200);
        let acao = answer
            .headers
            .get("access-control-allow-origin")
            .map(|v| v.to_str().unwrap().to_string());
        assert_eq!(acao, allowed.then(|| origin.to_string()), "{origin}");
    }
    let answer = http
        .request(agora_client::Method::GET, agent.addr, "/state", &[], None)
        .await
        .unwrap();
    assert!(answer.headers.get("access-control-allow-origin").is_none());

    let (code, _) = agent.get("/files/fw-1/task-1/no-such-file").await;
    assert_eq!(code, 404);
    let (code, _) = agent.get("/files/fw-1/nobody/stdout").await;
    assert_eq!(code, 404);

    // /metrics counts them; /state shows sandboxes.
    let (code, body) = agent.get("/metrics").await;
    assert_eq!(code, 200);
    for name in [
        "agora_agent_registered 1",
        "agora_agent_executors{state=\"running\"} 1",
        "agora_agent_tasks{state=\"TASK_STAGING\"} 1",
        "agora_agent_resources{name=\"cpus\",kind=\"total\"} 2",
        "agora_agent_resources{name=\"cpus\",kind=\"used\"} 0.5",
        "agora_agent_files_requests_total{outcome=\"read\"}",
        "agora_agent_files_requests_total{outcome=\"forbidden\"}",
        "# TYPE agora_agent_status_updates_acknowledged_total counter",
        "agora_agent_status_updates_retried_total{reason=\"timeout\"} 0",
        "agora_agent_status_updates_retried_total{reason=\"registered\"} 0",
    ] {
        assert!(body.contains(name), "missing {name} in\n{body}");
    }
    let forbidden = body
        .lines()
        .find(|l| l.starts_with("agora_agent_files_requests_total{outcome=\"forbidden\"}"))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap();
    assert!(forbidden >= 10.0, "{forbidden}");

    let (code, body) = agent.get("/state").await;
    assert_eq!(code, 200);
    let state: serde_json::Value = serde_json::from_str(&body).unwrap();
    let ex = &state["frameworks"][0]["executors"][0];
    assert_eq!(ex["sandbox"], sandbox.to_string_lossy().as_ref());

    agent.stop().await;
}
