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
    frame_into(&mut out, payload);
    out
}

/// Appends one framed record to `out` (a stream's next chunk).
pub fn frame_into(out: &mut Vec<u8>, payload: &[u8]) {
    use std::io::Write as _;
    out.reserve(payload.len() + 8);
    let _ = writeln!(out, "{}", payload.len());
    out.extend_from_slice(payload);
}

/// Incremental reader: feed bytes as they arrive, take whole records.
#[derive(Debug, Default)]
pub struct Reader {
    buffer: Vec<u8>,
    /// Where the unread bytes of `buffer` start: records are taken by
    /// moving this on, and the bytes before it are dropped only when
    /// more arrive (so a read holding hundreds of records is not shifted
    /// once per record).
    start: usize,
}

impl Reader {
    /// An empty reader.
    pub fn new() -> Self {
        Reader::default()
    }

    /// Appends bytes read from the stream.
    pub fn feed(&mut self, bytes: &[u8]) {
        if self.start == self.buffer.len() {
            self.buffer.clear();
            self.start = 0;
        } else if self.start > 0 && self.start >= self.buffer.len() / 2 {
            self.buffer.drain(..self.start);
            self.start = 0;
        }
        self.buffer.extend_from_slice(bytes);
    }

    /// The next whole record, if one has arrived.
    pub fn next_record(&mut self) -> Result<Option<Vec<u8>>, RecordIoError> {
        Ok(self.next_record_ref()?.map(<[u8]>::to_vec))
    }

    /// [`Reader::next_record`] without a copy: the record as it lies in
    /// the reader's buffer, valid until the next call.
    pub fn next_record_ref(&mut self) -> Result<Option<&[u8]>, RecordIoError> {
        loop {
            let unread = &self.buffer[self.start..];
            let Some(newline) = unread.iter().position(|b| *b == b'\n') else {
                if unread.len() > MAX_DIGITS {
                    return Err(RecordIoError::BadPrefix(
                        String::from_utf8_lossy(&unread[..MAX_DIGITS]).into_owned(),
                    ));
                }
                return Ok(None);
            };
            let prefix = &unread[..newline];
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
                self.start += newline + 1;
                continue;
            }
            if unread.len() < newline + 1 + len {
                return Ok(None);
            }
            let record = self.start + newline + 1..self.start + newline + 1 + len;
            self.start = record.end;
            return Ok(Some(&self.buffer[record]));
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

    /// Chunks of every size, each holding several records and pieces of
    /// others (and empty records), give back every record in order.
    #[test]
    fn many_records_per_read_in_order() {
        let payloads: Vec<Vec<u8>> = (0..200)
            .map(|i| format!("record {i} {}", "x".repeat(i % 37)).into_bytes())
            .collect();
        let mut stream = Vec::new();
        for (i, p) in payloads.iter().enumerate() {
            if i % 50 == 0 {
                stream.extend_from_slice(b"0\n");
            }
            stream.extend(frame(p));
        }
        for size in [1, 7, 64, 1000, stream.len()] {
            let mut reader = Reader::new();
            let mut records = Vec::new();
            for chunk in stream.chunks(size) {
                reader.feed(chunk);
                while let Some(r) = reader.next_record().unwrap() {
                    records.push(r);
                }
            }
            assert_eq!(records, payloads, "chunks of {size}");
            assert_eq!(reader.next_record().unwrap(), None);
        }
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
