//! A global allocator that starts every large block on a cache line.
//!
//! The vector kernels read activations 64 bytes (one AVX-512 register) at a time. glibc's
//! `malloc` aligns to 16 bytes, and a large block (served by `mmap`) sits 16 bytes past a
//! page boundary, so every such load of a token's activations crossed two cache lines: a
//! prefill block measured 18% slower on misaligned activations than on aligned ones. A
//! binary installs [`CacheLineAligned`] as its `#[global_allocator]`; blocks of at least
//! [`MIN_BYTES`] then start on a 64-byte boundary (the kernels' results never depend on
//! alignment, only their speed).
//!
//! Blocks of [`MAP_BYTES`] or more are mapped directly (Linux), page-aligned: their pages
//! are zero and untouched until written, as `calloc`'s large blocks are, so a large zeroed
//! buffer (a KV cache sized for a long context) costs no memory before it is used. The
//! system allocator can only zero an over-aligned block by writing it.

use std::alloc::{GlobalAlloc, Layout, System};

/// Blocks of this many bytes or more are aligned to [`LINE`].
pub const MIN_BYTES: usize = 1024;
/// The alignment given to large blocks: one cache line, one AVX-512 register.
pub const LINE: usize = 64;
/// Blocks of this many bytes or more are their own anonymous mapping (Linux).
pub const MAP_BYTES: usize = 1 << 20;

/// [`System`], with blocks of [`MIN_BYTES`] or more aligned to [`LINE`] bytes and blocks of
/// [`MAP_BYTES`] or more mapped (Linux).
pub struct CacheLineAligned;

/// The layout actually requested from [`System`] for `layout`.
fn widen(layout: Layout) -> Layout {
    if layout.size() >= MIN_BYTES && layout.align() < LINE {
        // A valid layout stays valid with a larger power-of-two alignment below isize::MAX.
        Layout::from_size_align(layout.size(), LINE).unwrap_or(layout)
    } else {
        layout
    }
}

/// Whether `layout` is served by its own mapping: decided by the layout alone, so the
/// block is freed the way it was allocated.
fn mapped(layout: Layout) -> bool {
    cfg!(target_os = "linux") && layout.size() >= MAP_BYTES && layout.align() <= 4096
}

#[cfg(target_os = "linux")]
mod map {
    /// A fresh anonymous mapping of `size` bytes (zero, page-aligned), or null.
    pub(super) unsafe fn map(size: usize) -> *mut u8 {
        let p = libc::mmap(
            std::ptr::null_mut(),
            size,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        );
        if p == libc::MAP_FAILED {
            std::ptr::null_mut()
        } else {
            p.cast()
        }
    }

    pub(super) unsafe fn unmap(p: *mut u8, size: usize) {
        libc::munmap(p.cast(), size);
    }

    /// The mapping at `p` resized (moved if need be), or null (the old one stays valid).
    pub(super) unsafe fn remap(p: *mut u8, old: usize, new: usize) -> *mut u8 {
        let q = libc::mremap(p.cast(), old, new, libc::MREMAP_MAYMOVE);
        if q == libc::MAP_FAILED {
            std::ptr::null_mut()
        } else {
            q.cast()
        }
    }
}

#[cfg(not(target_os = "linux"))]
mod map {
    pub(super) unsafe fn map(_: usize) -> *mut u8 {
        unreachable!("mapped blocks are Linux-only")
    }
    pub(super) unsafe fn unmap(_: *mut u8, _: usize) {
        unreachable!("mapped blocks are Linux-only")
    }
    pub(super) unsafe fn remap(_: *mut u8, _: usize, _: usize) -> *mut u8 {
        unreachable!("mapped blocks are Linux-only")
    }
}

