//! GLM (`glm`, GlmForCausalLM: GLM-4-9B's layout), a layer top to bottom as data flows:
//! input RMSNorm; attention with grouped kv heads, q/k/v with bias, interleaved partial
//! rotary (the layer's building blocks are [`super::layers`]); the residual add; the
//! post-attention RMSNorm; the gated MLP, its gate and up stored as one `gate_up_proj`; the
//! residual add.

use super::layers::{DecoderLayer, Ffn, Loader, SelfAttention};
use crate::error::Result;
use crate::load::{Matrix, WeightSource};

/// Layer `l`, this rank's part of it.
pub(crate) fn load_layer(cx: &Loader, src: &mut dyn WeightSource, l: usize) -> Result<DecoderLayer> {
    let p = format!("model.layers.{l}");
    Ok(DecoderLayer {
        input_layernorm: cx.whole(src, &format!("{p}.input_layernorm.weight"))?,
        self_attn: SelfAttention::Grouped(cx.attention(src, &p, None, false)?),
        post_self_attn_layernorm: None,
        post_attention_layernorm: cx.whole(src, &format!("{p}.post_attention_layernorm.weight"))?,
        mlp: fused_mlp(cx, src, &p)?,
        post_mlp_layernorm: None,
    })
}

/// The MLP of layer prefix `p` with gate and up stored as one `mlp.gate_up_proj`
/// (`[2 x intermediate, hidden]`): this rank's channels of each half, down_proj's columns.
pub(crate) fn fused_mlp(cx: &Loader, src: &mut dyn WeightSource, p: &str) -> Result<Ffn> {
    let inter = cx.plan.intermediate(cx.shard);
    let name = format!("{p}.mlp.gate_up_proj.weight");
    let gate = cx.matrix(src, &name, Some((inter.start, inter.len())))?;
    let up = cx.matrix(src, &name, Some((cx.dims.intermediate + inter.start, inter.len())))?;
    let gate_up = cx.linear_of(Matrix::cat_rows(vec![gate, up], cx.kind, cx.dev)?, None)?;
    let down = cx.matrix(src, &format!("{p}.mlp.down_proj.weight"), None)?;
    let down = down.narrow_inputs(inter.start as i64, inter.len() as i64, cx.kind, cx.dev)?;
    Ok(cx.mlp(gate_up, cx.linear_of(down, None)?))
}
