//! A minimal blocking HTTP/1.1 client for the tests' status/metrics endpoints: one `GET` per
//! connection (`Connection: close`), status code and body back, chunked bodies decoded.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// How long [`get`] waits for the whole answer: longer than the agent's longest status long poll (60 s).
pub const DEFAULT_READ_TIMEOUT: Duration = Duration::from_secs(70);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// `GET path` from the calling thread's namespace; returns (status code, body).
pub fn get(addr: SocketAddr, path: &str) -> io::Result<(u16, String)> {
    get_with_timeout(addr, path, DEFAULT_READ_TIMEOUT)
}

/// Like [`get`], giving up when the answer takes longer than `read_timeout` (for quick polls).
pub fn get_with_timeout(
    addr: SocketAddr,
    path: &str,
    read_timeout: Duration,
) -> io::Result<(u16, String)> {
    let mut s = TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT)?;
    s.set_read_timeout(Some(read_timeout))?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf)?;
    parse_response(&buf)
}

/// Splits a raw HTTP/1.1 response into (status code, body), decoding a chunked body.
pub fn parse_response(raw: &[u8]) -> io::Result<(u16, String)> {
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map_or((raw, &raw[raw.len()..]), |i| (&raw[..i], &raw[i + 4..]));
    let (head, body) = split;
    let head = String::from_utf8_lossy(head);
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("no HTTP status line in response: {head:?}"),
            )
        })?;
    let chunked = head.lines().any(|l| {
        let l = l.to_ascii_lowercase();
        l.starts_with("transfer-encoding:") && l.contains("chunked")
    });
    let body = if chunked {
        dechunk(body)
    } else {
        body.to_vec()
    };
    Ok((code, String::from_utf8_lossy(&body).into_owned()))
}

/// Decodes a `Transfer-Encoding: chunked` body (chunk extensions ignored); stops at the last chunk or at
/// the first malformed or truncated one.
pub fn dechunk(mut body: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(eol) = body.windows(2).position(|w| w == b"\r\n") {
        let line = String::from_utf8_lossy(&body[..eol]);
        let size = line.split(';').next().unwrap_or("").trim();
        let Ok(n) = usize::from_str_radix(size, 16) else {
            break;
        };
        let rest = &body[eol + 2..];
        if n == 0 || rest.len() < n {
            break;
        }
        out.extend_from_slice(&rest[..n]);
        body = rest[n..].strip_prefix(b"\r\n").unwrap_or(&rest[n..]);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_body_is_returned_as_is() {
        let (code, body) =
            parse_response(b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 3\r\n\r\nnot")
                .unwrap();
        assert_eq!((code, body.as_str()), (503, "not"));
    }

    #[test]
    fn chunked_body_is_decoded_across_multibyte_text() {
        let raw = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4;x=y\r\nh\u{e9}l\r\n3\r\nlo!\r\n0\r\n\r\n";
        let (code, body) = parse_response(raw.as_bytes()).unwrap();
        assert_eq!((code, body.as_str()), (200, "h\u{e9}llo!"));
    }

    #[test]
    fn truncated_chunk_stops_decoding() {
        assert_eq!(dechunk(b"5\r\nab"), b"");
        assert_eq!(dechunk(b"2\r\nab\r\nzz\r\n"), b"ab");
    }

    #[test]
    fn missing_status_line_is_an_error() {
        assert!(parse_response(b"").is_err());
    }
}
