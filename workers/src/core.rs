//! The worker driver's sans-IO core: every decision of the
//! [`WorkerDriver`](crate::WorkerDriver), with no sockets, threads or clock.
//!
//! [`WorkerCore`] takes requests, offers, status updates, connection
//! changes and clock ticks (`now` is always an argument) and returns the
//! [`Action`]s to carry out, in order. The order is the contract:
//!
//! - a placement round returns `Persist` (every worker now Launched),
//!   then `Complete` (each request's future), then `Launch`, then
//!   `Decline` of every offer it did not use: no offer is kept past the
//!   round, and a future completes before its task is sent;
//! - a terminal status returns `Persist` (the record removed), then the
//!   `Terminated` event, then the `Acknowledge`: the update is
//!   acknowledged only once it has been acted on;
//! - a worker leaves the core on its first terminal report, so a repeated
//!   report finds no worker and raises no second event.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use agora_proto::{AgentId, FrameworkId, Offer, OfferId, TaskId, TaskInfo, TaskState, TaskStatus};
use rand::{Rng, SeedableRng};
use tokio::time::Instant;

use crate::events::{ConnectionState, TerminationCause, WorkerHandle, WorkerId};
use crate::placement::{self, LiveWorker, PendingRequest, Topology};
use crate::spec::{WorkerLaunch, WorkerSpec};
use crate::store::{Placed, StoreOp, StoreState, WorkerRecord, WorkerState};
use crate::RequestError;

/// The timings and limits of the core (see [`crate::DriverOptions`]).
#[derive(Debug, Clone)]
pub(crate) struct CoreConfig {
    pub(crate) locality_wait: Duration,
    pub(crate) refuse_unusable: Duration,
    pub(crate) refuse_idle: Duration,
    pub(crate) kill_retry: Duration,
    pub(crate) launch_timeout: Duration,
    pub(crate) reconcile_min: Duration,
    pub(crate) reconcile_max: Duration,
    pub(crate) rack_attribute: String,
    pub(crate) seed: u64,
}

/// What the runtime's handler is told.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Event {
    Recovered(Vec<WorkerHandle>),
    Running(WorkerHandle),
    Terminated {
        id: WorkerId,
        cause: TerminationCause,
        diagnostics: String,
    },
    Connection(ConnectionState),
}

/// What the driver must do, in order.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Action {
    /// Write these changes to the store before anything after them.
    Persist(Vec<StoreOp>),
    /// Complete a request's future.
    Complete {
        id: WorkerId,
        result: Result<WorkerHandle, RequestError>,
    },
    /// Accept an offer with these tasks; what is left is declined for `refuse`.
    Launch {
        offer_id: OfferId,
        tasks: Vec<TaskInfo>,
        refuse: Duration,
    },
    /// Decline offers for `refuse`.
    Decline {
        offer_ids: Vec<OfferId>,
        refuse: Duration,
    },
    Kill {
        task_id: TaskId,
        agent_id: Option<AgentId>,
    },
    /// Explicit reconciliation of these tasks; empty means implicit (all).
    Reconcile(Vec<(TaskId, Option<AgentId>)>),
    Suppress,
    Revive,
    Acknowledge(TaskStatus),
    Event(Event),
}

/// A request not placed yet.
#[derive(Debug)]
struct Pending {
    id: WorkerId,
    spec: WorkerSpec,
    since: Instant,
}

/// A launched worker, until its first terminal report.
#[derive(Debug)]
struct Live {
    handle: WorkerHandle,
    released: bool,
    running: bool,
    /// Any report since launch (or since recovery).
    heard: bool,
    launched_at: Instant,
    last_kill: Option<Instant>,
    reconcile: Option<Reconciling>,
}

/// An explicit reconciliation in progress for one worker.
#[derive(Debug, Clone, Copy)]
struct Reconciling {
    next: Instant,
    backoff: Duration,
}

