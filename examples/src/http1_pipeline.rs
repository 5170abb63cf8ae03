//! HTTP/1.1 pipelining for a [`crate::mesos_v1_client::CallPipeline`]:
//! calls written back to back on one keep-alive connection without
//! waiting for the answers, which come back in order (RFC 9112 §9.3.2).
//!
//! hyper's client keeps one request in flight per connection, so a
//! client making one small call per status update (ACKNOWLEDGE) pays a
//! write, a read and two wake-ups per call on each side. Pipelined, a
//! burst of calls is one write, its answers one read, and the server
//! reads the burst at once. Requests are written here from their parts;
//! answers are parsed with `httparse` (hyper's own parser) and must carry
//! a `Content-Length` (every answer to a call does: `202` with an empty
//! body, or an error with a text body); anything else fails the
//! connection, and with it every call in flight on it.

use std::collections::VecDeque;
use std::sync::Arc;

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::{mpsc, Mutex, Semaphore};

/// Most header lines an answer may have.
const MAX_HEADERS: usize = 32;
/// Longest answer (head and body) the reader buffers.
const MAX_ANSWER: usize = 1 << 20;

/// One answer: its status and body.
#[derive(Debug, PartialEq, Eq)]
pub struct Answer {
    /// The status code.
    pub status: u16,
    /// The body.
    pub body: bytes::Bytes,
}

/// Appends a `POST` of `body` to `path` with `headers` (name, value) to
/// `out`, as HTTP/1.1 with a `Content-Length`.
pub fn write_request(
    out: &mut Vec<u8>,
    host: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) {
    RequestHead::new(host, path, headers).write(out, body);
}

/// The head every request of a connection shares (method, path, `Host`
/// and the other fixed headers), written once: a request is then this,
/// its `Content-Length` and its body.
#[derive(Debug, Clone)]
pub struct RequestHead {
    /// Everything up to the `Content-Length` value.
    prefix: Vec<u8>,
}

// === impl RequestHead ===

impl RequestHead {
    /// The head of a `POST` to `path` at `host` with `headers` (name,
    /// value).
    pub fn new(host: &str, path: &str, headers: &[(&str, &str)]) -> Self {
        let mut prefix = Vec::new();
        prefix.extend_from_slice(b"POST ");
        prefix.extend_from_slice(path.as_bytes());
        prefix.extend_from_slice(b" HTTP/1.1\r\nHost: ");
        prefix.extend_from_slice(host.as_bytes());
        for (name, value) in headers {
            prefix.extend_from_slice(b"\r\n");
            prefix.extend_from_slice(name.as_bytes());
            prefix.extend_from_slice(b": ");
            prefix.extend_from_slice(value.as_bytes());
        }
        prefix.extend_from_slice(b"\r\nContent-Length: ");
        RequestHead { prefix }
    }

    /// Appends a request with this head and `body` to `out`.
    pub fn write(&self, out: &mut Vec<u8>, body: &[u8]) {
        out.reserve(self.prefix.len() + 24 + body.len());
        out.extend_from_slice(&self.prefix);
        write_decimal(out, body.len());
        out.extend_from_slice(b"\r\n\r\n");
        out.extend_from_slice(body);
    }
}

/// Appends `n` in decimal ASCII.
fn write_decimal(out: &mut Vec<u8>, mut n: usize) {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    loop {
        at -= 1;
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[at..]);
}

/// Takes the first whole answer off `buf`: `Ok(None)` until one has
/// arrived, an error when it is malformed, has no `Content-Length`, or
/// would be longer than [`MAX_ANSWER`].
pub fn take_answer(buf: &mut BytesMut) -> Result<Option<Answer>, String> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut response = httparse::Response::new(&mut headers);
    let head = match response.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) if buf.len() > MAX_ANSWER => {
            return Err(format!("an answer's head is over {MAX_ANSWER} bytes"));
        }
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(e) => return Err(format!("malformed answer: {e}")),
    };
    let status = response.code.unwrap_or(0);
    let mut length = None;
    for h in response.headers.iter() {
        if h.name.eq_ignore_ascii_case("transfer-encoding") {
            return Err("a chunked answer to a call (expected a Content-Length)".into());
        }
        if h.name.eq_ignore_ascii_case("content-length") {
            let value = std::str::from_utf8(h.value)
                .ok()
                .and_then(|v| v.trim().parse::<usize>().ok())
                .ok_or_else(|| "an answer's Content-Length is not a number".to_string())?;
            length = Some(value);
        }
    }
    let Some(length) = length else {
        return Err(format!("the {status} answer has no Content-Length"));
    };
    if head + length > MAX_ANSWER {
        return Err(format!("an answer is over {MAX_ANSWER} bytes"));
    }
    if buf.len() < head + length {
        return Ok(None);
    }
    buf.advance(head);
    let body = buf.split_to(length).freeze();
    Ok(Some(Answer { status, body }))
}

