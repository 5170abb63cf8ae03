//! The operator event stream (`SUBSCRIBE` on `/api/v1`), computed once
//! for all its readers: a *feed* per view (every reader, or, when ACLs
//! restrict what operators see, each principal) turns each new `/state`
//! snapshot into events once, encodes them once per codec, and queues the
//! same bytes for each of its readers. Two hundred readers cost one diff
//! of the state per snapshot, not two hundred.
//!
//! A reader gets SUBSCRIBED (the whole state as its view shows it) and a
//! HEARTBEAT, then the events of every later snapshot, and a HEARTBEAT
//! every 15 s. What waits for one reader is bounded: when more than
//! `--operator-stream-backlog` bytes are queued for it, or it took
//! nothing for a whole heartbeat interval while events waited (it stopped
//! reading), its stream is cut off, its connection closed, the reason
//! logged and `agora_master_streams_cut_total{stream="operator"}`
//! counted. A feed with no readers left ends.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use agora_mesos_proto::v1::master::event;
use agora_mesos_proto::{recordio, v1, Codec};
use axum::body::{Body, Bytes};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use tokio::sync::{mpsc, watch};

use super::operator::{event_of, get_state, Seen};
use crate::http::AppState;
use crate::state::StateSnapshot;

/// Heartbeat period of the operator event stream (Mesos's).
const HEARTBEAT: Duration = Duration::from_secs(15);

/// The records of one snapshot's events (or SUBSCRIBED), each framed
/// alone: the body writes one record per chunk, as libprocess does.
type Batch = Arc<[Bytes]>;

/// Who a feed is for: everyone (`None`), or one principal (and the
/// anonymous) when ACLs restrict what operators see.
type ViewKey = Option<Option<String>>;

/// The live feeds, by view.
#[derive(Default)]
pub(crate) struct Feeds(Mutex<HashMap<ViewKey, mpsc::UnboundedSender<Reader>>>);

/// One reader's queue, as its feed holds it.
struct Reader {
    codec: Codec,
    queue: mpsc::UnboundedSender<Batch>,
    /// Bytes queued and not yet taken by the response body.
    queued: Arc<AtomicUsize>,
    /// Chunks the response body took, and how many at the last heartbeat.
    taken: Arc<AtomicUsize>,
    taken_at_heartbeat: usize,
    connection: Option<agora_net::Connection>,
}

/// One view's feed: the readers, what they last saw, and the snapshot
/// that was (as the view shows it).
struct Feed {
    app: AppState,
    key: ViewKey,
    feeds: Arc<Feeds>,
    readers: Vec<Reader>,
    seen: Seen,
    viewed: Arc<StateSnapshot>,
}

/// `SUBSCRIBE`: a stream of `codec` records from the feed of the view
/// of `principal`.
pub(crate) fn subscribe(
    app: &AppState,
    feeds: &Arc<Feeds>,
    principal: Option<String>,
    codec: Codec,
    connection: Option<agora_net::Connection>,
) -> Response {
    use crate::acls::Action;
    let acls = &app.auth.acls;
    let key = (acls.restricts(Action::ViewFrameworks) || acls.restricts(Action::ViewTasks))
        .then_some(principal);
    let (queue, mut rx) = mpsc::unbounded_channel::<Batch>();
    let queued = Arc::new(AtomicUsize::new(0));
    let taken = Arc::new(AtomicUsize::new(0));
    let mut reader = Reader {
        codec,
        queue,
        queued: queued.clone(),
        taken: taken.clone(),
        taken_at_heartbeat: 0,
        connection,
    };
    {
        let mut live = feeds.0.lock().unwrap_or_else(PoisonError::into_inner);
        loop {
            let Some(add) = live.get(&key) else {
                let (add, adds) = mpsc::unbounded_channel();
                live.insert(key.clone(), add.clone());
                let feed = Feed::new(app.clone(), key.clone(), feeds.clone());
                tokio::spawn(feed.run(adds));
                // A new feed takes its first reader at once (or, shutting
                // down already, drops it: the stream ends).
                let _ = add.send(reader);
                break;
            };
            match add.send(reader) {
                Ok(()) => break,
                // The feed ended (its last reader left): start another.
                Err(mpsc::error::SendError(back)) => {
                    reader = back;
                    live.remove(&key);
                }
            }
        }
    }
    // The first batch (SUBSCRIBED) was not counted in the backlog.
    let mut first = true;
    let mut current: Option<(Batch, usize)> = None;
    let body = futures::stream::poll_fn(move |cx| loop {
        if let Some((batch, next)) = &mut current {
            if let Some(chunk) = batch.get(*next).cloned() {
                *next += 1;
                if !first {
                    queued.fetch_sub(chunk.len(), Ordering::AcqRel);
                }
                taken.fetch_add(1, Ordering::AcqRel);
                return std::task::Poll::Ready(Some(Ok::<_, Infallible>(chunk)));
            }
            if current.take().is_some() {
                first = false;
            }
        }
        match rx.poll_recv(cx) {
            std::task::Poll::Ready(Some(batch)) => current = Some((batch, 0)),
            std::task::Poll::Ready(None) => return std::task::Poll::Ready(None),
            std::task::Poll::Pending => return std::task::Poll::Pending,
        }
    });
    let mut response = (StatusCode::OK, Body::from_stream(body)).into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(codec.media_type()),
    );
    response
}

// === impl Feed ===

impl Feed {
    fn new(app: AppState, key: ViewKey, feeds: Arc<Feeds>) -> Feed {
        let viewed = Feed::view(&app, &key, app.snapshot.borrow().clone());
        Feed {
            seen: Seen::of(&viewed),
            viewed,
            app,
            key,
            feeds,
            readers: Vec::new(),
        }
    }

