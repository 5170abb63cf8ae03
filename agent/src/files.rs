//! Reading executors' sandbox files over HTTP (`GET /files/FID/EID/PATH`),
//! confined to the sandbox.
//!
//! A request names a framework, an executor, optionally a run (default:
//! the executor's most recent run) and a path inside that run's sandbox.
//! Confinement is layered:
//!
//! 1. the ids must pass [`agora_proto::validate_id`] and the path may only
//!    have plain components: no `..`, `.`, empty components, absolute paths
//!    or NUL bytes (refused with [`FileError::Forbidden`], HTTP 403);
//! 2. the sandbox is canonicalized and the path resolved under it one
//!    component at a time, each symlink followed by hand: a step that
//!    would look at anything outside the sandbox (other than the
//!    sandbox's own ancestors, on the way back into it) is refused
//!    before the file system is asked about it, so a symlink an executor
//!    plants answers `403` whether what it points to outside exists or
//!    not (the answer never tells one from the other);
//! 3. the file is opened without following a final symlink and without
//!    blocking (a FIFO cannot hang the reader), must be a regular file
//!    with no other hard link (a link to a file outside the sandbox
//!    would be that file: refused, 403), and on Linux its open
//!    descriptor's real path is checked again, so a component swapped
//!    for a symlink between check and open is refused.
//!
//! Missing sandboxes, and missing files inside them, are
//! [`FileError::NotFound`] (404).
//!
//! Mesos's files API (`/files/read`, `/files/browse`, `/files/download`,
//! `/files/debug`) names a file by one `path`: the sandbox's absolute
//! path as `/state` gives it (`executors[].directory`), or the virtual
//! `/frameworks/FID/executors/EID/runs/latest` (or `runs/RUN`), either
//! followed by a path inside the sandbox. [`MesosPath::parse`] takes such
//! a path apart without looking at the file system (a path of any other
//! form is `NotFound`, whether or not something exists there), and the
//! rest goes through [`open`] and its checks above.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Component, Path, PathBuf};

use serde::Serialize;

/// Bytes returned when the request gives no `length`.
pub const DEFAULT_READ_LENGTH: usize = 64 * 1024;
/// Largest `length` honoured.
pub const MAX_READ_LENGTH: usize = 1024 * 1024;
/// Entries listed per directory at most.
const MAX_LISTING: usize = 10_000;

/// Why a file cannot be served.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    /// The request tries to leave the sandbox or names something that is
    /// not a readable regular file or directory (HTTP 403).
    #[error("forbidden: {0}")]
    Forbidden(String),
    /// No such sandbox, run or file (HTTP 404).
    #[error("not found: {0}")]
    NotFound(String),
    /// Reading failed (HTTP 500).
    #[error("cannot read: {0}")]
    Io(#[from] std::io::Error),
}

/// A window of a file, as `GET /files/…` answers it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FileChunk {
    /// The path inside the sandbox, as requested.
    pub path: String,
    /// The run whose sandbox was read.
    pub run_id: String,
    /// Where `data` starts, in bytes.
    pub offset: u64,
    /// How many bytes of the file `data` holds: ask next from
    /// `offset + length`. It may be less than asked, so that `data` never
    /// ends inside a UTF-8 character.
    pub length: u64,
    /// The file's size when it was read.
    pub size: u64,
    /// Whether `offset + length` reached `size`.
    pub eof: bool,
    /// The bytes, as UTF-8 (invalid sequences replaced by U+FFFD).
    pub data: String,
}

/// One entry of a sandbox directory listing.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DirEntry {
    /// File name.
    pub name: String,
    /// Whether it is a directory.
    pub dir: bool,
    /// Size in bytes (0 for directories).
    pub size: u64,
    /// Modification time, Unix seconds.
    pub mtime: f64,
}

/// A directory of a sandbox.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Listing {
    /// The path inside the sandbox ("" for its root).
    pub path: String,
    /// The run whose sandbox was listed.
    pub run_id: String,
    /// Entries by name.
    pub entries: Vec<DirEntry>,
}

