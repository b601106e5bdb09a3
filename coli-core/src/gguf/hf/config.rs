//! `config.json` from a GGUF's metadata: the keys every architecture shares, then each
//! architecture's own (`convert_hf_to_gguf.py` and its `conversion/` modules write them).

use std::collections::BTreeMap;

use serde_json::{json, Map, Value};

use super::Arch;
use crate::gguf::{GgufTensor, GgufValue};

/// Reads metadata keys of one architecture, each error naming the key.
struct Meta<'a> {
    m: &'a BTreeMap<String, GgufValue>,
    arch: Arch,
}

impl Meta<'_> {
    fn key(&self, k: &str) -> String {
        format!("{}.{k}", self.arch.key())
    }
    fn uint(&self, k: &str) -> Result<Option<usize>, String> {
        let key = self.key(k);
        match self.m.get(&key) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .map(|x| Some(x as usize))
                .ok_or_else(|| format!("metadata \"{key}\" = {v:?}, expected an unsigned integer")),
        }
    }
    fn need(&self, k: &str) -> Result<usize, String> {
        self.uint(k)?
            .ok_or_else(|| format!("missing metadata key \"{}\"", self.key(k)))
    }
    /// One expert's width: `expert_feed_forward_length`, else (older converters)
    /// `feed_forward_length`.
    fn expert_width(&self) -> Result<usize, String> {
        match self.uint("expert_feed_forward_length")? {
            Some(v) => Ok(v),
            None => self.need("feed_forward_length"),
        }
    }
    /// A positive finite float, or `None` when absent.
    fn float(&self, k: &str) -> Result<Option<f64>, String> {
        let key = self.key(k);
        match self.m.get(&key) {
            None => Ok(None),
            Some(v) => v
                .as_f64()
                .filter(|x| x.is_finite() && *x > 0.0)
                .map(|x| Some(shortest_f32(x)))
                .ok_or_else(|| format!("metadata \"{key}\" = {v:?}, expected a finite number > 0")),
        }
    }
}

/// An f32 widened to f64 prints as 9.999999747378752e-06; config.json holds the f32's
/// shortest decimal form, as the converter read it.
fn shortest_f32(x: f64) -> f64 {
    (x as f32).to_string().parse().unwrap_or(x)
}

