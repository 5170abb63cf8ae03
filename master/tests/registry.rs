//! The local registry across master restarts: a master served in-process
//! with a `work_dir`, stopped and started again on the same directory,
//! spoken to over real WebSockets by hand-written agents and schedulers.
//! (The same with real processes and a SIGKILL is in
//! `examples/tests/fault_tolerance.rs`.)

use std::path::Path;
use std::time::Duration;

use agora_proto::{
    agent, scheduler, AgentId, AgentInfo, FrameworkId, FrameworkInfo, Resources, PROTOCOL_VERSION,
};
use futures::{SinkExt, StreamExt};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

type Ws = WebSocketStream<MaybeTlsStream<TcpStream>>;

const WAIT: Duration = Duration::from_secs(10);

struct Master {
    addr: std::net::SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<Result<(), agora_master::MasterError>>,
}

async fn start(work_dir: &Path, tweak: impl FnOnce(&mut agora_master::Config)) -> Master {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let mut config = agora_master::Config {
        work_dir: Some(work_dir.to_path_buf()),
        allocation_interval: Duration::from_millis(100),
        ..Default::default()
    };
    tweak(&mut config);
    let task = tokio::spawn(agora_master::run(listener, config, async move {
        let _ = stopped.await;
    }));
    Master {
        addr,
        stop: Some(stop),
        task,
    }
}

impl Master {
    async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let result = tokio::time::timeout(WAIT, self.task)
            .await
            .unwrap()
            .unwrap();
        assert!(result.is_ok(), "{result:?}");
    }
}

async fn connect(addr: std::net::SocketAddr, path: &str) -> Ws {
    let (ws, _) = tokio_tungstenite::connect_async(format!("ws://{addr}{path}"))
        .await
        .unwrap();
    ws
}

async fn send<T: serde::Serialize>(ws: &mut Ws, msg: &T) {
    ws.send(Message::Text(agora_proto::encode(msg).into()))
        .await
        .unwrap();
}

async fn next_text(ws: &mut Ws) -> String {
    loop {
        match tokio::time::timeout(WAIT, ws.next()).await.unwrap() {
            Some(Ok(Message::Text(t))) => return t.to_string(),
            Some(Ok(Message::Ping(_) | Message::Pong(_))) => continue,
            other => panic!("expected a text frame, got {other:?}"),
        }
    }
}

async fn next_sched(ws: &mut Ws) -> scheduler::Event {
    loop {
        match agora_proto::decode(&next_text(ws).await).unwrap() {
            scheduler::Event::Heartbeat | scheduler::Event::Offers { .. } => continue,
            e => return e,
        }
    }
}

async fn next_agent(ws: &mut Ws) -> agent::Event {
    loop {
        match agora_proto::decode(&next_text(ws).await).unwrap() {
            agent::Event::Ping => continue,
            e => return e,
        }
    }
}

fn agent_info(id: Option<AgentId>) -> AgentInfo {
    AgentInfo {
        id,
        hostname: "host".into(),
        address: "127.0.0.1:1".into(),
        resources: Resources::parse("cpus:2;mem:1024").unwrap(),
        attributes: Default::default(),
    }
}

/// Registers (or re-registers, with `id`) an agent; returns its
/// connection and the first event.
async fn register(addr: std::net::SocketAddr, id: Option<AgentId>) -> (Ws, agent::Event) {
    let mut ws = connect(addr, "/api/agent").await;
    send(
        &mut ws,
        &agent::Call::Register {
            protocol: PROTOCOL_VERSION,
            agent_info: agent_info(id),
            tasks: vec![],
            executors: vec![],
            frameworks: vec![],
        },
    )
    .await;
    let event = next_agent(&mut ws).await;
    (ws, event)
}

async fn subscribe(
    addr: std::net::SocketAddr,
    id: Option<FrameworkId>,
    failover_timeout: f64,
) -> (Ws, scheduler::Event) {
    let mut ws = connect(addr, "/api/scheduler").await;
    let mut info = FrameworkInfo::new("fw");
    info.id = id;
    info.failover_timeout = failover_timeout;
    send(
        &mut ws,
        &scheduler::Call::Subscribe {
            protocol: PROTOCOL_VERSION,
            framework_info: info,
            force: false,
        },
    )
    .await;
    let event = next_sched(&mut ws).await;
    (ws, event)
}

