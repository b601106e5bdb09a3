//! Where each expert's bytes are on disk, and reading them: one `pread` per expert when
//! its three matrices are adjacent, else one per matrix; `O_DIRECT` reads are aligned.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use coli_kernels::WFormat;

use super::buffers::{BufPool, ExpertBuf};
use super::config::Counters;
use super::store::ALIGN;
use crate::error::{ModelError, Result};
use crate::weights::Scales;

/// Two parts closer than this (bytes of other data between them) are read together.
const COALESCE_SLACK: u64 = 64 * 1024;

/// Where one matrix of an expert is: the file, the byte range, and how to read it.
#[derive(Clone, Debug)]
pub struct MatrixLocation {
    /// The shard holding it.
    pub path: PathBuf,
    /// Byte offset of its data in the file.
    pub offset: u64,
    /// Bytes of data.
    pub len: usize,
    /// Stored format.
    pub fmt: WFormat,
    /// Rows.
    pub rows: usize,
    /// Columns.
    pub cols: usize,
    /// Block or row scales (resident), where the format has them.
    pub scales: Option<Scales>,
    /// Block scales read with the matrix instead (DeepSeek-V4's FP4 experts' E8M0, coli
    /// int4 containers' f32 group scales).
    pub streamed_scales: Option<ScaleLocation>,
    /// Stored input-major (`[cols, rows]`, gpt-oss' unquantized experts): transposed
    /// after each read, so the cached copy is the `[rows, cols]` matrix the kernels take.
    pub transposed: bool,
}

/// How streamed scales are stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScaleKind {
    /// One E8M0 byte per block (checked for NaN, 255, when read).
    E8M0,
    /// One little-endian f32 per block, at a 4-byte-aligned file offset (checked finite
    /// when read).
    F32,
}

/// Where a matrix's streamed scales are: in the same shard or another, one per block of
/// `block_rows x block_cols`.
#[derive(Clone, Debug)]
pub struct ScaleLocation {
    /// The shard holding them.
    pub path: PathBuf,
    /// Byte offset of their data in the file.
    pub offset: u64,
    /// Bytes.
    pub len: usize,
    /// How they are stored.
    pub kind: ScaleKind,
    /// Rows per block.
    pub block_rows: usize,
    /// Columns per block.
    pub block_cols: usize,
}

/// Most matrices an expert has (SwiGLU: gate, up, down; gpt-oss: gate_up, down).
pub const MAX_MATRICES: usize = 3;

/// Most byte ranges an expert is read from: its matrices and their streamed scales.
pub const MAX_PARTS: usize = 2 * MAX_MATRICES;

/// Where an expert's matrices are, in the order its forward takes them (at most
/// `MAX_MATRICES`).
#[derive(Clone, Debug)]
pub struct ExpertLocation {
    /// SwiGLU: gate, up, down; gpt-oss: gate_up, down.
    pub parts: Vec<MatrixLocation>,
}

/// One matrix of an expert on disk (the file as an index into the store's files).
#[derive(Clone, Debug)]
pub(crate) struct Part {
    pub(crate) file: usize,
    pub(crate) offset: u64,
    pub(crate) len: usize,
    pub(crate) fmt: WFormat,
    pub(crate) rows: usize,
    pub(crate) cols: usize,
    pub(crate) scales: Option<Scales>,
    /// A matrix's streamed scales: their part's index and block shape.
    pub(crate) streamed: Option<(usize, usize, usize)>,
    /// This part is a matrix's streamed scales, stored so (checked when read).
    pub(crate) is_scales: Option<ScaleKind>,
    /// Stored input-major: transposed in the buffer after the read.
    pub(crate) transposed: bool,
}

/// An expert's parts (its matrices first, in order, then their streamed scales), and
/// whether one read covers them all.
#[derive(Clone, Debug)]
pub(crate) struct ExpertLoc {
    pub(crate) parts: Vec<Part>,
    /// One read covers every part (same file, little else between them).
    pub(crate) coalesced: bool,
}

