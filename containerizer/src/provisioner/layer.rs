//! Layers: a blob (tar, or gzip of a tar) verified and unpacked into a
//! directory, and layers applied one over another by copy.
//!
//! Unpacking hashes the blob as it is read (its digest) and the tar
//! inside it (the layer's diff id); a layer whose either hash differs
//! from what names it is refused. Whiteouts — `.wh.NAME` (NAME is
//! deleted) and `.wh..wh..opq` (the directory hides what lower layers
//! put in it) — become what overlayfs reads for the overlay backend (a
//! character device 0/0 named NAME; the directory's
//! `trusted.overlay.opaque` attribute set to `y`), which takes root. For
//! the copy backend they stay files, and [`apply_by_copy`] carries them
//! out.

use std::ffi::OsStr;
use std::fs;
use std::io::{self, BufRead, BufReader, Read};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

use nix::sys::stat::{makedev, mknod, Mode, SFlag};
use sha2::{Digest, Sha256};
use tar::EntryType;

use super::error::{chain, is_disk_full, Failure};
use super::Backend;

const WHITEOUT: &str = ".wh.";
const OPAQUE: &str = ".wh..wh..opq";
/// Prefix of aufs's own metadata (hard-link directories), not content.
const AUFS_META: &str = ".wh..wh.";

/// The digests a layer must have.
pub(crate) struct Expected<'a> {
    /// The blob's digest, when known (a registry's or an OCI layout's
    /// blob; not a `docker save` archive's `layer.tar`).
    pub blob: Option<&'a str>,
    /// The diff id: the digest of the uncompressed tar.
    pub diff_id: &'a str,
}

/// A reader that hashes what passes through and remembers whether
/// reading failed (so a malformed blob is told from a failing disk).
struct Hashing<R> {
    inner: R,
    hasher: Sha256,
    failed: bool,
}

// === impl Hashing ===

impl<R: Read> Hashing<R> {
    fn new(inner: R) -> Hashing<R> {
        Hashing {
            inner,
            hasher: Sha256::new(),
            failed: false,
        }
    }

    fn digest(self) -> String {
        format!("sha256:{}", hex::encode(self.hasher.finalize()))
    }
}

impl<R: Read> Read for Hashing<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self.inner.read(buf) {
            Ok(n) => {
                self.hasher.update(&buf[..n]);
                Ok(n)
            }
            Err(e) => {
                self.failed = true;
                Err(e)
            }
        }
    }
}

/// Unpacks the layer blob read from `input` into `rootfs` (an empty
/// directory) for `backend`, checking `expected`. `privileged`: running
/// as root (ownership, extended attributes and device nodes are kept).
pub(crate) fn unpack(
    input: impl Read,
    expected: &Expected<'_>,
    rootfs: &Path,
    backend: Backend,
    privileged: bool,
) -> Result<(), Failure> {
    let mut blob = Hashing::new(input);
    let unpacked = unpack_blob(&mut blob, expected.diff_id, rootfs, backend, privileged);
    // The whole blob is read even when unpacking failed: a blob that is
    // not what its digest says is reported as such (a corrupt blob
    // usually breaks the gzip stream or the tar first), and a streaming
    // writer is never left blocked.
    let drained = io::copy(&mut blob, &mut io::sink());
    if let (Some(want), Ok(_)) = (expected.blob, &drained) {
        let actual = blob.digest();
        if actual != want {
            return Err(Failure::DigestMismatch {
                what: "layer blob",
                expected: want.to_string(),
                actual,
            });
        }
    }
    let diff_id = unpacked?;
    drained.map_err(|e| Failure::BadImage(format!("layer {}: {e}", expected.diff_id)))?;
    if diff_id != expected.diff_id {
        return Err(Failure::DigestMismatch {
            what: "layer (uncompressed)",
            expected: expected.diff_id.to_string(),
            actual: diff_id,
        });
    }
    Ok(())
}

