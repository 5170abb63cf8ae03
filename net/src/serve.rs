//! The accept loop: every connection served by hyper with HTTP/1.1
//! (upgrades to WebSocket included) and HTTP/2 (prior knowledge), until
//! the token is cancelled; then the connections are shut down gracefully.
//!
//! Ours rather than `axum::serve` for what that does not let us set:
//! answers to pipelined HTTP/1.1 requests (Mesos clients may write calls
//! back to back) share writes, through a write buffer of bounded size
//! ([`crate::conn`]); `TCP_NODELAY` on every connection (events are small
//! writes on long-lived streams: without it, Nagle holds each back until
//! the peer's delayed ACK of the previous one); and bounds on what a peer
//! may hold ([`crate::Limits`]):
//!
//! - connections: at most `per_peer` not yet established from one
//!   address, and `max_connections` in all (below the file descriptor
//!   limit). At either cap a new connection closes the oldest one that has
//!   not shown who it is (see [`crate::Connection::establish`]); when all
//!   have, the new one is closed at once. Every such close is counted
//!   ([`NetStats`]).
//! - time: a request's headers must all arrive within the header timeout
//!   of their first byte, and a connection with no request in progress is
//!   closed after the idle timeout. A request being served is bounded by
//!   its handler (bodies: [`crate::body`]). An upgraded connection (a
//!   WebSocket) is its handler's, which meters its messages with the
//!   body budget and deadline ([`crate::Connection::meter_messages`]).
//! - a malformed request gets hyper's `400` (written before the
//!   connection closes).
//!
//! With TLS, each connection's handshake runs in its own task with a
//! deadline: a client that connects and never finishes it (or never
//! starts) holds only its own connection, and loses it at the deadline.
//! A plaintext client on a TLS listener fails the handshake and is
//! closed, unless plaintext is allowed: then the first byte tells them
//! apart (a TLS record starts with 0x16, no HTTP method does).

use std::future::{poll_fn, Future};
use std::pin::pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use axum::body::{Body, Bytes, HttpBody};
use axum::extract::Request;
use axum::http::Version;
use axum::response::Response;
use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::either::Either;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

use crate::conn::{CloseReason, ConnIo, Connection, Link, Shared, Table, Watch};
use crate::limits::Limits;
use crate::stats::NetStats;
use crate::tls::ServerTls;

/// The first byte of a TLS handshake record.
const TLS_HANDSHAKE_RECORD: u8 = 0x16;
/// How long what a finished connection left buffered may take to go out.
const LINGER: Duration = Duration::from_secs(1);
/// Bytes hyper buffers per connection (HTTP/1) or stream (HTTP/2) each
/// way.
const HYPER_BUFFER: usize = 64 * 1024;
/// HTTP/2 pings on a connection with streams open, to find dead peers.
const H2_KEEP_ALIVE: Duration = Duration::from_secs(30);

/// How a listener serves.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// Connections not yet established open at once from one peer
    /// address.
    pub per_peer: usize,
    /// Connections in all, and timeouts.
    pub limits: Limits,
    /// TLS, or plaintext only.
    pub tls: Option<Arc<ServerTls>>,
    /// How long a client has to finish its TLS handshake.
    pub handshake_timeout: Duration,
    /// Where connections are counted (for the process's `/metrics`).
    pub stats: Arc<NetStats>,
}

impl Default for ServeOptions {
    fn default() -> Self {
        ServeOptions {
            per_peer: 1024,
            limits: Limits::default(),
            tls: None,
            handshake_timeout: Duration::from_secs(15),
            stats: Arc::default(),
        }
    }
}

/// Pause after a failed accept (out of file descriptors, say) before the
/// next, so the loop does not spin.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// A request being served, until its answer is written or dropped.
struct InFlight(Arc<Link>);

/// An answer's body, holding its request's [`InFlight`].
struct Tracked {
    body: Body,
    _in_flight: InFlight,
}

/// How a connection's task ended.
enum End {
    /// hyper finished it (the peer closed, an error, an upgrade).
    Done,
    /// Closed by a bound or a handler.
    Closed(CloseReason),
}

