"""A synthetic OLMoE (`cargo xtask synth DIR olmoe int8`) or DeepSeek-V3 (`cargo xtask synth
DIR deepseek-v3 LAYERS EXPERTS`) as a GGUF for llama.cpp, without torch: bf16 tensors stay
bf16, norms, the router and its bias f32, and the int8 experts (per-row scales) are
dequantized and stored as Q8_0 (llama.cpp's nearest format: the weights agree to Q8_0's
rounding, not bit for bit). A `coli convert --experts int4` container (int4, a scale per 64
columns) becomes Q4_0, llama.cpp's nearest. The tokenizer comes from another GGUF (the demo
model's, or one written by this script), padded with unused tokens to the synthetic
vocabulary. DeepSeek-V3 is written as llama.cpp's converter writes `deepseek2`: `kv_b_proj`
split into `attn_k_b` (each head's key rows transposed) and `attn_v_b`, MLA's head counts
and lengths, YaRN, expert groups; the MTP layer is left out (llama.cpp does not load it).
Other recipes from these files: `llama-quantize --allow-requantize OUT.gguf Q4KM.gguf Q4_K_M`.

    python bench/olmoe_gguf.py SYNTH_DIR TOKENIZER_GGUF OUT.gguf
"""
import json
import struct
import sys

import gguf
import numpy as np
from gguf import GGMLQuantizationType as Q, GGUFReader, GGUFWriter

src, demo, dst = sys.argv[1], sys.argv[2], sys.argv[3]
cfg = json.load(open(f"{src}/config.json"))
index = json.load(open(f"{src}/model.safetensors.index.json"))["weight_map"]
headers = {}


def header(file):
    if file not in headers:
        with open(f"{src}/{file}", "rb") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            headers[file] = (8 + n, json.loads(f.read(n)))
    return headers[file]


def tensor(name):
    file = index[name]
    start, h = header(file)
    e = h[name]
    b, end = e["data_offsets"]
    with open(f"{src}/{file}", "rb") as f:
        f.seek(start + b)
        raw = f.read(end - b)
    shape = e["shape"]
    if e["dtype"] == "BF16":
        return (np.frombuffer(raw, np.uint16).astype(np.uint32) << 16).view(np.float32).reshape(shape)
    if e["dtype"] == "F32":
        return np.frombuffer(raw, np.float32).reshape(shape)
    if e["dtype"] == "I8":
        return np.frombuffer(raw, np.int8).reshape(shape)
    if e["dtype"] == "U8":  # coli int4: q + 8 in nibbles, even column in the low nibble
        b = np.frombuffer(raw, np.uint8).reshape(shape)
        q = np.empty((shape[0], shape[1] * 2), np.int8)
        q[:, 0::2] = (b & 15).astype(np.int8) - 8
        q[:, 1::2] = (b >> 4).astype(np.int8) - 8
        return q
    raise SystemExit(f"{name}: dtype {e['dtype']}")


def weight(name):
    w = tensor(name)
    if w.dtype == np.int8:
        s = tensor(name + "_scale")
        s = s.reshape(w.shape[0], -1)
        group = w.shape[1] // s.shape[1]
        return w.astype(np.float32) * np.repeat(s, group, axis=1)
    return w


_probe = next(n for n in index if n.endswith("experts.0.gate_proj.weight"))
INT4 = header(index[_probe])[1][_probe]["dtype"] == "U8"
EXPERT_Q = Q.Q4_0 if INT4 else Q.Q8_0


DEEPSEEK = cfg["model_type"] == "deepseek_v3"
h, n_layers, vocab = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["vocab_size"]
n_exp = cfg["n_routed_experts" if DEEPSEEK else "num_experts"]
w = GGUFWriter(dst, "deepseek2" if DEEPSEEK else "olmoe")
r = GGUFReader(demo)
for name, f in r.fields.items():
    if not name.startswith("tokenizer."):
        continue
    vt = f.types[0]
    v = f.contents()
    if name == "tokenizer.ggml.tokens":
        v = v + [f"<unused{i}>" for i in range(len(v), vocab)]  # unique past any earlier padding
    if name == "tokenizer.ggml.token_type":
        v = v + [5] * (vocab - len(v))  # UNUSED
    if name == "tokenizer.ggml.scores":
        v = v + [0.0] * (vocab - len(v))
    if vt == gguf.GGUFValueType.ARRAY:
        w.add_array(name, v)
    elif vt == gguf.GGUFValueType.STRING:
        w.add_string(name, v)
    else:
        w.add_key_value(name, v, vt)


def put(name, data, qtype):
    if qtype == Q.F32:
        w.add_tensor(name, np.ascontiguousarray(data, np.float32))
    else:
        q = gguf.quants.quantize(np.ascontiguousarray(data, np.float32), qtype)
        w.add_tensor(name, q, raw_shape=q.shape, raw_dtype=qtype)


def shared_keys_and_head():
    """The keys and tensors both architectures write alike: sizes, embedding, head."""
    w.add_block_count(n_layers)
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(h)
    w.add_feed_forward_length(cfg["intermediate_size"])
    put("token_embd.weight", weight("model.embed_tokens.weight"), Q.BF16)
    put("output.weight", weight("lm_head.weight"), Q.BF16)
    put("output_norm.weight", weight("model.norm.weight"), Q.F32)


