//! What a GGUF says in Hugging Face terms: `config.json` from its metadata, and each
//! llama.cpp tensor name as the Hugging Face checkpoint spells it (llama.cpp's
//! `gguf-py/gguf/constants.py` and `convert_hf_to_gguf.py` name them).
//!
//! Architectures: `llama` (dense, and Mixtral: `llama` with experts), `qwen3moe`,
//! `qwen2moe`, `olmoe`, `deepseek2` (DeepSeek-V3/R1, Kimi-K2), `glm4moe` (GLM-4.5/4.6),
//! `minimax-m2`, `gpt-oss`. Each layer's routed
//! experts are one 3-D tensor per matrix (`ffn_gate_exps`, expert-major); expert `e` of
//! it is the Hugging Face tensor `...mlp.experts.{e}.gate_proj.weight`.

use std::collections::BTreeMap;

use serde_json::{json, Map, Value};

use super::{GgufTensor, GgufValue};

/// One Hugging Face tensor as a GGUF holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HfName {
    /// A tensor of its own.
    Plain(String),
    /// Every routed expert of a layer stacked: expert `e` is `{prefix}.{e}.{suffix}`.
    Experts {
        /// Up to the expert index, e.g. `model.layers.3.mlp.experts`.
        prefix: String,
        /// After it, e.g. `gate_proj.weight`.
        suffix: String,
    },
}

/// An architecture coli reads from GGUF.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    /// `llama`: dense Llama, or Mixtral when it has experts (Q/K rows permuted by the
    /// converter).
    Llama,
    /// `qwen3moe`.
    Qwen3Moe,
    /// `qwen2moe` (shared expert with its gate, q/k/v biases).
    Qwen2Moe,
    /// `olmoe`.
    Olmoe,
    /// `deepseek2`: DeepSeek-V3/R1 and Kimi-K2 (MLA, sigmoid routing with a selection
    /// bias and expert groups, shared experts, leading dense layers).
    Deepseek2,
    /// `glm4moe`: GLM-4.5/4.6 (GQA with partial rotary, sigmoid routing as DeepSeek's,
    /// shared experts, leading dense layers, its MTP layers kept after the others).
    Glm4Moe,
    /// `minimax-m2`: MiniMax-M2 (GQA with partial rotary and q/k norms over the whole
    /// projection, sigmoid routing with a selection bias, Mixtral's expert names).
    MiniMaxM2,
    /// `gpt-oss`: gpt-oss-20b/120b (biases on every projection, sinks, alternating
    /// sliding and full layers, YaRN; experts with biases, their interleaved gate/up rows
    /// split by the converter into `ffn_gate_exps` and `ffn_up_exps`).
    GptOss,
}

impl Arch {
    /// The architecture of `general.architecture`, or an error naming the supported ones.
    pub fn from_gguf(name: &str) -> Result<Arch, String> {
        Ok(match name {
            "llama" => Arch::Llama,
            "qwen3moe" => Arch::Qwen3Moe,
            "qwen2moe" => Arch::Qwen2Moe,
            "olmoe" => Arch::Olmoe,
            "deepseek2" => Arch::Deepseek2,
            "glm4moe" => Arch::Glm4Moe,
            "minimax-m2" => Arch::MiniMaxM2,
            "gpt-oss" => Arch::GptOss,
            other => {
                return Err(format!(
                    "general.architecture \"{other}\" is not supported (supported: llama, qwen3moe, qwen2moe, olmoe, deepseek2, glm4moe, minimax-m2, gpt-oss)"
                ))
            }
        })
    }

    /// `general.architecture`'s spelling, the prefix of its metadata keys.
    pub fn key(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Qwen3Moe => "qwen3moe",
            Arch::Qwen2Moe => "qwen2moe",
            Arch::Olmoe => "olmoe",
            Arch::Deepseek2 => "deepseek2",
            Arch::Glm4Moe => "glm4moe",
            Arch::MiniMaxM2 => "minimax-m2",
            Arch::GptOss => "gpt-oss",
        }
    }

    /// Whether llama.cpp's converter permuted the rows of `attn_q`/`attn_k` for its
    /// interleaved RoPE (they are put back when read).
    pub fn permutes_qk(self) -> bool {
        self == Arch::Llama
    }
}