/// `config.json` of the model a GGUF holds, from its metadata and tensor directory.
pub fn hf_config(
    arch: Arch,
    m: &BTreeMap<String, GgufValue>,
    tensors: &[GgufTensor],
) -> Result<Value, String> {
    let meta = Meta { m, arch };
    let hidden = meta.need("embedding_length")?;
    let n_heads = meta.need("attention.head_count")?;
    let n_kv = meta.uint("attention.head_count_kv")?.unwrap_or(n_heads);
    if n_heads == 0 || n_kv == 0 || !n_heads.is_multiple_of(n_kv) {
        return Err(format!(
            "metadata \"{}\" = {n_heads} and \"{}\" = {n_kv}: expected at least one head each, the KV heads dividing the query heads",
            meta.key("attention.head_count"),
            meta.key("attention.head_count_kv")
        ));
    }
    let head_dim = match meta.uint("attention.key_length")? {
        Some(d) => d,
        None if hidden.is_multiple_of(n_heads) => hidden / n_heads,
        None => {
            return Err(format!(
                "metadata \"{}\" = {hidden} does not split into {n_heads} heads",
                meta.key("embedding_length")
            ))
        }
    };
    let vocab = match m.get("tokenizer.ggml.tokens").and_then(GgufValue::as_array) {
        Some(t) => t.len(),
        None => tensors
            .iter()
            .find(|t| t.name == "token_embd.weight")
            .and_then(|t| t.dims.get(1).copied())
            .ok_or("no tokenizer.ggml.tokens and no token_embd.weight to size the vocabulary")?,
    };
    let tok_id = |key: &str| m.get(key).and_then(GgufValue::as_u64);
    let mut c = Map::new();
    let mut set = |k: &str, v: Value| {
        c.insert(k.to_string(), v);
    };
    set("hidden_size", json!(hidden));
    set("num_hidden_layers", json!(meta.need("block_count")?));
    set("num_attention_heads", json!(n_heads));
    set("num_key_value_heads", json!(n_kv));
    set("head_dim", json!(head_dim));
    set("vocab_size", json!(vocab));
    set(
        "max_position_embeddings",
        json!(meta.uint("context_length")?.unwrap_or(4096)),
    );
    if let Some(eps) = meta.float("attention.layer_norm_rms_epsilon")? {
        set("rms_norm_eps", json!(eps));
    }
    if let Some(theta) = meta.float("rope.freq_base")? {
        set("rope_theta", json!(theta));
    }
    set(
        "tie_word_embeddings",
        json!(!tensors.iter().any(|t| t.name == "output.weight")),
    );
    set("bos_token_id", json!(tok_id("tokenizer.ggml.bos_token_id")));
    set("eos_token_id", json!(tok_id("tokenizer.ggml.eos_token_id")));
    let has = |name: &str| tensors.iter().any(|t| t.name == name);
    match arch {
        Arch::Llama => match meta.uint("expert_count")?.unwrap_or(0) {
            0 => {
                set("model_type", json!("llama"));
                set(
                    "intermediate_size",
                    json!(meta.need("feed_forward_length")?),
                );
            }
            experts => {
                // Mixtral: the converter writes the experts' width as feed_forward_length.
                set("model_type", json!("mixtral"));
                set("num_local_experts", json!(experts));
                set(
                    "num_experts_per_tok",
                    json!(meta.need("expert_used_count")?),
                );
                let ff = meta.expert_width()?;
                set("intermediate_size", json!(ff));
                set("sliding_window", Value::Null);
            }
        },
        Arch::Deepseek2 => {
            let has_bias = tensors
                .iter()
                .any(|t| t.name.ends_with(".exp_probs_b.bias"));
            deepseek2_config(&meta, m, has_bias, &mut set)?
        }
        Arch::Glm4Moe => glm4moe_config(&meta, m, tensors, head_dim, &mut set)?,
        Arch::GptOss => gpt_oss_config(&meta, m, &has, &mut set)?,
        Arch::Qwen3Next => qwen3next_config(&meta, m, tensors, head_dim, &mut set)?,
        Arch::MiniMaxM2 => {
            if let Some(g) = meta.uint("expert_gating_func")?.filter(|&g| g != 2) {
                return Err(format!(
                    "metadata \"{}\" = {g}: only sigmoid routing (2) is MiniMax-M2's",
                    meta.key("expert_gating_func")
                ));
            }
            set("model_type", json!("minimax_m2"));
            set("num_local_experts", json!(meta.need("expert_count")?));
            set(
                "num_experts_per_tok",
                json!(meta.need("expert_used_count")?),
            );
            let ff = meta.expert_width()?;
            set("intermediate_size", json!(ff));
            set(
                "rotary_dim",
                json!(meta.uint("rope.dimension_count")?.unwrap_or(head_dim)),
            );
        }
        Arch::Qwen3Moe | Arch::Qwen2Moe | Arch::Olmoe => {
            let experts = meta.need("expert_count")?;
            let used = meta.need("expert_used_count")?;
            let ff = meta.expert_width()?;
            set("num_experts", json!(experts));
            set("num_experts_per_tok", json!(used));
            match arch {
                Arch::Olmoe => {
                    set("model_type", json!("olmoe"));
                    set("intermediate_size", json!(ff));
                    // llama.cpp's OLMoE graph does not renormalise the top-k weights.
                    set("norm_topk_prob", json!(false));
                    if let Some(clip) = meta.float("attention.clamp_kqv")? {
                        set("clip_qkv", json!(clip));
                    }
                }
                _ => {
                    let qwen3 = arch == Arch::Qwen3Moe;
                    set(
                        "model_type",
                        json!(if qwen3 { "qwen3_moe" } else { "qwen2_moe" }),
                    );
                    set("moe_intermediate_size", json!(ff));
                    set(
                        "intermediate_size",
                        json!(meta.uint("feed_forward_length")?.unwrap_or(ff)),
                    );
                    // Qwen3-MoE renormalises the top-k weights; Qwen2-MoE does not.
                    set("norm_topk_prob", json!(qwen3));
                    set("decoder_sparse_step", json!(1));
                    set("mlp_only_layers", json!([]));
                    if !qwen3 {
                        set("qkv_bias", json!(has("blk.0.attn_q.bias")));
                        if let Some(s) = meta.uint("expert_shared_feed_forward_length")? {
                            set("shared_expert_intermediate_size", json!(s));
                        }
                    }
                    set("attention_bias", json!(has("blk.0.attn_q.bias")));
                }
            }
        }
    }
    Ok(Value::Object(c))
}

