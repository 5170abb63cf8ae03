//! WebSocket messages through the accept loop ([`agora_net::serve`]) on
//! 127.0.0.1, with the connection's messages metered against the body
//! budget ([`agora_net::Connection::meter_messages`], as the master's and
//! the agent's WebSockets are) and without: messages per second from a
//! tokio-tungstenite client to a handler that reads them, for small
//! messages (a call or an acknowledgement) and large ones (many chunks of
//! the budget each). Runs alternate; medians printed with metered ÷
//! plain. This is the transport alone (no decoding): what a handler
//! does with a message costs far more than the metering.
//!
//! ```text
//! cargo bench -p agora-net --bench ws_messages
//! cargo bench -p agora-net --bench ws_messages -- --quick
//! ```

use std::sync::Arc;
use std::time::{Duration, Instant};

use agora_net::{serve, Bodies, Connection, Limits, NetStats, ServeOptions};
use axum::extract::ws::{Message, WebSocketUpgrade};
use axum::extract::State;
use axum::response::Response;
use axum::routing::get;
use axum::{Extension, Router};
use futures::{SinkExt, StreamExt};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

#[derive(Clone)]
struct App {
    bodies: Arc<Bodies>,
    metered: bool,
}

async fn ws(
    ws: WebSocketUpgrade,
    State(app): State<App>,
    connection: Option<Extension<Connection>>,
) -> Response {
    let connection = connection.map(|Extension(c)| c);
    ws.max_message_size(16 * 1024 * 1024)
        .max_frame_size(16 * 1024 * 1024)
        .on_upgrade(move |mut socket| async move {
            if let (true, Some(c)) = (app.metered, &connection) {
                c.meter_messages(&app.bodies, 16 * 1024 * 1024);
            }
            let mut bytes = 0usize;
            while let Some(Ok(message)) = socket.recv().await {
                if let Some(c) = &connection {
                    c.message_done();
                }
                match message {
                    Message::Text(t) if t.as_str() == "end" => {
                        let _ = socket.send(Message::text(bytes.to_string())).await;
                    }
                    Message::Text(t) => bytes += t.len(),
                    Message::Binary(b) => bytes += b.len(),
                    _ => {}
                }
            }
        })
}

/// Messages per second for `count` messages of `size` bytes.
async fn run(metered: bool, count: usize, size: usize) -> f64 {
    let stats = Arc::new(NetStats::default());
    let limits = Limits::default();
    let app = App {
        bodies: Bodies::new(&limits, stats.clone()),
        metered,
    };
    let router = Router::new().route("/ws", get(ws)).with_state(app);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let token = CancellationToken::new();
    let options = ServeOptions {
        limits,
        stats,
        ..ServeOptions::default()
    };
    let server = tokio::spawn(serve(listener, router, token.clone(), options));
    let (client, _) = tokio_tungstenite::connect_async(format!("ws://{addr}/ws"))
        .await
        .unwrap();
    let (mut tx, mut rx) = client.split();
    let payload = "x".repeat(size);
    let start = Instant::now();
    for i in 0..count {
        let message = tokio_tungstenite::tungstenite::Message::text(payload.clone());
        tx.feed(message).await.unwrap();
        if i % 64 == 63 {
            tx.flush().await.unwrap();
        }
    }
    tx.send(tokio_tungstenite::tungstenite::Message::text("end"))
        .await
        .unwrap();
    let got = rx.next().await.unwrap().unwrap();
    let elapsed = start.elapsed();
    assert_eq!(
        got.into_text().unwrap().as_str(),
        (count * size).to_string()
    );
    token.cancel();
    drop((tx, rx));
    let _ = tokio::time::timeout(Duration::from_secs(5), server).await;
    count as f64 / elapsed.as_secs_f64()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let repeat = if quick { 1 } else { 5 };
    let cases: &[(&str, usize, usize)] = if quick {
        &[
            ("small (200 B)", 20_000, 200),
            ("large (1 MiB)", 20, 1 << 20),
        ]
    } else {
        &[
            ("small (200 B)", 200_000, 200),
            ("medium (16 KiB)", 20_000, 16 * 1024),
            ("large (1 MiB)", 300, 1 << 20),
        ]
    };
    println!("| messages | plain msg/s | metered msg/s | metered ÷ plain |");
    println!("| --- | ---: | ---: | ---: |");
    for &(name, count, size) in cases {
        let (mut plain, mut metered) = (Vec::new(), Vec::new());
        for _ in 0..repeat {
            plain.push(runtime.block_on(run(false, count, size)));
            metered.push(runtime.block_on(run(true, count, size)));
        }
        let (p, m) = (median(plain), median(metered));
        println!("| {name} | {p:.0} | {m:.0} | {:.3} |", m / p);
    }
}
