//! Authentication against real processes: a master with `--credentials`,
//! `--authenticate-frameworks` and `--authenticate-agents` registers only
//! agents and schedulers that send a principal and secret it knows
//! (`Authorization: Basic`, on the native WebSockets and the Mesos v1
//! API); the others get 401 and are never registered. A framework naming
//! another principal than the one it authenticated as is refused.

mod support;

use std::sync::mpsc;
use std::time::Duration;

use agora_proto::{basic_authorization, Credential, FrameworkInfo};
use agora_scheduler::{DriverConfig, SchedulerDriver};
use support::{wait_for, Recorder, SchedEvent, TestCluster};

const AGENT: &str = "cpus:2;mem:1024";

fn framework(
    master: &str,
    info: FrameworkInfo,
    credential: Option<Credential>,
) -> (SchedulerDriver, mpsc::Receiver<SchedEvent>) {
    let (tx, rx) = mpsc::channel();
    let mut config = DriverConfig::new(master);
    config.credential = credential;
    let driver = SchedulerDriver::new(Recorder(tx), info, config);
    driver.start().expect("driver start");
    (driver, rx)
}

fn credential(principal: &str, secret: &str) -> Option<Credential> {
    Some(Credential {
        principal: principal.into(),
        secret: secret.into(),
    })
}

