//! Memory: what is free, what a model's tensors will take, and the check before allocating.

use std::path::Path;

use tch::Device;

use crate::device::DType;
use crate::error::{Error, Result};

/// On the CPU, tensors that cannot fit end in the operating system's OOM killer (Linux
/// overcommits, so allocating succeeds and writing kills), not in an error. Before the
/// weights, a KV cache or a forward pass's largest tensors are allocated on CPU devices,
/// their size is compared with the memory the system has free (`need` bytes, named by
/// `what`). A CUDA device needs no such check: its allocator returns an
/// out-of-memory error, which reaches the user as one.
/// Whether `bytes` of tensors in `dtype` fit in the CPU's free memory (an error naming both
/// if not), for tools that allocate tensors of a config's shapes themselves.
pub fn check_weights(bytes: u64, dtype: DType) -> Result<()> {
    check_cpu_memory(|| "the weights".to_owned(), bytes, dtype, "use a smaller shape or dtype, or free memory")
}

/// [`check_cpu_memory`] for a need that each of `ranks` ranks on this machine has at once
/// (they share its memory): the total is compared, and named as theirs.
pub(crate) fn check_ranks_memory(
    what: impl FnOnce() -> String,
    need: u64,
    ranks: usize,
    dtype: DType,
    advice: &'static str,
) -> Result<()> {
    if ranks <= 1 {
        return check_cpu_memory(what, need, dtype, advice);
    }
    let what = || format!("{} on each of the {ranks} ranks on this machine", what());
    check_cpu_memory(what, need.saturating_mul(ranks as u64), dtype, advice)
}

pub(crate) fn check_cpu_memory(
    what: impl FnOnce() -> String,
    need: u64,
    dtype: DType,
    advice: &'static str,
) -> Result<()> {
    if need == 0 {
        return Ok(());
    }
    match cpu_memory_free() {
        Some(free) if need > free.bytes => Err(Error::OutOfMemory {
            what: what(),
            need,
            dtype: dtype.name(),
            free: free.bytes,
            read_from: free.read_from,
            advice,
        }),
        _ => Ok(()),
    }
}

/// Memory the system can give this process, and where that number was read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FreeMemory {
    pub bytes: u64,
    pub read_from: &'static str,
}

/// The memory free for new allocations on the CPU: MemAvailable plus SwapFree of
/// /proc/meminfo, or less where the process's cgroup (v1 or v2, any level up to the root)
/// has a memory limit with less room under it: a container's limit is not in /proc/meminfo.
/// `None` where /proc/meminfo cannot be read (not Linux).
pub fn cpu_memory_free() -> Option<FreeMemory> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let cgroups = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    free_memory(&meminfo, |swap_free| cgroup_room(&cgroups, swap_free, |p| std::fs::read_to_string(p).ok()))
}

/// MemAvailable plus SwapFree, or the cgroup's room (given SwapFree) where that is less.
fn free_memory(meminfo: &str, cgroup_room: impl FnOnce(u64) -> Option<u64>) -> Option<FreeMemory> {
    let kib = |key: &str| {
        meminfo
            .lines()
            .find_map(|l| l.strip_prefix(key)?.strip_prefix(':')?.trim().strip_suffix("kB")?.trim().parse::<u64>().ok())
    };
    let swap = kib("SwapFree").unwrap_or(0).saturating_mul(1024);
    let free = kib("MemAvailable")?.saturating_mul(1024).saturating_add(swap);
    match cgroup_room(swap) {
        Some(bytes) if bytes < free => {
            Some(FreeMemory { bytes, read_from: "the cgroup's memory limit less what it holds, with its swap" })
        }
        _ => Some(FreeMemory { bytes: free, read_from: "MemAvailable plus SwapFree in /proc/meminfo" }),
    }
}