/// The core (see the module docs).
#[derive(Debug)]
pub(crate) struct WorkerCore {
    config: CoreConfig,
    attempt: u64,
    next_seq: u64,
    framework_id: Option<FrameworkId>,
    /// Pending requests in request order.
    pending: BTreeMap<u64, Pending>,
    pending_seq: HashMap<WorkerId, u64>,
    workers: HashMap<WorkerId, Live>,
    topology: Topology,
    registered: bool,
    suppressed: bool,
    /// Offers were declined with a filter since the last revive.
    filtered: bool,
    /// Offers were declined because a request waits for better locality.
    delayed_until: Option<Instant>,
    revive_wanted: bool,
    stopped: bool,
    rng: rand::rngs::StdRng,
}

// === impl WorkerCore ===

impl WorkerCore {
    pub(crate) fn new(config: CoreConfig) -> Self {
        WorkerCore {
            topology: Topology::new(&config.rack_attribute),
            rng: rand::rngs::StdRng::seed_from_u64(config.seed),
            config,
            attempt: 0,
            next_seq: 0,
            framework_id: None,
            pending: BTreeMap::new(),
            pending_seq: HashMap::new(),
            workers: HashMap::new(),
            registered: false,
            suppressed: false,
            filtered: false,
            delayed_until: None,
            revive_wanted: false,
            stopped: false,
        }
    }

    /// The framework id to subscribe with (from the store, then the master).
    pub(crate) fn framework_id(&self) -> Option<&FrameworkId> {
        self.framework_id.as_ref()
    }

    /// This attempt's number.
    pub(crate) fn attempt(&self) -> u64 {
        self.attempt
    }

    /// Requests not placed yet.
    #[cfg(test)]
    pub(crate) fn pending_count(&self) -> usize {
        self.pending.len()
    }

    /// Workers launched and not terminated.
    #[cfg(test)]
    pub(crate) fn live_count(&self) -> usize {
        self.workers.len()
    }

    /// Starts an attempt from what the store holds: New records are
    /// dropped, Launched ones recovered (and reconciled once connected),
    /// Released ones killed again once connected.
    pub(crate) fn recover(&mut self, state: StoreState, now: Instant) -> Vec<Action> {
        self.attempt = state.attempt + 1;
        self.framework_id = state.framework_id;
        let mut ops = vec![StoreOp::SetAttempt {
            attempt: self.attempt,
        }];
        let mut recovered = Vec::new();
        for (id, record) in state.workers {
            let handle = match (record.state, record.handle()) {
                (WorkerState::New, _) | (_, None) => {
                    tracing::info!(worker_id = %id, "dropping a worker requested but never launched by an earlier attempt");
                    ops.push(StoreOp::Remove { id });
                    continue;
                }
                (_, Some(handle)) => handle,
            };
            self.topology
                .learn_host(&handle.agent_id, &handle.hostname, handle.rack.as_deref());
            let released = record.state == WorkerState::Released;
            if !released {
                recovered.push(handle.clone());
            }
            self.workers.insert(
                id,
                Live {
                    handle,
                    released,
                    running: false,
                    heard: false,
                    launched_at: now,
                    last_kill: None,
                    reconcile: None,
                },
            );
        }
        recovered.sort_by(|a, b| a.id.cmp(&b.id));
        vec![
            Action::Persist(ops),
            Action::Event(Event::Recovered(recovered)),
        ]
    }

    /// A new request: the worker's intent is recorded as New.
    pub(crate) fn request(&mut self, spec: WorkerSpec, now: Instant) -> (WorkerId, Vec<Action>) {
        self.next_seq += 1;
        let id = WorkerId::new(format!("worker-{}-{}", self.attempt, self.next_seq));
        if self.stopped {
            let complete = Action::Complete {
                id: id.clone(),
                result: Err(RequestError::Stopped),
            };
            return (id, vec![complete]);
        }
        let record = WorkerRecord {
            id: id.clone(),
            state: WorkerState::New,
            spec_name: spec.name.clone(),
            placed: None,
        };
        self.pending.insert(
            self.next_seq,
            Pending {
                id: id.clone(),
                spec,
                since: now,
            },
        );
        self.pending_seq.insert(id.clone(), self.next_seq);
        if self.suppressed || self.filtered {
            self.revive_wanted = true;
        }
        (id, vec![Action::Persist(vec![StoreOp::Put { record }])])
    }

