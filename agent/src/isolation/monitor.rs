//! What each container uses: `/monitor/statistics` (as Mesos names it,
//! also served as `/containers`) and the container series of `/metrics`.
//!
//! The executors and their run ids come from the core's published
//! `/state` snapshot; the figures are read from the cgroup files at
//! request time, off the async threads.

use std::fmt::Write;
use std::sync::Arc;

use serde_json::{json, Value};

use super::cgroups::Cgroups;
use super::ContainerStats;

/// Reads container statistics; empty without `--isolation cgroups`.
#[derive(Debug, Clone, Default)]
pub(crate) struct Monitor {
    cgroups: Option<Arc<Cgroups>>,
}

/// One container's statistics with what runs in it.
#[derive(Debug, Clone)]
pub(crate) struct Usage {
    framework_id: String,
    executor_id: String,
    container_id: String,
    /// The name of its directories (the run it was made for).
    cgroup: String,
    tasks: Vec<String>,
    stats: ContainerStats,
}

/// How often the agent tells the master what its containers use.
pub(crate) const REPORT_INTERVAL: std::time::Duration = std::time::Duration::from_secs(5);

// === impl Monitor ===

impl Monitor {
    pub(crate) fn new(cgroups: Option<Arc<Cgroups>>) -> Monitor {
        Monitor { cgroups }
    }

    /// The usage of every running executor's container in `state` (the
    /// agent's `/state` view). Blocking: reads cgroup files.
    pub(crate) fn usage(&self, state: &Value) -> Vec<Usage> {
        let Some(cgroups) = &self.cgroups else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for framework in state["frameworks"].as_array().into_iter().flatten() {
            let fid = framework["id"].as_str().unwrap_or_default();
            let executors = framework["executors"].as_array().into_iter().flatten();
            // Custom executors: their own entry, with their tasks.
            let mut containers: Vec<(String, String, Vec<String>)> = executors
                .clone()
                .filter(|e| e["running"] == true && e["command_executor"] != true)
                .filter_map(|e| {
                    let tasks = task_ids(e);
                    Some((
                        e["id"].as_str()?.into(),
                        e["run_id"].as_str()?.into(),
                        tasks,
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
                if cgroups.open(run_id).is_some() {
                    own.insert(id.to_string());
                    containers.push((id.into(), run_id.into(), task_ids(task)));
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
                containers.push((id.into(), run_id.into(), tasks));
            }
            for (executor_id, run_id, tasks) in containers {
                let Some(container) = cgroups.open(&run_id) else {
                    continue;
                };
                out.push(Usage {
                    framework_id: fid.to_string(),
                    executor_id,
                    container_id: run_id,
                    cgroup: container.dir_name().to_string(),
                    tasks,
                    stats: container.stats(),
                });
            }
        }
        out
    }

    /// Whether the agent isolates with cgroups.
    pub(crate) fn enabled(&self) -> bool {
        self.cgroups.is_some()
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

// === impl Usage ===

impl Usage {
    /// What the master is told of this container.
    pub(crate) fn to_report(&self) -> agora_proto::agent::ContainerUsage {
        let s = &self.stats;
        agora_proto::agent::ContainerUsage {
            framework_id: agora_proto::FrameworkId::new(&self.framework_id),
            tasks: self.tasks.iter().map(agora_proto::TaskId::new).collect(),
            cpus_time_secs: s.cpus_user_time_secs + s.cpus_system_time_secs,
            cpus_limit: s.cpus_limit,
            cpus_nr_throttled: s.cpus_nr_throttled,
            mem_bytes: s.mem_total_bytes,
            mem_max_bytes: s.mem_max_bytes,
            mem_limit_bytes: s.mem_limit_bytes,
            processes: s.processes,
        }
    }

    /// The `/monitor/statistics` entry.
    pub(crate) fn to_json(&self, timestamp: f64) -> Value {
        let mut statistics = serde_json::to_value(&self.stats).unwrap_or_default();
        statistics["timestamp"] = json!(timestamp);
        json!({
            "framework_id": self.framework_id,
            "executor_id": self.executor_id,
            "container_id": self.container_id,
            "cgroup": self.cgroup,
            "tasks": self.tasks,
            "statistics": statistics,
        })
    }
}

/// A `/metrics` series: name, type, help, and its value for a container.
type Series = (
    &'static str,
    &'static str,
    &'static str,
    fn(&ContainerStats) -> f64,
);

/// The container series of `/metrics`, appended to `out`.
pub(crate) fn render_metrics(out: &mut String, usage: &[Usage]) {
    let series: [Series; 9] = [
        (
            "agora_agent_container_cpu_user_seconds_total",
            "counter",
            "CPU time in user mode of each container",
            |s| s.cpus_user_time_secs,
        ),
        (
            "agora_agent_container_cpu_system_seconds_total",
            "counter",
            "CPU time in the kernel of each container",
            |s| s.cpus_system_time_secs,
        ),
        (
            "agora_agent_container_cpu_limit",
            "gauge",
            "CPUs each container is limited to",
            |s| s.cpus_limit,
        ),
        (
            "agora_agent_container_cpu_throttled_periods_total",
            "counter",
            "CFS periods in which each container was throttled",
            |s| s.cpus_nr_throttled as f64,
        ),
        (
            "agora_agent_container_memory_bytes",
            "gauge",
            "Memory each container uses",
            |s| s.mem_total_bytes as f64,
        ),
        (
            "agora_agent_container_memory_peak_bytes",
            "gauge",
            "Most memory each container used at once",
            |s| s.mem_max_bytes as f64,
        ),
        (
            "agora_agent_container_memory_limit_bytes",
            "gauge",
            "Hard memory limit of each container",
            |s| s.mem_limit_bytes as f64,
        ),
        (
            "agora_agent_container_processes",
            "gauge",
            "Processes and threads in each container",
            |s| s.processes as f64,
        ),
        (
            "agora_agent_container_processes_limit_hits_total",
            "counter",
            "Forks refused at each container's pids limit",
            |s| s.processes_limit_hits as f64,
        ),
    ];
    for (name, kind, help, value) in series {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for u in usage {
            let _ = writeln!(
                out,
                "{name}{{framework_id=\"{}\",executor_id=\"{}\"}} {}",
                u.framework_id,
                u.executor_id,
                value(&u.stats)
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_name_each_container() {
        let usage = vec![Usage {
            framework_id: "F0".into(),
            executor_id: "e1".into(),
            container_id: "run".into(),
            cgroup: "run".into(),
            tasks: vec!["t1".into()],
            stats: ContainerStats {
                mem_total_bytes: 42,
                cpus_limit: 0.5,
                ..Default::default()
            },
        }];
        let mut out = String::new();
        render_metrics(&mut out, &usage);
        assert!(out.contains(
            "agora_agent_container_memory_bytes{framework_id=\"F0\",executor_id=\"e1\"} 42\n"
        ));
        assert!(out.contains(
            "agora_agent_container_cpu_limit{framework_id=\"F0\",executor_id=\"e1\"} 0.5\n"
        ));
        let entry = usage[0].to_json(1.0);
        assert_eq!(entry["tasks"][0], "t1");
        assert_eq!(entry["statistics"]["mem_total_bytes"], 42);
        assert_eq!(entry["statistics"]["timestamp"], 1.0);
    }
}
