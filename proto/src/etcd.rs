//! A small etcd v3 client and the leader record masters publish in it
//! (feature `etcd`).
//!
//! It speaks etcd's JSON gRPC gateway (`POST /v3/...`) over plain
//! HTTP/1.1, one request per connection, so no protobuf tooling is
//! needed to build it. Keys and values travel base64-encoded and 64-bit
//! integers as JSON strings, as the gateway wants. Calls block the
//! calling thread for at most [`REQUEST_TIMEOUT`]: async callers wrap
//! them in `spawn_blocking` (see [`detect_leader`]).
//!
//! In high-availability mode every master campaigns for
//! `PREFIX/leader` (see `docs/protocol.md`, "High availability"); the
//! winner writes a [`LeaderInfo`] there, attached to its lease. Agents,
//! schedulers and CLIs given `--master etcd://HOST:PORT/PREFIX`
//! ([`EtcdUrl`]) read that key to find the master to connect to.

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

use base64::Engine as _;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value as Json};

/// Longest one etcd request may take (connect, write, read).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);

/// Largest response body read from etcd.
const MAX_RESPONSE_BYTES: usize = 64 << 20;

/// What a leader publishes at `PREFIX/leader`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaderInfo {
    /// `HOST:PORT` that agents and schedulers connect to.
    pub address: String,
    /// The leading master's id (new at every start).
    pub master_id: String,
}

/// Why an etcd request failed.
#[derive(Debug, thiserror::Error)]
pub enum EtcdError {
    /// etcd could not be reached or the exchange broke off.
    #[error("etcd at {endpoint}: {source}")]
    Io {
        /// `HOST:PORT` of etcd.
        endpoint: String,
        /// Why.
        source: std::io::Error,
    },
    /// etcd answered with an error status or something unreadable.
    #[error("etcd at {endpoint} answered {path}: {message}")]
    Protocol {
        /// `HOST:PORT` of etcd.
        endpoint: String,
        /// The gateway path called.
        path: String,
        /// What was wrong.
        message: String,
    },
    /// An `etcd://` URL or endpoint is malformed.
    #[error("invalid etcd address {0:?}: expected etcd://HOST:PORT/PREFIX (or http://HOST:PORT)")]
    InvalidAddress(String),
}

/// `etcd://HOST:PORT/PREFIX`: where to find the current leader.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdUrl {
    /// `HOST:PORT` of etcd.
    pub endpoint: String,
    /// Key prefix, starting with `/`, without a trailing `/`.
    pub prefix: String,
}

/// One key as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyValue {
    /// The key.
    pub key: Vec<u8>,
    /// The value.
    pub value: Vec<u8>,
    /// Revision at which the key was (last) created.
    pub create_revision: i64,
    /// Revision of the last change.
    pub mod_revision: i64,
    /// Lease the key is attached to (0: none).
    pub lease: i64,
}

/// One write inside a transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TxnOp {
    /// Sets `key` to `value`, attached to `lease` when non-zero.
    Put {
        /// The key.
        key: Vec<u8>,
        /// The value.
        value: Vec<u8>,
        /// Lease id, or 0.
        lease: i64,
    },
    /// Deletes `key`.
    Delete {
        /// The key.
        key: Vec<u8>,
    },
}

/// A client for one etcd endpoint.
#[derive(Debug, Clone)]
pub struct Client {
    endpoint: String,
}

/// What a transaction did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TxnResult {
    /// Whether the compares held (and the success ops were applied).
    pub succeeded: bool,
    /// The store's revision after the transaction.
    pub revision: i64,
}

// === impl EtcdUrl ===