/// Drives one pipelined connection: takes batches of requests from
/// `queue` (shared with the other connections), at most `depth`
/// unanswered at once; `encode` appends each to the burst written with
/// one write (every request queued, as far as the window allows) and gives
/// its tag (or `None` when it cannot be written, having said why);
/// `answered` gets each answer (or the connection's failure) with its
/// request's tag, in order. Returns when the queue is closed and every
/// answer is in, or at the first failure (after failing every call in
/// flight).
pub async fn drive<R, T, E, F>(
    stream: tokio::net::TcpStream,
    queue: Arc<Mutex<mpsc::Receiver<Vec<R>>>>,
    depth: usize,
    encode: E,
    answered: F,
) -> Result<(), String>
where
    R: Send + 'static,
    T: Send + 'static,
    E: FnMut(R, &mut Vec<u8>) -> Option<T> + Send + 'static,
    F: Fn(T, Result<Answer, String>),
{
    let (read, write) = stream.into_split();
    let window = Arc::new(Semaphore::new(depth.max(1)));
    let in_flight: Arc<std::sync::Mutex<VecDeque<T>>> = Arc::default();
    let writer = tokio::spawn(write_bursts(
        write,
        queue,
        window.clone(),
        in_flight.clone(),
        encode,
    ));
    let result = read_answers(read, window, in_flight.clone(), &answered, writer).await;
    if let Err(e) = &result {
        let lost: Vec<T> = in_flight
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain(..)
            .collect();
        for tag in lost {
            answered(tag, Err(e.clone()));
        }
    }
    result
}

/// The writing half: a burst is every request queued (up to the window)
/// in one write.
async fn write_bursts<R, T, E>(
    mut write: OwnedWriteHalf,
    queue: Arc<Mutex<mpsc::Receiver<Vec<R>>>>,
    window: Arc<Semaphore>,
    in_flight: Arc<std::sync::Mutex<VecDeque<T>>>,
    mut encode: E,
) -> Result<(), String>
where
    E: FnMut(R, &mut Vec<u8>) -> Option<T>,
{
    let mut burst = Vec::new();
    let mut tags = Vec::new();
    let mut pending: VecDeque<R> = VecDeque::new();
    loop {
        {
            let mut rx = queue.lock().await;
            let Some(batch) = rx.recv().await else {
                return Ok(());
            };
            pending.extend(batch);
            // Whatever else is queued already goes along.
            while let Ok(batch) = rx.try_recv() {
                pending.extend(batch);
            }
        }
        while let Some(request) = pending.pop_front() {
            let permit = match window.try_acquire() {
                Ok(permit) => permit,
                Err(_) => {
                    // The window is full: what is encoded goes out, then
                    // the next place is awaited.
                    flush(&mut write, &mut burst, &mut tags, &in_flight).await?;
                    window.acquire().await.map_err(|e| e.to_string())?
                }
            };
            if let Some(tag) = encode(request, &mut burst) {
                permit.forget();
                tags.push(tag);
            }
        }
        flush(&mut write, &mut burst, &mut tags, &in_flight).await?;
    }
}

/// Writes `burst` with one write, its `tags` in flight first (an answer
/// may come back before the write returns).
async fn flush<T>(
    write: &mut OwnedWriteHalf,
    burst: &mut Vec<u8>,
    tags: &mut Vec<T>,
    in_flight: &std::sync::Mutex<VecDeque<T>>,
) -> Result<(), String> {
    if burst.is_empty() {
        return Ok(());
    }
    in_flight
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .extend(tags.drain(..));
    let result = write
        .write_all(burst)
        .await
        .map_err(|e| format!("writing calls to the master: {e}"));
    burst.clear();
    result
}

