//! The grammar matcher: which text a grammar still allows, character by character.
//!
//! The grammar is compiled into plain rules whose alternatives are sequences of character
//! sets and rule references (repetitions become helper rules). A matcher state is the set
//! of possible parse stacks, each stack the positions still to match, innermost last; a
//! character advances every stack whose next element accepts it and expands rule
//! references until each stack's top is a character set (or the stack is empty: the text so
//! far is a complete sentence). Bytes are decoded as UTF-8 incrementally, so a token may end
//! in the middle of a character.

use crate::gbnf::{Expr, Grammar};
use crate::schema::{SchemaInfo, SchemaNote, Violation};
use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hash, Hasher};
use std::sync::{Arc, Mutex};

/// A fast non-cryptographic hasher (the Fx mix) for the automaton's state index.
#[derive(Default)]
struct Fx(u64);

impl Hasher for Fx {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(b as u64);
        }
    }
    fn write_u32(&mut self, v: u32) {
        self.write_u64(v as u64);
    }
    fn write_usize(&mut self, v: usize) {
        self.write_u64(v as u64);
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = (self.0.rotate_left(5) ^ v).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

type BuildFx = BuildHasherDefault<Fx>;

/// One element of a compiled alternative.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Elem {
    /// A character in (or, negated, not in) these inclusive ranges (sorted, disjoint).
    Chars {
        negated: bool,
        ranges: Vec<(u32, u32)>,
    },
    /// Another compiled rule.
    Rule(usize),
}

impl Elem {
    fn accepts(&self, c: u32) -> bool {
        match self {
            Elem::Chars { negated, ranges } => {
                ranges.iter().any(|&(a, b)| a <= c && c <= b) != *negated
            }
            Elem::Rule(_) => false,
        }
    }

    /// The ASCII characters it accepts, one bit each (what [`Elem::accepts`] says of
    /// `0..128`, from one pass over the ranges).
    fn ascii_set(&self) -> u128 {
        match self {
            Elem::Chars { negated, ranges } => {
                let mut set = 0u128;
                for &(a, b) in ranges.iter().take_while(|r| r.0 < 128) {
                    let b = b.min(127);
                    // Bits a..=b.
                    set |= (u128::MAX >> (127 - b)) & (u128::MAX << a);
                }
                if *negated {
                    !set
                } else {
                    set
                }
            }
            Elem::Rule(_) => 0,
        }
    }
}

/// A compiled grammar: rules as alternatives of element sequences, the start state, and
/// the automaton its matchers share.
#[derive(Debug)]
pub struct Compiled {
    rules: Vec<Vec<Vec<Elem>>>,
    root: usize,
    start: StateData,
    dfa: Mutex<Dfa>,
    schema: Option<Arc<SchemaInfo>>,
}

/// A position: rule, alternative, index of the next element.
pub type Pos = (u32, u32, u32);

/// Deepest stack accepted (guards against pathological grammars).
const MAX_STACK: usize = 4096;

/// Most stacks kept at once (ambiguous grammars can multiply them).
const MAX_STACKS: usize = 4096;

/// Most states the lazy automaton keeps before it starts afresh.
const MAX_DFA_STATES: usize = 1 << 14;

/// Transition not computed yet.
const UNKNOWN: u32 = u32::MAX;
/// No frame: the bottom of a stack, or (as a state's top) an empty stack.
const NIL: u32 = u32::MAX;
/// Transition to nothing: the byte is refused.
const DEAD: u32 = u32::MAX - 1;
/// The characters of a class do not all lead to the same state.
const NONUNIFORM: u32 = u32::MAX - 2;

/// Where every character of a slice class leads from a state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Uniform {
    /// Not all to the same place.
    No,
    /// All refused.
    Dead,
    /// All to this state.
    To(u32),
}

/// A matcher state: the parse stacks (sorted, deduplicated) and the bytes of an incomplete
/// UTF-8 character.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
struct StateData {
    /// Each stack's top is a position whose next element is a character set, or the stack
    /// is empty (complete).
    stacks: Vec<Vec<Pos>>,
    pending: Vec<u8>,
}

/// Bytes of an unfinished UTF-8 character (a lead byte and up to two more).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
struct Partial {
    bytes: [u8; 3],
    len: u8,
}

