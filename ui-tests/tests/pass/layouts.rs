// Whole layouts beyond tp, pp, ep and dp, each checked as one against every engine listed.
use headcount::Architecture;

#[derive(headcount::Architecture)]
#[arch(
    from_config = "configs/glm-4.5.json", engines = [vllm],
    layouts = [
        layout(tensor_parallel = 16, decode_context_parallel = 2),
        layout(tensor_parallel = 8, expert_parallel = 8, eplb, redundant_experts = 8),
    ],
)]
pub struct Glm45Vllm;

#[derive(headcount::Architecture)]
#[arch(
    from_config = "configs/glm-4.5.json", engines = [megatron],
    layouts = [layout(tensor_parallel = 8, pipeline_parallel = 2, virtual_pipeline_parallel = 2,
                      context_parallel = 2, sequence_parallel, seq_length = 4096,
                      expert_parallel = 8, expert_tensor_parallel = 1)],
)]
pub struct Glm45Megatron;

const _: () = assert!(Glm45Vllm::LAYOUTS.len() == 2 && Glm45Vllm::LAYOUTS[0].dcp == 2);
const _: () = assert!(Glm45Vllm::LAYOUTS[1].eplb && Glm45Vllm::LAYOUTS[1].redundant == 8);
const _: () = assert!(Glm45Megatron::LAYOUTS[0].sp && matches!(Glm45Megatron::LAYOUTS[0].etp, Some(1)));

fn main() {}
