//! Adds a run-time search path (RUNPATH, so `LD_LIBRARY_PATH` still wins on GPU
//! hosts) for the libtorch this crate was built against, so that `cargo test`
//! and a locally built `gpuctl-worker` start without `LD_LIBRARY_PATH`.
//!
//! `.cargo/config.toml` sets `GPUCTL_BUILD_LIBTORCH_SP` to the site-packages
//! folder that `scripts/install-libtorch.sh` fills: `torch/lib` holds
//! `libtorch_cpu.so`, `libc10.so`, `libgomp.so.1`; `nvidia/cu13/lib` holds the
//! CUDA runtime and CUPTI that `libtorch_cpu.so` loads at start.

use std::path::PathBuf;

fn main() {
    compile_autograd_shim();
    println!("cargo:rerun-if-env-changed=GPUCTL_BUILD_LIBTORCH_SP");
    println!("cargo:rerun-if-env-changed=LIBTORCH");
    println!("cargo:rerun-if-changed=build.rs");
    let Some(sp) = std::env::var_os("GPUCTL_BUILD_LIBTORCH_SP") else {
        return;
    };
    let sp = PathBuf::from(sp);
    // `.libtorch` is usually a link into a cache: record the real folders.
    let sp = std::fs::canonicalize(&sp).unwrap_or(sp);
    link_libtorch_stub(&sp);
    for sub in ["torch/lib", "nvidia/cu13/lib"] {
        let dir = sp.join(sub);
        if dir.is_dir() {
            // --enable-new-dtags: DT_RUNPATH, which LD_LIBRARY_PATH overrides.
            println!(
                "cargo:rustc-link-arg=-Wl,--enable-new-dtags,-rpath,{}",
                dir.display()
            );
        } else {
            println!(
                "cargo:warning=gpuctl-worker: {} is missing; run scripts/install-libtorch.sh or set LD_LIBRARY_PATH at run time",
                dir.display()
            );
        }
    }
}

/// torch-sys always passes `-ltorch`, but the CPU-only LIBTORCH folder of
/// DESIGN.md holds only libtorch_cpu, libc10 and libgomp. `libtorch.so` (whose
/// only job is to pull in libtorch_cuda) is in the wheel's `torch/lib`: offer it
/// to the linker from a folder of our own. `--as-needed` keeps it out of the
/// binary's NEEDED list, since no symbol of it is used, so nothing changes at
/// run time.
fn link_libtorch_stub(sp: &std::path::Path) {
    let libdir = std::env::var_os("LIBTORCH").map(|l| PathBuf::from(l).join("lib"));
    if libdir.is_some_and(|d| d.join("libtorch.so").exists()) {
        return;
    }
    let real = sp.join("torch/lib/libtorch.so");
    if !real.exists() {
        println!(
            "cargo:warning=gpuctl-worker: no libtorch.so in LIBTORCH/lib nor {}; linking may fail",
            real.display()
        );
        return;
    }
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("OUT_DIR")).join("torch-link");
    let _ = std::fs::create_dir_all(&out);
    let link = out.join("libtorch.so");
    let _ = std::fs::remove_file(&link);
    if let Err(e) = std::os::unix::fs::symlink(&real, &link) {
        println!(
            "cargo:warning=gpuctl-worker: cannot link {}: {e}",
            link.display()
        );
        return;
    }
    println!("cargo:rustc-link-search=native={}", out.display());
}

/// `csrc/`: backward with a given gradient, the CUDA allocator's figures,
/// the Kineto profiler and the cap on CPU tensors' host memory, against the same libtorch headers that torch-sys compiles its
/// own C++ against.
fn compile_autograd_shim() {
    println!("cargo:rerun-if-changed=csrc/autograd.cpp");
    println!("cargo:rerun-if-changed=csrc/allocator.cpp");
    println!("cargo:rerun-if-changed=csrc/profiler.cpp");
    println!("cargo:rerun-if-changed=csrc/host_cap.cpp");
    println!("cargo:rerun-if-changed=csrc/pinned.cpp");
    println!("cargo:rerun-if-changed=csrc/fused_sgd.cpp");
    let Some(lt) = std::env::var_os("LIBTORCH").map(PathBuf::from) else {
        panic!("gpuctl-worker: LIBTORCH is not set (scripts/install-libtorch.sh sets it up)");
    };
    let inc = lt.join("include");
    let abi = std::env::var("LIBTORCH_CXX11_ABI").unwrap_or_else(|_| "1".into());
    cc::Build::new()
        .cpp(true)
        .file("csrc/autograd.cpp")
        .file("csrc/allocator.cpp")
        .file("csrc/profiler.cpp")
        .file("csrc/host_cap.cpp")
        .file("csrc/pinned.cpp")
        .file("csrc/fused_sgd.cpp")
        .include(&inc)
        .include(inc.join("torch/csrc/api/include"))
        .flag("-std=c++17")
        .flag_if_supported("-Wno-unused-parameter")
        .define("_GLIBCXX_USE_CXX11_ABI", abi.as_str())
        .warnings(false)
        .compile("gpuctl_autograd");
}
