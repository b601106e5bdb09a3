//! Strings (lengths, `pattern`, `format`), integers and numbers (bounds).

use super::visit::empty;
use super::{err, Conv, SchemaError, MAX_DIGITS};
use serde_json::{Map, Value};

/// Largest string length written into the grammar (larger bounds are relaxed).
const MAX_LENGTH: u64 = 10_000;

/// A numeric bound: (value, exclusive).
type Bound = Option<(f64, bool)>;

impl Conv<'_> {
    pub(crate) fn string(
        &mut self,
        o: &Map<String, Value>,
        path: &str,
    ) -> Result<String, SchemaError> {
        let mut relaxed = Vec::new();
        let mut len = |k: &'static str| -> Result<Option<u64>, SchemaError> {
            match o.get(k) {
                None => Ok(None),
                Some(v) => match v.as_u64().or_else(|| {
                    v.as_f64()
                        .filter(|f| *f >= 0.0 && f.fract() == 0.0)
                        .map(|f| f as u64)
                }) {
                    Some(n) if n <= MAX_LENGTH => Ok(Some(n)),
                    Some(_) => {
                        relaxed.push(k);
                        Ok(None)
                    }
                    None => err(path, k, "must be a non-negative integer"),
                },
            }
        };
        let (min, max) = (len("minLength")?, len("maxLength")?);
        for k in relaxed {
            self.relax(
                path,
                k,
                format!("lengths above {MAX_LENGTH} are checked after generation"),
            );
        }
        if let (Some(a), Some(b)) = (min, max) {
            if b < a {
                return empty(path, "maxLength", "below minLength");
            }
        }
        let has_len = min.is_some() || max.is_some();
        let mut content = None;
        if let Some(p) = o.get("pattern") {
            let Some(p) = p.as_str() else {
                return err(path, "pattern", "must be a string");
            };
            match crate::regex::pattern_to_gbnf(p) {
                Ok(g) => content = Some(format!("( {g} )")),
                Err(e) => self.relax(path, "pattern", format!("{e}: checked after generation")),
            }
        }
        if let Some(f) = o.get("format") {
            let f = f.as_str().unwrap_or("");
            match format_rule(f) {
                Some(g) if content.is_none() => {
                    let name = format!("format-{f}");
                    if !self.rules.iter().any(|r| r.0 == name) {
                        self.push_rule(name.clone(), g.to_string());
                        for (helper, body) in format_helpers(f) {
                            self.push_rule(helper, body);
                        }
                    }
                    content = Some(name);
                }
                Some(_) => self.relax(path, "format", "format beside pattern is checked after generation"),
                None => self.relax(path, "format", format!("format {f:?} has no grammar (date, time, date-time, uuid, email, ipv4, uri do): checked after generation")),
            }
        }
        let content = match content {
            Some(c) => {
                if has_len {
                    let k = if min.is_some() {
                        "minLength"
                    } else {
                        "maxLength"
                    };
                    self.relax(
                        path,
                        k,
                        "lengths beside pattern/format are checked after generation",
                    );
                }
                c
            }
            None => {
                if !has_len {
                    return Ok(self.prim("string"));
                }
                self.prim("string");
                let lo = min.unwrap_or(0);
                match max {
                    None => format!("char{{{lo},}}"),
                    Some(h) => format!("char{{{lo},{h}}}"),
                }
            }
        };
        Ok(self.add_rule(
            &format!("{path}-string"),
            format!("\"\\\"\" {content} \"\\\"\""),
        ))
    }

    /// Bounds: (value, exclusive) from minimum/exclusiveMinimum (draft 4 booleans too).
    fn bounds(&self, o: &Map<String, Value>, path: &str) -> Result<(Bound, Bound), SchemaError> {
        let num = |k: &str| -> Result<Option<f64>, SchemaError> {
            match o.get(k) {
                None | Some(Value::Bool(_)) => Ok(None),
                Some(v) => match v.as_f64() {
                    Some(f) if f.is_finite() => Ok(Some(f)),
                    _ => err(path, k, "must be a number"),
                },
            }
        };
        let flag = |k: &str| o.get(k) == Some(&Value::Bool(true));
        let pick = |incl: Option<f64>,
                    excl: Option<f64>,
                    draft4: bool,
                    lower: bool|
         -> Option<(f64, bool)> {
            let a = incl.map(|v| (v, draft4));
            let b = excl.map(|v| (v, true));
            match (a, b) {
                (Some(x), Some(y)) => {
                    // The tighter bound.
                    let x_tighter = if lower { x.0 > y.0 } else { x.0 < y.0 };
                    Some(if x_tighter { x } else { y })
                }
                (x, y) => x.or(y),
            }
        };
        let lo = pick(
            num("minimum")?,
            num("exclusiveMinimum")?,
            flag("exclusiveMinimum"),
            true,
        );
        let hi = pick(
            num("maximum")?,
            num("exclusiveMaximum")?,
            flag("exclusiveMaximum"),
            false,
        );
        Ok((lo, hi))
    }

    /// Bounds too large for the grammar are dropped (relaxed): `(lo, hi)` left.
    fn fit(&mut self, path: &str, lo: Bound, hi: Bound) -> (Bound, Bound) {
        let limit = 10f64.powi(MAX_DIGITS as i32) - 1.0;
        let mut keep = |b: Bound, k: &str| match b {
            Some((v, _)) if v.abs() > limit => {
                self.relax(
                    path,
                    k,
                    format!("bounds beyond {MAX_DIGITS} digits are checked after generation"),
                );
                None
            }
            b => b,
        };
        (keep(lo, "minimum"), keep(hi, "maximum"))
    }

    pub(crate) fn integer(
        &mut self,
        o: &Map<String, Value>,
        path: &str,
    ) -> Result<String, SchemaError> {
        let (lo, hi) = self.bounds(o, path)?;
        let lo = lo.map(|(v, ex)| (if ex { v.floor() + 1.0 } else { v.ceil() }, false));
        let hi = hi.map(|(v, ex)| (if ex { v.ceil() - 1.0 } else { v.floor() }, false));
        let (lo, hi) = self.fit(path, lo, hi);
        if lo.is_none() && hi.is_none() {
            return Ok(self.prim("integral"));
        }
        let (lo, hi) = (lo.map(|v| v.0 as i64), hi.map(|v| v.0 as i64));
        if let (Some(a), Some(b)) = (lo, hi) {
            if a > b {
                return empty(path, "maximum", "no integer lies within the bounds");
            }
        }
        // 2.0 is an integer too.
        let body = format!("( {} ) ( \".\" \"0\"+ )?", int_range(lo, hi));
        Ok(self.add_rule(&format!("{path}-integer"), body))
    }

    pub(crate) fn number(
        &mut self,
        o: &Map<String, Value>,
        path: &str,
    ) -> Result<String, SchemaError> {
        let (lo, hi) = self.bounds(o, path)?;
        if let (Some((a, ae)), Some((b, be))) = (lo, hi) {
            if a > b || (a == b && (ae || be)) {
                return empty(path, "maximum", "no number lies within the bounds");
            }
        }
        // Fractional bounds widen to the integers around them (relaxed).
        let lo = lo.map(|(v, e)| {
            if v.fract() != 0.0 {
                self.relax(path, "minimum", "a fractional bound is checked after generation (the grammar uses the integer below)");
                (v.floor(), false)
            } else {
                (v, e)
            }
        });
        let hi = hi.map(|(v, e)| {
            if v.fract() != 0.0 {
                self.relax(path, "maximum", "a fractional bound is checked after generation (the grammar uses the integer above)");
                (v.ceil(), false)
            } else {
                (v, e)
            }
        });
        let (lo, hi) = self.fit(path, lo, hi);
        if lo.is_none() && hi.is_none() {
            return Ok(self.prim("number"));
        }
        self.prim("frac");
        let lo = lo.map(|(v, e)| (v as i64, e));
        let hi = hi.map(|(v, e)| (v as i64, e));
        let mut alts = Vec::new();
        // Non-negative part: magnitudes within [max(lo,0), hi].
        if hi.is_none_or(|(h, e)| h > 0 || (h == 0 && !e)) {
            let low = match lo {
                Some((l, e)) if l >= 0 => Some((l as u64, e)),
                _ => None,
            };
            alts.push(mag_range(low, hi.map(|(h, e)| (h as u64, e))));
        }
        // Negative part: "-" magnitude within [max(-hi,0), -lo] (exclusive ends carried).
        if lo.is_none_or(|(l, _)| l < 0) {
            let low = match hi {
                Some((h, e)) if h <= 0 => Some(((-h) as u64, e)),
                _ => None,
            };
            let high = lo.map(|(l, e)| ((-l) as u64, e));
            let m = mag_range(low, high);
            alts.push(format!("\"-\" ( {m} )"));
        }
        // Magnitudes below 1 written with a negative exponent (`2.5e-05`, as Python and
        // serde print small numbers): one digit, a fraction, an exponent of -1 or less.
        // Taken on a side where every such magnitude is within the bounds; next to an
        // exclusive bound at 0, the leading digit is not 0.
        let small = |zero: bool| {
            let lead = if zero { "[0-9]" } else { "[1-9]" };
            format!(r#"{lead} ( "." [0-9]+ )? [eE] "-" "0"* [1-9] [0-9]*"#)
        };
        if lo.is_none_or(|(l, _)| l <= 0) && hi.is_none_or(|(h, _)| h >= 1) {
            alts.push(small(lo.is_none_or(|(l, e)| l < 0 || !e)));
        }
        if lo.is_none_or(|(l, _)| l <= -1) && hi.is_none_or(|(h, _)| h >= 0) {
            let zero = hi.is_none_or(|(h, e)| h > 0 || !e);
            alts.push(format!("\"-\" {}", small(zero)));
        }
        Ok(self.add_rule(&format!("{path}-number"), alts.join(" | ")))
    }
}

