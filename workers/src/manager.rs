//! [`WorkerManager`] (Flink's `ActiveResourceManager`, optional): keeps
//! the declared number of workers of each spec, on top of a
//! [`WorkerDriver`].
//!
//! - **Declarations**: [`WorkerManager::declare`] sets how many workers
//!   of a spec the runtime wants. Too few: new requests. Too many:
//!   releases in Flink's order — pending requests first (cancelled), then
//!   started workers that have not registered, then registered ones.
//! - **Replacement**: a terminated worker is replaced when the
//!   declaration still wants it (the driver itself never replaces).
//! - **Registration timeout** (default 5 min): a started worker that has
//!   not registered with the runtime ([`WorkerManager::worker_registered`])
//!   by then is released and replaced.
//! - **Start-failure rate limit**: a worker that ends before it
//!   registered is a start failure. Once `max_failures` happened within
//!   `failure_window` (default 10 per minute), no worker is requested
//!   until the rate is back under the limit, and for at least
//!   `retry_interval` (default 3 s): a crashing worker cannot make the
//!   manager request more than the limit.
//! - **Recovery**: previous-attempt workers count toward their spec; each
//!   must register within the registration timeout. [`ManagerEvent::ReadyToServe`]
//!   comes once all of them registered or ended, or after
//!   `recovery_timeout` (Flink's FLINK-24713).
//!
//! [`ManagerCore`] is the sans-IO state machine; [`WorkerManager`] runs it
//! on a tokio task next to the driver.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use crate::driver::RequestId;
use crate::events::{
    ConnectionState, FatalError, TerminationCause, WorkerEventHandler, WorkerHandle, WorkerId,
};
use crate::spec::WorkerSpec;
use crate::store::WorkerStore;
use crate::{DriverOptions, FinalStatus, RequestError, WorkerDriver, WorkerError};

/// The manager's timings and limits.
#[derive(Debug, Clone)]
pub struct ManagerOptions {
    /// A started worker must register within this. Default 5 min.
    pub registration_timeout: Duration,
    /// Start failures tolerated per `failure_window`. Default 10.
    pub max_failures: usize,
    /// The window of the failure rate. Default 1 min.
    pub failure_window: Duration,
    /// Shortest pause once the rate is exceeded. Default 3 s.
    pub retry_interval: Duration,
    /// Longest wait for recovered workers before serving. Default: the
    /// registration timeout.
    pub recovery_timeout: Duration,
    /// How often timers are checked. Default 100 ms.
    pub tick: Duration,
}

/// What the runtime hears from the manager.
#[derive(Debug, Clone, PartialEq)]
pub enum ManagerEvent {
    /// Workers of earlier attempts; they should register again.
    Recovered(Vec<WorkerHandle>),
    /// A requested worker is placed; its process will start and should
    /// register ([`WorkerManager::worker_registered`]).
    WorkerStarted(WorkerHandle),
    /// A worker's task is running.
    WorkerRunning(WorkerHandle),
    /// A worker ended (once per worker).
    WorkerTerminated {
        /// The worker.
        id: WorkerId,
        /// Why.
        cause: TerminationCause,
        /// What the master said.
        diagnostics: String,
    },
    /// A worker did not register in time and was released.
    RegistrationTimedOut(WorkerId),
    /// Start failures exceeded the rate: no requests until `until`.
    CoolingDown {
        /// When requests resume.
        until: Instant,
    },
    /// Recovery is over: every recovered worker registered or ended, or
    /// the recovery timeout passed.
    ReadyToServe,
    /// The driver's connection to the master changed.
    Connection(ConnectionState),
    /// The driver stopped on a fatal error.
    Fatal(String),
}

/// What the manager's shell must do.
#[derive(Debug, Clone, PartialEq)]
pub enum ManagerAction {
    /// Request one worker of this spec (then report the request id with
    /// [`ManagerCore::on_requested`]).
    Request(WorkerSpec),
    /// Cancel `count` outstanding requests of the spec.
    Cancel {
        /// The spec name.
        spec: String,
        /// How many.
        count: usize,
    },
    /// Release a worker.
    Release(WorkerId),
    /// Tell the runtime.
    Event(ManagerEvent),
}

