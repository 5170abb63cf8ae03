//! The accept loop: every connection served by hyper with HTTP/1.1
//! (upgrades to WebSocket included) and HTTP/2 (prior knowledge), until
//! the token is cancelled; then the connections are shut down gracefully.
//!
//! Ours rather than `axum::serve` for what that does not let us set:
//! pipelined HTTP/1.1 requests (Mesos clients may write calls back to
//! back) get their answers in one write (`pipeline_flush`), and
//! `TCP_NODELAY` on every connection (events are small writes on
//! long-lived streams: without it, Nagle holds each back until the
//! peer's delayed ACK of the previous one).

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

/// Serves `router` on `listener` until `token` is cancelled, then waits
/// for every connection to finish its graceful shutdown.
pub(crate) async fn serve(listener: TcpListener, router: Router, token: CancellationToken) {
    let mut builder = Builder::new(TokioExecutor::new());
    builder.http1().pipeline_flush(true);
    let graceful = GracefulShutdown::new();
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot accept a connection");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                    continue;
                }
            },
            () = token.cancelled() => break,
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
        });
    }
    drop(listener);
    graceful.shutdown().await;
}
