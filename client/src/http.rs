//! [`Http`]: HTTP/1.1 requests on hyper's pooled client.

use std::fmt::Display;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::header::{HeaderMap, HeaderName, HeaderValue, AUTHORIZATION, CONTENT_TYPE};
use hyper::{Method, Request, Uri};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioTimer};

/// How long a request may take, from connecting to the last body byte,
/// unless [`Http::with_timeout`] says otherwise.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest body read unless [`Http::with_max_body`] says otherwise (a
/// big cluster's `/state`).
pub const DEFAULT_MAX_BODY: usize = 64 << 20;
/// How long an idle pooled connection is kept.
const POOL_IDLE: Duration = Duration::from_secs(30);
/// TCP keepalive on every connection: a peer that vanished without a
/// word (a long-lived watch on a dead host) is noticed.
const TCP_KEEPALIVE: Duration = Duration::from_secs(10);

/// An HTTP/1.1 client (cheap to clone: clones share the connection pool).
#[derive(Clone, Debug)]
pub struct Http {
    client: Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
    /// `https` with [`Http::with_tls`], else `http`.
    scheme: &'static str,
    timeout: Duration,
    max_body: usize,
    /// Sent as `Authorization` on every request that has none of its own.
    authorization: Option<HeaderValue>,
}

/// A whole answer.
#[derive(Debug, Clone)]
pub struct Response {
    /// Status code.
    pub status: u16,
    /// Header fields.
    pub headers: HeaderMap,
    /// The body, de-chunked.
    pub body: Bytes,
}

/// An answer whose body is read as it arrives.
#[derive(Debug)]
pub struct Streaming {
    /// Status code.
    pub status: u16,
    /// Header fields.
    pub headers: HeaderMap,
    url: String,
    body: Incoming,
}

/// Why a request failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The address or path does not make a URL.
    #[error("invalid URL {0:?}: expected HOST:PORT and a path starting with /")]
    InvalidUrl(String),
    /// A header name or value is not valid HTTP.
    #[error("invalid header {0:?}")]
    InvalidHeader(String),
    /// Connecting, writing or reading failed.
    #[error("{method} {url}: {message}")]
    Transport {
        /// The method.
        method: Method,
        /// The URL.
        url: String,
        /// What went wrong (with its causes).
        message: String,
    },
    /// No (complete) answer in time.
    #[error("{method} {url}: no answer within {timeout:?}")]
    Timeout {
        /// The method.
        method: Method,
        /// The URL.
        url: String,
        /// The limit.
        timeout: Duration,
    },
    /// The body is larger than the client reads.
    #[error("{url}: the answer is larger than {limit} bytes")]
    TooLarge {
        /// The URL.
        url: String,
        /// The cap.
        limit: usize,
    },
    /// A status other than the one expected.
    #[error("{url} answered {status}: {body}")]
    Status {
        /// The URL.
        url: String,
        /// The status code.
        status: u16,
        /// The body, as text, shortened.
        body: String,
    },
    /// The body is not the JSON expected.
    #[error("{url}: not the JSON expected: {source}")]
    Json {
        /// The URL.
        url: String,
        /// Why.
        source: serde_json::Error,
    },
}

// === impl Http ===

impl Default for Http {
    fn default() -> Self {
        Http::new()
    }
}

impl Http {
    /// A client with [`DEFAULT_TIMEOUT`] and [`DEFAULT_MAX_BODY`].
    pub fn new() -> Http {
        Http::build(None)
    }

    /// A client that speaks HTTPS, trusting (and presenting) what `tls`
    /// says (see `agora_net::TlsOptions::client`).
    pub fn with_tls(self, tls: std::sync::Arc<rustls::ClientConfig>) -> Http {
        let Http {
            timeout,
            max_body,
            authorization,
            ..
        } = self;
        Http {
            timeout,
            max_body,
            authorization,
            ..Http::build(Some(tls))
        }
    }

