//! Every weight matrix of a model with its role: what conversion and placement walk.

use super::{DeltaInput, Ffn, KvUp, Mixer, MlaQuery, Transformer};
use crate::weights::Linear;

/// What a weight matrix is for (conversion and placement treat them differently).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinearRole {
    /// Token embeddings.
    Embedding,
    /// The output head.
    Head,
    /// A router or a shared-expert gate (kept at source precision: routing must not move).
    Router,
    /// Attention, dense MLP, shared experts, DSA indexer.
    Dense,
    /// A routed expert's matrix.
    Expert {
        /// Decoder layer.
        layer: usize,
        /// Expert index.
        expert: usize,
    },
}

impl Transformer {
    /// Every weight matrix with its role, in a fixed order.
    pub fn linears_mut(&mut self) -> Vec<(LinearRole, &mut Linear)> {
        use LinearRole::*;
        let mut v: Vec<(LinearRole, &mut Linear)> = vec![
            (Embedding, &mut self.embed_tokens),
            (Head, &mut self.lm_head),
        ];
        for (li, l) in self.layers.iter_mut().enumerate() {
            match &mut l.attn {
                Mixer::Gqa(a) => v.extend(
                    [&mut a.q_proj, &mut a.k_proj, &mut a.v_proj, &mut a.o_proj]
                        .map(|x| (Dense, x)),
                ),
                Mixer::DeltaNet(d) => {
                    match &mut d.input {
                        DeltaInput::Grouped { qkvz, ba } => v.extend([(Dense, qkvz), (Dense, ba)]),
                        DeltaInput::Split { qkv, z, b, a } => {
                            v.extend([qkv, z, b, a].map(|x| (Dense, x)))
                        }
                        DeltaInput::SplitGroupedBa { qkv, z, ba } => {
                            v.extend([qkv, z, ba].map(|x| (Dense, x)))
                        }
                    }
                    v.push((Dense, &mut d.out_proj));
                }
                Mixer::Compressed(c) => {
                    v.extend([&mut c.q_a, &mut c.q_b, &mut c.kv].map(|x| (Dense, x)));
                    v.extend(c.o_a.iter_mut().map(|x| (Dense, x)));
                    v.push((Dense, &mut c.o_b));
                    if let Some(comp) = &mut c.compressor {
                        v.extend([&mut comp.kv, &mut comp.gate].map(|x| (Dense, x)));
                    }
                    if let Some(ix) = &mut c.indexer {
                        let comp = &mut ix.compressor;
                        v.extend(
                            [&mut ix.q_b, &mut ix.weights, &mut comp.kv, &mut comp.gate]
                                .map(|x| (Dense, x)),
                        );
                    }
                }
                Mixer::Mla(m) => {
                    match &mut m.q {
                        MlaQuery::Direct(q) => v.push((Dense, q)),
                        MlaQuery::LowRank { a, b, .. } => v.extend([(Dense, a), (Dense, b)]),
                    }
                    match &mut m.kv_b {
                        KvUp::Fused(kv_b) => v.push((Dense, kv_b)),
                        KvUp::Split { k, v: vb } => v.extend([(Dense, k), (Dense, vb)]),
                    }
                    v.extend([&mut m.kv_a, &mut m.o_proj].map(|x| (Dense, x)));
                    if let Some(ind) = m.dsa.as_mut().and_then(|d| d.indexer.as_mut()) {
                        v.extend(
                            [&mut ind.wq_b, &mut ind.wk, &mut ind.weights_proj].map(|x| (Dense, x)),
                        );
                    }
                }
            }
            // The hyper-connections' maps decide how streams mix: kept as stored, like a
            // router.
            if let Some(hc) = &mut l.hc {
                v.extend(hc.iter_mut().map(|c| (Router, &mut c.map)));
            }
            match &mut l.ffn {
                Ffn::Dense(m) => v.extend(
                    [&mut m.gate_proj, &mut m.up_proj, &mut m.down_proj].map(|x| (Dense, x)),
                ),
                Ffn::Moe(moe) => {
                    v.push((Router, &mut moe.router));
                    if let Some(sh) = &mut moe.shared {
                        let m = &mut sh.mlp;
                        v.extend(
                            [&mut m.gate_proj, &mut m.up_proj, &mut m.down_proj]
                                .map(|x| (Dense, x)),
                        );
                        if let Some(g) = &mut sh.gate {
                            v.push((Router, g));
                        }
                    }
                    for (e, m) in moe.experts.iter_mut().enumerate() {
                        let role = Expert {
                            layer: li,
                            expert: e,
                        };
                        v.extend(m.linears_mut().into_iter().map(|x| (role, x)));
                    }
                }
            }
        }
        if let Some(hy) = &mut self.hyper {
            v.push((Router, &mut hy.head.map));
        }
        v
    }