/// A Mesos files-API `path`, taken apart: which sandbox, and where in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MesosPath {
    /// The framework whose sandbox it is.
    pub framework_id: String,
    /// The executor (a command task's own id).
    pub executor_id: String,
    /// The run (`None`: `latest`).
    pub run: Option<String>,
    /// The path inside the sandbox ("" for the sandbox itself).
    pub relative: String,
}

/// One entry of `/files/browse`, with Mesos's fields.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FileInfo {
    /// The path asked for, joined with the entry's name.
    pub path: String,
    /// Hard links.
    pub nlink: u64,
    /// Size in bytes.
    pub size: u64,
    /// Modification time, Unix seconds.
    pub mtime: i64,
    /// Type and permissions as `ls -l` shows them (`-rw-r--r--`).
    pub mode: String,
    /// Owner's user name (the number when it has none).
    pub uid: String,
    /// Group name (the number when it has none).
    pub gid: String,
}

/// What a path names.
#[derive(Debug)]
pub enum Target {
    /// A regular file, opened, with the run it belongs to.
    File {
        /// The open file.
        file: File,
        /// Its run.
        run_id: String,
    },
    /// A directory.
    Dir(Listing),
}

/// Finds `path` in the sandbox of the executor's run `run` (latest when
/// `None`) under `work_dir`, refusing anything outside the sandbox.
pub fn open(
    work_dir: &Path,
    framework_id: &str,
    executor_id: &str,
    run: Option<&str>,
    path: &str,
) -> Result<Target, FileError> {
    let relative = relative_path(path)?;
    let runs = crate::paths::sandbox_dir(work_dir, framework_id, executor_id, "latest")
        .map_err(|e| FileError::Forbidden(e.to_string()))?
        .parent()
        .map(Path::to_path_buf)
        .ok_or_else(|| FileError::NotFound("sandbox".into()))?;
    let run_id = match run {
        Some(r) => {
            agora_proto::validate_id(r)
                .map_err(|e| FileError::Forbidden(format!("invalid run id: {e}")))?;
            r.to_string()
        }
        None => latest_run(&runs)?,
    };
    let root = canonical(&runs.join(&run_id), "sandbox")?;
    let target = resolve(&root, &relative, path)?;
    let meta = std::fs::metadata(&target)?;
    if meta.is_dir() {
        return Ok(Target::Dir(list(&target, path, run_id)?));
    }
    if !meta.is_file() {
        return Err(FileError::Forbidden(format!(
            "{path} is not a regular file"
        )));
    }
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags((nix::fcntl::OFlag::O_NOFOLLOW | nix::fcntl::OFlag::O_NONBLOCK).bits())
        .open(&target)
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => FileError::NotFound(path.to_string()),
            _ => FileError::Forbidden(format!("{path} cannot be opened: {e}")),
        })?;
    let opened = file.metadata()?;
    if !opened.is_file() {
        return Err(FileError::Forbidden(format!(
            "{path} is not a regular file"
        )));
    }
    if std::os::unix::fs::MetadataExt::nlink(&opened) > 1 {
        // Another name of the file may be outside the sandbox (a task can
        // link what its user may read): which one came first cannot be
        // told, so none is served.
        return Err(FileError::Forbidden(format!(
            "{path} has other hard links; only files with one link are served"
        )));
    }
    if let Some(real) = opened_path(&file) {
        if !real.starts_with(&root) {
            return Err(FileError::Forbidden(format!(
                "{path} leads outside the sandbox"
            )));
        }
    }
    Ok(Target::File { file, run_id })
}

// === impl MesosPath ===

