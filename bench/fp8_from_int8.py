"""An FP8 twin of a coli int8 container (issue 13's "native FP8 decode within 20% of int8").

usage: python fp8_from_int8.py SRC_INT8_DIR OUT_DIR

Every int8 matrix (`I8` + `{name}_scale`) is dequantized and stored again as FP8 e4m3 with
128 x 128 block scales (`{name}_scale_inv`, DeepSeek-V3's layout, `amax / 448` per block),
everything else copied as is; config.json gains DeepSeek's `quantization_config`. Same
geometry and the same number of expert bytes as the int8 container, so the two decode
speeds compare the kernels. Needs torch (for float8_e4m3fn) and numpy.
"""
import json
import os
import struct
import sys

import numpy as np
import torch

BLOCK = 128


def read_header(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return json.loads(f.read(n)), 8 + n


def to_fp8(w):
    """w: float32 [rows, cols] -> (e4m3 bytes [rows, cols], f32 scales [ceil r/128, ceil c/128])."""
    rows, cols = w.shape
    br, bc = -(-rows // BLOCK), -(-cols // BLOCK)
    t = torch.from_numpy(w)
    pad = torch.zeros(br * BLOCK, bc * BLOCK)
    pad[:rows, :cols] = t
    blocks = pad.view(br, BLOCK, bc, BLOCK)
    amax = blocks.abs().amax(dim=(1, 3))
    scale = torch.where(amax > 0, amax / 448.0, torch.ones_like(amax))
    q = (blocks / scale[:, None, :, None]).clamp(-448, 448).to(torch.float8_e4m3fn)
    q = q.view(br * BLOCK, bc * BLOCK)[:rows, :cols].contiguous()
    return q.view(torch.uint8).numpy().tobytes(), scale.numpy().astype("<f4")


def main():
    src, out = sys.argv[1], sys.argv[2]
    os.makedirs(out)
    shards = sorted(f for f in os.listdir(src) if f.endswith(".safetensors"))
    weight_map = {}
    total = 0
    for shard in shards:
        header, base = read_header(os.path.join(src, shard))
        data = np.memmap(os.path.join(src, shard), dtype=np.uint8, mode="r")
        tensors = []  # (name, dtype, shape, bytes)
        names = [k for k in header if k != "__metadata__"]
        for name in names:
            meta = header[name]
            if name.endswith("_scale") and name[: -len("_scale")] in header:
                continue
            lo, hi = meta["data_offsets"]
            raw = data[base + lo : base + hi]
            if meta["dtype"] == "I8" and name + "_scale" in header:
                s = header[name + "_scale"]
                slo, shi = s["data_offsets"]
                scale = np.frombuffer(bytes(data[base + slo : base + shi]), "<f4")
                q = np.frombuffer(bytes(raw), np.int8).reshape(meta["shape"])
                w = q.astype(np.float32) * scale.reshape(-1, 1)
                fp8, inv = to_fp8(w)
                tensors.append((name, "F8_E4M3", meta["shape"], fp8))
                tensors.append((name + "_scale_inv", "F32", list(inv.shape), inv.tobytes()))
            else:
                tensors.append((name, meta["dtype"], meta["shape"], bytes(raw)))
        hdr = {"__metadata__": {"format": "pt"}}
        off = 0
        for name, dtype, shape, b in tensors:
            hdr[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + len(b)]}
            off += len(b)
            weight_map[name] = shard
        hb = json.dumps(hdr).encode()
        hb += b" " * (-len(hb) % 8)
        tmp = os.path.join(out, shard + ".partial")
        with open(tmp, "wb") as f:
            f.write(struct.pack("<Q", len(hb)))
            f.write(hb)
            for _, _, _, b in tensors:
                f.write(b)
        os.rename(tmp, os.path.join(out, shard))
        total += off
        print(f"{shard}: {len(tensors)} tensors", flush=True)
    with open(os.path.join(src, "config.json")) as f:
        cfg = json.load(f)
    cfg["quantization_config"] = {
        "activation_scheme": "dynamic",
        "fmt": "e4m3",
        "quant_method": "fp8",
        "weight_block_size": [BLOCK, BLOCK],
    }
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
    for extra in os.listdir(src):
        if extra.startswith("tokenizer") or extra in ("generation_config.json", "special_tokens_map.json"):
            with open(os.path.join(src, extra), "rb") as a, open(os.path.join(out, extra), "wb") as b:
                b.write(a.read())


if __name__ == "__main__":
    main()
