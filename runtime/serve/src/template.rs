//! Chat templates: a checkpoint's Jinja `chat_template` rendered as transformers'
//! `apply_chat_template` renders it, with minijinja.
//!
//! transformers renders in a sandboxed jinja2 environment with `trim_blocks` and
//! `lstrip_blocks` on, loop controls (`break`, `continue`), a `tojson` filter that is
//! Python's `json.dumps` (non-ASCII kept by default), the globals `raise_exception` and
//! `strftime_now`, the special tokens of tokenizer_config.json (`bos_token`, `eos_token`, ...)
//! as strings, and Python's string and dict methods (minijinja-contrib's pycompat). The
//! rendered text is then tokenized without adding special tokens: the template writes them.

use std::collections::BTreeMap;
use std::path::Path;

use minijinja::value::{Kwargs, Value, ValueKind};
use minijinja::{Environment, Error, ErrorKind};

/// The names transformers passes the special tokens of tokenizer_config.json under.
const SPECIAL_TOKENS: [&str; 7] =
    ["bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token", "mask_token"];

/// A chat template ready to render.
pub struct ChatTemplate {
    env: Environment<'static>,
    specials: BTreeMap<String, String>,
    source: String,
}

impl ChatTemplate {
    /// The template of the checkpoint in `dir`: `chat_template.jinja`, else
    /// tokenizer_config.json's `chat_template` (a string, or a list of named templates, the
    /// one named `default` taken), else a GGUF model's `tokenizer.chat_template` with its
    /// special tokens; `None` when it has none.
    pub fn from_dir(dir: &Path) -> Result<Option<ChatTemplate>, String> {
        let files = headcount_runtime::tokenizer_files(dir).map_err(|e| e.to_string())?;
        let (config, config_path) = (files.config, files.origin.with_file_name("tokenizer_config.json"));
        let source = if let Some(jinja) = files.chat_template {
            jinja
        } else {
            match config.get("chat_template") {
                None | Some(serde_json::Value::Null) => return Ok(None),
                Some(serde_json::Value::String(s)) => s.clone(),
                Some(serde_json::Value::Array(named)) => named
                    .iter()
                    .find(|t| t.get("name").and_then(|n| n.as_str()) == Some("default"))
                    .and_then(|t| t.get("template")?.as_str().map(str::to_owned))
                    .ok_or_else(|| {
                        format!("{}: chat_template has no template named \"default\"", config_path.display())
                    })?,
                Some(_) => {
                    return Err(format!("{}: chat_template is neither a string nor a list", config_path.display()));
                }
            }
        };
        let mut specials = BTreeMap::new();
        for name in SPECIAL_TOKENS {
            let token = match config.get(name) {
                Some(serde_json::Value::String(s)) => Some(s.clone()),
                Some(serde_json::Value::Object(o)) => o.get("content").and_then(|c| c.as_str()).map(str::to_owned),
                _ => None,
            };
            if let Some(t) = token {
                specials.insert(name.to_owned(), t);
            }
        }
        ChatTemplate::new(source, specials).map(Some)
    }

    /// A template from its source and the special tokens it is given.
    pub fn new(source: String, specials: BTreeMap<String, String>) -> Result<ChatTemplate, String> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_filter("tojson", tojson);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_template_owned("chat", source.clone())
            .map_err(|e| format!("the chat template does not parse: {e:#}"))?;
        Ok(ChatTemplate { env, specials, source })
    }

    /// The template's Jinja source.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The prompt text of a conversation (`messages`, and `tools` when given, as the
    /// request's JSON), ending with the assistant's turn when `add_generation_prompt`.
    pub fn render(
        &self,
        messages: &Value,
        tools: Option<&Value>,
        add_generation_prompt: bool,
        extra: &BTreeMap<String, Value>,
    ) -> Result<String, String> {
        let template = self.env.get_template("chat").map_err(|e| e.to_string())?;
        let mut ctx: BTreeMap<String, Value> = extra.clone();
        for (k, v) in &self.specials {
            ctx.insert(k.clone(), Value::from(v.as_str()));
        }
        ctx.insert("messages".into(), messages.clone());
        ctx.insert("add_generation_prompt".into(), Value::from(add_generation_prompt));
        if let Some(t) = tools {
            ctx.insert("tools".into(), t.clone());
        }
        template.render(Value::from_serialize(&ctx)).map_err(|e| {
            // raise_exception's message is the template's own words.
            if e.kind() == ErrorKind::InvalidOperation && e.detail().is_some() {
                format!("the chat template refused the conversation: {}", e.detail().unwrap_or_default())
            } else {
                format!("the chat template failed: {e:#}")
            }
        })
    }
}

fn raise_exception(msg: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, msg))
}

