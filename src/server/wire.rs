//! [`OpenAiErrors`]: the connection's byte stream, with the error responses hyper writes by
//! itself (a request it cannot parse: a garbage request line, too many or too large headers,
//! a bad `Content-Length`, bytes that are not a URI) rewritten into the OpenAI error shape,
//! so that every error the host answers has a JSON body.
//!
//! Invariant: hyper's own error responses are the only ones with an empty body (`content-length:
//! 0`) and no `content-type`; every response of the router is JSON (or SSE, or 204 without a
//! body). A rewritten response ends the connection, as hyper's does.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use serde_json::json;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// A stream whose hyper-made error responses are rewritten (see the module docs).
pub(super) struct OpenAiErrors<S> {
    inner: S,
    /// A rewritten response still to be written, and how much of it went.
    pending: Option<(Vec<u8>, usize)>,
}

impl<S> OpenAiErrors<S> {
    pub(super) fn new(inner: S) -> Self {
        Self {
            inner,
            pending: None,
        }
    }
}

/// The OpenAI-shaped replacement of a response head hyper wrote by itself, or `None` when
/// `buf` is not one.
fn rewrite(buf: &[u8]) -> Option<Vec<u8>> {
    // Response heads only (body chunks, SSE events): checked before anything is scanned.
    if !buf.starts_with(b"HTTP/1.") {
        return None;
    }
    let head_end = buf.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = std::str::from_utf8(&buf[..head_end]).ok()?;
    let mut lines = head.split("\r\n");
    let status_line = lines.next()?;
    let mut parts = status_line.splitn(3, ' ');
    let (version, code) = (parts.next()?, parts.next()?);
    let reason = parts.next().unwrap_or("");
    if !version.starts_with("HTTP/1.") || !(code.starts_with('4') || code.starts_with('5')) {
        return None;
    }
    let headers: Vec<(String, &str)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim()))
        .collect();
    let empty = headers
        .iter()
        .any(|(k, v)| k == "content-length" && *v == "0");
    let typed = headers.iter().any(|(k, _)| k == "content-type");
    if !empty || typed || buf.len() != head_end + 4 {
        return None;
    }
    let (kind, message) = match code {
        "431" => (
            "request_header_fields_too_large",
            "the request's headers are too many or too large",
        ),
        "414" => ("uri_too_long", "the request's URI is too long"),
        "408" => (
            "request_timeout",
            "the request's headers did not arrive in time",
        ),
        c if c.starts_with('5') => ("server_error", "the connection failed"),
        _ => (
            "invalid_request_error",
            "the request could not be parsed as HTTP/1.1 (request line, headers, Content-Length or URI)",
        ),
    };
    let body = json!({"error": {"message": format!("{message} ({code} {reason})"), "type": kind, "param": null, "code": kind}})
        .to_string();
    Some(
        format!(
            "{version} {code} {reason}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        )
        .into_bytes(),
    )
}

impl<S: AsyncRead + Unpin> AsyncRead for OpenAiErrors<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> OpenAiErrors<S> {
    /// Writes what is pending; ready when nothing is.
    fn poll_pending(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while let Some((bytes, at)) = &mut self.pending {
            match Pin::new(&mut self.inner).poll_write(cx, &bytes[*at..]) {
                Poll::Ready(Ok(0)) => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                Poll::Ready(Ok(n)) => {
                    *at += n;
                    if *at == bytes.len() {
                        self.pending = None;
                    }
                }
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            }
        }
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for OpenAiErrors<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        match this.poll_pending(cx) {
            Poll::Ready(Ok(())) => {}
            Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
            Poll::Pending => return Poll::Pending,
        }
        if let Some(replacement) = rewrite(buf) {
            this.pending = Some((replacement, 0));
            // The original bytes count as written; the replacement goes out in their place.
            let _ = this.poll_pending(cx);
            return Poll::Ready(Ok(buf.len()));
        }
        Pin::new(&mut this.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        match this.poll_pending(cx) {
            Poll::Ready(Ok(())) => Pin::new(&mut this.inner).poll_flush(cx),
            other => other,
        }
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        match this.poll_pending(cx) {
            Poll::Ready(Ok(())) => Pin::new(&mut this.inner).poll_shutdown(cx),
            other => other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::rewrite;

    #[test]
    fn only_hypers_empty_error_responses_are_rewritten() {
        let hyper_400 = b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\ndate: Mon, 30 Nov 2026 19:00:00 GMT\r\n\r\n";
        let out = String::from_utf8(rewrite(hyper_400).unwrap()).unwrap();
        let (head, body) = out.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.1 400 Bad Request\r\n"));
        let v: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(v["error"]["type"], "invalid_request_error");
        let hyper_431 =
            b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 0\r\n\r\n";
        assert!(
            String::from_utf8(rewrite(hyper_431).unwrap())
                .unwrap()
                .contains("request_header_fields_too_large")
        );
        // The router's own responses are left alone: JSON errors, successes, 204s.
        let json_400 = b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ncontent-length: 12\r\n\r\n";
        assert!(rewrite(json_400).is_none());
        assert!(rewrite(b"HTTP/1.1 204 No Content\r\n\r\n").is_none());
        assert!(rewrite(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n").is_none());
        // A head with body bytes after it is not hyper's empty error.
        assert!(rewrite(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\nx").is_none());
    }
}
