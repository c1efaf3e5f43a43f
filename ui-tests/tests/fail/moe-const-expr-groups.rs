// Rule 9 on const expressions: the compiler evaluates the rule and points at the value.
const EXPERTS: usize = 16;

#[derive(headcount::Architecture)]
#[arch(
    family = glm4_moe,
    vocab_size = 32_000, hidden_size = 256, intermediate_size = 512, num_hidden_layers = 4,
    num_attention_heads = 8, num_key_value_heads = 2, head_dim = 32,
    moe_intermediate_size = 128, n_routed_experts = EXPERTS, num_experts_per_tok = 4,
    n_group = EXPERTS / 3, topk_group = 1,
)]
pub struct TinyMoe;

fn main() {}
