//! Profiler traces through libtorch's profiler (Kineto), via runtime/cpp/trace.cpp: CPU
//! operators, and GPU kernels on a GPU, saved as Chrome trace JSON.

use crate::error::{Error, Result};
#[cfg(headcount_op_count)]
use crate::ffi::{ERR_LEN, ErrBuf, ops as ffi};
use crate::op_count::available;

/// Runs `f` under libtorch's profiler and saves the trace (Chrome trace JSON) to `path`:
/// operators on the calling thread and, with `cuda`, kernels and copies on the GPU. The
/// products that split CPU weights hand to worker threads ([`crate::parallel`]) are not in
/// it. The trace is saved even when `f` returns an error; a panic in `f` discards it.
pub fn trace<R>(path: &std::path::Path, cuda: bool, f: impl FnOnce() -> R) -> Result<R> {
    available()?;
    #[cfg(headcount_op_count)]
    {
        use std::ffi::{CString, c_char};
        let failed =
            |what: &str, err: &ErrBuf| Error::InvalidArgument(format!("the profiler trace {what}: {}", err.message()));
        let c_path = CString::new(path.as_os_str().as_encoded_bytes())
            .map_err(|_| Error::InvalidArgument(format!("the trace path {} holds a NUL byte", path.display())))?;
        let mut err = ErrBuf::new();
        // SAFETY: `err` is a writable buffer of the length passed.
        if unsafe { ffi::headcount_trace_begin(i32::from(cuda), err.ptr(), ERR_LEN) } != 0 {
            return Err(failed("could not start", &err));
        }
        /// Discards the trace if `f` panics, so no profiler is left running.
        struct Tracing(bool);
        impl Drop for Tracing {
            fn drop(&mut self) {
                if self.0 {
                    let mut err = [0 as c_char; 8];
                    // SAFETY: an empty path (discard) and a writable buffer of the length passed.
                    unsafe { ffi::headcount_trace_end(c"".as_ptr(), err.as_mut_ptr(), err.len()) };
                }
            }
        }
        let mut tracing = Tracing(true);
        let r = f();
        tracing.0 = false;
        // SAFETY: a NUL-terminated path and a writable buffer of the length passed.
        if unsafe { ffi::headcount_trace_end(c_path.as_ptr(), err.ptr(), ERR_LEN) } != 0 {
            return Err(failed(&format!("could not be saved to {}", path.display()), &err));
        }
        // Kineto reports a file it cannot write only in its log.
        match std::fs::metadata(path) {
            Ok(m) if m.len() > 0 => Ok(r),
            _ => Err(Error::InvalidArgument(format!("the profiler trace was not written to {}", path.display()))),
        }
    }
    #[cfg(not(headcount_op_count))]
    {
        let _ = (path, cuda, f);
        unreachable!("available() is an error in this build")
    }
}

/// Starts and stops an empty profiler session, which sets the profiler up (on a GPU,
/// CUPTI). Run once before CUDA graphs are captured in a process that will trace them.
pub fn init_profiler(cuda: bool) -> Result<()> {
    available()?;
    #[cfg(headcount_op_count)]
    {
        let mut err = ErrBuf::new();
        // SAFETY: writable buffers of the lengths passed; an empty path discards the trace.
        let failed = unsafe {
            ffi::headcount_trace_begin(i32::from(cuda), err.ptr(), ERR_LEN) != 0
                || ffi::headcount_trace_end(c"".as_ptr(), err.ptr(), ERR_LEN) != 0
        };
        if failed {
            return Err(Error::InvalidArgument(format!("the profiler could not be set up: {}", err.message())));
        }
        Ok(())
    }
    #[cfg(not(headcount_op_count))]
    {
        let _ = cuda;
        unreachable!("available() is an error in this build")
    }
}
