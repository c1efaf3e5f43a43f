//! Structured output (`response_format` `json_object` and `json_schema`): the answer is
//! constrained, token by token, to text that parses as JSON and validates against the
//! schema, with llguidance (the grammar engine vLLM, SGLang and llama.cpp use) on the
//! checkpoint's own tokenizer. Each constrained sequence holds a matcher: before each of its
//! tokens is chosen, the tokens the grammar does not allow get a logit of -inf (after the
//! penalties), and the chosen one advances the matcher; once the JSON is complete only the
//! eos id is allowed. Unconstrained sequences in the same batch are untouched.

use std::path::Path;
use std::sync::Arc;

use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{ApproximateTokEnv, InferenceCapabilities, TokEnv, TokRxInfo, TokTrie};
use llguidance::{Matcher, ParserFactory};
use serde_json::{Value, json};
use tch::{Kind, Tensor};

/// The grammars of one checkpoint's tokenizer.
pub struct Grammars {
    factory: Arc<ParserFactory>,
    vocab: usize,
}

impl Grammars {
    /// From the tokenizer of the model `dir` names (its tokenizer.json, or a GGUF file's
    /// vocabulary), for a model of `vocab` ids whose answers end on `eos`.
    pub fn from_dir(dir: &Path, vocab: usize, eos: &[i64]) -> Result<Grammars, String> {
        let files = headcount_runtime::tokenizer_files(dir).map_err(|e| e.to_string())?;
        let path = files.origin;
        let text = files.tokenizer.ok_or_else(|| {
            format!("{} has no tokenizer.json (nor a GGUF vocabulary) to write JSON with", dir.display())
        })?;
        let json: Value = serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        let mut bytes = llguidance::token_bytes_from_tokenizer_json(&json)
            .map_err(|e| format!("structured output cannot read {}: {e}", path.display()))?;
        // The model's vocabulary may be padded past the tokenizer's: those ids write nothing.
        bytes.resize(vocab.max(bytes.len()), Vec::new());
        let eos: Vec<u32> =
            eos.iter().filter_map(|&e| u32::try_from(e).ok()).filter(|&e| (e as usize) < vocab).collect();
        let first = eos.first().copied().ok_or("structured output needs an eos id inside the vocabulary")?;
        let trie = TokTrie::from(&TokRxInfo::new(bytes.len() as u32, first), &bytes).with_eos_tokens(&eos);
        let env: TokEnv = Arc::new(ApproximateTokEnv::new(trie));
        let mut factory = ParserFactory::new(&env, InferenceCapabilities::default(), &[])
            .map_err(|e| format!("structured output: {e}"))?;
        factory.quiet();
        Ok(Grammars { factory: Arc::new(factory), vocab })
    }

    /// A matcher for answers that are JSON valid against `schema`, or why the schema is
    /// refused.
    /// JSON is written compact, as Python's `json.dumps` writes it (`, ` and `: `, no other
    /// whitespace), unless the schema's own `x-guidance` options say otherwise.
    pub fn matcher(&self, schema: &Value) -> Result<Matcher, String> {
        let mut schema = schema.clone();
        if let Some(o) = schema.as_object_mut()
            && !o.contains_key("x-guidance")
        {
            o.insert(
                "x-guidance".into(),
                json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "}),
            );
        }
        let parser = self.factory.create_parser(TopLevelGrammar::from_json_schema(schema));
        let matcher = Matcher::new(parser);
        match matcher.get_error() {
            Some(e) => Err(e),
            None => Ok(matcher),
        }
    }

    /// A matcher of text in the Lark grammar `lark`.
    pub fn lark_matcher(&self, lark: &str) -> Result<Matcher, String> {
        let matcher = Matcher::new(self.factory.create_parser(TopLevelGrammar::from_lark(lark.to_owned())));
        match matcher.get_error() {
            Some(e) => Err(e),
            None => Ok(matcher),
        }
    }

    /// The vocabulary the masks cover.
    pub fn vocab(&self) -> usize {
        self.vocab
    }
}

