//! A Mesos v1 HTTP scheduler client, as Mesos clients (mesos-go, pymesos)
//! drive a master, for the benches' `--api v1` mode.
//!
//! - [`subscribe`] posts SUBSCRIBE and keeps its answer open: a chunked
//!   body of RecordIO records in the negotiated codec (protobuf, mesos-go's
//!   default, or JSON), decoded by [`EventDecoder`]. It returns once
//!   SUBSCRIBED has arrived, with the `Mesos-Stream-Id` and framework id
//!   every later call must name.
//! - [`Calls`] posts every other call on its own request (keep-alive
//!   connections from `agora-client`'s pool) and expects `202 Accepted`,
//!   as mesos-go does; anything else is a [`V1Error::Status`].
//! - [`CallPipeline`] keeps many calls in flight, so one ACKNOWLEDGE per
//!   update (as Mesos clients send them) is not serialised on one round
//!   trip: pipelined on a few HTTP/1.1 keep-alive connections (written
//!   back to back, a batch in one write: [`crate::http1_pipeline`]), one
//!   per HTTP/1.1 connection as most Mesos clients do (hyper's connection
//!   API, driven by the task that makes its calls), or as streams of one
//!   HTTP/2 connection. Calls of one pipeline may complete in any order,
//!   as with several Mesos client connections; the first failure is kept
//!   and reported.
//! - Translation between the Mesos messages the bench sees and the
//!   `agora-proto` types its offer logic works on ([`offer`],
//!   [`task_status`], [`mesos_task`]).
//!
//! The framing and the checks of answers are sans-IO ([`EventDecoder`],
//! [`check_subscribe_head`], [`check_call_answer`]) and unit-tested here.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use crate::http1_pipeline;
use agora_client::{ClientError, Http, Streaming};
use agora_mesos_proto::convert::{self, ResourceStyle};
use agora_mesos_proto::recordio::{self, RecordIoError};
use agora_mesos_proto::v1::scheduler::{call, event, Call, Event};
use agora_mesos_proto::{v1, Codec, CodecError};
use bytes::Bytes;
use futures::stream::{FuturesUnordered, StreamExt};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::client::conn::{http1, http2};
use hyper::header::{HeaderMap, HeaderValue, ACCEPT, CONTENT_TYPE, HOST};
use hyper::{Method, Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, Notify};

/// The scheduler endpoint's path.
pub const SCHEDULER_PATH: &str = "/api/v1/scheduler";
/// The `Mesos-Stream-Id` header.
pub const STREAM_ID: &str = "Mesos-Stream-Id";
/// Default size of a [`CallPipeline`]: calls in flight at once.
pub const DEFAULT_CALLS_IN_FLIGHT: usize = 128;
/// Calls queued per connection of a [`CallPipeline`] before
/// [`CallPipeline::send`] waits.
pub const CALLS_QUEUED_PER_CONNECTION: usize = 256;
/// Longest body of a refusal kept in [`V1Error::Status`].
const MAX_ERROR_BODY: usize = 512;

