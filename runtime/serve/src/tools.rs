//! GLM's tool calls in a chat answer (`--tool-call-parser glm45|glm47`): each call is
//! `<tool_call>NAME`, then `<arg_key>K</arg_key>` `<arg_value>V</arg_value>` pairs, then
//! `</tool_call>`. GLM-4.5 and 4.6 put a newline after the name and after each tag; GLM-4.7
//! writes the name and the first `<arg_key>` together. Both are read here: the name ends at a
//! newline or the first tag, and whitespace between tags is skipped. The text outside calls
//! is the answer's content.
//!
//! Each call becomes OpenAI's `tool_calls` entry with JSON `arguments`, every value typed by
//! the tool's JSON schema: a parameter the schema says is a string keeps the text as
//! written, any other is read as JSON where it is JSON (a number stays a number), else kept
//! as text. Text arrives in pieces: a call's name goes out once it is complete, then each
//! argument once its value is closed, so a stream sends the name first and the arguments as
//! they arrive; a tail that could still begin a tag is held back.

use serde_json::{Map, Value};

const OPEN: &str = "<tool_call>";
const CLOSE: &str = "</tool_call>";
const KEY: &str = "<arg_key>";
const KEY_END: &str = "</arg_key>";
const VALUE: &str = "<arg_value>";
const VALUE_END: &str = "</arg_value>";

/// The tool-call formats `headcount serve` reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ToolParser {
    /// GLM-4.5 and 4.6: a newline after the name and between the tags.
    Glm45,
    /// GLM-4.7: the name and the first `<arg_key>` together.
    Glm47,
}

impl ToolParser {
    /// The format a chat template writes its assistant's tool calls in: GLM-4.7's where a
    /// call's name runs into `<arg_key>`, else GLM-4.5's; `None` for a template that writes
    /// no `<arg_key>`.
    pub fn of_template(source: &str) -> Option<ToolParser> {
        if !source.contains(KEY) {
            return None;
        }
        Some(if source.contains("}}<arg_key>") || source.contains("}}{{ '<arg_key>") {
            ToolParser::Glm47
        } else {
            ToolParser::Glm45
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            ToolParser::Glm45 => "glm45",
            ToolParser::Glm47 => "glm47",
        }
    }
}

/// `--tool-call-parser`: a format, or the one the chat template writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ToolParserChoice {
    Named(ToolParser),
    Auto,
}

impl ToolParserChoice {
    /// The parser for a checkpoint whose chat template is `template` (its source).
    pub fn resolve(self, template: Option<&str>) -> Result<ToolParser, String> {
        match self {
            ToolParserChoice::Named(p) => Ok(p),
            ToolParserChoice::Auto => template.and_then(ToolParser::of_template).ok_or_else(|| {
                "--tool-call-parser auto: the chat template writes no GLM tool call (no <arg_key>); name the format \
                 with --tool-call-parser glm45 or glm47"
                    .to_owned()
            }),
        }
    }
}

/// One finished call.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    /// The arguments as a JSON object's text; for a call the answer ended inside (cut by
    /// `max_tokens`), the text as it stands, without a closing brace.
    pub arguments: String,
    /// Whether `</tool_call>` closed the call.
    pub complete: bool,
}

/// What a piece of text added to the calls: a call's start (its index, id and name), or
/// more of its arguments' text.
#[derive(Clone, Debug, PartialEq)]
pub enum ToolDelta {
    Start { index: usize, id: String, name: String },
    Arguments { index: usize, text: String },
}

#[derive(Clone, Debug, PartialEq)]
enum Part {
    /// Outside calls: content.
    Text,
    /// After `<tool_call>`: the name so far.
    Name,
    /// Between arguments: waiting for `<arg_key>` or `</tool_call>`.
    Args,
    /// Inside `<arg_key>`.
    Key,
    /// After `</arg_key>`, waiting for `<arg_value>`.
    BeforeValue,
    /// Inside `<arg_value>`.
    Value,
}

