//! The client from threads that are not async: tests, and stores whose
//! interface is blocking (the master's registry, the worker store).
//!
//! Requests run on one background runtime shared by the process (one
//! worker thread, started on first use); the calling thread waits for
//! the answer. Safe to call from inside another runtime (the caller's
//! thread blocks, as any blocking call would), but not from a future
//! running on this module's own runtime.

use std::future::Future;
use std::sync::OnceLock;

use crate::{ClientError, Http, Response};

fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("agora-client-blocking")
            .enable_all()
            .build()
            .unwrap_or_else(|e| panic!("cannot start the HTTP client's runtime: {e}"))
    })
}

fn http() -> &'static Http {
    static HTTP: OnceLock<Http> = OnceLock::new();
    HTTP.get_or_init(Http::new)
}

/// Runs `future` on the shared background runtime and waits for it.
pub fn block_on<F>(future: F) -> F::Output
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    runtime().spawn(async move {
        let _ = tx.send(future.await);
    });
    match rx.recv() {
        Ok(output) => output,
        // The task panicked: carry the panic to the caller.
        Err(_) => panic!("a blocking HTTP call panicked"),
    }
}

/// `GET http://ADDRESS/PATH`, whatever the status.
pub fn get(address: impl std::fmt::Display, path: &str) -> Result<Response, ClientError> {
    let (address, path) = (address.to_string(), path.to_string());
    block_on(async move { http().get(address, &path).await })
}

/// Any request, whatever the status (see [`Http::request`]).
pub fn request(
    method: hyper::Method,
    address: impl std::fmt::Display,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<Vec<u8>>,
) -> Result<Response, ClientError> {
    let (address, path) = (address.to_string(), path.to_string());
    let headers: Vec<(String, String)> = headers
        .iter()
        .map(|(n, v)| (n.to_string(), v.to_string()))
        .collect();
    block_on(async move {
        let headers: Vec<(&str, &str)> = headers
            .iter()
            .map(|(n, v)| (n.as_str(), v.as_str()))
            .collect();
        http().request(method, address, &path, &headers, body).await
    })
}