    /// Copies the dense weights into resident anonymous memory (huge pages where granted).
    /// Same bytes, same results; only the memory they are read from changes. Routed experts
    /// stay where they are: placing them is the expert store's job, not a blanket copy.
    /// So does an embedding table the head does not share ([`Transformer::embedding_stays_mapped`]).
    pub fn make_resident(&mut self) -> crate::error::Result<()> {
        self.copy_resident(false)
    }

    /// Whether the embedding table stays in the shard mapping when the dense weights are
    /// made resident: it is read one row per token, so a copy would cost its whole size in
    /// RAM and load time and speed nothing up (rows are read with `pread`:
    /// [`Linear::embed_row`]). It is copied when the head reads the same bytes (tied
    /// weights, streamed whole every token), when it is stored input-major (a copy is where
    /// it gets transposed) or when it has block scales.
    pub fn embedding_stays_mapped(&self) -> bool {
        !self.embed_tokens.is_transposed()
            && self.embed_tokens.scale_view().is_none()
            && !self.embedding_is_head()
    }

    /// Whether the head reads the embedding table's bytes (tied weights).
    fn embedding_is_head(&self) -> bool {
        let (e, h) = (self.embed_tokens.view(), self.lm_head.view());
        e.file == h.file && e.file_range() == h.file_range()
    }

    /// Bytes of the embedding table when the head does not read them (an untied table,
    /// of which a token reads one row); 0 when the head is the same tensor.
    pub fn untied_embedding_bytes(&self) -> u64 {
        if self.embedding_is_head() {
            0
        } else {
            let r = self.embed_tokens.view().file_range();
            r.end - r.start
        }
    }

    /// Copies the routed experts (`experts`) or every other matrix into resident memory.
    pub(crate) fn copy_resident(&mut self, experts: bool) -> crate::error::Result<()> {
        let embedding_mapped = self.embedding_stays_mapped();
        let mut linears: Vec<&mut Linear> = self
            .linears_mut()
            .into_iter()
            .filter(|(r, _)| match r {
                LinearRole::Expert { .. } => experts,
                LinearRole::Embedding => !experts && !embedding_mapped,
                _ => !experts,
            })
            .map(|(_, l)| l)
            .collect();
        // The matrices, then the scales left where they lie (DeepSeek-V4's FP4 experts).
        let mut views: Vec<coli_core::TensorView> =
            linears.iter().map(|l| l.view().clone()).collect();
        let scaled: Vec<usize> = (0..linears.len())
            .filter(|&i| linears[i].scale_view().is_some())
            .collect();
        views.extend(
            scaled
                .iter()
                .filter_map(|&i| linears[i].scale_view().cloned()),
        );
        let mut resident = coli_core::make_resident(&views.iter().collect::<Vec<_>>())?;
        let scales = resident.split_off(linears.len());
        for (l, v) in linears.iter_mut().zip(resident) {
            l.set_resident_view(v)?;
        }
        for (&i, v) in scaled.iter().zip(scales) {
            linears[i].set_scale_view(v);
            linears[i].check_scales()?;
        }
        Ok(())
    }
}