/// A started (or recovered) worker.
#[derive(Debug, Clone)]
struct Started {
    spec: String,
    registered: bool,
    started_at: Instant,
    previous: bool,
}

/// The manager's state machine (see the module docs).
#[derive(Debug)]
pub struct ManagerCore {
    options: ManagerOptions,
    declared: BTreeMap<String, (WorkerSpec, usize)>,
    /// Outstanding requests per spec.
    pending: HashMap<String, usize>,
    /// Of those, how many are being cancelled.
    cancelling: HashMap<String, usize>,
    started: BTreeMap<WorkerId, Started>,
    failures: VecDeque<Instant>,
    cooldown_until: Option<Instant>,
    ready: bool,
    ready_deadline: Option<Instant>,
}

/// Runs a [`ManagerCore`] next to a [`WorkerDriver`]. Cheap to clone.
#[derive(Clone)]
pub struct WorkerManager {
    inputs: mpsc::UnboundedSender<Input>,
    driver: WorkerDriver,
    ready: watch::Receiver<bool>,
}

enum Input {
    Declare(WorkerSpec, usize),
    Registered(WorkerId),
    Release(WorkerId),
    RequestDone(RequestId, String, Result<WorkerHandle, RequestError>),
    Recovered(Vec<WorkerHandle>),
    Running(WorkerHandle),
    Terminated(WorkerId, TerminationCause, String),
    Connection(ConnectionState),
    Fatal(String),
}

/// Forwards driver events into the manager's queue.
struct Bridge(mpsc::UnboundedSender<Input>);

// === impl ManagerOptions ===

impl Default for ManagerOptions {
    fn default() -> Self {
        ManagerOptions {
            registration_timeout: Duration::from_secs(300),
            max_failures: 10,
            failure_window: Duration::from_secs(60),
            retry_interval: Duration::from_secs(3),
            recovery_timeout: Duration::from_secs(300),
            tick: Duration::from_millis(100),
        }
    }
}

// === impl ManagerCore ===

impl ManagerCore {
    /// A manager with nothing declared.
    pub fn new(options: ManagerOptions) -> Self {
        ManagerCore {
            options,
            declared: BTreeMap::new(),
            pending: HashMap::new(),
            cancelling: HashMap::new(),
            started: BTreeMap::new(),
            failures: VecDeque::new(),
            cooldown_until: None,
            ready: false,
            ready_deadline: None,
        }
    }

    /// Workers of `spec` requested or started (recovered ones included).
    pub fn total(&self, spec: &str) -> usize {
        let pending = self.pending.get(spec).copied().unwrap_or(0);
        let cancelling = self.cancelling.get(spec).copied().unwrap_or(0);
        let started = self.started.values().filter(|s| s.spec == spec).count();
        pending.saturating_sub(cancelling) + started
    }

    /// Whether requests are paused by the failure rate.
    pub fn cooling_down(&self, now: Instant) -> bool {
        self.cooldown_until.is_some_and(|t| now < t)
    }

    /// Sets the wanted number of workers of `spec`.
    pub fn declare(&mut self, spec: WorkerSpec, count: usize, now: Instant) -> Vec<ManagerAction> {
        self.declared.insert(spec.name.clone(), (spec, count));
        self.check(now)
    }

    /// The shell issued a request for `spec` (after [`ManagerAction::Request`]).
    pub fn on_requested(&mut self, _spec: &str) {}

    /// The previous attempts' workers.
    pub fn on_recovered(&mut self, workers: Vec<WorkerHandle>, now: Instant) -> Vec<ManagerAction> {
        for w in &workers {
            self.started.insert(
                w.id.clone(),
                Started {
                    spec: w.spec_name.clone(),
                    registered: false,
                    started_at: now,
                    previous: true,
                },
            );
        }
        let mut actions = vec![ManagerAction::Event(ManagerEvent::Recovered(workers))];
        self.ready_deadline = Some(now + self.options.recovery_timeout);
        actions.extend(self.check_ready(now));
        actions.extend(self.check(now));
        actions
    }