/// Serves `router` on `listener` until `token` is cancelled, then waits
/// for every connection to finish its graceful shutdown. See the module
/// documentation for the bounds `options` set.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    token: CancellationToken,
    options: ServeOptions,
) {
    let table = Table::new(
        options.per_peer,
        options.limits.max_connections,
        options.stats.clone(),
    );
    let mut builder = Builder::new(TokioExecutor::new());
    // What hyper holds per connection: a request's headers (and
    // pipelined requests) read, and an answer's body taken ahead of the
    // socket, within HYPER_BUFFER (its default is 400 KiB each way; per
    // HTTP/2 stream for answers).
    builder.http1().max_buf_size(HYPER_BUFFER);
    builder
        .http2()
        .max_send_buf_size(HYPER_BUFFER)
        .timer(TokioTimer::new())
        .keep_alive_interval(Some(H2_KEEP_ALIVE))
        .keep_alive_timeout(options.limits.idle_timeout.min(H2_KEEP_ALIVE));
    let graceful = GracefulShutdown::new();
    let mut logged_refusals: u64 = 0;
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
        let Some((slot, link)) = table.admit(peer.ip()) else {
            let refused = options
                .stats
                .refused
                .load(std::sync::atomic::Ordering::Relaxed);
            // Said once per 1,000 refusals: a flood must not flood the log.
            if refused >= logged_refusals + 1000 || logged_refusals == 0 {
                logged_refusals = refused;
                tracing::warn!(peer = %peer.ip(), cap = options.limits.max_connections, refused, "connection cap reached and every open connection established; closing new ones");
            }
            drop(stream);
            continue;
        };
        if let Err(e) = stream.set_nodelay(true) {
            tracing::debug!(error = %e, "cannot set TCP_NODELAY on a connection");
        }
        let builder = builder.clone();
        let watcher = graceful.watcher();
        let tls = options.tls.clone();
        let handshake_timeout = options.handshake_timeout;
        let router = router.clone();
        let limits = options.limits.clone();
        let stats = options.stats.clone();
        tokio::spawn(async move {
            let io = match tls {
                None => Either::Left(stream),
                Some(tls) => {
                    let handshake = secure(stream, &tls, handshake_timeout);
                    let io = tokio::select! {
                        io = handshake => io,
                        () = closed(&link) => None,
                    };
                    match io {
                        Some(io) => io,
                        None => return,
                    }
                }
            };
            let (io, shared) = ConnIo::new(io, slot, link.clone());
            let service = TowerToHyperService::new(service(router, link));
            let conn = builder
                .serve_connection_with_upgrades(TokioIo::new(io), service)
                .into_owned();
            let conn = pin!(watcher.watch(conn));
            match drive(conn, &shared, &limits).await {
                End::Done => {
                    // What hyper wrote last (a 400, a close) goes out.
                    let flush = poll_fn(|cx| shared.poll_flush_buffered(cx));
                    let _ = tokio::time::timeout(LINGER, flush).await;
                }
                End::Closed(reason) => {
                    let counter = match reason {
                        CloseReason::HeaderTimeout => Some(&stats.closed_header_timeout),
                        CloseReason::IdleTimeout => Some(&stats.closed_idle_timeout),
                        _ => None,
                    };
                    if let Some(counter) = counter {
                        counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                    tracing::debug!(peer = %shared.link.peer(), ?reason, "connection closed");
                }
            }
        });
    }
    drop(listener);
    graceful.shutdown().await;
}

/// The router as one connection's service: each request carries the
/// [`Connection`] and counts as in flight until its answer is written.
fn service(
    router: Router,
    link: Arc<Link>,
) -> impl tower::Service<
    Request<Incoming>,
    Response = Response,
    Error = std::convert::Infallible,
    Future = impl Future<Output = Result<Response, std::convert::Infallible>> + Send,
> + Clone
       + Send {
    let for_requests = link.clone();
    ServiceExt::<Request>::map_future(router, move |future| {
        link.request_began();
        let in_flight = InFlight(link.clone());
        async move {
            let response: Response = match future.await {
                Ok(response) => response,
                Err(never) => match never {},
            };
            Ok(response.map(|body| {
                Body::new(Tracked {
                    body,
                    _in_flight: in_flight,
                })
            }))
        }
    })
    .map_request(move |req: Request<Incoming>| {
        let mut req = req.map(Body::new);
        if req.version() == Version::HTTP_2 {
            for_requests.http2();
        }
        req.extensions_mut()
            .insert(Connection(for_requests.clone()));
        req
    })
}

/// Polls hyper's connection with its flushes deferred to the end of each
/// turn, and closes it when it outstays a timeout or is closed from
/// outside.
async fn drive<C, I>(mut conn: std::pin::Pin<&mut C>, shared: &Shared<I>, limits: &Limits) -> End
where
    C: Future,
    I: AsyncRead + AsyncWrite + Unpin,
{
    let link = &shared.link;
    let first = tokio::time::Instant::now() + limits.header_timeout.min(limits.idle_timeout);
    let mut sleep = pin!(tokio::time::sleep_until(first));
    poll_fn(|cx| {
        link.register_task(cx);
        if link.is_closed() {
            return Poll::Ready(End::Closed(link.close_reason()));
        }
        let polled = shared.deferring(|| conn.as_mut().poll(cx));
        // A write error shows again on hyper's next write.
        let _ = shared.poll_flush_buffered(cx);
        if polled.is_ready() {
            return Poll::Ready(End::Done);
        }
        while sleep.as_mut().poll(cx).is_ready() {
            match link.watch(limits.header_timeout, limits.idle_timeout) {
                Watch::Expired(reason) => {
                    link.close(reason);
                    return Poll::Ready(End::Closed(reason));
                }
                Watch::Until(at) => sleep.as_mut().reset(at),
            }
        }
        Poll::Pending
    })
    .await
}

/// Until `link` is closed from outside.
async fn closed(link: &Link) {
    poll_fn(|cx| {
        link.register_task(cx);
        if link.is_closed() {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    })
    .await
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

// === impl InFlight ===

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.request_ended();
    }
}

// === impl Tracked ===

impl HttpBody for Tracked {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<Bytes>, axum::Error>>> {
        std::pin::Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.body.size_hint()
    }
}