impl MesosPath {
    /// Takes apart `path`: `/frameworks/FID/executors/EID/runs/RUN[/REL]`
    /// (the virtual form, `RUN` being `latest` or a run id), or the same
    /// under `work_dir` (the real sandbox path). Looks at no file.
    pub fn parse(work_dir: &Path, path: &str) -> Result<MesosPath, FileError> {
        let not_found = || FileError::NotFound(format!("{path}: no such sandbox file"));
        let rest = match path.strip_prefix("/frameworks/") {
            Some(rest) => rest,
            None => {
                let prefix = format!(
                    "{}/frameworks/",
                    work_dir.to_string_lossy().trim_end_matches('/')
                );
                let canonical = std::fs::canonicalize(work_dir)
                    .ok()
                    .map(|c| format!("{}/frameworks/", c.to_string_lossy().trim_end_matches('/')));
                path.strip_prefix(&prefix)
                    .or_else(|| canonical.as_deref().and_then(|c| path.strip_prefix(c)))
                    .ok_or_else(not_found)?
            }
        };
        let mut parts = rest.splitn(6, '/');
        let (Some(fid), Some("executors"), Some(eid), Some("runs"), Some(run)) = (
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
        ) else {
            return Err(not_found());
        };
        let relative = parts.next().unwrap_or("").to_string();
        let forbidden = |what: &str, e: &dyn std::fmt::Display| {
            FileError::Forbidden(format!("{path}: invalid {what} id: {e}"))
        };
        agora_proto::validate_id(fid).map_err(|e| forbidden("framework", &e))?;
        agora_proto::validate_executor_id(eid).map_err(|e| forbidden("executor", &e))?;
        let run = match run {
            "latest" => None,
            run => {
                agora_proto::validate_id(run).map_err(|e| forbidden("run", &e))?;
                Some(run.to_string())
            }
        };
        // Checked here too, so a refused path is refused before its
        // framework's ACL is asked about.
        relative_path(&relative)?;
        Ok(MesosPath {
            framework_id: fid.to_string(),
            executor_id: eid.to_string(),
            run,
            relative,
        })
    }

    /// [`open`]s what the path names.
    pub fn open(&self, work_dir: &Path) -> Result<Target, FileError> {
        open(
            work_dir,
            &self.framework_id,
            &self.executor_id,
            self.run.as_deref(),
            &self.relative,
        )
    }

    /// `/files/browse`: the entries of the directory the path names (of
    /// the file alone when it names a file), each named by `path` joined
    /// with its name, sorted by path. Entries are described as they are
    /// (a symlink as a symlink: what it points to is not looked at).
    pub fn browse(&self, work_dir: &Path, path: &str) -> Result<Vec<FileInfo>, FileError> {
        let base = path.trim_end_matches('/');
        match self.open(work_dir)? {
            Target::File { file, .. } => {
                let meta = file.metadata()?;
                Ok(vec![file_info(base.to_string(), &meta)])
            }
            Target::Dir(_) => {
                let run = match &self.run {
                    Some(run) => run.clone(),
                    None => latest_run(
                        crate::paths::sandbox_dir(
                            work_dir,
                            &self.framework_id,
                            &self.executor_id,
                            "latest",
                        )
                        .map_err(|e| FileError::Forbidden(e.to_string()))?
                        .parent()
                        .ok_or_else(|| FileError::NotFound("sandbox".into()))?,
                    )?,
                };
                let root = canonical(
                    &crate::paths::sandbox_dir(
                        work_dir,
                        &self.framework_id,
                        &self.executor_id,
                        &run,
                    )
                    .map_err(|e| FileError::Forbidden(e.to_string()))?,
                    "sandbox",
                )?;
                let dir = resolve(&root, &relative_path(&self.relative)?, &self.relative)?;
                let mut entries: Vec<FileInfo> = std::fs::read_dir(&dir)?
                    .filter_map(Result::ok)
                    .take(MAX_LISTING)
                    .filter_map(|e| {
                        let meta = e.path().symlink_metadata().ok()?;
                        let name = e.file_name().to_string_lossy().into_owned();
                        Some(file_info(format!("{base}/{name}"), &meta))
                    })
                    .collect();
                entries.sort_by(|a, b| a.path.cmp(&b.path));
                Ok(entries)
            }
        }
    }
}

