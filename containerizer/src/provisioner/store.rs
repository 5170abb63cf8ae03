//! The layer store (`--docker-store-dir`), shared by every image:
//!
//! ```text
//! layers/<hex>/rootfs        a layer, unpacked; <hex> is its diff id's
//! layers/<hex>/layer.json    its diff id, size and form (overlay/copy);
//!                            its modification time is the layer's last use
//! images/<hex>.json          an image by name: its layers (diff ids,
//!                            bottom first) and runtime config
//! staging/                   work in progress, emptied at start
//! ```
//!
//! A layer is unpacked and checked in `staging/` and renamed into
//! `layers/` whole, so a crash leaves no partial layer there (only
//! `staging/` litter, removed at the next start). Layers are counted
//! by the images in use ([`Lease`]); [`Store::gc`] removes unreferenced
//! ones, least recently used first, until the store is under the
//! watermark, and forgets the images that needed them.

use std::collections::HashMap;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::image::ImageConfig;
use super::layer::disk_usage;
use super::Backend;

/// The store: its directories and what is known of them.
pub(crate) struct Store {
    root: PathBuf,
    backend: Backend,
    index: Mutex<Index>,
    next_staging: AtomicU64,
}

/// An image as the store keeps it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Record {
    /// The image's name ([`super::reference::ImageName::key`]).
    pub key: String,
    /// The manifest's digest (none for a `docker save` archive's image).
    pub digest: Option<String>,
    /// Diff ids, bottom first.
    pub layers: Vec<String>,
    pub config: ImageConfig,
}

/// The layers an image in use holds: they are not collected until it is
/// dropped.
pub(crate) struct Lease {
    store: Arc<Store>,
    layers: Vec<String>,
}

/// A directory under `staging/`, removed when dropped unless committed.
pub(crate) struct Staging {
    path: Option<PathBuf>,
}

/// What a collection did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GcReport {
    /// The diff ids of the layers removed, least recently used first.
    pub removed: Vec<String>,
    /// Bytes they took.
    pub freed: u64,
    /// Bytes the store's layers take now.
    pub size: u64,
    /// Images forgotten because a layer of theirs was removed.
    pub forgotten_images: Vec<String>,
}

#[derive(Default)]
struct Index {
    layers: HashMap<String, LayerState>,
    images: HashMap<String, Record>,
    /// Bytes of the present layers.
    total: u64,
}

struct LayerState {
    /// Bytes on disk (0 until present).
    size: u64,
    present: bool,
    /// Images in use that hold it.
    refs: usize,
    last_used: SystemTime,
}

#[derive(Serialize, Deserialize)]
struct LayerMeta {
    diff_id: String,
    size: u64,
    backend: Backend,
}

// === impl Store ===

impl Store {
    /// Opens (creating) the store at `root` for `backend`: empties
    /// `staging/`, drops layers unpacked for another backend and images
    /// whose layers are gone.
    pub fn open(root: &Path, backend: Backend) -> io::Result<Store> {
        for dir in ["layers", "images", "staging"] {
            fs::create_dir_all(root.join(dir))?;
        }
        for entry in fs::read_dir(root.join("staging"))? {
            remove_any(&entry?.path())?;
        }
        let mut index = Index::default();
        for entry in fs::read_dir(root.join("layers"))? {
            let dir = entry?.path();
            let meta_path = dir.join("layer.json");
            let meta = fs::read(&meta_path)
                .ok()
                .and_then(|b| serde_json::from_slice::<LayerMeta>(&b).ok());
            let used = fs::metadata(&meta_path).and_then(|m| m.modified());
            match (meta, used) {
                (Some(meta), Ok(last_used))
                    if meta.backend == backend && layer_dir(root, &meta.diff_id) == dir =>
                {
                    index.total += meta.size;
                    index.layers.insert(
                        meta.diff_id,
                        LayerState {
                            size: meta.size,
                            present: true,
                            refs: 0,
                            last_used,
                        },
                    );
                }
                _ => {
                    tracing::info!(layer = %dir.display(), "removing a layer of another backend or unreadable");
                    remove_any(&dir)?;
                }
            }
        }
        for entry in fs::read_dir(root.join("images"))? {
            let path = entry?.path();
            let record = fs::read(&path)
                .ok()
                .and_then(|b| serde_json::from_slice::<Record>(&b).ok());
            match record {
                Some(record)
                    if record_path(root, &record.key) == path
                        && record.layers.iter().all(|l| index.layers.contains_key(l)) =>
                {
                    index.images.insert(record.key.clone(), record);
                }
                _ => remove_any(&path)?,
            }
        }
        Ok(Store {
            root: root.to_path_buf(),
            backend,
            index: Mutex::new(index),
            next_staging: AtomicU64::new(0),
        })
    }

    /// The unpacked layer `diff_id` (present or not).
    pub fn rootfs(&self, diff_id: &str) -> PathBuf {
        layer_dir(&self.root, diff_id).join("rootfs")
    }

