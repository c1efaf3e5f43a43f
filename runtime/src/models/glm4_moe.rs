//! GLM-4.5, 4.6 and 4.7 (`glm4_moe`, Glm4MoeForCausalLM), a layer top to bottom as data
//! flows: input RMSNorm; attention with grouped kv heads, optional RMSNorms of each query and
//! key head (`use_qk_norm`), and rotate-half partial rotary (its q and k channels reordered
//! at load so that the interleaved rotation computes it); the residual add; the
//! post-attention RMSNorm; a dense gated MLP in the first `first_k_dense_replace` layers,
//! else the mixture of experts ([`crate::moe`]: the router, the routed experts, the shared
//! experts); the residual add. The multi-token-prediction layers stored after the decoder
//! layers run as a speculative decoder ([`super::mtp`]).

use std::ops::Range;

use tch::{Device, Kind, Tensor};

use super::layers::{DecoderLayer, Ffn, Loader, SelfAttention, rotate_half_order};
use crate::config::MoeDims;
use crate::error::{Error, Result};
use crate::load::WeightSource;
use crate::moe::{ExpertMlp, Moe};
use crate::nn::{Linear, Weight, WeightLayout};

/// Layer `l`, this rank's part of it.
pub(crate) fn load_layer(cx: &Loader, src: &mut dyn WeightSource, l: usize) -> Result<DecoderLayer> {
    // cannot fire: the family's config has MoE sizes (Dims::new).
    let m = cx.dims.moe.as_ref().ok_or_else(|| Error::Internal("glm4_moe without MoE sizes".into()))?;
    let order = rotate_half_order(cx.dims.head_dim, cx.dims.rotary_dim, cx.dev)?;
    moe_layer(cx, src, m, l, |src, p| Ok(SelfAttention::Grouped(cx.attention(src, p, Some(&order), m.qk_norm)?)))
}

/// Layer `l` of a mixture-of-experts family around the attention `attention` loads (given
/// the layer prefix): its two norms, and a dense MLP or the experts, as `m` says.
pub(crate) fn moe_layer(
    cx: &Loader,
    src: &mut dyn WeightSource,
    m: &MoeDims,
    l: usize,
    attention: impl FnOnce(&mut dyn WeightSource, &str) -> Result<SelfAttention>,
) -> Result<DecoderLayer> {
    let p = format!("model.layers.{l}");
    let input_layernorm = cx.whole(src, &format!("{p}.input_layernorm.weight"))?;
    let self_attn = attention(src, &p)?;
    let post_attention_layernorm = cx.whole(src, &format!("{p}.post_attention_layernorm.weight"))?;
    let mlp = if m.is_moe_layer(l) {
        experts(cx, src, m, &p)?
    } else {
        let (gate_up, down) = cx.gated(src, &format!("{p}.mlp."), cx.plan.intermediate(cx.shard))?;
        cx.mlp(gate_up, down)
    };
    Ok(DecoderLayer {
        input_layernorm,
        self_attn,
        post_self_attn_layernorm: None,
        post_attention_layernorm,
        mlp,
        post_mlp_layernorm: None,
    })
}

/// The mixture of experts of layer prefix `p`: the router (f32) with its correction bias,
/// this rank's routed experts (its columns of each), and its columns of the shared experts.
fn experts(cx: &Loader, src: &mut dyn WeightSource, m: &MoeDims, p: &str) -> Result<Ffn> {
    let (plan, s) = (cx.plan, cx.shard);
    let router = cx.whole_as(src, &format!("{p}.mlp.gate.weight"), Kind::Float)?;
    let correction_bias = cx.whole_as(src, &format!("{p}.mlp.gate.e_score_correction_bias"), Kind::Float)?;
    let w = plan.expert_width_per_shard;
    let cols = plan.expert_width(s);
    let local = plan.experts(s);
    let mut experts = Vec::new();
    for e in local.clone() {
        let (gate_up, down) = if m.fused_experts {
            let (gu, dn) = expert_from_fused(cx, src, p, e, m.width, cols.clone())?;
            (cx.linear_as(&gu, None, cx.expert_layout)?, cx.linear_as(&dn, None, cx.expert_layout)?)
        } else {
            cx.gated_as(src, &format!("{p}.mlp.experts.{e}."), cols.clone(), cx.expert_layout)?
        };
        experts.push(ExpertMlp { gate_up, down, width: w as i64 });
    }
    let shared = if m.shared_width > 0 {
        let sw = plan.shared_width_per_shard;
        let (gate_up, down) =
            cx.gated_as(src, &format!("{p}.mlp.shared_experts."), s * sw..(s + 1) * sw, cx.expert_layout)?;
        Some(ExpertMlp { gate_up, down, width: sw as i64 })
    } else {
        None
    };
    let stacked = stack_experts(&mut experts, cx.kind, cx.expert_layout, cx.dev)?;
    Ok(Ffn::Moe(Moe { router, correction_bias, first_expert: local.start, experts, shared, stacked }))
}

