//! The weight files headcount reads besides safetensors checkpoints: GGUF (llama.cpp's
//! format) so far; its header, metadata and the config they give.

pub mod gguf;
