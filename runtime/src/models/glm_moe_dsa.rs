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
use crate::config::{Dims, IndexerDims, MlaDims, MoeDims};
use crate::error::Result;
use crate::load::WeightSource;

/// Layer `l`'s tensors, named and shaped as in the checkpoint.
pub(crate) fn tensors(dims: &Dims, m: &MlaDims, ix: &IndexerDims, moe: &MoeDims, l: usize) -> Vec<(String, Vec<i64>)> {
    let mut out = super::glm4_moe_lite::tensors(dims, m, moe, l);
    if ix.is_full(l) {
        let a = format!("model.layers.{l}.self_attn.indexer");
        let (h, d, heads) = (dims.hidden as i64, ix.dim as i64, ix.heads as i64);
        // cannot fire: a sparse-attention config has low-rank queries (rule HC1304).
        let q_lora = m.q_lora.unwrap_or(0) as i64;
        out.push((format!("{a}.wq_b.weight"), vec![heads * d, q_lora]));
        out.push((format!("{a}.wk.weight"), vec![d, h]));
        out.push((format!("{a}.k_norm.weight"), vec![d]));
        out.push((format!("{a}.k_norm.bias"), vec![d]));
        out.push((format!("{a}.weights_proj.weight"), vec![heads, h]));
    }
    out
}

/// Layer `l`, this rank's part of it: glm4_moe_lite's loader, which reads the indexer of a
/// full layer with the latent attention.
pub(crate) fn load_layer(cx: &Loader, src: &mut dyn WeightSource, l: usize) -> Result<DecoderLayer> {
    super::glm4_moe_lite::load_layer(cx, src, l)
}
