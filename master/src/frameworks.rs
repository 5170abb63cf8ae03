//! Frameworks: subscription and re-subscription (scheduler failover),
//! teardown, disconnection and the failover timeout, revive/suppress,
//! resource requests, heartbeats and framework messages.

use agora_proto::hash::HashSet;
use std::sync::Arc;
use std::time::Duration;

use agora_proto::scheduler::{Event, ResourceRequest};
use agora_proto::{
    agent, validate_id, AgentId, Bytes, ExecutorId, FrameworkId, FrameworkInfo, OfferId, Resource,
    TaskId, TaskState, PROTOCOL_VERSION,
};
use tokio::time::Instant;

use crate::acls::Action;
use crate::master::{peer_seconds, ConnId, Master, CLOSE_NORMAL, CLOSE_POLICY};
use crate::registry::{FrameworkRecord, RegistryOp};
use crate::tasks::Task;
use crate::tracked::Tracked;

/// A framework the master knows.
#[derive(Debug)]
pub(crate) struct Framework {
    pub(crate) id: FrameworkId,
    /// As last subscribed (or reported by an agent), with `id` set.
    pub(crate) info: FrameworkInfo,
    /// The scheduler's connection, when subscribed.
    pub(crate) conn: Option<ConnId>,
    /// Its tasks that are live, or terminal with the update unacknowledged.
    pub(crate) tasks: Tracked<TaskId, Task>,
    pub(crate) offers: HashSet<OfferId>,
    /// When a disconnected framework is torn down.
    pub(crate) failover_deadline: Option<Instant>,
    /// When it was last disconnected (or recovered without its
    /// scheduler), and the size of its info then: what the bound on
    /// disconnected frameworks counts.
    pub(crate) disconnected: Option<(Instant, usize)>,
    /// Whether offers are suppressed (for `/state`).
    pub(crate) suppressed: bool,
    /// Learnt from an agent's report, never subscribed to this master.
    pub(crate) recovered: bool,
    /// Learnt from an agent's task report without its `FrameworkInfo`
    /// (an agent that did not report it): its principal is unknown, and
    /// its first subscription sets it.
    pub(crate) unclaimed: bool,
    pub(crate) registered_at: f64,
    /// The epoch of its launches' stamps, durable in its record.
    pub(crate) launch_epoch: u64,
    /// Launches stamped in this epoch.
    pub(crate) launch_seq: u64,
}

/// A removed framework, kept (the last `--max-completed-frameworks`) for
/// the Mesos endpoints: `completed_frameworks` of the operator API, and
/// the operator event stream's FRAMEWORK_ADDED/FRAMEWORK_REMOVED of a
/// framework that came and went between two snapshots.
#[derive(Debug, Clone)]
pub(crate) struct CompletedFramework {
    pub(crate) id: FrameworkId,
    pub(crate) info: Arc<FrameworkInfo>,
    pub(crate) registered_at: f64,
    pub(crate) removed_at: f64,
}

// === impl Framework ===

impl Framework {
    pub(crate) fn new(id: FrameworkId, mut info: FrameworkInfo) -> Self {
        info.id = Some(id.clone());
        Framework {
            id,
            info,
            conn: None,
            tasks: Tracked::default(),
            offers: HashSet::default(),
            failover_deadline: None,
            disconnected: None,
            suppressed: false,
            recovered: false,
            unclaimed: false,
            registered_at: agora_proto::now_timestamp(),
            launch_epoch: 0,
            launch_seq: 0,
        }
    }

    pub(crate) fn roles(&self) -> Vec<String> {
        self.info.effective_roles()
    }

    fn record(&self, disconnected_at: Option<f64>) -> RegistryOp {
        RegistryOp::PutFramework(FrameworkRecord {
            id: self.id.clone(),
            info: self.info.clone(),
            disconnected_at,
            launch_epoch: self.launch_epoch,
        })
    }

    /// It lost its scheduler at `since`.
    pub(crate) fn mark_disconnected(&mut self, since: Instant) {
        let bytes = serde_json::to_vec(&self.info).map_or(0, |b| b.len());
        self.disconnected = Some((since, bytes));
    }