/// Why the client could not subscribe, read the stream or make a call.
#[derive(Debug, thiserror::Error)]
pub enum V1Error {
    /// Connecting, writing or reading failed.
    #[error(transparent)]
    Transport(#[from] ClientError),
    /// The master answered with another status than the call expects
    /// (200 for SUBSCRIBE, 202 for every other call).
    #[error("{call} answered {status} (expected {expected}): {body}")]
    Status {
        /// The call's type.
        call: String,
        /// The status code.
        status: u16,
        /// What the call expects.
        expected: u16,
        /// The answer's body, as text, shortened.
        body: String,
    },
    /// The SUBSCRIBE answer has no `Mesos-Stream-Id`: later calls cannot
    /// name the subscription.
    #[error("the SUBSCRIBE answer has no Mesos-Stream-Id header")]
    MissingStreamId,
    /// The stream is not in the codec asked for.
    #[error("the SUBSCRIBE answer's Content-Type is {got:?}, expected {expected:?}")]
    ContentType {
        /// The codec's media type.
        expected: &'static str,
        /// The answer's.
        got: String,
    },
    /// The stream's framing is broken.
    #[error("event stream: {0}")]
    RecordIo(#[from] RecordIoError),
    /// A record or an answer does not decode.
    #[error("event stream: {0}")]
    Codec(#[from] CodecError),
    /// The master refused the subscription or ended it with ERROR.
    #[error("the master sent ERROR: {0}")]
    MasterError(String),
    /// The stream ended (before SUBSCRIBED, or while it was awaited).
    #[error("the event stream ended")]
    StreamEnded,
    /// The first event was not SUBSCRIBED.
    #[error("expected SUBSCRIBED first, got {0:?}")]
    NotSubscribed(event::Type),
    /// An event names something Agora's types cannot hold.
    #[error("event: {0}")]
    Convert(#[from] convert::ConvertError),
}

/// A live subscription: the calls that name it and its events.
pub struct Subscription {
    /// The framework id SUBSCRIBED gave.
    pub framework_id: v1::FrameworkId,
    /// Posts calls on this subscription.
    pub calls: Calls,
    /// The rest of the event stream (after SUBSCRIBED).
    pub events: Events,
}

/// The event stream of a subscription.
pub struct Events {
    body: Streaming,
    decoder: EventDecoder,
}

/// Incremental decoder of an event stream: feed the body's pieces as they
/// arrive (they need not align with records), take whole events.
#[derive(Debug)]
pub struct EventDecoder {
    reader: recordio::Reader,
    codec: Codec,
}

/// Posts calls on one subscription (cheap to clone; clones share the
/// connection pool).
#[derive(Clone, Debug)]
pub struct Calls {
    http: Http,
    master: Arc<str>,
    codec: Codec,
    stream_id: Arc<str>,
    framework_id: v1::FrameworkId,
}

/// The HTTP a [`CallPipeline`] speaks to the master.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum HttpVersion {
    /// HTTP/1.1, as Mesos clients speak it: one call in flight on each of
    /// as many keep-alive connections.
    #[value(name = "1.1")]
    Http1,
    /// HTTP/2 over cleartext (prior knowledge): every call in flight on
    /// one connection, as streams, their frames sharing writes.
    #[value(name = "2")]
    Http2,
    /// HTTP/1.1 with pipelining: up to [`PIPELINE_DEPTH`] calls written
    /// back to back on each keep-alive connection, answered in order.
    #[value(name = "1.1-pipelined")]
    Http1Pipelined,
}

/// Most calls unanswered at once on one connection of a pipelined
/// [`CallPipeline`].
pub const PIPELINE_DEPTH: usize = 128;

/// Most calls [`CallPipeline::send_all`] queues as one batch.
const SEND_BATCH: usize = 16;

/// Calls in flight at once, all taking from one queue: whichever
/// connection (HTTP/1.1) or stream (HTTP/2) is free makes the next call,
/// so a slow answer holds up only its own call. Over HTTP/1.1 each call
/// in flight has a keep-alive connection of its own (no pipelining);
/// over HTTP/2 they share one connection.
#[derive(Clone)]
pub struct CallPipeline {
    queue: mpsc::Sender<Vec<Call>>,
    shared: Arc<PipelineShared>,
    /// Whether a batch of calls stays together (pipelined: one write).
    batches: bool,
}

/// What the pipeline's connection tasks report.
#[derive(Default)]
struct PipelineShared {
    /// Calls queued or in flight.
    outstanding: AtomicUsize,
    /// The owner is tearing the subscription down.
    stopping: AtomicBool,
    /// Signalled when `outstanding` drops to zero.
    idle: Notify,
    /// The first failure.
    failure: Mutex<Option<String>>,
}

// === impl EventDecoder ===

impl EventDecoder {
    /// A decoder of records in `codec`.
    pub fn new(codec: Codec) -> Self {
        EventDecoder {
            reader: recordio::Reader::new(),
            codec,
        }
    }

    /// Appends a piece of the body.
    pub fn feed(&mut self, bytes: &[u8]) {
        self.reader.feed(bytes);
    }

    /// The next whole event, if one has arrived.
    pub fn next_event(&mut self) -> Result<Option<Event>, V1Error> {
        match self.reader.next_record_ref()? {
            Some(record) => Ok(Some(self.codec.decode::<Event>(record)?)),
            None => Ok(None),
        }
    }
}

// === impl Events ===

impl Events {
    /// The next event; `None` when the master ended the stream.
    /// The next event among the bytes already read, if a whole one is
    /// there: no waiting.
    pub fn buffered(&mut self) -> Result<Option<Event>, V1Error> {
        self.decoder.next_event()
    }

    pub async fn next(&mut self) -> Result<Option<Event>, V1Error> {
        loop {
            if let Some(event) = self.decoder.next_event()? {
                return Ok(Some(event));
            }
            match self.body.chunk().await? {
                Some(bytes) => self.decoder.feed(&bytes),
                None => return Ok(None),
            }
        }
    }
}

/// Subscribes `framework` at `master` (`HOST:PORT`) in `codec` and waits
/// for SUBSCRIBED (skipping nothing: it must be the first event).
pub async fn subscribe(
    http: &Http,
    master: &str,
    codec: Codec,
    framework: v1::FrameworkInfo,
) -> Result<Subscription, V1Error> {
    let mut call = Call {
        framework_id: framework.id.clone(),
        subscribe: Some(call::Subscribe {
            framework_info: framework,
            ..Default::default()
        }),
        ..Default::default()
    };
    call.set_type(call::Type::Subscribe);
    let body = codec.encode(&call)?;
    let streaming = http
        .stream(
            Method::POST,
            master,
            SCHEDULER_PATH,
            &[
                ("content-type", codec.media_type()),
                ("accept", codec.media_type()),
            ],
            Some(body),
        )
        .await?;
    if streaming.status != 200 {
        let status = streaming.status;
        let body = streaming
            .read_to_end(MAX_ERROR_BODY)
            .await
            .map(|b| b.to_vec())
            .unwrap_or_default();
        return Err(status_error("SUBSCRIBE", status, 200, &body));
    }
    let stream_id = check_subscribe_head(streaming.status, &streaming.headers, codec)?;
    let mut events = Events {
        body: streaming,
        decoder: EventDecoder::new(codec),
    };
    let first = events.next().await?.ok_or(V1Error::StreamEnded)?;
    let framework_id = subscribed(first)?;
    let calls = Calls {
        http: http.clone(),
        master: master.into(),
        codec,
        stream_id: stream_id.into(),
        framework_id: framework_id.clone(),
    };
    Ok(Subscription {
        framework_id,
        calls,
        events,
    })
}

/// The framework id of the first event, which must be SUBSCRIBED.
fn subscribed(first: Event) -> Result<v1::FrameworkId, V1Error> {
    match first.r#type() {
        event::Type::Subscribed => first
            .subscribed
            .map(|s| s.framework_id)
            .filter(|id| !id.value.is_empty())
            .ok_or(V1Error::NotSubscribed(event::Type::Subscribed)),
        event::Type::Error => Err(V1Error::MasterError(
            first.error.map(|e| e.message).unwrap_or_default(),
        )),
        other => Err(V1Error::NotSubscribed(other)),
    }
}

/// Checks the head of a SUBSCRIBE answer as mesos-go does (status 200,
/// `Content-Type` equal to the codec) and returns its stream id.
pub fn check_subscribe_head(
    status: u16,
    headers: &HeaderMap,
    codec: Codec,
) -> Result<String, V1Error> {
    if status != 200 {
        return Err(status_error("SUBSCRIBE", status, 200, b""));
    }
    let content_type = headers
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if Codec::from_content_type(content_type) != Some(codec) {
        return Err(V1Error::ContentType {
            expected: codec.media_type(),
            got: content_type.to_string(),
        });
    }
    headers
        .get(STREAM_ID)
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.is_empty())
        .map(str::to_string)
        .ok_or(V1Error::MissingStreamId)
}

/// Checks the answer to a call other than SUBSCRIBE: exactly `202
/// Accepted` (mesos-go refuses a 200 or a 204 too).
pub fn check_call_answer(call: call::Type, status: u16, body: &[u8]) -> Result<(), V1Error> {
    if status == 202 {
        Ok(())
    } else {
        Err(status_error(call.as_str_name(), status, 202, body))
    }
}

fn status_error(call: &str, status: u16, expected: u16, body: &[u8]) -> V1Error {
    let text = String::from_utf8_lossy(&body[..body.len().min(MAX_ERROR_BODY)]);
    V1Error::Status {
        call: call.to_string(),
        status,
        expected,
        body: text.trim().to_string(),
    }
}

// === impl Calls ===

impl Calls {
    /// The subscription's stream id.
    pub fn stream_id(&self) -> &str {
        &self.stream_id
    }

