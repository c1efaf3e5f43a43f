//! A checkpoint's multi-token-prediction (MTP) layers (glm4_moe's and glm4_moe_lite's), as
//! transformers 5.24's `MtpLayer` runs them, in the order data flows: the embedding of the next token (the main model's)
//! through `enorm` and the main model's last hidden state (after its final norm) through
//! `hnorm`, side by side (embedding first) into `eh_proj`; one decoder layer of the family
//! (always with experts) on a KV cache of its own; `post_norm` (stored as
//! `shared_head.norm`); the main model's lm_head. Its output hidden state is the next MTP
//! step's previous hidden state, so one layer chained drafts several tokens.
//!
//! Layer `k` is stored as decoder layer `num_hidden_layers + k`. The published checkpoints'
//! copies of the embedding and the head under it are vetted and not read.

use tch::Tensor;

use super::layers::{DecoderLayer, Loader};
use super::{KvCache, Step, load_layer};
use crate::config::Dims;
use crate::error::{Error, Result};
use crate::load::WeightSource;
use crate::nn::{Linear, Rounding, rms_norm};
use crate::parallel::group::ProcessGroup;

/// One MTP layer, this rank's part of it: its norms and `eh_proj` whole on every rank, its
/// decoder block split over the tensor-parallel ranks as every decoder layer is.
pub struct MtpLayer {
    pub enorm: Tensor,
    pub hnorm: Tensor,
    /// `[2 × hidden] -> [hidden]`: the normalized embedding, then the normalized hidden state.
    pub eh_proj: Linear,
    pub block: DecoderLayer,
    pub post_norm: Tensor,
}

/// MTP layer `k` of the checkpoint behind `src`.
pub(crate) fn load(cx: &Loader, src: &mut dyn WeightSource, k: usize) -> Result<MtpLayer> {
    let l = cx.dims.layers + k;
    let p = format!("model.layers.{l}");
    let enorm = cx.whole(src, &format!("{p}.enorm.weight"))?;
    let hnorm = cx.whole(src, &format!("{p}.hnorm.weight"))?;
    let eh_proj = cx.linear(&cx.whole(src, &format!("{p}.eh_proj.weight"))?, None)?;
    let block = load_layer(cx, src, l)?;
    let post_norm = cx.whole(src, &format!("{p}.shared_head.norm.weight"))?;
    Ok(MtpLayer { enorm, hnorm, eh_proj, block, post_norm })
}

impl MtpLayer {
    /// The layer on the embeddings `embedded` ([B, T, hidden]) of the tokens after the
    /// positions whose main-model (or previous MTP step's) hidden states are `previous`
    /// ([B, T, hidden]): its output hidden state, after `post_norm`. The step's keys go into
    /// `kv`, this layer's cache.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn forward(
        &self,
        embedded: &Tensor,
        previous: &Tensor,
        step: &Step,
        kv: &Tensor,
        dims: &Dims,
        rounding: Rounding,
        group: &ProcessGroup,
    ) -> Result<Tensor> {
        let eps = dims.eps;
        let e = rms_norm(embedded, &self.enorm, eps, rounding)?;
        let h = rms_norm(previous, &self.hnorm, eps, rounding)?;
        let x = self.eh_proj.forward(&Tensor::f_cat(&[e, h], -1)?)?;
        let x = self.block.forward(x, step, kv, dims, eps, rounding, false, group, &mut None)?;
        rms_norm(&x, &self.post_norm, eps, rounding)
    }

    /// Parameters this rank holds of the layer.
    pub fn numel(&self) -> i64 {
        let b = &self.block;
        let norms = [&self.enorm, &self.hnorm, &self.post_norm, &b.input_layernorm, &b.post_attention_layernorm];
        self.eh_proj.numel() + b.self_attn.numel() + b.mlp.numel() + norms.iter().map(|t| t.numel() as i64).sum::<i64>()
    }
}

/// The KV cache of a generation's MTP layers: one tensor per layer, shaped as a decoder
/// layer's, with the main cache's rows and capacity (slot i holds what the layer computed
/// for the token after position i).
pub(crate) fn check_cache(cache: &KvCache, layers: usize) -> Result<()> {
    if cache.kv.len() != layers {
        return Err(Error::InvalidArgument(format!(
            "the MTP cache holds {} layers and the model {layers}: make it with new_mtp_cache",
            cache.kv.len()
        )));
    }
    Ok(())
}
