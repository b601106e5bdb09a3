//! Character classes: a compiled alternative's elements and the range arithmetic the
//! automaton's shortcuts use.

/// One element of a compiled alternative.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Elem {
    /// A character in (or, negated, not in) these inclusive ranges (sorted, disjoint).
    Chars {
        negated: bool,
        ranges: Vec<(u32, u32)>,
    },
    /// Another compiled rule.
    Rule(usize),
}

impl Elem {
    pub(super) fn accepts(&self, c: u32) -> bool {
        match self {
            Elem::Chars { negated, ranges } => {
                ranges.iter().any(|&(a, b)| a <= c && c <= b) != *negated
            }
            Elem::Rule(_) => false,
        }
    }

    /// The ASCII characters it accepts, one bit each (what [`Elem::accepts`] says of
    /// `0..128`, from one pass over the ranges).
    pub(super) fn ascii_set(&self) -> u128 {
        match self {
            Elem::Chars { negated, ranges } => {
                let set = ascii_bits(ranges);
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

/// The ASCII code points of sorted ranges, one bit each.
pub(super) fn ascii_bits(ranges: &[(u32, u32)]) -> u128 {
    ranges
        .iter()
        .take_while(|r| r.0 < 128)
        // Bits a..=b.
        .fold(0u128, |set, &(a, b)| {
            set | (u128::MAX >> (127 - b.min(127))) & (u128::MAX << a)
        })
}

/// Whether the union of `ranges` contains every code point of `class`.
pub(super) fn covers(ranges: &[(u32, u32)], class: &[(u32, u32)]) -> bool {
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

/// Whether no code point of `class` is in `ranges`.
pub(super) fn disjoint(ranges: &[(u32, u32)], class: &[(u32, u32)]) -> bool {
    ranges
        .iter()
        .all(|&(x, y)| class.iter().all(|&(lo, hi)| y < lo || hi < x))
}

/// The code points a valid UTF-8 prefix (lead byte and some continuation bytes) can still
/// become.
pub(super) fn prefix_range(p: &[u8]) -> (u32, u32) {
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
