//! The status update write-ahead log: one append-only file for the whole
//! agent (`WORK_DIR/meta/updates.wal`) holding every checkpointed task's
//! update stream.
//!
//! Records are JSON lines ([`WalRecord`]), each followed by a tab and the
//! CRC-32 of its JSON as eight hex digits, so a record that reached the
//! disk only in part (a machine crash, a torn sector) is recognised even
//! when it still ends in a newline. A record is an update a stream took, the
//! acknowledgement of a stream's head, the end of a stream, and (written
//! only by compaction) a snapshot of a whole live stream. The checkpoint
//! writer appends every record of a batch with one `write` and makes them
//! durable with one `fdatasync` ([`Wal::append`], [`Wal::sync`]); callers
//! learn of durability only after that sync, so an update is never
//! acknowledged to its executor before it is on disk.
//!
//! The log keeps, in memory, the live state it describes ([`Streams`]).
//! When the file outgrows [`Limits::compact_bytes`] (or twice its size after
//! the last compaction, whichever is larger), or when no stream is left and
//! the file is bigger than [`Limits::reset_bytes`], that state is written
//! to a new segment, synced, and renamed over the old file (then the
//! directory is synced): a crash at any point leaves either the old or the
//! new segment, both complete.
//!
//! Reading back ([`Wal::open`]) stops at the first bad record (a checksum
//! that does not match, a line that does not parse, a torn last line) and
//! drops it and everything after it: the records after a bad one were
//! never durable as a whole (see [`decode`]). That is logged (file,
//! offset, what was dropped) and counted ([`WalStats`], in `/metrics`);
//! the file is compacted right after, so new appends never follow a
//! damaged fragment. The master's registry log follows the same policy.

use agora_proto::hash::{HashMap, HashSet};
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use agora_proto::{ExecutorId, FrameworkId, TaskId, TaskInfo, TaskStatus};
use serde::{Deserialize, Serialize};

/// File name of the log inside `WORK_DIR/meta`.
pub(crate) const WAL_FILE: &str = "updates.wal";
/// Default size past which the log is compacted.
pub(crate) const COMPACT_BYTES: u64 = 8 << 20;
/// Default size past which an empty log (no live stream) is reset.
pub(crate) const RESET_BYTES: u64 = 256 << 10;
/// Acknowledged uuids a stream remembers (between this and twice this),
/// to recognise an executor re-sending an update whose acknowledgement it
/// missed. An executor re-sends only what was in flight when its
/// connection dropped, so the newest thousand suffice; keeping every uuid
/// would grow a long-lived task's stream (in memory and in every
/// compaction) without bound.
pub(crate) const ACKED_UUIDS_KEPT: usize = 1024;

/// One record of the log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WalRecord {
    /// A stream took an update (appended at the stream's tail).
    Update {
        framework_id: FrameworkId,
        executor_id: ExecutorId,
        status: TaskStatus,
    },
    /// The master acknowledged the head of a stream.
    Ack {
        framework_id: FrameworkId,
        task_id: TaskId,
        uuid: String,
    },
    /// A stream ended (its terminal update was acknowledged, or the task
    /// was forgotten): nothing about it needs recovering.
    End {
        framework_id: FrameworkId,
        task_id: TaskId,
    },
    /// A checkpointed task was launched (or re-checkpointed): what a
    /// restarted agent needs to recover it. It starts the task's stream.
    Task {
        framework_id: FrameworkId,
        executor_id: ExecutorId,
        task: Box<TaskInfo>,
        /// The task's own sandbox (command tasks).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        sandbox: Option<PathBuf>,
    },
    /// The whole of one live stream, as written by compaction.
    Stream(StreamState),
}

/// The checkpointed state of one task's stream.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StreamState {
    pub framework_id: FrameworkId,
    pub executor_id: ExecutorId,
    pub task_id: TaskId,
    /// Uuids of the latest acknowledged updates, oldest first (at most
    /// twice [`ACKED_UUIDS_KEPT`]).
    pub acked: Vec<String>,
    /// The latest acknowledged update.
    pub last_acked: Option<TaskStatus>,
    /// Updates not acknowledged yet, oldest first.
    pub pending: Vec<TaskStatus>,
    /// The task, when it was checkpointed in the log (tasks checkpointed
    /// by older agents have a `task.json` instead).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task: Option<Box<TaskInfo>>,
    /// The task's own sandbox, when it has one (command tasks).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<PathBuf>,
}