    fn build(tls: Option<std::sync::Arc<rustls::ClientConfig>>) -> Http {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_keepalive(Some(TCP_KEEPALIVE));
        connector.set_connect_timeout(Some(DEFAULT_TIMEOUT));
        connector.enforce_http(false);
        let scheme = if tls.is_some() { "https" } else { "http" };
        // Without TLS the connector is never asked for https: it is
        // given a configuration that trusts nothing, built once per
        // process (clients are made per request in places).
        static TRUSTS_NOTHING: std::sync::OnceLock<std::sync::Arc<rustls::ClientConfig>> =
            std::sync::OnceLock::new();
        let config = tls.unwrap_or_else(|| {
            TRUSTS_NOTHING
                .get_or_init(|| {
                    std::sync::Arc::new(
                        rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
                            rustls::crypto::ring::default_provider(),
                        ))
                        .with_safe_default_protocol_versions()
                        .expect("ring supports the default TLS versions")
                        .with_root_certificates(rustls::RootCertStore::empty())
                        .with_no_client_auth(),
                    )
                })
                .clone()
        });
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config((*config).clone())
            .https_or_http()
            .enable_http1()
            .wrap_connector(connector);
        let client = Client::builder(TokioExecutor::new())
            .pool_timer(TokioTimer::new())
            .pool_idle_timeout(POOL_IDLE)
            .build(connector);
        Http {
            client,
            scheme,
            timeout: DEFAULT_TIMEOUT,
            max_body: DEFAULT_MAX_BODY,
            authorization: None,
        }
    }

    /// `http` or `https`.
    pub fn scheme(&self) -> &'static str {
        self.scheme
    }

    /// The same client sending `value` (`Basic …`, `Bearer …`) as
    /// `Authorization` on every request that brings none of its own.
    pub fn with_authorization(mut self, value: &str) -> Result<Http, ClientError> {
        let mut value = HeaderValue::from_str(value)
            .map_err(|_| ClientError::InvalidHeader("authorization".into()))?;
        value.set_sensitive(true);
        self.authorization = Some(value);
        Ok(self)
    }

    /// The same client with another per-request timeout.
    pub fn with_timeout(mut self, timeout: Duration) -> Http {
        self.timeout = timeout;
        self
    }

    /// The same client with another body cap.
    pub fn with_max_body(mut self, max_body: usize) -> Http {
        self.max_body = max_body;
        self
    }

    /// The per-request timeout.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// `GET http://ADDRESS/PATH`.
    pub async fn get(&self, address: impl Display, path: &str) -> Result<Response, ClientError> {
        self.request(Method::GET, address, path, &[], None).await
    }

    /// `POST http://ADDRESS/PATH` with a body of `content_type`.
    pub async fn post(
        &self,
        address: impl Display,
        path: &str,
        content_type: &str,
        body: Vec<u8>,
    ) -> Result<Response, ClientError> {
        self.request(
            Method::POST,
            address,
            path,
            &[("content-type", content_type)],
            Some(body),
        )
        .await
    }

    /// Any request, with extra header fields; the whole answer, read
    /// within the timeout.
    pub async fn request(
        &self,
        method: Method,
        address: impl Display,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<Vec<u8>>,
    ) -> Result<Response, ClientError> {
        let url = url(self.scheme, &address, path);
        let exchange = async {
            let streaming = self.open(method.clone(), &url, headers, body).await?;
            let (status, headers) = (streaming.status, streaming.headers.clone());
            let body = streaming.read_to_end(self.max_body).await?;
            Ok(Response {
                status,
                headers,
                body,
            })
        };
        self.in_time(&method, &url, exchange).await
    }

    /// Sends a request and returns once the answer's head is in (within
    /// the timeout); its body is read with [`Streaming::chunk`], with no
    /// time limit.
    pub async fn stream(
        &self,
        method: Method,
        address: impl Display,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<Vec<u8>>,
    ) -> Result<Streaming, ClientError> {
        let url = url(self.scheme, &address, path);
        let open = self.open(method.clone(), &url, headers, body);
        self.in_time(&method, &url, open).await
    }

    /// `exchange`'s result, or a timeout error once the timeout passed.
    async fn in_time<T>(
        &self,
        method: &Method,
        url: &str,
        exchange: impl std::future::Future<Output = Result<T, ClientError>>,
    ) -> Result<T, ClientError> {
        tokio::time::timeout(self.timeout, exchange)
            .await
            .unwrap_or_else(|_| {
                Err(ClientError::Timeout {
                    method: method.clone(),
                    url: url.to_string(),
                    timeout: self.timeout,
                })
            })
    }

    async fn open(
        &self,
        method: Method,
        url: &str,
        headers: &[(&str, &str)],
        body: Option<Vec<u8>>,
    ) -> Result<Streaming, ClientError> {
        let uri: Uri = url
            .parse()
            .map_err(|_| ClientError::InvalidUrl(url.to_string()))?;
        if uri.host().is_none() {
            return Err(ClientError::InvalidUrl(url.to_string()));
        }
        let mut request = Request::builder().method(method.clone()).uri(uri);
        if let Some(fields) = request.headers_mut() {
            for (name, value) in headers {
                let name = HeaderName::from_bytes(name.as_bytes())
                    .map_err(|_| ClientError::InvalidHeader(name.to_string()))?;
                let value = HeaderValue::from_str(value)
                    .map_err(|_| ClientError::InvalidHeader(value.to_string()))?;
                fields.append(name, value);
            }
            if let Some(authorization) = &self.authorization {
                if !fields.contains_key(AUTHORIZATION) {
                    fields.insert(AUTHORIZATION, authorization.clone());
                }
            }
            if body.is_some() && !fields.contains_key(CONTENT_TYPE) {
                fields.insert(
                    CONTENT_TYPE,
                    HeaderValue::from_static("application/octet-stream"),
                );
            }
        }
        let request = request
            .body(Full::new(Bytes::from(body.unwrap_or_default())))
            .map_err(|_| ClientError::InvalidUrl(url.to_string()))?;
        let response = self
            .client
            .request(request)
            .await
            .map_err(|e| ClientError::Transport {
                method,
                url: url.to_string(),
                message: chain(&e),
            })?;
        let (parts, body) = response.into_parts();
        Ok(Streaming {
            status: parts.status.as_u16(),
            headers: parts.headers,
            url: url.to_string(),
            body,
        })
    }
}

