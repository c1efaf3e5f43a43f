//! CUDA graphs: a decode step captured once and replayed, through the C++ shim
//! `runtime/cuda/graph.cpp` over libtorch's `at::cuda::CUDAGraph`.
//!
//! On a GPU a decode step is hundreds of small kernels, and issuing each through libtorch
//! costs CPU time: a small model's step can be bound by that rather than by the GPU. A
//! replayed graph launches the whole step at once.
//!
//! The shim is a shared library built by `runtime/build.rs` when libtorch is a CUDA build,
//! and loaded here on first use, after libtorch's CUDA library. It is looked for at
//! `$HEADCOUNT_CUDA_GRAPH_LIB`, then where the build put it relative to the running binary.

use std::ffi::{CString, c_char, c_int, c_void};
use std::path::PathBuf;
use std::sync::OnceLock;

use tch::Device;

use crate::error::{Error, Result};
use crate::ffi::{ERR_LEN, ErrBuf};

type NewFn = unsafe extern "C" fn(c_int, *mut c_char, usize) -> *mut c_void;
type OpFn = unsafe extern "C" fn(*mut c_void, *mut c_char, usize) -> c_int;
type FreeFn = unsafe extern "C" fn(*mut c_void);
type PeakFn = unsafe extern "C" fn(c_int, *mut std::ffi::c_longlong, *mut c_char, usize) -> c_int;
type ResetFn = unsafe extern "C" fn(c_int, *mut c_char, usize) -> c_int;

struct Shim {
    new: NewFn,
    enter_stream: OpFn,
    exit_stream: OpFn,
    capture_begin: OpFn,
    capture_end: OpFn,
    replay: OpFn,
    free: FreeFn,
    peak_allocated: PeakFn,
    reset_peak: ResetFn,
}

/// The places the shim library may be, in the order they are tried.
fn candidates() -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Some(p) = std::env::var_os("HEADCOUNT_CUDA_GRAPH_LIB") {
        out.push(PathBuf::from(p));
    }
    // Binaries live in target/<profile>/, or one folder below it (deps/, examples/).
    let rel = env!("HEADCOUNT_CUDA_GRAPH_REL");
    if let Some(dir) = std::env::current_exe().ok().and_then(|e| e.parent().map(PathBuf::from)) {
        out.push(dir.join(rel));
        if let Some(up) = dir.parent() {
            out.push(up.join(rel));
        }
    }
    out
}

fn shim() -> Result<&'static Shim> {
    static SHIM: OnceLock<std::result::Result<Shim, String>> = OnceLock::new();
    SHIM.get_or_init(load).as_ref().map_err(|e| Error::CudaGraph(e.clone()))
}

fn load() -> std::result::Result<Shim, String> {
    let why = env!("HEADCOUNT_CUDA_GRAPH_WHY");
    if !why.is_empty() && std::env::var_os("HEADCOUNT_CUDA_GRAPH_LIB").is_none() {
        return Err(format!("this build has no CUDA graph support ({why})"));
    }
    if !crate::device::load_cuda_library() {
        return Err("libtorch's CUDA library could not be loaded".to_owned());
    }
    let tried = candidates();
    let Some(path) = tried.iter().find(|p| p.is_file()) else {
        let list: Vec<String> = tried.iter().map(|p| p.display().to_string()).collect();
        return Err(format!(
            "the shim library was not found (looked at {}); set HEADCOUNT_CUDA_GRAPH_LIB to its path",
            list.join(", ")
        ));
    };
    let c = CString::new(path.as_os_str().as_encoded_bytes()).map_err(|_| "a path with a NUL byte".to_owned())?;
    // SAFETY: dlopen with a valid C string; failure is a null handle, handled below.
    let handle = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    if handle.is_null() {
        // SAFETY: dlerror returns null or a C string valid until the next dl* call.
        let reason = unsafe {
            let e = libc::dlerror();
            if e.is_null() { String::new() } else { std::ffi::CStr::from_ptr(e).to_string_lossy().into_owned() }
        };
        return Err(format!("{} could not be loaded: {reason}", path.display()));
    }
    let sym = |name: &str| -> std::result::Result<*mut c_void, String> {
        let n = CString::new(name).map_err(|_| name.to_owned())?;
        // SAFETY: a valid handle and C string; a null result is handled.
        let p = unsafe { libc::dlsym(handle, n.as_ptr()) };
        if p.is_null() { Err(format!("{} has no symbol {name}", path.display())) } else { Ok(p) }
    };
    // SAFETY: the symbols are the shim's extern "C" functions, with these exact signatures
    // (runtime/cuda/graph.cpp).
    unsafe {
        Ok(Shim {
            new: std::mem::transmute::<*mut c_void, NewFn>(sym("hc_graph_new")?),
            enter_stream: std::mem::transmute::<*mut c_void, OpFn>(sym("hc_graph_enter_stream")?),
            exit_stream: std::mem::transmute::<*mut c_void, OpFn>(sym("hc_graph_exit_stream")?),
            capture_begin: std::mem::transmute::<*mut c_void, OpFn>(sym("hc_graph_capture_begin")?),
            capture_end: std::mem::transmute::<*mut c_void, OpFn>(sym("hc_graph_capture_end")?),
            replay: std::mem::transmute::<*mut c_void, OpFn>(sym("hc_graph_replay")?),
            free: std::mem::transmute::<*mut c_void, FreeFn>(sym("hc_graph_free")?),
            peak_allocated: std::mem::transmute::<*mut c_void, PeakFn>(sym("hc_cuda_peak_allocated")?),
            reset_peak: std::mem::transmute::<*mut c_void, ResetFn>(sym("hc_cuda_reset_peak")?),
        })
    }
}

