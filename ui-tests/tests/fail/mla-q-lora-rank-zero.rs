// Rule 1: transformers builds and runs a query projection of rank 0 (every query zero).
#[derive(headcount::Architecture)]
#[arch(
    family = glm4_moe_lite,
    vocab_size = 64, hidden_size = 32, intermediate_size = 48, num_hidden_layers = 2,
    num_attention_heads = 4, num_key_value_heads = 4, q_lora_rank = 0,
    kv_lora_rank = 16, qk_rope_head_dim = 4, qk_nope_head_dim = 8, v_head_dim = 8,
    moe_intermediate_size = 16, n_routed_experts = 8, num_experts_per_tok = 2,
)]
pub struct TinyLatent;

fn main() {}
