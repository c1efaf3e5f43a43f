// from_config is read at compile time, relative to the crate root.
#[derive(headcount::Architecture)]
#[arch(from_config = "configs/no-such-config.json")]
pub struct FromFile;

fn main() {}
