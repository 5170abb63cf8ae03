//! The mounts the runtime makes on the host: overlays of image layers
//! (a container's root file system, image volumes), and finding and
//! removing whatever is mounted under a run's directory.

use std::path::{Path, PathBuf};

use nix::mount::{mount, umount2, MntFlags, MsFlags};

/// The largest option string the kernel takes for one mount (a page).
const MOUNT_OPTIONS_MAX: usize = 4095;

/// Why an overlay could not be mounted.
#[derive(Debug, thiserror::Error)]
pub enum OverlayError {
    /// The kernel has no overlay file system.
    #[error(
        "the overlay file system is unavailable ({0}); Agora mounts image layers with overlay \
         only and does not copy them: load the overlay module (modprobe overlay)"
    )]
    Unavailable(String),
    /// A layer path overlay cannot name.
    #[error(
        "layer directory '{0}' has a ':' or ',' in its path, which overlay options cannot hold"
    )]
    BadLayerPath(PathBuf),
    /// A missing layer.
    #[error("layer directory '{0}' does not exist")]
    MissingLayer(PathBuf),
    /// Too many or too long layer paths for one mount.
    #[error("the overlay options for {layers} layers take {len} bytes, more than the kernel's {MOUNT_OPTIONS_MAX}")]
    TooLong {
        /// Number of layers.
        layers: usize,
        /// Length of the option string.
        len: usize,
    },
    /// The mount itself failed.
    #[error("mounting overlay at '{target}': {error}")]
    Mount {
        /// Mount point.
        target: PathBuf,
        /// Error.
        error: nix::Error,
    },
    /// Making the directories failed.
    #[error("creating '{path}': {error}")]
    Io {
        /// Path.
        path: PathBuf,
        /// Error.
        error: std::io::Error,
    },
}

/// Whether `/proc/filesystems` lists overlay.
pub fn overlay_supported() -> bool {
    std::fs::read_to_string("/proc/filesystems")
        .map(|s| {
            s.lines()
                .any(|l| l.split_whitespace().last() == Some("overlay"))
        })
        .unwrap_or(false)
}

/// Mounts at `dir/merged` an overlay of `layers` (bottom first) with a
/// writable upper directory `dir/upper` and work directory `dir/work`,
/// and returns the mount point.
pub fn mount_overlay(layers: &[PathBuf], dir: &Path) -> Result<PathBuf, OverlayError> {
    let merged = dir.join("merged");
    let upper = dir.join("upper");
    let work = dir.join("work");
    for d in [&merged, &upper, &work] {
        std::fs::create_dir_all(d).map_err(|error| OverlayError::Io {
            path: d.clone(),
            error,
        })?;
    }
    for layer in layers {
        let text = layer.to_string_lossy();
        if text.contains(':') || text.contains(',') {
            return Err(OverlayError::BadLayerPath(layer.clone()));
        }
        if !layer.is_dir() {
            return Err(OverlayError::MissingLayer(layer.clone()));
        }
    }
    // overlay's lowerdir lists the top layer first.
    let lower = layers
        .iter()
        .rev()
        .map(|l| l.to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join(":");
    let options = format!(
        "lowerdir={lower},upperdir={},workdir={}",
        upper.display(),
        work.display()
    );
    if options.len() > MOUNT_OPTIONS_MAX {
        return Err(OverlayError::TooLong {
            layers: layers.len(),
            len: options.len(),
        });
    }
    match mount(
        Some("overlay"),
        &merged,
        Some("overlay"),
        MsFlags::empty(),
        Some(options.as_str()),
    ) {
        Ok(()) => Ok(merged),
        Err(nix::Error::ENODEV) => Err(OverlayError::Unavailable(
            "mount returned ENODEV".to_string(),
        )),
        Err(error) => Err(OverlayError::Mount {
            target: merged,
            error,
        }),
    }
}

/// The mount points at or under `dir` in this process's mount namespace,
/// deepest first (the order to unmount them in).
pub fn mounts_under(dir: &Path) -> Vec<PathBuf> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut found: Vec<PathBuf> = text
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .map(|field| PathBuf::from(unescape(field)))
        .filter(|p| p.starts_with(dir))
        .collect();
    found.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    found.dedup();
    found
}

/// Unmounts everything at or under `dir` (detached, so a busy mount goes
/// as soon as it is no longer used). Returns what could not be unmounted.
pub fn unmount_all_under(dir: &Path) -> Vec<(PathBuf, nix::Error)> {
    let mut failed = Vec::new();
    // A mount stacked on another at one point shows once per layer.
    for _ in 0..4 {
        let mounts = mounts_under(dir);
        if mounts.is_empty() {
            break;
        }
        failed.clear();
        for point in mounts {
            if let Err(e) = umount2(&point, MntFlags::MNT_DETACH) {
                if e != nix::Error::EINVAL && e != nix::Error::ENOENT {
                    failed.push((point, e));
                }
            }
        }
    }
    failed
}

/// mountinfo escapes space, tab, newline and backslash as octal.
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\' && i + 4 <= bytes.len() {
            let digits = std::str::from_utf8(&bytes[i + 1..i + 4]).ok();
            if let Some(v) = digits.and_then(|d| u8::from_str_radix(d, 8).ok()) {
                out.push(v);
                i += 4;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_paths_are_unescaped() {
        assert_eq!(unescape("/a\\040b"), "/a b");
        assert_eq!(unescape("/plain"), "/plain");
        assert_eq!(unescape("/end\\"), "/end\\");
    }
}