    /// Withdraws a request not placed yet; a placed one is unaffected.
    pub(crate) fn cancel(&mut self, id: &WorkerId) -> Vec<Action> {
        let Some(seq) = self.pending_seq.remove(id) else {
            return Vec::new();
        };
        self.pending.remove(&seq);
        vec![
            Action::Persist(vec![StoreOp::Remove { id: id.clone() }]),
            Action::Complete {
                id: id.clone(),
                result: Err(RequestError::Cancelled),
            },
        ]
    }

    /// Releases a worker: Released is recorded, then the task is killed
    /// (and killed again every `kill_retry` until it is reported ended).
    /// A request not placed yet is cancelled.
    pub(crate) fn release(&mut self, id: &WorkerId, now: Instant) -> Vec<Action> {
        if self.pending_seq.contains_key(id) {
            return self.cancel(id);
        }
        let Some(worker) = self.workers.get_mut(id) else {
            tracing::debug!(worker_id = %id, "release of an unknown or ended worker");
            return Vec::new();
        };
        if worker.released {
            return Vec::new();
        }
        worker.released = true;
        worker.last_kill = Some(now);
        let record = record_of(&worker.handle, WorkerState::Released);
        vec![
            Action::Persist(vec![StoreOp::Put { record }]),
            Action::Kill {
                task_id: TaskId::new(id.as_str()),
                agent_id: Some(worker.handle.agent_id.clone()),
            },
        ]
    }

    /// One placement round over a batch of offers (see the module docs).
    pub(crate) fn on_offers(&mut self, offers: Vec<Offer>, now: Instant) -> Vec<Action> {
        for offer in &offers {
            self.topology.learn(offer);
        }
        if self.pending.is_empty() || self.stopped {
            let mut actions = vec![Action::Decline {
                offer_ids: offers.into_iter().map(|o| o.id).collect(),
                refuse: self.config.refuse_idle,
            }];
            if !self.suppressed && !self.stopped {
                self.suppressed = true;
                actions.push(Action::Suppress);
            }
            return actions;
        }
        let pending: Vec<PendingRequest<'_>> = self
            .pending
            .values()
            .map(|p| PendingRequest {
                id: &p.id,
                spec: &p.spec,
                since: p.since,
            })
            .collect();
        let live: Vec<LiveWorker<'_>> = self
            .workers
            .values()
            .map(|w| LiveWorker {
                spec_name: &w.handle.spec_name,
                agent_id: &w.handle.agent_id,
            })
            .collect();
        let plan = placement::plan(
            &pending,
            &offers,
            &live,
            &self.topology,
            self.config.locality_wait,
            now,
        );

        let mut ops = Vec::new();
        let mut completes = Vec::new();
        let mut per_offer: BTreeMap<usize, Vec<TaskInfo>> = BTreeMap::new();
        for assignment in plan.assignments {
            let Some(seq) = self.pending_seq.remove(&assignment.worker) else {
                continue;
            };
            let Some(request) = self.pending.remove(&seq) else {
                continue;
            };
            let offer = &offers[assignment.offer];
            let rack = self.topology.rack(offer);
            let handle = WorkerHandle {
                id: request.id.clone(),
                spec_name: request.spec.name.clone(),
                agent_id: offer.agent_id.clone(),
                hostname: offer.hostname.clone(),
                rack: rack.clone(),
                locality: assignment.locality,
                attempt: self.attempt,
                ports: assignment.ports.clone(),
            };
            let task = request.spec.task_info(&WorkerLaunch {
                id: &request.id,
                agent_id: &offer.agent_id,
                hostname: &offer.hostname,
                rack: rack.as_deref(),
                resources: &assignment.resources,
                ports: &assignment.ports,
            });
            ops.push(StoreOp::Put {
                record: record_of(&handle, WorkerState::Launched),
            });
            per_offer.entry(assignment.offer).or_default().push(task);
            completes.push(Action::Complete {
                id: request.id.clone(),
                result: Ok(handle.clone()),
            });
            self.workers.insert(
                request.id,
                Live {
                    handle,
                    released: false,
                    running: false,
                    heard: false,
                    launched_at: now,
                    last_kill: None,
                    reconcile: None,
                },
            );
        }
        let mut actions = Vec::new();
        if !ops.is_empty() {
            actions.push(Action::Persist(ops));
        }
        actions.extend(completes);
        let leftover_refuse = if self.pending.is_empty() {
            self.config.refuse_idle
        } else {
            Duration::ZERO
        };
        for (i, tasks) in per_offer {
            actions.push(Action::Launch {
                offer_id: offers[i].id.clone(),
                tasks,
                refuse: leftover_refuse,
            });
        }
        if !plan.unusable.is_empty() {
            self.filtered = true;
            actions.push(Action::Decline {
                offer_ids: plan
                    .unusable
                    .iter()
                    .map(|i| offers[*i].id.clone())
                    .collect(),
                refuse: self.config.refuse_unusable,
            });
        }
        if !plan.delayed.is_empty() {
            // Declined until the first waiting request may step down a
            // level; then a revive brings them back at once.
            let until = plan
                .next_level_change
                .unwrap_or(now + self.config.locality_wait);
            self.delayed_until = Some(self.delayed_until.map_or(until, |d| d.min(until)));
            self.filtered = true;
            let refuse = until
                .saturating_duration_since(now)
                .max(Duration::from_millis(100));
            actions.push(Action::Decline {
                offer_ids: plan.delayed.iter().map(|i| offers[*i].id.clone()).collect(),
                refuse,
            });
        }
        if self.pending.is_empty() && !self.suppressed {
            self.suppressed = true;
            actions.push(Action::Suppress);
        }
        actions
    }