/// The first capture that failed in this process. libtorch's state after a failed capture
/// is repaired as far as its API allows (runtime/cuda/graph.cpp), but no later generation
/// should stake its output on that: graphs stay off for the rest of the process.
static FAILED: OnceLock<String> = OnceLock::new();

/// Turns graphs off for the rest of the process, for `reason`.
pub(crate) fn disable(reason: String) {
    let _ = FAILED.set(reason);
}

/// Whether CUDA graphs can be used in this process, or why not.
pub fn available() -> Result<()> {
    if let Some(why) = FAILED.get() {
        return Err(Error::CudaGraph(format!("off for this process after a failed capture ({why})")));
    }
    shim().map(|_| ())
}

/// The peak of bytes allocated by libtorch on a CUDA device since the last
/// [`reset_peak_memory`] (torch.cuda.max_memory_allocated), through the shim.
pub(crate) fn peak_memory(device: Device) -> Result<u64> {
    let index = cuda_index(device)?;
    let shim = shim()?;
    let mut bytes: std::ffi::c_longlong = 0;
    let mut err = ErrBuf::new();
    // SAFETY: a valid out pointer and a buffer of ERR_LEN bytes.
    let rc = unsafe { (shim.peak_allocated)(index, &mut bytes, err.ptr(), ERR_LEN) };
    if rc != 0 {
        return Err(Error::CudaGraph(err.message()));
    }
    Ok(u64::try_from(bytes).unwrap_or(0))
}

/// Starts a new peak for [`peak_memory`].
pub(crate) fn reset_peak_memory(device: Device) -> Result<()> {
    let index = cuda_index(device)?;
    let shim = shim()?;
    let mut err = ErrBuf::new();
    // SAFETY: a buffer of ERR_LEN bytes.
    let rc = unsafe { (shim.reset_peak)(index, err.ptr(), ERR_LEN) };
    if rc == 0 { Ok(()) } else { Err(Error::CudaGraph(err.message())) }
}

fn cuda_index(device: Device) -> Result<c_int> {
    let Device::Cuda(index) = device else {
        return Err(Error::InvalidArgument(format!("CUDA graphs need a CUDA device, not {device:?}")));
    };
    c_int::try_from(index).map_err(|_| Error::Device(format!("no CUDA device {index}")))
}

/// Calls one shim operation and turns its status into a `Result`.
fn call(op: OpFn, handle: *mut c_void, what: &str) -> Result<()> {
    let mut err = ErrBuf::new();
    // SAFETY: `handle` came from hc_graph_new and is live (owned by a `CudaGraph`); the
    // buffer holds ERR_LEN bytes.
    let rc = unsafe { op(handle, err.ptr(), ERR_LEN) };
    if rc == 0 { Ok(()) } else { Err(Error::CudaGraph(format!("{what}: {}", err.message()))) }
}

/// One captured CUDA graph. Work issued on this thread between [`CudaGraph::capture`]'s
/// start and end is recorded, not run; [`CudaGraph::replay`] runs it again, reading and
/// writing the same device memory each time.
pub struct CudaGraph {
    shim: &'static Shim,
    handle: *mut c_void,
    on_side_stream: bool,
    capturing: bool,
}