/// The least room under a memory limit among the cgroups of `/proc/self/cgroup` (its text)
/// and their ancestors, swap included: the limit minus the usage, where page cache counts
/// as free (the kernel reclaims it before it kills), plus the swap the level may still use
/// (at most `swap_free`). `read` gives a file's text. `None` where no level has a limit.
fn cgroup_room(proc_self_cgroup: &str, swap_free: u64, read: impl Fn(&Path) -> Option<String>) -> Option<u64> {
    let number = |p: &Path| read(p)?.trim().parse::<u64>().ok(); // "max": no limit
    // v1 writes "no limit" as the largest page-aligned i64.
    let limit_at = |p: &Path| number(p).filter(|&l| l < 1 << 62);
    let mut least: Option<u64> = None;
    for line in proc_self_cgroup.lines() {
        let mut fields = line.splitn(3, ':');
        let (Some(id), Some(controllers), Some(path)) = (fields.next(), fields.next(), fields.next()) else { continue };
        let v2 = id == "0" && controllers.is_empty();
        if !v2 && !controllers.split(',').any(|c| c == "memory") {
            continue;
        }
        let root = Path::new(if v2 { "/sys/fs/cgroup" } else { "/sys/fs/cgroup/memory" });
        // The kernel writes these paths; one with `..` (outside this cgroup namespace) is
        // not followed: only the root level is read.
        let relative = Path::new(path.trim_start_matches('/'));
        let inside = relative.components().all(|c| matches!(c, std::path::Component::Normal(_)));
        let mut dir = if inside { root.join(relative) } else { root.to_path_buf() };
        loop {
            let room = (|| {
                // v2: memory.max, memory.current, "file" in memory.stat, memory.swap.max and
                // memory.swap.current. v1: memory.limit_in_bytes, memory.usage_in_bytes,
                // "total_cache", and memory.memsw.* for memory plus swap together.
                let (limit, usage, cache) = if v2 {
                    ("memory.max", "memory.current", "file")
                } else {
                    ("memory.limit_in_bytes", "memory.usage_in_bytes", "total_cache")
                };
                let limit = limit_at(&dir.join(limit))?;
                let usage = number(&dir.join(usage))?;
                let stat = read(&dir.join("memory.stat")).unwrap_or_default();
                let cached = stat
                    .lines()
                    .find_map(|l| l.strip_prefix(cache)?.strip_prefix(' ')?.trim().parse::<u64>().ok())
                    .unwrap_or(0);
                let held = usage.saturating_sub(cached);
                let ram = limit.saturating_sub(held);
                let with_swap = if v2 {
                    let swap = match (limit_at(&dir.join("memory.swap.max")), number(&dir.join("memory.swap.current")))
                    {
                        (Some(max), Some(current)) => swap_free.min(max.saturating_sub(current)),
                        (Some(max), None) => swap_free.min(max),
                        (None, _) => swap_free,
                    };
                    ram.saturating_add(swap)
                } else {
                    let all = ram.saturating_add(swap_free);
                    match (
                        limit_at(&dir.join("memory.memsw.limit_in_bytes")),
                        number(&dir.join("memory.memsw.usage_in_bytes")),
                    ) {
                        (Some(max), Some(used)) => all.min(max.saturating_sub(used.saturating_sub(cached))),
                        _ => all,
                    }
                };
                Some(with_swap)
            })();
            if let Some(room) = room {
                least = Some(least.map_or(room, |l| l.min(room)));
            }
            if dir == root || !dir.pop() {
                break;
            }
        }
    }
    least
}

/// Peak resident memory of this process (Linux `VmHWM`), if known.
pub fn peak_resident_bytes() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// The most memory libtorch's allocator has held on a CUDA device since the last reset.
pub fn peak_device_memory(device: Device) -> Result<u64> {
    crate::cuda_graph::peak_memory(device)
}