    /// Whether layer `diff_id` is in the store.
    pub fn has_layer(&self, diff_id: &str) -> bool {
        self.lock().layers.get(diff_id).is_some_and(|l| l.present)
    }

    /// A new directory under `staging/`.
    pub fn staging(&self) -> io::Result<Staging> {
        let n = self.next_staging.fetch_add(1, Ordering::Relaxed);
        let path = self
            .root
            .join("staging")
            .join(format!("{}-{n}", std::process::id()));
        fs::create_dir(&path)?;
        Ok(Staging { path: Some(path) })
    }

    /// Moves `staging` (holding `rootfs/`, the unpacked layer
    /// `diff_id`) into the store. A layer already there (unpacked by a
    /// pull that gave up waiting) is kept and `staging` removed.
    pub fn commit_layer(&self, mut staging: Staging, diff_id: &str) -> io::Result<()> {
        let from = staging.path().to_path_buf();
        let size = disk_usage(&from.join("rootfs"))?;
        let meta = LayerMeta {
            diff_id: diff_id.to_string(),
            size,
            backend: self.backend,
        };
        fs::write(
            from.join("layer.json"),
            serde_json::to_vec(&meta).map_err(io::Error::other)?,
        )?;
        let to = layer_dir(&self.root, diff_id);
        let mut index = self.lock();
        match fs::rename(&from, &to) {
            Ok(()) => {
                staging.path = None;
            }
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENOTEMPTY) | Some(libc::EEXIST)) => {
                return Ok(());
            }
            Err(e) => return Err(e),
        }
        let now = SystemTime::now();
        let layer = index
            .layers
            .entry(diff_id.to_string())
            .or_insert(LayerState {
                size: 0,
                present: false,
                refs: 0,
                last_used: now,
            });
        if !layer.present {
            layer.present = true;
            layer.size = size;
            layer.last_used = now;
            index.total += size;
        }
        Ok(())
    }

    /// Holds `layers` (present or about to be) until the lease drops.
    pub fn pin(self: &Arc<Self>, layers: &[String]) -> Lease {
        let now = SystemTime::now();
        let mut index = self.lock();
        for diff_id in layers {
            let layer = index.layers.entry(diff_id.clone()).or_insert(LayerState {
                size: 0,
                present: false,
                refs: 0,
                last_used: now,
            });
            layer.refs += 1;
            layer.last_used = now;
        }
        Lease {
            store: self.clone(),
            layers: layers.to_vec(),
        }
    }

    /// The image named `key`, if the store has it.
    pub fn record(&self, key: &str) -> Option<Record> {
        self.lock().images.get(key).cloned()
    }

    /// Files `record` (replacing an older one of the same name).
    pub fn save_record(&self, record: &Record) -> io::Result<()> {
        let path = record_path(&self.root, &record.key);
        let tmp = path.with_extension("tmp");
        fs::write(&tmp, serde_json::to_vec(record).map_err(io::Error::other)?)?;
        fs::rename(&tmp, &path)?;
        self.lock()
            .images
            .insert(record.key.clone(), record.clone());
        Ok(())
    }

    /// Bytes the present layers take.
    pub fn size(&self) -> u64 {
        self.lock().total
    }

    /// Removes unreferenced layers, least recently used first, until the
    /// layers take at most `watermark` bytes (or none is left to
    /// remove); images that needed a removed layer are forgotten.
    pub fn gc(&self, watermark: u64) -> GcReport {
        let mut report = GcReport::default();
        let mut doomed = Vec::new();
        {
            let mut index = self.lock();
            if index.total > watermark {
                let mut unused: Vec<(SystemTime, String, u64)> = index
                    .layers
                    .iter()
                    .filter(|(_, l)| l.present && l.refs == 0)
                    .map(|(id, l)| (l.last_used, id.clone(), l.size))
                    .collect();
                unused.sort();
                for (_, diff_id, size) in unused {
                    if index.total <= watermark {
                        break;
                    }
                    // Renamed away under the lock: a provision that pins
                    // the layer from now on finds it gone and fetches it.
                    let dir = layer_dir(&self.root, &diff_id);
                    let Ok(grave) = self.staging() else { break };
                    if let Err(e) = fs::rename(&dir, grave.path().join("layer")) {
                        tracing::warn!(layer = %diff_id, error = %e, "cannot remove a layer");
                        continue;
                    }
                    index.layers.remove(&diff_id);
                    index.total -= size;
                    report.freed += size;
                    report.removed.push(diff_id);
                    // Removed (by its drop) once the index is unlocked.
                    doomed.push(grave);
                }
                let removed: std::collections::HashSet<&String> = report.removed.iter().collect();
                let forgotten: Vec<String> = index
                    .images
                    .values()
                    .filter(|r| r.layers.iter().any(|l| removed.contains(l)))
                    .map(|r| r.key.clone())
                    .collect();
                for key in &forgotten {
                    index.images.remove(key);
                    let _ = fs::remove_file(record_path(&self.root, key));
                }
                report.forgotten_images = forgotten;
            }
            report.size = index.total;
        }
        drop(doomed);
        report
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Index> {
        self.index.lock().expect("layer store index poisoned")
    }

    fn release(&self, layers: &[String]) {
        let now = SystemTime::now();
        let mut index = self.lock();
        for diff_id in layers {
            let Some(layer) = index.layers.get_mut(diff_id) else {
                continue;
            };
            layer.refs = layer.refs.saturating_sub(1);
            layer.last_used = now;
            if layer.present {
                // The last use survives a restart as the file's time.
                let meta = layer_dir(&self.root, diff_id).join("layer.json");
                if let Ok(file) = fs::File::options().append(true).open(meta) {
                    let _ = file.set_modified(now);
                }
            } else if layer.refs == 0 {
                index.layers.remove(diff_id);
            }
        }
    }
}

