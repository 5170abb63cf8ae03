//! One accepted connection as the accept loop keeps it: its I/O through a
//! write buffer of bounded size, what it did last (for the header and
//! idle timeouts), and its place in the table of open connections (for
//! the per-address and global caps).
//!
//! Writes are coalesced: while the accept loop polls hyper's connection,
//! a flush only marks the buffer, and the loop writes it once hyper is
//! done for that turn. Answers to pipelined HTTP/1.1 requests so share
//! writes (hyper's own `pipeline_flush` did that, but it let hyper buffer
//! a streamed body without bound towards a peer that does not read, and
//! lost the `400` of a malformed request). Outside that window (an
//! upgraded WebSocket's task) a flush writes at once.
//!
//! A connection is *established* once it has shown who it is: a request
//! that authenticated, a framework's subscription, an agent's
//! registration (the handlers say so through [`Connection::establish`]).
//! Only connections not yet established are counted against the
//! per-address cap, and only they are closed to make room: when an
//! address is at its cap, or the process at its global cap, a new
//! connection closes the oldest one not established (of that address, or
//! of all; one with no request in progress first), so a flood of idle
//! connections never locks out a peer that authenticates.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::task::{ready, Context, Poll};
use std::thread::ThreadId;
use std::time::Duration;

use futures::task::AtomicWaker;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Instant;

use crate::body::Bodies;
use crate::gate::{Gate, Gated};
use crate::stats::NetStats;

/// Bytes a connection may hold written and not yet sent to its socket.
const WRITE_BUFFER: usize = 64 * 1024;
/// Connections closed to make room that may still hold their
/// descriptors, beyond the global cap.
pub(crate) const EVICTING: usize = 8;
/// Connections looked at, oldest first, for one with no request in
/// progress to close for room.
const VICTIM_SCAN: usize = 64;
/// A write at least this large goes straight to the socket when nothing
/// is buffered (no copy).
const DIRECT_WRITE: usize = 16 * 1024;

/// Why a connection was closed by the accept loop rather than by its peer
/// or its handler.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum CloseReason {
    /// Still open.
    Open = 0,
    /// A request's headers did not arrive within the header timeout.
    HeaderTimeout = 1,
    /// No request came within the idle timeout.
    IdleTimeout = 2,
    /// Made room for a new connection from the same address.
    PeerCap = 3,
    /// Made room for a new connection at the global cap.
    GlobalCap = 4,
    /// A handler closed it (a stream whose reader stopped reading).
    Handler = 5,
    /// A WebSocket message did not all arrive within its deadline.
    MessageTimeout = 6,
}

/// A connection as its requests see it: each request served by
/// [`crate::serve`] carries one in its extensions.
#[derive(Clone)]
pub struct Connection(pub(crate) Arc<Link>);

/// What is shared about one connection between its I/O, its requests,
/// the accept loop's watchdog and the table of connections.
pub(crate) struct Link {
    id: u64,
    peer: IpAddr,
    table: Arc<Table>,
    closed: AtomicU8,
    established: AtomicBool,
    /// Speaks HTTP/2 (whose pings are not the start of a request).
    http2: AtomicBool,
    /// Woken when the connection is closed from outside.
    read_waker: AtomicWaker,
    write_waker: AtomicWaker,
    task_waker: AtomicWaker,
    read_bytes: AtomicU64,
    /// Requests being served (their answers not yet written in full).
    in_flight: AtomicUsize,
    /// When the connection last became idle (milliseconds, [`clock`]).
    idle_since: AtomicU64,
    /// `read_bytes` when it became idle: more means a request started.
    read_at_idle: AtomicU64,
    /// When the first byte after `idle_since` came (0: none yet).
    request_started: AtomicU64,
    /// Once it carries a WebSocket: the metering of its messages.
    gate: OnceLock<Gate>,
}

/// The I/O handed to hyper (and, after an upgrade, to the WebSocket).
pub(crate) struct ConnIo<I> {
    shared: Arc<Shared<I>>,
}

/// The socket and its write buffer.
pub(crate) struct Shared<I> {
    pub(crate) link: Arc<Link>,
    inner: Mutex<Inner<I>>,
}