fn file_info(path: String, meta: &std::fs::Metadata) -> FileInfo {
    use std::os::unix::fs::MetadataExt;
    let uid = meta.uid();
    let gid = meta.gid();
    FileInfo {
        path,
        nlink: meta.nlink(),
        size: meta.size(),
        mtime: meta.mtime(),
        mode: mode_string(meta.mode()),
        uid: nix::unistd::User::from_uid(uid.into())
            .ok()
            .flatten()
            .map_or_else(|| uid.to_string(), |u| u.name),
        gid: nix::unistd::Group::from_gid(gid.into())
            .ok()
            .flatten()
            .map_or_else(|| gid.to_string(), |g| g.name),
    }
}

/// `st_mode` as `ls -l` writes it (`drwxr-x---`, `-rwsr-xr-x`, ...), as
/// Mesos's browse answers it.
pub fn mode_string(mode: u32) -> String {
    let kind = match mode & libc::S_IFMT {
        libc::S_IFDIR => 'd',
        libc::S_IFLNK => 'l',
        libc::S_IFCHR => 'c',
        libc::S_IFBLK => 'b',
        libc::S_IFIFO => 'p',
        libc::S_IFSOCK => 's',
        _ => '-',
    };
    let mut out = String::with_capacity(10);
    out.push(kind);
    let special = [
        (libc::S_ISUID, 's', 'S'),
        (libc::S_ISGID, 's', 'S'),
        (libc::S_ISVTX, 't', 'T'),
    ];
    for (i, (bit, on, off)) in special.into_iter().enumerate() {
        let shift = 6 - 3 * i as u32;
        let bits = (mode >> shift) & 0o7;
        out.push(if bits & 4 != 0 { 'r' } else { '-' });
        out.push(if bits & 2 != 0 { 'w' } else { '-' });
        let exec = bits & 1 != 0;
        out.push(match (mode & bit != 0, exec) {
            (true, true) => on,
            (true, false) => off,
            (false, true) => 'x',
            (false, false) => '-',
        });
    }
    out
}

/// Mesos's `/files/read` answer: `{"data", "offset"}`. `offset` -1 asks
/// for the size alone (`data` empty, `offset` the size); an offset at or
/// past the end answers the size with no data; `length` is capped at
/// [`DEFAULT_READ_LENGTH`] (Mesos's 16 pages) and read to the end of the
/// file when absent.
pub fn read_mesos(
    file: &mut File,
    offset: i64,
    length: Option<usize>,
) -> Result<serde_json::Value, FileError> {
    let size = file.metadata()?.len();
    if offset < 0 || offset as u64 >= size {
        return Ok(serde_json::json!({ "data": "", "offset": size }));
    }
    let length = length
        .unwrap_or(DEFAULT_READ_LENGTH)
        .min(DEFAULT_READ_LENGTH);
    let chunk = read_chunk(file, "", String::new(), offset as u64, length)?;
    Ok(serde_json::json!({ "data": chunk.data, "offset": offset }))
}

/// Reads up to `length` bytes (capped at [`MAX_READ_LENGTH`]) at `offset`.
pub fn read_chunk(
    file: &mut File,
    path: &str,
    run_id: String,
    offset: u64,
    length: usize,
) -> Result<FileChunk, FileError> {
    let size = file.metadata()?.len();
    let length = length.min(MAX_READ_LENGTH);
    let mut buf = Vec::new();
    if offset < size && length > 0 {
        file.seek(SeekFrom::Start(offset))?;
        file.take(length as u64).read_to_end(&mut buf)?;
    }
    let mut read = buf.len();
    // Do not split a character at the end of a window that is not the
    // file's end: the next window starts with it instead.
    if let Err(e) = std::str::from_utf8(&buf) {
        if e.error_len().is_none() && offset + (read as u64) < size {
            read = e.valid_up_to();
        }
    }
    let data = String::from_utf8_lossy(&buf[..read]).into_owned();
    let length = read as u64;
    Ok(FileChunk {
        path: path.to_string(),
        run_id,
        offset,
        length,
        size,
        eof: offset.saturating_add(length) >= size,
        data,
    })
}

