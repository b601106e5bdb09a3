//! Resident copies of tensors: one anonymous, read-only mapping the weights are copied
//! into at load, so they stream from huge pages rather than the shards' file mappings.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use super::TensorView;
use crate::error::{CoreError, Result};

/// Copies tensors into one anonymous, read-only mapping (transparent huge pages requested)
/// and returns views of the copies, in order. Views of the same bytes share one copy.
///
/// Resident weights read from anonymous huge pages stream at memory bandwidth; the same
/// bytes behind a file mapping's 4 KiB pages are read several times slower (TLB misses,
/// prefetchers stopping at page boundaries).
pub fn make_resident(views: &[&TensorView]) -> Result<Vec<TensorView>> {
    const ALIGN: usize = 64;
    let mut offsets = Vec::with_capacity(views.len());
    // The views whose bytes are copied (the first of each group sharing bytes), in
    // increasing order of their place in the copy.
    let mut firsts = Vec::new();
    let mut seen: HashMap<(PathBuf, usize, usize), usize> = HashMap::new();
    let mut total = 0usize;
    for (i, v) in views.iter().enumerate() {
        // A resident view's range is within its own copy, not the file: such views share
        // bytes only when they share the copy.
        let key = if v.resident {
            (PathBuf::new(), v.bytes().as_ptr() as usize, v.range.len())
        } else {
            (v.file.clone(), v.range.start, v.range.end)
        };
        let off = *seen.entry(key).or_insert_with(|| {
            let o = total.next_multiple_of(ALIGN);
            total = o + v.range.len();
            firsts.push(i);
            o
        });
        offsets.push(off);
    }
    let anon = || {
        CoreError::io(
            "<resident weights>",
            std::io::Error::other("anonymous mapping failed"),
        )
    };
    let mut map = memmap2::MmapMut::map_anon(total.max(1)).map_err(|_| anon())?;
    #[cfg(target_os = "linux")]
    let _ = map.advise(memmap2::Advice::HugePage);
    // File-backed views are read with pread (large sequential reads), not through their
    // mapping: shard mappings are advised random-access so that touching one small tensor
    // does not read megabytes around it, and a shard truncated since it was opened is an
    // I/O error here, not a SIGBUS. The reads go to the file that was opened and
    // validated, not to whatever the path names now.
    //
    // The copy runs in pieces on every core: zeroing the fresh pages and copying them is
    // CPU work that one thread would serialize.
    const PIECE: usize = 8 << 20;
    let mut pieces: Vec<(&mut [u8], &TensorView, usize)> = Vec::new();
    let mut rest: &mut [u8] = &mut map[..];
    let mut consumed = 0;
    for &i in &firsts {
        let (v, off) = (views[i], offsets[i]);
        let mut at = 0;
        while at < v.range.len() {
            let len = PIECE.min(v.range.len() - at);
            let (_, tail) = std::mem::take(&mut rest).split_at_mut(off + at - consumed);
            let (dst, tail) = tail.split_at_mut(len);
            rest = tail;
            consumed = off + at + len;
            pieces.push((dst, v, at));
            at += len;
        }
    }
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .clamp(1, 8)
        .min(pieces.len().max(1));
    let mut per_thread: Vec<Vec<(&mut [u8], &TensorView, usize)>> =
        (0..threads).map(|_| Vec::new()).collect();
    for (j, p) in pieces.into_iter().enumerate() {
        per_thread[j % threads].push(p);
    }
    let copy = |work: Vec<(&mut [u8], &TensorView, usize)>| -> Result<()> {
        for (dst, v, at) in work {
            if v.resident {
                dst.copy_from_slice(&v.bytes()[at..at + dst.len()]);
                continue;
            }
            std::os::unix::fs::FileExt::read_exact_at(&*v.handle, dst, v.file_offset + at as u64)
                .map_err(|x| CoreError::io(&v.file, x))?;
        }
        Ok(())
    };
    std::thread::scope(|s| {
        let handles: Vec<_> = per_thread
            .into_iter()
            .map(|work| s.spawn(|| copy(work)))
            .collect();
        handles.into_iter().try_for_each(|h| {
            h.join().map_err(|_| {
                CoreError::io(
                    "<resident weights>",
                    std::io::Error::other("a copy thread panicked"),
                )
            })?
        })
    })?;
    let map = Arc::new(
        map.make_read_only()
            .map_err(|e| CoreError::io("<resident weights>", e))?,
    );
    Ok(views
        .iter()
        .zip(offsets)
        .map(|(v, off)| TensorView {
            name: v.name.clone(),
            dtype_name: v.dtype_name.clone(),
            shape: v.shape.clone(),
            file: v.file.clone(),
            map: map.clone(),
            range: off..off + v.range.len(),
            file_offset: v.file_offset,
            resident: true,
            handle: v.handle.clone(),
        })
        .collect())
}