    /// A request's future completed.
    pub fn on_request_done(
        &mut self,
        spec: &str,
        result: Result<WorkerHandle, RequestError>,
        now: Instant,
    ) -> Vec<ManagerAction> {
        if let Some(p) = self.pending.get_mut(spec) {
            *p = p.saturating_sub(1);
        }
        let cancelling = self.cancelling.get(spec).copied().unwrap_or(0);
        match result {
            Ok(handle) => {
                if cancelling > 0 {
                    // The cancel came too late; the worker counts again.
                    self.cancelling.insert(spec.to_string(), cancelling - 1);
                }
                self.started.insert(
                    handle.id.clone(),
                    Started {
                        spec: handle.spec_name.clone(),
                        registered: false,
                        started_at: now,
                        previous: false,
                    },
                );
                let mut actions = vec![ManagerAction::Event(ManagerEvent::WorkerStarted(handle))];
                actions.extend(self.check(now));
                actions
            }
            Err(RequestError::Cancelled) => {
                self.cancelling
                    .insert(spec.to_string(), cancelling.saturating_sub(1));
                self.check(now)
            }
            // The driver stopped: nothing to replace through it.
            Err(_) => Vec::new(),
        }
    }

    /// The worker registered with the runtime.
    pub fn on_registered(&mut self, id: &WorkerId, now: Instant) -> Vec<ManagerAction> {
        if let Some(s) = self.started.get_mut(id) {
            s.registered = true;
        }
        self.check_ready(now)
    }

    /// A worker ended: a start failure if it had not registered; replaced
    /// when the declaration still wants it.
    pub fn on_terminated(
        &mut self,
        id: &WorkerId,
        cause: TerminationCause,
        diagnostics: String,
        now: Instant,
    ) -> Vec<ManagerAction> {
        let Some(started) = self.started.remove(id) else {
            return Vec::new();
        };
        let mut actions = vec![ManagerAction::Event(ManagerEvent::WorkerTerminated {
            id: id.clone(),
            cause,
            diagnostics,
        })];
        if !started.registered && !started.previous && cause != TerminationCause::Killed {
            actions.extend(self.record_failure(now));
        }
        actions.extend(self.check_ready(now));
        actions.extend(self.check(now));
        actions
    }

    /// The runtime no longer wants this worker: it is released and the
    /// declaration lowered by one.
    pub fn release(&mut self, id: &WorkerId, now: Instant) -> Vec<ManagerAction> {
        let Some(started) = self.started.remove(id) else {
            return Vec::new();
        };
        if let Some((_, count)) = self.declared.get_mut(&started.spec) {
            *count = count.saturating_sub(1);
        }
        let mut actions = vec![ManagerAction::Release(id.clone())];
        actions.extend(self.check(now));
        actions
    }

    /// Timers: registration timeouts, the end of a cool-down, the
    /// recovery deadline.
    pub fn on_tick(&mut self, now: Instant) -> Vec<ManagerAction> {
        let mut actions = Vec::new();
        let timeout = self.options.registration_timeout;
        let expired: Vec<WorkerId> = self
            .started
            .iter()
            .filter(|(_, s)| {
                !s.registered && now.saturating_duration_since(s.started_at) >= timeout
            })
            .map(|(id, _)| id.clone())
            .collect();
        for id in expired {
            tracing::warn!(worker_id = %id, ?timeout, "worker did not register in time; releasing it");
            self.started.remove(&id);
            actions.push(ManagerAction::Release(id.clone()));
            actions.push(ManagerAction::Event(ManagerEvent::RegistrationTimedOut(id)));
        }
        if self.cooldown_until.is_some_and(|t| t <= now) {
            self.cooldown_until = None;
        }
        actions.extend(self.check_ready(now));
        actions.extend(self.check(now));
        actions
    }