/// The local time formatted with C's strftime, as Python's `datetime.now().strftime`.
fn strftime_now(format: String) -> Result<Value, Error> {
    let bad = || Error::new(ErrorKind::InvalidOperation, "strftime_now: the format cannot be used");
    let c = std::ffi::CString::new(format).map_err(|_| bad())?;
    // SAFETY: time and localtime_r write only the values given; strftime writes at most
    // buf.len() bytes and returns how many it wrote.
    unsafe {
        let now = libc::time(std::ptr::null_mut());
        let mut tm: libc::tm = std::mem::zeroed();
        if libc::localtime_r(&now, &mut tm).is_null() {
            return Err(bad());
        }
        let mut buf = vec![0u8; 256];
        let n = libc::strftime(buf.as_mut_ptr().cast(), buf.len(), c.as_ptr(), &tm);
        buf.truncate(n);
        String::from_utf8(buf).map(Value::from).map_err(|_| bad())
    }
}

/// Python's `json.dumps(value, ensure_ascii=False, indent=None, sort_keys=False)` and those
/// keyword arguments, as transformers' `tojson` filter.
fn tojson(value: Value, kwargs: Kwargs) -> Result<Value, Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    let ensure_ascii: Option<bool> = kwargs.get("ensure_ascii")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    kwargs.assert_all_used()?;
    let opts = Dump { indent, ascii: ensure_ascii.unwrap_or(false), sort: sort_keys.unwrap_or(false) };
    let mut out = String::new();
    opts.value(&value, 0, &mut out)?;
    Ok(Value::from_safe_string(out))
}

struct Dump {
    indent: Option<usize>,
    ascii: bool,
    sort: bool,
}

impl Dump {
    fn value(&self, v: &Value, depth: usize, out: &mut String) -> Result<(), Error> {
        match v.kind() {
            ValueKind::Undefined | ValueKind::None => out.push_str("null"),
            ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
            ValueKind::Number => out.push_str(&python_number(v)),
            ValueKind::String | ValueKind::Bytes => self.string(v.as_str().unwrap_or_default(), out),
            ValueKind::Seq | ValueKind::Iterable => {
                let items: Vec<Value> = v.try_iter()?.collect();
                self.open_close('[', ']', items.len(), depth, out, |i, d, out| self.value(&items[i], d, out))?;
            }
            ValueKind::Map => {
                let mut keys: Vec<Value> = v.try_iter()?.collect();
                if self.sort {
                    keys.sort();
                }
                self.open_close('{', '}', keys.len(), depth, out, |i, d, out| {
                    let k = &keys[i];
                    match k.as_str() {
                        Some(s) => self.string(s, out),
                        None => self.string(&k.to_string(), out),
                    }
                    out.push_str(": ");
                    self.value(&v.get_item(k)?, d, out)
                })?;
            }
            _ => {
                return Err(Error::new(ErrorKind::InvalidOperation, format!("tojson: cannot write a {}", v.kind())));
            }
        }
        Ok(())
    }

    /// `[a, b]`, or with an indent one item a line.
    fn open_close(
        &self,
        open: char,
        close: char,
        n: usize,
        depth: usize,
        out: &mut String,
        mut item: impl FnMut(usize, usize, &mut String) -> Result<(), Error>,
    ) -> Result<(), Error> {
        out.push(open);
        if n == 0 {
            out.push(close);
            return Ok(());
        }
        for i in 0..n {
            match self.indent {
                Some(w) => {
                    out.push_str(if i == 0 { "\n" } else { ",\n" });
                    out.push_str(&" ".repeat(w * (depth + 1)));
                }
                None if i > 0 => out.push_str(", "),
                None => {}
            }
            item(i, depth + 1, out)?;
        }
        if let Some(w) = self.indent {
            out.push('\n');
            out.push_str(&" ".repeat(w * depth));
        }
        out.push(close);
        Ok(())
    }

    fn string(&self, s: &str, out: &mut String) {
        out.push('"');
        for c in s.chars() {
            match c {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                '\n' => out.push_str("\\n"),
                '\r' => out.push_str("\\r"),
                '\t' => out.push_str("\\t"),
                '\u{08}' => out.push_str("\\b"),
                '\u{0c}' => out.push_str("\\f"),
                c if (c as u32) < 0x20 || (self.ascii && (c as u32) > 0x7e) => {
                    let mut units = [0u16; 2];
                    for u in c.encode_utf16(&mut units) {
                        out.push_str(&format!("\\u{u:04x}"));
                    }
                }
                c => out.push(c),
            }
        }
        out.push('"');
    }
}

/// A number as Python's `json.dumps` writes it: integers as they are, floats as `repr`
/// (`1.0`, `0.1`, `1e+16`).
fn python_number(v: &Value) -> String {
    if v.is_integer() {
        return v.to_string();
    }
    let f = f64::try_from(v.clone()).unwrap_or(f64::NAN);
    if f.is_nan() {
        return "NaN".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "Infinity".into() } else { "-Infinity".into() };
    }
    let a = f.abs();
    if a != 0.0 && !(1e-4..1e16).contains(&a) {
        // Rust writes 1e16 as "1e16"; Python as "1e+16".
        let s = format!("{f:e}");
        return match s.split_once('e') {
            Some((m, e)) if !e.starts_with('-') => format!("{m}e+{e:0>2}"),
            Some((m, e)) => format!("{m}e-{:0>2}", &e[1..]),
            None => s,
        };
    }
    let s = format!("{f}");
    if s.contains('.') { s } else { format!("{s}.0") }
}
