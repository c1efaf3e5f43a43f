//! Process groups over c10d, torch.distributed's C++ core: a TCPStore for the rendezvous and
//! Gloo for collectives, through the shim `runtime/cpp/dist.cpp`.
//!
//! A group of one rank is the same type with no communication, so the model has one code
//! path for every size. Gloo moves CPU tensors; tensors on a GPU are staged through host
//! memory. Every wait is bounded by the group's timeout, and every failure is an
//! [`Error::Parallel`] naming the operation and the rank.

use std::ffi::{CString, c_char, c_void};
use std::time::Duration;

use tch::{Device, Tensor};

use crate::error::{Error, Result};
use crate::ffi::{ERR_LEN, ErrBuf};

/// Why this build has no process groups (empty when it has them).
const WHY_NOT: &str = env!("HEADCOUNT_DIST_WHY");

/// Whether this build can run parallel ranks, or why not.
pub fn available() -> Result<()> {
    if cfg!(headcount_dist) {
        Ok(())
    } else {
        Err(Error::Parallel(format!("this build has no process groups, so it runs one rank only ({WHY_NOT})")))
    }
}

#[cfg(headcount_dist)]
use crate::ffi::dist as ffi;

fn c_string(what: &str, s: &str) -> Result<CString> {
    CString::new(s).map_err(|_| Error::Parallel(format!("{what} {s:?} contains a NUL byte")))
}

/// Milliseconds for c10d, at most a day: c10d adds a timeout to the current time, which a
/// larger value would overflow.
fn millis(d: Duration) -> i64 {
    i64::try_from(d.min(Duration::from_secs(86_400)).as_millis()).unwrap_or(86_400_000)
}

/// The key-value store the ranks meet at (c10d's TCPStore): the server on one rank, or on
/// torchrun's agent, and a client everywhere else.
pub struct Store {
    ptr: *mut c_void,
    /// `host:port`, for messages.
    address: String,
}

// SAFETY: c10d's TCPStore serializes its own socket use; the handle is only freed on drop.
unsafe impl Send for Store {}
unsafe impl Sync for Store {}

impl Store {
    /// Serves (`server`) or joins the store at `host:port` for `world` ranks; a client keeps
    /// trying to connect for `timeout`.
    pub fn connect(host: &str, port: u16, server: bool, world: usize, timeout: Duration) -> Result<Store> {
        available()?;
        let address = format!("{host}:{port}");
        let _ = (world, server, timeout);
        #[cfg(headcount_dist)]
        {
            // SAFETY: sets an int flag of c10's logging.
            unsafe { ffi::hc_quiet_logs() };
            let c_host = c_string("MASTER_ADDR", host)?;
            let mut err = ErrBuf::new();
            let mut ptr = std::ptr::null_mut();
            let world = i32::try_from(world).map_err(|_| Error::Parallel(format!("a world of {world} ranks")))?;
            // SAFETY: valid C strings and out-pointers; the shim catches every C++ exception.
            let rc = unsafe {
                ffi::hc_store_new(
                    c_host.as_ptr(),
                    i32::from(port),
                    i32::from(server),
                    world,
                    millis(timeout),
                    &mut ptr,
                    err.ptr(),
                    ERR_LEN,
                )
            };
            if rc != 0 {
                let why = err.message();
                let hint = if server {
                    format!(
                        "could not serve the rendezvous store at {address} (MASTER_ADDR:MASTER_PORT): {why}; is the port busy? pick a free MASTER_PORT"
                    )
                } else {
                    format!(
                        "could not reach the rendezvous store at {address} (MASTER_ADDR:MASTER_PORT) within {} s: {why}",
                        timeout.as_secs()
                    )
                };
                return Err(Error::Parallel(hint));
            }
            return Ok(Store { ptr, address });
        }
        #[allow(unreachable_code)]
        Err(Error::Parallel(format!("no store at {address}: this build has no process groups")))
    }