// SAFETY: a block is allocated, resized and freed by one of two providers chosen by its
// layout alone (`mapped`), which the `GlobalAlloc` contract makes the same at both ends:
// its own mapping, page-aligned (which satisfies any alignment `mapped` admits), or
// `System` with the widened layout (`widen` is a function of the layout; a widened
// alignment satisfies the caller's).
unsafe impl GlobalAlloc for CacheLineAligned {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if mapped(layout) {
            return map::map(layout.size());
        }
        System.alloc(widen(layout))
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if mapped(layout) {
            // Fresh anonymous pages are zero.
            return map::map(layout.size());
        }
        System.alloc_zeroed(widen(layout))
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if mapped(layout) {
            return map::unmap(ptr, layout.size());
        }
        System.dealloc(ptr, widen(layout))
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let Ok(new) = Layout::from_size_align(new_size, layout.align()) else {
            return std::ptr::null_mut();
        };
        if mapped(layout) && mapped(new) {
            return map::remap(ptr, layout.size(), new_size);
        }
        if !mapped(layout) && !mapped(new) && widen(layout).align() == widen(new).align() {
            return System.realloc(ptr, widen(layout), new_size);
        }
        // Across a threshold the provider or the alignment changes: a new block, the copy.
        let fresh = self.alloc(new);
        if !fresh.is_null() {
            std::ptr::copy_nonoverlapping(ptr, fresh, layout.size().min(new_size));
            self.dealloc(ptr, layout);
        }
        fresh
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn large_blocks_start_on_a_line_and_keep_their_bytes_when_resized() {
        let a = CacheLineAligned;
        let sizes = [
            MIN_BYTES - 1,
            MIN_BYTES,
            5000,
            MAP_BYTES - 1,
            MAP_BYTES,
            3 * MAP_BYTES + 5,
        ];
        for size in sizes {
            let l = Layout::from_size_align(size, 4).unwrap();
            // SAFETY: a non-zero layout; the block is written within its size, resized and
            // freed with the layouts it has.
            unsafe {
                let mut p = a.alloc(l);
                assert!(!p.is_null());
                assert_eq!(p as usize % 4, 0);
                if size >= MIN_BYTES {
                    assert_eq!(p as usize % LINE, 0, "{size} bytes");
                }
                for i in 0..size {
                    *p.add(i) = (i % 251) as u8;
                }
                // Across both thresholds, both ways, and within them.
                for new_size in [size / 2 + 1, size * 3, MIN_BYTES + 7, MAP_BYTES + 9, size] {
                    let cur = Layout::from_size_align(size, 4).unwrap();
                    let q = a.realloc(p, cur, new_size);
                    assert!(!q.is_null());
                    if new_size >= MIN_BYTES {
                        assert_eq!(q as usize % LINE, 0, "{size} -> {new_size}");
                    }
                    for i in 0..size.min(new_size) {
                        assert_eq!(*q.add(i), (i % 251) as u8, "{size} -> {new_size} at {i}");
                    }
                    let back = a.realloc(q, Layout::from_size_align(new_size, 4).unwrap(), size);
                    assert!(!back.is_null());
                    for i in 0..size.min(new_size) {
                        assert_eq!(*back.add(i), (i % 251) as u8);
                    }
                    // Rewrite the tail a shrink dropped, for the next round.
                    for i in size.min(new_size)..size {
                        *back.add(i) = (i % 251) as u8;
                    }
                    p = back;
                }
                let z = a.alloc_zeroed(l);
                assert!((0..size).all(|i| *z.add(i) == 0));
                a.dealloc(z, l);
                a.dealloc(p, l);
            }
        }
    }

    #[test]
    fn only_large_blocks_change_provider_or_alignment() {
        let l = |size, align| Layout::from_size_align(size, align).unwrap();
        // Small blocks keep the system allocator's layout (no padding to a line), large
        // ones are aligned to a line, an alignment above a line is kept.
        assert_eq!(widen(l(16, 8)), l(16, 8));
        assert_eq!(widen(l(MIN_BYTES - 1, 4)), l(MIN_BYTES - 1, 4));
        assert_eq!(widen(l(MIN_BYTES, 4)), l(MIN_BYTES, LINE));
        assert_eq!(widen(l(100, 128)), l(100, 128));
        assert_eq!(widen(l(MIN_BYTES, 128)), l(MIN_BYTES, 128));
        // Only blocks of MAP_BYTES or more are their own mapping, and only where a page
        // satisfies their alignment.
        assert!(!mapped(l(16, 8)));
        assert!(!mapped(l(MAP_BYTES - 1, 8)));
        assert!(!mapped(l(MAP_BYTES, 8192)));
        assert_eq!(mapped(l(MAP_BYTES, 8)), cfg!(target_os = "linux"));
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_large_zeroed_block_costs_no_memory_until_written() {
        // Resident pages of this process, from /proc (the counter the kernel keeps).
        fn resident() -> usize {
            let s = std::fs::read_to_string("/proc/self/statm").unwrap();
            s.split_whitespace()
                .nth(1)
                .unwrap()
                .parse::<usize>()
                .unwrap()
                * 4096
        }
        let a = CacheLineAligned;
        let size = 256 << 20;
        let l = Layout::from_size_align(size, 4).unwrap();
        let before = resident();
        // SAFETY: a valid layout, freed with it; one byte written inside the block.
        unsafe {
            let p = a.alloc_zeroed(l);
            assert!(!p.is_null());
            assert_eq!(p as usize % LINE, 0);
            *p.add(size / 2) = 1;
            let grew = resident().saturating_sub(before);
            a.dealloc(p, l);
            assert!(
                grew < 64 << 20,
                "a zeroed 256 MiB block made {grew} bytes resident"
            );
        }
    }
}