impl ExpertLoc {
    /// The store's form of `loc`, its files numbered in `paths` (added when new).
    pub(crate) fn new(loc: &ExpertLocation, paths: &mut Vec<PathBuf>) -> ExpertLoc {
        assert!(
            (1..=MAX_MATRICES).contains(&loc.parts.len()),
            "an expert has 1 to {MAX_MATRICES} matrices"
        );
        let mut file_of = |path: &PathBuf| match paths.iter().position(|p| p == path) {
            Some(i) => i,
            None => {
                paths.push(path.clone());
                paths.len() - 1
            }
        };
        let mut parts: Vec<Part> = Vec::with_capacity(MAX_PARTS);
        let mut scale_parts: Vec<Part> = Vec::new();
        for m in &loc.parts {
            let streamed = m.streamed_scales.as_ref().map(|s| {
                scale_parts.push(Part {
                    file: file_of(&s.path),
                    offset: s.offset,
                    len: s.len,
                    fmt: m.fmt,
                    rows: 0,
                    cols: 0,
                    scales: None,
                    streamed: None,
                    is_scales: Some(s.kind),
                    transposed: false,
                });
                (
                    loc.parts.len() + scale_parts.len() - 1,
                    s.block_rows,
                    s.block_cols,
                )
            });
            parts.push(Part {
                file: file_of(&m.path),
                offset: m.offset,
                len: m.len,
                fmt: m.fmt,
                rows: m.rows,
                cols: m.cols,
                scales: m.scales.clone(),
                streamed,
                is_scales: None,
                transposed: m.transposed,
            });
        }
        parts.extend(scale_parts);
        let same_file = parts.iter().all(|p| p.file == parts[0].file);
        let total: u64 = parts.iter().map(|p| p.len as u64).sum();
        let mut loc = ExpertLoc {
            parts,
            coalesced: false,
        };
        let (s, e) = loc.span();
        // f32 scales must land 4-byte aligned in the buffer: a buffered coalesced read
        // puts byte `s` at the (page-aligned) start.
        let aligned = loc
            .parts
            .iter()
            .all(|p| p.is_scales != Some(ScaleKind::F32) || (p.offset - s).is_multiple_of(4));
        loc.coalesced = same_file && e - s <= total + COALESCE_SLACK && aligned;
        loc
    }

    /// The byte range from the first part's start to the last part's end.
    pub(crate) fn span(&self) -> (u64, u64) {
        let start = self.parts.iter().map(|p| p.offset).min().unwrap_or(0);
        let end = self
            .parts
            .iter()
            .map(|p| p.offset + p.len as u64)
            .max()
            .unwrap_or(0);
        (start, end)
    }

    /// Buffer bytes this expert needs, alignment slack included.
    pub(crate) fn buffer_len(&self) -> usize {
        if self.coalesced {
            let (s, e) = self.span();
            (e - s) as usize + 2 * ALIGN
        } else {
            self.parts.iter().map(|p| p.len + 2 * ALIGN).sum()
        }
    }
}

/// What the I/O threads share with the compute thread.
pub(crate) struct Shared {
    pub(crate) files: Vec<File>,
    /// The shards' mappings, when every expert is served in place (no copy).
    pub(crate) maps: Option<Vec<Arc<memmap2::Mmap>>>,
    pub(crate) paths: Vec<PathBuf>,
    pub(crate) direct: bool,
    /// Per decoder layer: its experts' locations (empty for dense layers).
    pub(crate) locs: Vec<Vec<ExpertLoc>>,
    pub(crate) pool: Arc<BufPool>,
    pub(crate) counters: Counters,
}

