//! No peer can make the master or an agent hold memory or connections
//! beyond fixed bounds, or wait forever (issue 25, "Exhaustion"): each
//! attack as it was found, against real processes on 127.0.0.1, then
//! the bound that holds and the real framework that still gets through.
//!
//! Figures (RSS, job times) are printed; only bounds are asserted.

mod support;

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use agora_examples::mesos_v1_client as v1c;
use agora_mesos_proto::{convert, Codec};
use agora_proto::FrameworkInfo;
use futures::{SinkExt, StreamExt};
use support::{bin, start_framework, wait_for, wait_until, Proc, SchedEvent, TestCluster};
use tokio_tungstenite::tungstenite::Message;

const AGENT: &str = "cpus:8;mem:8192;disk:4096";
/// What the attack declared and sent.
const DECLARED: usize = 16_001_000;
const SENT: usize = 16_000_000;

// --- helpers ---

/// The process's resident set, in KiB.
fn rss_kib(pid: i32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// Samples a process's RSS every 50 ms, keeping the peak.
struct RssWatch {
    peak: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl RssWatch {
    fn start(pid: i32) -> RssWatch {
        let peak = Arc::new(AtomicU64::new(rss_kib(pid)));
        let stop = Arc::new(AtomicBool::new(false));
        let (p, s) = (peak.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                p.fetch_max(rss_kib(pid), Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        RssWatch {
            peak,
            stop,
            thread: Some(thread),
        }
    }

    fn peak_kib(&self) -> u64 {
        self.peak.load(Ordering::Relaxed)
    }
}

impl Drop for RssWatch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// `GET path` on a connection of its own (a pooled one may be the
/// oldest idle connection the master closes to make room).
fn get_fresh(addr: SocketAddr, path: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .expect("request");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut answer = String::new();
    s.read_to_string(&mut answer).expect("answer");
    let status = answer
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = answer
        .split_once("\r\n\r\n")
        .map_or(String::new(), |(_, b)| b.to_string());
    (status, body)
}

/// The value of the series `series` (name and labels, as printed) in
/// the Prometheus text at `addr`'s `/metrics`.
fn metric(addr: SocketAddr, series: &str) -> f64 {
    let (status, body) = get_fresh(addr, "/metrics");
    assert_eq!(status, 200, "{body}");
    body.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {series} in /metrics:\n{body}"))
}

/// Raises this process's open file limit to at least `want` (children
/// inherit it); false when the hard limit is lower.
fn raise_fd_limit(want: u64) -> bool {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) else {
        return false;
    };
    if soft >= want {
        return true;
    }
    hard >= want && setrlimit(Resource::RLIMIT_NOFILE, want.max(soft), hard).is_ok()
}

/// Whether the peer closed `stream` within `within` (EOF or an error
/// other than a timeout); what it said first, if anything.
fn closed_within(stream: &mut TcpStream, within: Duration) -> (bool, String) {
    let start = Instant::now();
    let mut said = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let left = within.saturating_sub(start.elapsed());
        if left.is_zero() {
            return (false, String::from_utf8_lossy(&said).into_owned());
        }
        stream.set_read_timeout(Some(left)).unwrap();
        match stream.read(&mut buf) {
            Ok(0) => return (true, String::from_utf8_lossy(&said).into_owned()),
            Ok(n) => said.extend_from_slice(&buf[..n]),
            Err(e)
                if e.kind() == std::io::ErrorKind::WouldBlock
                    || e.kind() == std::io::ErrorKind::TimedOut =>
            {
                return (false, String::from_utf8_lossy(&said).into_owned())
            }
            Err(_) => return (true, String::from_utf8_lossy(&said).into_owned()),
        }
    }
}

/// One stalled body: declares [`DECLARED`] bytes, sends up to [`SENT`]
/// (as fast as the server takes them) and stalls. Returns the bytes it
/// got in, how long until the server closed the connection (`None`: it
/// did not within `patience`), and the server's first line.
fn stalled_body(
    addr: SocketAddr,
    path: &str,
    patience: Duration,
) -> (usize, Option<Duration>, String) {
    let start = Instant::now();
    let Ok(mut s) = TcpStream::connect(addr) else {
        return (0, Some(Duration::ZERO), "connect refused".into());
    };
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nAccept: application/json\r\nContent-Length: {DECLARED}\r\n\r\n"
    );
    if s.write_all(head.as_bytes()).is_err() {
        return (0, Some(start.elapsed()), String::new());
    }
    s.set_write_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let chunk = vec![b'x'; 64 * 1024];
    let mut sent = 0;
    while sent < SENT && start.elapsed() < patience {
        match s.write(&chunk[..(SENT - sent).min(chunk.len())]) {
            Ok(n) => sent += n,
            Err(e)
                if e.kind() == std::io::ErrorKind::WouldBlock
                    || e.kind() == std::io::ErrorKind::TimedOut => {}
            Err(_) => break,
        }
    }
    let (closed, said) = closed_within(&mut s, patience.saturating_sub(start.elapsed()));
    let first = said.lines().next().unwrap_or_default().to_string();
    (sent, closed.then(|| start.elapsed()), first)
}

/// 100 stalled bodies at once against `path` of the process `pid` at
/// `addr`: its RSS stays under +100 MB, and each connection is closed
/// within `deadline` (plus slack).
fn attack_with_stalled_bodies(pid: i32, addr: SocketAddr, path: &str, deadline: Duration) {
    let before = rss_kib(pid);
    let watch = RssWatch::start(pid);
    let patience = deadline + Duration::from_secs(20);
    let threads: Vec<_> = (0..100)
        .map(|_| {
            let path = path.to_string();
            std::thread::spawn(move || stalled_body(addr, &path, patience))
        })
        .collect();
    let results: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    let peak = watch.peak_kib();
    drop(watch);
    let full = results.iter().filter(|(sent, ..)| *sent == SENT).count();
    let slowest = results.iter().filter_map(|(_, t, _)| *t).max();
    let answers: std::collections::BTreeMap<&str, usize> =
        results.iter().fold(Default::default(), |mut m, (_, _, a)| {
            *m.entry(a.as_str()).or_default() += 1;
            m
        });
    println!(
        "{path}: RSS {} MiB before, peak {} MiB (+{} MiB); {full} of 100 sent all {SENT} bytes; slowest close after {slowest:?}; answers {answers:?}",
        before / 1024,
        peak / 1024,
        peak.saturating_sub(before) / 1024
    );
    assert!(
        peak.saturating_sub(before) < 100 * 1024,
        "RSS grew by {} MiB",
        peak.saturating_sub(before) / 1024
    );
    for (sent, closed, first) in &results {
        let closed = closed.unwrap_or_else(|| {
            panic!("a connection that sent {sent} bytes is still open after {patience:?}")
        });
        assert!(
            closed <= deadline + Duration::from_secs(8),
            "closed only after {closed:?} (deadline {deadline:?})"
        );
        assert!(
            first.is_empty() || first.starts_with("HTTP/1.1 408"),
            "answered {first:?}"
        );
    }
}

/// What a stalled WebSocket message declared and sent.
const WS_DECLARED: u64 = 16_000_000;
const WS_SENT: usize = 15_000_000;

/// One stalled WebSocket message: upgrades to `path` (raw TCP), writes
/// a text frame's header declaring [`WS_DECLARED`] bytes and up to
/// [`WS_SENT`] bytes of its payload (as fast as the server takes them),
/// and stalls. Returns the bytes it got in and how long until the server
/// closed the connection (`None`: not within `patience`).
fn stalled_message(addr: SocketAddr, path: &str, patience: Duration) -> (usize, Option<Duration>) {
    let start = Instant::now();
    let Ok(mut s) = TcpStream::connect(addr) else {
        return (0, Some(Duration::ZERO));
    };
    let upgrade = format!(
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
    );
    s.write_all(upgrade.as_bytes()).expect("upgrade request");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut answer = Vec::new();
    let mut byte = [0u8; 1];
    while !answer.ends_with(b"\r\n\r\n") {
        match s.read(&mut byte) {
            Ok(1) => answer.push(byte[0]),
            _ => panic!("no upgrade: {}", String::from_utf8_lossy(&answer)),
        }
    }
    assert!(
        answer.starts_with(b"HTTP/1.1 101"),
        "{}",
        String::from_utf8_lossy(&answer)
    );
    // FIN + text; masked, 64-bit length; a zero mask leaves the payload
    // as written.
    let mut header = vec![0x81u8, 0x80 | 127];
    header.extend_from_slice(&WS_DECLARED.to_be_bytes());
    header.extend_from_slice(&[0, 0, 0, 0]);
    s.write_all(&header).expect("frame header");
    s.set_write_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let chunk = vec![b'x'; 64 * 1024];
    let mut sent = 0;
    while sent < WS_SENT && start.elapsed() < patience {
        match s.write(&chunk[..(WS_SENT - sent).min(chunk.len())]) {
            Ok(n) => sent += n,
            Err(e)
                if e.kind() == std::io::ErrorKind::WouldBlock
                    || e.kind() == std::io::ErrorKind::TimedOut => {}
            Err(_) => break,
        }
    }
    let (closed, _) = closed_within(&mut s, patience.saturating_sub(start.elapsed()));
    (sent, closed.then(|| start.elapsed()))
}

fn ws_url(addr: SocketAddr, path: &str) -> String {
    format!("ws://{addr}{path}")
}

/// Subscribes a framework on the native WebSocket, returns its id, and
/// disconnects.
async fn subscribe_and_leave(addr: SocketAddr, name: &str, failover_timeout: f64) -> String {
    let (mut ws, _) = tokio_tungstenite::connect_async(ws_url(addr, "/api/scheduler"))
        .await
        .expect("websocket");
    let subscribe = serde_json::json!({
        "type": "SUBSCRIBE",
        "protocol": agora_proto::PROTOCOL_VERSION,
        "framework_info": {"name": name, "user": "nobody", "failover_timeout": failover_timeout},
    });
    ws.send(Message::text(subscribe.to_string())).await.unwrap();
    loop {
        let frame = tokio::time::timeout(Duration::from_secs(20), ws.next())
            .await
            .expect("an answer in time")
            .expect("open")
            .expect("frame");
        if let Message::Text(text) = frame {
            let event: serde_json::Value = serde_json::from_str(&text).unwrap();
            if event["type"] == "SUBSCRIBED" {
                let _ = ws.close(None).await;
                return event["framework_id"].as_str().unwrap().to_string();
            }
            assert_ne!(event["type"], "ERROR", "{event}");
        }
    }
}

/// An operator `SUBSCRIBE` on `/api/v1` that is never read.
fn operator_stream(addr: SocketAddr) -> TcpStream {
    let body = r#"{"type":"SUBSCRIBE"}"#;
    let mut s = TcpStream::connect(addr).expect("connect");
    let head = format!(
        "POST /api/v1 HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nAccept: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(head.as_bytes()).unwrap();
    s
}

/// Runs `test-framework` with `tasks` tasks; how long it took.
fn run_job(cluster: &TestCluster, tasks: usize) -> Duration {
    let start = Instant::now();
    let (ok, out, err) = cluster.run_bin(
        "test-framework",
        &[
            "--master",
            &cluster.master_address(),
            "--tasks",
            &tasks.to_string(),
            "--task-resources",
            "cpus:0.01;mem:1",
            "--timeout",
            "5m",
        ],
        Duration::from_secs(300),
    );
    assert!(ok, "the job failed\n{out}\n{err}\n{}", cluster.logs());
    start.elapsed()
}

// --- request bodies ---

/// 100 connections each declaring a 16,001,000-byte body, sending
/// 16,000,000 bytes and stalling: the master's RSS stays under +100 MB
/// (it read at most its body budget) and every one is closed by the body
/// timeout; the master serves on. A body declared over the limit is
/// refused before it is read.
#[test]
fn stalled_bodies_leave_the_master_bounded_and_are_closed_by_the_body_timeout() {
    // 16,001,000 bytes at 16 MB/s: one second more than the 2 s timeout.
    let cluster = TestCluster::start_with(
        0,
        AGENT,
        &[
            "--http-body-timeout",
            "2s",
            "--http-body-min-rate",
            "16000000",
        ],
    );
    let addr = cluster.master.addr;
    attack_with_stalled_bodies(
        cluster.master.pid(),
        addr,
        "/api/v1/scheduler",
        Duration::from_secs(3),
    );
    assert_eq!(
        metric(
            addr,
            "agora_master_http_bodies_refused_total{reason=\"timeout\"}"
        ),
        100.0
    );
    assert_eq!(get_fresh(addr, "/health").0, 200);

    // Declared over 16 MiB: 413 before a byte of the body is sent.
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(
        b"POST /api/v1 HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 17000000\r\n\r\n",
    )
    .unwrap();
    let (_, said) = closed_within(&mut s, Duration::from_secs(5));
    assert!(said.starts_with("HTTP/1.1 413"), "{said}");
}

/// The same against an agent's `/api/v1/executor` (its body was read
/// before its token was checked, whatever its flags); with
/// `--authenticate-executors` a call without a token is refused before
/// its body is read.
#[test]
fn stalled_bodies_leave_the_agent_bounded_and_are_closed_by_the_body_timeout() {
    let mut cluster = TestCluster::start_full(
        1,
        AGENT,
        &[],
        &[
            "--http-body-timeout",
            "2s",
            "--http-body-min-rate",
            "16000000",
        ],
    );
    let agent = cluster.agents[0].addr;
    attack_with_stalled_bodies(
        cluster.agents[0].pid(),
        agent,
        "/api/v1/executor",
        Duration::from_secs(3),
    );
    assert_eq!(
        metric(
            agent,
            "agora_agent_http_bodies_refused_total{reason=\"timeout\"}"
        ),
        100.0
    );
    assert_eq!(get_fresh(agent, "/health").0, 200);

    let i = cluster.add_agent(AGENT, &["--authenticate-executors"]);
    let guarded = cluster.agents[i].addr;
    let mut s = TcpStream::connect(guarded).unwrap();
    s.write_all(
        format!("POST /api/v1/executor HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {DECLARED}\r\n\r\n").as_bytes(),
    )
    .unwrap();
    let (_, said) = closed_within(&mut s, Duration::from_secs(5));
    assert!(said.starts_with("HTTP/1.1 401"), "{said}");
}

// --- connections: timeouts, malformed requests ---

/// A connection that says nothing, one idle after a request and one with
/// half its headers are closed after their timeouts; a malformed request
/// gets 400, from the master as from the agent.
#[test]
fn idle_and_half_sent_connections_are_closed_and_malformed_requests_get_400() {
    let flags = [
        "--idle-connection-timeout",
        "1s",
        "--http-header-timeout",
        "1s",
    ];
    let cluster = TestCluster::start_full(1, AGENT, &flags, &flags);
    let addr = cluster.master.addr;
    let patience = Duration::from_secs(6);

    let mut silent = TcpStream::connect(addr).unwrap();
    let mut after_request = TcpStream::connect(addr).unwrap();
    after_request
        .write_all(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut half = TcpStream::connect(addr).unwrap();
    half.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\nAcc")
        .unwrap();
    let start = Instant::now();
    let (closed, _) = closed_within(&mut silent, patience);
    assert!(
        closed,
        "a silent connection is still open after {patience:?}"
    );
    let (closed, said) = closed_within(&mut after_request, patience);
    assert!(closed && said.starts_with("HTTP/1.1 200"), "{said}");
    let (closed, said) = closed_within(&mut half, patience);
    assert!(closed && said.is_empty(), "{said}");
    let took = start.elapsed();
    println!("idle and half-sent connections closed within {took:?}");
    assert!(took >= Duration::from_millis(900), "{took:?}");
    assert!(
        metric(
            addr,
            "agora_master_connections_closed_total{reason=\"idle_timeout\"}"
        ) >= 2.0
    );
    assert!(
        metric(
            addr,
            "agora_master_connections_closed_total{reason=\"header_timeout\"}"
        ) >= 1.0
    );

    for (who, at) in [("master", addr), ("agent", cluster.agents[0].addr)] {
        let mut s = TcpStream::connect(at).unwrap();
        s.write_all(b"GARBAGE\x01 / HTTP/1.1\r\n\r\n").unwrap();
        let (closed, said) = closed_within(&mut s, patience);
        assert!(
            closed && said.starts_with("HTTP/1.1 400"),
            "the {who} answered a malformed request with {said:?}"
        );
    }
}

// --- connection caps ---

/// 1,024 idle connections from 127.0.0.1 (the per-address cap) do not
/// lock out a real framework on the same address: a native SDK
/// framework and a Mesos v1 client subscribe, each new connection closing
/// the oldest idle one, and once they are established more idle
/// connections do not touch them.
#[test]
fn a_framework_gets_through_while_its_address_is_full_of_idle_connections() {
    if !raise_fd_limit(4096) {
        println!("skipped: the open file limit cannot be raised to 4096");
        return;
    }
    let cluster = TestCluster::start_with(
        1,
        AGENT,
        &[
            "--idle-connection-timeout",
            "10m",
            "--max-connections",
            "3000",
        ],
    );
    let addr = cluster.master.addr;
    let idle: Vec<TcpStream> = (0..1024)
        .map(|_| TcpStream::connect(addr).expect("connect"))
        .collect();
    wait_until(
        Duration::from_secs(10),
        "the master to hold 1,024 connections",
        || cluster.logs(),
        || (metric(addr, "agora_master_connections_open") >= 1024.0).then_some(()),
    );

    let (driver, rx) = start_framework(&cluster.master_address(), FrameworkInfo::new("real"));
    wait_for(&rx, Duration::from_secs(20), |e| {
        matches!(e, SchedEvent::Registered(_)).then_some(())
    });
    let rt = tokio::runtime::Runtime::new().unwrap();
    let master = cluster.master_address();
    let subscription = rt.block_on(async {
        let sub = v1c::subscribe(
            &agora_client::Http::new(),
            &master,
            Codec::Json,
            convert::mesos_framework_info(&FrameworkInfo::new("real-v1")),
        )
        .await
        .expect("the v1 framework subscribed");
        sub.calls
            .call(v1c::suppress())
            .await
            .expect("a call went through");
        sub
    });
    let evicted = metric(
        addr,
        "agora_master_connections_closed_total{reason=\"peer_cap\"}",
    );
    println!("idle connections closed to make room: {evicted}");
    assert!(evicted >= 1.0);

    // Another 1,024 idle connections: the frameworks' own stay.
    let more: Vec<TcpStream> = (0..1024)
        .map(|_| TcpStream::connect(addr).expect("connect"))
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    rt.block_on(async {
        subscription
            .calls
            .call(v1c::suppress())
            .await
            .expect("the v1 framework's calls still go through");
    });
    while let Ok(event) = rx.try_recv() {
        assert!(
            !matches!(event, SchedEvent::Disconnected | SchedEvent::Error(_)),
            "the native framework lost its connection: {event:?}"
        );
    }
    let _ = driver.stop(false);
    drop((idle, more));
}

/// Connections from 20 loopback addresses, 40 each, against a master
/// whose open file limit is 512: the global cap (derived from the limit)
/// holds, the master never runs out of file descriptors, and it still
/// serves HTTP and subscribes a framework.
#[test]
fn the_global_connection_cap_holds_with_many_addresses() {
    if !raise_fd_limit(4096) {
        println!("skipped: the open file limit cannot be raised to 4096");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let master_dir = dir.path().join("master");
    std::fs::create_dir_all(&master_dir).unwrap();
    let master_bin = bin("agora-master");
    let args: Vec<String> = [
        "-c",
        "ulimit -n 512 && exec \"$0\" \"$@\"",
        master_bin.to_str().unwrap(),
        "--listen",
        "127.0.0.1:0",
        "--idle-connection-timeout",
        "10m",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let master = Proc::spawn(
        "master",
        std::path::Path::new("/bin/sh"),
        &args,
        &master_dir,
        &dir.path().join("master.log"),
    );
    let addr = master.addr;
    let cluster = TestCluster {
        dir,
        master,
        agents: Vec::new(),
        authorization: None,
        tls: None,
    };
    let cap = agora_net::limits::default_max_connections(Some(512)) as f64;
    let rt = tokio::runtime::Runtime::new().unwrap();
    let held = rt.block_on(async {
        let mut held = Vec::new();
        for host in 2..22u8 {
            for _ in 0..40 {
                let socket = tokio::net::TcpSocket::new_v4().unwrap();
                socket
                    .bind(SocketAddr::from((Ipv4Addr::new(127, 0, 0, host), 0)))
                    .unwrap();
                if let Ok(s) = socket.connect(addr).await {
                    held.push(s);
                }
            }
        }
        held
    });
    std::thread::sleep(Duration::from_millis(500));
    let open = metric(addr, "agora_master_connections_open");
    let closed = metric(
        addr,
        "agora_master_connections_closed_total{reason=\"global_cap\"}",
    );
    println!(
        "{} connections from 20 addresses: {open} open at the master (cap {cap}), {closed} closed to make room",
        held.len()
    );
    assert!(open <= cap + 8.0, "{open} open, cap {cap}");
    assert!(closed >= 1.0);
    assert_eq!(get_fresh(addr, "/health").0, 200);
    let fid = rt.block_on(subscribe_and_leave(addr, "after-the-flood", 0.0));
    assert!(!fid.is_empty());
    let log = cluster.logs();
    assert!(
        !log.contains("Too many open files") && !log.contains("cannot accept"),
        "the master ran out of file descriptors:\n{log}"
    );
    drop(held);
}

// --- disconnected frameworks ---

/// 6,000 frameworks subscribe with `failover_timeout: 1e9` and
/// disconnect: the master keeps at most `--max-disconnected-frameworks`
/// (1,000 by default), the oldest removed first, and its RSS stops
/// growing once the bound is reached.
#[test]
fn disconnected_frameworks_stay_bounded_with_the_oldest_removed_first() {
    let cluster = TestCluster::start(0, AGENT);
    let addr = cluster.master.addr;
    let pid = cluster.master.pid();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let before = rss_kib(pid);
    let mut ids = Vec::new();
    let mut rss_at = Vec::new();
    for round in 0..6 {
        let batch: Vec<String> = rt.block_on(async {
            let mut all = Vec::new();
            for chunk in 0..10 {
                let tasks: Vec<_> = (0..100)
                    .map(|i| {
                        let name = format!("fw-{round}-{chunk}-{i}");
                        tokio::spawn(async move { subscribe_and_leave(addr, &name, 1e9).await })
                    })
                    .collect();
                for t in tasks {
                    all.push(t.await.unwrap());
                }
            }
            all
        });
        ids.extend(batch);
        // Let the master see the disconnections.
        std::thread::sleep(Duration::from_millis(300));
        rss_at.push(rss_kib(pid));
    }
    let state = wait_until(
        Duration::from_secs(20),
        "at most 1,000 frameworks in /state",
        || {
            let state = cluster.state();
            let frameworks = state["frameworks"].as_array().unwrap();
            let connected = frameworks.iter().filter(|f| f["connected"] == true).count();
            format!("{} frameworks, {connected} connected", frameworks.len())
        },
        || {
            let state = cluster.state();
            (state["frameworks"].as_array().unwrap().len() <= 1000).then_some(state)
        },
    );
    let kept: std::collections::HashSet<&str> = state["frameworks"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|f| f["id"].as_str())
        .collect();
    println!(
        "RSS {} MiB before; after each 1,000 frameworks: {:?} MiB; {} kept",
        before / 1024,
        rss_at.iter().map(|k| k / 1024).collect::<Vec<_>>(),
        kept.len()
    );
    assert!(kept.len() <= 1000, "{} kept", kept.len());
    assert!(kept.len() >= 990, "{} kept", kept.len());
    assert!(!kept.contains(ids[0].as_str()), "the oldest was kept");
    assert!(
        kept.contains(ids.last().unwrap().as_str()),
        "the newest was removed"
    );
    assert_eq!(
        metric(addr, "agora_master_disconnected_frameworks_removed_total"),
        (ids.len() - kept.len()) as f64
    );
    // Past the bound (the second thousand on), memory stops growing with
    // the number of frameworks.
    let growth = rss_at[5].saturating_sub(rss_at[1]);
    assert!(
        growth < 64 * 1024,
        "RSS grew {} MiB from 2,000 to 6,000 frameworks",
        growth / 1024
    );
}

// --- WebSocket messages ---

/// 100 stalled WebSocket messages at once against `path` of the process
/// `pid` at `addr`, `meanwhile` run as they stall: its RSS stays under
/// +100 MB, and each connection is closed within `deadline` (plus
/// slack) and counted under `prefix` as `message_timeout`.
fn attack_with_stalled_messages(
    pid: i32,
    addr: SocketAddr,
    path: &str,
    prefix: &str,
    deadline: Duration,
    meanwhile: impl FnOnce() -> String,
) {
    let before = rss_kib(pid);
    let watch = RssWatch::start(pid);
    let patience = deadline + Duration::from_secs(20);
    let attack: Vec<_> = (0..100)
        .map(|_| {
            let path = path.to_string();
            std::thread::spawn(move || stalled_message(addr, &path, patience))
        })
        .collect();
    std::thread::sleep(Duration::from_secs(1));
    let held = metric(addr, &format!("{prefix}_http_body_bytes"));
    let during = meanwhile();
    let results: Vec<_> = attack.into_iter().map(|t| t.join().unwrap()).collect();
    let peak = watch.peak_kib();
    drop(watch);
    let full = results.iter().filter(|(sent, _)| *sent == WS_SENT).count();
    let slowest = results.iter().filter_map(|(_, t)| *t).max();
    println!(
        "{path}: stalled WebSocket messages: RSS {} MiB before, peak {} MiB (+{} MiB); {} MiB of body budget held after 1 s; {full} of 100 sent all {WS_SENT} bytes; slowest close after {slowest:?}; {during}",
        before / 1024,
        peak / 1024,
        peak.saturating_sub(before) / 1024,
        held as u64 / (1024 * 1024),
    );
    assert!(
        held > 0.0 && held <= (48 * 1024 * 1024) as f64,
        "body budget held: {held}"
    );
    assert!(
        peak.saturating_sub(before) < 100 * 1024,
        "RSS grew by {} MiB",
        peak.saturating_sub(before) / 1024
    );
    for (sent, closed) in &results {
        let closed = closed.unwrap_or_else(|| {
            panic!("a connection that sent {sent} bytes is still open after {patience:?}")
        });
        assert!(
            closed <= deadline + Duration::from_secs(8),
            "closed only after {closed:?} (deadline {deadline:?})"
        );
    }
    assert_eq!(
        metric(
            addr,
            &format!("{prefix}_connections_closed_total{{reason=\"message_timeout\"}}")
        ),
        100.0
    );
    assert_eq!(metric(addr, &format!("{prefix}_http_body_bytes")), 0.0);
    assert_eq!(get_fresh(addr, "/health").0, 200);
}

/// 100 connections upgrade to the native scheduler WebSocket, each
/// sending 15 MB of a frame declared as 16 MB and stalling: the master
/// reads no more of them than its body budget (RSS under +100 MB), a
/// real framework subscribes and runs a job meanwhile, and every stalled
/// connection is closed by the message deadline (counted as
/// `message_timeout`).
#[test]
fn stalled_websocket_messages_leave_the_master_bounded_and_are_closed_by_the_deadline() {
    // A stalled message has 6 s plus a second per 16 MB it declares.
    let cluster = TestCluster::start_with(
        1,
        AGENT,
        &[
            "--http-body-timeout",
            "6s",
            "--http-body-min-rate",
            "16000000",
        ],
    );
    attack_with_stalled_messages(
        cluster.master.pid(),
        cluster.master.addr,
        "/api/scheduler",
        "agora_master",
        Duration::from_secs(7),
        || format!("a 10-task job meanwhile took {:?}", run_job(&cluster, 10)),
    );
}

/// The same against an agent's executor WebSocket (`/api/executor`),
/// which anyone may open: the agent stays bounded and closes them.
#[test]
fn stalled_websocket_messages_leave_the_agent_bounded_and_are_closed_by_the_deadline() {
    let cluster = TestCluster::start_full(
        1,
        AGENT,
        &[],
        &[
            "--http-body-timeout",
            "6s",
            "--http-body-min-rate",
            "16000000",
        ],
    );
    attack_with_stalled_messages(
        cluster.agents[0].pid(),
        cluster.agents[0].addr,
        "/api/executor",
        "agora_agent",
        Duration::from_secs(7),
        || format!("a 10-task job meanwhile took {:?}", run_job(&cluster, 10)),
    );
}

// --- streams whose reader stops reading ---

/// 200 operator `SUBSCRIBE` streams that never read: the master's RSS
/// stays bounded and a 2,000-task job still runs (its time with and
/// without them printed). A stream that never reads is cut off once its
/// backlog passes `--operator-stream-backlog`, its connection closed and
/// counted.
#[test]
fn operator_streams_that_never_read_stay_bounded() {
    if !raise_fd_limit(1024) {
        println!("skipped: the open file limit cannot be raised to 1024");
        return;
    }
    let cluster = TestCluster::start_with(
        1,
        "cpus:64;mem:65536;disk:4096",
        &["--allocation-interval", "100ms"],
    );
    let addr = cluster.master.addr;
    let pid = cluster.master.pid();
    let alone = run_job(&cluster, 2000);
    let before = rss_kib(pid);
    let streams: Vec<TcpStream> = (0..200).map(|_| operator_stream(addr)).collect();
    std::thread::sleep(Duration::from_millis(500));
    let watch = RssWatch::start(pid);
    let beside = run_job(&cluster, 2000);
    let peak = watch.peak_kib();
    drop(watch);
    let cut = metric(addr, "agora_master_streams_cut_total{stream=\"operator\"}");
    println!(
        "2,000-task job: {alone:?} alone, {beside:?} beside 200 unread operator streams ({:.2}×); master RSS {} MiB before, peak {} MiB; {cut} streams cut off",
        beside.as_secs_f64() / alone.as_secs_f64(),
        before / 1024,
        peak / 1024
    );
    assert!(
        peak.saturating_sub(before) < 200 * 1024,
        "RSS grew by {} MiB",
        peak.saturating_sub(before) / 1024
    );
    drop(streams);

    // With a small backlog, an unread stream is cut off during a job.
    let cluster = TestCluster::start_with(
        1,
        "cpus:64;mem:65536;disk:4096",
        &[
            "--allocation-interval",
            "100ms",
            "--operator-stream-backlog",
            "65536",
        ],
    );
    let addr = cluster.master.addr;
    let mut unread = operator_stream(addr);
    std::thread::sleep(Duration::from_millis(300));
    run_job(&cluster, 500);
    wait_until(
        Duration::from_secs(20),
        "the unread operator stream to be cut off",
        || cluster.logs(),
        || {
            (metric(addr, "agora_master_streams_cut_total{stream=\"operator\"}") >= 1.0)
                .then_some(())
        },
    );
    // What was sent before the cut can still be read, then the end.
    let mut sink = Vec::new();
    unread
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let ended = unread.read_to_end(&mut sink);
    assert!(
        ended.is_ok(),
        "the cut-off stream is still open after {} bytes: {ended:?}",
        sink.len()
    );
    assert!(cluster.logs().contains("operator event stream cut off"));
}