/// The path's components, each checked; "" is the sandbox itself.
fn relative_path(path: &str) -> Result<PathBuf, FileError> {
    let forbidden = |why: &str| FileError::Forbidden(format!("path {path:?}: {why}"));
    if path.contains('\0') {
        return Err(forbidden("contains a NUL byte"));
    }
    if path.starts_with('/') {
        return Err(forbidden("absolute paths are not allowed"));
    }
    let trimmed = path.strip_suffix('/').unwrap_or(path);
    let mut out = PathBuf::new();
    if trimmed.is_empty() {
        return Ok(out);
    }
    for part in trimmed.split('/') {
        if part.is_empty() || part == "." || part == ".." {
            return Err(forbidden(
                "only plain components are allowed (no .., . or //)",
            ));
        }
        match Path::new(part).components().next() {
            Some(Component::Normal(_)) => out.push(part),
            _ => return Err(forbidden("only plain components are allowed")),
        }
    }
    Ok(out)
}

/// Most symlinks followed in resolving one path (the kernel's own limit).
const MAX_SYMLINKS: usize = 40;

/// Resolves `relative` under the canonical sandbox `root`, following
/// symlinks by hand: the real path of what it names, inside `root`.
/// `Forbidden` as soon as a step would leave the sandbox for anything but
/// one of its ancestors (whose existence says nothing), before the file
/// system is asked whether it exists; `NotFound` for a missing component
/// inside the sandbox.
fn resolve(root: &Path, relative: &Path, path: &str) -> Result<PathBuf, FileError> {
    let outside = || FileError::Forbidden(format!("{path} leads outside the sandbox"));
    let mut pending: Vec<std::ffi::OsString> = relative
        .components()
        .rev()
        .map(|c| c.as_os_str().to_os_string())
        .collect();
    let mut current = root.to_path_buf();
    let mut links = 0;
    while let Some(part) = pending.pop() {
        match Path::new(&part).components().next() {
            None | Some(Component::CurDir) => continue,
            Some(Component::RootDir) => {
                current = PathBuf::from("/");
                continue;
            }
            Some(Component::ParentDir) => {
                // `current` has no symlink in it: its parent is lexical.
                current.pop();
                continue;
            }
            Some(Component::Prefix(_) | Component::Normal(_)) => {}
        }
        let next = current.join(&part);
        // An ancestor of the sandbox is a real directory that exists
        // (the sandbox does): only a step inside is looked at.
        if root.starts_with(&next) {
            current = next;
            continue;
        }
        if !next.starts_with(root) {
            return Err(outside());
        }
        let meta = std::fs::symlink_metadata(&next).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => FileError::NotFound(path.to_string()),
            _ => FileError::Forbidden(format!("{path}: {e}")),
        })?;
        if meta.file_type().is_symlink() {
            links += 1;
            if links > MAX_SYMLINKS {
                return Err(FileError::Forbidden(format!(
                    "{path}: too many symbolic links"
                )));
            }
            let target = std::fs::read_link(&next)?;
            pending.extend(
                target
                    .components()
                    .rev()
                    .map(|c| c.as_os_str().to_os_string()),
            );
            continue;
        }
        current = next;
    }
    if current.starts_with(root) {
        Ok(current)
    } else {
        Err(outside())
    }
}

fn canonical(path: &Path, what: &str) -> Result<PathBuf, FileError> {
    std::fs::canonicalize(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => FileError::NotFound(what.to_string()),
        _ => FileError::Forbidden(format!("{what}: {e}")),
    })
}

