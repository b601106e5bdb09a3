//! The cache of a layer that reads only its last positions: a DeepSeek-V4 attention
//! layer (the last positions' keys and compressor rows in rings, and every finished
//! compressed entry) or a sliding-window attention layer (gpt-oss; its keys and values in
//! one ring, nothing else).
//!
//! A V4 layer reads keys only inside its sliding window, and a compressor's raw rows only
//! until their window's entry is finished (the window before it too, for CSA's overlap).
//! So the cache keeps those in rings of a few windows plus `slack` positions, and the
//! entries (one per `rate` positions) in full. The sequence can then be cut back by up to
//! `slack` positions and continued with exactly the bits a fresh sequence would give
//! (drafts, a shared prefix); a deeper cut starts over ([`RingCache::floor`]), unless it
//! lands at or after a checkpoint: a copy of the rings taken when a prompt was fed
//! ([`RingCache::save`]), so that the next turn of a conversation, whose template may
//! rewrite the last answer, goes back to the end of the previous prompt.

use std::io::{Read, Write};

/// The rings' positions beyond what the layer reads: how far a sequence can be cut back
/// and continued exactly, and the most tokens a forward writes before it reads them.
pub const RING_SLACK: usize = 64;

/// What one ring layer keeps, from its config or its loaded block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RingShape {
    /// Positions of the sliding window, the query's own included.
    pub window: usize,
    /// Floats of a position's row in the key ring (V4: its shared key, `head_dim`; a
    /// sliding-window GQA layer: its keys, then its values).
    pub key_width: usize,
    /// Positions per compressed entry (0 on a sliding layer).
    pub rate: usize,
    /// Whether an entry also reads the previous window's rows (CSA).
    pub overlap: bool,
    /// Floats of the compressors' raw rows per position (0 on a sliding layer).
    pub raw_width: usize,
    /// Floats of the compressors' entries per window.
    pub entry_width: usize,
}

impl RingShape {
    /// A sliding-window GQA layer of `window` positions: each position's keys and values
    /// in one row of the key ring, nothing compressed.
    pub fn sliding(window: usize, kv: super::kv::KvShape) -> RingShape {
        RingShape {
            window,
            key_width: kv.key_width + kv.value_width,
            rate: 0,
            overlap: false,
            raw_width: 0,
            entry_width: 0,
        }
    }

    /// Positions of the key ring for `slack` (at least 1; at most `capacity`): a token
    /// reads the `window - 1` keys before its own, and a cut of `slack` positions must
    /// leave them.
    pub fn key_rows(&self, slack: usize, capacity: usize) -> usize {
        (self.window.max(1) - 1 + slack.max(1)).min(capacity)
    }

    /// Positions of the raw-row ring for `slack`: an entry reads its window's rows (and,
    /// on CSA, the window's before), whose first is up to `(1 + overlap) rate - 1`
    /// positions before the last, and a cut of `slack` positions must leave them.
    pub fn raw_rows(&self, slack: usize, capacity: usize) -> usize {
        match self.rate {
            0 => 0,
            m => ((1 + usize::from(self.overlap)) * m - 1 + slack.max(1)).min(capacity),
        }
    }

    /// Floats of the entries per position of capacity (an entry's width spread over its
    /// window, rounded up).
    pub fn entry_floats_per_position(&self) -> usize {
        match self.rate {
            0 => 0,
            m => self.entry_width.div_ceil(m),
        }
    }

    /// Floats of the rings for `slack` at `capacity` positions, and of their checkpoint.
    pub fn ring_floats(&self, slack: usize, capacity: usize) -> usize {
        2 * (self.key_rows(slack, capacity) * self.key_width
            + self.raw_rows(slack, capacity) * self.raw_width)
    }
}

/// One layer's rings and entries (see the module's documentation).
#[derive(Debug)]
pub struct RingCache {
    /// The layer's shape.
    pub shape: RingShape,
    keys: Vec<f32>,
    raw: Vec<f32>,
    entries: Vec<f32>,
    key_rows: usize,
    raw_rows: usize,
    slack: usize,
    /// The first position whose key, and whose raw row, the rings still hold.
    key_lo: usize,
    raw_lo: usize,
    /// The checkpoint: the rings (keys, then raw rows) as they were at a position, and
    /// their first positions then.
    saved: Vec<f32>,
    saved_at: Option<(usize, usize, usize)>,
}

