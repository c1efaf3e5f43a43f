// A whole layout's axes beyond tp, pp, ep and dp, each error at the value it refuses:
// vLLM's decode context parallelism over 8 kv heads at tp 16 (HC2025), redundant experts
// without load balancing (HC2037), SGLang's MoE data parallelism (HC2036).
#[derive(headcount::Architecture)]
#[arch(
    from_config = "configs/glm-4.5.json", engines = [vllm],
    layouts = [
        layout(tensor_parallel = 16, decode_context_parallel = 4),
        layout(tensor_parallel = 8, expert_parallel = 8, redundant_experts = 8),
    ],
)]
pub struct Glm45Vllm;

#[derive(headcount::Architecture)]
#[arch(
    from_config = "configs/glm-4.5.json", engines = [sglang],
    layouts = [layout(tensor_parallel = 8, expert_parallel = 2, attention_context_parallel = 2, moe_data_parallel = 2)],
)]
pub struct Glm45Sglang;

fn main() {}