    fn transport_error(&self, message: String) -> V1Error {
        V1Error::Transport(ClientError::Transport {
            method: Method::POST,
            url: format!("http://{}{SCHEDULER_PATH}", self.master),
            message,
        })
    }

    /// Opens a connection of its own to the master.
    async fn open(&self) -> Result<TokioIo<TcpStream>, V1Error> {
        let stream = TcpStream::connect(&*self.master)
            .await
            .map_err(|e| self.transport_error(e.to_string()))?;
        // Calls are small writes answered at once: no Nagle.
        let _ = stream.set_nodelay(true);
        Ok(TokioIo::new(stream))
    }

    /// Opens a keep-alive HTTP/1.1 connection of its own to the master.
    async fn connect(
        &self,
    ) -> Result<
        (
            http1::SendRequest<Full<Bytes>>,
            http1::Connection<TokioIo<TcpStream>, Full<Bytes>>,
        ),
        V1Error,
    > {
        http1::handshake(self.open().await?)
            .await
            .map_err(|e| self.transport_error(e.to_string()))
    }

    /// Opens an HTTP/2 connection of its own to the master, driven by a
    /// task of its own until every sender is gone.
    async fn connect_h2(&self) -> Result<http2::SendRequest<Full<Bytes>>, V1Error> {
        let (sender, conn) = http2::handshake(TokioExecutor::new(), self.open().await?)
            .await
            .map_err(|e| self.transport_error(e.to_string()))?;
        tokio::spawn(conn);
        Ok(sender)
    }

    /// `call` (its `framework_id` filled in) as a request to `uri`.
    fn request(
        &self,
        uri: &str,
        mut call: Call,
    ) -> Result<(call::Type, Request<Full<Bytes>>), V1Error> {
        call.framework_id = Some(self.framework_id.clone());
        let kind = call.r#type();
        let body = self.codec.encode(&call)?;
        let media = HeaderValue::from_static(self.codec.media_type());
        let request = Request::post(uri)
            .header(HOST, &*self.master)
            .header(CONTENT_TYPE, media.clone())
            .header(ACCEPT, media)
            .header(STREAM_ID, &*self.stream_id)
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| self.transport_error(e.to_string()))?;
        Ok((kind, request))
    }

