//! The master's counters and histograms, and their Prometheus text form
//! for `GET /metrics`.
//!
//! Counters are atomics the state machine bumps with one-line hooks where
//! the thing happens (an offer made, an update forwarded, a frame read);
//! they are read by the HTTP handler without going through the state task.
//! Gauges (agents, frameworks, tasks by state, offers outstanding,
//! resources) are not kept here: they are counted while the `/state`
//! snapshot is built (see `state::Summary`), so `/metrics` renders in
//! microseconds and never waits for the event loop.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::state::StateSnapshot;

/// Upper bounds (seconds) of the allocation cycle histogram's buckets.
const ALLOCATION_BUCKETS: [f64; 14] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
];

/// Everything the master counts. One instance per master, shared by the
/// state machine and the HTTP handlers.
#[derive(Debug, Default)]
pub(crate) struct Metrics {
    /// Unix time the master started.
    pub(crate) started_at: f64,
    pub(crate) offers_made: Counter,
    pub(crate) offers_declined: Counter,
    pub(crate) offers_rescinded: Counter,
    pub(crate) offers_expired: Counter,
    pub(crate) offers_accepted: Counter,
    pub(crate) tasks_launched: Counter,
    pub(crate) tasks_rejected: Counter,
    /// `STATUS_UPDATE`s received from agents.
    pub(crate) status_updates_received: Counter,
    /// Updates forwarded to a connected scheduler (first delivery).
    pub(crate) status_updates_sent: Counter,
    /// Unacknowledged updates sent again to a re-subscribing scheduler.
    pub(crate) status_updates_retried: Counter,
    /// Scheduler acknowledgements relayed to agents.
    pub(crate) status_updates_acked: Counter,
    /// Agents' re-sends of an update the master holds unacknowledged
    /// (forwarded, or to be sent when the scheduler subscribes): not
    /// forwarded again.
    pub(crate) status_updates_repeated: Counter,
    /// Status updates from an agent about a task that lives on another
    /// agent, or about an earlier, completed task with the id of a live
    /// one: acknowledged to the sender, not applied or forwarded.
    pub(crate) reports_refused_update: Counter,
    /// Tasks in an agent's re-registration that live on another agent, or
    /// that completed already: neither adopted nor charged to the
    /// reporting agent.
    pub(crate) reports_refused_reregistration: Counter,
    pub(crate) frames_in_scheduler: Counter,
    pub(crate) frames_in_agent: Counter,
    pub(crate) frames_out_scheduler: Counter,
    pub(crate) frames_out_agent: Counter,
    /// Frames that did not decode (malformed JSON, unknown type, binary).
    pub(crate) errors_decode: Counter,
    /// Frames over the size cap.
    pub(crate) errors_frame_too_large: Counter,
    /// Non-fatal errors sent to schedulers (e.g. "subscribe first").
    pub(crate) errors_scheduler: Counter,
    /// Fatal errors that closed a scheduler connection.
    pub(crate) errors_scheduler_fatal: Counter,
    /// Non-fatal errors sent to agents.
    pub(crate) errors_agent: Counter,
    /// Fatal errors that closed an agent connection.
    pub(crate) errors_agent_fatal: Counter,
    /// Connections dropped because their outbound queue was full.
    pub(crate) errors_slow_peer: Counter,
    /// Mesos v1 scheduler event streams cut off: their client did not
    /// read (the queue of events for it filled up).
    pub(crate) streams_cut_scheduler_v1: Counter,
    /// Operator event streams (`SUBSCRIBE` on `/api/v1`) cut off: their
    /// reader left more than `--operator-stream-backlog` bytes unread.
    pub(crate) streams_cut_operator: Counter,
    pub(crate) agents_removed: Counter,
    /// Disconnected frameworks removed to keep within
    /// `--max-disconnected-frameworks` (or its bytes).
    pub(crate) frameworks_removed_disconnected_cap: Counter,
    /// Subscriptions naming a framework of another principal, refused.
    pub(crate) refused_framework_principal: Counter,
    /// Re-registrations of an agent id of another principal, refused.
    pub(crate) refused_agent_principal: Counter,
    /// Agent registrations the `register_agents` ACL refused.
    pub(crate) refused_agent_unauthorized: Counter,
    /// Agent registrations beyond a bound (resources, sets, ranges, ports,
    /// attributes, text), refused.
    pub(crate) refused_agent_bounds: Counter,
    /// Times the registry log was cut at an unreadable record on start.
    pub(crate) registry_truncations: Counter,
    /// Bytes cut off the registry log.
    pub(crate) registry_truncated_bytes: Counter,
    pub(crate) allocation_cycles: Histogram,
}