impl RingCache {
    /// Allocates the rings and entries for `capacity` positions.
    pub fn new(shape: RingShape, slack: usize, capacity: usize) -> RingCache {
        let (key_rows, raw_rows) = (
            shape.key_rows(slack, capacity),
            shape.raw_rows(slack, capacity),
        );
        RingCache {
            shape,
            keys: vec![0.0; key_rows * shape.key_width],
            raw: vec![0.0; raw_rows * shape.raw_width],
            entries: vec![0.0; capacity * shape.entry_floats_per_position()],
            key_rows,
            raw_rows,
            slack: slack.max(1),
            key_lo: 0,
            raw_lo: 0,
            saved: vec![0.0; key_rows * shape.key_width + raw_rows * shape.raw_width],
            saved_at: None,
        }
    }

    /// Floats held.
    pub fn floats(&self) -> usize {
        self.keys.len() + self.raw.len() + self.entries.len() + self.saved.len()
    }

    /// Copies the rings as they are after `len` positions into the checkpoint.
    pub fn save(&mut self, len: usize) {
        let k = self.keys.len();
        self.saved[..k].copy_from_slice(&self.keys);
        self.saved[k..].copy_from_slice(&self.raw);
        self.saved_at = Some((len, self.key_lo, self.raw_lo));
    }

    /// The checkpoint's length, if there is one.
    pub fn saved_len(&self) -> Option<usize> {
        self.saved_at.map(|(len, _, _)| len)
    }

    /// Puts the checkpoint back: the rings are as they were after its length (the entries
    /// of the windows finished by then were not written since).
    pub fn restore(&mut self) -> Option<usize> {
        let (len, key_lo, raw_lo) = self.saved_at?;
        let k = self.keys.len();
        self.keys.copy_from_slice(&self.saved[..k]);
        self.raw.copy_from_slice(&self.saved[k..]);
        self.key_lo = key_lo;
        self.raw_lo = raw_lo;
        Some(len)
    }

    /// Drops a checkpoint past `len` (the sequence was cut below it, so later writes may
    /// change the entries it relies on).
    pub fn forget_saved_after(&mut self, len: usize) {
        if self.saved_len().is_some_and(|s| s > len) {
            self.saved_at = None;
        }
    }

    /// Most positions a forward may write before reading them (its tokens go through the
    /// layer in pieces of this many).
    pub fn piece(&self) -> usize {
        self.slack
    }

    /// Called before positions from `start` on are written: a sequence starting over
    /// forgets what the rings held.
    pub fn begin(&mut self, start: usize) {
        if start == 0 {
            self.key_lo = 0;
            self.raw_lo = 0;
        }
        assert!(start >= self.floor(), "cut deeper than the rings hold");
    }

    /// Position `p`'s key.
    pub fn key(&self, p: usize) -> &[f32] {
        let w = self.shape.key_width;
        &self.keys[(p % self.key_rows) * w..][..w]
    }

    /// Writes position `p`'s key (overwriting the one `key_rows` positions before it).
    pub fn set_key(&mut self, p: usize, key: &[f32]) {
        self.key_mut(p).copy_from_slice(key);
    }

    /// Position `p`'s key, to write (overwriting the one `key_rows` positions before it).
    pub fn key_mut(&mut self, p: usize) -> &mut [f32] {
        let w = self.shape.key_width;
        self.key_lo = self.key_lo.max((p + 1).saturating_sub(self.key_rows));
        &mut self.keys[(p % self.key_rows) * w..][..w]
    }

    /// The key ring and its number of rows: position `p`'s key is row `p % rows`, for the
    /// positions from [`RingCache::floor`]'s window on.
    pub fn key_ring(&self) -> (&[f32], usize) {
        (&self.keys, self.key_rows)
    }

    /// Position `p`'s raw row.
    pub fn raw(&self, p: usize) -> &[f32] {
        let w = self.shape.raw_width;
        &self.raw[(p % self.raw_rows) * w..][..w]
    }

    /// Position `p`'s raw row, to write (overwriting the one `raw_rows` positions before).
    pub fn raw_mut(&mut self, p: usize) -> &mut [f32] {
        let w = self.shape.raw_width;
        self.raw_lo = self.raw_lo.max((p + 1).saturating_sub(self.raw_rows));
        &mut self.raw[(p % self.raw_rows) * w..][..w]
    }

    /// Entry `win`'s floats (both compressors').
    pub fn entry(&self, win: usize) -> &[f32] {
        let w = self.shape.entry_width;
        &self.entries[win * w..][..w]
    }

