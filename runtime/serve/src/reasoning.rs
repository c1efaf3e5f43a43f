//! GLM's reasoning in a chat answer (`--reasoning-parser glm45`): the text of the first
//! `<think>` ... `</think>` block is the answer's reasoning, returned as `reasoning_content`
//! (SGLang's and DeepSeek's name) and `reasoning` (vLLM's); the text around it is the
//! content. A chat template that opens `<think>` itself (the rendered prompt ends with it)
//! starts the answer inside the block. Text arrives in pieces, so a tail that could still
//! become a marker is held back until the next piece says what it is.

const OPEN: &str = "<think>";
const CLOSE: &str = "</think>";

/// The reasoning parsers `headcount serve` has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReasoningParser {
    /// GLM-4.5, 4.6 and 4.7: `<think>` ... `</think>`.
    Glm45,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Part {
    /// Before any `<think>`.
    Before,
    /// Inside the block.
    Reasoning,
    /// After `</think>`: everything is content.
    After,
}

/// Splits an answer's text, piece by piece, into reasoning and content.
pub struct ReasoningSplit {
    part: Part,
    /// Text not yet assigned: a tail that may begin a marker.
    held: String,
}

/// What a piece of text added: `(reasoning, content)`.
pub type Split = (String, String);

impl ReasoningSplit {
    /// A split for an answer whose prompt ends inside `<think>` (`opened`) or not.
    pub fn new(opened: bool) -> ReasoningSplit {
        ReasoningSplit { part: if opened { Part::Reasoning } else { Part::Before }, held: String::new() }
    }

    /// Whether the rendered prompt `text` leaves the answer inside a `<think>` block.
    pub fn opened_by(text: &str) -> bool {
        let t = text.trim_end();
        t.ends_with(OPEN) || t.rfind(OPEN).is_some_and(|o| t.rfind(CLOSE).is_none_or(|c| c < o))
    }

    /// Adds the next piece of final text.
    pub fn push(&mut self, piece: &str) -> Split {
        self.held.push_str(piece);
        let (mut reasoning, mut content) = (String::new(), String::new());
        loop {
            let marker = match self.part {
                Part::Before => OPEN,
                Part::Reasoning => CLOSE,
                Part::After => {
                    content.push_str(&self.held);
                    self.held.clear();
                    break;
                }
            };
            let out = if self.part == Part::Reasoning { &mut reasoning } else { &mut content };
            if let Some(at) = self.held.find(marker) {
                out.push_str(&self.held[..at]);
                self.held.drain(..at + marker.len());
                self.part = if self.part == Part::Before { Part::Reasoning } else { Part::After };
                continue;
            }
            let keep = partial_marker(&self.held, marker);
            out.push_str(&self.held[..self.held.len() - keep]);
            self.held.drain(..self.held.len() - keep);
            break;
        }
        (reasoning, content)
    }

    /// The text held back at the end of the answer, where it stays what it was.
    pub fn finish(&mut self) -> Split {
        let rest = std::mem::take(&mut self.held);
        if self.part == Part::Reasoning { (rest, String::new()) } else { (String::new(), rest) }
    }
}

/// Bytes at the end of `text` that begin `marker` (and could become it).
fn partial_marker(text: &str, marker: &str) -> usize {
    (1..marker.len().min(text.len() + 1)).rev().find(|&k| text.ends_with(&marker[..k])).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `text` through a split in the pieces `cuts` makes, joined back.
    fn split_at(text: &str, cuts: &[usize], opened: bool) -> Split {
        let mut s = ReasoningSplit::new(opened);
        let (mut r, mut c) = (String::new(), String::new());
        let mut from = 0;
        for &to in cuts.iter().chain(std::iter::once(&text.len())) {
            let (a, b) = s.push(&text[from..to]);
            r.push_str(&a);
            c.push_str(&b);
            from = to;
        }
        let (a, b) = s.finish();
        (r + &a, c + &b)
    }

    #[test]
    fn the_first_think_block_is_reasoning_at_every_split() {
        let cases: &[(&str, bool, &str, &str)] = &[
            ("<think>add the units</think>The sum is 46.", false, "add the units", "The sum is 46."),
            ("Sure. <think>why</think>\n46", false, "why", "Sure. \n46"),
            ("no markers at all", false, "", "no markers at all"),
            ("a template opened it</think>46", true, "a template opened it", "46"),
            ("still thinking when it stopped", true, "still thinking when it stopped", ""),
            ("<think>a</think>b<think>c</think>", false, "a", "b<think>c</think>"),
            ("<thinking> is not the marker", false, "", "<thinking> is not the marker"),
            ("<think>ends in a partial </thi", false, "ends in a partial </thi", ""),
            ("3 < 4 and <th", false, "", "3 < 4 and <th"),
            ("<think>ü, é</think>ß", false, "ü, é", "ß"),
        ];
        for &(text, opened, reasoning, content) in cases {
            let want = (reasoning.to_owned(), content.to_owned());
            assert_eq!(split_at(text, &[], opened), want, "{text:?} whole");
            for cut in (1..text.len()).filter(|&i| text.is_char_boundary(i)) {
                assert_eq!(split_at(text, &[cut], opened), want, "{text:?} cut at {cut}");
            }
            let every: Vec<usize> = (1..text.len()).filter(|&i| text.is_char_boundary(i)).collect();
            assert_eq!(split_at(text, &every, opened), want, "{text:?} a character at a time");
        }
    }

    #[test]
    fn a_prompt_opens_the_block_when_it_ends_inside_one() {
        assert!(ReasoningSplit::opened_by("<|assistant|>\n<think>\n"));
        assert!(ReasoningSplit::opened_by("<|assistant|><think>plan:"));
        assert!(!ReasoningSplit::opened_by("<|assistant|>\n<think></think>\n"));
        assert!(!ReasoningSplit::opened_by("<|user|>hi<|assistant|>"));
    }
}
