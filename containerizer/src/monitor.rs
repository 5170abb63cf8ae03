//! What containers used: `/monitor/statistics` entries (as Mesos names
//! them), the usage reports the agent sends its master, and the
//! container series of the agent's `/metrics`.
//!
//! The figures come from [`crate::Containerizer::usage`], read from the
//! cgroup files; which executor and tasks a container holds is the
//! agent's to say.

use std::fmt::Write;

use serde_json::{json, Value};

use crate::isolation::ContainerStats;

/// What one container used, with what runs in it.
#[derive(Debug, Clone)]
pub struct Usage {
    /// The framework of what runs in it.
    pub framework_id: String,
    /// The executor (or command task) it is the container of.
    pub executor_id: String,
    /// The run it holds.
    pub container_id: String,
    /// The tasks it runs.
    pub tasks: Vec<String>,
    /// Its figures.
    pub statistics: Statistics,
}

/// One container's figures ([`crate::Containerizer::usage`]).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Statistics {
    /// The name of its directories (the run it was made for).
    pub cgroup: String,
    /// What it used.
    pub stats: ContainerStats,
}

// === impl Usage ===

impl Usage {
    /// What the master is told of this container.
    pub fn to_report(&self) -> agora_proto::agent::ContainerUsage {
        let s = &self.statistics.stats;
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
    pub fn to_json(&self, timestamp: f64) -> Value {
        let mut statistics = serde_json::to_value(&self.statistics.stats).unwrap_or_default();
        statistics["timestamp"] = json!(timestamp);
        json!({
            "framework_id": self.framework_id,
            "executor_id": self.executor_id,
            "container_id": self.container_id,
            "cgroup": self.statistics.cgroup,
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
pub fn render_metrics(out: &mut String, usage: &[Usage]) {
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
                value(&u.statistics.stats)
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
            tasks: vec!["t1".into()],
            statistics: Statistics {
                cgroup: "run".into(),
                stats: ContainerStats {
                    mem_total_bytes: 42,
                    cpus_limit: 0.5,
                    ..Default::default()
                },
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
