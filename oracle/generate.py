#!/usr/bin/env python3
"""Builds coli's oracle fixtures from Hugging Face `transformers`.

For each family and configuration: a tiny random checkpoint of the real
architecture (weights rounded to bf16, scaled so logits are decisive), saved
with `save_pretrained`, plus reference ids and f32 logits computed by
`transformers` in float32 with eager attention. deepseek_v3_mtp, glm4_moe_mtp and glm5_mtp also carry a
complete MTP layer (`model.layers.{num_hidden_layers}.*`, as DeepSeek-V3 and GLM-4.5 publish it)
and its reference logits, `mtp_logits.bin` (see `mtp_reference`); the other fixtures with MTP
tensors carry only `add_mtp_layer`'s incomplete decoy, which engines must ignore.

    pip install -r oracle/requirements.txt
    python oracle/generate.py tiny [NAME..] # tests/fixtures/<name>/
    python oracle/generate.py tiny5 [NAME..]  # families and layouts only transformers 5 has (GLM-5,
                                              # gpt-oss, MiniMax-M2, Qwen3-Next/3.5, DeepSeek-V4, MTP layers),
                                              # under oracle/requirements-tf5.txt
    python oracle/generate.py v4 [NAME..]     # only the DeepSeek-V4 fixtures (also part of tiny5)
    python oracle/generate.py container DIR SEED  # reference for a `coli convert` output
    python oracle/generate.py demo DIR      # tests/fixtures/demo/reference.json from coli's imported demo model

Outputs are committed; the tests need no Python.
"""
import json
import math
import os
import shutil
import sys

import numpy as np
import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures")
SEQ_LEN = 40
GREEDY_PROMPT = 8
GREEDY_NEW = 24
# `generate.py tiny NAME...` rebuilds only the named fixtures.
ONLY = sys.argv[2:] if len(sys.argv) > 1 and sys.argv[1] in ("tiny", "tiny5", "v4") else []


def decisive_init(model, seed, gain, bias_shift=0.0):
    """Random weights with 1/sqrt(fan_in) scale (times `gain` on the head), rounded to bf16."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                if name.endswith("bias"):
                    v = 0.1 * torch.randn(p.shape, generator=g)
                else:
                    v = 1.0 + 0.2 * torch.randn(p.shape, generator=g)
            elif "embed_tokens" in name:
                v = torch.randn(p.shape, generator=g)
            else:
                v = torch.randn(p.shape, generator=g) / math.sqrt(p.shape[-1])
                if "lm_head" in name:
                    v = v * gain
            p.copy_(v.to(torch.bfloat16).to(torch.float32))
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                # A real checkpoint's bias steers selection; zeros would test nothing.
                v = bias_shift + 0.3 * torch.randn(b.shape, generator=g)
                b.copy_(v.to(torch.bfloat16).to(torch.float32))


def reference(model, vocab, seed, seq_len=SEQ_LEN):
    g = torch.Generator().manual_seed(seed + 1)
    ids = torch.randint(0, vocab, (1, seq_len), generator=g)
    with torch.no_grad():
        logits = model(ids).logits[0].float()
        top2 = torch.topk(logits, 2, dim=-1).values
        # An explicit all-ones mask: otherwise generate() masks prompt tokens equal to pad_token_id.
        prompt = ids[:, :GREEDY_PROMPT]
        gen = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=GREEDY_NEW,
                             do_sample=False, min_new_tokens=GREEDY_NEW, pad_token_id=0, eos_token_id=None)
    return {
        "ids": ids[0].tolist(),
        "tf_pred": logits.argmax(-1).tolist(),
        "top2_margin": (top2[:, 0] - top2[:, 1]).tolist(),
        "max_abs_logit": logits.abs().max(-1).values.tolist(),
        "greedy_prompt": ids[0, :GREEDY_PROMPT].tolist(),
        "greedy": gen[0, GREEDY_PROMPT:].tolist(),
        "vocab_size": vocab,
    }, logits.numpy().astype("<f4")


def is_fp8_weight(name):
    """The projections DeepSeek/GLM FP8 releases store as float8_e4m3fn (not embeddings, the
    LM head, the router or norms)."""
    return name.endswith("_proj.weight") or name.endswith("kv_a_proj_with_mqa.weight")


def quantize_fp8(model, block):
    """Block-quantizes every FP8 projection in place to its dequantized value (the reference runs
    on these); returns {name: (fp8 tensor, f32 scale_inv)} to store."""
    br, bc = block
    stored = {}
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() != 2 or not is_fp8_weight(name):
                continue
            rows, cols = p.shape
            gr, gc = -(-rows // br), -(-cols // bc)
            padded = torch.zeros(gr * br, gc * bc)
            padded[:rows, :cols] = p.float()
            amax = padded.view(gr, br, gc, bc).abs().amax(dim=(1, 3))
            scale = torch.where(amax > 0, amax / 448.0, torch.ones_like(amax)).float()
            full = scale.repeat_interleave(br, 0).repeat_interleave(bc, 1)[:rows, :cols]
            q = (p.float() / full).clamp(-448, 448).to(torch.float8_e4m3fn)
            p.copy_(q.float() * full)
            stored[name] = (q, scale)
    return stored


def store_fp8(out, stored, block):
    """Rewrites the saved shards with the FP8 tensors and their `_scale_inv`, and stamps
    config.json with the quantization_config of DeepSeek's FP8 releases."""
    from safetensors.torch import load_file, save_file
    index_path = os.path.join(out, "model.safetensors.index.json")
    index = None
    if os.path.exists(index_path):
        with open(index_path) as f:
            index = json.load(f)
        shards = sorted(set(index["weight_map"].values()))
    else:
        shards = ["model.safetensors"]
    for shard in shards:
        path = os.path.join(out, shard)
        tensors = load_file(path)
        with open(path, "rb") as f:
            meta = json.loads(f.read(int.from_bytes(f.read(8), "little"))).get("__metadata__")
        for name in list(tensors):
            if name in stored:
                q, scale = stored[name]
                tensors[name] = q.contiguous()
                tensors[name + "_scale_inv"] = scale.contiguous()
                if index is not None:
                    index["weight_map"][name + "_scale_inv"] = shard
        save_file(tensors, path, metadata=meta)
    if index is not None:
        with open(index_path, "w") as f:
            json.dump(index, f, indent=2)
    with open(os.path.join(out, "config.json")) as f:
        c = json.load(f)
    c["quantization_config"] = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                                "weight_block_size": list(block)}
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(c, f, indent=2)


def add_mtp_layer(out, cfg):
    """Appends a DeepSeek/GLM-style MTP layer (index num_hidden_layers) to the last shard, as the
    published checkpoints do; engines must ignore it."""
    from safetensors.torch import load_file, save_file
    n = cfg.num_hidden_layers
    index_path = os.path.join(out, "model.safetensors.index.json")
    if os.path.exists(index_path):
        with open(index_path) as f:
            index = json.load(f)
        shard = sorted(set(index["weight_map"].values()))[-1]
    else:
        index, shard = None, "model.safetensors"
    path = os.path.join(out, shard)
    tensors = load_file(path)
    with open(path, "rb") as f:
        meta = json.loads(f.read(int.from_bytes(f.read(8), "little")))["__metadata__"]
    g = torch.Generator().manual_seed(7)
    h = cfg.hidden_size
    extra = {
        f"model.layers.{n}.eh_proj.weight": torch.randn(h, 2 * h, generator=g),
        f"model.layers.{n}.enorm.weight": torch.ones(h),
        f"model.layers.{n}.hnorm.weight": torch.ones(h),
        f"model.layers.{n}.shared_head.norm.weight": torch.ones(h),
        f"model.layers.{n}.input_layernorm.weight": torch.ones(h),
        f"model.layers.{n}.mlp.experts.0.gate_proj.weight": torch.randn(cfg.moe_intermediate_size, h, generator=g),
    }
    for k, v in extra.items():
        tensors[k] = v.to(torch.bfloat16)
        if index is not None:
            index["weight_map"][k] = shard
    save_file(tensors, path, metadata=meta)
    if index is not None:
        with open(index_path, "w") as f:
            json.dump(index, f, indent=2)
    with open(os.path.join(out, "config.json")) as f:
        c = json.load(f)
    c["num_nextn_predict_layers"] = 1
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(c, f, indent=2)


FP4_E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]


def dequantize_mxfp4(blocks, scales):
    """OCP MXFP4 by the spec, in numpy: `blocks` [.., rows, G, 16] bytes hold 32 e2m1 values per
    group (even element in the low nibble), `scales` [.., rows, G] E8M0 exponents (2^(s - 127)).
    Returns [.., rows, G * 32] float64."""
    lut = np.array(FP4_E2M1, dtype=np.float64)
    lo, hi = lut[blocks & 15], lut[blocks >> 4]
    vals = np.stack([lo, hi], axis=-1).reshape(*blocks.shape[:-1], 32)
    vals = vals * np.exp2(scales.astype(np.float64) - 127.0)[..., None]
    return vals.reshape(*blocks.shape[:-2], -1)


