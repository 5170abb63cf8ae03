//! The bounds of [`crate::body`] for WebSocket messages: once a handler
//! says a connection carries a WebSocket ([`crate::Connection::meter_messages`]),
//! every byte read for a message not yet complete is charged to the
//! process's budget of body memory, taken as it is read (a read waits,
//! unread, while there is no room), and the message must be complete
//! within the body deadline for its size so far (`--http-body-timeout`
//! plus a second per `--http-body-min-rate` bytes read), else the
//! connection is closed ([`crate::conn::CloseReason::MessageTimeout`]).
//! The handler gives the room back when it has a whole message
//! ([`crate::Connection::message_done`]); closing the connection gives
//! it back too.
//!
//! Room is taken in chunks of [`CHUNK`] bytes, a message's first from
//! the reserve for small bodies and the rest from the large pool, so a
//! flood of large messages leaves room for small calls; a read is cut to
//! the room held. A connection with no message in progress holds
//! nothing: the chunk a read took is given back when nothing came. The
//! WebSocket reads ahead at most one read, so what it may hold of the
//! next message uncharged when a message completes is under a chunk.
//!
//! The fast path (a small message that arrives in one read) costs an
//! uncontended semaphore acquire and release per message and no timer:
//! the deadline is armed only when a message spans reads.

use std::future::Future as _;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll};

use tokio::io::ReadBuf;
use tokio::sync::OwnedSemaphorePermit;
use tokio::time::{Instant, Sleep};
use tokio_util::sync::PollSemaphore;

use crate::body::Bodies;

/// Bytes of room taken at a time.
pub(crate) const CHUNK: usize = 64 * 1024;

/// A connection's metering of its WebSocket messages.
pub(crate) struct Gate {
    bodies: Arc<Bodies>,
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

struct Metered {
    small: PollSemaphore,
    large: PollSemaphore,
    /// Room held for the message in progress, from each pool.
    held_small: Option<OwnedSemaphorePermit>,
    held_large: Option<OwnedSemaphorePermit>,
    /// Bytes of room held.
    held: usize,
    /// Bytes read of the message in progress (0: none in progress).
    read: usize,
    /// When its first byte was read.
    started: Instant,
    /// Its deadline's timer, once a message spanned reads.
    sleep: Option<Pin<Box<Sleep>>>,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

// === impl Gate ===

impl Gate {
    pub(crate) fn new(bodies: Arc<Bodies>) -> Gate {
        let (small, large) = bodies.pools();
        Gate {
            bodies,
            state: Mutex::new(Metered {
                small: PollSemaphore::new(small),
                large: PollSemaphore::new(large),
                held_small: None,
                held_large: None,
                held: 0,
                read: 0,
                started: Instant::now(),
                sleep: None,
            }),
        }
    }

    /// Reads through `read` into `buf`, within the room held (taking
    /// more first when all of it is used) and the deadline of the message
    /// in progress.
    pub(crate) fn poll_read<E>(
        &self,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
        read: impl FnOnce(&mut Context<'_>, &mut ReadBuf<'_>) -> Poll<Result<(), E>>,
    ) -> Poll<Gated<Result<(), E>>> {
        let mut m = lock(&self.state);
        if m.read > 0 && Instant::now() >= self.deadline(&m) {
            return Poll::Ready(self.expire(&mut m));
        }
        if m.read == m.held {
            let first = m.held == 0;
            let pool = if first { &mut m.small } else { &mut m.large };
            match pool.poll_acquire_many(cx, CHUNK as u32) {
                Poll::Ready(Some(permit)) => {
                    let held = if first {
                        &mut m.held_small
                    } else {
                        &mut m.held_large
                    };
                    match held {
                        Some(held) => held.merge(permit),
                        None => *held = Some(permit),
                    }
                    m.held += CHUNK;
                    self.bodies
                        .stats()
                        .body_bytes
                        .fetch_add(CHUNK as u64, Ordering::Relaxed);
                }
                // The pools are never closed; were one, the read goes on
                // unmetered rather than failing.
                Poll::Ready(None) => return read(cx, buf).map(Gated::Read),
                Poll::Pending => return self.pending(cx, &mut m),
            }
        }
        let room = m.held - m.read;
        let (polled, n) = if buf.remaining() <= room {
            let before = buf.filled().len();
            let polled = read(cx, buf);
            (polled, buf.filled().len() - before)
        } else {
            let mut cut = ReadBuf::new(buf.initialize_unfilled_to(room));
            let polled = read(cx, &mut cut);
            let n = cut.filled().len();
            buf.advance(n);
            (polled, n)
        };
        match polled {
            Poll::Ready(result) => {
                if n > 0 {
                    if m.read == 0 {
                        m.started = Instant::now();
                    }
                    m.read += n;
                }
                Poll::Ready(Gated::Read(result))
            }
            Poll::Pending => self.pending(cx, &mut m),
        }
    }

