//! Slot files: a slot's tokens and KV cache saved on shutdown and restored on start.
//!
//! Layout: magic `COLIKV03`, the model's fingerprint (u64), the payload's length (u64),
//! the payload ([`coli_models::Slot::save_state`]), then an FNV-1a 64 checksum of the
//! payload. Written to a temporary file in the same directory, synced, then renamed over
//! the old one: a crash leaves the old file or the new one, never half of one. A file that
//! is corrupt, truncated or from another model is refused with a reason (the caller warns
//! and starts the slot empty).

use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::Path;

use coli_models::Slot;

/// Version 2: DeepSeek-V4 layers write their rings and entries, not rows per position.
/// Version 3: so do gpt-oss' sliding-window layers (their window's keys and values).
const MAGIC: &[u8; 8] = b"COLIKV03";

/// FNV-1a, 64 bits.
#[derive(Clone, Copy)]
pub struct Fnv(u64);

impl Default for Fnv {
    fn default() -> Self {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
}

impl Fnv {
    /// Adds bytes.
    pub fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 ^= b as u64;
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }

    /// The hash so far.
    pub fn finish(self) -> u64 {
        self.0
    }
}

/// FNV-1a 64 of `bytes`.
pub fn fnv(bytes: &[u8]) -> u64 {
    let mut h = Fnv::default();
    h.write(bytes);
    h.finish()
}

/// Counts and hashes what passes through.
struct Hashing<W> {
    inner: W,
    hash: Fnv,
    len: u64,
}

impl<W: Write> Write for Hashing<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hash.write(&buf[..n]);
        self.len += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// Saves `slot` to `path` atomically. An empty slot removes the file.
pub fn save(slot: &Slot<'_>, path: &Path, fingerprint: u64) -> Result<(), String> {
    let err = |e: std::io::Error| format!("{}: {e}", path.display());
    if slot.tokens().is_empty() {
        return match std::fs::remove_file(path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(err(e)),
            _ => Ok(()),
        };
    }
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(err)?;
    let tmp = dir.join(format!(
        ".{}.tmp",
        path.file_name().and_then(|n| n.to_str()).unwrap_or("slot")
    ));
    let write = || -> std::io::Result<()> {
        let mut f = BufWriter::new(File::create(&tmp)?);
        f.write_all(MAGIC)?;
        f.write_all(&fingerprint.to_le_bytes())?;
        f.write_all(&0u64.to_le_bytes())?; // length, filled in below
        let mut h = Hashing {
            inner: &mut f,
            hash: Fnv::default(),
            len: 0,
        };
        slot.save_state(&mut h)?;
        let (hash, len) = (h.hash.finish(), h.len);
        f.write_all(&hash.to_le_bytes())?;
        let mut file = f.into_inner().map_err(|e| e.into_error())?;
        use std::io::{Seek, SeekFrom};
        file.seek(SeekFrom::Start(16))?;
        file.write_all(&len.to_le_bytes())?;
        file.sync_all()?;
        Ok(())
    };
    if let Err(e) = write() {
        let _ = std::fs::remove_file(&tmp);
        return Err(err(e));
    }
    std::fs::rename(&tmp, path).map_err(err)
}

/// Restores `slot` from `path`; a missing file is not an error (the slot stays empty).
pub fn restore(slot: &mut Slot<'_>, path: &Path, fingerprint: u64) -> Result<(), String> {
    let file = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(format!("{}: {e}", path.display())),
    };
    let mut bytes = Vec::new();
    BufReader::new(file)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    let payload = check(&bytes, fingerprint).map_err(|e| format!("{}: {e}", path.display()))?;
    slot.load_state(&mut &payload[..])
        .map_err(|e| format!("{}: {e}", path.display()))
}