// SAFETY: the handle owns a heap object of the shim with no tie to the thread that made it;
// CUDA graphs may be replayed from any thread. A capture's work is issued from the thread
// that calls `capture`, within that call.
unsafe impl Send for CudaGraph {}

impl CudaGraph {
    /// A graph for a CUDA device.
    pub fn new(device: Device) -> Result<CudaGraph> {
        let index = cuda_index(device)?;
        let shim = shim()?;
        let mut err = ErrBuf::new();
        // SAFETY: the buffer holds ERR_LEN bytes; a null result carries its reason in it.
        let handle = unsafe { (shim.new)(index, err.ptr(), ERR_LEN) };
        if handle.is_null() {
            return Err(Error::CudaGraph(err.message()));
        }
        Ok(CudaGraph { shim, handle, on_side_stream: false, capturing: false })
    }

    /// Runs `f` on a side stream (warm-up before a capture: libtorch allocates its
    /// per-stream workspaces there on first use).
    pub fn on_side_stream<T>(&mut self, f: impl FnOnce() -> Result<T>) -> Result<T> {
        call(self.shim.enter_stream, self.handle, "entering the side stream")?;
        self.on_side_stream = true;
        let out = f();
        let exit = call(self.shim.exit_stream, self.handle, "leaving the side stream");
        self.on_side_stream = false;
        let out = out?;
        exit.map(|()| out)
    }

    /// Records what `f` issues. Its tensors are allocated from the graph's own memory pool
    /// and keep their addresses: outputs `f` returns hold what each replay writes.
    pub fn capture<T>(&mut self, f: impl FnOnce() -> Result<T>) -> Result<T> {
        call(self.shim.enter_stream, self.handle, "entering the side stream")?;
        self.on_side_stream = true;
        let out = match call(self.shim.capture_begin, self.handle, "starting the capture") {
            Ok(()) => {
                self.capturing = true;
                let out = f();
                // The capture must end even when `f` failed, or the stream stays capturing.
                let end = call(self.shim.capture_end, self.handle, "ending the capture");
                self.capturing = false;
                out.and_then(|o| end.map(|()| o))
            }
            Err(e) => Err(e),
        };
        let exit = call(self.shim.exit_stream, self.handle, "leaving the side stream");
        self.on_side_stream = false;
        if let Err(e) = &out {
            let _ = FAILED.set(e.to_string());
        }
        let out = out?;
        exit.map(|()| out)
    }

    /// Runs the captured work again, on the current stream.
    pub fn replay(&self) -> Result<()> {
        call(self.shim.replay, self.handle, "replaying")
    }
}

impl Drop for CudaGraph {
    fn drop(&mut self) {
        // Only after a panic inside `capture`'s closure: end the capture before leaving the
        // stream, or the stream would stay capturing.
        if self.capturing {
            let _ = call(self.shim.capture_end, self.handle, "ending the capture");
            let _ = FAILED.set("a panic during the capture".to_owned());
        }
        if self.on_side_stream {
            let _ = call(self.shim.exit_stream, self.handle, "leaving the side stream");
        }
        // SAFETY: the handle came from hc_graph_new and is freed once, here.
        unsafe { (self.shim.free)(self.handle) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_is_refused_by_name() {
        let e = CudaGraph::new(Device::Cpu).err().expect("a CPU graph must be refused");
        assert!(e.to_string().contains("need a CUDA device"), "{e}");
    }

    /// Where the build made the shim (libtorch is PyPI's CUDA build and scripts/setup
    /// installs the CUDA headers), it loads, and on a machine without a GPU every use is a
    /// clear error rather than a crash. Where it was not built, the reason is given.
    #[test]
    fn the_shim_loads_or_says_why() {
        #[cfg(headcount_cuda_graph)]
        {
            available().expect("the shim was built, so it must load");
            if !tch::Cuda::is_available() {
                let e = CudaGraph::new(Device::Cuda(0)).err().expect("no GPU: no graph");
                assert!(matches!(e, Error::CudaGraph(_)), "{e}");
                assert!(!e.to_string().contains("frame #"), "backtrace leaked: {e}");
            }
        }
        #[cfg(not(headcount_cuda_graph))]
        {
            let e = available().err().expect("no shim was built");
            assert!(e.to_string().contains("no CUDA graph support"), "{e}");
            assert!(
                std::env::var_os("HEADCOUNT_REQUIRE_CUDA_GRAPH").is_none(),
                "HEADCOUNT_REQUIRE_CUDA_GRAPH is set but the shim was not built: {e}"
            );
        }
    }
}
