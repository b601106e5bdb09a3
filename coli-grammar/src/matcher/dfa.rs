//! The lazily built automaton's tables: states, hash-consed stack frames, byte and
//! character transitions, unfinished-character nodes and the shortcut caches.

use super::*;

/// A fast non-cryptographic hasher (the Fx mix) for the automaton's state index.
#[derive(Default)]
pub(super) struct Fx(u64);

impl Hasher for Fx {
    fn finish(&self) -> u64 {
        // The product's well-mixed middle bits brought down to the low bits the tables'
        // buckets are chosen by.
        self.0.rotate_left(26)
    }
    fn write(&mut self, bytes: &[u8]) {
        // Eight bytes per round (a slice of frame ids is hashed as its bytes).
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            self.write_u64(u64::from_le_bytes(c.try_into().expect("eight bytes")));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut last = [0u8; 8];
            last[..rest.len()].copy_from_slice(rest);
            self.write_u64(u64::from_le_bytes(last) ^ (rest.len() as u64) << 60);
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

pub(super) type BuildFx = BuildHasherDefault<Fx>;

/// A hasher for one `u128` key (a frame's position and parent packed): one folded
/// multiply of its halves, which mixes every input bit into the low bits the table's
/// buckets are chosen by (other writes go through [`Fx`]).
#[derive(Default)]
pub(super) struct Fold(Fx);

impl Hasher for Fold {
    fn finish(&self) -> u64 {
        self.0.finish()
    }
    fn write(&mut self, bytes: &[u8]) {
        self.0.write(bytes);
    }
    fn write_u128(&mut self, v: u128) {
        let (lo, hi) = (
            v as u64 ^ 0x243f_6a88_85a3_08d3,
            (v >> 64) as u64 ^ 0x1319_8a2e_0370_7344,
        );
        let m = lo as u128 * hi as u128;
        self.0 .0 = m as u64 ^ (m >> 64) as u64;
    }
}

/// A frame's key in the index: its position and parent, packed.
#[inline]
fn frame_key((r, a, i): Pos, parent: u32) -> u128 {
    r as u128 | (a as u128) << 32 | (i as u128) << 64 | (parent as u128) << 96
}

/// Bytes of an unfinished UTF-8 character (a lead byte and up to two more).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub(super) struct Partial {
    pub(super) bytes: [u8; 3],
    pub(super) len: u8,
}

impl Partial {
    pub(super) fn as_slice(&self) -> &[u8] {
        &self.bytes[..self.len as usize]
    }
}

/// The lazily built deterministic automaton over matcher states: each state (parse stacks
/// at a character boundary) seen gets an id, and each (state, character) transition is
/// computed once — ASCII in a table, other characters in a map; the bytes inside a
/// multi-byte character are checked against the state without becoming states. Shared by
/// every matcher of a compiled grammar.
#[derive(Debug, Default)]
pub(super) struct Dfa {
    /// Per state: the tops of its parse stacks (frame ids, `NIL` for an empty stack),
    /// sorted.
    pub(super) states: Vec<Vec<u32>>,
    /// Stack frames, hash-consed: (position, parent frame or `NIL`, depth).
    pub(super) frames: Vec<(Pos, u32, u32)>,
    pub(super) frame_index: HashMap<u128, u32, BuildHasherDefault<Fold>>,
    /// State hash → ids of the concrete states with that hash; (relative stacks <<
    /// 32 | anchor list) → the relative state (its tops are its relative stacks').
    pub(super) index: HashMap<u64, Vec<u32>, BuildFx>,
    pub(super) rel_states: HashMap<u64, u32, BuildFx>,
    /// `states.len() * ROW` byte transitions: ASCII to a state, lead bytes to an
    /// unfinished-character node.
    pub(super) trans: Vec<u32>,
    /// (state << 32 | character) → state or `DEAD`, for non-ASCII characters.
    pub(super) chars: HashMap<u64, u32, BuildFx>,
    /// Unfinished-character nodes: (state, bytes so far), each with 64 transitions on
    /// continuation bytes, and their index (states whose non-ASCII characters all lead to
    /// one place have none: their cursors are loose).
    pub(super) pnodes: Vec<(u32, Partial)>,
    /// Results of ASCII character groups (`UNKNOWN` until first used).
    pub(super) groups: Vec<u32>,
    /// (state, slice class) → [`Stepper::except`]'s answer.
    pub(super) except: HashMap<(u32, u32), Except, BuildFx>,
    /// (position, slice class) → the ASCII characters its element treats apart
    /// ([`Stepper::apart`]).
    pub(super) apart: HashMap<(Pos, u32), u128, BuildFx>,
    /// (state, slice class) → [`Stepper::closed_alive`]'s answer.
    pub(super) alive: HashMap<(u32, u32), bool, BuildFx>,
    pub(super) pnext: Vec<u32>,
    pub(super) pindex: HashMap<(u32, Partial), u32, BuildFx>,
    /// Per state: the forced next character (`UNKNOWN` not computed, `DEAD` none).
    pub(super) forced: Vec<u32>,
    /// Per state and slice class: where every character of the class leads
    /// (`UNKNOWN`, `NONUNIFORM`, `DEAD` or a state).
    pub(super) uniform: Vec<u32>,
    /// Per state: where every non-ASCII character leads, as `uniform` (see
    /// [`Stepper::non_ascii`]).
    pub(super) non_ascii: Vec<u32>,
    /// Keeps every state's stacks concrete and steps every non-ASCII character on its
    /// own (the reference the relative states and the `non_ascii` shortcut are tested
    /// against, `Compiled::reference_stepping`).
    pub(super) reference: bool,
    /// Bumped when the automaton is cleared, so matchers know their id is stale.
    pub(super) epoch: u64,
    /// Scratch of [`Stepper::advance`] and [`Stepper::expand`], kept for its memory.
    pub(super) seen: Marks,
    pub(super) work: Vec<Work>,
    pub(super) tops: Vec<u32>,
    pub(super) src: Vec<u32>,
    /// Per state: its anchor list (`NONE`: its stacks are concrete) and its relative
    /// stacks' id (`NONE` likewise); `states` holds the relative tops then.
    pub(super) anchors: Vec<u32>,
    pub(super) rel_of: Vec<u32>,
    /// Anchor lists (frames sharing one parent, sorted by position), the deepest frame
    /// of each, and their index.
    pub(super) anchor_lists: Vec<Vec<u32>>,
    pub(super) anchor_depth: Vec<u32>,
    pub(super) anchor_index: HashMap<Vec<u32>, u32, BuildFx>,
    /// Relative stacks (tops over holes), their index, and their steps by character.
    pub(super) rel_tops: Vec<Vec<u32>>,
    pub(super) rel_index: HashMap<Vec<u32>, u32, BuildFx>,
    pub(super) rel_steps: HashMap<(u32, u32), RelStep, BuildFx>,
    /// The anchors after a relative step (`RelStep::To`): each an old hole (`HOLE | k`)
    /// or a frame above one; and such frames made concrete, by (frame, old anchor).
    pub(super) rel_anchors: Vec<Vec<u32>>,
    pub(super) concretized: HashMap<(u32, u32), u32, BuildFx>,
    /// Per relative stacks: their ASCII groups ([`Stepper::fill_ascii`]), an index of
    /// `patterns` (each character's group and the count), `NONE` past 64 sets,
    /// `UNKNOWN` not sorted yet (indexed by relative stacks).
    pub(super) ascii_groups: Vec<u32>,
    /// Per relative stacks: how many holes they rest on.
    pub(super) rel_holes: Vec<u32>,
    pub(super) patterns: Vec<([u8; 128], u32)>,
    /// (anchor list, relative step's anchors) → the anchor list after the step.
    pub(super) anchor_steps: HashMap<(u32, u32), u32, BuildFx>,
    /// Scratch of `rebuild`: frames rebuilt in one pass, and a chain.
    pub(super) rebuilt: Marks,
    /// Scratch of a relative step's output and of `anchored`'s anchor per top.
    pub(super) rel_out: Vec<u32>,
    pub(super) anchor_of: Vec<u32>,
    pub(super) chain: Vec<u32>,
    /// Set by [`Stepper::expand`]: a stack popped into a hole or a bound was met; and
    /// the deepest frame it looked at.
    pub(super) escaped: bool,
    pub(super) max_depth: u32,
    /// Stacks stepped by [`Stepper::compute`] (a relative step or concrete stacks; a
    /// cached step is not counted), the count when the current mask's walk began (its
    /// budget counts from there), the budget when not the default
    /// ([`cold::COLD_BUDGET`]), and the cold walk's pools of scratch.
    pub(super) steps_made: usize,
    pub(super) walk_from: usize,
    pub(super) cold_budget: Option<usize>,
    pub(super) cold_nodes: Vec<ColdNode>,
    pub(super) cold_tops: Vec<Vec<u32>>,
}

/// Entries per state in the byte table: ASCII bytes, then lead bytes `0xC0..=0xFF` (a
/// continuation byte at a character boundary is refused without a look).
pub(super) const ROW: usize = 192;

/// The byte table's entry of state `s` on byte `b` (ASCII or `0xC0..`).
#[inline]
pub(super) fn slot(s: u32, b: u8) -> usize {
    s as usize * ROW
        + if b < 0x80 {
            b as usize
        } else {
            b as usize - 0x40
        }
}

/// Room of a byte table: up to the bound at which the automaton starts afresh.
const TABLE_CAP: usize = (MAX_DFA_STATES + 1024) * ROW;

/// Dropped automata (at most two), emptied, kept for the next one: their byte table's
/// pages stay in memory, their lists keep their room and their maps room for up to
/// [`SPARE_MAP_ROOM`] entries, so a new automaton neither faults pages in nor grows its
/// maps step by step while it builds its first states (memory held: up to what the
/// automaton dropped had reached).
static SPARE: Mutex<Vec<Dfa>> = Mutex::new(Vec::new());

impl Drop for Dfa {
    fn drop(&mut self) {
        // Only an automaton with a reserved table is kept (an emptied default one is not,
        // so this drop does not recur).
        if self.trans.capacity() != TABLE_CAP {
            return;
        }
        let Ok(mut spare) = SPARE.lock() else {
            return;
        };
        if spare.len() < 2 {
            let mut d = std::mem::take(self);
            d.empty();
            spare.push(d);
        }
    }
}

/// A set of frames with a value each, emptied in O(1): a frame is in it when its mark
/// is the current stamp (a scratch set filled and emptied thousands of times per mask,
/// which a hash set made cost a hash and a probe per frame).
#[derive(Debug)]
pub(super) struct Marks {
    /// Per frame: the stamp when it was put in, and its value.
    mark: Vec<(u32, u32)>,
    stamp: u32,
    /// Frames put in since the set was emptied, and whether `NIL` is in it.
    pub(super) len: usize,
    nil: bool,
}

impl Default for Marks {
    /// An empty set (stamp 1: a new frame's mark 0 is never current).
    fn default() -> Marks {
        Marks {
            mark: Vec::new(),
            stamp: 1,
            len: 0,
            nil: false,
        }
    }
}

impl Marks {
    /// No frames at all (as new, keeping its room).
    fn empty(&mut self) {
        let Marks {
            mark,
            stamp,
            len,
            nil,
        } = self;
        mark.clear();
        *stamp = 1;
        *len = 0;
        *nil = false;
    }