/// The JSON schema a request's `response_format` asks for: `None` for `{"type": "text"}`,
/// any JSON object for `json_object` (or the object's `schema` where it has one, the form
/// Together and Fireworks take), the given schema for `json_schema`; or which part of it is
/// wrong. A key the format does not have is refused, not ignored.
pub fn schema_of(format: &Value) -> Result<Option<Value>, (String, String)> {
    schema_at(format, "response_format")
}

/// [`schema_of`] of a format at `at` (`text.format` on the Responses API, whose `json_schema`
/// format holds `name` and `schema` itself).
pub fn schema_at(format: &Value, at: &str) -> Result<Option<Value>, (String, String)> {
    let bad = |key: &str, why: &str| Err((format!("{at}{key}"), format!("{at}{key} {why}")));
    let Value::Object(o) = format else { return bad("", "must be an object with a type") };
    let kind = o.get("type").and_then(Value::as_str);
    let flat = at != "response_format";
    let keys: &[&str] = match kind {
        Some("text") => &["type"],
        Some("json_object") => &["type", "schema"],
        Some("json_schema") if flat => &["type", "name", "schema", "strict", "description"],
        Some("json_schema") => &["type", "json_schema"],
        _ => return bad(".type", "must be \"text\", \"json_object\" or \"json_schema\""),
    };
    if let Some(k) = o.iter().find(|(k, v)| !v.is_null() && !keys.contains(&k.as_str())).map(|(k, _)| k) {
        return bad(
            &format!(".{k}"),
            &format!("is not read by this server: a {} format has {}", kind.unwrap_or_default(), keys.join(", ")),
        );
    }
    let schema = |v: Option<&Value>, key: &str| match v {
        Some(s @ Value::Object(_)) => Ok(Some(s.clone())),
        Some(Value::Bool(true)) => Ok(Some(json!({}))),
        _ => bad(key, "must be a JSON schema object"),
    };
    match kind {
        Some("json_object") => match o.get("schema") {
            None | Some(Value::Null) => Ok(Some(json!({"type": "object"}))),
            s => schema(s, ".schema"),
        },
        Some("json_schema") if flat => schema(o.get("schema"), ".schema"),
        Some("json_schema") => match o.get("json_schema") {
            Some(Value::Object(j)) => {
                const KEYS: [&str; 4] = ["name", "schema", "strict", "description"];
                if let Some(k) = j.iter().find(|(k, v)| !v.is_null() && !KEYS.contains(&k.as_str())).map(|(k, _)| k) {
                    return bad(
                        &format!(".json_schema.{k}"),
                        &format!("is not read by this server: json_schema has {}", KEYS.join(", ")),
                    );
                }
                schema(j.get("schema"), ".json_schema.schema")
            }
            _ => bad(".json_schema.schema", "must be a JSON schema object"),
        },
        _ => Ok(None),
    }
}

