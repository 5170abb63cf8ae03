//! The accept loop: every connection served by hyper with HTTP/1.1
//! (upgrades to WebSocket included) and HTTP/2 (prior knowledge), until
//! the token is cancelled; then the connections are shut down gracefully.
//!
//! Ours rather than `axum::serve` for what that does not let us set:
//! pipelined HTTP/1.1 requests (Mesos clients may write calls back to
//! back) get their answers in one write (`pipeline_flush`),
//! `TCP_NODELAY` on every connection (events are small writes on
//! long-lived streams: without it, Nagle holds each back until the
//! peer's delayed ACK of the previous one), and a cap on the
//! connections open at once from one peer address: past it, a new
//! connection is closed at once, so one peer cannot take every file
//! descriptor (the others' connections are not touched).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::body::Body;
use axum::extract::Request;
use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto::Builder;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

/// Pause after a failed accept (out of file descriptors, say) before the
/// next, so the loop does not spin.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// Connections open now, by peer address.
#[derive(Clone, Default)]
struct PeerCounts(Arc<Mutex<HashMap<IpAddr, usize>>>);

/// One open connection, counted against its peer until dropped.
struct PeerSlot {
    counts: PeerCounts,
    peer: IpAddr,
}

/// Serves `router` on `listener` until `token` is cancelled, then waits
/// for every connection to finish its graceful shutdown. At most
/// `per_peer` connections from one address are open at once.
pub(crate) async fn serve(
    listener: TcpListener,
    router: Router,
    token: CancellationToken,
    per_peer: usize,
) {
    let mut builder = Builder::new(TokioExecutor::new());
    builder.http1().pipeline_flush(true);
    let graceful = GracefulShutdown::new();
    let counts = PeerCounts::default();
    let mut refused: u64 = 0;
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(pair) => pair,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot accept a connection");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                    continue;
                }
            },
            () = token.cancelled() => break,
        };
        let Some(slot) = counts.take(peer.ip(), per_peer) else {
            refused += 1;
            // Said once per 1,000 refusals: a flood must not flood the log.
            if refused % 1000 == 1 {
                tracing::warn!(peer = %peer.ip(), cap = per_peer, refused, "too many connections from one address; closing new ones");
            }
            drop(stream);
            continue;
        };
        if let Err(e) = stream.set_nodelay(true) {
            tracing::debug!(error = %e, "cannot set TCP_NODELAY on a connection");
        }
        let service = TowerToHyperService::new(
            router
                .clone()
                .map_request(|req: Request<Incoming>| req.map(Body::new)),
        );
        let conn = builder
            .serve_connection_with_upgrades(TokioIo::new(stream), service)
            .into_owned();
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::trace!(error = %e, "connection ended");
            }
            drop(slot);
        });
    }
    drop(listener);
    graceful.shutdown().await;
}

// === impl PeerCounts ===

impl PeerCounts {
    /// A slot for one more connection from `peer`, if it has fewer than
    /// `cap` open.
    fn take(&self, peer: IpAddr, cap: usize) -> Option<PeerSlot> {
        let mut counts = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let open = counts.entry(peer).or_insert(0);
        if *open >= cap {
            return None;
        }
        *open += 1;
        Some(PeerSlot {
            counts: self.clone(),
            peer,
        })
    }
}

impl Drop for PeerSlot {
    fn drop(&mut self) {
        let mut counts = self.counts.0.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(open) = counts.get_mut(&self.peer) {
            *open -= 1;
            if *open == 0 {
                counts.remove(&self.peer);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peer_gets_at_most_its_cap_and_slots_come_back_when_dropped() {
        let counts = PeerCounts::default();
        let a: IpAddr = "127.0.0.1".parse().unwrap();
        let b: IpAddr = "127.0.0.2".parse().unwrap();
        let slots: Vec<PeerSlot> = (0..120).filter_map(|_| counts.take(a, 100)).collect();
        assert_eq!(slots.len(), 100);
        // Another address is not affected.
        assert!(counts.take(b, 100).is_some());
        drop(slots);
        assert!(counts.take(a, 100).is_some());
        assert!(counts.0.lock().unwrap().get(&a).is_none());
    }
}
