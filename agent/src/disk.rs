//! The work directory's free space: an agent whose disk is full says so
//! instead of failing every task it is given.
//!
//! A watch checks the file system of the work directory (`statvfs`) every
//! [`Config::disk_check_interval`](crate::Config::disk_check_interval),
//! and at once whenever the agent saw a write fail for lack of space
//! ([`saw`]: `ENOSPC` or `EDQUOT`). Below
//! [`Config::disk_min_free`](crate::Config::disk_min_free) free bytes (or
//! with no free inode) the work directory is *full*: the core refuses
//! every launch (`TASK_FAILED`, `REASON_EXECUTOR_LAUNCH_FAILED`, which
//! Mesos's v1 API calls `REASON_CONTAINER_LAUNCH_FAILED`, with a message
//! naming the directory and what is free) and tells the master, which
//! offers none of the agent's resources until the agent says it has room
//! again ([`agora_proto::agent::Call::Availability`]). The tasks already
//! running go on.
//!
//! The agent keeps [`Config::disk_reserve`](crate::Config::disk_reserve)
//! bytes allocated in `WORK_DIR/meta/disk-reserve`. When the disk fills,
//! the reserve is released, so that the status update log and the
//! checkpoints of the tasks still running can be written (whatever the
//! tasks themselves leave of it: they share the file system). The work
//! directory counts as having room again only once the reserve can be
//! allocated anew with `disk_min_free` left beside it, so releasing the
//! reserve never makes a full disk look free.

use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::sync::{mpsc, Notify};
use tokio_util::sync::CancellationToken;

use crate::messages::{CoreEvent, Input};

/// The reserve's file name under `WORK_DIR/meta`.
pub(crate) const RESERVE_FILE: &str = "disk-reserve";
/// Default of [`Config::disk_check_interval`](crate::Config::disk_check_interval).
pub const DEFAULT_CHECK_INTERVAL: Duration = Duration::from_secs(5);
/// Default of [`Config::disk_min_free`](crate::Config::disk_min_free): 64 MiB.
pub const DEFAULT_MIN_FREE: u64 = 64 << 20;
/// Default of [`Config::disk_reserve`](crate::Config::disk_reserve): 8 MiB.
pub const DEFAULT_RESERVE: u64 = 8 << 20;

/// Wakes every watch for an immediate check (any agent of the process:
/// a check is cheap, and only a check decides).
static SEEN_FULL: Notify = Notify::const_new();

/// What `statvfs` says of a file system.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Space {
    /// Bytes an unprivileged process may still write.
    pub(crate) free_bytes: u64,
    /// Inodes an unprivileged process may still use (`None`: the file
    /// system has no fixed number).
    pub(crate) free_inodes: Option<u64>,
}

/// Watches the work directory's free space (see the module's doc).
pub(crate) struct Watch {
    work_dir: PathBuf,
    reserve: PathBuf,
    min_free: u64,
    reserve_bytes: u64,
    /// Why the work directory is full; `None` while it has room.
    full: Option<String>,
}

/// Called with a write's error: one for lack of space has every watch
/// check at once.
pub(crate) fn saw(error: &io::Error) {
    if matches!(error.raw_os_error(), Some(libc::ENOSPC | libc::EDQUOT)) {
        SEEN_FULL.notify_waiters();
    }
}

/// Parses a size: bytes, or a number with `B`, `KB`, `MB`, `GB` or `TB`
/// (powers of 1024, as Mesos's flags read them; `KiB`, `MiB`, ... too).
pub fn parse_bytes(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: f64 = number
        .parse()
        .map_err(|_| format!("invalid size {text:?}: expected e.g. 64MB"))?;
    let factor: u64 = match unit.trim().to_ascii_uppercase().as_str() {
        "" | "B" => 1,
        "K" | "KB" | "KIB" => 1 << 10,
        "M" | "MB" | "MIB" => 1 << 20,
        "G" | "GB" | "GIB" => 1 << 30,
        "T" | "TB" | "TIB" => 1 << 40,
        other => return Err(format!("invalid size unit {other:?} in {text:?}")),
    };
    let bytes = number * factor as f64;
    if !bytes.is_finite() || bytes < 0.0 || bytes > u64::MAX as f64 {
        return Err(format!("invalid size {text:?}"));
    }
    Ok(bytes as u64)
}

