//! The connection to the master: connects to `ws://MASTER/api/agent`,
//! answers pings, forwards every other event to the agent core, writes
//! what the core sends, and reconnects with exponential backoff when the
//! connection drops or the master falls silent.
//!
//! The master's address comes from an [`agora_discovery::MasterLocator`]:
//! with `--master etcd://HOST:PORT/PREFIX` (feature `etcd`) it is the
//! leader recorded in etcd, which the locator watches; the link leaves a
//! master the moment it stops leading and connects (and re-registers)
//! with the new one. Reconnect delays double from
//! `--reconnect-backoff-min` to `--reconnect-backoff-max` with jitter, so
//! the agents that lost one master do not all come back at once.
//!
//! The link only moves frames; the core decides what to register with and
//! what to do with events (see [`crate::core`]). The core can force a new
//! connection by dropping the sender it was given.

use std::sync::Arc;
use std::time::Duration;

use agora_discovery::{
    random_sample, Backoff, LeaderChanged, Located, MasterLocator, DEFAULT_JITTER,
};
use agora_proto::agent::{Call, Event};
use futures::{SinkExt, StreamExt};
use tokio::sync::{mpsc, Notify};
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::Message;
use tokio_util::sync::CancellationToken;

use crate::messages::{CoreEvent, Input};
use crate::shared::Shared;

/// Most queued calls written to the master with one flush.
const WRITE_BATCH: usize = 256;
/// Pings the master may skip before the agent gives up on the connection.
pub(crate) const MASTER_SILENT_PINGS: u32 = 3;
/// How long a closing connection may take to write its close frame.
const CLOSE_WAIT: Duration = Duration::from_secs(1);
/// How long to wait for `REGISTERED` before trying another connection.
pub(crate) const REGISTRATION_WAIT: Duration = Duration::from_secs(10);

/// Runs until `cancel` fires.
pub(crate) async fn run(shared: Shared, core: mpsc::Sender<CoreEvent>, cancel: CancellationToken) {
    let locator = match MasterLocator::new(&shared.config.master) {
        Ok(locator) => locator,
        Err(e) => {
            // `agora-agent` checks --master before it starts; a library
            // caller that did not gets the reason in the log.
            tracing::error!(master = %shared.config.master, error = %e, "cannot find the master");
            return;
        }
    };
    let mut backoff = Backoff::new(
        shared.config.reconnect_backoff_min,
        shared.config.reconnect_backoff_max,
        DEFAULT_JITTER,
    );
    let mut previous: Option<String> = None;
    loop {
        let located = tokio::select! {
            _ = cancel.cancelled() => return,
            r = locator.locate(previous.as_deref()) => r,
        };
        let (master, leader_changed) = match located {
            Ok(Located { address, changed }) => (address, changed),
            Err(e) => {
                match e {
                    agora_discovery::DiscoveryError::NoLeader(_) => {
                        tracing::debug!(%locator, "no leading master yet")
                    }
                    e => tracing::warn!(%locator, error = %e, "cannot locate the master"),
                }
                tokio::select! {
                    _ = cancel.cancelled() => return,
                    _ = tokio::time::sleep(backoff.next_delay(random_sample())) => {}
                }
                continue;
            }
        };
        let scheme = if shared.client_tls.is_some() {
            "wss"
        } else {
            "ws"
        };
        let url = format!("{scheme}://{master}/api/agent");
        previous = Some(master.clone());
        let ws_config = WebSocketConfig::default()
            .max_message_size(Some(agora_proto::MAX_FRAME_BYTES))
            .max_frame_size(Some(agora_proto::MAX_FRAME_BYTES));
        let mut request =
            match tokio_tungstenite::tungstenite::client::IntoClientRequest::into_client_request(
                &url,
            ) {
                Ok(request) => request,
                Err(e) => {
                    tracing::error!(%url, error = %e, "invalid master URL");
                    return;
                }
            };
        if let Some(credential) = &shared.config.credential {
            match credential.authorization().parse() {
                Ok(value) => {
                    request.headers_mut().insert("authorization", value);
                }
                Err(_) => tracing::error!("the agent's credential cannot be sent as a header"),
            }
        }
        let connector = shared
            .client_tls
            .clone()
            .map(tokio_tungstenite::Connector::Rustls);
        let connect = tokio_tungstenite::connect_async_tls_with_config(
            request,
            Some(ws_config),
            true,
            connector,
        );
        let result = tokio::select! {
            _ = cancel.cancelled() => return,
            r = tokio::time::timeout(REGISTRATION_WAIT, connect) => r,
        };
        match result {
            Ok(Ok((ws, _))) => {
                tracing::info!(%master, "connected to master");
                // What the master sees this agent's traffic come from.
                let local_ip = match ws.get_ref() {
                    tokio_tungstenite::MaybeTlsStream::Plain(tcp) => {
                        tcp.local_addr().ok().map(|a| a.ip())
                    }
                    tokio_tungstenite::MaybeTlsStream::Rustls(tls) => {
                        tls.get_ref().0.local_addr().ok().map(|a| a.ip())
                    }
                    _ => None,
                };
                let registered = serve(&shared, ws, local_ip, &core, &cancel, leader_changed).await;
                if cancel.is_cancelled() {
                    return;
                }
                if registered {
                    backoff.reset();
                }
                tracing::warn!(%master, "master connection lost; reconnecting");
            }
            Ok(Err(tokio_tungstenite::tungstenite::Error::Http(response)))
                if matches!(response.status().as_u16(), 401 | 403) =>
            {
                // Not a passing state: say so loudly, and keep retrying
                // (the operator may be fixing the credentials file).
                previous = None;
                tracing::warn!(
                    %master,
                    status = %response.status(),
                    principal = shared.config.credential.as_ref().map(|c| c.principal.as_str()),
                    "the master refused this agent's credentials; retrying"
                );
            }
            Ok(Err(e)) => {
                if let tokio_tungstenite::tungstenite::Error::Http(_) = e {
                    // Alive but not serving yet (a new leader loading its
                    // registry): try it again after the backoff instead
                    // of waiting for another leader.
                    previous = None;
                }
                tracing::debug!(%master, error = %e, "cannot connect to master")
            }
            Err(_) => {
                tracing::debug!(%master, "connecting to master timed out")
            }
        }
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(backoff.next_delay(random_sample())) => {}
        }
    }
}

