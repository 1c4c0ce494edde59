//! One HTTP/1.1 connection: read a request head, answer it from the site,
//! and keep the connection open for the next request when both sides allow
//! it. Only GET and HEAD exist here; bodies are never read, so a request
//! that announces one is answered and the connection closed.

use std::fs::File;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use crate::content_type;
use crate::resolve::{ResolveError, Site};

/// A head larger than this is refused; real browsers send a few KiB.
const MAX_HEAD_BYTES: usize = 16 * 1024;
/// How long an idle keep-alive connection (or a slow client) may hold its thread.
const READ_TIMEOUT: Duration = Duration::from_secs(30);
const WRITE_TIMEOUT: Duration = Duration::from_secs(60);

/// The parts of a request head this server acts on.
#[derive(Debug, PartialEq, Eq)]
struct Request {
    method: String,
    target: String,
    /// Whether the client allows another request on this connection.
    keep_alive: bool,
    /// Whether a body follows, which this server does not read.
    has_body: bool,
}

/// Why a head could not be read as a request.
#[derive(Debug)]
enum HeadError {
    /// The client closed the connection between requests.
    Closed,
    /// Reading failed or timed out; the connection is dropped either way.
    Io,
    TooLarge,
    /// Not a request this server understands (answered 400).
    Malformed,
}

impl From<io::Error> for HeadError {
    fn from(_: io::Error) -> HeadError {
        HeadError::Io
    }
}

/// Serves requests on `stream` until either side closes it. Errors end the
/// connection quietly: a dropped client is routine, not worth a log line.
pub fn serve_connection(stream: TcpStream, site: &Site) {
    let _ = stream.set_read_timeout(Some(READ_TIMEOUT));
    let _ = stream.set_write_timeout(Some(WRITE_TIMEOUT));
    let _ = stream.set_nodelay(true);
    let Ok(writer) = stream.try_clone() else { return };
    let mut reader = BufReader::new(stream);
    let mut writer = writer;
    loop {
        let request = match read_head(&mut reader) {
            Ok(request) => request,
            Err(HeadError::Closed | HeadError::Io) => return,
            Err(HeadError::TooLarge) => {
                let _ = write_status(&mut writer, 431, "Request Header Fields Too Large", false, false, &[]);
                return;
            }
            Err(HeadError::Malformed) => {
                let _ = write_status(&mut writer, 400, "Bad Request", false, false, &[]);
                return;
            }
        };
        let keep_alive = request.keep_alive && !request.has_body;
        let answered = respond(&mut writer, site, &request, keep_alive).is_ok();
        if answered && request.has_body {
            linger(&mut writer, reader.get_mut());
        }
        if !answered || !keep_alive {
            return;
        }
    }
}

/// Closing a socket with unread input makes the kernel send a reset, which
/// can destroy the response the client has not read yet. So after answering
/// a request whose body was never read, stop sending and drain briefly.
fn linger(writer: &mut TcpStream, reader: &mut TcpStream) {
    let _ = writer.shutdown(std::net::Shutdown::Write);
    let _ = reader.set_read_timeout(Some(Duration::from_secs(1)));
    let mut sink = [0u8; 8192];
    let mut drained = 0;
    while drained < 256 * 1024 {
        match reader.read(&mut sink) {
            Ok(0) | Err(_) => return,
            Ok(read) => drained += read,
        }
    }
}

/// Answers one request; an error means the connection is unusable.
fn respond(writer: &mut TcpStream, site: &Site, request: &Request, keep_alive: bool) -> io::Result<()> {
    let head_only = request.method == "HEAD";
    if !head_only && request.method != "GET" {
        return write_status(writer, 405, "Method Not Allowed", keep_alive, false, &[("Allow", "GET, HEAD")]);
    }
    let path = match site.resolve(&request.target) {
        Ok(path) => path,
        Err(ResolveError::BadTarget(_)) => return write_status(writer, 400, "Bad Request", keep_alive, head_only, &[]),
        Err(ResolveError::NotFound) => return write_status(writer, 404, "Not Found", keep_alive, head_only, &[]),
    };
    // The file can vanish or turn unreadable between resolving and opening;
    // that is a miss from the client's point of view, not a server fault.
    let Ok(mut file) = File::open(&path) else {
        return write_status(writer, 404, "Not Found", keep_alive, head_only, &[]);
    };
    let length = file.metadata()?.len();
    let head = format!(
        "HTTP/1.1 200 OK\r\nContent-Type: {}\r\nContent-Length: {length}\r\nX-Content-Type-Options: nosniff\r\nConnection: {}\r\n\r\n",
        content_type::for_path(&path),
        connection_header(keep_alive),
    );
    writer.write_all(head.as_bytes())?;
    if !head_only {
        // File-to-socket io::copy uses sendfile/splice on Linux, so large
        // assets are not copied through user space. `take` keeps the body
        // at the announced length should the file grow meanwhile.
        let sent = io::copy(&mut (&mut file).take(length), writer)?;
        if sent != length {
            // The file shrank: the client got fewer bytes than announced,
            // and the only honest signal left is closing the connection.
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "file shrank while being sent"));
        }
    }
    writer.flush()
}

