//! Reading `agora-execute --ledger` files and checking the reliability
//! contract on them: every task reached exactly one distinct terminal
//! state, a command task that ran was seen `TASK_RUNNING` before its
//! terminal state, and nothing arrived out of order (no non-terminal
//! state after the terminal one). Duplicates are counted, not failed:
//! at-least-once delivery allows them.

use std::collections::{BTreeMap, HashSet};
use std::path::Path;

use serde_json::Value;

/// One status update the scheduler saw.
#[derive(Debug, Clone, PartialEq)]
pub struct SeenUpdate {
    /// `TASK_RUNNING`, …
    pub state: String,
    /// The reliable update's uuid (`None` for master-generated ones).
    pub uuid: Option<String>,
    /// `SOURCE_EXECUTOR`, `SOURCE_AGENT` or `SOURCE_MASTER`.
    pub source: String,
    /// `REASON_…`, if any.
    pub reason: Option<String>,
    /// The agent it names.
    pub agent_id: Option<String>,
}

/// Everything a ledger says.
#[derive(Debug, Default, Clone)]
pub struct Ledger {
    /// Updates per task id, in arrival order.
    pub updates: BTreeMap<String, Vec<SeenUpdate>>,
    /// Task ids in launch order (a task launched by two processes twice).
    pub launches: Vec<(String, String)>,
    /// Agents reported lost.
    pub agents_lost: Vec<String>,
    /// `registered` and `reregistered` lines.
    pub registrations: usize,
}

/// The outcome of [`Ledger::check`].
#[derive(Debug, Default, Clone)]
pub struct Check {
    /// Tasks with at least one update.
    pub tasks: usize,
    /// Updates in all.
    pub updates: usize,
    /// Reliable updates seen again with a uuid already seen for the task.
    pub duplicates: usize,
    /// Master-generated answers to reconciliation.
    pub reconciliation_answers: usize,
    /// Tasks per terminal state.
    pub terminal: BTreeMap<String, usize>,
    /// Everything that breaks the contract; must be empty.
    pub violations: Vec<String>,
}

/// Whether `state` is terminal.
pub fn is_terminal(state: &str) -> bool {
    matches!(
        state,
        "TASK_FINISHED"
            | "TASK_FAILED"
            | "TASK_KILLED"
            | "TASK_LOST"
            | "TASK_ERROR"
            | "TASK_DROPPED"
            | "TASK_GONE"
    )
}

// === impl Ledger ===

impl Ledger {
    /// Reads the ledger at `path` (missing file: empty). A torn last line
    /// (the writer was SIGKILLed mid-write) is skipped.
    pub fn read(path: &Path) -> Ledger {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        let mut ledger = Ledger::default();
        for line in text.lines() {
            let Ok(value) = serde_json::from_str::<Value>(line) else {
                continue;
            };
            let text = |key: &str| value[key].as_str().map(str::to_string);
            match value["event"].as_str() {
                Some("update") => {
                    let (Some(task), Some(state)) = (text("task_id"), text("state")) else {
                        continue;
                    };
                    ledger.updates.entry(task).or_default().push(SeenUpdate {
                        state,
                        uuid: text("uuid"),
                        source: text("source").unwrap_or_default(),
                        reason: text("reason"),
                        agent_id: text("agent_id"),
                    });
                }
                Some("launch") => {
                    if let (Some(task), Some(agent)) = (text("task_id"), text("agent_id")) {
                        ledger.launches.push((task, agent));
                    }
                }
                Some("agent_lost") => ledger.agents_lost.extend(text("agent_id")),
                Some("registered") | Some("reregistered") => ledger.registrations += 1,
                _ => {}
            }
        }
        ledger
    }

    /// Tasks that have a terminal update.
    pub fn terminal_tasks(&self) -> usize {
        self.updates
            .values()
            .filter(|u| u.iter().any(|u| is_terminal(&u.state)))
            .count()
    }

