//! Stepping through the shared automaton: character and byte transitions computed on
//! first use, ASCII groups, stack expansion and cursors inside characters (the answers
//! the mask's shortcuts ask for are in `shortcuts.rs`).

use super::*;

/// Steps through the shared automaton (while its lock is held).
pub(crate) struct Stepper<'a> {
    pub(super) g: &'a Compiled,
    pub(super) dfa: &'a mut Dfa,
}

impl Stepper<'_> {
    /// The state after character `c` from state `s`, or `None` if `c` is refused.
    pub(crate) fn step_char(&mut self, s: u32, c: u32) -> Option<u32> {
        let t = if c < 128 {
            self.ascii(s, c)
        } else if let Some(t) = self.non_ascii_target(s) {
            t
        } else {
            let key = (s as u64) << 32 | c as u64;
            match self.dfa.chars.get(&key) {
                Some(&t) => t,
                None => {
                    let t = self.compute(s, c);
                    self.dfa.chars.insert(key, t);
                    t
                }
            }
        };
        (t != DEAD).then_some(t)
    }

    /// Where every non-ASCII character leads from `s` (a state or `DEAD`), if they all
    /// lead to one place.
    fn non_ascii_target(&mut self, s: u32) -> Option<u32> {
        match self.non_ascii(s) {
            Uniform::No => None,
            Uniform::Dead => Some(DEAD),
            Uniform::To(t) => Some(t),
        }
    }

    /// The transition of state `s` on ASCII character `c` (a state or `DEAD`).
    #[inline]
    pub(super) fn ascii(&mut self, s: u32, c: u32) -> u32 {
        let idx = slot(s, c as u8);
        let mut t = self.dfa.trans[idx];
        if t == UNKNOWN {
            self.fill_ascii(s);
            t = self.dfa.trans[idx];
        }
        if t < PARTIAL && t & GROUP != 0 {
            let gi = (t & !GROUP) as usize;
            t = self.dfa.groups[gi];
            if t == UNKNOWN {
                t = self.compute(s, c);
                self.dfa.groups[gi] = t;
            }
            self.dfa.trans[idx] = t;
        }
        t
    }

    /// Sorts every ASCII character of `s` at once into groups: characters the same stacks
    /// accept lead to the same state, so each group is advanced once, when first used.
    pub(super) fn fill_ascii(&mut self, s: u32) {
        // The partition depends on the stack tops' elements only, so states with the
        // same relative stacks share it.
        let r = self.dfa.rel_of[s as usize];
        let known = if r == NONE {
            None
        } else {
            Some(self.dfa.ascii_groups[r as usize]).filter(|&p| p != UNKNOWN)
        };
        let p = match known {
            Some(p) => p,
            None => {
                let p = match self.ascii_pattern(s) {
                    Some((pattern, n)) => {
                        self.dfa.patterns.push((pattern, n));
                        (self.dfa.patterns.len() - 1) as u32
                    }
                    None => NONE,
                };
                if r != NONE {
                    self.dfa.ascii_groups[r as usize] = p;
                }
                p
            }
        };
        if p == NONE {
            for c in 0..128u32 {
                let t = self.compute(s, c);
                self.dfa.trans[slot(s, c as u8)] = t;
            }
            return;
        }
        let base = self.dfa.groups.len() as u32;
        let (pattern, n) = &self.dfa.patterns[p as usize];
        let row = &mut self.dfa.trans[slot(s, 0)..slot(s, 0) + 128];
        for (t, &g) in row.iter_mut().zip(pattern.iter()) {
            *t = if g == u8::MAX {
                DEAD
            } else {
                GROUP | (base + g as u32)
            };
        }
        let n = *n as usize;
        self.dfa.groups.extend(std::iter::repeat_n(UNKNOWN, n));
    }

    /// Sorts the ASCII characters of `s` into groups: each character's group (in order of
    /// first use, `u8::MAX` for refused) and the number of groups, or `None` past 64
    /// distinct sets of tops (then each character is stepped on its own).
    fn ascii_pattern(&self, s: u32) -> Option<([u8; 128], u32)> {
        // Tops with the same ASCII set take the same characters, so a character's group is
        // decided by the distinct sets that hold it (many stacks under different
        // continuations share a few sets).
        let (mut buf, mut n) = ([0u128; 64], 0);
        for &top in &self.dfa.states[s as usize] {
            if let Some(e) = self.g.top_elem(&self.dfa.frames, top) {
                let set = e.ascii_set();
                if set != 0 && !buf[..n].contains(&set) {
                    if n == 64 {
                        return None;
                    }
                    buf[n] = set;
                    n += 1;
                }
            }
        }
        let sets = &buf[..n];
        // The classes of characters in the same sets: the union of the sets, split by
        // each set in turn (a few classes, each a bit set, so a split costs two ANDs and
        // a character is never visited by itself).
        let (mut cbuf, mut nc) = ([0u128; 128], 0);
        let all = sets.iter().fold(0u128, |a, &s| a | s);
        if all != 0 {
            cbuf[0] = all;
            nc = 1;
        }
        for &set in sets {
            // The classes before this set's splits (the parts split off lie outside it).
            let before = nc;
            for i in 0..before {
                let (inside, outside) = (cbuf[i] & set, cbuf[i] & !set);
                if inside != 0 && outside != 0 {
                    cbuf[i] = inside;
                    cbuf[nc] = outside;
                    nc += 1;
                }
            }
        }
        // Numbered in order of their first character.
        let classes = &mut cbuf[..nc];
        classes.sort_unstable_by_key(|c| c.trailing_zeros());
        let mut pattern = [u8::MAX; 128];
        for (g, &class) in classes.iter().enumerate() {
            let mut bits = class;
            while bits != 0 {
                pattern[bits.trailing_zeros() as usize] = g as u8;
                bits &= bits - 1;
            }
        }
        Some((pattern, classes.len() as u32))
    }

    /// The state after character `c` from state `s` (or `DEAD`). A state relative to its
    /// anchors takes the step of its relative stacks, computed once for every state of
    /// the same shape, unless a stack pops into an anchor: then its concrete stacks step.
    pub(super) fn compute(&mut self, s: u32, c: u32) -> u32 {
        if let Some(t) = self.compute_relative(s, c) {
            return t;
        }
        self.dfa.steps_made += 1;
        let mut src = std::mem::take(&mut self.dfa.src);
        self.dfa.concrete_tops(s, &mut src);
        let mut tops = std::mem::take(&mut self.dfa.tops);
        let t = if self.advance(&src, c, &mut tops) {
            self.dfa.intern(&tops)
        } else {
            DEAD
        };
        self.dfa.tops = tops;
        self.dfa.src = src;
        t
    }

    /// The stack tops after character `c` from the stacks topped by `src` into `out`
    /// (cleared first); false if no stack takes it.
    pub(super) fn advance(&mut self, src: &[u32], c: u32, out: &mut Vec<u32>) -> bool {
        out.clear();
        for &top in src {
            let Some(e) = self.g.top_elem(&self.dfa.frames, top) else {
                continue;
            };
            if e.accepts(c) {
                let ((r, a, i), parent, _) = self.dfa.frames[top as usize];
                let f = self.dfa.frame((r, a, i + 1), parent);
                // Each top's expansion starts with nothing seen.
                self.dfa.seen.clear();
                self.expand(f, out);
            }
        }
        if out.is_empty() {
            return false;
        }
        out.sort_unstable();
        out.dedup();
        out.truncate(MAX_STACKS);
        true
    }

    /// Normalises the stack topped by frame `f` (popping finished positions, expanding
    /// rule references, a reference that ends its alternative replacing the frame: a tail
    /// call) into stacks whose top waits for a character, pushing their tops onto `out`.
    /// A frame met again in one expansion expands to what it gave the first time, so it is
    /// skipped (`seen`): repetitions of bodies that can be empty do not loop. A walk with
    /// its own work list (no recursion: a long chain of references cannot overflow the
    /// thread's stack), in the order of a depth-first recursion.
    pub(super) fn expand(&mut self, f: u32, out: &mut Vec<u32>) {
        let g = self.g;
        let mut work = std::mem::take(&mut self.dfa.work);
        work.clear();
        work.push(Work::Frame(f));
        while let Some(item) = work.pop() {
            let f = match item {
                Work::Frame(f) => f,
                Work::Alts { sub, next, base } => {
                    if (next as usize) < g.rules[sub as usize].len() {
                        work.push(Work::Alts {
                            sub,
                            next: next + 1,
                            base,
                        });
                        work.push(Work::Frame(self.dfa.frame((sub, next, 0), base)));
                    }
                    continue;
                }
            };
            if out.len() >= MAX_STACKS || self.dfa.seen.len > 4 * MAX_STACKS {
                // A bound met (a relative step is then not taken).
                self.dfa.escaped = true;
                continue;
            }
            if !self.dfa.seen.insert(f) {
                continue;
            }
            if f == NIL {
                out.push(NIL);
                continue;
            }
            let ((r, a, i), parent, depth) = self.dfa.frames[f as usize];
            self.dfa.max_depth = self.dfa.max_depth.max(depth);
            if depth as usize > MAX_STACK {
                continue;
            }
            let alt = &g.rules[r as usize][a as usize];
            match alt.get(i as usize) {
                None => {
                    // Continue after the reference that led here.
                    let next = if parent == NIL {
                        NIL
                    } else if is_hole(parent) {
                        // Into an anchor: a relative step cannot tell where.
                        self.dfa.escaped = true;
                        continue;
                    } else {
                        let ((pr, pa, pi), pp, _) = self.dfa.frames[parent as usize];
                        self.dfa.frame((pr, pa, pi + 1), pp)
                    };
                    work.push(Work::Frame(next));
                }
                Some(Elem::Chars { .. }) => out.push(f),
                Some(Elem::Rule(sub)) => {
                    let base = if i as usize + 1 == alt.len() {
                        parent
                    } else {
                        f
                    };
                    work.push(Work::Alts {
                        sub: *sub as u32,
                        next: 0,
                        base,
                    });
                }
            }
        }
        self.dfa.work = work;
    }

    /// The cursor for state `s` with the bytes `p` of a character begun (valid, checked).
    pub(super) fn cursor(&mut self, s: u32, p: &[u8]) -> Option<Cursor> {
        let mut c = s as Cursor;
        for &b in p {
            c = self.step(c, b)?;
        }
        Some(c)
    }

    /// The bytes of the character a cursor is inside (none at a boundary).
    pub(super) fn pending_of(&self, cur: Cursor) -> Partial {
        if cur & LOOSE != 0 {
            loose_bytes(cur)
        } else if at_boundary(cur) {
            Partial::default()
        } else {
            self.dfa.pnodes[(cur as u32 & !PARTIAL) as usize].1
        }
    }

    /// The cursor after byte `b` (UTF-8 decoded incrementally), or `None` if refused.
    #[inline]
    pub(crate) fn step(&mut self, cur: Cursor, b: u8) -> Option<Cursor> {
        if cur & LOOSE != 0 {
            return step_loose(cur, b);
        }
        let cur32 = cur as u32;
        if b < 0x80 && at_boundary(cur) {
            let t = self.ascii(cur32, b as u32);
            return (t != DEAD).then_some(t as Cursor);
        }
        let slot = if at_boundary(cur) {
            if (0x80..0xC0).contains(&b) {
                // A continuation byte where a character would begin.
                return None;
            }
            slot(cur32, b)
        } else {
            if !(0x80..0xC0).contains(&b) {
                return None;
            }
            (cur32 & !PARTIAL) as usize * 64 + (b - 0x80) as usize
        };
        let t = if at_boundary(cur) {
            self.dfa.trans[slot]
        } else {
            self.dfa.pnext[slot]
        };
        let t = if t == UNKNOWN {
            let t = self.compute_byte(cur32, b);
            if at_boundary(cur) {
                self.dfa.trans[slot] = t;
            } else {
                self.dfa.pnext[slot] = t;
            }
            t
        } else {
            t
        };
        match t {
            DEAD => None,
            LOOSE_LEAD => {
                // Every non-ASCII character leads to one state (known: it was asked).
                let Uniform::To(target) = self.non_ascii(cur32) else {
                    unreachable!("a loose lead byte at a state of no single target")
                };
                Some(LOOSE | (b as Cursor) << 32 | 1 << 56 | target as Cursor)
            }
            t => Some(t as Cursor),
        }
    }

    /// The transition on byte `b` of a state, or of an unfinished-character node (`cur`
    /// with its `PARTIAL` bit): a state, a node, `DEAD` or `LOOSE_LEAD`.
    pub(super) fn compute_byte(&mut self, cur: u32, b: u8) -> u32 {
        let (s, mut p) = if at_boundary(cur as Cursor) {
            (cur, Partial::default())
        } else {
            self.dfa.pnodes[(cur & !PARTIAL) as usize]
        };
        if p.len == 0 && b < 0x80 {
            return self.step_char(s, b as u32).unwrap_or(DEAD);
        }
        if p.len == 0 {
            // A character begun where every non-ASCII character leads to one place: its
            // bytes are checked by the cursor alone (`step_loose`), with no node.
            match self.non_ascii(s) {
                Uniform::Dead => return DEAD,
                Uniform::To(_) => {
                    // A lead byte (not a continuation, not C0/C1/F5..).
                    let lead = utf8_start(&[b]) == Utf8::Begun;
                    return if lead { LOOSE_LEAD } else { DEAD };
                }
                Uniform::No => {}
            }
        }
        let mut buf = [0u8; 4];
        let n = p.len as usize;
        buf[..n].copy_from_slice(p.as_slice());
        buf[n] = b;
        match std::str::from_utf8(&buf[..=n]) {
            Ok(text) => {
                let c = text.chars().next().expect("one char") as u32;
                self.step_char(s, c).unwrap_or(DEAD)
            }
            Err(e) if e.error_len().is_none() && n < 3 => {
                p.bytes[n] = b;
                p.len += 1;
                // Half a character: kept only if some character it can still become is
                // allowed here.
                let (lo, hi) = prefix_range(p.as_slice());
                let frames = &self.dfa.frames;
                if !self.g.could_accept(
                    self.dfa.states[s as usize]
                        .iter()
                        .filter_map(|&t| self.g.top_elem(frames, t)),
                    lo,
                    hi,
                ) {
                    return DEAD;
                }
                if let Some(&id) = self.dfa.pindex.get(&(s, p)) {
                    return id | PARTIAL;
                }
                let id = self.dfa.pnodes.len() as u32;
                self.dfa.pnodes.push((s, p));
                self.dfa.pnext.extend(std::iter::repeat_n(UNKNOWN, 64));
                self.dfa.pindex.insert((s, p), id);
                id | PARTIAL
            }
            Err(_) => DEAD,
        }
    }
}

