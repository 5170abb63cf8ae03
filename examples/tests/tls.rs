//! TLS against real processes: a master and agent serving TLS with
//! certificates from a CA made for the test (rcgen), agents registering
//! and jobs running over `wss://` with client certificates, executors
//! reaching their agent over `wss://`; no silent downgrade (a plaintext
//! client is refused unless `--tls-allow-plaintext`); a client
//! certificate from another CA is refused at the handshake; a client that
//! never starts its handshake does not hold up others and is closed at
//! the deadline; `agora-local --tls` runs a job.

mod support;

use std::io::{Read, Write};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use agora_net::tls::rustls::ClientConfig;
use agora_net::{LocalPki, TlsOptions};
use support::TestCluster;

const AGENT: &str = "cpus:2;mem:1024";

struct Pki {
    /// Holds the files.
    _dir: tempfile::TempDir,
    /// The cluster's CA and a certificate for 127.0.0.1.
    ours: TlsOptions,
    /// Another CA's certificate for 127.0.0.1 (its own CA trusted).
    theirs: TlsOptions,
}

fn pki() -> Pki {
    let dir = tempfile::tempdir().unwrap();
    let ours = LocalPki::new("cluster CA")
        .unwrap()
        .write(
            &dir.path().join("ours"),
            "node",
            &["localhost", "127.0.0.1"],
        )
        .unwrap();
    let theirs = LocalPki::new("another CA")
        .unwrap()
        .write(
            &dir.path().join("theirs"),
            "node",
            &["localhost", "127.0.0.1"],
        )
        .unwrap();
    Pki {
        _dir: dir,
        ours,
        theirs,
    }
}

fn path(p: &Option<std::path::PathBuf>) -> String {
    p.as_ref().unwrap().display().to_string()
}

/// `--tls-cert … --tls-key … --tls-ca …` of `options`.
fn flags(options: &TlsOptions) -> Vec<String> {
    vec![
        "--tls-cert".into(),
        path(&options.cert),
        "--tls-key".into(),
        path(&options.key),
        "--tls-ca".into(),
        path(&options.ca),
    ]
}

fn client(options: &TlsOptions) -> Arc<ClientConfig> {
    options.client().unwrap().unwrap()
}

/// `GET /health` over HTTPS with `tls`: the status, or the error.
fn https_health(addr: std::net::SocketAddr, tls: Arc<ClientConfig>) -> Result<u16, String> {
    let http = agora_client::Http::new()
        .with_tls(tls)
        .with_timeout(Duration::from_secs(5));
    agora_client::blocking::block_on(async move { http.get(addr, "/health").await })
        .map(|r| r.status)
        .map_err(|e| e.to_string())
}

/// `GET /health` in plaintext: the status line, or what happened.
fn plain_health(addr: std::net::SocketAddr) -> String {
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let _ = stream.write_all(b"GET /health HTTP/1.1\r\nHost: m\r\nConnection: close\r\n\r\n");
    let mut answer = String::new();
    match stream.read_to_string(&mut answer) {
        Ok(_) => answer.lines().next().unwrap_or("closed").to_string(),
        Err(e) => format!("error: {e}"),
    }
}

fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