impl Shared {
    /// Reads `[start, start + len)` of file `f` into `dst` (aligned); returns where in
    /// `dst` the first requested byte landed.
    fn read(&self, f: usize, start: u64, len: usize, dst: &mut [u8]) -> io::Result<usize> {
        let file = &self.files[f];
        if !self.direct {
            file.read_exact_at(&mut dst[..len], start)?;
            return Ok(0);
        }
        let a0 = start - start % ALIGN as u64;
        let need = (start + len as u64 - a0) as usize;
        let a_len = need.next_multiple_of(ALIGN);
        let mut got = 0;
        while got < need {
            let n = file.read_at(&mut dst[got..a_len], a0 + got as u64)?;
            if n == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "file ended before the expert's bytes",
                ));
            }
            got += n;
        }
        Ok((start - a0) as usize)
    }

    /// Reads one expert into a buffer from the pool.
    pub(crate) fn load(
        &self,
        layer: usize,
        expert: usize,
    ) -> std::result::Result<ExpertBuf, String> {
        let loc = &self.locs[layer][expert];
        if let Some(maps) = &self.maps {
            return self.map_in_place(maps, loc, layer, expert);
        }
        let mut buf = self
            .pool
            .take()
            .map_err(|e| format!("reading expert {expert} of layer {layer}: {e}"))?;
        let t0 = Instant::now();
        let mut offsets = [0usize; MAX_PARTS];
        let mut bytes = 0u64;
        let dst = buf.as_mut_slice();
        let err = |p: &Part, e: io::Error| {
            format!(
                "reading expert {expert} of layer {layer} from {}: {e}",
                self.paths[p.file].display()
            )
        };
        let nan_scale = |p: &Part, m: String| {
            format!(
                "expert {expert} of layer {layer} in {}: {m}",
                self.paths[p.file].display()
            )
        };
        if loc.coalesced {
            let (s, e) = loc.span();
            let at = self
                .read(loc.parts[0].file, s, (e - s) as usize, dst)
                .map_err(|e| err(&loc.parts[0], e))?;
            for (o, p) in offsets.iter_mut().zip(&loc.parts) {
                *o = at + (p.offset - s) as usize;
            }
            bytes += e - s;
        } else {
            let mut pos = 0;
            for (o, p) in offsets.iter_mut().zip(&loc.parts) {
                let at = self
                    .read(p.file, p.offset, p.len, &mut dst[pos..])
                    .map_err(|e| err(p, e))?;
                *o = pos + at;
                pos = (pos + at + p.len).next_multiple_of(ALIGN);
                bytes += p.len as u64;
            }
        }
        for (p, &o) in loc.parts.iter().zip(&offsets) {
            if let Some(kind) = p.is_scales {
                crate::weights::check_streamed_scales(kind, &dst[o..o + p.len])
                    .map_err(|m| nan_scale(p, m))?;
            }
            if p.transposed {
                transpose_in_buffer(&mut dst[o..o + p.len], p.cols, p.rows, p.fmt.size());
            }
        }
        let c = &self.counters;
        c.bytes_read.fetch_add(bytes, Ordering::Relaxed);
        c.read_ns
            .fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
        Ok(ExpertBuf {
            buf: Some(buf),
            mapped: None,
            pool: self.pool.clone(),
            offsets,
        })
    }

    /// An expert served from its shard's mapping: its pages are faulted in here (on the
    /// I/O thread for a prefetch), so the kernels never wait on a page fault.
    fn map_in_place(
        &self,
        maps: &[Arc<memmap2::Mmap>],
        loc: &ExpertLoc,
        layer: usize,
        expert: usize,
    ) -> std::result::Result<ExpertBuf, String> {
        let t0 = Instant::now();
        for p in &loc.parts {
            let map = &maps[p.file];
            let path = self.paths[p.file].display();
            let end = p.offset as usize + p.len;
            if end > map.len() {
                return Err(format!(
                    "reading expert {expert} of layer {layer} in place from {path}: it lies past the end of the file (truncated since it was opened?)"
                ));
            }
            populate(map, p.offset as usize, end).map_err(|x| {
                format!("reading expert {expert} of layer {layer} in place from {path}: faulting its pages in: {x}")
            })?;
            if let Some(kind) = p.is_scales {
                crate::weights::check_streamed_scales(kind, &map[p.offset as usize..end])
                    .map_err(|m| format!("expert {expert} of layer {layer} in {path}: {m}"))?;
            }
        }
        let bytes: usize = loc.parts.iter().map(|p| p.len).sum();
        let c = &self.counters;
        c.bytes_read.fetch_add(bytes as u64, Ordering::Relaxed);
        c.read_ns
            .fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
        Ok(ExpertBuf {
            buf: None,
            mapped: Some(loc.parts.iter().map(|p| maps[p.file].clone()).collect()),
            pool: self.pool.clone(),
            offsets: std::array::from_fn(|i| loc.parts.get(i).map_or(0, |p| p.offset as usize)),
        })
    }
}