fn registered_id(event: &agent::Event) -> AgentId {
    match event {
        agent::Event::Registered { agent_id, .. } => agent_id.clone(),
        e => panic!("expected REGISTERED, got {e:?}"),
    }
}

fn subscribed_id(event: &scheduler::Event) -> FrameworkId {
    match event {
        scheduler::Event::Subscribed { framework_id, .. } => framework_id.clone(),
        e => panic!("expected SUBSCRIBED, got {e:?}"),
    }
}

#[tokio::test]
async fn restarted_master_reloads_agents_and_frameworks_and_removes_the_absent() {
    let dir = tempfile::tempdir().unwrap();
    let timeout = |c: &mut agora_master::Config| {
        c.agent_reregister_timeout = Duration::from_millis(1500);
    };
    let master = start(dir.path(), timeout).await;
    let (_a, event) = register(master.addr, None).await;
    let back = registered_id(&event);
    let (_b, event) = register(master.addr, None).await;
    let absent = registered_id(&event);
    let (_s, event) = subscribe(master.addr, None, 3600.0).await;
    let fid = subscribed_id(&event);
    master.stop().await;

    let master = start(dir.path(), timeout).await;
    let (_a, event) = register(master.addr, Some(back.clone())).await;
    assert!(
        matches!(&event, agent::Event::Registered { reregistered: true, agent_id, .. } if *agent_id == back),
        "{event:?}"
    );
    let (mut s, event) = subscribe(master.addr, Some(fid.clone()), 3600.0).await;
    assert!(
        matches!(&event, scheduler::Event::Subscribed { reregistered: true, framework_id, .. } if *framework_id == fid),
        "{event:?}"
    );
    // The agent that does not come back is removed after the timeout,
    // and the framework hears it is lost.
    match next_sched(&mut s).await {
        scheduler::Event::Failure {
            agent_id,
            executor_id: None,
            ..
        } => assert_eq!(agent_id, absent),
        e => panic!("expected FAILURE for the absent agent, got {e:?}"),
    }
    // From then on it is refused, across another restart too.
    let (_b, event) = register(master.addr, Some(absent.clone())).await;
    assert!(matches!(event, agent::Event::Shutdown { .. }), "{event:?}");
    master.stop().await;
    let master = start(dir.path(), timeout).await;
    let (_b, event) = register(master.addr, Some(absent)).await;
    assert!(matches!(event, agent::Event::Shutdown { .. }), "{event:?}");
    let (_a, event) = register(master.addr, Some(back.clone())).await;
    assert_eq!(registered_id(&event), back);
    master.stop().await;
}

#[tokio::test]
async fn agent_removed_before_the_restart_is_refused_when_it_comes_back() {
    let dir = tempfile::tempdir().unwrap();
    let fast_pings = |c: &mut agora_master::Config| {
        c.agent_ping_interval = Duration::from_millis(100);
        c.max_missed_pings = 2;
    };
    let master = start(dir.path(), fast_pings).await;
    // The agent never answers a ping: it is removed and told so.
    let (mut a, event) = register(master.addr, None).await;
    let aid = registered_id(&event);
    assert!(
        matches!(next_agent(&mut a).await, agent::Event::Shutdown { .. }),
        "the silent agent was not removed"
    );
    master.stop().await;

    let master = start(dir.path(), fast_pings).await;
    let (_a, event) = register(master.addr, Some(aid)).await;
    match event {
        agent::Event::Shutdown { message } => assert!(message.contains("removed"), "{message}"),
        e => panic!("the removed agent was let back in: {e:?}"),
    }
    master.stop().await;
}

#[tokio::test]
async fn framework_whose_failover_timeout_passed_during_the_downtime_is_torn_down() {
    let dir = tempfile::tempdir().unwrap();
    let master = start(dir.path(), |_| {}).await;
    let (short, event) = subscribe(master.addr, None, 1.0).await;
    let short_id = subscribed_id(&event);
    let (long, event) = subscribe(master.addr, None, 3600.0).await;
    let long_id = subscribed_id(&event);
    drop(short);
    drop(long);
    // Both disconnect before the master goes down; the short one's
    // failover timeout ends while the master is down.
    tokio::time::sleep(Duration::from_millis(200)).await;
    master.stop().await;
    tokio::time::sleep(Duration::from_millis(1200)).await;

    let master = start(dir.path(), |_| {}).await;
    let (_s, event) = subscribe(master.addr, Some(short_id), 1.0).await;
    match event {
        scheduler::Event::Error {
            fatal: true,
            message,
        } => assert!(message.contains("removed"), "{message}"),
        e => panic!("the expired framework was let back in: {e:?}"),
    }
    let (_l, event) = subscribe(master.addr, Some(long_id.clone()), 3600.0).await;
    assert!(
        matches!(&event, scheduler::Event::Subscribed { reregistered: true, framework_id, .. } if *framework_id == long_id),
        "{event:?}"
    );
    master.stop().await;
}