/// Writes a status-only response with a short plain-text body, or only its
/// head when answering HEAD: a client does not read a body after a HEAD
/// response, so stray bytes would be taken for the next response.
fn write_status(
    writer: &mut TcpStream,
    code: u16,
    reason: &str,
    keep_alive: bool,
    head_only: bool,
    extra_headers: &[(&str, &str)],
) -> io::Result<()> {
    let body = format!("{code} {}\n", reason.to_ascii_lowercase());
    let mut head = format!(
        "HTTP/1.1 {code} {reason}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\nConnection: {}\r\n",
        body.len(),
        connection_header(keep_alive),
    );
    for (name, value) in extra_headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    if !head_only {
        head.push_str(&body);
    }
    writer.write_all(head.as_bytes())?;
    writer.flush()
}

fn connection_header(keep_alive: bool) -> &'static str {
    if keep_alive {
        "keep-alive"
    } else {
        "close"
    }
}

/// Reads one request head (request line and header fields).
fn read_head(reader: &mut impl BufRead) -> Result<Request, HeadError> {
    let mut budget = MAX_HEAD_BYTES;
    let mut request_line = read_line(reader, &mut budget)?;
    // Robust servers skip blank lines before a request (RFC 9112 §2.2).
    while request_line.is_empty() {
        request_line = read_line(reader, &mut budget)?;
    }
    let mut parts = request_line.split(' ');
    let (Some(method), Some(target), Some(version), None) = (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(HeadError::Malformed);
    };
    let http11 = match version {
        "HTTP/1.1" => true,
        "HTTP/1.0" => false,
        // HTTP/2 and later never arrive as text, and 0.9 has no headers.
        _ => return Err(HeadError::Malformed),
    };
    if method.is_empty() || target.is_empty() {
        return Err(HeadError::Malformed);
    }
    let mut keep_alive = http11;
    let mut has_body = false;
    loop {
        let line = read_line(reader, &mut budget)?;
        if line.is_empty() {
            break;
        }
        let Some((name, value)) = line.split_once(':') else {
            return Err(HeadError::Malformed);
        };
        let value = value.trim();
        match name.to_ascii_lowercase().as_str() {
            "connection" => {
                for option in value.split(',').map(str::trim) {
                    if option.eq_ignore_ascii_case("close") {
                        keep_alive = false;
                    } else if option.eq_ignore_ascii_case("keep-alive") {
                        keep_alive = true;
                    }
                }
            }
            "content-length" => has_body |= value != "0",
            "transfer-encoding" => has_body = true,
            _ => {}
        }
    }
    Ok(Request { method: method.to_string(), target: target.to_string(), keep_alive, has_body })
}

/// Reads one CRLF- (or LF-) terminated line as ASCII text, charging its
/// length against `budget` so a client cannot stream an endless head.
fn read_line(reader: &mut impl BufRead, budget: &mut usize) -> Result<String, HeadError> {
    let mut line = Vec::new();
    let limit = u64::try_from(*budget).unwrap_or(u64::MAX) + 1;
    let read = reader.take(limit).read_until(b'\n', &mut line)?;
    if read == 0 {
        return Err(HeadError::Closed);
    }
    if read > *budget {
        return Err(HeadError::TooLarge);
    }
    *budget -= read;
    if line.last() != Some(&b'\n') {
        // The peer closed mid-line.
        return Err(HeadError::Closed);
    }
    line.pop();
    if line.last() == Some(&b'\r') {
        line.pop();
    }
    // Request heads are ASCII; anything else is not a request.
    String::from_utf8(line).map_err(|_| HeadError::Malformed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(head: &str) -> Result<Request, HeadError> {
        read_head(&mut head.as_bytes())
    }

    fn request(method: &str, target: &str, keep_alive: bool, has_body: bool) -> Request {
        Request { method: method.into(), target: target.into(), keep_alive, has_body }
    }

    #[test]
    fn parses_heads() {
        let cases = [
            ("GET / HTTP/1.1\r\nHost: x\r\n\r\n", request("GET", "/", true, false)),
            ("HEAD /a.js HTTP/1.1\r\nConnection: close\r\n\r\n", request("HEAD", "/a.js", false, false)),
            ("GET / HTTP/1.0\r\n\r\n", request("GET", "/", false, false)),
            ("GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n", request("GET", "/", true, false)),
            ("\r\nGET /x HTTP/1.1\n\n", request("GET", "/x", true, false)),
            ("POST /f HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello", request("POST", "/f", true, true)),
            ("POST /f HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n", request("POST", "/f", true, true)),
        ];
        for (head, expected) in cases {
            assert_eq!(parse(head).unwrap(), expected, "{head:?}");
        }
    }

    #[test]
    fn refuses_bad_heads() {
        for head in
            ["GET /\r\n\r\n", "GET / HTTP/2\r\n\r\n", "GET  / HTTP/1.1\r\n\r\n", "GET / HTTP/1.1\r\nNoColon\r\n\r\n"]
        {
            assert!(matches!(parse(head), Err(HeadError::Malformed)), "{head:?}");
        }
        assert!(matches!(parse(""), Err(HeadError::Closed)));
        assert!(matches!(parse("GET / HTTP/1.1\r\nHost: x"), Err(HeadError::Closed)));
        let huge = format!("GET / HTTP/1.1\r\nX: {}\r\n\r\n", "a".repeat(MAX_HEAD_BYTES));
        assert!(matches!(parse(&huge), Err(HeadError::TooLarge)));
    }
}