    /// The stamp of its next launch.
    pub(crate) fn next_launch_stamp(&mut self) -> agora_proto::LaunchStamp {
        let stamp = agora_proto::LaunchStamp {
            epoch: self.launch_epoch,
            seq: self.launch_seq,
        };
        self.launch_seq += 1;
        stamp
    }
}

fn validate_framework_info(info: &FrameworkInfo) -> Result<(), String> {
    if info.name.trim().is_empty() {
        return Err("framework_info.name must not be empty".into());
    }
    if let Some(id) = &info.id {
        validate_id(id.as_str()).map_err(|e| format!("invalid framework id: {e}"))?;
    }
    if !info.failover_timeout.is_finite() || info.failover_timeout < 0.0 {
        return Err(format!(
            "invalid failover_timeout {}: must be a non-negative number of seconds",
            info.failover_timeout
        ));
    }
    for role in &info.roles {
        if role != agora_proto::DEFAULT_ROLE {
            Resource::scalar("cpus", 1.0)
                .and_then(|r| r.with_role(role))
                .map_err(|_| format!("invalid role {role:?}"))?;
        }
    }
    Ok(())
}

// === impl Master: frameworks ===

impl Master {
    pub(crate) fn subscribe(
        &mut self,
        now: Instant,
        conn: ConnId,
        protocol: u32,
        info: FrameworkInfo,
        force: bool,
    ) {
        if protocol != PROTOCOL_VERSION {
            return self.scheduler_fatal(
                conn,
                format!("unsupported protocol version {protocol}; this master speaks {PROTOCOL_VERSION}"),
                CLOSE_POLICY,
            );
        }
        if let Some(existing) = self.scheduler_conns.get(&conn) {
            let msg = format!("this connection is already subscribed as framework {existing}");
            return self.scheduler_error(conn, msg);
        }
        if let Err(msg) = validate_framework_info(&info) {
            return self.scheduler_fatal(
                conn,
                format!("subscription refused: {msg}"),
                CLOSE_POLICY,
            );
        }
        let acls = &self.config.acls;
        if acls.restricts(Action::RegisterFrameworks) {
            let principal = info.principal.as_deref();
            let refused = info.effective_roles().iter().find_map(|role| {
                acls.check(Action::RegisterFrameworks, principal, Some(role))
                    .err()
            });
            if let Some(msg) = refused {
                tracing::warn!(framework = %info.name, ?principal, %msg, "subscription refused");
                return self.scheduler_fatal(
                    conn,
                    format!("subscription refused: {msg}"),
                    CLOSE_POLICY,
                );
            }
        }
        let (fid, reregistered) = match info.id.clone() {
            None => {
                let fid = FrameworkId::new(self.new_id("F"));
                let fw = Framework::new(fid.clone(), info);
                self.allocator.add_framework(&fid, &fw.roles(), true);
                self.frameworks.insert(fid.clone(), fw);
                (fid, false)
            }
            Some(fid) => {
                if self.removed_frameworks.contains(&fid) {
                    return self.scheduler_fatal(
                        conn,
                        format!("framework {fid} was removed; subscribe without an id to start a new one"),
                        CLOSE_POLICY,
                    );
                }
                if let Err(msg) = self.may_subscribe(&fid, &info) {
                    return self.scheduler_fatal(conn, msg, CLOSE_POLICY);
                }
                match self.frameworks.get(&fid).and_then(|f| f.conn) {
                    Some(_) if !force => {
                        return self.scheduler_fatal(
                            conn,
                            format!("framework {fid} is already connected; subscribe with force to take over"),
                            CLOSE_POLICY,
                        );
                    }
                    Some(old) => {
                        tracing::info!(framework_id = %fid, "framework taken over by a new connection");
                        self.scheduler_conns.remove(&old);
                        self.scheduler_fatal(
                            old,
                            format!("framework {fid} subscribed from another connection"),
                            CLOSE_POLICY,
                        );
                        self.withdraw_framework_offers(now, &fid, false);
                    }
                    None => {}
                }
                match self.frameworks.get_mut(&fid) {
                    Some(fw) => {
                        fw.info = FrameworkInfo {
                            id: Some(fid.clone()),
                            ..info
                        };
                        fw.recovered = false;
                        fw.unclaimed = false;
                        let roles = fw.roles();
                        self.allocator.update_framework(&fid, &roles);
                    }
                    None => {
                        // A framework this master never saw (it restarted and
                        // no agent has reported it yet): adopt the id.
                        let fw = Framework::new(fid.clone(), info);
                        self.allocator.add_framework(&fid, &fw.roles(), true);
                        self.frameworks.insert(fid.clone(), fw);
                    }
                }
                (fid, true)
            }
        };
        let Some(fw) = self.frameworks.get_mut(&fid) else {
            return;
        };
        fw.conn = Some(conn);
        fw.failover_deadline = None;
        // A new epoch, durable before the scheduler hears SUBSCRIBED (and
        // so before it can launch): every launch of this subscription is
        // stamped later than any of an earlier one, on any master. (The
        // clock only helps a master without a registry.)
        let wall = agora_proto::now_timestamp().max(0.0) as u64;
        fw.launch_epoch = (fw.launch_epoch + 1).max(wall);
        fw.launch_seq = 0;
        let record = fw.record(None);
        let pending: Vec<_> = fw
            .tasks
            .values()
            .filter_map(|t| t.pending_update.clone())
            .collect();
        self.persist(record);
        self.scheduler_conns.insert(conn, fid.clone());
        self.allocator.activate_framework(&fid);
        if reregistered {
            // A new scheduler process knows nothing of what its
            // predecessor suppressed or declined: it starts with offers on
            // (as a Mesos SUBSCRIBE without `suppressed_roles`). Kept, a
            // suppression stopped offers for good to a framework that no
            // longer knew to revive (found by the simulation).
            self.revive(now, &fid, &[]);
        }
        tracing::info!(framework_id = %fid, reregistered, "framework subscribed");
        self.send_scheduler(
            conn,
            Event::Subscribed {
                framework_id: fid.clone(),
                heartbeat_interval_seconds: self.config.heartbeat_interval.as_secs_f64(),
                master_info: self.info.clone(),
                reregistered,
            },
        );
        self.metrics
            .status_updates_retried
            .add(pending.len() as u64);
        for status in pending {
            self.send_scheduler(conn, Event::Update { status });
        }
        self.schedule_allocation(now);
    }