/// The bytes of a loose cursor's unfinished character.
fn loose_bytes(cur: Cursor) -> Partial {
    let len = (cur >> 56 & 3) as u8;
    let b = (cur >> 32).to_le_bytes();
    Partial {
        bytes: [b[0], b[1], b[2]],
        len,
    }
}

/// A loose cursor after byte `b`: its target state once the character is whole, the
/// cursor with one more byte while it is a valid beginning, else `None`. (The target's
/// state takes every non-ASCII character, so any valid beginning is alive.)
fn step_loose(cur: Cursor, b: u8) -> Option<Cursor> {
    let p = loose_bytes(cur);
    let n = p.len as usize;
    let mut buf = [0u8; 4];
    buf[..n].copy_from_slice(p.as_slice());
    buf[n] = b;
    match utf8_start(&buf[..=n]) {
        Utf8::Whole => Some(cur & 0xFFFF_FFFF),
        Utf8::Begun => {
            let len = (n as Cursor + 1) << 56;
            Some(cur & !(3 << 56) | (b as Cursor) << (32 + 8 * n) | len)
        }
        Utf8::Invalid => None,
    }
}

/// What one to four bytes are at the start of UTF-8 text.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Utf8 {
    /// One whole character.
    Whole,
    /// The beginning of a character, which more bytes can finish.
    Begun,
    /// Neither: no valid text starts so, or it holds more than one character.
    Invalid,
}