    /// Revives offers if a request arrived while they were suppressed or
    /// filtered, or a waiting request may now take a worse level. Called
    /// after each batch of inputs, so a burst of requests revives once.
    pub(crate) fn flush(&mut self) -> Vec<Action> {
        let revive = std::mem::take(&mut self.revive_wanted);
        if !revive || self.pending.is_empty() || self.stopped || !self.registered {
            return Vec::new();
        }
        self.suppressed = false;
        self.filtered = false;
        self.delayed_until = None;
        vec![Action::Revive]
    }

    /// A status update (see the module docs for the exactly-once rule).
    pub(crate) fn on_status(&mut self, status: TaskStatus, now: Instant) -> Vec<Action> {
        let id = WorkerId::new(status.task_id.as_str());
        let mut actions = Vec::new();
        match self.workers.get_mut(&id) {
            None => {
                if !status.state.is_terminal() && status.state != TaskState::Unknown {
                    // A task this runtime does not know (its record was
                    // lost, or it belongs to a released past): kill it,
                    // tell nobody.
                    tracing::info!(task_id = %status.task_id, state = %status.state, "killing a task the worker store does not know");
                    actions.push(Action::Kill {
                        task_id: status.task_id.clone(),
                        agent_id: status.agent_id.clone(),
                    });
                }
            }
            Some(worker) => {
                worker.heard = true;
                worker.reconcile = None;
                if status.state.is_terminal() {
                    let cause = TerminationCause::of(&status, worker.released);
                    let diagnostics = format!(
                        "{} ({})",
                        status.state,
                        status.message.as_deref().unwrap_or("no message")
                    );
                    self.workers.remove(&id);
                    actions.push(Action::Persist(vec![StoreOp::Remove { id: id.clone() }]));
                    actions.push(Action::Event(Event::Terminated {
                        id,
                        cause,
                        diagnostics,
                    }));
                    // Its resources return; a waiting request may use them.
                    if !self.pending.is_empty() {
                        self.revive_wanted = true;
                    }
                } else if status.state == TaskState::Running && !worker.running {
                    worker.running = true;
                    actions.push(Action::Event(Event::Running(worker.handle.clone())));
                } else if status.state == TaskState::Unknown {
                    worker.heard = false;
                    worker.reconcile = Some(Reconciling {
                        next: now + self.config.reconcile_min,
                        backoff: self.config.reconcile_min,
                    });
                }
            }
        }
        if status.uuid.is_some() {
            actions.push(Action::Acknowledge(status));
        }
        actions
    }

