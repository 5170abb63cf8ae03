//! Checkpoints of frameworks that set `checkpoint`: what a restarted agent
//! needs to find its executors again and to finish delivering their tasks'
//! status updates. Layout in [`crate::paths`].
//!
//! All writes go through one writer thread, in order. Status updates are
//! appended to a per-task `updates.log` (one JSON record per line) and made
//! durable with `fdatasync` before the agent acknowledges them to the
//! executor. The writer commits in groups: it takes every request queued
//! while it was busy, writes them all, syncs each touched file once and only
//! then reports each request done, so concurrent updates share an fsync
//! instead of queueing one behind another.

use std::collections::{HashMap, HashSet};
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use agora_proto::{ExecutorInfo, FrameworkId, FrameworkInfo, TaskInfo, TaskStatus};
use serde::{Deserialize, Serialize};

/// A callback run on the writer thread once a request is durable (or failed).
pub(crate) type Done = Box<dyn FnOnce(io::Result<()>) + Send>;

/// One file system operation.
#[derive(Debug)]
pub(crate) enum Op {
    /// Replace a file atomically (write temp, fsync, rename, fsync dir).
    Replace { path: PathBuf, bytes: Vec<u8> },
    /// Append a line to a log, synced before the request completes.
    Append { path: PathBuf, line: Vec<u8> },
    /// Remove a directory tree (not synced; losing it only means more to
    /// clean up on recovery).
    RemoveDir { path: PathBuf },
}

struct Request {
    ops: Vec<Op>,
    done: Option<Done>,
}

/// Handle to the writer thread; dropping every clone stops it after it
/// drained its queue.
#[derive(Clone)]
pub(crate) struct Writer {
    tx: std::sync::mpsc::Sender<Request>,
}

/// An executor as checkpointed.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct ExecutorRecord {
    pub framework_id: FrameworkId,
    pub info: ExecutorInfo,
    pub run_id: String,
    pub token: String,
    pub pid: Option<u32>,
    pub start_time: Option<u64>,
    pub sandbox: PathBuf,
    pub is_command: bool,
}

/// One line of `updates.log`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum LogRecord {
    Update(TaskStatus),
    Ack(String),
}

/// What a checkpoint holds about one task.
#[derive(Debug, Clone)]
pub(crate) struct RecoveredTask {
    pub info: TaskInfo,
    /// Updates in stream order, each at most once, none after a terminal one.
    pub updates: Vec<TaskStatus>,
    /// Uuids the master acknowledged.
    pub acked: HashSet<String>,
}

/// What a checkpoint holds about one executor.
#[derive(Debug, Clone)]
pub(crate) struct RecoveredExecutor {
    pub executor_id: String,
    /// `None` when the executor's record was never written (the agent died
    /// while launching it).
    pub record: Option<ExecutorRecord>,
    pub tasks: Vec<RecoveredTask>,
}

/// What a checkpoint holds about one framework.
#[derive(Debug, Clone)]
pub(crate) struct RecoveredFramework {
    pub info: FrameworkInfo,
    pub executors: Vec<RecoveredExecutor>,
}

// === impl Writer ===

impl Writer {
    /// Starts the writer thread.
    pub(crate) fn start() -> io::Result<Writer> {
        let (tx, rx) = std::sync::mpsc::channel::<Request>();
        std::thread::Builder::new()
            .name("agora-checkpoint".into())
            .spawn(move || {
                while let Ok(first) = rx.recv() {
                    let mut batch = vec![first];
                    batch.extend(rx.try_iter());
                    commit(batch);
                }
            })?;
        Ok(Writer { tx })
    }

    /// Queues `ops`; `done` runs once they are durable.
    pub(crate) fn submit(&self, ops: Vec<Op>, done: Option<Done>) {
        if let Err(std::sync::mpsc::SendError(req)) = self.tx.send(Request { ops, done }) {
            if let Some(done) = req.done {
                done(Err(io::Error::other("checkpoint writer stopped")));
            }
        }
    }
}

