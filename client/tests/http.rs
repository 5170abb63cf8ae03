//! The HTTP client against servers on 127.0.0.1: an axum app for the
//! typed calls, and raw sockets for answers no good server sends (the
//! hand-written clients this replaces panicked or hung on some of them).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use agora_client::{AgentClient, ClientError, Http, MasterClient};
use axum::body::Body;
use axum::extract::Query;
use axum::routing::get;
use axum::{Json, Router};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

async fn serve(app: Router) -> std::net::SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

/// A server that reads a request and answers `raw`, then keeps the
/// connection open (or never answers, for an empty `raw`).
async fn raw_server(raw: &'static [u8]) -> std::net::SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((mut socket, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                let _ = socket.read(&mut buf).await;
                if !raw.is_empty() {
                    let _ = socket.write_all(raw).await;
                }
                tokio::time::sleep(Duration::from_secs(30)).await;
            });
        }
    });
    addr
}

fn tasks_app() -> Router {
    Router::new()
        .route(
            "/api/v1/tasks",
            get(|Query(q): Query<HashMap<String, String>>| async move {
                let offset: usize = q["offset"].parse().unwrap();
                let limit: usize = q["limit"].parse().unwrap();
                // 25 tasks, at most 10 a page whatever the limit asked.
                let items: Vec<Value> = (offset..25)
                    .take(limit.min(10))
                    .map(|i| json!({ "id": format!("t{i}"), "state": q.get("state") }))
                    .collect();
                Json(json!({ "items": items, "total": 25 }))
            }),
        )
        .route(
            "/state",
            get(|| async {
                // A multi-byte character split across two chunks.
                let chunks: Vec<Result<&'static [u8], std::io::Error>> =
                    vec![Ok(b"{\"name\":\"caf\xc3"), Ok(b"\xa9\"}")];
                Body::from_stream(futures::stream::iter(chunks))
            }),
        )
        .route(
            "/files/{f}/{e}/{file}",
            get(|Query(q): Query<HashMap<String, String>>| async move {
                Json(json!({
                    "path": "stdout", "run_id": "r1", "size": 11, "eof": true,
                    "offset": q["offset"].parse::<u64>().unwrap(), "length": 5, "data": "héllo"
                }))
            }),
        )
}

#[tokio::test]
async fn typed_calls_read_pages_files_and_split_characters() {
    let addr = serve(tasks_app()).await;
    let master = MasterClient::new(addr);
    let tasks = master.list("/api/v1/tasks", "state=running").await.unwrap();
    assert_eq!(tasks.len(), 25, "every page is read");
    assert_eq!(tasks[24]["id"], "t24");
    assert_eq!(tasks[0]["state"], "running");
    // The old client decoded the body lossily, then sliced it at chunk
    // sizes from the wire and panicked inside a character.
    let state = master.state().await.unwrap();
    assert_eq!(state["name"], "café");
    let chunk = AgentClient::new(addr)
        .file("fw 1", "ex/1", "stdout", 6, 5)
        .await
        .unwrap();
    assert_eq!((chunk.offset, chunk.length, chunk.eof), (6, 5, true));
    assert_eq!(chunk.data, "héllo");
    match master.get_json("/missing").await {
        Err(ClientError::Status { status: 404, .. }) => {}
        other => panic!("expected a 404 error, got {other:?}"),
    }
}

#[tokio::test]
async fn a_huge_chunk_size_is_an_error_not_a_panic() {
    // The etcd client this replaces added such a size to an offset and
    // overflowed.
    let addr =
        raw_server(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nffffffffffffffff\r\nabc")
            .await;
    let http = Http::new().with_timeout(Duration::from_secs(2));
    assert!(http.get(addr, "/").await.is_err());
}

#[tokio::test]
async fn a_body_ends_at_its_content_length() {
    // The connection stays open after the body: reading to the end of
    // the stream (as the old client did) would wait for the timeout.
    let addr = raw_server(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok").await;
    let started = Instant::now();
    let response = Http::new().get(addr, "/").await.unwrap();
    assert_eq!((response.status, response.text().as_str()), (200, "ok"));
    assert!(started.elapsed() < Duration::from_secs(2));
}

#[tokio::test]
async fn silence_and_oversized_bodies_are_errors() {
    let silent = raw_server(b"").await;
    let http = Http::new().with_timeout(Duration::from_millis(300));
    let started = Instant::now();
    assert!(matches!(
        http.get(silent, "/").await,
        Err(ClientError::Timeout { .. })
    ));
    assert!(started.elapsed() < Duration::from_secs(2));
    let big = raw_server(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n0123456789").await;
    let small = Http::new().with_max_body(4);
    assert!(matches!(
        small.get(big, "/").await,
        Err(ClientError::TooLarge { limit: 4, .. })
    ));
    assert!(matches!(
        Http::new().get("not an address", "/").await,
        Err(ClientError::InvalidUrl(_))
    ));
}

#[tokio::test]
async fn streams_are_read_as_they_come() {
    let addr = raw_server(
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\none\r\n3\r\ntwo\r\n",
    )
    .await;
    let mut stream = Http::new()
        .stream(agora_client::Method::GET, addr, "/", &[], None)
        .await
        .unwrap();
    assert_eq!(stream.status, 200);
    let mut got = Vec::new();
    while got.len() < 6 {
        got.extend_from_slice(&stream.chunk().await.unwrap().unwrap());
    }
    assert_eq!(got, b"onetwo");
}

#[test]
fn the_blocking_client_works_with_or_without_a_runtime() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let addr = runtime.block_on(serve(tasks_app()));
    let response = agora_client::blocking::get(addr, "/state").unwrap();
    assert_eq!(response.status, 200);
    let inside = runtime.block_on(async move {
        agora_client::blocking::request(
            agora_client::Method::GET,
            addr,
            "/api/v1/tasks?offset=0&limit=1",
            &[("accept", "application/json")],
            None,
        )
        .unwrap()
    });
    assert_eq!(inside.json::<Value>().unwrap()["total"], 25);
}
