// Unknown keys: a near miss gets the known key suggested (and is not also reported as
// missing); an unrelated word gets the list of keys.
#[derive(headcount::Architecture)]
#[arch(
    vocab_size = 32_000, hidden_size = 256, intermediate_size = 512, num_hidden_layers = 4,
    num_attention_heads = 8, num_kv_heads = 2, head_dim = 32,
    flash_attention = true,
)]
pub struct Tiny;

fn main() {}