/// Size thresholds of compaction.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    /// Compact once the file is larger than this (and than twice its size
    /// right after the previous compaction).
    pub compact_bytes: u64,
    /// Reset the file once no stream is live and it is larger than this.
    pub reset_bytes: u64,
}

/// The live streams the log describes.
#[derive(Debug, Default)]
pub struct Streams {
    map: HashMap<(FrameworkId, TaskId), Live>,
}

#[derive(Debug)]
struct Live {
    state: StreamState,
    /// Every uuid the stream took.
    seen: HashSet<String>,
}

/// Counters of the log, for `/state` and tests.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct WalStats {
    /// `fdatasync` calls on the log (compactions not included).
    pub syncs: u64,
    /// Records appended.
    pub records: u64,
    /// Compactions (including resets).
    pub compactions: u64,
    /// Current file size.
    pub bytes: u64,
    /// Times the log was cut at a bad record when opened (0 or 1).
    pub truncations: u64,
    /// Bytes cut off then.
    pub truncated_bytes: u64,
    /// Records cut off then (the bad one and those after it).
    pub truncated_records: u64,
}

/// The open log.
#[derive(Debug)]
pub(crate) struct Wal {
    path: PathBuf,
    file: File,
    streams: Streams,
    limits: Limits,
    /// Size right after the last compaction.
    base: u64,
    /// Appended since the last sync.
    dirty: bool,
    stats: WalStats,
}

// === impl Streams ===

impl Streams {
    /// Applies one record; returns `false` when it changed nothing (a
    /// duplicate uuid, an update after a terminal one, an ack of something
    /// other than the head).
    pub fn apply(&mut self, record: WalRecord) -> bool {
        match record {
            WalRecord::Update {
                framework_id,
                executor_id,
                status,
            } => {
                let Some(uuid) = status.uuid.clone() else {
                    return false;
                };
                let live = self.live(framework_id, executor_id, &status.task_id);
                if live.state.is_terminal() || !live.seen.insert(uuid) {
                    return false;
                }
                live.state.pending.push(status);
                true
            }
            WalRecord::Ack {
                framework_id,
                task_id,
                uuid,
            } => {
                let Some(live) = self.map.get_mut(&(framework_id, task_id)) else {
                    return false;
                };
                if live.state.pending.first().and_then(|s| s.uuid.as_deref()) != Some(&uuid) {
                    return false;
                }
                let head = live.state.pending.remove(0);
                live.state.acked.push(uuid);
                live.state.last_acked = Some(head);
                if live.state.acked.len() > 2 * ACKED_UUIDS_KEPT {
                    let forget = live.state.acked.len() - ACKED_UUIDS_KEPT;
                    for old in live.state.acked.drain(..forget) {
                        live.seen.remove(&old);
                    }
                }
                true
            }
            WalRecord::End {
                framework_id,
                task_id,
            } => self.map.remove(&(framework_id, task_id)).is_some(),
            WalRecord::Task {
                framework_id,
                executor_id,
                task,
                sandbox,
            } => {
                let live = self.live(framework_id, executor_id.clone(), &task.task_id);
                live.state.executor_id = executor_id;
                live.state.task = Some(task);
                live.state.sandbox = sandbox;
                true
            }
            WalRecord::Stream(state) => {
                let seen = state
                    .acked
                    .iter()
                    .cloned()
                    .chain(state.pending.iter().filter_map(|s| s.uuid.clone()))
                    .collect();
                let key = (state.framework_id.clone(), state.task_id.clone());
                self.map.insert(key, Live { state, seen });
                true
            }
        }
    }

    /// Drops the streams of one framework, or all of them.
    pub fn forget(&mut self, framework_id: Option<&FrameworkId>) {
        match framework_id {
            Some(fid) => self.map.retain(|(f, _), _| f != fid),
            None => self.map.clear(),
        }
    }

    /// The stream of a task, started empty if it has none.
    fn live(
        &mut self,
        framework_id: FrameworkId,
        executor_id: ExecutorId,
        task_id: &TaskId,
    ) -> &mut Live {
        let key = (framework_id.clone(), task_id.clone());
        self.map.entry(key).or_insert_with(|| Live {
            state: StreamState {
                framework_id,
                executor_id,
                task_id: task_id.clone(),
                acked: Vec::new(),
                last_acked: None,
                pending: Vec::new(),
                task: None,
                sandbox: None,
            },
            seen: HashSet::default(),
        })
    }

