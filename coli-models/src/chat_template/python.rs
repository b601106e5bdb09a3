//! Python's spelling of values, as jinja2 produces them inside `transformers`:
//! `str()` for printed values (`None`, `True`, `{'a': 1}`), `repr()` of floats, the
//! `json.dumps` behind transformers' own `tojson` filter, and the `str` methods whose
//! Python semantics differ from minijinja-contrib's (whitespace, `split`).

use std::fmt::Write;
use std::sync::Arc;

use minijinja::value::{Enumerator, Object, ObjectRepr, ValueKind};
use minijinja::{Error, ErrorKind, Value};

/// A Python tuple: a sequence that `repr()` spells with parentheses (the pairs of
/// `dict.items()` and `|items`).
#[derive(Debug)]
pub(super) struct Tuple(pub Vec<Value>);

impl Object for Tuple {
    fn repr(self: &Arc<Self>) -> ObjectRepr {
        ObjectRepr::Seq
    }

    fn get_value(self: &Arc<Self>, key: &Value) -> Option<Value> {
        self.0.get(key.as_usize()?).cloned()
    }

    fn enumerate(self: &Arc<Self>) -> Enumerator {
        Enumerator::Seq(self.0.len())
    }
}

/// A mapping's `(key, value)` pairs, in order, as tuples.
pub(super) fn items(v: &Value) -> Result<Vec<Value>, Error> {
    Ok(map_pairs(v)?
        .into_iter()
        .map(|(k, item)| Value::from_object(Tuple(vec![k, item])))
        .collect())
}

/// Python's `str.isspace` for one character: Rust's `White_Space` plus the four
/// information separators U+001C..U+001F, which Python also strips.
pub(super) fn is_py_space(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

/// `str.strip([chars])` (and `lstrip`/`rstrip` through `left`/`right`).
pub(super) fn strip<'a>(s: &'a str, chars: Option<&str>, left: bool, right: bool) -> &'a str {
    let strip_char = |c: char| match chars {
        Some(set) => set.contains(c),
        None => is_py_space(c),
    };
    let mut out = s;
    if left {
        out = out.trim_start_matches(strip_char);
    }
    if right {
        out = out.trim_end_matches(strip_char);
    }
    out
}

/// `str.split(sep=None, maxsplit=-1)`.
pub(super) fn split(s: &str, sep: Option<&str>, maxsplit: i64) -> Result<Vec<String>, Error> {
    let limit = usize::try_from(maxsplit).ok();
    match sep {
        Some("") => Err(Error::new(ErrorKind::InvalidOperation, "empty separator")),
        Some(sep) => Ok(match limit {
            Some(n) => s.splitn(n + 1, sep).map(str::to_string).collect(),
            None => s.split(sep).map(str::to_string).collect(),
        }),
        None => {
            // Runs of whitespace separate; leading and trailing whitespace yield nothing.
            let mut parts = Vec::new();
            let mut rest = s.trim_start_matches(is_py_space);
            while !rest.is_empty() {
                if limit.is_some_and(|n| parts.len() == n) {
                    parts.push(rest.to_string());
                    break;
                }
                let end = rest.find(is_py_space).unwrap_or(rest.len());
                parts.push(rest[..end].to_string());
                rest = rest[end..].trim_start_matches(is_py_space);
            }
            Ok(parts)
        }
    }
}

