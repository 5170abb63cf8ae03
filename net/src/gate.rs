//! The bounds of [`crate::body`] for WebSocket messages. Once a handler
//! says a connection carries a WebSocket
//! ([`crate::Connection::meter_messages`]), the gate follows the frames
//! the peer sends and charges each to the process's budget of body
//! memory (`--max-http-body-memory`) for its declared size, header
//! included, *before* the last byte of its header reaches the WebSocket:
//! the WebSocket reserves room for a frame's declared size once it has
//! its header, so a frame the budget has no room for is held back (its
//! header unfinished, the bytes after it kept by the gate) and its read
//! waits, as a request body waits for room. What the gate keeps is at
//! most a header while the budget lacks room for a frame of the largest
//! size (reads then stop a header past the frame being passed), else at
//! most one read. Frames of
//! at most 64 KiB draw on the reserve for small bodies, larger ones on
//! the rest, so a flood of large messages leaves room for small calls.
//!
//! A message in progress (a frame begun, a fragmented message not
//! finished, a frame waiting for room) must be whole within the body
//! deadline for its declared size (`--http-body-timeout` plus a second
//! per `--http-body-min-rate` bytes), counted while the WebSocket waits
//! for the peer (time the handler spends elsewhere is not the peer's);
//! else the connection is closed
//! ([`crate::conn::CloseReason::MessageTimeout`]). The room of whole
//! messages is given back when the handler has taken them
//! ([`crate::Connection::message_done`]), a fragmented message's only
//! once its last frame came; closing the connection gives back all.
//!
//! Bytes the HTTP server read past the upgrade request (a client that
//! sent frames before the `101`) reach the WebSocket without passing the
//! gate; the gate then sees frames that are not there, but every byte it
//! passes is still charged, and nothing it holds outlives the deadline.
//!
//! The fast path (a whole small frame in one read) costs a look at its
//! header, an uncontended semaphore acquire and release, no clock and no
//! timer.

use std::future::Future as _;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll};

use tokio::io::ReadBuf;
use tokio::sync::Semaphore;
use tokio::time::{Instant, Sleep};
use tokio_util::sync::PollSemaphore;

use crate::body::{Bodies, SMALL_BODY};

/// The longest frame header (2 bytes, an 8-byte length, a 4-byte mask).
const MAX_HEADER: usize = 14;

/// A connection's metering of its WebSocket messages.
pub(crate) struct Gate {
    bodies: Arc<Bodies>,
    /// The WebSocket's limit on a frame's payload: a frame declaring more
    /// is refused by it from its header, and passes uncharged.
    max_frame: u64,
    /// Room in the large pool below which reads are cut short.
    scarce: usize,
    state: Mutex<Metered>,
}

/// What a metered read came to.
pub(crate) enum Gated<T> {
    /// The read's own outcome.
    Read(T),
    /// The message in progress outstayed its deadline: close the
    /// connection.
    Expired,
}

/// Room held in the two pools.
#[derive(Default, Clone, Copy)]
struct Room {
    small: usize,
    large: usize,
}

struct Metered {
    small: PollSemaphore,
    large: PollSemaphore,
    /// Room held in all (permits taken from the pools and forgotten:
    /// given back by count).
    held: Room,
    /// Of it, for messages passed whole (given back by `message_done`).
    complete: Room,
    /// For the frames of the fragmented data message in progress.
    fragments: Room,
    /// For the frame being passed.
    frame: Room,
    /// The header being read.
    head: [u8; MAX_HEADER],
    head_len: usize,
    /// Payload bytes of the frame being passed still to come.
    left: u64,
    /// The frame being passed: a control frame, and its FIN bit.
    control: bool,
    fin: bool,
    /// A data frame without FIN passed: a fragmented message goes on.
    fragmented: bool,
    /// A frame's size waiting for room (its header's last byte held).
    waiting: Option<usize>,
    /// Bytes read and not yet passed, from `stash_at`.
    stash: Vec<u8>,
    stash_at: usize,
    /// When the message in progress began to wait for the peer (set
    /// lazily: when a read first waits with one in progress).
    started: Option<Instant>,
    /// When a read last returned with a message in progress: the time
    /// until the next read is the handler's, not the peer's.
    away: Option<Instant>,
    /// The deadline's timer, once a message spanned reads.
    sleep: Option<Pin<Box<Sleep>>>,
}

