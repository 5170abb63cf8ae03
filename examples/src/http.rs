//! A minimal HTTP/1.1 GET client for the local cluster's endpoints, so the
//! examples and tests need no HTTP client dependency.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{bail, Context};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Largest response body read (the cluster's `/state` of a big test).
const MAX_RESPONSE: usize = 64 * 1024 * 1024;

/// `GET http://addr/path`: the status code and body.
pub async fn get(addr: SocketAddr, path: &str) -> anyhow::Result<(u16, String)> {
    let fut = async {
        let mut stream = TcpStream::connect(addr)
            .await
            .with_context(|| format!("connecting to {addr}"))?;
        let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await?;
        let mut raw = Vec::new();
        (&mut stream)
            .take(MAX_RESPONSE as u64)
            .read_to_end(&mut raw)
            .await?;
        parse_response(&raw)
    };
    tokio::time::timeout(Duration::from_secs(10), fut)
        .await
        .with_context(|| format!("GET {path} on {addr} timed out"))?
}

/// Splits a raw HTTP/1.1 response into its status code and (de-chunked) body.
pub fn parse_response(raw: &[u8]) -> anyhow::Result<(u16, String)> {
    let text = String::from_utf8_lossy(raw);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .context("HTTP response without header end")?;
    let status: u16 = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .context("HTTP response without status code")?;
    let chunked = head.lines().any(|l| {
        l.to_ascii_lowercase().starts_with("transfer-encoding:")
            && l.to_ascii_lowercase().contains("chunked")
    });
    let body = if chunked {
        dechunk(body)?
    } else {
        body.to_string()
    };
    Ok((status, body))
}

fn dechunk(mut body: &str) -> anyhow::Result<String> {
    let mut out = String::new();
    loop {
        let (size, rest) = body.split_once("\r\n").context("truncated chunked body")?;
        let size = usize::from_str_radix(size.trim(), 16).context("bad chunk size")?;
        if size == 0 {
            return Ok(out);
        }
        if rest.len() < size {
            bail!("truncated chunk");
        }
        out.push_str(&rest[..size]);
        body = rest[size..].trim_start_matches("\r\n");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_plain_and_chunked() {
        let (code, body) =
            parse_response(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok").unwrap();
        assert_eq!((code, body.as_str()), (200, "ok"));
        let (code, body) = parse_response(
            b"HTTP/1.1 404 Not Found\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n",
        )
        .unwrap();
        assert_eq!((code, body.as_str()), (404, "abcde"));
    }
}
