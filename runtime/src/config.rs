//! The model's view of a validated config: every size as the model uses it, and the weights
//! a checkpoint of that shape holds.

use headcount_spec::{Config, Family};
use tch::{Kind, Tensor};

use crate::error::{Error, Result};

/// The activations of `hidden_act` the runtime implements.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    Silu,
    Gelu,
    GeluTanh,
    Relu,
}

impl Activation {
    fn from_name(s: &str) -> Option<Activation> {
        match s {
            "silu" | "swish" => Some(Activation::Silu),
            "gelu" => Some(Activation::Gelu),
            "gelu_pytorch_tanh" => Some(Activation::GeluTanh),
            "relu" => Some(Activation::Relu),
            _ => None,
        }
    }
    pub(crate) fn apply(self, x: &Tensor) -> Result<Tensor> {
        Ok(match self {
            Activation::Silu => x.f_silu()?,
            Activation::Gelu => x.f_gelu("none")?,
            Activation::GeluTanh => x.f_gelu("tanh")?,
            Activation::Relu => x.f_relu()?,
        })
    }
}

/// A validated config, with every size as the model uses it.
#[derive(Clone, Debug)]
pub struct Dims {
    pub config: Config,
    pub family: Family,
    pub vocab: usize,
    pub hidden: usize,
    pub intermediate: usize,
    pub layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub rotary_dim: usize,
    pub rope_theta: f64,
    pub eps: f64,
    pub max_positions: usize,
    pub attention_bias: bool,
    pub tie_embeddings: bool,
    pub act: Activation,
    /// glm4_moe: the experts' shape and routing; `None` for a dense family.
    pub moe: Option<MoeDims>,
    /// Multi-head latent attention's sizes (glm4_moe_lite); `None` for grouped kv heads.
    /// `head_dim` and `rotary_dim` are then its `rope`.
    pub mla: Option<MlaDims>,
}

/// Multi-head latent attention's sizes: each query head has `nope + rope` channels, one
/// compressed latent of `kv_lora` channels and one rotary key of `rope` channels a token
/// are cached, and `kv_b_proj` expands the latent into each head's `nope` key and `v` value
/// channels.
#[derive(Clone, Debug)]
pub struct MlaDims {
    /// `None`: queries through one q_proj.
    pub q_lora: Option<usize>,
    pub kv_lora: usize,
    pub rope: usize,
    pub nope: usize,
    pub v: usize,
    /// Whether the rotary channels are interleaved pairs (else two halves).
    pub interleave: bool,
    /// The attention's softmax scale, `(nope + rope)^-0.5`.
    pub scale: f64,
    /// Sparse attention (glm_moe_dsa): the indexer that picks each query's keys.
    pub indexer: Option<IndexerDims>,
}

/// DeepSeek sparse attention's indexer: `heads` query heads of `dim` channels (their first
/// `rope` rotated) scored against one key of `dim` channels a token; each query attends to
/// the `topk` best-scored past tokens.
#[derive(Clone, Debug)]
pub struct IndexerDims {
    pub heads: usize,
    pub dim: usize,
    pub topk: usize,
    /// Whether each decoder layer runs its own indexer (else it reuses the previous full
    /// layer's top-k); empty: every layer does.
    pub full: Vec<bool>,
}

impl IndexerDims {
    /// Whether layer `l` runs its own indexer.
    pub fn is_full(&self, l: usize) -> bool {
        self.full.is_empty() || self.full.get(l).copied().unwrap_or(false)
    }
}

impl MlaDims {
    /// What the cache holds a token a layer: the latent and the rotary key.
    pub fn latent_width(&self) -> usize {
        self.kv_lora + self.rope
    }

    /// What the cache of layer `l` holds a token: the latent and the rotary key, and the
    /// indexer's key where the layer runs its own indexer.
    pub fn cache_width(&self, l: usize) -> usize {
        match &self.indexer {
            Some(ix) if ix.is_full(l) => self.latent_width() + ix.dim,
            _ => self.latent_width(),
        }
    }
}

/// A glm4_moe config's mixture-of-experts sizes.
#[derive(Clone, Debug)]
pub struct MoeDims {
    pub experts: usize,
    /// Width of one routed expert.
    pub width: usize,
    /// Width of the shared experts fused into one MLP (0: none).
    pub shared_width: usize,
    pub per_token: usize,
    pub groups: usize,
    pub topk_group: usize,
    /// How many layers have a dense MLP (the first ones, in glm4_moe).
    pub dense_layers: usize,
    /// Whether each decoder layer has experts, as `mlp_layer_types` lists them; empty: the
    /// layers from `dense_first` on have.
    pub sparse: Vec<bool>,
    pub dense_first: usize,
    pub norm_topk_prob: bool,
    pub scaling: f64,
    pub qk_norm: bool,
    /// Multi-token-prediction layers stored after the decoder layers (run only as a
    /// speculative decoder, see `crate::models::mtp`).
    pub mtp_layers: usize,
    /// The checkpoint stores experts fused (`mlp.experts.gate_up_proj` [E, 2I, H] and
    /// `mlp.experts.down_proj` [E, H, I], transformers 5's own layout) rather than one
    /// `mlp.experts.N.{gate,up,down}_proj.weight` each (as published).
    pub fused_experts: bool,
}

