//! Checkpoints of frameworks that set `checkpoint`: what a restarted agent
//! needs to find its executors again and to finish delivering their tasks'
//! status updates. Layout in [`crate::paths`].
//!
//! Frameworks and executors are small JSON files, each replaced
//! atomically (write temp, sync, rename, sync dir). Tasks, status updates
//! and their acknowledgements go to one agent-wide write-ahead log
//! ([`crate::wal`]); a task's `task.json`, as older agents wrote it, is
//! still read back.
//!
//! All writes go through one writer thread, in order. It commits in
//! groups: it takes every request queued while it was busy, carries out
//! the file operations, appends every log record of the batch with one
//! `write`, makes them durable with one `fdatasync`, and only then reports
//! each request done. Many concurrent updates (of any number of tasks)
//! thus share one fsync, and none is reported durable before it is.

use agora_proto::hash::HashMap;
use std::fs::File;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use agora_proto::{ExecutorInfo, FrameworkId, FrameworkInfo, TaskInfo};
use serde::{Deserialize, Serialize};

use crate::wal::{self, Limits, StreamState, Wal, WalRecord, WalStats};

/// From this many files in a run of replacements on, the run is made
/// durable with `syncfs` (twice) rather than an fsync per file and per
/// directory. Fewer stay with per-file syncs, which do not wait for other
/// processes' dirty data on the same file system.
const SYNCFS_MIN_FILES: usize = 8;

/// A batch that takes longer than this is logged (at debug).
const SLOW_BATCH: std::time::Duration = std::time::Duration::from_millis(50);

/// A callback run on the writer thread once a request is durable (or failed).
pub(crate) type Done = Box<dyn FnOnce(io::Result<()>) + Send>;

/// One file system operation.
// Ops are moved straight into the writer's batch; boxing the record would
// only add an allocation per status update.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum Op {
    /// Replace a file atomically (write temp, fsync, rename, fsync dir).
    Replace { path: PathBuf, bytes: Vec<u8> },
    /// Append a record to the status update log, synced before the
    /// request completes.
    Wal(WalRecord),
    /// Drop every stream of a framework (or all) from the log.
    WalForget(Option<FrameworkId>),
    /// Remove a directory tree (not synced; losing it only means more to
    /// clean up on recovery).
    RemoveDir { path: PathBuf },
    /// Remove a file (a missing one is no error), then sync its directory.
    RemoveFile { path: PathBuf },
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
    stats: Arc<Mutex<WalStats>>,
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

/// What a checkpoint holds about one task.
#[derive(Debug, Clone)]
pub(crate) struct RecoveredTask {
    pub info: TaskInfo,
    /// Its own sandbox, when it has one (command tasks).
    pub sandbox: Option<PathBuf>,
    /// Its update stream; `None` when it took no update yet.
    pub stream: Option<StreamState>,
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
    /// Opens the status update log under `work_dir` (reading back and
    /// compacting what it holds) and starts the writer thread. Returns the
    /// streams the log held.
    pub(crate) fn start(work_dir: &Path) -> io::Result<(Writer, Vec<StreamState>)> {
        Self::start_with(
            work_dir,
            Limits {
                compact_bytes: wal::COMPACT_BYTES,
                reset_bytes: wal::RESET_BYTES,
            },
        )
    }

    /// [`Writer::start`] with explicit compaction limits.
    pub(crate) fn start_with(
        work_dir: &Path,
        limits: Limits,
    ) -> io::Result<(Writer, Vec<StreamState>)> {
        let path = crate::paths::meta_root(work_dir).join(wal::WAL_FILE);
        let mut wal = Wal::open(&path, limits)?;
        let streams = wal.streams().states().cloned().collect();
        let stats = Arc::new(Mutex::new(wal.stats()));
        let (tx, rx) = std::sync::mpsc::channel::<Request>();
        let shared = stats.clone();
        std::thread::Builder::new()
            .name("agora-checkpoint".into())
            .spawn(move || {
                while let Ok(first) = rx.recv() {
                    let mut batch = vec![first];
                    batch.extend(rx.try_iter());
                    commit(&mut wal, batch, &shared);
                }
            })?;
        Ok((Writer { tx, stats }, streams))
    }

