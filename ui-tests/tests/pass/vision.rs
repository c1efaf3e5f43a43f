// Vision-language declarations: GLM-4.5V read from its config.json (the tower with it), and
// a tower declared in the attribute, checked against vLLM with the tower split (tp 1, 2, 4)
// and run data-parallel (tp 8).
use headcount::{Architecture, Family, VisionFamily, VisionSpec};

#[derive(headcount::Architecture)]
#[arch(from_config = "configs/glm-4.5v.json", engines = [vllm, sglang], tensor_parallel = [1, 2, 4])]
pub struct Glm45V;

#[derive(headcount::Architecture)]
#[arch(
    family = glm4, engines = [vllm],
    vision = glm4v(depth = 24, hidden_size = 1536, num_heads = 12, intermediate_size = 13_696, out_hidden_size = 4096),
    vocab_size = 151_552, hidden_size = 4096, intermediate_size = 13_696, num_hidden_layers = 40,
    num_attention_heads = 32, num_key_value_heads = 2, kv_replication, tensor_parallel = [1, 2, 4],
    layouts = [layout(tensor_parallel = 8, mm_encoder_data_parallel)],
)]
pub struct Glm41V;

const _: () = assert!(matches!(Glm45V::FAMILY, Family::Glm4Moe));
const _: () = assert!(matches!(Glm45V::VISION_FAMILY, Some(VisionFamily::Glm4vMoe)));
const _: () = assert!(matches!(Glm45V::VISION, Some(VisionSpec { num_heads: 12, intermediate_size: 10_944, .. })));
const _: () = assert!(matches!(Glm41V::VISION, Some(VisionSpec { depth: 24, out_hidden_size: 4096, .. })));
const _: () = assert!(Glm41V::LAYOUTS.len() == 1 && Glm41V::LAYOUTS[0].mm_encoder_dp);

fn main() {
    let c = Glm45V::config();
    assert_eq!(c.vision.as_ref().map(|v| v.family), Some(VisionFamily::Glm4vMoe));
    assert!(Glm41V::config().vision.is_some());
}