/// The most recently modified run of an executor.
fn latest_run(runs: &Path) -> Result<String, FileError> {
    let entries = std::fs::read_dir(runs).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => FileError::NotFound("no sandbox for this executor".into()),
        _ => FileError::Io(e),
    })?;
    entries
        .filter_map(Result::ok)
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            agora_proto::validate_id(&name).ok()?;
            let mtime = e.metadata().and_then(|m| m.modified()).ok()?;
            Some((mtime, name))
        })
        .max()
        .map(|(_, name)| name)
        .ok_or_else(|| FileError::NotFound("no sandbox for this executor".into()))
}

fn list(dir: &Path, path: &str, run_id: String) -> Result<Listing, FileError> {
    let mut entries: Vec<DirEntry> = std::fs::read_dir(dir)?
        .filter_map(Result::ok)
        .take(MAX_LISTING)
        .filter_map(|e| {
            let meta = e.metadata().ok()?;
            Some(DirEntry {
                name: e.file_name().to_string_lossy().into_owned(),
                dir: meta.is_dir(),
                size: if meta.is_dir() { 0 } else { meta.len() },
                mtime: meta
                    .modified()
                    .ok()
                    .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                    .map_or(0.0, |d| d.as_secs_f64()),
            })
        })
        .collect();
    entries.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(Listing {
        path: path.trim_end_matches('/').to_string(),
        run_id,
        entries,
    })
}

