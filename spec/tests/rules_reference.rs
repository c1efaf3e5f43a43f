//! docs/RULES.md is generated from `headcount_spec::reference::RULES`: each example must
//! fail with exactly its own code, each fix must pass, every code is listed once, and the
//! committed file must be what the table renders (`HEADCOUNT_BLESS=1` rewrites it).

use headcount_spec::reference::{self, DECLARATION_ONLY, RULES, RuleDoc};
use headcount_spec::{Config, LayoutError, rules};

/// The layout of `keys` (declaration syntax) as the rules see a declaration of it.
fn errors_of(keys: &[(&str, &str)]) -> Vec<LayoutError> {
    let plain = |v: &str| v.replace('_', "");
    let mut json = serde_json::Map::new();
    let (mut tp, mut pp, mut ep) = (Vec::new(), Vec::new(), Vec::new());
    let (mut replication, mut padding, mut uneven) = (false, 1u64, false);
    let mut vision: Option<(String, serde_json::Map<String, serde_json::Value>)> = None;
    let list = |v: &str| -> Vec<u64> { serde_json::from_str(&plain(v)).expect("a list of sizes") };
    for &(k, v) in keys {
        match k {
            "family" => {
                json.insert("model_type".into(), v.into());
            }
            "tensor_parallel" => tp = list(v),
            "pipeline_parallel" => pp = list(v),
            "expert_parallel" => ep = list(v),
            "kv_replication" => replication = v == "true",
            "vocab_padding" => padding = plain(v).parse().unwrap(),
            "uneven_pipeline" => uneven = v == "true",
            // `vision = glm4v(depth = 2, ..)`: config.json's model_type and vision_config.
            "vision" => {
                let (name, args) = v.trim_end_matches(')').split_once('(').expect("type(args)");
                let tower = args
                    .split(", ")
                    .map(|a| a.split_once(" = ").expect("key = value"))
                    .map(|(k, n)| (k.to_owned(), serde_json::from_str(&plain(n)).unwrap()))
                    .collect();
                vision = Some((name.to_owned(), tower));
            }
            // `None` in a declaration (no low-rank queries) is config.json's null.
            _ if v == "None" => {
                json.insert(k.into(), serde_json::Value::Null);
            }
            _ if v.starts_with('"') => {
                json.insert(k.into(), serde_json::from_str(v).unwrap());
            }
            _ => {
                json.insert(k.into(), serde_json::from_str(&plain(v)).unwrap_or_else(|e| panic!("{k} = {v}: {e}")));
            }
        }
    }
    assert!(DECLARATION_ONLY.iter().all(|k| !json.contains_key(*k)));
    let json = match vision {
        None => json,
        Some((name, tower)) => {
            let text = match json.get("model_type").and_then(|t| t.as_str()) {
                Some("glm4_moe") => "glm4v_moe_text",
                _ => "glm4v_text",
            };
            json.insert("model_type".into(), text.into());
            let mut outer = serde_json::Map::new();
            outer.insert("model_type".into(), name.into());
            outer.insert("text_config".into(), serde_json::Value::Object(json));
            outer.insert("vision_config".into(), serde_json::Value::Object(tower));
            outer
        }
    };
    let config = Config::from_value(serde_json::Value::Object(json)).expect("a readable config");
    let spec = headcount_spec::ArchSpec {
        expert_parallel: &ep,
        kv_replication: replication,
        vocab_padding: padding,
        uneven_pipeline: uneven,
        ..config.spec(&tp, &pp)
    };
    rules::validate(&spec).to_vec()
}

fn render(doc: &RuleDoc, message: &str) -> String {
    let failing = reference::with_changes(doc.failing);
    let fixed = reference::with_changes(doc.fix);
    let changed = |keys: &[(&str, &str)]| keys.iter().map(|(k, v)| format!("`{k} = {v}`")).collect::<Vec<_>>();
    format!(
        "## {code}: {title}\n\nRule {rule}. Must hold: {condition}.\n\nFails ({failing}):\n\n```rust,ignore\n{decl}```\n\n```text\nerror: {message}\n```\n\nFixed ({fix}):\n\n```rust,ignore\n{fixed_decl}```\n\n",
        code = doc.code,
        title = doc.title,
        rule = doc.rule,
        condition = doc.condition,
        failing = changed(doc.failing).join(", "),
        decl = reference::declaration(&failing, "Broken"),
        fix = changed(doc.fix).join(", "),
        fixed_decl = reference::declaration(&fixed, "Fixed"),
    )
}

#[test]
fn the_rules_reference_is_current_and_each_example_shows_its_rule() {
    let mut codes: Vec<&str> = RULES.iter().map(|r| r.code).collect();
    codes.sort();
    codes.dedup();
    assert_eq!(codes.len(), RULES.len(), "a code is listed twice");
    assert_eq!(RULES.len(), 40, "every model rule has one entry (engine and memory rules: docs/ENGINES.md)");
    let mut doc = String::from(
        "# The rules\n\nGenerated from `spec/src/reference.rs` by `spec/tests/rules_reference.rs` (run with\n\
         `HEADCOUNT_BLESS=1` to rewrite); every example below is checked to fail with its own code and\n\
         every fix to pass. Codes never change meaning; messages may improve. A declaration's error\n\
         reads `error: [HC0102] ...`, `Config::validate`'s lists `[HC0102] ...`, and\n\
         `headcount check` prints `error[HC0102]: ...`. Each example changes the keys named from\n\
         this declaration:\n\n```rust,ignore\n",
    );
    doc.push_str(&reference::declaration(reference::BASE, "Base"));
    doc.push_str("```\n\n");
    for r in RULES {
        let failing = errors_of(&reference::with_changes(r.failing));
        let got: Vec<&str> = failing.iter().map(LayoutError::code).collect();
        assert_eq!(got, vec![r.code], "{}: the example gives {failing:?}", r.code);
        let fixed = errors_of(&reference::with_changes(r.fix));
        assert!(fixed.is_empty(), "{}: the fix still fails: {fixed:?}", r.code);
        doc.push_str(&render(r, &failing[0].to_string()));
    }
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/RULES.md");
    if std::env::var_os("HEADCOUNT_BLESS").is_some() {
        std::fs::write(&path, &doc).unwrap();
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(committed == doc, "docs/RULES.md is out of date: run HEADCOUNT_BLESS=1 cargo test -p headcount-spec");
}
