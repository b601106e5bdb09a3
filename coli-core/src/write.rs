//! Writing files so that a reader never sees half of one.
//!
//! Every writer uses a temp name unique to its process, thread and call, fsyncs,
//! then renames over the destination; on failure the temp file is removed.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::dtype::DType;
use crate::error::{CoreError, Result};

static COUNTER: AtomicU64 = AtomicU64::new(0);

/// A temp path beside `dest`, unique per process, thread and call.
pub fn temp_path_for(dest: &Path) -> PathBuf {
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let tid = format!("{:?}", std::thread::current().id());
    let tid: String = tid.chars().filter(char::is_ascii_digit).collect();
    let name = dest
        .file_name()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    dest.with_file_name(format!(".{name}.tmp-{}-{tid}-{n}", std::process::id()))
}

/// Writes a file atomically: `fill` writes the content into a temp file, which is
/// fsynced and renamed over `dest`. The temp file is removed if anything fails.
pub fn write_atomic(
    dest: &Path,
    fill: impl FnOnce(&mut std::io::BufWriter<&File>) -> std::io::Result<()>,
) -> Result<()> {
    let tmp = temp_path_for(dest);
    let result = (|| -> std::io::Result<()> {
        let file = File::create(&tmp)?;
        {
            let mut w = std::io::BufWriter::new(&file);
            fill(&mut w)?;
            w.flush()?;
        }
        file.sync_all()?;
        std::fs::rename(&tmp, dest)?;
        if let Some(parent) = dest.parent() {
            if let Ok(d) = File::open(parent) {
                let _ = d.sync_all();
            }
        }
        Ok(())
    })();
    result.map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        CoreError::io(dest, e)
    })
}

/// One tensor to write: dtype, shape and little-endian bytes.
pub struct TensorData {
    /// Element type.
    pub dtype: DType,
    /// Shape.
    pub shape: Vec<usize>,
    /// Little-endian bytes, `shape.product() * dtype.size()` of them.
    pub bytes: Vec<u8>,
}

/// A tensor's entry in a safetensors header: element type and shape.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorSpec {
    /// Element type.
    pub dtype: DType,
    /// Shape.
    pub shape: Vec<usize>,
}

impl TensorSpec {
    /// Bytes of the tensor's data.
    pub fn bytes(&self) -> usize {
        self.shape.iter().product::<usize>() * self.dtype.size()
    }
}

/// The header (length prefix excluded) of a safetensors file holding `specs` in name
/// order: keys sorted, padded with spaces so the data starts 8-byte aligned, as the
/// reference writer does.
fn safetensors_header(
    specs: &BTreeMap<String, TensorSpec>,
    metadata: &BTreeMap<String, String>,
) -> Vec<u8> {
    let mut header = serde_json::Map::new();
    if !metadata.is_empty() {
        header.insert(
            "__metadata__".into(),
            serde_json::to_value(metadata).expect("string map"),
        );
    }
    let mut offset = 0usize;
    for (name, t) in specs {
        let n = t.bytes();
        header.insert(
            name.clone(),
            serde_json::json!({"dtype": t.dtype.safetensors_name(), "shape": t.shape, "data_offsets": [offset, offset + n]}),
        );
        offset += n;
    }
    let mut json = serde_json::to_string(&sorted_keys(serde_json::Value::Object(header)))
        .expect("header serializes")
        .into_bytes();
    while !(8 + json.len()).is_multiple_of(8) {
        json.push(b' ');
    }
    json
}

/// Serializes tensors (sorted by name) and metadata as a safetensors file, atomically.
pub fn write_safetensors(
    dest: &Path,
    tensors: &BTreeMap<String, TensorData>,
    metadata: &BTreeMap<String, String>,
) -> Result<()> {
    let specs: BTreeMap<String, TensorSpec> = tensors
        .iter()
        .map(|(name, t)| {
            let spec = TensorSpec {
                dtype: t.dtype,
                shape: t.shape.clone(),
            };
            assert_eq!(
                spec.bytes(),
                t.bytes.len(),
                "tensor {name}: shape {:?} vs {} bytes",
                t.shape,
                t.bytes.len()
            );
            (name.clone(), spec)
        })
        .collect();
    write_safetensors_streaming(dest, &specs, metadata, |name, w| {
        w.write_all(&tensors[name].bytes)
    })
}

/// Bytes written between two flushes of the streaming writer: the dirty pages it leaves
/// behind, and the page cache it keeps, stay within this.
const STREAM_FLUSH_BYTES: u64 = 64 << 20;