/// Unpacks what `blob` holds (gzip or plain tar) into `rootfs`; returns
/// the tar's digest.
fn unpack_blob(
    blob: &mut dyn Read,
    diff_id: &str,
    rootfs: &Path,
    backend: Backend,
    privileged: bool,
) -> Result<String, Failure> {
    let mut buffered = BufReader::with_capacity(256 << 10, blob);
    let magic = buffered
        .fill_buf()
        .map_err(|e| Failure::BadImage(format!("layer {diff_id}: {e}")))?
        .to_vec();
    let decoded: Box<dyn Read + '_> = if magic.starts_with(&[0x1f, 0x8b]) {
        Box::new(flate2::read::MultiGzDecoder::new(buffered))
    } else if magic.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
        return Err(Failure::Unsupported(format!(
            "zstd-compressed layer {diff_id}"
        )));
    } else if magic.starts_with(b"BZh") || magic.starts_with(&[0xfd, b'7', b'z', b'X', b'Z']) {
        return Err(Failure::Unsupported(format!(
            "bzip2/xz-compressed layer {diff_id} (only gzip and plain tar)"
        )));
    } else {
        Box::new(buffered)
    };
    let mut tar = Hashing::new(decoded);
    let result = unpack_tar(&mut tar, rootfs, backend, privileged).and_then(|()| {
        // The tar's end blocks and padding count in its digest.
        io::copy(&mut tar, &mut io::sink()).map(drop)
    });
    match result {
        Ok(()) => Ok(tar.digest()),
        Err(e) => Err(classify(e, tar.failed, diff_id, rootfs)),
    }
}

fn classify(e: io::Error, read_failed: bool, diff_id: &str, rootfs: &Path) -> Failure {
    if is_disk_full(&e) {
        Failure::store(rootfs, &e)
    } else if read_failed
        || matches!(
            e.kind(),
            io::ErrorKind::InvalidData | io::ErrorKind::UnexpectedEof | io::ErrorKind::InvalidInput
        )
    {
        Failure::BadImage(format!("layer {diff_id}: {}", chain(&e)))
    } else {
        Failure::Store {
            path: rootfs.to_path_buf(),
            detail: format!("unpacking layer {diff_id}: {}", chain(&e)),
        }
    }
}

fn unpack_tar(
    input: &mut dyn Read,
    rootfs: &Path,
    backend: Backend,
    privileged: bool,
) -> io::Result<()> {
    let mut archive = tar::Archive::new(input);
    archive.set_preserve_permissions(true);
    archive.set_preserve_mtime(true);
    archive.set_overwrite(true);
    archive.set_preserve_ownerships(privileged);
    archive.set_unpack_xattrs(privileged);
    // Unprivileged, a read-only directory would refuse its own files:
    // directories stay writable until the end, then get their modes.
    let mut modes: Vec<(PathBuf, u32)> = Vec::new();
    for entry in archive.entries()? {
        let mut entry = entry?;
        let path = entry.path()?.into_owned();
        let relative = relative(&path)?;
        let Some(name) = relative
            .file_name()
            .and_then(OsStr::to_str)
            .map(str::to_string)
        else {
            if relative.as_os_str().is_empty() {
                // The root itself ("./"): its mode is the rootfs's.
                continue;
            }
            return Err(bad(format!("entry {path:?} has no file name")));
        };
        if name.starts_with(WHITEOUT) && backend == Backend::Overlay {
            let dir = safe_dir(rootfs, relative.parent().unwrap_or(Path::new("")))?;
            if name == OPAQUE {
                xattr::set(&dir, "trusted.overlay.opaque", b"y").map_err(|e| {
                    io::Error::new(e.kind(), format!("opaque directory {relative:?}: {e}"))
                })?;
            } else if !name.starts_with(AUFS_META) {
                let target = dir.join(&name[WHITEOUT.len()..]);
                remove_any(&target)?;
                mknod(&target, SFlag::S_IFCHR, Mode::empty(), makedev(0, 0))
                    .map_err(|e| io::Error::from_raw_os_error(e as i32))?;
            }
            continue;
        }
        let kind = entry.header().entry_type();
        if matches!(kind, EntryType::Char | EntryType::Block | EntryType::Fifo) {
            let dir = safe_dir(rootfs, relative.parent().unwrap_or(Path::new("")))?;
            special(&entry, &dir.join(&name), kind, privileged)?;
            continue;
        }
        if !entry.unpack_in(rootfs)? {
            return Err(bad(format!("entry {path:?} leaves the layer")));
        }
        if kind == EntryType::Directory && !privileged {
            let dir = rootfs.join(&relative);
            let mode = entry.header().mode()? & 0o7777;
            if mode & 0o700 != 0o700 {
                fs::set_permissions(&dir, fs::Permissions::from_mode(mode | 0o700))?;
                modes.push((dir, mode));
            }
        }
    }
    for (dir, mode) in modes.into_iter().rev() {
        fs::set_permissions(&dir, fs::Permissions::from_mode(mode))?;
    }
    Ok(())
}

