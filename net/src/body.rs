//! Reading a request body within bounds: its declared size checked before
//! a byte of it is read (`413`), room for it taken from the process's
//! budget of body memory before it is read (the body waits, unread, while
//! there is none), and the whole of it within a deadline that grows with
//! its size (`--http-body-timeout` plus a second per
//! `--http-body-min-rate` bytes), else `408`. A peer that declares a large
//! body and stalls holds neither memory beyond the budget nor a handler
//! beyond the deadline.
//!
//! Handlers authenticate a request before they read its body.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes, HttpBody};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use http_body_util::BodyExt;
use tokio::sync::{Semaphore, SemaphorePermit};
use tokio::time::Instant;

use crate::limits::Limits;
use crate::stats::NetStats;

/// How long a refused body is read and dropped before its connection
/// closes.
const LINGER: Duration = Duration::from_secs(2);

/// Bodies of at most this many bytes draw on the reserve for small ones.
pub const SMALL_BODY: usize = 64 * 1024;

/// The process's request bodies: their memory budget and deadlines.
#[derive(Debug)]
pub struct Bodies {
    small: Arc<Semaphore>,
    large: Arc<Semaphore>,
    timeout: Duration,
    min_rate: u64,
    stats: Arc<NetStats>,
}

/// Why a body was not read.
#[derive(Debug, thiserror::Error)]
pub enum BodyError {
    /// Declared or sent larger than the endpoint accepts.
    #[error("Request body exceeds the {limit}-byte limit")]
    TooLarge {
        /// The endpoint's limit.
        limit: usize,
    },
    /// Not all of it arrived in time.
    #[error("Request body not received within {allowed:?} ({received} bytes came)")]
    TimedOut {
        /// The time it had.
        allowed: Duration,
        /// Bytes read by then.
        received: usize,
    },
    /// The peer went away or sent a broken body.
    #[error("Failed to read request body: {0}")]
    Read(String),
}

/// Budget held for one body; given back when dropped.
struct Held<'a> {
    permits: Vec<SemaphorePermit<'a>>,
    bytes: usize,
    stats: &'a NetStats,
}

// === impl Bodies ===

impl Bodies {
    /// The bodies of a process with these limits, counted in `stats`.
    pub fn new(limits: &Limits, stats: Arc<NetStats>) -> Arc<Bodies> {
        let budget = limits.body_memory.min(u32::MAX as usize);
        let small = (budget / 4).max(SMALL_BODY);
        Arc::new(Bodies {
            small: Arc::new(Semaphore::new(small)),
            large: Arc::new(Semaphore::new(budget.saturating_sub(small).max(SMALL_BODY))),
            timeout: limits.body_timeout,
            min_rate: limits.body_min_rate,
            stats,
        })
    }

    /// The time a body of `bytes` has to arrive.
    pub fn allowed(&self, bytes: usize) -> Duration {
        let extra = if self.min_rate == 0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(bytes as f64 / self.min_rate as f64)
        };
        self.timeout + extra
    }

    /// The reserve for small bodies and the pool for large ones (for
    /// [`crate::gate`]).
    pub(crate) fn pools(&self) -> (Arc<Semaphore>, Arc<Semaphore>) {
        (self.small.clone(), self.large.clone())
    }

    pub(crate) fn small_pool(&self) -> &Arc<Semaphore> {
        &self.small
    }

    pub(crate) fn large_pool(&self) -> &Arc<Semaphore> {
        &self.large
    }

    pub(crate) fn stats(&self) -> &NetStats {
        &self.stats
    }

    /// Reads `body` whole, if it is at most `max` bytes and arrives in
    /// time (see the module documentation).
    pub async fn read(&self, mut body: Body, max: usize) -> Result<Bytes, BodyError> {
        let started = Instant::now();
        let declared = body.size_hint().exact();
        if let Some(declared) = declared {
            if declared > max as u64 {
                self.stats.bodies_too_large.fetch_add(1, Ordering::Relaxed);
                linger(body);
                return Err(BodyError::TooLarge { limit: max });
            }
            if declared == 0 {
                return Ok(Bytes::new());
            }
        }
        let declared = declared.map(|d| d as usize);
        let mut held = Held {
            permits: Vec::new(),
            bytes: 0,
            stats: &self.stats,
        };
        let mut data: Vec<u8> = Vec::new();
        let timed_out = |received: usize, allowed: Duration| {
            self.stats.bodies_timed_out.fetch_add(1, Ordering::Relaxed);
            BodyError::TimedOut { allowed, received }
        };
        if let Some(declared) = declared {
            let allowed = self.allowed(declared);
            let pool = if declared <= SMALL_BODY {
                &self.small
            } else {
                &self.large
            };
            self.hold(&mut held, pool, declared, started + allowed)
                .await
                .map_err(|()| timed_out(0, allowed))?;
            data.reserve_exact(declared);
        }
        loop {
            let allowed = self.allowed(declared.unwrap_or(data.len()));
            let frame = match tokio::time::timeout_at(started + allowed, body.frame()).await {
                Err(_) => return Err(timed_out(data.len(), allowed)),
                Ok(None) => break,
                Ok(Some(Err(e))) => return Err(BodyError::Read(e.to_string())),
                Ok(Some(Ok(frame))) => frame,
            };
            let Ok(chunk) = frame.into_data() else {
                continue;
            };
            let len = data.len() + chunk.len();
            if len > max {
                self.stats.bodies_too_large.fetch_add(1, Ordering::Relaxed);
                linger(body);
                return Err(BodyError::TooLarge { limit: max });
            }
            if len > held.bytes {
                // A body of no declared size takes room as it comes.
                let more = (len - held.bytes).div_ceil(SMALL_BODY) * SMALL_BODY;
                let allowed = self.allowed(len);
                self.hold(&mut held, &self.large, more, started + allowed)
                    .await
                    .map_err(|()| timed_out(data.len(), allowed))?;
            }
            data.extend_from_slice(&chunk);
        }
        drop(held);
        Ok(Bytes::from(data))
    }

    async fn hold<'a>(
        &'a self,
        held: &mut Held<'a>,
        pool: &'a Semaphore,
        bytes: usize,
        deadline: Instant,
    ) -> Result<(), ()> {
        let permits = u32::try_from(bytes).map_err(drop)?;
        let permit = tokio::time::timeout_at(deadline, pool.acquire_many(permits))
            .await
            .map_err(drop)?
            .map_err(drop)?;
        held.permits.push(permit);
        held.bytes += bytes;
        self.stats
            .body_bytes
            .fetch_add(bytes as u64, Ordering::Relaxed);
        Ok(())
    }
}

