// A config.json whose layout breaks the rules (heads 7, kv 2; eos id out of vocab): the
// rule messages, at the path. A key written in the attribute overrides the file, and its
// errors point at it.
#[derive(headcount::Architecture)]
#[arch(from_config = "configs/bad-layout.json")]
pub struct FromFile;

#[derive(headcount::Architecture)]
#[arch(from_config = "configs/good.json", num_key_value_heads = 3)]
pub struct Overridden;

fn main() {}