/// DeepSeek-V3/Kimi-K2's keys from a `deepseek2` GGUF, as `convert_hf_to_gguf.py` writes
/// them: MLA files carry `key_length_mla`/`value_length_mla` (then `key_length` is the
/// cache row, rank + rope), older files the head sizes in `key_length`/`value_length`.
fn deepseek2_config(
    meta: &Meta<'_>,
    m: &BTreeMap<String, GgufValue>,
    has_bias: bool,
    set: &mut impl FnMut(&str, Value),
) -> Result<(), String> {
    // expert_gating_func: 1 softmax (DeepSeek-V2), 2 sigmoid (V3, Kimi-K2); files that
    // do not say are V3's when they carry its selection bias.
    let gating = meta.uint("expert_gating_func")?;
    match gating {
        Some(2) => {}
        None if has_bias => {}
        g => {
            return Err(format!(
                "metadata \"{}\" = {g:?}: only sigmoid routing (2, DeepSeek-V3/R1, Kimi-K2) is supported; DeepSeek-V2's softmax routing is not",
                meta.key("expert_gating_func")
            ))
        }
    }
    let heads = meta.need("attention.head_count")?;
    let rope = meta.need("rope.dimension_count")?;
    let (k_len, v_len) = match (
        meta.uint("attention.key_length_mla")?,
        meta.uint("attention.value_length_mla")?,
    ) {
        (Some(k), Some(v)) => (k, v),
        _ => (
            meta.need("attention.key_length")?,
            meta.need("attention.value_length")?,
        ),
    };
    if k_len <= rope {
        return Err(format!(
            "metadata key length {k_len} is not above \"{}\" = {rope}",
            meta.key("rope.dimension_count")
        ));
    }
    set("model_type", json!("deepseek_v3"));
    set("num_key_value_heads", json!(heads));
    set("head_dim", json!(rope));
    set("qk_rope_head_dim", json!(rope));
    set("qk_nope_head_dim", json!(k_len - rope));
    set("v_head_dim", json!(v_len));
    set("kv_lora_rank", json!(meta.need("attention.kv_lora_rank")?));
    set(
        "q_lora_rank",
        json!(meta.uint("attention.q_lora_rank")?.filter(|&r| r > 0)),
    );
    sigmoid_moe_config(meta, m, set)?;
    set("scoring_func", json!("sigmoid"));
    set("topk_method", json!("noaux_tc"));
    // llama.cpp's deepseek2 RoPE rotates adjacent pairs, as transformers' default.
    set("rope_interleave", json!(true));
    if let Some(scaling) = deepseek2_yarn(meta, m)? {
        set("rope_scaling", scaling);
    }
    Ok(())
}

/// The routing keys DeepSeek-V3 and GLM-4.5 share (sigmoid scores, a selection bias,
/// groups, shared experts, leading dense layers), as the converter writes them.
fn sigmoid_moe_config(
    meta: &Meta<'_>,
    m: &BTreeMap<String, GgufValue>,
    set: &mut impl FnMut(&str, Value),
) -> Result<(), String> {
    set(
        "intermediate_size",
        json!(meta.need("feed_forward_length")?),
    );
    set(
        "moe_intermediate_size",
        json!(meta.need("expert_feed_forward_length")?),
    );
    set("n_routed_experts", json!(meta.need("expert_count")?));
    set(
        "num_experts_per_tok",
        json!(meta.need("expert_used_count")?),
    );
    set(
        "n_shared_experts",
        json!(meta.uint("expert_shared_count")?.unwrap_or(0)),
    );
    set(
        "first_k_dense_replace",
        json!(meta.uint("leading_dense_block_count")?.unwrap_or(0)),
    );
    set(
        "n_group",
        json!(meta.uint("expert_group_count")?.unwrap_or(1)),
    );
    set(
        "topk_group",
        json!(meta.uint("expert_group_used_count")?.unwrap_or(1)),
    );
    set(
        "routed_scaling_factor",
        json!(meta.float("expert_weights_scale")?.unwrap_or(1.0)),
    );
    let norm_key = meta.key("expert_weights_norm");
    let norm = match m.get(&norm_key) {
        None => false,
        Some(v) => v
            .as_bool()
            .ok_or_else(|| format!("metadata \"{norm_key}\" = {v:?}, expected a bool"))?,
    };
    set("norm_topk_prob", json!(norm));
    Ok(())
}