/// GBNF (content of a JSON string) for a supported `format`.
fn format_rule(f: &str) -> Option<&'static str> {
    const DATE: &str = concat!(
        r#"( [0-9]{4} "-" ( ( "0" [13578] | "1" [02] ) "-" ( "0" [1-9] | [12] [0-9] | "3" [01] ) "#,
        r#"| ( "0" [469] | "11" ) "-" ( "0" [1-9] | [12] [0-9] | "30" ) "#,
        r#"| "02-" ( "0" [1-9] | "1" [0-9] | "2" [0-8] ) ) "#,
        r#"| ( [0-9]{2} ( "0" [48] | [2468] [048] | [13579] [26] ) | ( [02468] [048] | [13579] [26] ) "00" ) "-02-29" )"#
    );
    const TIME: &str = r#"( [01] [0-9] | "2" [0-3] ) ":" [0-5] [0-9] ":" [0-5] [0-9] ( "." [0-9]{1,9} )? ( "Z" | [+-] ( [01] [0-9] | "2" [0-3] ) ":" [0-5] [0-9] )"#;
    Some(match f {
        "date" => DATE,
        "time" => TIME,
        "date-time" => concat!(
            r#"( [0-9]{4} "-" ( ( "0" [13578] | "1" [02] ) "-" ( "0" [1-9] | [12] [0-9] | "3" [01] ) "#,
            r#"| ( "0" [469] | "11" ) "-" ( "0" [1-9] | [12] [0-9] | "30" ) "#,
            r#"| "02-" ( "0" [1-9] | "1" [0-9] | "2" [0-8] ) ) "#,
            r#"| ( [0-9]{2} ( "0" [48] | [2468] [048] | [13579] [26] ) | ( [02468] [048] | [13579] [26] ) "00" ) "-02-29" ) "#,
            r#""T" ( [01] [0-9] | "2" [0-3] ) ":" [0-5] [0-9] ":" [0-5] [0-9] ( "." [0-9]{1,9} )? ( "Z" | [+-] ( [01] [0-9] | "2" [0-3] ) ":" [0-5] [0-9] )"#
        ),
        "uuid" => {
            r#"[0-9a-fA-F]{8} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{12}"#
        }
        // A dot-atom local part of RFC 5322's ASCII characters, at most 64 of them
        // (`format-email-local-K`: see `format_helpers`), and a host name of up to four
        // labels of at most 56 (no "--" at the third and fourth characters: that would be
        // an IDNA label) ending in an alphabetic top-level label of at most 24: 252
        // characters at most, within a domain's 254 (four labels of 63 would pass it).
        "email" => concat!(
            r#"[a-zA-Z0-9!#$%&'*+/=?^_`{|}~-] format-email-local-63 "@" "#,
            r#"( [a-zA-Z0-9] ( [a-zA-Z0-9] | [a-zA-Z0-9-] [a-zA-Z0-9] | [a-zA-Z0-9-] [a-zA-Z0-9-] [a-zA-Z0-9] "#,
            r#"| [a-zA-Z0-9-] ( [a-zA-Z0-9] [a-zA-Z0-9-] | "-" [a-zA-Z0-9] ) [a-zA-Z0-9-]{0,51} [a-zA-Z0-9] )? "." ){1,4} "#,
            r#"[a-zA-Z]{2,24}"#
        ),
        "ipv4" => {
            r#"( [0-9] | [1-9] [0-9] | "1" [0-9]{2} | "2" [0-4] [0-9] | "25" [0-5] ) ( "." ( [0-9] | [1-9] [0-9] | "1" [0-9]{2} | "2" [0-4] [0-9] | "25" [0-5] ) ){3}"#
        }
        // RFC 3986's URI without IP literals: scheme, authority (user info, host name or
        // IPv4, port), path, query, fragment; any length.
        "uri" => concat!(
            r#"[a-zA-Z] [a-zA-Z0-9+.-]* ":" "#,
            r#"( "//" ( ( [a-zA-Z0-9._~!$&'()*+,;=:-] | "%" [0-9a-fA-F]{2} )* "@" )? "#,
            r#"( [a-zA-Z0-9._~!$&'()*+,;=-] | "%" [0-9a-fA-F]{2} )* ( ":" [0-9]* )? "#,
            r#"( "/" ( [a-zA-Z0-9._~!$&'()*+,;=:@-] | "%" [0-9a-fA-F]{2} )* )* "#,
            r#"| "/" ( ( [a-zA-Z0-9._~!$&'()*+,;=:@-] | "%" [0-9a-fA-F]{2} )+ "#,
            r#"( "/" ( [a-zA-Z0-9._~!$&'()*+,;=:@-] | "%" [0-9a-fA-F]{2} )* )* )? "#,
            r#"| ( [a-zA-Z0-9._~!$&'()*+,;=:@-] | "%" [0-9a-fA-F]{2} )+ "#,
            r#"( "/" ( [a-zA-Z0-9._~!$&'()*+,;=:@-] | "%" [0-9a-fA-F]{2} )* )* )? "#,
            r#"( "?" ( [a-zA-Z0-9._~!$&'()*+,;=:@/?-] | "%" [0-9a-fA-F]{2} )* )? "#,
            r##"( "#" ( [a-zA-Z0-9._~!$&'()*+,;=:@/?-] | "%" [0-9a-fA-F]{2} )* )?"##
        ),
        _ => return None,
    })
}