    /// Number of live streams.
    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }

    /// The live streams, in no particular order.
    pub fn states(&self) -> impl Iterator<Item = &StreamState> {
        self.map.values().map(|l| &l.state)
    }
}

// === impl StreamState ===

impl StreamState {
    /// Whether the stream took a terminal update.
    pub(crate) fn is_terminal(&self) -> bool {
        self.latest().is_some_and(|s| s.state.is_terminal())
    }

    /// Whether the stream took no update yet (it holds only its task).
    pub(crate) fn has_no_updates(&self) -> bool {
        self.pending.is_empty() && self.last_acked.is_none() && self.acked.is_empty()
    }

    /// The newest update of the stream, acknowledged or not.
    pub(crate) fn latest(&self) -> Option<&TaskStatus> {
        self.pending.last().or(self.last_acked.as_ref())
    }

    /// Every uuid the stream took.
    pub(crate) fn seen(&self) -> HashSet<String> {
        self.acked
            .iter()
            .cloned()
            .chain(self.pending.iter().filter_map(|s| s.uuid.clone()))
            .collect()
    }
}

// === impl Wal ===

impl Wal {
    /// Opens (or creates) the log at `path`, reads back every stream (up
    /// to the first bad record, see [`decode`]) and compacts it into a
    /// fresh segment.
    pub(crate) fn open(path: &Path, limits: Limits) -> io::Result<Wal> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let decoded = read(path)?;
        let file = OpenOptions::new().create(true).append(true).open(path)?;
        let mut wal = Wal {
            path: path.to_path_buf(),
            file,
            streams: decoded.streams,
            limits,
            base: 0,
            dirty: false,
            stats: WalStats {
                truncations: u64::from(decoded.truncated_bytes > 0),
                truncated_bytes: decoded.truncated_bytes,
                truncated_records: decoded.damaged_records,
                ..WalStats::default()
            },
        };
        // The new segment holds only the good records: nothing is ever
        // appended after a bad one.
        wal.compact()?;
        Ok(wal)
    }

    /// The live streams.
    pub(crate) fn streams(&self) -> &Streams {
        &self.streams
    }

    /// The counters.
    pub(crate) fn stats(&self) -> WalStats {
        self.stats
    }

    /// Applies `records` to the live state and writes them with one
    /// `write`. Not durable until [`Wal::sync`].
    pub(crate) fn append(&mut self, records: Vec<WalRecord>) -> io::Result<()> {
        if records.is_empty() {
            return Ok(());
        }
        let mut buf = Vec::with_capacity(records.len() * 512);
        for record in records {
            encode_record(&mut buf, &record)?;
            self.stats.records += 1;
            self.streams.apply(record);
        }
        self.dirty = true;
        let written = self.file.write_all(&buf);
        self.stats.bytes += buf.len() as u64;
        if let Err(e) = written {
            // The file may now end in a fragment: rewrite it from the live
            // state so later appends stay readable.
            let _ = self.compact();
            return Err(e);
        }
        Ok(())
    }

    /// Makes every append durable (one `fdatasync`), then compacts when
    /// the file has grown past its limits.
    pub(crate) fn sync(&mut self) -> io::Result<()> {
        if self.dirty {
            self.file.sync_data()?;
            self.dirty = false;
            self.stats.syncs += 1;
        }
        let grown = self.stats.bytes > self.limits.compact_bytes.max(self.base * 2);
        let idle = self.streams.len() == 0 && self.stats.bytes > self.limits.reset_bytes;
        if grown || idle {
            if let Err(e) = self.compact() {
                // The old segment is intact and durable; try again later.
                tracing::warn!(error = %e, wal = %self.path.display(), "status update log compaction failed");
            }
        }
        Ok(())
    }

    /// Drops the streams of one framework (or all) and compacts at once.
    pub(crate) fn forget(&mut self, framework_id: Option<&FrameworkId>) -> io::Result<()> {
        self.streams.forget(framework_id);
        self.compact()
    }

    /// Writes the live state to a new segment and renames it over the log.
    fn compact(&mut self) -> io::Result<()> {
        let started = std::time::Instant::now();
        let tmp = self.path.with_extension("wal.tmp");
        let mut buf = Vec::new();
        for state in self.streams.states() {
            encode_record(&mut buf, &WalRecord::Stream(state.clone()))?;
        }
        {
            let mut f = File::create(&tmp)?;
            f.write_all(&buf)?;
            f.sync_all()?;
        }
        std::fs::rename(&tmp, &self.path)?;
        if let Some(dir) = self.path.parent() {
            File::open(dir)?.sync_all()?;
        }
        self.file = OpenOptions::new().append(true).open(&self.path)?;
        self.dirty = false;
        self.base = buf.len() as u64;
        self.stats.bytes = self.base;
        self.stats.compactions += 1;
        tracing::debug!(
            wal = %self.path.display(),
            streams = self.streams.len(),
            bytes = self.base,
            took_ms = started.elapsed().as_secs_f64() * 1e3,
            "status update log compacted"
        );
        Ok(())
    }
}

