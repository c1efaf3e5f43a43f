// HC1402 at the tower's num_heads; HC2046, vLLM splitting GLM-4.5V's 12 vision heads over
// tensor_parallel 8 (vllm issue 24004); a config type whose text model is of another family;
// an unknown tower key; a type that is not a vision-language config.
#[derive(headcount::Architecture)]
#[arch(
    family = glm4,
    vision = glm4v(depth = 2, hidden_size = 60, num_heads = 8, intermediate_size = 128, out_hidden_size = 256),
    vocab_size = 32_000, hidden_size = 256, intermediate_size = 512, num_hidden_layers = 4,
    num_attention_heads = 8, num_key_value_heads = 2, head_dim = 32,
)]
pub struct Heads;

#[derive(headcount::Architecture)]
#[arch(from_config = "configs/glm-4.5v.json", engines = [vllm], tensor_parallel = [4, 8])]
pub struct Glm45V;

#[derive(headcount::Architecture)]
#[arch(
    family = glm4, vision = glm4v_moe(num_heads = 12),
    vocab_size = 32_000, hidden_size = 256, intermediate_size = 512, num_hidden_layers = 4,
    num_attention_heads = 8, num_key_value_heads = 2, head_dim = 32,
)]
pub struct WrongText;

#[derive(headcount::Architecture)]
#[arch(
    family = glm4, vision = glm4v(patch_size = 14),
    vocab_size = 32_000, hidden_size = 256, intermediate_size = 512, num_hidden_layers = 4,
    num_attention_heads = 8, num_key_value_heads = 2, head_dim = 32,
)]
pub struct UnknownKey;

#[derive(headcount::Architecture)]
#[arch(
    family = glm4, vision = qwen2_vl(num_heads = 12),
    vocab_size = 32_000, hidden_size = 256, intermediate_size = 512, num_hidden_layers = 4,
    num_attention_heads = 8, num_key_value_heads = 2, head_dim = 32,
)]
pub struct NotVision;

fn main() {}