/// GLM-4.5/4.6 from a `glm4moe` GGUF: `block_count` counts the MTP layers
/// (`nextn_predict_layers`) after the others; the rotated part of a head is
/// `rope.dimension_count`; llama.cpp rotates it in halves (NeoX), as transformers does.
fn glm4moe_config(
    meta: &Meta<'_>,
    m: &BTreeMap<String, GgufValue>,
    tensors: &[GgufTensor],
    head_dim: usize,
    set: &mut impl FnMut(&str, Value),
) -> Result<(), String> {
    if let Some(g) = meta.uint("expert_gating_func")?.filter(|&g| g != 2) {
        return Err(format!(
            "metadata \"{}\" = {g}: only sigmoid routing (2) is GLM-4.5's",
            meta.key("expert_gating_func")
        ));
    }
    let blocks = meta.need("block_count")?;
    let nextn = meta.uint("nextn_predict_layers")?.unwrap_or(0);
    if nextn >= blocks {
        return Err(format!(
            "metadata \"{}\" = {nextn} leaves no layer of {blocks}",
            meta.key("nextn_predict_layers")
        ));
    }
    let rot = meta.uint("rope.dimension_count")?.unwrap_or(head_dim / 2);
    if rot == 0 || rot > head_dim || !rot.is_multiple_of(2) {
        return Err(format!(
            "metadata \"{}\" = {rot}: expected an even number of dims within a head of {head_dim}",
            meta.key("rope.dimension_count")
        ));
    }
    let has = |name: &str| tensors.iter().any(|t| t.name == name);
    set("model_type", json!("glm4_moe"));
    set("num_hidden_layers", json!(blocks - nextn));
    set("num_nextn_predict_layers", json!(nextn));
    set("partial_rotary_factor", json!(rot as f64 / head_dim as f64));
    set("attention_bias", json!(has("blk.0.attn_q.bias")));
    set("use_qk_norm", json!(has("blk.0.attn_q_norm.weight")));
    sigmoid_moe_config(meta, m, set)
}

/// gpt-oss' keys from a `gpt-oss` GGUF. llama.cpp keeps the release's constants in its
/// graph (`swiglu_alpha` 1.702, `swiglu_limit` 7.0: transformers' defaults, left unset
/// here) and its layer pattern (even layers slide: transformers' default when
/// `layer_types` is absent). YaRN as the release configures it: the converter writes no
/// key for `truncate`, which the release sets to false.
fn gpt_oss_config(
    meta: &Meta<'_>,
    m: &BTreeMap<String, GgufValue>,
    has: &dyn Fn(&str) -> bool,
    set: &mut dyn FnMut(&str, Value),
) -> Result<(), String> {
    set("model_type", json!("gpt_oss"));
    set("num_local_experts", json!(meta.need("expert_count")?));
    set(
        "num_experts_per_tok",
        json!(meta.need("expert_used_count")?),
    );
    set("intermediate_size", json!(meta.expert_width()?));
    set(
        "sliding_window",
        json!(meta.need("attention.sliding_window")?),
    );
    if let Some(swa) = meta.float("rope.freq_base_swa")? {
        if meta.float("rope.freq_base")? != Some(swa) {
            return Err(format!(
                "metadata \"{}\" = {swa}: sliding layers with a RoPE base of their own are not gpt-oss'",
                meta.key("rope.freq_base_swa")
            ));
        }
    }
    set("attention_bias", json!(has("blk.0.attn_q.bias")));
    if let Some(mut r) = deepseek2_yarn(meta, m)? {
        r["truncate"] = json!(false);
        set("rope_scaling", r);
    }
    Ok(())
}

