//! DeepSeek-V4 (V4-Flash, V4-Pro): hyper-connections (`hc_mult` residual streams mixed
//! by Sinkhorn-projected weights around every block, collapsed by a hyper head at the
//! end); attention with one shared key/value head of `head_dim` 512 over a sliding window,
//! plus compressed entries on `compressed_sparse_attention` layers (top-k chosen by a
//! Lightning indexer) and `heavily_compressed_attention` layers (all of them); attention
//! sinks; a grouped low-rank output projection; MoE layers routed by `sqrtsoftplus`,
//! `softmax` or `sigmoid` scores, by a frozen token-to-expert table on the first
//! (`hash_moe`) layers; clamped SwiGLU (`swiglu_limit`) in the routed and shared experts.
//! The blocks are [`crate::arch::compressed`] and [`crate::arch::hyper`]; `config` resolves
//! the config (with the legacy keys the configuration class folds in); this file reads the
//! tensors, spelled as `transformers` saves them or as the release ships them. MTP layers in a
//! checkpoint (`mtp.*`) are not read. Mirrors `modeling_deepseek_v4.py` and
//! `configuration_deepseek_v4.py` of `transformers` 5.24.

mod config;

use coli_core::ModelDir;
use coli_kernels::rope::{RopeLayout, RopeTable};

use self::config::{expert_dtype, ExpertDtype};
pub use self::config::{resolve, DeepseekV4Config, V4Attention, V4Settings, CONFIG_ALIASES};
use crate::arch::moe::{check_routed_scaling, check_top_k};
use crate::arch::{
    Choice, CompressedAttention, Compressor, Expert, Ffn, Hyper, HyperConnection, HyperHead,
    KvLayout, KvShape, Layer, LightningIndexer, Mixer, Mlp, ModelInfo, Moe, Routing, ScoreFn,
    SharedExpert, Transformer,
};
use crate::error::{ModelError, Result};
use crate::families::{Capability, Family, TensorLayout};
use crate::weights::{load_vector, Linear};

/// Tensor names in either spelling: `transformers`' (`model.layers.{i}.self_attn…`) or
/// the release's (`layers.{i}.attn…`).
struct Names {
    hub: bool,
}

impl Names {
    fn top(&self, tf: &str, hub: &str) -> String {
        if self.hub {
            hub.to_string()
        } else {
            format!("model.{tf}")
        }
    }

    fn layer(&self, i: usize, tf: &str, hub: &str) -> String {
        if self.hub {
            format!("layers.{i}.{hub}")
        } else {
            format!("model.layers.{i}.{tf}")
        }
    }
}

/// The DeepSeek-V4 family.
pub struct DeepseekV4;

impl Family for DeepseekV4 {
    const MODEL_TYPES: &'static [&'static str] = &["deepseek_v4"];
    const DISPLAY_NAME: &'static str = "DeepSeek-V4";
    const CAPABILITIES: &'static [Capability] = &[
        Capability::Moe,
        Capability::SharedExperts,
        Capability::SparseAttention,
        Capability::HyperConnections,
    ];
    /// Both spellings: transformers' fused experts under `model.layers.`, the release's
    /// per-expert tensors under `layers.`; the release's MTP layers (`mtp.`) are not read.
    const LAYOUT: TensorLayout = TensorLayout {
        layers: &["model.layers.", "layers."],
        ignored: &["mtp."],
        experts: &[".mlp.experts.", ".ffn.experts."],
        shared: &[".mlp.shared_experts.", ".ffn.shared_experts."],
        indexer: &[".self_attn.compressor.indexer.", ".attn.indexer."],
        fused_experts: &[".mlp.experts.gate_up_proj", ".mlp.experts.down_proj"],
    };

    fn load(dir: &ModelDir) -> Result<Transformer> {
        let cfg: DeepseekV4Config = dir.config.deserialize_aliased(CONFIG_ALIASES)?;
        let set = resolve(dir, &cfg)?;
        load_model(dir, &cfg, &set)
    }

    fn kv_layout(dir: &ModelDir) -> Result<KvLayout> {
        let cfg: DeepseekV4Config = dir.config.deserialize_aliased(CONFIG_ALIASES)?;
        let set = resolve(dir, &cfg)?;
        let n = cfg.common.num_hidden_layers;
        let mut l = KvLayout::uniform(
            n,
            KvShape {
                key_width: set.head_dim,
                value_width: 0,
            },
        );
        l.attends = vec![false; n];
        l.rings = set
            .attention
            .iter()
            .map(|&k| Some(set.ring_shape(k, cfg.sliding_window, cfg.index_head_dim)))
            .collect();
        Ok(l)
    }
}

