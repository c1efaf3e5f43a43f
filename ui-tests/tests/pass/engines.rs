// GLM-4.5 checked against vLLM, SGLang and Megatron-LM at every declared size, in bf16 and
// with FP8 blocks of 128, and AWQ in groups of 128 through Marlin.
use headcount::{Architecture, BlockQuant, Engine, QuantMethod, SupportsDataParallel, WeightQuant};

#[derive(headcount::Architecture)]
#[arch(
    family = glm4_moe, engines = [vllm, sglang, megatron],
    vocab_size = 151_552, hidden_size = 5120, intermediate_size = 12_288,
    num_hidden_layers = 92, num_attention_heads = 96, num_key_value_heads = 8, head_dim = 128,
    moe_intermediate_size = 1536, n_routed_experts = 160, n_shared_experts = 1,
    num_experts_per_tok = 8, first_k_dense_replace = 3, use_qk_norm = true, routed_scaling_factor = 2.5,
    tensor_parallel = [1, 2, 4, 8], pipeline_parallel = [1, 2, 4], expert_parallel = [1, 8, 16, 32],
    data_parallel = [1, 2],
)]
pub struct Glm45;

#[derive(headcount::Architecture)]
#[arch(
    family = glm4_moe, engines = [vllm, sglang], quantization = fp8_block(128, 128),
    vocab_size = 151_552, hidden_size = 5120, intermediate_size = 12_288,
    num_hidden_layers = 92, num_attention_heads = 96, num_key_value_heads = 8, head_dim = 128,
    moe_intermediate_size = 1536, n_routed_experts = 160, n_shared_experts = 1,
    num_experts_per_tok = 8, first_k_dense_replace = 3, use_qk_norm = true,
    tensor_parallel = [1, 2, 4],
)]
pub struct Glm45Fp8;

#[derive(headcount::Architecture)]
#[arch(
    family = glm4_moe, engines = [vllm, sglang], quantization = awq(128), kernel = marlin,
    vocab_size = 151_552, hidden_size = 5120, intermediate_size = 12_288,
    num_hidden_layers = 92, num_attention_heads = 96, num_key_value_heads = 8, head_dim = 128,
    moe_intermediate_size = 1536, n_routed_experts = 160, n_shared_experts = 1,
    num_experts_per_tok = 8, first_k_dense_replace = 3, use_qk_norm = true,
    tensor_parallel = [1, 2, 4],
)]
pub struct Glm45Awq;

const _: () = assert!(Glm45::ENGINES.len() == 3 && matches!(Glm45::ENGINES[2], Engine::Megatron));
const _: () = assert!(Glm45::DATA_PARALLEL.len() == 2 && Glm45::QUANTIZATION.is_none());
const _: () = assert!(matches!(Glm45Fp8::QUANTIZATION, Some(BlockQuant { n: 128, k: 128 })));
const _: () = assert!(Glm45Fp8::WEIGHT_QUANTIZATION.is_none() && Glm45Awq::QUANTIZATION.is_none());
const _: () = assert!(matches!(
    Glm45Awq::WEIGHT_QUANTIZATION,
    Some(WeightQuant { method: QuantMethod::Awq, group: 128, marlin: true })
));

fn replicas<A: SupportsDataParallel<2>>() -> u64 {
    A::DATA_PARALLEL[1]
}

fn main() {
    assert_eq!(replicas::<Glm45>(), 2);
}