impl EtcdUrl {
    /// Parses `etcd://HOST:PORT/PREFIX`; `None` when `text` is not an
    /// `etcd://` URL at all, an error when it is one but malformed.
    pub fn parse(text: &str) -> Option<Result<EtcdUrl, EtcdError>> {
        let rest = text.trim().strip_prefix("etcd://")?;
        let invalid = || EtcdError::InvalidAddress(text.to_string());
        let Some((endpoint, prefix)) = rest.split_once('/') else {
            return Some(Err(invalid()));
        };
        let prefix = format!("/{}", prefix.trim_end_matches('/'));
        if prefix == "/" || !valid_endpoint(endpoint) {
            return Some(Err(invalid()));
        }
        Some(Ok(EtcdUrl {
            endpoint: endpoint.to_string(),
            prefix,
        }))
    }

    /// The key the leader's [`LeaderInfo`] is stored under.
    pub fn leader_key(&self) -> String {
        leader_key(&self.prefix)
    }
}

impl std::fmt::Display for EtcdUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "etcd://{}{}", self.endpoint, self.prefix)
    }
}

/// `PREFIX/leader`.
pub fn leader_key(prefix: &str) -> String {
    format!("{}/leader", prefix.trim_end_matches('/'))
}

fn valid_endpoint(endpoint: &str) -> bool {
    matches!(endpoint.rsplit_once(':'), Some((host, port))
        if !host.is_empty() && matches!(port.parse::<u16>(), Ok(p) if p != 0))
}

/// Reads the current leader at `url` (`None`: no leader right now).
/// Runs the blocking request on tokio's blocking pool.
pub async fn detect_leader(url: &EtcdUrl) -> Result<Option<LeaderInfo>, EtcdError> {
    let client = Client::new(&url.endpoint)?;
    let key = url.leader_key();
    let endpoint = url.endpoint.clone();
    tokio::task::spawn_blocking(move || client.leader(&key))
        .await
        .unwrap_or_else(|e| {
            Err(EtcdError::Io {
                endpoint,
                source: std::io::Error::other(e),
            })
        })
}

/// How often [`detect_new_leader`] reads the leader key while waiting.
pub const LEADER_POLL: Duration = Duration::from_millis(100);

/// Reads the leader at `url` like [`detect_leader`], but when it is still
/// `previous` (the master a client just lost or could not reach) waits
/// up to `patience`, reading every [`LEADER_POLL`], for a different one:
/// a dead leader's key lives until its lease expires, and a client that
/// follows the key promptly reconnects within a poll of the takeover
/// instead of backing off against the dead address.
pub async fn detect_new_leader(
    url: &EtcdUrl,
    previous: Option<&str>,
    patience: Duration,
) -> Result<Option<LeaderInfo>, EtcdError> {
    let deadline = tokio::time::Instant::now() + patience;
    loop {
        let leader = detect_leader(url).await?;
        let fresh = match (&leader, previous) {
            (Some(l), Some(p)) => l.address != p,
            (Some(_), None) => true,
            (None, _) => false,
        };
        if fresh || tokio::time::Instant::now() + LEADER_POLL > deadline {
            return Ok(leader);
        }
        tokio::time::sleep(LEADER_POLL).await;
    }
}

/// Returns once `url` names a leader other than `address` (or none, or
/// etcd cannot be read), checking every `interval`: a client connected
/// to `address` then drops its connection and detects again. A deposed
/// leader that is merely frozen still holds its connections open; this
/// is how its clients leave it.
pub async fn leader_changed(url: &EtcdUrl, address: &str, interval: Duration) {
    let mut failures = 0u32;
    loop {
        tokio::time::sleep(interval).await;
        match detect_leader(url).await {
            Ok(Some(leader)) if leader.address == address => failures = 0,
            Ok(other) => {
                tracing::info!(leader = ?other.map(|l| l.address), was = address, "the leader changed");
                return;
            }
            // A brief etcd hiccup is no reason to leave a working
            // leader; a long one is (the leader stops too).
            Err(e) => {
                failures += 1;
                if failures >= 3 {
                    tracing::warn!(error = %e, "cannot read the leader from etcd");
                    return;
                }
            }
        }
    }
}

// === impl Client ===

