//! Writes the `#[derive(Architecture)]` declaration of a config (`headcount declare`).

use std::fmt::Write;

use crate::config::Config;
use crate::fields::{FIELDS, FieldValue};
use crate::keys;

fn float(x: f64) -> String {
    if x.is_nan() {
        "f64::NAN".to_owned()
    } else if x.is_infinite() {
        if x > 0.0 { "f64::INFINITY".to_owned() } else { "f64::NEG_INFINITY".to_owned() }
    } else {
        // Debug prints the shortest text that reads back as the same f64, always with a
        // '.' or an exponent, so it is a float literal.
        format!("{x:?}")
    }
}

/// Whether `name` can name a Rust type.
pub fn is_type_name(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        && name != "_"
}

/// The declaration of `config` as a unit struct named `name`, declaring the tensor-parallel
/// sizes the layout allows without kv replication (up to 8).
pub fn declaration(config: &Config, name: &str) -> String {
    let c = config;
    let mut s = String::new();
    let tp: Vec<u64> = {
        let spec = crate::ArchSpec { kv_replication: false, ..c.spec(&[], &[]) };
        let legal = spec.legal_tensor_parallel();
        let v: Vec<u64> = legal.as_slice().iter().copied().filter(|&t| t <= 8).collect();
        if v.is_empty() { vec![1] } else { v }
    };
    let _ = writeln!(s, "#[derive(headcount::Architecture)]");
    let _ = writeln!(s, "#[arch(");
    let _ = writeln!(s, "    {} = {},", keys::FAMILY, c.family.model_type());
    let mut kv = |k: &str, v: String| {
        let _ = writeln!(s, "    {k} = {v},");
    };
    if let Some(v) = &c.vision {
        kv(keys::VISION, v.declaration());
    }
    for f in FIELDS.iter().filter(|f| f.in_family(c.family)) {
        let Some(value) = c.get(f.key) else { continue };
        let text = match value {
            // null q_lora_rank (one q_proj) is written out: left out, the family's default stands.
            FieldValue::Absent if f.kind == crate::fields::FieldKind::Rank => "None".to_owned(),
            FieldValue::Absent => continue,
            FieldValue::Ids(ids) if ids.is_empty() => continue,
            FieldValue::Ids(ids) => {
                format!("[{}]", ids.iter().map(u64::to_string).collect::<Vec<_>>().join(", "))
            }
            FieldValue::Float(x) => float(x),
            other => other.to_string(),
        };
        kv(f.key, text);
    }
    let sizes: Vec<String> = tp.iter().map(u64::to_string).collect();
    kv(keys::TENSOR_PARALLEL, format!("[{}]", sizes.join(", ")));
    if c.family.is_moe() {
        let spec = c.spec(&[], &[]);
        let ep: Vec<String> =
            spec.legal_expert_parallel().as_slice().iter().filter(|&&e| e <= 8).map(u64::to_string).collect();
        kv(keys::EXPERT_PARALLEL, format!("[{}]", ep.join(", ")));
    }
    let _ = writeln!(s, ")]");
    let _ = writeln!(s, "pub struct {name};");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn type_names() {
        assert!(is_type_name("Glm4_9B"));
        assert!(!is_type_name("9B"));
        assert!(!is_type_name("a-b"));
        assert!(!is_type_name(""));
    }

    #[test]
    fn default_config_declares_its_legal_sizes() {
        let d = declaration(&Config::default(), "Glm4_9B");
        assert!(d.contains("num_key_value_heads = 2,"), "{d}");
        assert!(d.contains("rms_norm_eps = 1.5625e-7,"), "{d}");
        assert!(d.contains("tensor_parallel = [1, 2],"), "{d}");
        assert!(d.ends_with("pub struct Glm4_9B;\n"));
    }
}
