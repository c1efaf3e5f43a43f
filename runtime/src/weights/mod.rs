//! The weight files headcount reads besides safetensors checkpoints: GGUF (llama.cpp's
//! format): its header, metadata and the config they give, and the model's weights from its
//! tensors.

pub(crate) mod compressed;
pub mod gguf;
pub(crate) mod gguf_source;
pub mod gguf_tokenizer;

pub use gguf_source::{gguf_file, model_config};