/// Reads an answer's text, piece by piece, into content and tool calls.
pub struct ToolSplit {
    /// Each tool's parameters' types, by tool name then parameter name.
    types: Map<String, Value>,
    part: Part,
    /// Text not yet assigned.
    held: String,
    name: String,
    key: String,
    /// The current call's arguments so far (JSON text, without the closing brace).
    args: String,
    calls: Vec<ToolCall>,
    /// Prefix of call ids (unique to the request) and the next call's number.
    id_prefix: String,
    /// OpenAI's `parallel_tool_calls: false`: only the first call is returned.
    single: bool,
}

impl ToolSplit {
    /// A split for an answer to a request with `tools` (OpenAI's list of
    /// `{"type": "function", "function": {"name", "parameters"}}`); `id_prefix` makes the
    /// calls' ids.
    pub fn new(tools: &Value, id_prefix: &str) -> ToolSplit {
        let mut types = Map::new();
        for t in tools.as_array().into_iter().flatten() {
            let f = &t["function"];
            if let Some(name) = f["name"].as_str() {
                types.insert(name.to_owned(), f["parameters"]["properties"].clone());
            }
        }
        ToolSplit {
            types,
            part: Part::Text,
            held: String::new(),
            name: String::new(),
            key: String::new(),
            args: String::new(),
            calls: Vec::new(),
            id_prefix: id_prefix.to_owned(),
            single: false,
        }
    }

    /// Returns only the answer's first call (`parallel_tool_calls: false`); the others are
    /// read and dropped.
    pub fn first_call_only(mut self) -> ToolSplit {
        self.single = true;
        self
    }

    /// The calls finished so far.
    pub fn calls(&self) -> &[ToolCall] {
        if self.single { &self.calls[..self.calls.len().min(1)] } else { &self.calls }
    }

    /// `pieces` without the deltas of calls past the first where only it is returned.
    fn kept(&self, mut pieces: Vec<Piece>) -> Vec<Piece> {
        if self.single {
            pieces.retain(|p| match p {
                Piece::Text(_) => true,
                Piece::Call(d) => {
                    matches!(d, ToolDelta::Start { index: 0, .. } | ToolDelta::Arguments { index: 0, .. })
                }
            });
        }
        pieces
    }

    /// Adds the next piece of final text: the content and the call deltas it completes.
    pub fn push(&mut self, piece: &str) -> (String, Vec<ToolDelta>) {
        split_pieces(self.push_in_order(piece))
    }