/// The rules a format's rule refers to: for `email`, `format-email-local-K`, what may
/// follow a local part's character when K more may come (RFC 5321's 64 in all): another
/// character, or a dot and a character (atoms never empty, never two dots in a row).
fn format_helpers(f: &str) -> Vec<(String, String)> {
    if f != "email" {
        return Vec::new();
    }
    const ATEXT: &str = "[a-zA-Z0-9!#$%&'*+/=?^_`{|}~-]";
    let name = |k: usize| format!("format-email-local-{k}");
    (0..64)
        .map(|k| {
            let body = match k {
                0 => "\"\"".to_string(),
                1 => format!("( {ATEXT} {} )?", name(0)),
                _ => format!(
                    "( {ATEXT} {} | \".\" {ATEXT} {} )?",
                    name(k - 1),
                    name(k - 2)
                ),
            };
            (name(k), body)
        })
        .collect()
}

/// GBNF for the decimal digits of the integers in `lo..=hi`, both with `n` digits.
fn same_len(lo: &[u8], hi: &[u8]) -> String {
    if lo.is_empty() {
        return String::new();
    }
    let n = lo.len() - 1;
    let any = |k: usize| {
        if k == 0 {
            String::new()
        } else {
            format!(" [0-9]{{{k}}}")
        }
    };
    if lo[0] == hi[0] {
        let rest = same_len(&lo[1..], &hi[1..]);
        return format!("\"{}\" {rest}", lo[0] as char)
            .trim_end()
            .to_string();
    }
    let lo_rest_zero = lo[1..].iter().all(|&d| d == b'0');
    let hi_rest_nine = hi[1..].iter().all(|&d| d == b'9');
    let mut alts = Vec::new();
    let mut mid_lo = lo[0] + 1;
    let mut mid_hi = hi[0] - 1;
    if lo_rest_zero {
        mid_lo = lo[0];
    } else {
        let nines = vec![b'9'; n];
        alts.push(format!(
            "\"{}\" ( {} )",
            lo[0] as char,
            same_len(&lo[1..], &nines)
        ));
    }
    if hi_rest_nine {
        mid_hi = hi[0];
    }
    if mid_lo <= mid_hi {
        let class = if mid_lo == mid_hi {
            format!("\"{}\"", mid_lo as char)
        } else {
            format!("[{}-{}]", mid_lo as char, mid_hi as char)
        };
        alts.push(format!("{class}{}", any(n)));
    }
    if !hi_rest_nine {
        let zeros = vec![b'0'; n];
        alts.push(format!(
            "\"{}\" ( {} )",
            hi[0] as char,
            same_len(&zeros, &hi[1..])
        ));
    }
    format!("( {} )", alts.join(" | "))
}

