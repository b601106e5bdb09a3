//! Arrays: a prefix of positional schemas (`prefixItems`, or `items` as an array), then
//! items of one schema (`items`, or `additionalItems` after an array `items`), counted.

use super::visit::{empty, EMPTY};
use super::{err, pointer_child, Conv, SchemaError};
use serde_json::{Map, Value};

/// Largest item count written into the grammar (larger bounds are relaxed).
const MAX_COUNT: u64 = 10_000;

impl Conv<'_> {
    pub(crate) fn array(
        &mut self,
        o: &Map<String, Value>,
        path: &str,
    ) -> Result<String, SchemaError> {
        let ws = self.prim("ws");
        let count = |k: &str| -> Result<Option<u64>, SchemaError> {
            match o.get(k) {
                None => Ok(None),
                Some(v) => match v.as_u64().or_else(|| {
                    v.as_f64()
                        .filter(|f| *f >= 0.0 && f.fract() == 0.0)
                        .map(|f| f as u64)
                }) {
                    Some(n) => Ok(Some(n)),
                    None => err(path, k, "must be a non-negative integer"),
                },
            }
        };
        let mut min = count("minItems")?.unwrap_or(0);
        let mut max = count("maxItems")?;
        if max.is_some_and(|m| m < min) {
            return empty(path, "maxItems", "below minItems");
        }
        if min > MAX_COUNT {
            self.relax(
                path,
                "minItems",
                format!("counts above {MAX_COUNT} are checked after generation"),
            );
            min = 0;
        }
        if max.is_some_and(|m| m > MAX_COUNT) {
            self.relax(
                path,
                "maxItems",
                format!("counts above {MAX_COUNT} are checked after generation"),
            );
            max = None;
        }
        let mut prefix = Vec::new();
        let (tuple, tail_key) = match (o.get("prefixItems"), o.get("items")) {
            (Some(Value::Array(p)), _) => (Some(("prefixItems", p)), "items"),
            (Some(_), _) => return err(path, "prefixItems", "must be an array of schemas"),
            (None, Some(Value::Array(p))) => (Some(("items", p)), "additionalItems"),
            _ => (None, "items"),
        };
        let mut cut = None;
        if let Some((key, p)) = tuple {
            for (i, s) in p.iter().enumerate() {
                let sp = pointer_child(&pointer_child(path, key), &i.to_string());
                match self.visit(s, &sp) {
                    Ok(g) => prefix.push(g),
                    Err(e) if e.msg.starts_with(EMPTY) => {
                        // No array has an item here: at most i items.
                        cut = Some(i as u64);
                        break;
                    }
                    Err(e) => return Err(e),
                }
            }
        }
        let item = if cut.is_some() {
            None
        } else {
            match o.get(tail_key) {
                Some(Value::Bool(false)) => None,
                None => Some(self.prim("value")),
                Some(s) => match self.visit(s, &pointer_child(path, tail_key)) {
                    Ok(g) => Some(g),
                    Err(e) if e.msg.starts_with(EMPTY) => None,
                    Err(e) => return Err(e),
                },
            }
        };
        if let Some(c) = cut {
            max = Some(max.map_or(c, |m| m.min(c)));
        }
        let p = prefix.len() as u64;
        let eff_p = max.map_or(p, |m| m.min(p));
        if item.is_none() && min > p {
            return empty(
                path,
                "minItems",
                "more items required than the schema allows",
            );
        }
        let quant = |lo: u64, hi: Option<u64>| -> String {
            match hi {
                None if lo == 0 => "*".to_string(),
                None if lo == 1 => "+".to_string(),
                None => format!("{{{lo},}}"),
                Some(h) if h == lo => format!("{{{lo}}}"),
                Some(h) => format!("{{{lo},{h}}}"),
            }
        };
        // Tail after j >= p present elements, each preceded by a comma.
        let tail = |j: u64| -> String {
            match &item {
                None => String::new(),
                Some(it) => {
                    let lo = min.saturating_sub(j);
                    let hi = max.map(|m| m.saturating_sub(j));
                    if hi == Some(0) {
                        return String::new();
                    }
                    format!("( \",\" {ws} {it} {ws} ){}", quant(lo, hi))
                }
            }
        };
        let body = if eff_p == 0 {
            match &item {
                Some(it) if max != Some(0) => {
                    let hi = max.map(|m| m - 1);
                    let more = if hi == Some(0) {
                        String::new()
                    } else {
                        format!(
                            "( \",\" {ws} {it} {ws} ){}",
                            quant(min.saturating_sub(1), hi)
                        )
                    };
                    let first = format!("{it} {ws} {more}");
                    if min == 0 {
                        format!("( {first} )?")
                    } else {
                        first
                    }
                }
                _ => String::new(),
            }
        } else {
            // after(j): elements j.. given j >= 1 present.
            let mut after = if eff_p == p { tail(p) } else { String::new() };
            for j in (1..eff_p).rev() {
                let e = format!("\",\" {ws} {} {ws} {after}", prefix[j as usize]);
                after = if j < min { e } else { format!("( {e} )?") };
            }
            let e = format!("{} {ws} {after}", prefix[0]);
            if min >= 1 {
                e
            } else {
                format!("( {e} )?")
            }
        };
        Ok(self.add_rule(&format!("{path}-array"), format!("\"[\" {ws} {body} \"]\"")))
    }
}