    /// Checks the contract for a job whose task ids are `NAME-0` …
    /// `NAME-(instances-1)`.
    pub fn check(&self, name: &str, instances: usize) -> Check {
        let mut check = Check::default();
        let mut launched: BTreeMap<&str, usize> = BTreeMap::new();
        for (task, _) in &self.launches {
            *launched.entry(task.as_str()).or_default() += 1;
        }
        for (task, n) in &launched {
            if *n > 1 {
                check.violations.push(format!("{task}: launched {n} times"));
            }
        }
        for i in 0..instances {
            let task = format!("{name}-{i}");
            let Some(updates) = self.updates.get(&task) else {
                check.violations.push(format!("{task}: no update at all"));
                continue;
            };
            check.tasks += 1;
            check.updates += updates.len();
            let mut uuids = HashSet::new();
            let mut terminal: Option<&SeenUpdate> = None;
            let mut distinct_terminal: Vec<&str> = Vec::new();
            let mut running_seen = false;
            for (n, update) in updates.iter().enumerate() {
                if let Some(uuid) = &update.uuid {
                    if !uuids.insert(uuid.clone()) {
                        check.duplicates += 1;
                    }
                }
                if update.reason.as_deref() == Some("REASON_RECONCILIATION") {
                    check.reconciliation_answers += 1;
                }
                if is_terminal(&update.state) {
                    if !distinct_terminal.contains(&update.state.as_str()) {
                        distinct_terminal.push(&update.state);
                    }
                    let reliable = update.source != "SOURCE_MASTER";
                    if reliable
                        && update.reason.as_deref() != Some("REASON_RECONCILIATION")
                        && !running_seen
                        && terminal.is_none()
                        && update.source == "SOURCE_EXECUTOR"
                    {
                        check.violations.push(format!(
                            "{task}: the executor's {} arrived without TASK_RUNNING before it: {updates:?}",
                            update.state
                        ));
                    }
                    terminal.get_or_insert(update);
                } else {
                    if update.state == "TASK_RUNNING" {
                        running_seen = true;
                    }
                    if terminal.is_some() {
                        check.violations.push(format!(
                            "{task}: {} (update {n}) after the terminal state: {updates:?}",
                            update.state
                        ));
                    }
                }
            }
            match distinct_terminal.as_slice() {
                [] => check
                    .violations
                    .push(format!("{task}: no terminal state: {updates:?}")),
                [one] => *check.terminal.entry(one.to_string()).or_default() += 1,
                many => check.violations.push(format!(
                    "{task}: {} distinct terminal states {many:?}: {updates:?}",
                    many.len()
                )),
            }
            // The command executor sends TASK_RUNNING before any terminal
            // update of its own; an executor terminal without it means an
            // update was lost.
            let executor_ran = updates.iter().any(|u| u.source == "SOURCE_EXECUTOR");
            if executor_ran && !running_seen {
                check.violations.push(format!(
                    "{task}: executor updates but never TASK_RUNNING: {updates:?}"
                ));
            }
        }
        let extra: Vec<&String> = self
            .updates
            .keys()
            .filter(|t| {
                t.strip_prefix(name)
                    .and_then(|r| r.strip_prefix('-'))
                    .and_then(|i| i.parse::<usize>().ok())
                    .is_none_or(|i| i >= instances)
            })
            .collect();
        if !extra.is_empty() {
            check
                .violations
                .push(format!("updates for tasks outside the job: {extra:?}"));
        }
        check
    }
}

// === impl Check ===

impl Check {
    /// Panics with every violation (and `context`) unless there are none.
    pub fn assert_ok(&self, context: &str) {
        assert!(
            self.violations.is_empty(),
            "{} contract violations:\n{}\n{self}\n{context}",
            self.violations.len(),
            self.violations.join("\n")
        );
    }
}

impl std::fmt::Display for Check {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "tasks {}, updates {}, duplicates {}, reconciliation answers {}, terminal {:?}, violations {}",
            self.tasks,
            self.updates,
            self.duplicates,
            self.reconciliation_answers,
            self.terminal,
            self.violations.len()
        )
    }
}