thread_local! {
    /// An I/O thread's scratch for transposing input-major matrices (grows to the largest).
    static TRANSPOSE_SCRATCH: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Transposes `bytes` (`[rows, cols]` of `elem`-byte elements) in place, through the
/// thread's scratch.
fn transpose_in_buffer(bytes: &mut [u8], rows: usize, cols: usize, elem: usize) {
    TRANSPOSE_SCRATCH.with_borrow_mut(|scratch| {
        scratch.clear();
        scratch.extend_from_slice(bytes);
        crate::weights::transpose_into(scratch, rows, cols, elem, bytes);
    });
}

/// Faults in the pages of `map[start..end]`: read-ahead of the range into the page cache
/// (the mapping is otherwise advised random), then its page-table entries filled in one
/// call (`MADV_POPULATE_READ`, Linux 5.14) or, on older kernels, by touching every page.
fn populate(map: &memmap2::Mmap, start: usize, end: usize) -> io::Result<()> {
    const PAGE: usize = 4096;
    let a0 = start - start % PAGE;
    let len = end - a0;
    map.advise_range(memmap2::Advice::WillNeed, a0, len)?;
    #[cfg(target_os = "linux")]
    {
        const MADV_POPULATE_READ: libc::c_int = 22;
        // SAFETY: the range lies inside the mapping (checked by the caller); the advice
        // only fills page tables, it changes no memory.
        let r = unsafe {
            libc::madvise(
                map.as_ptr().add(a0) as *mut libc::c_void,
                len,
                MADV_POPULATE_READ,
            )
        };
        if r == 0 {
            return Ok(());
        }
        let err = io::Error::last_os_error();
        if err.raw_os_error() != Some(libc::EINVAL) {
            return Err(err);
        }
    }
    let mut sum = 0u8;
    for off in (a0..end).step_by(PAGE) {
        // SAFETY: inside the mapping; a volatile read so the touch is not optimized away.
        sum ^= unsafe { std::ptr::read_volatile(map.as_ptr().add(off)) };
    }
    std::hint::black_box(sum);
    Ok(())
}

/// Maps every shard for in-place expert reads.
pub(crate) fn map_shards(files: &[File], paths: &[PathBuf]) -> Result<Vec<Arc<memmap2::Mmap>>> {
    files
        .iter()
        .zip(paths)
        .map(|(f, p)| {
            // SAFETY: the shards are opened read-only and coli never writes them; a file
            // changed by another process under a live mapping is outside what any
            // memory-mapped reader can guard against (see `in_place_allowed`).
            let map = unsafe { memmap2::Mmap::map(f) }
                .map_err(|e| ModelError::ExpertRead(format!("mapping {}: {e}", p.display())))?;
            #[cfg(target_os = "linux")]
            let _ = map.advise(memmap2::Advice::HugePage);
            Ok(Arc::new(map))
        })
        .collect()
}

/// Whether experts may be served from the shard mappings when all of them are cached
/// (`COLI_EXPERTS_IN_PLACE=0` turns it off: every expert is then copied into RAM).
pub(crate) fn in_place_allowed() -> bool {
    std::env::var_os("COLI_EXPERTS_IN_PLACE").is_none_or(|v| v != "0")
}

/// Opens a shard for `pread` (with `O_DIRECT` when asked).
pub(crate) fn open(path: &Path, direct: bool) -> Result<File> {
    let mut o = OpenOptions::new();
    o.read(true);
    if direct {
        o.custom_flags(libc::O_DIRECT);
    }
    o.open(path).map_err(|e| {
        let hint = if direct && e.raw_os_error() == Some(libc::EINVAL) {
            " (O_DIRECT is not supported on this filesystem; run without --direct)"
        } else {
            ""
        };
        ModelError::ExpertRead(format!("opening {}: {e}{hint}", path.display()))
    })
}
