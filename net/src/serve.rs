//! The accept loop: every connection served by hyper with HTTP/1.1
//! (upgrades to WebSocket included) and HTTP/2 (prior knowledge), until
//! the token is cancelled; then the connections are shut down gracefully.
//!
//! Ours rather than `axum::serve` for what that does not let us set:
//! pipelined HTTP/1.1 requests (Mesos clients may write calls back to
//! back) get their answers in one write (`pipeline_flush`, where asked),
//! `TCP_NODELAY` on every connection (events are small writes on
//! long-lived streams: without it, Nagle holds each back until the
//! peer's delayed ACK of the previous one), and a cap on the
//! connections open at once from one peer address: past it, a new
//! connection is closed at once, so one peer cannot take every file
//! descriptor (the others' connections are not touched).
//!
//! With TLS, each connection's handshake runs in its own task with a
//! deadline: a client that connects and never finishes it (or never
//! starts) holds only its own connection, and loses it at the deadline.
//! A plaintext client on a TLS listener fails the handshake and is
//! closed, unless plaintext is allowed: then the first byte tells them
//! apart (a TLS record starts with 0x16, no HTTP method does).

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
use tokio::net::{TcpListener, TcpStream};
use tokio_util::either::Either;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

use crate::tls::ServerTls;

/// The first byte of a TLS handshake record.
const TLS_HANDSHAKE_RECORD: u8 = 0x16;

/// How a listener serves.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// Connections open at once from one peer address.
    pub per_peer: usize,
    /// TLS, or plaintext only.
    pub tls: Option<Arc<ServerTls>>,
    /// How long a client has to finish its TLS handshake.
    pub handshake_timeout: Duration,
    /// Answers to pipelined HTTP/1.1 requests share writes. It also lets
    /// hyper take a streamed body's chunks ahead of the socket, so a
    /// server that judges a slow reader by its stream's backlog (the
    /// agent's executor streams) keeps it off.
    pub pipeline_flush: bool,
}

impl Default for ServeOptions {
    fn default() -> Self {
        ServeOptions {
            per_peer: 1024,
            tls: None,
            handshake_timeout: Duration::from_secs(15),
            pipeline_flush: false,
        }
    }
}

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
/// `options.per_peer` connections from one address are open at once.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    token: CancellationToken,
    options: ServeOptions,
) {
    let per_peer = options.per_peer;
    let mut builder = Builder::new(TokioExecutor::new());
    builder.http1().pipeline_flush(options.pipeline_flush);
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
        let builder = builder.clone();
        let watcher = graceful.watcher();
        let tls = options.tls.clone();
        let handshake_timeout = options.handshake_timeout;
        tokio::spawn(async move {
            let io = match tls {
                None => Either::Left(stream),
                Some(tls) => match secure(stream, &tls, handshake_timeout).await {
                    Some(io) => io,
                    None => return,
                },
            };
            let conn = builder
                .serve_connection_with_upgrades(TokioIo::new(io), service)
                .into_owned();
            if let Err(e) = watcher.watch(conn).await {
                tracing::trace!(error = %e, "connection ended");
            }
            drop(slot);
        });
    }
    drop(listener);
    graceful.shutdown().await;
}

/// The connection after its TLS handshake (or as it is, when plaintext is
/// allowed and it does not start one); `None` when the handshake fails or
/// does not end in time.
async fn secure(
    stream: TcpStream,
    tls: &ServerTls,
    timeout: Duration,
) -> Option<Either<TcpStream, tokio_rustls::server::TlsStream<TcpStream>>> {
    let peer = stream.peer_addr().ok();
    let handshake = async {
        if tls.allow_plaintext {
            let mut first = [0u8; 1];
            match stream.peek(&mut first).await {
                Ok(1) if first[0] != TLS_HANDSHAKE_RECORD => return Ok(Either::Left(stream)),
                Ok(_) => {}
                Err(e) => return Err(e),
            }
        }
        tls.acceptor.accept(stream).await.map(Either::Right)
    };
    match tokio::time::timeout(timeout, handshake).await {
        Ok(Ok(io)) => Some(io),
        Ok(Err(e)) => {
            tracing::info!(?peer, error = %e, "TLS handshake failed; connection closed");
            None
        }
        Err(_) => {
            tracing::info!(
                ?peer,
                ?timeout,
                "TLS handshake not done in time; connection closed"
            );
            None
        }
    }
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