// === impl Response ===

impl Response {
    /// The body as text (invalid UTF-8 replaced).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// A header field's value, when it is text.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// The body parsed as JSON.
    pub fn json<T: serde::de::DeserializeOwned>(&self) -> Result<T, serde_json::Error> {
        serde_json::from_slice(&self.body)
    }
}

// === impl Streaming ===

impl Streaming {
    /// The URL asked.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The next piece of the body; `None` at its end.
    pub async fn chunk(&mut self) -> Result<Option<Bytes>, ClientError> {
        loop {
            match self.body.frame().await {
                None => return Ok(None),
                Some(Err(e)) => {
                    return Err(ClientError::Transport {
                        method: Method::GET,
                        url: self.url.clone(),
                        message: chain(&e),
                    })
                }
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        return Ok(Some(data));
                    }
                }
            }
        }
    }

    /// The rest of the body, at most `limit` bytes.
    pub async fn read_to_end(mut self, limit: usize) -> Result<Bytes, ClientError> {
        let mut out = BytesMut::new();
        while let Some(data) = self.chunk().await? {
            if out.len().saturating_add(data.len()) > limit {
                return Err(ClientError::TooLarge {
                    url: self.url,
                    limit,
                });
            }
            out.extend_from_slice(&data);
        }
        Ok(out.freeze())
    }
}

fn url(scheme: &str, address: &impl Display, path: &str) -> String {
    let address = address.to_string();
    let address = address
        .trim()
        .trim_start_matches("http://")
        .trim_start_matches("https://");
    let address = address.trim_end_matches('/');
    if path.starts_with('/') {
        format!("{scheme}://{address}{path}")
    } else {
        format!("{scheme}://{address}/{path}")
    }
}

/// An error and its causes, as one line.
fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}