/// Judges `b` (one to four bytes) as `std::str::from_utf8` would, from the table of
/// well-formed sequences (Unicode 15, table 3-7) instead of a general decoder: a cursor
/// inside a character asks this of every byte a mask walks.
pub(super) fn utf8_start(b: &[u8]) -> Utf8 {
    let (len, lo, hi) = match b[0] {
        0x00..=0x7F => {
            return if b.len() == 1 {
                Utf8::Whole
            } else {
                Utf8::Invalid
            }
        }
        0xC2..=0xDF => (2, 0x80, 0xBF),
        0xE0 => (3, 0xA0, 0xBF),
        0xE1..=0xEC | 0xEE..=0xEF => (3, 0x80, 0xBF),
        0xED => (3, 0x80, 0x9F),
        0xF0 => (4, 0x90, 0xBF),
        0xF1..=0xF3 => (4, 0x80, 0xBF),
        0xF4 => (4, 0x80, 0x8F),
        _ => return Utf8::Invalid,
    };
    if b.len() > len
        || b.len() > 1 && !(lo..=hi).contains(&b[1])
        || b.iter().skip(2).any(|&c| !(0x80..=0xBF).contains(&c))
    {
        return Utf8::Invalid;
    }
    if b.len() == len {
        Utf8::Whole
    } else {
        Utf8::Begun
    }
}
