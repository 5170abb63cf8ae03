//! [`Client`]: unary calls on etcd's JSON gateway.

use std::time::Duration;

use agora_client::{ClientError, Http, Method};
use base64::Engine as _;
use serde_json::{json, Value as Json};

use crate::watch::{self, Watch};

/// Longest one etcd request may take (connect, write, read).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);

/// Largest answer read from etcd.
const MAX_RESPONSE_BYTES: usize = 64 << 20;

/// Why an etcd request failed.
#[derive(Debug, thiserror::Error)]
pub enum EtcdError {
    /// etcd could not be reached, or the exchange broke off or timed out.
    #[error("etcd at {endpoint}: {source}")]
    Http {
        /// `HOST:PORT` of etcd.
        endpoint: String,
        /// Why.
        source: ClientError,
    },
    /// etcd answered with an error or something unreadable.
    #[error("etcd at {endpoint} answered {path}: {message}")]
    Protocol {
        /// `HOST:PORT` of etcd.
        endpoint: String,
        /// The gateway path called.
        path: String,
        /// What was wrong.
        message: String,
    },
    /// An endpoint is malformed.
    #[error("invalid etcd endpoint {0:?}: expected HOST:PORT or http://HOST:PORT")]
    InvalidEndpoint(String),
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

/// What a transaction did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TxnResult {
    /// Whether the compares held (and the success ops were applied).
    pub succeeded: bool,
    /// The store's revision after the transaction.
    pub revision: i64,
}

