//! Validation of safetensors headers, which are untrusted bytes.
//!
//! Layout: 8 bytes little-endian header length `n`, `n` bytes of JSON, then the
//! data section. Every entry is checked: known dtype, shape product without
//! overflow, `data_offsets` inside the data section, byte span equal to
//! shape × dtype size, no two tensors overlapping, and no key given twice (JSON
//! parsers disagree on which of two equal keys wins, so a header with one is refused).

use std::collections::BTreeMap;
use std::ops::Range;

use serde_json::Value;

/// Largest header accepted (the format's own limit is 100 MB).
pub const MAX_HEADER_LEN: u64 = 100_000_000;

/// One tensor entry of a validated header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeaderEntry {
    /// The safetensors dtype spelling (`BF16`, `F8_E4M3`, …).
    pub dtype: String,
    /// Shape, outermost dimension first.
    pub shape: Vec<usize>,
    /// Byte range relative to the start of the file (not of the data section).
    pub file_range: Range<usize>,
}

/// A validated header.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Header {
    /// Tensors by name.
    pub tensors: BTreeMap<String, HeaderEntry>,
    /// The free-form `__metadata__` map.
    pub metadata: BTreeMap<String, String>,
    /// Offset of the data section in the file (8 + header length).
    pub data_start: usize,
}

/// Bytes per element of a safetensors dtype spelling; `None` if unknown.
pub fn dtype_size(dtype: &str) -> Option<usize> {
    Some(match dtype {
        "BOOL" | "U8" | "I8" | "F8_E4M3" | "F8_E5M2" | "F8_E8M0" => 1,
        "I16" | "U16" | "F16" | "BF16" => 2,
        "I32" | "U32" | "F32" => 4,
        "I64" | "U64" | "F64" => 8,
        _ => return None,
    })
}

/// Reads the 8-byte length prefix from the first bytes of a file of `file_len` bytes,
/// checking it against the file size. Returns the header length.
pub fn header_len(prefix: &[u8], file_len: u64) -> Result<usize, String> {
    if file_len < 8 || prefix.len() < 8 {
        return Err(format!(
            "file is {file_len} bytes, too short for the 8-byte header length"
        ));
    }
    let n = u64::from_le_bytes(prefix[..8].try_into().expect("8 bytes"));
    if n > MAX_HEADER_LEN {
        return Err(format!(
            "header length {n} exceeds the limit of {MAX_HEADER_LEN} bytes"
        ));
    }
    if n > file_len - 8 {
        return Err(format!(
            "header length {n} runs past the end of the file ({} bytes after the length prefix)",
            file_len - 8
        ));
    }
    Ok(n as usize)
}

/// Parses and validates a header's JSON (`json` = the `n` bytes after the length prefix)
/// for a file of `file_len` bytes.
pub fn parse_header(json: &[u8], file_len: u64) -> Result<Header, String> {
    let data_start = 8 + json.len();
    let data_len = (file_len as usize)
        .checked_sub(data_start)
        .ok_or("header runs past the end of the file")?;
    let text = std::str::from_utf8(json).map_err(|e| format!("header is not UTF-8: {e}"))?;
    let mut header = Header {
        data_start,
        ..Header::default()
    };
    // Well-formed headers take the typed parse (no JSON tree per tensor); anything it
    // rejects is parsed again generically, which names what is wrong.
    match serde_json::from_str::<FastHeader>(text) {
        Ok(fast) => {
            header.metadata = fast.metadata;
            for (name, e) in fast.tensors {
                let entry = check_entry(
                    &name,
                    &e.dtype,
                    e.shape,
                    e.data_offsets,
                    data_start,
                    data_len,
                )?;
                if header.tensors.insert(name.clone(), entry).is_some() {
                    return Err(duplicate_key(&name, "the header"));
                }
            }
        }
        Err(_) => {
            crate::json::check_no_duplicate_keys(text.as_bytes())?;
            parse_generic(text, data_start, data_len, &mut header)?
        }
    }
    check_no_overlap(&header)?;
    Ok(header)
}

fn duplicate_key(key: &str, within: &str) -> String {
    format!("key \"{key}\" appears twice in {within} (each key once expected)")
}

