//! States relative to their anchors: stacks that differ only below the part a character
//! moves step alike, so the step is computed once for all of them.
//!
//! The stacks of a state share a deepest common frame `P`. The frames directly above
//! `P`, one per stack, are the state's *anchors* (sorted by position); each stack is kept
//! as its frames above its anchor, resting on a *hole* that names the anchor by index.
//! The keys of a JSON object are the case this is for: the stacks of the key lexer sit on
//! frames that record which required members came already, which change after each
//! member while the key's own frames do not. A character steps the relative stacks (the
//! same for every state of that shape, cached per shape and character); the result is
//! the state of the new relative stacks under the anchors they still use. Only when a
//! stack pops into its anchor (a member's value ends), or a bound is met, are the
//! concrete stacks stepped instead. Both give the same stacks: a relative step changes
//! nothing below the holes.

use super::*;

/// A parent that is a hole: the anchor of this index (the bits below) of the state.
pub(super) const HOLE: u32 = 1 << 31;

/// No anchor list, no relative stacks: the state's tops are concrete frames.
pub(super) const NONE: u32 = u32::MAX;

/// The hole frame `f` rests on, or `None` for a concrete frame.
fn hole_of(frames: &[(Pos, u32, u32)], mut f: u32) -> Option<u32> {
    while f != NIL && !is_hole(f) {
        f = frames[f as usize].1;
    }
    (f != NIL).then_some(f & !HOLE)
}

/// Whether a frame's parent is a hole.
pub(super) fn is_hole(f: u32) -> bool {
    f != NIL && f & HOLE != 0
}

/// A step of relative stacks on one character.
#[derive(Clone, Copy, Debug)]
pub(super) enum RelStep {
    /// Some stack pops into its anchor, or a bound was met: the concrete stacks step.
    Escape,
    /// No stack takes the character.
    Dead,
    /// To relative stacks `rel` over the anchors `rel_anchors[anchors]` (old holes or
    /// frames above them); the deepest frame looked at was `depth` above its hole.
    To {
        rel: u32,
        anchors: u32,
        depth: u32,
        /// The anchors are the old ones, each in its place: the anchor list stays.
        keeps: bool,
    },
}

impl Dfa {
    /// The state of concrete tops (sorted): relative to its anchors where it has them.
    pub(super) fn intern(&mut self, tops: &[u32]) -> u32 {
        match self.relativize(tops) {
            Some((rel, anchors)) => {
                let a = self.intern_anchors(anchors);
                let r = self.intern_rel(rel);
                self.intern_relative(r, a)
            }
            None => self.intern_concrete(tops),
        }
    }

    /// The state of relative stacks `r` under anchor list `a`.
    pub(super) fn intern_relative(&mut self, r: u32, a: u32) -> u32 {
        // Relative stacks are interned, so the pair names the state without its tops
        // hashed or compared.
        let key = (r as u64) << 32 | a as u64;
        if let Some(&id) = self.rel_states.get(&key) {
            return id;
        }
        let d = std::mem::take(&mut self.rel_tops[r as usize]);
        let id = self.push_state(&d, r, a);
        self.rel_tops[r as usize] = d;
        self.rel_states.insert(key, id);
        id
    }

    /// The id of an anchor list.
    pub(super) fn intern_anchors(&mut self, anchors: Vec<u32>) -> u32 {
        // One hash of the list, whether it is new or not.
        match self.anchor_index.entry(anchors) {
            std::collections::hash_map::Entry::Occupied(e) => *e.get(),
            std::collections::hash_map::Entry::Vacant(v) => {
                let a = self.anchor_lists.len() as u32;
                let depth = v
                    .key()
                    .iter()
                    .map(|&f| self.frames[f as usize].2)
                    .max()
                    .unwrap_or(0);
                self.anchor_depth.push(depth);
                self.anchor_lists.push(v.key().clone());
                v.insert(a);
                a
            }
        }
    }

    /// The id of relative stacks (tops over holes, sorted).
    pub(super) fn intern_rel(&mut self, tops: Vec<u32>) -> u32 {
        // One hash of the tops, whether they are new or not.
        match self.rel_index.entry(tops) {
            std::collections::hash_map::Entry::Occupied(e) => *e.get(),
            std::collections::hash_map::Entry::Vacant(v) => {
                let r = self.rel_tops.len() as u32;
                self.ascii_groups.push(UNKNOWN);
                let holes = v
                    .key()
                    .iter()
                    .filter_map(|&t| hole_of(&self.frames, t))
                    .max();
                self.rel_holes.push(holes.map_or(0, |k| k + 1));
                self.rel_tops.push(v.key().clone());
                v.insert(r);
                r
            }
        }
    }