/// Reads a log (see [`decode`]). A missing file is empty.
fn read(path: &Path) -> io::Result<Decoded> {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(e),
    };
    Ok(decode(&bytes, &path.display().to_string()))
}

/// What a log's bytes hold, and what of them was dropped.
pub(crate) struct Decoded {
    /// The live streams the records before the first bad one describe.
    pub streams: Streams,
    /// Bytes dropped: from the first bad record to the end (0: none).
    pub truncated_bytes: u64,
    /// Records dropped: the first bad one and every one after it.
    pub damaged_records: u64,
}

/// The live streams a log's bytes describe (`origin` names the log in
/// what is logged), read up to the first bad record: one that fails its
/// checksum, does not parse, or has no newline (torn). That record ends
/// the log and everything from it on is dropped: a crash before the sync
/// may persist a later page of an append and lose an earlier one, so the
/// records after a bad one were never durable as a whole and must not be
/// applied out of order. A line without a checksum (written before
/// checksums existed) is read if it parses.
pub(crate) fn decode(bytes: &[u8], origin: &str) -> Decoded {
    let mut streams = Streams::default();
    let mut offset = 0;
    let mut damage = None;
    while offset < bytes.len() {
        let Some(len) = bytes[offset..].iter().position(|b| *b == b'\n') else {
            damage = Some("no newline (a torn write)".to_string());
            break;
        };
        let line = &bytes[offset..offset + len];
        if !line.is_empty() {
            let record = split_checksum(line).and_then(|json| {
                serde_json::from_slice::<WalRecord>(json).map_err(|e| e.to_string())
            });
            match record {
                Ok(record) => {
                    streams.apply(record);
                }
                Err(e) => {
                    damage = Some(e);
                    break;
                }
            }
        }
        offset += len + 1;
    }
    let dropped = &bytes[offset..];
    let damaged_records = dropped
        .split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .count() as u64;
    if let Some(reason) = damage {
        if damaged_records > 1 {
            tracing::error!(
                wal = %origin,
                offset,
                bytes = dropped.len(),
                records = damaged_records,
                %reason,
                "status update log damaged: truncating it at its first bad record, dropping it and every record after it"
            );
        } else {
            tracing::warn!(
                wal = %origin,
                offset,
                bytes = dropped.len(),
                %reason,
                "dropping the bad last record of the status update log (a write torn by a crash)"
            );
        }
    }
    Decoded {
        streams,
        truncated_bytes: dropped.len() as u64,
        damaged_records,
    }
}

/// The bytes `records` take in a log, one line each (for the
/// simulation's disk and tests; the log itself encodes as it appends).
#[cfg(any(test, feature = "sim"))]
pub(crate) fn encode(records: &[WalRecord]) -> io::Result<Vec<u8>> {
    let mut buf = Vec::with_capacity(records.len() * 512);
    for record in records {
        encode_record(&mut buf, record)?;
    }
    Ok(buf)
}

/// Appends one record line: its JSON, a tab, its CRC-32, a newline.
fn encode_record(buf: &mut Vec<u8>, record: &WalRecord) -> io::Result<()> {
    let start = buf.len();
    serde_json::to_writer(&mut *buf, record).map_err(io::Error::other)?;
    let crc = crc32(&buf[start..]);
    buf.push(b'\t');
    buf.extend_from_slice(format!("{crc:08x}").as_bytes());
    buf.push(b'\n');
    Ok(())
}

