//! Stop strings over streamed text: the text is cut before the first occurrence of any
//! stop string, and while a stop string may still be starting, its first characters are
//! held back (never streamed and then taken back).

/// Scans generated text for stop strings.
#[derive(Debug, Default)]
pub struct StopScanner {
    stops: Vec<String>,
    text: String,
    emitted: usize,
    hit: bool,
}

impl StopScanner {
    /// A scanner for these stop strings (empty ones are ignored).
    pub fn new(stops: Vec<String>) -> StopScanner {
        StopScanner {
            stops: stops.into_iter().filter(|s| !s.is_empty()).collect(),
            ..StopScanner::default()
        }
    }

    /// Whether a stop string has been seen.
    pub fn hit(&self) -> bool {
        self.hit
    }

    /// The text kept so far (before any stop string).
    pub fn text(&self) -> &str {
        &self.text[..self.emitted.min(self.text.len())]
    }

    /// Adds a piece of text; returns what may be shown now.
    pub fn push(&mut self, piece: &str) -> String {
        if self.hit {
            return String::new();
        }
        let from = self.emitted;
        self.text.push_str(piece);
        // A stop string may have started in the held-back text: search from its start.
        let found = self
            .stops
            .iter()
            .filter_map(|s| {
                let start = from.saturating_sub(s.len());
                let start = floor_char(&self.text, start);
                self.text[start..].find(s.as_str()).map(|i| start + i)
            })
            .min();
        if let Some(at) = found {
            self.hit = true;
            let out = self.text[from..at.max(from)].to_string();
            self.text.truncate(at.max(from));
            self.emitted = self.text.len();
            return out;
        }
        let hold = self
            .stops
            .iter()
            .map(|s| partial_suffix(&self.text, s))
            .max()
            .unwrap_or(0);
        let upto = floor_char(&self.text, self.text.len() - hold).max(from);
        self.emitted = upto;
        self.text[from..upto].to_string()
    }

    /// The held-back text at the end of generation (nothing if a stop string was hit).
    pub fn finish(&mut self) -> String {
        if self.hit {
            return String::new();
        }
        let out = self.text[self.emitted..].to_string();
        self.emitted = self.text.len();
        out
    }
}

/// The length of the longest suffix of `text` that is a proper prefix of `stop`.
fn partial_suffix(text: &str, stop: &str) -> usize {
    (1..stop.len())
        .rev()
        .find(|&k| k <= text.len() && stop.is_char_boundary(k) && text.ends_with(&stop[..k]))
        .unwrap_or(0)
}

fn floor_char(s: &str, mut i: usize) -> usize {
    while i > 0 && !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(stops: &[&str], pieces: &[&str]) -> (String, bool) {
        let mut s = StopScanner::new(stops.iter().map(|s| s.to_string()).collect());
        let mut out = String::new();
        for p in pieces {
            out += &s.push(p);
        }
        out += &s.finish();
        (out, s.hit())
    }

    #[test]
    fn cuts_before_the_stop_string_across_pieces() {
        assert_eq!(
            run(&["END"], &["abc E", "N", "D tail"]),
            ("abc ".into(), true)
        );
        assert_eq!(run(&["\n\n"], &["a\n", "\nb"]), ("a".into(), true));
        assert_eq!(run(&["x", "bc"], &["abcx"]), ("a".into(), true));
    }

    #[test]
    fn held_back_text_is_released_when_the_stop_does_not_complete() {
        let mut s = StopScanner::new(vec!["END".into()]);
        assert_eq!(s.push("ab E"), "ab ");
        assert_eq!(s.push("N"), "");
        assert_eq!(s.push("x"), "ENx");
        assert_eq!(s.finish(), "");
        assert_eq!(run(&["END"], &["ab EN"]), ("ab EN".into(), false));
    }

    #[test]
    fn multibyte_text_is_never_split() {
        assert_eq!(run(&["é!"], &["café", " ok"]), ("café ok".into(), false));
        assert_eq!(run(&["é!"], &["caf", "é!"]), ("caf".into(), true));
        assert_eq!(run(&[], &["日本"]), ("日本".into(), false));
    }

    #[test]
    fn streamed_output_equals_the_whole_text_cut_at_the_first_stop() {
        // Property: for any split of a text into pieces, the concatenated output is the
        // text up to the first occurrence of a stop string (found independently by `find`).
        let text = "the cat sat on the mat; the end. THE END";
        let stops = ["the end", "mat;", "zzz"];
        let first = stops.iter().filter_map(|s| text.find(s)).min();
        let want = &text[..first.unwrap_or(text.len())];
        for size in 1..8 {
            let pieces: Vec<String> = text
                .as_bytes()
                .chunks(size)
                .map(|c| String::from_utf8(c.to_vec()).unwrap())
                .collect();
            let pieces: Vec<&str> = pieces.iter().map(String::as_str).collect();
            assert_eq!(
                run(&stops, &pieces),
                (want.to_string(), first.is_some()),
                "{size}"
            );
        }
    }
}
