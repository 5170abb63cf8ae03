//! Support for the `http_state` benchmark (`benches/http_state.rs`): builds
//! a large master state through the sans-IO API (agents register, a few
//! frameworks subscribe, accept offers with tasks, agents report them
//! running) and times what serving `/state` and `/metrics` costs: taking
//! the changes on the state task (everything, and a typical interval's
//! worth of task updates), assembling the snapshot on the builder thread,
//! encoding it, rendering the metrics, and answering over a real HTTP
//! connection (requests made by a client the caller passes in). Not part of the supported API.

use std::future::IntoFuture;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::{Duration, Instant as StdInstant};

use agora_proto::{
    agent, scheduler, AgentId, AgentInfo, FrameworkId, FrameworkInfo, Resources, TaskId, TaskState,
    TaskStatus,
};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::allocator::{AllocatorOptions, DrfAllocator};
use crate::master::{Input, Master, Output};
use crate::state::StateBuilder;
use crate::Config;

/// Timings of one run, in milliseconds (medians over `repeats`).
#[derive(Debug, Clone)]
pub struct Report {
    /// Agents in the state.
    pub agents: usize,
    /// Active tasks in the state.
    pub tasks: usize,
    /// Task updates between two snapshots in the incremental case.
    pub updates: usize,
    /// On the state task, everything changed: the views of every agent,
    /// task and offer (what the first snapshot after start-up costs).
    pub loop_full_ms: f64,
    /// Off the state task (builder thread): assembling the snapshot from
    /// that full delta.
    pub build_full_ms: f64,
    /// On the state task, after `updates` task updates (a tenth of them
    /// terminal and acknowledged): taking the delta.
    pub loop_incremental_ms: f64,
    /// Off the state task: applying that delta and assembling the snapshot.
    pub build_incremental_ms: f64,
    /// On the state task, nothing changed since the last snapshot (a timer
    /// fired): shares and roles only.
    pub loop_idle_ms: f64,
    /// Encoding a new snapshot as JSON after the incremental change (once
    /// per snapshot, then cached; views that did not change reuse their
    /// text).
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
                principal: None,
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
                        container: None,
                        allocation_role: None,
                        launch_stamp: None,
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
                        task_group: None,
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
                        principal: None,
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

/// How long `request` takes (a GET made by the benchmark's client).
async fn timed(request: impl std::future::Future) -> Duration {
    let started = StdInstant::now();
    request.await;
    started.elapsed()
}

/// Sends status updates for `n` tasks of `order`, from position `from`:
/// TASK_RUNNING again, except every tenth, which finishes and which its
/// scheduler acknowledges. Returns the next position.
fn update_tasks(
    m: &mut Master,
    order: &[(FrameworkId, TaskId, AgentId)],
    from: usize,
    n: usize,
) -> usize {
    let now = Instant::now();
    let end = (from + n).min(order.len());
    for (i, (fid, tid, aid)) in order[from..end].iter().enumerate() {
        let finish = i % 10 == 9;
        let state = if finish {
            TaskState::Finished
        } else {
            TaskState::Running
        };
        let status = TaskStatus::new(tid.clone(), state, agora_proto::Source::SourceExecutor)
            .with_new_uuid();
        let uuid = status.uuid.clone().unwrap_or_default();
        let agent_conn = m.agents.get(aid).and_then(|a| a.conn).unwrap_or_default();
        m.handle(
            now,
            Input::Agent {
                conn: agent_conn,
                call: agent::Call::StatusUpdate {
                    framework_id: fid.clone(),
                    status,
                },
                principal: None,
            },
        );
        let scheduler_conn = m.frameworks.get(fid).and_then(|f| f.conn);
        if let (true, Some(conn)) = (finish, scheduler_conn) {
            m.handle(
                now,
                Input::Scheduler {
                    conn,
                    call: scheduler::Call::Acknowledge {
                        agent_id: aid.clone(),
                        task_id: tid.clone(),
                        uuid,
                    },
                },
            );
        }
    }
    m.take_outputs();
    end
}

/// The master's tasks, taking one framework after the other in turn.
fn interleaved_tasks(m: &Master) -> Vec<(FrameworkId, TaskId, AgentId)> {
    let mut per_framework: Vec<Vec<_>> = m
        .frameworks
        .values()
        .map(|f| {
            let mut tasks: Vec<_> = f
                .tasks
                .values()
                .map(|t| (f.id.clone(), t.info.task_id.clone(), t.agent_id.clone()))
                .collect();
            tasks.sort();
            tasks
        })
        .collect();
    per_framework.sort();
    let longest = per_framework.iter().map(Vec::len).max().unwrap_or(0);
    let mut order = Vec::new();
    for i in 0..longest {
        for tasks in &per_framework {
            if let Some(t) = tasks.get(i) {
                order.push(t.clone());
            }
        }
    }
    order
}

/// Builds the state and times everything; `repeats` runs of each step,
/// `updates` task updates between two snapshots in the incremental case.
/// `get(addr, path)` makes one HTTP GET (the benchmark's own client,
/// `agora-client`), timed here.
pub async fn run<G, F>(
    agents: usize,
    tasks: usize,
    frameworks: usize,
    updates: usize,
    repeats: usize,
    get: G,
) -> Report
where
    G: Fn(std::net::SocketAddr, &'static str) -> F,
    F: std::future::Future,
{
    let mut master = build(agents, tasks, frameworks);
    let active: usize = master.frameworks.values().map(|f| f.tasks.len()).sum();
    let repeats = repeats.max(1);

    // Everything changed (the first snapshot after start-up).
    let (mut loop_full, mut build_full) = (Vec::new(), Vec::new());
    for _ in 0..repeats {
        let t = StdInstant::now();
        let delta = master.full_state_delta();
        loop_full.push(ms(t.elapsed()));
        let t = StdInstant::now();
        let mut builder = StateBuilder::default();
        builder.apply(delta);
        let _ = builder.build();
        build_full.push(ms(t.elapsed()));
    }
    let mut builder = StateBuilder::default();
    builder.apply(master.full_state_delta());
    master.mark_published();
    let _ = builder.build();

    // A typical interval: `updates` task updates, then a snapshot.
    let order = interleaved_tasks(&master);
    let mut next = 0;
    let (mut loop_incremental, mut build_incremental) = (Vec::new(), Vec::new());
    let (mut loop_idle, mut encode_ms) = (Vec::new(), Vec::new());
    for _ in 0..repeats {
        next = update_tasks(&mut master, &order, next, updates);
        let t = StdInstant::now();
        let delta = master.state_delta();
        loop_incremental.push(ms(t.elapsed()));
        let t = StdInstant::now();
        builder.apply(delta);
        let snapshot = builder.build();
        build_incremental.push(ms(t.elapsed()));
        let t = StdInstant::now();
        let _ = snapshot.json().expect("encode");
        encode_ms.push(ms(t.elapsed()));
        let t = StdInstant::now();
        let delta = master.state_delta();
        loop_idle.push(ms(t.elapsed()));
        builder.apply(delta);
    }
    let snapshot = Arc::new(builder.build());
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
        first_frame_timeout: std::time::Duration::from_secs(15),
        metrics,
        bodies: agora_net::Bodies::new(&agora_net::Limits::default(), Arc::default()),
        net: Arc::default(),
        operator_stream_backlog: crate::DEFAULT_OPERATOR_STREAM_BACKLOG,
        auth: Arc::default(),
        open_doors: Vec::new(),
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
        next = update_tasks(&mut master, &order, next, updates);
        builder.apply(master.state_delta());
        snap_tx.send_replace(Arc::new(builder.build()));
        cold.push(ms(timed(get(addr, "/state")).await));
        warm.push(ms(timed(get(addr, "/state")).await));
        get_metrics.push(ms(timed(get(addr, "/metrics")).await));
        page.push(ms(timed(get(
            addr,
            "/api/v1/tasks?state=running&limit=100&offset=50000",
        ))
        .await));
    }
    token.cancel();
    let _ = server.await;
    Report {
        agents: master.agents.len(),
        tasks: active,
        updates,
        loop_full_ms: median(loop_full),
        build_full_ms: median(build_full),
        loop_incremental_ms: median(loop_incremental),
        build_incremental_ms: median(build_incremental),
        loop_idle_ms: median(loop_idle),
        encode_ms: median(encode_ms),
        state_bytes,
        get_state_cold_ms: median(cold),
        get_state_warm_ms: median(warm),
        render_metrics_ms: median(render),
        get_metrics_ms: median(get_metrics),
        get_tasks_page_ms: median(page),
    }
}