/// Where passing a run of bytes stopped.
enum Scan {
    /// All of them may pass.
    All,
    /// Only the first `n`: the next frame waits for room.
    Cut(usize),
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A frame header's length, once its first two bytes are known.
fn header_len(head: &[u8]) -> usize {
    let ext = match head[1] & 0x7f {
        126 => 2,
        127 => 8,
        _ => 0,
    };
    let mask = if head[1] & 0x80 != 0 { 4 } else { 0 };
    2 + ext + mask
}

/// A whole frame header's payload length.
fn payload_len(head: &[u8]) -> u64 {
    match head[1] & 0x7f {
        126 => u64::from(u16::from_be_bytes([head[2], head[3]])),
        127 => u64::from_be_bytes(head[2..10].try_into().unwrap_or([0xff; 8])),
        n => u64::from(n),
    }
}

// === impl Gate ===

impl Gate {
    pub(crate) fn new(bodies: Arc<Bodies>, max_frame: usize) -> Gate {
        let (small, large) = bodies.pools();
        Gate {
            bodies,
            max_frame: max_frame as u64,
            scarce: max_frame.saturating_add(MAX_HEADER),
            state: Mutex::new(Metered {
                small: PollSemaphore::new(small),
                large: PollSemaphore::new(large),
                held: Room::default(),
                complete: Room::default(),
                fragments: Room::default(),
                frame: Room::default(),
                head: [0; MAX_HEADER],
                head_len: 0,
                left: 0,
                control: false,
                fin: false,
                fragmented: false,
                waiting: None,
                stash: Vec::new(),
                stash_at: 0,
                started: None,
                away: None,
                sleep: None,
            }),
        }
    }

    /// Reads through `read` into `buf` (or from what the gate kept), and
    /// passes what the budget has room for (see the module documentation).
    pub(crate) fn poll_read<E>(
        &self,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
        read: impl FnOnce(&mut Context<'_>, &mut ReadBuf<'_>) -> Poll<Result<(), E>>,
    ) -> Poll<Gated<Result<(), E>>> {
        if buf.remaining() == 0 {
            return Poll::Ready(Gated::Read(Ok(())));
        }
        let mut m = lock(&self.state);
        let m = &mut *m;
        if let Some(started) = m.started {
            let now = Instant::now();
            if let Some(away) = m.away.take() {
                m.started = Some(started + now.saturating_duration_since(away));
            }
            if now >= self.deadline(m) {
                return Poll::Ready(self.expire(m));
            }
        }
        let before = buf.filled().len();
        let passed = if m.stash_at < m.stash.len() {
            let n = (m.stash.len() - m.stash_at).min(buf.remaining());
            let at = m.stash_at;
            let stash = std::mem::take(&mut m.stash);
            let scan = self.scan(cx, m, &stash[at..at + n]);
            let passed = match scan {
                Scan::All => n,
                Scan::Cut(k) => k,
            };
            buf.put_slice(&stash[at..at + passed]);
            m.stash = stash;
            m.stash_at += passed;
            if m.stash_at == m.stash.len() {
                m.stash.clear();
                m.stash_at = 0;
            }
            passed
        } else {
            // While a frame of the largest size would not find room, a
            // read stops a header past the frame being passed: a frame
            // that must wait then leaves at most its header with the gate.
            let limit = if self.bodies.large_pool().available_permits() < self.scarce {
                usize::try_from(m.left)
                    .unwrap_or(usize::MAX)
                    .saturating_add(MAX_HEADER)
            } else {
                usize::MAX
            };
            let polled = if buf.remaining() <= limit {
                read(cx, buf)
            } else {
                let mut cut = ReadBuf::new(buf.initialize_unfilled_to(limit));
                let polled = read(cx, &mut cut);
                let n = cut.filled().len();
                buf.advance(n);
                polled
            };
            match polled {
                Poll::Ready(Ok(())) => {}
                Poll::Ready(Err(e)) => return Poll::Ready(Gated::Read(Err(e))),
                Poll::Pending => return self.pending(cx, m),
            }
            let n = buf.filled().len() - before;
            if n == 0 {
                return Poll::Ready(Gated::Read(Ok(())));
            }
            let scan = self.scan(cx, m, &buf.filled()[before..]);
            match scan {
                Scan::All => n,
                Scan::Cut(k) => {
                    m.stash.extend_from_slice(&buf.filled()[before + k..]);
                    buf.set_filled(before + k);
                    k
                }
            }
        };
        if passed == 0 {
            // Nothing may pass (an empty read is the end to the reader):
            // the wait for room woke nothing yet.
            return self.pending(cx, m);
        }
        if m.started.is_some() {
            m.away = Some(Instant::now());
        }
        Poll::Ready(Gated::Read(Ok(())))
    }

