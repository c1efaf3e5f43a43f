//! Devices and dtypes, parsed from the strings users type.

use std::path::Path;
use std::str::FromStr;

use tch::{Device, Kind};

use crate::error::{Error, Result};

/// The weight and activation dtypes the runtime runs in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DType {
    F32,
    Bf16,
    F16,
}

impl DType {
    pub fn kind(self) -> Kind {
        match self {
            DType::F32 => Kind::Float,
            DType::Bf16 => Kind::BFloat16,
            DType::F16 => Kind::Half,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::Bf16 => "bf16",
            DType::F16 => "f16",
        }
    }
}

impl FromStr for DType {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "f32" | "float32" | "float" => Ok(DType::F32),
            "bf16" | "bfloat16" => Ok(DType::Bf16),
            "f16" | "float16" | "half" => Ok(DType::F16),
            _ => Err(Error::InvalidArgument(format!("unknown dtype {s:?}: use f32, bf16 or f16"))),
        }
    }
}

/// Loads libtorch's CUDA library if it is installed. The linker drops `libtorch_cuda.so`
/// from binaries that name none of its symbols, so without this `cuda` is never available.
pub fn load_cuda_library() -> bool {
    use std::sync::OnceLock;
    static LOADED: OnceLock<bool> = OnceLock::new();
    *LOADED.get_or_init(|| {
        let mut any = false;
        for name in ["libtorch_cuda.so", "libc10_cuda.so"] {
            let Ok(c) = std::ffi::CString::new(name) else { continue };
            // SAFETY: dlopen with a valid C string; a null result just means "not there".
            let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
            any |= !h.is_null();
        }
        any
    })
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
    free_memory(&meminfo, cgroup_room(&cgroups, |p| std::fs::read_to_string(p).ok()))
}

/// MemAvailable plus SwapFree, capped by the cgroup's room plus SwapFree (swap is generous
/// here on purpose: the check must not refuse what would fit).
fn free_memory(meminfo: &str, cgroup_room: Option<u64>) -> Option<FreeMemory> {
    let kib = |key: &str| {
        meminfo
            .lines()
            .find_map(|l| l.strip_prefix(key)?.strip_prefix(':')?.trim().strip_suffix("kB")?.trim().parse::<u64>().ok())
    };
    let swap = kib("SwapFree").unwrap_or(0).saturating_mul(1024);
    let free = kib("MemAvailable")?.saturating_mul(1024).saturating_add(swap);
    match cgroup_room.map(|room| room.saturating_add(swap)) {
        Some(bytes) if bytes < free => {
            Some(FreeMemory { bytes, read_from: "the cgroup's memory limit less what it holds, plus SwapFree" })
        }
        _ => Some(FreeMemory { bytes: free, read_from: "MemAvailable plus SwapFree in /proc/meminfo" }),
    }
}

/// The least room under a memory limit among the cgroups of `/proc/self/cgroup` (its text)
/// and their ancestors: limit minus usage, where the page cache counts as free (the kernel
/// reclaims it before it kills). `read` gives a file's text. `None` where no level has a
/// limit.
fn cgroup_room(proc_self_cgroup: &str, read: impl Fn(&Path) -> Option<String>) -> Option<u64> {
    let mut least: Option<u64> = None;
    for line in proc_self_cgroup.lines() {
        let mut fields = line.splitn(3, ':');
        let (Some(id), Some(controllers), Some(path)) = (fields.next(), fields.next(), fields.next()) else { continue };
        // cgroup v2 ("0::/path"): memory.max, memory.current, "file" in memory.stat.
        // cgroup v1 ("N:memory:/path"): memory.limit_in_bytes, memory.usage_in_bytes,
        // "total_cache" in memory.stat.
        let (root, limit, usage, cache) = if id == "0" && controllers.is_empty() {
            ("/sys/fs/cgroup", "memory.max", "memory.current", "file")
        } else if controllers.split(',').any(|c| c == "memory") {
            ("/sys/fs/cgroup/memory", "memory.limit_in_bytes", "memory.usage_in_bytes", "total_cache")
        } else {
            continue;
        };
        let root = Path::new(root);
        let mut dir = root.join(path.trim_start_matches('/'));
        loop {
            let room = (|| {
                let limit = read(&dir.join(limit))?.trim().parse::<u64>().ok()?; // "max": no limit
                // v1 writes "no limit" as the largest page-aligned i64.
                if limit >= 1 << 62 {
                    return None;
                }
                let usage = read(&dir.join(usage))?.trim().parse::<u64>().ok()?;
                let stat = read(&dir.join("memory.stat")).unwrap_or_default();
                let cached = stat
                    .lines()
                    .find_map(|l| l.strip_prefix(cache)?.strip_prefix(' ')?.trim().parse::<u64>().ok())
                    .unwrap_or(0);
                Some(limit.saturating_sub(usage.saturating_sub(cached)))
            })();
            if let Some(room) = room {
                least = Some(least.map_or(room, |l| l.min(room)));
            }
            if dir == root || !dir.pop() || !dir.starts_with(root) {
                break;
            }
        }
    }
    least
}

