//! The agent's `/state` view.

use super::*;

impl Core {
    pub(super) fn snapshot(&self) -> serde_json::Value {
        let config = &self.shared.config;
        let wal = self.writer.stats();
        let task_json = |fid: &FrameworkId, eid: &ExecutorId| -> Vec<serde_json::Value> {
            let mut tasks: Vec<_> = self
                .tasks
                .iter()
                .filter(|((f, _), t)| f == fid && t.executor_id == *eid)
                .map(|((_, tid), t)| {
                    json!({
                        "id": tid,
                        "name": t.info.name,
                        "state": t.state,
                        "resources": t.info.resources,
                        "pending_updates": self.updates.pending(fid, tid).len(),
                    })
                })
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
                let mut eids: HashSet<&ExecutorId> = self
                    .executors
                    .keys()
                    .filter(|(f, _)| f == fid)
                    .map(|(_, e)| e)
                    .collect();
                let orphan: HashSet<&ExecutorId> = self
                    .tasks
                    .iter()
                    .filter(|((f, _), t)| {
                        f == fid
                            && !self
                                .executors
                                .contains_key(&(fid.clone(), t.executor_id.clone()))
                    })
                    .map(|(_, t)| &t.executor_id)
                    .collect();
                eids.extend(orphan.iter().copied());
                let mut eids: Vec<_> = eids.into_iter().collect();
                eids.sort();
                let executors: Vec<_> = eids
                    .into_iter()
                    .map(
                        |eid| match self.executors.get(&(fid.clone(), eid.clone())) {
                            Some(ex) => json!({
                                "id": eid,
                                "name": ex.info.name,
                                "running": true,
                                "pid": ex.pid,
                                "run_id": ex.run_id,
                                "sandbox": ex.sandbox,
                                "command_executor": ex.is_command,
                                "subscribed": ex.subscribed,
                                "connected": ex.conn.is_some(),
                                "stopping": ex.killing,
                                "tasks": task_json(fid, eid),
                            }),
                            None => json!({
                                "id": eid,
                                "running": false,
                                "tasks": task_json(fid, eid),
                            }),
                        },
                    )
                    .collect();
                json!({
                    "id": fid,
                    "name": info.name,
                    "checkpoint": info.checkpoint,
                    "executors": executors,
                })
            })
            .collect();
        json!({
            "id": self.agent_id,
            "version": agora_proto::VERSION,
            "master": config.master,
            "registered": self.master.as_ref().is_some_and(|m| m.registered),
            "hostname": config.hostname,
            "address": self.shared.address,
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
            },
        })
    }
}