    /// The handler has a whole message: the room of the messages passed
    /// whole is given back; a message still in progress keeps its own.
    pub(crate) fn message_done(&self) {
        let mut m = lock(&self.state);
        let complete = std::mem::take(&mut m.complete);
        self.give_back(&mut m, complete);
        if m.idle() {
            m.started = None;
            m.away = None;
        }
    }

    #[cfg(test)]
    fn stash_len(&self) -> usize {
        let m = lock(&self.state);
        m.stash.len() - m.stash_at
    }

    /// The connection closed: everything is given back.
    pub(crate) fn closed(&self) {
        let mut m = lock(&self.state);
        self.release_all(&mut m);
        m.sleep = None;
        m.stash = Vec::new();
    }

    /// Follows the frames in `bytes`, charging each as its header
    /// completes; cut before the last byte of a header there is no room
    /// for.
    fn scan(&self, cx: &mut Context<'_>, m: &mut Metered, bytes: &[u8]) -> Scan {
        let mut i = 0;
        while i < bytes.len() {
            if m.left > 0 {
                let n = m.left.min((bytes.len() - i) as u64);
                m.left -= n;
                i += n as usize;
                if m.left == 0 {
                    m.frame_ended();
                }
                continue;
            }
            m.head[m.head_len] = bytes[i];
            m.head_len += 1;
            if m.head_len < 2 || m.head_len < header_len(&m.head) {
                i += 1;
                continue;
            }
            let payload = payload_len(&m.head);
            let size = m.head_len as u64 + payload;
            if payload <= self.max_frame && !self.charge(cx, m, size) {
                m.head_len -= 1;
                return Scan::Cut(i);
            }
            if payload > self.max_frame {
                m.frame = Room::default();
            }
            m.control = m.head[0] & 0x08 != 0;
            m.fin = m.head[0] & 0x80 != 0;
            m.head_len = 0;
            m.left = payload;
            i += 1;
            if payload == 0 {
                m.frame_ended();
            }
        }
        Scan::All
    }

    /// Takes room for a frame of `size` bytes (header and payload); false
    /// while there is none (the read is woken when there is).
    fn charge(&self, cx: &mut Context<'_>, m: &mut Metered, size: u64) -> bool {
        // Larger than any permit (and than the WebSocket's limit).
        let Ok(permits) = u32::try_from(size) else {
            m.waiting = None;
            m.frame = Room::default();
            return true;
        };
        let size = size as usize;
        let small = size <= SMALL_BODY;
        let pool: &Semaphore = if small {
            self.bodies.small_pool()
        } else {
            self.bodies.large_pool()
        };
        let taken = m.waiting.is_none()
            && match pool.try_acquire_many(permits) {
                Ok(permit) => {
                    permit.forget();
                    true
                }
                Err(_) => false,
            };
        if !taken {
            m.waiting = Some(size);
            let pool = if small { &mut m.small } else { &mut m.large };
            match pool.poll_acquire_many(cx, permits) {
                Poll::Ready(Some(permit)) => permit.forget(),
                // The pools are never closed; were one, the frame passes
                // unmetered rather than never.
                Poll::Ready(None) => {
                    m.waiting = None;
                    m.frame = Room::default();
                    return true;
                }
                Poll::Pending => return false,
            }
        }
        m.waiting = None;
        m.frame = if small {
            m.held.small += size;
            Room {
                small: size,
                large: 0,
            }
        } else {
            m.held.large += size;
            Room {
                small: 0,
                large: size,
            }
        };
        self.bodies
            .stats()
            .body_bytes
            .fetch_add(size as u64, Ordering::Relaxed);
        true
    }

    /// A read waits (for room or bytes): with a message in progress its
    /// deadline's timer runs.
    fn pending<T>(&self, cx: &mut Context<'_>, m: &mut Metered) -> Poll<Gated<T>> {
        if m.idle() {
            return Poll::Pending;
        }
        if m.started.is_none() {
            m.started = Some(Instant::now());
        }
        let deadline = self.deadline(m);
        let sleep = match &mut m.sleep {
            Some(sleep) => {
                if sleep.deadline() != deadline {
                    sleep.as_mut().reset(deadline);
                }
                sleep
            }
            None => m.sleep.insert(Box::pin(tokio::time::sleep_until(deadline))),
        };
        match sleep.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(self.expire(m)),
            Poll::Pending => Poll::Pending,
        }
    }

