// HC2015-HC2018: FP8 blocks of 128 need 128 rows and columns a rank: GLM-4.5's 1536-wide
// experts leave 192 at tensor_parallel 8 (GLM-4.7 FP8 on SGLang at TP 32 leaves 48).
#[derive(headcount::Architecture)]
#[arch(
    family = glm4_moe, engines = [sglang], quantization = fp8_block(128, 128),
    vocab_size = 151_552, hidden_size = 5120, intermediate_size = 12_288,
    num_hidden_layers = 92, num_attention_heads = 96, num_key_value_heads = 8, head_dim = 128,
    moe_intermediate_size = 1536, n_routed_experts = 160, n_shared_experts = 1,
    num_experts_per_tok = 8, first_k_dense_replace = 3, use_qk_norm = true,
    tensor_parallel = [1, 2, 4, 8],
)]
pub struct Glm45Fp8;

fn main() {}