    fn record_failure(&mut self, now: Instant) -> Vec<ManagerAction> {
        let window = self.options.failure_window;
        self.failures.push_back(now);
        while self
            .failures
            .front()
            .is_some_and(|t| now.saturating_duration_since(*t) >= window)
        {
            self.failures.pop_front();
        }
        if self.failures.len() < self.options.max_failures {
            return Vec::new();
        }
        // Paused until the oldest failure in the window leaves it (the
        // rate is under the limit again), and for at least the retry
        // interval.
        let oldest = self.failures.front().copied().unwrap_or(now);
        let until = (oldest + window).max(now + self.options.retry_interval);
        self.cooldown_until = Some(until);
        tracing::warn!(
            failures = self.failures.len(),
            ?window,
            "worker start failures exceed the limit; pausing requests"
        );
        vec![ManagerAction::Event(ManagerEvent::CoolingDown { until })]
    }

    fn check_ready(&mut self, now: Instant) -> Vec<ManagerAction> {
        if self.ready || self.ready_deadline.is_none() {
            return Vec::new();
        }
        let waiting = self.started.values().any(|s| s.previous && !s.registered);
        if waiting && self.ready_deadline.is_some_and(|d| now < d) {
            return Vec::new();
        }
        self.ready = true;
        vec![ManagerAction::Event(ManagerEvent::ReadyToServe)]
    }

    /// Compares each declaration with what exists (Flink's
    /// `checkResourceDeclarations`).
    fn check(&mut self, now: Instant) -> Vec<ManagerAction> {
        let mut actions = Vec::new();
        let names: Vec<String> = self.declared.keys().cloned().collect();
        for name in names {
            let Some((spec, want)) = self.declared.get(&name).cloned() else {
                continue;
            };
            let have = self.total(&name);
            if have < want {
                if self.cooling_down(now) {
                    continue;
                }
                for _ in have..want {
                    actions.push(ManagerAction::Request(spec.clone()));
                }
                *self.pending.entry(name.clone()).or_default() += want - have;
            } else if have > want {
                let mut excess = have - want;
                let pending = self.pending.get(&name).copied().unwrap_or(0);
                let cancelling = self.cancelling.get(&name).copied().unwrap_or(0);
                let cancel = excess.min(pending.saturating_sub(cancelling));
                if cancel > 0 {
                    *self.cancelling.entry(name.clone()).or_default() += cancel;
                    actions.push(ManagerAction::Cancel {
                        spec: name.clone(),
                        count: cancel,
                    });
                    excess -= cancel;
                }
                // Unregistered workers first (newest first), then registered.
                let mut victims: Vec<(bool, Instant, WorkerId)> = self
                    .started
                    .iter()
                    .filter(|(_, s)| s.spec == name)
                    .map(|(id, s)| (s.registered, s.started_at, id.clone()))
                    .collect();
                victims.sort_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)));
                for (_, _, id) in victims.into_iter().take(excess) {
                    self.started.remove(&id);
                    actions.push(ManagerAction::Release(id));
                }
            }
        }
        actions
    }
}

// === impl WorkerManager ===

impl WorkerManager {
    /// Starts a driver with `options` and `store`, and the manager on
    /// `runtime`. Events for the runtime come on the returned receiver.
    pub fn start(
        options: DriverOptions,
        store: Box<dyn WorkerStore>,
        manager: ManagerOptions,
        runtime: &tokio::runtime::Handle,
    ) -> Result<(WorkerManager, mpsc::UnboundedReceiver<ManagerEvent>), WorkerError> {
        let (inputs, rx) = mpsc::unbounded_channel();
        let (events, events_rx) = mpsc::unbounded_channel();
        let (ready_tx, ready) = watch::channel(false);
        let driver = WorkerDriver::initialize(options, store, Arc::new(Bridge(inputs.clone())))?;
        let task = ManagerTask {
            core: ManagerCore::new(manager),
            driver: driver.clone(),
            inputs: inputs.clone(),
            events,
            ready: ready_tx,
            requests: HashMap::new(),
            runtime: runtime.clone(),
        };
        runtime.spawn(task.run(rx));
        Ok((
            WorkerManager {
                inputs,
                driver,
                ready,
            },
            events_rx,
        ))
    }

