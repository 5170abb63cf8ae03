//! `agora-workers` on a real cluster (issue 12): real `agora-master` and
//! `agora-agent` processes on 127.0.0.1, agents with distinct host names
//! (`h0`…) and racks, workers that are `agora-minijob worker` processes
//! registering with a listener of the test over TCP.
//!
//! Racks: h0, h1 on r0; h2, h3 on r1; h4 alone on r2.

mod support;

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use agora_proto::Resources;
use agora_workers::manager::{ManagerEvent, ManagerOptions};
use agora_workers::{
    ConnectionState, Constraint, DriverOptions, FatalError, FileStore, FinalStatus, Locality,
    MemoryStore, RequestError, TerminationCause, WorkerDriver, WorkerEventHandler, WorkerHandle,
    WorkerId, WorkerManager, WorkerSpec, WorkerStore,
};
use support::{bin, named_rack, wait_until, TestCluster, FAST_MASTER_FLAGS, NAMED_AGENT};

const WORKER: &str = "cpus:0.1;mem:32";

/// A condition on the workers started and ended so far.
type Until<'a> = dyn Fn(&[WorkerHandle], &[(WorkerId, TerminationCause)]) -> bool + 'a;

/// What the runtime saw, in order.
#[derive(Debug, Clone, PartialEq)]
enum Seen {
    Recovered(Vec<WorkerId>),
    Completed(WorkerId),
    Registered(WorkerId),
    Running(WorkerId),
    Terminated(WorkerId, TerminationCause),
    Connection(ConnectionState),
    Error(String),
}

#[derive(Default)]
struct Log(Mutex<Vec<Seen>>);

impl Log {
    fn push(&self, s: Seen) {
        self.0.lock().unwrap().push(s);
    }
    fn all(&self) -> Vec<Seen> {
        self.0.lock().unwrap().clone()
    }
    fn count(&self, f: impl Fn(&Seen) -> bool) -> usize {
        self.all().iter().filter(|s| f(s)).count()
    }
    fn terminations(&self) -> Vec<(WorkerId, TerminationCause)> {
        self.all()
            .into_iter()
            .filter_map(|s| match s {
                Seen::Terminated(id, c) => Some((id, c)),
                _ => None,
            })
            .collect()
    }
}

impl WorkerEventHandler for Log {
    fn on_previous_attempt_workers_recovered(&self, workers: Vec<WorkerHandle>) {
        self.push(Seen::Recovered(workers.into_iter().map(|w| w.id).collect()));
    }
    fn on_worker_running(&self, worker: &WorkerHandle) {
        self.push(Seen::Running(worker.id.clone()));
    }
    fn on_worker_terminated(&self, id: &WorkerId, cause: TerminationCause, _d: &str) {
        self.push(Seen::Terminated(id.clone(), cause));
    }
    fn on_connection(&self, state: ConnectionState) {
        self.push(Seen::Connection(state));
    }
    fn on_error(&self, error: &FatalError) {
        self.push(Seen::Error(error.to_string()));
    }
}

/// A cluster of `n` named agents.
fn cluster(n: usize) -> TestCluster {
    TestCluster::start_named(n, NAMED_AGENT, FAST_MASTER_FLAGS)
}

fn add_agent(cluster: &mut TestCluster, i: usize, extra_attributes: &str) -> usize {
    let attributes = format!("rack:{}{extra_attributes}", named_rack(i));
    cluster.add_agent_named(&format!("h{i}"), &attributes, NAMED_AGENT, &[])
}

/// The "runtime" workers register with: a TCP listener logging each
/// worker's first line.
fn registry(log: Arc<Log>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let log = log.clone();
            std::thread::spawn(move || {
                let mut line = String::new();
                if BufReader::new(&stream).read_line(&mut line).is_ok() {
                    if let Ok(v) = serde_json::from_str::<serde_json::Value>(&line) {
                        if let Some(id) = v["worker_id"].as_str() {
                            log.push(Seen::Registered(WorkerId::new(id)));
                        }
                    }
                }
                // Keep the connection open as a live worker does.
                let mut rest = String::new();
                let _ = BufReader::new(&stream).read_line(&mut rest);
            });
        }
    });
    addr
}