def quantize_gpt_oss_experts(model, seed):
    """Gives every gpt-oss expert random MXFP4 weights (random nibbles, scales 2^-5..2^-3) and sets
    the model's fused `[E, in, out]` parameters to their values, dequantized by
    `dequantize_mxfp4`. Returns {tensor name: array} in the hub's layout (`_blocks`
    [E, out, in/32, 16] and `_scales` [E, out, in/32], both U8)."""
    rng = np.random.default_rng(seed + 99)
    stored = {}
    with torch.no_grad():
        for name, p in model.named_parameters():
            if not (name.endswith("experts.gate_up_proj") or name.endswith("experts.down_proj")):
                continue
            e, d_in, d_out = p.shape
            blocks = rng.integers(0, 256, size=(e, d_out, d_in // 32, 16), dtype=np.uint8)
            scales = rng.integers(122, 125, size=(e, d_out, d_in // 32), dtype=np.uint8)
            w = dequantize_mxfp4(blocks, scales)  # [E, out, in]
            p.copy_(torch.from_numpy(w.transpose(0, 2, 1).copy()).float())
            stored[name + "_blocks"] = blocks
            stored[name + "_scales"] = scales
    return stored


def store_mxfp4(out, stored):
    """Replaces the fused bf16 expert weights in the saved shard with the MXFP4 `_blocks` and
    `_scales`, and stamps config.json with the quantization_config of the gpt-oss releases."""
    from safetensors.torch import load_file, save_file
    path = os.path.join(out, "model.safetensors")
    assert os.path.exists(path), "gpt-oss fixtures are single-shard"
    tensors = load_file(path)
    with open(path, "rb") as f:
        meta = json.loads(f.read(int.from_bytes(f.read(8), "little"))).get("__metadata__")
    for name, arr in stored.items():
        fused = name.rsplit("_", 1)[0]
        tensors.pop(fused, None)
        tensors[name] = torch.from_numpy(arr).contiguous()
    save_file(tensors, path, metadata=meta)
    with open(os.path.join(out, "config.json")) as f:
        c = json.load(f)
    c["quantization_config"] = {"quant_method": "mxfp4",
                                "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                                           "model.embed_tokens", "lm_head"]}
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(c, f, indent=2)


def store_fused_experts(out):
    """Rewrites the per-expert tensors save_pretrained writes into the fused form the Qwen3.5
    hub checkpoints ship (what transformers' qwen2_moe conversion builds at load):
    `experts.gate_up_proj` = cat(stack(gate), stack(up), dim=1) `[E, 2I, H]`,
    `experts.down_proj` = stack(down) `[E, H, I]`, no `.weight` suffix."""
    import re
    from safetensors.torch import load_file, save_file
    path = os.path.join(out, "model.safetensors")
    assert os.path.exists(path), "fused-expert fixtures are single-shard"
    tensors = load_file(path)
    with open(path, "rb") as f:
        meta = json.loads(f.read(int.from_bytes(f.read(8), "little"))).get("__metadata__")
    per = {}
    for name in list(tensors):
        m = re.match(r"(.*\.mlp\.experts)\.(\d+)\.(gate|up|down)_proj\.weight$", name)
        if m:
            per.setdefault(m.group(1), {}).setdefault(m.group(3), {})[int(m.group(2))] = tensors.pop(name)
    for prefix, parts in per.items():
        stack = lambda k: torch.stack([parts[k][e] for e in sorted(parts[k])])
        tensors[prefix + ".gate_up_proj"] = torch.cat([stack("gate"), stack("up")], dim=1).contiguous()
        tensors[prefix + ".down_proj"] = stack("down").contiguous()
    save_file(tensors, path, metadata=meta)


def check_router_margins(model, top_k):
    """Hooks every gpt-oss router: records the smallest gap between the k-th and (k+1)-th logit,
    so a fixture whose routing sits on a tie (torch's order is then unspecified) is refused."""
    gaps = []

    def hook(_module, _inputs, output):
        logits = output[0].float()
        top = torch.topk(logits, min(top_k + 1, logits.shape[-1]), dim=-1).values
        if top.shape[-1] > top_k:
            gaps.append(float((top[:, top_k - 1] - top[:, top_k]).min()))
    for m in model.modules():
        if type(m).__name__.endswith("TopKRouter"):
            m.register_forward_hook(hook)
    return gaps


def group_router_hook(gaps):
    """A forward hook for a DeepSeek-V3/GLM-4.5 `TopkRouter` (sigmoid + selection bias, group
    limit): records the smallest gap at each decision (the topk_group-th vs the next group
    score, the top_k-th vs the next expert among the allowed groups), so that a fixture whose
    routing sits on a tie is refused."""
    def hook(m, inputs, _output):
        x = inputs[0].reshape(-1, m.hidden_dim).float()
        s = torch.sigmoid(x @ m.weight.float().t()) + m.e_score_correction_bias.float()
        e, grp = m.num_experts, m.num_group
        gs = s.view(-1, grp, e // grp).topk(2, dim=-1)[0].sum(-1)
        if m.topk_group < grp:
            top = gs.topk(m.topk_group + 1, dim=-1).values
            gaps.append(float((top[:, m.topk_group - 1] - top[:, m.topk_group]).min()))
        keep = torch.zeros_like(gs, dtype=torch.bool).scatter(1, gs.topk(m.topk_group, dim=-1).indices, True)
        masked = s.masked_fill(~keep.repeat_interleave(e // grp, dim=1), float("-inf"))
        top = masked.topk(min(m.top_k + 1, e), dim=-1).values
        if top.shape[-1] > m.top_k:
            gaps.append(float((top[:, m.top_k - 1] - top[:, m.top_k]).min()))
    return hook


def check_group_router_margins(model):
    gaps = []
    for m in model.modules():
        if type(m).__name__.endswith("TopkRouter"):
            m.register_forward_hook(group_router_hook(gaps))
    return gaps


MTP_CONVENTION = ("row i = (final-normed main hidden h_i, token ids[i+1]) at RoPE position i; "
                  "embedding first in eh_proj's input")


def causal_mask(rows, past=0):
    """The additive causal mask [1, 1, rows, past + rows] of `rows` new rows after `past` cached ones."""
    return torch.full((rows, past + rows), torch.finfo(torch.float32).min).triu(past + 1)[None, None]


def glm_dsa_mtp_config(cfg):
    """A one-layer copy of a glm_moe_dsa config whose layer 0 is what GLM-5's MTP layer is: MoE,
    its own ("full") indexer, indexed attention."""
    import copy
    c1 = copy.deepcopy(cfg)
    c1.num_hidden_layers = 1
    c1.mlp_layer_types, c1.indexer_types, c1.layer_types = ["sparse"], ["full"], ["indexed_attention"]
    c1._attn_implementation = "eager"
    return c1


def glm_dsa_mtp(model):
    """GLM-5's MTP layer built by hand, which transformers 5.24 does not have: `MtpModel` cannot wrap
    GlmMoeDsaDecoderLayer (it returns (hidden, topk_indices); a layer index n = num_hidden_layers
    is out of range of mlp_layer_types/indexer_types/layer_types). Same parameter names as
    MtpModel's (layers.0.{enorm,hnorm,eh_proj,mtp_block.*,post_norm}) and the same
    forward_layer/_project_to_logits, so the deepseek_v3/glm4_moe helpers apply unchanged.
    The block is a GlmMoeDsaDecoderLayer of a one-layer config (`glm_dsa_mtp_config`) returning
    the hidden state only; given no mask it builds the causal one over its cache (the indexer
    needs an explicit mask). Embedding, head and rotary are the main model's."""
    from torch import nn
    from transformers import DynamicCache
    from transformers.models.glm_moe_dsa.modeling_glm_moe_dsa import GlmMoeDsaDecoderLayer, GlmMoeDsaRMSNorm
    c1 = glm_dsa_mtp_config(model.config)

    class Block(GlmMoeDsaDecoderLayer):
        def forward(self, hidden_states, attention_mask=None, cache=None, **kw):
            if attention_mask is None:
                past = cache.get_seq_length() if cache is not None else 0
                attention_mask = causal_mask(hidden_states.shape[1], past)
            return super().forward(hidden_states, attention_mask=attention_mask, cache=cache, **kw)[0]

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            h, eps = c1.hidden_size, c1.rms_norm_eps
            self.enorm, self.hnorm = GlmMoeDsaRMSNorm(h, eps), GlmMoeDsaRMSNorm(h, eps)
            self.eh_proj = nn.Linear(2 * h, h, bias=False)
            self.mtp_block = Block(c1, 0)
            self.post_norm = GlmMoeDsaRMSNorm(h, eps)  # checkpoint: shared_head.norm

        @staticmethod
        def new_cache():
            return DynamicCache(config=c1)  # indexed layer: MLA latents + indexer keys

    class Mtp(nn.Module):
        def __init__(self):
            super().__init__()
            self.config = c1
            self.layers = nn.ModuleList([Layer()])
            self._main = [model]  # not a submodule: embedding, head and rotary stay the main model's

        def forward_layer(self, i, h, pos, cache, input_ids):
            m, layer = self._main[0], self.layers[i]
            x = layer.eh_proj(torch.cat([layer.enorm(m.get_input_embeddings()(input_ids)), layer.hnorm(h)], dim=-1))
            mask = causal_mask(x.shape[1]) if cache is None else None
            y = layer.mtp_block(x, attention_mask=mask, position_ids=pos, cache=cache, use_cache=cache is not None,
                                position_embeddings=m.model.rotary_emb(x, position_ids=pos))
            return layer.post_norm(y)

        def _project_to_logits(self, hid):
            return self._main[0].lm_head(hid)

    return Mtp().float().eval()


def check_indexer_margins(module, gaps):
    """Hooks every GLM-5 DSA indexer in `module`: recomputes its index scores (as
    GlmMoeDsaIndexer.forward does), checks that its top-k is the one returned, and records per
    call the smallest relative gap (k-th minus (k+1)-th score, over the row's largest |score|)
    among rows with more than k visible keys, so that a selection on a tie is refused."""
    from torch.nn import functional as F
    from transformers.models.glm_moe_dsa.modeling_glm_moe_dsa import (GlmMoeDsaIndexer,
                                                                      apply_rotary_pos_emb_interleave)

    def hook(m, args, kwargs, out):
        hs, q_resid, (cos, sin), mask = args[:4]
        cache = kwargs.get("cache")
        b, s, _ = hs.shape
        q = m.wq_b(q_resid).view(b, s, m.n_heads, m.head_dim)
        q_rot, q_pass = torch.split(q, [m.qk_rope_head_dim, m.head_dim - m.qk_rope_head_dim], dim=-1)
        k = m.k_norm(m.wk(hs)).unsqueeze(2)
        k_rot, k_pass = torch.split(k, [m.qk_rope_head_dim, m.head_dim - m.qk_rope_head_dim], dim=-1)
        q_rot, k_rot = apply_rotary_pos_emb_interleave(q_rot, k_rot, cos, sin, unsqueeze_dim=2)
        q = torch.cat([q_rot, q_pass], dim=-1)
        k = torch.cat([k_rot, k_pass], dim=-1).squeeze(2)
        if cache is not None:  # already updated with these rows
            keys = cache.layers[m.layer_idx].indexer_keys
            assert torch.equal(keys[:, -s:], k)
            k = keys
        scores = F.relu(torch.matmul(q.float(), k.transpose(-1, -2).float().unsqueeze(1)) * m.softmax_scale)
        w = m.weights_proj(hs).float() * (m.n_heads ** -0.5)
        idx = torch.matmul(w.unsqueeze(-2), scores).squeeze(-2) + mask
        kk = m.index_topk
        if idx.shape[-1] <= kk:
            return
        top = idx.topk(kk + 1, dim=-1)
        live = top.values[..., kk] > -1e30  # the (k+1)-th key is visible, so the boundary is real
        if not live.any():
            return
        got = out.long().sort(-1).values
        assert torch.equal(top.indices[..., :kk].sort(-1).values[live], got[live]), "indexer recomputation differs"
        v = top.values[live]
        gaps.append(float(((v[:, kk - 1] - v[:, kk]) / v[:, 0].abs().clamp_min(1e-12)).min()))

    for mod in module.modules():
        if isinstance(mod, GlmMoeDsaIndexer):
            mod.register_forward_hook(hook, with_kwargs=True)
    return gaps


def mtp_cached_chunks(mtp, model, ids, chunks=(0, 15, 16, 30)):
    """The teacher-forced MTP rows through a KV cache, a chunk at a time (rows chunks[j]..chunks[j+1]-1,
    then the rest), at the same positions as the full pass."""
    t = torch.tensor([ids])
    layer = mtp.layers[0]
    cache = layer.new_cache()
    with torch.no_grad():
        h = model.model(t).last_hidden_state[:, :-1]
        rows = h.shape[1]
        bounds = list(chunks) + [rows]
        out = []
        for a, b in zip(bounds[:-1], bounds[1:]):
            pos = torch.arange(a, b)[None]
            out.append(mtp._project_to_logits(mtp.forward_layer(0, h[:, a:b], pos, cache, input_ids=t[:, a + 1:b + 1])))
        return torch.cat(out, dim=1)[0].float()


def mtp_forward(mtp, model, ids, pos):
    """MTP logits [rows, vocab] of rows i = 0..L-2 -- (h_i, ids[i+1]) -- in one causal pass, no
    cache, through transformers' own MtpModel.forward_layer with explicit `pos` (a [1, L-1]
    tensor of RoPE positions)."""
    with torch.no_grad():
        h = model.model(ids).last_hidden_state[:, :-1]  # final-normed: what enters lm_head
        hid = mtp.forward_layer(0, h, pos, None, input_ids=ids[:, 1:])  # post_norm applied inside
        return mtp._project_to_logits(hid)[0].float()


def new_mtp(model):
    """The MTP module on `model`: transformers' MtpModel, or `glm_dsa_mtp` for GLM-5."""
    if model.config.model_type == "glm_moe_dsa":
        return glm_dsa_mtp(model)
    from transformers.modeling_layers import MtpModel
    mtp = MtpModel(model, 1).float().eval()
    mtp.config._attn_implementation = "eager"
    return mtp


def mtp_reference(model, ids, main_logits, seed, eh_gain, bias_shift, gaps, idx_gaps=None):
    """A real MTP layer (DeepSeek-V3 / GLM-4.5 / GLM-5 `model.layers.{n}`) on the f32 main model:
    transformers' MtpModel (embedding, head and rotary tied to the main model; its block is the
    MoE decoder layer), or for GLM-5 the same built by hand (`glm_dsa_mtp`), own parameters
    decisive_init-style with `eh_gain` on eh_proj.

    Reference logits: `forward_layer` on rows i = 0..L-2 with
    position_ids = arange(L-1) given explicitly (vLLM's convention: row i at the position of
    h_i; transformers' MTPCandidateGenerator would pass i + 1). Checked against (a) the same with
    positions 1..L-1 and (b) a forward written by hand from the module's parts (enorm, hnorm,
    eh_proj, the block with an explicit causal mask and the main rotary at 0..L-2, post_norm,
    lm_head); for GLM-5, whose reference is that forward already, (b) is instead the rows run
    through a KV cache (MLA latents and indexer keys) in chunks (`mtp_cached_chunks`).
    `idx_gaps` (GLM-5): the MTP block's indexer top-k margins are recorded there too."""
    mtp = new_mtp(model)
    dsa = model.config.model_type == "glm_moe_dsa"
    layer = mtp.layers[0]
    decisive_init(layer, seed + 500, 1.0, bias_shift)
    with torch.no_grad():
        layer.eh_proj.weight.copy_((layer.eh_proj.weight * eh_gain).to(torch.bfloat16).to(torch.float32))
    mtp_gaps = []
    layer.mtp_block.mlp.gate.register_forward_hook(group_router_hook(mtp_gaps))
    if idx_gaps is not None:
        check_indexer_margins(layer, idx_gaps)
    t = torch.tensor([ids])
    rows = t.shape[1] - 1
    with torch.no_grad():
        # MtpModel ties embed/head/rotary to the main model: it must have left them as they were.
        assert np.array_equal(model(t).logits[0].float().numpy(), main_logits), "MtpModel changed the main model"
        pos = torch.arange(rows)[None]
        ours = mtp_forward(mtp, model, t, pos)
        shifted = mtp_forward(mtp, model, t, pos + 1)
        if dsa:
            by_hand = mtp_cached_chunks(mtp, model, ids)
        else:
            h = model.model(t).last_hidden_state[:, :-1]
            e = model.get_input_embeddings()(t[:, 1:])
            x = layer.eh_proj(torch.cat([layer.enorm(e), layer.hnorm(h)], dim=-1))
            mask = torch.full((rows, rows), torch.finfo(torch.float32).min).triu(1)[None, None]
            y = layer.mtp_block(x, attention_mask=mask, position_ids=pos,
                                position_embeddings=model.model.rotary_emb(x, position_ids=pos))
            by_hand = model.lm_head(layer.post_norm(y))[0].float()
    scale = ours.abs().max().item()
    d_shift = (ours - shifted).abs().max().item()
    d_hand = (ours - by_hand).abs().max().item()
    print(f"  MTP positions 0..{rows - 1} vs 1..{rows}: max |d| {d_shift:.2e} ({d_shift / scale:.1e} rel); "
          f"{'cached in chunks' if dsa else 'by hand'}: max |d| {d_hand:.2e} ({d_hand / scale:.1e} rel); "
          f"max |logit| {scale:.3f}")
    assert d_shift <= 1e-5 * scale and d_hand <= 1e-5 * scale, (d_shift, d_hand, scale)
    print(f"  routing gaps: main min {min(gaps):.2e}, MTP block min {min(mtp_gaps):.2e}")
    n_main, n_mtp = len(gaps), len(mtp_gaps)
    chain = mtp_chain_reference(model, layer, ids, ours.argmax(-1).tolist())
    chain_gaps = gaps[n_main:] + mtp_gaps[n_mtp:]
    print(f"  routing gaps in the MTP chain runs: min {min(chain_gaps):.2e}")
    gaps.extend(mtp_gaps)
    top2 = torch.topk(ours, 2, dim=-1).values
    ref = {
        "mtp_pred": ours.argmax(-1).tolist(),
        "mtp_top2_margin": (top2[:, 0] - top2[:, 1]).tolist(),
        "mtp_max_abs_logit": ours.abs().max(-1).values.tolist(),
        "mtp_rows": rows,
        "mtp_convention": MTP_CONVENTION,
    }
    ref.update(chain)
    return mtp, ref, ours.numpy().astype("<f4")


MTP_CHAIN_PREFIXES = (8, 15, 30)
MTP_CHAIN_STEPS = 4
MTP_CHAIN_CONVENTION = (
    "vLLM eagle.py method 'mtp' with the one MTP layer reused: for prompt ids[0..p-1], MTP rows 0..p-1 pair "
    "the main model's final-normed h_i with ids[i+1] at RoPE position i (causal over these rows, as in "
    "mtp_convention) and d1 = argmax of row p-1; then for k = 2..4 one more row at position p+k-2 pairs the "
    "previous row's MTP block output y before shared_head.norm with token d_{k-1}, attends causally over all "
    "earlier MTP rows, and gives d_k = argmax; margins/max_abs are the top-2 margin and max |logit| of these "
    "4 logit rows (no zeroed embedding at position 0, fp32, eager).")


def mtp_chain_rows(model, layer, ids, p, steps=MTP_CHAIN_STEPS):
    """vLLM's recursive MTP drafting (eagle.py, method "mtp", one MTP layer reused), written out
    with full recomputation: the MTP block runs over all of its rows again at each step with an
    explicit causal mask. Rows 0..p-1: (final-normed main h_i over ids[0..p-1], ids[i+1]) at
    position i. Step k >= 2 appends a row at position p+k-2 whose hidden input is the previous
    row's block output y (before post_norm = shared_head.norm) and whose token is d_{k-1}.
    Returns the draft logits [steps, vocab]."""
    t = torch.tensor([ids])
    emb = model.get_input_embeddings()
    with torch.no_grad():
        h = model.model(t[:, :p]).last_hidden_state  # final-normed h_0..h_{p-1}
        hid = h                                      # the hidden input of each MTP row
        tok = t[:, 1:p + 1]                          # the token of each MTP row (row p-1: ids[p])
        out = []
        for _ in range(steps):
            rows = hid.shape[1]
            pos = torch.arange(rows)[None]
            x = layer.eh_proj(torch.cat([layer.enorm(emb(tok)), layer.hnorm(hid)], dim=-1))
            mask = torch.full((rows, rows), torch.finfo(torch.float32).min).triu(1)[None, None]
            y = layer.mtp_block(x, attention_mask=mask, position_ids=pos,
                                position_embeddings=model.model.rotary_emb(x, position_ids=pos))
            logits = model.lm_head(layer.post_norm(y[:, -1:]))[0, 0].float()
            out.append(logits)
            draft = logits.argmax().view(1, 1)
            hid = torch.cat([hid, y[:, -1:]], dim=1)  # pre-norm y of the last row
            tok = torch.cat([tok, draft], dim=1)
    return torch.stack(out)


def mtp_chain_rows_cached(model, layer, ids, p, steps=MTP_CHAIN_STEPS):
    """The same chain as vLLM runs it: the prefill rows once into a KV cache, then one new row
    (one new cache entry) per step. Only a cross-check of `mtp_chain_rows`."""
    from transformers import DynamicCache
    t = torch.tensor([ids])
    emb = model.get_input_embeddings()
    cache = layer.new_cache() if hasattr(layer, "new_cache") else DynamicCache()
    with torch.no_grad():
        hid = model.model(t[:, :p]).last_hidden_state
        tok = t[:, 1:p + 1]
        start, out = 0, []
        for _ in range(steps):
            rows = hid.shape[1]
            pos = torch.arange(start, start + rows)[None]
            x = layer.eh_proj(torch.cat([layer.enorm(emb(tok)), layer.hnorm(hid)], dim=-1))
            mask = torch.full((rows, rows), torch.finfo(torch.float32).min).triu(1)[None, None] if rows > 1 else None
            y = layer.mtp_block(x, attention_mask=mask, position_ids=pos, cache=cache, use_cache=True,
                                position_embeddings=model.model.rotary_emb(x, position_ids=pos))
            logits = model.lm_head(layer.post_norm(y[:, -1:]))[0, 0].float()
            out.append(logits)
            start += rows
            hid, tok = y[:, -1:], logits.argmax().view(1, 1)
    return torch.stack(out)


def mtp_chain_reference(model, layer, ids, mtp_pred):
    """`mtp_chain` for reference.json: for each prompt length p in MTP_CHAIN_PREFIXES, the 4 drafts
    of `mtp_chain_rows` and the top-2 margin and max |logit| of each draft row. d1 must be the
    teacher-forced mtp_pred[p-1]; the cached chain must give the same logits."""
    chain = []
    for p in MTP_CHAIN_PREFIXES:
        assert p + 1 < len(ids)
        logits = mtp_chain_rows(model, layer, ids, p)
        cached = mtp_chain_rows_cached(model, layer, ids, p)
        scale = logits.abs().max().item()
        d = (logits - cached).abs().max().item()
        drafts = logits.argmax(-1).tolist()
        assert d <= 1e-5 * scale and cached.argmax(-1).tolist() == drafts, (p, d, scale)
        assert drafts[0] == mtp_pred[p - 1], (p, drafts[0], mtp_pred[p - 1])
        top2 = torch.topk(logits, 2, dim=-1).values
        margins = (top2[:, 0] - top2[:, 1]).tolist()
        max_abs = logits.abs().max(-1).values.tolist()
        rel = [m / a for m, a in zip(margins, max_abs)]
        print(f"  MTP chain p={p}: drafts {drafts}, min rel margin {min(rel):.2e}, cached vs full max |d| {d:.1e}"
              + (f"; NEAR-TIE (rel margin < 1e-3) at step(s) {[k + 1 for k, r in enumerate(rel) if r < 1e-3]}"
                 if min(rel) < 1e-3 else ""))
        chain.append({"p": p, "drafts": drafts, "margins": margins, "max_abs": max_abs})
    return {"mtp_chain": chain, "mtp_chain_convention": MTP_CHAIN_CONVENTION}

def store_real_mtp(out, cfg, mtp):
    """Appends the MTP layer to the (single-shard) checkpoint as DeepSeek-V3 and GLM-4.5 publish it,
    `model.layers.{n}.*` with n = num_hidden_layers: enorm, hnorm, eh_proj [H, 2H],
    shared_head.norm (transformers' post_norm), shared_head.head and embed_tokens (copies of
    lm_head and the main embedding), and the decoder block under the main layers' names, experts
    per expert. The block's names come from save_pretrained itself: a model one layer deeper,
    its layer n loaded with the block, saved, and its layer n taken."""
    import copy
    import tempfile
    from safetensors.torch import load_file, save_file
    n = cfg.num_hidden_layers
    path = os.path.join(out, "model.safetensors")
    assert os.path.exists(path), "real-MTP fixtures are single-shard"
    tensors = load_file(path)
    with open(path, "rb") as f:
        meta = json.loads(f.read(int.from_bytes(f.read(8), "little"))).get("__metadata__")
    layer = mtp.layers[0]
    aux_cfg = copy.deepcopy(cfg)
    aux_cfg.num_hidden_layers = n + 1
    if cfg.model_type == "glm_moe_dsa":  # per-layer lists; layer n as GLM-5's MTP layer is
        aux_cfg.mlp_layer_types = list(cfg.mlp_layer_types) + ["sparse"]
        aux_cfg.indexer_types = list(cfg.indexer_types) + ["full"]
        aux_cfg.layer_types = list(cfg.layer_types) + ["indexed_attention"]
    aux = AutoModelForCausalLM.from_config(aux_cfg, attn_implementation="eager")
    aux.model.layers[n].load_state_dict(layer.mtp_block.state_dict(), strict=True)
    with tempfile.TemporaryDirectory() as tmp:
        aux.to(torch.bfloat16).save_pretrained(tmp, max_shard_size="1GB", safe_serialization=True)
        saved = load_file(os.path.join(tmp, "model.safetensors"))
    prefix, last = f"model.layers.{n}.", f"model.layers.{n - 1}."
    block = {k: v for k, v in saved.items() if k.startswith(prefix)}
    # The block's names are those of the main model's last (MoE) layer in the same file ...
    assert sorted(k[len(prefix):] for k in block) == sorted(k[len(last):] for k in tensors if k.startswith(last))
    # ... and save_pretrained split the fused experts as their forward reads them (gate rows first).
    experts = layer.mtp_block.mlp.experts
    inter = experts.down_proj.shape[-1]
    for j in range(experts.gate_up_proj.shape[0]):
        for part, w in (("gate", experts.gate_up_proj[j, :inter]), ("up", experts.gate_up_proj[j, inter:]),
                        ("down", experts.down_proj[j])):
            assert torch.equal(block[f"{prefix}mlp.experts.{j}.{part}_proj.weight"].float(), w.detach()), (j, part)
    own = {"enorm.weight": layer.enorm.weight, "hnorm.weight": layer.hnorm.weight,
           "eh_proj.weight": layer.eh_proj.weight, "shared_head.norm.weight": layer.post_norm.weight}
    extra = {prefix + k: v.detach().to(torch.bfloat16).contiguous() for k, v in own.items()}
    extra[prefix + "shared_head.head.weight"] = tensors["lm_head.weight"].clone()
    extra[prefix + "embed_tokens.weight"] = tensors["model.embed_tokens.weight"].clone()
    extra.update(block)
    assert not set(extra) & set(tensors) and all(v.dtype == torch.bfloat16 for v in extra.values())
    tensors.update(extra)
    save_file(tensors, path, metadata=meta)
    with open(os.path.join(out, "config.json")) as f:
        c = json.load(f)
    c["num_nextn_predict_layers"] = 1
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(c, f, indent=2)
    print(f"  MTP tensors ({len(extra)}): " + ", ".join(sorted(k[len(prefix):] for k in extra)))


def check_real_mtp_reload(out, ids, logits, mtp_logits):
    """transformers reads the saved directory back to the same main logits (it ignores the MTP
    tensors), and the MTP layer read back from the file by its checkpoint names (experts fused
    again) gives the same MTP logits."""
    import re
    from safetensors.torch import load_file
    t = torch.tensor([ids])
    again = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32, attn_implementation="eager").eval()
    with torch.no_grad():
        back = again(t).logits[0].float().numpy()
    assert np.array_equal(back, logits), "the saved checkpoint does not load back to the main logits"
    n = again.config.num_hidden_layers
    prefix = f"model.layers.{n}."
    sd = {k[len(prefix):]: v.float() for k, v in load_file(os.path.join(out, "model.safetensors")).items()
          if k.startswith(prefix)}
    assert torch.equal(sd.pop("shared_head.head.weight"), again.lm_head.weight)
    assert torch.equal(sd.pop("embed_tokens.weight"), again.get_input_embeddings().weight)
    state, per = {}, {}
    for k, v in sd.items():
        m = re.match(r"mlp\.experts\.(\d+)\.(gate|up|down)_proj\.weight$", k)
        if m:
            per.setdefault(m.group(2), {})[int(m.group(1))] = v
        elif k in ("enorm.weight", "hnorm.weight", "eh_proj.weight"):
            state[k] = v
        elif k == "shared_head.norm.weight":
            state["post_norm.weight"] = v
        else:
            state["mtp_block." + k] = v
    stack = lambda part: torch.stack([per[part][j] for j in sorted(per[part])])
    state["mtp_block.mlp.experts.gate_up_proj"] = torch.cat([stack("gate"), stack("up")], dim=1)
    state["mtp_block.mlp.experts.down_proj"] = stack("down")
    mtp = new_mtp(again)
    mtp.layers[0].load_state_dict(state, strict=True)
    got = mtp_forward(mtp, again, t, torch.arange(len(ids) - 1)[None]).numpy()
    assert np.array_equal(got, mtp_logits), np.abs(got - mtp_logits).max()


def build(name, model_type, seed, gain=4.0, shard=None, new_rope_keys=False, mtp=False, rename_type=None,
          bias_shift=0.0, fp8_block=None, mxfp4=False, seq_len=SEQ_LEN, check_routes=False, post_init=None,
          model_cls=None, fuse_experts=False, real_mtp=None, **kw):
    if ONLY and name not in ONLY:
        return
    cfg = AutoConfig.for_model(model_type, **kw)
    cfg._attn_implementation = "eager"
    torch.manual_seed(seed)
    if model_cls:
        # A multimodal wrapper (Qwen3.5-MoE): the class as the hub's architectures name it.
        model = model_cls._from_config(cfg, attn_implementation="eager").float().eval()
    else:
        model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").float().eval()
    tcfg = cfg.get_text_config()
    decisive_init(model, seed, gain, bias_shift)
    if post_init:
        post_init(model, seed)
    fp8 = quantize_fp8(model, fp8_block) if fp8_block else None
    mx = quantize_gpt_oss_experts(model, seed) if mxfp4 else None
    gaps = check_router_margins(model, tcfg.num_experts_per_tok) if mxfp4 or check_routes else []
    if tcfg.tie_word_embeddings:
        model.tie_weights()
    idx_gaps = None
    if real_mtp is not None:
        gaps = check_group_router_margins(model)
        if model_type == "glm_moe_dsa":
            idx_gaps = check_indexer_margins(model, [])
    ref, logits = reference(model, tcfg.vocab_size, seed, seq_len)
    if real_mtp is not None:
        mtp_module, mtp_ref, mtp_logits = mtp_reference(model, ref["ids"], logits, seed, real_mtp, bias_shift, gaps,
                                                        idx_gaps)
    if gaps and min(gaps) < 1e-5:
        sys.exit(f"{name}: a routing decision is within {min(gaps):.1e} of a tie; change the seed")
    if idx_gaps:
        print(f"  indexer top-k relative gaps (main, MTP, chains): min {min(idx_gaps):.2e} over {len(idx_gaps)} calls")
        if min(idx_gaps) < 1e-5:
            sys.exit(f"{name}: an indexer top-k boundary is within {min(idx_gaps):.1e} (rel) of a tie; change the seed")
    out = os.path.join(ROOT, name)
    shutil.rmtree(out, ignore_errors=True)
    model.to(torch.bfloat16).save_pretrained(out, max_shard_size=shard or "1GB", safe_serialization=True)
    if new_rope_keys:
        # transformers >= 5 spells RoPE settings as one `rope_parameters` object.
        with open(os.path.join(out, "config.json")) as f:
            c = json.load(f)
        params = dict(c.pop("rope_scaling") or {})
        params["rope_theta"] = c.pop("rope_theta")
        params.setdefault("rope_type", "default")
        c["rope_parameters"] = params
        with open(os.path.join(out, "config.json"), "w") as f:
            json.dump(c, f, indent=2)
    if fp8:
        store_fp8(out, fp8, fp8_block)
    if mx:
        store_mxfp4(out, mx)
    if fuse_experts:
        store_fused_experts(out)
        # transformers reads the fused file back to the same logits: the layout is its own.
        again = model_cls.from_pretrained(out, dtype=torch.float32, attn_implementation="eager").eval()
        with torch.no_grad():
            back = again(torch.tensor([ref["ids"]])).logits[0].float().numpy()
        assert np.array_equal(back, logits), "the fused experts do not load back in transformers"
    if mtp:
        add_mtp_layer(out, cfg)
    if real_mtp is not None:
        store_real_mtp(out, cfg, mtp_module)
        check_real_mtp_reload(out, ref["ids"], logits, mtp_logits)
        mtp_logits.tofile(os.path.join(out, "mtp_logits.bin"))
        ref.update(mtp_ref)
    if rename_type:
        # The same architecture published under another model_type (Kimi-K2 ships as kimi_k2).
        with open(os.path.join(out, "config.json")) as f:
            c = json.load(f)
        c["model_type"] = rename_type
        with open(os.path.join(out, "config.json"), "w") as f:
            json.dump(c, f, indent=2)
    for junk in ("generation_config.json",):
        p = os.path.join(out, junk)
        if os.path.exists(p):
            os.remove(p)
    logits.tofile(os.path.join(out, "logits.bin"))
    ref["name"] = name
    ref["transformers"] = transformers.__version__
    ref["torch"] = torch.__version__
    with open(os.path.join(out, "reference.json"), "w") as f:
        json.dump(ref, f)
    m = np.array(ref["top2_margin"]) / np.maximum(np.array(ref["max_abs_logit"]), 1e-9)
    size = sum(os.path.getsize(os.path.join(out, x)) for x in os.listdir(out))
    print(f"{name}: {size/1024:.0f} KiB, near-ties (margin < 1e-3 rel) {int((m < 1e-3).sum())}/{len(m)}, greedy {ref['greedy'][:8]}...")
    if real_mtp is not None:
        mm = np.array(ref["mtp_top2_margin"]) / np.maximum(np.array(ref["mtp_max_abs_logit"]), 1e-9)
        print(f"{name}: MTP near-ties (margin < 1e-3 rel) {int((mm < 1e-3).sum())}/{len(mm)}, "
              f"min rel margin {mm.min():.2e}, pred {ref['mtp_pred'][:8]}...")


def tiny():
    common = dict(vocab_size=256, hidden_size=64, num_hidden_layers=2, max_position_embeddings=256,
                  bos_token_id=1, eos_token_id=2, pad_token_id=0)
    build("llama_gqa", "llama", 11, num_attention_heads=4, num_key_value_heads=2, intermediate_size=128, **common)
    build("llama_tied_mha", "llama", 12, num_attention_heads=4, num_key_value_heads=4, intermediate_size=96,
          tie_word_embeddings=True, **common)
    build("llama_llama3_rope", "llama", 13, num_attention_heads=4, num_key_value_heads=1, intermediate_size=128,
          rope_theta=500000.0,
          rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                        "original_max_position_embeddings": 32}, new_rope_keys=True, **common)
    build("llama_sharded_headdim", "llama", 14, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
          intermediate_size=128, shard="60KB", **common)
    build("olmoe_norm_topk", "olmoe", 21, num_attention_heads=4, num_key_value_heads=4, intermediate_size=32,
          num_experts=8, num_experts_per_tok=2, norm_topk_prob=True, **common)
    build("olmoe_gqa_clip", "olmoe", 22, num_attention_heads=4, num_key_value_heads=2, intermediate_size=32,
          num_experts=8, num_experts_per_tok=3, norm_topk_prob=False, clip_qkv=3.0, shard="100KB", **common)
    moe3 = dict(common, num_hidden_layers=3)
    build("qwen2_moe_shared", "qwen2_moe", 31, num_attention_heads=4, num_key_value_heads=2, intermediate_size=96,
          moe_intermediate_size=32, shared_expert_intermediate_size=48, num_experts=8, num_experts_per_tok=2,
          norm_topk_prob=False, mlp_only_layers=[0], **moe3)
    build("qwen2_moe_sparse_step", "qwen2_moe", 32, num_attention_heads=4, num_key_value_heads=4, intermediate_size=80,
          moe_intermediate_size=24, shared_expert_intermediate_size=40, num_experts=6, num_experts_per_tok=3,
          norm_topk_prob=True, decoder_sparse_step=2, shard="100KB", **moe3)
    build("qwen3_moe_headdim", "qwen3_moe", 41, num_attention_heads=4, num_key_value_heads=1, head_dim=32,
          intermediate_size=96, moe_intermediate_size=32, num_experts=8, num_experts_per_tok=2, norm_topk_prob=True,
          mlp_only_layers=[1], **moe3)
    build("qwen3_moe_new_rope", "qwen3_moe", 42, num_attention_heads=4, num_key_value_heads=2, intermediate_size=96,
          moe_intermediate_size=32, num_experts=8, num_experts_per_tok=3, norm_topk_prob=False,
          rope_scaling={"rope_type": "linear", "factor": 2.0}, new_rope_keys=True, **common)
    build("mixtral_gqa", "mixtral", 51, num_attention_heads=4, num_key_value_heads=2, intermediate_size=48,
          num_local_experts=8, num_experts_per_tok=2, **common)
    build("mixtral_mqa_shard", "mixtral", 52, num_attention_heads=4, num_key_value_heads=1, intermediate_size=40,
          num_local_experts=4, num_experts_per_tok=1, shard="80KB", **common)
    mla = dict(num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=32, qk_nope_head_dim=16,
               qk_rope_head_dim=8, v_head_dim=16, intermediate_size=96, moe_intermediate_size=16,
               n_shared_experts=1, first_k_dense_replace=1)
    yarn = {"type": "yarn", "factor": 4.0, "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0,
            "original_max_position_embeddings": 64}
    build("deepseek_v3_group_yarn", "deepseek_v3", 61, q_lora_rank=48, n_routed_experts=8, num_experts_per_tok=2,
          n_group=4, topk_group=2, norm_topk_prob=True, routed_scaling_factor=2.5, rope_scaling=yarn,
          rope_interleave=True, mtp=True, **mla, **moe3)
    build("deepseek_v3_no_q_lora", "deepseek_v3", 62, q_lora_rank=None, n_routed_experts=6, num_experts_per_tok=3,
          n_group=1, topk_group=1, norm_topk_prob=False, routed_scaling_factor=1.0, rope_interleave=False,
          shard="100KB", mtp=True, **mla, **moe3)
    build("kimi_k2_yarn_mscale", "deepseek_v3", 63, q_lora_rank=32, n_routed_experts=8, num_experts_per_tok=2,
          n_group=2, topk_group=1, norm_topk_prob=True, routed_scaling_factor=2.827,
          rope_scaling={"type": "yarn", "factor": 8.0, "beta_fast": 1.0, "beta_slow": 1.0, "mscale": 1.0,
                        "mscale_all_dim": 0.707, "original_max_position_embeddings": 32},
          rename_type="kimi_k2", **mla, **moe3)
    glm = dict(num_attention_heads=4, num_key_value_heads=2, intermediate_size=96, moe_intermediate_size=16,
               n_shared_experts=1, first_k_dense_replace=1, routed_scaling_factor=2.5)
    build("glm4_moe_partial_qknorm", "glm4_moe", 71, partial_rotary_factor=0.5, attention_bias=True,
          use_qk_norm=True, n_routed_experts=8, num_experts_per_tok=2, n_group=1, topk_group=1,
          norm_topk_prob=True, **glm, **moe3)
    # FP8 releases: float8_e4m3fn projections with per-block weight_scale_inv; dimensions that
    # are not multiples of the block (partial edge blocks), 128x128 as published and 32x32
    # (several blocks per matrix).
    build("deepseek_v3_fp8_b128", "deepseek_v3", 64, q_lora_rank=48, n_routed_experts=8, num_experts_per_tok=2,
          n_group=4, topk_group=2, norm_topk_prob=True, routed_scaling_factor=2.5, fp8_block=(128, 128),
          shard="100KB", **mla, **moe3)
    build("glm4_moe_fp8_b32", "glm4_moe", 73, partial_rotary_factor=0.5, attention_bias=True,
          use_qk_norm=True, n_routed_experts=8, num_experts_per_tok=2, n_group=1, topk_group=1,
          norm_topk_prob=True, fp8_block=(32, 32), **glm, **moe3)
    build("glm4_moe_group_mtp", "glm4_moe", 72, partial_rotary_factor=0.25, head_dim=32, attention_bias=False,
          use_qk_norm=False, n_routed_experts=8, num_experts_per_tok=3, n_group=2, topk_group=1,
          norm_topk_prob=False, new_rope_keys=True, mtp=True, shard="100KB", **glm, **moe3)


def tiny5():
    """Families only transformers 5 implements (run with oracle/requirements-tf5.txt)."""
    assert transformers.__version__.startswith("5."), transformers.__version__
    common = dict(vocab_size=256, hidden_size=64, max_position_embeddings=256, bos_token_id=1, eos_token_id=2,
                  pad_token_id=0)
    dsa = dict(num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=32, q_lora_rank=48,
               qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16, intermediate_size=96,
               moe_intermediate_size=16, n_shared_experts=1, index_head_dim=16, index_n_heads=8)
    # SEQ_LEN (40) > index_topk, so the indexer really prunes.
    build("glm5_dsa_full", "glm_moe_dsa", 81, num_hidden_layers=3, first_k_dense_replace=1, n_routed_experts=8,
          num_experts_per_tok=2, n_group=1, topk_group=1, index_topk=8, **dsa, **common)
    # Shared layers reuse the previous selection; group routing with a negative selection bias (masked
    # groups must lose even to negative choices); YaRN with mscale_all_dim; MTP tensors; shards.
    build("glm5_dsa_shared_group_yarn", "glm_moe_dsa", 82, num_hidden_layers=4,
          indexer_types=["full", "shared", "full", "shared"], mlp_layer_types=["dense", "sparse", "sparse", "dense"],
          n_routed_experts=8, num_experts_per_tok=3, n_group=2, topk_group=1, index_topk=12, bias_shift=-1.5,
          rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "beta_fast": 32.0,
                           "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 0.707,
                           "original_max_position_embeddings": 64},
          mtp=True, shard="100KB", **dsa, **common)

    # A real, complete MTP layer (model.layers.{n}, n = num_hidden_layers) with reference MTP logits
    # (mtp_logits.bin, one row per (h_i, ids[i+1]), see mtp_reference): DeepSeek-V3 (MLA with a
    # q LoRA, YaRN, interleaved rope, group routing) and GLM-4.5 (GQA with biases, partial RoPE,
    # group routing). The main model: one dense and one MoE layer. real_mtp = the eh_proj gain: with
    # 1.0 its input halves (enorm(e), hnorm(h)) and its output all have RMS ~1, and the block, not
    # the skip path, decides most MTP argmaxes; MTP top-2 margins are as wide as the main ones.
    build("deepseek_v3_mtp", "deepseek_v3", 131, num_hidden_layers=2, first_k_dense_replace=1,
          num_attention_heads=4, num_key_value_heads=4, q_lora_rank=48, kv_lora_rank=32, qk_nope_head_dim=16,
          qk_rope_head_dim=8, v_head_dim=16, intermediate_size=64, moe_intermediate_size=16, n_shared_experts=1,
          n_routed_experts=8, num_experts_per_tok=2, n_group=4, topk_group=2, norm_topk_prob=True,
          routed_scaling_factor=2.5, rope_interleave=True,
          rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "beta_fast": 32.0,
                           "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0,
                           "original_max_position_embeddings": 64},
          real_mtp=1.0, **common)
    build("glm4_moe_mtp", "glm4_moe", 139, num_hidden_layers=2, first_k_dense_replace=1, num_attention_heads=4,
          num_key_value_heads=2, partial_rotary_factor=0.5, attention_bias=True, use_qk_norm=False,
          intermediate_size=64, moe_intermediate_size=16, n_shared_experts=1, n_routed_experts=8,
          num_experts_per_tok=3, n_group=2, topk_group=1, norm_topk_prob=False, routed_scaling_factor=2.5,
          real_mtp=1.0, **common)
    # GLM-5 (glm_moe_dsa): the MTP layer is MLA with its own ("full") DSA indexer and a MoE, built by
    # hand (see glm_dsa_mtp); config.json's per-layer lists keep num_hidden_layers entries, as the
    # release's. index_topk well below the rows, so the indexer prunes in the main layers and the
    # MTP layer alike; the indexer's top-k boundaries are guarded against ties like the routing.
    build("glm5_mtp", "glm_moe_dsa", 150, num_hidden_layers=2, first_k_dense_replace=1, n_routed_experts=8,
          num_experts_per_tok=2, n_group=1, topk_group=1, index_topk=8, real_mtp=1.0, **dsa, **common)

    # gpt-oss: MXFP4 experts as the hub ships them; alternating sliding (window < SEQ_LEN) and
    # full layers; sinks; biases; YaRN without truncation (the release's rope settings).
    oss = dict(num_attention_heads=4, num_key_value_heads=2, head_dim=16, intermediate_size=64,
               num_local_experts=8, mxfp4=True, **common)
    build("gpt_oss_window_yarn", "gpt_oss", 91, num_hidden_layers=4, num_experts_per_tok=2, sliding_window=8,
          rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0, "factor": 4.0, "beta_fast": 32.0,
                           "beta_slow": 1.0, "truncate": False, "original_max_position_embeddings": 64},
          **oss)
    # gpt-oss as transformers saves it unquantized (a BF16 re-upload, or the release loaded with
    # Mxfp4Config(dequantize=True) and saved): fused `experts.gate_up_proj` [E, hidden, 2*inter] (gate
    # and up interleaved along the last axis) and `experts.down_proj` [E, inter, hidden], each expert's
    # matrix input-major ([in, out]), the transpose of every other layout coli reads.
    build("gpt_oss_bf16_fused", "gpt_oss", 93, num_hidden_layers=2, num_experts_per_tok=2, sliding_window=8,
          check_routes=True, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
          **{k: v for k, v in oss.items() if k != "mxfp4"})
    # A swiglu_limit the activations cross (both clamps act), top-3, every layer sliding.
    build("gpt_oss_clamp_top3", "gpt_oss", 92, num_hidden_layers=3, num_experts_per_tok=3, sliding_window=5,
          swiglu_limit=0.5, layer_types=["sliding_attention"] * 3,
          rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, **oss)

    # MiniMax-M2: sigmoid routing with a selection-only bias, q/k RMSNorm over the whole
    # projection, partial RoPE (rotary_dim < head_dim, head_dim != hidden / heads).
    mm = dict(num_attention_heads=4, num_key_value_heads=2, head_dim=32, intermediate_size=32,
              num_local_experts=8, **common)
    build("minimax_m2_partial_rope", "minimax_m2", 101, num_hidden_layers=3, num_experts_per_tok=2,
          rotary_dim=16, bias_shift=0.5, **mm)
    build("minimax_m2_top3_shard", "minimax_m2", 102, num_hidden_layers=2, num_experts_per_tok=3,
          rotary_dim=8, shard="100KB", **mm)


    # Qwen3-Next: Gated DeltaNet linear-attention layers between gated full-attention layers,
    # sequences longer than the delta rule's 64-token chunk (transformers' prefill runs the
    # chunked form, coli the recurrent one), shared expert with a sigmoid gate, zero-centred
    # RMSNorm weights, partial RoPE.
    nxt = dict(num_attention_heads=4, num_key_value_heads=2, head_dim=32, partial_rotary_factor=0.25,
               linear_key_head_dim=16, linear_value_head_dim=16, moe_intermediate_size=32,
               shared_expert_intermediate_size=48, num_experts=8, check_routes=True,
               post_init=mild_decay, **common)
    build("qwen3_next_hybrid", "qwen3_next", 111, num_hidden_layers=4, full_attention_interval=2,
          linear_num_key_heads=2, linear_num_value_heads=4, linear_conv_kernel_dim=4, num_experts_per_tok=2,
          norm_topk_prob=True, mlp_only_layers=[0], intermediate_size=96, seq_len=80, **nxt)
    # One value head per key head, a 3-tap conv, explicit layer_types, no top-k renormalisation,
    # rope_theta as the release, shards.
    build("qwen3_next_layer_types_shard", "qwen3_next", 112, num_hidden_layers=3,
          layer_types=["linear_attention", "full_attention", "linear_attention"], linear_num_key_heads=4,
          linear_num_value_heads=4, linear_conv_kernel_dim=3, num_experts_per_tok=3, norm_topk_prob=False,
          intermediate_size=64, rope_parameters={"rope_type": "default", "rope_theta": 10000000.0,
                                                 "partial_rotary_factor": 0.25},
          seq_len=72, shard="100KB", **nxt)


    # Qwen3.5-MoE as the hub ships it: the multimodal wrapper's config (text_config beside a
    # vision_config), the text model under model.language_model beside a tiny vision tower,
    # experts fused; separate linear-attention projections; every layer a MoE.
    from transformers import Qwen3_5MoeForConditionalGeneration
    q35 = dict(vocab_size=256, hidden_size=64, max_position_embeddings=256, num_attention_heads=4,
               num_key_value_heads=2, head_dim=32, linear_key_head_dim=16, linear_value_head_dim=16,
               moe_intermediate_size=32, shared_expert_intermediate_size=48, num_experts=8,
               bos_token_id=1, eos_token_id=2, pad_token_id=0)
    vision = dict(depth=1, hidden_size=32, num_heads=2, intermediate_size=64, out_hidden_size=64, patch_size=4,
                  temporal_patch_size=2, spatial_merge_size=2, num_position_embeddings=16)
    build("qwen3_5_moe_hub_fused", "qwen3_5_moe", 121, model_cls=Qwen3_5MoeForConditionalGeneration,
          text_config=dict(q35, num_hidden_layers=4, full_attention_interval=2, linear_num_key_heads=2,
                           linear_num_value_heads=4, linear_conv_kernel_dim=4, num_experts_per_tok=2,
                           rope_parameters={"rope_type": "default", "rope_theta": 10000000.0,
                                            "partial_rotary_factor": 0.25, "mrope_section": [2, 1, 1],
                                            "mrope_interleaved": True}),
          vision_config=vision, fuse_experts=True, check_routes=True, post_init=mild_decay, seq_len=72)
    # The text model saved alone (qwen3_5_moe_text, under model.*), experts per expert, shards.
    build("qwen3_5_moe_text_shard", "qwen3_5_moe_text", 123, num_hidden_layers=3,
          layer_types=["linear_attention", "linear_attention", "full_attention"], linear_num_key_heads=4,
          linear_num_value_heads=8, linear_conv_kernel_dim=3, num_experts_per_tok=3, check_routes=True,
          post_init=mild_decay, seq_len=70, shard="100KB", **q35)

    deepseek_v4()


def mild_decay(model, seed):
    """Qwen3-Next's A_log: decays exp(g) near 1 (as trained models have), so the recurrent state
    carries information across the whole sequence and over the chunk boundary."""
    g = torch.Generator().manual_seed(seed + 7)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("A_log"):
                v = torch.log(0.02 + 0.3 * torch.rand(p.shape, generator=g))
                p.copy_(v.to(torch.bfloat16).to(torch.float32))


# DeepSeek-V4 (transformers 5 only): hyper-connection streams (mHC, Sinkhorn), shared-KV MQA with
# a sliding window, attention sinks, grouped low-rank output projection, compressed KV (CSA: overlapping
# windows of 4 + a Lightning indexer's top-k; HCA: non-overlapping windows), hash and learned routing.
V4_HUB_RENAMES = [  # (transformers name pattern, hub name): the inverse of conversion_mapping.py "deepseek_v4"
    (r"^model\.embed_tokens\.weight$", "embed.weight"),
    (r"^lm_head\.weight$", "head.weight"),
    (r"^model\.norm\.weight$", "norm.weight"),
    (r"^model\.hc_head\.hc_(fn|base|scale)$", r"hc_head_\1"),
    (r"^model\.layers\.(\d+)\.input_layernorm\.", r"layers.\1.attn_norm."),
    (r"^model\.layers\.(\d+)\.post_attention_layernorm\.", r"layers.\1.ffn_norm."),
    (r"^model\.layers\.(\d+)\.attn_hc\.(fn|base|scale)$", r"layers.\1.hc_attn_\2"),
    (r"^model\.layers\.(\d+)\.ffn_hc\.(fn|base|scale)$", r"layers.\1.hc_ffn_\2"),
    (r"^model\.layers\.(\d+)\.self_attn\.sinks$", r"layers.\1.attn.attn_sink"),
    (r"^model\.layers\.(\d+)\.self_attn\.q_a_proj\.", r"layers.\1.attn.wq_a."),
    (r"^model\.layers\.(\d+)\.self_attn\.q_a_norm\.", r"layers.\1.attn.q_norm."),
    (r"^model\.layers\.(\d+)\.self_attn\.q_b_proj\.", r"layers.\1.attn.wq_b."),
    (r"^model\.layers\.(\d+)\.self_attn\.kv_proj\.", r"layers.\1.attn.wkv."),
    (r"^model\.layers\.(\d+)\.self_attn\.kv_norm\.", r"layers.\1.attn.kv_norm."),
    (r"^model\.layers\.(\d+)\.self_attn\.o_a_proj\.", r"layers.\1.attn.wo_a."),
    (r"^model\.layers\.(\d+)\.self_attn\.o_b_proj\.", r"layers.\1.attn.wo_b."),
    (r"^model\.layers\.(\d+)\.self_attn\.compressor\.indexer\.q_b_proj\.", r"layers.\1.attn.indexer.wq_b."),
    (r"^model\.layers\.(\d+)\.self_attn\.compressor\.indexer\.scorer\.weights_proj\.",
     r"layers.\1.attn.indexer.weights_proj."),
    (r"^model\.layers\.(\d+)\.self_attn\.compressor\.indexer\.", r"layers.\1.attn.indexer.compressor."),
    (r"^model\.layers\.(\d+)\.self_attn\.compressor\.", r"layers.\1.attn.compressor."),
    (r"^model\.layers\.(\d+)\.mlp\.gate\.e_score_correction_bias$", r"layers.\1.ffn.gate.bias"),
    (r"^model\.layers\.(\d+)\.mlp\.gate\.", r"layers.\1.ffn.gate."),
    (r"^model\.layers\.(\d+)\.mlp\.shared_experts\.gate_proj\.", r"layers.\1.ffn.shared_experts.w1."),
    (r"^model\.layers\.(\d+)\.mlp\.shared_experts\.down_proj\.", r"layers.\1.ffn.shared_experts.w2."),
    (r"^model\.layers\.(\d+)\.mlp\.shared_experts\.up_proj\.", r"layers.\1.ffn.shared_experts.w3."),
]
# ... and within a compressor (the attention's or the indexer's): kv_proj -> wkv, gate_proj -> wgate,
# position_bias -> ape, kv_norm -> norm.
V4_HUB_COMPRESSOR = {"kv_proj.weight": "wkv.weight", "gate_proj.weight": "wgate.weight", "position_bias": "ape",
                     "kv_norm.weight": "norm.weight"}
# Stored in float32 as in the release (DeepSeek's reference model keeps these in float32); the rest
# bf16 (norms included), tid2eid int32.
V4_HUB_F32 = ("hc_head_fn", "hc_head_base", "hc_head_scale", "attn_sink", ".ape", "gate.bias")


def v4_hub_state_dict(model):
    """The model's weights under the tensor names DeepSeek ships V4 with (no `model.` prefix, `attn`/`ffn`,
    wq_a/wkv/wo_a..., per-expert w1/w2/w3, ffn.gate.bias, hc_attn_fn...): each name worked out from
    conversion_mapping.py's "deepseek_v4" renames, read backwards. Fused experts are split as their forward
    reads them (gate_up_proj[e] = cat(w1, w3), down_proj[e] = w2)."""
    import re
    out = {}
    sd = model.state_dict()
    for name, t in sd.items():
        if "rotary_emb" in name:
            continue
        m = re.match(r"^model\.layers\.(\d+)\.mlp\.experts\.(gate_up_proj|down_proj)$", name)
        if m:
            layer, kind = m.groups()
            inter = model.config.moe_intermediate_size
            for e in range(t.shape[0]):
                p = f"layers.{layer}.ffn.experts.{e}."
                if kind == "gate_up_proj":
                    out[p + "w1.weight"], out[p + "w3.weight"] = t[e, :inter], t[e, inter:]
                else:
                    out[p + "w2.weight"] = t[e]
            continue
        new = None
        for pat, rep in V4_HUB_RENAMES:
            if re.search(pat, name):
                new = re.sub(pat, rep, name)
                break
        assert new is not None, name
        if ".compressor." in new:
            head, leaf = new.rsplit(".compressor.", 1)
            new = head + ".compressor." + V4_HUB_COMPRESSOR[leaf]
        assert new not in out, new
        out[new] = t
    stored = {}
    for k, v in out.items():
        if k.endswith("tid2eid"):
            stored[k] = v.to(torch.int32).contiguous()
        elif k.endswith(V4_HUB_F32) or re.search(r"\.hc_(attn|ffn)_(fn|base|scale)$", k):
            stored[k] = v.float().contiguous()
        else:
            stored[k] = v.to(torch.bfloat16).contiguous()
    return stored


# DeepSeek-V4-Flash's release quantization: the dense projections below in float8_e4m3fn with one
# float8_e8m0fnu (ue8m0: a power of two 2^(b - 127)) scale per 128x128 block, stored as `X.scale`; the
# routed experts in FP4 e2m1, two per byte (element 2i in the low nibble), as int8 [rows, cols / 2] with
# an e8m0 scale per 32 along K, `X.scale` [rows, cols / 32]. Everything else (embed, head, norms, routers,
# hc_*, attn_sink, ape, the compressors' wkv/wgate and the indexer's weights_proj: transformers'
# _keep_in_fp32_modules for V4) stays BF16/F32 with no scale.
V4_FP8_DENSE = r"^layers\.\d+\.(attn\.(wq_a|wq_b|wkv|wo_a|wo_b|indexer\.wq_b)|ffn\.shared_experts\.w[123])\.weight$"
V4_FP4_EXPERT = r"^layers\.\d+\.ffn\.experts\.\d+\.w[123]\.weight$"
V4_RELEASE_QUANT = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8", "scale_fmt": "ue8m0",
                    "weight_block_size": [128, 128]}
SAFETENSORS_DTYPES = {torch.bfloat16: "BF16", torch.float32: "F32", torch.int32: "I32", torch.int8: "I8",
                      torch.float8_e4m3fn: "F8_E4M3", torch.float8_e8m0fnu: "F8_E8M0"}


def v4_quantize_release(model, seed, block):
    """The release's quantized tensors for `model` (hub names, v4_hub_state_dict's): {X.weight: (weight,
    scale)}. FP8 projections: the model's values over 2^ceil(log2(block amax / 448)) (DeepSeek's ue8m0
    rounding), cast to e4m3fn (round to nearest even); FP4 experts: random nibbles and scales 2^-5..2^-3
    (quantize_gpt_oss_experts' ranges). The model itself is not touched (see v4_release_dequantize)."""
    import re
    br, bc = block
    rng = np.random.default_rng(seed + 99)
    stored = {}
    for name, w in v4_hub_state_dict(model).items():
        if re.match(V4_FP8_DENSE, name):
            w = w.float()
            rows, cols = w.shape
            gr, gc = -(-rows // br), -(-cols // bc)
            padded = torch.zeros(gr * br, gc * bc)
            padded[:rows, :cols] = w
            amax = padded.view(gr, br, gc, bc).abs().amax(dim=(1, 3))
            assert bool((amax > 0).all()), name
            e = torch.ceil(torch.log2(amax / 448.0))
            full = torch.exp2(e).repeat_interleave(br, 0).repeat_interleave(bc, 1)[:rows, :cols]
            q = (w / full).clamp(-448, 448).to(torch.float8_e4m3fn)
            s = (e + 127).to(torch.uint8).view(torch.float8_e8m0fnu)
        elif re.match(V4_FP4_EXPERT, name):
            rows, cols = w.shape
            assert cols % 32 == 0, name
            q = torch.from_numpy(rng.integers(0, 256, size=(rows, cols // 2), dtype=np.uint8)).view(torch.int8)
            s = torch.from_numpy(rng.integers(122, 125, size=(rows, cols // 32), dtype=np.uint8)).view(torch.float8_e8m0fnu)
        else:
            continue
        stored[name] = (q.contiguous(), s.contiguous())
    return stored


def e4m3fn_decode(b):
    """OCP FP8 E4M3FN by its definition: sign, 4 exponent bits (bias 7), 3 mantissa bits; exponent 0 is
    subnormal (m/8 * 2^-6); S.1111.111 is NaN; no infinities."""
    b = b.astype(np.int64)
    e, m = (b >> 3) & 15, b & 7
    v = np.where(e == 0, m / 8.0 * 2.0 ** -6, (1.0 + m / 8.0) * np.exp2(e - 7.0))
    v = np.where((b & 0x7F) == 0x7F, np.nan, v)
    return np.where(b & 0x80, -v, v)


def e8m0_decode(b):
    """OCP E8M0: 2^(b - 127); 255 is NaN."""
    return np.where(b == 255, np.nan, np.exp2(b.astype(np.float64) - 127.0))


def v4_release_dequantize(raw, block):
    """numpy, from the bytes: {name: (safetensors dtype, shape, uint8 bytes)} -> {name: torch tensor}, the
    quantized weights (those with a sibling `X.scale`) dequantized to float32, their scales dropped; BF16
    widened to F32; I32 kept. F8_E4M3 weights: e4m3fn * the e8m0 scale of their block (block[0] x
    block[1], edge blocks partial); I8 weights: packed e2m1 (dequantize_mxfp4) * the e8m0 scale of their
    32 columns."""
    br, bc = block
    out = {}
    for name, (dt, shape, b) in raw.items():
        if name.endswith(".scale"):
            continue
        sname = name[:-len("weight")] + "scale" if name.endswith(".weight") else None
        if sname in raw:
            sdt, sshape, sb = raw[sname]
            assert sdt == "F8_E8M0", (sname, sdt)
            scale = e8m0_decode(sb).reshape(sshape)
            if dt == "F8_E4M3":
                rows, cols = shape
                assert list(sshape) == [-(-rows // br), -(-cols // bc)], (name, shape, sshape)
                full = np.repeat(np.repeat(scale, br, 0), bc, 1)[:rows, :cols]
                w = e4m3fn_decode(b).reshape(shape) * full
            elif dt == "I8":
                rows, half = shape
                assert list(sshape) == [rows, 2 * half // 32], (name, shape, sshape)
                w = dequantize_mxfp4(b.reshape(rows, 2 * half // 32, 16), sb.reshape(sshape))
            else:
                raise ValueError((name, dt))
            assert np.isfinite(w).all(), name
            out[name] = torch.from_numpy(w.astype(np.float32))
        elif dt == "BF16":
            out[name] = torch.from_numpy((b.view("<u2").astype(np.uint32) << 16).view("<f4").reshape(shape).copy())
        elif dt == "F32":
            out[name] = torch.from_numpy(b.view("<f4").reshape(shape).copy())
        elif dt == "I32":
            out[name] = torch.from_numpy(b.view("<i4").reshape(shape).copy())
        else:
            raise ValueError((name, dt))
    return out


def raw_tensors(tensors):
    """{name: torch tensor} -> {name: (safetensors dtype, shape, little-endian bytes as uint8)}."""
    return {k: (SAFETENSORS_DTYPES[t.dtype], list(t.shape), t.contiguous().view(-1).view(torch.uint8).numpy())
            for k, t in tensors.items()}


def read_safetensors_raw(path):
    """A safetensors file read by its format (8-byte header length, JSON header, data), without safetensors."""
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
        data = np.frombuffer(f.read(), dtype=np.uint8)
    return {k: (v["dtype"], v["shape"], data[v["data_offsets"][0]:v["data_offsets"][1]])
            for k, v in header.items() if k != "__metadata__"}

def v4_from_hub_state_dict(hub, cfg):
    """coli's own reading of the hub names back to transformers' (the forward direction, written
    independently of V4_HUB_RENAMES): a cross-check of v4_hub_state_dict besides transformers' loader."""
    import re
    fwd = [(r"^embed\.weight$", "model.embed_tokens.weight"), (r"^head\.weight$", "lm_head.weight"),
           (r"^norm\.weight$", "model.norm.weight"), (r"^hc_head_(fn|base|scale)$", r"model.hc_head.hc_\1")]
    layer = {"attn_norm.weight": "input_layernorm.weight", "ffn_norm.weight": "post_attention_layernorm.weight",
             "attn.attn_sink": "self_attn.sinks", "attn.wq_a.weight": "self_attn.q_a_proj.weight",
             "attn.q_norm.weight": "self_attn.q_a_norm.weight", "attn.wq_b.weight": "self_attn.q_b_proj.weight",
             "attn.wkv.weight": "self_attn.kv_proj.weight", "attn.kv_norm.weight": "self_attn.kv_norm.weight",
             "attn.wo_a.weight": "self_attn.o_a_proj.weight", "attn.wo_b.weight": "self_attn.o_b_proj.weight",
             "attn.indexer.wq_b.weight": "self_attn.compressor.indexer.q_b_proj.weight",
             "attn.indexer.weights_proj.weight": "self_attn.compressor.indexer.scorer.weights_proj.weight",
             "ffn.gate.weight": "mlp.gate.weight", "ffn.gate.bias": "mlp.gate.e_score_correction_bias",
             "ffn.gate.tid2eid": "mlp.gate.tid2eid", "ffn.shared_experts.w1.weight": "mlp.shared_experts.gate_proj.weight",
             "ffn.shared_experts.w2.weight": "mlp.shared_experts.down_proj.weight",
             "ffn.shared_experts.w3.weight": "mlp.shared_experts.up_proj.weight"}
    for part in ("fn", "base", "scale"):
        layer[f"hc_attn_{part}"], layer[f"hc_ffn_{part}"] = f"attn_hc.{part}", f"ffn_hc.{part}"
    for src, dst in (("attn.compressor.", "self_attn.compressor."),
                     ("attn.indexer.compressor.", "self_attn.compressor.indexer.")):
        for a, b in (("wkv.weight", "kv_proj.weight"), ("wgate.weight", "gate_proj.weight"), ("ape", "position_bias"),
                     ("norm.weight", "kv_norm.weight")):
            layer[src + a] = dst + b
    sd, experts = {}, {}
    for k, v in hub.items():
        v = v.long() if k.endswith("tid2eid") else v.float()
        m = re.match(r"^layers\.(\d+)\.(.*)$", k)
        if m:
            i, rest = m.groups()
            e = re.match(r"^ffn\.experts\.(\d+)\.(w[123])\.weight$", rest)
            if e:
                experts.setdefault(int(i), {}).setdefault(e.group(2), {})[int(e.group(1))] = v
            else:
                sd[f"model.layers.{i}.{layer[rest]}"] = v
            continue
        for pat, rep in fwd:
            if re.match(pat, k):
                sd[re.sub(pat, rep, k)] = v
                break
        else:
            raise KeyError(k)
    for i, parts in experts.items():
        stack = lambda w: torch.stack([parts[w][e] for e in range(cfg.n_routed_experts)])
        sd[f"model.layers.{i}.mlp.experts.gate_up_proj"] = torch.cat([stack("w1"), stack("w3")], dim=1)
        sd[f"model.layers.{i}.mlp.experts.down_proj"] = stack("w2")
    return sd


def v4_init(model, seed, gain, bias_shift=0.0):
    """decisive_init, then real values for what transformers' init zeroes or sets to ones (a reference on
    those would test nothing): attention sinks N(0, 1), hyper-connection bases N(0, 0.5^2) and scales
    U(0.5, 1.5) (the decoder's attn_hc/ffn_hc and the final hc_head), compressor and indexer position
    biases (ape) N(0, 0.5^2); each hash layer's tid2eid: k distinct random experts per token."""
    decisive_init(model, seed, gain, bias_shift)
    g = torch.Generator().manual_seed(seed + 3)
    cfg = model.config
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(".sinks"):
                v = torch.randn(p.shape, generator=g)
            elif name.endswith(("_hc.base", "hc_head.hc_base", ".position_bias")):
                v = 0.5 * torch.randn(p.shape, generator=g)
            elif name.endswith(("_hc.scale", "hc_head.hc_scale")):
                v = 0.5 + torch.rand(p.shape, generator=g)
            else:
                continue
            p.copy_(v.to(torch.bfloat16).to(torch.float32))
        for name, b in model.named_buffers():
            if name.endswith("tid2eid"):
                rows = [torch.randperm(cfg.n_routed_experts, generator=g)[:cfg.num_experts_per_tok]
                        for _ in range(cfg.vocab_size)]
                b.copy_(torch.stack(rows))


def v4_guards(model):
    """Hooks: (1) every learned router (`moe` layers): the gap between the k-th and (k+1)-th of
    scores + e_score_correction_bias, and its choice recomputed; (2) every Lightning indexer (CSA
    layers): its scores masked to the causally visible compressed entries (entry w visible from
    position t iff w < (t + 1) // rate), the relative gap (k-th minus (k+1)-th over the row's largest
    |score|) in rows with more than k visible entries, and its choice recomputed; (3) how many
    swiglu_limit clamps bind (gate > limit, |up| > limit) in the routed experts and the shared expert.
    Returns (router gaps, indexer gaps, clamp counts), filled by every forward that follows."""
    from torch.nn import functional as F
    from transformers.models.deepseek_v4 import modeling_deepseek_v4 as v4
    router_gaps, index_gaps = [], []
    clamps = {"routed_gate": 0, "routed_up": 0, "shared_gate": 0, "shared_up": 0, "routed_n": 0, "shared_n": 0}

    def router_hook(m, inputs, out):
        x = inputs[0].reshape(-1, m.hidden_dim).float()
        s = m.score_fn(F.linear(x, m.weight.float())) + m.e_score_correction_bias.float()
        top = s.topk(m.top_k + 1, dim=-1)
        router_gaps.append(float((top.values[:, m.top_k - 1] - top.values[:, m.top_k]).min()))
        assert torch.equal(top.indices[:, :m.top_k].sort(-1).values, out[2].sort(-1).values), "router recomputation"

    def indexer_hooks(m):
        state = {}

        def scorer_hook(_m, _args, out):
            state["scores"] = out

        def hook(mod, args, kwargs, out):
            position_ids = args[2] if len(args) > 2 else kwargs["position_ids"]
            scores = state.pop("scores").float()  # [B, S, T]
            t, k = scores.shape[-1], mod.index_topk
            visible = torch.arange(t)[None, None, :] < ((position_ids + 1) // mod.compress_rate)[..., None]
            rows = visible.sum(-1) > k
            if t <= k or not rows.any():
                return
            masked = scores.masked_fill(~visible, float("-inf"))
            top = masked.topk(k + 1, dim=-1)
            assert torch.equal(top.indices[..., :k].sort(-1).values[rows], out.sort(-1).values[rows]), \
                "indexer recomputation differs"
            v = top.values[rows]
            scale = masked.masked_fill(~visible, 0.0).abs().amax(-1)[rows].clamp_min(1e-12)
            index_gaps.append(float(((v[:, k - 1] - v[:, k]) / scale).min()))

        m.scorer.register_forward_hook(scorer_hook)
        m.register_forward_hook(hook, with_kwargs=True)

    def count(key, n):
        def hook(_m, _args, out):
            clamps[key] += int(n(out).sum())
        return hook

    for m in model.modules():
        if isinstance(m, v4.DeepseekV4TopKRouter):
            m.register_forward_hook(router_hook)
        elif isinstance(m, v4.DeepseekV4Indexer):
            indexer_hooks(m)
        elif isinstance(m, v4.DeepseekV4Experts):
            def apply_gate(gate_up, m=m, orig=m._apply_gate):
                gate, up = gate_up.chunk(2, dim=-1)
                clamps["routed_gate"] += int((gate > m.limit).sum())
                clamps["routed_up"] += int((up.abs() > m.limit).sum())
                clamps["routed_n"] += gate.numel()
                return orig(gate_up)
            m._apply_gate = apply_gate
        elif isinstance(m, v4.DeepseekV4MLP):
            m.gate_proj.register_forward_hook(count("shared_gate", lambda o, m=m: o > m.limit))
            m.up_proj.register_forward_hook(count("shared_up", lambda o, m=m: o.abs() > m.limit))
            m.gate_proj.register_forward_hook(count("shared_n", lambda o: torch.ones_like(o, dtype=torch.bool)))
    return router_gaps, index_gaps, clamps


V4_CHUNKS = (0, 13, 14, 27)


def v4_cache_checks(model, ids, logits):
    """transformers' cached paths against the full forward (`logits`, reference()'s): the prompt one token
    at a time through a DynamicCache, and in chunks V4_CHUNKS (+ the rest) -- across calls the compressors
    carry half-filled windows, the CSA overlap half-window and the emitted entries; and the full forward
    without a cache (use_cache=False). Returns the worst |d| / the row's max |logit| of each."""
    from transformers import DynamicCache
    t = torch.tensor([ids])
    ref = torch.from_numpy(logits)
    scale = ref.abs().amax(-1, keepdim=True)
    res = {}
    with torch.no_grad():
        for label, bounds in (("one token at a time", list(range(len(ids) + 1))),
                              (f"chunks {list(V4_CHUNKS)}+", list(V4_CHUNKS) + [len(ids)])):
            cache = DynamicCache(config=model.config)
            out = [model(t[:, a:b], cache=cache, use_cache=True).logits[0].float() for a, b in zip(bounds[:-1], bounds[1:])]
            res[label] = float(((torch.cat(out) - ref).abs() / scale).max())
        res["no cache"] = float(((model(t, use_cache=False).logits[0].float() - ref).abs() / scale).max())
    for label, d in res.items():
        print(f"  cached check, {label}: max |d| / row max |logit| {d:.2e}")
        assert d <= 1e-4, (label, d)
    return res


def build_v4(name, seed, gain=4.0, bias_shift=0.0, seq_len=SEQ_LEN, hub=None, expect=None, quant=None, **kw):
    """A DeepSeek-V4 fixture. hub=None: `kw` is the transformers config, saved by save_pretrained in
    transformers' own layout (save_original_format=False: model.layers.N..., fused experts; its default
    writes a half-reverted mix of hub and transformers names). hub=dict: config.json is that dict as
    DeepSeek's hub configs spell it (legacy keys the config class folds in), and model.safetensors holds
    the hub's tensor names (v4_hub_state_dict); transformers must read it back to the same logits.
    `expect`: config attributes the config class must have derived (from the legacy keys).
    `quant` (hub only): the FP8 block, [128, 128] in the release; the file then holds the release's
    quantized tensors (v4_quantize_release) and the model, so the reference, runs on their values as
    v4_release_dequantize (numpy, from the bytes) reads them; transformers' loader (its FP8 quantizer,
    dequantizing) must read the file back to the same logits."""
    if ONLY and name not in ONLY:
        return
    import tempfile
    from safetensors.torch import save_file
    out = os.path.join(ROOT, name)
    if hub is not None:
        tmp = tempfile.mkdtemp()
        with open(os.path.join(tmp, "config.json"), "w") as f:
            json.dump(hub, f, indent=2)
        cfg = AutoConfig.from_pretrained(tmp)
    else:
        cfg = AutoConfig.for_model("deepseek_v4", **kw)
    cfg._attn_implementation = "eager"
    print(f"{name}: layer_types {cfg.layer_types}, mlp_layer_types {cfg.mlp_layer_types}, "
          f"compress_rates {cfg.compress_rates}, rope_parameters {cfg.rope_parameters}")
    def subset(v, got):  # dicts: the expected keys only, recursively
        if isinstance(v, dict):
            return isinstance(got, dict) and all(subset(v[k], got.get(k)) for k in v)
        return got == v
    for k, v in (expect or {}).items():
        assert subset(v, getattr(cfg, k)), (k, getattr(cfg, k), v)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").float().eval()
    rot = model.model.rotary_emb
    for kind in ("main", "compress"):
        print(f"  {kind} rope ({rot.rope_type[kind]}): inv_freq {[float(f'{x:.6g}') for x in getattr(rot, kind + '_inv_freq')]}"
              f", attention_scaling {getattr(rot, kind + '_attention_scaling')}")
        assert getattr(rot, kind + "_attention_scaling") == 1.0
    v4_init(model, seed, gain, bias_shift)
    stored = None
    if quant:
        stored = v4_quantize_release(model, seed, quant)
        hub_sd = v4_hub_state_dict(model)
        for k, (q, s) in stored.items():
            hub_sd[k], hub_sd[k[:-len("weight")] + "scale"] = q, s
        deq = v4_release_dequantize(raw_tensors(hub_sd), quant)
        for k, (q, s) in stored.items():  # numpy's e4m3fn / e8m0 decoding against torch's casts
            if q.dtype == torch.float8_e4m3fn:
                full = s.float().repeat_interleave(quant[0], 0).repeat_interleave(quant[1], 1)[:q.shape[0], :q.shape[1]]
                assert torch.equal(deq[k], q.float() * full), k
        missing, unexpected = model.load_state_dict(v4_from_hub_state_dict(deq, cfg), strict=False)
        assert not unexpected and all("rotary_emb" in k for k in missing), (missing, unexpected)
        n8 = sum(q.dtype == torch.float8_e4m3fn for q, _ in stored.values())
        print(f"  quantized: {n8} FP8 projections ({quant[0]}x{quant[1]} ue8m0 blocks), "
              f"{len(stored) - n8} FP4 expert matrices (e8m0 per 32)")
    router_gaps, index_gaps, clamps = v4_guards(model)
    ref, logits = reference(model, cfg.vocab_size, seed, seq_len)
    t = torch.tensor([ref["ids"]])
    for key in clamps:  # the clamps in the reference forward alone
        clamps[key] = 0
    with torch.no_grad():
        assert np.array_equal(model(t).logits[0].float().numpy(), logits)
    ref_clamps = dict(clamps)
    cached = v4_cache_checks(model, ref["ids"], logits)
    # generate()'s greedy tokens (its cache, one decode step at a time) against a full forward per step.
    seq = torch.tensor([ref["greedy_prompt"] + ref["greedy"]])
    with torch.no_grad():
        for i in range(GREEDY_PROMPT, seq.shape[1]):
            assert int(model(seq[:, :i], use_cache=False).logits[0, -1].argmax()) == int(seq[0, i]), i
    print(f"  learned-router top-k gaps: min {min(router_gaps):.2e} over {len(router_gaps)} calls; indexer top-k "
          f"relative gaps: min {min(index_gaps):.2e} over {len(index_gaps)} calls")
    c = ref_clamps
    print(f"  swiglu_limit {cfg.swiglu_limit} binds in the reference forward: routed gate {c['routed_gate']}, up "
          f"{c['routed_up']} of {c['routed_n']}; shared gate {c['shared_gate']}, up {c['shared_up']} of {c['shared_n']}")
    print(f"  greedy: generate() == argmax of a full forward at each of {GREEDY_NEW} steps")
    if min(router_gaps) < 1e-5:
        sys.exit(f"{name}: a routing decision is within {min(router_gaps):.1e} of a tie; change the seed")
    if min(index_gaps) < 1e-5:
        sys.exit(f"{name}: an indexer top-k boundary is within {min(index_gaps):.1e} (rel) of a tie; change the seed")
    assert min(c["routed_gate"], c["routed_up"], c["shared_gate"], c["shared_up"]) > 0, c
    shutil.rmtree(out, ignore_errors=True)
    if hub is None:
        model.to(torch.bfloat16).save_pretrained(out, max_shard_size="1GB", safe_serialization=True,
                                                 save_original_format=False)
        again = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32, attn_implementation="eager").eval()
    else:
        os.makedirs(out)
        shutil.copy(os.path.join(tmp, "config.json"), os.path.join(out, "config.json"))
        shutil.rmtree(tmp)
        sd = v4_hub_state_dict(model)
        for k, (q, s) in (stored or {}).items():
            assert torch.equal(sd[k].float(), deq[k]), k  # the dequantized values are exact in bf16
            sd[k], sd[k[:-len("weight")] + "scale"] = q, s
        save_file(sd, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
        if stored:  # what follows reads the file: numpy's dequantization of its bytes
            sd = v4_release_dequantize(read_safetensors_raw(os.path.join(out, "model.safetensors")), quant)
        # Our own reading of the names back, independent of transformers' conversion mapping ...
        mine = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").float().eval()
        missing, unexpected = mine.load_state_dict(v4_from_hub_state_dict(sd, cfg), strict=False)
        assert not unexpected and all("rotary_emb" in k for k in missing), (missing, unexpected)
        with torch.no_grad():
            assert np.array_equal(mine(t).logits[0].float().numpy(), logits), "hub names read back differ"
        # ... and transformers' (conversion_mapping.py "deepseek_v4" renames + expert merge on load).
        load_kw = {}
        if quant:  # transformers' FP8 quantizer, dequantizing on load (its only mode on CPU)
            from transformers import FineGrainedFP8Config
            load_kw["quantization_config"] = FineGrainedFP8Config(dequantize=True)
        again, info = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32, attn_implementation="eager",
                                                           output_loading_info=True, **load_kw)
        print(f"  transformers loading info: { {k: v for k, v in info.items() if v} }")
        again.eval()
        if quant:  # the same weights as numpy's dequantization, in plain (not FP8) modules
            ours = model.state_dict()
            for k, v in again.state_dict().items():
                assert v.dtype == ours[k].dtype or not v.is_floating_point(), (k, v.dtype)  # tid2eid: int32 there
                assert torch.equal(v.to(ours[k].dtype), ours[k]), k
            assert not any("FP8" in type(m).__name__ for m in again.modules())
    with torch.no_grad():
        back = again(t).logits[0].float().numpy()
    assert np.array_equal(back, logits), f"transformers reads {name} back to other logits: {np.abs(back - logits).max()}"
    for junk in ("generation_config.json",):
        p = os.path.join(out, junk)
        if os.path.exists(p):
            os.remove(p)
    logits.tofile(os.path.join(out, "logits.bin"))
    ref["name"] = name
    ref["transformers"] = transformers.__version__
    ref["torch"] = torch.__version__
    ref["checks"] = {"router_min_gap": min(router_gaps), "indexer_min_rel_gap": min(index_gaps),
                     "swiglu_clamps_reference_forward": ref_clamps,
                     "cached_max_rel_diff": cached}
    if quant:
        ref["checks"]["quantization"] = (
            f"FP8 e4m3fn dense projections, ue8m0 scale per {quant[0]}x{quant[1]} block; FP4 e2m1 routed experts, "
            "ue8m0 scale per 32 along K. Reference = transformers (f32) on the weights numpy dequantizes from "
            "the file's bytes; transformers' own loader (FineGrainedFP8Config(dequantize=True)) gives the same logits")
    with open(os.path.join(out, "reference.json"), "w") as f:
        json.dump(ref, f)
    m = np.array(ref["top2_margin"]) / np.maximum(np.array(ref["max_abs_logit"]), 1e-9)
    size = sum(os.path.getsize(os.path.join(out, x)) for x in os.listdir(out))
    print(f"{name}: {size/1024:.0f} KiB, near-ties (margin < 1e-3 rel) {int((m < 1e-3).sum())}/{len(m)}, "
          f"min rel margin {m.min():.2e}, greedy {ref['greedy'][:8]}...")


def deepseek_v4():
    """The DeepSeek-V4 fixtures (generate.py tiny5 NAME.. or generate.py v4 [NAME..])."""
    assert transformers.__version__.startswith("5."), transformers.__version__
    # transformers' layout and config keys: all three attention kinds (sliding / CSA / HCA), window
    # and compress rates far below the sequence, index_topk below the CSA entries, two hash-routed
    # layers then two learned (sqrtsoftplus + selection bias), 4 mHC streams with the real 20 Sinkhorn
    # iterations, partial RoPE (8 of 32 dims), default rope for both main and compress, clamps that bind.
    build_v4("deepseek_v4_hash_csa", 161, vocab_size=256, hidden_size=48, num_hidden_layers=4,
             layer_types=["sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention",
                          "compressed_sparse_attention"],
             mlp_layer_types=["hash_moe", "hash_moe", "moe", "moe"],
             compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 8},
             num_attention_heads=4, head_dim=32, partial_rotary_factor=0.25, q_lora_rank=32, o_groups=2,
             o_lora_rank=16, index_n_heads=8, index_head_dim=16, index_topk=3, n_routed_experts=8,
             num_experts_per_tok=2, moe_intermediate_size=16, sliding_window=6, scoring_func="sqrtsoftplus",
             routed_scaling_factor=2.5, swiglu_limit=1.5, hc_mult=4, hc_sinkhorn_iters=20,
             rope_parameters={"main": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
                              "compress": {"rope_type": "default", "rope_theta": 160000.0,
                                           "partial_rotary_factor": 0.25}},
             max_position_embeddings=256, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    # softmax scoring. transformers 5.24's config documents `scoring_func` "softmax" but ACT2FN has no
    # such entry, so the router cannot be built; the generator registers it (softmax over the experts, the
    # last dimension) and everything else is transformers' router (top-k of scores + bias, the chosen
    # scores over their sum, times routed_scaling_factor). Hash then learned routing; sliding, CSA, HCA.
    from transformers.activations import ACT2FN
    if "softmax" not in ACT2FN:
        class ExpertSoftmax(torch.nn.Module):
            def forward(self, x):
                return x.softmax(dim=-1)
        ACT2FN["softmax"] = ExpertSoftmax
    build_v4("deepseek_v4_softmax", 191, vocab_size=256, hidden_size=32, num_hidden_layers=3,
             layer_types=["sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention"],
             mlp_layer_types=["hash_moe", "moe", "moe"],
             compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 8},
             num_attention_heads=4, head_dim=32, partial_rotary_factor=0.25, q_lora_rank=32, o_groups=2,
             o_lora_rank=16, index_n_heads=8, index_head_dim=16, index_topk=3, n_routed_experts=8,
             num_experts_per_tok=3, moe_intermediate_size=16, sliding_window=6, scoring_func="softmax",
             routed_scaling_factor=2.0, swiglu_limit=1.5, hc_mult=2, hc_sinkhorn_iters=20,
             rope_parameters={"main": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
                              "compress": {"rope_type": "default", "rope_theta": 160000.0,
                                           "partial_rotary_factor": 0.25}},
             max_position_embeddings=256, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    # As DeepSeek ships V4: the hub's tensor names and config keys -- compress_ratios per layer (+ the
    # MTP layer's trailing 0, as the release lists it) with compress_rate_hca folding 128 down to 8,
    # num_hash_layers, qk_rope_head_dim, YaRN `rope_scaling` (the compress rope only), sigmoid routing
    # (transformers 5.24 has no "softmax" scoring_func: ACT2FN lacks it),
    # 2 mHC streams; HCA first, then CSA, then a sliding-only layer.
    build_v4("deepseek_v4_hub_yarn", 171, hub={
        "architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4", "vocab_size": 256,
        "hidden_size": 64, "moe_intermediate_size": 16, "num_hidden_layers": 3, "num_attention_heads": 4,
        "num_key_value_heads": 1, "head_dim": 32, "qk_rope_head_dim": 16, "q_lora_rank": 32, "o_lora_rank": 16,
        "o_groups": 2, "compress_ratios": [128, 4, 0, 0], "compress_rate_csa": 4, "compress_rate_hca": 8,
        "sliding_window": 8, "rope_theta": 10000, "compress_rope_theta": 160000,
        "rope_scaling": {"type": "yarn", "factor": 4, "original_max_position_embeddings": 64, "beta_fast": 32,
                         "beta_slow": 1},
        "max_position_embeddings": 256, "index_n_heads": 8, "index_head_dim": 16, "index_topk": 2,
        "num_hash_layers": 1, "n_routed_experts": 8, "n_shared_experts": 1, "num_experts_per_tok": 2,
        "norm_topk_prob": True, "routed_scaling_factor": 1.5, "scoring_func": "sigmoid", "topk_method": "noaux_tc",
        "swiglu_limit": 1.5, "hc_mult": 2, "hc_sinkhorn_iters": 20, "hc_eps": 1e-6, "rms_norm_eps": 1e-6,
        "hidden_act": "silu", "num_nextn_predict_layers": 1, "tie_word_embeddings": False, "bos_token_id": 1,
        "eos_token_id": 2, "torch_dtype": "bfloat16"},
        expect={"layer_types": ["heavily_compressed_attention", "compressed_sparse_attention", "sliding_attention"],
                "mlp_layer_types": ["hash_moe", "moe", "moe"],
                "compress_rates": {"compressed_sparse_attention": 4, "heavily_compressed_attention": 8},
                "partial_rotary_factor": 0.5, "qk_rope_head_dim": 16,
                "rope_parameters": {"main": {"rope_type": "default", "rope_theta": 10000, "partial_rotary_factor": 0.5},
                                    "compress": {"rope_type": "yarn", "rope_theta": 160000, "factor": 4,
                                                 "original_max_position_embeddings": 64, "beta_fast": 32,
                                                 "beta_slow": 1, "attention_factor": 1.0,
                                                 "partial_rotary_factor": 0.5}}})
    # As DeepSeek ships V4-Flash, quantized: FP8 e4m3fn dense projections with a ue8m0 (power of two)
    # scale per 128x128 block (`X.scale`), FP4 e2m1 routed experts (int8, two per byte) with a ue8m0
    # scale per 32 along K, the config's quantization_config and top-level expert_dtype (see
    # V4_FP8_DENSE). Blocks: wq_b [256, 32] is two row blocks, the rest one partial block each
    # (transformers' dequantization infers the block from the grid, so ragged multi-block edges, which
    # the release never has, would not load there). hidden and moe_intermediate_size multiples of 32;
    # CSA (hash routing) first, then HCA, then sliding; sqrtsoftplus routing, 4 mHC streams, 8 heads.
    build_v4("deepseek_v4_fp4_release", 181, quant=(128, 128), hub={
        "architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4", "vocab_size": 256,
        "hidden_size": 32, "moe_intermediate_size": 64, "num_hidden_layers": 3, "num_attention_heads": 8,
        "num_key_value_heads": 1, "head_dim": 32, "qk_rope_head_dim": 8, "q_lora_rank": 32, "o_lora_rank": 16,
        "o_groups": 2, "compress_ratios": [4, 128, 0, 0], "compress_rate_csa": 4, "compress_rate_hca": 8,
        "sliding_window": 6, "rope_theta": 10000, "compress_rope_theta": 160000,
        "rope_scaling": {"type": "yarn", "factor": 16, "original_max_position_embeddings": 16, "beta_fast": 32,
                         "beta_slow": 1},
        "max_position_embeddings": 256, "index_n_heads": 8, "index_head_dim": 16, "index_topk": 3,
        "num_hash_layers": 1, "n_routed_experts": 8, "n_shared_experts": 1, "num_experts_per_tok": 2,
        "norm_topk_prob": True, "routed_scaling_factor": 1.5, "scoring_func": "sqrtsoftplus", "topk_method": "noaux_tc",
        "swiglu_limit": 1.5, "hc_mult": 4, "hc_sinkhorn_iters": 20, "hc_eps": 1e-6, "rms_norm_eps": 1e-6,
        "hidden_act": "silu", "num_nextn_predict_layers": 1, "tie_word_embeddings": False, "bos_token_id": 1,
        "eos_token_id": 2, "torch_dtype": "bfloat16", "expert_dtype": "fp4",
        "quantization_config": dict(V4_RELEASE_QUANT)},
        expect={"layer_types": ["compressed_sparse_attention", "heavily_compressed_attention", "sliding_attention"],
                "mlp_layer_types": ["hash_moe", "moe", "moe"],
                "compress_rates": {"compressed_sparse_attention": 4, "heavily_compressed_attention": 8},
                "partial_rotary_factor": 0.25, "qk_rope_head_dim": 8, "hc_mult": 4, "scoring_func": "sqrtsoftplus",
                "quantization_config": dict(V4_RELEASE_QUANT, expert_dtype="fp4"),
                "rope_parameters": {"main": {"rope_type": "default", "rope_theta": 10000},
                                    "compress": {"rope_type": "yarn", "rope_theta": 160000, "factor": 16,
                                                 "original_max_position_embeddings": 16, "attention_factor": 1.0}}})


def dequantize_container(d):
    """A coli container's weights as f32, dequantized by the format's definition (int8: q *
    row scale; int4: (nibble - 8) * scale of its 64-column group, even column in the low
    nibble) -- written here independently of coli's Rust code."""
    from safetensors.torch import load_file
    import glob
    raw = {}
    for f in sorted(glob.glob(os.path.join(d, "*.safetensors"))):
        raw.update(load_file(f))
    out = {}
    for name, t in raw.items():
        if name.endswith("_scale"):
            continue
        s = raw.get(name + "_scale")
        if t.dtype == torch.int8:
            w = t.float() * s.float()[:, :1]
        elif t.dtype == torch.uint8:
            rows, rb = t.shape
            q = torch.empty((rows, 2 * rb), dtype=torch.int32)
            q[:, 0::2] = (t & 15).int()
            q[:, 1::2] = (t >> 4).int()
            cols = min(s.shape[1] * 64, 2 * rb)
            scale = s.float().repeat_interleave(64, dim=1)
            w = (q - 8).float()[:, :cols] * scale[:, :cols]
        else:
            w = t.float()
        out[name] = w.contiguous()
    return out


def container(d, seed):
    """Reference for a coli container: transformers on its dequantized weights."""
    cfg = AutoConfig.from_pretrained(d)
    cfg._attn_implementation = "eager"
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").float().eval()
    sd = dequantize_container(d)
    missing, unexpected = model.load_state_dict(sd, strict=False)
    missing = [m for m in missing if not m.endswith("e_score_correction_bias")]
    assert not missing and not unexpected, (missing, unexpected)
    if cfg.tie_word_embeddings:
        model.tie_weights()
    ref, logits = reference(model, cfg.vocab_size, seed)
    logits.tofile(os.path.join(d, "logits.bin"))
    ref["name"] = os.path.basename(d.rstrip("/"))
    ref["transformers"] = transformers.__version__
    ref["torch"] = torch.__version__
    ref["dequantized_from"] = "coli container (int8 per-row / int4 g64)"
    with open(os.path.join(d, "reference.json"), "w") as f:
        json.dump(ref, f)
    print(ref["name"], "greedy", ref["greedy"][:8])


def demo(model_dir):
    """Reference for the demo model: transformers on coli's imported bf16 weights (f32 compute)."""
    from transformers import AutoTokenizer
    out = os.path.join(ROOT, "demo")
    os.makedirs(out, exist_ok=True)
    model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32, attn_implementation="eager").eval()
    tok = AutoTokenizer.from_pretrained(model_dir)
    prompt = "The capital of France is"
    prompt_ids = tok(prompt, add_special_tokens=False).input_ids
    with torch.no_grad():
        gen = model.generate(torch.tensor([prompt_ids]), max_new_tokens=32, do_sample=False, eos_token_id=None,
                             pad_token_id=2)
        seq = gen[0].tolist()
        logits = model(gen).logits[0].float()
        top2 = torch.topk(logits, 2, dim=-1).values
    ref = {
        "prompt": prompt,
        "prompt_ids": prompt_ids,
        "greedy_ids": seq[len(prompt_ids):],
        "greedy_text": tok.decode(seq[len(prompt_ids):]),
        "tf_ids": seq,
        "tf_pred": logits.argmax(-1).tolist(),
        "top2_margin": (top2[:, 0] - top2[:, 1]).tolist(),
        "transformers": transformers.__version__,
        "torch": torch.__version__,
    }
    # Tokenizer cases: llama.cpp (the GGUF's own tokenizer) is the independent reference.
    from llama_cpp import Llama
    gguf = sys.argv[3] if len(sys.argv) > 3 else None
    cases = ["The capital of France is", "Hello, world! 12345 numbers", "  leading spaces\n\nand\ttabs",
             "<|im_start|>user\nHi<|im_end|>\n", "naïve café — ünïcödé 😀", "def f(x):\n    return x**2"]
    if gguf:
        llm = Llama(model_path=gguf, vocab_only=True, verbose=False)
        ref["tokenizer_cases"] = [{"text": t, "ids": llm.tokenize(t.encode(), add_bos=False, special=True)} for t in cases]
        for c in ref["tokenizer_cases"]:
            hf = tok(c["text"], add_special_tokens=False).input_ids
            print("tokenizer", repr(c["text"]), "llama.cpp == hf(coli tokenizer.json):", hf == c["ids"])
        # The conversion itself, against transformers' own GGUF loader (dequantize + Q/K unpermute).
        ref_model = AutoModelForCausalLM.from_pretrained(os.path.dirname(gguf), gguf_file=os.path.basename(gguf),
                                                         torch_dtype=torch.float32)
        ours = model.state_dict()
        worst = 0.0
        for k, v in ref_model.state_dict().items():
            if k in ours:
                d = (ours[k].float() - v.float().to(torch.bfloat16).float()).abs().max().item()
                worst = max(worst, d)
        ref["max_weight_diff_vs_transformers_gguf_loader"] = worst
        print("max |coli weight - bf16(transformers gguf weight)|:", worst)
    with open(os.path.join(out, "reference.json"), "w") as f:
        json.dump(ref, f)
    print("demo greedy:", repr(ref["greedy_text"]))


if __name__ == "__main__":
    if sys.argv[1] == "tiny":
        tiny()
    elif sys.argv[1] == "tiny5":
        tiny5()
    elif sys.argv[1] == "v4":
        deepseek_v4()
    elif sys.argv[1] == "container":
        container(sys.argv[2], int(sys.argv[3]))
    elif sys.argv[1] == "demo":
        demo(sys.argv[2])