    /// Wants `count` workers of `spec` (by its name).
    pub fn declare(&self, spec: WorkerSpec, count: usize) {
        let _ = self.inputs.send(Input::Declare(spec, count));
    }

    /// The worker registered with the runtime.
    pub fn worker_registered(&self, id: &WorkerId) {
        let _ = self.inputs.send(Input::Registered(id.clone()));
    }

    /// Releases a worker the runtime no longer wants (its declaration
    /// drops by one).
    pub fn release(&self, id: &WorkerId) {
        let _ = self.inputs.send(Input::Release(id.clone()));
    }

    /// Completes once recovery is over ([`ManagerEvent::ReadyToServe`]).
    pub async fn ready_to_serve(&self) {
        let mut ready = self.ready.clone();
        let _ = ready.wait_for(|r| *r).await;
    }

    /// The driver underneath.
    pub fn driver(&self) -> &WorkerDriver {
        &self.driver
    }

    /// Deregisters the application (see [`WorkerDriver::deregister`]).
    pub async fn deregister(
        &self,
        status: FinalStatus,
        diagnostics: Option<String>,
    ) -> Result<(), WorkerError> {
        self.driver.deregister(status, diagnostics).await
    }

    /// Stops in failover mode (see [`WorkerDriver::terminate`]).
    pub async fn terminate(&self) {
        self.driver.terminate().await
    }
}

struct ManagerTask {
    core: ManagerCore,
    driver: WorkerDriver,
    inputs: mpsc::UnboundedSender<Input>,
    events: mpsc::UnboundedSender<ManagerEvent>,
    ready: watch::Sender<bool>,
    /// Outstanding requests per spec, oldest first, for cancels.
    requests: HashMap<String, VecDeque<RequestId>>,
    runtime: tokio::runtime::Handle,
}

impl ManagerTask {
    async fn run(mut self, mut rx: mpsc::UnboundedReceiver<Input>) {
        let mut tick = tokio::time::interval(self.core.options.tick);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let actions = tokio::select! {
                input = rx.recv() => {
                    let Some(input) = input else { return };
                    let now = Instant::now();
                    match input {
                        Input::Declare(spec, count) => self.core.declare(spec, count, now),
                        Input::Registered(id) => self.core.on_registered(&id, now),
                        Input::Release(id) => self.core.release(&id, now),
                        Input::RequestDone(request, spec, result) => {
                            if let Some(q) = self.requests.get_mut(&spec) {
                                q.retain(|r| *r != request);
                            }
                            self.core.on_request_done(&spec, result, now)
                        }
                        Input::Recovered(workers) => self.core.on_recovered(workers, now),
                        Input::Running(handle) => {
                            vec![ManagerAction::Event(ManagerEvent::WorkerRunning(handle))]
                        }
                        Input::Terminated(id, cause, diagnostics) => {
                            self.core.on_terminated(&id, cause, diagnostics, now)
                        }
                        Input::Connection(state) => {
                            vec![ManagerAction::Event(ManagerEvent::Connection(state))]
                        }
                        Input::Fatal(message) => {
                            vec![ManagerAction::Event(ManagerEvent::Fatal(message))]
                        }
                    }
                }
                _ = tick.tick() => self.core.on_tick(Instant::now()),
            };
            for action in actions {
                self.apply(action);
            }
        }
    }

    fn apply(&mut self, action: ManagerAction) {
        match action {
            ManagerAction::Request(spec) => {
                let name = spec.name.clone();
                let future = self.driver.request_worker(spec);
                let request = future.request_id();
                self.requests
                    .entry(name.clone())
                    .or_default()
                    .push_back(request);
                self.core.on_requested(&name);
                let inputs = self.inputs.clone();
                self.runtime.spawn(async move {
                    let result = future.await;
                    let _ = inputs.send(Input::RequestDone(request, name, result));
                });
            }
            ManagerAction::Cancel { spec, count } => {
                if let Some(q) = self.requests.get_mut(&spec) {
                    // Newest requests are the furthest from being placed.
                    for request in q.iter().rev().take(count) {
                        let _ = self.driver.cancel(*request);
                    }
                }
            }
            ManagerAction::Release(id) => {
                let _ = self.driver.release_worker(&id);
            }
            ManagerAction::Event(event) => {
                if event == ManagerEvent::ReadyToServe {
                    self.ready.send_replace(true);
                }
                let _ = self.events.send(event);
            }
        }
    }
}

