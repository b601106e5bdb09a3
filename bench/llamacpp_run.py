"""llama.cpp side of bench/moe_bench.py (run with the peer's Python, see BENCHMARKING.md):
loads a GGUF, evaluates the prompt ids, then greedy-decodes N tokens (EOS ignored), and
prints one JSON line: load_s (Llama() construction), prefill_s, ttft_s (load + prefill +
first argmax, i.e. model open to first token), decode_tok_s, ids.

    python llamacpp_run.py MODEL.gguf THREADS N_NEW ID,ID,...
"""
import json
import sys
import time

t_start = time.perf_counter()
import llama_cpp  # noqa: E402
import numpy as np  # noqa: E402
from llama_cpp import Llama  # noqa: E402

path, threads, n_new = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
prompt = [int(t) for t in sys.argv[4].split(",")]
t0 = time.perf_counter()
llm = Llama(model_path=path, n_threads=threads, n_threads_batch=threads,
            n_ctx=max(512, len(prompt) + n_new + 8), n_batch=512, verbose=False)
t1 = time.perf_counter()


def last():
    p = llama_cpp.llama_get_logits_ith(llm._ctx.ctx, -1)
    return int(np.argmax(np.ctypeslib.as_array(p, shape=(llm.n_vocab(),))))


llm.eval(prompt)
tok = last()
t2 = time.perf_counter()
out = [tok]
for _ in range(n_new - 1):
    llm.eval([tok])
    tok = last()
    out.append(tok)
t3 = time.perf_counter()
print(json.dumps({
    "load_s": t1 - t0,
    "prefill_s": t2 - t1,
    "ttft_s": t2 - t0,
    "import_s": t0 - t_start,
    "decode_tok_s": (n_new - 1) / (t3 - t2) if n_new > 1 else None,
    "ids": out,
}))
