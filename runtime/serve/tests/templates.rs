//! Chat templates render exactly as transformers renders them: every conversation of
//! tests/fixtures/chat-templates/references.json (python/make_chat_references.py), through the
//! addition demo's template and a template of GLM-4's chat format, including a system
//! message, several turns, tools through tojson and a template's raise_exception.

use std::collections::BTreeMap;
use std::path::PathBuf;

use headcount_serve::template::ChatTemplate;
use minijinja::Value;

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/chat-templates")
}

fn template_source(name: &str) -> String {
    match name {
        "glm4-format" => std::fs::read_to_string(fixtures().join("glm4-format.jinja")).unwrap(),
        "addition-demo" => {
            let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples/addition/model");
            let cfg: serde_json::Value =
                serde_json::from_str(&std::fs::read_to_string(dir.join("tokenizer_config.json")).unwrap()).unwrap();
            cfg["chat_template"].as_str().unwrap().to_owned()
        }
        other => panic!("unknown template {other}"),
    }
}

#[test]
fn templates_render_as_transformers_renders_them() {
    let text = std::fs::read_to_string(fixtures().join("references.json")).unwrap();
    // Read as template values straight from the JSON, keys in their order (as Python's dicts).
    let cases: Value = serde_json::from_str(&text).unwrap();
    let mut checked = 0;
    for case in cases.try_iter().unwrap() {
        let name = case.get_attr("template").unwrap().to_string();
        let specials: BTreeMap<String, String> = case
            .get_attr("specials")
            .unwrap()
            .try_iter()
            .unwrap()
            .map(|k| {
                let v = case.get_attr("specials").unwrap().get_item(&k).unwrap().to_string();
                (k.to_string(), v)
            })
            .collect();
        let t = ChatTemplate::new(template_source(&name), specials).unwrap();
        let messages = case.get_attr("messages").unwrap();
        let tools = case.get_attr("tools").unwrap();
        let tools = (!tools.is_none()).then_some(tools);
        let add_prompt = case.get_attr("add_generation_prompt").unwrap().is_true();
        let ours = t.render(&messages, tools.as_ref(), add_prompt, &BTreeMap::new());
        let expected = case.get_attr("rendered").unwrap();
        if expected.is_undefined() {
            let msg = case.get_attr("error").unwrap().to_string();
            let err = ours.expect_err("the template refuses this conversation");
            assert!(err.contains(&msg), "{name}: {err:?} should carry the template's message {msg:?}");
        } else {
            assert_eq!(ours.unwrap(), expected.to_string(), "{name}: {messages}");
        }
        checked += 1;
    }
    assert!(checked >= 12, "{checked} cases");
}

#[test]
fn tojson_writes_what_pythons_json_dumps_writes() {
    let src = "{{ v | tojson }}|{{ v | tojson(indent=2) }}|{{ s | tojson(ensure_ascii=True) }}|{{ v | tojson(sort_keys=True) }}";
    let t = ChatTemplate::new(src.to_owned(), BTreeMap::new()).unwrap();
    let v: Value = serde_json::from_str(r#"{"b": [1, 2.5, 1.0, true, null], "a": {}, "c": []}"#).unwrap();
    let msgs = Value::from_serialize(serde_json::json!([]));
    let mut extra = BTreeMap::new();
    extra.insert("v".to_owned(), v);
    extra.insert("s".to_owned(), Value::from("Zürich \"q\"\n"));
    let out = t.render(&msgs, None, false, &extra).unwrap();
    let expected = concat!(
        r#"{"b": [1, 2.5, 1.0, true, null], "a": {}, "c": []}|"#,
        "{\n  \"b\": [\n    1,\n    2.5,\n    1.0,\n    true,\n    null\n  ],\n  \"a\": {},\n  \"c\": []\n}|",
        r#""Z\u00fcrich \"q\"\n"|"#,
        r#"{"a": {}, "b": [1, 2.5, 1.0, true, null], "c": []}"#
    );
    assert_eq!(out, expected);
}