/// Writes a safetensors file tensor by tensor, atomically: the header from `specs`, then
/// `produce(name, w)` writes each tensor's bytes in name order (exactly `spec.bytes()` of
/// them, checked). Memory stays at what one `produce` call holds; every
/// [`STREAM_FLUSH_BYTES`] the written part is synced and dropped from the page cache
/// (`posix_fadvise(DONTNEED)`), so a memory cgroup that counts page cache is not filled.
pub fn write_safetensors_streaming(
    dest: &Path,
    specs: &BTreeMap<String, TensorSpec>,
    metadata: &BTreeMap<String, String>,
    mut produce: impl FnMut(&str, &mut dyn Write) -> std::io::Result<()>,
) -> Result<()> {
    let json = safetensors_header(specs, metadata);
    write_atomic(dest, |w| {
        w.write_all(&(json.len() as u64).to_le_bytes())?;
        w.write_all(&json)?;
        let mut written = 8 + json.len() as u64;
        let mut flushed = 0u64;
        for (name, spec) in specs {
            let mut counted = CountingWriter {
                inner: &mut *w,
                n: 0,
            };
            produce(name, &mut counted)?;
            if counted.n != spec.bytes() as u64 {
                return Err(std::io::Error::other(format!(
                    "tensor {name}: {} bytes written, its shape {:?} needs {}",
                    counted.n,
                    spec.shape,
                    spec.bytes()
                )));
            }
            written += counted.n;
            if written - flushed >= STREAM_FLUSH_BYTES {
                w.flush()?;
                let file: &File = w.get_ref();
                file.sync_data()?;
                drop_cached(file, flushed, written - flushed);
                flushed = written;
            }
        }
        Ok(())
    })
}

/// Drops `[offset, offset + len)` of `file` from the page cache (a hint; synced data only).
fn drop_cached(file: &File, offset: u64, len: u64) {
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd;
        // SAFETY: a valid open descriptor; the call only advises the kernel.
        unsafe {
            libc::posix_fadvise(
                file.as_raw_fd(),
                offset as libc::off_t,
                len as libc::off_t,
                libc::POSIX_FADV_DONTNEED,
            );
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (file, offset, len);
}

/// Counts the bytes passed through to a writer.
struct CountingWriter<'a> {
    inner: &'a mut dyn Write,
    n: u64,
}

impl Write for CountingWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let k = self.inner.write(buf)?;
        self.n += k as u64;
        Ok(k)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// `v` with every object's keys in sorted order, so written files do not depend on whether
/// serde_json keeps insertion order (its `preserve_order` feature, which another crate of a
/// build may turn on).
pub fn sorted_keys(v: serde_json::Value) -> serde_json::Value {
    match v {
        serde_json::Value::Object(m) => {
            let mut kv: Vec<(String, serde_json::Value)> = m.into_iter().collect();
            kv.sort_by(|a, b| a.0.cmp(&b.0));
            serde_json::Value::Object(kv.into_iter().map(|(k, v)| (k, sorted_keys(v))).collect())
        }
        serde_json::Value::Array(a) => {
            serde_json::Value::Array(a.into_iter().map(sorted_keys).collect())
        }
        v => v,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::safetensors_header::parse_file_bytes;

    #[test]
    fn written_file_round_trips_and_leaves_no_temp() {
        let dir = tempfile::tempdir().unwrap();
        let dest = dir.path().join("m.safetensors");
        let mut t = BTreeMap::new();
        t.insert(
            "w".to_string(),
            TensorData {
                dtype: DType::F32,
                shape: vec![2],
                bytes: [1.5f32, -2.0]
                    .iter()
                    .flat_map(|x| x.to_le_bytes())
                    .collect(),
            },
        );
        let mut meta = BTreeMap::new();
        meta.insert("format".to_string(), "pt".to_string());
        write_safetensors(&dest, &t, &meta).unwrap();
        let bytes = std::fs::read(&dest).unwrap();
        let h = parse_file_bytes(&bytes).unwrap();
        assert_eq!(h.data_start % 8, 0);
        let r = h.tensors["w"].file_range.clone();
        assert_eq!(DType::F32.to_f32_vec(&bytes[r]), vec![1.5, -2.0]);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn failed_write_removes_temp_and_keeps_old_file() {
        let dir = tempfile::tempdir().unwrap();
        let dest = dir.path().join("x");
        std::fs::write(&dest, b"old").unwrap();
        let r = write_atomic(&dest, |w| {
            w.write_all(b"partial")?;
            Err(std::io::Error::other("boom"))
        });
        assert!(r.is_err());
        assert_eq!(std::fs::read(&dest).unwrap(), b"old");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }
}