impl MoeDims {
    /// Whether layer `l` has experts. Layers past `mlp_layer_types` are multi-token-prediction
    /// layers, which always have (transformers' get_mtp_config sets first_k_dense_replace 0).
    pub fn is_moe_layer(&self, l: usize) -> bool {
        if self.sparse.is_empty() { l >= self.dense_first } else { self.sparse.get(l).copied().unwrap_or(true) }
    }
}

// Config sizes are u64 and the model's are usize: the same width on the 64-bit targets
// libtorch supports, so `as usize` below never truncates.
const _: () = assert!(usize::BITS == u64::BITS, "headcount's runtime needs a 64-bit target");

impl Dims {
    /// Validates a config (every rule) and derives the sizes. The rules keep every weight's
    /// element count (so every size below, and the products `weight_shapes` forms) within
    /// i64: the `as i64` casts of these sizes never wrap.
    pub fn new(config: &Config) -> Result<Dims> {
        config.validate()?;
        if let Some(v) = &config.vision {
            return Err(Error::Config(headcount_spec::ConfigError::Unsupported {
                field: "model_type".to_owned(),
                value: format!("{:?}", v.family.model_type()),
                reason: "headcount checks vision-language configs (`headcount check`, `declare`, `launch-args`) and runs text-only models: its layers are those of the text model alone",
            }));
        }
        // cannot fire: a valid config has a head_dim (given, or derived by rule 3).
        let hd = config.resolved_head_dim().unwrap_or(0) as usize;
        let spec = config.spec(&[], &[]);
        let sparse: Vec<bool> = config.mlp_layer_types.iter().map(|t| *t == headcount_spec::MlpLayer::Sparse).collect();
        // Without a list: glm4_moe's and glm_moe_dsa's first_k_dense_replace, glm4_moe_lite's
        // one dense layer.
        let dense_first =
            if config.family.is_mla() && !config.family.is_dsa() { 1 } else { config.first_k_dense_replace as usize };
        let act = Activation::from_name(&config.hidden_act)
            .ok_or_else(|| Error::InvalidArgument(format!("hidden_act {:?} is not implemented", config.hidden_act)))?;
        Ok(Dims {
            config: config.clone(),
            family: config.family,
            vocab: config.vocab_size as usize,
            hidden: config.hidden_size as usize,
            intermediate: config.intermediate_size as usize,
            layers: config.num_hidden_layers as usize,
            heads: config.num_attention_heads as usize,
            kv_heads: config.num_key_value_heads as usize,
            head_dim: hd,
            rotary_dim: config.rotary_dim().unwrap_or(0) as usize,
            rope_theta: config.rope_theta,
            eps: config.rms_norm_eps,
            max_positions: config.max_position_embeddings as usize,
            attention_bias: config.attention_bias,
            tie_embeddings: config.tie_word_embeddings,
            act,
            moe: config.family.is_moe().then(|| MoeDims {
                experts: config.n_routed_experts as usize,
                width: config.moe_intermediate_size as usize,
                shared_width: (config.moe_intermediate_size * config.n_shared_experts) as usize,
                per_token: config.num_experts_per_tok as usize,
                groups: config.n_group as usize,
                topk_group: config.topk_group as usize,
                dense_layers: spec.dense_layers_in(0, config.num_hidden_layers) as usize,
                sparse,
                dense_first,
                norm_topk_prob: config.norm_topk_prob,
                scaling: config.routed_scaling_factor,
                qk_norm: config.use_qk_norm,
                mtp_layers: config.num_nextn_predict_layers as usize,
                fused_experts: false,
            }),
            mla: config.family.is_mla().then(|| {
                let (nope, rope) = (config.qk_nope_head_dim as usize, config.qk_rope_head_dim as usize);
                MlaDims {
                    q_lora: config.q_lora_rank.map(|r| r as usize),
                    kv_lora: config.kv_lora_rank as usize,
                    rope,
                    nope,
                    v: config.v_head_dim as usize,
                    // glm_moe_dsa always rotates interleaved pairs (its family default).
                    interleave: config.rope_interleave,
                    scale: ((nope + rope) as f64).powf(-0.5),
                    indexer: config.family.is_dsa().then(|| IndexerDims {
                        heads: config.index_n_heads as usize,
                        dim: config.index_head_dim as usize,
                        topk: config.index_topk as usize,
                        full: config.indexer_types.iter().map(|t| *t == headcount_spec::IndexerLayer::Full).collect(),
                    }),
                }
            }),
        })
    }

