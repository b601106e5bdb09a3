//! The character classes whose tokens masks decide in bulk. Shared by the matcher (which
//! finds where a class leads) and the masks (which slice the vocabulary by class); kept
//! apart so neither module imports the other for it.

/// The character classes of the trie's slices, widest first (the first that applies at a
/// state is used): plain JSON string content (no quote, backslash or control character),
/// ASCII letters and digits, letters, lowercase letters and digits, lowercase letters.
/// (Surrogates are no characters: string content stops short of them.)
pub(crate) const SLICE_CLASSES: &[&[(u32, u32)]] = &[
    &[
        (0x20, 0x21),
        (0x23, 0x5B),
        (0x5D, 0xD7FF),
        (0xE000, 0x10FFFF),
    ],
    &[(0x30, 0x39), (0x41, 0x5A), (0x61, 0x7A)],
    &[(0x41, 0x5A), (0x61, 0x7A)],
    &[(0x30, 0x39), (0x61, 0x7A)],
    &[(0x61, 0x7A)],
];