    /// Sets `key` to `value`.
    pub fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        let _ = (key, value);
        #[cfg(headcount_dist)]
        {
            let k = c_string("store key", key)?;
            let mut err = ErrBuf::new();
            // SAFETY: a live store, a valid key and a byte slice of the given length.
            let rc =
                unsafe { ffi::hc_store_set(self.ptr, k.as_ptr(), value.as_ptr(), value.len(), err.ptr(), ERR_LEN) };
            if rc != 0 {
                return Err(Error::Parallel(format!(
                    "the store at {} refused key {key}: {}",
                    self.address,
                    err.message()
                )));
            }
        }
        Ok(())
    }

    /// The value of `key`, waiting up to `timeout` for another rank to set it.
    pub fn get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>> {
        let _ = (key, timeout);
        #[cfg(headcount_dist)]
        {
            let k = c_string("store key", key)?;
            let mut err = ErrBuf::new();
            let mut buf = std::ptr::null_mut();
            let mut n = 0usize;
            // SAFETY: a live store, a valid key and out-pointers.
            let rc = unsafe {
                ffi::hc_store_get(self.ptr, k.as_ptr(), millis(timeout), &mut buf, &mut n, err.ptr(), ERR_LEN)
            };
            if rc != 0 {
                return Err(Error::Parallel(format!(
                    "waiting for {key} at the store {}: {}",
                    self.address,
                    err.message()
                )));
            }
            // SAFETY: the shim returned a buffer of n bytes, freed right after the copy.
            let value = unsafe { std::slice::from_raw_parts(buf, n) }.to_vec();
            // SAFETY: `buf` came from hc_store_get.
            unsafe { ffi::hc_buffer_free(buf) };
            return Ok(value);
        }
        #[allow(unreachable_code)]
        Err(Error::Parallel("no store: this build has no process groups".to_owned()))
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        #[cfg(headcount_dist)]
        // SAFETY: the handle came from hc_store_new and is freed once.
        unsafe {
            ffi::hc_store_free(self.ptr)
        };
    }
}

/// Where a group's connections bind: the interfaces of `GLOO_SOCKET_IFNAME` (as
/// torch.distributed reads it), else an address; both empty, the machine's hostname.
#[derive(Clone, Debug, Default)]
pub struct Bind {
    pub interfaces: String,
    pub hostname: String,
}

/// A group of ranks that run collectives together.
pub struct ProcessGroup {
    rank: usize,
    size: usize,
    /// Names the group in messages (`world`, `tensor-parallel group of stage 1`).
    name: String,
    /// The rank in the whole run, for messages.
    global_rank: usize,
    ptr: *mut c_void,
    /// Time spent in this group's collectives, and their count (for `bench`).
    spent: std::cell::Cell<(Duration, u64)>,
    /// How long one of its waits may take.
    timeout: Duration,
}

// SAFETY: c10d process groups are used from one thread at a time here (the model's), and
// Gloo's own worker threads are internal to it; the handle is freed once, on drop.
unsafe impl Send for ProcessGroup {}

impl ProcessGroup {
    /// A group of one: every collective returns its input.
    pub fn single() -> ProcessGroup {
        ProcessGroup {
            rank: 0,
            size: 1,
            name: "world".to_owned(),
            global_rank: 0,
            ptr: std::ptr::null_mut(),
            spent: Default::default(),
            timeout: Duration::ZERO,
        }
    }