    /// The master removed an agent: each worker on it ends, once.
    pub(crate) fn on_agent_lost(&mut self, agent_id: &AgentId) -> Vec<Action> {
        let mut lost: Vec<WorkerId> = self
            .workers
            .iter()
            .filter(|(_, w)| &w.handle.agent_id == agent_id)
            .map(|(id, _)| id.clone())
            .collect();
        if lost.is_empty() {
            return Vec::new();
        }
        lost.sort();
        let mut ops = Vec::new();
        let mut events = Vec::new();
        for id in lost {
            let Some(worker) = self.workers.remove(&id) else {
                continue;
            };
            let cause = if worker.released {
                TerminationCause::Killed
            } else {
                TerminationCause::AgentLost
            };
            ops.push(StoreOp::Remove { id: id.clone() });
            events.push(Action::Event(Event::Terminated {
                id,
                cause,
                diagnostics: format!("agent {agent_id} was lost"),
            }));
        }
        if !self.pending.is_empty() {
            self.revive_wanted = true;
        }
        let mut actions = vec![Action::Persist(ops)];
        actions.extend(events);
        actions
    }

    /// Subscribed (`framework_id`: first time in this attempt; `None`:
    /// again after a drop). Every worker is reconciled, released ones
    /// are killed again, and offers are revived or suppressed.
    pub(crate) fn on_subscribed(
        &mut self,
        framework_id: Option<FrameworkId>,
        now: Instant,
    ) -> Vec<Action> {
        self.registered = true;
        let mut actions = Vec::new();
        let state = match framework_id {
            Some(fid) => {
                if self.framework_id.as_ref() != Some(&fid) {
                    self.framework_id = Some(fid.clone());
                    actions.push(Action::Persist(vec![StoreOp::SetFrameworkId {
                        framework_id: fid,
                    }]));
                }
                ConnectionState::Connected
            }
            None => ConnectionState::Reconnected,
        };
        actions.push(Action::Event(Event::Connection(state)));
        let mut reconcile = Vec::new();
        let mut ids: Vec<&WorkerId> = self.workers.keys().collect();
        ids.sort();
        for id in ids {
            let Some(worker) = self.workers.get(id) else {
                continue;
            };
            reconcile.push((
                TaskId::new(id.as_str()),
                Some(worker.handle.agent_id.clone()),
            ));
        }
        let min = self.config.reconcile_min;
        for worker in self.workers.values_mut() {
            worker.reconcile = Some(Reconciling {
                next: now + min,
                backoff: min,
            });
            if worker.released {
                worker.last_kill = Some(now);
                actions.push(Action::Kill {
                    task_id: TaskId::new(worker.handle.id.as_str()),
                    agent_id: Some(worker.handle.agent_id.clone()),
                });
            }
        }
        if !reconcile.is_empty() {
            actions.push(Action::Reconcile(reconcile));
        }
        // Implicit reconciliation finds tasks the store does not know.
        actions.push(Action::Reconcile(Vec::new()));
        // A new subscription starts with no filters: offers come anew.
        self.filtered = false;
        self.delayed_until = None;
        if self.pending.is_empty() {
            self.suppressed = true;
            actions.push(Action::Suppress);
        } else {
            self.suppressed = false;
            actions.push(Action::Revive);
        }
        actions
    }