/// A monotonically increasing count.
#[derive(Debug, Default)]
pub(crate) struct Counter(AtomicU64);

/// A fixed-bucket histogram of durations, Prometheus-style (cumulative
/// buckets are computed when rendering).
#[derive(Debug)]
pub(crate) struct Histogram {
    buckets: [AtomicU64; ALLOCATION_BUCKETS.len()],
    /// Observations above the last bucket.
    overflow: AtomicU64,
    sum_nanos: AtomicU64,
    count: AtomicU64,
}

// === impl Counter ===

impl Counter {
    /// Adds one.
    pub(crate) fn inc(&self) {
        self.add(1);
    }

    /// Adds `n`.
    pub(crate) fn add(&self, n: u64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }

    /// The current count.
    pub(crate) fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

// === impl Histogram ===

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            buckets: std::array::from_fn(|_| AtomicU64::new(0)),
            overflow: AtomicU64::new(0),
            sum_nanos: AtomicU64::new(0),
            count: AtomicU64::new(0),
        }
    }
}

impl Histogram {
    /// Records one observation.
    pub(crate) fn observe(&self, d: Duration) {
        let secs = d.as_secs_f64();
        match ALLOCATION_BUCKETS.iter().position(|b| secs <= *b) {
            Some(i) => self.buckets[i].fetch_add(1, Ordering::Relaxed),
            None => self.overflow.fetch_add(1, Ordering::Relaxed),
        };
        let nanos = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        self.sum_nanos.fetch_add(nanos, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
    }

    /// How many observations there were.
    pub(crate) fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    /// The mean observation in milliseconds (0 before the first).
    pub(crate) fn mean_ms(&self) -> f64 {
        let count = self.count();
        if count == 0 {
            return 0.0;
        }
        self.sum_nanos.load(Ordering::Relaxed) as f64 / 1e6 / count as f64
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} histogram");
        let mut cumulative = 0;
        for (bound, bucket) in ALLOCATION_BUCKETS.iter().zip(&self.buckets) {
            cumulative += bucket.load(Ordering::Relaxed);
            let _ = writeln!(out, "{name}_bucket{{le=\"{bound}\"}} {cumulative}");
        }
        cumulative += self.overflow.load(Ordering::Relaxed);
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {cumulative}");
        let sum = self.sum_nanos.load(Ordering::Relaxed) as f64 / 1e9;
        let _ = writeln!(out, "{name}_sum {sum}");
        let _ = writeln!(out, "{name}_count {cumulative}");
    }
}

// === impl Metrics ===

impl Metrics {
    /// All counters at zero, started now.
    pub(crate) fn new() -> Self {
        Metrics {
            started_at: agora_proto::now_timestamp(),
            ..Metrics::default()
        }
    }

