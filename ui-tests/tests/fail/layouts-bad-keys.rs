// A layout key that does not exist, a switch given a number, an axis no engine listed has,
// and layouts with no engine to check them against.
#[derive(headcount::Architecture)]
#[arch(
    from_config = "configs/glm-4.5.json", engines = [vllm],
    layouts = [layout(tensor_parallel = 8, context_paralel = 2), layout(tensor_parallel = 8, sequence_parallel = 2)],
)]
pub struct Misspelt;

#[derive(headcount::Architecture)]
#[arch(from_config = "configs/glm-4.5.json", engines = [vllm], layouts = [layout(tensor_parallel = 8, context_parallel = 2)])]
pub struct NoSuchAxis;

#[derive(headcount::Architecture)]
#[arch(from_config = "configs/glm-4.5.json", layouts = [layout(tensor_parallel = 8)])]
pub struct NoEngines;

fn main() {}