    /// Whether a subscription with `info` may take framework `fid`: only
    /// from the principal recorded for it (the one it authenticated as,
    /// or with authentication off the `principal` it declared), as in
    /// Mesos, whose master refuses a change of `FrameworkInfo.principal`.
    /// A framework this master does not know is adopted; one learnt
    /// without its `FrameworkInfo` is claimed by its first subscription.
    fn may_subscribe(&self, fid: &FrameworkId, info: &FrameworkInfo) -> Result<(), String> {
        let Some(fw) = self.frameworks.get(fid) else {
            return Ok(());
        };
        if fw.unclaimed || fw.info.principal == info.principal {
            return Ok(());
        }
        tracing::warn!(framework_id = %fid, owner = ?fw.info.principal, principal = ?info.principal, "subscription naming another principal's framework refused");
        self.metrics.refused_framework_principal.inc();
        Err(format!(
            "subscription refused: framework {fid} belongs to another principal; {} may not subscribe as it",
            crate::agents::describe_principal(info.principal.as_deref())
        ))
    }

    pub(crate) fn scheduler_closed(&mut self, now: Instant, conn: ConnId) {
        let Some(fid) = self.scheduler_conns.remove(&conn) else {
            return;
        };
        let Some(fw) = self.frameworks.get_mut(&fid) else {
            return;
        };
        fw.conn = None;
        let timeout =
            peer_seconds(fw.info.failover_timeout).map(|t| t.min(self.config.max_failover_timeout));
        tracing::info!(framework_id = %fid, failover_timeout = ?timeout, "framework disconnected");
        self.allocator.deactivate_framework(&fid);
        self.withdraw_framework_offers(now, &fid, false);
        match timeout.and_then(|t| now.checked_add(t)) {
            Some(deadline) => {
                if let Some(fw) = self.frameworks.get_mut(&fid) {
                    fw.failover_deadline = Some(deadline);
                    fw.mark_disconnected(now);
                    let record = fw.record(Some(agora_proto::now_timestamp()));
                    self.persist(record);
                }
                self.bound_disconnected_frameworks(now);
            }
            None => self.teardown(
                now,
                &fid,
                "framework removed: disconnected with failover_timeout 0",
            ),
        }
    }