    /// Checks the answer to a call of `kind`: 202 expected.
    async fn answer(
        &self,
        kind: call::Type,
        response: Result<Response<Incoming>, hyper::Error>,
    ) -> Result<(), V1Error> {
        let response = response.map_err(|e| self.transport_error(e.to_string()))?;
        let status = response.status().as_u16();
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|e| self.transport_error(e.to_string()))?
            .to_bytes();
        check_call_answer(kind, status, &body)
    }

    /// Makes `call` on a connection from [`Calls::connect`] and expects 202.
    async fn call_on(
        &self,
        sender: &mut http1::SendRequest<Full<Bytes>>,
        call: Call,
    ) -> Result<(), V1Error> {
        let (kind, request) = self.request(SCHEDULER_PATH, call)?;
        sender
            .ready()
            .await
            .map_err(|e| self.transport_error(e.to_string()))?;
        self.answer(kind, sender.send_request(request).await).await
    }

    /// Makes `call` as a stream of a connection from [`Calls::connect_h2`]
    /// and expects 202.
    async fn call_h2(
        &self,
        mut sender: http2::SendRequest<Full<Bytes>>,
        call: Call,
    ) -> Result<(), V1Error> {
        // HTTP/2 names the scheme and authority in the request itself.
        let uri = format!("http://{}{SCHEDULER_PATH}", self.master);
        let (kind, request) = self.request(&uri, call)?;
        sender
            .ready()
            .await
            .map_err(|e| self.transport_error(e.to_string()))?;
        self.answer(kind, sender.send_request(request).await).await
    }

    /// Posts `call` (its `framework_id` is filled in) and expects 202.
    pub async fn call(&self, mut call: Call) -> Result<(), V1Error> {
        call.framework_id = Some(self.framework_id.clone());
        let kind = call.r#type();
        let body = self.codec.encode(&call)?;
        let answer = self
            .http
            .request(
                Method::POST,
                &*self.master,
                SCHEDULER_PATH,
                &[
                    (CONTENT_TYPE.as_str(), self.codec.media_type()),
                    (ACCEPT.as_str(), self.codec.media_type()),
                    (STREAM_ID, &*self.stream_id),
                ],
                Some(body),
            )
            .await?;
        check_call_answer(kind, answer.status, &answer.body)
    }
}

/// ACCEPT of one offer with one LAUNCH of `tasks`.
pub fn accept(offer_id: v1::OfferId, tasks: Vec<v1::TaskInfo>, filters: v1::Filters) -> Call {
    let mut operation = v1::offer::Operation {
        launch: Some(v1::offer::operation::Launch { task_infos: tasks }),
        ..Default::default()
    };
    operation.set_type(v1::offer::operation::Type::Launch);
    let mut call = Call {
        accept: Some(call::Accept {
            offer_ids: vec![offer_id],
            operations: vec![operation],
            filters: Some(filters),
        }),
        ..Default::default()
    };
    call.set_type(call::Type::Accept);
    call
}

/// DECLINE of one offer.
pub fn decline(offer_id: v1::OfferId, filters: v1::Filters) -> Call {
    let mut call = Call {
        decline: Some(call::Decline {
            offer_ids: vec![offer_id],
            filters: Some(filters),
        }),
        ..Default::default()
    };
    call.set_type(call::Type::Decline);
    call
}

/// SUPPRESS of every role.
pub fn suppress() -> Call {
    let mut call = Call {
        suppress: Some(call::Suppress::default()),
        ..Default::default()
    };
    call.set_type(call::Type::Suppress);
    call
}

/// TEARDOWN of the framework.
pub fn teardown() -> Call {
    let mut call = Call::default();
    call.set_type(call::Type::Teardown);
    call
}

/// ACKNOWLEDGE of an update, when it carries a uuid (updates without one,
/// such as the master's, are not acknowledged, as in Mesos).
pub fn acknowledge(status: &v1::TaskStatus) -> Option<Call> {
    let uuid = status.uuid.clone()?;
    let agent_id = status.agent_id.clone()?;
    let mut call = Call {
        acknowledge: Some(call::Acknowledge {
            agent_id,
            task_id: status.task_id.clone(),
            uuid,
        }),
        ..Default::default()
    };
    call.set_type(call::Type::Acknowledge);
    Some(call)
}

/// Mesos filters with `refuse_seconds`.
pub fn filters(refuse_seconds: Option<f64>) -> v1::Filters {
    v1::Filters { refuse_seconds }
}

// === impl CallPipeline ===

impl CallPipeline {
    /// A pipeline of `in_flight` calls at once (at least one) for
    /// `calls`' subscription, over `http`. Over HTTP/1.1 each connection
    /// runs in one task that both drives it and makes its calls, so a
    /// call costs no hop between tasks; over HTTP/2 one task makes every
    /// call as a stream of one connection. A failed call is kept (see
    /// [`CallPipeline::failure`]), not retried.
    pub fn new(calls: Calls, in_flight: usize, http: HttpVersion) -> Self {
        let shared = Arc::new(PipelineShared::default());
        let in_flight = in_flight.max(1);
        let (queue, rx) = mpsc::channel(CALLS_QUEUED_PER_CONNECTION * in_flight);
        match http {
            HttpVersion::Http1 => {
                let rx = Arc::new(tokio::sync::Mutex::new(rx));
                for _ in 0..in_flight {
                    tokio::spawn(connection(calls.clone(), rx.clone(), shared.clone()));
                }
            }
            HttpVersion::Http2 => {
                tokio::spawn(h2_connection(calls, rx, shared.clone(), in_flight));
            }
            HttpVersion::Http1Pipelined => {
                let rx = Arc::new(tokio::sync::Mutex::new(rx));
                for _ in 0..in_flight.div_ceil(PIPELINE_DEPTH) {
                    tokio::spawn(pipelined_connection(
                        calls.clone(),
                        rx.clone(),
                        shared.clone(),
                        PIPELINE_DEPTH.min(in_flight),
                    ));
                }
            }
        }
        CallPipeline {
            queue,
            shared,
            batches: http == HttpVersion::Http1Pipelined,
        }
    }