    /// The Prometheus text exposition (format 0.0.4) of the counters and
    /// of the gauges counted in `snapshot`.
    pub(crate) fn render(&self, snapshot: &StateSnapshot) -> String {
        let mut out = String::with_capacity(8 * 1024);
        let s = &snapshot.summary;
        gauge(
            &mut out,
            "agora_master_elected",
            "1 while this master serves (there is no standby mode yet)",
            &[("", 1.0)],
        );
        gauge(
            &mut out,
            "agora_master_uptime_seconds",
            "Seconds since this master started",
            &[("", (snapshot.generated_at - snapshot.started_at).max(0.0))],
        );
        gauge(
            &mut out,
            "agora_master_agents",
            "Agents known to the master, by connection state",
            &[
                ("state=\"connected\"", s.agents_connected as f64),
                ("state=\"disconnected\"", s.agents_disconnected as f64),
            ],
        );
        gauge(
            &mut out,
            "agora_master_agents_removed",
            "Agent ids removed after the ping timeout and still remembered",
            &[("", snapshot.removed_agents as f64)],
        );
        gauge(
            &mut out,
            "agora_master_frameworks",
            "Frameworks known to the master, by connection state",
            &[
                ("state=\"connected\"", s.frameworks_connected as f64),
                (
                    "state=\"disconnected\"",
                    (s.frameworks - s.frameworks_connected) as f64,
                ),
            ],
        );
        let tasks: Vec<(String, f64)> = s
            .tasks_by_state
            .iter()
            .map(|(state, n)| (format!("state=\"{state}\""), *n as f64))
            .collect();
        let tasks: Vec<(&str, f64)> = tasks.iter().map(|(l, n)| (l.as_str(), *n)).collect();
        gauge(
            &mut out,
            "agora_master_tasks",
            "Active tasks by latest state",
            &tasks,
        );
        let completed: Vec<(String, f64)> = s
            .completed_by_state
            .iter()
            .map(|(state, n)| (format!("state=\"{state}\""), *n as f64))
            .collect();
        let completed: Vec<(&str, f64)> = completed.iter().map(|(l, n)| (l.as_str(), *n)).collect();
        gauge(
            &mut out,
            "agora_master_completed_tasks",
            "Completed tasks kept in the bounded history, by terminal state",
            &completed,
        );
        gauge(
            &mut out,
            "agora_master_offers_outstanding",
            "Offers sent and not yet answered",
            &[("", s.offers_outstanding as f64)],
        );
        for (name, help, total, used, offered) in [
            ("cpus", "CPUs", s.cpus_total, s.cpus_used, s.cpus_offered),
            (
                "mem",
                "Memory (MiB)",
                s.mem_total,
                s.mem_used,
                s.mem_offered,
            ),
            (
                "disk",
                "Disk (MiB)",
                s.disk_total,
                s.disk_used,
                s.disk_offered,
            ),
        ] {
            gauge(
                &mut out,
                &format!("agora_master_{name}"),
                &format!("{help} on connected agents: total, used by tasks, offered"),
                &[
                    ("kind=\"total\"", total),
                    ("kind=\"used\"", used),
                    ("kind=\"offered\"", offered),
                ],
            );
        }
        counter(
            &mut out,
            "agora_master_offers_total",
            "Offers, by what happened to them",
            &[
                ("event=\"made\"", self.offers_made.get()),
                ("event=\"accepted\"", self.offers_accepted.get()),
                ("event=\"declined\"", self.offers_declined.get()),
                ("event=\"rescinded\"", self.offers_rescinded.get()),
            ],
        );
        counter(
            &mut out,
            "agora_master_offers_expired_total",
            "Offers rescinded because they outlived the offer timeout (also counted as rescinded)",
            &[("", self.offers_expired.get())],
        );
        counter(
            &mut out,
            "agora_master_tasks_launched_total",
            "Tasks accepted for launch (became TASK_STAGING)",
            &[("", self.tasks_launched.get())],
        );
        counter(
            &mut out,
            "agora_master_tasks_rejected_total",
            "Tasks refused at launch with TASK_ERROR or TASK_DROPPED",
            &[("", self.tasks_rejected.get())],
        );
        counter(
            &mut out,
            "agora_master_status_updates_total",
            "Status updates: received from agents, sent to schedulers, retried on re-subscription, acknowledged, re-sent by an agent while unacknowledged here (not forwarded again)",
            &[
                ("event=\"received\"", self.status_updates_received.get()),
                ("event=\"sent\"", self.status_updates_sent.get()),
                ("event=\"retried\"", self.status_updates_retried.get()),
                ("event=\"acked\"", self.status_updates_acked.get()),
                ("event=\"repeated\"", self.status_updates_repeated.get()),
            ],
        );
        counter(
            &mut out,
            "agora_master_agent_reports_refused_total",
            "Reports from an agent about a task that lives on another agent or about an earlier, completed task with the same id, refused: status updates (acknowledged to the sender, not forwarded) and tasks in a re-registration (not adopted)",
            &[
                ("report=\"status_update\"", self.reports_refused_update.get()),
                ("report=\"reregistration\"", self.reports_refused_reregistration.get()),
            ],
        );
        counter(
            &mut out,
            "agora_master_messages_in_total",
            "WebSocket frames read, by channel",
            &[
                ("channel=\"scheduler\"", self.frames_in_scheduler.get()),
                ("channel=\"agent\"", self.frames_in_agent.get()),
            ],
        );
        counter(
            &mut out,
            "agora_master_messages_out_total",
            "WebSocket frames written, by channel",
            &[
                ("channel=\"scheduler\"", self.frames_out_scheduler.get()),
                ("channel=\"agent\"", self.frames_out_agent.get()),
            ],
        );
        counter(
            &mut out,
            "agora_master_errors_total",
            "Errors, by kind",
            &[
                ("kind=\"decode\"", self.errors_decode.get()),
                (
                    "kind=\"frame_too_large\"",
                    self.errors_frame_too_large.get(),
                ),
                ("kind=\"scheduler\"", self.errors_scheduler.get()),
                (
                    "kind=\"scheduler_fatal\"",
                    self.errors_scheduler_fatal.get(),
                ),
                ("kind=\"agent\"", self.errors_agent.get()),
                ("kind=\"agent_fatal\"", self.errors_agent_fatal.get()),
                ("kind=\"slow_peer\"", self.errors_slow_peer.get()),
            ],
        );
        counter(
            &mut out,
            "agora_master_streams_cut_total",
            "Event streams cut off because their reader stopped reading: native WebSockets (schedulers and agents, their queue full), Mesos v1 scheduler streams (their queue full), operator SUBSCRIBE streams (over --operator-stream-backlog)",
            &[
                ("stream=\"websocket\"", self.errors_slow_peer.get()),
                ("stream=\"scheduler_v1\"", self.streams_cut_scheduler_v1.get()),
                ("stream=\"operator\"", self.streams_cut_operator.get()),
            ],
        );
        counter(
            &mut out,
            "agora_master_disconnected_frameworks_removed_total",
            "Disconnected frameworks removed before their failover timeout to keep within --max-disconnected-frameworks and --max-disconnected-framework-bytes (the one disconnected longest first)",
            &[("", self.frameworks_removed_disconnected_cap.get())],
        );
        counter(
            &mut out,
            "agora_master_agents_removed_total",
            "Agents removed after missing their pings",
            &[("", self.agents_removed.get())],
        );
        counter(
            &mut out,
            "agora_master_identity_refusals_total",
            "Registrations refused for who sent them: a subscription naming another principal's framework, an agent re-registration of another principal's agent id, an agent the register_agents ACL refuses, an agent beyond the registration bounds",
            &[
                (
                    "reason=\"framework_principal\"",
                    self.refused_framework_principal.get(),
                ),
                (
                    "reason=\"agent_principal\"",
                    self.refused_agent_principal.get(),
                ),
                (
                    "reason=\"agent_unauthorized\"",
                    self.refused_agent_unauthorized.get(),
                ),
                ("reason=\"agent_bounds\"", self.refused_agent_bounds.get()),
            ],
        );
        counter(
            &mut out,
            "agora_master_registry_truncations_total",
            "Times the registry log was cut on start at its first unreadable record (a torn write, damage); that record and every later one were dropped",
            &[("", self.registry_truncations.get())],
        );
        counter(
            &mut out,
            "agora_master_registry_truncated_bytes_total",
            "Bytes cut off the registry log on start",
            &[("", self.registry_truncated_bytes.get())],
        );
        self.allocation_cycles.render(
            &mut out,
            "agora_master_allocation_cycle_seconds",
            "Wall time of one allocation cycle (allocator plus sending offers)",
        );
        out
    }
}

