//! Placing a loaded model's routed experts: where their bytes are, how many there are,
//! and building the expert store (or copying them into RAM) from a [`Placement`].

use std::path::Path;

use super::{Expert, Ffn, Transformer};
use crate::error::Result;
use crate::experts::{
    available_memory, ExpertLocation, ExpertStore, MatrixLocation, Placement, ScaleKind,
    ScaleLocation, StoreConfig,
};
use crate::weights::Linear;

/// Shape of a model's routed experts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExpertCensus {
    /// Layers with routed experts.
    pub moe_layers: usize,
    /// Most experts in one layer.
    pub experts_per_layer: usize,
    /// Bytes of the largest expert (its three matrices).
    pub expert_bytes: u64,
    /// Bytes of all routed experts.
    pub total_bytes: u64,
}

fn matrix_location(l: &Linear) -> MatrixLocation {
    let v = l.view();
    let r = v.file_range();
    // Scales left where they lie are read with the matrix; others are resident.
    let streamed_scales = l.scale_view().map(|s| {
        let r = s.file_range();
        let block = l.scales().map_or((1, 1), |x| (x.block_rows, x.block_cols));
        let kind = l
            .scales()
            .and_then(|x| x.values.streamed_kind())
            .unwrap_or(ScaleKind::E8M0);
        ScaleLocation {
            path: s.file.clone(),
            offset: r.start,
            len: (r.end - r.start) as usize,
            kind,
            block_rows: block.0,
            block_cols: block.1,
        }
    });
    MatrixLocation {
        path: v.file.clone(),
        offset: r.start,
        len: (r.end - r.start) as usize,
        fmt: l.format(),
        rows: l.rows,
        cols: l.cols,
        scales: l.scales().filter(|_| streamed_scales.is_none()).cloned(),
        streamed_scales,
        transposed: l.is_transposed(),
    }
}

/// Bytes of a routed expert's matrix as the store reads it: its data and its streamed
/// scales.
fn streamed_bytes(l: &Linear) -> u64 {
    (l.view().bytes().len() + l.scale_view().map_or(0, |s| s.bytes().len())) as u64
}

fn expert_location(m: &Expert) -> ExpertLocation {
    ExpertLocation {
        parts: m.linears().into_iter().map(matrix_location).collect(),
    }
}

impl Transformer {
    /// Counts the routed experts and their bytes.
    pub fn expert_census(&self) -> ExpertCensus {
        let mut c = ExpertCensus {
            moe_layers: 0,
            experts_per_layer: 0,
            expert_bytes: 0,
            total_bytes: 0,
        };
        for l in &self.layers {
            if let Ffn::Moe(moe) = &l.ffn {
                c.moe_layers += 1;
                c.experts_per_layer = c.experts_per_layer.max(moe.experts.len());
                for m in &moe.experts {
                    let b: u64 = m.linears().iter().map(|l| streamed_bytes(l)).sum();
                    c.expert_bytes = c.expert_bytes.max(b);
                    c.total_bytes += b;
                }
            }
        }
        c
    }

    /// Per decoder layer, where its routed experts' bytes are (empty for dense layers).
    pub fn expert_locations(&self) -> Vec<Vec<ExpertLocation>> {
        self.layers
            .iter()
            .map(|l| match &l.ffn {
                Ffn::Moe(moe) => moe.experts.iter().map(expert_location).collect(),
                Ffn::Dense(_) => Vec::new(),
            })
            .collect()
    }

    /// Copies every routed expert into resident memory (no store, no streaming).
    pub fn make_experts_resident(&mut self) -> Result<()> {
        self.copy_resident(true)
    }

    /// Applies a placement: builds the expert store (or makes experts resident for
    /// [`crate::experts::CacheSize::Off`]); `dir` holds the usage history for pinning.
    /// Dense models are left alone.
    pub fn place_experts(&mut self, dir: &Path, p: &Placement) -> Result<()> {
        let census = self.expert_census();
        if census.moe_layers == 0 {
            return Ok(());
        }
        let Some(cap) = p.cap_per_layer(
            census.moe_layers,
            census.experts_per_layer,
            census.expert_bytes,
            available_memory(),
        ) else {
            return self.make_experts_resident();
        };
        let mut cfg = StoreConfig {
            cap,
            direct: p.reads_direct(cap, census.experts_per_layer),
            prefetch: p.prefetch,
            pinned: self.hottest_experts(dir, p.pin_bytes, census.expert_bytes),
        };
        self.store = None;
        let locations = self.expert_locations();
        let store = match ExpertStore::new(&locations, &cfg) {
            // O_DIRECT chosen by default, not asked for: a filesystem that refuses it
            // gets buffered reads instead of an error.
            Err(_) if cfg.direct && !p.direct => {
                cfg.direct = false;
                ExpertStore::new(&locations, &cfg)?
            }
            r => r?,
        };
        self.store = Some(store);
        Ok(())
    }

    /// The historically hottest experts filling `pin_bytes` (none when 0).
    fn hottest_experts(&self, dir: &Path, pin_bytes: u64, bytes: u64) -> Vec<(usize, usize)> {
        if pin_bytes == 0 {
            return Vec::new();
        }
        let history = crate::experts::usage::read(dir);
        crate::experts::usage::hottest(&history, pin_bytes, |_| bytes)
            .into_iter()
            .filter(|&(l, e)| {
                matches!(self.layers.get(l).map(|x| &x.ffn), Some(Ffn::Moe(m)) if e < m.experts.len())
            })
            .collect()
    }
}