fn load_model(dir: &ModelDir, cfg: &DeepseekV4Config, set: &V4Settings) -> Result<Transformer> {
    let c = &dir.config;
    let common = &cfg.common;
    let (h, n_layers, heads) = (
        common.hidden_size,
        common.num_hidden_layers,
        common.num_attention_heads,
    );
    let hd = set.head_dim;
    if common.num_key_value_heads.is_some_and(|k| k != 1) {
        return Err(c
            .error(
                "num_key_value_heads",
                "DeepSeek-V4 attention has one shared key/value head",
            )
            .into());
    }
    if heads == 0 || cfg.o_groups == 0 || !heads.is_multiple_of(cfg.o_groups) {
        return Err(c
            .error(
                "o_groups",
                format!(
                    "{} must be positive and divide num_attention_heads = {heads}",
                    cfg.o_groups
                ),
            )
            .into());
    }
    for (key, v) in [
        ("hidden_size", h),
        ("q_lora_rank", cfg.q_lora_rank),
        ("o_lora_rank", cfg.o_lora_rank),
        ("moe_intermediate_size", cfg.moe_intermediate_size),
        ("vocab_size", common.vocab_size),
    ] {
        if v == 0 {
            return Err(c.error(key, "must be positive").into());
        }
    }
    if cfg.hidden_act != "silu" {
        return Err(c
            .error(
                "hidden_act",
                format!(
                    "\"{}\" is not supported (DeepSeek-V4 uses silu)",
                    cfg.hidden_act
                ),
            )
            .into());
    }
    if cfg.mlp_bias || cfg.attention_bias {
        return Err(c
            .error(
                "mlp_bias",
                "DeepSeek-V4 has no biases on its MLPs or attention projections",
            )
            .into());
    }
    if cfg.hc_mult == 0 || cfg.hc_sinkhorn_iters == 0 {
        return Err(c
            .error("hc_mult", "hc_mult and hc_sinkhorn_iters must be positive")
            .into());
    }
    if cfg.sliding_window == 0 {
        return Err(c.error("sliding_window", "must be positive").into());
    }
    if cfg.index_topk == 0 || cfg.index_n_heads == 0 || cfg.index_head_dim < set.rope_dim {
        return Err(c
            .error(
                "index_topk",
                "index_topk and index_n_heads must be positive, index_head_dim at least the rotary width",
            )
            .into());
    }
    let limit = cfg.swiglu_limit as f32;
    if !(limit.is_finite() && limit > 0.0) {
        return Err(c
            .error("swiglu_limit", "must be finite and positive")
            .into());
    }
    check_routed_scaling(dir, cfg.routed_scaling_factor)?;
    let score = match cfg.scoring_func.as_str() {
        "sqrtsoftplus" => ScoreFn::SqrtSoftplus,
        "softmax" => ScoreFn::Softmax,
        "sigmoid" => ScoreFn::Sigmoid,
        other => {
            return Err(c
                .error(
                    "scoring_func",
                    format!("unknown scoring function \"{other}\" (expected sqrtsoftplus, softmax or sigmoid)"),
                )
                .into())
        }
    };
    let (n_experts, top_k) = (cfg.n_routed_experts, cfg.num_experts_per_tok);
    check_top_k(dir, "n_routed_experts", n_experts, top_k)?;
    let names = Names {
        hub: !dir.has("model.embed_tokens.weight") && dir.has("embed.weight"),
    };
    let eps = common.rms_norm_eps.unwrap_or(1e-6) as f32;
    let main_rope = RopeTable::new(set.rope_dim, set.main_rope.theta, &set.main_rope.scaling);
    let compress_rope = RopeTable::new(
        set.rope_dim,
        set.compress_rope.theta,
        &set.compress_rope.scaling,
    );
    let info = ModelInfo {
        family: DeepseekV4::DISPLAY_NAME,
        model_type: c.model_type()?.to_string(),
        vocab_size: common.vocab_size,
        hidden_size: h,
        n_layers,
        n_heads: heads,
        n_kv_heads: 1,
        head_dim: hd,
        max_position_embeddings: common.max_position_embeddings.unwrap_or(1_048_576),
        eos_token_ids: c.eos_token_ids()?,
        kv: KvShape {
            key_width: hd,
            value_width: 0,
        },
        notes: Vec::new(),
    };
    let mult = cfg.hc_mult;
    let hc = |i: usize, which: &str| -> Result<HyperConnection> {
        let [a, b, s] = ["fn", "base", "scale"]
            .map(|k| names.layer(i, &format!("{which}_hc.{k}"), &format!("hc_{which}_{k}")));
        HyperConnection::load(dir, [&a, &b, &s], mult, h)
    };
    let layers = (0..n_layers)
        .map(|i| {
            let rope = match set.attention[i] {
                V4Attention::Sliding => main_rope.clone(),
                _ => compress_rope.clone(),
            };
            let attn = load_attention(dir, &names, cfg, set, i, rope, &compress_rope)?;
            let ffn = load_moe(dir, &names, cfg, set.hash[i], i, score, limit)?;
            Ok(Layer {
                input_layernorm: load_vector(
                    dir,
                    &names.layer(i, "input_layernorm.weight", "attn_norm.weight"),
                    h,
                )?,
                attn: Mixer::Compressed(Box::new(attn)),
                post_attention_layernorm: load_vector(
                    dir,
                    &names.layer(i, "post_attention_layernorm.weight", "ffn_norm.weight"),
                    h,
                )?,
                ffn: Ffn::Moe(Box::new(ffn)),
                hc: Some(Box::new([hc(i, "attn")?, hc(i, "ffn")?])),
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let head_names = ["hc_fn", "hc_base", "hc_scale"]
        .map(|k| names.top(&format!("hc_head.{k}"), &format!("hc_head_{}", &k[3..])));
    let hyper = Hyper {
        mult,
        iters: cfg.hc_sinkhorn_iters,
        eps: cfg.hc_eps as f32,
        norm_eps: eps,
        head: HyperHead::load(
            dir,
            [&head_names[0], &head_names[1], &head_names[2]],
            mult,
            h,
        )?,
    };
    let embed_name = names.top("embed_tokens.weight", "embed.weight");
    let head_name = if names.hub {
        "head.weight"
    } else {
        "lm_head.weight"
    };
    let (embed_tokens, lm_head) = crate::arch::layer::embeddings(
        dir,
        &embed_name,
        head_name,
        &info,
        common.tie_word_embeddings,
    )?;
    let mut info = info;
    if dir.tensor_names().iter().any(|n| n.starts_with("mtp.")) {
        info.notes.push(
            "the checkpoint's multi-token-prediction layers (mtp.*) are not read: DeepSeek-V4 does not draft by MTP yet"
                .into(),
        );
    }
    Ok(Transformer {
        norm: load_vector(dir, &names.top("norm.weight", "norm.weight"), h)?,
        rope: main_rope,
        rope_layout: RopeLayout::Interleaved,
        rms_norm_eps: eps,
        info,
        embed_tokens,
        layers,
        lm_head,
        store: None,
        mtp: None,
        hyper: Some(Box::new(hyper)),
    })
}

/// Layer `i`'s attention, its compressor and indexer.
fn load_attention(
    dir: &ModelDir,
    names: &Names,
    cfg: &DeepseekV4Config,
    set: &V4Settings,
    i: usize,
    rope: RopeTable,
    compress_rope: &RopeTable,
) -> Result<CompressedAttention> {
    let common = &cfg.common;
    let (h, heads, hd, qr) = (
        common.hidden_size,
        common.num_attention_heads,
        set.head_dim,
        cfg.q_lora_rank,
    );
    let a =
        |tf: &str, hub: &str| names.layer(i, &format!("self_attn.{tf}"), &format!("attn.{hub}"));
    let groups = cfg.o_groups;
    // Compressor tensors: transformers' `compressor.kv_proj` is the release's
    // `compressor.wkv`, and so on.
    let comp_name = |tf_prefix: &str, hub_prefix: &str| {
        let (tf_prefix, hub_prefix) = (tf_prefix.to_string(), hub_prefix.to_string());
        move |k: &str| {
            let hub = match k {
                "kv_proj" => "wkv.weight",
                "gate_proj" => "wgate.weight",
                "position_bias" => "ape",
                _ => "norm.weight",
            };
            let tf = match k {
                "position_bias" => k.to_string(),
                _ => format!("{k}.weight"),
            };
            names.layer(
                i,
                &format!("self_attn.{tf_prefix}.{tf}"),
                &format!("attn.{hub_prefix}.{hub}"),
            )
        }
    };
    let (csa, hca) = set.rates;
    let rd = set.rope_dim;
    let (compressor, indexer) = match set.attention[i] {
        V4Attention::Sliding => (None, None),
        V4Attention::Hca => (
            Some(Compressor::load(
                dir,
                &comp_name("compressor", "compressor"),
                h,
                (hca, hd, false),
                compress_rope.clone(),
                rd,
            )?),
            None,
        ),
        V4Attention::Csa => {
            let ihd = cfg.index_head_dim;
            let ix = LightningIndexer {
                compressor: Compressor::load(
                    dir,
                    &comp_name("compressor.indexer", "indexer.compressor"),
                    h,
                    (csa, ihd, true),
                    compress_rope.clone(),
                    rd,
                )?,
                q_b: Linear::load(
                    dir,
                    &a("compressor.indexer.q_b_proj.weight", "indexer.wq_b.weight"),
                    cfg.index_n_heads * ihd,
                    qr,
                )?,
                weights: Linear::load(
                    dir,
                    &a(
                        "compressor.indexer.scorer.weights_proj.weight",
                        "indexer.weights_proj.weight",
                    ),
                    cfg.index_n_heads,
                    h,
                )?,
                heads: cfg.index_n_heads,
                top_k: cfg.index_topk,
            };
            (
                Some(Compressor::load(
                    dir,
                    &comp_name("compressor", "compressor"),
                    h,
                    (csa, hd, true),
                    compress_rope.clone(),
                    rd,
                )?),
                Some(ix),
            )
        }
    };
    Ok(CompressedAttention {
        q_a: Linear::load(dir, &a("q_a_proj.weight", "wq_a.weight"), qr, h)?,
        q_a_norm: load_vector(dir, &a("q_a_norm.weight", "q_norm.weight"), qr)?,
        q_b: Linear::load(dir, &a("q_b_proj.weight", "wq_b.weight"), heads * hd, qr)?,
        kv: Linear::load(dir, &a("kv_proj.weight", "wkv.weight"), hd, h)?,
        kv_norm: load_vector(dir, &a("kv_norm.weight", "kv_norm.weight"), hd)?,
        o_a: Linear::load_row_blocks(
            dir,
            &a("o_a_proj.weight", "wo_a.weight"),
            groups,
            cfg.o_lora_rank,
            heads * hd / groups,
        )?,
        o_b: Linear::load(
            dir,
            &a("o_b_proj.weight", "wo_b.weight"),
            h,
            groups * cfg.o_lora_rank,
        )?,
        sinks: load_vector(dir, &a("sinks", "attn_sink"), heads)?,
        heads,
        head_dim: hd,
        rope_dim: rd,
        window: cfg.sliding_window,
        rope,
        compressor,
        indexer,
    })
}

/// Layer `i`'s MoE: routed experts (fused or per expert), the shared expert, the router
/// with its bias (`moe`) or token table (`hash_moe`).
fn load_moe(
    dir: &ModelDir,
    names: &Names,
    cfg: &DeepseekV4Config,
    hash: bool,
    i: usize,
    score: ScoreFn,
    limit: f32,
) -> Result<Moe> {
    let (h, inter, ne, k) = (
        cfg.common.hidden_size,
        cfg.moe_intermediate_size,
        cfg.n_routed_experts,
        cfg.num_experts_per_tok,
    );
    let m = |tf: &str, hub: &str| names.layer(i, &format!("mlp.{tf}"), &format!("ffn.{hub}"));
    let fp4 = expert_dtype(dir, cfg)? == ExpertDtype::Fp4;
    let choice = if hash {
        Choice::Hash(load_token_table(
            dir,
            &m("gate.tid2eid", "gate.tid2eid"),
            cfg.common.vocab_size,
            k,
            ne,
        )?)
    } else {
        Choice::Biased(load_vector(
            dir,
            &m("gate.e_score_correction_bias", "gate.bias"),
            ne,
        )?)
    };
    let fused = m("experts.gate_up_proj", "");
    let experts = (0..ne)
        .map(|e| {
            let mut mlp = if fp4 {
                if !names.hub && dir.has(&fused) {
                    return Err(ModelError::BadTensor {
                        name: fused.clone(),
                        msg: "FP4 experts fused per layer are not supported; the release's \
                              per-expert tensors are"
                            .into(),
                    });
                }
                let [g, u, d] = [("gate_proj", "w1"), ("up_proj", "w3"), ("down_proj", "w2")].map(
                    |(tf, hub)| {
                        m(
                            &format!("experts.{e}.{tf}.weight"),
                            &format!("experts.{e}.{hub}.weight"),
                        )
                    },
                );
                Mlp {
                    gate_proj: Linear::load_fp4(dir, &g, inter, h)?,
                    up_proj: Linear::load_fp4(dir, &u, inter, h)?,
                    down_proj: Linear::load_fp4(dir, &d, h, inter)?,
                    limit: None,
                }
            } else if !names.hub && dir.has(&fused) {
                let down = m("experts.down_proj", "");
                Mlp {
                    gate_proj: Linear::load_fused_expert(dir, &fused, e, ne, 0, 2, inter, h)?,
                    up_proj: Linear::load_fused_expert(dir, &fused, e, ne, 1, 2, inter, h)?,
                    down_proj: Linear::load_fused_expert(dir, &down, e, ne, 0, 1, h, inter)?,
                    limit: None,
                }
            } else {
                let [g, u, d] = [("gate_proj", "w1"), ("up_proj", "w3"), ("down_proj", "w2")].map(
                    |(tf, hub)| m(&format!("experts.{e}.{tf}"), &format!("experts.{e}.{hub}")),
                );
                Mlp::load(dir, [&g, &u, &d], h, inter, false)?
            };
            mlp.limit = Some(limit);
            Ok(Expert::SwiGlu(mlp))
        })
        .collect::<Result<Vec<_>>>()?;
    let [g, u, d] =
        [("gate_proj", "w1"), ("up_proj", "w3"), ("down_proj", "w2")].map(|(tf, hub)| {
            m(
                &format!("shared_experts.{tf}"),
                &format!("shared_experts.{hub}"),
            )
        });
    let mut shared = Mlp::load(dir, [&g, &u, &d], h, inter, false)?;
    shared.limit = Some(limit);
    Ok(Moe {
        router: Linear::load(dir, &m("gate.weight", "gate.weight"), ne, h)?,
        experts,
        top_k: k,
        routing: Routing::Scored {
            score,
            choice,
            scaling: cfg.routed_scaling_factor as f32,
        },
        shared: Some(SharedExpert {
            mlp: shared,
            gate: None,
        }),
    })
}

/// `tid2eid` `[vocab, top_k]` (I64 or I32): every entry an expert index, the experts of a
/// row distinct.
fn load_token_table(
    dir: &ModelDir,
    name: &str,
    vocab: usize,
    k: usize,
    n_experts: usize,
) -> Result<Vec<u32>> {
    let t = dir.tensor_shaped(name, &[vocab, k])?;
    let bytes = t.read_bytes()?;
    let values: Vec<i64> = match t.dtype_name.as_str() {
        "I64" => bytes
            .chunks_exact(8)
            .map(|b| i64::from_le_bytes(b.try_into().expect("8 bytes")))
            .collect(),
        "I32" => bytes
            .chunks_exact(4)
            .map(|b| i32::from_le_bytes(b.try_into().expect("4 bytes")) as i64)
            .collect(),
        other => {
            return Err(ModelError::BadTensor {
                name: name.to_string(),
                msg: format!("the token-to-expert table must be I64 or I32, found {other}"),
            })
        }
    };
    let bad = |msg: String| ModelError::BadTensor {
        name: name.to_string(),
        msg,
    };
    let mut out = Vec::with_capacity(values.len());
    for (tok, row) in values.chunks_exact(k).enumerate() {
        for (j, &e) in row.iter().enumerate() {
            if e < 0 || e as usize >= n_experts {
                return Err(bad(format!(
                    "token {tok} routes to expert {e}, outside 0..{n_experts}"
                )));
            }
            if row[..j].contains(&e) {
                return Err(bad(format!("token {tok} lists expert {e} twice")));
            }
            out.push(e as u32);
        }
    }
    Ok(out)
}
