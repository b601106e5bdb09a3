"""Reference dequantizations for coli's ggml block decoders, from gguf-py.

For every ggml type coli reads, writes tests/fixtures/gguf_quants/TYPE.bin:
  u32 n_blocks, the blocks' bytes, then gguf.quants.dequantize's f32 values (LE).
Blocks are random bytes whose f16 scales are set to finite values of both signs (every
other bit pattern of a block is a valid block), plus, where gguf-py can quantize the type,
blocks it quantized from random weights. Run: python oracle/gguf_quants.py
"""
import pathlib
import struct

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import quants
from gguf.constants import GGML_QUANT_SIZES

OUT = pathlib.Path(__file__).resolve().parent.parent / "tests/fixtures/gguf_quants"

# Byte offsets of each type's f16 scales within a block.
F16_AT = {
    "Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "Q8_0": [0],
    "Q2_K": [80, 82], "Q3_K": [108], "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208],
    "IQ2_XXS": [0], "IQ2_XS": [0], "IQ2_S": [0], "IQ3_XXS": [0], "IQ3_S": [0],
    "IQ1_S": [0], "IQ4_NL": [0], "IQ4_XS": [0], "IQ1_M": [], "MXFP4": [],
}
QUANTIZABLE = {"Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "MXFP4"}


def random_f16(rng, n):
    mag = np.exp(rng.uniform(np.log(1e-4), np.log(2.0), n))
    return (mag * rng.choice([-1.0, 1.0], n)).astype(np.float16)


def random_blocks(name, rng, n):
    bs, bb = GGML_QUANT_SIZES[T[name]]
    blocks = rng.integers(0, 256, (n, bb), dtype=np.uint8)
    for off in F16_AT[name]:
        blocks[:, off:off + 2] = random_f16(rng, n).view(np.uint8).reshape(n, 2)
    if name == "IQ1_M":
        # The block's f16 scale is the top nibbles of the four u16 scale words.
        d = random_f16(rng, n).view(np.uint16)
        words = blocks[:, 48:56].copy().view(np.uint16).reshape(n, 4) & np.uint16(0x0FFF)
        for k, shift in enumerate([12, 8, 4, 0]):
            words[:, k] |= ((d >> np.uint16(shift)) & np.uint16(0xF)) << np.uint16(12)
        blocks[:, 48:56] = words.view(np.uint8).reshape(n, 8)
    if name == "MXFP4":
        blocks[:, 0] = rng.integers(100, 150, n, dtype=np.uint8)
        blocks[:5, 0] = [0, 1, 2, 254, 255][: min(5, n)]
    return blocks


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(20261206)
    for name in F16_AT:
        bs, bb = GGML_QUANT_SIZES[T[name]]
        n = 6 if bs == 256 else 48
        blocks = random_blocks(name, rng, n)
        if name in QUANTIZABLE:
            w = rng.standard_normal((8, bs)).astype(np.float32) * 0.05
            blocks = np.concatenate([blocks, quants.quantize(w, T[name]).reshape(8, bb)])
        values = quants.dequantize(blocks.reshape(-1), T[name]).astype(np.float32)
        assert values.size == blocks.shape[0] * bs
        data = struct.pack("<I", blocks.shape[0]) + blocks.tobytes() + values.astype("<f4").tobytes()
        (OUT / f"{name}.bin").write_bytes(data)
        print(name, blocks.shape[0], "blocks")


if __name__ == "__main__":
    main()