/// The Hugging Face name of GGUF tensor `name` in `arch`, or `None` for a tensor with
/// no counterpart.
pub fn hf_name(arch: Arch, name: &str) -> Option<HfName> {
    let plain = |s: &str| Some(HfName::Plain(s.to_string()));
    match name {
        "token_embd.weight" => return plain("model.embed_tokens.weight"),
        "output_norm.weight" => return plain("model.norm.weight"),
        "output.weight" => return plain("lm_head.weight"),
        _ => {}
    }
    let rest = name.strip_prefix("blk.")?;
    let (layer, tail) = rest.split_once('.')?;
    let layer: usize = layer.parse().ok()?;
    let p = format!("model.layers.{layer}");
    let experts = |suffix: &str| {
        Some(HfName::Experts {
            prefix: format!("{p}.mlp.experts"),
            suffix: suffix.to_string(),
        })
    };
    let moe = arch != Arch::Llama;
    if arch == Arch::MiniMaxM2 {
        let m = format!("{p}.block_sparse_moe");
        let experts = |suffix: &str| {
            Some(HfName::Experts {
                prefix: format!("{m}.experts"),
                suffix: suffix.to_string(),
            })
        };
        match tail {
            "ffn_gate_inp.weight" => return plain(&format!("{m}.gate.weight")),
            "exp_probs_b.bias" => return plain(&format!("{m}.e_score_correction_bias")),
            "ffn_gate_exps.weight" => return experts("w1.weight"),
            "ffn_up_exps.weight" => return experts("w3.weight"),
            "ffn_down_exps.weight" => return experts("w2.weight"),
            _ => {}
        }
    }
    if arch == Arch::GptOss {
        // The experts' biases stay one tensor per layer, `[E, rows]`, as transformers keeps
        // them (`down_proj_bias`); the split gate/up ones under names of their own.
        let hf = match tail {
            "post_attention_norm.weight" => "post_attention_layernorm.weight",
            "attn_sinks.weight" => "self_attn.sinks",
            "attn_output.bias" => "self_attn.o_proj.bias",
            "ffn_gate_inp.weight" => "mlp.router.weight",
            "ffn_gate_inp.bias" => "mlp.router.bias",
            "ffn_gate_exps.bias" => "mlp.experts.gate_proj_bias",
            "ffn_up_exps.bias" => "mlp.experts.up_proj_bias",
            "ffn_down_exps.bias" => "mlp.experts.down_proj_bias",
            // Its FFN is always the MoE: no `ffn_norm`, no dense projections.
            "ffn_norm.weight" | "ffn_gate.weight" | "ffn_up.weight" | "ffn_down.weight" => {
                return None
            }
            _ => "",
        };
        if !hf.is_empty() {
            return plain(&format!("{p}.{hf}"));
        }
    }
    if arch == Arch::Llama {
        // Mixtral is `llama` with experts: stacked `*_exps` (the converter today), or one
        // tensor per expert, `ffn_gate.{e}.weight` (files of early 2024).
        let mixtral = |suffix: &str| {
            Some(HfName::Experts {
                prefix: format!("{p}.block_sparse_moe.experts"),
                suffix: suffix.to_string(),
            })
        };
        match tail {
            "ffn_gate_inp.weight" => {
                return Some(HfName::Plain(format!("{p}.block_sparse_moe.gate.weight")))
            }
            "ffn_gate_exps.weight" => return mixtral("w1.weight"),
            "ffn_up_exps.weight" => return mixtral("w3.weight"),
            "ffn_down_exps.weight" => return mixtral("w2.weight"),
            _ => {}
        }
        let per_expert = tail
            .strip_suffix(".weight")
            .and_then(|t| t.split_once('.'))
            .and_then(|(m, e)| Some((m, e.parse::<usize>().ok()?)));
        if let Some((m, e)) = per_expert {
            let w = match m {
                "ffn_gate" => "w1",
                "ffn_up" => "w3",
                "ffn_down" => "w2",
                _ => return None,
            };
            return plain(&format!("{p}.block_sparse_moe.experts.{e}.{w}.weight"));
        }
    }
    let ds = arch == Arch::Deepseek2;
    // DeepSeek-style MoE blocks: shared experts, a selection bias, dense leading layers.
    let sig = ds || arch == Arch::Glm4Moe;
    let glm = arch == Arch::Glm4Moe;
    if glm {
        // The MTP layers' own tensors (`blk.{n}.nextn.*`, n >= num_hidden_layers).
        let nextn = match tail {
            "nextn.eh_proj.weight" => Some("eh_proj.weight"),
            "nextn.enorm.weight" => Some("enorm.weight"),
            "nextn.hnorm.weight" => Some("hnorm.weight"),
            "nextn.embed_tokens.weight" => Some("embed_tokens.weight"),
            "nextn.shared_head_head.weight" => Some("shared_head.head.weight"),
            "nextn.shared_head_norm.weight" => Some("shared_head.norm.weight"),
            _ => None,
        };
        if let Some(n) = nextn {
            return plain(&format!("{p}.{n}"));
        }
    }
    let hf = match tail {
        // GLM names the FFN's norm after the attention.
        "post_attention_norm.weight" if glm => "post_attention_layernorm.weight",
        // DeepSeek's MLA. llama.cpp splits `kv_b_proj` into `attn_k_b` (each head's key
        // part transposed: [head][rank][nope]) and `attn_v_b` ([head][v][rank]); older
        // files keep `attn_kv_b`. The split halves keep llama.cpp's layout under names of
        // their own.
        "attn_q_a.weight" if ds => "self_attn.q_a_proj.weight",
        "attn_q_a_norm.weight" if ds => "self_attn.q_a_layernorm.weight",
        "attn_q_b.weight" if ds => "self_attn.q_b_proj.weight",
        "attn_kv_a_mqa.weight" if ds => "self_attn.kv_a_proj_with_mqa.weight",
        "attn_kv_a_norm.weight" if ds => "self_attn.kv_a_layernorm.weight",
        "attn_kv_b.weight" if ds => "self_attn.kv_b_proj.weight",
        "attn_k_b.weight" if ds => "self_attn.k_b_proj.weight",
        "attn_v_b.weight" if ds => "self_attn.v_b_proj.weight",
        "exp_probs_b.bias" if sig => "mlp.gate.e_score_correction_bias",
        "ffn_gate_shexp.weight" if sig => "mlp.shared_experts.gate_proj.weight",
        "ffn_up_shexp.weight" if sig => "mlp.shared_experts.up_proj.weight",
        "ffn_down_shexp.weight" if sig => "mlp.shared_experts.down_proj.weight",
        // Its leading dense layers.
        "ffn_gate.weight" if sig => "mlp.gate_proj.weight",
        "ffn_up.weight" if sig => "mlp.up_proj.weight",
        "ffn_down.weight" if sig => "mlp.down_proj.weight",
        "attn_norm.weight" => "input_layernorm.weight",
        "ffn_norm.weight" => "post_attention_layernorm.weight",
        "attn_q.weight" => "self_attn.q_proj.weight",
        "attn_k.weight" => "self_attn.k_proj.weight",
        "attn_v.weight" => "self_attn.v_proj.weight",
        "attn_output.weight" => "self_attn.o_proj.weight",
        "attn_q.bias" => "self_attn.q_proj.bias",
        "attn_k.bias" => "self_attn.k_proj.bias",
        "attn_v.bias" => "self_attn.v_proj.bias",
        "attn_q_norm.weight" => "self_attn.q_norm.weight",
        "attn_k_norm.weight" => "self_attn.k_norm.weight",
        "ffn_gate.weight" if !moe => "mlp.gate_proj.weight",
        "ffn_up.weight" if !moe => "mlp.up_proj.weight",
        "ffn_down.weight" if !moe => "mlp.down_proj.weight",
        "ffn_gate_inp.weight" if moe => "mlp.gate.weight",
        "ffn_gate_exps.weight" if moe => return experts("gate_proj.weight"),
        "ffn_up_exps.weight" if moe => return experts("up_proj.weight"),
        "ffn_down_exps.weight" if moe => return experts("down_proj.weight"),
        "ffn_gate_inp_shexp.weight" if arch == Arch::Qwen2Moe => "mlp.shared_expert_gate.weight",
        "ffn_gate_shexp.weight" if arch == Arch::Qwen2Moe => "mlp.shared_expert.gate_proj.weight",
        "ffn_up_shexp.weight" if arch == Arch::Qwen2Moe => "mlp.shared_expert.up_proj.weight",
        "ffn_down_shexp.weight" if arch == Arch::Qwen2Moe => "mlp.shared_expert.down_proj.weight",
        _ => return None,
    };
    Some(HfName::Plain(format!("{p}.{hf}")))
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_map_as_the_converter_writes_them() {
        assert_eq!(
            hf_name(Arch::Llama, "blk.3.attn_q.weight"),
            Some(HfName::Plain(
                "model.layers.3.self_attn.q_proj.weight".into()
            ))
        );
        assert_eq!(
            hf_name(Arch::Qwen3Moe, "blk.1.ffn_down_exps.weight"),
            Some(HfName::Experts {
                prefix: "model.layers.1.mlp.experts".into(),
                suffix: "down_proj.weight".into()
            })
        );
        // A dense FFN name in a MoE architecture, an expert name in a dense one: none.
        assert_eq!(hf_name(Arch::Olmoe, "blk.0.ffn_gate.weight"), None);
        // Mixtral is llama with experts, stacked or (older files) one tensor each.
        assert_eq!(
            hf_name(Arch::Llama, "blk.2.ffn_up_exps.weight"),
            Some(HfName::Experts {
                prefix: "model.layers.2.block_sparse_moe.experts".into(),
                suffix: "w3.weight".into()
            })
        );
        assert_eq!(
            hf_name(Arch::Llama, "blk.0.ffn_down.5.weight"),
            Some(HfName::Plain(
                "model.layers.0.block_sparse_moe.experts.5.w2.weight".into()
            ))
        );
        assert_eq!(hf_name(Arch::Llama, "blk.0.ffn_norm.5.weight"), None);
        // GLM-4.5's MTP layer keeps its own tensors after the others; DeepSeek's split kv_b.
        assert_eq!(
            hf_name(Arch::Glm4Moe, "blk.92.nextn.shared_head_norm.weight"),
            Some(HfName::Plain(
                "model.layers.92.shared_head.norm.weight".into()
            ))
        );
        assert_eq!(
            hf_name(Arch::Glm4Moe, "blk.3.post_attention_norm.weight"),
            Some(HfName::Plain(
                "model.layers.3.post_attention_layernorm.weight".into()
            ))
        );
        assert_eq!(
            hf_name(Arch::Deepseek2, "blk.5.exp_probs_b.bias"),
            Some(HfName::Plain(
                "model.layers.5.mlp.gate.e_score_correction_bias".into()
            ))
        );
        assert_eq!(hf_name(Arch::Qwen3Moe, "blk.5.exp_probs_b.bias"), None);
        // MiniMax-M2 keeps the hub's block_sparse_moe names.
        assert_eq!(
            hf_name(Arch::MiniMaxM2, "blk.4.exp_probs_b.bias"),
            Some(HfName::Plain(
                "model.layers.4.block_sparse_moe.e_score_correction_bias".into()
            ))
        );
        assert_eq!(
            hf_name(Arch::MiniMaxM2, "blk.4.ffn_down_exps.weight"),
            Some(HfName::Experts {
                prefix: "model.layers.4.block_sparse_moe.experts".into(),
                suffix: "w2.weight".into()
            })
        );
        assert_eq!(hf_name(Arch::Olmoe, "blk.5.attn_k_b.weight"), None);
        assert_eq!(hf_name(Arch::Llama, "blk.x.attn_q.weight"), None);
    }

    #[test]
    fn missing_and_malformed_keys_are_named() {
        let mut m = BTreeMap::new();
        m.insert(
            "llama.embedding_length".to_string(),
            GgufValue::Str("64".into()),
        );
        let e = hf_config(Arch::Llama, &m, &[]).unwrap_err();
        assert!(e.contains("llama.embedding_length"), "{e}");
        m.insert("llama.embedding_length".to_string(), GgufValue::Int(64));
        let e = hf_config(Arch::Llama, &m, &[]).unwrap_err();
        assert!(
            e.contains("missing metadata key \"llama.attention.head_count\""),
            "{e}"
        );
        assert!(Arch::from_gguf("mamba").unwrap_err().contains("mamba"));
    }

    #[test]
    fn gpt_oss_names_and_config_as_its_converter_writes_them() {
        let plain = |s: &str| Some(HfName::Plain(s.to_string()));
        assert_eq!(
            hf_name(Arch::GptOss, "blk.2.attn_sinks.weight"),
            plain("model.layers.2.self_attn.sinks")
        );
        assert_eq!(
            hf_name(Arch::GptOss, "blk.2.ffn_gate_inp.bias"),
            plain("model.layers.2.mlp.router.bias")
        );
        assert_eq!(
            hf_name(Arch::GptOss, "blk.2.attn_output.bias"),
            plain("model.layers.2.self_attn.o_proj.bias")
        );
        // The experts' biases stay stacked under one name; their matrices split per expert.
        assert_eq!(
            hf_name(Arch::GptOss, "blk.0.ffn_up_exps.bias"),
            plain("model.layers.0.mlp.experts.up_proj_bias")
        );
        assert_eq!(
            hf_name(Arch::GptOss, "blk.0.ffn_up_exps.weight"),
            Some(HfName::Experts {
                prefix: "model.layers.0.mlp.experts".into(),
                suffix: "up_proj.weight".into()
            })
        );
        assert_eq!(
            hf_name(Arch::GptOss, "blk.0.post_attention_norm.weight"),
            plain("model.layers.0.post_attention_layernorm.weight")
        );
        assert_eq!(hf_name(Arch::GptOss, "blk.0.ffn_norm.weight"), None);
        assert_eq!(hf_name(Arch::Qwen3Moe, "blk.0.attn_sinks.weight"), None);

        let mut m = BTreeMap::new();
        for (k, v) in [
            ("embedding_length", 64),
            ("block_count", 2),
            ("attention.head_count", 4),
            ("attention.head_count_kv", 2),
            ("expert_count", 4),
            ("expert_used_count", 2),
            ("expert_feed_forward_length", 32),
            ("rope.scaling.original_context_length", 4096),
        ] {
            m.insert(format!("gpt-oss.{k}"), GgufValue::Int(v));
        }
        m.insert("gpt-oss.rope.freq_base".into(), GgufValue::Float(150000.0));
        let vocab = GgufValue::Array(vec![GgufValue::Str("a".into()); 8]);
        m.insert("tokenizer.ggml.tokens".into(), vocab);
        m.insert("gpt-oss.rope.scaling.factor".into(), GgufValue::Float(32.0));
        m.insert(
            "gpt-oss.rope.scaling.type".into(),
            GgufValue::Str("yarn".into()),
        );
        let e = hf_config(Arch::GptOss, &m, &[]).unwrap_err();
        assert!(e.contains("\"gpt-oss.attention.sliding_window\""), "{e}");
        m.insert(
            "gpt-oss.attention.sliding_window".into(),
            GgufValue::Int(128),
        );
        let c = hf_config(Arch::GptOss, &m, &[]).unwrap();
        assert_eq!(c["model_type"], "gpt_oss");
        assert_eq!(c["sliding_window"], 128);
        assert_eq!(c["intermediate_size"], 32);
        assert_eq!(c["num_local_experts"], 4);
        // The release's YaRN: no truncation of the correction range.
        assert_eq!(c["rope_scaling"]["truncate"], false);
        assert_eq!(c["rope_scaling"]["factor"], 32.0);
        m.insert(
            "gpt-oss.rope.freq_base_swa".into(),
            GgufValue::Float(10000.0),
        );
        let e = hf_config(Arch::GptOss, &m, &[]).unwrap_err();
        assert!(e.contains("gpt-oss.rope.freq_base_swa"), "{e}");
    }
}
