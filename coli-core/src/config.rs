//! `config.json`: the keys all families share, in both their old and new spellings.
//!
//! Family files deserialize their own `Config` struct from [`RawConfig::value`];
//! this module owns the keys whose spelling changed across `transformers`
//! versions (`rope_theta`/`rope_scaling` vs `rope_parameters`) and the ones with
//! several shapes (`eos_token_id` as an int or a list).

use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::error::{CoreError, Result};

/// A parsed `config.json` with the path it came from (for error messages).
#[derive(Clone, Debug)]
pub struct RawConfig {
    /// Where the config was read from.
    pub path: PathBuf,
    /// The whole JSON object (a `text_config`'s keys read as the top level: see
    /// [`RawConfig::parse`]).
    pub value: Value,
    /// The object as the file has it, for writing a config back.
    pub as_written: Value,
}

/// How RoPE frequencies are scaled.
#[derive(Clone, Debug, PartialEq)]
pub enum RopeScaling {
    /// Plain RoPE.
    None,
    /// Llama 3.1's frequency-dependent scaling.
    Llama3 {
        /// Overall scale factor.
        factor: f64,
        /// Wavelength ratio below which frequencies are divided by `factor`.
        low_freq_factor: f64,
        /// Wavelength ratio above which frequencies are kept.
        high_freq_factor: f64,
        /// Context length the model was trained with before scaling.
        original_max_position_embeddings: f64,
    },
    /// Linear position interpolation (`inv_freq / factor`).
    Linear {
        /// Scale factor.
        factor: f64,
    },
    /// YaRN (DeepSeek-V3, Kimi-K2): frequencies blended between interpolation and
    /// extrapolation by a linear ramp over the correction range, cos/sin scaled by
    /// the attention factor.
    Yarn(YarnParameters),
}

/// YaRN settings as `transformers` reads them (missing keys take its defaults).
#[derive(Clone, Debug, PartialEq)]
pub struct YarnParameters {
    /// Context extension factor.
    pub factor: f64,
    /// Rotations at which extrapolation stops (default 32).
    pub beta_fast: f64,
    /// Rotations at which interpolation starts (default 1).
    pub beta_slow: f64,
    /// Context length before extension (falls back to `max_position_embeddings`).
    pub original_max_position_embeddings: f64,
    /// Explicit cos/sin scale, if given.
    pub attention_factor: Option<f64>,
    /// `mscale` (numerator of the inferred attention factor).
    pub mscale: Option<f64>,
    /// `mscale_all_dim` (denominator; DeepSeek also scales the softmax by its square).
    pub mscale_all_dim: Option<f64>,
    /// Round the correction range outward to integers (default true).
    pub truncate: bool,
}

/// YaRN's magnitude correction `0.1 * mscale * ln(scale) + 1` (1 when `scale <= 1`).
pub fn yarn_get_mscale(scale: f64, mscale: f64) -> f64 {
    if scale <= 1.0 {
        1.0
    } else {
        0.1 * mscale * scale.ln() + 1.0
    }
}

impl YarnParameters {
    /// The factor applied to cos and sin: explicit, or inferred from `factor`, `mscale`
    /// and `mscale_all_dim` exactly as `transformers` does.
    pub fn attention_factor(&self) -> f64 {
        if let Some(a) = self.attention_factor {
            return a;
        }
        match (self.mscale, self.mscale_all_dim) {
            (Some(m), Some(d)) if m != 0.0 && d != 0.0 => {
                yarn_get_mscale(self.factor, m) / yarn_get_mscale(self.factor, d)
            }
            _ => yarn_get_mscale(self.factor, 1.0),
        }
    }
}

/// RoPE base and scaling, whichever way the config spells them.
#[derive(Clone, Debug, PartialEq)]
pub struct RopeParameters {
    /// The base θ.
    pub theta: f64,
    /// Frequency scaling.
    pub scaling: RopeScaling,
}

impl RawConfig {
    /// Reads and parses `path` (a `config.json`).
    pub fn read(path: &Path) -> Result<RawConfig> {
        let text = std::fs::read_to_string(path).map_err(|e| CoreError::io(path, e))?;
        Self::parse(path, &text)
    }