/// `statvfs` of `dir`.
pub(crate) fn space(dir: &Path) -> io::Result<Space> {
    let st = nix::sys::statvfs::statvfs(dir)?;
    let free_bytes =
        (st.blocks_available() as u128 * st.fragment_size() as u128).min(u64::MAX as u128) as u64;
    Ok(Space {
        free_bytes,
        free_inodes: (st.files() > 0).then_some(st.files_available() as u64),
    })
}

/// Whether a file system with `space` counts as full, for a work
/// directory that needs `min_free` bytes free, plus `reserve` bytes when
/// its reserve is to be allocated again: why, when it does.
pub(crate) fn verdict(space: &Space, min_free: u64, reserve: u64, dir: &Path) -> Option<String> {
    let needed = min_free.saturating_add(reserve);
    if space.free_bytes < needed {
        return Some(format!(
            "the agent's work directory {} is full: {} free, less than {} (--disk-min-free{})",
            dir.display(),
            mib(space.free_bytes),
            mib(needed),
            if reserve > 0 {
                " plus --disk-reserve"
            } else {
                ""
            },
        ));
    }
    if space.free_inodes == Some(0) {
        return Some(format!(
            "the agent's work directory {} is full: no free inode",
            dir.display()
        ));
    }
    None
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}

// === impl Watch ===

impl Watch {
    /// A watch of `config`'s work directory.
    pub(crate) fn new(config: &crate::Config) -> Watch {
        Watch {
            work_dir: config.work_dir.clone(),
            reserve: crate::paths::meta_root(&config.work_dir).join(RESERVE_FILE),
            min_free: config.disk_min_free,
            reserve_bytes: config.disk_reserve,
            full: None,
        }
    }

    /// Checks the work directory; the new verdict when it changed.
    /// Blocking (a `statvfs`, and allocating or removing the reserve).
    pub(crate) fn check(&mut self) -> Option<Option<String>> {
        let reserved = self.reserve_bytes == 0 || self.reserve_held();
        let missing = if reserved { 0 } else { self.reserve_bytes };
        let verdict = match space(&self.work_dir) {
            Ok(space) => verdict(&space, self.min_free, missing, &self.work_dir),
            Err(e) => {
                tracing::warn!(work_dir = %self.work_dir.display(), error = %e, "cannot tell the work directory's free space");
                return None;
            }
        };
        let verdict = match verdict {
            Some(full) => {
                if reserved && self.reserve_bytes > 0 {
                    // Room for the status update log and checkpoints.
                    match std::fs::remove_file(&self.reserve) {
                        Ok(()) => {
                            tracing::warn!(reserve = %self.reserve.display(), bytes = self.reserve_bytes, "work directory full: released the disk reserve for the agent's own records")
                        }
                        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                        Err(e) => {
                            tracing::warn!(reserve = %self.reserve.display(), error = %e, "cannot release the disk reserve")
                        }
                    }
                }
                Some(full)
            }
            None if reserved => None,
            None => match self.allocate_reserve() {
                Ok(()) => None,
                Err(e) => {
                    let _ = std::fs::remove_file(&self.reserve);
                    Some(format!(
                        "the agent's work directory {} is full: cannot allocate the disk reserve: {e}",
                        self.work_dir.display()
                    ))
                }
            },
        };
        // Only a change between full and not (the text of a full
        // verdict changes with every byte).
        if verdict.is_some() == self.full.is_some() {
            self.full = verdict;
            return None;
        }
        match &verdict {
            Some(why) => {
                tracing::error!(reason = %why, "work directory full: the agent takes no new task until space is freed")
            }
            None => {
                tracing::info!(work_dir = %self.work_dir.display(), "the work directory has room again: the agent takes tasks again")
            }
        }
        self.full = verdict.clone();
        Some(verdict)
    }

    /// Whether the reserve file holds its bytes.
    fn reserve_held(&self) -> bool {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(&self.reserve)
            .is_ok_and(|m| m.blocks().saturating_mul(512) >= self.reserve_bytes)
    }