struct Inner<I> {
    io: Option<I>,
    buf: Vec<u8>,
    /// Bytes of `buf` already written.
    start: usize,
    /// The thread polling hyper's connection for the accept loop: a flush
    /// on it is left to the loop.
    deferring: Option<ThreadId>,
    slot: Option<Slot>,
}

/// The open connections: counts, and those not established by age.
pub(crate) struct Table {
    state: Mutex<TableState>,
    per_peer: usize,
    global: usize,
    pub(crate) stats: Arc<NetStats>,
}

#[derive(Default)]
struct TableState {
    open: usize,
    next_id: u64,
    /// Not established, by id (age).
    pending: BTreeMap<u64, Arc<Link>>,
    /// Not established, by address.
    by_peer: HashMap<IpAddr, BTreeSet<u64>>,
}

/// A connection's place in the table, given back when dropped.
pub(crate) struct Slot {
    table: Arc<Table>,
    id: u64,
    peer: IpAddr,
}

/// The watchdog's verdict.
pub(crate) enum Watch {
    /// Look again at this time.
    Until(Instant),
    /// Close it, for this reason.
    Expired(CloseReason),
}

/// Where [`clock`] counts from.
fn origin() -> Instant {
    static START: OnceLock<Instant> = OnceLock::new();
    *START.get_or_init(Instant::now)
}

/// Milliseconds since [`origin`], on tokio's clock; at least 1, so that
/// 0 can mean "not set".
fn clock() -> u64 {
    Instant::now()
        .saturating_duration_since(origin())
        .as_millis() as u64
        + 1
}

/// The instant of a [`clock`] reading.
fn instant_of(ms: u64) -> Instant {
    origin() + Duration::from_millis(ms.saturating_sub(1))
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

// === impl Connection ===

impl Connection {
    /// The peer's address.
    pub fn peer(&self) -> IpAddr {
        self.0.peer
    }

    /// The connection has shown who it is (a request that authenticated,
    /// a subscribed framework, a registered agent): it no longer counts
    /// against its address's cap and is never closed to make room.
    pub fn establish(&self) {
        if !self.0.established.swap(true, Ordering::AcqRel) {
            self.0.table.establish(self.0.id, self.0.peer);
        }
    }

    /// Whether [`Connection::establish`] was called.
    pub fn is_established(&self) -> bool {
        self.0.established.load(Ordering::Acquire)
    }

    /// Closes the connection: reads end, writes fail, and the accept loop
    /// drops it (a stream whose reader stopped reading, say).
    pub fn close(&self) {
        self.0.close(CloseReason::Handler);
    }

    /// The connection carries a WebSocket whose frames are at most
    /// `max_frame` bytes (call it before reading the first message): from
    /// now on each frame the peer sends is charged to `bodies`' budget of
    /// body memory for its declared size before the WebSocket has its
    /// header (a frame waits, unread, while there is no room), until the
    /// handler has its message; and a message in progress must be whole
    /// within `bodies`' deadline for its size, else the connection is
    /// closed. Call [`Connection::message_done`] on each message received
    /// (data or control). See the `gate` module's documentation.
    pub fn meter_messages(&self, bodies: &Arc<Bodies>, max_frame: usize) {
        let _ = self.0.gate.set(Gate::new(bodies.clone(), max_frame));
    }

    /// The handler has a whole message (data or control): the room of
    /// the messages passed whole is given back.
    pub fn message_done(&self) {
        if let Some(gate) = self.0.gate.get() {
            gate.message_done();
        }
    }
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("id", &self.0.id)
            .field("peer", &self.0.peer)
            .field("established", &self.is_established())
            .finish()
    }
}

// === impl Link ===

impl Link {
    pub(crate) fn close(&self, reason: CloseReason) {
        if self
            .closed
            .compare_exchange(
                CloseReason::Open as u8,
                reason as u8,
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .is_ok()
        {
            self.read_waker.wake();
            self.write_waker.wake();
            self.task_waker.wake();
        }
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire) != CloseReason::Open as u8
    }

    pub(crate) fn close_reason(&self) -> CloseReason {
        match self.closed.load(Ordering::Acquire) {
            1 => CloseReason::HeaderTimeout,
            2 => CloseReason::IdleTimeout,
            3 => CloseReason::PeerCap,
            4 => CloseReason::GlobalCap,
            5 => CloseReason::Handler,
            6 => CloseReason::MessageTimeout,
            _ => CloseReason::Open,
        }
    }

