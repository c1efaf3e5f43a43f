//! GLM-4 (`glm4`, Glm4ForCausalLM: GLM-4-0414), GLM's layer with two more norms, a layer top
//! to bottom as data flows: input RMSNorm; attention (as GLM's); `post_self_attn_layernorm`
//! on its output; the residual add; the post-attention RMSNorm; the gated MLP (as GLM's);
//! `post_mlp_layernorm` on its output; the residual add.

use super::glm::fused_mlp;
use super::layers::{DecoderLayer, Loader, SelfAttention};
use crate::error::Result;
use crate::load::WeightSource;

/// Layer `l`, this rank's part of it.
pub(crate) fn load_layer(cx: &Loader, src: &mut dyn WeightSource, l: usize) -> Result<DecoderLayer> {
    let p = format!("model.layers.{l}");
    let norm = |src: &mut dyn WeightSource, n: &str| cx.whole(src, &format!("{p}.{n}.weight"));
    Ok(DecoderLayer {
        input_layernorm: norm(src, "input_layernorm")?,
        self_attn: SelfAttention::Grouped(cx.attention(src, &p, None, false)?),
        post_self_attn_layernorm: Some(norm(src, "post_self_attn_layernorm")?),
        post_attention_layernorm: norm(src, "post_attention_layernorm")?,
        mlp: fused_mlp(cx, src, &p)?,
        post_mlp_layernorm: Some(norm(src, "post_mlp_layernorm")?),
    })
}