    /// [`Self::push`] as content and call deltas in the order the text has them.
    pub fn push_in_order(&mut self, piece: &str) -> Vec<Piece> {
        self.held.push_str(piece);
        let mut out = Vec::new();
        loop {
            let progressed = match self.part {
                Part::Text => match self.held.find(OPEN) {
                    Some(at) => {
                        out.push(Piece::Text(self.held[..at].to_owned()));
                        self.held.drain(..at + OPEN.len());
                        self.part = Part::Name;
                        self.name.clear();
                        true
                    }
                    None => {
                        // Keep back a tail that could begin `<tool_call>`.
                        let keep = partial_tail(&self.held, OPEN);
                        let cut = self.held.len() - keep;
                        out.push(Piece::Text(self.held[..cut].to_owned()));
                        self.held.drain(..cut);
                        false
                    }
                },
                Part::Name => {
                    let ends = [self.held.find('\n'), self.held.find(KEY), self.held.find(CLOSE)];
                    match ends.into_iter().flatten().min() {
                        Some(at) => {
                            self.name = self.held[..at].trim().to_owned();
                            self.held.drain(..at);
                            let index = self.calls.len();
                            let id = format!("{}{index}", self.id_prefix);
                            out.push(Piece::Call(ToolDelta::Start { index, id, name: self.name.clone() }));
                            self.args.clear();
                            self.part = Part::Args;
                            true
                        }
                        None => false,
                    }
                }
                Part::Args => {
                    let rest = self.held.trim_start();
                    let skipped = self.held.len() - rest.len();
                    if rest.starts_with(KEY) {
                        self.held.drain(..skipped + KEY.len());
                        self.key.clear();
                        self.part = Part::Key;
                        true
                    } else if rest.starts_with(CLOSE) {
                        self.held.drain(..skipped + CLOSE.len());
                        out.push(Piece::Call(self.close_call()));
                        true
                    } else if !rest.is_empty() && !KEY.starts_with(rest) && !CLOSE.starts_with(rest) {
                        // Not a tag where one must be: the text stays in the call (a value
                        // the model left unwrapped is dropped, as GLM's format has none).
                        self.held.drain(..skipped + 1);
                        true
                    } else {
                        false
                    }
                }
                Part::Key => match self.held.find(KEY_END) {
                    Some(at) => {
                        self.key = self.held[..at].trim().to_owned();
                        self.held.drain(..at + KEY_END.len());
                        self.part = Part::BeforeValue;
                        true
                    }
                    None => false,
                },
                Part::BeforeValue => {
                    let rest = self.held.trim_start();
                    let skipped = self.held.len() - rest.len();
                    if rest.starts_with(VALUE) {
                        self.held.drain(..skipped + VALUE.len());
                        self.part = Part::Value;
                        true
                    } else if !rest.is_empty() && !VALUE.starts_with(rest) {
                        // A key without a value: an empty string.
                        let text = self.argument("");
                        out.push(Piece::Call(ToolDelta::Arguments { index: self.calls.len(), text }));
                        self.part = Part::Args;
                        true
                    } else {
                        false
                    }
                }
                Part::Value => match self.held.find(VALUE_END) {
                    Some(at) => {
                        let raw = self.held[..at].to_owned();
                        self.held.drain(..at + VALUE_END.len());
                        let text = self.argument(&raw);
                        out.push(Piece::Call(ToolDelta::Arguments { index: self.calls.len(), text }));
                        self.part = Part::Args;
                        true
                    }
                    None => false,
                },
            };
            if !progressed {
                break;
            }
        }
        self.kept(out)
    }

    /// The answer ended: text held back is content; a call left open is returned as it
    /// stands: its arguments' text so far, not closed, so that no client takes a cut call for
    /// a whole one.
    pub fn finish(&mut self) -> (String, Vec<ToolDelta>) {
        split_pieces(self.finish_in_order())
    }

    /// [`Self::finish`] in the order of the text.
    pub fn finish_in_order(&mut self) -> Vec<Piece> {
        let mut deltas = Vec::new();
        let content = match self.part {
            Part::Text => std::mem::take(&mut self.held),
            Part::Name => {
                // `<tool_call>` and a name with nothing after: the call is that name alone.
                self.name = self.held.trim().to_owned();
                self.held.clear();
                let index = self.calls.len();
                let id = format!("{}{index}", self.id_prefix);
                deltas.push(ToolDelta::Start { index, id, name: self.name.clone() });
                self.args.clear();
                self.part = Part::Args;
                String::new()
            }
            _ => {
                self.held.clear();
                String::new()
            }
        };
        if self.part != Part::Text {
            let index = self.calls.len();
            self.calls.push(ToolCall {
                id: format!("{}{index}", self.id_prefix),
                name: std::mem::take(&mut self.name),
                arguments: std::mem::take(&mut self.args),
                complete: false,
            });
            self.part = Part::Text;
        }
        let mut out = vec![Piece::Text(content)];
        out.extend(deltas.into_iter().map(Piece::Call));
        self.kept(out)
    }

    /// Ends the current call: its arguments' closing brace (`{}` when it has none), and the
    /// call among the finished ones.
    fn close_call(&mut self) -> ToolDelta {
        let index = self.calls.len();
        let text = if self.args.is_empty() { "{}".to_owned() } else { "}".to_owned() };
        self.args.push_str(&text);
        self.calls.push(ToolCall {
            id: format!("{}{index}", self.id_prefix),
            name: std::mem::take(&mut self.name),
            arguments: std::mem::take(&mut self.args),
            complete: true,
        });
        self.part = Part::Text;
        ToolDelta::Arguments { index, text }
    }

