//! Sandbox garbage collection, as Mesos's agent does it: the sandbox of
//! an executor's run is removed `--gc-delay` (default one week) after the
//! run ended, and sooner as the work directory's disk fills: every
//! sweep, a run that ended more than
//!
//! ```text
//! max age = gc_delay * max(0, 1 - gc_disk_headroom - disk usage)
//! ```
//!
//! ago is removed (Mesos's formula, with its `--gc_disk_headroom`,
//! default 0.1), so on a disk used beyond `1 - headroom` every ended run
//! goes at the next sweep. An executor's directory goes with its last
//! run, and a framework's with its last executor once the agent no longer
//! knows the framework.
//!
//! A sweep runs every `--disk-check-interval` (Mesos's
//! `--disk_watch_interval`). A run is *live* while the agent's `/state`
//! shows it (a running executor's sandbox, a command task that has not
//! ended, a command executor's own); any other run under
//! `WORK_DIR/frameworks` has ended. When a run is first seen ended, the
//! time is checkpointed in `WORK_DIR/meta/gc.json`, so a restarted agent
//! still removes it on time. A run is removed only at a sweep after the
//! one that first saw it ended (a run that starts between the `/state`
//! view a sweep reads and its listing is seen live at the next one), and
//! sweeps wait until the agent has recovered and registered.

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::messages::Snapshot;

/// Default `--gc-delay`: one week, as Mesos's.
pub const DEFAULT_GC_DELAY: Duration = Duration::from_secs(7 * 24 * 3600);
/// Default `--gc-disk-headroom`, as Mesos's.
pub const DEFAULT_GC_DISK_HEADROOM: f64 = 0.1;
/// The checkpoint's name under `WORK_DIR/meta`.
const CHECKPOINT: &str = "gc.json";
/// The shortest time between sweeps.
const MIN_INTERVAL: Duration = Duration::from_secs(1);

/// Mesos's maximum age of an ended run's sandbox for a disk `usage`
/// (0..=1).
pub fn max_age(gc_delay: Duration, headroom: f64, usage: f64) -> Duration {
    let factor = (1.0 - headroom - usage).clamp(0.0, 1.0);
    gc_delay.mul_f64(factor)
}

/// The collector: which ended runs it knows of, since when.
pub(crate) struct Collector {
    work_dir: PathBuf,
    gc_delay: Duration,
    headroom: f64,
    /// Ended runs' sandboxes, with the Unix time (seconds) they were
    /// first seen ended.
    ended: BTreeMap<PathBuf, f64>,
}

/// What one sweep did.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Swept {
    /// Directories removed.
    pub(crate) removed: Vec<PathBuf>,
    /// Ended runs kept for now.
    pub(crate) waiting: usize,
}

// === impl Collector ===

impl Collector {
    pub(crate) fn new(work_dir: &Path, gc_delay: Duration, headroom: f64) -> Collector {
        let ended = std::fs::read(checkpoint_path(work_dir))
            .ok()
            .and_then(|bytes| serde_json::from_slice(&bytes).ok())
            .unwrap_or_default();
        Collector {
            work_dir: work_dir.to_path_buf(),
            gc_delay,
            headroom,
            ended,
        }
    }

