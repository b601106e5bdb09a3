#!/usr/bin/env python3
"""GGUF oracle fixtures: tiny random models of each architecture coli reads from GGUF.

Each fixture (tests/fixtures/gguf_<name>/) is a `model.gguf` whose tensors are written as
llama.cpp's converter names and lays them out (experts stacked per layer in `*_exps`,
Llama's Q/K rows permuted for interleaved RoPE), in a mix of quantization types per tensor
as the common recipes mix them, and the reference of `transformers` on the GGUF's weights
as gguf-py dequantizes them (loaded into the Hugging Face model by name, Q/K rows put back
with the inverse of the converter's permutation).

Blocks are random bytes with their f16 scales chosen for a 1/sqrt(fan_in) spread (every bit
pattern of a block is a valid block), so every type's decoder is exercised in the model.

    python oracle/gguf_models.py [NAME..]   # under oracle/requirements-tf5.txt (NAME: e.g. llama_q4_k_m)
    python oracle/gguf_models.py demo FILE  # tests/fixtures/demo_gguf/reference.json: transformers'
                                            # own GGUF loader and tokenizer on the demo model's GGUF
"""
import json
import math
import os
import shutil
import sys

import numpy as np
import torch
import transformers
import gguf
from gguf import GGMLQuantizationType as T
from gguf import GGUFWriter, quants
from gguf.constants import GGML_QUANT_SIZES
from transformers import AutoConfig, AutoModelForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from generate import ROOT, check_router_margins, decisive_init, group_router_hook, mild_decay, reference  # noqa: E402
from gguf_quants import F16_AT  # noqa: E402


