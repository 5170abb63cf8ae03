//! [`FileStore`]: the worker store in one local file.
//!
//! The file is a log of JSON lines: a snapshot line, then one line per
//! [`WorkerStore::apply`] batch, each appended and `fdatasync`ed before
//! `apply` returns (one sync per batch: the driver batches everything one
//! step decides). Opening the store folds the log and rewrites it as a
//! single snapshot (temporary file, fsync, rename, fsync of the
//! directory); so does an apply once the log grows past
//! [`COMPACT_AFTER`] lines. A torn last line (a crash mid-append) is
//! ignored: its batch never returned, so nothing acted on it.
//!
//! One process at a time: the store takes an exclusive `flock` on
//! `PATH.lock` for its lifetime, and a second opener gets
//! [`StoreError::Locked`].

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use nix::fcntl::{Flock, FlockArg};
use serde::{Deserialize, Serialize};

use super::{StoreError, StoreOp, StoreState, WorkerStore};

/// Batches appended before the log is rewritten as one snapshot.
pub const COMPACT_AFTER: usize = 10_000;

/// The worker store in a local file (see the module docs).
#[derive(Debug)]
pub struct FileStore {
    path: PathBuf,
    state: StoreState,
    log: Option<File>,
    lines: usize,
    _lock: Flock<File>,
}

#[derive(Serialize, Deserialize)]
#[serde(untagged)]
enum Line {
    Snapshot { snapshot: StoreState },
    Batch { ops: Vec<StoreOp> },
}

// === impl FileStore ===

impl FileStore {
    /// Opens (or creates) the store at `path`, taking its lock.
    pub fn open(path: impl AsRef<Path>) -> Result<FileStore, StoreError> {
        let path = path.as_ref().to_path_buf();
        let io = |source| StoreError::Io {
            path: path.display().to_string(),
            source,
        };
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(io)?;
        }
        let lock_path = path.with_extension("lock");
        let lock_file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(io)?;
        let lock = Flock::lock(lock_file, FlockArg::LockExclusiveNonblock)
            .map_err(|_| StoreError::Locked(path.display().to_string()))?;
        let state = read_log(&path)?;
        let mut store = FileStore {
            path,
            state,
            log: None,
            lines: 0,
            _lock: lock,
        };
        store.compact()?;
        Ok(store)
    }

    /// Where the store lives.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn io(&self, source: std::io::Error) -> StoreError {
        StoreError::Io {
            path: self.path.display().to_string(),
            source,
        }
    }

    /// Rewrites the log as one snapshot line.
    fn compact(&mut self) -> Result<(), StoreError> {
        let tmp = self.path.with_extension("tmp");
        let line = serde_json::to_string(&Line::Snapshot {
            snapshot: self.state.clone(),
        })
        .map_err(|e| StoreError::Corrupt(e.to_string()))?;
        let write = || -> std::io::Result<()> {
            let mut file = File::create(&tmp)?;
            file.write_all(line.as_bytes())?;
            file.write_all(b"\n")?;
            file.sync_all()?;
            std::fs::rename(&tmp, &self.path)?;
            let dir = self
                .path
                .parent()
                .filter(|d| !d.as_os_str().is_empty())
                .unwrap_or(Path::new("."));
            File::open(dir)?.sync_all()
        };
        write().map_err(|e| self.io(e))?;
        let log = OpenOptions::new()
            .append(true)
            .open(&self.path)
            .map_err(|e| self.io(e))?;
        self.log = Some(log);
        self.lines = 1;
        Ok(())
    }
}

impl WorkerStore for FileStore {
    fn load(&mut self) -> Result<StoreState, StoreError> {
        Ok(self.state.clone())
    }

    fn apply(&mut self, ops: &[StoreOp]) -> Result<(), StoreError> {
        if ops.is_empty() {
            return Ok(());
        }
        let mut line = serde_json::to_string(&Line::Batch { ops: ops.to_vec() })
            .map_err(|e| StoreError::Corrupt(e.to_string()))?;
        line.push('\n');
        let Some(log) = self.log.as_mut() else {
            return Err(self.io(std::io::Error::other("the log is not open")));
        };
        let written = log
            .write_all(line.as_bytes())
            .and_then(|()| log.sync_data());
        if let Err(e) = written {
            // The file may now end in a torn line; reopening folds what
            // was complete.
            self.log = None;
            return Err(self.io(e));
        }
        for op in ops {
            self.state.apply(op);
        }
        self.lines += 1;
        if self.lines > COMPACT_AFTER {
            self.compact()?;
        }
        Ok(())
    }
}