    /// Every weight name of the checkpoint with its shape, in transformers' naming (by the
    /// family's description, `headcount_spec::tensors`).
    pub fn weight_shapes(&self) -> Vec<(String, Vec<i64>)> {
        let spec = self.config.spec(&[], &[]);
        let embedding = headcount_spec::tensors::embedding(&spec);
        let mut out = vec![(embedding.name.to_owned(), shape_of(&embedding))];
        for l in 0..self.layers {
            out.extend(self.layer_shapes(l));
        }
        out.extend(named("", headcount_spec::tensors::head(&spec).as_slice(), 0));
        out
    }

    /// The weights of layer `l`, named and shaped as in the checkpoint.
    pub(crate) fn layer_shapes(&self, l: usize) -> Vec<(String, Vec<i64>)> {
        let spec = self.config.spec(&[], &[]);
        let fused = self.moe.as_ref().is_some_and(|m| m.fused_experts);
        let weights = headcount_spec::tensors::layer(&spec, self.layer_kind(l), fused);
        named(&format!("model.layers.{l}."), weights.as_slice(), self.moe.as_ref().map_or(0, |m| m.experts))
    }

    /// Layer `l`'s kind as this model runs it: a multi-token-prediction layer (stored after
    /// the decoder layers) has experts and no indexer of its own.
    pub(crate) fn layer_kind(&self, l: usize) -> headcount_spec::tensors::LayerKind {
        headcount_spec::tensors::LayerKind {
            sparse: self.moe.as_ref().is_some_and(|m| m.is_moe_layer(l)),
            indexer: self.mla.as_ref().and_then(|m| m.indexer.as_ref()).is_some_and(|ix| ix.is_full(l)),
        }
    }

    /// Multi-token-prediction layers the runtime can run as a speculative decoder: those of
    /// a family whose row of spec's family table says it runs them, 0 for the others.
    pub fn mtp_layers(&self) -> usize {
        match &self.moe {
            Some(m) if self.family.runs_mtp() => m.mtp_layers,
            _ => 0,
        }
    }

    /// Multi-token-prediction layer `k`'s weights, stored as layer `layers + k` as GLM's
    /// checkpoints store them: a decoder layer with experts, then `enorm`, `hnorm`,
    /// `eh_proj` and `shared_head.norm` (transformers' `post_norm`).
    pub(crate) fn mtp_shapes(&self, k: usize) -> Vec<(String, Vec<i64>)> {
        let l = self.layers + k;
        let mut out = self.layer_shapes(l);
        let spec = self.config.spec(&[], &[]);
        out.extend(named(&format!("model.layers.{l}."), headcount_spec::tensors::mtp_head(&spec).as_slice(), 0));
        out
    }

    /// What a multi-token-prediction layer may also store and is not read: the published
    /// checkpoints' copies of the embedding and the head, which are the main model's (as
    /// transformers' MtpModel takes them).
    pub(crate) fn mtp_copies(&self, k: usize) -> Vec<(String, Vec<i64>)> {
        let spec = self.config.spec(&[], &[]);
        let copies = headcount_spec::tensors::mtp_copies(&spec);
        named(&format!("model.layers.{}.", self.layers + k), copies.as_slice(), 0)
    }

    /// Total parameters of the unsharded model, by the spec's memory plan (saturating: a
    /// layer count no checkpoint backs can make the sum exceed i64).
    pub fn parameter_count(&self) -> i64 {
        let n = headcount_spec::memory::parameter_count(&self.config.spec(&[], &[]));
        i64::try_from(n).unwrap_or(i64::MAX)
    }

    /// Bytes the weights take in `kind`, unsharded (saturating like `parameter_count`).
    pub fn weight_bytes(&self, kind: Kind) -> u64 {
        let params = u64::try_from(self.parameter_count()).unwrap_or(0); // cannot fire: a sum of products of sizes
        params.saturating_mul(kind.elt_size_in_bytes() as u64)
    }
}

/// A described weight's checkpoint shape.
fn shape_of(w: &headcount_spec::tensors::Weight) -> Vec<i64> {
    // cannot wrap: sizes of a validated config, each far below i64::MAX (rule HC1015).
    w.shape().iter().map(|&d| d as i64).collect()
}

/// Described weights named under `prefix`, one entry each, or one an expert (`*` in the
/// name) for each of `experts`.
fn named(prefix: &str, weights: &[headcount_spec::tensors::Weight], experts: usize) -> Vec<(String, Vec<i64>)> {
    let mut out = Vec::new();
    for w in weights {
        let shape = shape_of(w);
        match w.copies {
            headcount_spec::tensors::Copies::PerExpert => {
                for e in 0..experts {
                    out.push((format!("{prefix}{}", w.name.replace('*', &e.to_string())), shape.clone()));
                }
            }
            _ => out.push((format!("{prefix}{}", w.name), shape)),
        }
    }
    out
}
