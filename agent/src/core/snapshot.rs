//! The agent's `/state` view.

use super::*;

impl Core {
    /// The `/state` view (`wal`: the status update log's counters, which
    /// the writer thread keeps).
    pub(crate) fn snapshot(&self, wal: crate::wal::WalStats) -> serde_json::Value {
        let config = &self.shared.config;
        let one_task = |fid: &FrameworkId, tid: &TaskId, t: &Task| {
            json!({
                "id": tid,
                "name": t.info.name,
                "state": t.state,
                "resources": t.info.resources,
                "pending_updates": self.updates.pending(fid, tid).len(),
            })
        };
        let task_json = |ekey: &ExecKey| -> Vec<serde_json::Value> {
            let mut tasks: Vec<_> = self
                .executor_tasks(ekey)
                .map(|(tid, t)| one_task(&ekey.0, tid, t))
                .collect();
            tasks.sort_by(|a, b| a["id"].as_str().cmp(&b["id"].as_str()));
            tasks
        };
        let mut fids: Vec<&FrameworkId> = self.frameworks.keys().collect();
        fids.sort();
        let frameworks: Vec<_> = fids
            .into_iter()
            .map(|fid| {
                let info = &self.frameworks[fid];
                // Executors by id: running ones, and gone ones whose tasks'
                // updates are still on their way.
                let mut eids: Vec<ExecutorId> = self
                    .executors
                    .keys()
                    .chain(self.tasks_by_executor.keys())
                    .filter(|(f, e)| {
                        f == fid && !e.as_str().starts_with(paths::AGENT_EXECUTOR_PREFIX)
                    })
                    .map(|(_, e)| e.clone())
                    .collect();
                eids.sort();
                eids.dedup();
                let mut executors: Vec<_> = eids
                    .into_iter()
                    .map(|eid| {
                        let ekey = (fid.clone(), eid);
                        match self.executors.get(&ekey) {
                            Some(ex) => json!({
                                "id": ekey.1,
                                "name": ex.info.name,
                                "running": true,
                                "pid": ex.pid,
                                "run_id": ex.run_id,
                                "sandbox": ex.sandbox,
                                // Mesos's name: what `/files/read?path=` takes.
                                "directory": ex.sandbox,
                                "command_executor": ex.is_command,
                                "subscribed": ex.subscribed,
                                "connected": ex.conn.is_some(),
                                "stopping": ex.killing,
                                "tasks": task_json(&ekey),
                            }),
                            None => json!({
                                "id": ekey.1,
                                "running": false,
                                "tasks": task_json(&ekey),
                            }),
                        }
                    })
                    .collect();
                // A command task shows as its own command executor, as in
                // Mesos: named by the task, with the task's sandbox.
                let mut command_executors = Vec::new();
                for ((f, host_id), tids) in &self.tasks_by_executor {
                    if f != fid || !host_id.as_str().starts_with(paths::AGENT_EXECUTOR_PREFIX) {
                        continue;
                    }
                    let host = self.executors.get(&(f.clone(), host_id.clone()));
                    for tid in tids {
                        let Some(t) = self.tasks.get(&(f.clone(), tid.clone())) else {
                            continue;
                        };
                        let run_id = t.sandbox.as_deref().map(paths::run_id_of);
                        executors.push(json!({
                            "id": tid,
                            "name": format!("Command Executor (Task: {tid})"),
                            "running": host.is_some(),
                            "pid": host.and_then(|h| h.pid),
                            "run_id": run_id,
                            "sandbox": t.sandbox,
                            "directory": t.sandbox,
                            "command_executor": true,
                            "process": host_id,
                            "subscribed": host.is_some_and(|h| h.subscribed),
                            "connected": host.is_some_and(|h| h.conn.is_some()),
                            "stopping": host.is_some_and(|h| h.killing),
                            "tasks": [one_task(f, tid, t)],
                        }));
                    }
                }
                for ((f, host_id), host) in &self.executors {
                    if f == fid && host.is_command {
                        command_executors.push(json!({
                            "id": host_id,
                            "pid": host.pid,
                            "run_id": host.run_id,
                            "sandbox": host.sandbox,
                            "subscribed": host.subscribed,
                            "connected": host.conn.is_some(),
                            "stopping": host.killing,
                            "live_tasks": self.live_tasks(&(f.clone(), host_id.clone())),
                        }));
                    }
                }
                executors.sort_by(|a, b| a["id"].as_str().cmp(&b["id"].as_str()));
                command_executors.sort_by(|a, b| a["id"].as_str().cmp(&b["id"].as_str()));
                json!({
                    "id": fid,
                    "name": info.name,
                    "user": info.user,
                    "checkpoint": info.checkpoint,
                    "executors": executors,
                    "command_executors": command_executors,
                })
            })
            .collect();
        json!({
            "id": self.agent_id,
            "version": agora_proto::VERSION,
            "master": config.master,
            "registered": self.master.as_ref().is_some_and(|m| m.registered),
            // Why the agent takes no new task (its work directory is
            // full); null while it takes them.
            "unavailable": self.disk_full,
            "hostname": config.hostname,
            "address": self.shared.advertised_address(self.master_local_ip),
            "work_dir": config.work_dir,
            "resources": config.resources,
            "attributes": config.attributes,
            "frameworks": frameworks,
            "status_update_streams": self.updates.len(),
            "status_updates_acknowledged": self.acknowledged,
            "checkpoint": {
                "wal_bytes": wal.bytes,
                "wal_records": wal.records,
                "wal_syncs": wal.syncs,
                "wal_compactions": wal.compactions,
                "wal_truncations": wal.truncations,
                "wal_truncated_bytes": wal.truncated_bytes,
                "wal_truncated_records": wal.truncated_records,
            },
        })
    }

    /// Every task: framework, id, executor process, state, and how many
    /// updates of its stream the master has not acknowledged (sorted).
    #[cfg_attr(not(feature = "sim"), allow(dead_code))]
    pub(crate) fn task_views(&self) -> Vec<(FrameworkId, TaskId, ExecutorId, TaskState, usize)> {
        let mut out: Vec<_> = self
            .tasks
            .iter()
            .map(|((fid, tid), t)| {
                (
                    fid.clone(),
                    tid.clone(),
                    t.executor_id.clone(),
                    t.state,
                    self.updates.pending(fid, tid).len(),
                )
            })
            .collect();
        out.sort_by(|a, b| (&a.0, &a.1).cmp(&(&b.0, &b.1)));
        out
    }

    /// The `TaskInfo` the agent holds for a task (the one it was given
    /// last), if it has one.
    #[cfg_attr(not(feature = "sim"), allow(dead_code))]
    pub(crate) fn task_info(
        &self,
        framework_id: &FrameworkId,
        task_id: &TaskId,
    ) -> Option<&TaskInfo> {
        self.tasks
            .get(&(framework_id.clone(), task_id.clone()))
            .map(|t| &t.info)
    }
}