/// Python's `repr()` of a float (shortest round-trip digits; exponent form outside
/// 1e-4 ..= 1e16, with a signed two-digit exponent).
pub(super) fn float_repr(f: f64) -> String {
    if f.is_nan() {
        return "nan".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "inf" } else { "-inf" }.into();
    }
    // Rust's `{:e}` gives the same shortest round-trip digits Python uses.
    let sci = format!("{:e}", f.abs());
    let (mantissa, exp) = sci.split_once('e').expect("{:e} has an exponent");
    let exp: i32 = exp.parse().expect("{:e} exponent is an integer");
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    let sign = if f.is_sign_negative() { "-" } else { "" };
    if (-4..16).contains(&exp) {
        let point = exp + 1; // digits before the decimal point
        let text = if point <= 0 {
            format!("0.{}{digits}", "0".repeat((-point) as usize))
        } else if (point as usize) >= digits.len() {
            format!("{digits}{}.0", "0".repeat(point as usize - digits.len()))
        } else {
            format!(
                "{}.{}",
                &digits[..point as usize],
                &digits[point as usize..]
            )
        };
        format!("{sign}{text}")
    } else {
        let mantissa = if digits.len() == 1 {
            digits
        } else {
            format!("{}.{}", &digits[..1], &digits[1..])
        };
        let esign = if exp < 0 { '-' } else { '+' };
        format!("{sign}{mantissa}e{esign}{:02}", exp.abs())
    }
}

fn number_str(v: &Value) -> String {
    if v.is_integer() {
        v.to_string()
    } else {
        f64::try_from(v.clone()).map_or_else(|_| v.to_string(), float_repr)
    }
}

/// `str.title()`: a cased character after an uncased one is upper-cased, after a cased
/// one lower-cased (so `3rd` becomes `3Rd`, `it's` becomes `It'S`).
pub(super) fn title(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut previous_cased = false;
    for c in s.chars() {
        if previous_cased {
            out.extend(c.to_lowercase());
        } else {
            out.extend(c.to_uppercase());
        }
        previous_cased = c.is_lowercase() || c.is_uppercase();
    }
    out
}

/// Python's `str.isprintable` for one character, without Unicode's unassigned code
/// points (no table here): control and format characters, separators other than the
/// ASCII space, and private use are not printable.
fn is_printable(c: char) -> bool {
    let u = c as u32;
    let not = matches!(u,
        0..=0x1f | 0x7f..=0xa0 | 0xad | 0x600..=0x605 | 0x61c | 0x6dd | 0x70f | 0x890..=0x891
        | 0x8e2 | 0x1680 | 0x180e | 0x2000..=0x200f | 0x2028..=0x202f | 0x205f..=0x206f
        | 0x3000 | 0xe000..=0xf8ff | 0xfeff | 0xfff9..=0xfffb | 0x110bd
        | 0x110cd | 0x13430..=0x1343f | 0x1bca0..=0x1bca3 | 0x1d173..=0x1d17a | 0xe0001
        | 0xe0020..=0xe007f | 0xf0000..=0x10ffff);
    !not
}

/// Python's `repr()` of a string: single quotes unless the text holds a single quote
/// and no double quote; backslash escapes for the quote, `\\`, and characters that are
/// not printable (`\xNN`, `\uNNNN`, `\UNNNNNNNN`).
pub(super) fn str_repr(s: &str) -> String {
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    let mut out = String::with_capacity(s.len() + 2);
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if !is_printable(c) => {
                let _ = match c as u32 {
                    u @ 0..=0xff => write!(out, "\\x{u:02x}"),
                    u @ 0x100..=0xffff => write!(out, "\\u{u:04x}"),
                    u => write!(out, "\\U{u:08x}"),
                };
            }
            c => out.push(c),
        }
    }
    out.push(quote);
    out
}

fn map_pairs(v: &Value) -> Result<Vec<(Value, Value)>, Error> {
    v.try_iter()?
        .map(|k| v.get_item(&k).map(|item| (k, item)))
        .collect()
}