    /// The time the message in progress has: the body deadline for what
    /// is held and waited for.
    fn deadline(&self, m: &Metered) -> Instant {
        let bytes = m.held.small + m.held.large + m.waiting.unwrap_or(0);
        m.started.unwrap_or_else(Instant::now) + self.bodies.allowed(bytes)
    }

    fn expire<T>(&self, m: &mut Metered) -> Gated<T> {
        let held = m.held.small + m.held.large;
        let allowed = self.bodies.allowed(held + m.waiting.unwrap_or(0));
        tracing::info!(
            held,
            waiting = m.waiting.unwrap_or(0),
            ?allowed,
            "WebSocket message not received in time; closing the connection"
        );
        self.bodies
            .stats()
            .closed_message_timeout
            .fetch_add(1, Ordering::Relaxed);
        // The room stays held until the connection is dropped, with the
        // WebSocket's buffers: given back now, another frame could fill
        // its room before this one's memory is freed. A wait for room
        // ends now (it holds what it was given so far until dropped).
        m.waiting = None;
        m.started = None;
        let (small, large) = self.bodies.pools();
        m.small = PollSemaphore::new(small);
        m.large = PollSemaphore::new(large);
        Gated::Expired
    }

    fn give_back(&self, m: &mut Metered, room: Room) {
        let small = room.small.min(m.held.small);
        let large = room.large.min(m.held.large);
        if small > 0 {
            self.bodies.small_pool().add_permits(small);
            m.held.small -= small;
        }
        if large > 0 {
            self.bodies.large_pool().add_permits(large);
            m.held.large -= large;
        }
        let given = small + large;
        if given > 0 {
            self.bodies
                .stats()
                .body_bytes
                .fetch_sub(given as u64, Ordering::Relaxed);
        }
    }

    fn release_all(&self, m: &mut Metered) {
        let held = m.held;
        self.give_back(m, held);
        m.held = Room::default();
        m.complete = Room::default();
        m.fragments = Room::default();
        m.frame = Room::default();
        m.waiting = None;
        m.started = None;
        m.away = None;
        // A wait for room holds what it was given so far until dropped.
        let (small, large) = self.bodies.pools();
        m.small = PollSemaphore::new(small);
        m.large = PollSemaphore::new(large);
    }
}

impl Drop for Gate {
    fn drop(&mut self) {
        self.closed();
    }
}

// === impl Metered ===

impl Metered {
    /// No message in progress and no room held.
    fn idle(&self) -> bool {
        self.held.small == 0
            && self.held.large == 0
            && self.head_len == 0
            && self.left == 0
            && self.waiting.is_none()
            && !self.fragmented
    }

    /// The frame being passed has all come.
    fn frame_ended(&mut self) {
        let frame = std::mem::take(&mut self.frame);
        if self.control {
            self.complete.add(frame);
        } else if self.fin {
            let fragments = std::mem::take(&mut self.fragments);
            self.complete.add(fragments);
            self.complete.add(frame);
            self.fragmented = false;
        } else {
            self.fragments.add(frame);
            self.fragmented = true;
        }
    }
}

// === impl Room ===

