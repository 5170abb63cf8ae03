//! Typed clients for the master's and agents' HTTP endpoints
//! (`docs/http.md`).

use std::fmt::Display;

use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};
use serde::Deserialize;
use serde_json::Value;

use crate::{ClientError, Http, Response};

/// Items asked for per request when [`MasterClient::list`] reads a
/// whole paginated list.
pub const PAGE: usize = 10_000;

/// Longest piece of an unexpected answer's body kept in an error.
const ERROR_BODY_CHARS: usize = 500;

/// What a query value may hold unencoded (RFC 3986's unreserved
/// characters).
const QUERY_VALUE: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'~');

/// One server's HTTP endpoints: what [`MasterClient`] and
/// [`AgentClient`] share (they dereference to it).
#[derive(Debug, Clone)]
pub struct Peer {
    http: Http,
    address: String,
}

/// A master's HTTP endpoints.
#[derive(Debug, Clone)]
pub struct MasterClient(Peer);

/// An agent's HTTP endpoints.
#[derive(Debug, Clone)]
pub struct AgentClient(Peer);

/// A window of a sandbox file, as an agent's `GET /files/…` answers it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct FileChunk {
    /// The path inside the sandbox.
    #[serde(default)]
    pub path: String,
    /// The run whose sandbox was read.
    #[serde(default)]
    pub run_id: String,
    /// Where `data` starts, in bytes.
    pub offset: u64,
    /// How many bytes of the file `data` holds: ask next from
    /// `offset + length`.
    pub length: u64,
    /// The file's size when it was read.
    #[serde(default)]
    pub size: u64,
    /// Whether `offset + length` reached `size`.
    pub eof: bool,
    /// The bytes, as UTF-8.
    pub data: String,
}

/// Percent-encodes a query or path value.
pub fn encode(value: &str) -> String {
    utf8_percent_encode(value, QUERY_VALUE).to_string()
}

/// `GET` `path` and its JSON body; any status but 200 is an error.
async fn get_json(http: &Http, address: &str, path: &str) -> Result<Value, ClientError> {
    let response = http.get(address, path).await?;
    expect_ok(address, path, &response)?;
    response.json().map_err(|source| ClientError::Json {
        url: format!("{}://{address}{path}", http.scheme()),
        source,
    })
}

fn expect_ok(address: &str, path: &str, response: &Response) -> Result<(), ClientError> {
    if response.status == 200 {
        return Ok(());
    }
    let text = response.text();
    Err(ClientError::Status {
        url: format!("http://{address}{path}"),
        status: response.status,
        body: text.trim().chars().take(ERROR_BODY_CHARS).collect(),
    })
}

// === impl Peer ===

impl Peer {
    /// The server at `address` (`HOST:PORT`), through `http`.
    pub fn new(http: Http, address: impl Display) -> Peer {
        Peer {
            http,
            address: address.to_string(),
        }
    }

    /// `HOST:PORT`.
    pub fn address(&self) -> &str {
        &self.address
    }

    /// `GET path`, whatever the status.
    pub async fn get(&self, path: &str) -> Result<Response, ClientError> {
        self.http.get(&self.address, path).await
    }

    /// `GET path` as JSON; any status but 200 is an error.
    pub async fn get_json(&self, path: &str) -> Result<Value, ClientError> {
        get_json(&self.http, &self.address, path).await
    }

    /// `POST path` with a JSON body, whatever the status.
    pub async fn post_json(&self, path: &str, body: &Value) -> Result<Response, ClientError> {
        self.http
            .post(
                &self.address,
                path,
                "application/json",
                serde_json::to_vec(body).unwrap_or_default(),
            )
            .await
    }

    /// `/state`.
    pub async fn state(&self) -> Result<Value, ClientError> {
        self.get_json("/state").await
    }
}

// === impl MasterClient ===

impl MasterClient {
    /// The master at `address` (`HOST:PORT`).
    pub fn new(address: impl Display) -> MasterClient {
        MasterClient(Peer::new(Http::new(), address))
    }

