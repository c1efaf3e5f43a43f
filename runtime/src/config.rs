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
        // cannot fire: a valid config has a head_dim (given, or derived by rule 3).
        let hd = config.resolved_head_dim().unwrap_or(0) as usize;
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
        })
    }

    /// Every weight name of the checkpoint with its shape, in transformers' naming.
    pub fn weight_shapes(&self) -> Vec<(String, Vec<i64>)> {
        let mut out = vec![("model.embed_tokens.weight".to_owned(), vec![self.vocab as i64, self.hidden as i64])];
        for l in 0..self.layers {
            out.extend(self.layer_shapes(l));
        }
        out.extend(self.head_shapes());
        out
    }

    /// The weights of layer `l`, named and shaped as in the checkpoint.
    pub(crate) fn layer_shapes(&self, l: usize) -> Vec<(String, Vec<i64>)> {
        let (h, i) = (self.hidden as i64, self.intermediate as i64);
        let q = (self.heads * self.head_dim) as i64;
        let kv = (self.kv_heads * self.head_dim) as i64;
        let mut out = Vec::new();
        let p = format!("model.layers.{l}");
        out.push((format!("{p}.input_layernorm.weight"), vec![h]));
        out.push((format!("{p}.self_attn.q_proj.weight"), vec![q, h]));
        out.push((format!("{p}.self_attn.k_proj.weight"), vec![kv, h]));
        out.push((format!("{p}.self_attn.v_proj.weight"), vec![kv, h]));
        if self.attention_bias {
            out.push((format!("{p}.self_attn.q_proj.bias"), vec![q]));
            out.push((format!("{p}.self_attn.k_proj.bias"), vec![kv]));
            out.push((format!("{p}.self_attn.v_proj.bias"), vec![kv]));
        }
        out.push((format!("{p}.self_attn.o_proj.weight"), vec![h, q]));
        out.push((format!("{p}.post_attention_layernorm.weight"), vec![h]));
        if self.family == Family::Glm4 {
            out.push((format!("{p}.post_self_attn_layernorm.weight"), vec![h]));
            out.push((format!("{p}.post_mlp_layernorm.weight"), vec![h]));
        }
        out.push((format!("{p}.mlp.gate_up_proj.weight"), vec![2 * i, h]));
        out.push((format!("{p}.mlp.down_proj.weight"), vec![h, i]));
        out
    }

    /// The weights after the last layer: the final norm and an untied lm_head.
    pub(crate) fn head_shapes(&self) -> Vec<(String, Vec<i64>)> {
        let (h, v) = (self.hidden as i64, self.vocab as i64);
        let mut out = vec![("model.norm.weight".to_owned(), vec![h])];
        if !self.tie_embeddings {
            out.push(("lm_head.weight".to_owned(), vec![v, h]));
        }
        out
    }

    /// Total parameters of the unsharded model, counted per layer times the layer count,
    /// so an absurd `num_hidden_layers` costs no list of its weights (saturating: a layer
    /// count no checkpoint backs can make the sum exceed i64).
    pub fn parameter_count(&self) -> i64 {
        let count = |shapes: Vec<(String, Vec<i64>)>| {
            shapes.iter().map(|(_, s)| s.iter().product::<i64>()).fold(0, i64::saturating_add)
        };
        let embedding = (self.vocab as i64).saturating_mul(self.hidden as i64);
        let layers = i64::try_from(self.layers).unwrap_or(i64::MAX);
        embedding
            .saturating_add(count(self.layer_shapes(0)).saturating_mul(layers))
            .saturating_add(count(self.head_shapes()))
    }

    /// Bytes the weights take in `kind`, unsharded (saturating like `parameter_count`).
    pub fn weight_bytes(&self, kind: Kind) -> u64 {
        let params = u64::try_from(self.parameter_count()).unwrap_or(0); // cannot fire: a sum of products of sizes
        params.saturating_mul(kind.elt_size_in_bytes() as u64)
    }
}