    /// Room for one more frame (called as each frame is made).
    fn grow(&mut self) {
        self.mark.push((0, 0));
    }

    /// Empties the set.
    pub(super) fn clear(&mut self) {
        self.stamp = self.stamp.wrapping_add(1);
        if self.stamp == 0 {
            self.mark.iter_mut().for_each(|m| m.0 = 0);
            self.stamp = 1;
        }
        self.len = 0;
        self.nil = false;
    }

    /// Puts frame `f` (or `NIL`) in; false if it was in already.
    pub(super) fn insert(&mut self, f: u32) -> bool {
        self.insert_value(f, 0)
    }

    /// Puts frame `f` in with value `v`; false (and `v` not kept) if it was in already.
    pub(super) fn insert_value(&mut self, f: u32, v: u32) -> bool {
        if f == NIL {
            if self.nil {
                return false;
            }
            self.nil = true;
        } else {
            let m = &mut self.mark[f as usize];
            if m.0 == self.stamp {
                return false;
            }
            *m = (self.stamp, v);
        }
        self.len += 1;
        true
    }

    /// Frame `f`'s value, if it is in.
    pub(super) fn get(&self, f: u32) -> Option<u32> {
        let m = self.mark[f as usize];
        (m.0 == self.stamp).then_some(m.1)
    }
}

/// An item of [`Stepper::expand`]'s work list.
#[derive(Debug)]
pub(super) enum Work {
    Frame(u32),
    /// Alternatives `next..` of rule `sub`, on top of frame `base`.
    Alts {
        sub: u32,
        next: u32,
        base: u32,
    },
}

/// Entries a map of a spare automaton keeps room for: a map grown for a large grammar
/// and kept at that size would spread a small automaton's entries over megabytes, each
/// probe a cache miss.
pub(super) const SPARE_MAP_ROOM: usize = 4096;

/// Empties map `m`, keeping room for at most [`SPARE_MAP_ROOM`] entries.
fn room<K: Eq + Hash, V, S: std::hash::BuildHasher>(m: &mut HashMap<K, V, S>) {
    m.clear();
    m.shrink_to(SPARE_MAP_ROOM);
}

impl Dfa {
    /// An empty automaton whose byte table has its room reserved up to the bound at
    /// which the automaton starts afresh: address space only (pages are touched as the
    /// table grows), so no mask pays for copying the table to a bigger place.
    ///
    /// It is one a dropped automaton left, emptied, when there is one (see [`SPARE`]).
    pub(super) fn new() -> Dfa {
        // A table a dropped automaton left, whose pages are already in memory: a new
        // page costs this machine kind 2–3 µs to fault in, and a key's mask of hundreds of
        // new states touches a hundred of them.
        if let Some(d) = SPARE.lock().ok().and_then(|mut t| t.pop()) {
            return d;
        }
        let mut d = Dfa::default();
        d.trans = Vec::with_capacity(TABLE_CAP);
        d
    }