/// A worker that registers with `runtime`.
fn worker_spec(name: &str, runtime: &str) -> WorkerSpec {
    let command = format!(
        "{} worker --runtime {runtime} --slots 1",
        bin("agora-minijob").display()
    );
    WorkerSpec::new(name, Resources::parse(WORKER).unwrap(), command)
}

fn options(cluster: &TestCluster, name: &str) -> DriverOptions {
    let mut o = DriverOptions::new(cluster.master_address(), name);
    o.locality_wait = Duration::from_secs(1);
    o.reconnect_backoff_max = Duration::from_millis(300);
    o
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Runtime::new().unwrap()
}

/// Awaits each future on its own task and logs `Completed` as it completes.
fn complete_all(
    rt: &tokio::runtime::Runtime,
    log: &Arc<Log>,
    futures: Vec<agora_workers::WorkerFuture>,
) -> Vec<tokio::task::JoinHandle<Result<WorkerHandle, RequestError>>> {
    futures
        .into_iter()
        .map(|f| {
            let log = log.clone();
            rt.spawn(async move {
                let r = f.await;
                if let Ok(h) = &r {
                    log.push(Seen::Completed(h.id.clone()));
                }
                r
            })
        })
        .collect()
}

fn join_all(
    rt: &tokio::runtime::Runtime,
    tasks: Vec<tokio::task::JoinHandle<Result<WorkerHandle, RequestError>>>,
) -> Vec<WorkerHandle> {
    rt.block_on(async {
        let mut out = Vec::new();
        for t in tasks {
            out.push(
                tokio::time::timeout(Duration::from_secs(30), t)
                    .await
                    .expect("future completes")
                    .unwrap()
                    .expect("worker placed"),
            );
        }
        out
    })
}

/// Live (non-terminal) tasks of all frameworks in the master's `/state`.
fn live_tasks(cluster: &TestCluster) -> usize {
    let state = cluster.state();
    state["frameworks"]
        .as_array()
        .map(|fs| {
            fs.iter()
                .flat_map(|f| f["tasks"].as_array().cloned().unwrap_or_default())
                .filter(|t| {
                    let s = t["state"].as_str().unwrap_or("");
                    !matches!(
                        s,
                        "TASK_FINISHED"
                            | "TASK_FAILED"
                            | "TASK_KILLED"
                            | "TASK_LOST"
                            | "TASK_ERROR"
                            | "TASK_DROPPED"
                            | "TASK_GONE"
                    )
                })
                .count()
        })
        .unwrap_or(0)
}

/// §7 test 1 and 5: ten workers on three agents; every future completes
/// before its worker registers; no termination precedes a future; each
/// released worker ends exactly once as `Killed`.
#[test]
fn workers_complete_before_they_register_and_end_once_when_released() {
    let cluster = cluster(3);
    let rt = runtime();
    let log = Arc::new(Log::default());
    let runtime_addr = registry(log.clone());
    let driver = WorkerDriver::initialize(
        options(&cluster, "basic"),
        Box::new(MemoryStore::default()),
        log.clone(),
    )
    .unwrap();
    let futures = (0..10)
        .map(|_| driver.request_worker(worker_spec("tm", &runtime_addr)))
        .collect();
    let workers = join_all(&rt, complete_all(&rt, &log, futures));
    wait_until(
        Duration::from_secs(30),
        "10 registrations",
        || format!("{:?}", log.all()),
        || (log.count(|s| matches!(s, Seen::Registered(_))) == 10).then_some(()),
    );
    let seen = log.all();
    assert_eq!(
        seen.first(),
        Some(&Seen::Recovered(Vec::new())),
        "recovery is reported first"
    );
    for w in &workers {
        let completed = seen
            .iter()
            .position(|s| *s == Seen::Completed(w.id.clone()))
            .unwrap();
        let registered = seen
            .iter()
            .position(|s| *s == Seen::Registered(w.id.clone()))
            .unwrap();
        assert!(
            completed < registered,
            "{} registered before its future completed: {seen:?}",
            w.id
        );
        assert!(!seen[..completed]
            .iter()
            .any(|s| matches!(s, Seen::Terminated(id, _) if *id == w.id)));
    }
    for w in &workers {
        driver.release_worker(&w.id).unwrap();
    }
    wait_until(
        Duration::from_secs(30),
        "10 terminations",
        || format!("{:?}", log.all()),
        || (log.terminations().len() >= 10).then_some(()),
    );
    std::thread::sleep(Duration::from_millis(500));
    let ends = log.terminations();
    assert_eq!(
        ends.len(),
        10,
        "exactly one termination per worker: {ends:?}"
    );
    assert!(
        ends.iter().all(|(_, c)| *c == TerminationCause::Killed),
        "{ends:?}"
    );
    rt.block_on(driver.terminate());
}