/// No two tensors share a byte. Zero-length tensors hold no bytes and are skipped (so
/// one lying between two overlapping tensors cannot hide them); every other span is
/// compared with the furthest end seen so far in start order, not just its neighbour.
fn check_no_overlap(header: &Header) -> Result<(), String> {
    let mut spans: Vec<(&String, &Range<usize>)> = header
        .tensors
        .iter()
        .map(|(n, e)| (n, &e.file_range))
        .filter(|(_, r)| !r.is_empty())
        .collect();
    spans.sort_by_key(|(_, r)| (r.start, r.end));
    let mut furthest: Option<(&String, &Range<usize>)> = None;
    for (name, r) in spans {
        if let Some((prev, pr)) = furthest {
            if r.start < pr.end {
                let base = header.data_start;
                return Err(format!(
                    "tensors \"{prev}\" (data_offsets [{}, {}]) and \"{name}\" (data_offsets [{}, {}]) overlap in the data section",
                    pr.start - base,
                    pr.end - base,
                    r.start - base,
                    r.end - base
                ));
            }
        }
        if furthest.is_none_or(|(_, pr)| r.end > pr.end) {
            furthest = Some((name, r));
        }
    }
    Ok(())
}

/// The typed form of a well-formed header.
struct FastHeader {
    tensors: Vec<(String, FastEntry)>,
    metadata: BTreeMap<String, String>,
}

#[derive(serde::Deserialize)]
struct FastEntry {
    dtype: String,
    shape: Vec<usize>,
    data_offsets: (u64, u64),
}

impl<'de> serde::Deserialize<'de> for FastHeader {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = FastHeader;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a safetensors header object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut m: A,
            ) -> Result<FastHeader, A::Error> {
                let mut h = FastHeader {
                    tensors: Vec::with_capacity(m.size_hint().unwrap_or(0)),
                    metadata: BTreeMap::new(),
                };
                let mut seen_metadata = false;
                while let Some(k) = m.next_key::<String>()? {
                    if k == "__metadata__" {
                        if std::mem::replace(&mut seen_metadata, true) {
                            return Err(serde::de::Error::custom("duplicate __metadata__"));
                        }
                        h.metadata = m.next_value::<crate::json::UniqueKeys<String>>()?.0;
                    } else {
                        h.tensors.push((k, m.next_value()?));
                    }
                }
                Ok(h)
            }
        }
        d.deserialize_map(V)
    }
}

/// Checks one entry: known dtype, offsets inside the data section, span = shape × size.
fn check_entry(
    name: &str,
    dtype: &str,
    shape: Vec<usize>,
    (begin, end): (u64, u64),
    data_start: usize,
    data_len: usize,
) -> Result<HeaderEntry, String> {
    let size =
        dtype_size(dtype).ok_or_else(|| format!("tensor \"{name}\": unknown dtype \"{dtype}\""))?;
    if begin > end || end > data_len as u64 {
        return Err(format!(
            "tensor \"{name}\": data_offsets [{begin}, {end}] lie outside the data section of {data_len} bytes"
        ));
    }
    let numel = shape
        .iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| format!("tensor \"{name}\": shape {shape:?} overflows"))?;
    let want = numel
        .checked_mul(size)
        .ok_or_else(|| format!("tensor \"{name}\": shape {shape:?} overflows"))?;
    if (end - begin) as usize != want {
        return Err(format!(
            "tensor \"{name}\": {dtype} {shape:?} needs {want} bytes but data_offsets span {}",
            end - begin
        ));
    }
    Ok(HeaderEntry {
        dtype: dtype.to_string(),
        shape,
        file_range: data_start + begin as usize..data_start + end as usize,
    })
}

/// The generic parse of a header the typed parse rejected: names the first problem.
fn parse_generic(
    text: &str,
    data_start: usize,
    data_len: usize,
    header: &mut Header,
) -> Result<(), String> {
    // The writer pads with spaces; trailing whitespace is fine for serde_json.
    let root: Value =
        serde_json::from_str(text).map_err(|e| format!("header is not valid JSON: {e}"))?;
    let obj = root.as_object().ok_or("header is not a JSON object")?;
    for (name, entry) in obj {
        if name == "__metadata__" {
            let m = entry.as_object().ok_or("__metadata__ is not an object")?;
            for (k, v) in m {
                let s = v
                    .as_str()
                    .ok_or_else(|| format!("__metadata__ value for \"{k}\" is not a string"))?;
                header.metadata.insert(k.clone(), s.to_string());
            }
            continue;
        }
        let e = entry
            .as_object()
            .ok_or_else(|| format!("tensor \"{name}\": entry is not an object"))?;
        let dtype = e
            .get("dtype")
            .and_then(Value::as_str)
            .ok_or_else(|| format!("tensor \"{name}\": missing dtype"))?;
        let shape: Vec<usize> = e
            .get("shape")
            .and_then(Value::as_array)
            .ok_or_else(|| format!("tensor \"{name}\": missing shape"))?
            .iter()
            .map(|d| d.as_u64().and_then(|d| usize::try_from(d).ok()))
            .collect::<Option<_>>()
            .ok_or_else(|| {
                format!("tensor \"{name}\": shape must be a list of non-negative integers")
            })?;
        let offsets = e
            .get("data_offsets")
            .and_then(Value::as_array)
            .filter(|a| a.len() == 2)
            .ok_or_else(|| format!("tensor \"{name}\": data_offsets must be [begin, end]"))?;
        let offsets = match (offsets[0].as_u64(), offsets[1].as_u64()) {
            (Some(b), Some(e)) => (b, e),
            _ => {
                return Err(format!(
                    "tensor \"{name}\": data_offsets must be non-negative integers"
                ))
            }
        };
        let entry = check_entry(name, dtype, shape, offsets, data_start, data_len)?;
        header.tensors.insert(name.clone(), entry);
    }
    Ok(())
}

