//! A channel to an agent that times every RPC into the controller's
//! metrics (`pillar_csi_agent_rpc_duration_seconds`): from the call until
//! the agent's answer arrives (its response headers; a unary answer's
//! body follows at once). The code is the `grpc-status` an error answer
//! carries in its headers, `OK` for an answer without one, `Unavailable`
//! when the transport failed.
use crate::metrics::Metrics;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;
use tonic::body::Body;
use tonic::transport::Channel;
use tower_service::Service;

/// A [`Channel`] that records each RPC's latency, when it has metrics.
#[derive(Clone)]
pub struct TimedChannel {
    inner: Channel,
    metrics: Option<Arc<Metrics>>,
}

impl TimedChannel {
    /// `inner`, timed into `metrics` (none: not timed).
    pub fn new(inner: Channel, metrics: Option<Arc<Metrics>>) -> Self {
        TimedChannel { inner, metrics }
    }
}

/// The gRPC method of a request path `/<package>.<Service>/<Method>`.
fn method_of(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// The code an answer's headers carry (errors are answered with the
/// status in the headers); `OK` when they carry none.
fn code_of(response: &http::Response<Body>) -> tonic::Code {
    response
        .headers()
        .get("grpc-status")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<i32>().ok())
        .map_or(tonic::Code::Ok, tonic::Code::from_i32)
}

type Answer = Result<http::Response<Body>, tonic::transport::Error>;

impl Service<http::Request<Body>> for TimedChannel {
    type Response = http::Response<Body>;
    type Error = tonic::transport::Error;
    type Future = Pin<Box<dyn Future<Output = Answer> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let method = method_of(request.uri().path()).to_owned();
        let metrics = self.metrics.clone();
        let answer = self.inner.call(request);
        Box::pin(async move {
            let start = Instant::now();
            let answer = answer.await;
            if let Some(metrics) = metrics {
                let code = match &answer {
                    Ok(response) => code_of(response),
                    Err(_) => tonic::Code::Unavailable,
                };
                metrics.observe_agent_rpc(&method, code, start.elapsed());
            }
            answer
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_method_is_the_last_path_segment() {
        assert_eq!(
            method_of("/pillar_csi.agent.v1.AgentService/CreateVolume"),
            "CreateVolume"
        );
        assert_eq!(method_of("CreateVolume"), "CreateVolume");
    }

    #[test]
    fn an_error_answer_carries_its_code_in_the_headers() {
        let ok = http::Response::new(Body::empty());
        assert_eq!(code_of(&ok), tonic::Code::Ok);
        let refused = http::Response::builder()
            .header("grpc-status", "9")
            .body(Body::empty())
            .expect("a response with a grpc-status header");
        assert_eq!(code_of(&refused), tonic::Code::FailedPrecondition);
    }
}
