//! Builds the C++ parts of the runtime against libtorch's headers:
//! - the operator counter and the profiler trace (`cpp/op_count.cpp`, `cpp/trace.cpp`), a
//!   static library linked into the runtime whenever libtorch's headers are found (cfg
//!   `headcount_op_count`);
//! - the process-group shim (`cpp/dist.cpp`, c10d's TCPStore and ProcessGroupGloo), a static
//!   library linked whenever libtorch's and Gloo's headers are found (cfg `headcount_dist`).
//!   The wheel ships c10d's headers but not Gloo's, which its ProcessGroupGloo.hpp includes:
//!   they are looked for at `$HEADCOUNT_GLOO_INCLUDE`, then in /usr/include (Debian's
//!   `libgloo-dev`, which scripts/setup installs);
//! - the CUDA graph shim (`cuda/graph.cpp`), a shared library beside the build outputs, when
//!   libtorch is a CUDA build and the CUDA runtime headers are found.
//!
//! The shim is optional: without it the runtime runs everywhere and a CUDA graph, when asked
//! for, is refused with the reason recorded here. The library is loaded with dlopen at run
//! time (see `src/cuda_graph.rs`), so binaries never depend on libtorch_cuda at load time.
//!
//! Where the headers are looked for, first found wins: `HEADCOUNT_CUDA_INCLUDE`,
//! `$CUDA_HOME/include`, then the `nvidia/cu13/include` folder of the Python environment that
//! holds libtorch (PyPI's `nvidia-cuda-runtime` and `nvidia-cuda-crt`, which scripts/setup
//! installs).

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

const LIB: &str = "libheadcount_cuda_graph.so";

fn main() {
    println!("cargo:rerun-if-changed=cuda/graph.cpp");
    println!("cargo:rerun-if-changed=cpp/op_count.cpp");
    println!("cargo:rerun-if-changed=cpp/trace.cpp");
    println!("cargo:rerun-if-changed=cpp/c_api.h");
    println!("cargo:rerun-if-changed=cpp/dist.cpp");
    for var in ["LIBTORCH", "HEADCOUNT_GLOO_INCLUDE", "HEADCOUNT_CUDA_INCLUDE", "CUDA_HOME", "CXX", "AR"] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    println!("cargo::rustc-check-cfg=cfg(headcount_cuda_graph)");
    println!("cargo::rustc-check-cfg=cfg(headcount_op_count)");
    println!("cargo::rustc-check-cfg=cfg(headcount_dist)");
    let out = PathBuf::from(env::var_os("OUT_DIR").unwrap_or_default());
    link_static(&out, build_dist(&out), "headcount_dist", "headcount_dist", "HEADCOUNT_DIST_WHY");
    link_static(&out, build_op_counter(&out), "headcount_ops", "headcount_op_count", "HEADCOUNT_OP_COUNT_WHY");
    // The library's path relative to the profile folder (target/<profile>), the last three
    // components of OUT_DIR: `build/<package>-<hash>/out`. Binaries look for it relative to
    // themselves, so a copied target folder keeps working.
    let rel: PathBuf = out.components().rev().take(3).collect::<Vec<_>>().into_iter().rev().collect();
    println!("cargo:rustc-env=HEADCOUNT_CUDA_GRAPH_REL={}", rel.join(LIB).display());
    match build(&out) {
        Ok(()) => {
            println!("cargo:rustc-cfg=headcount_cuda_graph");
            println!("cargo:rustc-env=HEADCOUNT_CUDA_GRAPH_WHY=");
        }
        Err(why) => {
            let _ = std::fs::remove_file(out.join(LIB));
            println!("cargo:rustc-env=HEADCOUNT_CUDA_GRAPH_WHY={why}");
        }
    }
}

/// Links the static library `lib` in `out` and sets `cfg` when `built`; either way sets the
/// environment variable `why` to the reason it was not built (empty when it was).
fn link_static(out: &Path, built: Result<(), String>, lib: &str, cfg: &str, why: &str) {
    match built {
        Ok(()) => {
            println!("cargo:rustc-link-search=native={}", out.display());
            println!("cargo:rustc-link-lib=static={lib}");
            println!("cargo:rustc-cfg={cfg}");
            println!("cargo:rustc-env={why}=");
        }
        Err(reason) => println!("cargo:rustc-env={why}={reason}"),
    }
}

/// libtorch's folder (`$LIBTORCH`, resolved).
fn libtorch() -> Result<PathBuf, String> {
    let libtorch = env::var_os("LIBTORCH").map(PathBuf::from).ok_or("LIBTORCH is not set")?;
    libtorch.canonicalize().map_err(|e| format!("libtorch at {} is missing: {e}", libtorch.display()))
}

/// Compiles `cpp/op_count.cpp` and `cpp/trace.cpp` into `libheadcount_ops.a` in `out`. They
/// use only libtorch's CPU library, which every build links.
fn build_op_counter(out: &Path) -> Result<(), String> {
    let include = libtorch()?.join("include");
    if !include.join("ATen/record_function.h").is_file() {
        return Err(format!("{} has no ATen/record_function.h", include.display()));
    }
    let mut objects = Vec::new();
    for source in ["cpp/op_count.cpp", "cpp/trace.cpp"] {
        let object = out.join(Path::new(source).with_extension("o").file_name().unwrap_or_default());
        let mut args: Vec<std::ffi::OsString> = vec!["-c".into(), "-I".into(), include.clone().into(), source.into()];
        args.extend(["-o".into(), object.clone().into()]);
        compile(source, &args)?;
        objects.push(object);
    }
    archive(&out.join("libheadcount_ops.a"), &objects)
}

