// HC2043, HC2044: AWQ in groups of 128 through Marlin on GLM-4.5's shape. At
// tensor_parallel 8 the shared expert's down_proj has 192 input columns a rank: not whole
// groups of 128, and not a multiple of Marlin's 128 (its routed experts' 192 neither hold
// whole groups).
#[derive(headcount::Architecture)]
#[arch(
    family = glm4_moe, engines = [vllm], quantization = awq(128), kernel = marlin,
    vocab_size = 151_552, hidden_size = 5120, intermediate_size = 12_288,
    num_hidden_layers = 92, num_attention_heads = 96, num_key_value_heads = 8, head_dim = 128,
    moe_intermediate_size = 1536, n_routed_experts = 160, n_shared_experts = 1,
    num_experts_per_tok = 8, first_k_dense_replace = 3, use_qk_norm = true,
    tensor_parallel = [1, 2, 4, 8],
)]
pub struct Glm45Awq;

// A kernel without quantized weights, and a kernel the rules do not know.
#[derive(headcount::Architecture)]
#[arch(
    engines = [vllm], kernel = marlin,
    vocab_size = 32_000, hidden_size = 256, intermediate_size = 512, num_hidden_layers = 4,
    num_attention_heads = 8, num_key_value_heads = 2, head_dim = 32,
)]
pub struct NoWeights;

#[derive(headcount::Architecture)]
#[arch(
    engines = [vllm], quantization = gptq(0), kernel = exllama,
    vocab_size = 32_000, hidden_size = 256, intermediate_size = 512, num_hidden_layers = 4,
    num_attention_heads = 8, num_key_value_heads = 2, head_dim = 32,
)]
pub struct BadKernel;

fn main() {}