    /// The JSON text one more argument adds (`raw` its value as written): `{"k": v` for the
    /// first, `, "k": v` after.
    fn argument(&mut self, raw: &str) -> String {
        let value = self.typed(raw);
        let key = Value::String(self.key.clone()).to_string();
        let text = format!("{}{key}: {value}", if self.args.is_empty() { "{" } else { ", " });
        self.args.push_str(&text);
        text
    }

    /// `raw` as the tool's schema types the current argument.
    fn typed(&self, raw: &str) -> Value {
        let kind = self.types.get(&self.name).and_then(|p| p[&self.key]["type"].as_str());
        if kind == Some("string") {
            return Value::String(raw.to_owned());
        }
        serde_json::from_str(raw.trim()).unwrap_or_else(|_| Value::String(raw.to_owned()))
    }
}

/// Text outside calls, or a call's delta.
#[derive(Clone, Debug, PartialEq)]
pub enum Piece {
    Text(String),
    Call(ToolDelta),
}

/// Pieces as the content they hold and the deltas.
fn split_pieces(pieces: Vec<Piece>) -> (String, Vec<ToolDelta>) {
    let mut content = String::new();
    let mut deltas = Vec::new();
    for p in pieces {
        match p {
            Piece::Text(t) => content.push_str(&t),
            Piece::Call(d) => deltas.push(d),
        }
    }
    (content, deltas)
}