    /// Empties the automaton, keeping the room of its tables and lists, and of its maps
    /// up to [`SPARE_MAP_ROOM`] entries. Every field is named, so a field added later
    /// cannot be forgotten here.
    pub(super) fn empty(&mut self) {
        let Dfa {
            states,
            frames,
            frame_index,
            index,
            rel_states,
            trans,
            chars,
            pnodes,
            groups,
            except,
            apart,
            alive,
            pnext,
            pindex,
            forced,
            uniform,
            non_ascii,
            reference,
            epoch,
            seen,
            work,
            tops,
            src,
            anchors,
            rel_of,
            anchor_lists,
            anchor_depth,
            anchor_index,
            rel_tops,
            rel_index,
            rel_steps,
            rel_anchors,
            concretized,
            ascii_groups,
            rel_holes,
            patterns,
            anchor_steps,
            rebuilt,
            rel_out,
            anchor_of,
            chain,
            escaped,
            max_depth,
            steps_made,
            walk_from,
            cold_budget,
            cold_nodes,
            cold_tops,
        } = self;
        states.clear();
        frames.clear();
        room(frame_index);
        room(index);
        room(rel_states);
        trans.clear();
        room(chars);
        pnodes.clear();
        groups.clear();
        room(except);
        room(apart);
        room(alive);
        pnext.clear();
        room(pindex);
        forced.clear();
        uniform.clear();
        non_ascii.clear();
        *reference = false;
        *epoch = 0;
        seen.empty();
        work.clear();
        tops.clear();
        src.clear();
        anchors.clear();
        rel_of.clear();
        anchor_lists.clear();
        anchor_depth.clear();
        room(anchor_index);
        rel_tops.clear();
        room(rel_index);
        room(rel_steps);
        rel_anchors.clear();
        room(concretized);
        ascii_groups.clear();
        rel_holes.clear();
        patterns.clear();
        room(anchor_steps);
        rebuilt.empty();
        rel_out.clear();
        anchor_of.clear();
        chain.clear();
        *escaped = false;
        *max_depth = 0;
        *steps_made = 0;
        *walk_from = 0;
        *cold_budget = None;
        cold_nodes.clear();
        cold_tops.clear();
    }