    /// Allocates the reserve (`fallocate`, so its blocks are the file
    /// system's, not a sparse promise).
    fn allocate_reserve(&self) -> io::Result<()> {
        use std::os::unix::fs::OpenOptionsExt;
        if let Some(dir) = self.reserve.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(&self.reserve)?;
        let len = i64::try_from(self.reserve_bytes).unwrap_or(i64::MAX);
        match nix::fcntl::fallocate(&file, nix::fcntl::FallocateFlags::empty(), 0, len) {
            Ok(()) => Ok(()),
            Err(nix::errno::Errno::EOPNOTSUPP) => {
                // A file system without fallocate: written out instead.
                use std::io::Write;
                let mut file = file;
                let zeros = vec![0u8; 64 << 10];
                let mut left = self.reserve_bytes;
                while left > 0 {
                    let n = left.min(zeros.len() as u64) as usize;
                    file.write_all(&zeros[..n])?;
                    left -= n as u64;
                }
                file.sync_all()
            }
            Err(e) => Err(e.into()),
        }
    }
}

/// Runs `watch` until `cancel`: a check now, then every `interval` and
/// whenever a write failed for lack of space, each change of verdict
/// sent to the core.
pub(crate) async fn run(
    mut watch: Watch,
    interval: Duration,
    core: mpsc::Sender<CoreEvent>,
    cancel: CancellationToken,
) {
    loop {
        let checked = tokio::task::spawn_blocking(move || {
            let change = watch.check();
            (watch, change)
        })
        .await;
        let Ok((returned, change)) = checked else {
            return;
        };
        watch = returned;
        if let Some(full) = change {
            if core
                .send(CoreEvent::Input(Input::DiskFull { full }))
                .await
                .is_err()
            {
                return;
            }
        }
        tokio::select! {
            () = cancel.cancelled() => return,
            () = tokio::time::sleep(interval) => {}
            () = SEEN_FULL.notified() => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_as_mesos_flags_do() {
        assert_eq!(parse_bytes("4096"), Ok(4096));
        assert_eq!(parse_bytes("64MB"), Ok(64 << 20));
        assert_eq!(parse_bytes("1.5 GB"), Ok(3 << 29));
        assert_eq!(parse_bytes("8MiB"), Ok(8 << 20));
        assert_eq!(parse_bytes("2kb"), Ok(2048));
        assert!(parse_bytes("lots").is_err());
        assert!(parse_bytes("5 parsecs").is_err());
        assert!(parse_bytes("-1MB").is_err());
    }

    #[test]
    fn full_below_the_minimum_plus_a_missing_reserve() {
        let dir = Path::new("/work");
        let space = |free_bytes, free_inodes| Space {
            free_bytes,
            free_inodes,
        };
        assert_eq!(verdict(&space(10 << 20, Some(5)), 4 << 20, 0, dir), None);
        let full = verdict(&space(3 << 20, None), 4 << 20, 0, dir).unwrap();
        assert!(
            full.contains("/work is full") && full.contains("3.0 MiB free"),
            "{full}"
        );
        // The released reserve does not count as room: 10 MiB free is
        // not enough while an 8 MiB reserve is missing beside 4 MiB.
        assert!(verdict(&space(10 << 20, None), 4 << 20, 8 << 20, dir).is_some());
        assert_eq!(verdict(&space(12 << 20, None), 4 << 20, 8 << 20, dir), None);
        let inodes = verdict(&space(1 << 30, Some(0)), 4 << 20, 0, dir).unwrap();
        assert!(inodes.contains("no free inode"), "{inodes}");
    }

    #[test]
    fn the_reserve_is_held_released_when_full_and_taken_again() {
        let dir = tempfile::tempdir().unwrap();
        let free = space(dir.path()).unwrap().free_bytes;
        let mut config = crate::Config::new("127.0.0.1:5050", dir.path().to_path_buf());
        config.disk_reserve = 1 << 20;
        config.disk_min_free = 1 << 20;
        let mut watch = Watch::new(&config);
        // Room: the reserve is allocated, and nothing changed.
        assert_eq!(watch.check(), None);
        assert!(watch.reserve_held());
        // A minimum above what is free: full, and the reserve released.
        watch.min_free = free.saturating_mul(2);
        let full = watch.check().expect("a change").expect("full");
        assert!(full.contains("is full"), "{full}");
        assert!(!watch.reserve.exists());
        assert_eq!(watch.check(), None, "still full: no change");
        // Room again: the reserve comes back first.
        watch.min_free = 1 << 20;
        assert_eq!(watch.check(), Some(None));
        assert!(watch.reserve_held());
    }
}