fn series(out: &mut String, name: &str, labels: &str, value: impl std::fmt::Display) {
    if labels.is_empty() {
        let _ = writeln!(out, "{name} {value}");
    } else {
        let _ = writeln!(out, "{name}{{{labels}}} {value}");
    }
}

fn gauge(out: &mut String, name: &str, help: &str, values: &[(&str, f64)]) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} gauge");
    for (labels, v) in values {
        series(out, name, labels, v);
    }
}

fn counter(out: &mut String, name: &str, help: &str, values: &[(&str, u64)]) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} counter");
    for (labels, v) in values {
        series(out, name, labels, v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_are_cumulative() {
        let h = Histogram::default();
        h.observe(Duration::from_micros(50));
        h.observe(Duration::from_millis(3));
        h.observe(Duration::from_secs(10));
        let mut out = String::new();
        h.render(&mut out, "x", "help");
        assert!(out.contains("x_bucket{le=\"0.0001\"} 1\n"), "{out}");
        assert!(out.contains("x_bucket{le=\"0.005\"} 2\n"), "{out}");
        assert!(out.contains("x_bucket{le=\"2.5\"} 2\n"), "{out}");
        assert!(out.contains("x_bucket{le=\"+Inf\"} 3\n"), "{out}");
        assert!(out.contains("x_count 3\n"), "{out}");
        assert_eq!(h.count.load(Ordering::Relaxed), 3);
    }
}