    pub(crate) fn register_task(&self, cx: &Context<'_>) {
        self.task_waker.register(cx.waker());
    }

    /// A request's headers were read: it is being served.
    pub(crate) fn request_began(&self) {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
    }

    /// A request's answer was written (or dropped).
    pub(crate) fn request_ended(&self) {
        if self.in_flight.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.became_idle();
        }
    }

    fn became_idle(&self) {
        self.read_at_idle
            .store(self.read_bytes.load(Ordering::Acquire), Ordering::Release);
        self.request_started.store(0, Ordering::Release);
        self.idle_since.store(clock(), Ordering::Release);
    }

    pub(crate) fn http2(&self) {
        self.http2.store(true, Ordering::Relaxed);
    }

    pub(crate) fn peer(&self) -> IpAddr {
        self.peer
    }

    fn read(&self, n: usize) {
        let before = self.read_bytes.fetch_add(n as u64, Ordering::AcqRel);
        if self.in_flight.load(Ordering::Acquire) == 0
            && before == self.read_at_idle.load(Ordering::Acquire)
        {
            self.request_started.store(clock(), Ordering::Release);
        }
    }

    /// Whether the connection outstayed a timeout: a request begun and
    /// its headers not all read within `header`, or nothing begun within
    /// `idle` of the last answer. A request being served is watched by
    /// its handler (the body's deadline), not here.
    pub(crate) fn watch(&self, header: Duration, idle: Duration) -> Watch {
        let now = clock();
        let later = |ms: u64| Watch::Until(instant_of(ms.max(now + 1)));
        if self.in_flight.load(Ordering::Acquire) > 0 {
            return later(now + header.min(idle).as_millis() as u64);
        }
        let started = self.request_started.load(Ordering::Acquire);
        if started != 0 && !self.http2.load(Ordering::Relaxed) {
            let deadline = started + header.as_millis() as u64;
            if now >= deadline {
                return Watch::Expired(CloseReason::HeaderTimeout);
            }
            return later(deadline);
        }
        let deadline = self.idle_since.load(Ordering::Acquire) + idle.as_millis() as u64;
        if now >= deadline {
            return Watch::Expired(CloseReason::IdleTimeout);
        }
        // A request may begin before then: its header timeout is shorter.
        later(deadline.min(now + header.as_millis() as u64))
    }
}

// === impl ConnIo ===

impl<I> ConnIo<I> {
    pub(crate) fn new(io: I, slot: Slot, link: Arc<Link>) -> (ConnIo<I>, Arc<Shared<I>>) {
        link.became_idle();
        let shared = Arc::new(Shared {
            link,
            inner: Mutex::new(Inner {
                io: Some(io),
                buf: Vec::new(),
                start: 0,
                deferring: None,
                slot: Some(slot),
            }),
        });
        (
            ConnIo {
                shared: shared.clone(),
            },
            shared,
        )
    }
}

impl<I> Drop for ConnIo<I> {
    fn drop(&mut self) {
        let mut inner = lock(&self.shared.inner);
        inner.io = None;
        inner.slot = None;
        inner.buf = Vec::new();
        if let Some(gate) = self.shared.link.gate.get() {
            gate.closed();
        }
    }
}

fn closed_error() -> io::Error {
    io::Error::new(io::ErrorKind::ConnectionAborted, "connection closed")
}

impl<I: AsyncRead + AsyncWrite + Unpin> AsyncRead for ConnIo<I> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let link = &self.shared.link;
        link.read_waker.register(cx.waker());
        if link.is_closed() {
            // End of stream: hyper and the WebSocket end quietly.
            return Poll::Ready(Ok(()));
        }
        let mut inner = lock(&self.shared.inner);
        let Some(io) = inner.io.as_mut() else {
            return Poll::Ready(Err(closed_error()));
        };
        let before = buf.filled().len();
        match link.gate.get() {
            None => ready!(Pin::new(io).poll_read(cx, buf))?,
            Some(gate) => {
                match ready!(gate.poll_read(cx, buf, |cx, buf| Pin::new(io).poll_read(cx, buf))) {
                    Gated::Read(result) => result?,
                    Gated::Expired => {
                        link.close(CloseReason::MessageTimeout);
                        return Poll::Ready(Ok(()));
                    }
                }
            }
        }
        let n = buf.filled().len() - before;
        if n > 0 {
            link.read(n);
        }
        Poll::Ready(Ok(()))
    }
}

