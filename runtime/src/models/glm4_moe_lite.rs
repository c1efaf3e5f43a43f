//! GLM-4.7-Flash (`glm4_moe_lite`, Glm4MoeLiteForCausalLM), a layer top to bottom as data
//! flows: input RMSNorm; multi-head latent attention ([`super::layers::LatentAttention`]):
//! queries through q_a_proj, q_a_layernorm and q_b_proj (or one q_proj), the latent and the
//! shared rotary key through kv_a_proj_with_mqa and kv_a_layernorm, keys and values expanded
//! by kv_b_proj, interleaved (or rotate-half) rotary over `qk_rope_head_dim` channels; the
//! residual add; the post-attention RMSNorm; a dense gated MLP or glm4_moe's mixture of
//! experts, as `mlp_layer_types` says; the residual add. The multi-token-prediction layers
//! stored after the decoder layers run as a speculative decoder ([`super::mtp`]).

use super::glm4_moe::moe_layer;
use super::layers::{DecoderLayer, Loader, SelfAttention};
use crate::error::{Error, Result};
use crate::load::WeightSource;

/// Layer `l`, this rank's part of it.
pub(crate) fn load_layer(cx: &Loader, src: &mut dyn WeightSource, l: usize) -> Result<DecoderLayer> {
    // cannot fire: the family's config has MLA and MoE sizes (Dims::new).
    let (Some(m), Some(moe)) = (cx.dims.mla.as_ref(), cx.dims.moe.as_ref()) else {
        return Err(Error::Internal("glm4_moe_lite without MLA or MoE sizes".into()));
    };
    moe_layer(cx, src, moe, l, |src, p| Ok(SelfAttention::Latent(cx.latent_attention(src, p, m, l)?)))
}