impl Client {
    /// A client for `endpoint` (`HOST:PORT` or `http://HOST:PORT`).
    pub fn new(endpoint: &str) -> Result<Client, EtcdError> {
        let trimmed = endpoint
            .trim()
            .trim_start_matches("http://")
            .trim_end_matches('/');
        if !valid_endpoint(trimmed) {
            return Err(EtcdError::InvalidAddress(endpoint.to_string()));
        }
        Ok(Client {
            endpoint: trimmed.to_string(),
        })
    }

    /// `HOST:PORT` of etcd.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// Grants a lease of `ttl` seconds; returns its id.
    pub fn grant(&self, ttl: i64) -> Result<i64, EtcdError> {
        let path = "/v3/lease/grant";
        let answer = self.call(path, &json!({ "TTL": ttl.to_string() }))?;
        int(&answer, "ID").ok_or_else(|| self.protocol(path, "no lease ID in the answer"))
    }

    /// Renews lease `id`; returns its remaining TTL in seconds (0 or
    /// less: the lease is gone).
    pub fn keep_alive(&self, id: i64) -> Result<i64, EtcdError> {
        let answer = self.call("/v3/lease/keepalive", &json!({ "ID": id.to_string() }))?;
        let result = answer.get("result").unwrap_or(&answer);
        Ok(int(result, "TTL").unwrap_or(0))
    }

    /// Revokes lease `id`, deleting its keys.
    pub fn revoke(&self, id: i64) -> Result<(), EtcdError> {
        self.call("/v3/lease/revoke", &json!({ "ID": id.to_string() }))
            .map(drop)
    }

    /// Reads one key.
    pub fn get(&self, key: &[u8]) -> Result<Option<KeyValue>, EtcdError> {
        let answer = self.call("/v3/kv/range", &json!({ "key": b64(key) }))?;
        Ok(self.kvs(&answer)?.into_iter().next())
    }

    /// Reads every key starting with `prefix`, in key order.
    pub fn get_prefix(&self, prefix: &[u8]) -> Result<Vec<KeyValue>, EtcdError> {
        let answer = self.call(
            "/v3/kv/range",
            &json!({ "key": b64(prefix), "range_end": b64(&prefix_end(prefix)) }),
        )?;
        self.kvs(&answer)
    }

    /// Reads the [`LeaderInfo`] at `key` (`None`: no leader).
    pub fn leader(&self, key: &str) -> Result<Option<LeaderInfo>, EtcdError> {
        match self.get(key.as_bytes())? {
            None => Ok(None),
            Some(kv) => serde_json::from_slice(&kv.value)
                .map(Some)
                .map_err(|e| self.protocol("/v3/kv/range", &format!("bad leader record: {e}"))),
        }
    }

    /// Creates `key` = `value` on `lease` only if the key does not exist.
    /// On success the key's create revision is the result's `revision`.
    pub fn create(&self, key: &[u8], value: &[u8], lease: i64) -> Result<TxnResult, EtcdError> {
        let compare = json!({
            "key": b64(key), "target": "CREATE", "result": "EQUAL", "create_revision": "0"
        });
        self.txn(
            vec![compare],
            &[TxnOp::Put {
                key: key.to_vec(),
                value: value.to_vec(),
                lease,
            }],
        )
    }

    /// Applies `ops` only if `key` still has create revision `revision`
    /// (the fence: it is still the key we created).
    pub fn txn_if_created_at(
        &self,
        key: &[u8],
        revision: i64,
        ops: &[TxnOp],
    ) -> Result<TxnResult, EtcdError> {
        let compare = json!({
            "key": b64(key), "target": "CREATE", "result": "EQUAL",
            "create_revision": revision.to_string()
        });
        self.txn(vec![compare], ops)
    }

