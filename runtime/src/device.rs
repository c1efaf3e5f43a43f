//! Devices and dtypes, parsed from the strings users type.

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
    fn parses_devices_and_dtypes() {
        assert_eq!(parse_device("cpu").unwrap(), Device::Cpu);
        assert!(matches!(parse_device("tpu"), Err(Error::Device(_))));
        assert!(matches!(parse_device("cuda:x"), Err(Error::Device(_))));
        assert_eq!("bf16".parse::<DType>().unwrap(), DType::Bf16);
        assert!("int8".parse::<DType>().is_err());
    }
}