/// Compiles `cpp/dist.cpp` into `libheadcount_dist.a` in `out`, against c10d's headers
/// (libtorch's) and Gloo's.
fn build_dist(out: &Path) -> Result<(), String> {
    let include = libtorch()?.join("include");
    if !include.join("torch/csrc/distributed/c10d/ProcessGroupGloo.hpp").is_file() {
        return Err(format!("{} has no c10d headers", include.display()));
    }
    let gloo = [env::var_os("HEADCOUNT_GLOO_INCLUDE").map(PathBuf::from), Some(PathBuf::from("/usr/include"))]
        .into_iter()
        .flatten()
        .find(|dir| dir.join("gloo/config.h").is_file())
        .ok_or("Gloo's headers (gloo/config.h) were not found: install Debian's libgloo-dev (scripts/setup does), or set HEADCOUNT_GLOO_INCLUDE")?;
    let object = out.join("dist.o");
    let mut args: Vec<std::ffi::OsString> = vec!["-c".into(), "-DUSE_DISTRIBUTED".into(), "-DUSE_C10D_GLOO".into()];
    let api = include.join("torch/csrc/api/include");
    args.extend(["-I".into(), include.into(), "-I".into(), api.into(), "-I".into(), gloo.into()]);
    args.push("cpp/dist.cpp".into());
    args.extend(["-o".into(), object.clone().into()]);
    compile("the process-group shim", &args)?;
    archive(&out.join("libheadcount_dist.a"), &[object])
}

/// Packs `objects` into the static library `archive`.
fn archive(archive: &Path, objects: &[PathBuf]) -> Result<(), String> {
    let ar = env::var("AR").unwrap_or_else(|_| "ar".to_owned());
    let _ = std::fs::remove_file(archive);
    let status = Command::new(&ar)
        .arg("crs")
        .arg(archive)
        .args(objects)
        .status()
        .map_err(|e| format!("could not run the archiver {ar:?}: {e}"))?;
    if !status.success() {
        return Err(format!("the archiver {ar:?} failed ({status})"));
    }
    Ok(())
}

fn build(out: &Path) -> Result<(), String> {
    let libtorch = libtorch()?;
    let include = libtorch.join("include");
    let lib = libtorch.join("lib");
    if !include.join("ATen/cuda/CUDAGraph.h").is_file() || !lib.join("libtorch_cuda.so").is_file() {
        return Err("libtorch is a CPU-only build".to_owned());
    }
    let cuda = cuda_include(&libtorch).ok_or(
        "the CUDA runtime headers (cuda_runtime_api.h and crt/host_config.h) were not found: \
         install PyPI's nvidia-cuda-crt beside torch, or set HEADCOUNT_CUDA_INCLUDE",
    )?;
    let mut args: Vec<std::ffi::OsString> = vec!["-shared".into(), "-I".into(), include.into(), "-I".into()];
    args.extend([cuda.into(), "cuda/graph.cpp".into(), "-L".into(), lib.into()]);
    args.extend(["-Wl,--no-as-needed", "-ltorch_cuda", "-lc10_cuda", "-ltorch_cpu", "-lc10", "-o"].map(Into::into));
    args.push(out.join(LIB).into());
    compile("the CUDA graph shim", &args)
}

/// Runs the C++ compiler (`$CXX`, else `c++`) with libtorch's flags and `args`; on failure,
/// the first error line, also shown as a cargo warning.
fn compile(what: &str, args: &[std::ffi::OsString]) -> Result<(), String> {
    let cxx = env::var("CXX").unwrap_or_else(|_| "c++".to_owned());
    let abi = env::var("LIBTORCH_CXX11_ABI").unwrap_or_else(|_| "1".to_owned());
    let output = Command::new(&cxx)
        .args(["-std=c++17", "-O2", "-fPIC", "-w", "-DGLOG_USE_GLOG_EXPORT"])
        .arg(format!("-D_GLIBCXX_USE_CXX11_ABI={abi}"))
        .args(args)
        .output()
        .map_err(|e| format!("could not run the C++ compiler {cxx:?}: {e}"))?;
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        let first = stderr.lines().find(|l| l.contains("error")).unwrap_or("").trim().to_owned();
        println!("cargo:warning={what} did not compile: {first}");
        return Err(format!("{what} did not compile: {first}"));
    }
    Ok(())
}

fn cuda_include(libtorch: &Path) -> Option<PathBuf> {
    let mut candidates = Vec::new();
    if let Some(p) = env::var_os("HEADCOUNT_CUDA_INCLUDE") {
        candidates.push(PathBuf::from(p));
    }
    if let Some(p) = env::var_os("CUDA_HOME") {
        candidates.push(PathBuf::from(p).join("include"));
    }
    if let Some(site) = libtorch.parent() {
        let wheel_headers = site.join("nvidia/cu13/include");
        // Build again when headers are installed there later (scripts/setup adds crt/).
        if wheel_headers.is_dir() {
            println!("cargo:rerun-if-changed={}", wheel_headers.display());
        }
        candidates.push(wheel_headers);
    }
    candidates.into_iter().find(|c| c.join("cuda_runtime_api.h").is_file() && c.join("crt/host_config.h").is_file())
}