    /// Queues `call`; waits when the queue is full (backpressure, not a
    /// drop).
    pub async fn send(&self, call: Call) {
        self.queue_batch(vec![call]).await;
    }

    /// Queues `calls` in order. Pipelined, they go out together (one
    /// write, as far as the window allows: batches queued back to back
    /// are written together); otherwise one by one.
    pub async fn send_all<I>(&self, calls: I)
    where
        I: IntoIterator<Item = Call>,
        I::IntoIter: Send,
    {
        let mut calls = calls.into_iter();
        if self.batches {
            // In batches of a few: a `Call` is over a kilobyte, and one
            // vector of hundreds of them is fresh memory (pages the
            // kernel zeroes) every time.
            loop {
                let batch: Vec<Call> = calls.by_ref().take(SEND_BATCH).collect();
                if batch.is_empty() {
                    break;
                }
                self.queue_batch(batch).await;
            }
        } else {
            for call in calls {
                self.queue_batch(vec![call]).await;
            }
        }
    }

    async fn queue_batch(&self, calls: Vec<Call>) {
        let n = calls.len();
        self.shared.outstanding.fetch_add(n, Ordering::AcqRel);
        if self.queue.send(calls).await.is_err() {
            for _ in 0..n {
                self.shared
                    .finished(Err("every connection's task has ended".into()));
            }
        }
    }

    /// Waits until every call queued has been answered.
    pub async fn drain(&self) {
        loop {
            let idle = self.shared.idle.notified();
            if self.shared.outstanding.load(Ordering::Acquire) == 0 {
                return;
            }
            idle.await;
        }
    }

    /// Marks the pipeline as stopping (its owner is tearing down): see
    /// [`CallPipeline::stopping`].
    pub fn stop(&self) {
        self.shared.stopping.store(true, Ordering::Release);
    }

    /// Whether [`CallPipeline::stop`] was called.
    pub fn stopping(&self) -> bool {
        self.shared.stopping.load(Ordering::Acquire)
    }