/// Python's `repr()` of a template value.
pub(super) fn repr(v: &Value) -> Result<String, Error> {
    Ok(match v.kind() {
        ValueKind::String => str_repr(v.as_str().unwrap_or_default()),
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Result<Vec<String>, Error> = v.try_iter()?.map(|x| repr(&x)).collect();
            let items = items?;
            match v.downcast_object_ref::<Tuple>() {
                Some(_) if items.len() == 1 => format!("({},)", items[0]),
                Some(_) => format!("({})", items.join(", ")),
                None => format!("[{}]", items.join(", ")),
            }
        }
        ValueKind::Map => {
            let mut parts = Vec::new();
            for (k, item) in map_pairs(v)? {
                parts.push(format!("{}: {}", repr(&k)?, repr(&item)?));
            }
            format!("{{{}}}", parts.join(", "))
        }
        _ => str(v)?,
    })
}

/// Python's `str()` of a template value, as jinja2 prints it (`{{ x }}`, `|string`).
pub(super) fn str(v: &Value) -> Result<String, Error> {
    Ok(match v.kind() {
        ValueKind::Undefined => String::new(),
        ValueKind::None => "None".into(),
        ValueKind::Bool => if v.is_true() { "True" } else { "False" }.into(),
        ValueKind::Number => number_str(v),
        ValueKind::String => v.as_str().unwrap_or_default().to_string(),
        ValueKind::Seq | ValueKind::Iterable | ValueKind::Map => repr(v)?,
        _ => v.to_string(),
    })
}

/// The options of Python's `json.dumps` that transformers' `tojson` exposes.
pub(super) struct JsonOptions {
    /// Escape every non-ASCII character as `\uXXXX` (transformers' default: false).
    pub ensure_ascii: bool,
    /// Pretty-print with this indent string per level.
    pub indent: Option<String>,
    /// Item and key separators (Python's defaults depend on `indent`).
    pub separators: (String, String),
    /// Sort object keys.
    pub sort_keys: bool,
}

/// Python's `json.dumps(value, ensure_ascii=…, indent=…, separators=…, sort_keys=…)`.
pub(super) fn json_dumps(v: &Value, opts: &JsonOptions) -> Result<String, Error> {
    let mut out = String::new();
    write_json(&mut out, v, opts, 0)?;
    Ok(out)
}

fn write_json_str(out: &mut String, s: &str, ensure_ascii: bool) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 || (ensure_ascii && (c as u32) > 0x7e) => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    let _ = write!(out, "\\u{unit:04x}");
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

fn json_key(k: &Value) -> Result<String, Error> {
    Ok(match k.kind() {
        ValueKind::String => k.as_str().unwrap_or_default().to_string(),
        ValueKind::Number => number_str(k),
        ValueKind::Bool => if k.is_true() { "true" } else { "false" }.into(),
        ValueKind::None => "null".into(),
        kind => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                format!("tojson: keys must be str, int, float, bool or None, not {kind}"),
            ))
        }
    })
}

fn newline(out: &mut String, opts: &JsonOptions, level: usize) {
    if let Some(indent) = &opts.indent {
        out.push('\n');
        for _ in 0..level {
            out.push_str(indent);
        }
    }
}