    fn txn(&self, compare: Vec<Json>, ops: &[TxnOp]) -> Result<TxnResult, EtcdError> {
        let success: Vec<Json> = ops
            .iter()
            .map(|op| match op {
                TxnOp::Put { key, value, lease } => {
                    let mut put = json!({ "key": b64(key), "value": b64(value) });
                    if *lease != 0 {
                        put["lease"] = Json::String(lease.to_string());
                    }
                    json!({ "request_put": put })
                }
                TxnOp::Delete { key } => json!({ "request_delete_range": { "key": b64(key) } }),
            })
            .collect();
        let answer = self.call(
            "/v3/kv/txn",
            &json!({ "compare": compare, "success": success }),
        )?;
        let revision = answer
            .get("header")
            .and_then(|h| int(h, "revision"))
            .unwrap_or(0);
        Ok(TxnResult {
            succeeded: answer
                .get("succeeded")
                .and_then(Json::as_bool)
                .unwrap_or(false),
            revision,
        })
    }

    fn kvs(&self, answer: &Json) -> Result<Vec<KeyValue>, EtcdError> {
        let Some(kvs) = answer.get("kvs").and_then(Json::as_array) else {
            return Ok(Vec::new());
        };
        kvs.iter()
            .map(|kv| {
                let bytes = |field: &str| {
                    base64::engine::general_purpose::STANDARD
                        .decode(kv.get(field).and_then(Json::as_str).unwrap_or(""))
                        .map_err(|e| self.protocol("/v3/kv/range", &format!("{field}: {e}")))
                };
                Ok(KeyValue {
                    key: bytes("key")?,
                    value: bytes("value")?,
                    create_revision: int(kv, "create_revision").unwrap_or(0),
                    mod_revision: int(kv, "mod_revision").unwrap_or(0),
                    lease: int(kv, "lease").unwrap_or(0),
                })
            })
            .collect()
    }

    fn protocol(&self, path: &str, message: &str) -> EtcdError {
        EtcdError::Protocol {
            endpoint: self.endpoint.clone(),
            path: path.to_string(),
            message: message.to_string(),
        }
    }

    /// One POST; returns the first JSON object of the answer (streaming
    /// calls such as keepalive answer with one object per line).
    fn call(&self, path: &str, body: &Json) -> Result<Json, EtcdError> {
        let io = |source| EtcdError::Io {
            endpoint: self.endpoint.clone(),
            source,
        };
        let body = body.to_string();
        let addr = self
            .endpoint
            .to_socket_addrs()
            .map_err(io)?
            .next()
            .ok_or_else(|| io(std::io::Error::other("no address")))?;
        let mut stream = TcpStream::connect_timeout(&addr, REQUEST_TIMEOUT).map_err(io)?;
        stream.set_read_timeout(Some(REQUEST_TIMEOUT)).map_err(io)?;
        stream
            .set_write_timeout(Some(REQUEST_TIMEOUT))
            .map_err(io)?;
        let request = format!(
            "POST {path} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            self.endpoint,
            body.len()
        );
        stream.write_all(request.as_bytes()).map_err(io)?;
        let deadline = std::time::Instant::now() + REQUEST_TIMEOUT;
        let mut raw = Vec::new();
        let mut buf = [0u8; 16 * 1024];
        loop {
            if let Some((status, body)) = complete_response(&raw) {
                return self.decode_answer(path, status, &body);
            }
            if std::time::Instant::now() >= deadline || raw.len() > MAX_RESPONSE_BYTES {
                return Err(io(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "no complete answer in time",
                )));
            }
            match stream.read(&mut buf) {
                Ok(0) => {
                    return match complete_response(&raw) {
                        Some((status, body)) => self.decode_answer(path, status, &body),
                        None => Err(io(std::io::Error::new(
                            std::io::ErrorKind::UnexpectedEof,
                            "connection closed mid-answer",
                        ))),
                    }
                }
                Ok(n) => raw.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(io(e)),
            }
        }
    }

    fn decode_answer(&self, path: &str, status: u16, body: &[u8]) -> Result<Json, EtcdError> {
        let first = serde_json::Deserializer::from_slice(body)
            .into_iter::<Json>()
            .next();
        let value = match first {
            Some(Ok(v)) => v,
            Some(Err(e)) => return Err(self.protocol(path, &format!("HTTP {status}: {e}"))),
            None => return Err(self.protocol(path, &format!("HTTP {status} with no body"))),
        };
        if let Some(error) = value.get("error") {
            return Err(self.protocol(path, &format!("HTTP {status}: {error}")));
        }
        if status != 200 {
            return Err(self.protocol(path, &format!("HTTP {status}: {value}")));
        }
        Ok(value)
    }
}