/// A client for one etcd endpoint (cheap to clone; clones share their
/// connections).
#[derive(Debug, Clone)]
pub struct Client {
    http: Http,
    endpoint: String,
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
            return Err(EtcdError::InvalidEndpoint(endpoint.to_string()));
        }
        Ok(Client {
            http: Http::new()
                .with_timeout(REQUEST_TIMEOUT)
                .with_max_body(MAX_RESPONSE_BYTES),
            endpoint: trimmed.to_string(),
        })
    }

    /// `HOST:PORT` of etcd.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// Grants a lease of `ttl` seconds; returns its id.
    pub async fn grant(&self, ttl: i64) -> Result<i64, EtcdError> {
        let path = "/v3/lease/grant";
        let answer = self.call(path, &json!({ "TTL": ttl.to_string() })).await?;
        int(&answer, "ID").ok_or_else(|| self.protocol(path, "no lease ID in the answer"))
    }

    /// Renews lease `id` once; returns its remaining TTL in seconds (0
    /// or less: the lease is gone).
    ///
    /// The gateway maps etcd's keep-alive stream onto one HTTP request
    /// per renewal: the leader renews every fraction of its TTL over a
    /// pooled connection.
    pub async fn keep_alive(&self, id: i64) -> Result<i64, EtcdError> {
        let answer = self
            .call("/v3/lease/keepalive", &json!({ "ID": id.to_string() }))
            .await?;
        let result = answer.get("result").unwrap_or(&answer);
        Ok(int(result, "TTL").unwrap_or(0))
    }

    /// Revokes lease `id`, deleting its keys.
    pub async fn revoke(&self, id: i64) -> Result<(), EtcdError> {
        self.call("/v3/lease/revoke", &json!({ "ID": id.to_string() }))
            .await
            .map(drop)
    }

    /// Reads one key.
    pub async fn get(&self, key: &[u8]) -> Result<Option<KeyValue>, EtcdError> {
        Ok(self.get_at(key).await?.0)
    }

    /// Reads one key, with the store's revision at the read: a watch from
    /// the next revision misses no change after it.
    pub async fn get_at(&self, key: &[u8]) -> Result<(Option<KeyValue>, i64), EtcdError> {
        let answer = self
            .call("/v3/kv/range", &json!({ "key": b64(key) }))
            .await?;
        let revision = header_revision(&answer);
        Ok((self.kvs(&answer)?.into_iter().next(), revision))
    }

    /// Reads every key starting with `prefix`, in key order.
    pub async fn get_prefix(&self, prefix: &[u8]) -> Result<Vec<KeyValue>, EtcdError> {
        let answer = self
            .call(
                "/v3/kv/range",
                &json!({ "key": b64(prefix), "range_end": b64(&prefix_end(prefix)) }),
            )
            .await?;
        self.kvs(&answer)
    }

    /// Creates `key` = `value` on `lease` only if the key does not exist.
    /// On success the key's create revision is the result's `revision`.
    pub async fn create(
        &self,
        key: &[u8],
        value: &[u8],
        lease: i64,
    ) -> Result<TxnResult, EtcdError> {
        let compare = json!({
            "key": b64(key), "target": "CREATE", "result": "EQUAL", "create_revision": "0"
        });
        let put = TxnOp::Put {
            key: key.to_vec(),
            value: value.to_vec(),
            lease,
        };
        self.txn(vec![compare], &[put]).await
    }

    /// Applies `ops` only if `key` still has create revision `revision`
    /// (the fence: it is still the key we created).
    pub async fn txn_if_created_at(
        &self,
        key: &[u8],
        revision: i64,
        ops: &[TxnOp],
    ) -> Result<TxnResult, EtcdError> {
        let compare = json!({
            "key": b64(key), "target": "CREATE", "result": "EQUAL",
            "create_revision": revision.to_string()
        });
        self.txn(vec![compare], ops).await
    }

    /// Watches `key` from `start_revision` (0: from now on). Returns once
    /// etcd has confirmed the watch.
    pub async fn watch(&self, key: &[u8], start_revision: i64) -> Result<Watch, EtcdError> {
        let mut create = json!({ "key": b64(key) });
        if start_revision > 0 {
            create["start_revision"] = Json::String(start_revision.to_string());
        }
        let body = json!({ "create_request": create }).to_string().into_bytes();
        let stream = self
            .http
            .stream(
                Method::POST,
                &self.endpoint,
                watch::PATH,
                &[("content-type", "application/json")],
                Some(body),
            )
            .await
            .map_err(|source| self.http_error(source))?;
        Watch::start(self.clone(), stream).await
    }

    async fn txn(&self, compare: Vec<Json>, ops: &[TxnOp]) -> Result<TxnResult, EtcdError> {
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
        let answer = self
            .call(
                "/v3/kv/txn",
                &json!({ "compare": compare, "success": success }),
            )
            .await?;
        Ok(TxnResult {
            succeeded: answer
                .get("succeeded")
                .and_then(Json::as_bool)
                .unwrap_or(false),
            revision: header_revision(&answer),
        })
    }

    fn kvs(&self, answer: &Json) -> Result<Vec<KeyValue>, EtcdError> {
        let Some(kvs) = answer.get("kvs").and_then(Json::as_array) else {
            return Ok(Vec::new());
        };
        kvs.iter()
            .map(|kv| key_value(kv).map_err(|m| self.protocol("/v3/kv/range", &m)))
            .collect()
    }

    pub(crate) fn protocol(&self, path: &str, message: &str) -> EtcdError {
        EtcdError::Protocol {
            endpoint: self.endpoint.clone(),
            path: path.to_string(),
            message: message.to_string(),
        }
    }

    pub(crate) fn http_error(&self, source: ClientError) -> EtcdError {
        EtcdError::Http {
            endpoint: self.endpoint.clone(),
            source,
        }
    }

    /// One POST; returns the first JSON object of the answer (streaming
    /// calls such as keep-alive answer with one object per line, and
    /// the rest is not waited for).
    async fn call(&self, path: &str, body: &Json) -> Result<Json, EtcdError> {
        let exchange = async {
            let mut stream = self
                .http
                .stream(
                    Method::POST,
                    &self.endpoint,
                    path,
                    &[("content-type", "application/json")],
                    Some(body.to_string().into_bytes()),
                )
                .await
                .map_err(|source| self.http_error(source))?;
            let status = stream.status;
            let mut raw = Vec::new();
            loop {
                if let Some(value) = first_value(&raw) {
                    return self.decode_answer(path, status, value);
                }
                match stream.chunk().await {
                    Ok(Some(data)) => {
                        if raw.len().saturating_add(data.len()) > MAX_RESPONSE_BYTES {
                            return Err(self.protocol(path, "answer too large"));
                        }
                        raw.extend_from_slice(&data);
                    }
                    Ok(None) => {
                        return match first_value(&raw) {
                            Some(value) => self.decode_answer(path, status, value),
                            None => Err(self.protocol(
                                path,
                                &format!("HTTP {status}: {}", String::from_utf8_lossy(&raw).trim()),
                            )),
                        }
                    }
                    Err(source) => return Err(self.http_error(source)),
                }
            }
        };
        tokio::time::timeout(REQUEST_TIMEOUT, exchange)
            .await
            .unwrap_or_else(|_| {
                Err(self.http_error(ClientError::Timeout {
                    method: Method::POST,
                    url: format!("http://{}{path}", self.endpoint),
                    timeout: REQUEST_TIMEOUT,
                }))
            })
    }

    fn decode_answer(
        &self,
        path: &str,
        status: u16,
        value: Result<Json, serde_json::Error>,
    ) -> Result<Json, EtcdError> {
        let value = value.map_err(|e| self.protocol(path, &format!("HTTP {status}: {e}")))?;
        if let Some(error) = value.get("error") {
            return Err(self.protocol(path, &format!("HTTP {status}: {error}")));
        }
        if status != 200 {
            return Err(self.protocol(path, &format!("HTTP {status}: {value}")));
        }
        Ok(value)
    }
}