// === impl Bridge ===

impl WorkerEventHandler for Bridge {
    fn on_previous_attempt_workers_recovered(&self, workers: Vec<WorkerHandle>) {
        let _ = self.0.send(Input::Recovered(workers));
    }
    fn on_worker_running(&self, worker: &WorkerHandle) {
        let _ = self.0.send(Input::Running(worker.clone()));
    }
    fn on_worker_terminated(&self, id: &WorkerId, cause: TerminationCause, diagnostics: &str) {
        let _ = self.0.send(Input::Terminated(
            id.clone(),
            cause,
            diagnostics.to_string(),
        ));
    }
    fn on_connection(&self, state: ConnectionState) {
        let _ = self.0.send(Input::Connection(state));
    }
    fn on_error(&self, error: &FatalError) {
        let _ = self.0.send(Input::Fatal(error.to_string()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::placement::Locality;
    use agora_proto::{AgentId, Resources};

    fn spec() -> WorkerSpec {
        WorkerSpec::new("tm", Resources::parse("cpus:1").unwrap(), "run")
    }

    fn handle(id: &str) -> WorkerHandle {
        WorkerHandle {
            id: WorkerId::new(id),
            spec_name: "tm".into(),
            agent_id: AgentId::new("a"),
            hostname: "h".into(),
            rack: None,
            locality: Locality::Any,
            attempt: 1,
            ports: Default::default(),
        }
    }

    fn requests(actions: &[ManagerAction]) -> usize {
        actions
            .iter()
            .filter(|a| matches!(a, ManagerAction::Request(_)))
            .count()
    }

    fn options() -> ManagerOptions {
        ManagerOptions {
            registration_timeout: Duration::from_secs(10),
            max_failures: 3,
            failure_window: Duration::from_secs(60),
            retry_interval: Duration::from_secs(3),
            recovery_timeout: Duration::from_secs(10),
            tick: Duration::from_millis(100),
        }
    }

    #[test]
    fn declarations_request_the_difference_and_replace_lost_workers() {
        let mut m = ManagerCore::new(options());
        let t0 = Instant::now();
        assert_eq!(requests(&m.declare(spec(), 3, t0)), 3);
        assert_eq!(requests(&m.declare(spec(), 3, t0)), 0, "nothing twice");
        for i in 0..3 {
            m.on_request_done("tm", Ok(handle(&format!("w{i}"))), t0);
            m.on_registered(&WorkerId::new(format!("w{i}")), t0);
        }
        assert_eq!(m.total("tm"), 3);
        let actions = m.on_terminated(
            &WorkerId::new("w1"),
            TerminationCause::AgentLost,
            String::new(),
            t0,
        );
        assert_eq!(requests(&actions), 1, "one replacement");
        // A duplicate termination is ignored.
        assert!(m
            .on_terminated(
                &WorkerId::new("w1"),
                TerminationCause::AgentLost,
                String::new(),
                t0
            )
            .is_empty());
    }

    #[test]
    fn excess_cancels_pending_first_then_unregistered_then_registered() {
        let mut m = ManagerCore::new(options());
        let t0 = Instant::now();
        m.declare(spec(), 4, t0);
        m.on_request_done("tm", Ok(handle("reg")), t0);
        m.on_registered(&WorkerId::new("reg"), t0);
        m.on_request_done("tm", Ok(handle("unreg")), t0 + Duration::from_secs(1));
        // Two still pending.
        let actions = m.declare(spec(), 1, t0 + Duration::from_secs(2));
        assert_eq!(
            actions,
            vec![
                ManagerAction::Cancel {
                    spec: "tm".into(),
                    count: 2
                },
                ManagerAction::Release(WorkerId::new("unreg")),
            ]
        );
        assert_eq!(m.total("tm"), 1);
        let actions = m.declare(spec(), 0, t0);
        assert_eq!(actions, vec![ManagerAction::Release(WorkerId::new("reg"))]);
    }

    #[test]
    fn registration_timeout_releases_and_replaces() {
        let mut m = ManagerCore::new(options());
        let t0 = Instant::now();
        m.declare(spec(), 1, t0);
        m.on_request_done("tm", Ok(handle("w0")), t0);
        assert!(m.on_tick(t0 + Duration::from_secs(9)).is_empty());
        let actions = m.on_tick(t0 + Duration::from_secs(10));
        assert!(actions.contains(&ManagerAction::Release(WorkerId::new("w0"))));
        assert!(
            actions.contains(&ManagerAction::Event(ManagerEvent::RegistrationTimedOut(
                WorkerId::new("w0")
            )))
        );
        assert_eq!(requests(&actions), 1);
        // Its later Killed termination changes nothing.
        assert!(m
            .on_terminated(
                &WorkerId::new("w0"),
                TerminationCause::Killed,
                String::new(),
                t0
            )
            .is_empty());
    }

    #[test]
    fn start_failures_are_rate_limited() {
        let mut m = ManagerCore::new(options());
        let mut now = Instant::now();
        let t0 = now;
        let mut requested = requests(&m.declare(spec(), 1, now));
        let mut n = 0;
        // A worker that dies at once, forever; simulate 5 minutes.
        while now < t0 + Duration::from_secs(300) {
            if m.total("tm") > 0 {
                n += 1;
                let id = format!("w{n}");
                m.on_request_done("tm", Ok(handle(&id)), now);
                now += Duration::from_millis(500);
                requested += requests(&m.on_terminated(
                    &WorkerId::new(id),
                    TerminationCause::Exited { code: 1 },
                    String::new(),
                    now,
                ));
            } else {
                now += Duration::from_millis(100);
                requested += requests(&m.on_tick(now));
            }
        }
        // At most 3 per minute, plus the first burst of 3.
        assert!(requested <= 3 * 5 + 3, "{requested} requests in 5 minutes");
        assert!(
            requested >= 3 * 4,
            "requests go on after each cool-down: {requested}"
        );
    }

    #[test]
    fn ready_to_serve_after_recovered_workers_register_or_the_timeout() {
        let mut m = ManagerCore::new(options());
        let t0 = Instant::now();
        let actions = m.on_recovered(vec![handle("a"), handle("b")], t0);
        assert!(!actions.contains(&ManagerAction::Event(ManagerEvent::ReadyToServe)));
        m.declare(spec(), 2, t0);
        assert!(m.on_registered(&WorkerId::new("a"), t0).is_empty());
        assert_eq!(
            m.on_registered(&WorkerId::new("b"), t0),
            vec![ManagerAction::Event(ManagerEvent::ReadyToServe)]
        );
        let mut late = ManagerCore::new(options());
        late.on_recovered(vec![handle("a")], t0);
        assert!(late
            .on_tick(t0 + Duration::from_secs(10))
            .contains(&ManagerAction::Event(ManagerEvent::ReadyToServe)));
        let mut empty = ManagerCore::new(options());
        assert!(empty
            .on_recovered(Vec::new(), t0)
            .contains(&ManagerAction::Event(ManagerEvent::ReadyToServe)));
    }
}