/// How many bytes at the end of `text` are a proper prefix of `marker` (held back until the
/// next piece says whether the marker follows).
fn partial_tail(text: &str, marker: &str) -> usize {
    (1..marker.len())
        .rev()
        .find(|&n| {
            text.len() >= n && text.is_char_boundary(text.len() - n) && marker.starts_with(&text[text.len() - n..])
        })
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn tools() -> Value {
        json!([
            {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
              "properties": {"city": {"type": "string"}, "days": {"type": "integer"}, "zip": {"type": "string"}}}}},
            {"type": "function", "function": {"name": "now", "parameters": {"type": "object", "properties": {}}}},
        ])
    }

    /// The content and calls of `text` read whole.
    fn whole(text: &str) -> (String, Vec<ToolCall>) {
        let mut s = ToolSplit::new(&tools(), "call_");
        let (mut content, _) = s.push(text);
        content.push_str(&s.finish().0);
        (content, s.calls().to_vec())
    }

    const GLM45: &str = "Let me check.\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Beijing</arg_value>\n\
                         <arg_key>days</arg_key>\n<arg_value>3</arg_value>\n<arg_key>zip</arg_key>\n\
                         <arg_value>100000</arg_value>\n</tool_call>\n<tool_call>now\n</tool_call>";
    const GLM47: &str = "<tool_call>get_weather<arg_key>city</arg_key><arg_value>New \"York\"</arg_value>\
                         <arg_key>days</arg_key><arg_value>2</arg_value></tool_call><tool_call>now</tool_call>";

    #[test]
    fn both_formats_read_whole_with_values_typed_by_the_schema() {
        let (content, calls) = whole(GLM45);
        assert_eq!(content, "Let me check.\n\n");
        assert_eq!(calls.len(), 2);
        assert_eq!((calls[0].name.as_str(), calls[0].id.as_str()), ("get_weather", "call_0"));
        let args: Value = serde_json::from_str(&calls[0].arguments).unwrap();
        // A string parameter keeps digits as text; an integer one is a number.
        assert_eq!(args, json!({"city": "Beijing", "days": 3, "zip": "100000"}));
        assert_eq!((calls[1].name.as_str(), calls[1].arguments.as_str()), ("now", "{}"));
        let (content, calls) = whole(GLM47);
        assert_eq!(content, "");
        let args: Value = serde_json::from_str(&calls[0].arguments).unwrap();
        assert_eq!(args, json!({"city": "New \"York\"", "days": 2}));
        assert_eq!((calls[1].name.as_str(), calls[1].arguments.as_str()), ("now", "{}"));
        // No call: all content, markers' look-alikes included.
        assert_eq!(whole("a < b <tool and <tool_cal"), ("a < b <tool and <tool_cal".to_owned(), vec![]));
        // Text ending inside a character of several bytes (a random model's answer).
        assert_eq!(whole("\u{4f60}\u{597d}"), ("\u{4f60}\u{597d}".to_owned(), vec![]));
        let mut s = ToolSplit::new(&tools(), "call_");
        assert_eq!(s.push("\u{4f60}\u{4b3e}").0, "\u{4f60}\u{4b3e}");
    }

    /// Streamed in two pieces split at every byte boundary, and one character at a time: the
    /// same content and calls, the name before any argument, and the argument deltas joined
    /// equal to each call's arguments.
    #[test]
    fn pieces_split_anywhere_give_the_whole_answer() {
        for text in [GLM45, GLM47] {
            let want = whole(text);
            let mut splits: Vec<Vec<&str>> =
                (0..=text.len()).filter(|&i| text.is_char_boundary(i)).map(|i| vec![&text[..i], &text[i..]]).collect();
            splits.push(text.char_indices().map(|(i, c)| &text[i..i + c.len_utf8()]).collect());
            for pieces in splits {
                let mut s = ToolSplit::new(&tools(), "call_");
                let (mut content, mut deltas) = (String::new(), Vec::new());
                for p in &pieces {
                    let (c, d) = s.push(p);
                    content.push_str(&c);
                    deltas.extend(d);
                }
                let (c, d) = s.finish();
                content.push_str(&c);
                deltas.extend(d);
                assert_eq!((content, s.calls().to_vec()), want, "{pieces:?}");
                let mut joined = vec![String::new(); want.1.len()];
                let mut started = vec![false; want.1.len()];
                for d in deltas {
                    match d {
                        ToolDelta::Start { index, name, .. } => {
                            assert_eq!(name, want.1[index].name);
                            started[index] = true;
                        }
                        ToolDelta::Arguments { index, text } => {
                            assert!(started[index], "arguments before the name");
                            joined[index].push_str(&text);
                        }
                    }
                }
                let args: Vec<String> = want.1.iter().map(|c| c.arguments.clone()).collect();
                assert_eq!(joined, args);
            }
        }
    }

    #[test]
    fn only_the_first_call_where_parallel_calls_are_off() {
        let mut s = ToolSplit::new(&tools(), "call_").first_call_only();
        let (content, deltas) = s.push(GLM45);
        let (_, rest) = s.finish();
        assert_eq!(content, "Let me check.\n\n");
        assert_eq!(s.calls().len(), 1);
        assert_eq!(s.calls()[0].name, "get_weather");
        let indices: Vec<usize> = deltas
            .iter()
            .chain(&rest)
            .map(|d| match d {
                ToolDelta::Start { index, .. } | ToolDelta::Arguments { index, .. } => *index,
            })
            .collect();
        assert!(!indices.is_empty() && indices.iter().all(|&i| i == 0), "{indices:?}");
    }

    /// A call cut off (by max_tokens) is returned as it stands: never a closed object that
    /// looks whole while it lacks the arguments it never reached.
    #[test]
    fn a_call_cut_off_is_returned_as_it_stands() {
        let (_, calls) = whole("<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Oslo</arg_value>\n<arg_k");
        assert_eq!(calls.len(), 1);
        assert_eq!((calls[0].arguments.as_str(), calls[0].complete), (r#"{"city": "Oslo""#, false));
        assert!(serde_json::from_str::<Value>(&calls[0].arguments).is_err());
        let (_, calls) = whole("<tool_call>now");
        assert_eq!((calls[0].name.as_str(), calls[0].arguments.as_str(), calls[0].complete), ("now", "", false));
        let (_, calls) = whole("<tool_call>now</tool_call>");
        assert_eq!((calls[0].arguments.as_str(), calls[0].complete), ("{}", true));
    }

    #[test]
    fn the_template_names_its_format() {
        assert_eq!(ToolParser::of_template("{{ tc.name }}\n<arg_key>{{ k }}</arg_key>"), Some(ToolParser::Glm45));
        assert_eq!(ToolParser::of_template("<tool_call>{{ tc.name }}<arg_key>"), Some(ToolParser::Glm47));
        assert_eq!(ToolParser::of_template("{{ messages }}"), None);
    }
}