    /// The connection dropped: offers are void; everything else waits.
    pub(crate) fn on_disconnected(&mut self) -> Vec<Action> {
        if !self.registered {
            return Vec::new();
        }
        self.registered = false;
        vec![Action::Event(Event::Connection(
            ConnectionState::Disconnected,
        ))]
    }

    /// A clock tick: kill retries, launch timeouts, reconciliation
    /// retries with backoff and jitter, and delay-scheduling wake-ups.
    pub(crate) fn on_tick(&mut self, now: Instant) -> Vec<Action> {
        if !self.registered || self.stopped {
            return Vec::new();
        }
        let mut actions = Vec::new();
        let mut reconcile = Vec::new();
        let config = &self.config;
        let mut ids: Vec<WorkerId> = self.workers.keys().cloned().collect();
        ids.sort();
        for id in ids {
            let Some(worker) = self.workers.get_mut(&id) else {
                continue;
            };
            if worker.released
                && worker
                    .last_kill
                    .is_none_or(|t| now.saturating_duration_since(t) >= config.kill_retry)
            {
                worker.last_kill = Some(now);
                actions.push(Action::Kill {
                    task_id: TaskId::new(id.as_str()),
                    agent_id: Some(worker.handle.agent_id.clone()),
                });
            }
            if !worker.heard
                && worker.reconcile.is_none()
                && now.saturating_duration_since(worker.launched_at) >= config.launch_timeout
            {
                tracing::info!(worker_id = %id, "no report since the launch; reconciling");
                worker.reconcile = Some(Reconciling {
                    next: now,
                    backoff: config.reconcile_min,
                });
            }
            if let Some(r) = worker.reconcile.as_mut() {
                if r.next <= now {
                    reconcile.push((
                        TaskId::new(id.as_str()),
                        Some(worker.handle.agent_id.clone()),
                    ));
                    let jitter = 1.0 + self.rng.random_range(-0.2..0.2);
                    r.next = now + r.backoff.mul_f64(jitter);
                    r.backoff = (r.backoff * 2).min(config.reconcile_max);
                }
            }
        }
        if !reconcile.is_empty() {
            actions.push(Action::Reconcile(reconcile));
        }
        if self.delayed_until.is_some_and(|t| t <= now) {
            self.delayed_until = None;
            self.revive_wanted = true;
        }
        actions
    }

    /// Deregistration: every pending request fails, the store is cleared;
    /// the driver then tears the framework down (killing every worker).
    pub(crate) fn deregister(&mut self) -> Vec<Action> {
        let mut actions = self.fail_pending(RequestError::Deregistered);
        self.workers.clear();
        actions.insert(0, Action::Persist(vec![StoreOp::Clear]));
        self.stopped = true;
        actions
    }

    /// The driver stops (terminated, leadership revoked, or a fatal
    /// error): pending requests fail with `error`; workers and the store
    /// are left as they are for the next attempt.
    pub(crate) fn stop(&mut self, error: RequestError) -> Vec<Action> {
        self.stopped = true;
        self.fail_pending(error)
    }

    fn fail_pending(&mut self, error: RequestError) -> Vec<Action> {
        let pending = std::mem::take(&mut self.pending);
        self.pending_seq.clear();
        pending
            .into_values()
            .map(|p| Action::Complete {
                id: p.id,
                result: Err(error.clone()),
            })
            .collect()
    }
}

fn record_of(handle: &WorkerHandle, state: WorkerState) -> WorkerRecord {
    WorkerRecord {
        id: handle.id.clone(),
        state,
        spec_name: handle.spec_name.clone(),
        placed: Some(Placed {
            agent_id: handle.agent_id.clone(),
            hostname: handle.hostname.clone(),
            rack: handle.rack.clone(),
            locality: handle.locality,
            attempt: handle.attempt,
            ports: handle.ports.clone(),
        }),
    }
}

#[cfg(test)]
mod tests;
