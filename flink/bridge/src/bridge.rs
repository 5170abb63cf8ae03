//! The bridge's loop: reads commands, drives the [`WorkerDriver`], and
//! writes events in an order the Flink driver can rely on.
//!
//! Order: `recovered` first; a worker's `running` and `terminated` never
//! before its `placed` (the futures complete on the worker driver's
//! thread before it sends the task, but `placed` is written by the task
//! awaiting the future, so the writer holds a worker's later events
//! until its `placed` is out); `ended` last.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use agora_workers::election::{ElectionOptions, LeaderContender, LeaderElection, LeaderEpoch};
use agora_workers::store::EtcdStore;
use agora_workers::{
    ConnectionState, DriverOptions, FatalError, FileStore, MemoryStore, RequestId,
    TerminationCause, WorkerDriver, WorkerEventHandler, WorkerHandle, WorkerId, WorkerStore,
};
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;

use crate::protocol::{Command, Event};
use crate::store::StoreChoice;

/// How long requests still in flight get to fail once the driver stopped.
const DRAIN_REQUESTS: Duration = Duration::from_secs(5);

/// How long a `deregister` waits for the driver to be subscribed: only a
/// subscribed framework can be torn down (its workers would otherwise
/// run on until the failover timeout, unrecorded).
const DEREGISTER_CONNECT_WAIT: Duration = Duration::from_secs(30);

/// Everything the bridge needs.
#[derive(Debug, Clone)]
pub struct BridgeOptions {
    /// The worker driver's options (master, framework name, role, …).
    pub driver: DriverOptions,
    /// The worker store.
    pub store: StoreChoice,
    /// Lease of the etcd election (etcd store only).
    pub election_ttl: Duration,
    /// How long to wait to win the etcd election (a previous JobManager's
    /// bridge may hold it until its lease runs out).
    pub election_timeout: Duration,
}

/// How the bridge ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// What `ended` said.
    pub reason: String,
    /// Whether it ended on an error (the process exits non-zero).
    pub failed: bool,
}

/// Feeds the worker driver's callbacks to the writer, and keeps whether
/// the driver is subscribed.
struct Handler {
    events: mpsc::UnboundedSender<Event>,
    connected: watch::Sender<bool>,
}

struct Contender(mpsc::UnboundedSender<Option<LeaderEpoch>>);

/// The leadership held in etcd, with the stream of revocations.
struct Elected {
    election: Arc<LeaderElection>,
    epoch: LeaderEpoch,
    grants: mpsc::UnboundedReceiver<Option<LeaderEpoch>>,
}

// === run ===

/// Runs the bridge until `deregister`, `terminate`, the end of `input`,
/// `shutdown` (as `terminate`), or a fatal error; every event goes to
/// `output` as one JSON line.
pub async fn run<R, W>(
    options: BridgeOptions,
    input: R,
    output: W,
    shutdown: impl Future<Output = ()>,
) -> Outcome
where
    R: AsyncBufRead + Unpin,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let (events, rx) = mpsc::unbounded_channel();
    let writer = tokio::spawn(write_events(rx, output));
    let outcome = serve(options, input, &events, shutdown).await;
    let _ = events.send(Event::Ended {
        reason: outcome.reason.clone(),
    });
    drop(events);
    let _ = writer.await;
    outcome
}