/// The Lark grammar of an answer that is one GLM tool call (in `parser`'s format, see
/// `crate::tools`) to one of `tools` (OpenAI's list), or to the one named `only`: each
/// parameter in the order the schema lists it, the required ones always, the others
/// optionally; a string parameter's value its text (its `enum`, or up to `maxLength`
/// characters other than `<`), any other a JSON value its schema validates.
pub fn tool_call_grammar(
    tools: &Value,
    only: Option<&str>,
    parser: crate::tools::ToolParser,
) -> Result<String, String> {
    let sep = if parser == crate::tools::ToolParser::Glm45 { "\n" } else { "" };
    let lit = |s: &str| Value::String(s.to_owned()).to_string();
    let mut rules = Vec::new();
    let mut calls = Vec::new();
    for (i, t) in tools.as_array().into_iter().flatten().enumerate() {
        let f = &t["function"];
        let Some(name) = f["name"].as_str() else { continue };
        if only.is_some_and(|o| o != name) {
            continue;
        }
        let props = f["parameters"]["properties"].as_object().cloned().unwrap_or_default();
        let required: Vec<&str> =
            f["parameters"]["required"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
        let mut call = vec![lit(&format!("<tool_call>{name}{sep}"))];
        for (j, (key, schema)) in props.iter().enumerate() {
            let value = format!("v_{i}_{j}");
            let body = match (schema["type"].as_str(), schema["enum"].as_array()) {
                (Some("string"), Some(options)) => {
                    options.iter().filter_map(Value::as_str).map(lit).collect::<Vec<_>>().join(" | ")
                }
                (Some("string"), None) => match schema["maxLength"].as_u64() {
                    Some(n) => format!("/[^<]{{0,{n}}}/"),
                    None => "/[^<]*/".to_owned(),
                },
                _ => format!("%json {schema}"),
            };
            rules.push(format!("{value}: {body}"));
            let arg = format!(
                "{} {value} {}",
                lit(&format!("<arg_key>{key}</arg_key>{sep}<arg_value>")),
                lit(&format!("</arg_value>{sep}"))
            );
            call.push(if required.contains(&key.as_str()) { format!("({arg})") } else { format!("({arg})?") });
        }
        call.push(lit("</tool_call>"));
        rules.push(format!("call_{i}: {}", call.join(" ")));
        calls.push(format!("call_{i}"));
    }
    if calls.is_empty() {
        return Err(match only {
            Some(o) => format!("no tool named {o:?} is among the request's tools"),
            None => "the request has no tools to call".to_owned(),
        });
    }
    Ok(format!("start: {}\n{}\n", calls.join(" | "), rules.join("\n")))
}

/// A request's grammar, as the engine masks and advances it.
pub struct Grammar(pub Matcher);

impl headcount_runtime::engine::Constraint for Grammar {
    fn mask(&mut self, vocab: usize, device: tch::Device) -> Result<Tensor, String> {
        mask(&mut self.0, vocab, device)
    }
    fn consume(&mut self, id: i64) {
        // cannot fire: the token was chosen under the grammar's mask.
        let _ = self.0.consume_token(id as u32);
    }
}

/// The additive mask (0 allowed, -inf not) of the tokens `m` allows next, `[1, vocab]` f32
/// on `device`; only the eos ids once the JSON is complete.
pub fn mask(m: &mut Matcher, vocab: usize, device: tch::Device) -> Result<Tensor, String> {
    let allowed = m.compute_mask_or_eos().map_err(|e| e.to_string())?;
    // On the host, a flag a token: expanding the mask's 32-bit words by tensor operations
    // was slower on the byte-level fixture (docs/SERVING.md).
    let row: Vec<f32> =
        (0..vocab).map(|t| if allowed.is_allowed(t as u32) { 0.0 } else { f32::NEG_INFINITY }).collect();
    let t = Tensor::f_from_slice(&row).and_then(|t| t.f_view([1, vocab as i64])).map_err(|e| e.to_string())?;
    t.f_to_device(device).and_then(|t| t.f_to_kind(Kind::Float)).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes_fixture() -> std::path::PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/glm-bytes")
    }

    #[test]
    fn response_formats_name_their_schema_or_the_field_at_fault() {
        assert_eq!(schema_of(&json!({"type": "text"})), Ok(None));
        assert_eq!(schema_of(&json!({"type": "json_object"})), Ok(Some(json!({"type": "object"}))));
        let s = json!({"type": "object", "properties": {"a": {"type": "integer"}}});
        assert_eq!(schema_of(&json!({"type": "json_schema", "json_schema": {"name": "x", "schema": s}})), Ok(Some(s)));
        assert_eq!(schema_of(&json!({"type": "xml"})).unwrap_err().0, "response_format.type");
        let missing = schema_of(&json!({"type": "json_schema", "json_schema": {"name": "x"}})).unwrap_err();
        assert_eq!(missing.0, "response_format.json_schema.schema");
        // json_object with a schema (Together's and Fireworks' form) is that schema.
        let s = json!({"type": "object", "properties": {"a": {"type": "integer"}}});
        assert_eq!(schema_of(&json!({"type": "json_object", "schema": s})), Ok(Some(s.clone())));
        assert_eq!(schema_of(&json!({"type": "json_object", "schema": 3})).unwrap_err().0, "response_format.schema");
        assert_eq!(schema_of(&json!({"type": "text", "x": 1})).unwrap_err().0, "response_format.x");
        // The Responses API's text.format holds name and schema itself.
        let flat = json!({"type": "json_schema", "name": "x", "schema": s, "strict": true});
        assert_eq!(schema_at(&flat, "text.format"), Ok(Some(s)));
    }

    /// On the byte-level fixture tokenizer: a schema's matcher allows only what can start its
    /// JSON, and walks a valid answer to the point where only eos is left.
    #[test]
    fn a_matcher_allows_exactly_the_schema_s_json() {
        let g = Grammars::from_dir(&bytes_fixture(), 260, &[2]).unwrap();
        let schema = json!({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"],
                            "additionalProperties": false});
        let mut m = g.matcher(&schema).unwrap();
        let byte = |b: u8| 4 + b as u32; // the fixture's byte ids
        let first = m.compute_mask().unwrap();
        assert!(first.is_allowed(byte(b'{')) && !first.is_allowed(byte(b'x')) && !first.is_allowed(2));
        for b in br#"{"n": 42}"# {
            assert!(m.compute_mask().unwrap().is_allowed(byte(*b)), "{}", *b as char);
            m.consume_token(byte(*b)).unwrap();
        }
        let last = m.compute_mask_or_eos().unwrap();
        assert!(last.is_allowed(2) && !last.is_allowed(byte(b'}')));
        assert!(g.matcher(&json!({"type": "no such type"})).is_err());
        // The additive mask says the same as the matcher, token by token.
        let mut m = g.matcher(&schema).unwrap();
        let row = Vec::<f32>::try_from(mask(&mut m, 260, tch::Device::Cpu).unwrap().squeeze_dim(0)).unwrap();
        let bits = g.matcher(&schema).unwrap().compute_mask().unwrap();
        for (t, &v) in row.iter().enumerate() {
            assert_eq!(v == 0.0, bits.is_allowed(t as u32), "token {t}");
        }
    }

    /// A forced tool call: the grammar of the tools' calls walks a GLM-4.5 call with its
    /// required argument and an optional one, then allows only eos.
    #[test]
    fn a_tool_call_grammar_writes_one_call_of_a_listed_tool() {
        use crate::tools::ToolParser;
        let g = Grammars::from_dir(&bytes_fixture(), 260, &[2]).unwrap();
        let tools = json!([
            {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
              "properties": {"city": {"type": "string", "maxLength": 8}, "days": {"type": "integer"}},
              "required": ["city"]}}},
            {"type": "function", "function": {"name": "now", "parameters": {"type": "object", "properties": {}}}},
        ]);
        let lark = tool_call_grammar(&tools, None, ToolParser::Glm45).unwrap();
        let mut m = g.lark_matcher(&lark).unwrap();
        let call = "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Oslo</arg_value>\n\
                    <arg_key>days</arg_key>\n<arg_value>3</arg_value>\n</tool_call>";
        for b in call.bytes() {
            assert!(m.compute_mask().unwrap().is_allowed(4 + b as u32), "{lark}\nat {:?}", b as char);
            m.consume_token(4 + b as u32).unwrap();
        }
        assert!(m.compute_mask_or_eos().unwrap().is_allowed(2));
        // The required argument cannot be left out; a named tool allows only itself.
        let mut m = g.lark_matcher(&lark).unwrap();
        for b in "<tool_call>get_weather\n".bytes() {
            m.consume_token(4 + b as u32).unwrap();
        }
        let next = m.compute_mask().unwrap();
        assert!(next.is_allowed(4 + b'<' as u32) && !next.is_allowed(4 + b'x' as u32));
        let only = tool_call_grammar(&tools, Some("now"), ToolParser::Glm47).unwrap();
        let mut m = g.lark_matcher(&only).unwrap();
        for b in "<tool_call>now</tool_call>".bytes() {
            m.consume_token(4 + b as u32).unwrap();
        }
        assert!(tool_call_grammar(&tools, Some("nope"), ToolParser::Glm45).unwrap_err().contains("nope"));
    }
}
