//! libtorch's intra-op threads on one calling thread.
//!
//! The binary sets libtorch's thread count once for the process (`--threads`). While a
//! model's few-row products run on its own workers ([`super::CpuPool`]), the generating
//! thread narrows the threads *its own* libtorch calls fan out to, so that libtorch's
//! spinning OpenMP threads do not take the cores the workers need. That count is the
//! thread's: libtorch's OpenMP build reads the calling thread's OpenMP thread count, and MKL
//! its thread-local one, so another thread's generation, and every thread started meanwhile,
//! keep the process's count. `at::set_num_threads` is not used for this: it also replaces
//! the process-wide default that threads started later begin with.

use std::ffi::{CStr, c_int};
use std::sync::OnceLock;

type SetFn = unsafe extern "C" fn(c_int);
type GetFn = unsafe extern "C" fn() -> c_int;
type SetLocalFn = unsafe extern "C" fn(c_int) -> c_int;

/// The OpenMP and MKL entry points libtorch's CPU library brought into the process, where
/// it was built with them.
struct Runtime {
    omp_set: Option<SetFn>,
    omp_get: Option<GetFn>,
    mkl_set_local: Option<SetLocalFn>,
}

fn runtime() -> &'static Runtime {
    static RUNTIME: OnceLock<Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        let find = |name: &CStr| {
            // SAFETY: a lookup of a NUL-terminated name in the libraries already loaded.
            let p = unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) };
            (!p.is_null()).then_some(p)
        };
        // SAFETY: each symbol, where present, is the C function of that name and signature
        // (OpenMP 1.0's omp_set_num_threads and omp_get_max_threads, MKL's C
        // `int MKL_Set_Num_Threads_Local(int)`, which mkl_service.h names
        // mkl_set_num_threads_local).
        unsafe {
            Runtime {
                omp_set: find(c"omp_set_num_threads").map(|p| std::mem::transmute::<*mut libc::c_void, SetFn>(p)),
                omp_get: find(c"omp_get_max_threads").map(|p| std::mem::transmute::<*mut libc::c_void, GetFn>(p)),
                // The C entry point; the lower-case name is the Fortran one (a pointer).
                mkl_set_local: find(c"MKL_Set_Num_Threads_Local")
                    .map(|p| std::mem::transmute::<*mut libc::c_void, SetLocalFn>(p)),
            }
        }
    })
}

/// The calling thread's libtorch calls at `n` threads until dropped, then as before. Does
/// nothing where libtorch has no OpenMP; not `Send`, as the count belongs to this thread.
pub struct ThreadTorchThreads {
    omp: Option<c_int>,
    mkl: Option<c_int>,
    _not_send: std::marker::PhantomData<*const ()>,
}

impl ThreadTorchThreads {
    pub fn set(n: i32) -> ThreadTorchThreads {
        // libtorch gives a thread the process's count on its first parallel call; make that
        // happen now, or it would undo this one later.
        let _ = tch::get_num_threads();
        let rt = runtime();
        let n = n.max(1);
        // SAFETY: the functions as found above; each reads or writes the calling thread's
        // own setting.
        let omp = match (rt.omp_get, rt.omp_set) {
            (Some(get), Some(set)) => unsafe {
                let before = get();
                set(n);
                Some(before)
            },
            _ => None,
        };
        // SAFETY: as above; it returns the thread's previous local count (0: none).
        let mkl = rt.mkl_set_local.map(|set| unsafe { set(n) });
        ThreadTorchThreads { omp, mkl, _not_send: std::marker::PhantomData }
    }
}

impl Drop for ThreadTorchThreads {
    fn drop(&mut self) {
        let rt = runtime();
        // SAFETY: as in `set`, on the thread that made this guard (it is not `Send`).
        unsafe {
            if let (Some(before), Some(set)) = (self.omp, rt.omp_set) {
                set(before);
            }
            if let (Some(before), Some(set)) = (self.mkl, rt.mkl_set_local) {
                set(before);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The narrowing holds on its own thread and nowhere else: a thread started meanwhile
    /// gets the process's count, and the count comes back when the guard goes.
    #[test]
    fn narrowing_stays_on_its_thread() {
        tch::set_num_threads(2);
        let before = tch::get_num_threads();
        {
            let _one = ThreadTorchThreads::set(1);
            if runtime().omp_set.is_some() {
                assert_eq!(tch::get_num_threads(), 1);
            }
            let other = std::thread::spawn(tch::get_num_threads).join().unwrap();
            assert_eq!(other, before, "a thread started during the narrowing");
        }
        assert_eq!(tch::get_num_threads(), before);
    }
}
