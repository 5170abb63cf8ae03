//! Support for the `http_state` benchmark (`benches/http_state.rs`): builds
//! a large master state through the sans-IO API (agents register, a few
//! frameworks subscribe, accept offers with tasks, agents report them
//! running) and times what serving `/state` and `/metrics` costs: building
//! the snapshot (done on the state task), encoding it, rendering the
//! metrics, and answering over a real HTTP connection. Not part of the
//! supported API.

use std::future::IntoFuture;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::{Duration, Instant as StdInstant};

use agora_proto::{agent, scheduler, AgentInfo, FrameworkInfo, Resources, TaskState, TaskStatus};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::allocator::{AllocatorOptions, DrfAllocator};
use crate::master::{Input, Master, Output};
use crate::Config;

/// Timings of one run, in milliseconds (medians over `repeats`).
#[derive(Debug, Clone)]
pub struct Report {
    /// Agents in the state.
    pub agents: usize,
    /// Active tasks in the state.
    pub tasks: usize,
    /// Building the snapshot on the state task.
    pub snapshot_ms: f64,
    /// Encoding the snapshot as JSON (once per snapshot, then cached).
    pub encode_ms: f64,
    /// Size of `/state`'s body.
    pub state_bytes: usize,
    /// `GET /state` over HTTP on loopback, first request after a new
    /// snapshot (includes encoding).
    pub get_state_cold_ms: f64,
    /// `GET /state` again (encoded body shared).
    pub get_state_warm_ms: f64,
    /// Rendering `/metrics`.
    pub render_metrics_ms: f64,
    /// `GET /metrics` over HTTP on loopback.
    pub get_metrics_ms: f64,
    /// `GET /api/v1/tasks?state=running&limit=100` (a UI page).
    pub get_tasks_page_ms: f64,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// A master holding `agents` agents and `tasks` running tasks spread over
/// `frameworks` frameworks.
pub(crate) fn build(agents: usize, tasks: usize, frameworks: usize) -> Master {
    let config = Config {
        max_removed_agents: 16,
        ..Config::default()
    };
    let now = Instant::now();
    let allocator = DrfAllocator::new(AllocatorOptions::from(&config));
    let info = agora_proto::MasterInfo {
        id: "bench".into(),
        address: "127.0.0.1:5050".into(),
        version: agora_proto::VERSION.into(),
    };
    let mut m = Master::new(config, info, Box::new(allocator), now);
    let resources = Resources::parse("cpus:32;mem:65536;disk:100000").expect("resources");
    let mut agent_conns = Vec::new();
    for i in 0..agents {
        let conn = 1_000_000 + i as u64;
        m.handle(
            now,
            Input::Agent {
                conn,
                call: agent::Call::Register {
                    protocol: agora_proto::PROTOCOL_VERSION,
                    agent_info: AgentInfo {
                        id: None,
                        hostname: format!("host-{i}.example.org"),
                        address: format!("10.0.{}.{}:5051", i / 250, i % 250),
                        resources: resources.clone(),
                        attributes: agora_proto::Attributes::parse(&format!("rack:r{}", i % 40))
                            .unwrap_or_default(),
                    },
                    tasks: vec![],
                    executors: vec![],
                    frameworks: vec![],
                },
            },
        );
        agent_conns.push(conn);
    }
    for f in 0..frameworks {
        m.handle(
            now,
            Input::Scheduler {
                conn: f as u64 + 1,
                call: scheduler::Call::Subscribe {
                    protocol: agora_proto::PROTOCOL_VERSION,
                    framework_info: FrameworkInfo::new(format!("bench-{f}")),
                    force: false,
                },
            },
        );
    }
    m.take_outputs();
    let task_resources = Resources::parse("cpus:0.1;mem:32").expect("resources");
    let mut launched = 0;
    let mut round = 0;
    let mut t = now;
    while launched < tasks && round < 1000 {
        round += 1;
        t += Duration::from_secs(1);
        m.allocate(t);
        let offers: Vec<(u64, agora_proto::Offer)> = m
            .take_outputs()
            .into_iter()
            .filter_map(|o| match o {
                Output::Scheduler {
                    conn,
                    event: scheduler::Event::Offers { offers },
                } => Some(offers.into_iter().map(move |of| (conn, of))),
                _ => None,
            })
            .flatten()
            .collect();
        if offers.is_empty() {
            break;
        }
        let per_offer = tasks.div_ceil(agents * frameworks).max(1);
        for (conn, offer) in offers {
            let n = per_offer.min(tasks - launched);
            let batch: Vec<agora_proto::TaskInfo> = (0..n)
                .map(|k| {
                    let id = format!("task-{launched}-{k}-r{round}");
                    agora_proto::TaskInfo {
                        name: format!("bench task {id}"),
                        task_id: id.as_str().into(),
                        agent_id: offer.agent_id.clone(),
                        resources: task_resources.clone(),
                        executor: None,
                        command: Some(agora_proto::CommandInfo {
                            value: "sleep 3600".into(),
                            ..Default::default()
                        }),
                        data: None,
                        kill_grace_period: None,
                        labels: Default::default(),
                    }
                })
                .collect();
            launched += batch.len();
            let ids: Vec<_> = batch.iter().map(|t| t.task_id.clone()).collect();
            m.handle(
                t,
                Input::Scheduler {
                    conn,
                    call: scheduler::Call::Launch {
                        offer_ids: vec![offer.id.clone()],
                        tasks: batch,
                        filters: agora_proto::Filters {
                            refuse_seconds: Some(0.0),
                        },
                    },
                },
            );
            let fid = m.scheduler_conns[&conn].clone();
            let agent_conn = m.agents[&offer.agent_id].conn.unwrap_or_default();
            for id in ids {
                let status =
                    TaskStatus::new(id, TaskState::Running, agora_proto::Source::SourceExecutor)
                        .with_new_uuid();
                m.handle(
                    t,
                    Input::Agent {
                        conn: agent_conn,
                        call: agent::Call::StatusUpdate {
                            framework_id: fid.clone(),
                            status,
                        },
                    },
                );
            }
            m.take_outputs();
            if launched >= tasks {
                break;
            }
        }
    }
    m
}

async fn http_get(addr: std::net::SocketAddr, path: &str) -> (Duration, usize) {
    let started = StdInstant::now();
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let req = format!("GET {path} HTTP/1.1\r\nHost: b\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await.expect("write");
    let mut body = Vec::new();
    s.read_to_end(&mut body).await.expect("read");
    (started.elapsed(), body.len())
}

/// Builds the state and times everything; `repeats` runs of each step.
pub async fn run(agents: usize, tasks: usize, frameworks: usize, repeats: usize) -> Report {
    let master = build(agents, tasks, frameworks);
    let active: usize = master.frameworks.values().map(|f| f.tasks.len()).sum();
    let repeats = repeats.max(1);
    let mut snapshot_ms = Vec::new();
    let mut encode_ms = Vec::new();
    let mut snapshot = None;
    for _ in 0..repeats {
        let t = StdInstant::now();
        let s = master.snapshot();
        snapshot_ms.push(ms(t.elapsed()));
        let t = StdInstant::now();
        let _ = serde_json::to_vec(&s).expect("encode");
        encode_ms.push(ms(t.elapsed()));
        snapshot = Some(s);
    }
    let snapshot = Arc::new(snapshot.expect("one snapshot"));
    let state_bytes = snapshot.json().expect("encode").len();
    let metrics = master.metrics.clone();
    let mut render = Vec::new();
    for _ in 0..repeats {
        let t = StdInstant::now();
        let _ = metrics.render(&snapshot);
        render.push(ms(t.elapsed()));
    }

    let (snap_tx, snap_rx) = watch::channel(snapshot);
    let (inputs, _rx) = mpsc::channel(16);
    let token = CancellationToken::new();
    let app = crate::http::AppState {
        inputs,
        registry: Arc::default(),
        next_conn: Arc::new(AtomicU64::new(1)),
        snapshot: snap_rx,
        shutdown: token.clone(),
        queue_capacity: 16,
        metrics,
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let server = tokio::spawn(
        axum::serve(listener, crate::http::router(app))
            .with_graceful_shutdown(token.clone().cancelled_owned())
            .into_future(),
    );
    let (mut cold, mut warm, mut get_metrics, mut page) = (vec![], vec![], vec![], vec![]);
    for _ in 0..repeats {
        // A fresh snapshot object: the first GET encodes it.
        let fresh = Arc::new(master.snapshot());
        snap_tx.send_replace(fresh);
        cold.push(ms(http_get(addr, "/state").await.0));
        warm.push(ms(http_get(addr, "/state").await.0));
        get_metrics.push(ms(http_get(addr, "/metrics").await.0));
        page.push(ms(http_get(
            addr,
            "/api/v1/tasks?state=running&limit=100&offset=50000",
        )
        .await
        .0));
    }
    token.cancel();
    let _ = server.await;
    Report {
        agents: master.agents.len(),
        tasks: active,
        snapshot_ms: median(snapshot_ms),
        encode_ms: median(encode_ms),
        state_bytes,
        get_state_cold_ms: median(cold),
        get_state_warm_ms: median(warm),
        render_metrics_ms: median(render),
        get_metrics_ms: median(get_metrics),
        get_tasks_page_ms: median(page),
    }
}
