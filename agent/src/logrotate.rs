//! Mesos's `logrotate` container logger: with `--container-logger
//! logrotate`, an executor's stdout and stderr (and a command task's,
//! through the command executor) are pipes into logger processes
//! (`agora-logrotate-logger`, Mesos's `mesos-logrotate-logger`), each of
//! which appends what it reads to the sandbox's `stdout` (or `stderr`),
//! rotating it to `stdout.1` (the previous `stdout.1` to `stdout.2`, ...)
//! when it would exceed `--logrotate-max-stdout-size`, and deleting what
//! would go past `stdout.N`, N being `--logrotate-max-files`. A task that
//! prints forever so holds at most `max size × (N + 1)` bytes of each
//! stream. The writing is the `file-rotate` crate's.
//!
//! A logger runs in a process group of its own (killing the executor's
//! group leaves it to read what is left) and ends when every writer of
//! its pipe has closed it, so it outlives an agent restart with the
//! executor it serves, as Mesos's does. The agent reaps the loggers it
//! starts on a thread of their own.

use std::io::{Read, Write};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, OnceLock, PoisonError};
use std::time::Duration;

/// Default `--logrotate-max-stdout-size` and `--logrotate-max-stderr-size`:
/// 10 MB, as Mesos's.
pub const DEFAULT_MAX_SIZE: u64 = 10 << 20;
/// Default `--logrotate-max-files`: rotated files kept of each stream.
pub const DEFAULT_MAX_FILES: usize = 9;
/// The smallest size honoured (Mesos's: one page).
pub const MIN_MAX_SIZE: u64 = 4096;

/// The settings of `--container-logger logrotate`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Logrotate {
    /// The logger program (`agora-logrotate-logger`).
    pub program: PathBuf,
    /// Size (bytes) at which `stdout` is rotated.
    pub max_stdout_size: u64,
    /// Size (bytes) at which `stderr` is rotated.
    pub max_stderr_size: u64,
    /// Rotated files kept of each stream.
    pub max_files: usize,
}

/// Started loggers, reaped by [`reaper`].
static LOGGERS: Mutex<Vec<Child>> = Mutex::new(Vec::new());
static REAPER: OnceLock<()> = OnceLock::new();

// === impl Logrotate ===

impl Logrotate {
    /// Mesos's defaults, with `agora-logrotate-logger` next to the
    /// running executable.
    pub fn with_defaults() -> Logrotate {
        Logrotate {
            program: default_program(),
            max_stdout_size: DEFAULT_MAX_SIZE,
            max_stderr_size: DEFAULT_MAX_SIZE,
            max_files: DEFAULT_MAX_FILES,
        }
    }

    /// The variables that hand these settings to a command executor
    /// (which pipes its tasks' output through the same logger).
    pub fn environment(&self) -> Vec<(String, String)> {
        use agora_proto::env;
        vec![
            (
                env::LOGROTATE_LOGGER.to_string(),
                self.program.display().to_string(),
            ),
            (
                env::LOGROTATE_MAX_STDOUT_SIZE.to_string(),
                self.max_stdout_size.to_string(),
            ),
            (
                env::LOGROTATE_MAX_STDERR_SIZE.to_string(),
                self.max_stderr_size.to_string(),
            ),
            (
                env::LOGROTATE_MAX_FILES.to_string(),
                self.max_files.to_string(),
            ),
        ]
    }

    /// Starts the loggers of `sandbox`'s `stdout` and `stderr`, as `user`
    /// when given (uid, gid): the write ends of their pipes, to become the
    /// executor's stdout and stderr.
    pub(crate) fn start(
        &self,
        sandbox: &Path,
        user: Option<(u32, u32)>,
    ) -> std::io::Result<(OwnedFd, OwnedFd)> {
        let out = self.start_one(&sandbox.join("stdout"), self.max_stdout_size, user)?;
        let err = self.start_one(&sandbox.join("stderr"), self.max_stderr_size, user)?;
        Ok((out, err))
    }

    fn start_one(
        &self,
        file: &Path,
        max_size: u64,
        user: Option<(u32, u32)>,
    ) -> std::io::Result<OwnedFd> {
        use std::os::unix::process::CommandExt;
        let (read, write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
        let mut command = Command::new(&self.program);
        command
            .arg("--log-filename")
            .arg(file)
            .arg("--max-size")
            .arg(max_size.to_string())
            .arg("--max-files")
            .arg(self.max_files.to_string())
            .stdin(Stdio::from(read))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0);
        if let Some((uid, gid)) = user {
            command.uid(uid).gid(gid);
        }
        let child = command.spawn().map_err(|e| {
            std::io::Error::new(
                e.kind(),
                format!(
                    "cannot start the container logger {}: {e}",
                    self.program.display()
                ),
            )
        })?;
        LOGGERS
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(child);
        REAPER.get_or_init(|| {
            let _ = std::thread::Builder::new()
                .name("logger-reaper".into())
                .spawn(reaper);
        });
        Ok(write)
    }
}

/// `agora-logrotate-logger` next to the running executable.
pub fn default_program() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|d| d.join("agora-logrotate-logger")))
        .unwrap_or_else(|| PathBuf::from("agora-logrotate-logger"))
}

/// Reaps ended loggers, forever.
fn reaper() {
    loop {
        std::thread::sleep(Duration::from_secs(1));
        LOGGERS
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .retain_mut(|child| !matches!(child.try_wait(), Ok(Some(_)) | Err(_)));
    }
}

/// The logger's work: appends everything `input` gives to `file`,
/// rotating it at `max_size` bytes and keeping `max_files` rotated files,
/// until end of input.
pub fn copy_rotating(
    input: &mut impl Read,
    file: &Path,
    max_size: u64,
    max_files: usize,
) -> std::io::Result<()> {
    use file_rotate::{compression::Compression, suffix::AppendCount, ContentLimit, FileRotate};
    let max_size = max_size.max(MIN_MAX_SIZE);
    // FileRotate drops what it cannot write to a file it could not open:
    // an unwritable file is an error here instead.
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(file)?;
    let mut out = FileRotate::new(
        file,
        AppendCount::new(max_files),
        ContentLimit::Bytes(usize::try_from(max_size).unwrap_or(usize::MAX)),
        Compression::None,
        None,
    );
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match input.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        out.write_all(&buf[..n])?;
    }
    out.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_past_the_cap_is_rotated_and_the_oldest_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("stdout");
        let line = b"0123456789abcdef".repeat(64); // 1 KiB
        let input: Vec<u8> = line.repeat(100); // 100 KiB
        copy_rotating(&mut &input[..], &file, 8192, 3).unwrap();
        let size = |p: &Path| std::fs::metadata(p).map(|m| m.len()).ok();
        assert!(size(&file).unwrap() <= 8192);
        for n in 1..=3 {
            assert_eq!(
                size(&dir.path().join(format!("stdout.{n}"))),
                Some(8192),
                "{n}"
            );
        }
        assert_eq!(size(&dir.path().join("stdout.4")), None);
        // What is kept is the end of the output.
        let last = std::fs::read(&file).unwrap();
        assert!(input.ends_with(&last));
    }
}
