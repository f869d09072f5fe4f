//! The agents' service reads its calls' bodies in pieces of at most
//! [`PIECE_BYTES`].
//!
//! tonic decodes a stream's messages in a buffer of its own (`Streaming`)
//! that grows to hold the largest message plus the HTTP/2 frame read after
//! it (up to 16 KB), and is never made smaller again. A session lasts as long
//! as its agent, so at 16,384 nodes whatever one burst grew it to stayed:
//! ~47 KB a session, 0.77 GB of the coordinator's heap after the first job
//! (heap profile, issue 51). Agents send telemetry in messages of at most
//! [`gpuctl_core::telemetry_parts::MESSAGE_BYTES`]; the buffer grows to hold
//! one such message and the piece read after it. tonic's buffer starts at
//! [`gpuctl_proto::codec::BUFFER_BYTES`] (1 KB), so with pieces of 2 KB it grew
//! to 5 KB for a message and, doubling, to 8-10 KB (6.5 KB a session on
//! average at 16,384 nodes, 107-132 MB). With pieces of 512 bytes, a message
//! and the piece after it need 3.5 KB at most. The pieces are slices of the
//! frames HTTP/2 read: nothing is copied.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use tonic::server::NamedService;
use tower::Service;

/// A piece of a body as the agents' service reads it.
pub const PIECE_BYTES: usize = 512;

/// `S` (the agents' service), its calls' bodies read in pieces.
#[derive(Clone, Debug)]
pub struct InPieces<S>(pub S);

impl<S: NamedService> NamedService for InPieces<S> {
    const NAME: &'static str = S::NAME;
}

impl<S> Service<http::Request<tonic::body::Body>> for InPieces<S>
where
    S: Service<http::Request<tonic::body::Body>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<tonic::body::Body>) -> S::Future {
        self.0
            .call(req.map(|body| tonic::body::Body::new(Pieces::new(body))))
    }
}

/// A body whose data frames are cut to at most [`PIECE_BYTES`].
#[derive(Debug)]
pub struct Pieces<B> {
    inner: B,
    /// What is left of the frame read last.
    rest: Bytes,
}

impl<B> Pieces<B> {
    pub fn new(inner: B) -> Pieces<B> {
        Pieces {
            inner,
            rest: Bytes::new(),
        }
    }
}

impl<B> Body for Pieces<B>
where
    B: Body<Data = Bytes> + Unpin,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = &mut *self;
        if this.rest.is_empty() {
            match std::task::ready!(Pin::new(&mut this.inner).poll_frame(cx)) {
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => this.rest = data,
                    Err(trailers) => return Poll::Ready(Some(Ok(trailers))),
                },
                other => return Poll::Ready(other),
            }
        }
        let n = this.rest.len().min(PIECE_BYTES);
        Poll::Ready(Some(Ok(Frame::data(this.rest.split_to(n)))))
    }

    fn is_end_stream(&self) -> bool {
        self.rest.is_empty() && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        let inner = self.inner.size_hint();
        let rest = self.rest.len() as u64;
        let mut hint = SizeHint::new();
        hint.set_lower(inner.lower() + rest);
        if let Some(upper) = inner.upper() {
            hint.set_upper(upper + rest);
        }
        hint
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuctl_proto::pb::{GpuSample, TelemetryBatch};
    // Messages of the size agents send (a sample is ~100 bytes).
    use http_body_util::BodyExt as _;
    use prost::Message;
    use tokio_stream::StreamExt as _;

    /// A body of the given frames, then trailers.
    fn body(frames: Vec<Bytes>) -> tonic::body::Body {
        let mut trailers = http::HeaderMap::new();
        trailers.insert("grpc-status", "0".parse().unwrap());
        let frames = frames
            .into_iter()
            .map(|f| Ok::<_, tonic::Status>(Frame::data(f)))
            .chain(std::iter::once(Ok(Frame::trailers(trailers))));
        tonic::body::Body::new(http_body_util::StreamBody::new(futures::stream::iter(
            frames,
        )))
    }

    /// `batches` as gRPC messages (a flag byte, a length, the message), in
    /// one buffer.
    fn framed(batches: &[TelemetryBatch]) -> Bytes {
        let mut out = Vec::new();
        for b in batches {
            let m = b.encode_to_vec();
            out.push(0);
            out.extend_from_slice(&(m.len() as u32).to_be_bytes());
            out.extend_from_slice(&m);
        }
        out.into()
    }

    fn batches() -> Vec<TelemetryBatch> {
        (0..40u64)
            .map(|t| TelemetryBatch {
                node: "n-7".into(),
                job_id: "job-1".into(),
                attempt: 0,
                samples: (0..8)
                    .map(|g| GpuSample {
                        unix_ms: t * 1_000,
                        ..gpuctl_testkit::gpu::healthy(g)
                    })
                    .collect(),
            })
            .collect()
    }

    #[tokio::test]
    async fn frames_are_cut_to_pieces_that_join_to_what_came_and_trailers_follow() {
        let all = framed(&batches());
        // HTTP/2 frames as a client sends them: 16 KB, then the rest.
        let frames = vec![all.slice(..16_384.min(all.len())), all.slice(16_384..)];
        assert!(all.len() > 16_384 + PIECE_BYTES, "{}", all.len());
        let mut pieces = Pieces::new(body(frames));
        let mut joined = Vec::new();
        let mut sizes = Vec::new();
        let mut trailers = None;
        while let Some(frame) = pieces.frame().await {
            match frame.unwrap().into_data() {
                Ok(d) => {
                    sizes.push(d.len());
                    joined.extend_from_slice(&d);
                }
                Err(f) => trailers = f.into_trailers().ok(),
            }
        }
        assert_eq!(joined, all.to_vec());
        assert!(sizes.iter().all(|n| *n <= PIECE_BYTES), "{sizes:?}");
        assert!(sizes.len() >= all.len() / PIECE_BYTES, "{sizes:?}");
        assert_eq!(trailers.unwrap()["grpc-status"], "0");
    }

    #[tokio::test]
    async fn tonic_decodes_a_stream_read_in_pieces_message_for_message() {
        let sent = batches();
        let all = framed(&sent);
        let frames = vec![all.slice(..16_384), all.slice(16_384..)];
        let mut stream = tonic::Streaming::<TelemetryBatch>::new_request(
            tonic::codec::Codec::decoder(&mut tonic_prost::ProstCodec::<
                TelemetryBatch,
                TelemetryBatch,
            >::default()),
            tonic::body::Body::new(Pieces::new(body(frames))),
            None,
            None,
        );
        let mut got = Vec::new();
        while let Some(b) = stream.next().await {
            got.push(b.unwrap());
        }
        assert_eq!(got, sent);
    }
}