    /// Parses config text; `path` is only used in messages. A multimodal checkpoint's
    /// text model keeps its keys in `text_config` (Qwen3.5-MoE, beside a
    /// `vision_config`): they are read as if written at the top level, as transformers'
    /// `get_text_config()` gives them, the wrapper's own non-null keys (and its
    /// `model_type`) first.
    pub fn parse(path: &Path, text: &str) -> Result<RawConfig> {
        let written: Value = serde_json::from_str(text).map_err(|e| CoreError::Config {
            path: path.to_path_buf(),
            msg: format!("not valid JSON: {e}"),
        })?;
        if !written.is_object() {
            return Err(CoreError::Config {
                path: path.to_path_buf(),
                msg: "expected a JSON object at the top level".into(),
            });
        }
        let mut value = written.clone();
        if let Some(Value::Object(inner)) = value.get("text_config").cloned() {
            let obj = value.as_object_mut().expect("checked above");
            for (k, v) in inner {
                let taken = obj.get(&k).is_some_and(|x| !x.is_null());
                if !taken && k != "model_type" {
                    obj.insert(k, v);
                }
            }
        }
        Ok(RawConfig {
            path: path.to_path_buf(),
            value,
            as_written: written,
        })
    }

    /// An error about this config naming `key`.
    pub fn error(&self, key: &str, msg: impl std::fmt::Display) -> CoreError {
        CoreError::Config {
            path: self.path.clone(),
            msg: format!("key \"{key}\": {msg}"),
        }
    }

    /// `model_type`, required.
    pub fn model_type(&self) -> Result<&str> {
        self.value
            .get("model_type")
            .and_then(Value::as_str)
            .ok_or_else(|| self.error("model_type", "missing or not a string"))
    }

    /// Deserializes the whole config into a family's `Config` struct.
    pub fn deserialize<T: DeserializeOwned>(&self) -> Result<T> {
        serde_json::from_value(self.value.clone()).map_err(|e| CoreError::Config {
            path: self.path.clone(),
            msg: format!("does not match the family's config: {e}"),
        })
    }

    /// [`RawConfig::deserialize`], first renaming keys a family's configuration class
    /// accepts under another name: each `(alias, key)` pair is one entry of its
    /// `attribute_map` in `transformers` (a config saved by one version may spell `key` as
    /// `alias`). An alias is copied to `key` when `key` is absent; both present with
    /// different values is an error naming the two. An alias `outer.inner` names a key
    /// inside an object (transformers 5 moves `partial_rotary_factor` into
    /// `rope_parameters`).
    pub fn deserialize_aliased<T: DeserializeOwned>(&self, aliases: &[(&str, &str)]) -> Result<T> {
        let mut value = self.value.clone();
        let obj = value
            .as_object_mut()
            .expect("RawConfig holds an object (checked at parse)");
        for &(alias, key) in aliases {
            let found = match alias.split_once('.') {
                Some((outer, inner)) => obj.get(outer).and_then(|o| o.get(inner)),
                None => obj.get(alias),
            };
            let Some(a) = found.filter(|v| !v.is_null()).cloned() else {
                continue;
            };
            match obj.get(key).filter(|v| !v.is_null()) {
                None => {
                    obj.insert(key.to_string(), a);
                }
                Some(k) if *k == a => {}
                Some(k) => {
                    return Err(self.error(
                        key,
                        format!(
                        "{k} disagrees with \"{alias}\" ({a}), another name for the same setting"
                    ),
                    ))
                }
            }
        }
        serde_json::from_value(value).map_err(|e| CoreError::Config {
            path: self.path.clone(),
            msg: format!("does not match the family's config: {e}"),
        })
    }

    /// The FP8 block size `[rows, cols]` from `quantization_config` (DeepSeek-style
    /// `quant_method: "fp8"`, `fmt: "e4m3"`, `weight_block_size`); `None` without one.
    /// Any other quantization method is refused by name.
    pub fn fp8_block_size(&self) -> Result<Option<(usize, usize)>> {
        let Some(q) = self
            .value
            .get("quantization_config")
            .filter(|v| !v.is_null())
        else {
            return Ok(None);
        };
        let key = "quantization_config";
        let method = q.get("quant_method").and_then(Value::as_str).unwrap_or("");
        if method != "fp8" {
            return Err(self.error(
                key,
                format!("quant_method \"{method}\" is not supported (supported: fp8)"),
            ));
        }
        if let Some(fmt) = q.get("fmt").and_then(Value::as_str) {
            if fmt != "e4m3" {
                return Err(self.error(
                    key,
                    format!("fp8 fmt \"{fmt}\" is not supported (supported: e4m3)"),
                ));
            }
        }
        let block = q
            .get("weight_block_size")
            .and_then(Value::as_array)
            .and_then(|a| match a.as_slice() {
                [r, c] => Some((r.as_u64()? as usize, c.as_u64()? as usize)),
                _ => None,
            })
            .filter(|(r, c)| *r > 0 && *c > 0)
            .ok_or_else(|| {
                self.error(
                    key,
                    "weight_block_size must be two positive integers [rows, cols]",
                )
            })?;
        Ok(Some(block))
    }

