// HC2020: vLLM passes only the hidden states and the residual between pipeline stages, so a
// stage that begins on a shared indexer (layer 2 of 4 here) would read a pick it never made.
// headcount's own ranks pass the pick on: without `engines = [vllm]` this declaration builds.
#[derive(headcount::Architecture)]
#[arch(
    family = glm_moe_dsa,
    vocab_size = 64, hidden_size = 32, intermediate_size = 48, num_hidden_layers = 4,
    num_attention_heads = 4, num_key_value_heads = 4, q_lora_rank = 16,
    kv_lora_rank = 16, qk_rope_head_dim = 4, qk_nope_head_dim = 8, v_head_dim = 8,
    index_topk = 2, index_n_heads = 2, index_head_dim = 8,
    indexer_types = ["full", "shared", "shared", "full"],
    moe_intermediate_size = 16, n_routed_experts = 8, num_experts_per_tok = 2,
    pipeline_parallel = [2], engines = [vllm],
)]
pub struct TinySparse;

fn main() {}