/// The payload of a slot file, after checking magic, model, length and checksum.
fn check(bytes: &[u8], fingerprint: u64) -> Result<&[u8], String> {
    if bytes.len() < 32 || &bytes[..8] != MAGIC {
        return Err("not a coli slot file".into());
    }
    let word = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"));
    if word(8) != fingerprint {
        return Err("saved by another model (fingerprint differs)".into());
    }
    let len = word(16);
    if len != (bytes.len() - 32) as u64 {
        return Err(format!(
            "truncated or padded: {} payload bytes, header says {len}",
            bytes.len() - 32
        ));
    }
    let payload = &bytes[24..bytes.len() - 8];
    let mut h = Fnv::default();
    h.write(payload);
    if h.finish() != word(bytes.len() - 8) {
        return Err("checksum mismatch (corrupt)".into());
    }
    Ok(payload)
}

/// The tokens a slot file holds, read without its KV (for choosing which file to restore).
/// `None` for a file that is not a slot file of this model.
pub fn peek_tokens(path: &Path, fingerprint: u64) -> Option<Vec<u32>> {
    let mut f = BufReader::new(File::open(path).ok()?);
    let mut head = [0u8; 32];
    f.read_exact(&mut head).ok()?;
    let word = |at: usize| u64::from_le_bytes(head[at..at + 8].try_into().expect("8 bytes"));
    if &head[..8] != MAGIC || word(8) != fingerprint {
        return None;
    }
    let n = word(24) as usize;
    if n == 0 || (n as u64).saturating_mul(4) > word(16) {
        return None;
    }
    let mut bytes = vec![0u8; n * 4];
    f.read_exact(&mut bytes).ok()?;
    Some(
        bytes
            .chunks_exact(4)
            .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")))
            .collect(),
    )
}

/// Saved conversations in a directory: each file's tokens, to find the one sharing the
/// longest prefix with a prompt. Bounded: past `cap` files the oldest is deleted.
pub struct Library {
    dir: std::path::PathBuf,
    fingerprint: u64,
    cap: usize,
    /// (file, its tokens), oldest first.
    files: Vec<(std::path::PathBuf, Vec<u32>)>,
}

impl Library {
    /// The conversations already saved in `dir` for this model (others are left alone).
    pub fn open(dir: &Path, fingerprint: u64, cap: usize) -> Library {
        let mut files: Vec<(std::time::SystemTime, std::path::PathBuf, Vec<u32>)> =
            std::fs::read_dir(dir)
                .into_iter()
                .flatten()
                .filter_map(|e| e.ok())
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|x| x == "colikv"))
                .filter_map(|p| {
                    let tokens = peek_tokens(&p, fingerprint);
                    if tokens.is_none() {
                        eprintln!(
                            "coli serve: {}: not a slot file of this model; ignored",
                            p.display()
                        );
                    }
                    let t = std::fs::metadata(&p).and_then(|m| m.modified()).ok()?;
                    Some((t, p, tokens?))
                })
                .collect();
        files.sort();
        Library {
            dir: dir.to_path_buf(),
            fingerprint,
            cap: cap.max(1),
            files: files.into_iter().map(|(_, p, t)| (p, t)).collect(),
        }
    }

    /// The saved conversation sharing the longest prefix with `prompt`, and that length.
    /// With `whole_only` (a model with a recurrent state) a conversation counts only when
    /// `prompt` continues all of it.
    pub fn best(&self, prompt: &[u32], whole_only: bool) -> Option<(&Path, usize)> {
        self.files
            .iter()
            .map(|(p, t)| {
                let common = t.iter().zip(prompt).take_while(|(a, b)| a == b).count();
                let usable = if whole_only && common < t.len() {
                    0
                } else {
                    common
                };
                (p.as_path(), usable)
            })
            .max_by_key(|(_, n)| *n)
            .filter(|(_, n)| *n > 0)
    }

    /// Saves what `slot` holds (unless an identical conversation is saved already).
    pub fn save(&mut self, slot: &Slot<'_>) -> Result<(), String> {
        let tokens = slot.tokens();
        if tokens.is_empty() || self.files.iter().any(|(_, t)| t == tokens) {
            return Ok(());
        }
        let bytes: Vec<u8> = tokens.iter().flat_map(|t| t.to_le_bytes()).collect();
        let path = self.dir.join(format!("conv-{:016x}.colikv", fnv(&bytes)));
        save(slot, &path, self.fingerprint)?;
        // A saved conversation that is a prefix of this one is superseded by it.
        let mut removed = Vec::new();
        self.files.retain(|(p, t)| {
            let prefix = t.len() <= tokens.len() && tokens[..t.len()] == t[..];
            if prefix && *p != path {
                removed.push(p.clone());
            }
            !prefix && *p != path
        });
        for p in removed {
            let _ = std::fs::remove_file(p);
        }
        self.files.push((path, tokens.to_vec()));
        while self.files.len() > self.cap {
            let (p, _) = self.files.remove(0);
            let _ = std::fs::remove_file(p);
        }
        Ok(())
    }

    /// Loads the saved conversation at `path` into `slot`.
    pub fn restore(&self, slot: &mut Slot<'_>, path: &Path) -> Result<(), String> {
        restore(slot, path, self.fingerprint)
    }
}