/// `(status, body)` once `raw` holds a whole response: a
/// `Content-Length` body, or for a chunked one (streaming calls) the
/// first complete chunk, which holds the one answer we asked for.
fn complete_response(raw: &[u8]) -> Option<(u16, Vec<u8>)> {
    let head_end = raw.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = std::str::from_utf8(&raw[..head_end]).ok()?;
    let rest = &raw[head_end + 4..];
    let mut lines = head.split("\r\n");
    let status: u16 = lines.next()?.split_whitespace().nth(1)?.parse().ok()?;
    let mut length = None;
    let mut chunked = false;
    for line in lines {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        let (name, value) = (name.trim().to_ascii_lowercase(), value.trim());
        if name == "content-length" {
            length = value.parse::<usize>().ok();
        } else if name == "transfer-encoding" && value.eq_ignore_ascii_case("chunked") {
            chunked = true;
        }
    }
    if chunked {
        let mut body = Vec::new();
        let mut at = rest;
        loop {
            let line_end = at.windows(2).position(|w| w == b"\r\n")?;
            let size_text = std::str::from_utf8(&at[..line_end]).ok()?;
            let size = usize::from_str_radix(size_text.split(';').next()?.trim(), 16).ok()?;
            if size == 0 {
                return Some((status, body));
            }
            let data = at.get(line_end + 2..line_end + 2 + size)?;
            body.extend_from_slice(data);
            if serde_json::from_slice::<Json>(trim_ascii(&body)).is_ok() {
                return Some((status, body));
            }
            at = at.get(line_end + 2 + size + 2..)?;
        }
    }
    let length = length?;
    rest.get(..length).map(|body| (status, body.to_vec()))
}

fn trim_ascii(bytes: &[u8]) -> &[u8] {
    let start = bytes.iter().position(|b| !b.is_ascii_whitespace());
    let end = bytes.iter().rposition(|b| !b.is_ascii_whitespace());
    match (start, end) {
        (Some(s), Some(e)) => &bytes[s..=e],
        _ => &[],
    }
}

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

fn int(value: &Json, field: &str) -> Option<i64> {
    match value.get(field)? {
        Json::String(s) => s.parse().ok(),
        Json::Number(n) => n.as_i64(),
        _ => None,
    }
}

/// The smallest key greater than every key starting with `prefix`.
fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn etcd_urls_parse() {
        let url = EtcdUrl::parse("etcd://127.0.0.1:2379/agora")
            .unwrap()
            .unwrap();
        assert_eq!(url.endpoint, "127.0.0.1:2379");
        assert_eq!(url.prefix, "/agora");
        assert_eq!(url.leader_key(), "/agora/leader");
        assert_eq!(url.to_string(), "etcd://127.0.0.1:2379/agora");
        assert!(EtcdUrl::parse("127.0.0.1:5050").is_none());
        for bad in ["etcd://h:1", "etcd://h:1/", "etcd://h/p", "etcd://:1/p"] {
            assert!(EtcdUrl::parse(bad).unwrap().is_err(), "{bad}");
        }
    }

    #[test]
    fn responses_are_framed() {
        let plain = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}";
        assert_eq!(complete_response(plain), Some((200, b"{}".to_vec())));
        assert_eq!(complete_response(&plain[..plain.len() - 1]), None);
        let chunked =
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n{\"a\":\r\n2\r\n1}\r\n";
        assert_eq!(
            complete_response(chunked),
            Some((200, b"{\"a\":1}".to_vec()))
        );
    }

    #[test]
    fn prefix_end_increments_the_last_byte() {
        assert_eq!(prefix_end(b"/a/"), b"/a0");
        assert_eq!(prefix_end(&[b'a', 0xff]), b"b");
    }
}