def write_olmoe():
    shared_keys_and_head()
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_rope_freq_base(cfg["rope_theta"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_expert_count(n_exp)
    w.add_expert_used_count(cfg["num_experts_per_tok"])
    w.add_file_type(2 if INT4 else 7)  # MOSTLY_Q4_0 / MOSTLY_Q8_0
    for l in range(n_layers):
        p = f"model.layers.{l}"
        for hf, gg in [("q_proj", "attn_q"), ("k_proj", "attn_k"), ("v_proj", "attn_v"), ("o_proj", "attn_output")]:
            put(f"blk.{l}.{gg}.weight", weight(f"{p}.self_attn.{hf}.weight"), Q.BF16)
        put(f"blk.{l}.attn_q_norm.weight", weight(f"{p}.self_attn.q_norm.weight"), Q.F32)
        put(f"blk.{l}.attn_k_norm.weight", weight(f"{p}.self_attn.k_norm.weight"), Q.F32)
        put(f"blk.{l}.attn_norm.weight", weight(f"{p}.input_layernorm.weight"), Q.F32)
        put(f"blk.{l}.ffn_norm.weight", weight(f"{p}.post_attention_layernorm.weight"), Q.F32)
        put(f"blk.{l}.ffn_gate_inp.weight", weight(f"{p}.mlp.gate.weight"), Q.F32)
        for hf, gg in [("gate_proj", "ffn_gate_exps"), ("up_proj", "ffn_up_exps"), ("down_proj", "ffn_down_exps")]:
            stacked = np.stack([weight(f"{p}.mlp.experts.{e}.{hf}.weight") for e in range(n_exp)])
            put(f"blk.{l}.{gg}.weight", stacked, EXPERT_Q)
        print(f"layer {l + 1}/{n_layers}", file=sys.stderr)


def write_deepseek():
    nh, r, rope = cfg["num_attention_heads"], cfg["kv_lora_rank"], cfg["qk_rope_head_dim"]
    nope, v = cfg["qk_nope_head_dim"], cfg["v_head_dim"]
    shared_keys_and_head()
    w.add_head_count(nh)
    w.add_head_count_kv(1)
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_rope_freq_base(cfg["rope_theta"])
    w.add_leading_dense_block_count(cfg["first_k_dense_replace"])
    w.add_vocab_size(vocab)
    w.add_q_lora_rank(cfg["q_lora_rank"])
    w.add_kv_lora_rank(r)
    w.add_key_length(r + rope)
    w.add_value_length(r)
    w.add_key_length_mla(nope + rope)
    w.add_value_length_mla(v)
    w.add_rope_dimension_count(rope)
    w.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
    w.add_expert_count(n_exp)
    w.add_expert_used_count(cfg["num_experts_per_tok"])
    w.add_expert_shared_count(cfg["n_shared_experts"])
    w.add_expert_weights_scale(cfg["routed_scaling_factor"])
    w.add_expert_weights_norm(cfg["norm_topk_prob"])
    w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
    w.add_expert_group_count(cfg["n_group"])
    w.add_expert_group_used_count(cfg["topk_group"])
    y = cfg["rope_scaling"]
    w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    w.add_rope_scaling_factor(y["factor"])
    w.add_rope_scaling_orig_ctx_len(y["original_max_position_embeddings"])
    w.add_rope_scaling_yarn_log_mul(0.1 * y["mscale_all_dim"])
    w.add_file_type(7)  # MOSTLY_Q8_0
    names = [("input_layernorm", "attn_norm", Q.F32), ("post_attention_layernorm", "ffn_norm", Q.F32),
             ("self_attn.q_a_proj", "attn_q_a", Q.BF16), ("self_attn.q_a_layernorm", "attn_q_a_norm", Q.F32),
             ("self_attn.q_b_proj", "attn_q_b", Q.BF16), ("self_attn.kv_a_proj_with_mqa", "attn_kv_a_mqa", Q.BF16),
             ("self_attn.kv_a_layernorm", "attn_kv_a_norm", Q.F32), ("self_attn.o_proj", "attn_output", Q.BF16),
             ("mlp.gate_proj", "ffn_gate", Q.BF16), ("mlp.up_proj", "ffn_up", Q.BF16),
             ("mlp.down_proj", "ffn_down", Q.BF16), ("mlp.gate", "ffn_gate_inp", Q.F32),
             ("mlp.shared_experts.gate_proj", "ffn_gate_shexp", Q.BF16),
             ("mlp.shared_experts.up_proj", "ffn_up_shexp", Q.BF16),
             ("mlp.shared_experts.down_proj", "ffn_down_shexp", Q.BF16)]
    for l in range(n_layers):
        p = f"model.layers.{l}"
        for hf, gg, qt in names:
            if f"{p}.{hf}.weight" in index:
                put(f"blk.{l}.{gg}.weight", weight(f"{p}.{hf}.weight"), qt)
        if f"{p}.mlp.gate.e_score_correction_bias" in index:
            put(f"blk.{l}.exp_probs_b.bias", weight(f"{p}.mlp.gate.e_score_correction_bias"), Q.F32)
        per_head = weight(f"{p}.self_attn.kv_b_proj.weight").reshape(nh, nope + v, r)
        put(f"blk.{l}.attn_k_b.weight", per_head[:, :nope].transpose(0, 2, 1), Q.BF16)  # [nh, r, nope]
        put(f"blk.{l}.attn_v_b.weight", per_head[:, nope:], Q.BF16)  # [nh, v, r]
        if f"{p}.mlp.experts.0.gate_proj.weight" in index:
            for hf, gg in [("gate_proj", "ffn_gate_exps"), ("up_proj", "ffn_up_exps"), ("down_proj", "ffn_down_exps")]:
                stacked = np.stack([weight(f"{p}.mlp.experts.{e}.{hf}.weight") for e in range(n_exp)])
                put(f"blk.{l}.{gg}.weight", stacked, EXPERT_Q)
        print(f"layer {l + 1}/{n_layers}", file=sys.stderr)


write_deepseek() if DEEPSEEK else write_olmoe()
w.write_header_to_file()
w.write_kv_data_to_file()
w.write_tensors_to_file()
w.close()
print("ok")