// === impl Lease ===

impl Drop for Lease {
    fn drop(&mut self) {
        self.store.release(&self.layers);
    }
}

// === impl Staging ===

impl Staging {
    pub fn path(&self) -> &Path {
        self.path
            .as_deref()
            .expect("staging directory already committed")
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        if let Some(path) = self.path.take() {
            if let Err(e) = remove_any(&path) {
                tracing::warn!(dir = %path.display(), error = %e, "cannot remove a staging directory");
            }
        }
    }
}

/// `layers/<hex>` of `diff_id` (`sha256:<hex>`, checked by the caller).
fn layer_dir(root: &Path, diff_id: &str) -> PathBuf {
    let hex = diff_id.strip_prefix("sha256:").unwrap_or(diff_id);
    root.join("layers").join(hex)
}

fn record_path(root: &Path, key: &str) -> PathBuf {
    let hash = hex::encode(Sha256::digest(key.as_bytes()));
    root.join("images").join(format!("{hash}.json"))
}

fn remove_any(path: &Path) -> io::Result<()> {
    match fs::symlink_metadata(path) {
        Ok(meta) if meta.is_dir() => fs::remove_dir_all(path),
        Ok(_) => fs::remove_file(path),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layer(store: &Store, diff_id: &str, bytes: usize) {
        let staging = store.staging().unwrap();
        fs::create_dir(staging.path().join("rootfs")).unwrap();
        fs::write(staging.path().join("rootfs/data"), vec![7u8; bytes]).unwrap();
        store.commit_layer(staging, diff_id).unwrap();
    }

    fn id(n: u8) -> String {
        format!("sha256:{}", hex::encode([n; 32]))
    }

    #[test]
    fn gc_removes_unreferenced_layers_oldest_first_and_keeps_used_ones() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(Store::open(dir.path(), Backend::Copy).unwrap());
        for n in 1..=4 {
            layer(&store, &id(n), 64 << 10);
        }
        let each = store.size() / 4;
        let used = store.pin(&[id(1), id(2)]);
        // 3 was used after 4: 4 is the older.
        drop(store.pin(&[id(4)]));
        drop(store.pin(&[id(3)]));
        store
            .save_record(&Record {
                key: "library/x:1".into(),
                digest: None,
                layers: vec![id(1), id(4)],
                config: ImageConfig::default(),
            })
            .unwrap();
        let report = store.gc(3 * each);
        assert_eq!(report.removed, vec![id(4)]);
        assert_eq!(report.forgotten_images, vec!["library/x:1".to_string()]);
        assert!(store.record("library/x:1").is_none());
        assert!(!store.rootfs(&id(4)).exists());
        // Under the watermark already: nothing more goes.
        assert!(store.gc(3 * each).removed.is_empty());
        // Down to nothing: only the unused layer 3 can go.
        let report = store.gc(0);
        assert_eq!(report.removed, vec![id(3)]);
        assert!(store.rootfs(&id(1)).exists() && store.rootfs(&id(2)).exists());
        drop(used);
        assert_eq!(store.gc(0).removed.len(), 2);
        assert_eq!(store.size(), 0);
    }

    #[test]
    fn a_restart_keeps_layers_and_images_and_clears_staging() {
        let dir = tempfile::tempdir().unwrap();
        {
            let store = Store::open(dir.path(), Backend::Copy).unwrap();
            layer(&store, &id(1), 1000);
            store
                .save_record(&Record {
                    key: "library/x:1".into(),
                    digest: None,
                    layers: vec![id(1)],
                    config: ImageConfig::default(),
                })
                .unwrap();
            // A crash mid-unpack leaves a staging directory behind.
            std::mem::forget(store.staging().unwrap());
        }
        let store = Store::open(dir.path(), Backend::Copy).unwrap();
        assert!(store.has_layer(&id(1)));
        assert!(store.record("library/x:1").is_some());
        assert_eq!(fs::read_dir(dir.path().join("staging")).unwrap().count(), 0);
        // The overlay backend cannot use layers unpacked for copy.
        drop(store);
        let store = Store::open(dir.path(), Backend::Overlay).unwrap();
        assert!(!store.has_layer(&id(1)));
        assert!(store.record("library/x:1").is_none());
    }
}