impl Partial {
    fn as_slice(&self) -> &[u8] {
        &self.bytes[..self.len as usize]
    }
}

/// A cursor: a state id (parse stacks at a character boundary), or with this bit an id of
/// an unfinished-character node (a state and the bytes of a character begun).
const PARTIAL: u32 = 1 << 30;

/// In a state's ASCII transitions: a group of characters accepted by the same stacks,
/// advanced when first used (`groups[index]`).
const GROUP: u32 = 1 << 29;

/// Where a matcher is in the automaton.
pub(crate) type Cursor = u32;

/// Whether a cursor is at a character boundary.
pub(crate) fn at_boundary(c: Cursor) -> bool {
    c & PARTIAL == 0
}

/// The lazily built deterministic automaton over matcher states: each state (parse stacks
/// at a character boundary) seen gets an id, and each (state, character) transition is
/// computed once — ASCII in a table, other characters in a map; the bytes inside a
/// multi-byte character are checked against the state without becoming states. Shared by
/// every matcher of a compiled grammar.
#[derive(Debug, Default)]
struct Dfa {
    /// Per state: the tops of its parse stacks (frame ids, `NIL` for an empty stack),
    /// sorted.
    states: Vec<Vec<u32>>,
    /// Stack frames, hash-consed: (position, parent frame or `NIL`, depth).
    frames: Vec<(Pos, u32, u32)>,
    frame_index: HashMap<(Pos, u32), u32, BuildFx>,
    /// State hash → ids of the states with that hash.
    index: HashMap<u64, Vec<u32>, BuildFx>,
    /// `states.len() * 256` byte transitions: ASCII to a state, lead bytes to an
    /// unfinished-character node.
    trans: Vec<u32>,
    /// (state << 32 | character) → state or `DEAD`, for non-ASCII characters.
    chars: HashMap<u64, u32, BuildFx>,
    /// Unfinished-character nodes: (state, bytes so far), each with 64 transitions on
    /// continuation bytes, and their index.
    pnodes: Vec<(u32, Partial)>,
    /// Results of ASCII character groups (`UNKNOWN` until first used).
    groups: Vec<u32>,
    /// (state, slice class) → [`Stepper::except`]'s answer.
    except: HashMap<(u32, u32), Except, BuildFx>,
    /// (state, slice class) → [`Stepper::closed_alive`]'s answer.
    alive: HashMap<(u32, u32), bool, BuildFx>,
    pnext: Vec<u32>,
    pindex: HashMap<(u32, Partial), u32, BuildFx>,
    /// Per state: the forced next character (`UNKNOWN` not computed, `DEAD` none).
    forced: Vec<u32>,
    /// Per state and slice class: where every character of the class leads
    /// (`UNKNOWN`, `NONUNIFORM`, `DEAD` or a state).
    uniform: Vec<u32>,
    /// Bumped when the automaton is cleared, so matchers know their id is stale.
    epoch: u64,
    /// Scratch of [`Stepper::advance`] and [`Stepper::expand`], kept for its memory.
    seen: HashSet<u32, BuildFx>,
    work: Vec<Work>,
    tops: Vec<u32>,
}

/// An item of [`Stepper::expand`]'s work list.
#[derive(Debug)]
enum Work {
    Frame(u32),
    /// Alternatives `next..` of rule `sub`, on top of frame `base`.
    Alts {
        sub: u32,
        next: u32,
        base: u32,
    },
}

impl Dfa {
    /// The frame (`pos` on top of `parent`).
    fn frame(&mut self, pos: Pos, parent: u32) -> u32 {
        if let Some(&f) = self.frame_index.get(&(pos, parent)) {
            return f;
        }
        let depth = if parent == NIL {
            1
        } else {
            self.frames[parent as usize].2 + 1
        };
        let f = self.frames.len() as u32;
        self.frames.push((pos, parent, depth));
        self.frame_index.insert((pos, parent), f);
        f
    }

    /// The state of materialized stacks.
    fn intern_stacks(&mut self, stacks: &[Vec<Pos>]) -> u32 {
        let mut tops: Vec<u32> = stacks
            .iter()
            .map(|st| st.iter().fold(NIL, |parent, &pos| self.frame(pos, parent)))
            .collect();
        tops.sort_unstable();
        tops.dedup();
        self.intern(&tops)
    }