fn frameworks(cluster: &TestCluster) -> Vec<serde_json::Value> {
    cluster.state()["frameworks"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

#[test]
fn only_known_principals_register_agents_and_frameworks() {
    let secrets = tempfile::tempdir().unwrap();
    let credentials = secrets.path().join("credentials.json");
    std::fs::write(
        &credentials,
        r#"{"credentials":[{"principal":"agents","secret":"a-secret"},{"principal":"web","secret":"w-secret"}]}"#,
    )
    .unwrap();
    let agent_secret = secrets.path().join("agent-secret");
    std::fs::write(&agent_secret, "a-secret\n").unwrap();
    let wrong_secret = secrets.path().join("wrong-secret");
    std::fs::write(&wrong_secret, "guess\n").unwrap();
    let credentials = credentials.display().to_string();
    let mut cluster = TestCluster::start_with(
        0,
        AGENT,
        &[
            "--credentials",
            &credentials,
            "--authenticate-frameworks",
            "--authenticate-agents",
        ],
    );
    let master = cluster.master_address();

    // Agents without credentials, or with a wrong secret, never register.
    cluster.add_agent(AGENT, &[]);
    let wrong = wrong_secret.display().to_string();
    cluster.add_agent(AGENT, &["--principal", "agents", "--secret-file", &wrong]);
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(
        cluster.state()["agents"].as_array().unwrap().len(),
        0,
        "{}",
        cluster.logs()
    );
    // With the right one, it does.
    let right = agent_secret.display().to_string();
    cluster.add_agent(AGENT, &["--principal", "agents", "--secret-file", &right]);
    cluster.wait_agents(1);
    assert_eq!(cluster.state()["agents"].as_array().unwrap().len(), 1);
    assert!(
        cluster.agents[0].log_tail().contains("401"),
        "the refused agent says why: {}",
        cluster.agents[0].log_tail()
    );

    // A framework without credentials, or a wrong secret, is not
    // subscribed; one with them is, under its principal.
    let (anonymous, anonymous_events) = framework(&master, FrameworkInfo::new("anonymous"), None);
    let (guesser, guesser_events) = framework(
        &master,
        FrameworkInfo::new("guesser"),
        credential("web", "guess"),
    );
    let (web, web_events) = framework(
        &master,
        FrameworkInfo::new("web"),
        credential("web", "w-secret"),
    );
    wait_for(&web_events, Duration::from_secs(20), |e| match e {
        SchedEvent::Registered(id) => Some(id.clone()),
        _ => None,
    });
    std::thread::sleep(Duration::from_secs(1));
    for events in [&anonymous_events, &guesser_events] {
        while let Ok(event) = events.try_recv() {
            assert!(
                !matches!(event, SchedEvent::Registered(_)),
                "an unauthenticated framework registered"
            );
        }
    }
    let names: Vec<(String, String)> = frameworks(&cluster)
        .iter()
        .map(|f| {
            (
                f["name"].as_str().unwrap_or_default().to_string(),
                f["principal"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect();
    assert_eq!(names, vec![("web".to_string(), "web".to_string())]);

    // Naming another principal than the one authenticated is refused.
    let mut info = FrameworkInfo::new("impostor");
    info.principal = Some("agents-admin".into());
    let (impostor, impostor_events) = framework(&master, info, credential("web", "w-secret"));
    let error = wait_for(&impostor_events, Duration::from_secs(20), |e| match e {
        SchedEvent::Error(message) => Some(message.clone()),
        SchedEvent::Registered(_) => panic!("the impostor registered"),
        _ => None,
    });
    assert!(error.contains("not the authenticated principal"), "{error}");

    // The Mesos v1 API: 401 with a challenge without credentials, 200
    // (the event stream) with them.
    let subscribe =
        r#"{"type":"SUBSCRIBE","subscribe":{"framework_info":{"user":"u","name":"v1"}}}"#;
    let (status, head) = post_head(&master, subscribe, None);
    assert_eq!(status, 401, "{head}");
    assert!(
        head.to_ascii_lowercase()
            .contains("www-authenticate: basic realm=\"agora\""),
        "{head}"
    );
    let authorization = basic_authorization("web", "w-secret");
    let (status, head) = post_head(&master, subscribe, Some(&authorization));
    assert_eq!(status, 200, "{head}");
    let (status, _) = post_head(
        &master,
        subscribe,
        Some(&basic_authorization("web", "guess")),
    );
    assert_eq!(status, 401);

    for driver in [anonymous, guesser, web, impostor] {
        let _ = driver.abort();
    }
}

/// Posts `body` to the master's Mesos scheduler endpoint and reads the
/// answer's status and head only (a SUBSCRIBE's body never ends).
fn post_head(master: &str, body: &str, authorization: Option<&str>) -> (u16, String) {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(master).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let auth = authorization
        .map(|a| format!("Authorization: {a}\r\n"))
        .unwrap_or_default();
    write!(
        stream,
        "POST /api/v1/scheduler HTTP/1.1\r\nHost: {master}\r\nContent-Type: application/json\r\nAccept: application/json\r\n{auth}Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match stream.read(&mut byte) {
            Ok(1) => head.push(byte[0]),
            _ => break,
        }
    }
    let head = String::from_utf8_lossy(&head).into_owned();
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (status, head)
}

/// `GET path` from the master with `authorization`: status and the
/// `WWW-Authenticate` challenge.
fn get_as(cluster: &TestCluster, path: &str, authorization: Option<&str>) -> (u16, String) {
    let headers: Vec<(&str, &str)> = authorization
        .iter()
        .map(|a| ("authorization", *a))
        .collect();
    let response = agora_client::blocking::request(
        agora_client::Method::GET,
        cluster.master.addr,
        path,
        &headers,
        None,
    )
    .unwrap();
    let challenge = response
        .header("www-authenticate")
        .unwrap_or_default()
        .to_string();
    (response.status, challenge)
}

#[test]
fn operators_authenticate_on_http_and_every_client_takes_credentials() {
    let secrets = tempfile::tempdir().unwrap();
    let credentials = secrets.path().join("credentials");
    std::fs::write(
        &credentials,
        "# principal secret\nagents a-secret\nops o-secret\n",
    )
    .unwrap();
    let agent_secret = secrets.path().join("agent-secret");
    std::fs::write(&agent_secret, "a-secret\n").unwrap();
    let ops_secret = secrets.path().join("ops-secret");
    std::fs::write(&ops_secret, "o-secret\n").unwrap();
    let (credentials, agent_secret, ops_secret) = (
        credentials.display().to_string(),
        agent_secret.display().to_string(),
        ops_secret.display().to_string(),
    );
    let ops = basic_authorization("ops", "o-secret");
    let mut cluster = TestCluster::start_as(
        0,
        AGENT,
        &[
            "--credentials",
            &credentials,
            "--authenticate-frameworks",
            "--authenticate-agents",
            "--authenticate-http",
        ],
        &[],
        Some(ops.clone()),
    );
    cluster.add_agent(
        AGENT,
        &["--principal", "agents", "--secret-file", &agent_secret],
    );
    cluster.wait_agents(1);
    let master = cluster.master_address();

    // Operator endpoints: 401 with a challenge without credentials or
    // with wrong ones; Basic and Bearer (the secret as a token) pass.
    for path in [
        "/state",
        "/api/v1/agents",
        "/metrics",
        "/master/state",
        "/metrics/snapshot",
        "/",
    ] {
        let (status, challenge) = get_as(&cluster, path, None);
        assert_eq!(
            (status, challenge.as_str()),
            (401, "Basic realm=\"agora\""),
            "{path}"
        );
        assert_eq!(
            get_as(&cluster, path, Some("Bearer guess")).0,
            401,
            "{path}"
        );
        assert_eq!(get_as(&cluster, path, Some(&ops)).0, 200, "{path}");
        assert_eq!(
            get_as(&cluster, path, Some("Bearer o-secret")).0,
            200,
            "{path}"
        );
    }
    // Probes and the leader lookup stay open.
    for path in ["/health", "/version"] {
        assert_eq!(get_as(&cluster, path, None).0, 200, "{path}");
    }
    // The Mesos operator API too.
    let call = br#"{"type":"GET_HEALTH"}"#.to_vec();
    let post = |authorization: Option<&str>| {
        let mut headers = vec![("content-type", "application/json")];
        headers.extend(authorization.map(|a| ("authorization", a)));
        agora_client::blocking::request(
            agora_client::Method::POST,
            cluster.master.addr,
            "/api/v1",
            &headers,
            Some(call.clone()),
        )
        .unwrap()
        .status
    };
    assert_eq!(post(None), 401);
    assert_eq!(post(Some(&ops)), 200);

    // The CLI: refused without credentials, served with them.
    let (ok, _, err) = cluster.run_bin(
        "agora",
        &["--master", &master, "agents"],
        Duration::from_secs(30),
    );
    assert!(!ok && err.contains("401"), "{err}");
    let (ok, out, err) = cluster.run_bin(
        "agora",
        &[
            "--master",
            &master,
            "--principal",
            "ops",
            "--secret-file",
            &ops_secret,
            "agents",
        ],
        Duration::from_secs(30),
    );
    assert!(ok, "{err}");
    assert!(out.contains("127.0.0.1"), "{out}");

    // agora-execute: without credentials never registered (gives up at
    // its timeout); with them, the job runs.
    let (ok, out, _) = cluster.run_bin(
        "agora-execute",
        &[
            "--master",
            &master,
            "--command",
            "true",
            "--timeout",
            "3s",
            "--quiet",
        ],
        Duration::from_secs(30),
    );
    assert!(!ok, "{out}");
    let (ok, out, err) = cluster.run_bin(
        "agora-execute",
        &[
            "--master",
            &master,
            "--command",
            "true",
            "--instances",
            "2",
            "--principal",
            "ops",
            "--secret-file",
            &ops_secret,
            "--quiet",
        ],
        Duration::from_secs(60),
    );
    assert!(ok, "{out}\n{err}");
    // agora-local with a principal: a whole authenticating cluster that
    // runs the job as that principal.
    let work = secrets.path().join("local");
    let (ok, out, err) = cluster.run_bin(
        "agora-local",
        &[
            "--agents",
            "1",
            "--work-dir",
            &work.display().to_string(),
            "--command",
            "true",
            "--instances",
            "2",
            "--principal",
            "local",
            "--secret-file",
            &ops_secret,
            "--quiet",
        ],
        Duration::from_secs(60),
    );
    assert!(ok, "{out}\n{err}");
    assert!(out.contains("2/2") || out.contains("finished"), "{out}");
}