/// Qwen3-Next's keys from a `qwen3next` GGUF (`conversion/qwen.py`): the linear-attention
/// widths from the `ssm.*` keys, the layer pattern from `attention.recurrent_layers` (else
/// `full_attention_interval`), the MTP layers counted in `block_count` and left out.
/// llama.cpp's graph always renormalises the top-k weights and makes every layer sparse.
fn qwen3next_config(
    meta: &Meta<'_>,
    m: &BTreeMap<String, GgufValue>,
    tensors: &[GgufTensor],
    head_dim: usize,
    set: &mut dyn FnMut(&str, Value),
) -> Result<(), String> {
    let blocks = meta.need("block_count")?;
    let nextn = meta.uint("nextn_predict_layers")?.unwrap_or(0);
    if nextn >= blocks {
        return Err(format!(
            "metadata \"{}\" = {nextn} leaves none of the {blocks} blocks",
            meta.key("nextn_predict_layers")
        ));
    }
    let n = blocks - nextn;
    set("model_type", json!("qwen3_next"));
    set("num_hidden_layers", json!(n));
    set("num_experts", json!(meta.need("expert_count")?));
    set(
        "num_experts_per_tok",
        json!(meta.need("expert_used_count")?),
    );
    let ff = meta.expert_width()?;
    set("moe_intermediate_size", json!(ff));
    set(
        "intermediate_size",
        json!(meta.uint("feed_forward_length")?.unwrap_or(ff)),
    );
    set(
        "shared_expert_intermediate_size",
        json!(meta.need("expert_shared_feed_forward_length")?),
    );
    let value_heads = meta.need("ssm.time_step_rank")?;
    let inner = meta.need("ssm.inner_size")?;
    if value_heads == 0 || !inner.is_multiple_of(value_heads) {
        return Err(format!(
            "metadata \"{}\" = {inner} does not split into {value_heads} value heads (\"{}\")",
            meta.key("ssm.inner_size"),
            meta.key("ssm.time_step_rank")
        ));
    }
    set("linear_num_value_heads", json!(value_heads));
    set("linear_value_head_dim", json!(inner / value_heads));
    set("linear_num_key_heads", json!(meta.need("ssm.group_count")?));
    set("linear_key_head_dim", json!(meta.need("ssm.state_size")?));
    set(
        "linear_conv_kernel_dim",
        json!(meta.need("ssm.conv_kernel")?),
    );
    if let Some(rot) = meta.uint("rope.dimension_count")? {
        set("partial_rotary_factor", json!(rot as f64 / head_dim as f64));
    }
    let key = meta.key("attention.recurrent_layers");
    match m.get(&key) {
        Some(v) => {
            let flags = v
                .as_array()
                .filter(|a| a.len() >= n)
                .and_then(|a| {
                    a[..n]
                        .iter()
                        .map(|f| match f {
                            GgufValue::Bool(b) => Some(*b),
                            _ => None,
                        })
                        .collect::<Option<Vec<bool>>>()
                })
                .ok_or_else(|| {
                    format!("metadata \"{key}\": expected at least {n} booleans, one per layer")
                })?;
            let types: Vec<&str> = flags
                .iter()
                .map(|&r| {
                    if r {
                        "linear_attention"
                    } else {
                        "full_attention"
                    }
                })
                .collect();
            set("layer_types", json!(types));
        }
        None => {
            if let Some(every) = meta.uint("full_attention_interval")? {
                set("full_attention_interval", json!(every));
            }
        }
    }
    set("norm_topk_prob", json!(true));
    set("decoder_sparse_step", json!(1));
    set("mlp_only_layers", json!([]));
    set(
        "attention_bias",
        json!(tensors.iter().any(|t| t.name.ends_with(".attn_q.bias"))),
    );
    set("norms_stored_one_plus", json!(true));
    if let Some(r) = deepseek2_yarn(meta, m)? {
        set("rope_scaling", r);
    }
    Ok(())
}

/// `rope_scaling` from the `rope.scaling.*` keys (YaRN only); `yarn_log_multiplier` is
/// `0.1 * mscale_all_dim`.
fn deepseek2_yarn(
    meta: &Meta<'_>,
    m: &BTreeMap<String, GgufValue>,
) -> Result<Option<Value>, String> {
    let ty_key = meta.key("rope.scaling.type");
    match m.get(&ty_key).map(|v| v.as_str()) {
        None | Some(Some("none")) => return Ok(None),
        Some(Some("yarn")) => {}
        Some(other) => {
            return Err(format!(
                "metadata \"{ty_key}\" = {other:?}: only \"yarn\" scaling is supported"
            ))
        }
    }
    let mut r = Map::new();
    r.insert("type".into(), json!("yarn"));
    r.insert("rope_type".into(), json!("yarn"));
    let factor = meta.float("rope.scaling.factor")?.ok_or_else(|| {
        format!(
            "missing metadata key \"{}\"",
            meta.key("rope.scaling.factor")
        )
    })?;
    r.insert("factor".into(), json!(factor));
    r.insert(
        "original_max_position_embeddings".into(),
        json!(meta.need("rope.scaling.original_context_length")?),
    );
    for (k, hf) in [
        ("rope.scaling.yarn_beta_fast", "beta_fast"),
        ("rope.scaling.yarn_beta_slow", "beta_slow"),
    ] {
        if let Some(v) = meta.float(k)? {
            r.insert(hf.into(), json!(v));
        }
    }
    if let Some(log_mul) = meta.float("rope.scaling.yarn_log_multiplier")? {
        let all_dim = shortest_f32(((log_mul as f32) / 0.1f32) as f64);
        r.insert("mscale_all_dim".into(), json!(all_dim));
        r.insert("mscale".into(), json!(all_dim));
    }
    Ok(Some(Value::Object(r)))
}
