//! [`Watch`]: a key's changes as they happen, through the gateway's
//! streaming `/v3/watch` (one long-lived request; etcd pushes each
//! change as one JSON object).

use agora_client::Streaming;
use serde_json::Value as Json;

use crate::client::{header_revision, int, key_value, Client, EtcdError, KeyValue};

/// The gateway path of watches.
pub(crate) const PATH: &str = "/v3/watch";
/// Largest message buffered from a watch.
const MAX_MESSAGE_BYTES: usize = 64 << 20;

/// What happened to the key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    /// It was created or changed; the event's `kv` is its new value.
    Put,
    /// It was deleted (or its lease ran out); the event's `kv` holds only
    /// the key.
    Delete,
}

/// One change of a watched key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchEvent {
    /// Put or delete.
    pub kind: EventKind,
    /// The key (and for a put, its new value).
    pub kv: KeyValue,
}

/// An open watch of one key (see [`Client::watch`]). Dropping it closes
/// the request.
#[derive(Debug)]
pub struct Watch {
    client: Client,
    stream: Streaming,
    buf: Vec<u8>,
    /// The store's revision in the last message read.
    revision: i64,
}

// === impl Watch ===

impl Watch {
    /// Reads etcd's confirmation of the watch from `stream`.
    pub(crate) async fn start(client: Client, stream: Streaming) -> Result<Watch, EtcdError> {
        let mut watch = Watch {
            client,
            stream,
            buf: Vec::new(),
            revision: 0,
        };
        if watch.stream.status != 200 {
            let mut raw = Vec::new();
            while raw.len() < 4096 {
                match watch.stream.chunk().await {
                    Ok(Some(data)) => raw.extend_from_slice(&data),
                    _ => break,
                }
            }
            let message = format!(
                "HTTP {}: {}",
                watch.stream.status,
                String::from_utf8_lossy(&raw).trim()
            );
            return Err(watch.client.protocol(PATH, &message));
        }
        let first = watch.message().await?;
        match first {
            Some(result) if result.get("created").and_then(Json::as_bool) == Some(true) => {
                watch.revision = header_revision(&result);
                Ok(watch)
            }
            Some(result) => Err(watch.client.protocol(
                PATH,
                &format!("expected the watch to be created, got {result}"),
            )),
            None => Err(watch
                .client
                .protocol(PATH, "the watch ended before it was created")),
        }
    }

    /// The store's revision as of the last message read.
    pub fn revision(&self) -> i64 {
        self.revision
    }

    /// The next changes, oldest first (never empty). `Ok(None)`: etcd
    /// ended the watch (it was cancelled, its start revision was
    /// compacted, or the connection closed cleanly): read the key again
    /// and watch from there.
    pub async fn next(&mut self) -> Result<Option<Vec<WatchEvent>>, EtcdError> {
        loop {
            let Some(result) = self.message().await? else {
                return Ok(None);
            };
            let revision = header_revision(&result);
            if revision > 0 {
                self.revision = revision;
            }
            if result.get("canceled").and_then(Json::as_bool) == Some(true) {
                return Ok(None);
            }
            let Some(events) = result.get("events").and_then(Json::as_array) else {
                // A progress notification.
                continue;
            };
            let mut out = Vec::with_capacity(events.len());
            for event in events {
                let kind = match event.get("type").and_then(Json::as_str) {
                    Some("DELETE") => EventKind::Delete,
                    // PUT is the default (0), which the gateway leaves out.
                    None | Some("PUT") => EventKind::Put,
                    Some(other) => {
                        return Err(self
                            .client
                            .protocol(PATH, &format!("unknown event type {other:?}")))
                    }
                };
                let kv = event
                    .get("kv")
                    .map(key_value)
                    .transpose()
                    .map_err(|m| self.client.protocol(PATH, &m))?
                    .unwrap_or(KeyValue {
                        key: Vec::new(),
                        value: Vec::new(),
                        create_revision: 0,
                        mod_revision: 0,
                        lease: 0,
                    });
                out.push(WatchEvent { kind, kv });
            }
            if !out.is_empty() {
                return Ok(Some(out));
            }
        }
    }

    /// The next message's `result`; `None` at the end of the stream.
    async fn message(&mut self) -> Result<Option<Json>, EtcdError> {
        loop {
            if let Some(value) = take_value(&mut self.buf) {
                let value = value.map_err(|e| self.client.protocol(PATH, &e.to_string()))?;
                if let Some(error) = value.get("error") {
                    return Err(self.client.protocol(PATH, &error.to_string()));
                }
                let result = value.get("result").cloned().unwrap_or(value);
                if int(&result, "compact_revision").unwrap_or(0) > 0 {
                    // The start revision is gone: the caller reads anew.
                    return Ok(None);
                }
                return Ok(Some(result));
            }
            match self.stream.chunk().await {
                Ok(Some(data)) => {
                    if self.buf.len().saturating_add(data.len()) > MAX_MESSAGE_BYTES {
                        return Err(self.client.protocol(PATH, "watch message too large"));
                    }
                    self.buf.extend_from_slice(&data);
                }
                Ok(None) => return Ok(None),
                Err(source) => return Err(self.client.http_error(source)),
            }
        }
    }
}

/// Removes and returns the first complete JSON value of `buf`; `None`
/// while it is incomplete.
fn take_value(buf: &mut Vec<u8>) -> Option<Result<Json, serde_json::Error>> {
    let mut values = serde_json::Deserializer::from_slice(buf).into_iter::<Json>();
    match values.next()? {
        Err(e) if e.is_eof() => None,
        Err(e) => {
            buf.clear();
            Some(Err(e))
        }
        Ok(value) => {
            let used = values.byte_offset();
            buf.drain(..used);
            Some(Ok(value))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_split_as_they_complete() {
        let mut buf = b"{\"result\":{\"created\":true}}\n{\"result\":".to_vec();
        let first = take_value(&mut buf).unwrap().unwrap();
        assert_eq!(first["result"]["created"], true);
        assert!(take_value(&mut buf).is_none());
        buf.extend_from_slice(b"{\"events\":[]}}\n");
        let second = take_value(&mut buf).unwrap().unwrap();
        assert!(second["result"]["events"].is_array());
        assert!(take_value(&mut buf).is_none());
    }
}