    /// The snapshot as this feed's view shows it.
    fn view(app: &AppState, key: &ViewKey, snapshot: Arc<StateSnapshot>) -> Arc<StateSnapshot> {
        match key {
            None => snapshot,
            Some(principal) => match snapshot.viewed_by(&app.auth.acls, principal.as_deref()) {
                Some(viewed) => Arc::new(viewed),
                None => snapshot,
            },
        }
    }

    async fn run(mut self, mut adds: mpsc::UnboundedReceiver<Reader>) {
        let mut snapshots: watch::Receiver<Arc<StateSnapshot>> = self.app.snapshot.clone();
        snapshots.mark_unchanged();
        let mut heartbeat =
            tokio::time::interval_at(tokio::time::Instant::now() + HEARTBEAT, HEARTBEAT);
        let shutdown = self.app.shutdown.clone();
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                reader = adds.recv() => match reader {
                    Some(reader) => self.add(reader),
                    None => return,
                },
                changed = snapshots.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    let snapshot = snapshots.borrow_and_update().clone();
                    self.viewed = Feed::view(&self.app, &self.key, snapshot);
                    let mut events = Vec::new();
                    self.seen.update(&self.viewed, &mut |e| events.push(e));
                    self.push(&events);
                }
                _ = heartbeat.tick() => {
                    self.cut_stalled();
                    self.push(&[event_of(event::Type::Heartbeat, |_| {})]);
                }
            }
            if self.readers.is_empty() && self.end_if_idle(&mut adds) {
                return;
            }
        }
    }

    /// A new reader gets SUBSCRIBED with the state this feed last saw,
    /// and the events after it.
    fn add(&mut self, reader: Reader) {
        let events = [
            event_of(event::Type::Subscribed, |e| {
                e.subscribed = Some(event::Subscribed {
                    get_state: Some(get_state(&self.viewed)),
                    heartbeat_interval_seconds: Some(HEARTBEAT.as_secs_f64()),
                })
            }),
            event_of(event::Type::Heartbeat, |_| {}),
        ];
        let batch = encode(reader.codec, &events);
        // The first batch holds the whole state: it is not held against
        // the reader's backlog.
        if reader.queue.send(batch).is_ok() {
            self.readers.push(reader);
        }
    }

    /// Queues `events` for every reader, encoded once per codec; cuts off
    /// a reader whose backlog would pass the bound.
    fn push(&mut self, events: &[v1::master::Event]) {
        if events.is_empty() {
            return;
        }
        let mut batches: [Option<(Batch, usize)>; 2] = [None, None];
        let limit = self.app.operator_stream_backlog;
        let metrics = self.app.metrics.clone();
        self.readers.retain(|reader| {
            let slot = match reader.codec {
                Codec::Json => 0,
                Codec::Protobuf => 1,
            };
            let (batch, len) = batches[slot]
                .get_or_insert_with(|| {
                    let batch = encode(reader.codec, events);
                    let len = batch.iter().map(Bytes::len).sum();
                    (batch, len)
                })
                .clone();
            let backlog = reader.queued.load(Ordering::Acquire) + len;
            if backlog > limit {
                metrics.streams_cut_operator.inc();
                let peer = reader.connection.as_ref().map(|c| c.peer());
                tracing::warn!(?peer, backlog, limit, "operator event stream cut off: its reader left more than --operator-stream-backlog bytes unread; connection closed");
                reader.cut();
                return false;
            }
            reader.queued.fetch_add(len, Ordering::AcqRel);
            reader.queue.send(batch).is_ok()
        });
    }

    /// Cuts off the readers that took nothing in a whole heartbeat
    /// interval while events waited for them: they stopped reading (a
    /// quiet cluster would take long to fill a backlog, while the reader
    /// holds the whole state it was sent).
    fn cut_stalled(&mut self) {
        let metrics = self.app.metrics.clone();
        self.readers.retain_mut(|reader| {
            let taken = reader.taken.load(Ordering::Acquire);
            let waiting = reader.queued.load(Ordering::Acquire);
            if waiting > 0 && taken == reader.taken_at_heartbeat {
                metrics.streams_cut_operator.inc();
                let peer = reader.connection.as_ref().map(|c| c.peer());
                tracing::warn!(?peer, waiting, interval = ?HEARTBEAT, "operator event stream cut off: its reader took nothing for a heartbeat interval; connection closed");
                reader.cut();
                return false;
            }
            reader.taken_at_heartbeat = taken;
            true
        });
    }

    /// With no reader left, ends the feed unless a reader is on its way
    /// (decided under the feeds' lock, which readers are added under).
    fn end_if_idle(&self, adds: &mut mpsc::UnboundedReceiver<Reader>) -> bool {
        let mut live = self.feeds.0.lock().unwrap_or_else(PoisonError::into_inner);
        if !adds.is_empty() {
            return false;
        }
        live.remove(&self.key);
        true
    }
}

// === impl Reader ===

impl Reader {
    /// Ends the stream and closes its connection (hyper may not be
    /// polling the stream to see it end: its socket is full).
    fn cut(&self) {
        if let Some(connection) = &self.connection {
            connection.close();
        }
    }
}

/// `events` as RecordIO records in `codec`, one chunk each.
fn encode(codec: Codec, events: &[v1::master::Event]) -> Batch {
    events
        .iter()
        .filter_map(|e| match codec.encode(e) {
            Ok(bytes) => Some(Bytes::from(recordio::frame(&bytes))),
            Err(err) => {
                tracing::error!(error = %err, "cannot encode an operator event");
                None
            }
        })
        .collect()
}