async fn serve<R>(
    options: BridgeOptions,
    input: R,
    events: &mpsc::UnboundedSender<Event>,
    shutdown: impl Future<Output = ()>,
) -> Outcome
where
    R: AsyncBufRead + Unpin,
{
    tokio::pin!(shutdown);
    let failed = |reason: String| {
        let _ = events.send(Event::Error {
            message: reason.clone(),
        });
        Outcome {
            reason,
            failed: true,
        }
    };
    let mut elected = None;
    let store: Box<dyn WorkerStore> = match &options.store {
        StoreChoice::Memory => Box::new(MemoryStore::default()),
        StoreChoice::File(path) => match FileStore::open(path) {
            Ok(store) => Box::new(store),
            Err(e) => return failed(format!("worker store: {e}")),
        },
        StoreChoice::Etcd { endpoint, prefix } => {
            let won = match elect(endpoint, prefix, &options).await {
                Ok(won) => won,
                Err(e) => return failed(e),
            };
            let store = EtcdStore::new(endpoint, prefix, won.election.leader_key(), won.epoch);
            elected = Some(won);
            match store {
                Ok(store) => Box::new(store),
                Err(e) => return failed(format!("worker store: {e}")),
            }
        }
    };
    let (connected, connection) = watch::channel(false);
    let handler = Arc::new(Handler {
        events: events.clone(),
        connected,
    });
    let driver = match WorkerDriver::initialize(options.driver.clone(), store, handler) {
        Ok(driver) => driver,
        Err(e) => return failed(format!("cannot start the worker driver: {e}")),
    };
    tracing::info!(
        master = %options.driver.master,
        store = %options.store,
        "the worker driver started"
    );
    if let Some(won) = &elected {
        let (election, epoch) = (won.election.clone(), won.epoch);
        let address = options.driver.hostname.clone();
        let confirmed =
            tokio::task::spawn_blocking(move || election.confirm_leadership(epoch, &address)).await;
        if !matches!(confirmed, Ok(Ok(true))) {
            driver.terminate().await;
            return failed("lost the etcd leadership before confirming it".into());
        }
    }

    let mut lines = input.lines();
    let mut requests: HashMap<u64, RequestId> = HashMap::new();
    let mut in_flight: JoinSet<u64> = JoinSet::new();
    let outcome = loop {
        let revoked = async {
            match elected.as_mut() {
                Some(won) => loop {
                    match won.grants.recv().await {
                        Some(Some(_)) => continue,
                        Some(None) | None => return,
                    }
                },
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            line = lines.next_line() => match line {
                Ok(Some(line)) => {
                    if let Some(outcome) = on_line(&driver, &line, events, &connection, &mut requests, &mut in_flight).await {
                        break outcome;
                    }
                }
                Ok(None) => {
                    driver.terminate().await;
                    break Outcome { reason: "stdin closed: terminated (workers keep running)".into(), failed: false };
                }
                Err(e) => {
                    driver.terminate().await;
                    break failed(format!("reading stdin: {e}"));
                }
            },
            Some(done) = in_flight.join_next(), if !in_flight.is_empty() => {
                if let Ok(request) = done {
                    requests.remove(&request);
                }
            }
            reason = driver.wait() => {
                break Outcome { reason: format!("the worker driver stopped: {reason}"), failed: true };
            }
            () = &mut shutdown => {
                driver.terminate().await;
                break Outcome { reason: "signalled: terminated (workers keep running)".into(), failed: false };
            }
            () = revoked => {
                driver.terminate().await;
                break failed("the etcd leadership was lost: another JobManager's bridge leads".into());
            }
        }
    };
    // Requests still open fail now that the driver has stopped.
    let _ = tokio::time::timeout(DRAIN_REQUESTS, async {
        while in_flight.join_next().await.is_some() {}
    })
    .await;
    if let Some(won) = elected {
        drop(won.grants);
        if let Ok(election) = Arc::try_unwrap(won.election) {
            let _ = tokio::task::spawn_blocking(move || election.close()).await;
        }
    }
    outcome
}

/// Carries out one line; returns the outcome when the bridge must end.
async fn on_line(
    driver: &WorkerDriver,
    line: &str,
    events: &mpsc::UnboundedSender<Event>,
    connection: &watch::Receiver<bool>,
    requests: &mut HashMap<u64, RequestId>,
    in_flight: &mut JoinSet<u64>,
) -> Option<Outcome> {
    if line.trim().is_empty() {
        return None;
    }
    let refuse = |error: String| {
        tracing::warn!(%error, "refused a command");
        let _ = events.send(Event::Refused {
            line: line.chars().take(200).collect(),
            error,
        });
    };
    let command = match serde_json::from_str::<Command>(line) {
        Ok(command) => command,
        Err(e) => {
            refuse(e.to_string());
            return None;
        }
    };
    match command {
        Command::Request { request, spec } => {
            if requests.contains_key(&request) {
                refuse(format!("request {request} is already pending"));
                return None;
            }
            let spec = match spec.to_spec() {
                Ok(spec) => spec,
                Err(e) => {
                    let _ = events.send(Event::RequestFailed {
                        request,
                        error: e.to_string(),
                    });
                    return None;
                }
            };
            let future = driver.request_worker(spec);
            requests.insert(request, future.request_id());
            let events = events.clone();
            in_flight.spawn(async move {
                let event = match future.await {
                    Ok(worker) => Event::Placed { request, worker },
                    Err(e) => Event::RequestFailed {
                        request,
                        error: e.to_string(),
                    },
                };
                let _ = events.send(event);
                request
            });
        }
        Command::Cancel { request } => match requests.get(&request) {
            Some(id) => {
                if let Err(e) = driver.cancel(*id) {
                    refuse(e.to_string());
                }
            }
            None => refuse(format!("no pending request {request}")),
        },
        Command::Release { worker } => {
            if let Err(e) = driver.release_worker(&worker) {
                refuse(e.to_string());
            }
        }
        Command::Deregister {
            status,
            diagnostics,
        } => {
            let mut connection = connection.clone();
            let subscribed =
                tokio::time::timeout(DEREGISTER_CONNECT_WAIT, connection.wait_for(|c| *c)).await;
            if !matches!(subscribed, Ok(Ok(_))) {
                tracing::warn!(
                    "deregistering while not subscribed to a master: the master tears the framework down only after its failover timeout"
                );
            }
            let result = driver.deregister(status.into(), diagnostics).await;
            return Some(match result {
                Ok(()) => Outcome {
                    reason: "deregistered".into(),
                    failed: false,
                },
                Err(e) => Outcome {
                    reason: format!("deregistering failed: {e}"),
                    failed: true,
                },
            });
        }
        Command::Terminate {} => {
            driver.terminate().await;
            return Some(Outcome {
                reason: "terminated (workers keep running)".into(),
                failed: false,
            });
        }
    }
    None
}

/// Campaigns in etcd until this bridge leads, or the timeout.
async fn elect(endpoint: &str, prefix: &str, options: &BridgeOptions) -> Result<Elected, String> {
    let mut election_options = ElectionOptions::new(endpoint, prefix);
    election_options.lease_ttl = options.election_ttl;
    let (tx, mut grants) = mpsc::unbounded_channel();
    let election = LeaderElection::start(election_options, Arc::new(Contender(tx)))
        .map_err(|e| format!("etcd election: {e}"))?;
    tracing::info!(%endpoint, %prefix, "campaigning for the worker store in etcd");
    let deadline = tokio::time::Instant::now() + options.election_timeout;
    loop {
        match tokio::time::timeout_at(deadline, grants.recv()).await {
            Ok(Some(Some(epoch))) => {
                tracing::info!(epoch = epoch.0, "leading the worker store in etcd");
                return Ok(Elected {
                    election: Arc::new(election),
                    epoch,
                    grants,
                });
            }
            Ok(Some(None)) => continue,
            Ok(None) => return Err("the etcd election stopped".into()),
            Err(_) => {
                let _ = tokio::task::spawn_blocking(move || election.close()).await;
                return Err(format!(
                    "did not win the etcd election under {prefix} within {:?} (another JobManager's bridge leads)",
                    options.election_timeout
                ));
            }
        }
    }
}

/// Writes events as JSON lines, holding a worker's `running` and
/// `terminated` until its `placed` (or `recovered`) is out.
async fn write_events<W>(mut rx: mpsc::UnboundedReceiver<Event>, mut output: W)
where
    W: AsyncWrite + Unpin,
{
    let mut known: HashSet<WorkerId> = HashSet::new();
    let mut held: HashMap<WorkerId, Vec<Event>> = HashMap::new();
    let mut broken = false;
    while let Some(event) = rx.recv().await {
        let mut out = Vec::new();
        match &event {
            Event::Recovered { workers, .. } => {
                known.extend(workers.iter().map(|w| w.id.clone()));
                out.push(event);
            }
            Event::Placed { worker, .. } => {
                let id = worker.id.clone();
                known.insert(id.clone());
                out.push(event);
                out.extend(held.remove(&id).unwrap_or_default());
            }
            Event::Ended { .. } => {
                out.extend(held.drain().flat_map(|(_, events)| events));
                out.push(event);
            }
            _ => match event.follows_worker() {
                Some(id) if !known.contains(id) => {
                    held.entry(id.clone()).or_default().push(event);
                }
                _ => out.push(event),
            },
        }
        for event in out {
            if let Event::Terminated { worker, .. } = &event {
                known.remove(worker);
            }
            if broken {
                continue;
            }
            let mut line = match serde_json::to_vec(&event) {
                Ok(line) => line,
                Err(e) => {
                    tracing::error!(error = %e, "cannot encode an event");
                    continue;
                }
            };
            line.push(b'\n');
            if output.write_all(&line).await.is_err() || output.flush().await.is_err() {
                // The JobManager is gone; stdin's end stops the bridge.
                tracing::warn!("stdout is closed; events are no longer delivered");
                broken = true;
            }
        }
    }
}

// === impl Handler ===

impl WorkerEventHandler for Handler {
    fn on_previous_attempt_workers_recovered(&self, workers: Vec<WorkerHandle>) {
        tracing::info!(
            workers = workers.len(),
            "previous attempts' workers recovered"
        );
        let _ = self.events.send(Event::Recovered { workers });
    }

    fn on_worker_running(&self, worker: &WorkerHandle) {
        let _ = self.events.send(Event::Running {
            worker: worker.id.clone(),
        });
    }

    fn on_worker_terminated(&self, id: &WorkerId, cause: TerminationCause, diagnostics: &str) {
        tracing::info!(worker_id = %id, %cause, diagnostics, "worker terminated");
        let _ = self.events.send(Event::terminated(id, cause, diagnostics));
    }

    fn on_connection(&self, state: ConnectionState) {
        tracing::info!(?state, "connection to the master");
        self.connected
            .send_replace(state != ConnectionState::Disconnected);
        let _ = self.events.send(Event::Connection { state });
    }

    fn on_error(&self, error: &FatalError) {
        tracing::error!(%error, "the worker driver failed");
        let _ = self.events.send(Event::Error {
            message: error.to_string(),
        });
    }
}

// === impl Contender ===

impl LeaderContender for Contender {
    fn grant_leadership(&self, epoch: LeaderEpoch) {
        let _ = self.0.send(Some(epoch));
    }

    fn revoke_leadership(&self) {
        let _ = self.0.send(None);
    }
}