/// Starts a new peak for [`peak_device_memory`].
pub fn reset_peak_device_memory(device: Device) -> Result<()> {
    crate::cuda_graph::reset_peak_memory(device)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_free_memory_from_meminfo_and_the_cgroup_limit() {
        let meminfo = "MemTotal:       24000000 kB\nMemFree:          100000 kB\nMemAvailable:   20000000 kB\nSwapTotal:       2000000 kB\nSwapFree:        1000000 kB\n";
        let meminfo_source = "MemAvailable plus SwapFree in /proc/meminfo";
        let no_cgroup = |_| None;
        assert_eq!(
            free_memory(meminfo, no_cgroup),
            Some(FreeMemory { bytes: 21_000_000 * 1024, read_from: meminfo_source })
        );
        // The cgroup's room is asked for with SwapFree, and taken where it is less.
        let capped = free_memory(meminfo, |swap| Some((8 << 30) + swap)).unwrap();
        assert_eq!(capped.bytes, (8 << 30) + 1_000_000 * 1024);
        assert!(capped.read_from.starts_with("the cgroup's memory limit"));
        // Room above what the machine has changes nothing.
        assert_eq!(free_memory(meminfo, |_| Some(1 << 50)), free_memory(meminfo, no_cgroup));
        // Without swap lines, MemAvailable alone; without MemAvailable (kernels before 3.14), no answer.
        assert_eq!(free_memory("MemAvailable: 1 kB\n", no_cgroup).map(|f| f.bytes), Some(1024));
        assert_eq!(free_memory("MemFree: 1 kB\n", no_cgroup), None);
        // This machine's own answer is a plausible size.
        if cfg!(target_os = "linux") {
            assert!(cpu_memory_free().is_some_and(|f| f.bytes > 1 << 20));
        }
    }

    #[test]
    fn cgroup_room_is_the_least_over_every_level() {
        use std::collections::HashMap;
        let files = |pairs: &[(&str, &str)]| -> HashMap<std::path::PathBuf, String> {
            pairs.iter().map(|(p, t)| (std::path::PathBuf::from(p), (*t).to_owned())).collect()
        };
        const GIB: u64 = 1 << 30;
        // cgroup v2: a 16 GiB limit on the process's group holding 12 GiB, 3 of them page
        // cache: 7 GiB of room, plus the swap it may use. Its parent has no limit.
        let mut v2 = files(&[
            ("/sys/fs/cgroup/job/memory.max", "17179869184\n"),
            ("/sys/fs/cgroup/job/memory.current", "12884901888\n"),
            ("/sys/fs/cgroup/job/memory.stat", "anon 9663676416\nfile 3221225472\nfile_mapped 0\n"),
            ("/sys/fs/cgroup/memory.max", "max\n"),
        ]);
        let room = |v: &HashMap<_, String>, lines: &str| cgroup_room(lines, GIB, |p| v.get(p).cloned());
        assert_eq!(room(&v2, "0::/job\n"), Some(8 * GIB), "no swap files: all of SwapFree");
        v2.insert("/sys/fs/cgroup/job/memory.swap.max".into(), "0\n".into());
        assert_eq!(room(&v2, "0::/job\n"), Some(7 * GIB), "swap.max 0: no swap");
        v2.insert("/sys/fs/cgroup/job/memory.swap.max".into(), "max\n".into());
        assert_eq!(room(&v2, "0::/job\n"), Some(8 * GIB));
        // A path leaving the cgroup root is not followed: only the root is read, which has
        // no limit here.
        assert_eq!(room(&v2, "0::/../job\n"), None);
        // cgroup v1: the limit sits on an ancestor; "no limit" (i64::MAX in pages) is skipped.
        let mut v1 = files(&[
            ("/sys/fs/cgroup/memory/a/b/memory.limit_in_bytes", "9223372036854771712\n"),
            ("/sys/fs/cgroup/memory/a/b/memory.usage_in_bytes", "1073741824\n"),
            ("/sys/fs/cgroup/memory/a/memory.limit_in_bytes", "4294967296\n"),
            ("/sys/fs/cgroup/memory/a/memory.usage_in_bytes", "3221225472\n"),
            ("/sys/fs/cgroup/memory/a/memory.stat", "cache 5\ntotal_cache 1073741824\n"),
        ]);
        let v1_lines = "9:name=systemd:/\n4:memory:/a/b\n0::/\n";
        assert_eq!(room(&v1, v1_lines), Some(3 * GIB), "2 GiB of memory and 1 of swap");
        // memsw limits memory and swap together: equal to the memory limit, no swap.
        v1.insert("/sys/fs/cgroup/memory/a/memory.memsw.limit_in_bytes".into(), "4294967296\n".into());
        v1.insert("/sys/fs/cgroup/memory/a/memory.memsw.usage_in_bytes".into(), "3221225472\n".into());
        assert_eq!(room(&v1, v1_lines), Some(2 * GIB));
        // Usage above the limit, no limit anywhere, and no memory controller.
        let over = files(&[("/sys/fs/cgroup/memory.max", "100"), ("/sys/fs/cgroup/memory.current", "200")]);
        assert_eq!(cgroup_room("0::/\n", 0, |p| over.get(p).cloned()), Some(0));
        assert_eq!(cgroup_room("4:memory:/a/b\n", GIB, |_| None), None);
        assert_eq!(cgroup_room("3:cpu:/a\n", GIB, |_| Some("1".to_owned())), None);
        assert_eq!(cgroup_room("", GIB, |_| Some("1".to_owned())), None);
    }
}
