//! The gRPC codec every gpuctl service and client uses: prost's, with
//! smaller starting buffers.
//!
//! tonic starts each stream's encode and decode buffers at 8 KiB and keeps
//! them for the stream's life. An agent's session is a stream that lives as
//! long as the agent, and most of what it carries is a few hundred bytes
//! (heartbeats, telemetry of 8 GPUs, acknowledgements): at 4,096 agents
//! those two buffers were 64 MB of the coordinator's heap (jemalloc's heap
//! profile, mid-job). A buffer still grows to fit a bigger message, as
//! before; only its starting size changes.

use std::marker::PhantomData;

use tonic::codec::{BufferSettings, Codec};
use tonic_prost::{ProstCodec, ProstDecoder, ProstEncoder};

/// Each buffer's starting size: a heartbeat or a telemetry batch of 8 GPUs
/// fits.
pub const BUFFER_BYTES: usize = 1024;

/// A message batch handed on once this much is encoded: tonic's default.
const YIELD_BYTES: usize = 32 * 1024;

/// [`ProstCodec`] with [`BUFFER_BYTES`] buffers; named in `proto/build.rs`.
#[derive(Debug, Clone)]
pub struct SmallCodec<T, U>(PhantomData<(T, U)>);

impl<T, U> Default for SmallCodec<T, U> {
    fn default() -> Self {
        SmallCodec(PhantomData)
    }
}

fn settings() -> BufferSettings {
    BufferSettings::new(BUFFER_BYTES, YIELD_BYTES)
}

impl<T, U> Codec for SmallCodec<T, U>
where
    T: prost::Message + Send + 'static,
    U: prost::Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = ProstDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        ProstCodec::<T, U>::raw_encoder(settings())
    }

    fn decoder(&mut self) -> Self::Decoder {
        ProstCodec::<T, U>::raw_decoder(settings())
    }
}