/// Where an open file really is (Linux: `/proc/self/fd/N`); `None` where
/// that cannot be told.
fn opened_path(file: &File) -> Option<PathBuf> {
    use std::os::fd::AsRawFd;
    std::fs::read_link(format!("/proc/self/fd/{}", file.as_raw_fd())).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_components_pass() {
        assert_eq!(relative_path("").unwrap(), PathBuf::new());
        assert_eq!(relative_path("stdout").unwrap(), PathBuf::from("stdout"));
        assert_eq!(relative_path("a/b/").unwrap(), PathBuf::from("a/b"));
        for bad in [
            "..",
            "../x",
            "a/../../x",
            "/etc/passwd",
            "a//b",
            "./a",
            "a/.",
            "a\0b",
        ] {
            assert!(
                matches!(relative_path(bad), Err(FileError::Forbidden(_))),
                "{bad:?}"
            );
        }
    }

    /// A work dir with one sandbox (`fw`/`ex`, run `r1`) holding `stdout`;
    /// the work dir and the sandbox.
    fn sandbox() -> (tempfile::TempDir, PathBuf) {
        let work = tempfile::tempdir().unwrap();
        let sandbox = crate::paths::sandbox_dir(work.path(), "fw", "ex", "r1").unwrap();
        std::fs::create_dir_all(sandbox.join("sub")).unwrap();
        std::fs::write(sandbox.join("stdout"), "hello").unwrap();
        (work, sandbox)
    }

    fn status(work: &Path, path: &str) -> u16 {
        match open(work, "fw", "ex", Some("r1"), path) {
            Ok(_) => 200,
            Err(FileError::Forbidden(_)) => 403,
            Err(FileError::NotFound(_)) => 404,
            Err(FileError::Io(e)) => panic!("{path}: {e}"),
        }
    }

    #[test]
    fn symlinks_out_of_the_sandbox_answer_alike_whether_their_target_exists() {
        let (work, sandbox) = sandbox();
        let outside = work.path().join("outside.txt");
        std::fs::write(&outside, "secret").unwrap();
        let link = |name: &str, target: &Path| {
            std::os::unix::fs::symlink(target, sandbox.join(name)).unwrap()
        };
        link("to-existing", &outside);
        link("to-missing", &work.path().join("missing.txt"));
        link("to-existing-dir", Path::new("/etc"));
        link("to-missing-dir", Path::new("/agora-no-such-dir/x"));
        link("up-existing", Path::new("../../../../../../outside.txt"));
        link("up-missing", Path::new("../../../../../../missing.txt"));
        link("up-and-back", Path::new("../r1/stdout"));
        link("absolute-inside", &sandbox.join("stdout"));
        link("inside", Path::new("sub/../stdout"));
        link("loop", Path::new("loop"));
        for path in [
            "to-existing",
            "to-missing",
            "to-existing-dir/passwd",
            "to-missing-dir/passwd",
            "up-existing",
            "up-missing",
            "loop",
        ] {
            assert_eq!(status(work.path(), path), 403, "{path}");
        }
        for path in ["stdout", "up-and-back", "absolute-inside", "inside", "sub"] {
            assert_eq!(status(work.path(), path), 200, "{path}");
        }
        assert_eq!(status(work.path(), "sub/missing"), 404);
        assert_eq!(status(work.path(), "missing"), 404);
    }

    #[test]
    fn a_hard_link_is_not_served() {
        let (work, sandbox) = sandbox();
        let outside = work.path().join("outside.txt");
        std::fs::write(&outside, "secret").unwrap();
        std::fs::hard_link(&outside, sandbox.join("linked")).unwrap();
        assert_eq!(status(work.path(), "linked"), 403);
        // Once it is the file's only name, it is.
        std::fs::remove_file(&outside).unwrap();
        assert_eq!(status(work.path(), "linked"), 200);
    }

    #[test]
    fn mesos_paths_name_a_sandbox_without_looking() {
        let work = Path::new("/var/agora");
        let p = MesosPath::parse(work, "/frameworks/fw/executors/ex/runs/latest/a/stdout").unwrap();
        assert_eq!(
            (
                p.framework_id.as_str(),
                p.executor_id.as_str(),
                p.run,
                p.relative.as_str()
            ),
            ("fw", "ex", None, "a/stdout")
        );
        let p = MesosPath::parse(work, "/var/agora/frameworks/fw/executors/ex/runs/r1").unwrap();
        assert_eq!((p.run.as_deref(), p.relative.as_str()), (Some("r1"), ""));
        for missing in [
            "/etc/passwd",
            "/frameworks/fw",
            "/var/agora/meta/x",
            "stdout",
        ] {
            assert!(
                matches!(MesosPath::parse(work, missing), Err(FileError::NotFound(_))),
                "{missing}"
            );
        }
        for bad in [
            "/frameworks/fw/executors/ex/runs/latest/../../x",
            "/frameworks/../executors/ex/runs/latest/stdout",
            "/frameworks/fw/executors/ex/runs/latest//stdout",
        ] {
            assert!(
                matches!(MesosPath::parse(work, bad), Err(FileError::Forbidden(_))),
                "{bad}"
            );
        }
    }

    #[test]
    fn modes_read_as_ls_writes_them() {
        assert_eq!(mode_string(libc::S_IFREG | 0o644), "-rw-r--r--");
        assert_eq!(mode_string(libc::S_IFDIR | 0o750), "drwxr-x---");
        assert_eq!(mode_string(libc::S_IFREG | 0o4755), "-rwsr-xr-x");
        assert_eq!(mode_string(libc::S_IFDIR | 0o1777), "drwxrwxrwt");
        assert_eq!(mode_string(libc::S_IFLNK | 0o777), "lrwxrwxrwx");
    }

    #[test]
    fn chunks_do_not_split_characters() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        std::fs::write(&p, "aé b").unwrap(); // 'é' is 2 bytes: 61 c3 a9 20 62
        let mut f = File::open(&p).unwrap();
        let c = read_chunk(&mut f, "f", "r".into(), 0, 2).unwrap();
        assert_eq!((c.data.as_str(), c.length, c.eof), ("a", 1, false));
        let c = read_chunk(&mut f, "f", "r".into(), 1, 10).unwrap();
        assert_eq!(
            (c.data.as_str(), c.length, c.size, c.eof),
            ("é b", 4, 5, true)
        );
        let c = read_chunk(&mut f, "f", "r".into(), 99, 10).unwrap();
        assert_eq!((c.data.as_str(), c.length, c.eof), ("", 0, true));
    }
}