    /// The WebSocket has a whole message: the room its bytes took is
    /// given back, and its deadline is off.
    pub(crate) fn message_done(&self) {
        self.release(&mut lock(&self.state));
    }

    /// The connection closed: everything is given back.
    pub(crate) fn closed(&self) {
        let mut m = lock(&self.state);
        self.release(&mut m);
        m.sleep = None;
    }

    /// A read waits (for room or bytes): with no message in progress it
    /// holds nothing; with one, its deadline's timer runs.
    fn pending<T>(&self, cx: &mut Context<'_>, m: &mut Metered) -> Poll<Gated<T>> {
        if m.read == 0 {
            self.release(m);
            return Poll::Pending;
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

    fn deadline(&self, m: &Metered) -> Instant {
        m.started + self.bodies.allowed(m.read)
    }

    fn expire<T>(&self, m: &mut Metered) -> Gated<T> {
        let allowed = self.bodies.allowed(m.read);
        tracing::info!(received = m.read, ?allowed, "WebSocket message not received in time; closing the connection");
        self.bodies
            .stats()
            .closed_message_timeout
            .fetch_add(1, Ordering::Relaxed);
        self.release(m);
        Gated::Expired
    }

    fn release(&self, m: &mut Metered) {
        if m.held > 0 {
            self.bodies
                .stats()
                .body_bytes
                .fetch_sub(m.held as u64, Ordering::Relaxed);
        }
        m.held_small = None;
        m.held_large = None;
        m.held = 0;
        m.read = 0;
    }
}

impl Drop for Gate {
    fn drop(&mut self) {
        self.closed();
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
        (bodies.clone(), Gate::new(bodies))
    }

    /// A source of `available` bytes (then pending), counting what it
    /// handed out.
    struct Source {
        available: usize,
        given: usize,
    }

    impl Source {
        fn read(&mut self, buf: &mut ReadBuf<'_>) -> Poll<Result<(), ()>> {
            let n = self.available.min(buf.remaining());
            if n == 0 {
                return Poll::Pending;
            }
            buf.put_slice(&vec![7u8; n]);
            self.available -= n;
            self.given += n;
            Poll::Ready(Ok(()))
        }
    }

    /// Polls one metered read of up to `len` bytes from `source`.
    fn read_once(gate: &Gate, source: &mut Source, len: usize) -> Poll<Gated<usize>> {
        let waker = futures::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        let mut storage = vec![0u8; len];
        let mut buf = ReadBuf::new(&mut storage);
        match gate.poll_read(&mut cx, &mut buf, |_, b| source.read(b)) {
            Poll::Ready(Gated::Read(Ok(()))) => Poll::Ready(Gated::Read(buf.filled().len())),
            Poll::Ready(Gated::Read(Err(()))) => panic!("read failed"),
            Poll::Ready(Gated::Expired) => Poll::Ready(Gated::Expired),
            Poll::Pending => Poll::Pending,
        }
    }

    fn held(bodies: &Bodies) -> u64 {
        bodies.stats().body_bytes.load(Ordering::Relaxed)
    }

    #[tokio::test]
    async fn bytes_of_a_message_in_progress_are_charged_and_given_back_when_it_completes() {
        let (bodies, gate) = gate(4 << 20);
        let mut source = Source {
            available: 100,
            given: 0,
        };
        assert!(matches!(
            read_once(&gate, &mut source, 4096),
            Poll::Ready(Gated::Read(100))
        ));
        assert_eq!(held(&bodies), CHUNK as u64);
        // Waiting for the rest of it keeps its room.
        assert!(read_once(&gate, &mut source, 4096).is_pending());
        assert_eq!(held(&bodies), CHUNK as u64);
        gate.message_done();
        assert_eq!(held(&bodies), 0);
        // An idle connection waiting for a message holds nothing.
        assert!(read_once(&gate, &mut source, 4096).is_pending());
        assert_eq!(held(&bodies), 0);
    }

    #[tokio::test]
    async fn a_read_is_cut_to_the_room_held_and_waits_while_there_is_none() {
        // 1 MiB: 256 KiB for first chunks, 768 KiB for the rest.
        let (bodies, gate) = gate(1 << 20);
        let mut source = Source {
            available: 4 << 20,
            given: 0,
        };
        let mut got = 0;
        loop {
            match read_once(&gate, &mut source, 256 * 1024) {
                Poll::Ready(Gated::Read(n)) => {
                    assert!(n <= CHUNK, "a read of {n} bytes past its room");
                    got += n;
                }
                Poll::Ready(Gated::Expired) => panic!("expired at once"),
                Poll::Pending => break,
            }
        }
        // One chunk of the small pool, all of the large pool.
        assert_eq!(got, CHUNK + 768 * 1024);
        assert_eq!(source.given, got, "nothing read beyond the room");
        assert_eq!(held(&bodies), got as u64);
        // Another connection's small message still gets through.
        let (_, other) = (bodies.clone(), Gate::new(bodies.clone()));
        let mut small = Source {
            available: 10,
            given: 0,
        };
        assert!(matches!(
            read_once(&other, &mut small, 4096),
            Poll::Ready(Gated::Read(10))
        ));
        other.message_done();
        drop(gate);
        assert_eq!(held(&bodies), 0, "a closed connection gives its room back");
    }

    #[tokio::test]
    async fn a_message_not_complete_by_its_deadline_expires() {
        let (bodies, gate) = gate(4 << 20);
        // 512 KiB at 1 MiB/s: 500 ms plus 500 ms (real time: the
        // margins are wide).
        let mut source = Source {
            available: 512 * 1024,
            given: 0,
        };
        while let Poll::Ready(Gated::Read(_)) = read_once(&gate, &mut source, CHUNK) {}
        assert_eq!(source.given, 512 * 1024);
        tokio::time::sleep(Duration::from_millis(700)).await;
        assert!(read_once(&gate, &mut source, CHUNK).is_pending());
        tokio::time::sleep(Duration::from_millis(400)).await;
        assert!(matches!(
            read_once(&gate, &mut source, CHUNK),
            Poll::Ready(Gated::Expired)
        ));
        assert_eq!(held(&bodies), 0);
        assert_eq!(
            bodies.stats().closed_message_timeout.load(Ordering::Relaxed),
            1
        );
        // A message's time runs from its first byte, not from the last
        // one's end: an idle connection's next message is not late.
        gate.message_done();
        tokio::time::sleep(Duration::from_millis(1200)).await;
        source.available = 10;
        assert!(matches!(
            read_once(&gate, &mut source, CHUNK),
            Poll::Ready(Gated::Read(10))
        ));
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(read_once(&gate, &mut source, CHUNK).is_pending());
        gate.message_done();
        assert_eq!(held(&bodies), 0);
    }
}