/// Serves one connection; returns whether the agent got registered on it.
///
/// This task reads: it answers pings (through the writer), hands every
/// other event to the core (waiting when the core's queue is full) and
/// watches for silence. A writer task of its own drains what the core
/// queues meanwhile, so waiting on the core never holds up the agent's
/// updates and acknowledgements.
async fn serve<S>(
    shared: &Shared,
    ws: tokio_tungstenite::WebSocketStream<S>,
    local_ip: Option<std::net::IpAddr>,
    core: &mpsc::Sender<CoreEvent>,
    cancel: &CancellationToken,
    mut leader_changed: LeaderChanged,
) -> bool
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (sink, mut stream) = ws.split();
    let conn = shared.next_conn_id();
    let (tx, outbox) = mpsc::channel::<Call>(shared.config.master_outbox.max(1));
    if core
        .send(CoreEvent::MasterConnected { conn, tx, local_ip })
        .await
        .is_err()
    {
        return false;
    }
    let done = CancellationToken::new();
    let pong = Arc::new(Notify::new());
    let mut writer = tokio::spawn(write_master(sink, outbox, pong.clone(), done.clone()));
    let mut registered = false;
    let mut silence_limit = REGISTRATION_WAIT;
    let mut deadline = Instant::now() + silence_limit;
    loop {
        let frame = tokio::select! {
            _ = cancel.cancelled() => break,
            _ = done.cancelled() => break,
            _ = &mut leader_changed => {
                tracing::warn!("this master no longer leads; reconnecting to the new leader");
                break;
            }
            _ = tokio::time::sleep_until(deadline) => {
                tracing::warn!(silent_for = ?silence_limit, "master is silent; dropping the connection");
                break;
            }
            frame = stream.next() => frame,
        };
        let text = match frame {
            None => break,
            Some(Err(e)) => {
                tracing::warn!(error = %e, "master connection failed");
                break;
            }
            Some(Ok(Message::Text(text))) => text,
            Some(Ok(Message::Close(_))) => break,
            Some(Ok(Message::Binary(_))) => {
                tracing::warn!("master sent a binary frame; ignored");
                continue;
            }
            Some(Ok(_)) => continue,
        };
        deadline = Instant::now() + silence_limit;
        let event = match agora_proto::decode::<Event>(text.as_str()) {
            Ok(event) => event,
            Err(e) => {
                tracing::warn!(error = %e, "undecodable frame from master; ignored");
                continue;
            }
        };
        match &event {
            Event::Ping => {
                pong.notify_one();
                continue;
            }
            Event::Registered {
                ping_interval_seconds,
                ..
            } => {
                registered = true;
                let interval = if ping_interval_seconds.is_finite() && *ping_interval_seconds > 0.0
                {
                    Duration::from_secs_f64(ping_interval_seconds.min(86_400.0))
                } else {
                    Duration::from_secs(15)
                };
                silence_limit = interval * (MASTER_SILENT_PINGS + 1);
                deadline = Instant::now() + silence_limit;
            }
            _ => {}
        }
        let forwarded = tokio::select! {
            r = core.send(CoreEvent::Input(Input::MasterEvent { conn, event: Box::new(event) })) => r.is_ok(),
            _ = done.cancelled() => false,
            _ = cancel.cancelled() => false,
        };
        if !forwarded {
            break;
        }
    }
    done.cancel();
    if tokio::time::timeout(CLOSE_WAIT, &mut writer).await.is_err() {
        writer.abort();
    }
    let _ = core
        .send(CoreEvent::Input(Input::MasterDisconnected { conn }))
        .await;
    registered
}

/// Writes the core's calls to the master, everything already queued with
/// one flush, and a PONG whenever the reader saw a PING; ends (with a
/// close frame) when `done` fires or the core drops its sender (it wants a
/// fresh connection), and ends `done` when a write fails.
async fn write_master<S>(
    mut sink: futures::stream::SplitSink<tokio_tungstenite::WebSocketStream<S>, Message>,
    mut outbox: mpsc::Receiver<Call>,
    pong: Arc<Notify>,
    done: CancellationToken,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    loop {
        let call = tokio::select! {
            biased;
            _ = done.cancelled() => break,
            _ = pong.notified() => Call::Pong,
            call = outbox.recv() => match call {
                Some(call) => call,
                None => break,
            },
        };
        let mut written = sink
            .feed(Message::text(agora_proto::encode(&call)))
            .await
            .is_ok();
        let mut queued = 1;
        while written && queued < WRITE_BATCH {
            let Ok(call) = outbox.try_recv() else { break };
            written = sink
                .feed(Message::text(agora_proto::encode(&call)))
                .await
                .is_ok();
            queued += 1;
        }
        if !written || sink.flush().await.is_err() {
            break;
        }
    }
    let _ = tokio::time::timeout(CLOSE_WAIT, sink.send(Message::Close(None))).await;
    done.cancel();
}
