//! GLM-4.7-Flash (`glm4_moe_lite`, Glm4MoeLiteForCausalLM), a layer top to bottom as data
//! flows: input RMSNorm; multi-head latent attention ([`super::layers::LatentAttention`]):
//! queries through q_a_proj, q_a_layernorm and q_b_proj (or one q_proj), the latent and the
//! shared rotary key through kv_a_proj_with_mqa and kv_a_layernorm, keys and values expanded
//! by kv_b_proj, interleaved (or rotate-half) rotary over `qk_rope_head_dim` channels; the
//! residual add; the post-attention RMSNorm; a dense gated MLP or glm4_moe's mixture of
//! experts, as `mlp_layer_types` says; the residual add. The multi-token-prediction layers
//! stored after the decoder layers run as a speculative decoder ([`super::mtp`]).

use super::glm4_moe::{expert_tensors, moe_layer};
use super::layers::{DecoderLayer, Loader, SelfAttention};
use crate::config::{Dims, MlaDims, MoeDims};
use crate::error::{Error, Result};
use crate::load::WeightSource;

/// Layer `l`'s tensors, named and shaped as in the checkpoint.
pub(crate) fn tensors(dims: &Dims, m: &MlaDims, moe: &MoeDims, l: usize) -> Vec<(String, Vec<i64>)> {
    let (h, heads) = (dims.hidden as i64, dims.heads as i64);
    let (qk, lora, rope) = ((m.nope + m.rope) as i64, m.kv_lora as i64, m.rope as i64);
    let p = format!("model.layers.{l}");
    let a = format!("{p}.self_attn");
    let mut out = vec![(format!("{p}.input_layernorm.weight"), vec![h])];
    match m.q_lora {
        Some(r) => {
            let r = r as i64;
            out.push((format!("{a}.q_a_proj.weight"), vec![r, h]));
            if dims.attention_bias {
                out.push((format!("{a}.q_a_proj.bias"), vec![r]));
            }
            out.push((format!("{a}.q_a_layernorm.weight"), vec![r]));
            out.push((format!("{a}.q_b_proj.weight"), vec![heads * qk, r]));
        }
        None => out.push((format!("{a}.q_proj.weight"), vec![heads * qk, h])),
    }
    out.push((format!("{a}.kv_a_proj_with_mqa.weight"), vec![lora + rope, h]));
    if dims.attention_bias {
        out.push((format!("{a}.kv_a_proj_with_mqa.bias"), vec![lora + rope]));
    }
    out.push((format!("{a}.kv_a_layernorm.weight"), vec![lora]));
    out.push((format!("{a}.kv_b_proj.weight"), vec![heads * (m.nope + m.v) as i64, lora]));
    out.push((format!("{a}.o_proj.weight"), vec![h, heads * m.v as i64]));
    if dims.attention_bias {
        out.push((format!("{a}.o_proj.bias"), vec![h]));
    }
    out.push((format!("{p}.post_attention_layernorm.weight"), vec![h]));
    out.extend(expert_tensors(dims, moe, &p, l));
    out
}

/// Layer `l`, this rank's part of it.
pub(crate) fn load_layer(cx: &Loader, src: &mut dyn WeightSource, l: usize) -> Result<DecoderLayer> {
    // cannot fire: the family's config has MLA and MoE sizes (Dims::new).
    let (Some(m), Some(moe)) = (cx.dims.mla.as_ref(), cx.dims.moe.as_ref()) else {
        return Err(Error::Internal("glm4_moe_lite without MLA or MoE sizes".into()));
    };
    moe_layer(cx, src, moe, l, |src, p| Ok(SelfAttention::Latent(cx.latent_attention(src, p, m, l)?)))
}