    /// Joins the group of `size` ranks meeting under `prefix` in `store`, as `rank`.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        store: &Store,
        prefix: &str,
        name: &str,
        rank: usize,
        size: usize,
        global_rank: usize,
        timeout: Duration,
        bind: &Bind,
    ) -> Result<ProcessGroup> {
        if size == 1 {
            let mut one = ProcessGroup::single();
            one.name = name.to_owned();
            one.global_rank = global_rank;
            return Ok(one);
        }
        available()?;
        let _ = (store, prefix, timeout, bind);
        #[cfg(headcount_dist)]
        {
            let p = c_string("group prefix", prefix)?;
            let ifs = c_string("GLOO_SOCKET_IFNAME", &bind.interfaces)?;
            let host = c_string("address", &bind.hostname)?;
            let (r, n) = (i32::try_from(rank), i32::try_from(size));
            let (Ok(r), Ok(n)) = (r, n) else {
                return Err(Error::Parallel(format!("a group of {size} ranks is too large")));
            };
            let mut err = ErrBuf::new();
            let mut ptr = std::ptr::null_mut();
            // SAFETY: a live store, valid C strings and an out-pointer.
            let rc = unsafe {
                ffi::hc_group_new(
                    store.ptr,
                    p.as_ptr(),
                    r,
                    n,
                    millis(timeout),
                    ifs.as_ptr(),
                    host.as_ptr(),
                    &mut ptr,
                    err.ptr(),
                    ERR_LEN,
                )
            };
            if rc != 0 {
                return Err(Error::Parallel(format!(
                    "rank {global_rank}: could not join the {name} ({size} ranks) within {} s: {}",
                    timeout.as_secs(),
                    err.message()
                )));
            }
            return Ok(ProcessGroup {
                rank,
                size,
                name: name.to_owned(),
                global_rank,
                ptr,
                spent: Default::default(),
                timeout,
            });
        }
        #[allow(unreachable_code)]
        Err(Error::Parallel("this build has no process groups".to_owned()))
    }

    /// This rank's index in the group.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Ranks in the group.
    pub fn size(&self) -> usize {
        self.size
    }

    /// Time spent in this group's collectives so far, and how many ran.
    pub fn spent(&self) -> (Duration, u64) {
        self.spent.get()
    }

    fn count(&self, since: std::time::Instant) {
        let (d, n) = self.spent.get();
        self.spent.set((d + since.elapsed(), n + 1));
    }

    /// Runs the shim call `f` on `t` in host memory (Gloo's), contiguous; for a GPU tensor,
    /// or a strided one, through a copy written back afterwards when `write_back`.
    fn on_host(
        &self,
        op: &str,
        t: &Tensor,
        write_back: bool,
        f: impl FnOnce(*mut c_void, *mut c_char) -> i32,
    ) -> Result<()> {
        let t0 = std::time::Instant::now();
        let direct = t.device() == Device::Cpu && t.is_contiguous();
        let host = if direct { t.shallow_clone() } else { t.f_to_device(Device::Cpu)?.f_contiguous()? };
        let mut err = ErrBuf::new();
        if f(host.as_ptr() as *mut c_void, err.ptr()) != 0 {
            return Err(self.failed(op, &err));
        }
        if !direct && write_back {
            t.shallow_clone().f_copy_(&host)?;
        }
        self.count(t0);
        Ok(())
    }

    fn failed(&self, op: &str, err: &ErrBuf) -> Error {
        Error::Parallel(format!(
            "rank {}: {op} in the {} failed: {}; a peer rank has stopped (its own error says why), or did not answer within --rank-timeout ({} s), which must cover the longest step a stage waits for (a long prefill on an earlier pipeline stage)",
            self.global_rank,
            self.name,
            err.message(),
            self.timeout.as_secs()
        ))
    }

    /// Sums `t` over the group, in place.
    pub fn all_reduce_sum(&self, t: &Tensor) -> Result<()> {
        if self.size == 1 {
            return Ok(());
        }
        let _ = t;
        #[cfg(headcount_dist)]
        // SAFETY: a live group and a live tensor handle (torch-sys's tensor is an at::Tensor*).
        self.on_host("all-reduce", t, true, |p, e| unsafe { ffi::hc_all_reduce_sum(self.ptr, p, e, ERR_LEN) })?;
        Ok(())
    }

    /// Every rank's `t` (the same shape on every rank) joined along `dim` in rank order.
    pub fn all_gather(&self, t: &Tensor, dim: i64) -> Result<Tensor> {
        if self.size == 1 {
            return Ok(t.shallow_clone());
        }
        let t0 = std::time::Instant::now();
        let input = t.f_to_device(Device::Cpu)?.f_contiguous()?;
        // Gloo gathers into one tensor whose first dimension is the ranks' first dimensions
        // end to end; read back as [size, ..input].
        let shape = input.size();
        let mut flat = shape.clone();
        let Some(first) = flat.first_mut() else {
            return Err(Error::Parallel("all-gather of a scalar".to_owned()));
        };
        *first *= self.size as i64;
        let out = Tensor::f_empty(&flat, (input.kind(), Device::Cpu))?;
        #[cfg(headcount_dist)]
        {
            let mut err = ErrBuf::new();
            // SAFETY: a live group; `out` holds size times `input`'s elements, both contiguous.
            let rc = unsafe {
                ffi::hc_all_gather(
                    self.ptr,
                    out.as_ptr() as *mut c_void,
                    input.as_ptr() as *mut c_void,
                    err.ptr(),
                    ERR_LEN,
                )
            };
            if rc != 0 {
                return Err(self.failed("all-gather", &err));
            }
        }
        let mut stacked = shape;
        stacked.insert(0, self.size as i64);
        let parts = out.f_view(stacked.as_slice())?.f_unbind(0)?;
        let joined = Tensor::f_cat(&parts, dim)?.f_to_device(t.device())?;
        self.count(t0);
        Ok(joined)
    }

    /// Sets `t` to `root`'s `t` on every rank.
    pub fn broadcast(&self, t: &Tensor, root: usize) -> Result<()> {
        if self.size == 1 {
            return Ok(());
        }
        if root >= self.size {
            return Err(Error::Parallel(format!("broadcast from rank {root} of a group of {}", self.size)));
        }
        let _ = (t, root);
        #[cfg(headcount_dist)]
        // SAFETY: a live group and tensor handle; root < size (callers pass group ranks).
        self.on_host("broadcast", t, true, |p, e| unsafe { ffi::hc_broadcast(self.ptr, p, root as i32, e, ERR_LEN) })?;
        Ok(())
    }

    /// A group of one has no peer to send to or receive from.
    fn peer(&self, op: &str, other: usize) -> Result<()> {
        if self.ptr.is_null() || other >= self.size || other == self.rank {
            return Err(Error::Parallel(format!(
                "rank {}: {op} with rank {other} of the {} ({} rank{}): no such peer",
                self.global_rank,
                self.name,
                self.size,
                if self.size == 1 { "" } else { "s" }
            )));
        }
        Ok(())
    }

    /// Sends `t` to rank `dst` of the group.
    pub fn send(&self, t: &Tensor, dst: usize) -> Result<()> {
        self.peer("send", dst)?;
        #[cfg(headcount_dist)]
        // SAFETY: a live group and tensor handle.
        self.on_host("send", t, false, |p, e| unsafe { ffi::hc_send(self.ptr, p, dst as i32, 0, e, ERR_LEN) })?;
        Ok(())
    }

    /// Receives into `t` what rank `src` of the group sends.
    pub fn recv(&self, t: &Tensor, src: usize) -> Result<()> {
        self.peer("receive", src)?;
        #[cfg(headcount_dist)]
        // SAFETY: a live group and tensor handle.
        self.on_host("receive", t, true, |p, e| unsafe { ffi::hc_recv(self.ptr, p, src as i32, 0, e, ERR_LEN) })?;
        Ok(())
    }

    /// Returns once every rank of the group has called it.
    pub fn barrier(&self) -> Result<()> {
        if self.size == 1 {
            return Ok(());
        }
        #[cfg(headcount_dist)]
        {
            let mut err = ErrBuf::new();
            // SAFETY: a live group.
            if unsafe { ffi::hc_barrier(self.ptr, err.ptr(), ERR_LEN) } != 0 {
                return Err(self.failed("barrier", &err));
            }
        }
        Ok(())
    }
}