fn digits(v: u64) -> u32 {
    v.checked_ilog10().unwrap_or(0) + 1
}

/// GBNF for the unsigned integers in `lo..=hi` (hi `None`: no upper bound).
fn uint_range(lo: u64, hi: Option<u64>) -> String {
    let Some(hi) = hi else {
        // Numbers of lo's length from lo, then any longer number.
        let d = digits(lo);
        let top = 10u64.pow(d) - 1;
        let same = same_len(lo.to_string().as_bytes(), top.to_string().as_bytes());
        return format!("( {same} | [1-9] [0-9]{{{d},}} )");
    };
    let mut alts = Vec::new();
    for d in digits(lo)..=digits(hi) {
        let a = lo.max(if d == 1 { 0 } else { 10u64.pow(d - 1) });
        let b = hi.min(10u64.pow(d) - 1);
        if a <= b {
            alts.push(same_len(a.to_string().as_bytes(), b.to_string().as_bytes()));
        }
    }
    format!("( {} )", alts.join(" | "))
}

/// GBNF for the integers in `lo..=hi` (either side open).
fn int_range(lo: Option<i64>, hi: Option<i64>) -> String {
    let mut alts = Vec::new();
    if lo.is_none_or(|l| l < 0) {
        // Negatives -m with m in [max(1, -hi), -lo].
        let m_lo = match hi {
            Some(h) if h < 0 => (-h) as u64,
            _ => 1,
        };
        let m_hi = lo.map(|l| (-l) as u64);
        if m_hi.is_none_or(|m| m >= m_lo) {
            alts.push(format!("\"-\" {}", uint_range(m_lo, m_hi)));
        }
    }
    if hi.is_none_or(|h| h >= 0) {
        alts.push(uint_range(
            lo.map_or(0, |l| l.max(0) as u64),
            hi.map(|h| h as u64),
        ));
    }
    alts.join(" | ")
}

/// GBNF for non-negative decimal numbers (no exponent) with magnitude in the given
/// integral bounds `(value, exclusive)`.
fn mag_range(lo: Option<(u64, bool)>, hi: Option<(u64, bool)>) -> String {
    let frac = "frac?";
    let mut alts = Vec::new();
    let (a, a_ex) = lo.unwrap_or((0, false));
    match hi {
        None => {
            let start = if a_ex { a + 1 } else { a };
            alts.push(format!("{} {frac}", uint_range(start, None)));
        }
        Some((b, b_ex)) => {
            // Integral part in [a', b-1] with any fraction; then b itself.
            let start = if a_ex { a + 1 } else { a };
            if b >= 1 && start < b {
                alts.push(format!("{} {frac}", uint_range(start, Some(b - 1))));
            }
            if !b_ex && (b > a || !a_ex) {
                alts.push(format!("\"{b}\" ( \".\" \"0\"+ )?"));
            }
        }
    }
    if a_ex && hi.is_none_or(|(b, _)| b > a) {
        // Just above the exclusive lower bound: a.000…d with a non-zero digit.
        alts.push(format!("\"{a}\" \".\" \"0\"* [1-9] [0-9]*"));
    }
    alts.join(" | ")
}