/// Validates a whole in-memory safetensors file.
pub fn parse_file_bytes(bytes: &[u8]) -> Result<Header, String> {
    let n = header_len(bytes, bytes.len() as u64)?;
    parse_header(&bytes[8..8 + n], bytes.len() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn file(header: &str, data_len: usize) -> Vec<u8> {
        let mut v = (header.len() as u64).to_le_bytes().to_vec();
        v.extend_from_slice(header.as_bytes());
        v.resize(v.len() + data_len, 0);
        v
    }

    #[test]
    fn accepts_a_valid_file() {
        let h = parse_file_bytes(&file(
            r#"{"__metadata__":{"format":"pt"},"a":{"dtype":"BF16","shape":[2,3],"data_offsets":[0,12]},"b":{"dtype":"F32","shape":[1],"data_offsets":[12,16]}}"#,
            16,
        ))
        .unwrap();
        assert_eq!(h.tensors["a"].shape, vec![2, 3]);
        assert_eq!(h.metadata["format"], "pt");
        assert_eq!(h.tensors["b"].file_range.len(), 4);
    }

    #[test]
    fn rejects_bad_headers_with_reasons() {
        let cases = [
            (
                r#"{"a":{"dtype":"BF16","shape":[2,3],"data_offsets":[0,10]}}"#,
                16,
                "needs 12 bytes",
            ),
            (
                r#"{"a":{"dtype":"F32","shape":[4],"data_offsets":[8,24]}}"#,
                16,
                "outside the data section",
            ),
            (
                r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}"#,
                16,
                "overlap",
            ),
            (
                r#"{"a":{"dtype":"Q9","shape":[2],"data_offsets":[0,2]}}"#,
                16,
                "unknown dtype",
            ),
            (
                r#"{"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}}"#,
                16,
                "non-negative",
            ),
            (r#"{"a":1}"#, 0, "not an object"),
            (r#"[1,2]"#, 0, "not a JSON object"),
            (r#"{"a":"#, 0, "not valid JSON"),
            (
                r#"{"a":{"dtype":"F32","shape":[4294967296,4294967296,4294967296],"data_offsets":[0,4]}}"#,
                16,
                "overflows",
            ),
        ];
        for (h, data, want) in cases {
            let err = parse_file_bytes(&file(h, data)).unwrap_err();
            assert!(err.contains(want), "{h}: got {err:?}, wanted {want:?}");
        }
    }

    #[test]
    fn rejects_truncated_and_oversized_lengths() {
        assert!(parse_file_bytes(&[1, 2, 3])
            .unwrap_err()
            .contains("too short"));
        let mut v = 1000u64.to_le_bytes().to_vec();
        v.extend_from_slice(b"{}");
        assert!(parse_file_bytes(&v).unwrap_err().contains("past the end"));
        let v = u64::MAX.to_le_bytes().to_vec();
        assert!(parse_file_bytes(&v)
            .unwrap_err()
            .contains("exceeds the limit"));
    }

    /// Mutation testing found these unchecked (TESTING.md): each case pins one decision.
    #[test]
    fn dtype_sizes_follow_the_safetensors_specification() {
        // The sizes the safetensors format defines for each dtype spelling.
        for (dtype, size) in [
            ("BOOL", 1),
            ("F8_E4M3", 1),
            ("BF16", 2),
            ("U16", 2),
            ("F32", 4),
            ("I32", 4),
            ("I64", 8),
            ("U64", 8),
            ("F64", 8),
        ] {
            assert_eq!(dtype_size(dtype), Some(size), "{dtype}");
            let h = format!(
                r#"{{"t":{{"dtype":"{dtype}","shape":[2],"data_offsets":[0,{}]}}}}"#,
                2 * size
            );
            assert!(parse_file_bytes(&file(&h, 2 * size)).is_ok(), "{dtype}");
        }
        assert_eq!(dtype_size("F128"), None);
    }

    #[test]
    fn the_length_prefix_is_checked_on_both_the_prefix_and_the_file() {
        // A short prefix of a long file, and a long prefix of a short file: both refused.
        assert!(header_len(&[0u8; 4], 1000)
            .unwrap_err()
            .contains("too short"));
        assert!(header_len(&[0u8; 8], 4).unwrap_err().contains("too short"));
        // The limit itself is allowed; one byte more is not.
        let at = |n: u64| header_len(&n.to_le_bytes(), n + 8);
        assert_eq!(at(MAX_HEADER_LEN), Ok(MAX_HEADER_LEN as usize));
        assert!(at(MAX_HEADER_LEN + 1)
            .unwrap_err()
            .contains("exceeds the limit"));
        // A header that ends exactly at the end of the file is fine.
        assert_eq!(header_len(&2u64.to_le_bytes(), 10), Ok(2));
    }

    #[test]
    fn an_overlap_with_any_earlier_span_is_found() {
        // c overlaps b only (not a): the furthest end seen must advance past a's.
        let h = r#"{"a":{"dtype":"U8","shape":[10],"data_offsets":[0,10]},"b":{"dtype":"U8","shape":[10],"data_offsets":[10,20]},"c":{"dtype":"U8","shape":[10],"data_offsets":[15,25]}}"#;
        let err = parse_file_bytes(&file(h, 25)).unwrap_err();
        assert!(err.contains("\"b\"") && err.contains("\"c\""), "{err}");
        // Adjacent spans do not overlap.
        let ok = r#"{"a":{"dtype":"U8","shape":[10],"data_offsets":[0,10]},"b":{"dtype":"U8","shape":[10],"data_offsets":[10,20]}}"#;
        assert!(parse_file_bytes(&file(ok, 20)).is_ok());
    }

    #[test]
    fn well_formed_headers_take_the_typed_parse() {
        // The typed parse is the fast path: it must accept what the writer produces, with
        // the metadata apart from the tensors.
        let h = r#"{"__metadata__":{"format":"pt"},"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}"#;
        let fast: FastHeader = serde_json::from_str(h).unwrap();
        let names: Vec<&str> = fast.tensors.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["a", "b"]);
        assert_eq!(fast.metadata["format"], "pt");
        let err = serde_json::from_str::<FastHeader>("[1]")
            .err()
            .expect("an array is refused");
        assert!(
            err.to_string().contains("safetensors header object"),
            "{err}"
        );
    }

    #[test]
    fn the_generic_parse_names_the_entry_at_fault() {
        // The typed parse rejects the bad shape of "b"; the generic parse must get through
        // a valid "a" (and the metadata) to name it.
        let h = r#"{"__metadata__":{"format":"pt"},"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":"x","data_offsets":[4,8]}}"#;
        let err = parse_file_bytes(&file(h, 8)).unwrap_err();
        assert!(err.contains("tensor \"b\": missing shape"), "{err}");
    }

    proptest! {
        /// Arbitrary bytes never panic the parser, and whatever it accepts is in bounds.
        #[test]
        fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            if let Ok(h) = parse_file_bytes(&bytes) {
                for e in h.tensors.values() {
                    prop_assert!(e.file_range.end <= bytes.len());
                }
            }
        }

        /// Mutating one byte of a valid header never panics and never yields out-of-bounds ranges.
        #[test]
        fn mutated_headers_stay_in_bounds(pos in 0usize..120, byte in any::<u8>()) {
            let mut f = file(r#"{"a":{"dtype":"BF16","shape":[2,3],"data_offsets":[0,12]},"b":{"dtype":"F32","shape":[1],"data_offsets":[12,16]}}"#, 16);
            let pos = pos % f.len();
            f[pos] = byte;
            if let Ok(h) = parse_file_bytes(&f) {
                for e in h.tensors.values() {
                    prop_assert!(e.file_range.end <= f.len());
                    prop_assert!(e.file_range.start <= e.file_range.end);
                }
            }
        }
    }
}
