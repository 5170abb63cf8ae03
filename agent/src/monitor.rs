//! What each container uses: `/monitor/statistics` (as Mesos names it,
//! also served as `/containers`), the container series of `/metrics`,
//! and the usage reports sent to the master.
//!
//! The executors, command tasks and their run ids come from the core's
//! published `/state` snapshot; the figures are the containerizer's
//! ([`Containerizer::usage`]), read at request time, off the async
//! threads.

use std::sync::Arc;

use agora_containerizer::{Containerizer, Usage};
use serde_json::Value;

/// Reads container statistics; empty without `--isolation cgroups`.
#[derive(Clone)]
pub(crate) struct Monitor {
    containerizer: Arc<Containerizer>,
}

/// How often the agent tells the master what its containers use.
pub(crate) const REPORT_INTERVAL: std::time::Duration = std::time::Duration::from_secs(5);

// === impl Monitor ===

impl Monitor {
    pub(crate) fn new(containerizer: Containerizer) -> Monitor {
        Monitor {
            containerizer: Arc::new(containerizer),
        }
    }

    /// The usage of every running executor's container in `state` (the
    /// agent's `/state` view). Blocking: reads cgroup files.
    pub(crate) fn usage(&self, state: &Value) -> Vec<Usage> {
        if !self.enabled() {
            return Vec::new();
        }
        let containerizer = &self.containerizer;
        let mut out = Vec::new();
        for framework in state["frameworks"].as_array().into_iter().flatten() {
            let fid = framework["id"].as_str().unwrap_or_default();
            let executors = framework["executors"].as_array().into_iter().flatten();
            // Custom executors: their own entry, with their tasks.
            let mut containers: Vec<(String, String, Vec<String>, Option<_>)> = executors
                .clone()
                .filter(|e| e["running"] == true && e["command_executor"] != true)
                .filter_map(|e| {
                    let tasks = task_ids(e);
                    Some((
                        e["id"].as_str()?.into(),
                        e["run_id"].as_str()?.into(),
                        tasks,
                        None,
                    ))
                })
                .collect();
            // Command tasks: in a container of their own, named by their
            // run, when they have one.
            let mut own = std::collections::HashSet::new();
            for task in executors
                .clone()
                .filter(|e| e["running"] == true && e["command_executor"] == true)
            {
                let (Some(id), Some(run_id)) = (task["id"].as_str(), task["run_id"].as_str())
                else {
                    continue;
                };
                if let Some(statistics) = containerizer.usage(run_id) {
                    own.insert(id.to_string());
                    containers.push((id.into(), run_id.into(), task_ids(task), Some(statistics)));
                }
            }
            // Command executors: each runs the command tasks that name it
            // (in its own container unless they have one).
            for host in framework["command_executors"]
                .as_array()
                .into_iter()
                .flatten()
            {
                let (Some(id), Some(run_id)) = (host["id"].as_str(), host["run_id"].as_str())
                else {
                    continue;
                };
                let tasks = executors
                    .clone()
                    .filter(|e| e["process"].as_str() == Some(id))
                    .filter(|e| e["id"].as_str().is_none_or(|t| !own.contains(t)))
                    .flat_map(task_ids)
                    .collect();
                containers.push((id.into(), run_id.into(), tasks, None));
            }
            for (executor_id, run_id, tasks, statistics) in containers {
                let Some(statistics) = statistics.or_else(|| containerizer.usage(&run_id)) else {
                    continue;
                };
                out.push(Usage {
                    framework_id: fid.to_string(),
                    executor_id,
                    container_id: run_id,
                    tasks,
                    statistics,
                });
            }
        }
        out
    }

    /// Whether the agent isolates with cgroups.
    pub(crate) fn enabled(&self) -> bool {
        self.containerizer.isolates()
    }

    /// Every [`REPORT_INTERVAL`] until `cancel`, posts what the
    /// containers of the latest snapshot use to the core, for the master.
    pub(crate) async fn report(
        self,
        snapshots: tokio::sync::watch::Receiver<crate::messages::Snapshot>,
        core: tokio::sync::mpsc::Sender<crate::messages::CoreEvent>,
        cancel: tokio_util::sync::CancellationToken,
    ) {
        if !self.enabled() {
            return;
        }
        let mut tick = tokio::time::interval(REPORT_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tick.tick() => {}
            }
            let state = snapshots.borrow().clone();
            let monitor = self.clone();
            let Ok(usage) = tokio::task::spawn_blocking(move || monitor.usage(&state)).await else {
                continue;
            };
            if usage.is_empty() {
                continue;
            }
            let containers = usage.iter().map(Usage::to_report).collect();
            let event = crate::messages::CoreEvent::Input(crate::messages::Input::ContainerUsage(
                containers,
            ));
            if core.send(event).await.is_err() {
                return;
            }
        }
    }
}

fn task_ids(executor: &Value) -> Vec<String> {
    executor["tasks"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|t| t["id"].as_str().map(str::to_string))
        .collect()
}
