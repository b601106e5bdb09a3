//! Drafting with the checkpoint's MTP layer ([`crate::arch::Mtp`]) inside a session.
//!
//! The layer's row `i` needs the main model's final-normed hidden state at position `i` and
//! the token at position `i + 1`. The session records the hidden states of every position it
//! feeds; when a draft is wanted (the token `next` at position `pos` is known, its forward
//! not run yet), the rows not yet given to the layer are run through it, paired with the
//! tokens one position later (the last with `next`), and the last row's most likely token
//! is the draft of position `pos + 1`. Further drafts reuse the layer on its own output.
//! The main model verifies every draft, so what is drafted decides speed only.

use crate::arch::{norm_rows, KvCache, LogitsFor, PositionLoop, Scratch, Transformer};
use crate::error::Result;
use crate::sampling::argmax;

/// Most history rows given to the MTP layer in one forward.
const CATCH_UP_ROWS: usize = 256;

/// Tokens the MTP layer drafts after one token (the layer run on its own output for the
/// second and later ones).
pub const DEFAULT_MTP_DEPTH: usize = 1;

/// The MTP layer's cache and the main model's states it has not read yet.
pub struct MtpDrafts {
    kv: KvCache,
    scratch: Scratch,
    input: Vec<f32>,
    /// Rows given to the layer: positions `0..fed`.
    fed: usize,
    /// Final-normed main hidden states of positions `fed..`, one row each.
    hidden: Vec<f32>,
    /// Main-model tokens at the same positions as `hidden`'s rows.
    tokens: Vec<u32>,
    /// The history was cut below what the layer has read: no drafts until a restart.
    broken: bool,
    /// Hidden width.
    h: usize,
    /// Tokens drafted after each token (1: the layer once; more: on its own output).
    pub depth: usize,
    /// When `Some`, every draft is appended as (its position, the token): diagnostics.
    pub log: Option<Vec<(usize, u32)>>,
    /// Rests after drafts refused in a row (a new `Backoff` drafts at the next step).
    pub backoff: crate::drafts::Backoff,
}

impl MtpDrafts {
    /// Drafting for `model` (None when it has no MTP layer) over `capacity` positions.
    pub fn new(model: &Transformer, capacity: usize) -> Option<MtpDrafts> {
        let mtp = model.mtp.as_ref()?;
        Some(MtpDrafts {
            kv: mtp.kv_cache(capacity),
            scratch: Scratch::default(),
            input: Vec::new(),
            fed: 0,
            hidden: Vec::new(),
            tokens: Vec::new(),
            broken: false,
            h: model.info.hidden_size,
            depth: DEFAULT_MTP_DEPTH,
            log: None,
            backoff: crate::drafts::Backoff::default(),
        })
    }

    /// After the main model fed `tokens` at positions `start..`, leaving their residual
    /// rows in `x` (before the final norm): keeps their final-normed states.
    pub(crate) fn record(&mut self, model: &Transformer, start: usize, tokens: &[u32], x: &[f32]) {
        if start == 0 {
            // A new sequence.
            self.fed = 0;
            self.hidden.clear();
            self.tokens.clear();
            self.broken = false;
        }
        let have = self.fed + self.tokens.len();
        if self.broken || start < self.fed || start > have {
            // Positions the layer has read are being rewritten, or some were fed without
            // being recorded: the pairs are unknown until the session starts over.
            self.broken = true;
            return;
        }
        let h = self.h;
        let keep = start - self.fed;
        self.tokens.truncate(keep);
        self.hidden.truncate(keep * h);
        let from = self.hidden.len();
        self.hidden.resize(from + tokens.len() * h, 0.0);
        norm_rows(
            &x[..tokens.len() * h],
            &model.norm,
            model.rms_norm_eps,
            &mut self.hidden[from..],
        );
        self.tokens.extend_from_slice(tokens);
    }

    /// The session cuts its history to `len` positions: the layer's row `len - 1` pairs
    /// with a token that may now change, so it must be read again. Returns the positions
    /// the session may keep: `len`, or `len - 1` when the layer had read row `len - 1`
    /// (its hidden state is gone: the session recomputes that position).
    pub(crate) fn rewind(&mut self, len: usize) -> usize {
        if len == 0 || self.broken {
            return len; // at 0 the next forward starts over and resets everything
        }
        if len <= self.fed {
            self.fed = len - 1;
            self.tokens.clear();
            self.hidden.clear();
            len - 1
        } else {
            self.tokens.truncate(len - self.fed);
            self.hidden.truncate((len - self.fed) * self.h);
            len
        }
    }