/// §7 test 2: 50 workers preferring hosts 20/15/10/5/0 land ≥ 95 % on
/// their host; a worker whose preferred host is full takes ANY after
/// about twice the locality wait (HOST, then RACK, then ANY).
#[test]
fn locality_is_met_with_capacity_and_falls_back_within_twice_the_wait() {
    let cluster = cluster(5);
    let rt = runtime();
    let log = Arc::new(Log::default());
    let runtime_addr = registry(log.clone());
    let driver = WorkerDriver::initialize(
        options(&cluster, "locality"),
        Box::new(MemoryStore::default()),
        log.clone(),
    )
    .unwrap();
    let spread = [20, 15, 10, 5, 0];
    let mut futures = Vec::new();
    for (host, n) in spread.iter().enumerate() {
        for _ in 0..*n {
            futures.push(driver.request_worker(
                worker_spec("tm", &runtime_addr).prefer_host(format!("h{host}"), 1.0),
            ));
        }
    }
    let workers = join_all(&rt, complete_all(&rt, &log, futures));
    let hits = workers
        .iter()
        .filter(|w| matches!(w.locality, Locality::Local | Locality::Host))
        .count();
    let mut per_host: HashMap<String, usize> = HashMap::new();
    for w in &workers {
        *per_host.entry(w.hostname.clone()).or_default() += 1;
    }
    eprintln!("50 workers: {hits} local|host; per host {per_host:?}");
    assert!(hits * 100 >= 95 * 50, "{hits}/50 on their host");

    // Fill h4 (alone on rack r2), then ask for one more there.
    let filler = WorkerSpec::new(
        "filler",
        Resources::parse("cpus:7;mem:4096").unwrap(),
        "sleep 600",
    )
    .constraint(Constraint::equals("hostname", "h4"));
    let filled = rt.block_on(async {
        tokio::time::timeout(Duration::from_secs(30), driver.request_worker(filler)).await
    });
    assert_eq!(filled.unwrap().unwrap().hostname, "h4");
    let wait = Duration::from_secs(1);
    let asked = Instant::now();
    let big = WorkerSpec::new(
        "big",
        Resources::parse("cpus:2;mem:64").unwrap(),
        "sleep 600",
    )
    .prefer_host("h4", 1.0)
    .locality_wait(wait);
    let placed = rt
        .block_on(async {
            tokio::time::timeout(Duration::from_secs(30), driver.request_worker(big)).await
        })
        .unwrap()
        .unwrap();
    let took = asked.elapsed();
    eprintln!(
        "fallback: {} at {} after {:.2} s",
        placed.hostname,
        placed.locality,
        took.as_secs_f64()
    );
    assert_eq!(placed.locality, Locality::Any);
    assert_ne!(placed.hostname, "h4");
    assert!(
        took >= wait * 2 - Duration::from_millis(100),
        "stepped down too early: {took:?}"
    );
    assert!(
        took <= wait * 2 + Duration::from_millis(2500),
        "stepped down too late: {took:?}"
    );
    rt.block_on(driver.deregister(FinalStatus::Succeeded, None))
        .unwrap();
}