impl Drop for ProcessGroup {
    fn drop(&mut self) {
        #[cfg(headcount_dist)]
        if !self.ptr.is_null() {
            // SAFETY: the handle came from hc_group_new and is freed once.
            unsafe { ffi::hc_group_free(self.ptr) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// scripts/test sets HEADCOUNT_REQUIRE_DIST: there the shim must have been built.
    /// Elsewhere a build without it names the reason.
    #[test]
    fn process_groups_are_built_or_say_why() {
        match available() {
            Ok(()) => assert!(WHY_NOT.is_empty()),
            Err(e) => {
                assert!(std::env::var_os("HEADCOUNT_REQUIRE_DIST").is_none(), "required but missing: {e}");
                assert!(e.to_string().contains(WHY_NOT) && !WHY_NOT.is_empty(), "{e}");
            }
        }
    }

    /// A group of one communicates nothing and returns its input.
    #[test]
    fn a_group_of_one_is_the_identity() {
        let g = ProcessGroup::single();
        let t = Tensor::from_slice(&[1f32, 2., 3.]);
        g.all_reduce_sum(&t).unwrap();
        g.broadcast(&t, 0).unwrap();
        g.barrier().unwrap();
        assert_eq!(Vec::<f32>::try_from(&g.all_gather(&t, 0).unwrap()).unwrap(), vec![1., 2., 3.]);
        assert_eq!(Vec::<f32>::try_from(&t).unwrap(), vec![1., 2., 3.]);
        assert_eq!(g.spent().1, 0);
    }
}