/// A device node or FIFO: made as root; unprivileged, FIFOs only (a
/// device node cannot be made and is left out, with a warning).
fn special(
    entry: &tar::Entry<'_, &mut dyn Read>,
    target: &Path,
    kind: EntryType,
    privileged: bool,
) -> io::Result<()> {
    let header = entry.header();
    let mode = Mode::from_bits_truncate(header.mode()? & 0o7777);
    remove_any(target)?;
    let flag = match kind {
        EntryType::Char => SFlag::S_IFCHR,
        EntryType::Block => SFlag::S_IFBLK,
        _ => SFlag::S_IFIFO,
    };
    if !privileged && flag != SFlag::S_IFIFO {
        tracing::warn!(path = %target.display(), "device node left out of the layer (not root)");
        return Ok(());
    }
    let dev = makedev(
        u64::from(header.device_major()?.unwrap_or(0)),
        u64::from(header.device_minor()?.unwrap_or(0)),
    );
    mknod(target, flag, mode, dev).map_err(|e| io::Error::from_raw_os_error(e as i32))?;
    if privileged {
        let uid = header.uid()? as u32;
        let gid = header.gid()? as u32;
        std::os::unix::fs::lchown(target, Some(uid), Some(gid))?;
    }
    Ok(())
}

/// `path` without its root or `.` components; `..` is refused.
fn relative(path: &Path) -> io::Result<PathBuf> {
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            Component::Normal(part) => out.push(part),
            Component::CurDir | Component::RootDir | Component::Prefix(_) => {}
            Component::ParentDir => {
                return Err(bad(format!("entry {path:?} has a '..' component")))
            }
        }
    }
    Ok(out)
}

/// `root/relative`, making missing directories, through no symbolic
/// link (a whiteout under a link could reach outside the layer).
fn safe_dir(root: &Path, relative: &Path) -> io::Result<PathBuf> {
    let mut current = root.to_path_buf();
    for component in relative.components() {
        let Component::Normal(part) = component else {
            continue;
        };
        current.push(part);
        match fs::symlink_metadata(&current) {
            Ok(meta) if meta.is_dir() => {}
            Ok(_) => {
                return Err(bad(format!(
                    "{} is not a directory",
                    current.strip_prefix(root).unwrap_or(&current).display()
                )))
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                fs::create_dir(&current)?;
                fs::set_permissions(&current, fs::Permissions::from_mode(0o755))?;
            }
            Err(e) => return Err(e),
        }
    }
    Ok(current)
}