    /// How long a framework disconnected with `info` is kept for its
    /// scheduler: its `failover_timeout`, at most `--max-failover-timeout`
    /// (`None`: removed at once).
    pub(crate) fn failover_timeout(&self, info: &FrameworkInfo) -> Option<Duration> {
        peer_seconds(info.failover_timeout).map(|t| t.min(self.config.max_failover_timeout))
    }

    /// Keeps the disconnected frameworks within `--max-disconnected-frameworks`
    /// and `--max-disconnected-framework-bytes`: past either, the one
    /// disconnected longest is removed as if its failover timeout had
    /// expired (and the registry records the removal).
    pub(crate) fn bound_disconnected_frameworks(&mut self, now: Instant) {
        let (max_count, max_bytes) = (
            self.config.max_disconnected_frameworks,
            self.config.max_disconnected_framework_bytes,
        );
        let mut waiting: Vec<(Instant, usize, FrameworkId)> = self
            .frameworks
            .values()
            .filter(|f| f.conn.is_none() && f.failover_deadline.is_some())
            .map(|f| {
                let (since, bytes) = f.disconnected.unwrap_or((now, 0));
                (since, bytes, f.id.clone())
            })
            .collect();
        let mut bytes: usize = waiting.iter().map(|(_, b, _)| b).sum();
        if waiting.len() <= max_count && bytes <= max_bytes {
            return;
        }
        waiting.sort();
        let mut count = waiting.len();
        for (_, size, fid) in waiting {
            if count <= max_count && bytes <= max_bytes {
                break;
            }
            tracing::warn!(framework_id = %fid, disconnected = count, max_count, bytes, max_bytes, "too many disconnected frameworks: removing the one disconnected longest");
            self.metrics.frameworks_removed_disconnected_cap.inc();
            self.teardown(
                now,
                &fid,
                "framework removed: too many disconnected frameworks (--max-disconnected-frameworks); the one disconnected longest goes first",
            );
            count -= 1;
            bytes -= size;
        }
    }

    pub(crate) fn expire_frameworks(&mut self, now: Instant) {
        let expired: Vec<FrameworkId> = self
            .frameworks
            .values()
            .filter(|f| f.conn.is_none() && f.failover_deadline.is_some_and(|d| d <= now))
            .map(|f| f.id.clone())
            .collect();
        for fid in expired {
            tracing::info!(framework_id = %fid, "failover timeout expired; tearing down");
            self.teardown(now, &fid, "framework removed: failover timeout expired");
        }
    }

    /// Appends to the bounded list of removed frameworks (counted for the
    /// next `/state` delta).
    fn push_completed_framework(&mut self, framework: CompletedFramework) {
        self.completed_frameworks_total += 1;
        self.completed_frameworks.push_back(framework);
        while self.completed_frameworks.len() > self.config.max_completed_frameworks {
            self.completed_frameworks.pop_front();
        }
    }