    /// End-of-sequence ids: `eos_token_id` as an int, a list, or absent (empty).
    pub fn eos_token_ids(&self) -> Result<Vec<u32>> {
        match self.value.get("eos_token_id") {
            None | Some(Value::Null) => Ok(vec![]),
            Some(Value::Number(n)) => Ok(vec![self.id_of(n, "eos_token_id")?]),
            Some(Value::Array(items)) => items
                .iter()
                .map(|v| match v {
                    Value::Number(n) => self.id_of(n, "eos_token_id"),
                    other => {
                        Err(self.error("eos_token_id", format!("expected ints, found {other}")))
                    }
                })
                .collect(),
            Some(other) => Err(self.error(
                "eos_token_id",
                format!("expected an int or a list of ints, found {other}"),
            )),
        }
    }

    fn id_of(&self, n: &serde_json::Number, key: &str) -> Result<u32> {
        n.as_u64()
            .and_then(|v| u32::try_from(v).ok())
            .ok_or_else(|| self.error(key, format!("expected a non-negative token id, found {n}")))
    }

    /// RoPE θ and scaling from `rope_parameters` (new) or `rope_theta` + `rope_scaling` (old).
    /// `default_theta` is used when neither spelling gives a θ.
    pub fn rope_parameters(&self, default_theta: f64) -> Result<RopeParameters> {
        let new = self.value.get("rope_parameters").filter(|v| !v.is_null());
        let (theta, scaling_obj, key) = match new {
            Some(p) => {
                let theta = p
                    .get("rope_theta")
                    .and_then(Value::as_f64)
                    .or_else(|| self.value.get("rope_theta").and_then(Value::as_f64))
                    .unwrap_or(default_theta);
                (theta, Some(p), "rope_parameters")
            }
            None => {
                let theta = self
                    .value
                    .get("rope_theta")
                    .and_then(Value::as_f64)
                    .unwrap_or(default_theta);
                let s = self.value.get("rope_scaling").filter(|v| !v.is_null());
                (theta, s, "rope_scaling")
            }
        };
        if !(theta.is_finite() && theta > 1.0) {
            return Err(self.error(
                "rope_theta",
                format!("must be a finite number > 1, found {theta}"),
            ));
        }
        let scaling = match scaling_obj {
            None => RopeScaling::None,
            Some(obj) => {
                let kind = obj
                    .get("rope_type")
                    .or_else(|| obj.get("type"))
                    .and_then(Value::as_str)
                    .unwrap_or("default");
                let num = |k: &str| -> Result<f64> {
                    obj.get(k).and_then(Value::as_f64).ok_or_else(|| {
                        self.error(
                            key,
                            format!("rope_type \"{kind}\" needs the number \"{k}\""),
                        )
                    })
                };
                match kind {
                    "default" => RopeScaling::None,
                    "linear" => RopeScaling::Linear { factor: num("factor")? },
                    "yarn" => {
                        let opt = |k: &str| obj.get(k).and_then(Value::as_f64);
                        // transformers: `get(k) or default`, so a 0 also takes the default.
                        let or = |k: &str, d: f64| opt(k).filter(|v| *v != 0.0).unwrap_or(d);
                        let original = opt("original_max_position_embeddings")
                            .filter(|v| *v != 0.0)
                            .or_else(|| {
                                self.value
                                    .get("max_position_embeddings")
                                    .and_then(Value::as_f64)
                            })
                            .ok_or_else(|| {
                                self.error(
                                    key,
                                    "yarn needs original_max_position_embeddings or max_position_embeddings",
                                )
                            })?;
                        let p = YarnParameters {
                            factor: num("factor")?,
                            beta_fast: or("beta_fast", 32.0),
                            beta_slow: or("beta_slow", 1.0),
                            original_max_position_embeddings: original,
                            attention_factor: opt("attention_factor"),
                            mscale: opt("mscale"),
                            mscale_all_dim: opt("mscale_all_dim"),
                            truncate: obj.get("truncate").and_then(Value::as_bool).unwrap_or(true),
                        };
                        if !(p.factor.is_finite() && p.factor > 0.0) {
                            return Err(self.error(key, format!("yarn factor must be positive, found {}", p.factor)));
                        }
                        RopeScaling::Yarn(p)
                    }
                    "llama3" => RopeScaling::Llama3 {
                        factor: num("factor")?,
                        low_freq_factor: num("low_freq_factor")?,
                        high_freq_factor: num("high_freq_factor")?,
                        original_max_position_embeddings: num("original_max_position_embeddings")?,
                    },
                    other => {
                        return Err(self.error(
                            key,
                            format!("unsupported rope_type \"{other}\" (supported: default, linear, llama3, yarn)"),
                        ))
                    }
                }
            }
        };
        Ok(RopeParameters { theta, scaling })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(text: &str) -> RawConfig {
        RawConfig::parse(Path::new("config.json"), text).unwrap()
    }

    #[test]
    fn a_text_config_is_read_as_the_top_level_the_wrappers_keys_first() {
        let c = cfg(
            r#"{"model_type": "qwen3_5_moe", "tie_word_embeddings": false,
            "eos_token_id": null, "vision_config": {"depth": 27},
            "text_config": {"model_type": "qwen3_5_moe_text", "num_hidden_layers": 40,
                            "tie_word_embeddings": true, "eos_token_id": 7}}"#,
        );
        assert_eq!(c.model_type().unwrap(), "qwen3_5_moe");
        assert_eq!(c.value["num_hidden_layers"], 40);
        assert_eq!(c.value["tie_word_embeddings"], false);
        assert_eq!(c.eos_token_ids().unwrap(), vec![7]);
        // Nothing else moves.
        let plain = cfg(r#"{"model_type": "llama", "num_hidden_layers": 2}"#);
        assert_eq!(plain.value.as_object().unwrap().len(), 2);
    }

    #[test]
    fn aliases_fill_missing_keys_and_conflicts_are_errors() {
        #[derive(serde::Deserialize)]
        struct C {
            num_experts: usize,
        }
        let aliases = [("num_local_experts", "num_experts")];
        let c: C = cfg(r#"{"num_local_experts": 8}"#)
            .deserialize_aliased(&aliases)
            .unwrap();
        assert_eq!(c.num_experts, 8);
        let c: C = cfg(r#"{"num_experts": 4}"#)
            .deserialize_aliased(&aliases)
            .unwrap();
        assert_eq!(c.num_experts, 4);
        let c: C = cfg(r#"{"num_experts": 4, "num_local_experts": 4}"#)
            .deserialize_aliased(&aliases)
            .unwrap();
        assert_eq!(c.num_experts, 4);
        let e = cfg(r#"{"num_experts": 4, "num_local_experts": 8}"#)
            .deserialize_aliased::<C>(&aliases)
            .err()
            .unwrap()
            .to_string();
        assert!(
            e.contains("num_experts") && e.contains("num_local_experts"),
            "{e}"
        );
        assert!(cfg("{}").deserialize_aliased::<C>(&aliases).is_err());
        let nested = [("rope_parameters.num_local_experts", "num_experts")];
        let c: C = cfg(r#"{"rope_parameters": {"num_local_experts": 6}}"#)
            .deserialize_aliased(&nested)
            .unwrap();
        assert_eq!(c.num_experts, 6);
    }

    #[test]
    fn old_and_new_rope_keys_agree() {
        let old = cfg(
            r#"{"rope_theta": 500000.0, "rope_scaling": {"rope_type": "llama3", "factor": 8.0,
            "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}}"#,
        );
        let new = cfg(
            r#"{"rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
            "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}}"#,
        );
        let a = old.rope_parameters(10000.0).unwrap();
        assert_eq!(a, new.rope_parameters(10000.0).unwrap());
        assert_eq!(a.theta, 500000.0);
        assert!(matches!(a.scaling, RopeScaling::Llama3 { factor, .. } if factor == 8.0));
    }

    #[test]
    fn rope_defaults_and_errors() {
        let p = cfg("{}").rope_parameters(10000.0).unwrap();
        assert_eq!(
            p,
            RopeParameters {
                theta: 10000.0,
                scaling: RopeScaling::None
            }
        );
        let e = cfg(r#"{"rope_scaling": {"rope_type": "dynamic", "factor": 2}}"#)
            .rope_parameters(1e4)
            .unwrap_err();
        assert!(
            e.to_string().contains("unsupported rope_type \"dynamic\""),
            "{e}"
        );
        let e = cfg(r#"{"rope_theta": -3}"#)
            .rope_parameters(1e4)
            .unwrap_err();
        assert!(e.to_string().contains("rope_theta"), "{e}");
    }

    #[test]
    fn eos_as_int_list_or_absent() {
        assert_eq!(
            cfg(r#"{"eos_token_id": 2}"#).eos_token_ids().unwrap(),
            vec![2]
        );
        assert_eq!(
            cfg(r#"{"eos_token_id": [1, 7]}"#).eos_token_ids().unwrap(),
            vec![1, 7]
        );
        assert!(cfg("{}").eos_token_ids().unwrap().is_empty());
        assert!(cfg(r#"{"eos_token_id": "x"}"#).eos_token_ids().is_err());
        assert!(cfg(r#"{"eos_token_id": -1}"#).eos_token_ids().is_err());
    }

    #[test]
    fn model_type_required() {
        let e = cfg("{}").model_type().unwrap_err();
        assert!(e.to_string().contains("model_type"));
        assert!(RawConfig::parse(Path::new("c.json"), "[1]").is_err());
        assert!(RawConfig::parse(Path::new("c.json"), "{").is_err());
    }
}
