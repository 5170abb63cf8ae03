//! Encoding and decoding of frames: one JSON object per WebSocket text
//! frame, at most [`MAX_FRAME_BYTES`] long.

use serde::de::DeserializeOwned;
use serde::Serialize;

/// The largest frame any Agora process reads or writes (16 MiB).
pub const MAX_FRAME_BYTES: usize = 16 * 1024 * 1024;

/// Why a frame could not be decoded. The `Display` text is what the peer
/// is told.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// The frame is larger than the cap.
    #[error("frame of {size} bytes exceeds the {max}-byte limit")]
    TooLarge {
        /// Frame size.
        size: usize,
        /// The limit.
        max: usize,
    },
    /// The frame is not valid JSON or does not match the message schema.
    #[error("malformed message: {0}")]
    Malformed(String),
    /// The frame's `type` is not one this process knows.
    #[error("unknown message type {0:?}")]
    UnknownType(String),
    /// A binary frame arrived; Agora speaks JSON text frames only.
    #[error("binary frames are not supported; send JSON text frames")]
    Binary,
}

/// Messages that have an `Unknown` catch-all variant.
pub trait Message: Serialize + DeserializeOwned {
    /// Whether this is the catch-all for unknown `type` values.
    fn is_unknown(&self) -> bool;
}

/// Serializes a message to the text of one frame.
pub fn encode<T: Serialize>(message: &T) -> String {
    // Our own types always serialize: no maps with non-string keys, no
    // failing Serialize impls.
    serde_json::to_string(message).unwrap_or_else(|e| {
        format!("{{\"type\":\"ERROR\",\"message\":\"encoding failed: {e}\",\"fatal\":false}}")
    })
}

/// Parses one frame, enforcing the size cap and turning an unknown `type`
/// into [`DecodeError::UnknownType`].
pub fn decode<T: Message>(text: &str) -> Result<T, DecodeError> {
    if text.len() > MAX_FRAME_BYTES {
        return Err(DecodeError::TooLarge {
            size: text.len(),
            max: MAX_FRAME_BYTES,
        });
    }
    let message: T =
        serde_json::from_str(text).map_err(|e| DecodeError::Malformed(e.to_string()))?;
    if message.is_unknown() {
        let ty = serde_json::from_str::<serde_json::Value>(text)
            .ok()
            .and_then(|v| v.get("type").and_then(|t| t.as_str()).map(str::to_string))
            .unwrap_or_default();
        return Err(DecodeError::UnknownType(ty));
    }
    Ok(message)
}

macro_rules! impl_message {
    ($($ty:path),*) => {
        $(impl Message for $ty {
            fn is_unknown(&self) -> bool {
                matches!(self, <$ty>::Unknown)
            }
        })*
    };
}

impl_message!(
    crate::scheduler::Call,
    crate::scheduler::Event,
    crate::agent::Call,
    crate::agent::Event,
    crate::executor::Call,
    crate::executor::Event
);