/// §7 test 3 and 13: `unique(hostname)` places 6 workers on 5 agents as
/// 5 and keeps 1 pending; of 10 requests that wait for an attribute no
/// agent has yet, 5 are cancelled, and exactly 5 launch once an agent
/// with it arrives.
#[test]
fn unique_hostname_keeps_one_pending_and_cancelled_requests_never_launch() {
    let mut cluster = cluster(5);
    let rt = runtime();
    let log = Arc::new(Log::default());
    let runtime_addr = registry(log.clone());
    let driver = WorkerDriver::initialize(
        options(&cluster, "constraints"),
        Box::new(MemoryStore::default()),
        log.clone(),
    )
    .unwrap();
    let unique = worker_spec("unique", &runtime_addr).constraint(Constraint::unique("hostname"));
    let futures: Vec<_> = (0..6)
        .map(|_| driver.request_worker(unique.clone()))
        .collect();
    let tasks = complete_all(&rt, &log, futures);
    wait_until(
        Duration::from_secs(20),
        "5 placed",
        || format!("{:?}", log.all()),
        || (log.count(|s| matches!(s, Seen::Completed(_))) == 5).then_some(()),
    );
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(
        log.count(|s| matches!(s, Seen::Completed(_))),
        5,
        "the sixth stays pending"
    );
    let placed: Vec<WorkerHandle> = rt.block_on(async {
        let mut out = Vec::new();
        for t in tasks {
            if let Ok(Ok(Ok(h))) = tokio::time::timeout(Duration::from_millis(200), t).await {
                out.push(h);
            }
        }
        out
    });
    let mut hosts: Vec<&str> = placed.iter().map(|w| w.hostname.as_str()).collect();
    hosts.sort();
    hosts.dedup();
    assert_eq!(hosts.len(), 5, "one per host: {hosts:?}");

    let gpu = worker_spec("gpu", &runtime_addr).constraint(Constraint::equals("gpu", "yes"));
    let futures: Vec<_> = (0..10)
        .map(|_| driver.request_worker(gpu.clone()))
        .collect();
    let ids: Vec<_> = futures.iter().map(|f| f.request_id()).collect();
    for id in ids.iter().step_by(2) {
        driver.cancel(*id).unwrap();
    }
    let before = live_tasks(&cluster);
    add_agent(&mut cluster, 5, ";gpu:yes");
    let results: Vec<Result<WorkerHandle, RequestError>> = rt.block_on(async {
        let mut out = Vec::new();
        for f in futures {
            out.push(
                tokio::time::timeout(Duration::from_secs(30), f)
                    .await
                    .expect("answered"),
            );
        }
        out
    });
    let launched = results.iter().filter(|r| r.is_ok()).count();
    let cancelled = results
        .iter()
        .filter(|r| matches!(r, Err(RequestError::Cancelled)))
        .count();
    assert_eq!((launched, cancelled), (5, 5), "{results:?}");
    for (i, r) in results.iter().enumerate() {
        assert_eq!(r.is_err(), i % 2 == 0, "request {i}: {r:?}");
    }
    // The new host also takes the sixth unique worker, pending so far.
    let expected = before + 5 + 1;
    wait_until(
        Duration::from_secs(20),
        "5 gpu workers and the sixth unique one",
        || {
            format!(
                "before {before}, now {}: {}",
                live_tasks(&cluster),
                cluster.state()["frameworks"]
            )
        },
        || (live_tasks(&cluster) == expected).then_some(()),
    );
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        live_tasks(&cluster),
        expected,
        "exactly 5 gpu workers launched"
    );
    rt.block_on(driver.deregister(FinalStatus::Succeeded, None))
        .unwrap();
}