/// Parses `cpu`, `cuda` or `cuda:N` and checks the device exists.
pub fn parse_device(s: &str) -> Result<Device> {
    let s = s.trim().to_ascii_lowercase();
    if s == "cpu" {
        return Ok(Device::Cpu);
    }
    let index = if s == "cuda" {
        0
    } else if let Some(n) = s.strip_prefix("cuda:") {
        n.parse::<usize>()
            .map_err(|_| Error::Device(format!("unknown device {s:?}: use cpu, cuda or cuda:N with N a GPU index")))?
    } else {
        return Err(Error::Device(format!("unknown device {s:?}: use cpu, cuda or cuda:N")));
    };
    load_cuda_library();
    if !tch::Cuda::is_available() {
        return Err(Error::Device(format!(
            "device {s:?} was asked for, but CUDA is not available on this machine (no GPU, or a CPU-only libtorch)"
        )));
    }
    let count = usize::try_from(tch::Cuda::device_count()).unwrap_or(0);
    if index >= count {
        return Err(Error::Device(format!(
            "device {s:?} does not exist: this machine has {count} CUDA device{}",
            if count == 1 { "" } else { "s" }
        )));
    }
    Ok(Device::Cuda(index))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_free_memory_from_meminfo_and_the_cgroup_limit() {
        let meminfo = "MemTotal:       24000000 kB\nMemFree:          100000 kB\nMemAvailable:   20000000 kB\nSwapTotal:       2000000 kB\nSwapFree:        1000000 kB\n";
        let meminfo_source = "MemAvailable plus SwapFree in /proc/meminfo";
        assert_eq!(
            free_memory(meminfo, None),
            Some(FreeMemory { bytes: 21_000_000 * 1024, read_from: meminfo_source })
        );
        // A cgroup with 8 GiB of room: that, plus the swap.
        let capped = free_memory(meminfo, Some(8 << 30)).unwrap();
        assert_eq!(capped.bytes, (8 << 30) + 1_000_000 * 1024);
        assert!(capped.read_from.starts_with("the cgroup's memory limit"));
        // Room above what the machine has changes nothing.
        assert_eq!(free_memory(meminfo, Some(1 << 50)), free_memory(meminfo, None));
        // Without swap lines, MemAvailable alone; without MemAvailable (kernels before 3.14), no answer.
        assert_eq!(free_memory("MemAvailable: 1 kB\n", None).map(|f| f.bytes), Some(1024));
        assert_eq!(free_memory("MemFree: 1 kB\n", None), None);
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
        // cgroup v2: a 16 GiB limit on the process's group holding 12 GiB, 3 of them page
        // cache: 7 GiB of room. Its parent has no limit.
        let v2 = files(&[
            ("/sys/fs/cgroup/job/memory.max", "17179869184\n"),
            ("/sys/fs/cgroup/job/memory.current", "12884901888\n"),
            ("/sys/fs/cgroup/job/memory.stat", "anon 9663676416\nfile 3221225472\nfile_mapped 0\n"),
            ("/sys/fs/cgroup/memory.max", "max\n"),
        ]);
        assert_eq!(cgroup_room("0::/job\n", |p| v2.get(p).cloned()), Some(7 << 30));
        // cgroup v1: the limit sits on an ancestor; "no limit" (i64::MAX in pages) is skipped.
        let v1 = files(&[
            ("/sys/fs/cgroup/memory/a/b/memory.limit_in_bytes", "9223372036854771712\n"),
            ("/sys/fs/cgroup/memory/a/b/memory.usage_in_bytes", "1073741824\n"),
            ("/sys/fs/cgroup/memory/a/memory.limit_in_bytes", "4294967296\n"),
            ("/sys/fs/cgroup/memory/a/memory.usage_in_bytes", "3221225472\n"),
            ("/sys/fs/cgroup/memory/a/memory.stat", "cache 5\ntotal_cache 1073741824\n"),
        ]);
        let v1_lines = "9:name=systemd:/\n4:memory:/a/b\n0::/\n";
        assert_eq!(cgroup_room(v1_lines, |p| v1.get(p).cloned()), Some(2 << 30));
        // Usage above the limit, no limit anywhere, and unreadable files.
        let over = files(&[("/sys/fs/cgroup/memory.max", "100"), ("/sys/fs/cgroup/memory.current", "200")]);
        assert_eq!(cgroup_room("0::/\n", |p| over.get(p).cloned()), Some(0));
        assert_eq!(cgroup_room("4:memory:/a/b\n", |_| None), None);
        assert_eq!(cgroup_room("", |_| Some("1".to_owned())), None);
    }

    #[test]
    fn parses_devices_and_dtypes() {
        assert_eq!(parse_device("cpu").unwrap(), Device::Cpu);
        assert!(matches!(parse_device("tpu"), Err(Error::Device(_))));
        assert!(matches!(parse_device("cuda:x"), Err(Error::Device(_))));
        assert_eq!("bf16".parse::<DType>().unwrap(), DType::Bf16);
        assert!("int8".parse::<DType>().is_err());
    }
}
