//! Compiles `gpuctl.proto` with a vendored protoc, so no system protoc is needed.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    // SAFETY: build scripts are single-threaded.
    unsafe { std::env::set_var("PROTOC", protoc) };
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        // prost's codec with smaller buffers (src/codec.rs).
        .codec_path("crate::codec::SmallCodec")
        // Rarely set and large: boxed, so every RankResult does not carry
        // its size inline (the coordinator's events hold results by value).
        .boxed(".gpuctl.v1.TrainResult.profile")
        // A RankResult is ~630 bytes in place: a report's ranks are built
        // without their results (131,072 of them while a big job is
        // judged, ~80 MB of empty room), which are moved in after.
        .boxed(".gpuctl.v1.RankReport.result")
        // A slice of the fleet answer's encoded rows, kept built: shared,
        // not copied, into each page.
        .bytes(".gpuctl.v1.GetFleetResponse.rows_packed")
        // A report encoded on a blocking thread, handed to the codec whole.
        .bytes(".gpuctl.v1.PackedReport.report")
        .compile_protos(&["gpuctl.proto"], &["."])?;
    println!("cargo:rerun-if-changed=gpuctl.proto");
    Ok(())
}