    /// An empty automaton after one cleared at its bound (`epoch` bumped), keeping its
    /// reference flag and cold budget.
    pub(super) fn fresh(epoch: u64, reference: bool, cold_budget: Option<usize>) -> Dfa {
        let mut d = Dfa::new();
        d.epoch = epoch;
        d.reference = reference;
        d.cold_budget = cold_budget;
        d
    }

    /// The frame (`pos` on top of `parent`).
    pub(super) fn frame(&mut self, pos: Pos, parent: u32) -> u32 {
        // One hash and probe, whether the frame is new or not.
        match self.frame_index.entry(frame_key(pos, parent)) {
            std::collections::hash_map::Entry::Occupied(e) => *e.get(),
            std::collections::hash_map::Entry::Vacant(v) => {
                let depth = if parent == NIL || is_hole(parent) {
                    1
                } else {
                    self.frames[parent as usize].2 + 1
                };
                let f = self.frames.len() as u32;
                self.frames.push((pos, parent, depth));
                self.seen.grow();
                self.rebuilt.grow();
                v.insert(f);
                f
            }
        }
    }

    /// The state of materialized stacks.
    pub(super) fn intern_stacks(&mut self, stacks: &[Vec<Pos>]) -> u32 {
        let mut tops: Vec<u32> = stacks
            .iter()
            .map(|st| st.iter().fold(NIL, |parent, &pos| self.frame(pos, parent)))
            .collect();
        tops.sort_unstable();
        tops.dedup();
        self.intern(&tops)
    }

