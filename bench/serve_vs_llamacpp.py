#!/usr/bin/env python3
"""Serving throughput, nabla serve against llama.cpp's server, side by side in one run.

Claims under test (issue 14, "Performance"):
  - throughput (generated tokens/s) with 16 and 64 concurrent streaming
    clients, prompts of 128 tokens, outputs of 128 tokens: at least 1.5x
    llama.cpp's server; TTFT p50/p99 for both;
  - prefix caching: with a shared 1,000-token system prompt, TTFT of later
    requests at most 10% of the first request's.

The model is bench/decode_vs_llamacpp.py's (make_model: a random model
written from a seed; --arch llama (default): 134M parameters, a Hugging Face
folder for nabla and GGUF f32 for llama.cpp; --arch gpt2: gpt2-124m's shape,
a Hugging Face GPT-2 folder converted to GGUF f32 by llama.cpp's
convert_hf_to_gguf.py, and a nabla run dir of the same tensors; both with a
byte-level vocabulary, so a text of n ASCII bytes is n tokens on both sides
and no special token is added).

Servers, each started by this script on loopback and stopped by PID:
  nabla      build/nabla serve DIR --port 0 --threads T --max-num-seqs C ...
  llama.cpp  python -m llama_cpp.server --model DIR/model-f32.gguf
             --n_threads T --n_ctx ... --interrupt_requests False
             (llama-cpp-python's OpenAI-compatible server, the peer the issue
             names; it runs one request at a time, and by default a new
             request interrupts the streaming one), and, when --llama-server
             names llama.cpp's own C++ server binary, that one with
             --parallel C (continuous batching with C slots).

Load: C client threads; each sends its requests one after another, streamed
(/v1/completions, temperature 0, max_tokens N, logit_bias -100 on the
end-of-text id, 2 or gpt2's 50256, so that llama.cpp never stops there); every prompt is a different random
text of P bytes, so no prefix is shared. Throughput = generated tokens /
wall time from the first request sent to the last response completed; TTFT =
time from sending a request to its first streamed chunk.

Usage (the venv has llama-cpp-python[server], gguf, numpy, safetensors):
  /work/venv-llamacpp/bin/python bench/serve_vs_llamacpp.py [--build build] [--threads 2]
      [--clients 16,64] [--requests 2] [--prompt 128] [--tokens 128] [--sides nabla,llamacpp]
Not run by ctest: llama.cpp is a heavy peer.
"""
import argparse
import http.client
import json
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import decode_vs_llamacpp as dec  # noqa: E402


def free_port():
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


class Server:
    """A server process on loopback; stopped by its PID."""

    def __init__(self, cmd, port_from_stdout, env=None):
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        self.port = port_from_stdout(self.proc) if callable(port_from_stdout) else port_from_stdout
        self.lines = []
        threading.Thread(target=self._drain, daemon=True).start()
        deadline = time.time() + 600
        while time.time() < deadline:
            if self.proc.poll() is not None:
                sys.exit(f"server exited ({self.proc.returncode}): {' '.join(cmd)}\n" + "".join(self.lines[-40:]))
            try:
                c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
                c.request("GET", "/v1/models")
                if c.getresponse().status == 200:
                    return
            except OSError:
                pass
            time.sleep(0.5)
        self.stop()
        sys.exit("server did not come up: " + " ".join(cmd))

    def _drain(self):
        for line in self.proc.stdout:
            self.lines.append(line)

    def stop(self):
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


def nabla_port(proc):
    line = proc.stdout.readline()  # the first line names the address
    m = re.search(r":(\d+)", line)
    if not m:
        sys.exit("nabla serve's first line names no port: " + line)
    return int(m.group(1))


EOS = {"id": 2}  # the end-of-text id llama.cpp would stop at (--arch: </s> 2, gpt2's <|endoftext|> 50256)


def stream_completion(port, prompt, n, out):
    """One streamed completion; appends (ttft_s, total_s, tokens, finish) to out."""
    body = json.dumps({"model": "m", "prompt": prompt, "max_tokens": n, "temperature": 0, "stream": True,
                       "logit_bias": {str(EOS["id"]): -100}})
    t0 = time.perf_counter()
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    c.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        out.append((None, None, 0, f"HTTP {r.status}: {r.read()[:200]!r}"))
        return
    ttft, chunks, finish = None, 0, None
    while True:
        line = r.readline()
        if not line:
            break
        line = line.strip()
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data == b"[DONE]":
            break
        if ttft is None:
            ttft = time.perf_counter() - t0
        j = json.loads(data)
        for ch in j.get("choices") or []:
            chunks += 1
            if ch.get("finish_reason"):
                finish = ch["finish_reason"]
    total = time.perf_counter() - t0
    # neither side can stop early (no end-of-text id is drawable), so a
    # response that finished by length generated exactly n tokens
    out.append((ttft, total, n if finish == "length" else 0, finish))


def random_text(rng, nbytes):
    return "".join(rng.choice("abcdefghijklmnopqrstuvwxyz ") for _ in range(nbytes))