/// §7 test 4: killing an agent with k workers gives exactly k `AgentLost`
/// terminations and k replacements on the surviving agents; the agent
/// coming back raises nothing more.
#[test]
fn agent_loss_gives_k_terminations_and_k_replacements() {
    let mut cluster = cluster(5);
    let rt = runtime();
    let log = Arc::new(Log::default());
    let runtime_addr = registry(log.clone());
    let (manager, mut events) = WorkerManager::start(
        options(&cluster, "agent-loss"),
        Box::new(MemoryStore::default()),
        ManagerOptions::default(),
        rt.handle(),
    )
    .unwrap();
    manager.declare(worker_spec("tm", &runtime_addr), 10);
    let mut started: Vec<WorkerHandle> = Vec::new();
    let mut lost = Vec::new();
    let collect = |events: &mut tokio::sync::mpsc::UnboundedReceiver<ManagerEvent>,
                   started: &mut Vec<WorkerHandle>,
                   lost: &mut Vec<(WorkerId, TerminationCause)>,
                   until: &Until<'_>| {
        let deadline = Instant::now() + Duration::from_secs(60);
        while !until(started, lost) {
            assert!(
                Instant::now() < deadline,
                "timed out: started {started:?} lost {lost:?}"
            );
            match rt.block_on(async {
                tokio::time::timeout(Duration::from_millis(200), events.recv()).await
            }) {
                // Placed is not enough: an agent killed before the launch
                // reaches it fails the launch rather than loses a worker.
                Ok(Some(ManagerEvent::WorkerRunning(h))) => started.push(h),
                Ok(Some(ManagerEvent::WorkerTerminated { id, cause, .. })) => {
                    lost.push((id, cause))
                }
                _ => {}
            }
        }
    };
    collect(&mut events, &mut started, &mut lost, &|s, _| s.len() >= 10);
    for w in &started {
        manager.worker_registered(&w.id);
    }
    let victim = started
        .iter()
        .map(|w| w.hostname.clone())
        .max_by_key(|h| started.iter().filter(|w| w.hostname == *h).count())
        .unwrap();
    let k = started.iter().filter(|w| w.hostname == victim).count();
    let index: usize = victim.trim_start_matches('h').parse().unwrap();
    eprintln!("killing agent {victim} with {k} workers");
    cluster.agents[index].kill();
    collect(&mut events, &mut started, &mut lost, &|s, l| {
        l.len() >= k && s.len() >= 10 + k
    });
    assert!(
        lost.iter().all(|(_, c)| *c == TerminationCause::AgentLost),
        "{lost:?}"
    );
    let replacements = &started[10..];
    assert!(
        replacements.iter().all(|w| w.hostname != victim),
        "{replacements:?}"
    );
    cluster.agents[index].restart();
    std::thread::sleep(Duration::from_secs(2));
    while let Ok(e) = events.try_recv() {
        match e {
            ManagerEvent::WorkerStarted(h) => started.push(h),
            ManagerEvent::WorkerTerminated { id, cause, .. } => lost.push((id, cause)),
            _ => {}
        }
    }
    assert_eq!(lost.len(), k, "exactly k terminations: {lost:?}");
    assert_eq!(started.len(), 10 + k, "exactly k replacements");
    rt.block_on(manager.deregister(FinalStatus::Succeeded, None))
        .unwrap();
}