/// The `agora-master` binary on `work_dir`, SIGKILLed when dropped.
struct Binary {
    child: std::process::Child,
    addr: std::net::SocketAddr,
}

impl Binary {
    fn start(work_dir: &Path, extra: &[&str]) -> Binary {
        use std::io::BufRead;
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_agora-master"))
            .args(["--listen", "127.0.0.1:0", "--work-dir"])
            .arg(work_dir)
            .args(extra)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let addr = line
            .trim()
            .strip_prefix("agora-master listening on ")
            .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
            .parse()
            .unwrap();
        Binary { child, addr }
    }
}

impl Drop for Binary {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The registry is written before the master acts: an agent that was
/// told its id is known to the master after a SIGKILL right after, so
/// when it does not return in time it is removed (and refused), not let
/// in as a stranger.
#[tokio::test]
async fn an_admission_the_agent_heard_of_survives_a_sigkill() {
    let dir = tempfile::tempdir().unwrap();
    let master = Binary::start(dir.path(), &[]);
    let (_late, event) = register(master.addr, None).await;
    let late = registered_id(&event);
    let (_prompt, event) = register(master.addr, None).await;
    let prompt = registered_id(&event);
    drop(master);

    let master = Binary::start(dir.path(), &["--agent-reregister-timeout", "700ms"]);
    let (_prompt, event) = register(master.addr, Some(prompt.clone())).await;
    assert!(
        matches!(&event, agent::Event::Registered { reregistered: true, agent_id, .. } if *agent_id == prompt),
        "{event:?}"
    );
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let (_late, event) = register(master.addr, Some(late)).await;
    assert!(matches!(event, agent::Event::Shutdown { .. }), "{event:?}");
}

/// A registry log damaged in the middle is read up to the damage, not
/// past it: a removal logged after an unreadable record is not applied
/// (applying it would reorder the log), the agent it names comes back as
/// known, and `/metrics` counts what was cut.
#[tokio::test]
async fn a_damaged_registry_log_is_cut_at_its_first_bad_record_and_counted() {
    let dir = tempfile::tempdir().unwrap();
    let master = start(dir.path(), |_| {}).await;
    let (_a, event) = register(master.addr, None).await;
    let aid = registered_id(&event);
    master.stop().await;

    // A damaged record (a lost page), then a removal of the agent that
    // was written whole.
    let log = dir.path().join("registry/log.jsonl");
    let good = std::fs::metadata(&log).unwrap().len();
    assert!(good > 0, "the admission is in the log");
    let damage = format!(
        "{}\n{{\"op\":\"remove_agent\",\"id\":\"{}\"}}\n",
        "\0".repeat(40),
        aid.as_str()
    );
    let mut f = std::fs::OpenOptions::new().append(true).open(&log).unwrap();
    std::io::Write::write_all(&mut f, damage.as_bytes()).unwrap();
    drop(f);

    let master = start(dir.path(), |_| {}).await;
    let (_a, event) = register(master.addr, Some(aid.clone())).await;
    assert!(
        matches!(&event, agent::Event::Registered { reregistered: true, agent_id, .. } if *agent_id == aid),
        "the removal after the damage was applied: {event:?}"
    );
    let metrics = agora_client::MasterClient::new(master.addr)
        .metrics()
        .await
        .unwrap();
    let value = |name: &str| {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
            .unwrap_or_else(|| panic!("no {name} in\n{metrics}"))
            .to_string()
    };
    assert_eq!(value("agora_master_registry_truncations_total"), "1");
    assert_eq!(
        value("agora_master_registry_truncated_bytes_total"),
        damage.len().to_string()
    );
    master.stop().await;

    // The damage was cut off the file: nothing to cut the next time.
    let master = start(dir.path(), |_| {}).await;
    let metrics = agora_client::MasterClient::new(master.addr)
        .metrics()
        .await
        .unwrap();
    assert!(
        metrics
            .lines()
            .any(|l| l == "agora_master_registry_truncations_total 0"),
        "{metrics}"
    );
    master.stop().await;
}
