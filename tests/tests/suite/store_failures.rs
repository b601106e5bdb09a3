//! Failures on the expert store's I/O path reach the token waiting for the expert as a
//! clear error: never a hang, never a panic. Built directly from expert locations (the
//! store knows nothing of models).

use std::path::Path;
use std::sync::mpsc;
use std::time::Duration;

use coli_kernels::WFormat;
use coli_models::experts::{ExpertLocation, ExpertStore, MatrixLocation, Prefetch, StoreConfig};

fn location(path: &Path, offset: u64, len: usize) -> ExpertLocation {
    let m = |k: u64| MatrixLocation {
        path: path.to_path_buf(),
        offset: offset + k * len as u64,
        len,
        fmt: WFormat::F32,
        rows: 1,
        cols: len / 4,
        scales: None,
        streamed_scales: None,
        transposed: false,
    };
    ExpertLocation {
        parts: vec![m(0), m(1), m(2)],
    }
}

fn config(prefetch: Prefetch) -> StoreConfig {
    StoreConfig {
        cap: 2,
        direct: false,
        prefetch,
        pinned: Vec::new(),
    }
}

/// Runs `f` on another thread; fails the test if it has not finished within 20 s (a hang).
fn within_20s<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(Duration::from_secs(20))
        .expect("the expert store hung instead of returning an error")
}

#[test]
fn a_read_past_the_end_of_the_file_is_an_error_on_both_paths() {
    // Cap 1 copies experts into buffers; cap 2 holds both and serves them in place.
    for (prefetch, cap) in Prefetch::ALL.into_iter().flat_map(|p| [(p, 1), (p, 2)]) {
        let t = tempfile::tempdir().unwrap();
        let file = t.path().join("shard.safetensors");
        std::fs::write(&file, vec![0u8; 4096]).unwrap();
        // Expert 0 is in the file; expert 1 lies past its end.
        let locs = vec![vec![location(&file, 0, 1024), location(&file, 8192, 1024)]];
        let msg = within_20s(move || {
            let cfg = StoreConfig {
                cap,
                ..config(prefetch)
            };
            let store = ExpertStore::new(&locs, &cfg).unwrap();
            assert_eq!(store.in_place(), cap == 2);
            assert!(store.get(0, 0).is_ok());
            store.prefetch(0, &[1], false);
            match store.get(0, 1) {
                Ok(_) => String::new(),
                Err(e) => e.to_string(),
            }
        });
        assert!(
            msg.contains("expert store: reading expert 1 of layer 0")
                && msg.contains("shard.safetensors"),
            "{prefetch:?} cap {cap}: {msg:?}"
        );
    }
}

#[test]
fn a_failed_buffer_allocation_is_an_error_not_a_panic_in_the_io_thread() {
    for prefetch in Prefetch::ALL {
        let t = tempfile::tempdir().unwrap();
        let file = t.path().join("shard.safetensors");
        std::fs::write(&file, vec![0u8; 4096]).unwrap();
        // An expert "matrix" of 2^46 bytes: its read buffer cannot be mapped.
        let huge = 1usize << 46;
        // Two of them and room for one: the copying path (all cached would be in place).
        let locs = vec![vec![location(&file, 0, huge), location(&file, 0, huge)]];
        let msg = within_20s(move || {
            let cfg = StoreConfig {
                cap: 1,
                ..config(prefetch)
            };
            let store = ExpertStore::new(&locs, &cfg).unwrap();
            assert!(!store.in_place());
            store.prefetch(0, &[0], false);
            let first = store.get(0, 0).err().map(|e| e.to_string());
            // The store still answers afterwards (no poisoned lock, no dead thread).
            let second = store.get(0, 0).err().map(|e| e.to_string());
            (first, second)
        });
        for m in [&msg.0, &msg.1] {
            let m = m.as_deref().unwrap_or("no error");
            assert!(
                m.contains("allocating expert buffers"),
                "{prefetch:?}: {m:?}"
            );
        }
    }
}

#[test]
fn out_of_range_experts_are_errors() {
    let t = tempfile::tempdir().unwrap();
    let file = t.path().join("s");
    std::fs::write(&file, vec![0u8; 4096]).unwrap();
    let store = ExpertStore::new(&[vec![location(&file, 0, 64)]], &config(Prefetch::On)).unwrap();
    for (layer, expert) in [(0, 1), (1, 0)] {
        let e = store.get(layer, expert).err().expect("an error");
        assert!(e.to_string().contains("no routed expert"), "{e}");
    }
}
