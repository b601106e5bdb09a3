//! Shared by the examples: a byte-level BPE vocabulary read from a `tokenizer.json`.

/// GPT-2's byte ↔ character table, inverted: each character of a byte-level BPE token
/// stands for one byte.
fn byte_table() -> std::collections::HashMap<char, u8> {
    let mut printable: Vec<u32> = (b'!' as u32..=b'~' as u32).collect();
    printable.extend(0xA1..=0xAC);
    printable.extend(0xAE..=0xFF);
    let mut map = std::collections::HashMap::new();
    let mut n = 0;
    for b in 0..256u32 {
        if printable.contains(&b) {
            map.insert(char::from_u32(b).unwrap(), b as u8);
        } else {
            map.insert(char::from_u32(256 + n).unwrap(), b as u8);
            n += 1;
        }
    }
    map
}

/// Each token's bytes, by id, from a byte-level BPE `tokenizer.json` (`model.vocab`).
pub fn load_vocab(path: &str) -> Vec<Vec<u8>> {
    let t: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let vmap = t["model"]["vocab"].as_object().unwrap();
    let map = byte_table();
    let mut vocab = vec![Vec::new(); vmap.len()];
    for (k, id) in vmap {
        vocab[id.as_u64().unwrap() as usize] =
            k.chars().filter_map(|c| map.get(&c).copied()).collect();
    }
    vocab
}