    /// One sweep at Unix time `now`, with the disk `usage` (0..=1), the
    /// `live` sandboxes and the frameworks the agent knows (whose
    /// directories stay).
    pub(crate) fn sweep(
        &mut self,
        now: f64,
        usage: f64,
        live: &HashSet<PathBuf>,
        known: &HashSet<String>,
    ) -> Swept {
        let max_age = max_age(self.gc_delay, self.headroom, usage).as_secs_f64();
        let before = self.ended.clone();
        let mut swept = Swept::default();
        let mut present = HashSet::new();
        let frameworks = self.work_dir.join("frameworks");
        for framework in subdirs(&frameworks) {
            let executors = framework.join("executors");
            let mut framework_emptied = false;
            for executor in subdirs(&executors) {
                let runs = executor.join("runs");
                let mut removed_here = false;
                for run in subdirs(&runs) {
                    if live.contains(&run) {
                        self.ended.remove(&run);
                        continue;
                    }
                    present.insert(run.clone());
                    let Some(&since) = self.ended.get(&run) else {
                        self.ended.insert(run, now);
                        swept.waiting += 1;
                        continue;
                    };
                    if now - since < max_age {
                        swept.waiting += 1;
                        continue;
                    }
                    match std::fs::remove_dir_all(&run) {
                        Ok(()) => {
                            tracing::info!(sandbox = %run.display(), ended_secs_ago = now - since, max_age_secs = max_age, disk_usage = usage, "sandbox garbage collected");
                            self.ended.remove(&run);
                            swept.removed.push(run);
                            removed_here = true;
                        }
                        Err(error) => {
                            tracing::warn!(sandbox = %run.display(), %error, "cannot remove an ended sandbox");
                        }
                    }
                }
                // The executor's directory goes with its last run (only
                // when this sweep removed one: an empty one may be a
                // launch's, about to get its run).
                if removed_here
                    && std::fs::remove_dir(&runs).is_ok()
                    && std::fs::remove_dir(&executor).is_ok()
                {
                    swept.removed.push(executor);
                    framework_emptied = true;
                }
            }
            let is_known = framework
                .file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| known.contains(n));
            if framework_emptied
                && !is_known
                && std::fs::remove_dir(&executors).is_ok()
                && std::fs::remove_dir(&framework).is_ok()
            {
                swept.removed.push(framework);
            }
        }
        // Runs removed by someone else are forgotten.
        self.ended.retain(|run, _| present.contains(run));
        if self.ended != before {
            self.save();
        }
        swept
    }

    fn save(&self) {
        let path = checkpoint_path(&self.work_dir);
        let tmp = path.with_extension("json.tmp");
        let written = serde_json::to_vec(&self.ended)
            .map_err(std::io::Error::other)
            .and_then(|bytes| std::fs::write(&tmp, bytes))
            .and_then(|()| std::fs::rename(&tmp, &path));
        if let Err(error) = written {
            crate::disk::saw(&error);
            tracing::warn!(path = %path.display(), %error, "cannot checkpoint the sandbox collector");
        }
    }
}

fn checkpoint_path(work_dir: &Path) -> PathBuf {
    crate::paths::meta_root(work_dir).join(CHECKPOINT)
}

/// The directories (not symlinks) in `dir`, whose names are valid ids.
fn subdirs(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .filter(|e| {
            e.file_name()
                .to_str()
                .is_some_and(|n| agora_proto::validate_executor_id(n).is_ok())
        })
        .map(|e| e.path())
        .collect()
}

/// The frameworks the agent's `/state` view shows.
pub(crate) fn known_frameworks(state: &serde_json::Value) -> HashSet<String> {
    state["frameworks"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|f| f["id"].as_str().map(str::to_string))
        .collect()
}

/// The sandboxes the agent's `/state` view shows in use.
pub(crate) fn live_sandboxes(state: &serde_json::Value) -> HashSet<PathBuf> {
    let mut live = HashSet::new();
    for framework in state["frameworks"].as_array().into_iter().flatten() {
        for executor in framework["executors"].as_array().into_iter().flatten() {
            let Some(sandbox) = executor["sandbox"].as_str() else {
                continue;
            };
            let command_task = executor.get("process").is_some();
            let in_use = if command_task {
                executor["tasks"].as_array().into_iter().flatten().any(|t| {
                    serde_json::from_value::<agora_proto::TaskState>(t["state"].clone())
                        .map_or(true, |s| !s.is_terminal())
                })
            } else {
                executor["running"].as_bool().unwrap_or(false)
            };
            if in_use {
                live.insert(PathBuf::from(sandbox));
            }
        }
        for host in framework["command_executors"]
            .as_array()
            .into_iter()
            .flatten()
        {
            if let Some(sandbox) = host["sandbox"].as_str() {
                live.insert(PathBuf::from(sandbox));
            }
        }
    }
    live
}

/// The share of the work directory's file system in use (0..=1), as
/// Mesos computes it (`1 - free blocks / blocks`).
fn disk_usage(work_dir: &Path) -> f64 {
    match nix::sys::statvfs::statvfs(work_dir) {
        Ok(s) if s.blocks() > 0 => 1.0 - s.blocks_free() as f64 / s.blocks() as f64,
        _ => 0.0,
    }
}