def blocks_for(ty, rows, cols, std, rng):
    """`rows` rows of random `ty` blocks whose values spread about `std`."""
    name = ty.name
    bs, bb = GGML_QUANT_SIZES[ty]
    n = rows * cols // bs
    b = rng.integers(0, 256, (n, bb), dtype=np.uint8)
    if name == "MXFP4":
        # 2^(e-127)/2 * values up to 12: pick e so the spread is about `std`.
        e = int(round(127 + math.log2(std) - 1))
        b[:, 0] = rng.integers(e - 1, e + 2, n, dtype=np.uint8)
        return b.reshape(rows, cols // bs * bb)

    def set_scales(d):
        d16 = (d * rng.choice([-1.0, 1.0], n)).astype(np.float16)
        for off in F16_AT[name]:
            b[:, off:off + 2] = d16.view(np.uint8).reshape(n, 2)
        if name == "IQ1_M":
            bits = d16.view(np.uint16)
            words = b[:, 48:56].copy().view(np.uint16).reshape(n, 4) & np.uint16(0x0FFF)
            for k, shift in enumerate([12, 8, 4, 0]):
                words[:, k] |= ((bits >> np.uint16(shift)) & np.uint16(0xF)) << np.uint16(12)
            b[:, 48:56] = words.view(np.uint8).reshape(n, 8)

    set_scales(np.ones(n))
    unit = quants.dequantize(b.reshape(-1), ty).std()
    set_scales(np.full(n, std / unit))
    return b.reshape(rows, cols // bs * bb)


def dequant(raw, ty, shape):
    return quants.dequantize(raw.reshape(-1), ty).reshape(shape).astype(np.float32)


def hf_to_gguf_rows(w, heads):
    """convert_hf_to_gguf's `permute`: Hugging Face Q/K rows in llama.cpp's RoPE order."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def gguf_to_hf_rows(w, heads):
    return w.reshape(heads, w.shape[0] // heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


# Hugging Face tail of a layer tensor -> (GGUF tail, is stacked experts).
LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
    "mlp.gate.weight": "ffn_gate_inp.weight",
}
EXPERT_NAMES = {"gate_up_proj": None, "down_proj": "ffn_down_exps.weight"}


ONLY = set()  # fixture names given on the command line (none: all)


def build(name, model_type, arch, seed, types, n_experts=0, top_k=0, expert_inter=0, **kw):
    if ONLY and name not in ONLY:
        return
    cfg = AutoConfig.for_model(model_type, **kw)
    cfg._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").float().eval()
    decisive_init(model, seed, 4.0)
    rng = np.random.default_rng(seed)
    sd = model.state_dict()
    out_dir = os.path.join(ROOT, f"gguf_{name}")
    shutil.rmtree(out_dir, ignore_errors=True)
    os.makedirs(out_dir)
    w = GGUFWriter(os.path.join(out_dir, "model.gguf"), arch)
    hd = cfg.head_dim if getattr(cfg, "head_dim", None) else cfg.hidden_size // cfg.num_attention_heads
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_key_length(hd)
    w.add_value_length(hd)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_rope_freq_base(cfg.rope_parameters["rope_theta"] if hasattr(cfg, "rope_parameters") else cfg.rope_theta)
    if n_experts:
        w.add_expert_count(n_experts)
        w.add_expert_used_count(top_k)
        w.add_expert_feed_forward_length(expert_inter)
    w.add_bos_token_id(cfg.bos_token_id)
    w.add_eos_token_id(cfg.eos_token_id)
    new_sd = {}

    def put(gguf_name, hf_names, ty, tensor, permute_heads=None):
        """Writes `tensor` (HF layout, [.., rows, cols]) as `ty` blocks; the HF model gets
        the dequantized values (`hf_names`: one name, or one per expert)."""
        shape = tuple(tensor.shape)
        if ty in (T.F32,):
            data = tensor.numpy().astype(np.float32)
            w.add_tensor(gguf_name, data)
            new_sd[hf_names[0]] = torch.from_numpy(data.copy())
            return
        rows = int(np.prod(shape[:-1]))
        std = float(tensor.std()) or 0.05
        raw = blocks_for(ty, rows, shape[-1], std, rng)
        raw = raw.reshape(*shape[:-1], raw.shape[-1])
        values = dequant(raw, ty, shape)
        w.add_tensor(gguf_name, raw, raw_dtype=ty)
        if permute_heads:
            values = gguf_to_hf_rows(values, permute_heads)
        if len(hf_names) == 1:
            new_sd[hf_names[0]] = torch.from_numpy(values.copy())
        else:
            for e, n in enumerate(hf_names):
                new_sd[n] = torch.from_numpy(values[e].copy())

    put("token_embd.weight", ["model.embed_tokens.weight"], types["embd"], sd["model.embed_tokens.weight"])
    put("output_norm.weight", ["model.norm.weight"], T.F32, sd["model.norm.weight"])
    if not cfg.tie_word_embeddings:
        put("output.weight", ["lm_head.weight"], types["output"], sd["lm_head.weight"])
    for L in range(cfg.num_hidden_layers):
        p = f"model.layers.{L}."
        for tail, gtail in LAYER_NAMES.items():
            if p + tail not in sd:
                continue
            t = sd[p + tail]
            if t.dim() == 1 or tail == "mlp.gate.weight":
                put(f"blk.{L}.{gtail}", [p + tail], T.F32, t)
                continue
            kind = tail.split(".")[1].replace("_proj", "").replace("weight", "")
            heads = None
            if arch == "llama" and tail == "self_attn.q_proj.weight":
                heads = cfg.num_attention_heads
            if arch == "llama" and tail == "self_attn.k_proj.weight":
                heads = cfg.num_key_value_heads
            ty = types[kind]
            gguf_t = t
            if heads:
                gguf_t = torch.from_numpy(hf_to_gguf_rows(t.numpy(), heads))
            put(f"blk.{L}.{gtail}", [p + tail], ty, gguf_t, permute_heads=heads)
        if n_experts:
            # transformers 5 keeps experts fused: gate_up_proj [E, 2I, H], down_proj [E, H, I].
            gu = sd[p + "mlp.experts.gate_up_proj"]
            down = sd[p + "mlp.experts.down_proj"]
            inter = down.shape[-1]
            gate, up = gu[:, :inter], gu[:, inter:]
            vals = {}
            for gname, t, ty in [("ffn_gate_exps", gate, types["exp_gate"]), ("ffn_up_exps", up, types["exp_up"]),
                                 ("ffn_down_exps", down, types["exp_down"])]:
                std = float(t.std())
                raw = blocks_for(ty, t.shape[0] * t.shape[1], t.shape[2], std, rng).reshape(t.shape[0], t.shape[1], -1)
                w.add_tensor(f"blk.{L}.{gname}.weight", raw, raw_dtype=ty)
                vals[gname] = torch.from_numpy(dequant(raw, ty, tuple(t.shape)))
            new_sd[p + "mlp.experts.gate_up_proj"] = torch.cat([vals["ffn_gate_exps"], vals["ffn_up_exps"]], dim=1)
            new_sd[p + "mlp.experts.down_proj"] = vals["ffn_down_exps"]
    missing = [k for k in sd if k not in new_sd and not (cfg.tie_word_embeddings and k == "lm_head.weight")]
    assert not missing, missing
    model.load_state_dict(new_sd, strict=False)
    if cfg.tie_word_embeddings:
        model.tie_weights()
    gaps = check_router_margins(model, top_k) if n_experts else []
    finish(name, out_dir, w, model, cfg, seed, gaps, types)


def finish(name, out_dir, w, model, cfg, seed, gaps, types, quantizer=None):
    """Writes the GGUF (`w`; None: written already, by `quantizer`), then transformers'
    reference on its dequantized weights (refused when a routing decision sits on a tie)."""
    if w is not None:
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
    ref, logits = reference(model, cfg.vocab_size, seed)
    if gaps and min(gaps) < 1e-5:
        sys.exit(f"{name}: a routing decision is within {min(gaps):.1e} of a tie; change the seed")
    logits.tofile(os.path.join(out_dir, "logits.bin"))
    ref["name"] = f"gguf_{name}"
    ref["transformers"] = transformers.__version__
    ref["torch"] = torch.__version__
    ref["gguf_types"] = {k: T(v).name for k, v in types.items()}
    if quantizer:
        ref["quantizer"] = quantizer
    with open(os.path.join(out_dir, "reference.json"), "w") as f:
        json.dump(ref, f)
    size = sum(os.path.getsize(os.path.join(out_dir, x)) for x in os.listdir(out_dir))
    m = np.array(ref["top2_margin"]) / np.maximum(np.array(ref["max_abs_logit"]), 1e-9)
    print(f"gguf_{name}: {size/1024:.0f} KiB, near-ties {int((m < 1e-3).sum())}/{len(m)}, "
          f"router gap {min(gaps) if gaps else None}, greedy {ref['greedy'][:8]}")


DEEPSEEK_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_a_proj.weight": "attn_q_a.weight",
    "self_attn.q_a_layernorm.weight": "attn_q_a_norm.weight",
    "self_attn.q_b_proj.weight": "attn_q_b.weight",
    "self_attn.kv_a_proj_with_mqa.weight": "attn_kv_a_mqa.weight",
    "self_attn.kv_a_layernorm.weight": "attn_kv_a_norm.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
    "mlp.gate.weight": "ffn_gate_inp.weight",
    "mlp.gate.e_score_correction_bias": "exp_probs_b.bias",
    "mlp.shared_experts.gate_proj.weight": "ffn_gate_shexp.weight",
    "mlp.shared_experts.up_proj.weight": "ffn_up_shexp.weight",
    "mlp.shared_experts.down_proj.weight": "ffn_down_shexp.weight",
}


GLM_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "post_attention_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    **{k: v for k, v in DEEPSEEK_NAMES.items() if k.startswith("mlp.")},
}


MINIMAX_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "mlp.gate.weight": "ffn_gate_inp.weight",
    "mlp.e_score_correction_bias": "exp_probs_b.bias",
}


def build_deepseek(name, seed, types, split_kv_b=True, model_type="deepseek_v3", arch="deepseek2", ftype=None,
                   **kw):
    """DeepSeek-V3 as llama.cpp's converter writes it (`deepseek2`): `kv_b_proj` split into
    `attn_k_b` (each head's key rows transposed) and `attn_v_b`, or (`split_kv_b=False`, as
    files before the split) kept as `attn_kv_b`; experts stacked; the selection bias as
    `exp_probs_b.bias`; no Q/K permutation. Also `glm4moe` and `minimax-m2`.

    `types`: each tensor's type, blocks drawn here (`blocks_for`). Or `ftype`: a recipe of
    llama.cpp's own quantizer (`types` unused): the model is written as F32, quantized by
    `llama-quantize` (see `quantize()`), and the reference is transformers on the values
    the quantizer wrote, as gguf-py dequantizes them."""
    if ONLY and name not in ONLY:
        return
    import tempfile
    from gguf import GGUFReader
    from gguf import ExpertGatingFuncType
    cfg = AutoConfig.for_model(model_type, **kw)
    minimax = arch == "minimax-m2"
    glm = arch == "glm4moe" or minimax
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").float().eval()
    decisive_init(model, seed, 4.0)
    rng = np.random.default_rng(seed)
    sd = model.state_dict()
    out_dir = os.path.join(ROOT, f"gguf_{name}")
    shutil.rmtree(out_dir, ignore_errors=True)
    os.makedirs(out_dir)
    tmp = tempfile.mkdtemp() if ftype else None
    w = GGUFWriter(os.path.join(tmp or out_dir, "f32.gguf" if ftype else "model.gguf"), arch)
    nh = cfg.num_attention_heads
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(nh)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_rope_freq_base(cfg.rope_parameters["rope_theta"])
    if not minimax:
        w.add_leading_dense_block_count(cfg.first_k_dense_replace)
    w.add_vocab_size(cfg.vocab_size)
    if glm:
        # transformers builds no MTP layer, so the file has none (nextn_predict_layers 0).
        w.add_head_count_kv(cfg.num_key_value_heads)
        w.add_key_length(cfg.head_dim)
        w.add_value_length(cfg.head_dim)
        w.add_rope_dimension_count(int(cfg.head_dim * cfg.rope_parameters.get("partial_rotary_factor", 0.5)))
        if not minimax:
            w.add_nextn_predict_layers(0)
    else:
        nope, rope, v, r = cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim, cfg.kv_lora_rank
        w.add_head_count_kv(1)
        w.add_q_lora_rank(cfg.q_lora_rank)
        w.add_kv_lora_rank(r)
        w.add_rope_dimension_count(rope)
    if glm:
        pass
    elif split_kv_b:
        w.add_key_length(r + rope)
        w.add_value_length(r)
        w.add_key_length_mla(nope + rope)
        w.add_value_length_mla(v)
    else:
        w.add_key_length(nope + rope)
        w.add_value_length(v)
    if minimax:
        w.add_expert_feed_forward_length(cfg.intermediate_size)
        w.add_expert_count(cfg.num_local_experts)
        w.add_expert_used_count(cfg.num_experts_per_tok)
        w.add_expert_gating_func(ExpertGatingFuncType.SIGMOID)
    else:
        w.add_expert_feed_forward_length(cfg.moe_intermediate_size)
        w.add_expert_count(cfg.n_routed_experts)
        w.add_expert_used_count(cfg.num_experts_per_tok)
        w.add_expert_shared_count(cfg.n_shared_experts)
        w.add_expert_weights_scale(cfg.routed_scaling_factor)
        w.add_expert_weights_norm(cfg.norm_topk_prob)
        w.add_expert_gating_func(ExpertGatingFuncType.SIGMOID)
        w.add_expert_group_count(cfg.n_group)
        w.add_expert_group_used_count(cfg.topk_group)
    w.add_bos_token_id(cfg.bos_token_id)
    w.add_eos_token_id(cfg.eos_token_id)
    quantized = {}  # with `ftype`: each tensor's values in the quantizer's file

    def quant(gguf_name, ty, t):
        """Writes `t` ([.., rows, cols]) as `ty` blocks; returns the dequantized values.
        The second pass of `ftype`: the quantized file's values."""
        shape = tuple(t.shape)
        if quantized:
            return quantized[gguf_name].reshape(shape)
        if ftype:
            ty = T.F32
        if ty == T.F32:
            data = t.numpy().astype(np.float32)
            w.add_tensor(gguf_name, data)
            return data.copy()
        rows = int(np.prod(shape[:-1]))
        raw = blocks_for(ty, rows, shape[-1], float(t.std()) or 0.05, rng).reshape(*shape[:-1], -1)
        w.add_tensor(gguf_name, raw, raw_dtype=ty)
        return dequant(raw, ty, shape)

    def kind(key):
        """The recipe's type for `key` (with `ftype`: F32, the quantizer decides)."""
        return T.F32 if ftype else types[key]

    def emit():
        """Every tensor through `quant`; transformers' state dict of their values."""
        new_sd = {}
        new_sd["model.embed_tokens.weight"] = torch.from_numpy(quant("token_embd.weight", kind("embd"),
                                                                     sd["model.embed_tokens.weight"]))
        new_sd["model.norm.weight"] = torch.from_numpy(quant("output_norm.weight", T.F32, sd["model.norm.weight"]))
        new_sd["lm_head.weight"] = torch.from_numpy(quant("output.weight", kind("output"), sd["lm_head.weight"]))
        for L in range(cfg.num_hidden_layers):
            p = f"model.layers.{L}."
            for tail, gtail in (MINIMAX_NAMES if minimax else GLM_NAMES if glm else DEEPSEEK_NAMES).items():
                if p + tail not in sd:
                    continue
                t = sd[p + tail]
                ty = T.F32 if t.dim() == 1 or tail == "mlp.gate.weight" else kind(tail.split(".")[-2])
                new_sd[p + tail] = torch.from_numpy(quant(f"blk.{L}.{gtail}", ty, t))
            if glm:
                pass
            elif split_kv_b:
                kv_b = sd[p + "self_attn.kv_b_proj.weight"]
                per_head = kv_b.view(nh, nope + v, r)
                k_b = per_head[:, :nope].transpose(1, 2).contiguous()  # [nh, r, nope]
                v_b = per_head[:, nope:].contiguous()  # [nh, v, r]
                kv = quant(f"blk.{L}.attn_k_b.weight", kind("k_b"), k_b)
                vv = quant(f"blk.{L}.attn_v_b.weight", kind("v_b"), v_b)
                full = np.concatenate([kv.transpose(0, 2, 1), vv], axis=1).reshape(nh * (nope + v), r)
                new_sd[p + "self_attn.kv_b_proj.weight"] = torch.from_numpy(np.ascontiguousarray(full))
            else:
                full = quant(f"blk.{L}.attn_kv_b.weight", kind("kv_b_proj"), sd[p + "self_attn.kv_b_proj.weight"])
                new_sd[p + "self_attn.kv_b_proj.weight"] = torch.from_numpy(np.ascontiguousarray(full))
            if p + "mlp.experts.gate_up_proj" in sd:
                gu = sd[p + "mlp.experts.gate_up_proj"]
                down = sd[p + "mlp.experts.down_proj"]
                inter = down.shape[-1]
                g = quant(f"blk.{L}.ffn_gate_exps.weight", kind("exp_gate"), gu[:, :inter])
                u = quant(f"blk.{L}.ffn_up_exps.weight", kind("exp_up"), gu[:, inter:])
                d = quant(f"blk.{L}.ffn_down_exps.weight", kind("exp_down"), down)
                new_sd[p + "mlp.experts.gate_up_proj"] = torch.from_numpy(np.concatenate([g, u], axis=1))
                new_sd[p + "mlp.experts.down_proj"] = torch.from_numpy(d)
        return new_sd

    new_sd = emit()
    tool = None
    if ftype:
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        out = os.path.join(out_dir, "model.gguf")
        tool = quantize(os.path.join(tmp, "f32.gguf"), out, ftype)
        shutil.rmtree(tmp, ignore_errors=True)
        types = {}
        for t in GGUFReader(out).tensors:
            quantized[t.name] = quants.dequantize(t.data, t.tensor_type).astype(np.float32)
            types[t.name] = t.tensor_type
        new_sd = emit()
        w = None
        tool = f"{tool}, {ftype}"
    missing = [k for k in sd if k not in new_sd]
    assert not missing, missing
    model.load_state_dict(new_sd, strict=True)
    gaps = []
    for m in model.modules():
        if type(m).__name__.endswith("TopkRouter"):
            m.register_forward_hook(group_router_hook(gaps))
    finish(name, out_dir, w, model, cfg, seed, gaps, types, tool)


def quantize(src, out, ftype, imatrix=None):
    """Runs llama.cpp's quantizer (`llama-quantize`, the `llama_model_quantize` of
    llama-cpp-python's vendored llama.cpp) from F32 `src` to `out`; returns its name."""
    import subprocess
    tool = os.environ.get("LLAMA_QUANTIZE")
    if not tool:
        sys.exit("set LLAMA_QUANTIZE to llama-quantize built from llama-cpp-python==0.3.36's sdist: "
                 "cmake -B build vendor/llama.cpp -DLLAMA_CURL=OFF && cmake --build build --target llama-quantize")
    args = [tool] + (["--imatrix", imatrix] if imatrix else []) + [src, out, ftype, "2"]
    r = subprocess.run(args, capture_output=True, text=True)
    assert r.returncode == 0, f"llama-quantize failed:\n{r.stderr[-3000:]}"
    return "llama-quantize (llama-cpp-python 0.3.36's vendored llama.cpp)"


def write_imatrix(path, reader, seed):
    """An importance matrix in llama.cpp's legacy layout (`common_imatrix_load_legacy`):
    i32 entry count; per entry i32 name length, name, i32 calls, i32 values, f32 values
    (summed over calls; the loader divides by the calls); then i32 chunks and a dataset
    name. One entry per 2-D weight and per stacked expert tensor (columns x experts)."""
    import struct
    rng = np.random.default_rng(seed)
    entries = []
    for t in reader.tensors:
        dims = [int(x) for x in t.shape]  # innermost first
        if len(dims) < 2 or not t.name.endswith(".weight") or t.name.startswith("token_embd"):
            continue
        n = dims[0] * (dims[2] if len(dims) == 3 else 1)
        entries.append((t.name, rng.uniform(0.05, 2.0, n).astype(np.float32)))
    with open(path, "wb") as f:
        f.write(struct.pack("<i", len(entries)))
        for name, v in entries:
            b = name.encode()
            f.write(struct.pack("<i", len(b)) + b + struct.pack("<ii", 1, len(v)) + v.tobytes())
        ds = b"synthetic"
        f.write(struct.pack("<ii", 1, len(ds)) + ds)


GPT_OSS_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "post_attention_norm.weight",
    "self_attn.sinks": "attn_sinks.weight",
    "mlp.router.weight": "ffn_gate_inp.weight",
    "mlp.router.bias": "ffn_gate_inp.bias",
    **{f"self_attn.{x}_proj.{b}": f"attn_{y}.{b}" for x, y in
       [("q", "q"), ("k", "k"), ("v", "v"), ("o", "output")] for b in ("weight", "bias")},
}


def gpt_oss_f32(w, cfg, sd, back):
    """gpt-oss' layers as llama.cpp's converter (`conversion/gpt_oss.py`) writes an
    unquantized checkpoint: transformers' input-major experts transposed, the interleaved
    gate/up rows (and biases) split into `ffn_gate_exps` (even rows) and `ffn_up_exps`
    (odd), `down_proj` as `ffn_down_exps`; Q/K not permuted (NeoX RoPE)."""
    for L in range(cfg.num_hidden_layers):
        p = f"model.layers.{L}."
        for tail, gtail in GPT_OSS_NAMES.items():
            w.add_tensor(f"blk.{L}.{gtail}", np.ascontiguousarray(sd[p + tail].numpy()))
            back[f"blk.{L}.{gtail}"] = (p + tail, None)
        gu = sd[p + "mlp.experts.gate_up_proj"].numpy().transpose(0, 2, 1)  # [E, 2I, H]
        gub = sd[p + "mlp.experts.gate_up_proj_bias"].numpy()
        down = sd[p + "mlp.experts.down_proj"].numpy().transpose(0, 2, 1)  # [E, H, I]
        for gname, t in [("ffn_gate_exps.weight", gu[:, ::2]), ("ffn_up_exps.weight", gu[:, 1::2]),
                         ("ffn_down_exps.weight", down), ("ffn_gate_exps.bias", gub[:, ::2]),
                         ("ffn_up_exps.bias", gub[:, 1::2]),
                         ("ffn_down_exps.bias", sd[p + "mlp.experts.down_proj_bias"].numpy())]:
            w.add_tensor(f"blk.{L}.{gname}", np.ascontiguousarray(t))
            back[f"blk.{L}.{gname}"] = ((p, gname), None)


def gpt_oss_experts(p, v):
    """transformers' expert tensors of layer `p` from the GGUF's dequantized ones (the
    converter's split undone: gate rows even, up rows odd, input-major)."""
    def interleave(a, b, axis):
        out = np.empty(a.shape[:axis] + (2 * a.shape[axis],) + a.shape[axis + 1:], np.float32)
        idx = [slice(None)] * a.ndim
        idx[axis] = slice(0, None, 2)
        out[tuple(idx)] = a
        idx[axis] = slice(1, None, 2)
        out[tuple(idx)] = b
        return out
    t = lambda a: torch.from_numpy(np.ascontiguousarray(a))  # noqa: E731
    gu = interleave(v["ffn_gate_exps.weight"], v["ffn_up_exps.weight"], 1)  # [E, 2I, H]
    return {
        p + "mlp.experts.gate_up_proj": t(gu.transpose(0, 2, 1)),
        p + "mlp.experts.gate_up_proj_bias": t(interleave(v["ffn_gate_exps.bias"], v["ffn_up_exps.bias"], 1)),
        p + "mlp.experts.down_proj": t(v["ffn_down_exps.weight"].transpose(0, 2, 1)),
        p + "mlp.experts.down_proj_bias": t(v["ffn_down_exps.bias"]),
    }


def qwen3next_f32(w, cfg, sd, back):
    """Qwen3-Next as llama.cpp's converter (`conversion/qwen.py`, `Qwen3NextModel`) writes
    it: zero-centred norms stored as `1 + w` (not the gated norm of the linear layers),
    `A_log` as `-exp(A_log)`, the convolution squeezed to [channels, kernel], `dt_bias` as
    `ssm_dt.bias`, and `in_proj_qkvz` (grouped per key head as [q|k|v|z]) taken apart into
    the flat `attn_qkv` (every q head, every k head, every v head) and `attn_gate` (z).
    `back` entries ("=", name) are F32 tensors derived from the Hugging Face one: the
    reference keeps the original (checked to stay F32 through the quantizer)."""
    nk, nv = cfg.linear_num_key_heads, cfg.linear_num_value_heads
    dk, dv = cfg.linear_key_head_dim, cfg.linear_value_head_dim
    r = nv // nk
    w.add_tensor("output_norm.weight", sd["model.norm.weight"].numpy() + np.float32(1))
    back["output_norm.weight"] = (("=", "model.norm.weight"), None)
    for L in range(cfg.num_hidden_layers):
        p = f"model.layers.{L}."

        def put(gname, hf, value):
            w.add_tensor(f"blk.{L}.{gname}", np.ascontiguousarray(value))
            back[f"blk.{L}.{gname}"] = hf

        put("attn_norm.weight", (("=", p + "input_layernorm.weight"), None),
            sd[p + "input_layernorm.weight"].numpy() + np.float32(1))
        put("post_attention_norm.weight", (("=", p + "post_attention_layernorm.weight"), None),
            sd[p + "post_attention_layernorm.weight"].numpy() + np.float32(1))
        if cfg.layer_types[L] == "linear_attention":
            a = p + "linear_attn."
            qkvz = sd[a + "in_proj_qkvz.weight"].numpy().reshape(nk, 2 * dk + 2 * r * dv, -1)
            q, k = qkvz[:, :dk], qkvz[:, dk:2 * dk]
            v, z = qkvz[:, 2 * dk:2 * dk + r * dv], qkvz[:, 2 * dk + r * dv:]
            hsz = qkvz.shape[-1]
            put("attn_qkv.weight", ((p, "attn_qkv"), None),
                np.concatenate([q.reshape(-1, hsz), k.reshape(-1, hsz), v.reshape(-1, hsz)]))
            put("attn_gate.weight", ((p, "attn_gate"), None), z.reshape(-1, hsz))
            put("ssm_ba.weight", (a + "in_proj_ba.weight", None), sd[a + "in_proj_ba.weight"].numpy())
            put("ssm_conv1d.weight", (("=", a + "conv1d.weight"), None), sd[a + "conv1d.weight"].numpy().squeeze(1))
            put("ssm_dt.bias", (("=", a + "dt_bias"), None), sd[a + "dt_bias"].numpy())
            put("ssm_a", (("=", a + "A_log"), None), (-torch.exp(sd[a + "A_log"])).numpy())
            put("ssm_norm.weight", (a + "norm.weight", None), sd[a + "norm.weight"].numpy())
            put("ssm_out.weight", (a + "out_proj.weight", None), sd[a + "out_proj.weight"].numpy())
        else:
            a = p + "self_attn."
            for x, g in [("q_proj", "attn_q"), ("k_proj", "attn_k"), ("v_proj", "attn_v"), ("o_proj", "attn_output")]:
                put(f"{g}.weight", (a + x + ".weight", None), sd[a + x + ".weight"].numpy())
            for x in ("q_norm", "k_norm"):
                put(f"attn_{x}.weight", (("=", a + x + ".weight"), None), sd[a + x + ".weight"].numpy() + np.float32(1))
        m = p + "mlp."
        put("ffn_gate_inp.weight", (m + "gate.weight", None), sd[m + "gate.weight"].numpy())
        for x, g in [("gate_proj", "ffn_gate_shexp"), ("up_proj", "ffn_up_shexp"), ("down_proj", "ffn_down_shexp")]:
            put(f"{g}.weight", (m + f"shared_expert.{x}.weight", None), sd[m + f"shared_expert.{x}.weight"].numpy())
        put("ffn_gate_inp_shexp.weight", (m + "shared_expert_gate.weight", None), sd[m + "shared_expert_gate.weight"].numpy())
        gu, down = sd[m + "experts.gate_up_proj"].numpy(), sd[m + "experts.down_proj"].numpy()
        inter = down.shape[-1]
        for gname, t in [("ffn_gate_exps", gu[:, :inter]), ("ffn_up_exps", gu[:, inter:]), ("ffn_down_exps", down)]:
            put(f"{gname}.weight", ((p, gname), None), t)


def qwen3next_qkvz(cfg, qkv, z):
    """`in_proj_qkvz` grouped per key head from the converter's flat q|k|v and z rows."""
    nk, nv = cfg.linear_num_key_heads, cfg.linear_num_value_heads
    dk, dv = cfg.linear_key_head_dim, cfg.linear_value_head_dim
    r = nv // nk
    hsz = qkv.shape[-1]
    q = qkv[:nk * dk].reshape(nk, dk, hsz)
    k = qkv[nk * dk:2 * nk * dk].reshape(nk, dk, hsz)
    v = qkv[2 * nk * dk:].reshape(nk, r * dv, hsz)
    return np.concatenate([q, k, v, z.reshape(nk, r * dv, hsz)], axis=1).reshape(-1, hsz)


def build_quantized(name, model_type, arch, seed, ftype, n_experts=0, top_k=0, expert_inter=0, imatrix=False,
                    post_init=None, **kw):
    """A tiny model quantized by llama.cpp's own quantizer (`llama_model_quantize`, the
    `ftype` recipe's mix of types per tensor, real block search): the model is written as
    an F32 GGUF as the converter names and permutes it, quantized by llama.cpp, and the
    reference is transformers on the quantized file's values as gguf-py dequantizes them.

    `ftype` is the recipe's name as `llama-quantize` takes it (`Q4_K_M`, `Q2_K`,
    `IQ2_XXS`…). The tool is `$LLAMA_QUANTIZE`, built from the pinned llama-cpp-python
    sdist's `vendor/llama.cpp` (see `quantize()`). `imatrix`: an importance matrix in
    llama.cpp's legacy `.dat` layout, as the i-quant recipes below 3 bits require:
    positive per-column weights drawn from the seed (the quantizer weighs its block
    search by them; the reference is the values it wrote, whatever the weights)."""
    if ONLY and name not in ONLY:
        return
    import tempfile
    from gguf import GGUFReader
    cfg = AutoConfig.for_model(model_type, **kw)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").float().eval()
    decisive_init(model, seed, 4.0)
    if post_init:
        post_init(model, seed)
    sd = model.state_dict()
    out_dir = os.path.join(ROOT, f"gguf_{name}")
    shutil.rmtree(out_dir, ignore_errors=True)
    os.makedirs(out_dir)
    tmp = tempfile.mkdtemp()
    src = os.path.join(tmp, "f32.gguf")
    w = GGUFWriter(src, arch)
    hd = cfg.head_dim if getattr(cfg, "head_dim", None) else cfg.hidden_size // cfg.num_attention_heads
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_key_length(hd)
    w.add_value_length(hd)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_rope_freq_base(cfg.rope_parameters["rope_theta"])
    if n_experts:
        w.add_expert_count(n_experts)
        w.add_expert_used_count(top_k)
        w.add_expert_feed_forward_length(expert_inter)
    if arch == "qwen3next":
        # Qwen2MoeModel's and Qwen3NextModel.set_gguf_parameters' keys.
        w.add_expert_shared_feed_forward_length(cfg.shared_expert_intermediate_size)
        w.add_ssm_conv_kernel(cfg.linear_conv_kernel_dim)
        w.add_ssm_state_size(cfg.linear_key_head_dim)
        w.add_ssm_group_count(cfg.linear_num_key_heads)
        w.add_ssm_time_step_rank(cfg.linear_num_value_heads)
        w.add_ssm_inner_size(cfg.linear_value_head_dim * cfg.linear_num_value_heads)
        w.add_array("qwen3next.attention.recurrent_layers", [t == "linear_attention" for t in cfg.layer_types])
        w.add_full_attention_interval(kw.get("full_attention_interval", 4))
        w.add_rope_dimension_count(int(hd * cfg.rope_parameters.get("partial_rotary_factor", 0.25)))
    if arch == "gpt-oss":
        # conversion/gpt_oss.py and TextModel.set_gguf_parameters' YaRN keys.
        r = cfg.rope_parameters
        w.add_sliding_window(cfg.sliding_window)
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(r["factor"])
        w.add_rope_scaling_orig_ctx_len(r["original_max_position_embeddings"])
        w.add_rope_scaling_yarn_beta_fast(r["beta_fast"])
        w.add_rope_scaling_yarn_beta_slow(r["beta_slow"])
    w.add_bos_token_id(cfg.bos_token_id)
    w.add_eos_token_id(cfg.eos_token_id)
    back = {}  # GGUF name -> (HF name, Q/K heads to put back)
    w.add_tensor("token_embd.weight", sd["model.embed_tokens.weight"].numpy())
    back["token_embd.weight"] = ("model.embed_tokens.weight", None)
    if arch != "qwen3next":
        w.add_tensor("output_norm.weight", sd["model.norm.weight"].numpy())
        back["output_norm.weight"] = ("model.norm.weight", None)
    w.add_tensor("output.weight", sd["lm_head.weight"].numpy())
    back["output.weight"] = ("lm_head.weight", None)
    if arch == "gpt-oss":
        gpt_oss_f32(w, cfg, sd, back)
    if arch == "qwen3next":
        qwen3next_f32(w, cfg, sd, back)
    for L in range(cfg.num_hidden_layers if arch not in ("gpt-oss", "qwen3next") else 0):
        p = f"model.layers.{L}."
        for tail, gtail in LAYER_NAMES.items():
            if p + tail not in sd:
                continue
            t = sd[p + tail].numpy()
            heads = None
            if arch == "llama" and tail == "self_attn.q_proj.weight":
                heads = cfg.num_attention_heads
            if arch == "llama" and tail == "self_attn.k_proj.weight":
                heads = cfg.num_key_value_heads
            if heads:
                t = hf_to_gguf_rows(t, heads)
            w.add_tensor(f"blk.{L}.{gtail}", np.ascontiguousarray(t))
            back[f"blk.{L}.{gtail}"] = (p + tail, heads)
        if n_experts:
            # transformers 5 keeps experts fused: gate_up_proj [E, 2I, H], down_proj [E, H, I].
            gu, down = sd[p + "mlp.experts.gate_up_proj"].numpy(), sd[p + "mlp.experts.down_proj"].numpy()
            inter = down.shape[-1]
            for gname, t in [("ffn_gate_exps", gu[:, :inter]), ("ffn_up_exps", gu[:, inter:]), ("ffn_down_exps", down)]:
                w.add_tensor(f"blk.{L}.{gname}.weight", np.ascontiguousarray(t))
                back[f"blk.{L}.{gname}.weight"] = ((p, gname), None)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    out = os.path.join(out_dir, "model.gguf")
    imat = None
    if imatrix:
        imat = os.path.join(tmp, "imatrix.dat")
        write_imatrix(imat, GGUFReader(src), seed)
    tool = quantize(src, out, ftype, imat)
    shutil.rmtree(tmp, ignore_errors=True)
    new_sd = {}
    types = {}
    for t in GGUFReader(out).tensors:
        hf, heads = back[t.name]
        shape = tuple(int(x) for x in reversed(t.shape))
        values = quants.dequantize(t.data, t.tensor_type).reshape(shape).astype(np.float32)
        if heads:
            values = gguf_to_hf_rows(values, heads)
        if isinstance(hf, tuple) and hf[0] == "=":
            assert t.tensor_type == T.F32, f"{t.name} was quantized"
            new_sd[hf[1]] = sd[hf[1]].clone()
        elif isinstance(hf, tuple):
            new_sd.setdefault(("experts", hf[0]), {})[hf[1]] = values
        else:
            new_sd[hf] = torch.from_numpy(np.ascontiguousarray(values).reshape(sd[hf].shape))
        types[t.name] = t.tensor_type
    for key in [k for k in new_sd if isinstance(k, tuple)]:
        v = new_sd.pop(key)
        if arch == "gpt-oss":
            new_sd.update(gpt_oss_experts(key[1], v))
            continue
        if "attn_qkv" in v:
            new_sd[key[1] + "linear_attn.in_proj_qkvz.weight"] = torch.from_numpy(
                qwen3next_qkvz(cfg, v.pop("attn_qkv"), v.pop("attn_gate")))
        new_sd[key[1] + "mlp.experts.gate_up_proj"] = torch.from_numpy(
            np.concatenate([v["ffn_gate_exps"], v["ffn_up_exps"]], axis=1))
        new_sd[key[1] + "mlp.experts.down_proj"] = torch.from_numpy(np.ascontiguousarray(v["ffn_down_exps"]))
    missing = [k for k in sd if k not in new_sd]
    assert not missing, missing
    model.load_state_dict(new_sd, strict=True)
    gaps = check_router_margins(model, top_k) if n_experts else []
    ref, logits = reference(model, cfg.vocab_size, seed)
    if gaps and min(gaps) < 1e-5:
        sys.exit(f"{name}: a routing decision is within {min(gaps):.1e} of a tie; change the seed")
    logits.tofile(os.path.join(out_dir, "logits.bin"))
    ref["name"] = f"gguf_{name}"
    ref["transformers"] = transformers.__version__
    ref["torch"] = torch.__version__
    ref["quantizer"] = f"{tool}, {ftype}" + (" with an importance matrix" if imatrix else "")
    ref["gguf_types"] = {k: T(v).name for k, v in types.items()}
    with open(os.path.join(out_dir, "reference.json"), "w") as f:
        json.dump(ref, f)
    size = sum(os.path.getsize(os.path.join(out_dir, x)) for x in os.listdir(out_dir))
    m = np.array(ref["top2_margin"]) / np.maximum(np.array(ref["max_abs_logit"]), 1e-9)
    print(f"gguf_{name}: {size/1024:.0f} KiB, near-ties {int((m < 1e-3).sum())}/{len(m)}, "
          f"types {sorted(set(ref['gguf_types'].values()))}, greedy {ref['greedy'][:8]}")


def main():
    common = dict(vocab_size=256, hidden_size=256, num_hidden_layers=2, max_position_embeddings=256,
                  bos_token_id=1, eos_token_id=2, pad_token_id=0, num_attention_heads=4, num_key_value_heads=2)
    # Q4_K_M-like: Q4_K attention and gate/up, Q6_K for v, down and the head, Q8_0 embedding.
    build("llama_q4_k_m", "llama", "llama", 31, dict(embd=T.Q8_0, q=T.Q4_K, k=T.Q4_K, v=T.Q6_K, o=T.Q4_K,
          gate=T.Q4_K, up=T.Q4_K, down=T.Q6_K, output=T.Q6_K), intermediate_size=256, tie_word_embeddings=False, **common)
    # Low-bit recipes: K-quants and i-quants mixed in one model, untied head.
    build("llama_low_bit", "llama", "llama", 32, dict(embd=T.Q5_K, output=T.Q6_K, q=T.IQ2_XXS, k=T.IQ3_S,
          v=T.Q3_K, o=T.IQ2_XS, gate=T.Q2_K, up=T.IQ1_S, down=T.IQ4_XS), intermediate_size=256,
          tie_word_embeddings=False, **common)
    # Real quantizer output: llama.cpp's Q4_K_M recipe on a tiny Llama (every row a multiple of 256).
    build_quantized("llama_llamacpp_q4_k_m", "llama", "llama", 39, "Q4_K_M", intermediate_size=256,
                    tie_word_embeddings=False, **common)
    # And its Qwen3-MoE: the experts' 64-wide down rows take the recipe's fallback types.
    qwen3_moe = dict(n_experts=4, top_k=2, expert_inter=64, tie_word_embeddings=False, head_dim=64,
                     norm_topk_prob=True, **common, num_experts=4, num_experts_per_tok=2,
                     moe_intermediate_size=64, intermediate_size=64, decoder_sparse_step=1, mlp_only_layers=[])
    build_quantized("qwen3_moe_llamacpp_q4_k_m", "qwen3_moe", "qwen3moe", 40, "Q4_K_M", **qwen3_moe)
    # The low-bit recipes MoE downloads use: Q2_K, and IQ2_XXS with its importance matrix
    # (IQ2_XXS experts and attention, Q2_K/Q4_K where the recipe keeps more bits).
    build_quantized("qwen3_moe_llamacpp_q2_k", "qwen3_moe", "qwen3moe", 41, "Q2_K", **qwen3_moe)
    build_quantized("qwen3_moe_llamacpp_iq2_xxs", "qwen3_moe", "qwen3moe", 42, "IQ2_XXS", imatrix=True,
                    **qwen3_moe)
    # gpt-oss as its GGUFs ship: llama.cpp's MXFP4_MOE recipe (MXFP4 experts, Q8_0 elsewhere;
    # norms, sinks, router and biases F32); sliding window below the sequence, YaRN.
    build_quantized("gpt_oss_llamacpp_mxfp4", "gpt_oss", "gpt-oss", 43, "MXFP4_MOE", n_experts=4, top_k=2,
                    expert_inter=64, vocab_size=256, hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, head_dim=32, intermediate_size=64, num_local_experts=4,
                    num_experts_per_tok=2, sliding_window=8, max_position_embeddings=256, bos_token_id=1,
                    eos_token_id=2, pad_token_id=0, tie_word_embeddings=False,
                    rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0, "factor": 4.0, "beta_fast": 32.0,
                                     "beta_slow": 1.0, "truncate": False, "original_max_position_embeddings": 64})
    # Qwen3-Next in llama.cpp's Q4_K_M recipe: a linear and a full attention layer (the
    # converter's `1 + w` norms, `-exp(A_log)`, flat q|k|v and z), a gated shared expert.
    build_quantized("qwen3_next_llamacpp_q4_k_m", "qwen3_next", "qwen3next", 44, "Q4_K_M", n_experts=4, top_k=2,
                    expert_inter=32, post_init=mild_decay, vocab_size=256, hidden_size=256, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, head_dim=64, partial_rotary_factor=0.25,
                    linear_key_head_dim=32, linear_value_head_dim=32, linear_num_key_heads=2,
                    linear_num_value_heads=4, moe_intermediate_size=32, shared_expert_intermediate_size=32,
                    intermediate_size=32, num_experts=4, num_experts_per_tok=2, full_attention_interval=2,
                    max_position_embeddings=256, bos_token_id=1, eos_token_id=2, pad_token_id=0,
                    tie_word_embeddings=False)
    # Mixtral is `llama` with experts in GGUF (Q/K rows permuted like Llama's).
    build("mixtral_q4_k_m", "mixtral", "llama", 35, dict(embd=T.Q8_0, output=T.Q6_K, q=T.Q4_K, k=T.Q4_K,
          v=T.Q6_K, o=T.Q4_K, exp_gate=T.Q4_0, exp_up=T.Q8_0, exp_down=T.Q4_1), n_experts=4, top_k=2,
          expert_inter=64, intermediate_size=64, num_local_experts=4, num_experts_per_tok=2,
          tie_word_embeddings=False, **common)
    # DeepSeek-V3 (deepseek2): MLA with kv_b split in k_b/v_b, groups, shared expert, one dense layer.
    ds = dict(vocab_size=256, hidden_size=256, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
              q_lora_rank=64, kv_lora_rank=64, qk_nope_head_dim=32, qk_rope_head_dim=32, v_head_dim=32,
              n_routed_experts=4, num_experts_per_tok=2, n_group=2, topk_group=1, n_shared_experts=1,
              moe_intermediate_size=64, intermediate_size=64, first_k_dense_replace=1, routed_scaling_factor=2.5,
              norm_topk_prob=True, tie_word_embeddings=False, max_position_embeddings=256, bos_token_id=1,
              eos_token_id=2, pad_token_id=0)
    build_deepseek("deepseek_v3_q4_k_m", 36, dict(embd=T.Q8_0, output=T.Q6_K, q_a_proj=T.Q4_K, q_b_proj=T.Q8_0,
                   kv_a_proj_with_mqa=T.Q6_K, k_b=T.Q8_0, v_b=T.Q4_0, o_proj=T.Q5_0, gate_proj=T.Q4_K,
                   up_proj=T.Q4_K, down_proj=T.Q4_1, exp_gate=T.Q4_K, exp_up=T.IQ4_XS, exp_down=T.Q5_1), **ds)
    # GLM-4.5 (glm4moe): partial rotary, q/k/v biases, groups, shared expert, one dense layer.
    glm = dict(vocab_size=256, hidden_size=256, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
               head_dim=64, partial_rotary_factor=0.5, attention_bias=True, use_qk_norm=True, n_routed_experts=4,
               num_experts_per_tok=2, n_group=2, topk_group=1, n_shared_experts=1, moe_intermediate_size=64,
               intermediate_size=64, first_k_dense_replace=1, routed_scaling_factor=1.5, norm_topk_prob=True,
               tie_word_embeddings=False, max_position_embeddings=256, bos_token_id=1, eos_token_id=2, pad_token_id=0,
               num_nextn_predict_layers=0)
    build_deepseek("glm4_moe_q4_k_m", 37, dict(embd=T.Q8_0, output=T.Q6_K, q_proj=T.Q4_K, k_proj=T.Q4_K,
                   v_proj=T.Q6_K, o_proj=T.Q4_K, gate_proj=T.Q4_K, up_proj=T.Q4_K, down_proj=T.Q8_0, exp_gate=T.Q4_K,
                   exp_up=T.Q5_K, exp_down=T.Q4_0), model_type="glm4_moe", arch="glm4moe", **glm)
    # MiniMax-M2: partial rotary, q/k norms over the whole projection, biased sigmoid top-k.
    mm = dict(vocab_size=256, hidden_size=256, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
              head_dim=64, rotary_dim=32, num_local_experts=4, num_experts_per_tok=2, intermediate_size=64,
              tie_word_embeddings=False, max_position_embeddings=256, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    build_deepseek("minimax_m2_q4_k_m", 38, dict(embd=T.Q8_0, output=T.Q6_K, q_proj=T.Q4_K, k_proj=T.Q5_K,
                   v_proj=T.Q6_K, o_proj=T.Q4_K, exp_gate=T.Q4_K, exp_up=T.Q4_K, exp_down=T.Q8_0),
                   model_type="minimax_m2", arch="minimax-m2", **mm)
    # The same three families through llama.cpp's own quantizer (Q4_K_M; the tiny widths'
    # rows below 256 take the recipe's fallback types).
    build_deepseek("deepseek_v3_llamacpp_q4_k_m", 45, {}, ftype="Q4_K_M", **ds)
    build_deepseek("glm4_moe_llamacpp_q4_k_m", 46, {}, ftype="Q4_K_M", model_type="glm4_moe", arch="glm4moe", **glm)
    build_deepseek("minimax_m2_llamacpp_q4_k_m", 47, {}, ftype="Q4_K_M", model_type="minimax_m2",
                   arch="minimax-m2", **mm)
    moe = dict(common, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64, intermediate_size=64)
    build("qwen3_moe_mixed", "qwen3_moe", "qwen3moe", 33, dict(embd=T.Q4_0, output=T.Q8_0, q=T.IQ2_S, k=T.IQ1_M,
          v=T.Q5_0, o=T.Q5_1, exp_gate=T.Q4_1, exp_up=T.IQ4_NL, exp_down=T.MXFP4), n_experts=4, top_k=2,
          expert_inter=64, tie_word_embeddings=False, head_dim=64, norm_topk_prob=True, **{k: v for k, v in moe.items()
                                                                                        if k not in ("num_experts", "num_experts_per_tok")},
          num_experts=4, num_experts_per_tok=2)


def demo_gguf(path):
    """The demo model's GGUF as transformers reads it (`gguf_file=`: weights dequantized by
    gguf-py, the tokenizer and chat template from the metadata), f32 compute."""
    from transformers import AutoTokenizer
    d, f = os.path.dirname(os.path.abspath(path)), os.path.basename(path)
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, torch_dtype=torch.float32,
                                                 attn_implementation="eager").eval()
    tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
    prompt = "The capital of France is"
    prompt_ids = tok(prompt, add_special_tokens=False).input_ids
    chat = tok.apply_chat_template([{"role": "user", "content": "Hi there"}], tokenize=False,
                                   add_generation_prompt=True)
    with torch.no_grad():
        gen = model.generate(torch.tensor([prompt_ids]), max_new_tokens=24, do_sample=False,
                             eos_token_id=None, pad_token_id=2)
        seq = gen[0].tolist()
        logits = model(gen).logits[0].float()
        top2 = torch.topk(logits, 2, dim=-1).values
    ref = {
        "gguf": f,
        "prompt": prompt,
        "prompt_ids": prompt_ids,
        "greedy_ids": seq[len(prompt_ids):],
        "greedy_text": tok.decode(seq[len(prompt_ids):]),
        "tf_pred": logits.argmax(-1).tolist(),
        "top2_margin": (top2[:, 0] - top2[:, 1]).tolist(),
        "chat_user": "Hi there",
        "chat_rendered": chat,
        "chat_ids": tok(chat, add_special_tokens=False).input_ids,
        "transformers": transformers.__version__,
        "torch": torch.__version__,
    }
    out = os.path.join(ROOT, "demo_gguf")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "reference.json"), "w") as fh:
        json.dump(ref, fh)
    print("demo gguf greedy:", repr(ref["greedy_text"]), "min margin", min(ref["top2_margin"]))


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "demo":
        demo_gguf(sys.argv[2])
    else:
        ONLY.update(sys.argv[1:])
        main()