/// Writes a batch, syncs each touched log once, then completes every request.
fn commit(batch: Vec<Request>) {
    let mut open: HashMap<PathBuf, File> = HashMap::new();
    let mut results: Vec<(Option<Done>, io::Result<()>, Vec<PathBuf>)> = Vec::new();
    for req in batch {
        let mut result = Ok(());
        let mut touched = Vec::new();
        for op in req.ops {
            let r = match op {
                Op::Replace { path, bytes } => replace_file(&path, &bytes),
                Op::Append { path, line } => {
                    let r = append(&mut open, &path, &line);
                    touched.push(path);
                    r
                }
                Op::RemoveDir { path } => match std::fs::remove_dir_all(&path) {
                    Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
                    _ => Ok(()),
                },
            };
            if let Err(e) = r {
                tracing::error!(error = %e, "checkpoint write failed");
                result = Err(e);
                break;
            }
        }
        results.push((req.done, result, touched));
    }
    let mut synced: HashMap<PathBuf, Result<(), String>> = HashMap::new();
    for (path, file) in &open {
        synced.insert(path.clone(), file.sync_data().map_err(|e| e.to_string()));
    }
    for (done, mut result, touched) in results {
        if result.is_ok() {
            if let Some(Err(e)) = touched
                .iter()
                .find_map(|p| synced.get(p).filter(|r| r.is_err()))
            {
                result = Err(io::Error::other(format!("fdatasync failed: {e}")));
            }
        }
        if let Some(done) = done {
            done(result);
        }
    }
}

fn append(open: &mut HashMap<PathBuf, File>, path: &Path, line: &[u8]) -> io::Result<()> {
    if !open.contains_key(path) {
        let existed = path.exists();
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let file = OpenOptions::new().create(true).append(true).open(path)?;
        if !existed {
            sync_dir(path)?;
        }
        open.insert(path.to_path_buf(), file);
    }
    let file = open
        .get_mut(path)
        .ok_or_else(|| io::Error::other("log file vanished from the batch"))?;
    file.write_all(line)
}

fn replace_file(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let dir = path
        .parent()
        .ok_or_else(|| io::Error::other("checkpoint path has no parent"))?;
    std::fs::create_dir_all(dir)?;
    let tmp = path.with_extension("tmp");
    {
        let mut f = File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, path)?;
    sync_dir(path)
}

fn sync_dir(path: &Path) -> io::Result<()> {
    match path.parent() {
        Some(dir) => File::open(dir)?.sync_all(),
        None => Ok(()),
    }
}

/// Serializes a record as one log line.
pub(crate) fn log_line(record: &LogRecord) -> Vec<u8> {
    let mut line = serde_json::to_vec(record).unwrap_or_default();
    line.push(b'\n');
    line
}

/// Serializes a JSON checkpoint file.
pub(crate) fn json_bytes<T: Serialize>(value: &T) -> Vec<u8> {
    serde_json::to_vec_pretty(value).unwrap_or_default()
}

/// Writes the agent id (atomically, synced).
pub(crate) fn write_agent_id(work_dir: &Path, id: &str) -> io::Result<()> {
    replace_file(&crate::paths::agent_id_file(work_dir), id.as_bytes())
}

/// Reads the agent id, if one was saved.
pub(crate) fn read_agent_id(work_dir: &Path) -> Option<String> {
    std::fs::read_to_string(crate::paths::agent_id_file(work_dir))
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| agora_proto::validate_id(s).is_ok())
}

/// Reads every checkpointed framework. Unreadable pieces are logged and
/// skipped; a torn last log line (a crash mid-append) is ignored.
pub(crate) fn load(work_dir: &Path) -> Vec<RecoveredFramework> {
    let root = crate::paths::meta_root(work_dir).join("frameworks");
    let mut out = Vec::new();
    for fdir in subdirs(&root) {
        let Some(info) = read_json::<FrameworkInfo>(&fdir.join("framework.json")) else {
            tracing::warn!(dir = %fdir.display(), "checkpointed framework without framework.json: skipped");
            continue;
        };
        let mut executors = Vec::new();
        for edir in subdirs(&fdir.join("executors")) {
            let executor_id = file_name(&edir);
            let record = read_json::<ExecutorRecord>(&edir.join("executor.json"));
            let mut tasks = Vec::new();
            for tdir in subdirs(&edir.join("tasks")) {
                let Some(info) = read_json::<TaskInfo>(&tdir.join("task.json")) else {
                    continue;
                };
                let (updates, acked) = read_log(&tdir.join("updates.log"));
                tasks.push(RecoveredTask {
                    info,
                    updates,
                    acked,
                });
            }
            executors.push(RecoveredExecutor {
                executor_id,
                record,
                tasks,
            });
        }
        out.push(RecoveredFramework { info, executors });
    }
    out
}