    /// Entry `win`'s floats, to write.
    pub fn entry_mut(&mut self, win: usize) -> &mut [f32] {
        let w = self.shape.entry_width;
        &mut self.entries[win * w..][..w]
    }

    /// The shortest length this layer can be cut back to and continued exactly: the
    /// sliding window and the open windows' raw rows must still be held.
    pub fn floor(&self) -> usize {
        let keys = match self.key_lo {
            0 => 0,
            lo => lo + self.shape.window - 1,
        };
        let raw = match (self.raw_lo, self.shape.rate) {
            (0, _) | (_, 0) => 0,
            (lo, m) => (lo.div_ceil(m) + usize::from(self.shape.overlap)) * m,
        };
        keys.max(raw)
    }

    /// Writes the first `n` positions' state as the rings hold it: the first key's
    /// position (u64) and the keys from it to `n`, the same for the raw rows, then the
    /// finished entries (f32, little-endian). `n` must not be below [`RingCache::floor`].
    pub fn write(&self, n: usize, w: &mut dyn Write) -> std::io::Result<()> {
        let key_lo = self.key_lo.min(n);
        w.write_all(&(key_lo as u64).to_le_bytes())?;
        for p in key_lo..n {
            write_floats(w, self.key(p))?;
        }
        let raw_lo = self.raw_lo.min(n);
        w.write_all(&(raw_lo as u64).to_le_bytes())?;
        if self.shape.raw_width > 0 {
            for p in raw_lo..n {
                write_floats(w, self.raw(p))?;
            }
        }
        let entries = n.checked_div(self.shape.rate).unwrap_or(0);
        write_floats(w, &self.entries[..entries * self.shape.entry_width])
    }

    /// Reads what [`RingCache::write`] wrote for `n` positions.
    pub fn read(&mut self, n: usize, r: &mut dyn Read) -> std::io::Result<()> {
        let (kw, rw) = (self.shape.key_width, self.shape.raw_width);
        let mut row = vec![0.0; kw.max(rw)];
        self.key_lo = read_first(r, n, self.key_rows)?;
        for p in self.key_lo..n {
            read_floats(r, &mut row[..kw])?;
            self.set_key(p, &row[..kw]);
        }
        let rows = if rw > 0 { self.raw_rows } else { n };
        self.raw_lo = read_first(r, n, rows)?;
        if rw > 0 {
            for p in self.raw_lo..n {
                read_floats(r, &mut row[..rw])?;
                self.raw_mut(p).copy_from_slice(&row[..rw]);
            }
        }
        if self.floor() > n {
            return Err(std::io::Error::other(
                "ring positions do not reach back far enough",
            ));
        }
        let entries = n.checked_div(self.shape.rate).unwrap_or(0);
        read_floats(r, &mut self.entries[..entries * self.shape.entry_width])
    }
}

/// A ring's first position, which must leave at most `rows` positions before `n`.
fn read_first(r: &mut dyn Read, n: usize, rows: usize) -> std::io::Result<usize> {
    let mut b8 = [0u8; 8];
    r.read_exact(&mut b8)?;
    match usize::try_from(u64::from_le_bytes(b8)) {
        Ok(lo) if lo <= n && n - lo <= rows => Ok(lo),
        _ => Err(std::io::Error::other("first ring position out of range")),
    }
}

fn write_floats(w: &mut dyn Write, xs: &[f32]) -> std::io::Result<()> {
    for x in xs {
        w.write_all(&x.to_le_bytes())?;
    }
    Ok(())
}

