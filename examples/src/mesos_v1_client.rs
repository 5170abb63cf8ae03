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
//! - [`CallPipeline`] keeps one call in flight on each of several
//!   keep-alive connections, so one ACKNOWLEDGE per update (as Mesos
//!   clients send them) is not serialised on one round trip. Each
//!   connection is driven by the task that makes its calls (hyper's
//!   connection API), so a call costs no hop between tasks. Calls of one
//!   pipeline may complete in any order, as with several Mesos client
//!   connections; the first failure is kept and reported.
//! - Translation between the Mesos messages the bench sees and the
//!   `agora-proto` types its offer logic works on ([`offer`],
//!   [`task_status`], [`mesos_task`]).
//!
//! The framing and the checks of answers are sans-IO ([`EventDecoder`],
//! [`check_subscribe_head`], [`check_call_answer`]) and unit-tested here.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use agora_client::{ClientError, Http, Streaming};
use agora_mesos_proto::convert::{self, ResourceStyle};
use agora_mesos_proto::recordio::{self, RecordIoError};
use agora_mesos_proto::v1::scheduler::{call, event, Call, Event};
use agora_mesos_proto::{v1, Codec, CodecError};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1;
use hyper::header::{HeaderMap, HeaderValue, ACCEPT, CONTENT_TYPE, HOST};
use hyper::{Method, Request};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio::sync::{mpsc, Notify};

/// The scheduler endpoint's path.
pub const SCHEDULER_PATH: &str = "/api/v1/scheduler";
/// The `Mesos-Stream-Id` header.
pub const STREAM_ID: &str = "Mesos-Stream-Id";
/// Default size of a [`CallPipeline`]: calls in flight at once, each on a
/// keep-alive connection of its own.
pub const DEFAULT_CALLS_IN_FLIGHT: usize = 16;
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

/// Calls on `connections` keep-alive connections of their own, one call
/// in flight on each (HTTP/1.1 without pipelining), all taking from one
/// queue: whichever connection is free makes the next call, so a slow
/// answer holds up only its own call.
#[derive(Clone)]
pub struct CallPipeline {
    queue: mpsc::Sender<Call>,
    shared: Arc<PipelineShared>,
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
        match self.reader.next_record()? {
            Some(record) => Ok(Some(self.codec.decode::<Event>(&record)?)),
            None => Ok(None),
        }
    }
}

// === impl Events ===

impl Events {
    /// The next event; `None` when the master ended the stream.
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

    /// Opens a keep-alive connection of its own to the master.
    async fn connect(
        &self,
    ) -> Result<
        (
            http1::SendRequest<Full<Bytes>>,
            http1::Connection<TokioIo<TcpStream>, Full<Bytes>>,
        ),
        V1Error,
    > {
        let transport = |message: String| {
            V1Error::Transport(ClientError::Transport {
                method: Method::POST,
                url: format!("http://{}{SCHEDULER_PATH}", self.master),
                message,
            })
        };
        let stream = TcpStream::connect(&*self.master)
            .await
            .map_err(|e| transport(e.to_string()))?;
        // Calls are small writes answered at once: no Nagle.
        let _ = stream.set_nodelay(true);
        http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| transport(e.to_string()))
    }

    /// Makes `call` on a connection from [`Calls::connect`] and expects 202.
    async fn call_on(
        &self,
        sender: &mut http1::SendRequest<Full<Bytes>>,
        mut call: Call,
    ) -> Result<(), V1Error> {
        call.framework_id = Some(self.framework_id.clone());
        let kind = call.r#type();
        let body = self.codec.encode(&call)?;
        let transport = |message: String| {
            V1Error::Transport(ClientError::Transport {
                method: Method::POST,
                url: format!("http://{}{SCHEDULER_PATH}", self.master),
                message,
            })
        };
        let media = HeaderValue::from_static(self.codec.media_type());
        let request = Request::post(SCHEDULER_PATH)
            .header(HOST, &*self.master)
            .header(CONTENT_TYPE, media.clone())
            .header(ACCEPT, media)
            .header(STREAM_ID, &*self.stream_id)
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| transport(e.to_string()))?;
        sender.ready().await.map_err(|e| transport(e.to_string()))?;
        let response = sender
            .send_request(request)
            .await
            .map_err(|e| transport(e.to_string()))?;
        let status = response.status().as_u16();
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|e| transport(e.to_string()))?
            .to_bytes();
        check_call_answer(kind, status, &body)
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
    /// A pipeline of `connections` connections (at least one) for `calls`'
    /// subscription. Each runs in one task that both drives its
    /// connection and makes its calls, so a call costs no hop between
    /// tasks; a failed call is kept (see [`CallPipeline::failure`]), not
    /// retried.
    pub fn new(calls: Calls, connections: usize) -> Self {
        let shared = Arc::new(PipelineShared::default());
        let connections = connections.max(1);
        let (queue, rx) = mpsc::channel(CALLS_QUEUED_PER_CONNECTION * connections);
        let rx = Arc::new(tokio::sync::Mutex::new(rx));
        for _ in 0..connections {
            tokio::spawn(connection(calls.clone(), rx.clone(), shared.clone()));
        }
        CallPipeline { queue, shared }
    }

    /// Queues `call`; waits when the queue is full (backpressure, not a
    /// drop).
    pub async fn send(&self, call: Call) {
        self.shared.outstanding.fetch_add(1, Ordering::AcqRel);
        if self.queue.send(call).await.is_err() {
            self.shared
                .finished(Err("every connection's task has ended".into()));
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
    queue: Arc<tokio::sync::Mutex<mpsc::Receiver<Call>>>,
    shared: Arc<PipelineShared>,
) {
    let next = || async { queue.lock().await.recv().await };
    let (mut sender, conn) = match calls.connect().await {
        Ok(pair) => pair,
        Err(e) => {
            let e = e.to_string();
            while next().await.is_some() {
                shared.finished(Err(e.clone()));
            }
            return;
        }
    };
    let requests = async {
        while let Some(call) = next().await {
            let result = calls.call_on(&mut sender, call).await;
            shared.finished(result.map_err(|e| e.to_string()));
        }
        drop(sender);
    };
    // The connection ends once `requests` drops its sender.
    let _ = futures::future::join(conn, requests).await;
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
        let pipeline = CallPipeline::new(calls_to(master), 3);
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
    async fn a_refused_call_is_a_clear_failure() {
        let (master, _) = fake_master(
            "HTTP/1.1 403 Forbidden\r\ncontent-length: 30\r\n\r\nFramework f1 is not subscribed",
        )
        .await;
        let pipeline = CallPipeline::new(calls_to(master.clone()), 2);
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
