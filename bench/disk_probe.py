#!/usr/bin/env python3
"""Disk read rate for the expert store's access pattern: O_DIRECT reads of CHUNK bytes at
random aligned offsets of the given files, on T threads at once (T=1: sequential-like
single stream). Prints MB/s. Drop the page cache first; O_DIRECT bypasses it anyway.

    bench/disk_probe.py CHUNK_MB THREADS SECONDS FILE...
"""
import mmap, os, random, sys, threading, time

chunk = int(float(sys.argv[1]) * (1 << 20)) // 4096 * 4096
threads = int(sys.argv[2])
seconds = float(sys.argv[3])
files = sys.argv[4:]
total = [0]
lock = threading.Lock()
stop = time.time() + seconds

def worker(seed):
    rnd = random.Random(seed)
    buf = mmap.mmap(-1, chunk)
    fds = [os.open(f, os.O_RDONLY | os.O_DIRECT) for f in files]
    sizes = [os.fstat(fd).st_size for fd in fds]
    n = 0
    while time.time() < stop:
        i = rnd.randrange(len(fds))
        off = rnd.randrange(0, max(1, sizes[i] - chunk)) // 4096 * 4096
        n += os.preadv(fds[i], [buf], off)
    with lock:
        total[0] += n

t0 = time.time()
ts = [threading.Thread(target=worker, args=(s,)) for s in range(threads)]
for t in ts: t.start()
for t in ts: t.join()
print(f"{total[0] / (time.time() - t0) / 1e6:.0f} MB/s ({threads} threads, {chunk >> 20} MiB reads)")
