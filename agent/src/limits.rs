//! The agent's gRPC limits, so that no client can make it run out of memory
//! or threads:
//!
//! - **message size**: a request whose length prefix exceeds
//!   `limits.maxMessageBytes` is refused before its body is read (tonic
//!   checks the 5-byte gRPC frame header); this layer turns tonic's
//!   OUT_OF_RANGE for it into RESOURCE_EXHAUSTED, the code gRPC gives a
//!   message over the receive limit;
//! - **requests in flight**: at most `limits.maxConcurrentRequests` across
//!   all connections; one more is refused at once with RESOURCE_EXHAUSTED
//!   (not queued: a queue is memory a client controls). The CO retries;
//! - **deadline**: `limits.requestTimeoutSeconds` per RPC (the server's
//!   `timeout`; a shorter `grpc-timeout` from the client wins). A mutation
//!   whose caller timed out still finishes in its own task, holding its
//!   volume's lock, and the retry finds it done.
use http::{HeaderValue, Request, Response};
use std::{
    future::Future,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
};
use tokio::sync::Semaphore;
use tonic::{Code, Status};

/// tonic's message for a request over the decoding limit.
const TOO_LARGE: &str = "Error, decoded message length too large";

/// Limits requests in flight and reports oversized messages as
/// RESOURCE_EXHAUSTED; see the module documentation.
#[derive(Clone)]
pub struct LimitsLayer {
    permits: Arc<Semaphore>,
    limit: usize,
}

impl LimitsLayer {
    /// At most `max_in_flight` requests at once.
    pub fn new(max_in_flight: usize) -> Self {
        LimitsLayer {
            permits: Arc::new(Semaphore::new(max_in_flight)),
            limit: max_in_flight,
        }
    }
}

impl<S> tower::Layer<S> for LimitsLayer {
    type Service = Limited<S>;
    fn layer(&self, inner: S) -> Limited<S> {
        Limited {
            inner,
            permits: self.permits.clone(),
            limit: self.limit,
        }
    }
}

/// The service [`LimitsLayer`] wraps.
#[derive(Clone)]
pub struct Limited<S> {
    inner: S,
    permits: Arc<Semaphore>,
    limit: usize,
}

/// A response whose status is gRPC's OUT_OF_RANGE for an oversized request
/// gets RESOURCE_EXHAUSTED instead; every other response is left as it is.
fn oversized_is_exhausted<B>(mut response: Response<B>) -> Response<B> {
    let Some(status) = Status::from_header_map(response.headers()) else {
        return response;
    };
    if status.code() == Code::OutOfRange && status.message().starts_with(TOO_LARGE) {
        let exhausted = Status::resource_exhausted(status.message());
        if exhausted.add_header(response.headers_mut()).is_err() {
            response.headers_mut().insert(
                "grpc-status",
                HeaderValue::from(Code::ResourceExhausted as i32),
            );
        }
    }
    response
}

impl<S, B, RB> tower::Service<Request<B>> for Limited<S>
where
    S: tower::Service<Request<B>, Response = Response<RB>>,
    S::Future: Send + 'static,
    RB: Default,
{
    type Response = Response<RB>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Response<RB>, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let Ok(permit) = self.permits.clone().try_acquire_owned() else {
            let refusal = Status::resource_exhausted(format!(
                "the agent is serving {} requests, its limit (limits.maxConcurrentRequests); retry later",
                self.limit
            ));
            return Box::pin(async move { Ok(refusal.into_http()) });
        };
        let answer = self.inner.call(request);
        Box::pin(async move {
            let response = answer.await;
            drop(permit);
            response.map(oversized_is_exhausted)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::convert::Infallible;
    use tower::{Layer, Service};

    /// A service that answers once `gate` opens, with `status`.
    #[derive(Clone)]
    struct Held {
        gate: Arc<tokio::sync::Notify>,
        status: Status,
    }

    impl tower::Service<Request<()>> for Held {
        type Response = Response<tonic::body::Body>;
        type Error = Infallible;
        type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;
        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
            Poll::Ready(Ok(()))
        }
        fn call(&mut self, _: Request<()>) -> Self::Future {
            let (gate, status) = (self.gate.clone(), self.status.clone());
            Box::pin(async move {
                gate.notified().await;
                Ok(status.into_http())
            })
        }
    }

    fn code(r: &Response<tonic::body::Body>) -> Option<&[u8]> {
        r.headers().get("grpc-status").map(|v| v.as_bytes())
    }

    #[tokio::test]
    async fn one_request_over_the_limit_is_refused_and_a_freed_slot_serves_again() {
        let gate = Arc::new(tokio::sync::Notify::new());
        let mut svc = LimitsLayer::new(1).layer(Held {
            gate: gate.clone(),
            status: Status::ok(""),
        });
        let first = tokio::spawn(svc.call(Request::new(())));
        tokio::task::yield_now().await;
        let refused = svc.call(Request::new(())).await.expect("answer");
        assert_eq!(code(&refused), Some(b"8".as_slice()));
        gate.notify_one();
        let served = first.await.expect("join").expect("answer");
        assert_eq!(code(&served), Some(b"0".as_slice()));
        let again = tokio::spawn(svc.call(Request::new(())));
        tokio::task::yield_now().await;
        gate.notify_one();
        assert_eq!(
            code(&again.await.expect("join").expect("answer")),
            Some(b"0".as_slice())
        );
    }

    #[tokio::test]
    async fn only_the_oversized_message_error_becomes_resource_exhausted() {
        for (status, want) in [
            (
                Status::out_of_range(format!("{TOO_LARGE}: found 9 bytes, the limit is: 4 bytes")),
                b"8".as_slice(),
            ),
            (Status::out_of_range("generation 7 is past the end"), b"11"),
        ] {
            let gate = Arc::new(tokio::sync::Notify::new());
            gate.notify_one();
            let mut svc = LimitsLayer::new(4).layer(Held { gate, status });
            let r = svc.call(Request::new(())).await.expect("answer");
            assert_eq!(code(&r), Some(want));
        }
    }
}