/// In f32 on CPU with each expert's weights in one `[out, in]` block: the experts' gate/up
/// and down weights stacked (`[E, 2 x width, hidden]`, `[E, hidden, width]`), each expert's
/// projection then a view of its slice (no second copy), for one grouped product over all
/// experts in prefill ([`Moe::forward`]), which reads the stacks as transposed views
/// (`[E, hidden, 2 x width]`, `[E, width, hidden]`).
fn stack_experts(
    experts: &mut [ExpertMlp],
    kind: Kind,
    layout: WeightLayout,
    dev: Device,
) -> Result<Option<(Tensor, Tensor)>> {
    let stored = |l: &Linear| matches!(l.weight, Weight::Stored(_));
    let single = experts.iter().all(|e| stored(&e.gate_up) && stored(&e.down));
    // libtorch's grouped product wants rows of a multiple of 16 bytes.
    let aligned = experts.first().is_some_and(|e| {
        let (h, w2) = (e.gate_up.shape()[0], e.gate_up.shape()[1]);
        h % 4 == 0 && w2 % 8 == 0
    });
    if kind != Kind::Float || layout != WeightLayout::OutIn || dev != Device::Cpu || !single || !aligned {
        return Ok(None);
    }
    // Each weight is the `[in, out]` view of a contiguous `[out, in]` one.
    let gu: Vec<Tensor> = experts.iter().map(|e| e.gate_up.parts()[0].f_transpose(0, 1)).collect::<Result<_, _>>()?;
    let dn: Vec<Tensor> = experts.iter().map(|e| e.down.parts()[0].f_transpose(0, 1)).collect::<Result<_, _>>()?;
    let (gu, dn) = (Tensor::f_stack(&gu, 0)?, Tensor::f_stack(&dn, 0)?);
    for (i, e) in experts.iter_mut().enumerate() {
        e.gate_up.weight = Weight::Stored(gu.f_select(0, i as i64)?.f_transpose(0, 1)?);
        e.down.weight = Weight::Stored(dn.f_select(0, i as i64)?.f_transpose(0, 1)?);
    }
    Ok(Some((gu.f_transpose(1, 2)?, dn.f_transpose(1, 2)?)))
}

/// Expert `e`'s gate/up and down weights (this rank's columns `cols` of its `width`)
/// from transformers 5's fused `gate_up_proj` [E, 2I, H] and `down_proj` [E, H, I].
fn expert_from_fused(
    cx: &Loader,
    src: &mut dyn WeightSource,
    p: &str,
    e: usize,
    width: usize,
    cols: Range<usize>,
) -> Result<(Tensor, Tensor)> {
    let gu = cx.rows(src, &format!("{p}.mlp.experts.gate_up_proj"), (e, 1))?.f_squeeze_dim(0)?;
    let (start, len) = (cols.start as i64, cols.len() as i64);
    let gate_up = Tensor::f_cat(&[gu.f_narrow(0, start, len)?, gu.f_narrow(0, width as i64 + start, len)?], 0)?;
    let down = cx.rows(src, &format!("{p}.mlp.experts.down_proj"), (e, 1))?.f_squeeze_dim(0)?;
    Ok((gate_up, down.f_narrow(1, start, len)?))
}