def load(port, clients, requests, prompt_len, n, seed):
    rng = random.Random(seed)
    prompts = [[random_text(rng, prompt_len) for _ in range(requests)] for _ in range(clients)]
    results = []
    lock = threading.Lock()

    def client(i):
        mine = []
        for p in prompts[i]:
            stream_completion(port, p, n, mine)
        with lock:
            results.extend(mine)

    t0 = time.perf_counter()
    th = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in th:
        t.start()
    for t in th:
        t.join()
    wall = time.perf_counter() - t0
    bad = [r for r in results if r[3] != "length"]
    if len(bad) == len(results):
        sys.exit(f"every request failed: {bad[:2]}")
    toks = sum(r[2] for r in results)
    ttfts = sorted(r[0] for r in results if r[0] is not None)
    p = lambda q: ttfts[min(len(ttfts) - 1, int(q * len(ttfts)))] if ttfts else float("nan")  # noqa: E731
    return {"tok_s": toks / wall, "wall": wall, "requests": len(results), "failed": len(bad),
            "ttft_p50": p(0.50), "ttft_p99": p(0.99), "why": bad[:3]}


def prefix_cache(port, prefix_len, suffix_len, n, later, seed):
    """TTFT of the first request with a shared prefix, then of `later` ones."""
    rng = random.Random(seed)
    system = random_text(rng, prefix_len)
    ttft = []
    for _ in range(1 + later):
        out = []
        stream_completion(port, system + random_text(rng, suffix_len), n, out)
        if out[0][0] is None:
            sys.exit(f"prefix-cache request failed: {out[0][3]}")
        ttft.append(out[0][0])
    return ttft[0], statistics.median(ttft[1:])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--clients", default="16,64")
    ap.add_argument("--requests", type=int, default=2, help="requests per client, one after another")
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--prefix", type=int, default=1000)
    ap.add_argument("--sides", default="nabla,llamacpp")
    ap.add_argument("--llama-server", default="", help="llama.cpp's own server binary (optional third side)")
    dec.add_model_args(ap)
    a = ap.parse_args()
    gguf_path = dec.make_model(a)
    EOS["id"] = a.eos_id
    clients = [int(x) for x in a.clients.split(",")]
    ctx = 1024 if a.arch == "gpt2" else 2048  # gpt2: its 1024 learned positions
    if a.prefix + 32 > ctx:  # the prefix, 16 new tokens and 16 generated must fit the context
        a.prefix = ctx - 32
        print(f"prefix caching: a {a.prefix}-token shared prefix (the context is {ctx})")
    sides = list(dict.fromkeys([x for x in a.sides.split(",") if x] + (["llama-server"] if a.llama_server else [])))
    rows = []
    for side in sides:
        for C in clients:
            if side == "nabla":
                srv = Server([os.path.join(a.build, "nabla"), "serve", dec.nabla_serve_model(a), "--port", "0", "--threads", str(a.threads),
                              "--max-num-seqs", str(C), "--max-model-len", str(ctx), "--enable-prefix-caching",
                              "--served-model-name", "m"],
                             nabla_port)
            elif side == "llamacpp":
                port = free_port()
                srv = Server([sys.executable, "-m", "llama_cpp.server", "--model", gguf_path, "--host", "127.0.0.1",
                              "--port", str(port), "--n_threads", str(a.threads), "--n_threads_batch", str(a.threads),
                              "--n_ctx", str(ctx), "--model_alias", "m", "--interrupt_requests", "False"], port)
            else:
                port = free_port()
                srv = Server([a.llama_server, "-m", gguf_path, "--host", "127.0.0.1", "--port", str(port), "-t",
                              str(a.threads), "-tb", str(a.threads), "-c", str(ctx * C), "--parallel", str(C),
                              "--cont-batching", "--alias", "m"], port)
            try:
                load(srv.port, min(C, 4), 1, a.prompt, 8, a.seed + 1)  # warm-up: compiles buckets, touches pages
                r = load(srv.port, C, a.requests, a.prompt, a.tokens, a.seed)
                pf = prefix_cache(srv.port, a.prefix, 16, 16, 5, a.seed + 2) if C == clients[0] else None
            finally:
                srv.stop()
            rows.append((side, C, r, pf))
            print(f"{side} C={C}: {r['tok_s']:.1f} tok/s, {r['requests']} requests ({r['failed']} not complete), "
                  f"TTFT p50 {r['ttft_p50'] * 1e3:.0f} ms p99 {r['ttft_p99'] * 1e3:.0f} ms, wall {r['wall']:.1f} s"
                  + (f"; prefix TTFT first {pf[0] * 1e3:.0f} ms later {pf[1] * 1e3:.0f} ms ({100 * pf[1] / pf[0]:.0f}%)"
                     if pf else ""), flush=True)
            if r["failed"]:
                print("  not complete:", r["why"])
    print()
    print(f"model: {a.arch} {a.model_dir} (d {a.d_model}, {a.layers} layers, vocab {a.vocab}, f32), threads {a.threads}, "
          f"prompt {a.prompt} tokens, {a.tokens} generated, {a.requests} requests per client")
    print("| side | clients | generated tok/s | vs llama_cpp.server | TTFT p50 | TTFT p99 | failed |")
    print("|---|---|---|---|---|---|---|")
    base = {C: r["tok_s"] for s, C, r, _ in rows if s == "llamacpp"}
    for s, C, r, _ in rows:
        ratio = f"{r['tok_s'] / base[C]:.2f}x" if C in base else "-"
        print(f"| {s} | {C} | {r['tok_s']:.1f} | {ratio} | {r['ttft_p50'] * 1e3:.0f} ms | {r['ttft_p99'] * 1e3:.0f} ms | "
              f"{r['failed']} |")
    for s, C, _, pf in rows:
        if pf:
            print(f"prefix caching ({s}): {a.prefix}-token shared prefix, TTFT first {pf[0] * 1e3:.0f} ms, "
                  f"later (median of 5) {pf[1] * 1e3:.0f} ms = {100 * pf[1] / pf[0]:.1f}% of the first")


if __name__ == "__main__":
    main()