fn read_floats(r: &mut dyn Read, xs: &mut [f32]) -> std::io::Result<()> {
    let mut b4 = [0u8; 4];
    for x in xs {
        r.read_exact(&mut b4)?;
        *x = f32::from_le_bytes(b4);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(rate: usize, overlap: bool) -> RingShape {
        RingShape {
            window: 5,
            key_width: 3,
            rate,
            overlap,
            raw_width: if rate > 0 { 4 } else { 0 },
            entry_width: if rate > 0 { 2 } else { 0 },
        }
    }

    /// Position `p`'s stand-in values, distinct per position and column.
    fn val(p: usize, c: usize, what: usize) -> f32 {
        (p * 16 + c * 4 + what) as f32
    }

    /// Writes positions `0..n` as a forward would, finishing entries as windows close.
    fn fill(ring: &mut RingCache, n: usize) {
        let s = ring.shape;
        for p in 0..n {
            let key: Vec<f32> = (0..s.key_width).map(|c| val(p, c, 0)).collect();
            ring.set_key(p, &key);
            if s.raw_width > 0 {
                for (c, x) in ring.raw_mut(p).iter_mut().enumerate() {
                    *x = val(p, c, 1);
                }
                if (p + 1) % s.rate == 0 {
                    for (c, x) in ring.entry_mut(p / s.rate).iter_mut().enumerate() {
                        *x = val(p, c, 2);
                    }
                }
            }
        }
    }

    /// The smallest cut past 0 that still has the window's keys and the open windows'
    /// rows, counted from the `n` positions written, independently of the ring's
    /// bookkeeping (0 when nothing was written).
    fn floor_by_definition(s: RingShape, key_rows: usize, raw_rows: usize, n: usize) -> usize {
        (1..=n)
            .find(|&l| {
                let keys_held = (l + 1).saturating_sub(s.window) >= n.saturating_sub(key_rows);
                let raw_held = s.rate == 0 || {
                    let open = l / s.rate * s.rate;
                    open.saturating_sub(s.rate * usize::from(s.overlap))
                        >= n.saturating_sub(raw_rows)
                };
                keys_held && raw_held
            })
            .unwrap_or(0)
    }

    #[test]
    fn the_floor_is_the_first_cut_whose_window_and_open_rows_are_held() {
        for (rate, overlap) in [(0, false), (4, true), (8, false), (3, true)] {
            for slack in [1, 2, 5] {
                let s = shape(rate, overlap);
                for n in 0..60 {
                    let mut ring = RingCache::new(s, slack, 64);
                    fill(&mut ring, n);
                    let want = floor_by_definition(s, ring.key_rows, ring.raw_rows, n);
                    // Cutting to 0 always works (the sequence starts over).
                    assert_eq!(
                        ring.floor().max(n.min(1)),
                        want,
                        "rate {rate} slack {slack} n {n}"
                    );
                    assert!(
                        n - ring.floor().min(n) >= slack.min(n),
                        "cut depth below slack"
                    );
                }
            }
        }
    }

    #[test]
    fn a_written_ring_reads_back_into_the_same_state() {
        for (rate, overlap) in [(0, false), (4, true), (8, false)] {
            let s = shape(rate, overlap);
            for n in [0, 3, 17, 40, 59] {
                let mut ring = RingCache::new(s, 3, 64);
                fill(&mut ring, n + 2);
                // Saved at `n`, two positions before what the ring holds, as a slot whose
                // last tokens were not fed yet.
                let n = n.max(ring.floor());
                let mut bytes = Vec::new();
                ring.write(n, &mut bytes).unwrap();
                let mut back = RingCache::new(s, 3, 64);
                back.read(n, &mut &bytes[..]).unwrap();
                assert!(back.floor() <= n);
                for p in back.floor().saturating_sub(s.window)..n {
                    if p + s.window > back.floor() && p >= back.key_lo {
                        assert_eq!(back.key(p), ring.key(p), "key {p}");
                    }
                    if rate > 0 && p >= back.raw_lo {
                        assert_eq!(back.raw(p), ring.raw(p), "raw {p}");
                    }
                }
                for w in 0..n.checked_div(rate).unwrap_or(0) {
                    assert_eq!(back.entry(w), ring.entry(w), "entry {w}");
                }
                // Truncated or padded bytes are refused.
                let mut short = RingCache::new(s, 3, 64);
                if !bytes.is_empty() {
                    assert!(short.read(n, &mut &bytes[..bytes.len() - 1]).is_err());
                }
                let mut far = bytes.clone();
                far[..8].copy_from_slice(&(n as u64 + 1).to_le_bytes());
                assert!(short.read(n, &mut &far[..]).is_err());
                // Raw rows starting inside the open window (or, on CSA, the window
                // before it) cannot finish its entry: refused.
                if rate > 0 && n > 2 * rate && n % rate != 0 {
                    let mut gap = RingCache::new(s, 3, 64);
                    fill(&mut gap, n);
                    let open = n / rate * rate - rate * usize::from(overlap);
                    gap.raw_lo = open + 1;
                    let mut bytes = Vec::new();
                    gap.write(n, &mut bytes).unwrap();
                    let err = RingCache::new(s, 3, 64).read(n, &mut &bytes[..]);
                    assert!(err.is_err(), "rate {rate} n {n}");
                }
            }
        }
    }
}
