// HC2006 beside the model's own HC1002: SGLang and Megatron-LM refuse experts that do not
// split over the expert-parallel ranks.
#[derive(headcount::Architecture)]
#[arch(
    family = glm4_moe, engines = [megatron],
    vocab_size = 32_000, hidden_size = 256, intermediate_size = 512, num_hidden_layers = 4,
    num_attention_heads = 8, num_key_value_heads = 2, head_dim = 32,
    moe_intermediate_size = 128, n_routed_experts = 16, num_experts_per_tok = 4,
    expert_parallel = [3],
)]
pub struct TinyMoe;

fn main() {}
