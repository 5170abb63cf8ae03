//! RecordIO, the framing of Mesos event streams: each record is its
//! length in decimal ASCII, a newline, then that many bytes (no trailing
//! newline). Records are never empty.

/// Longest record [`Reader`] accepts (mesos-go's own limit).
pub const MAX_RECORD_BYTES: usize = 4 << 20;

/// Most digits a length prefix may have.
const MAX_DIGITS: usize = 20;

/// Why a stream could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecordIoError {
    /// The length prefix is not a decimal number followed by a newline.
    #[error("malformed RecordIO length prefix {0:?}")]
    BadPrefix(String),
    /// A record is longer than [`MAX_RECORD_BYTES`].
    #[error("RecordIO record of {0} bytes exceeds the {MAX_RECORD_BYTES}-byte limit")]
    TooLarge(usize),
}

/// Frames one record: `<len>\n<payload>`.
pub fn frame(payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(payload.len() + 8);
    out.extend_from_slice(payload.len().to_string().as_bytes());
    out.push(b'\n');
    out.extend_from_slice(payload);
    out
}

/// Incremental reader: feed bytes as they arrive, take whole records.
#[derive(Debug, Default)]
pub struct Reader {
    buffer: Vec<u8>,
}

impl Reader {
    /// An empty reader.
    pub fn new() -> Self {
        Reader::default()
    }

    /// Appends bytes read from the stream.
    pub fn feed(&mut self, bytes: &[u8]) {
        self.buffer.extend_from_slice(bytes);
    }

    /// The next whole record, if one has arrived.
    pub fn next_record(&mut self) -> Result<Option<Vec<u8>>, RecordIoError> {
        loop {
            let Some(newline) = self.buffer.iter().position(|b| *b == b'\n') else {
                if self.buffer.len() > MAX_DIGITS {
                    return Err(RecordIoError::BadPrefix(
                        String::from_utf8_lossy(&self.buffer[..MAX_DIGITS]).into_owned(),
                    ));
                }
                return Ok(None);
            };
            let prefix = &self.buffer[..newline];
            let text = std::str::from_utf8(prefix)
                .map_err(|_| RecordIoError::BadPrefix(String::from_utf8_lossy(prefix).into()))?
                .trim();
            if prefix.len() > MAX_DIGITS
                || text.is_empty()
                || !text.bytes().all(|b| b.is_ascii_digit())
            {
                return Err(RecordIoError::BadPrefix(text.to_string()));
            }
            let len: usize = text
                .parse()
                .map_err(|_| RecordIoError::BadPrefix(text.to_string()))?;
            if len > MAX_RECORD_BYTES {
                return Err(RecordIoError::TooLarge(len));
            }
            if len == 0 {
                self.buffer.drain(..=newline);
                continue;
            }
            if self.buffer.len() < newline + 1 + len {
                return Ok(None);
            }
            let record = self.buffer[newline + 1..newline + 1 + len].to_vec();
            self.buffer.drain(..newline + 1 + len);
            return Ok(Some(record));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_and_reads_back_in_pieces() {
        let mut stream = frame(b"{\"type\":\"HEARTBEAT\"}");
        stream.extend(frame(b"xyz"));
        let mut reader = Reader::new();
        let mut records = Vec::new();
        for chunk in stream.chunks(3) {
            reader.feed(chunk);
            while let Some(r) = reader.next_record().unwrap() {
                records.push(r);
            }
        }
        assert_eq!(
            records,
            vec![b"{\"type\":\"HEARTBEAT\"}".to_vec(), b"xyz".to_vec()]
        );
        assert_eq!(&frame(b"abc")[..], b"3\nabc");
    }

    #[test]
    fn rejects_garbage_and_huge_records() {
        let mut reader = Reader::new();
        reader.feed(b"12a\nxx");
        assert!(matches!(
            reader.next_record(),
            Err(RecordIoError::BadPrefix(_))
        ));
        let mut reader = Reader::new();
        reader.feed(b"99999999\n");
        assert!(matches!(
            reader.next_record(),
            Err(RecordIoError::TooLarge(_))
        ));
    }
}
