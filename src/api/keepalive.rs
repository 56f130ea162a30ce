//! What a keep-alive client is told about its connection. A request answered before its body
//! was read to the end (a 401, a 404 for no route, a 413) leaves bytes on the connection that
//! HTTP/1.1 cannot skip, and hyper then closes it after the answer: the client's next request
//! on it would get no answer. So such an answer says `Connection: close`, and the client opens
//! a new one. The refusals made before a handler runs (401, 429) [`drain`] a small body first,
//! and keep the connection.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes, HttpBody};
use axum::extract::Request;
use axum::http::{HeaderValue, Version, header};
use axum::middleware::Next;
use axum::response::Response;
use http_body::{Frame, SizeHint};

/// A request body that records when it has been read to its end.
struct Tracked {
    inner: Body,
    ended: Arc<AtomicBool>,
}

impl HttpBody for Tracked {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let frame = Pin::new(&mut self.inner).poll_frame(cx);
        if matches!(frame, Poll::Ready(None)) || self.inner.is_end_stream() {
            self.ended.store(true, Ordering::Release);
        }
        frame
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Answers with `Connection: close` when the request's body was not read to its end (HTTP/1
/// only: HTTP/2 has no such header, and ends a stream without the connection).
pub async fn announce_close(request: Request, next: Next) -> Response {
    let (parts, body) = request.into_parts();
    let ended = Arc::new(AtomicBool::new(body.is_end_stream()));
    let http1 = parts.version <= Version::HTTP_11;
    let body = Body::new(Tracked {
        inner: body,
        ended: Arc::clone(&ended),
    });
    let mut response = next.run(Request::from_parts(parts, body)).await;
    if http1 && !ended.load(Ordering::Acquire) {
        response
            .headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    response
}

/// How long a refused request's body is waited for before its answer.
pub const DRAIN_WAIT: Duration = Duration::from_secs(1);

/// Reads and drops a refused request's body, at most `limit` bytes within [`DRAIN_WAIT`], so
/// that the connection can take the client's next request. A larger or slower body is left,
/// and [`announce_close`] says the connection closes.
pub async fn drain(body: Body, limit: usize) {
    let _ = tokio::time::timeout(DRAIN_WAIT, axum::body::to_bytes(body, limit)).await;
}