    /// The first call that failed, if one did.
    pub fn failure(&self) -> Option<String> {
        self.shared
            .failure
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

// === impl PipelineShared ===

impl PipelineShared {
    fn finished(&self, result: Result<(), String>) {
        if let Err(e) = result {
            let mut failure = self.failure.lock().unwrap_or_else(|e| e.into_inner());
            failure.get_or_insert(e);
        }
        if self.outstanding.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.idle.notify_waiters();
        }
    }
}

/// One connection of a pipeline: connects, then makes calls taken from
/// the shared queue one after the other, driving the connection in the
/// same task.
async fn connection(
    calls: Calls,
    queue: Arc<tokio::sync::Mutex<mpsc::Receiver<Vec<Call>>>>,
    shared: Arc<PipelineShared>,
) {
    let next = || async { queue.lock().await.recv().await };
    let (mut sender, conn) = match calls.connect().await {
        Ok(pair) => pair,
        Err(e) => {
            let e = e.to_string();
            while let Some(batch) = next().await {
                batch.iter().for_each(|_| shared.finished(Err(e.clone())));
            }
            return;
        }
    };
    let requests = async {
        while let Some(batch) = next().await {
            for call in batch {
                let result = calls.call_on(&mut sender, call).await;
                shared.finished(result.map_err(|e| e.to_string()));
            }
        }
        drop(sender);
    };
    // The connection ends once `requests` drops its sender.
    let _ = futures::future::join(conn, requests).await;
}

/// One connection of a pipelined HTTP/1.1 pipeline.
async fn pipelined_connection(
    calls: Calls,
    queue: Arc<tokio::sync::Mutex<mpsc::Receiver<Vec<Call>>>>,
    shared: Arc<PipelineShared>,
    depth: usize,
) {
    let stream = match calls.open().await {
        Ok(io) => io.into_inner(),
        Err(e) => {
            let e = e.to_string();
            while let Some(batch) = queue.lock().await.recv().await {
                batch.iter().for_each(|_| shared.finished(Err(e.clone())));
            }
            return;
        }
    };
    let encode = {
        let (calls, shared) = (calls.clone(), shared.clone());
        let head = http1_pipeline::RequestHead::new(
            &calls.master,
            SCHEDULER_PATH,
            &[
                (CONTENT_TYPE.as_str(), calls.codec.media_type()),
                (ACCEPT.as_str(), calls.codec.media_type()),
                (STREAM_ID, &calls.stream_id),
            ],
        );
        // One call's body, reused from call to call.
        let mut body = Vec::new();
        move |mut call: Call, out: &mut Vec<u8>| {
            call.framework_id = Some(calls.framework_id.clone());
            let kind = call.r#type();
            body.clear();
            match calls.codec.encode_into(&call, &mut body) {
                Ok(()) => {
                    head.write(out, &body);
                    Some(kind)
                }
                Err(e) => {
                    shared.finished(Err(e.to_string()));
                    None
                }
            }
        }
    };
    let answered = |kind: call::Type, answer: Result<http1_pipeline::Answer, String>| {
        let result = answer
            .and_then(|a| check_call_answer(kind, a.status, &a.body).map_err(|e| e.to_string()));
        shared.finished(result);
    };
    // A failure has failed every call in flight on this connection (and
    // is the pipeline's failure); calls still queued go to the others.
    let _ = http1_pipeline::drive(stream, queue, depth, encode, answered).await;
}

/// The one connection of an HTTP/2 pipeline: makes the calls taken from
/// the queue as streams, at most `streams` at once.
async fn h2_connection(
    calls: Calls,
    mut queue: mpsc::Receiver<Vec<Call>>,
    shared: Arc<PipelineShared>,
    streams: usize,
) {
    let sender = match calls.connect_h2().await {
        Ok(sender) => sender,
        Err(e) => {
            let e = e.to_string();
            while let Some(batch) = queue.recv().await {
                batch.iter().for_each(|_| shared.finished(Err(e.clone())));
            }
            return;
        }
    };
    let mut in_flight = FuturesUnordered::new();
    loop {
        tokio::select! {
            Some(()) = in_flight.next(), if !in_flight.is_empty() => {}
            batch = queue.recv(), if in_flight.len() < streams => match batch {
                Some(batch) => {
                    for call in batch {
                        let (calls, shared, sender) = (&calls, &shared, sender.clone());
                        in_flight.push(async move {
                            let result = calls.call_h2(sender, call).await;
                            shared.finished(result.map_err(|e| e.to_string()));
                        });
                    }
                }
                None => break,
            },
        }
    }
    while in_flight.next().await.is_some() {}
}

// --- translation for the benches' offer logic ---

/// A Mesos offer as Agora's.
pub fn offer(offer: &v1::Offer) -> Result<agora_proto::Offer, V1Error> {
    Ok(agora_proto::Offer {
        id: convert::offer_id(&offer.id),
        framework_id: convert::framework_id(&offer.framework_id)?,
        agent_id: convert::agent_id(&offer.agent_id)?,
        hostname: offer.hostname.clone(),
        resources: convert::resources(&offer.resources)?,
        attributes: Default::default(),
        executor_ids: offer
            .executor_ids
            .iter()
            .map(convert::executor_id)
            .collect::<Result<_, _>>()?,
        allocation_role: offer.allocation_info.as_ref().and_then(|a| a.role.clone()),
    })
}

/// A Mesos update as Agora's (the fields the benches read).
pub fn task_status(status: &v1::TaskStatus) -> Result<agora_proto::TaskStatus, V1Error> {
    let mut out = agora_proto::TaskStatus::new(
        convert::task_id(&status.task_id)?,
        convert::task_state(status.state()),
        agora_proto::Source::SourceMaster,
    );
    out.message = status.message.clone();
    out.data = status.data.clone().map(agora_proto::Bytes);
    out.agent_id = status
        .agent_id
        .as_ref()
        .map(convert::agent_id)
        .transpose()?;
    out.executor_id = status
        .executor_id
        .as_ref()
        .map(convert::executor_id)
        .transpose()?;
    out.timestamp = status.timestamp.unwrap_or_default();
    out.uuid = status.uuid.as_deref().map(convert::uuid_text).transpose()?;
    Ok(out)
}

/// Agora's task as Mesos's: a command task, or one for a custom executor.
pub fn mesos_task(task: &agora_proto::TaskInfo) -> v1::TaskInfo {
    v1::TaskInfo {
        name: task.name.clone(),
        task_id: convert::mesos_task_id(&task.task_id),
        agent_id: convert::mesos_agent_id(&task.agent_id),
        resources: convert::mesos_resources(&task.resources, &ResourceStyle::default()),
        executor: task.executor.as_ref().map(convert::mesos_executor_info),
        command: task.command.as_ref().map(convert::mesos_command_info),
        data: task.data.as_ref().map(|d| d.0.clone()),
        labels: convert::mesos_labels(&task.labels),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyper::header::HeaderValue;

    fn heartbeat() -> Event {
        let mut e = Event::default();
        e.set_type(event::Type::Heartbeat);
        e
    }

    fn update(task: &str) -> Event {
        let mut status = v1::TaskStatus {
            task_id: v1::TaskId { value: task.into() },
            agent_id: Some(v1::AgentId { value: "a1".into() }),
            uuid: Some(uuid::Uuid::new_v4().as_bytes().to_vec()),
            data: Some(b"payload with a newline\n".to_vec()),
            ..Default::default()
        };
        status.set_state(v1::TaskState::TaskRunning);
        let mut e = Event {
            update: Some(event::Update { status }),
            ..Default::default()
        };
        e.set_type(event::Type::Update);
        e
    }

    fn stream(codec: Codec, events: &[Event]) -> Vec<u8> {
        events
            .iter()
            .flat_map(|e| recordio::frame(&codec.encode(e).unwrap()))
            .collect()
    }

    #[test]
    fn events_decode_across_every_chunk_boundary() {
        for codec in [Codec::Protobuf, Codec::Json] {
            let events = vec![update("t1"), heartbeat(), update("t2")];
            let bytes = stream(codec, &events);
            for size in [1, 2, 3, 7, bytes.len()] {
                let mut decoder = EventDecoder::new(codec);
                let mut got = Vec::new();
                for piece in bytes.chunks(size) {
                    decoder.feed(piece);
                    while let Some(e) = decoder.next_event().unwrap() {
                        got.push(e);
                    }
                }
                assert_eq!(got, events, "{codec:?} in pieces of {size}");
            }
        }
    }

    #[test]
    fn a_broken_frame_or_record_is_an_error() {
        let mut decoder = EventDecoder::new(Codec::Json);
        decoder.feed(b"x2\n{}");
        assert!(matches!(decoder.next_event(), Err(V1Error::RecordIo(_))));
        let mut decoder = EventDecoder::new(Codec::Json);
        decoder.feed(b"5\n{not}");
        assert!(matches!(decoder.next_event(), Err(V1Error::Codec(_))));
    }

    #[test]
    fn subscribe_head_gives_the_stream_id() {
        let mut headers = HeaderMap::new();
        headers.insert(
            CONTENT_TYPE,
            HeaderValue::from_static("application/x-protobuf"),
        );
        assert!(matches!(
            check_subscribe_head(200, &headers, Codec::Protobuf),
            Err(V1Error::MissingStreamId)
        ));
        headers.insert(STREAM_ID, HeaderValue::from_static("abc-123"));
        assert_eq!(
            check_subscribe_head(200, &headers, Codec::Protobuf).unwrap(),
            "abc-123"
        );
        // mesos-go insists on the codec it asked for.
        assert!(matches!(
            check_subscribe_head(200, &headers, Codec::Json),
            Err(V1Error::ContentType { .. })
        ));
        assert!(matches!(
            check_subscribe_head(307, &headers, Codec::Protobuf),
            Err(V1Error::Status { status: 307, .. })
        ));
    }

    #[test]
    fn calls_want_exactly_202_and_say_what_came_back() {
        check_call_answer(call::Type::Acknowledge, 202, b"").unwrap();
        for status in [200, 204, 400, 403, 503] {
            let err = check_call_answer(
                call::Type::Acknowledge,
                status,
                b"Framework f is not subscribed",
            )
            .unwrap_err();
            let text = err.to_string();
            assert!(text.contains("ACKNOWLEDGE"), "{text}");
            assert!(text.contains(&status.to_string()), "{text}");
            assert!(text.contains("expected 202"), "{text}");
            assert!(text.contains("not subscribed"), "{text}");
        }
    }

    #[test]
    fn the_first_event_must_be_subscribed() {
        let mut ok = Event {
            subscribed: Some(event::Subscribed {
                framework_id: v1::FrameworkId { value: "f1".into() },
                ..Default::default()
            }),
            ..Default::default()
        };
        ok.set_type(event::Type::Subscribed);
        assert_eq!(subscribed(ok).unwrap().value, "f1");
        let mut error = Event {
            error: Some(event::Error {
                message: "refused".into(),
            }),
            ..Default::default()
        };
        error.set_type(event::Type::Error);
        assert!(matches!(subscribed(error), Err(V1Error::MasterError(m)) if m == "refused"));
        assert!(matches!(
            subscribed(heartbeat()),
            Err(V1Error::NotSubscribed(event::Type::Heartbeat))
        ));
    }

    #[test]
    fn acknowledge_only_updates_with_a_uuid() {
        let Some(event::Update { status }) = update("t1").update else {
            unreachable!()
        };
        let ack = acknowledge(&status).expect("an ack");
        assert_eq!(ack.r#type(), call::Type::Acknowledge);
        let ack = ack.acknowledge.unwrap();
        assert_eq!(ack.task_id.value, "t1");
        assert_eq!(ack.agent_id.value, "a1");
        assert_eq!(ack.uuid.len(), 16);
        let mut master_made = status.clone();
        master_made.uuid = None;
        assert!(acknowledge(&master_made).is_none());
        // And the bench sees the uuid as Agora's text form.
        let native = task_status(&status).unwrap();
        assert_eq!(
            native.uuid.map(|u| convert::uuid_bytes(&u)),
            status.uuid.clone()
        );
    }

    /// A master stand-in that answers every request on every connection
    /// with `answer`, after checking the stream id; returns its address
    /// and the stream ids it saw.
    async fn fake_master(answer: &'static str) -> (String, Arc<Mutex<Vec<String>>>) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap().to_string();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let ids = seen.clone();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let ids = ids.clone();
                tokio::spawn(async move {
                    let mut buffer = Vec::new();
                    let mut piece = [0u8; 4096];
                    loop {
                        // One whole request: head, then Content-Length bytes.
                        let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") else {
                            match stream.read(&mut piece).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => buffer.extend_from_slice(&piece[..n]),
                            }
                            continue;
                        };
                        let head = String::from_utf8_lossy(&buffer[..end]).to_ascii_lowercase();
                        let length: usize = head
                            .lines()
                            .find_map(|l| l.strip_prefix("content-length:"))
                            .and_then(|v| v.trim().parse().ok())
                            .unwrap_or(0);
                        if buffer.len() < end + 4 + length {
                            match stream.read(&mut piece).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => buffer.extend_from_slice(&piece[..n]),
                            }
                            continue;
                        }
                        if let Some(id) = head
                            .lines()
                            .find_map(|l| l.strip_prefix("mesos-stream-id:"))
                        {
                            ids.lock().unwrap().push(id.trim().to_string());
                        }
                        buffer.drain(..end + 4 + length);
                        if stream.write_all(answer.as_bytes()).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        (address, seen)
    }

    fn calls_to(master: String) -> Calls {
        Calls {
            http: Http::new(),
            master: master.into(),
            codec: Codec::Protobuf,
            stream_id: "stream-1".into(),
            framework_id: v1::FrameworkId { value: "f1".into() },
        }
    }

    #[tokio::test]
    async fn a_pipeline_makes_every_call_on_keep_alive_connections_with_the_stream_id() {
        let (master, seen) =
            fake_master("HTTP/1.1 202 Accepted\r\ncontent-length: 0\r\n\r\n").await;
        let pipeline = CallPipeline::new(calls_to(master), 3, HttpVersion::Http1);
        for _ in 0..50 {
            pipeline.send(suppress()).await;
        }
        pipeline.drain().await;
        assert_eq!(pipeline.failure(), None);
        let seen = seen.lock().unwrap();
        assert_eq!(seen.len(), 50);
        assert!(seen.iter().all(|id| id == "stream-1"));
    }

    #[tokio::test]
    async fn a_pipelined_pipeline_writes_batches_back_to_back_and_gets_every_answer() {
        let (master, seen) =
            fake_master("HTTP/1.1 202 Accepted\r\ncontent-length: 0\r\n\r\n").await;
        // 70 calls in flight: one connection, all 70 unanswered at once.
        let pipeline = CallPipeline::new(calls_to(master), 70, HttpVersion::Http1Pipelined);
        for _ in 0..10 {
            pipeline.send_all((0..45).map(|_| suppress())).await;
        }
        pipeline.send(teardown()).await;
        pipeline.drain().await;
        assert_eq!(pipeline.failure(), None);
        let seen = seen.lock().unwrap();
        assert_eq!(seen.len(), 451);
        assert!(seen.iter().all(|id| id == "stream-1"));
    }

    #[tokio::test]
    async fn a_pipelined_refusal_or_a_vanished_master_is_a_clear_failure() {
        let (master, _) = fake_master(
            "HTTP/1.1 403 Forbidden\r\ncontent-length: 30\r\n\r\nFramework f1 is not subscribed",
        )
        .await;
        let pipeline = CallPipeline::new(calls_to(master), 8, HttpVersion::Http1Pipelined);
        pipeline.send_all(vec![suppress(), suppress()]).await;
        pipeline.drain().await;
        let failure = pipeline.failure().expect("a failure");
        assert!(
            failure.contains("SUPPRESS answered 403 (expected 202)"),
            "{failure}"
        );

        // A master that reads a call and hangs up: every call in flight
        // fails, none is left waiting.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap().to_string();
        tokio::spawn(async move {
            use tokio::io::AsyncReadExt;
            while let Ok((mut stream, _)) = listener.accept().await {
                let mut piece = [0u8; 64];
                let _ = stream.read(&mut piece).await;
            }
        });
        let pipeline = CallPipeline::new(calls_to(address), 8, HttpVersion::Http1Pipelined);
        pipeline.send_all((0..5).map(|_| suppress())).await;
        tokio::time::timeout(std::time::Duration::from_secs(10), pipeline.drain())
            .await
            .expect("every call answered or failed");
        let failure = pipeline.failure().expect("a failure");
        assert!(
            failure.contains("the master closed the connection")
                || failure.contains("reading answers from the master"),
            "{failure}"
        );
    }

    #[tokio::test]
    async fn a_refused_call_is_a_clear_failure() {
        let (master, _) = fake_master(
            "HTTP/1.1 403 Forbidden\r\ncontent-length: 30\r\n\r\nFramework f1 is not subscribed",
        )
        .await;
        let pipeline = CallPipeline::new(calls_to(master.clone()), 2, HttpVersion::Http1);
        pipeline.send(suppress()).await;
        pipeline.drain().await;
        let failure = pipeline.failure().expect("a failure");
        assert!(
            failure.contains("SUPPRESS answered 403 (expected 202)"),
            "{failure}"
        );
        assert!(failure.contains("not subscribed"), "{failure}");
        // The same through the pooled client.
        let err = calls_to(master).call(suppress()).await.unwrap_err();
        assert!(matches!(err, V1Error::Status { status: 403, .. }), "{err}");
    }

    #[test]
    fn tasks_translate_both_ways() {
        let task = agora_proto::TaskInfo {
            container: None,
            allocation_role: None,
            launch_stamp: None,
            name: "t".into(),
            task_id: agora_proto::TaskId::new("t1"),
            agent_id: agora_proto::AgentId::new("a1"),
            resources: agora_proto::Resources::parse("cpus:1;mem:1").unwrap(),
            executor: None,
            command: Some(agora_proto::CommandInfo {
                value: "/bin/true".into(),
                shell: true,
                ..Default::default()
            }),
            data: None,
            kill_grace_period: None,
            labels: Default::default(),
            task_group: None,
        };
        let mesos = mesos_task(&task);
        assert_eq!(convert::task_info(&mesos).unwrap(), task);
    }
}