/// Removes whatever is at `path` (nothing there is fine).
fn remove_any(path: &Path) -> io::Result<()> {
    match fs::symlink_metadata(path) {
        Ok(meta) if meta.is_dir() => fs::remove_dir_all(path),
        Ok(_) => fs::remove_file(path),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

fn bad(message: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, message)
}

/// Bytes `path` takes on disk (hard links counted once).
pub(crate) fn disk_usage(path: &Path) -> io::Result<u64> {
    let mut seen = std::collections::HashSet::new();
    let mut total = 0;
    let mut stack = vec![path.to_path_buf()];
    while let Some(p) = stack.pop() {
        let meta = fs::symlink_metadata(&p)?;
        if meta.nlink() > 1 && !meta.is_dir() && !seen.insert((meta.dev(), meta.ino())) {
            continue;
        }
        total += meta.blocks() * 512;
        if meta.is_dir() {
            for entry in fs::read_dir(&p)? {
                stack.push(entry?.path());
            }
        }
    }
    Ok(total)
}

/// Copies `layers` (bottom first, unpacked for the copy backend) into
/// `rootfs` one over another, carrying out their whiteouts: what a lower
/// layer put at a whited-out name is removed, and an opaque directory
/// is emptied of lower layers' entries before its own are copied.
/// `privileged`: ownership and device nodes are copied too.
pub fn apply_by_copy(layers: &[PathBuf], rootfs: &Path, privileged: bool) -> io::Result<()> {
    fs::create_dir_all(rootfs)?;
    for layer in layers {
        copy_dir(layer, rootfs, privileged)?;
    }
    Ok(())
}

fn copy_dir(from: &Path, to: &Path, privileged: bool) -> io::Result<()> {
    let mut entries: Vec<fs::DirEntry> = fs::read_dir(from)?.collect::<io::Result<_>>()?;
    entries.sort_by_key(|e| e.file_name());
    // Whiteouts first: they remove lower layers' entries, never this
    // layer's.
    for entry in &entries {
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if name == OPAQUE {
            for lower in fs::read_dir(to)? {
                remove_any(&lower?.path())?;
            }
        } else if name.starts_with(WHITEOUT) && !name.starts_with(AUFS_META) {
            remove_any(&to.join(&name[WHITEOUT.len()..]))?;
        }
    }
    for entry in &entries {
        let name = entry.file_name();
        if name.to_str().is_some_and(|n| n.starts_with(WHITEOUT)) {
            continue;
        }
        let source = entry.path();
        let target = to.join(&name);
        let meta = fs::symlink_metadata(&source)?;
        let kind = meta.file_type();
        if kind.is_dir() {
            match fs::symlink_metadata(&target) {
                Ok(existing) if existing.is_dir() => {}
                Ok(_) => {
                    fs::remove_file(&target)?;
                    fs::create_dir(&target)?;
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => fs::create_dir(&target)?,
                Err(e) => return Err(e),
            }
            fs::set_permissions(&target, fs::Permissions::from_mode(meta.mode() | 0o700))?;
            copy_dir(&source, &target, privileged)?;
            fs::set_permissions(&target, fs::Permissions::from_mode(meta.mode() & 0o7777))?;
        } else {
            remove_any(&target)?;
            if kind.is_symlink() {
                std::os::unix::fs::symlink(fs::read_link(&source)?, &target)?;
            } else if kind.is_file() {
                fs::copy(&source, &target)?;
            } else if privileged {
                let flag = SFlag::from_bits_truncate(meta.mode() & libc::S_IFMT);
                mknod(
                    &target,
                    flag,
                    Mode::from_bits_truncate(meta.mode() & 0o7777),
                    meta.rdev(),
                )
                .map_err(|e| io::Error::from_raw_os_error(e as i32))?;
            } else {
                continue;
            }
        }
        if privileged {
            std::os::unix::fs::lchown(&target, Some(meta.uid()), Some(meta.gid()))?;
            if kind.is_file() || kind.is_dir() {
                // chown clears set-id bits: set the mode again.
                fs::set_permissions(&target, fs::Permissions::from_mode(meta.mode() & 0o7777))?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tar_of(entries: &[(&str, Option<&[u8]>)]) -> Vec<u8> {
        let mut builder = tar::Builder::new(Vec::new());
        for (path, content) in entries {
            let mut header = tar::Header::new_gnu();
            match content {
                Some(data) => {
                    header.set_entry_type(EntryType::Regular);
                    header.set_size(data.len() as u64);
                    header.set_mode(0o644);
                    builder.append_data(&mut header, path, *data).unwrap();
                }
                None => {
                    header.set_entry_type(EntryType::Directory);
                    header.set_size(0);
                    header.set_mode(0o755);
                    builder.append_data(&mut header, path, io::empty()).unwrap();
                }
            }
        }
        builder.into_inner().unwrap()
    }

    fn sha(data: &[u8]) -> String {
        format!("sha256:{}", hex::encode(Sha256::digest(data)))
    }

    #[test]
    fn a_layer_is_refused_when_either_digest_differs() {
        let tar = tar_of(&[("etc/", None), ("etc/hostname", Some(b"x"))]);
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        io::Write::write_all(&mut gz, &tar).unwrap();
        let gz = gz.finish().unwrap();
        let dir = tempfile::tempdir().unwrap();

        let ok = Expected {
            blob: Some(&sha(&gz)),
            diff_id: &sha(&tar),
        };
        let root = dir.path().join("ok");
        fs::create_dir(&root).unwrap();
        unpack(&gz[..], &ok, &root, Backend::Copy, false).unwrap();
        assert_eq!(fs::read(root.join("etc/hostname")).unwrap(), b"x");

        let wrong_blob = sha(b"other");
        let bad_blob = Expected {
            blob: Some(&wrong_blob),
            diff_id: &sha(&tar),
        };
        let root = dir.path().join("bad-blob");
        fs::create_dir(&root).unwrap();
        match unpack(&gz[..], &bad_blob, &root, Backend::Copy, false) {
            Err(Failure::DigestMismatch { what, .. }) => assert_eq!(what, "layer blob"),
            other => panic!("{other:?}"),
        }
        let wrong_diff = sha(b"other");
        let bad_diff = Expected {
            blob: None,
            diff_id: &wrong_diff,
        };
        let root = dir.path().join("bad-diff");
        fs::create_dir(&root).unwrap();
        match unpack(&tar[..], &bad_diff, &root, Backend::Copy, false) {
            Err(Failure::DigestMismatch { what, actual, .. }) => {
                assert_eq!(what, "layer (uncompressed)");
                assert_eq!(actual, sha(&tar));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn entries_leaving_the_layer_are_refused() {
        let mut builder = tar::Builder::new(Vec::new());
        let mut header = tar::Header::new_gnu();
        header.set_entry_type(EntryType::Regular);
        header.set_size(1);
        header.set_mode(0o644);
        // Written by hand: the builder itself refuses '..'.
        header.as_gnu_mut().unwrap().name[..9].copy_from_slice(b"../escape");
        header.set_cksum();
        builder.append(&header, &b"x"[..]).unwrap();
        let tar = builder.into_inner().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        fs::create_dir(&root).unwrap();
        let expected = Expected {
            blob: None,
            diff_id: &sha(&tar),
        };
        let err = unpack(&tar[..], &expected, &root, Backend::Copy, false).unwrap_err();
        assert!(err.to_string().contains(".."), "{err}");
        assert!(!dir.path().join("escape").exists());
    }

    #[test]
    fn copy_applies_whiteouts_and_opaque_directories() {
        let dir = tempfile::tempdir().unwrap();
        let lower = dir.path().join("lower");
        let upper = dir.path().join("upper");
        for (path, content) in [
            ("lower/etc/keep", "k"),
            ("lower/etc/gone", "g"),
            ("lower/opaque/old", "o"),
            ("upper/etc/.wh.gone", ""),
            ("upper/opaque/.wh..wh..opq", ""),
            ("upper/opaque/new", "n"),
            ("upper/etc/added", "a"),
        ] {
            let p = dir.path().join(path);
            fs::create_dir_all(p.parent().unwrap()).unwrap();
            fs::write(p, content).unwrap();
        }
        let rootfs = dir.path().join("rootfs");
        apply_by_copy(&[lower, upper], &rootfs, false).unwrap();
        assert!(rootfs.join("etc/keep").exists());
        assert!(rootfs.join("etc/added").exists());
        assert!(!rootfs.join("etc/gone").exists());
        assert!(!rootfs.join("etc/.wh.gone").exists());
        assert!(!rootfs.join("opaque/old").exists());
        assert!(rootfs.join("opaque/new").exists());
        assert!(!rootfs.join("opaque/.wh..wh..opq").exists());
    }
}
