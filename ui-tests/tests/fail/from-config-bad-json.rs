// A config.json that is not JSON.
#[derive(headcount::Architecture)]
#[arch(from_config = "configs/bad-json.json")]
pub struct FromFile;

fn main() {}
