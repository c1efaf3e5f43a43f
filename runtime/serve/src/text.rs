//! A request's generated text as its tokens arrive: decoded whole each time (so characters
//! that span tokens come out complete), cut at the first stop string, and holding back any
//! tail that could still become one, so a stream never sends text it must take back.

use headcount_runtime::{Result, StreamDecoder, TextCodec};

pub struct TextStream {
    /// Decodes the tokens whole and hands out the text that became final.
    decoder: StreamDecoder,
    /// That text so far.
    text: String,
    /// Bytes of `text` handed out.
    sent: usize,
    stops: Vec<String>,
    stopped: bool,
    /// The stop string that ended the text.
    matched: Option<usize>,
}

impl TextStream {
    pub fn new(stops: Vec<String>) -> TextStream {
        TextStream { decoder: StreamDecoder::new(), text: String::new(), sent: 0, stops, stopped: false, matched: None }
    }

    /// Adds a token; returns the text that became final and whether a stop string ended
    /// the text (it is then not included, and later tokens add nothing).
    pub fn push(&mut self, codec: &TextCodec, id: i64) -> Result<(String, bool)> {
        if self.stopped {
            return Ok((String::new(), true));
        }
        let piece = self.decoder.push(codec, id)?;
        if piece.is_empty() {
            return Ok((String::new(), false));
        }
        self.text.push_str(&piece);
        if let Some((at, which)) = self.first_stop() {
            self.matched = Some(which);
            let out = self.text[self.sent..at].to_owned();
            self.text.truncate(at);
            self.sent = at;
            self.stopped = true;
            return Ok((out, true));
        }
        let keep = self.held_back();
        let end = self.text.len() - keep;
        let out = self.text[self.sent..end].to_owned();
        self.sent = end;
        Ok((out, false))
    }

    /// The stop string that ended the text, if one did.
    pub fn stop_string(&self) -> Option<&str> {
        self.matched.map(|i| self.stops[i].as_str())
    }

    /// The text held back at the end (no stop string completed it).
    pub fn finish(&mut self) -> String {
        let out = self.text[self.sent..].to_owned();
        self.sent = self.text.len();
        out
    }

    /// Where the earliest stop string starts in the text not yet handed out (searching
    /// from where one could still begin), and which it is.
    fn first_stop(&self) -> Option<(usize, usize)> {
        self.stops
            .iter()
            .enumerate()
            .filter(|(_, s)| !s.is_empty())
            .filter_map(|(which, s)| {
                let mut from = self.sent.saturating_sub(s.len());
                while !self.text.is_char_boundary(from) {
                    from -= 1;
                }
                self.text[from..].find(s.as_str()).map(|i| (from + i, which))
            })
            .filter(|&(at, _)| at >= self.sent)
            .min()
    }

    /// Bytes at the end of the text that begin some stop string.
    fn held_back(&self) -> usize {
        let tail = &self.text[self.sent..];
        self.stops
            .iter()
            .map(|s| {
                (1..s.len().min(tail.len() + 1))
                    .rev()
                    .find(|&k| s.is_char_boundary(k) && tail.ends_with(&s[..k]))
                    .unwrap_or(0)
            })
            .max()
            .unwrap_or(0)
    }
}
