//! Every ggml block type decodes bit for bit as gguf-py's `gguf.quants.dequantize` does
//! (`oracle/gguf_quants.py` recorded its values for random blocks and, where gguf-py
//! quantizes the type, for its quantizer's blocks).

use std::path::Path;

use coli_core::gguf::{dequantize, GgmlType};

fn fixture(ty: GgmlType) -> (Vec<u8>, Vec<f32>) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/gguf_quants")
        .join(format!("{}.bin", ty.name()));
    let data = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let n = u32::from_le_bytes(data[..4].try_into().unwrap()) as usize;
    let (bs, bb) = ty.block();
    let blocks = data[4..4 + n * bb].to_vec();
    let values = data[4 + n * bb..]
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect::<Vec<_>>();
    assert_eq!(values.len(), n * bs, "{}", path.display());
    (blocks, values)
}

#[test]
fn every_block_type_dequantizes_as_gguf_py_does() {
    let mut checked = 0;
    for ty in GgmlType::ALL.into_iter().filter(|t| t.is_quantized()) {
        let (blocks, want) = fixture(ty);
        let mut got = vec![0.0f32; want.len()];
        dequantize(ty, &blocks, &mut got).unwrap();
        let bs = ty.block().0;
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(
                g.to_bits(),
                w.to_bits(),
                "{ty:?} block {} element {}: coli {g:e}, gguf-py {w:e}",
                i / bs,
                i % bs
            );
        }
        checked += 1;
    }
    assert_eq!(checked, 20, "every quantized type has its fixture");
}

#[test]
fn ids_and_sizes_are_ggmls() {
    // ggml's GGML_QUANT_SIZES and type ids (gguf-py constants.py).
    let want = [
        ("Q4_0", 2, 32, 18),
        ("Q5_1", 7, 32, 24),
        ("Q2_K", 10, 256, 84),
        ("Q3_K", 11, 256, 110),
        ("Q6_K", 14, 256, 210),
        ("IQ2_XXS", 16, 256, 66),
        ("IQ1_S", 19, 256, 50),
        ("IQ3_S", 21, 256, 110),
        ("IQ2_S", 22, 256, 82),
        ("IQ4_XS", 23, 256, 136),
        ("IQ1_M", 29, 256, 56),
        ("MXFP4", 39, 32, 17),
    ];
    for (name, id, bs, bb) in want {
        let t = GgmlType::from_name(name).unwrap();
        assert_eq!((t.id(), t.block()), (id, (bs, bb)), "{name}");
        assert_eq!(GgmlType::from_id(id), Some(t));
    }
}