impl<I: AsyncRead + AsyncWrite + Unpin> AsyncWrite for ConnIo<I> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.shared
            .poll_write_vectored(cx, &[io::IoSlice::new(data)])
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.shared.poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let mut inner = lock(&self.shared.inner);
        if inner.deferring == Some(current_thread()) {
            return Poll::Ready(Ok(()));
        }
        self.shared.link.write_waker.register(cx.waker());
        if self.shared.link.is_closed() {
            return Poll::Ready(Err(closed_error()));
        }
        inner.poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let mut inner = lock(&self.shared.inner);
        if !self.shared.link.is_closed() {
            ready!(inner.poll_flush(cx))?;
        }
        match inner.io.as_mut() {
            Some(io) => Pin::new(io).poll_shutdown(cx),
            None => Poll::Ready(Ok(())),
        }
    }
}

fn current_thread() -> ThreadId {
    thread_local! {
        static ID: ThreadId = std::thread::current().id();
    }
    ID.with(|id| *id)
}

// === impl Shared ===

impl<I: AsyncRead + AsyncWrite + Unpin> Shared<I> {
    fn poll_write_vectored(
        &self,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.link.write_waker.register(cx.waker());
        if self.link.is_closed() {
            return Poll::Ready(Err(closed_error()));
        }
        let mut inner = lock(&self.inner);
        let total: usize = bufs.iter().map(|b| b.len()).sum();
        if total == 0 {
            return Poll::Ready(Ok(0));
        }
        if inner.pending() + total > WRITE_BUFFER {
            // Room first: what is buffered goes before.
            match inner.poll_write_buf(cx) {
                Poll::Ready(Ok(())) => {}
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending if inner.pending() >= WRITE_BUFFER => return Poll::Pending,
                Poll::Pending => {}
            }
        }
        if inner.pending() == 0 && total >= DIRECT_WRITE {
            let Some(io) = inner.io.as_mut() else {
                return Poll::Ready(Err(closed_error()));
            };
            return Pin::new(io).poll_write_vectored(cx, bufs);
        }
        let room = WRITE_BUFFER.saturating_sub(inner.pending()).max(1);
        let mut taken = 0;
        for b in bufs {
            let n = b.len().min(room - taken);
            inner.buf.extend_from_slice(&b[..n]);
            taken += n;
            if taken == room {
                break;
            }
        }
        Poll::Ready(Ok(taken))
    }

    /// Writes what the connection buffered (the accept loop, after each
    /// turn of hyper's connection).
    pub(crate) fn poll_flush_buffered(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.link.is_closed() {
            return Poll::Ready(Ok(()));
        }
        lock(&self.inner).poll_flush(cx)
    }

    /// Runs `f` (a turn of hyper's connection) with flushes left to the
    /// caller.
    pub(crate) fn deferring<T>(&self, f: impl FnOnce() -> T) -> T {
        lock(&self.inner).deferring = Some(current_thread());
        let out = f();
        lock(&self.inner).deferring = None;
        out
    }
}

// === impl Inner ===

impl<I: AsyncWrite + Unpin> Inner<I> {
    fn pending(&self) -> usize {
        self.buf.len() - self.start
    }