    /// Frame `f`'s stack rebuilt on another base: its frames down to (not including) the
    /// first one `below` says to stop at, consed again on `base` of that frame. Frames
    /// already rebuilt in this pass (`self.rebuilt`, cleared by the caller) are reused,
    /// so stacks sharing their lower frames cost one rebuild of those.
    fn rebuild(
        &mut self,
        f: u32,
        stop: impl Fn(&Dfa, u32) -> bool,
        base: impl Fn(&Dfa, u32) -> u32,
    ) -> u32 {
        let mut chain = std::mem::take(&mut self.chain);
        chain.clear();
        let mut g = f;
        let mut under = loop {
            if stop(self, g) {
                break base(self, g);
            }
            if let Some(r) = self.rebuilt.get(g) {
                break r;
            }
            chain.push(g);
            g = self.parent_of(g);
        };
        for &h in chain.iter().rev() {
            under = self.frame(self.frames[h as usize].0, under);
            self.rebuilt.insert_value(h, under);
        }
        self.chain = chain;
        under
    }

    /// A frame's depth: 0 for the bottom of a stack (`NIL`) or a hole.
    fn depth_of(&self, f: u32) -> u32 {
        if f == NIL || is_hole(f) {
            0
        } else {
            self.frames[f as usize].2
        }
    }

    fn parent_of(&self, f: u32) -> u32 {
        self.frames[f as usize].1
    }

    /// Tops (frames over one root: the stacks' bottom, or one hole) as stacks relative
    /// to their anchors, in the one form every state of those stacks gets: below the
    /// deepest frame `P` under every top, the frames directly above `P` when no top is
    /// one of them (then the anchors are sorted by position), else `P` alone. `None`
    /// when that would be no frame (`P` is the bottom and some top is a first frame).
    /// Returns the relative tops (sorted) and the anchors.
    fn anchored(&mut self, tops: &[u32]) -> Option<(Vec<u32>, Vec<u32>)> {
        let mut p = self.parent_of(tops[0]);
        for &t in &tops[1..] {
            let mut q = self.parent_of(t);
            while self.depth_of(p) > self.depth_of(q) {
                p = self.parent_of(p);
            }
            while self.depth_of(q) > self.depth_of(p) {
                q = self.parent_of(q);
            }
            while p != q {
                p = self.parent_of(p);
                q = self.parent_of(q);
            }
        }
        let mut anchor_of = std::mem::take(&mut self.anchor_of);
        anchor_of.clear();
        let anchors = if tops.iter().all(|&t| self.parent_of(t) != p) {
            let pd = self.depth_of(p);
            for &t in tops {
                let mut f = t;
                while self.depth_of(f) > pd + 1 {
                    f = self.parent_of(f);
                }
                anchor_of.push(f);
            }
            let mut anchors = anchor_of.clone();
            anchors.sort_unstable_by_key(|&f| self.frames[f as usize].0);
            anchors.dedup();
            anchors
        } else if p != NIL {
            anchor_of.resize(tops.len(), p);
            vec![p]
        } else {
            self.anchor_of = anchor_of;
            return None;
        };
        let mut rel = Vec::with_capacity(tops.len());
        self.rebuilt.clear();
        for (&t, &anchor) in tops.iter().zip(&anchor_of) {
            let k = if anchors.len() == 1 {
                0
            } else {
                let pos = self.frames[anchor as usize].0;
                anchors
                    .binary_search_by_key(&pos, |&f| self.frames[f as usize].0)
                    .expect("an anchor of the list")
            };
            let top = self.rebuild(t, |_, g| g == anchor, |_, _| HOLE | k as u32);
            rel.push(top);
        }
        rel.sort_unstable();
        rel.dedup();
        self.anchor_of = anchor_of;
        Some((rel, anchors))
    }

    /// Concrete tops as relative stacks and their anchors (`None`: the state stays
    /// concrete).
    fn relativize(&mut self, tops: &[u32]) -> Option<(Vec<u32>, Vec<u32>)> {
        if self.reference || tops.is_empty() || tops.contains(&NIL) {
            return None;
        }
        self.anchored(tops)
    }

    /// Frame `f` of a relative step's anchors made concrete over the old anchors `list`
    /// (`HOLE | k`: the old anchor `k`).
    fn concretize(&mut self, f: u32, list: u32) -> u32 {
        if is_hole(f) {
            return self.anchor_lists[list as usize][(f & !HOLE) as usize];
        }
        let k = self.hole_of(f).expect("a relative frame");
        let anchor = self.anchor_lists[list as usize][k as usize];
        if let Some(&c) = self.concretized.get(&(f, anchor)) {
            return c;
        }
        let mut chain = Vec::new();
        let mut g = f;
        while !is_hole(g) {
            chain.push(self.frames[g as usize].0);
            g = self.parent_of(g);
        }
        let c = chain
            .iter()
            .rev()
            .fold(anchor, |parent, &pos| self.frame(pos, parent));
        self.concretized.insert((f, anchor), c);
        c
    }

    /// The concrete tops of state `s` into `out` (sorted).
    pub(super) fn concrete_tops(&mut self, s: u32, out: &mut Vec<u32>) {
        out.clear();
        let a = self.anchors[s as usize];
        if a == NONE {
            out.extend_from_slice(&self.states[s as usize]);
            return;
        }
        self.rebuilt.clear();
        for i in 0..self.states[s as usize].len() {
            let top = self.rebuild(
                self.states[s as usize][i],
                |_, g| is_hole(g),
                |d, g| d.anchor_lists[a as usize][(g & !HOLE) as usize],
            );
            out.push(top);
        }
        out.sort_unstable();
    }

