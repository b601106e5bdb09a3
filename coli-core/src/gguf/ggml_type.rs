//! The ggml tensor types: ids, block shapes, names.

/// The ggml tensor types coli reads: every type the common quantizations mix.
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GgmlType {
    /// f32.
    F32,
    /// f16.
    F16,
    /// bf16.
    BF16,
    /// 32 weights: f16 scale, 4-bit values offset by 8.
    Q4_0,
    /// 32 weights: f16 scale and minimum, 4-bit values.
    Q4_1,
    /// 32 weights: f16 scale, 5-bit values offset by 16.
    Q5_0,
    /// 32 weights: f16 scale and minimum, 5-bit values.
    Q5_1,
    /// 32 weights: f16 scale, 8-bit signed values.
    Q8_0,
    /// 256 weights: 2-bit values, 4-bit sub-block scales and minimums.
    Q2_K,
    /// 256 weights: 3-bit values, 6-bit signed sub-block scales.
    Q3_K,
    /// 256 weights: 4-bit values, 6-bit sub-block scales and minimums.
    Q4_K,
    /// 256 weights: 5-bit values, 6-bit sub-block scales and minimums.
    Q5_K,
    /// 256 weights: 6-bit values, 8-bit signed sub-block scales.
    Q6_K,
    /// 256 weights: 2.06 bits each, E8-lattice grid of 256.
    IQ2_XXS,
    /// 256 weights: 2.31 bits each, grid of 512.
    IQ2_XS,
    /// 256 weights: 2.5 bits each, grid of 1024, explicit signs.
    IQ2_S,
    /// 256 weights: 3.06 bits each, grid of 256 of 4 values.
    IQ3_XXS,
    /// 256 weights: 3.44 bits each, grid of 512 of 4 values.
    IQ3_S,
    /// 256 weights: 1.56 bits each, ternary grid of 2048.
    IQ1_S,
    /// 256 weights: 1.75 bits each, ternary grid of 2048.
    IQ1_M,
    /// 32 weights: f16 scale, 4-bit indices into a non-linear table.
    IQ4_NL,
    /// 256 weights: IQ4_NL's table with 6-bit sub-block scales.
    IQ4_XS,
    /// 32 weights: E8M0 scale, `e2m1` values (OCP MX FP4).
    MXFP4,
}

impl GgmlType {
    /// Every type, in ggml's id order.
    pub const ALL: [GgmlType; 23] = [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q8_0,
        GgmlType::Q2_K,
        GgmlType::Q3_K,
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
        GgmlType::IQ2_XXS,
        GgmlType::IQ2_XS,
        GgmlType::IQ3_XXS,
        GgmlType::IQ1_S,
        GgmlType::IQ4_NL,
        GgmlType::IQ3_S,
        GgmlType::IQ2_S,
        GgmlType::IQ4_XS,
        GgmlType::IQ1_M,
        GgmlType::BF16,
        GgmlType::MXFP4,
    ];

    /// ggml's numeric id (`GGMLQuantizationType`).
    pub fn id(self) -> u32 {
        match self {
            GgmlType::F32 => 0,
            GgmlType::F16 => 1,
            GgmlType::Q4_0 => 2,
            GgmlType::Q4_1 => 3,
            GgmlType::Q5_0 => 6,
            GgmlType::Q5_1 => 7,
            GgmlType::Q8_0 => 8,
            GgmlType::Q2_K => 10,
            GgmlType::Q3_K => 11,
            GgmlType::Q4_K => 12,
            GgmlType::Q5_K => 13,
            GgmlType::Q6_K => 14,
            GgmlType::IQ2_XXS => 16,
            GgmlType::IQ2_XS => 17,
            GgmlType::IQ3_XXS => 18,
            GgmlType::IQ1_S => 19,
            GgmlType::IQ4_NL => 20,
            GgmlType::IQ3_S => 21,
            GgmlType::IQ2_S => 22,
            GgmlType::IQ4_XS => 23,
            GgmlType::IQ1_M => 29,
            GgmlType::BF16 => 30,
            GgmlType::MXFP4 => 39,
        }
    }

    /// The type of ggml id `id`, if coli reads it.
    pub fn from_id(id: u32) -> Option<GgmlType> {
        GgmlType::ALL.into_iter().find(|t| t.id() == id)
    }

    /// ggml's name (`Q4_K`), which is also the dtype name coli gives GGUF tensors.
    pub fn name(self) -> &'static str {
        match self {
            GgmlType::F32 => "F32",
            GgmlType::F16 => "F16",
            GgmlType::BF16 => "BF16",
            GgmlType::Q4_0 => "Q4_0",
            GgmlType::Q4_1 => "Q4_1",
            GgmlType::Q5_0 => "Q5_0",
            GgmlType::Q5_1 => "Q5_1",
            GgmlType::Q8_0 => "Q8_0",
            GgmlType::Q2_K => "Q2_K",
            GgmlType::Q3_K => "Q3_K",
            GgmlType::Q4_K => "Q4_K",
            GgmlType::Q5_K => "Q5_K",
            GgmlType::Q6_K => "Q6_K",
            GgmlType::IQ2_XXS => "IQ2_XXS",
            GgmlType::IQ2_XS => "IQ2_XS",
            GgmlType::IQ2_S => "IQ2_S",
            GgmlType::IQ3_XXS => "IQ3_XXS",
            GgmlType::IQ3_S => "IQ3_S",
            GgmlType::IQ1_S => "IQ1_S",
            GgmlType::IQ1_M => "IQ1_M",
            GgmlType::IQ4_NL => "IQ4_NL",
            GgmlType::IQ4_XS => "IQ4_XS",
            GgmlType::MXFP4 => "MXFP4",
        }
    }

    /// The type named `name` ([`GgmlType::name`]).
    pub fn from_name(name: &str) -> Option<GgmlType> {
        GgmlType::ALL.into_iter().find(|t| t.name() == name)
    }

    /// Whether values come in blocks of several (every type but F32, F16, BF16).
    pub fn is_quantized(self) -> bool {
        self.block().0 > 1
    }

    /// (elements per block, bytes per block).
    pub fn block(self) -> (usize, usize) {
        match self {
            GgmlType::F32 => (1, 4),
            GgmlType::F16 | GgmlType::BF16 => (1, 2),
            GgmlType::Q4_0 | GgmlType::IQ4_NL => (32, 18),
            GgmlType::Q4_1 => (32, 20),
            GgmlType::Q5_0 => (32, 22),
            GgmlType::Q5_1 => (32, 24),
            GgmlType::Q8_0 => (32, 34),
            GgmlType::MXFP4 => (32, 17),
            GgmlType::Q2_K => (256, 84),
            GgmlType::Q3_K => (256, 110),
            GgmlType::Q4_K => (256, 144),
            GgmlType::Q5_K => (256, 176),
            GgmlType::Q6_K => (256, 210),
            GgmlType::IQ2_XXS => (256, 66),
            GgmlType::IQ2_XS => (256, 74),
            GgmlType::IQ2_S => (256, 82),
            GgmlType::IQ3_XXS => (256, 98),
            GgmlType::IQ3_S => (256, 110),
            GgmlType::IQ1_S => (256, 50),
            GgmlType::IQ1_M => (256, 56),
            GgmlType::IQ4_XS => (256, 136),
        }
    }

    /// Bytes of a row of `cols` elements (`cols` a multiple of the block size).
    pub fn row_bytes(self, cols: usize) -> usize {
        let (bs, bb) = self.block();
        cols / bs * bb
    }
}
