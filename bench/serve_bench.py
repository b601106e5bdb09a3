"""Concurrent-client throughput of an OpenAI-compatible server (coli serve, or
llama-cpp-python's `python -m llama_cpp.server`): C clients each send R chat requests one
after another (the same prompts for every server), greedy, max_tokens N. Prints one JSON
line: aggregate completion tokens per second, request latency p50/p99, and (for coli)
the expert bytes read per generated token from /metrics.

    python3 bench/serve_bench.py URL CLIENTS REQUESTS_PER_CLIENT MAX_TOKENS [LABEL]

Standard library only (urllib + threads), so it runs against any server.
"""
import json
import sys
import threading
import time
import urllib.request

url, clients, per_client, max_tokens = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
label = sys.argv[5] if len(sys.argv) > 5 else url

TOPICS = ["the ocean", "a mountain village", "the history of bread", "a lighthouse keeper",
          "winter in a city", "a robot learning to paint", "the moon landing", "a desert caravan"]


def prompt(client, i):
    return f"Write a long story about {TOPICS[(client * 3 + i) % len(TOPICS)]}. Request {client}-{i}."


def metric(name):
    try:
        text = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()
    except Exception:
        return None
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return None


def post(body):
    req = urllib.request.Request(url + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=3600) as r:
        return json.loads(r.read())


latencies, tokens, errors = [], [0], []
lock = threading.Lock()


def client(c):
    for i in range(per_client):
        body = {"model": "m", "messages": [{"role": "user", "content": prompt(c, i)}],
                "max_tokens": max_tokens, "temperature": 0, "seed": 0}
        t0 = time.perf_counter()
        try:
            r = post(body)
        except Exception as e:  # noqa: BLE001 - report and go on
            with lock:
                errors.append(str(e))
            continue
        dt = time.perf_counter() - t0
        with lock:
            latencies.append(dt)
            tokens[0] += r["usage"]["completion_tokens"]


bytes0, rows0 = metric("coli_expert_disk_bytes_total"), metric("coli_batch_rows_total")
t0 = time.perf_counter()
threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
for t in threads:
    t.start()
for t in threads:
    t.join()
wall = time.perf_counter() - t0
latencies.sort()
pick = lambda q: latencies[min(len(latencies) - 1, int(q * len(latencies)))] if latencies else None
out = {"label": label, "clients": clients, "requests": len(latencies), "errors": len(errors),
       "completion_tokens": tokens[0], "wall_s": round(wall, 3),
       "aggregate_tok_s": round(tokens[0] / wall, 2),
       "latency_p50_s": pick(0.5), "latency_p99_s": pick(0.99)}
bytes1, rows1 = metric("coli_expert_disk_bytes_total"), metric("coli_batch_rows_total")
if bytes0 is not None and bytes1 is not None and rows1 > rows0:
    out["expert_bytes_per_token"] = round((bytes1 - bytes0) / (rows1 - rows0))
print(json.dumps(out))