/// The first JSON value in `raw` once it is complete: `None` while more
/// bytes are needed (or there are none).
pub(crate) fn first_value(raw: &[u8]) -> Option<Result<Json, serde_json::Error>> {
    match serde_json::Deserializer::from_slice(raw)
        .into_iter::<Json>()
        .next()?
    {
        Err(e) if e.is_eof() => None,
        other => Some(other),
    }
}

pub(crate) fn key_value(kv: &Json) -> Result<KeyValue, String> {
    let bytes = |field: &str| {
        base64::engine::general_purpose::STANDARD
            .decode(kv.get(field).and_then(Json::as_str).unwrap_or(""))
            .map_err(|e| format!("{field}: {e}"))
    };
    Ok(KeyValue {
        key: bytes("key")?,
        value: bytes("value")?,
        create_revision: int(kv, "create_revision").unwrap_or(0),
        mod_revision: int(kv, "mod_revision").unwrap_or(0),
        lease: int(kv, "lease").unwrap_or(0),
    })
}

pub(crate) fn header_revision(answer: &Json) -> i64 {
    answer
        .get("header")
        .and_then(|h| int(h, "revision"))
        .unwrap_or(0)
}

fn valid_endpoint(endpoint: &str) -> bool {
    matches!(endpoint.rsplit_once(':'), Some((host, port))
        if !host.is_empty() && matches!(port.parse::<u16>(), Ok(p) if p != 0))
}

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

pub(crate) fn int(value: &Json, field: &str) -> Option<i64> {
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
    fn prefix_end_increments_the_last_byte() {
        assert_eq!(prefix_end(b"/a/"), b"/a0");
        assert_eq!(prefix_end(&[b'a', 0xff]), b"b");
    }

    #[test]
    fn values_are_taken_whole() {
        assert!(first_value(b"").is_none());
        assert!(first_value(b"{\"a\":").is_none());
        assert_eq!(
            first_value(b"{\"a\":1}\n{\"b\"").unwrap().unwrap(),
            json!({"a": 1})
        );
        assert!(first_value(b"<html>").unwrap().is_err());
    }

    #[test]
    fn endpoints_are_checked() {
        assert_eq!(
            Client::new("http://127.0.0.1:2379/").unwrap().endpoint(),
            "127.0.0.1:2379"
        );
        for bad in ["", "h", "h:0", ":1", "h:x"] {
            assert!(Client::new(bad).is_err(), "{bad}");
        }
    }
}
