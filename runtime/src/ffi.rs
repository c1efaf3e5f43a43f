//! The Rust side of the C++ shims, one convention for all of them: every entry point
//! returns 0, or 1 with its message in an [`ErrBuf`] (runtime/cpp/c_api.h's `guarded`).
//! Shims that need only libtorch's CPU library are linked statically and declared here
//! (present under a cfg that runtime/build.rs sets when they compiled); the CUDA graph shim
//! needs libtorch's CUDA library, so it is loaded with dlopen (cuda_graph.rs).

use std::ffi::c_char;

/// Bytes every shim may write its error message into.
pub(crate) const ERR_LEN: usize = 1024;

/// The error buffer every shim call fills on failure.
pub(crate) struct ErrBuf([c_char; ERR_LEN]);

impl ErrBuf {
    pub fn new() -> ErrBuf {
        ErrBuf([0; ERR_LEN])
    }

    pub fn ptr(&mut self) -> *mut c_char {
        self.0.as_mut_ptr()
    }

    /// The message's first line (libtorch may append a C++ backtrace).
    pub fn message(&self) -> String {
        crate::error::first_line(&text(&self.0)).trim().to_owned()
    }
}

/// The text a shim wrote into `buf`: up to its first NUL (or the whole buffer).
pub(crate) fn text(buf: &[c_char]) -> String {
    // Reinterpreting each C char's bits as a byte: no value is lost.
    let bytes: Vec<u8> = buf.iter().take_while(|&&c| c != 0).map(|&c| c as u8).collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// runtime/cpp/op_count.cpp and runtime/cpp/trace.cpp.
#[cfg(headcount_op_count)]
pub(crate) mod ops {
    use std::ffi::{c_char, c_int, c_longlong};
    unsafe extern "C" {
        pub fn headcount_ops_begin(names: c_int, err: *mut c_char, len: usize) -> c_int;
        pub fn headcount_ops_end(calls: *mut c_longlong, ops: *mut c_longlong, leaves: *mut c_longlong);
        pub fn headcount_ops_names() -> usize;
        pub fn headcount_ops_name(
            i: usize,
            buf: *mut c_char,
            len: usize,
            calls: *mut c_longlong,
            ops: *mut c_longlong,
            leaves: *mut c_longlong,
        ) -> c_int;
        pub fn headcount_trace_begin(cuda: c_int, err: *mut c_char, len: usize) -> c_int;
        pub fn headcount_trace_end(path: *const c_char, err: *mut c_char, len: usize) -> c_int;
    }
}

/// runtime/cpp/dist.cpp.
#[cfg(headcount_dist)]
pub(crate) mod dist {
    use std::ffi::{c_char, c_int, c_void};
    unsafe extern "C" {
        pub fn hc_quiet_logs();
        pub fn hc_store_new(
            host: *const c_char,
            port: c_int,
            is_server: c_int,
            world: c_int,
            timeout_ms: i64,
            out: *mut *mut c_void,
            err: *mut c_char,
            len: usize,
        ) -> c_int;
        pub fn hc_store_free(store: *mut c_void);
        pub fn hc_store_set(
            store: *mut c_void,
            key: *const c_char,
            data: *const u8,
            n: usize,
            err: *mut c_char,
            len: usize,
        ) -> c_int;
        pub fn hc_store_get(
            store: *mut c_void,
            key: *const c_char,
            timeout_ms: i64,
            out: *mut *mut u8,
            n: *mut usize,
            err: *mut c_char,
            len: usize,
        ) -> c_int;
        pub fn hc_buffer_free(buf: *mut u8);
        #[allow(clippy::too_many_arguments)]
        pub fn hc_group_new(
            store: *mut c_void,
            prefix: *const c_char,
            rank: c_int,
            size: c_int,
            timeout_ms: i64,
            interfaces: *const c_char,
            hostname: *const c_char,
            out: *mut *mut c_void,
            err: *mut c_char,
            len: usize,
        ) -> c_int;
        pub fn hc_group_free(group: *mut c_void);
        pub fn hc_all_reduce_sum(group: *mut c_void, t: *mut c_void, err: *mut c_char, len: usize) -> c_int;
        pub fn hc_all_gather(
            group: *mut c_void,
            out: *mut c_void,
            input: *mut c_void,
            err: *mut c_char,
            len: usize,
        ) -> c_int;
        pub fn hc_broadcast(group: *mut c_void, t: *mut c_void, root: c_int, err: *mut c_char, len: usize) -> c_int;
        pub fn hc_send(
            group: *mut c_void,
            t: *mut c_void,
            dst: c_int,
            tag: c_int,
            err: *mut c_char,
            len: usize,
        ) -> c_int;
        pub fn hc_recv(
            group: *mut c_void,
            t: *mut c_void,
            src: c_int,
            tag: c_int,
            err: *mut c_char,
            len: usize,
        ) -> c_int;
        pub fn hc_barrier(group: *mut c_void, err: *mut c_char, len: usize) -> c_int;
    }
}
