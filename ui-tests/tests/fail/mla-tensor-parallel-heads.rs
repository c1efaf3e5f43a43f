// Rule 6 under latent attention: the query heads bound tp (kv heads do not: the latent is
// on every rank), and so do the MLP and expert widths.
#[derive(headcount::Architecture)]
#[arch(
    family = glm4_moe_lite,
    vocab_size = 154_880, hidden_size = 2048, intermediate_size = 10_240,
    num_hidden_layers = 47, num_attention_heads = 20, num_key_value_heads = 20,
    kv_lora_rank = 512, qk_rope_head_dim = 64, qk_nope_head_dim = 192, v_head_dim = 256,
    moe_intermediate_size = 1536, n_routed_experts = 64, num_experts_per_tok = 4,
    tensor_parallel = [5, 8],
)]
pub struct Glm47Flash;

fn main() {}
