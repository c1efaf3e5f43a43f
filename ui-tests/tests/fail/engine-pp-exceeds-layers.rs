// HC2013 beside the model's own HC0602: SGLang builds at least one layer a stage.
#[derive(headcount::Architecture)]
#[arch(
    engines = [sglang],
    vocab_size = 32_000, hidden_size = 256, intermediate_size = 512, num_hidden_layers = 4,
    num_attention_heads = 8, num_key_value_heads = 2, head_dim = 32,
    pipeline_parallel = [1, 5], uneven_pipeline = true,
)]
pub struct Tiny;

fn main() {}