/// §7 test 6 and 7: a worker whose command fails at once is requested
/// no more often than the failure limit allows; a worker that never
/// registers is released after the registration timeout and replaced.
#[test]
fn start_failures_are_paced_and_silent_workers_are_replaced() {
    let cluster = cluster(2);
    let rt = runtime();
    let limits = ManagerOptions {
        max_failures: 3,
        retry_interval: Duration::from_secs(1),
        registration_timeout: Duration::from_secs(2),
        ..ManagerOptions::default()
    };
    // Two runtimes: the failure limit pauses all of a manager's requests.
    let (manager, crash_events) = WorkerManager::start(
        options(&cluster, "failing"),
        Box::new(MemoryStore::default()),
        limits.clone(),
        rt.handle(),
    )
    .unwrap();
    let (silent_manager, silent_events) = WorkerManager::start(
        options(&cluster, "silent"),
        Box::new(MemoryStore::default()),
        limits,
        rt.handle(),
    )
    .unwrap();
    manager.declare(
        WorkerSpec::new("crash", Resources::parse(WORKER).unwrap(), "exit 1"),
        1,
    );
    silent_manager.declare(
        WorkerSpec::new("silent", Resources::parse(WORKER).unwrap(), "sleep 600"),
        1,
    );
    let (merged, mut events) = tokio::sync::mpsc::unbounded_channel();
    for mut source in [crash_events, silent_events] {
        let merged = merged.clone();
        rt.spawn(async move {
            while let Some(e) = source.recv().await {
                let _ = merged.send(e);
            }
        });
    }
    let mut crash_started = 0;
    let mut silent_started = 0;
    let mut crashes = 0;
    let mut timed_out = 0;
    let mut cooling = 0;
    let end = Instant::now() + Duration::from_secs(8);
    while Instant::now() < end {
        let event = rt.block_on(async {
            tokio::time::timeout(Duration::from_millis(100), events.recv()).await
        });
        match event {
            Ok(Some(ManagerEvent::WorkerStarted(h))) if h.spec_name == "crash" => {
                crash_started += 1
            }
            Ok(Some(ManagerEvent::WorkerStarted(_))) => silent_started += 1,
            Ok(Some(ManagerEvent::WorkerTerminated {
                cause: TerminationCause::Exited { code: 1 },
                ..
            })) => crashes += 1,
            Ok(Some(ManagerEvent::RegistrationTimedOut(_))) => timed_out += 1,
            Ok(Some(ManagerEvent::CoolingDown { .. })) => cooling += 1,
            _ => {}
        }
    }
    eprintln!("crash: {crash_started} started, {crashes} exits, {cooling} cool-downs; silent: {silent_started} started, {timed_out} timed out");
    assert!(crashes >= 3, "the crashing worker was retried");
    assert!(cooling >= 1, "the failure limit was reached");
    assert!(
        crash_started <= 4,
        "at most the limit (3) within the minute, plus one in flight: {crash_started}"
    );
    assert!(
        timed_out >= 2,
        "released after each 2 s registration timeout"
    );
    assert!(silent_started >= 3, "and replaced each time");
    rt.block_on(manager.deregister(FinalStatus::Failed, None))
        .unwrap();
    rt.block_on(silent_manager.deregister(FinalStatus::Failed, None))
        .unwrap();
}

/// §7 test 8: the master restarts under 20 running workers: the driver
/// re-registers as the same framework, no worker terminates, and a
/// request made after the failover is served.
#[test]
fn master_restart_with_twenty_workers_terminates_none() {
    let mut cluster = cluster(3);
    let rt = runtime();
    let log = Arc::new(Log::default());
    let runtime_addr = registry(log.clone());
    let driver = WorkerDriver::initialize(
        options(&cluster, "master-restart"),
        Box::new(MemoryStore::default()),
        log.clone(),
    )
    .unwrap();
    let futures = (0..20)
        .map(|_| driver.request_worker(worker_spec("tm", &runtime_addr)))
        .collect();
    join_all(&rt, complete_all(&rt, &log, futures));
    wait_until(
        Duration::from_secs(30),
        "20 running",
        || format!("{:?}", log.all()),
        || (log.count(|s| matches!(s, Seen::Running(_))) == 20).then_some(()),
    );
    let framework = driver.framework_id().unwrap();
    cluster.master.restart_same_port();
    cluster.wait_agents(3);
    wait_until(
        Duration::from_secs(30),
        "re-registration",
        || format!("{:?}", log.all()),
        || (log.count(|s| *s == Seen::Connection(ConnectionState::Reconnected)) >= 1).then_some(()),
    );
    let after = rt
        .block_on(async {
            tokio::time::timeout(
                Duration::from_secs(30),
                driver.request_worker(worker_spec("tm", &runtime_addr)),
            )
            .await
        })
        .expect("served after the failover");
    assert!(after.is_ok(), "{after:?}");
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(driver.framework_id(), Some(framework));
    assert!(log.terminations().is_empty(), "{:?}", log.terminations());
    assert_eq!(live_tasks(&cluster), 21, "{}", cluster.logs());
    rt.block_on(driver.deregister(FinalStatus::Succeeded, None))
        .unwrap();
}

