//! The answers the mask's shortcuts ask of the automaton: where every character of a
//! slice class (or every non-ASCII character) leads from a state, whether a class's
//! strings stay alive, and the few ASCII characters a state treats apart.

use super::*;

/// A cached answer of [`Stepper::uniform`] or [`Stepper::non_ascii`] as a [`Uniform`].
fn as_uniform(known: u32) -> Uniform {
    match known {
        NONUNIFORM => Uniform::No,
        DEAD => Uniform::Dead,
        t => Uniform::To(t),
    }
}

/// Every character past ASCII (surrogates are no characters).
const NON_ASCII: &[(u32, u32)] = &[(0x80, 0xD7FF), (0xE000, 0x10FFFF)];

/// [`Stepper::apart`]'s cached answer for an element with more than a few characters
/// apart (no set of ASCII characters has every bit, `0x7F` included, and the class's).
const APART_MANY: u128 = u128::MAX;

/// The exception characters of a slice class at a state and where the others lead.
pub(crate) type Except = Option<(Vec<u8>, Option<u32>)>;

impl Stepper<'_> {
    /// Where the characters of slice class `k` lead from `s`, when they all lead to the
    /// same place. Characters every stack top treats alike (inside or outside its set)
    /// lead to the same state, so one representative decides.
    pub(crate) fn uniform(&mut self, s: u32, k: usize) -> Uniform {
        let n = crate::slices::SLICE_CLASSES.len();
        let idx = s as usize * n + k;
        let mut known = self.dfa.uniform[idx];
        if known == UNKNOWN {
            let class = crate::slices::SLICE_CLASSES[k];
            known = if self.takes_all_or_none(&self.dfa.states[s as usize], class) {
                self.step_char(s, class[0].0).unwrap_or(DEAD)
            } else {
                NONUNIFORM
            };
            self.dfa.uniform[idx] = known;
        }
        as_uniform(known)
    }

    /// Whether every one of the stack tops `tops` (a state's, say) takes all the
    /// characters of `class` or none.
    pub(super) fn takes_all_or_none(&self, tops: &[u32], class: &[(u32, u32)]) -> bool {
        tops.iter()
            .all(|&top| match self.g.top_elem(&self.dfa.frames, top) {
                None => true,
                Some(Elem::Chars { ranges, .. }) => {
                    covers(ranges, class) || disjoint(ranges, class)
                }
                Some(Elem::Rule(_)) => false,
            })
    }

    /// Whether `c` is a state (at a character boundary) where every character of plain
    /// string content (`SLICE_CLASSES[0]`) is taken and leads back to the same state.
    pub(crate) fn loops_on_plain(&mut self, c: Cursor) -> bool {
        at_boundary(c) && matches!(self.uniform(c as u32, 0), Uniform::To(t) if t as Cursor == c)
    }

    /// Whether every string of slice class `k`'s characters stays alive from `s`: the
    /// states the class's characters reach from `s` (a few, at most 64) each take every
    /// character of the class.
    pub(crate) fn closed_alive(&mut self, s: u32, k: usize) -> bool {
        if let Some(&known) = self.dfa.alive.get(&(s, k as u32)) {
            return known;
        }
        let mut seen = vec![s];
        let mut i = 0;
        let mut ok = true;
        'all: while i < seen.len() {
            let u = seen[i];
            i += 1;
            let next: Vec<Option<u32>> = match self.uniform(u, k) {
                Uniform::To(t) => vec![Some(t)],
                Uniform::Dead => vec![None],
                Uniform::No => match self.except(u, k) {
                    Some((xs, others)) => {
                        let mut v = vec![others];
                        for x in xs {
                            v.push(self.step_char(u, x as u32));
                        }
                        v
                    }
                    None => {
                        ok = false;
                        break;
                    }
                },
            };
            for t in next {
                match t {
                    None => {
                        ok = false;
                        break 'all;
                    }
                    Some(t) if !seen.contains(&t) => {
                        seen.push(t);
                        if seen.len() > 64 {
                            ok = false;
                            break 'all;
                        }
                    }
                    Some(_) => {}
                }
            }
        }
        self.dfa.alive.insert((s, k as u32), ok);
        ok
    }

    /// For slice class `k` at state `s` where its characters do not all lead to one state:
    /// the few ASCII characters some stack top treats apart, and where every other
    /// character of the class leads (`None`: refused), if that is all that differs.
    pub(crate) fn except(&mut self, s: u32, k: usize) -> Except {
        if let Some(known) = self.dfa.except.get(&(s, k as u32)) {
            return known.clone();
        }
        let class = crate::slices::SLICE_CLASSES[k];
        let mut set = 0u128;
        let mut ok = true;
        for i in 0..self.dfa.states[s as usize].len() {
            let top = self.dfa.states[s as usize][i];
            if top == NIL {
                continue;
            }
            match self.apart(top, k) {
                Some(bits) => set |= bits,
                None => {
                    ok = false;
                    break;
                }
            }
        }
        let r = if ok && set != 0 && set.count_ones() <= 48 {
            let xs: Vec<u8> = (0..128u8).filter(|&c| set >> c & 1 != 0).collect();
            let rep = (0x20u32..0x7F)
                .find(|c| set >> c & 1 == 0 && class.iter().any(|&(a, b)| a <= *c && *c <= b));
            rep.map(|rep| (xs, self.step_char(s, rep)))
        } else {
            None
        };
        self.dfa.except.insert((s, k as u32), r.clone());
        r
    }

    /// The ASCII characters of slice class `k` that the element of frame `top` treats
    /// apart from the class's others (one bit each; none when it takes all of the class
    /// or none), or `None` when they are not a few ASCII characters. Depends on the
    /// element alone, so it is kept per position.
    fn apart(&mut self, top: u32, k: usize) -> Option<u128> {
        let pos = self.dfa.frames[top as usize].0;
        if let Some(&known) = self.dfa.apart.get(&(pos, k as u32)) {
            return (known != APART_MANY).then_some(known);
        }
        let class = crate::slices::SLICE_CLASSES[k];
        let bits = match self.g.top_elem(&self.dfa.frames, top) {
            Some(Elem::Chars { negated, ranges }) => {
                if covers(ranges, class) || disjoint(ranges, class) {
                    Some(0)
                } else {
                    // The class's characters inside the ranges and outside them: how many,
                    // and which of them are ASCII (no list of ranges built).
                    let size = |v: &[(u32, u32)]| {
                        v.iter().map(|&(a, b)| (b - a + 1) as usize).sum::<usize>()
                    };
                    let within: usize = ranges
                        .iter()
                        .map(|&(x, y)| {
                            let overlap = |&(p, q): &(u32, u32)| {
                                let (lo, hi) = (x.max(p), y.min(q));
                                if lo <= hi {
                                    (hi - lo + 1) as usize
                                } else {
                                    0
                                }
                            };
                            class.iter().map(overlap).sum::<usize>()
                        })
                        .sum();
                    let without = size(class) - within;
                    let (class_ascii, ranges_ascii) = (ascii_bits(class), ascii_bits(ranges));
                    let (within_ascii, without_ascii) =
                        (class_ascii & ranges_ascii, class_ascii & !ranges_ascii);
                    let (inside, outside) = if *negated {
                        ((without, without_ascii), (within, within_ascii))
                    } else {
                        ((within, within_ascii), (without, without_ascii))
                    };
                    let small = if inside.0 <= 48 {
                        Some(inside)
                    } else if outside.0 <= 48 {
                        Some(outside)
                    } else {
                        None
                    };
                    // Kept only when every one of them is ASCII.
                    small
                        .filter(|&(n, bits)| bits.count_ones() as usize == n)
                        .map(|(_, bits)| bits)
                }
            }
            _ => None,
        };
        self.dfa
            .apart
            .insert((pos, k as u32), bits.unwrap_or(APART_MANY));
        bits
    }

    /// Where every non-ASCII character leads from `s`, when they all lead to the same
    /// place: every stack top takes all of them or none (a key outside the names it must
    /// not spell, string content), so one of them decides.
    pub(crate) fn non_ascii(&mut self, s: u32) -> Uniform {
        let mut known = self.dfa.non_ascii[s as usize];
        if known == UNKNOWN {
            known = if !self.dfa.reference
                && self.takes_all_or_none(&self.dfa.states[s as usize], NON_ASCII)
            {
                self.compute(s, NON_ASCII[0].0)
            } else {
                NONUNIFORM
            };
            self.dfa.non_ascii[s as usize] = known;
        }
        as_uniform(known)
    }
}
