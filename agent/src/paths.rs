//! The layout of the agent's work dir. Every id that becomes a path
//! component is checked with [`agora_proto::validate_id`] first, so no id a
//! peer chooses can escape the work dir.
//!
//! ```text
//! WORK_DIR/agent_id                                        the agent's id
//! WORK_DIR/frameworks/FID/executors/EID/runs/RUN/          sandboxes (of command
//!                                                          tasks too: EID = the task id)
//! WORK_DIR/frameworks/FID/executors/~command-N/runs/RUN/   a command executor's own
//! WORK_DIR/meta/frameworks/FID/framework.json              checkpoints
//! WORK_DIR/meta/frameworks/FID/executors/EID/executor.json
//! WORK_DIR/meta/frameworks/FID/executors/EID/tasks/TID/task.json (read only: older agents')
//! WORK_DIR/meta/updates.wal                                tasks and their status update streams
//! ```

use std::path::{Path, PathBuf};

use agora_proto::{validate_executor_id, validate_id, IdError};

/// An id that cannot be used as a path component.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {kind} id: {source}")]
pub struct BadPathId {
    /// Which id (framework, executor, task, run).
    pub kind: &'static str,
    /// Why it was refused.
    pub source: IdError,
}

fn check(kind: &'static str, id: &str) -> Result<(), BadPathId> {
    // The agent's own executors (command executors) are named `~NAME`,
    // which no framework's id can be.
    match kind {
        "executor" => validate_executor_id(id),
        _ => validate_id(id),
    }
    .map_err(|source| BadPathId { kind, source })
}

pub use agora_proto::AGENT_EXECUTOR_PREFIX;

/// The file holding the agent id.
pub fn agent_id_file(work_dir: &Path) -> PathBuf {
    work_dir.join("agent_id")
}

/// Root of all checkpoints.
pub fn meta_root(work_dir: &Path) -> PathBuf {
    work_dir.join("meta")
}

/// `WORK_DIR/frameworks/FID/executors/EID/runs/RUN`.
pub fn sandbox_dir(
    work_dir: &Path,
    framework_id: &str,
    executor_id: &str,
    run_id: &str,
) -> Result<PathBuf, BadPathId> {
    check("framework", framework_id)?;
    check("executor", executor_id)?;
    check("run", run_id)?;
    Ok(work_dir
        .join("frameworks")
        .join(framework_id)
        .join("executors")
        .join(executor_id)
        .join("runs")
        .join(run_id))
}

/// The run id a [`sandbox_dir`] ends with (empty for a path that ends
/// with none).
pub fn run_id_of(sandbox: &Path) -> String {
    sandbox
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// `WORK_DIR/meta/frameworks/FID`.
pub fn meta_framework_dir(work_dir: &Path, framework_id: &str) -> Result<PathBuf, BadPathId> {
    check("framework", framework_id)?;
    Ok(meta_root(work_dir).join("frameworks").join(framework_id))
}

/// `WORK_DIR/meta/frameworks/FID/executors/EID`.
pub fn meta_executor_dir(
    work_dir: &Path,
    framework_id: &str,
    executor_id: &str,
) -> Result<PathBuf, BadPathId> {
    check("executor", executor_id)?;
    Ok(meta_framework_dir(work_dir, framework_id)?
        .join("executors")
        .join(executor_id))
}

/// `WORK_DIR/meta/frameworks/FID/executors/EID/tasks/TID`.
pub fn meta_task_dir(
    work_dir: &Path,
    framework_id: &str,
    executor_id: &str,
    task_id: &str,
) -> Result<PathBuf, BadPathId> {
    check("task", task_id)?;
    Ok(meta_executor_dir(work_dir, framework_id, executor_id)?
        .join("tasks")
        .join(task_id))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sandbox_layout() {
        let p = sandbox_dir(Path::new("/w"), "f1", "e1", "r1").unwrap();
        assert_eq!(p, PathBuf::from("/w/frameworks/f1/executors/e1/runs/r1"));
        let t = meta_task_dir(Path::new("/w"), "f1", "e1", "t1").unwrap();
        assert_eq!(
            t,
            PathBuf::from("/w/meta/frameworks/f1/executors/e1/tasks/t1")
        );
    }

    #[test]
    fn escaping_ids_are_rejected() {
        for bad in ["..", ".", "a/b", "../x", "", "a\0b"] {
            let e = sandbox_dir(Path::new("/w"), "f", bad, "r").unwrap_err();
            assert_eq!(e.kind, "executor");
            assert!(sandbox_dir(Path::new("/w"), bad, "e", "r").is_err());
            assert!(meta_task_dir(Path::new("/w"), "f", "e", bad).is_err());
        }
        let long = "x".repeat(300);
        assert!(sandbox_dir(Path::new("/w"), &long, "e", "r").is_err());
    }
}