    /// Queues `ops`; `done` runs once they are durable.
    pub(crate) fn submit(&self, ops: Vec<Op>, done: Option<Done>) {
        if let Err(std::sync::mpsc::SendError(req)) = self.tx.send(Request { ops, done }) {
            if let Some(done) = req.done {
                done(Err(io::Error::other("checkpoint writer stopped")));
            }
        }
    }

    /// The log's counters after the latest batch.
    pub(crate) fn stats(&self) -> WalStats {
        *self.stats.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Carries out a batch: file operations in order, every log record with
/// one write and one fdatasync, then completes every request.
///
/// Consecutive file replacements (a burst of task launches) are done in
/// phases: every temp file written, then each synced, then each renamed,
/// then each directory synced. Each file keeps the write-sync-rename-sync
/// order that makes it atomic, but the syncs of a burst find most of their
/// work already done by the first one, instead of each paying a journal
/// commit of its own.
fn commit(wal: &mut Wal, batch: Vec<Request>, stats: &Mutex<WalStats>) {
    let started = std::time::Instant::now();
    let requests = batch.len();
    let mut files = 0;
    let mut records = Vec::new();
    let mut results: Vec<(Option<Done>, io::Result<()>, bool)> = Vec::with_capacity(batch.len());
    let mut wal_error: Option<String> = None;
    // A run of replacements not yet carried out: (request index, path, bytes).
    let mut replacements: Vec<(usize, PathBuf, Vec<u8>)> = Vec::new();
    for (index, req) in batch.into_iter().enumerate() {
        results.push((req.done, Ok(()), false));
        for op in req.ops {
            if let Op::Replace { path, bytes } = op {
                // A second version of a file waits for the first: they
                // would share a temp file.
                if replacements.iter().any(|(_, p, _)| *p == path) {
                    replace_files(std::mem::take(&mut replacements), &mut results);
                }
                replacements.push((index, path, bytes));
                files += 1;
                continue;
            }
            replace_files(std::mem::take(&mut replacements), &mut results);
            if results[index].1.is_err() {
                break;
            }
            let r = match op {
                Op::Replace { .. } => Ok(()),
                Op::Wal(record) => {
                    records.push(record);
                    results[index].2 = true;
                    Ok(())
                }
                Op::WalForget(framework_id) => {
                    results[index].2 = true;
                    let mut r = wal.append(std::mem::take(&mut records));
                    if r.is_ok() {
                        r = wal.forget(framework_id.as_ref());
                    }
                    if let Err(e) = &r {
                        wal_error.get_or_insert_with(|| e.to_string());
                    }
                    Ok(())
                }
                Op::RemoveDir { path } => match std::fs::remove_dir_all(&path) {
                    Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
                    _ => Ok(()),
                },
                Op::RemoveFile { path } => match std::fs::remove_file(&path) {
                    Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
                    _ => path
                        .parent()
                        .map_or(Ok(()), |dir| std::fs::File::open(dir)?.sync_all()),
                },
            };
            if let Err(e) = r {
                tracing::error!(error = %e, "checkpoint write failed");
                crate::disk::saw(&e);
                results[index].1 = Err(e);
                break;
            }
        }
    }
    replace_files(replacements, &mut results);
    let files_done = started.elapsed();
    let record_count = records.len();
    let mut synced = wal.append(records);
    if synced.is_ok() {
        synced = wal.sync();
    }
    let elapsed = started.elapsed();
    if elapsed > SLOW_BATCH {
        tracing::debug!(
            requests,
            files,
            records = record_count,
            files_ms = files_done.as_secs_f64() * 1e3,
            took_ms = elapsed.as_secs_f64() * 1e3,
            "slow checkpoint batch"
        );
    }
    if let Err(e) = synced {
        tracing::error!(error = %e, "status update log write failed");
        crate::disk::saw(&e);
        wal_error.get_or_insert_with(|| e.to_string());
    }
    *stats.lock().unwrap_or_else(PoisonError::into_inner) = wal.stats();
    for (done, mut result, logged) in results {
        if let (Ok(()), true, Some(e)) = (&result, logged, &wal_error) {
            result = Err(io::Error::other(format!("status update log: {e}")));
        }
        if let Some(done) = done {
            done(result);
        }
    }
}

/// Replaces a run of files atomically, in phases (see [`commit`]). A
/// failure fails the request the file belongs to; the other files go on.
fn replace_files(
    run: Vec<(usize, PathBuf, Vec<u8>)>,
    results: &mut [(Option<Done>, io::Result<()>, bool)],
) {
    if run.is_empty() {
        return;
    }
    let fail =
        |results: &mut [(Option<Done>, io::Result<()>, bool)], index: usize, e: io::Error| {
            tracing::error!(error = %e, "checkpoint write failed");
            crate::disk::saw(&e);
            if results[index].1.is_ok() {
                results[index].1 = Err(e);
            }
        };
    // Write every temp file.
    let mut written = Vec::with_capacity(run.len());
    for (index, path, bytes) in run {
        if results[index].1.is_err() {
            continue;
        }
        match write_temp(&path, &bytes) {
            Ok((tmp, file)) => written.push((index, path, tmp, file)),
            Err(e) => fail(results, index, e),
        }
    }
    if written.len() >= SYNCFS_MIN_FILES {
        // One sync of the file system makes every temp file durable, and
        // one more every rename (and every directory created on the way):
        // two device flushes for the run instead of two per file.
        let Some(first) = written.first().map(|w| w.3.try_clone()) else {
            return;
        };
        let synced = first.and_then(|f| nix::unistd::syncfs(&f).map_err(io::Error::from));
        if let Err(e) = synced {
            for (index, ..) in written {
                fail(results, index, io::Error::new(e.kind(), e.to_string()));
            }
            return;
        }
        let mut handle = None;
        let mut renamed = Vec::with_capacity(written.len());
        for (index, path, tmp, file) in written {
            match std::fs::rename(&tmp, &path) {
                Ok(()) => {
                    handle.get_or_insert(file);
                    renamed.push(index);
                }
                Err(e) => fail(results, index, e),
            }
        }
        if let Some(Err(e)) = handle.map(|f| nix::unistd::syncfs(&f)) {
            let e = io::Error::from(e);
            for index in renamed {
                fail(results, index, io::Error::new(e.kind(), e.to_string()));
            }
        }
        return;
    }
    // Make each durable, then rename it into place.
    let mut renamed = Vec::with_capacity(written.len());
    for (index, path, tmp, file) in written {
        if let Err(e) = file.sync_all() {
            fail(results, index, e);
            continue;
        }
        drop(file);
        match std::fs::rename(&tmp, &path) {
            Ok(()) => renamed.push((index, path)),
            Err(e) => fail(results, index, e),
        }
    }
    // Make each rename durable: sync each directory once.
    let mut synced_dirs: std::collections::HashMap<PathBuf, Result<(), io::ErrorKind>> =
        std::collections::HashMap::default();
    for (index, path) in renamed {
        let Some(dir) = path.parent() else {
            continue;
        };
        let outcome = synced_dirs
            .entry(dir.to_path_buf())
            .or_insert_with(|| sync_dir(&path).map_err(|e| e.kind()));
        if let Err(kind) = outcome {
            fail(
                results,
                index,
                io::Error::new(*kind, "syncing the checkpoint directory failed"),
            );
        }
    }
}

/// Writes `bytes` to the temp file beside `path` (creating the directory),
/// not yet synced.
fn write_temp(path: &Path, bytes: &[u8]) -> io::Result<(PathBuf, File)> {
    let dir = path
        .parent()
        .ok_or_else(|| io::Error::other("checkpoint path has no parent"))?;
    std::fs::create_dir_all(dir)?;
    let tmp = path.with_extension("tmp");
    let mut f = File::create(&tmp)?;
    f.write_all(bytes)?;
    Ok((tmp, f))
}

fn sync_dir(path: &Path) -> io::Result<()> {
    match path.parent() {
        Some(dir) => File::open(dir)?.sync_all(),
        None => Ok(()),
    }
}

/// Serializes a JSON checkpoint file.
pub(crate) fn json_bytes<T: Serialize>(value: &T) -> Vec<u8> {
    serde_json::to_vec_pretty(value).unwrap_or_default()
}

/// Reads the agent id, if one was saved.
pub(crate) fn read_agent_id(work_dir: &Path) -> Option<String> {
    std::fs::read_to_string(crate::paths::agent_id_file(work_dir))
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| agora_proto::validate_id(s).is_ok())
}

/// Reads every checkpointed framework, attaching to each task its stream
/// from `streams` (what [`Writer::start`] read from the log). A task is
/// checkpointed in the log (a stream that carries its `TaskInfo`) or, as
/// older agents wrote it, in a `task.json`. Unreadable pieces are logged
/// and skipped. Streams with no checkpointed task are returned in the
/// second list (their task was forgotten while the end of the stream was
/// not yet durable, or their framework's checkpoint is gone).
pub(crate) fn load(
    work_dir: &Path,
    streams: Vec<StreamState>,
) -> (Vec<RecoveredFramework>, Vec<StreamState>) {
    type Key = (FrameworkId, agora_proto::TaskId);
    let mut by_task: HashMap<Key, StreamState> = HashMap::default();
    // Tasks the log holds, by framework and executor.
    let mut logged: HashMap<(FrameworkId, String), Vec<Key>> = HashMap::default();
    for s in streams {
        let key = (s.framework_id.clone(), s.task_id.clone());
        if s.task.is_some() {
            logged
                .entry((s.framework_id.clone(), s.executor_id.as_str().to_string()))
                .or_default()
                .push(key.clone());
        }
        by_task.insert(key, s);
    }
    let root = crate::paths::meta_root(work_dir).join("frameworks");
    let mut out = Vec::new();
    for fdir in subdirs(&root) {
        let Some(info) = read_json::<FrameworkInfo>(&fdir.join("framework.json")) else {
            tracing::warn!(dir = %fdir.display(), "checkpointed framework without framework.json: skipped");
            continue;
        };
        let fid = info
            .id
            .clone()
            .unwrap_or_else(|| FrameworkId::new(file_name(&fdir)));
        let mut executor_ids: Vec<String> = subdirs(&fdir.join("executors"))
            .iter()
            .map(|d| file_name(d))
            .collect();
        for (f, e) in logged.keys() {
            if *f == fid && !executor_ids.contains(e) {
                executor_ids.push(e.clone());
            }
        }
        let mut executors = Vec::new();
        for executor_id in executor_ids {
            let edir = fdir.join("executors").join(&executor_id);
            let record = read_json::<ExecutorRecord>(&edir.join("executor.json"));
            let mut tasks = Vec::new();
            for tdir in subdirs(&edir.join("tasks")) {
                let Some(info) = read_json::<TaskInfo>(&tdir.join("task.json")) else {
                    continue;
                };
                let stream = by_task
                    .remove(&(fid.clone(), info.task_id.clone()))
                    .map(|mut s| {
                        s.task = None;
                        s
                    });
                tasks.push(RecoveredTask {
                    info,
                    sandbox: None,
                    stream,
                });
            }
            let keys = logged
                .remove(&(fid.clone(), executor_id.clone()))
                .unwrap_or_default();
            for key in keys {
                let Some(mut stream) = by_task.remove(&key) else {
                    continue;
                };
                let Some(info) = stream.task.take() else {
                    continue;
                };
                let sandbox = stream.sandbox.take();
                let stream = (!stream.has_no_updates()).then_some(stream);
                tasks.push(RecoveredTask {
                    info: *info,
                    sandbox,
                    stream,
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
    (out, by_task.into_values().collect())
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
    use agora_proto::{ExecutorId, Source, TaskId, TaskState, TaskStatus};

    fn update(task: &str, state: TaskState, uuid: &str) -> Op {
        let mut s = TaskStatus::new(TaskId::new(task), state, Source::SourceExecutor);
        s.uuid = Some(uuid.into());
        Op::Wal(WalRecord::Update {
            framework_id: FrameworkId::new("f"),
            executor_id: ExecutorId::new("e"),
            status: s,
        })
    }

    /// A command-less task named `id`.
    fn task_info(id: &str) -> TaskInfo {
        TaskInfo {
            container: None,
            allocation_role: None,
            launch_stamp: None,
            name: id.into(),
            task_id: TaskId::new(id),
            agent_id: agora_proto::AgentId::new("a"),
            resources: agora_proto::Resources::default(),
            executor: None,
            command: None,
            data: None,
            kill_grace_period: None,
            labels: Default::default(),
            task_group: None,
        }
    }

    /// A log under `work_dir` that never compacts.
    fn uncompacted_log(work_dir: &Path) -> Wal {
        let path = crate::paths::meta_root(work_dir).join(wal::WAL_FILE);
        let limits = Limits {
            compact_bytes: 1 << 30,
            reset_bytes: 1 << 30,
        };
        Wal::open(&path, limits).unwrap()
    }

    #[test]
    fn a_burst_of_replacements_keeps_order_and_every_result() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = uncompacted_log(dir.path());
        let (tx, rx) = std::sync::mpsc::channel();
        let done = |tx: &std::sync::mpsc::Sender<(usize, bool)>, i: usize| -> Option<Done> {
            let tx = tx.clone();
            Some(Box::new(move |r: io::Result<()>| {
                let _ = tx.send((i, r.is_ok()));
            }))
        };
        let file = |i: usize| dir.path().join(format!("t{i}")).join("task.json");
        let mut batch: Vec<Request> = (0..50)
            .map(|i| Request {
                ops: vec![Op::Replace {
                    path: file(i),
                    bytes: format!("v1-{i}").into_bytes(),
                }],
                done: done(&tx, i),
            })
            .collect();
        // A second version of file 3 in the same run, a removal of file 7's
        // directory after its replacement, and a file whose directory
        // cannot be made (its parent is a file).
        batch.push(Request {
            ops: vec![Op::Replace {
                path: file(3),
                bytes: b"v2-3".to_vec(),
            }],
            done: done(&tx, 100),
        });
        batch.push(Request {
            ops: vec![Op::RemoveDir {
                path: dir.path().join("t7"),
            }],
            done: done(&tx, 101),
        });
        std::fs::write(dir.path().join("blocker"), b"").unwrap();
        batch.push(Request {
            ops: vec![Op::Replace {
                path: dir.path().join("blocker").join("x").join("task.json"),
                bytes: b"never".to_vec(),
            }],
            done: done(&tx, 102),
        });
        let stats = Mutex::new(WalStats::default());
        commit(&mut log, batch, &stats);
        drop(tx);
        let mut results: Vec<(usize, bool)> = rx.iter().collect();
        results.sort();
        assert_eq!(results.len(), 53, "every request completes once");
        for (i, ok) in &results {
            assert_eq!(*ok, *i != 102, "request {i}");
        }
        for i in 0..50 {
            let got = std::fs::read_to_string(file(i)).ok();
            let want = match i {
                3 => Some("v2-3".to_string()),
                7 => None,
                _ => Some(format!("v1-{i}")),
            };
            assert_eq!(got, want, "file {i}");
            assert!(!file(i).with_extension("tmp").exists());
        }
    }

    #[test]
    fn concurrent_requests_share_one_fsync() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = uncompacted_log(dir.path());
        // 200 requests queued while the writer was busy: one batch.
        let (tx, rx) = std::sync::mpsc::channel();
        let batch: Vec<Request> = (0..200)
            .map(|i| {
                let tx = tx.clone();
                Request {
                    ops: vec![update(
                        &format!("t{i}"),
                        TaskState::Running,
                        &format!("u{i}"),
                    )],
                    done: Some(Box::new(move |r: io::Result<()>| {
                        tx.send(r.is_ok()).unwrap()
                    })),
                }
            })
            .collect();
        commit(&mut log, batch, &Mutex::new(WalStats::default()));
        assert_eq!(log.stats().syncs, 1, "one fdatasync for the whole batch");
        assert_eq!(rx.try_iter().filter(|ok| *ok).count(), 200);
    }

    #[test]
    fn writer_reads_back_streams_and_tasks() {
        let dir = tempfile::tempdir().unwrap();
        let task_dir = crate::paths::meta_task_dir(dir.path(), "f", "e", "t").unwrap();
        let mut fw = FrameworkInfo::new("fw");
        fw.id = Some(FrameworkId::new("f"));
        fw.checkpoint = true;
        let task = task_info("t");
        {
            let (writer, streams) = Writer::start(dir.path()).unwrap();
            assert!(streams.is_empty());
            let (tx, rx) = std::sync::mpsc::channel();
            let meta_fw = crate::paths::meta_framework_dir(dir.path(), "f").unwrap();
            writer.submit(
                vec![
                    Op::Replace {
                        path: meta_fw.join("framework.json"),
                        bytes: json_bytes(&fw),
                    },
                    Op::Replace {
                        path: task_dir.join("task.json"),
                        bytes: json_bytes(&task),
                    },
                    update("t", TaskState::Running, "u1"),
                    update("orphan", TaskState::Running, "o1"),
                ],
                Some(Box::new(move |r| tx.send(r.is_ok()).unwrap())),
            );
            assert!(rx.recv().unwrap());
            assert!(writer.stats().syncs >= 1);
        }
        let (_writer, streams) = Writer::start(dir.path()).unwrap();
        assert_eq!(streams.len(), 2);
        let (frameworks, orphans) = load(dir.path(), streams);
        assert_eq!(frameworks.len(), 1);
        let t = &frameworks[0].executors[0].tasks[0];
        let stream = t.stream.as_ref().unwrap();
        assert_eq!(stream.pending[0].uuid.as_deref(), Some("u1"));
        assert_eq!(orphans.len(), 1);
        assert_eq!(orphans[0].task_id.as_str(), "orphan");
    }

    #[test]
    fn tasks_checkpointed_in_the_log_are_recovered() {
        let dir = tempfile::tempdir().unwrap();
        let fw = FrameworkInfo::new("fw");
        let launch = |fid: &str, eid: &str, id: &str| {
            Op::Wal(WalRecord::Task {
                framework_id: FrameworkId::new(fid),
                executor_id: ExecutorId::new(eid),
                task: Box::new(task_info(id)),
                sandbox: None,
            })
        };
        {
            let (writer, _) = Writer::start(dir.path()).unwrap();
            let (tx, rx) = std::sync::mpsc::channel();
            let meta_fw = crate::paths::meta_framework_dir(dir.path(), "f").unwrap();
            writer.submit(
                vec![
                    Op::Replace {
                        path: meta_fw.join("framework.json"),
                        bytes: json_bytes(&fw),
                    },
                    // "t" took an update; "quiet" none; "gone" belongs to a
                    // framework whose checkpoint is missing.
                    launch("f", "e", "t"),
                    update("t", TaskState::Running, "u1"),
                    launch("f", "e2", "quiet"),
                    launch("nofw", "e", "gone"),
                ],
                Some(Box::new(move |r| tx.send(r.is_ok()).unwrap())),
            );
            assert!(rx.recv().unwrap());
        }
        // Read back twice: straight from the appended records, and after a
        // restart compacted them into stream snapshots.
        for _ in 0..2 {
            let (_writer, streams) = Writer::start(dir.path()).unwrap();
            let (frameworks, orphans) = load(dir.path(), streams);
            assert_eq!(frameworks.len(), 1);
            let mut tasks: Vec<(String, String, Option<usize>)> = frameworks[0]
                .executors
                .iter()
                .flat_map(|e| {
                    e.tasks.iter().map(|t| {
                        (
                            e.executor_id.clone(),
                            t.info.task_id.as_str().to_string(),
                            t.stream.as_ref().map(|s| s.pending.len()),
                        )
                    })
                })
                .collect();
            tasks.sort();
            assert_eq!(
                tasks,
                vec![
                    ("e".into(), "t".into(), Some(1)),
                    ("e2".into(), "quiet".into(), None)
                ]
            );
            assert_eq!(orphans.len(), 1);
            assert_eq!(orphans[0].task_id.as_str(), "gone");
            assert!(frameworks[0].executors.iter().all(|e| e.record.is_none()));
        }
    }

    #[test]
    fn agent_id_roundtrip() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(read_agent_id(dir.path()), None);
        let file = crate::paths::agent_id_file(dir.path());
        std::fs::write(&file, "agent-1\n").unwrap();
        assert_eq!(read_agent_id(dir.path()).as_deref(), Some("agent-1"));
        std::fs::write(&file, "../etc").unwrap();
        assert_eq!(read_agent_id(dir.path()), None, "an unusable id is ignored");
    }
}