/// The reading half: answers in order, each giving its place in the
/// window back. Ends once the writer has ended and nothing is in flight.
async fn read_answers<T, F>(
    mut read: OwnedReadHalf,
    window: Arc<Semaphore>,
    in_flight: Arc<std::sync::Mutex<VecDeque<T>>>,
    answered: &F,
    mut writer: tokio::task::JoinHandle<Result<(), String>>,
) -> Result<(), String>
where
    F: Fn(T, Result<Answer, String>),
{
    let mut buf = BytesMut::with_capacity(16 * 1024);
    let mut writer_done = false;
    loop {
        while let Some(answer) = take_answer(&mut buf)? {
            let tag = in_flight
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .pop_front()
                .ok_or_else(|| "an answer to no request".to_string())?;
            window.add_permits(1);
            answered(tag, Ok(answer));
        }
        let idle = in_flight
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_empty();
        if writer_done && idle {
            return Ok(());
        }
        tokio::select! {
            n = read.read_buf(&mut buf) => {
                match n.map_err(|e| format!("reading answers from the master: {e}"))? {
                    0 => return Err("the master closed the connection".into()),
                    _ => continue,
                }
            }
            w = &mut writer, if !writer_done => {
                writer_done = true;
                w.map_err(|e| e.to_string())??;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_is_written_with_its_length() {
        let mut out = Vec::new();
        write_request(
            &mut out,
            "127.0.0.1:5050",
            "/api/v1/scheduler",
            &[("Content-Type", "application/json")],
            b"{}",
        );
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "POST /api/v1/scheduler HTTP/1.1\r\nHost: 127.0.0.1:5050\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"
        );
    }

    #[test]
    fn a_shared_head_writes_each_body_with_its_own_length() {
        let head = RequestHead::new("h:1", "/p", &[("A", "b")]);
        let mut out = Vec::new();
        head.write(&mut out, b"");
        head.write(&mut out, &[b'x'; 1234]);
        let text = String::from_utf8(out).unwrap();
        let expected = format!(
            "POST /p HTTP/1.1\r\nHost: h:1\r\nA: b\r\nContent-Length: 0\r\n\r\nPOST /p HTTP/1.1\r\nHost: h:1\r\nA: b\r\nContent-Length: 1234\r\n\r\n{}",
            "x".repeat(1234)
        );
        assert_eq!(text, expected);
    }

    #[test]
    fn answers_are_taken_whole_and_in_order_across_any_split() {
        let wire = b"HTTP/1.1 202 Accepted\r\ncontent-length: 0\r\n\r\nHTTP/1.1 400 Bad Request\r\ncontent-length: 4\r\n\r\nnope";
        for split in 0..wire.len() {
            let mut buf = BytesMut::from(&wire[..split]);
            let mut answers = Vec::new();
            while let Some(a) = take_answer(&mut buf).unwrap() {
                answers.push(a);
            }
            buf.extend_from_slice(&wire[split..]);
            while let Some(a) = take_answer(&mut buf).unwrap() {
                answers.push(a);
            }
            assert_eq!(
                answers,
                vec![
                    Answer {
                        status: 202,
                        body: bytes::Bytes::new()
                    },
                    Answer {
                        status: 400,
                        body: bytes::Bytes::from_static(b"nope")
                    }
                ],
                "split at {split}"
            );
            assert!(buf.is_empty());
        }
    }

    #[test]
    fn answers_without_a_length_or_chunked_or_garbage_fail() {
        for wire in [
            &b"HTTP/1.1 202 Accepted\r\n\r\n"[..],
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n0\r\n\r\n",
            b"HTTP/1.1 202 Accepted\r\ncontent-length: x\r\n\r\n",
            b"SMTP ready\r\n\r\n",
        ] {
            let mut buf = BytesMut::from(wire);
            assert!(take_answer(&mut buf).is_err(), "{wire:?}");
        }
        let mut buf =
            BytesMut::from(&b"HTTP/1.1 202 Accepted\r\ncontent-length: 99999999\r\n\r\n"[..]);
        assert!(take_answer(&mut buf).is_err());
    }
}
