import sys, time, json, numpy as np, ctypes
import llama_cpp
from llama_cpp import Llama
path, threads, n_new = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
prompt = [504, 3575, 282, 4649, 314]
def last():
    p = llama_cpp.llama_get_logits_ith(llm._ctx.ctx, -1)
    return int(np.argmax(np.ctypeslib.as_array(p, shape=(llm.n_vocab(),))))
llm = Llama(model_path=path, n_threads=threads, n_threads_batch=threads, n_ctx=512, n_batch=512, verbose=False)
t0 = time.perf_counter(); llm.eval(prompt); t1 = time.perf_counter()
out = []
tok = last()
out.append(tok)
t2 = time.perf_counter()
for _ in range(n_new - 1):
    llm.eval([tok]); tok = last(); out.append(tok)
t3 = time.perf_counter()
print(json.dumps({"prefill_s": t1 - t0, "decode_tok_s": (n_new - 1) / (t3 - t2), "ids": out}))