/// The JSON of a record line (without its newline), checked against its
/// CRC. A line with no tab is a record written before checksums; JSON
/// text never holds a raw tab, so the last tab is the separator.
fn split_checksum(line: &[u8]) -> Result<&[u8], String> {
    let Some(tab) = line.iter().rposition(|b| *b == b'\t') else {
        return Ok(line);
    };
    let (json, sum) = (&line[..tab], &line[tab + 1..]);
    let expected = std::str::from_utf8(sum)
        .ok()
        .filter(|s| s.len() == 8)
        .and_then(|s| u32::from_str_radix(s, 16).ok())
        .ok_or_else(|| "malformed checksum".to_string())?;
    let actual = crc32(json);
    if actual != expected {
        return Err(format!(
            "checksum mismatch (stored {expected:08x}, computed {actual:08x})"
        ));
    }
    Ok(json)
}

/// CRC-32 (IEEE 802.3, reflected, as zlib computes it).
fn crc32(bytes: &[u8]) -> u32 {
    crc32fast::hash(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use agora_proto::{Source, TaskState};

    #[test]
    fn a_long_stream_keeps_a_bounded_uuid_history() {
        let mut s = Streams::default();
        let n = 3 * ACKED_UUIDS_KEPT;
        for i in 0..n {
            let uuid = format!("u{i}");
            assert!(s.apply(update("t", TaskState::Running, &uuid)));
            assert!(s.apply(ack("t", &uuid)));
        }
        let live = s.map.values().next().unwrap();
        assert!(live.state.acked.len() <= 2 * ACKED_UUIDS_KEPT);
        assert!(live.state.acked.len() >= ACKED_UUIDS_KEPT);
        assert_eq!(live.seen.len(), live.state.acked.len());
        assert_eq!(
            live.state.acked.last().map(String::as_str),
            Some(format!("u{}", n - 1).as_str())
        );
        // The newest are still recognised as duplicates.
        assert!(!s.apply(update("t", TaskState::Running, &format!("u{}", n - 5))));
    }

    #[test]
    fn crc32_matches_the_standard_check_value() {
        assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
        assert_eq!(crc32(b""), 0);
    }

    #[test]
    fn a_damaged_record_ends_the_log_and_later_ones_are_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(WAL_FILE);
        let mut wal = Wal::open(&path, BIG).unwrap();
        wal.append(vec![
            update("t", TaskState::Running, "u1"),
            update("t", TaskState::Running, "u2"),
            update("t", TaskState::Finished, "u3"),
            update("b", TaskState::Running, "b1"),
        ])
        .unwrap();
        wal.sync().unwrap();
        drop(wal);
        // Flip one byte inside the second record's JSON, keeping the line
        // well formed: only the checksum can tell.
        let mut bytes = std::fs::read(&path).unwrap();
        let second = bytes.iter().position(|b| *b == b'\n').unwrap() + 1;
        let at = second + bytes[second..].windows(2).position(|w| w == b"u2").unwrap();
        bytes[at + 1] = b'7';
        std::fs::write(&path, &bytes).unwrap();

        let mut wal = Wal::open(&path, BIG).unwrap();
        // u3 and b1 follow the damage: not applied (u3 would have come
        // before u2).
        assert_eq!(wal.streams().len(), 1);
        assert_eq!(uuids(stream(wal.streams(), "t")), vec!["u1"]);
        let stats = wal.stats();
        assert_eq!(stats.truncations, 1);
        assert_eq!(stats.truncated_bytes, (bytes.len() - second) as u64);
        assert_eq!(stats.truncated_records, 3);
        // Compacted at open: appends follow the good records, and a
        // reopen reads them all with nothing dropped.
        wal.append(vec![update("t", TaskState::Running, "u4")])
            .unwrap();
        wal.sync().unwrap();
        drop(wal);
        let wal = Wal::open(&path, BIG).unwrap();
        assert_eq!(uuids(stream(wal.streams(), "t")), vec!["u1", "u4"]);
        assert_eq!(wal.stats().truncations, 0);
    }

    #[test]
    fn decode_counts_what_it_drops() {
        let good = encode(&[
            update("t", TaskState::Running, "u1"),
            update("t", TaskState::Running, "u2"),
        ])
        .unwrap();
        let all = decode(&good, "test");
        assert_eq!((all.truncated_bytes, all.damaged_records), (0, 0));
        assert_eq!(uuids(stream(&all.streams, "t")), vec!["u1", "u2"]);
        // A torn tail: the last record without its newline.
        let first = good.iter().position(|b| *b == b'\n').unwrap() + 1;
        let torn = decode(&good[..good.len() - 1], "test");
        assert_eq!(torn.truncated_bytes, (good.len() - 1 - first) as u64);
        assert_eq!(torn.damaged_records, 1);
        assert_eq!(uuids(stream(&torn.streams, "t")), vec!["u1"]);
        // Garbage (a zeroed page) in the middle: the rest is dropped.
        let mut zeroed = good.clone();
        zeroed[first..first + 10].fill(0);
        let d = decode(&zeroed, "test");
        assert_eq!(d.truncated_bytes, (good.len() - first) as u64);
        assert_eq!(d.damaged_records, 1);
        assert_eq!(uuids(stream(&d.streams, "t")), vec!["u1"]);
    }

    #[test]
    fn legacy_lines_without_a_checksum_are_read() {
        let mut bytes = Vec::new();
        for record in [
            update("c", TaskState::Running, "c1"),
            update("c", TaskState::Running, "c2"),
        ] {
            bytes.extend_from_slice(&serde_json::to_vec(&record).unwrap());
            bytes.push(b'\n');
        }
        // ...followed by a record of a newer agent, with its checksum.
        bytes.extend_from_slice(&encode(&[ack("c", "c1")]).unwrap());
        let d = decode(&bytes, "test");
        assert_eq!((d.truncated_bytes, d.damaged_records), (0, 0));
        let c = stream(&d.streams, "c");
        assert_eq!(uuids(c), vec!["c2"]);
        assert_eq!(c.acked, vec!["c1"]);
    }

    fn status(task: &str, state: TaskState, uuid: &str) -> TaskStatus {
        let mut s = TaskStatus::new(TaskId::new(task), state, Source::SourceExecutor);
        s.uuid = Some(uuid.into());
        s
    }

    fn update(task: &str, state: TaskState, uuid: &str) -> WalRecord {
        WalRecord::Update {
            framework_id: FrameworkId::new("f"),
            executor_id: ExecutorId::new("e"),
            status: status(task, state, uuid),
        }
    }

    fn ack(task: &str, uuid: &str) -> WalRecord {
        WalRecord::Ack {
            framework_id: FrameworkId::new("f"),
            task_id: TaskId::new(task),
            uuid: uuid.into(),
        }
    }

    fn end(task: &str) -> WalRecord {
        WalRecord::End {
            framework_id: FrameworkId::new("f"),
            task_id: TaskId::new(task),
        }
    }

    const BIG: Limits = Limits {
        compact_bytes: 1 << 30,
        reset_bytes: 1 << 30,
    };

    fn uuids(s: &StreamState) -> Vec<&str> {
        s.pending.iter().filter_map(|p| p.uuid.as_deref()).collect()
    }

    fn stream<'a>(w: &'a Streams, task: &str) -> &'a StreamState {
        w.states()
            .find(|s| s.task_id.as_str() == task)
            .unwrap_or_else(|| panic!("no stream {task}"))
    }

    #[test]
    fn records_build_streams_with_dedupe_and_terminal() {
        let mut s = Streams::default();
        assert!(s.apply(update("t", TaskState::Running, "u1")));
        assert!(!s.apply(update("t", TaskState::Running, "u1")));
        assert!(s.apply(update("t", TaskState::Finished, "u2")));
        assert!(!s.apply(update("t", TaskState::Failed, "u3")));
        assert!(!s.apply(ack("t", "u2")), "only the head can be acked");
        assert!(s.apply(ack("t", "u1")));
        let st = stream(&s, "t");
        assert_eq!(uuids(st), vec!["u2"]);
        assert_eq!(st.acked, vec!["u1"]);
        assert!(st.is_terminal());
        assert_eq!(st.seen().len(), 2);
        assert!(s.apply(end("t")));
        assert_eq!(s.len(), 0);
    }

    #[test]
    fn one_batch_of_many_appends_takes_one_fsync() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(WAL_FILE);
        let mut wal = Wal::open(&path, BIG).unwrap();
        let records: Vec<_> = (0..500)
            .map(|i| update(&format!("t{i}"), TaskState::Running, &format!("u{i}")))
            .collect();
        wal.append(records).unwrap();
        wal.sync().unwrap();
        assert_eq!(wal.stats().syncs, 1);
        assert_eq!(wal.stats().records, 500);
        // Nothing appended: no sync.
        wal.sync().unwrap();
        assert_eq!(wal.stats().syncs, 1);
        drop(wal);
        let wal = Wal::open(&path, BIG).unwrap();
        assert_eq!(wal.streams().len(), 500);
    }

    #[test]
    fn torn_tail_is_ignored_and_overwritten() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(WAL_FILE);
        let mut wal = Wal::open(&path, BIG).unwrap();
        wal.append(vec![
            update("t", TaskState::Running, "u1"),
            update("t", TaskState::Running, "u2"),
        ])
        .unwrap();
        wal.sync().unwrap();
        drop(wal);
        // A crash in the middle of the next append.
        let mut f = OpenOptions::new().append(true).open(&path).unwrap();
        let line = serde_json::to_vec(&update("t", TaskState::Finished, "u3")).unwrap();
        f.write_all(&line[..line.len() / 2]).unwrap();
        drop(f);
        let mut wal = Wal::open(&path, BIG).unwrap();
        assert_eq!(uuids(stream(wal.streams(), "t")), vec!["u1", "u2"]);
        assert_eq!(wal.stats().truncations, 1);
        assert_eq!(wal.stats().truncated_bytes, (line.len() / 2) as u64);
        assert_eq!(wal.stats().truncated_records, 1);
        // The fragment is gone: a new append is readable after reopening.
        wal.append(vec![update("t", TaskState::Finished, "u3")])
            .unwrap();
        wal.sync().unwrap();
        drop(wal);
        let wal = Wal::open(&path, BIG).unwrap();
        assert_eq!(uuids(stream(wal.streams(), "t")), vec!["u1", "u2", "u3"]);
        assert_eq!(wal.stats().truncations, 0);
    }

    #[test]
    fn compaction_preserves_live_streams_and_bounds_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(WAL_FILE);
        let limits = Limits {
            compact_bytes: 64 << 10,
            reset_bytes: 1 << 10,
        };
        let mut wal = Wal::open(&path, limits).unwrap();
        // A long-lived stream with acked and pending updates...
        wal.append(vec![
            update("live", TaskState::Running, "l1"),
            update("live", TaskState::Running, "l2"),
            ack("live", "l1"),
        ])
        .unwrap();
        // ...and thousands of short streams that come and go.
        for i in 0..2000 {
            let t = format!("t{i}");
            wal.append(vec![
                update(&t, TaskState::Running, &format!("{t}a")),
                ack(&t, &format!("{t}a")),
                update(&t, TaskState::Finished, &format!("{t}b")),
                ack(&t, &format!("{t}b")),
                end(&t),
            ])
            .unwrap();
            wal.sync().unwrap();
            assert!(
                std::fs::metadata(&path).unwrap().len() <= 2 * limits.compact_bytes,
                "log grew without bound"
            );
        }
        assert!(wal.stats().compactions > 1);
        drop(wal);
        let wal = Wal::open(&path, limits).unwrap();
        assert_eq!(wal.streams().len(), 1);
        let live = stream(wal.streams(), "live");
        assert_eq!(uuids(live), vec!["l2"]);
        assert_eq!(live.acked, vec!["l1"]);
        assert_eq!(
            live.last_acked.as_ref().unwrap().uuid.as_deref(),
            Some("l1")
        );
        assert!(live.seen().contains("l1"));
    }

    #[test]
    fn empty_log_is_reset_and_forget_compacts() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(WAL_FILE);
        let limits = Limits {
            compact_bytes: 1 << 30,
            reset_bytes: 0,
        };
        let mut wal = Wal::open(&path, limits).unwrap();
        wal.append(vec![
            update("t", TaskState::Finished, "u1"),
            ack("t", "u1"),
            end("t"),
        ])
        .unwrap();
        wal.sync().unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 0);
        wal.append(vec![update("t2", TaskState::Running, "u2")])
            .unwrap();
        wal.sync().unwrap();
        wal.forget(Some(&FrameworkId::new("f"))).unwrap();
        assert_eq!(wal.streams().len(), 0);
        drop(wal);
        assert_eq!(Wal::open(&path, limits).unwrap().streams().len(), 0);
    }
}
