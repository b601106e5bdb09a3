//! What a GGUF says in Hugging Face terms: `config.json` from its metadata, and each
//! llama.cpp tensor name as the Hugging Face checkpoint spells it (llama.cpp's
//! `gguf-py/gguf/constants.py` and `convert_hf_to_gguf.py` name them).
//!
//! Architectures: `llama` (dense, and Mixtral: `llama` with experts), `qwen3moe`,
//! `qwen2moe`, `olmoe`, `deepseek2` (DeepSeek-V3/R1, Kimi-K2), `glm4moe` (GLM-4.5/4.6),
//! `minimax-m2`, `gpt-oss`, `qwen3next`. Each layer's routed
//! experts are one 3-D tensor per matrix (`ffn_gate_exps`, expert-major); expert `e` of
//! it is the Hugging Face tensor `...mlp.experts.{e}.gate_proj.weight`.

mod config;
#[cfg(test)]
mod tests;

pub use config::hf_config;

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
    /// `qwen3next`: Qwen3-Next (Gated DeltaNet layers between gated full-attention ones,
    /// a shared expert with its gate; the converter stores the zero-centred norms as
    /// `1 + w` and `A_log` as `-exp(A_log)`, and takes `in_proj_qkvz` apart).
    Qwen3Next,
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
            "qwen3next" => Arch::Qwen3Next,
            other => {
                return Err(format!(
                    "general.architecture \"{other}\" is not supported (supported: llama, qwen3moe, qwen2moe, olmoe, deepseek2, glm4moe, minimax-m2, gpt-oss, qwen3next)"
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
            Arch::Qwen3Next => "qwen3next",
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
    let next = arch == Arch::Qwen3Next;
    // Shared experts with a gate of their own (Qwen's).
    let qwen_shared = next || arch == Arch::Qwen2Moe;
    if glm || next {
        // The MTP layers' own tensors (`blk.{n}.nextn.*`, n >= num_hidden_layers; for
        // Qwen3-Next kept under these names and not loaded).
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
        "post_attention_norm.weight" if glm || next => "post_attention_layernorm.weight",
        // Qwen3-Next's Gated DeltaNet: `in_proj_qkvz` as the flat q|k|v and z (older files:
        // `ssm_in`, the grouped original); `A_log` stored as `-exp(A_log)`, under a name of
        // its own (`neg_A`) so it is never taken for `A_log`.
        "attn_qkv.weight" if next => "linear_attn.in_proj_qkv.weight",
        "attn_gate.weight" if next => "linear_attn.in_proj_z.weight",
        "ssm_in.weight" if next => "linear_attn.in_proj_qkvz.weight",
        "ssm_ba.weight" if next => "linear_attn.in_proj_ba.weight",
        "ssm_conv1d.weight" if next => "linear_attn.conv1d.weight",
        "ssm_dt.bias" if next => "linear_attn.dt_bias",
        "ssm_a" if next => "linear_attn.neg_A",
        "ssm_norm.weight" if next => "linear_attn.norm.weight",
        "ssm_out.weight" if next => "linear_attn.out_proj.weight",
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
        "ffn_gate_inp_shexp.weight" if qwen_shared => "mlp.shared_expert_gate.weight",
        "ffn_gate_shexp.weight" if qwen_shared => "mlp.shared_expert.gate_proj.weight",
        "ffn_up_shexp.weight" if qwen_shared => "mlp.shared_expert.up_proj.weight",
        "ffn_down_shexp.weight" if qwen_shared => "mlp.shared_expert.down_proj.weight",
        _ => return None,
    };
    Some(HfName::Plain(format!("{p}.{hf}")))
}