/// Sweeps every `interval` until `cancel`, once the agent's view says
/// it is registered.
pub(crate) async fn run(
    mut collector: Collector,
    interval: Duration,
    snapshots: watch::Receiver<Snapshot>,
    cancel: CancellationToken,
) {
    let interval = interval.max(MIN_INTERVAL);
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(interval) => {}
        }
        let state = snapshots.borrow().clone();
        if !state["registered"].as_bool().unwrap_or(false) {
            continue;
        }
        let live = live_sandboxes(&state);
        let known = known_frameworks(&state);
        let work_dir = collector.work_dir.clone();
        let now = agora_proto::now_timestamp();
        let done = tokio::task::spawn_blocking(move || {
            let usage = disk_usage(&work_dir);
            let swept = collector.sweep(now, usage, &live, &known);
            (collector, swept)
        })
        .await;
        match done {
            Ok((back, swept)) => {
                collector = back;
                if !swept.removed.is_empty() {
                    tracing::debug!(
                        removed = swept.removed.len(),
                        waiting = swept.waiting,
                        "sandbox sweep"
                    );
                }
            }
            Err(_) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn max_age_shrinks_as_the_disk_fills() {
        let week = DEFAULT_GC_DELAY;
        assert_eq!(max_age(week, 0.1, 0.0), week.mul_f64(0.9));
        assert_eq!(max_age(week, 0.1, 0.5), week.mul_f64(0.4));
        assert_eq!(max_age(week, 0.1, 0.9), Duration::ZERO);
        assert_eq!(max_age(week, 0.1, 0.97), Duration::ZERO);
        assert_eq!(max_age(week, 0.0, 0.0), week);
    }

    fn run_dir(work: &Path, fid: &str, eid: &str, run: &str) -> PathBuf {
        let dir = crate::paths::sandbox_dir(work, fid, eid, run).unwrap();
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("stdout"), "out").unwrap();
        dir
    }

    #[test]
    fn ended_runs_go_after_the_delay_and_live_ones_stay() {
        let work = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(crate::paths::meta_root(work.path())).unwrap();
        let ended = run_dir(work.path(), "f1", "e1", "r1");
        let live_run = run_dir(work.path(), "f1", "e2", "r1");
        let live: HashSet<PathBuf> = [live_run.clone()].into();
        let known = HashSet::new();
        let mut gc = Collector::new(work.path(), Duration::from_secs(100), 0.1);
        // First seen ended: kept.
        let swept = gc.sweep(1000.0, 0.0, &live, &known);
        assert_eq!(
            swept,
            Swept {
                removed: vec![],
                waiting: 1
            }
        );
        // Before 90 s (100 s * 0.9): kept; the checkpoint survives a restart.
        let mut gc = Collector::new(work.path(), Duration::from_secs(100), 0.1);
        assert!(gc.sweep(1080.0, 0.0, &live, &known).removed.is_empty());
        let swept = gc.sweep(1091.0, 0.0, &live, &known);
        assert!(swept.removed.contains(&ended), "{swept:?}");
        assert!(!ended.exists());
        assert!(
            !ended.parent().unwrap().parent().unwrap().exists(),
            "executor dir"
        );
        assert!(live_run.exists());
        // The framework keeps its directory while an executor is there.
        assert!(work.path().join("frameworks/f1").exists());
    }

    #[test]
    fn a_full_disk_takes_ended_runs_at_the_next_sweep() {
        let work = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(crate::paths::meta_root(work.path())).unwrap();
        let ended = run_dir(work.path(), "f1", "e1", "r1");
        let _other = run_dir(work.path(), "f2", "e1", "r1");
        let (none, known) = (HashSet::new(), HashSet::from(["f2".to_string()]));
        let mut gc = Collector::new(work.path(), DEFAULT_GC_DELAY, 0.1);
        assert!(gc.sweep(1000.0, 0.95, &none, &known).removed.is_empty());
        let swept = gc.sweep(1001.0, 0.95, &none, &known);
        assert!(swept.removed.contains(&ended), "{swept:?}");
        // A framework the agent no longer knows goes with its last run;
        // one it knows keeps its directory.
        assert!(!work.path().join("frameworks/f1").exists());
        assert!(work.path().join("frameworks/f2").exists());
    }
}