/// Reads and drops what a refused body still sends, for a short while
/// (holding nothing), so the refusal reaches a client still writing
/// rather than being lost to the reset a close with unread data causes.
fn linger(mut body: Body) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    runtime.spawn(async move {
        let drain = async { while let Some(Ok(_)) = body.frame().await {} };
        let _ = tokio::time::timeout(LINGER, drain).await;
    });
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        self.stats
            .body_bytes
            .fetch_sub(self.bytes as u64, Ordering::Relaxed);
        self.permits.clear();
    }
}

// === impl BodyError ===

impl BodyError {
    /// The answer's status: `413`, `408` or `400`.
    pub fn status(&self) -> StatusCode {
        match self {
            BodyError::TooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            BodyError::TimedOut { .. } => StatusCode::REQUEST_TIMEOUT,
            BodyError::Read(_) => StatusCode::BAD_REQUEST,
        }
    }
}

impl IntoResponse for BodyError {
    fn into_response(self) -> Response {
        let status = self.status();
        tracing::info!(%status, error = %self, "request body refused");
        // The rest of the body is not read: the connection cannot carry
        // another request.
        (
            status,
            [
                (header::CONTENT_TYPE, "text/plain; charset=utf-8"),
                (header::CONNECTION, "close"),
            ],
            self.to_string(),
        )
            .into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bodies(memory: usize) -> Arc<Bodies> {
        let limits = Limits {
            body_timeout: Duration::from_millis(200),
            body_min_rate: 1024 * 1024,
            body_memory: memory,
            ..Limits::default()
        };
        Bodies::new(&limits, Arc::default())
    }

    #[tokio::test]
    async fn a_declared_size_over_the_limit_is_refused_before_reading() {
        let b = bodies(1 << 20);
        let body = Body::from(vec![0u8; 2000]);
        let err = b.read(body, 1000).await.unwrap_err();
        assert_eq!(err.status(), StatusCode::PAYLOAD_TOO_LARGE);
        let ok = b.read(Body::from(vec![7u8; 1000]), 1000).await.unwrap();
        assert_eq!(ok.len(), 1000);
        assert_eq!(b.stats.body_bytes.load(Ordering::Relaxed), 0);
    }

    #[tokio::test]
    async fn a_stalled_body_times_out_and_gives_its_room_back() {
        let b = bodies(4 << 20);
        let (tx, rx) =
            tokio::sync::mpsc::channel::<Result<hyper::body::Frame<Bytes>, std::io::Error>>(4);
        let stream = http_body_util::StreamBody::new(tokio_stream(rx));
        tx.send(Ok(hyper::body::Frame::data(Bytes::from_static(b"abc"))))
            .await
            .unwrap();
        let err = b.read(Body::new(stream), 1 << 20).await.unwrap_err();
        assert_eq!(err.status(), StatusCode::REQUEST_TIMEOUT, "{err}");
        assert_eq!(b.stats.body_bytes.load(Ordering::Relaxed), 0);
        drop(tx);
    }

    #[tokio::test]
    async fn a_body_waits_for_room_within_its_deadline() {
        // 4 MiB in all: 1 MiB kept for small bodies, 3 MiB for large ones.
        let b = bodies(4 << 20);
        let held = b.large.acquire_many(3 << 20).await.unwrap();
        let body = Body::from(vec![1u8; 100 * 1024]);
        let err = b.read(body, 1 << 20).await.unwrap_err();
        assert_eq!(err.status(), StatusCode::REQUEST_TIMEOUT, "{err}");
        // Small calls are not held up by large ones.
        let small = b.read(Body::from(vec![1u8; 100]), 1 << 20).await.unwrap();
        assert_eq!(small.len(), 100);
        drop(held);
        let body = Body::from(vec![1u8; 100 * 1024]);
        assert_eq!(b.read(body, 1 << 20).await.unwrap().len(), 100 * 1024);
    }

    fn tokio_stream<T: Send + 'static>(
        mut rx: tokio::sync::mpsc::Receiver<T>,
    ) -> impl futures::Stream<Item = T> {
        futures::stream::poll_fn(move |cx| rx.poll_recv(cx))
    }
}
