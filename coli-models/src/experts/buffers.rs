//! Expert buffers: 4096-aligned ranges of huge-page-advised anonymous arenas, reused
//! through a pool (decode allocates no new buffer once the pool is warm).

use std::io;
use std::sync::{Arc, Mutex};

use super::store::ALIGN;

/// Anonymous memory for several expert buffers, 2 MiB-aligned with transparent huge pages
/// requested (expert matrices are streamed through once per use; 4 KiB pages would cost a
/// TLB miss every 4 KiB). Buffers are packed back to back so huge pages cover them whole.
struct Arena {
    /// Keeps the mapping alive; accessed only through `base`.
    _map: memmap2::MmapMut,
    /// The first 2 MiB boundary inside the mapping.
    base: *mut u8,
}

// SAFETY: each buffer handed out owns a disjoint byte range of the arena (see `AlignedBuf`).
unsafe impl Send for Arena {}
// SAFETY: as above.
unsafe impl Sync for Arena {}

const HUGE_PAGE: usize = 2 << 20;

/// Buffers per arena.
const ARENA_BUFFERS: usize = 8;

/// One [`ALIGN`]-aligned buffer: a disjoint range of an arena.
pub(crate) struct AlignedBuf {
    arena: Arc<Arena>,
    offset: usize,
    len: usize,
}

impl AlignedBuf {
    pub(crate) fn as_slice(&self) -> &[u8] {
        // SAFETY: `offset..offset + len` lies inside the mapping past `base` and belongs to
        // this buffer alone; the mapping lives as long as the arena.
        unsafe { std::slice::from_raw_parts(self.arena.base.add(self.offset), self.len) }
    }
    pub(crate) fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above; `&mut self` makes this the only access to the range.
        unsafe { std::slice::from_raw_parts_mut(self.arena.base.add(self.offset), self.len) }
    }
}

/// Free buffers, all of one size (the largest expert plus alignment slack).
pub(crate) struct BufPool {
    pub(crate) free: Mutex<Vec<AlignedBuf>>,
    pub(crate) size: usize,
}

impl BufPool {
    /// A free buffer, or a new arena's first (an error, never a panic, when memory
    /// cannot be mapped: it reaches the token waiting for the read).
    pub(crate) fn take(&self) -> io::Result<AlignedBuf> {
        let mut free = self
            .free
            .lock()
            .map_err(|_| io::Error::other("expert buffer pool poisoned"))?;
        if let Some(b) = free.pop() {
            return Ok(b);
        }
        let stride = self.size.next_multiple_of(ALIGN);
        let mut map =
            memmap2::MmapMut::map_anon(stride * ARENA_BUFFERS + HUGE_PAGE).map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!("allocating expert buffers ({stride} bytes each): {e}"),
                )
            })?;
        #[cfg(target_os = "linux")]
        let _ = map.advise(memmap2::Advice::HugePage);
        let start = (map.as_ptr() as usize).next_multiple_of(HUGE_PAGE) - map.as_ptr() as usize;
        // SAFETY: start < HUGE_PAGE, inside the mapping.
        let base = unsafe { map.as_mut_ptr().add(start) };
        let arena = Arc::new(Arena { _map: map, base });
        for i in 1..ARENA_BUFFERS {
            free.push(AlignedBuf {
                arena: arena.clone(),
                offset: i * stride,
                len: self.size,
            });
        }
        Ok(AlignedBuf {
            arena,
            offset: 0,
            len: self.size,
        })
    }
}

/// One expert's bytes in RAM; immutable once read. Either a pooled buffer the expert was
/// read into (returned to the pool when the last user lets go), or its shard's mapping,
/// when the store serves every expert in place (see [`super::store`]).
pub struct ExpertBuf {
    pub(crate) buf: Option<AlignedBuf>,
    /// Each part's shard mapping, when served in place.
    pub(crate) mapped: Option<Vec<Arc<memmap2::Mmap>>>,
    pub(crate) pool: Arc<BufPool>,
    /// Where each part (gate, up, down) starts in the buffer, or in its shard's mapping.
    pub(crate) offsets: [usize; super::io::MAX_PARTS],
}

impl ExpertBuf {
    /// Part `i` (0 gate, 1 up, 2 down), `len` bytes.
    pub(crate) fn part(&self, i: usize, len: usize) -> &[u8] {
        let bytes: &[u8] = match (&self.mapped, &self.buf) {
            (Some(m), _) => &m[i],
            (None, Some(b)) => b.as_slice(),
            (None, None) => &[],
        };
        &bytes[self.offsets[i]..self.offsets[i] + len]
    }
}

impl Drop for ExpertBuf {
    fn drop(&mut self) {
        if let Some(b) = self.buf.take() {
            if let Ok(mut free) = self.pool.free.lock() {
                free.push(b);
            }
        }
    }
}