    /// The stacks of state `s`, bottom first, sorted.
    pub(super) fn materialize(&self, s: u32) -> Vec<Vec<Pos>> {
        let a = self.anchors[s as usize];
        let mut out: Vec<Vec<Pos>> = self.states[s as usize]
            .iter()
            .map(|&top| {
                let mut st = Vec::new();
                let mut f = top;
                while f != NIL {
                    if is_hole(f) {
                        f = self.anchor_lists[a as usize][(f & !HOLE) as usize];
                        continue;
                    }
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

    /// The concrete state of tops `d` (sorted).
    pub(super) fn intern_concrete(&mut self, d: &[u32]) -> u32 {
        let h = {
            let mut f = Fx(0);
            d.hash(&mut f);
            f.finish()
        };
        if let Some(ids) = self.index.get(&h) {
            if let Some(&i) = ids
                .iter()
                .find(|&&i| self.anchors[i as usize] == NONE && self.states[i as usize] == d)
            {
                return i;
            }
        }
        let i = self.push_state(d, NONE, NONE);
        self.index.entry(h).or_default().push(i);
        i
    }

    /// A new state: tops `d` under anchor list `a` with relative stacks `rel`, and its
    /// rows of transitions and shortcut answers, all unknown.
    pub(super) fn push_state(&mut self, d: &[u32], rel: u32, a: u32) -> u32 {
        let i = self.states.len() as u32;
        self.states.push(d.to_vec());
        self.anchors.push(a);
        self.rel_of.push(rel);
        self.trans.extend(std::iter::repeat_n(UNKNOWN, ROW));
        self.forced.push(UNKNOWN);
        self.non_ascii.push(UNKNOWN);
        self.uniform.extend(std::iter::repeat_n(
            UNKNOWN,
            crate::slices::SLICE_CLASSES.len(),
        ));
        i
    }
}