    /// A draft failed (an I/O error reading the layer's experts), or positions were fed
    /// without being recorded (a restored KV file): no drafts until a restart.
    pub(crate) fn lose_track(&mut self) {
        self.broken = true;
    }

    /// Up to `max` draft tokens for the positions after `next`, which sits at `pos` (the
    /// session's length: positions from there on recorded earlier were refused drafts).
    pub(crate) fn draft(
        &mut self,
        model: &Transformer,
        pos: usize,
        next: u32,
        max: usize,
    ) -> Result<Vec<u32>> {
        let Some(mtp) = model.mtp.as_deref() else {
            return Ok(Vec::new());
        };
        if pos < self.fed || pos > self.fed + self.tokens.len() {
            self.broken = true;
        } else {
            self.tokens.truncate(pos - self.fed);
            self.hidden.truncate((pos - self.fed) * self.h);
        }
        let n = self.tokens.len();
        if self.broken || n == 0 || max == 0 {
            return Ok(Vec::new());
        }
        let (h, v) = (model.info.hidden_size, model.info.vocab_size);
        // Row i pairs hidden row i with the token one position later.
        let mut pairs: Vec<u32> = self.tokens[1..].to_vec();
        pairs.push(next);
        let s = &mut self.scratch;
        // A long history (the prompt, at the first draft) in chunks: bounded buffers, the
        // same bits as one forward.
        let mut done = 0;
        let mut last = 0;
        while done < n {
            let m = (n - done).min(CATCH_UP_ROWS);
            mtp.forward(
                &self.hidden[done * h..(done + m) * h],
                &pairs[done..done + m],
                self.fed + done,
                &mut self.kv,
                s,
                &mut self.input,
                LogitsFor::Last,
            )?;
            done += m;
            last = m - 1;
        }
        let at = self.fed + n;
        self.fed = at;
        self.tokens.clear();
        self.hidden.clear();
        let mut drafts = vec![argmax(&s.logits[..v])];
        let mut y = Vec::new();
        while drafts.len() < max.min(self.depth) && at + drafts.len() < self.kv.capacity {
            // Its own output as the hidden state, the token it drafted as the pair; written
            // past the fed rows, so the next real rows overwrite it.
            y.clear();
            y.extend_from_slice(&s.x[last * h..(last + 1) * h]);
            let pos = at + drafts.len() - 1;
            let d = *drafts.last().expect("one draft");
            mtp.forward(
                &y,
                &[d],
                pos,
                &mut self.kv,
                s,
                &mut self.input,
                LogitsFor::Last,
            )?;
            drafts.push(argmax(&s.logits[..v]));
            last = 0;
        }
        if let Some(log) = &mut self.log {
            log.extend(drafts.iter().enumerate().map(|(i, &d)| (at + 1 + i, d)));
        }
        Ok(drafts)
    }
}

/// The MTP layer's logits over `ids` read at once, `[len - 1, vocab]`: row `i` is its guess
/// at `ids[i + 2]` from the main model's state at `i` and `ids[i + 1]` (for checks against
/// a reference). None when the model has no MTP layer.
pub fn teacher_forced(model: &Transformer, ids: &[u32]) -> Result<Option<Vec<f32>>> {
    let Some(mtp) = model.mtp.as_deref() else {
        return Ok(None);
    };
    let (h, v) = (model.info.hidden_size, model.info.vocab_size);
    if let Some(&id) = ids.iter().find(|&&t| t as usize >= v) {
        return Err(crate::ModelError::TokenOutOfVocab { id, vocab_size: v });
    }
    let n = ids.len().saturating_sub(1);
    if n == 0 {
        return Ok(Some(Vec::new()));
    }
    let mut s = Scratch::default();
    let mut kv = KvCache::new(model, ids.len());
    model.forward(
        ids,
        0,
        &mut kv,
        &mut s,
        LogitsFor::All,
        PositionLoop::Parallel,
    )?;
    let mut hidden = vec![0.0; n * h];
    norm_rows(&s.x[..n * h], &model.norm, model.rms_norm_eps, &mut hidden);
    let mut ms = Scratch::default();
    let mut mkv = mtp.kv_cache(n);
    mtp.forward(
        &hidden,
        &ids[1..],
        0,
        &mut mkv,
        &mut ms,
        &mut Vec::new(),
        LogitsFor::All,
    )?;
    Ok(Some(ms.logits[..n * v].to_vec()))
}