    fn poll_write_buf(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.pending() > 0 {
            let Some(io) = self.io.as_mut() else {
                return Poll::Ready(Err(closed_error()));
            };
            let n = ready!(Pin::new(io).poll_write(cx, &self.buf[self.start..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.start += n;
        }
        self.buf.clear();
        self.start = 0;
        if self.buf.capacity() > WRITE_BUFFER * 2 {
            self.buf = Vec::new();
        }
        Poll::Ready(Ok(()))
    }

    fn poll_flush(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.poll_write_buf(cx))?;
        match self.io.as_mut() {
            Some(io) => Pin::new(io).poll_flush(cx),
            None => Poll::Ready(Ok(())),
        }
    }
}

// === impl Table ===

impl Table {
    pub(crate) fn new(per_peer: usize, global: usize, stats: Arc<NetStats>) -> Arc<Table> {
        Arc::new(Table {
            state: Mutex::default(),
            per_peer: per_peer.max(1),
            global: global.max(1),
            stats,
        })
    }

    /// A place for a new connection from `peer`, closing the oldest
    /// connection not established of that address (at its cap) or of all
    /// (at the global cap) to make room; `None` when every open
    /// connection is established and the global cap is reached.
    pub(crate) fn admit(self: &Arc<Self>, peer: IpAddr) -> Option<(Slot, Arc<Link>)> {
        let mut state = lock(&self.state);
        let from_peer = state.by_peer.get(&peer).map_or(0, BTreeSet::len);
        if from_peer >= self.per_peer {
            let victim = state
                .by_peer
                .get(&peer)
                .and_then(|ids| state.victim(ids.iter().copied()));
            if let Some(victim) = victim {
                state.evict(victim, CloseReason::PeerCap);
                self.stats.closed_peer_cap.fetch_add(1, Ordering::Relaxed);
            }
        }
        // Connections closed to make room hold their descriptor until
        // their task drops them: while more than a few wait for that
        // (a flood), refuse, so the descriptors in use stay below the cap
        // plus that few (within the headroom below the file limit).
        let hard = self.global + EVICTING;
        if state.open >= self.global {
            let victim = state.victim(state.pending.keys().copied());
            match victim {
                Some(victim) if state.open < hard => {
                    state.evict(victim, CloseReason::GlobalCap);
                    self.stats.closed_global_cap.fetch_add(1, Ordering::Relaxed);
                }
                _ => {
                    self.stats.refused.fetch_add(1, Ordering::Relaxed);
                    return None;
                }
            }
        }
        state.open += 1;
        state.next_id += 1;
        let id = state.next_id;
        let link = Arc::new(Link {
            id,
            peer,
            table: self.clone(),
            closed: AtomicU8::new(CloseReason::Open as u8),
            established: AtomicBool::new(false),
            http2: AtomicBool::new(false),
            read_waker: AtomicWaker::new(),
            write_waker: AtomicWaker::new(),
            task_waker: AtomicWaker::new(),
            read_bytes: AtomicU64::new(0),
            in_flight: AtomicUsize::new(0),
            idle_since: AtomicU64::new(clock()),
            read_at_idle: AtomicU64::new(0),
            request_started: AtomicU64::new(0),
            gate: OnceLock::new(),
        });
        state.pending.insert(id, link.clone());
        state.by_peer.entry(peer).or_default().insert(id);
        self.stats.open.store(state.open as u64, Ordering::Relaxed);
        let slot = Slot {
            table: self.clone(),
            id,
            peer,
        };
        Some((slot, link))
    }

    fn establish(&self, id: u64, peer: IpAddr) {
        let mut state = lock(&self.state);
        if state.forget(id, peer) {
            self.stats.established.fetch_add(1, Ordering::Relaxed);
        }
    }
}

impl TableState {
    /// Takes `id` out of the connections not established.
    fn forget(&mut self, id: u64, peer: IpAddr) -> bool {
        let known = self.pending.remove(&id).is_some();
        if let Some(ids) = self.by_peer.get_mut(&peer) {
            ids.remove(&id);
            if ids.is_empty() {
                self.by_peer.remove(&peer);
            }
        }
        known
    }

    /// Which of `ids` (connections not established, oldest first) to
    /// close for room: the oldest with no request in progress among the
    /// first few, else the oldest.
    fn victim(&self, mut ids: impl Iterator<Item = u64>) -> Option<u64> {
        let oldest = ids.next()?;
        let idle = |id: &u64| {
            self.pending
                .get(id)
                .is_some_and(|l| l.in_flight.load(Ordering::Acquire) == 0)
        };
        if idle(&oldest) {
            return Some(oldest);
        }
        Some(ids.take(VICTIM_SCAN).find(idle).unwrap_or(oldest))
    }

    fn evict(&mut self, id: u64, reason: CloseReason) {
        if let Some(link) = self.pending.get(&id).cloned() {
            self.forget(id, link.peer);
            tracing::debug!(peer = %link.peer, ?reason, "closing a connection not established to make room");
            link.close(reason);
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut state = lock(&self.table.state);
        state.open = state.open.saturating_sub(1);
        state.forget(self.id, self.peer);
        self.table
            .stats
            .open
            .store(state.open as u64, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([127, 0, 0, last])
    }

    #[tokio::test]
    async fn a_full_address_makes_room_by_closing_its_oldest_unestablished_connection() {
        let table = Table::new(3, 100, Arc::default());
        let mut held: Vec<(Slot, Arc<Link>)> =
            (0..3).map(|_| table.admit(ip(1)).unwrap()).collect();
        // The first one authenticates: it no longer counts.
        Connection(held[0].1.clone()).establish();
        let fourth = table.admit(ip(1)).unwrap();
        assert!(
            !held[1].1.is_closed(),
            "the pool had room once one was established"
        );
        let fifth = table.admit(ip(1)).unwrap();
        assert_eq!(held[1].1.close_reason(), CloseReason::PeerCap);
        assert!(
            !held[0].1.is_closed(),
            "established connections are never closed for room"
        );
        assert!(!held[2].1.is_closed());
        // Another address is not touched.
        let other = table.admit(ip(2)).unwrap();
        assert!(!other.1.is_closed());
        held.push(fourth);
        held.push(fifth);
        drop(held);
        drop(other);
        let state = lock(&table.state);
        assert_eq!(state.open, 0);
        assert!(state.pending.is_empty() && state.by_peer.is_empty());
    }

    #[tokio::test]
    async fn a_connection_with_a_request_in_progress_is_closed_for_room_last() {
        let table = Table::new(2, 100, Arc::default());
        let busy = table.admit(ip(1)).unwrap();
        busy.1.request_began();
        let idle = table.admit(ip(1)).unwrap();
        let _new = table.admit(ip(1)).unwrap();
        assert_eq!(idle.1.close_reason(), CloseReason::PeerCap);
        assert!(!busy.1.is_closed());
    }

    #[tokio::test]
    async fn the_global_cap_closes_the_oldest_unestablished_or_refuses() {
        let stats = Arc::new(NetStats::default());
        let table = Table::new(100, 4, stats.clone());
        let a = table.admit(ip(1)).unwrap();
        let b = table.admit(ip(2)).unwrap();
        let c = table.admit(ip(3)).unwrap();
        let d = table.admit(ip(4)).unwrap();
        Connection(b.1.clone()).establish();
        Connection(c.1.clone()).establish();
        Connection(d.1.clone()).establish();
        // At the cap: the oldest not established (a) makes room.
        let e = table.admit(ip(5)).unwrap();
        assert_eq!(a.1.close_reason(), CloseReason::GlobalCap);
        drop(a);
        Connection(e.1.clone()).establish();
        // Every open connection is established: refused.
        assert!(table.admit(ip(6)).is_none());
        assert_eq!(stats.refused.load(Ordering::Relaxed), 1);
        drop(b);
        assert!(table.admit(ip(6)).is_some());
    }

    #[tokio::test]
    async fn the_watchdog_tells_a_stalled_header_from_an_idle_connection() {
        let table = Table::new(10, 10, Arc::default());
        let (_slot, link) = table.admit(ip(1)).unwrap();
        link.became_idle();
        let ms = Duration::from_millis;
        let (header, idle) = (ms(300), ms(900));
        let pause = |d| tokio::time::sleep(d);
        assert!(matches!(link.watch(header, idle), Watch::Until(_)));
        pause(ms(400)).await;
        // Idle past the header timeout, but within the idle timeout.
        assert!(matches!(link.watch(header, idle), Watch::Until(_)));
        // Half a request: the header timeout runs from its first byte.
        link.read(10);
        pause(ms(100)).await;
        assert!(matches!(link.watch(header, idle), Watch::Until(_)));
        pause(ms(300)).await;
        assert!(matches!(
            link.watch(header, idle),
            Watch::Expired(CloseReason::HeaderTimeout)
        ));
        // Its headers complete: served for as long as it takes, then idle.
        link.request_began();
        pause(ms(1000)).await;
        assert!(matches!(link.watch(header, idle), Watch::Until(_)));
        link.request_ended();
        pause(ms(500)).await;
        assert!(matches!(link.watch(header, idle), Watch::Until(_)));
        pause(ms(500)).await;
        assert!(matches!(
            link.watch(header, idle),
            Watch::Expired(CloseReason::IdleTimeout)
        ));
    }
}