fn read_log(path: &Path) -> (Vec<TaskStatus>, HashSet<String>) {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let mut updates: Vec<TaskStatus> = Vec::new();
    let mut seen = HashSet::new();
    let mut acked = HashSet::new();
    let mut terminal = false;
    for line in text.lines() {
        match serde_json::from_str::<LogRecord>(line) {
            Ok(LogRecord::Update(status)) => {
                let Some(uuid) = status.uuid.clone() else {
                    continue;
                };
                if terminal || !seen.insert(uuid) {
                    continue;
                }
                terminal = status.state.is_terminal();
                updates.push(status);
            }
            Ok(LogRecord::Ack(uuid)) => {
                acked.insert(uuid);
            }
            Err(e) => {
                tracing::warn!(log = %path.display(), error = %e, "skipping unreadable update record")
            }
        }
    }
    (updates, acked)
}

fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Option<T> {
    let bytes = std::fs::read(path).ok()?;
    match serde_json::from_slice(&bytes) {
        Ok(v) => Some(v),
        Err(e) => {
            tracing::warn!(file = %path.display(), error = %e, "unreadable checkpoint");
            None
        }
    }
}

fn subdirs(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut dirs: Vec<PathBuf> = entries
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.is_dir() && agora_proto::validate_id(&file_name(p)).is_ok())
        .collect();
    dirs.sort();
    dirs
}

fn file_name(p: &Path) -> String {
    p.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use agora_proto::{Source, TaskId, TaskState};

    fn status(state: TaskState, uuid: &str) -> TaskStatus {
        let mut s = TaskStatus::new(TaskId::new("t"), state, Source::SourceExecutor);
        s.uuid = Some(uuid.into());
        s
    }

    #[test]
    fn group_commit_writes_and_reads_back() {
        let dir = tempfile::tempdir().unwrap();
        let writer = Writer::start().unwrap();
        let log = dir.path().join("a/updates.log");
        let (tx, rx) = std::sync::mpsc::channel();
        for (state, uuid) in [
            (TaskState::Running, "u1"),
            (TaskState::Running, "u1"),
            (TaskState::Finished, "u2"),
            (TaskState::Failed, "u3"),
        ] {
            let tx = tx.clone();
            writer.submit(
                vec![Op::Append {
                    path: log.clone(),
                    line: log_line(&LogRecord::Update(status(state, uuid))),
                }],
                Some(Box::new(move |r| tx.send(r.is_ok()).unwrap())),
            );
        }
        writer.submit(
            vec![Op::Append {
                path: log.clone(),
                line: log_line(&LogRecord::Ack("u1".into())),
            }],
            None,
        );
        for _ in 0..4 {
            assert!(rx.recv().unwrap());
        }
        // Append a torn line, as after a crash mid-write.
        let mut f = OpenOptions::new().append(true).open(&log).unwrap();
        f.write_all(b"{\"update\":{\"task_").unwrap();
        drop(f);
        let (tx, rx) = std::sync::mpsc::channel();
        writer.submit(vec![], Some(Box::new(move |r| tx.send(r.is_ok()).unwrap())));
        assert!(rx.recv().unwrap());
        let (updates, acked) = read_log(&log);
        let uuids: Vec<_> = updates.iter().map(|u| u.uuid.clone().unwrap()).collect();
        assert_eq!(uuids, vec!["u1", "u2"]);
        assert!(acked.contains("u1"));
    }

    #[test]
    fn agent_id_roundtrip() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(read_agent_id(dir.path()), None);
        write_agent_id(dir.path(), "agent-1").unwrap();
        assert_eq!(read_agent_id(dir.path()).as_deref(), Some("agent-1"));
    }
}
