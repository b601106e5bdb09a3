//! JSON helpers for untrusted files: duplicate keys are refused, not resolved.
//!
//! serde_json (like Python's `json`) keeps the last of two equal keys in an object;
//! other readers keep the first. A file whose meaning depends on the reader is refused.

use std::collections::{BTreeMap, HashSet};
use std::fmt;

use serde::de::{Deserialize, Deserializer, Error, MapAccess, SeqAccess, Visitor};

/// A JSON object deserialized into a sorted map, refusing a key given twice.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UniqueKeys<V>(pub BTreeMap<String, V>);

impl<'de, V: Deserialize<'de>> Deserialize<'de> for UniqueKeys<V> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Vis<V>(std::marker::PhantomData<V>);
        impl<'de, V: Deserialize<'de>> Visitor<'de> for Vis<V> {
            type Value = UniqueKeys<V>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an object with distinct keys")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<Self::Value, A::Error> {
                let mut out = BTreeMap::new();
                while let Some(k) = m.next_key::<String>()? {
                    let v = m.next_value()?;
                    if out.contains_key(&k) {
                        return Err(A::Error::custom(format!(
                            "key \"{k}\" appears twice (each key once expected)"
                        )));
                    }
                    out.insert(k, v);
                }
                Ok(UniqueKeys(out))
            }
        }
        d.deserialize_map(Vis(std::marker::PhantomData))
    }
}

/// Walks any JSON value and fails on the first object that repeats a key.
struct NoDuplicates;

impl<'de> Deserialize<'de> for NoDuplicates {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(NoDuplicatesVisitor)
    }
}

struct NoDuplicatesVisitor;

impl<'de> Visitor<'de> for NoDuplicatesVisitor {
    type Value = NoDuplicates;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_bool<E: Error>(self, _: bool) -> Result<NoDuplicates, E> {
        Ok(NoDuplicates)
    }
    fn visit_i64<E: Error>(self, _: i64) -> Result<NoDuplicates, E> {
        Ok(NoDuplicates)
    }
    fn visit_u64<E: Error>(self, _: u64) -> Result<NoDuplicates, E> {
        Ok(NoDuplicates)
    }
    fn visit_f64<E: Error>(self, _: f64) -> Result<NoDuplicates, E> {
        Ok(NoDuplicates)
    }
    fn visit_str<E: Error>(self, _: &str) -> Result<NoDuplicates, E> {
        Ok(NoDuplicates)
    }
    fn visit_unit<E: Error>(self) -> Result<NoDuplicates, E> {
        Ok(NoDuplicates)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut s: A) -> Result<NoDuplicates, A::Error> {
        while s.next_element::<NoDuplicates>()?.is_some() {}
        Ok(NoDuplicates)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<NoDuplicates, A::Error> {
        let mut seen = HashSet::new();
        while let Some(k) = m.next_key::<String>()? {
            if seen.contains(&k) {
                return Err(A::Error::custom(format!(
                    "key \"{k}\" appears twice in one object (each key once expected)"
                )));
            }
            seen.insert(k);
            m.next_value::<NoDuplicates>()?;
        }
        Ok(NoDuplicates)
    }
}

/// Checks that no object anywhere in `text` repeats a key; the error names the key.
/// Text that is not JSON passes (the caller's own parse reports that).
pub fn check_no_duplicate_keys(text: &[u8]) -> Result<(), String> {
    let mut de = serde_json::Deserializer::from_slice(text);
    match NoDuplicates::deserialize(&mut de) {
        Ok(_) => Ok(()),
        Err(e) if e.is_data() => Err(format!("{e}")),
        Err(_) => Ok(()),
    }
}