/// A fingerprint of the model in `dir`: its config.json and the names and sizes of its
/// weight files (of a GGUF: its parts' names and sizes) (a slot's KV is only meaningful for the exact weights that computed it).
pub fn fingerprint(dir: &Path) -> u64 {
    let mut h = Fnv::default();
    if let Ok(Some(_)) = coli_core::model_dir::model_gguf(dir) {
        // A GGUF: its config is in its first part, so the parts' names and sizes.
        for part in coli_core::model_files(dir).unwrap_or_default() {
            h.write(part.file_name().unwrap_or_default().as_encoded_bytes());
            h.write(
                &std::fs::metadata(&part)
                    .map_or(0, |m| m.len())
                    .to_le_bytes(),
            );
        }
        return h.finish();
    }
    h.write(&std::fs::read(dir.join("config.json")).unwrap_or_default());
    let mut files: Vec<(String, u64)> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .filter_map(|e| {
                    let name = e.file_name().to_string_lossy().into_owned();
                    let size = e.metadata().ok()?.len();
                    name.ends_with(".safetensors").then_some((name, size))
                })
                .collect()
        })
        .unwrap_or_default();
    files.sort();
    for (name, size) in files {
        h.write(name.as_bytes());
        h.write(&size.to_le_bytes());
    }
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv_matches_the_published_test_vectors() {
        // From the FNV specification (draft-eastlake-fnv): FNV-1a 64 of "" and "a".
        let h = |s: &str| {
            let mut f = Fnv::default();
            f.write(s.as_bytes());
            f.finish()
        };
        assert_eq!(h(""), 0xcbf29ce484222325);
        assert_eq!(h("a"), 0xaf63dc4c8601ec8c);
        assert_eq!(h("foobar"), 0x85944171f73967e8);
    }

    #[test]
    fn damaged_files_are_refused_with_a_reason() {
        let payload = b"0123456789";
        let mut file = MAGIC.to_vec();
        file.extend(7u64.to_le_bytes());
        file.extend((payload.len() as u64).to_le_bytes());
        file.extend(payload);
        let mut h = Fnv::default();
        h.write(payload);
        file.extend(h.finish().to_le_bytes());
        assert_eq!(check(&file, 7).unwrap(), payload);
        assert!(check(&file, 8).unwrap_err().contains("another model"));
        let mut flipped = file.clone();
        flipped[26] ^= 1;
        assert!(check(&flipped, 7).unwrap_err().contains("checksum"));
        assert!(check(&file[..file.len() - 1], 7)
            .unwrap_err()
            .contains("truncated"));
        assert!(check(b"garbage", 7)
            .unwrap_err()
            .contains("not a coli slot file"));
    }
}