impl Room {
    fn add(&mut self, other: Room) {
        self.small += other.small;
        self.large += other.large;
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::limits::Limits;

    fn gate(memory: usize) -> (Arc<Bodies>, Gate) {
        let limits = Limits {
            body_timeout: Duration::from_millis(500),
            body_min_rate: 1024 * 1024,
            body_memory: memory,
            ..Limits::default()
        };
        let bodies = Bodies::new(&limits, Arc::default());
        (bodies.clone(), Gate::new(bodies, 16 << 20))
    }

    /// A masked client frame: header and `len` bytes of payload.
    fn frame(fin: bool, opcode: u8, len: usize) -> Vec<u8> {
        let mut f = vec![if fin { 0x80 } else { 0 } | opcode];
        if len < 126 {
            f.push(0x80 | len as u8);
        } else if len <= 0xffff {
            f.push(0x80 | 126);
            f.extend_from_slice(&(len as u16).to_be_bytes());
        } else {
            f.push(0x80 | 127);
            f.extend_from_slice(&(len as u64).to_be_bytes());
        }
        f.extend_from_slice(&[1, 2, 3, 4]);
        f.extend(std::iter::repeat_n(b'x', len));
        f
    }

    /// Bytes the peer sent, handed out as asked (then pending).
    #[derive(Default)]
    struct Peer {
        sent: Vec<u8>,
        at: usize,
    }

    impl Peer {
        fn send(&mut self, bytes: &[u8]) {
            self.sent.extend_from_slice(bytes);
        }

        fn read(&mut self, buf: &mut ReadBuf<'_>) -> Poll<Result<(), ()>> {
            let n = (self.sent.len() - self.at).min(buf.remaining());
            if n == 0 {
                return Poll::Pending;
            }
            buf.put_slice(&self.sent[self.at..self.at + n]);
            self.at += n;
            Poll::Ready(Ok(()))
        }
    }

    /// What one poll of a read of up to `len` bytes passed.
    fn read_once(gate: &Gate, peer: &mut Peer, len: usize) -> Poll<Gated<usize>> {
        let waker = futures::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        let mut storage = vec![0u8; len];
        let mut buf = ReadBuf::new(&mut storage);
        match gate.poll_read(&mut cx, &mut buf, |_, b| peer.read(b)) {
            Poll::Ready(Gated::Read(Ok(()))) => Poll::Ready(Gated::Read(buf.filled().len())),
            Poll::Ready(Gated::Read(Err(()))) => panic!("read failed"),
            Poll::Ready(Gated::Expired) => Poll::Ready(Gated::Expired),
            Poll::Pending => Poll::Pending,
        }
    }

    /// Everything that may pass now, read as a WebSocket reads.
    fn read_all(gate: &Gate, peer: &mut Peer) -> usize {
        let mut got = 0;
        while let Poll::Ready(Gated::Read(n)) = read_once(gate, peer, 128 * 1024) {
            got += n;
        }
        got
    }

    fn held(bodies: &Bodies) -> u64 {
        bodies.stats().body_bytes.load(Ordering::Relaxed)
    }

    #[tokio::test]
    async fn a_message_is_charged_its_declared_size_until_the_handler_has_it() {
        // Room for the largest frame: reads are not cut short.
        let (bodies, gate) = gate(64 << 20);
        let mut peer = Peer::default();
        let small = frame(true, 1, 100);
        peer.send(&small);
        assert_eq!(read_all(&gate, &mut peer), small.len());
        assert_eq!(held(&bodies), small.len() as u64);
        gate.message_done();
        assert_eq!(held(&bodies), 0);
        // A large one is charged whole from its header, before its
        // payload comes.
        let large = frame(true, 2, 1 << 20);
        peer.send(&large[..100]);
        assert_eq!(read_all(&gate, &mut peer), 100);
        assert_eq!(held(&bodies), large.len() as u64);
        peer.send(&large[100..]);
        assert_eq!(read_all(&gate, &mut peer), large.len() - 100);
        gate.message_done();
        assert_eq!(held(&bodies), 0);
        // An idle connection holds nothing.
        assert!(read_once(&gate, &mut peer, 4096).is_pending());
        assert_eq!(held(&bodies), 0);
        // A frame over the WebSocket's limit passes its header uncharged:
        // the WebSocket refuses it from there.
        let mut over = vec![0x82, 0x80 | 127];
        over.extend_from_slice(&(32u64 << 20).to_be_bytes());
        over.extend_from_slice(&[1, 2, 3, 4, b'x']);
        peer.send(&over);
        assert_eq!(read_all(&gate, &mut peer), over.len());
        assert_eq!(held(&bodies), 0);
    }

    #[tokio::test]
    async fn a_frame_with_no_room_keeps_its_header_unfinished_until_room_comes() {
        // 4 MiB: 1 MiB for small frames, 3 MiB for large ones.
        let (bodies, first) = gate(4 << 20);
        let mut one = Peer::default();
        one.send(&frame(true, 2, 2 << 20)[..1000]);
        assert_eq!(read_all(&first, &mut one), 1000);
        let second = Gate::new(bodies.clone(), 16 << 20);
        let mut two = Peer::default();
        let big = frame(true, 2, 2 << 20);
        let small = frame(true, 1, 50);
        two.send(&small);
        two.send(&big[..5000]);
        // The small message passes, the large frame's header does not
        // finish, and the rest waits with the gate.
        let passed = read_all(&second, &mut two);
        assert_eq!(passed, small.len() + header_len(&big) - 1);
        assert_eq!(
            two.at - passed,
            second.stash_len(),
            "what was read is kept, not lost"
        );
        second.message_done();
        assert_eq!(held(&bodies), (2 << 20) + 14);
        assert!(
            second.stash_len() <= MAX_HEADER,
            "{} bytes kept while room is scarce",
            second.stash_len()
        );
        // Small calls still pass.
        let third = Gate::new(bodies.clone(), 16 << 20);
        let mut three = Peer::default();
        three.send(&frame(true, 1, 10));
        assert_eq!(read_all(&third, &mut three), 16);
        third.message_done();
        // The first connection closes: the second's frame goes on.
        drop(first);
        assert_eq!(read_all(&second, &mut two), 5000 - header_len(&big) + 1);
        assert_eq!(held(&bodies), (2 << 20) + 14);
        drop(second);
        assert_eq!(held(&bodies), 0);
    }

    #[tokio::test]
    async fn a_message_begun_in_the_same_read_keeps_its_room_when_the_last_one_is_taken() {
        let (bodies, gate) = gate(64 << 20);
        let mut peer = Peer::default();
        let first = frame(true, 1, 10);
        let second = frame(true, 2, 100_000);
        peer.send(&first);
        peer.send(&second[..1000]);
        read_all(&gate, &mut peer);
        gate.message_done();
        assert_eq!(held(&bodies), second.len() as u64);
        // A fragmented message keeps its room across the pings between
        // its frames.
        peer.send(&second[1000..]);
        read_all(&gate, &mut peer);
        gate.message_done();
        assert_eq!(held(&bodies), 0);
        let part = frame(false, 1, 70_000);
        peer.send(&part);
        peer.send(&frame(true, 9, 4));
        read_all(&gate, &mut peer);
        gate.message_done();
        assert_eq!(held(&bodies), part.len() as u64);
        let last = frame(true, 0, 10);
        peer.send(&last);
        read_all(&gate, &mut peer);
        gate.message_done();
        assert_eq!(held(&bodies), 0);
    }

    #[tokio::test]
    async fn a_message_not_whole_by_its_deadline_expires() {
        let (bodies, gate) = gate(4 << 20);
        // 512 KiB declared at 1 MiB/s: 500 ms plus 500 ms (real time:
        // the margins are wide).
        let mut peer = Peer::default();
        let late = frame(true, 2, 512 * 1024);
        peer.send(&late[..200 * 1024]);
        read_all(&gate, &mut peer);
        tokio::time::sleep(Duration::from_millis(700)).await;
        assert!(read_once(&gate, &mut peer, 4096).is_pending());
        tokio::time::sleep(Duration::from_millis(400)).await;
        assert!(matches!(
            read_once(&gate, &mut peer, 4096),
            Poll::Ready(Gated::Expired)
        ));
        assert_eq!(
            bodies
                .stats()
                .closed_message_timeout
                .load(Ordering::Relaxed),
            1
        );
        // Its room is given back with the connection's buffers.
        assert_eq!(held(&bodies), late.len() as u64);
        gate.closed();
        assert_eq!(held(&bodies), 0);
    }

    #[tokio::test]
    async fn time_the_handler_spends_elsewhere_is_not_the_peers() {
        let (_, gate) = gate(4 << 20);
        let mut peer = Peer::default();
        let first = frame(true, 1, 10);
        let second = frame(true, 2, 100_000);
        peer.send(&first);
        peer.send(&second[..1000]);
        // The second message waits for the peer a while ...
        read_all(&gate, &mut peer);
        tokio::time::sleep(Duration::from_millis(300)).await;
        peer.send(&second[1000..2000]);
        assert!(matches!(
            read_once(&gate, &mut peer, 4096),
            Poll::Ready(Gated::Read(1000))
        ));
        // ... then the handler is busy with the first for longer than the
        // deadline before it reads again.
        gate.message_done();
        tokio::time::sleep(Duration::from_millis(800)).await;
        assert!(read_once(&gate, &mut peer, 4096).is_pending());
        peer.send(&second[2000..]);
        assert!(matches!(
            read_once(&gate, &mut peer, 128 * 1024),
            Poll::Ready(Gated::Read(_))
        ));
    }
}