    /// The master at `address`, through `http`.
    pub fn with_http(http: Http, address: impl Display) -> MasterClient {
        MasterClient(Peer::new(http, address))
    }

    /// An agent of this master's cluster, reached the way the master is
    /// (TLS, `Authorization`).
    pub fn agent(&self, address: impl Display) -> AgentClient {
        AgentClient(Peer::new(self.0.http.clone(), address))
    }

    /// `/metrics` (Prometheus text).
    pub async fn metrics(&self) -> Result<String, ClientError> {
        let response = self.get("/metrics").await?;
        expect_ok(self.address(), "/metrics", &response)?;
        Ok(response.text())
    }

    /// One call of the Mesos v1 operator API (`POST /api/v1`, JSON both
    /// ways): the answer's JSON, `Value::Null` for a call answered with
    /// an empty `200` (the writes); any other status is an error.
    pub async fn operator_call(&self, call: &Value) -> Result<Value, ClientError> {
        let path = "/api/v1";
        let response = self
            .0
            .http
            .request(
                crate::Method::POST,
                &self.0.address,
                path,
                &[
                    ("content-type", "application/json"),
                    ("accept", "application/json"),
                ],
                Some(serde_json::to_vec(call).unwrap_or_default()),
            )
            .await?;
        expect_ok(&self.0.address, path, &response)?;
        if response.body.is_empty() {
            return Ok(Value::Null);
        }
        response.json().map_err(|source| ClientError::Json {
            url: format!("{}://{}{path}", self.0.http.scheme(), self.0.address),
            source,
        })
    }

    /// Every item of a paginated list (`/api/v1/agents`, `…/frameworks`,
    /// `…/tasks`), `query` without `offset` and `limit`, asked for
    /// [`PAGE`] at a time.
    pub async fn list(&self, endpoint: &str, query: &str) -> Result<Vec<Value>, ClientError> {
        let mut items = Vec::new();
        loop {
            let sep = if query.is_empty() { "" } else { "&" };
            let path = format!("{endpoint}?{query}{sep}offset={}&limit={PAGE}", items.len());
            let page = self.get_json(&path).await?;
            let batch = page["items"].as_array().cloned().unwrap_or_default();
            let total = page["total"].as_u64().unwrap_or(0) as usize;
            let empty = batch.is_empty();
            items.extend(batch);
            if empty || items.len() >= total {
                return Ok(items);
            }
        }
    }
}

impl std::ops::Deref for MasterClient {
    type Target = Peer;

    fn deref(&self) -> &Peer {
        &self.0
    }
}

// === impl AgentClient ===

impl AgentClient {
    /// The agent at `address` (`HOST:PORT`).
    pub fn new(address: impl Display) -> AgentClient {
        AgentClient(Peer::new(Http::new(), address))
    }

    /// The agent at `address`, through `http`.
    pub fn with_http(http: Http, address: impl Display) -> AgentClient {
        AgentClient(Peer::new(http, address))
    }

    /// Up to `length` bytes of sandbox file `file` of an executor, from
    /// `offset`.
    pub async fn file(
        &self,
        framework_id: &str,
        executor_id: &str,
        file: &str,
        offset: u64,
        length: u64,
    ) -> Result<FileChunk, ClientError> {
        let path = format!(
            "/files/{}/{}/{}?offset={offset}&length={length}",
            encode(framework_id),
            encode(executor_id),
            encode(file)
        );
        let value = self.get_json(&path).await?;
        serde_json::from_value(value).map_err(|source| ClientError::Json {
            url: format!("http://{}{path}", self.address()),
            source,
        })
    }
}

impl std::ops::Deref for AgentClient {
    type Target = Peer;

    fn deref(&self) -> &Peer {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_values_are_encoded() {
        assert_eq!(encode("a b/c&d"), "a%20b%2Fc%26d");
        assert_eq!(encode("task-1_x.y~"), "task-1_x.y~");
        assert_eq!(encode("é"), "%C3%A9");
    }
}