fn write_json(out: &mut String, v: &Value, opts: &JsonOptions, level: usize) -> Result<(), Error> {
    match v.kind() {
        ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
        ValueKind::Number if v.is_integer() => out.push_str(&v.to_string()),
        ValueKind::Number => {
            let f = f64::try_from(v.clone())?;
            out.push_str(&match float_repr(f).as_str() {
                "nan" => "NaN".to_string(),
                "inf" => "Infinity".to_string(),
                "-inf" => "-Infinity".to_string(),
                r => r.to_string(),
            });
        }
        ValueKind::String => write_json_str(out, v.as_str().unwrap_or_default(), opts.ensure_ascii),
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = v.try_iter()?.collect();
            if items.is_empty() {
                out.push_str("[]");
                return Ok(());
            }
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(&opts.separators.0);
                }
                newline(out, opts, level + 1);
                write_json(out, item, opts, level + 1)?;
            }
            newline(out, opts, level);
            out.push(']');
        }
        ValueKind::Map => {
            let mut pairs = Vec::new();
            for (k, item) in map_pairs(v)? {
                pairs.push((json_key(&k)?, item));
            }
            if opts.sort_keys {
                pairs.sort_by(|a, b| a.0.cmp(&b.0));
            }
            if pairs.is_empty() {
                out.push_str("{}");
                return Ok(());
            }
            out.push('{');
            for (i, (k, item)) in pairs.iter().enumerate() {
                if i > 0 {
                    out.push_str(&opts.separators.0);
                }
                newline(out, opts, level + 1);
                write_json_str(out, k, opts.ensure_ascii);
                out.push_str(&opts.separators.1);
                write_json(out, item, opts, level + 1)?;
            }
            newline(out, opts, level);
            out.push('}');
        }
        kind => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                format!("tojson: object of kind {kind} is not JSON serializable"),
            ))
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_are_spelled_like_python_repr() {
        for (f, want) in [
            (1.0, "1.0"),
            (0.5, "0.5"),
            (21.5, "21.5"),
            (-0.0, "-0.0"),
            (1e16, "1e+16"),
            (1e15, "1000000000000000.0"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (1.5e300, "1.5e+300"),
            (123456.789, "123456.789"),
            (0.1 + 0.2, "0.30000000000000004"),
            (2.25, "2.25"),
        ] {
            assert_eq!(float_repr(f), want, "{f}");
        }
    }

    #[test]
    fn split_and_strip_follow_python() {
        assert_eq!(split("  a b\t\nc  ", None, -1).unwrap(), ["a", "b", "c"]);
        assert_eq!(split("a b c", None, 1).unwrap(), ["a", "b c"]);
        assert_eq!(
            split("a</think>b</think>c", Some("</think>"), 1).unwrap(),
            ["a", "b</think>c"]
        );
        assert_eq!(split("", Some(","), -1).unwrap(), [""]);
        assert!(split("", None, -1).unwrap().is_empty());
        assert!(split("x", Some(""), -1).is_err());
        assert_eq!(strip("\u{1f} x \n", None, true, true), "x");
        assert_eq!(strip("\n\nx\n", Some("\n"), true, false), "x\n");
    }

    #[test]
    fn str_and_repr_follow_python() {
        let v = Value::from_serialize(serde_json::json!({"a": [1, 2.5, null, true], "b'": "it's"}));
        assert_eq!(
            str(&v).unwrap(),
            r#"{'a': [1, 2.5, None, True], "b'": "it's"}"#
        );
        assert_eq!(str(&Value::from(())).unwrap(), "None");
        assert_eq!(str(&Value::UNDEFINED).unwrap(), "");
        assert_eq!(
            str_repr("a\u{3000}\u{a0}\u{7f}é\u{e000}"),
            r"'a\u3000\xa0\x7fé\ue000'"
        );
        assert_eq!(
            title("hello wORLD it's o'neil 3rd"),
            "Hello World It'S O'Neil 3Rd"
        );
    }

    #[test]
    fn json_dumps_follows_python() {
        let v =
            Value::from_serialize(serde_json::json!({"z": "é\n\"<&>", "a": [1, 0.5, {}], "e": []}));
        let compact = JsonOptions {
            ensure_ascii: false,
            indent: None,
            separators: (", ".into(), ": ".into()),
            sort_keys: false,
        };
        assert_eq!(
            json_dumps(&v, &compact).unwrap(),
            r#"{"z": "é\n\"<&>", "a": [1, 0.5, {}], "e": []}"#
        );
        let pretty = JsonOptions {
            ensure_ascii: true,
            indent: Some("  ".into()),
            separators: (",".into(), ": ".into()),
            sort_keys: true,
        };
        assert_eq!(
            json_dumps(&v, &pretty).unwrap(),
            "{\n  \"a\": [\n    1,\n    0.5,\n    {}\n  ],\n  \"e\": [],\n  \"z\": \"\\u00e9\\n\\\"<&>\"\n}"
        );
    }
}