    /// Removes the framework: its tasks are killed on their agents, its
    /// offers withdrawn, its id remembered as removed. A connected
    /// scheduler gets a fatal error and is closed.
    pub(crate) fn teardown(&mut self, now: Instant, fid: &FrameworkId, reason: &str) {
        self.withdraw_framework_offers(now, fid, false);
        let Some(fw) = self.frameworks.remove(fid) else {
            return;
        };
        let mut agents_touched: HashSet<AgentId> = HashSet::default();
        for (_, task) in fw.tasks {
            agents_touched.insert(task.agent_id.clone());
            let live = !task.state.is_terminal();
            if let Some(agent) = self.agents.get_mut(&task.agent_id) {
                agent
                    .tasks
                    .remove(&(fid.clone(), task.info.task_id.clone()));
                if live {
                    agent.used = agent.used.saturating_sub(&task.resources);
                }
            }
            let state = if live { TaskState::Killed } else { task.state };
            self.complete_task(task, state);
        }
        // Only agents whose executors change are marked for `/state`.
        for agent in self.agents.untracked_values_mut() {
            let before = agent.executors.len();
            let mut freed = agora_proto::Resources::new();
            agent.executors.retain(|(f, _), e| {
                if f == fid {
                    freed += &e.resources;
                    false
                } else {
                    true
                }
            });
            if agent.executors.len() != before {
                agent.used = agent.used.saturating_sub(&freed);
                agents_touched.insert(agent.id.clone());
            }
        }
        for aid in agents_touched {
            self.agents.mark(&aid);
            self.send_agent(
                &aid,
                agent::Event::ShutdownFramework {
                    framework_id: fid.clone(),
                },
            );
        }
        self.allocator.remove_framework(fid);
        self.removed_frameworks.insert(fid.clone());
        self.push_completed_framework(CompletedFramework {
            id: fid.clone(),
            info: Arc::new(fw.info.clone()),
            registered_at: fw.registered_at,
            removed_at: agora_proto::now_timestamp(),
        });
        self.persist(RegistryOp::RemoveFramework { id: fid.clone() });
        if let Some(conn) = fw.conn {
            self.scheduler_conns.remove(&conn);
            self.scheduler_fatal(conn, reason, CLOSE_NORMAL);
        }
        tracing::info!(framework_id = %fid, reason, "framework removed");
        self.schedule_allocation(now);
    }

    pub(crate) fn revive(&mut self, now: Instant, fid: &FrameworkId, roles: &[String]) {
        self.allocator.revive(fid, roles);
        if let Some(fw) = self.frameworks.get_mut(fid) {
            fw.suppressed = false;
        }
        self.schedule_allocation(now);
    }

    pub(crate) fn suppress(&mut self, fid: &FrameworkId, roles: &[String]) {
        self.allocator.suppress(fid, roles);
        if let Some(fw) = self.frameworks.get_mut(fid) {
            fw.suppressed = true;
        }
    }

    pub(crate) fn request_resources(
        &mut self,
        now: Instant,
        fid: &FrameworkId,
        requests: &[ResourceRequest],
    ) {
        self.allocator.request_resources(fid, requests);
        self.schedule_allocation(now);
    }

    pub(crate) fn send_heartbeats(&mut self) {
        let conns: Vec<ConnId> = self.frameworks.values().filter_map(|f| f.conn).collect();
        for conn in conns {
            self.send_scheduler(conn, Event::Heartbeat);
        }
    }

    pub(crate) fn message_to_executor(
        &mut self,
        conn: ConnId,
        fid: &FrameworkId,
        agent_id: AgentId,
        executor_id: ExecutorId,
        data: Bytes,
    ) {
        let sent = self.send_agent(
            &agent_id,
            agent::Event::Message {
                framework_id: fid.clone(),
                executor_id,
                data,
            },
        );
        if !sent {
            self.scheduler_error(
                conn,
                format!("agent {agent_id} is unknown or not connected; message dropped"),
            );
        }
    }

    /// Recovers a framework reported by an agent (after a master restart):
    /// known but disconnected until its scheduler subscribes.
    pub(crate) fn recover_framework(
        &mut self,
        now: Instant,
        info: FrameworkInfo,
        fid: &FrameworkId,
    ) {
        if self.frameworks.contains_key(fid) || self.removed_frameworks.contains(fid) {
            return;
        }
        let grace = self
            .failover_timeout(&info)
            .unwrap_or(Duration::ZERO)
            .max(self.config.recovered_framework_timeout);
        let mut fw = Framework::new(fid.clone(), info);
        fw.recovered = true;
        fw.failover_deadline = now.checked_add(grace);
        fw.mark_disconnected(now);
        self.allocator.add_framework(fid, &fw.roles(), false);
        tracing::info!(framework_id = %fid, "framework recovered from an agent's report");
        self.frameworks.insert(fid.clone(), fw);
        self.bound_disconnected_frameworks(now);
    }
}