/// §7 test 9, 11 and 14: the runtime stops (failover mode) with 6
/// workers launched and 2 requests pending; the next attempt, on the
/// same store, recovers exactly the 6 (the 2 New are dropped, never
/// launched) as the same framework, and kills silently a task whose
/// record was lost; deregistering then ends every task and empties the
/// store.
#[test]
fn runtime_failover_recovers_launched_workers_and_leaks_nothing() {
    let cluster = cluster(3);
    let rt = runtime();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("workers.log");
    let log_a = Arc::new(Log::default());
    let runtime_addr = registry(log_a.clone());
    let driver = WorkerDriver::initialize(
        options(&cluster, "failover"),
        Box::new(FileStore::open(&path).unwrap()),
        log_a.clone(),
    )
    .unwrap();
    let futures = (0..7)
        .map(|_| driver.request_worker(worker_spec("tm", &runtime_addr)))
        .collect();
    let launched = join_all(&rt, complete_all(&rt, &log_a, futures));
    let nowhere =
        worker_spec("nowhere", &runtime_addr).constraint(Constraint::equals("hostname", "nowhere"));
    let pending: Vec<_> = (0..2)
        .map(|_| driver.request_worker(nowhere.clone()))
        .collect();
    wait_until(
        Duration::from_secs(30),
        "7 running",
        || format!("{:?}", log_a.all()),
        || (log_a.count(|s| matches!(s, Seen::Running(_))) == 7).then_some(()),
    );
    let framework = driver.framework_id().unwrap();
    rt.block_on(driver.terminate());
    for f in pending {
        assert_eq!(rt.block_on(f), Err(RequestError::Stopped));
    }
    assert!(
        driver.release_worker(&launched[0].id).is_err(),
        "a stopped driver refuses calls"
    );
    // The last record is lost (as if its write never happened): that
    // task is unknown to the next attempt.
    let forgotten = launched[6].id.clone();
    {
        let mut store = FileStore::open(&path).unwrap();
        let state = store.load().unwrap();
        assert_eq!(state.workers.len(), 9, "7 Launched and 2 New records");
        store
            .apply(&[agora_workers::store::StoreOp::Remove {
                id: forgotten.clone(),
            }])
            .unwrap();
    }
    // /state trails the master by up to one snapshot interval.
    wait_until(
        Duration::from_secs(5),
        "the 7 workers in /state",
        || format!("{} live", live_tasks(&cluster)),
        || (live_tasks(&cluster) == 7).then_some(()),
    );
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(live_tasks(&cluster), 7, "workers outlive the runtime");
    let log_b = Arc::new(Log::default());
    let second = WorkerDriver::initialize(
        options(&cluster, "failover"),
        Box::new(FileStore::open(&path).unwrap()),
        log_b.clone(),
    )
    .unwrap();
    wait_until(
        Duration::from_secs(20),
        "re-registration",
        || format!("{:?}", log_b.all()),
        || (log_b.count(|s| matches!(s, Seen::Connection(_))) >= 1).then_some(()),
    );
    let Seen::Recovered(recovered) = &log_b.all()[0] else {
        panic!("recovery comes first: {:?}", log_b.all())
    };
    let mut expected: Vec<WorkerId> = launched[..6].iter().map(|w| w.id.clone()).collect();
    expected.sort();
    assert_eq!(recovered, &expected);
    assert_eq!(second.framework_id(), Some(framework));
    assert_eq!(second.attempt(), 2);
    wait_until(
        Duration::from_secs(20),
        "the forgotten task killed",
        || cluster.logs(),
        || (live_tasks(&cluster) == 6).then_some(()),
    );
    assert!(
        log_b.terminations().iter().all(|(id, _)| *id != forgotten),
        "no event for an unknown task"
    );
    rt.block_on(second.deregister(FinalStatus::Succeeded, Some("test over".into())))
        .unwrap();
    wait_until(
        Duration::from_secs(20),
        "every task ended",
        || cluster.logs(),
        || (live_tasks(&cluster) == 0).then_some(()),
    );
    let state = FileStore::open(&path).unwrap().load().unwrap();
    assert!(
        state.workers.is_empty() && state.framework_id.is_none(),
        "{state:?}"
    );
}
