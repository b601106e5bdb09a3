import sys, numpy as np, gguf
from gguf import GGUFReader, GGUFWriter, GGMLQuantizationType
src, dst = sys.argv[1], sys.argv[2]
r = GGUFReader(src)
arch = r.fields["general.architecture"].contents()
w = GGUFWriter(dst, arch)
for name, f in r.fields.items():
    if name.startswith("GGUF.") or name == "general.architecture" or name == "general.file_type":
        continue
    vt = f.types[0]
    if vt == gguf.GGUFValueType.ARRAY:
        w.add_array(name, f.contents())
    elif vt == gguf.GGUFValueType.STRING:
        w.add_string(name, f.contents())
    else:
        w.add_key_value(name, f.contents(), vt)
w.add_file_type(32)  # MOSTLY_BF16
for t in r.tensors:
    data = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
    shape = list(reversed([int(x) for x in t.shape]))
    data = data.reshape(shape)
    if t.tensor_type == GGMLQuantizationType.F32 and data.ndim == 1:
        w.add_tensor(t.name, data)
    else:
        q = gguf.quants.quantize(data, GGMLQuantizationType.BF16)
        w.add_tensor(t.name, q, raw_shape=q.shape, raw_dtype=GGMLQuantizationType.BF16)
w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
print("ok")
