//! A WebSocket-aware lossy link for tests: agents connect to the proxy as
//! if it were the master, and it relays each frame to the real master
//! (and back) after a random delay, in order per direction.
//!
//! WebSocket over TCP never loses one frame and keeps the connection, so
//! loss is modelled the only way it happens for real: a frame is dropped
//! *and* both sides of that connection are cut (frames still queued in
//! the proxy die with it). The agent then reconnects through the proxy.
//! Besides random drops (probability per frame, up to a cap), the first
//! frame of each type in [`ProxyConfig::force_drop`] is dropped, so a test
//! knows each kind of loss happened at least once.
//!
//! The proxy runs on its own thread with its own tokio runtime and stops
//! when dropped.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cancel::Cancel;
use futures::{SinkExt, StreamExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::handshake::server::{Request, Response};
use tokio_tungstenite::tungstenite::Message;

/// How lossy the link is.
#[derive(Debug, Clone)]
pub struct ProxyConfig {
    /// The real master.
    pub upstream: SocketAddr,
    /// Chance that a frame is dropped (and its connection cut).
    pub drop_probability: f64,
    /// Random drops stop after this many (forced ones not counted).
    pub max_random_drops: u64,
    /// Each frame is delayed by a uniform random time up to this.
    pub max_delay: Duration,
    /// Frame types (`"RUN_TASK"`, `"STATUS_UPDATE"`, `"ACKNOWLEDGE"`, …)
    /// whose first occurrence is dropped.
    pub force_drop: Vec<String>,
    /// Seed of the random choices (printed by the test to reproduce).
    pub seed: u64,
}

/// What the proxy did.
#[derive(Debug, Default)]
pub struct ProxyStats {
    /// Connections accepted.
    pub connections: AtomicU64,
    /// Frames relayed.
    pub relayed: AtomicU64,
    /// Frame types dropped, in order (each drop cut a connection).
    pub dropped: Mutex<Vec<String>>,
}

/// A running proxy; stops when dropped.
pub struct LossyProxy {
    /// Where agents connect (`HOST:PORT`).
    pub addr: SocketAddr,
    /// What it has done so far.
    pub stats: Arc<ProxyStats>,
    /// Faults are injected only while this is set.
    faults: Arc<AtomicBool>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// Shared by every connection of one proxy.
struct Link {
    config: ProxyConfig,
    stats: Arc<ProxyStats>,
    faults: Arc<AtomicBool>,
    rng: Mutex<u64>,
    random_drops: AtomicU64,
    forced: Mutex<Vec<String>>,
}

/// A tiny cancellation flag shared by the four halves of one relayed
/// connection (tokio-util's token is not a dev-dependency here).
mod cancel {
    use std::sync::Arc;
    use tokio::sync::watch;

    #[derive(Clone)]
    pub struct Cancel(Arc<watch::Sender<bool>>);

    impl Cancel {
        pub fn new() -> Self {
            Cancel(Arc::new(watch::channel(false).0))
        }
        pub fn cancel(&self) {
            self.0.send_replace(true);
        }
        pub async fn cancelled(&self) {
            let mut rx = self.0.subscribe();
            let _ = rx.wait_for(|c| *c).await;
        }
    }
}

// === impl LossyProxy ===

impl LossyProxy {
    /// Starts a proxy on 127.0.0.1 (ephemeral port) in front of `config.upstream`.
    pub fn start(config: ProxyConfig) -> LossyProxy {
        let stats = Arc::new(ProxyStats::default());
        let faults = Arc::new(AtomicBool::new(true));
        let (addr_tx, addr_rx) = std::sync::mpsc::channel();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let link = Arc::new(Link {
            rng: Mutex::new(config.seed.max(1)),
            forced: Mutex::new(config.force_drop.clone()),
            config,
            stats: stats.clone(),
            faults: faults.clone(),
            random_drops: AtomicU64::new(0),
        });
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()
                .expect("proxy runtime");
            runtime.block_on(async move {
                let listener = TcpListener::bind("127.0.0.1:0").await.expect("proxy bind");
                let _ = addr_tx.send(listener.local_addr().expect("proxy addr"));
                let all = Cancel::new();
                tokio::pin!(stopped);
                loop {
                    tokio::select! {
                        _ = &mut stopped => break,
                        accepted = listener.accept() => {
                            if let Ok((stream, _)) = accepted {
                                link.stats.connections.fetch_add(1, Ordering::Relaxed);
                                tokio::spawn(relay(link.clone(), stream, all.clone()));
                            }
                        }
                    }
                }
                all.cancel();
            });
        });
        let addr = addr_rx
            .recv_timeout(Duration::from_secs(10))
            .expect("proxy did not start");
        LossyProxy {
            addr,
            stats,
            faults,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    /// Turns fault injection on or off (delays and drops); off, the proxy
    /// relays frames at once.
    pub fn set_faults(&self, on: bool) {
        self.faults.store(on, Ordering::SeqCst);
    }

    /// Frame types dropped so far.
    pub fn dropped(&self) -> Vec<String> {
        self.stats.dropped.lock().expect("stats").clone()
    }
}

impl Drop for LossyProxy {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

// === impl Link ===

impl Link {
    /// xorshift64*: a uniform number in [0, 1).
    fn random(&self) -> f64 {
        let mut state = self.rng.lock().expect("rng");
        let mut x = *state;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        *state = x;
        (x.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Whether to drop this frame (and cut its connection).
    fn should_drop(&self, text: &str) -> Option<String> {
        if !self.faults.load(Ordering::SeqCst) {
            return None;
        }
        let kind = serde_json::from_str::<serde_json::Value>(text)
            .ok()
            .and_then(|v| v["type"].as_str().map(str::to_string))
            .unwrap_or_else(|| "?".into());
        {
            let mut forced = self.forced.lock().expect("forced");
            if let Some(i) = forced.iter().position(|k| *k == kind) {
                forced.remove(i);
                return Some(kind);
            }
        }
        if self.random_drops.load(Ordering::SeqCst) < self.config.max_random_drops
            && self.random() < self.config.drop_probability
        {
            self.random_drops.fetch_add(1, Ordering::SeqCst);
            return Some(kind);
        }
        None
    }

    fn delay(&self) -> Duration {
        if !self.faults.load(Ordering::SeqCst) {
            return Duration::ZERO;
        }
        self.config.max_delay.mul_f64(self.random())
    }
}

// The handshake callback's error type is tungstenite's HTTP response.
#[allow(clippy::result_large_err)]
/// Relays one agent connection to a new master connection until either
/// side ends or a drop cuts both.
async fn relay(link: Arc<Link>, stream: TcpStream, all: Cancel) {
    let mut path = String::from("/api/agent");
    let callback = |request: &Request, response: Response| {
        path = request.uri().path().to_string();
        Ok(response)
    };
    let Ok(agent) = tokio_tungstenite::accept_hdr_async(stream, callback).await else {
        return;
    };
    let url = format!("ws://{}{path}", link.config.upstream);
    let Ok((master, _)) = tokio_tungstenite::connect_async(url.as_str()).await else {
        return;
    };
    let cut = Cancel::new();
    let (agent_sink, agent_stream) = agent.split();
    let (master_sink, master_stream) = master.split();
    let up = pump(link.clone(), agent_stream, master_sink, cut.clone());
    let down = pump(link, master_stream, agent_sink, cut.clone());
    tokio::select! {
        _ = async { tokio::join!(up, down) } => {}
        _ = cut.cancelled() => {}
        _ = all.cancelled() => {}
    }
    // Dropping both sockets without a close handshake is the cut.
}

/// One direction: read frames, drop or delay them, write them in order.
async fn pump<R, W>(link: Arc<Link>, mut from: R, mut to: W, cut: Cancel)
where
    R: futures::Stream<Item = Result<Message, tokio_tungstenite::tungstenite::Error>> + Unpin,
    W: futures::Sink<Message> + Unpin,
{
    let (tx, mut rx) = mpsc::unbounded_channel::<(Instant, Message)>();
    let writer = async {
        while let Some((at, message)) = rx.recv().await {
            tokio::time::sleep_until(at).await;
            let close = matches!(message, Message::Close(_));
            if to.send(message).await.is_err() || close {
                break;
            }
            link.stats.relayed.fetch_add(1, Ordering::Relaxed);
        }
        cut.cancel();
    };
    let reader = async {
        let mut last = Instant::now();
        while let Some(Ok(message)) = from.next().await {
            let message = match message {
                Message::Text(text) => {
                    if let Some(kind) = link.should_drop(text.as_str()) {
                        link.stats.dropped.lock().expect("stats").push(kind);
                        cut.cancel();
                        return;
                    }
                    Message::Text(text)
                }
                Message::Binary(data) => Message::Binary(data),
                Message::Close(frame) => Message::Close(frame),
                // Pings and pongs are answered per hop by tungstenite.
                _ => continue,
            };
            let at = (Instant::now() + link.delay()).max(last);
            last = at;
            if tx.send((at, message)).is_err() {
                return;
            }
        }
        cut.cancel();
    };
    tokio::select! {
        _ = async { tokio::join!(reader, writer) } => {}
        _ = cut.cancelled() => {}
    }
}