    /// The stacks of state `s`, bottom first, sorted.
    fn materialize(&self, s: u32) -> Vec<Vec<Pos>> {
        let mut out: Vec<Vec<Pos>> = self.states[s as usize]
            .iter()
            .map(|&top| {
                let mut st = Vec::new();
                let mut f = top;
                while f != NIL {
                    st.push(self.frames[f as usize].0);
                    f = self.frames[f as usize].1;
                }
                st.reverse();
                st
            })
            .collect();
        out.sort();
        out
    }

    fn intern(&mut self, d: &[u32]) -> u32 {
        let h = {
            let mut f = Fx(0);
            d.hash(&mut f);
            f.finish()
        };
        if let Some(ids) = self.index.get(&h) {
            if let Some(&i) = ids.iter().find(|&&i| self.states[i as usize] == d) {
                return i;
            }
        }
        let i = self.states.len() as u32;
        self.states.push(d.to_vec());
        self.index.entry(h).or_default().push(i);
        self.trans.extend(std::iter::repeat_n(UNKNOWN, 256));
        self.forced.push(UNKNOWN);
        self.uniform.extend(std::iter::repeat_n(
            UNKNOWN,
            crate::slices::SLICE_CLASSES.len(),
        ));
        i
    }
}

/// Steps through the shared automaton (while its lock is held).
pub(crate) struct Stepper<'a> {
    g: &'a Compiled,
    dfa: &'a mut Dfa,
}

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
            let same = self.dfa.states[s as usize].iter().all(|&top| {
                match self.g.top_elem(&self.dfa.frames, top) {
                    None => true,
                    Some(Elem::Chars { ranges, .. }) => {
                        covers(ranges, class) || disjoint(ranges, class)
                    }
                    Some(Elem::Rule(_)) => false,
                }
            });
            known = if same {
                self.step_char(s, class[0].0).unwrap_or(DEAD)
            } else {
                NONUNIFORM
            };
            self.dfa.uniform[idx] = known;
        }
        match known {
            NONUNIFORM => Uniform::No,
            DEAD => Uniform::Dead,
            t => Uniform::To(t),
        }
    }

    /// Whether `c` is a state (at a character boundary) where every character of plain
    /// string content (`SLICE_CLASSES[0]`) is taken and leads back to the same state.
    pub(crate) fn loops_on_plain(&mut self, c: Cursor) -> bool {
        at_boundary(c) && matches!(self.uniform(c, 0), Uniform::To(t) if t == c)
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
        let mut xs: Vec<u8> = Vec::new();
        let mut ok = true;
        for &top in &self.dfa.states[s as usize] {
            let Some(e) = self.g.top_elem(&self.dfa.frames, top) else {
                continue;
            };
            let Elem::Chars { negated, ranges } = e else {
                ok = false;
                break;
            };
            if covers(ranges, class) || disjoint(ranges, class) {
                continue;
            }
            // The class's characters inside the ranges, and outside them.
            let within = intersect(ranges, class);
            let without = intersect(&crate::regex::complement(&within), class);
            let (inside, outside) = if *negated {
                (without, within)
            } else {
                (within, without)
            };
            let size =
                |v: &[(u32, u32)]| v.iter().map(|&(a, b)| (b - a + 1) as usize).sum::<usize>();
            let small = if size(&inside) <= 48 {
                inside
            } else if size(&outside) <= 48 {
                outside
            } else {
                ok = false;
                break;
            };
            for (a, b) in small {
                if b >= 128 {
                    ok = false;
                    break;
                }
                xs.extend((a..=b).map(|c| c as u8));
            }
        }
        xs.sort_unstable();
        xs.dedup();
        let r = if ok && !xs.is_empty() && xs.len() <= 48 {
            let rep = (0x20u32..0x7F).find(|c| {
                !xs.contains(&(*c as u8)) && class.iter().any(|&(a, b)| a <= *c && *c <= b)
            });
            rep.map(|rep| (xs, self.step_char(s, rep)))
        } else {
            None
        };
        self.dfa.except.insert((s, k as u32), r.clone());
        r
    }

    /// The state after character `c` from state `s`, or `None` if `c` is refused.
    pub(crate) fn step_char(&mut self, s: u32, c: u32) -> Option<u32> {
        let t = if c < 128 {
            self.ascii(s, c)
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

    /// The transition of state `s` on ASCII character `c` (a state or `DEAD`).
    #[inline]
    fn ascii(&mut self, s: u32, c: u32) -> u32 {
        let idx = s as usize * 256 + c as usize;
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
    fn fill_ascii(&mut self, s: u32) {
        let tops = &self.dfa.states[s as usize];
        if tops.len() > 64 {
            for c in 0..128u32 {
                let t = self.compute(s, c);
                self.dfa.trans[s as usize * 256 + c as usize] = t;
            }
            return;
        }
        let mut sigs = [0u64; 128];
        for (k, &top) in tops.iter().enumerate() {
            if let Some(e) = self.g.top_elem(&self.dfa.frames, top) {
                let mut set = e.ascii_set();
                while set != 0 {
                    sigs[set.trailing_zeros() as usize] |= 1 << k;
                    set &= set - 1;
                }
            }
        }
        let mut done: Vec<(u64, u32)> = Vec::new();
        for c in 0..128u32 {
            let sig = sigs[c as usize];
            let t = if sig == 0 {
                DEAD
            } else if let Some(&(_, t)) = done.iter().find(|d| d.0 == sig) {
                t
            } else {
                let t = GROUP | self.dfa.groups.len() as u32;
                self.dfa.groups.push(UNKNOWN);
                done.push((sig, t));
                t
            };
            self.dfa.trans[s as usize * 256 + c as usize] = t;
        }
    }

    fn compute(&mut self, s: u32, c: u32) -> u32 {
        let mut tops = std::mem::take(&mut self.dfa.tops);
        let t = if self.advance(s, c, &mut tops) {
            self.dfa.intern(&tops)
        } else {
            DEAD
        };
        self.dfa.tops = tops;
        t
    }

    /// The stack tops after character `c` from state `s` into `out` (cleared first); false
    /// if no stack takes it.
    fn advance(&mut self, s: u32, c: u32, out: &mut Vec<u32>) -> bool {
        out.clear();
        let n = self.dfa.states[s as usize].len();
        for k in 0..n {
            let top = self.dfa.states[s as usize][k];
            let Some(e) = self.g.top_elem(&self.dfa.frames, top) else {
                continue;
            };
            if e.accepts(c) {
                let ((r, a, i), parent, _) = self.dfa.frames[top as usize];
                let f = self.dfa.frame((r, a, i + 1), parent);
                // Each top's expansion starts with nothing seen (the set's memory reused).
                let mut seen = std::mem::take(&mut self.dfa.seen);
                seen.clear();
                self.expand(f, out, &mut seen);
                self.dfa.seen = seen;
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
    fn expand(&mut self, f: u32, out: &mut Vec<u32>, seen: &mut HashSet<u32, BuildFx>) {
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
            if out.len() >= MAX_STACKS || seen.len() > 4 * MAX_STACKS || !seen.insert(f) {
                continue;
            }
            if f == NIL {
                out.push(NIL);
                continue;
            }
            let ((r, a, i), parent, depth) = self.dfa.frames[f as usize];
            if depth as usize > MAX_STACK {
                continue;
            }
            let alt = &g.rules[r as usize][a as usize];
            match alt.get(i as usize) {
                None => {
                    // Continue after the reference that led here.
                    let next = if parent == NIL {
                        NIL
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

    /// The state a cursor is in (at its last character boundary).
    pub(crate) fn state_of(&self, c: Cursor) -> u32 {
        if at_boundary(c) {
            c
        } else {
            self.dfa.pnodes[(c & !PARTIAL) as usize].0
        }
    }

    /// The cursor for state `s` with the bytes `p` of a character begun (valid, checked).
    fn cursor(&mut self, s: u32, p: &[u8]) -> Option<Cursor> {
        let mut c = s;
        for &b in p {
            c = self.step(c, b)?;
        }
        Some(c)
    }

    /// The cursor after byte `b` (UTF-8 decoded incrementally), or `None` if refused.
    #[inline]
    pub(crate) fn step(&mut self, cur: Cursor, b: u8) -> Option<Cursor> {
        if b < 0x80 && at_boundary(cur) {
            let t = self.ascii(cur, b as u32);
            return (t != DEAD).then_some(t);
        }
        let slot = if at_boundary(cur) {
            cur as usize * 256 + b as usize
        } else {
            if !(0x80..0xC0).contains(&b) {
                return None;
            }
            (cur & !PARTIAL) as usize * 64 + (b - 0x80) as usize
        };
        let t = if at_boundary(cur) {
            self.dfa.trans[slot]
        } else {
            self.dfa.pnext[slot]
        };
        let t = if t == UNKNOWN {
            let t = self.compute_byte(cur, b);
            if at_boundary(cur) {
                self.dfa.trans[slot] = t;
            } else {
                self.dfa.pnext[slot] = t;
            }
            t
        } else {
            t
        };
        (t != DEAD).then_some(t)
    }

    fn compute_byte(&mut self, cur: Cursor, b: u8) -> u32 {
        let (s, mut p) = if at_boundary(cur) {
            (cur, Partial::default())
        } else {
            self.dfa.pnodes[(cur & !PARTIAL) as usize]
        };
        if p.len == 0 && b < 0x80 {
            return self.step_char(s, b as u32).unwrap_or(DEAD);
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

impl Compiled {
    /// Compiles a parsed grammar.
    pub fn new(g: &Grammar) -> Compiled {
        let mut c = Compiled {
            rules: vec![Vec::new(); g.rules.len()],
            root: g.root,
            start: StateData::default(),
            dfa: Mutex::new(Dfa::default()),
            schema: g.schema.clone(),
        };
        for (i, r) in g.rules.iter().enumerate() {
            let alts = c.alternatives(&r.expr);
            c.rules[i] = alts;
        }
        // The start state: the root's alternatives expanded (state 0 of the automaton).
        let mut dfa = Dfa::default();
        let mut st = Stepper {
            g: &c,
            dfa: &mut dfa,
        };
        let (mut tops, mut seen) = (Vec::new(), HashSet::default());
        for alt in 0..c.rules[c.root].len() {
            let f = st.dfa.frame((c.root as u32, alt as u32, 0), NIL);
            st.expand(f, &mut tops, &mut seen);
        }
        tops.sort_unstable();
        tops.dedup();
        let id = dfa.intern(&tops);
        c.start = StateData {
            stacks: dfa.materialize(id),
            pending: Vec::new(),
        };
        c.dfa = Mutex::new(dfa);
        c
    }

    fn fresh(&mut self, alts: Vec<Vec<Elem>>) -> usize {
        self.rules.push(alts);
        self.rules.len() - 1
    }

    fn alternatives(&mut self, e: &Expr) -> Vec<Vec<Elem>> {
        match e {
            Expr::Alt(v) => v.iter().flat_map(|x| self.alternatives(x)).collect(),
            _ => vec![self.sequence(e)],
        }
    }

    fn sequence(&mut self, e: &Expr) -> Vec<Elem> {
        match e {
            Expr::Seq(v) => v.iter().flat_map(|x| self.sequence(x)).collect(),
            Expr::Literal(l) => l
                .iter()
                .map(|&ch| Elem::Chars {
                    negated: false,
                    ranges: vec![(ch as u32, ch as u32)],
                })
                .collect(),
            Expr::Class { negated, ranges } => vec![Elem::Chars {
                negated: *negated,
                ranges: crate::regex::norm(
                    ranges.iter().map(|&(a, b)| (a as u32, b as u32)).collect(),
                ),
            }],
            Expr::Any => vec![Elem::Chars {
                negated: true,
                ranges: Vec::new(),
            }],
            Expr::Ref(i) => vec![Elem::Rule(*i)],
            Expr::Alt(_) => {
                let alts = self.alternatives(e);
                vec![Elem::Rule(self.fresh(alts))]
            }
            Expr::Repeat { expr, min, max } => {
                let body = self.sequence(expr);
                let mut out = Vec::new();
                for _ in 0..*min {
                    out.extend(body.iter().cloned());
                }
                match max {
                    None => {
                        // star ::= body star | ""
                        let star = self.fresh(Vec::new());
                        let mut rec = body.clone();
                        rec.push(Elem::Rule(star));
                        self.rules[star] = vec![rec, Vec::new()];
                        out.push(Elem::Rule(star));
                    }
                    Some(max) => {
                        // Nested optionals: (body (body (...)?)?)?
                        let mut tail: Option<usize> = None;
                        for _ in *min..*max {
                            let mut seq = body.clone();
                            if let Some(t) = tail {
                                seq.push(Elem::Rule(t));
                            }
                            tail = Some(self.fresh(vec![seq, Vec::new()]));
                        }
                        if let Some(t) = tail {
                            out.push(Elem::Rule(t));
                        }
                    }
                }
                out
            }
        }
    }

    /// States, computed character transitions, and checked unfinished characters of the
    /// shared automaton so far (a diagnostic).
    pub fn automaton_size(&self) -> (usize, usize, usize) {
        let dfa = self.dfa.lock().unwrap_or_else(|p| p.into_inner());
        let computed = dfa.trans.iter().filter(|&&t| t != UNKNOWN).count() + dfa.chars.len();
        (dfa.states.len(), computed, dfa.pnodes.len())
    }

    /// The JSON Schema this grammar was converted from, with its notes.
    pub fn schema(&self) -> Option<&SchemaInfo> {
        self.schema.as_deref()
    }

    /// Keywords of the schema that were ignored (unknown or vendor annotations), each
    /// with keyword and path.
    pub fn warnings(&self) -> &[SchemaNote] {
        self.schema.as_deref().map_or(&[], SchemaInfo::warnings)
    }

    /// Where the grammar accepts more than the schema, each with keyword and path;
    /// finished text is then validated ([`Compiled::check_complete`]).
    pub fn relaxations(&self) -> &[SchemaNote] {
        self.schema.as_deref().map_or(&[], SchemaInfo::relaxations)
    }

    /// Whether text the grammar accepts must still be validated against the schema.
    pub fn needs_validation(&self) -> bool {
        self.schema
            .as_deref()
            .is_some_and(SchemaInfo::needs_validation)
    }

    /// Checks text the grammar accepted as complete: always fine for an exact grammar;
    /// for a relaxed one, the schema's validator decides (and repeated member names are
    /// refused). A violation is reported, never ignored.
    pub fn check_complete(&self, text: &str) -> Result<(), Violation> {
        match self.schema.as_deref() {
            Some(s) => s.check(text),
            None => Ok(()),
        }
    }

    /// A matcher at the start of the grammar.
    pub fn matcher(&self) -> Matcher<'_> {
        Matcher {
            g: self,
            data: self.start.clone(),
            hint: (u64::MAX, 0),
        }
    }

    /// A matcher continuing from `state`, which [`Matcher::detach`] took from a matcher of
    /// this same grammar (a state of another grammar gives meaningless answers).
    pub fn resume(&self, state: MatcherState) -> Matcher<'_> {
        Matcher {
            g: self,
            data: state.data,
            hint: state.hint,
        }
    }

    /// The element a stack top waits for (`None` for an empty stack).
    fn top_elem<'a>(&'a self, frames: &[(Pos, u32, u32)], top: u32) -> Option<&'a Elem> {
        (top != NIL).then(|| {
            let ((r, a, i), _, _) = frames[top as usize];
            &self.rules[r as usize][a as usize][i as usize]
        })
    }

    /// Whether some stack's next element accepts a code point in `lo..=hi`.
    fn could_accept<'e>(
        &self,
        mut elems: impl Iterator<Item = &'e Elem>,
        lo: u32,
        hi: u32,
    ) -> bool {
        elems.any(|e| {
            match e {
                Elem::Chars {
                    negated: false,
                    ranges,
                } => ranges.iter().any(|&(x, y)| x <= hi && lo <= y),
                Elem::Chars {
                    negated: true,
                    ranges,
                } => {
                    // Some code point of lo..=hi outside every range.
                    let mut next = lo;
                    for &(x, y) in ranges {
                        if x > next {
                            break;
                        }
                        next = next.max(y.saturating_add(1));
                    }
                    next <= hi
                }
                Elem::Rule(_) => false,
            }
        })
    }

    /// The one character every continuation of `d` must start with, if there is one
    /// (and the text is not complete: then ending is another choice).
    fn forced_char(&self, frames: &[(Pos, u32, u32)], tops: &[u32]) -> Option<u32> {
        if tops.contains(&NIL) {
            return None;
        }
        let mut only = None;
        for &top in tops {
            match self.top_elem(frames, top).expect("non-empty") {
                Elem::Chars {
                    negated: false,
                    ranges,
                } => {
                    for &(x, y) in ranges {
                        if x != y || only.is_some_and(|o| o != x) {
                            return None;
                        }
                        only = Some(x);
                    }
                }
                _ => return None,
            }
        }
        only
    }

    /// Runs `f` with exclusive use of the shared automaton, positioned at `m`'s state.
    pub(crate) fn with_stepper<R>(
        &self,
        m: &Matcher,
        f: impl FnOnce(&mut Stepper, Cursor) -> R,
    ) -> R {
        let mut dfa = self.dfa.lock().unwrap_or_else(|p| p.into_inner());
        if dfa.states.len() > MAX_DFA_STATES || dfa.pnodes.len() > 4 * MAX_DFA_STATES {
            let epoch = dfa.epoch + 1;
            *dfa = Dfa {
                epoch,
                ..Dfa::default()
            };
        }
        let id = if m.hint.0 == dfa.epoch {
            m.hint.1
        } else {
            dfa.intern_stacks(&m.data.stacks)
        };
        let mut st = Stepper {
            g: self,
            dfa: &mut dfa,
        };
        let cur = st
            .cursor(id, &m.data.pending)
            .expect("a matcher's pending bytes were accepted");
        f(&mut st, cur)
    }
}

/// Whether the union of `ranges` contains every code point of `class`.
fn covers(ranges: &[(u32, u32)], class: &[(u32, u32)]) -> bool {
    class.iter().all(|&(lo, hi)| {
        // Walk the (sorted) ranges, extending coverage from lo.
        let mut next = lo;
        for &(x, y) in ranges {
            if x > next {
                break;
            }
            if y >= next {
                next = y.saturating_add(1);
            }
            if next > hi {
                return true;
            }
        }
        next > hi
    })
}

/// The exception characters of a slice class at a state and where the others lead.
pub(crate) type Except = Option<(Vec<u8>, Option<u32>)>;

/// The code points in both (sorted, disjoint) range lists.
fn intersect(a: &[(u32, u32)], b: &[(u32, u32)]) -> Vec<(u32, u32)> {
    let mut out = Vec::new();
    for &(x, y) in a {
        for &(p, q) in b {
            let (lo, hi) = (x.max(p), y.min(q));
            if lo <= hi {
                out.push((lo, hi));
            }
        }
    }
    crate::regex::norm(out)
}

/// Whether no code point of `class` is in `ranges`.
fn disjoint(ranges: &[(u32, u32)], class: &[(u32, u32)]) -> bool {
    ranges
        .iter()
        .all(|&(x, y)| class.iter().all(|&(lo, hi)| y < lo || hi < x))
}

/// The code points a valid UTF-8 prefix (lead byte and some continuation bytes) can still
/// become.
fn prefix_range(p: &[u8]) -> (u32, u32) {
    let n = match p[0] {
        0xC0..=0xDF => 2,
        0xE0..=0xEF => 3,
        _ => 4,
    };
    let lead = (p[0] & (0x7F >> n)) as u32;
    let fill = |c: u8| {
        let mut v = lead;
        for k in 1..n {
            let b = p.get(k).copied().unwrap_or(c);
            v = (v << 6) | (b & 0x3F) as u32;
        }
        v
    };
    // The shortest form rule: n-byte sequences encode at least these code points.
    let min = [0, 0, 0x80, 0x800, 0x10000][n];
    (fill(0x80).max(min), fill(0xBF).min(0x10FFFF))
}

/// The state of matching a text against a grammar. Cheap to clone; transitions are
/// computed once per grammar and shared.
#[derive(Clone, Debug)]
pub struct Matcher<'g> {
    g: &'g Compiled,
    data: StateData,
    /// (automaton epoch, state id) of `data`, when known.
    hint: (u64, u32),
}

/// A matcher's position without the borrow of its grammar, for owners that keep the
/// grammar beside it (an `Arc<Compiled>` and its state in one struct): moving in and out
/// is free, nothing is recomputed.
#[derive(Clone, Debug)]
pub struct MatcherState {
    data: StateData,
    hint: (u64, u32),
}

impl<'g> Matcher<'g> {
    /// Lets go of the grammar, keeping the position ([`Compiled::resume`] takes it back).
    pub fn detach(self) -> MatcherState {
        MatcherState {
            data: self.data,
            hint: self.hint,
        }
    }

    /// Advances by one character; false (and unchanged) if the grammar does not allow it.
    pub fn accept_char(&mut self, c: char) -> bool {
        let mut buf = [0u8; 4];
        self.accept_bytes(c.encode_utf8(&mut buf).as_bytes())
    }

    /// Advances by bytes (UTF-8, characters may be split across calls); false (and
    /// unchanged) if the grammar does not allow them or they are not valid UTF-8.
    pub fn accept_bytes(&mut self, bytes: &[u8]) -> bool {
        let g = self.g;
        let r = g.with_stepper(self, |st, mut cur| {
            for &b in bytes {
                cur = st.step(cur, b)?;
            }
            let s = st.state_of(cur);
            let stacks = if s == self.hint.1 && self.hint.0 == st.dfa.epoch {
                None
            } else {
                Some(st.dfa.materialize(s))
            };
            let pending = if at_boundary(cur) {
                Partial::default()
            } else {
                st.dfa.pnodes[(cur & !PARTIAL) as usize].1
            };
            Some((st.dfa.epoch, s, pending, stacks))
        });
        match r {
            Some((epoch, s, pending, stacks)) => {
                if let Some(stacks) = stacks {
                    self.data.stacks = stacks;
                }
                self.data.pending.clear();
                self.data.pending.extend_from_slice(pending.as_slice());
                self.hint = (epoch, s);
                true
            }
            None => false,
        }
    }

    /// The bytes every continuation must start with (at most `max`): the grammar allows
    /// exactly one next character at each of them and the text is not complete before
    /// them. An engine can draft the tokens of these bytes without sampling.
    pub fn forced_bytes(&self, max: usize) -> Vec<u8> {
        let g = self.g;
        g.with_stepper(self, |st, cur| {
            let mut out = Vec::new();
            if !at_boundary(cur) {
                return out;
            }
            let mut s = cur;
            while out.len() < max {
                let mut f = st.dfa.forced[s as usize];
                if f == UNKNOWN {
                    f = g
                        .forced_char(&st.dfa.frames, &st.dfa.states[s as usize])
                        .unwrap_or(DEAD);
                    st.dfa.forced[s as usize] = f;
                }
                let Some(c) = char::from_u32(f).filter(|_| f != DEAD) else {
                    break;
                };
                let mut buf = [0u8; 4];
                let enc = c.encode_utf8(&mut buf).as_bytes();
                if out.len() + enc.len() > max {
                    break;
                }
                s = st
                    .step_char(s, c as u32)
                    .expect("a forced character is accepted");
                out.extend_from_slice(enc);
            }
            out
        })
    }

    /// The state (parse stacks and pending bytes), for comparing matchers.
    pub fn state(&self) -> (&[Vec<Pos>], &[u8]) {
        (&self.data.stacks, &self.data.pending)
    }

    /// Whether the text so far is a complete sentence (end of sequence allowed here).
    pub fn is_complete(&self) -> bool {
        self.data.pending.is_empty() && self.data.stacks.iter().any(Vec::is_empty)
    }

    /// Whether no continuation is possible (nothing more may be added).
    pub fn is_dead_end(&self) -> bool {
        self.data.stacks.iter().all(Vec::is_empty)
    }

    /// The compiled grammar this matcher runs.
    pub fn grammar(&self) -> &'g Compiled {
        self.g
    }

    /// Whether `text` is a whole sentence of the grammar (a fresh matcher, every byte, end)
    /// and, when the grammar is a relaxed JSON Schema, valid against the schema.
    pub fn matches(g: &'g Compiled, text: &str) -> bool {
        let mut m = g.matcher();
        m.accept_bytes(text.as_bytes()) && m.is_complete() && g.check_complete(text).is_ok()
    }
}

#[cfg(test)]
mod tests;
