//! GLM-5 (`glm_moe_dsa`, GlmMoeDsaForCausalLM): glm4_moe_lite's layer (input RMSNorm,
//! multi-head latent attention, post-attention RMSNorm, dense MLP or experts by
//! `mlp_layer_types`) with DeepSeek sparse attention. On a layer whose `indexer_types`
//! entry is full, an indexer scores every past token for each query (wq_b from the
//! low-rank query, wk and its LayerNorm k_norm from the layer's input, interleaved rotary
//! over the first `qk_rope_head_dim` channels, relu'd dot products weighed by
//! weights_proj) and the query attends only to its `index_topk` best; a shared layer
//! attends to the keys the previous full layer picked. Rotary pairs are always
//! interleaved, and the queries always have a low rank. The indexer's key is cached beside
//! the latent ([`super::layers::LatentAttention`]); its weights are whole on every rank.

use super::layers::{DecoderLayer, Loader};
use crate::error::Result;
use crate::load::WeightSource;

/// Layer `l`, this rank's part of it: glm4_moe_lite's loader, which reads the indexer of a
/// full layer with the latent attention.
pub(crate) fn load_layer(cx: &Loader, src: &mut dyn WeightSource, l: usize) -> Result<DecoderLayer> {
    super::glm4_moe_lite::load_layer(cx, src, l)
}