#[test]
fn a_cluster_runs_over_mutual_tls_and_refuses_what_is_not() {
    let pki = pki();
    let mut master_flags = flags(&pki.ours);
    master_flags.extend([
        "--tls-require-client-cert".to_string(),
        "--authentication-timeout".to_string(),
        "2s".to_string(),
    ]);
    let agent_flags = flags(&pki.ours);
    let ours = client(&pki.ours);
    let cluster = TestCluster::start_secure(
        1,
        AGENT,
        &strs(&master_flags),
        &strs(&agent_flags),
        None,
        Some(ours.clone()),
    );
    let addr = cluster.master.addr;
    let master = cluster.master_address();

    // A job over wss://, its executors reaching their agent over wss://.
    let mut execute = vec![
        "--master".to_string(),
        master.clone(),
        "--command".to_string(),
        "echo hi".to_string(),
        "--instances".to_string(),
        "3".to_string(),
        "--quiet".to_string(),
    ];
    execute.extend(flags(&pki.ours));
    let (ok, out, err) = cluster.run_bin("agora-execute", &strs(&execute), Duration::from_secs(60));
    assert!(ok, "{out}\n{err}\n{}", cluster.logs());
    assert!(out.contains("finished 3/3"), "{out}");

    // The CLI over https://.
    let mut cli = flags(&pki.ours);
    cli.extend(["--master".to_string(), master.clone(), "agents".to_string()]);
    let (ok, out, err) = cluster.run_bin("agora", &strs(&cli), Duration::from_secs(30));
    assert!(ok && out.contains("127.0.0.1"), "{out}\n{err}");
    // A task's output, read from its agent's sandbox over https://.
    let mut log = flags(&pki.ours);
    log.extend(
        ["--master", &master, "task", "log", "agora-execute-0"]
            .iter()
            .map(|s| s.to_string()),
    );
    let (ok, out, err) = cluster.run_bin("agora", &strs(&log), Duration::from_secs(30));
    assert!(ok && out.contains("hi"), "{out}\n{err}");

    // No silent downgrade: a plaintext client gets no answer.
    let answer = plain_health(addr);
    assert!(!answer.starts_with("HTTP/1.1 200"), "{answer}");
    // A client without a certificate, or with one from another CA, is
    // refused at the handshake; one that does not trust our CA refuses
    // the server.
    let no_cert = client(&TlsOptions {
        ca: pki.ours.ca.clone(),
        ..TlsOptions::default()
    });
    assert!(https_health(addr, no_cert).is_err());
    let other_ca_cert = client(&TlsOptions {
        ca: pki.ours.ca.clone(),
        ..pki.theirs.clone()
    });
    assert!(https_health(addr, other_ca_cert).is_err());
    assert!(https_health(addr, client(&pki.theirs)).is_err());
    assert_eq!(https_health(addr, ours.clone()), Ok(200));

    // An agent without TLS never registers.
    let mut cluster = cluster;
    cluster.add_agent(AGENT, &[]);
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(cluster.state()["agents"].as_array().unwrap().len(), 1);

    // A client that connects and never says a word holds only its own
    // connection, closed at the deadline.
    let silent = std::net::TcpStream::connect(addr).unwrap();
    let started = std::time::Instant::now();
    assert_eq!(https_health(addr, ours.clone()), Ok(200));
    silent
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut byte = [0u8; 1];
    let read = (&silent).read(&mut byte);
    assert!(
        matches!(read, Ok(0)) || read.is_err(),
        "the silent connection is closed: {read:?}"
    );
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(1500) && waited < Duration::from_secs(8),
        "{waited:?}"
    );
}

#[test]
fn plaintext_is_served_beside_tls_only_when_allowed() {
    let pki = pki();
    let mut master_flags = flags(&pki.ours);
    master_flags.push("--tls-allow-plaintext".into());
    let cluster = TestCluster::start_with(1, AGENT, &strs(&master_flags));
    let addr = cluster.master.addr;
    assert!(plain_health(addr).starts_with("HTTP/1.1 200"));
    assert_eq!(https_health(addr, client(&pki.ours)), Ok(200));
    assert_eq!(cluster.state()["agents"].as_array().unwrap().len(), 1);
}

#[test]
fn agora_local_runs_a_job_over_tls() {
    let work = tempfile::tempdir().unwrap();
    let cluster = TestCluster::start(0, AGENT);
    let (ok, out, err) = cluster.run_bin(
        "agora-local",
        &[
            "--agents",
            "1",
            "--tls",
            "--work-dir",
            &work.path().display().to_string(),
            "--command",
            "echo hi",
            "--instances",
            "2",
            "--quiet",
        ],
        Duration::from_secs(60),
    );
    assert!(ok, "{out}\n{err}");
    assert!(out.contains("finished 2/2"), "{out}");
    assert!(Path::new(&work.path().join("tls/ca.pem")).exists());
}
