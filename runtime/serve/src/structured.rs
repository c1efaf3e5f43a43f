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
    /// From `dir/tokenizer.json`, for a model of `vocab` ids whose answers end on `eos`.
    pub fn from_dir(dir: &Path, vocab: usize, eos: &[i64]) -> Result<Grammars, String> {
        let path = dir.join("tokenizer.json");
        let text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
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

    /// The vocabulary the masks cover.
    pub fn vocab(&self) -> usize {
        self.vocab
    }
}

/// The JSON schema a request's `response_format` asks for: `None` for `{"type": "text"}`,
/// any JSON object for `json_object`, the given schema for `json_schema`; or which part of
/// it is wrong.
pub fn schema_of(format: &Value) -> Result<Option<Value>, (String, String)> {
    let bad = |key: &str, why: &str| Err((format!("response_format{key}"), format!("response_format{key} {why}")));
    match format.get("type").and_then(Value::as_str) {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(json!({"type": "object"}))),
        Some("json_schema") => match format.get("json_schema").and_then(|j| j.get("schema")) {
            Some(s @ Value::Object(_)) => Ok(Some(s.clone())),
            Some(Value::Bool(true)) => Ok(Some(json!({}))),
            _ => bad(".json_schema.schema", "must be a JSON schema object"),
        },
        _ => bad(".type", "must be \"text\", \"json_object\" or \"json_schema\""),
    }
}

/// The additive mask (0 allowed, -inf not) of the tokens `m` allows next, `[1, vocab]` f32
/// on `device`; only the eos ids once the JSON is complete.
pub fn mask(m: &mut Matcher, vocab: usize, device: tch::Device) -> Result<Tensor, String> {
    let allowed = m.compute_mask_or_eos().map_err(|e| e.to_string())?;
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
    }
}