    /// The hole a relative frame rests on, or `None` for a concrete one.
    fn hole_of(&self, f: u32) -> Option<u32> {
        hole_of(&self.frames, f)
    }
}

impl Stepper<'_> {
    /// The step of a relative state on `c` through its shape's cached step, if that
    /// step stays above the anchors (`None`: step the concrete stacks).
    pub(super) fn compute_relative(&mut self, s: u32, c: u32) -> Option<u32> {
        let r = self.dfa.rel_of[s as usize];
        if r == NONE {
            return None;
        }
        let step = match self.dfa.rel_steps.get(&(r, c)) {
            Some(&step) => step,
            None => {
                let step = self.rel_step(r, c);
                self.dfa.rel_steps.insert((r, c), step);
                step
            }
        };
        match step {
            RelStep::Escape => None,
            RelStep::Dead => Some(DEAD),
            RelStep::To {
                rel,
                anchors,
                depth,
                keeps,
            } => {
                let a = self.dfa.anchors[s as usize];
                if (self.dfa.anchor_depth[a as usize] + depth) as usize > MAX_STACK {
                    return None;
                }
                let next = if keeps {
                    // Each hole still its own anchor: the list is the state's.
                    a
                } else {
                    match self.dfa.anchor_steps.get(&(a, anchors)) {
                        Some(&next) => next,
                        None => {
                            let n = self.dfa.rel_anchors[anchors as usize].len();
                            let list: Vec<u32> = (0..n)
                                .map(|i| {
                                    let f = self.dfa.rel_anchors[anchors as usize][i];
                                    self.dfa.concretize(f, a)
                                })
                                .collect();
                            let next = self.dfa.intern_anchors(list);
                            self.dfa.anchor_steps.insert((a, anchors), next);
                            next
                        }
                    }
                };
                Some(self.dfa.intern_relative(rel, next))
            }
        }
    }

    /// Steps relative stacks `r` on `c`.
    fn rel_step(&mut self, r: u32, c: u32) -> RelStep {
        self.dfa.steps_made += 1;
        // The relative stacks and the output, out of the automaton while it steps (their
        // memory reused).
        let src = std::mem::take(&mut self.dfa.rel_tops[r as usize]);
        self.dfa.escaped = false;
        self.dfa.max_depth = 0;
        let mut out = std::mem::take(&mut self.dfa.rel_out);
        let any = self.advance(&src, c, &mut out);
        self.dfa.rel_tops[r as usize] = src;
        let mut step = self.rel_step_of(any, &out);
        self.dfa.rel_out = out;
        if let RelStep::To { anchors, keeps, .. } = &mut step {
            let list = &self.dfa.rel_anchors[*anchors as usize];
            // Only a full list in order: a shorter one names fewer anchors (the same
            // stacks, but not the one form of their state).
            *keeps = list.len() == self.dfa.rel_holes[r as usize] as usize
                && list.iter().enumerate().all(|(i, &f)| f == HOLE | i as u32);
        }
        step
    }

    /// [`Stepper::rel_step`] after the stacks stepped: `out` their tops, `any` whether
    /// some stack took the character.
    fn rel_step_of(&mut self, any: bool, out: &[u32]) -> RelStep {
        if self.dfa.escaped || out.len() >= MAX_STACKS {
            return RelStep::Escape;
        }
        if !any {
            return RelStep::Dead;
        }
        // The stacks in the one form of their state: on two holes or more, relative to
        // those (renumbered in their order, so the anchors stay sorted); on one, to the
        // anchors above it.
        let mut used = Vec::with_capacity(out.len());
        for &t in out {
            match self.dfa.hole_of(t) {
                Some(k) => used.push(k),
                None => return RelStep::Escape,
            }
        }
        used.sort_unstable();
        used.dedup();
        let (rel, anchors) =
            if used.len() > 1 && used.iter().enumerate().all(|(i, &k)| i as u32 == k) {
                // Every hole still used: numbered as they were, so the stacks are already in
                // their form (a rebuild would give the same frames back).
                (out.to_vec(), used.iter().map(|&k| HOLE | k).collect())
            } else if used.len() > 1 {
                self.dfa.rebuilt.clear();
                let mut rel: Vec<u32> = Vec::with_capacity(out.len());
                for &t in out {
                    let top = self.dfa.rebuild(
                        t,
                        |_, g| is_hole(g),
                        |_, g| HOLE | used.binary_search(&(g & !HOLE)).expect("a used hole") as u32,
                    );
                    rel.push(top);
                }
                rel.sort_unstable();
                rel.dedup();
                (rel, used.iter().map(|&k| HOLE | k).collect())
            } else {
                self.dfa
                    .anchored(out)
                    .expect("stacks over a hole have an anchor")
            };
        let rel = self.dfa.intern_rel(rel);
        let id = self.dfa.rel_anchors.len() as u32;
        self.dfa.rel_anchors.push(anchors);
        RelStep::To {
            rel,
            anchors: id,
            depth: self.dfa.max_depth,
            keeps: false,
        }
    }
}