/// Folds the log at `path` (absent: empty).
fn read_log(path: &Path) -> Result<StoreState, StoreError> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(StoreState::default()),
        Err(source) => {
            return Err(StoreError::Io {
                path: path.display().to_string(),
                source,
            })
        }
    };
    let mut state = StoreState::default();
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    for (i, raw) in lines.iter().enumerate() {
        match serde_json::from_str::<Line>(raw) {
            Ok(Line::Snapshot { snapshot }) => state = snapshot,
            Ok(Line::Batch { ops }) => {
                for op in &ops {
                    state.apply(op);
                }
            }
            // Only the last line may be torn; anything else is damage.
            Err(_) if i + 1 == lines.len() && !text.ends_with('\n') => {
                tracing::warn!(path = %path.display(), "ignoring a torn last line of the worker store");
            }
            Err(e) => {
                return Err(StoreError::Corrupt(format!(
                    "{} line {}: {e}",
                    path.display(),
                    i + 1
                )))
            }
        }
    }
    Ok(state)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{WorkerRecord, WorkerState};
    use crate::WorkerId;
    use agora_proto::FrameworkId;

    fn put(id: &str, state: WorkerState) -> StoreOp {
        StoreOp::Put {
            record: WorkerRecord {
                id: WorkerId::new(id),
                state,
                spec_name: "tm".into(),
                placed: None,
            },
        }
    }

    #[test]
    fn batches_survive_reopening_and_are_compacted() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("workers.json");
        {
            let mut store = FileStore::open(&path).unwrap();
            store
                .apply(&[
                    StoreOp::SetFrameworkId {
                        framework_id: FrameworkId::new("F1"),
                    },
                    StoreOp::SetAttempt { attempt: 1 },
                    put("w1", WorkerState::New),
                    put("w2", WorkerState::New),
                ])
                .unwrap();
            store
                .apply(&[
                    put("w1", WorkerState::Launched),
                    StoreOp::Remove {
                        id: WorkerId::new("w2"),
                    },
                ])
                .unwrap();
            assert_eq!(std::fs::read_to_string(&path).unwrap().lines().count(), 3);
        }
        let mut store = FileStore::open(&path).unwrap();
        let state = store.load().unwrap();
        assert_eq!(state.framework_id, Some(FrameworkId::new("F1")));
        assert_eq!(state.attempt, 1);
        assert_eq!(state.workers.len(), 1);
        assert_eq!(
            state.workers[&WorkerId::new("w1")].state,
            WorkerState::Launched
        );
        assert_eq!(std::fs::read_to_string(&path).unwrap().lines().count(), 1);
        store.apply(&[StoreOp::Clear]).unwrap();
        drop(store);
        assert_eq!(
            FileStore::open(&path).unwrap().load().unwrap(),
            StoreState::default()
        );
    }

    #[test]
    fn a_torn_last_line_is_ignored_but_damage_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("workers.json");
        {
            let mut store = FileStore::open(&path).unwrap();
            store.apply(&[put("w1", WorkerState::New)]).unwrap();
        }
        let mut text = std::fs::read_to_string(&path).unwrap();
        text.push_str(r#"{"ops":[{"op":"remove","id":"w"#);
        std::fs::write(&path, &text).unwrap();
        let state = FileStore::open(&path).unwrap().load().unwrap();
        assert_eq!(state.workers.len(), 1);
        std::fs::write(&path, "garbage\n{\"ops\":[]}\n").unwrap();
        assert!(matches!(
            FileStore::open(&path),
            Err(StoreError::Corrupt(_))
        ));
    }

    #[test]
    fn one_process_at_a_time() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("workers.json");
        let first = FileStore::open(&path).unwrap();
        assert!(matches!(FileStore::open(&path), Err(StoreError::Locked(_))));
        drop(first);
        FileStore::open(&path).unwrap();
    }
}
