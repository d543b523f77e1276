"""`nabla serve` through the official `openai` Python client (PyPI), over
loopback: completions (greedy tokens equal `nabla generate`'s for the same
prompt), n > 1 and lists of prompts, logprobs (completions and chat), a
concurrent mix equal to each request alone, streaming (the chunks add up to the whole; the usage chunk with
stream_options.include_usage), stop strings (never emitted, not even
partially, streamed or not), echo, seed reproducibility, chat with the ChatML
template, and the errors the client maps to its exception classes. The test
trains a tiny byte-level model (a few seconds), starts the server with
--port 0 and stops it by its PID with SIGTERM (exit 0).
Errors and endpoints with a raw HTTP client: tests/cli/test_serve.c."""
import concurrent.futures
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import openai

BIN = os.environ.get("NABLA_BIN")
if not BIN:
    sys.exit("NABLA_BIN is not set (ctest sets it)")
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what, file=sys.stderr)


def lossy(data: bytes) -> str:
    """The server's text for raw bytes: each byte that starts no valid UTF-8
    sequence becomes U+FFFD (one per byte)."""
    out, i = [], 0
    while i < len(data):
        for k in (1, 2, 3, 4):
            try:
                out.append(data[i:i + k].decode("utf-8", errors="strict"))
                i += k
                break
            except UnicodeDecodeError:
                continue
        else:
            out.append("\ufffd")
            i += 1
    return "".join(out)


def main():
    work = tempfile.mkdtemp(prefix="nabla-peer-serve-")
    os.chdir(work)
    with open("corpus.txt", "w") as f:
        for i in range(300):
            f.write(f"line {i} of a small corpus for the serve test\n")
    env = dict(os.environ, NABLA_PEAK_GFLOPS="10")
    # enough steps that greedy text is readable (stop strings need ASCII)
    subprocess.run([BIN, "train", "--run-dir", "run", "data.train=corpus.txt", "model.preset=gpt2-tiny",
                    "model.n_layers=1", "model.d_model=32", "model.n_heads=2", "model.n_kv_heads=2",
                    "model.d_ff=64", "model.max_seq_len=128", "data.seq_len=32", "batch_size=8", "steps=100",
                    "optim.lr=0.01", "schedule.warmup_steps=0", "eval_every=0", "log_every=100",
                    "checkpoint_every=0", "--threads", "1"], check=True, env=env, stdout=subprocess.DEVNULL,
                   timeout=120)
    prompt = "line 1"
    gen = subprocess.run([BIN, "generate", "--run-dir", "run", "--prompt", prompt, "--max-tokens", "24",
                          "--temperature", "0", "--show-ids", "--threads", "1"], check=True, env=env,
                         capture_output=True, timeout=120)
    ids = [int(t) for t in re.search(r"generated ids:([ 0-9]*)", gen.stderr.decode()).group(1).split()]
    want = lossy(bytes(ids))  # byte-level model: token i is byte i
    check(len(set(want)) > 5, f"the tiny model's greedy text {want!r} is too uniform to test stop strings")

    srv = subprocess.Popen([BIN, "serve", "run", "--port", "0", "--threads", "1", "--api-key", "k",
                            "--served-model-name", "tiny"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    try:
        line = srv.stdout.readline().decode()
        port = int(re.search(r"http://127\.0\.0\.1:(\d+)", line).group(1))
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="k", max_retries=0, timeout=120)
        run_checks(client, prompt, want, port)
    finally:
        srv.send_signal(signal.SIGTERM)
        try:
            rc = srv.wait(timeout=20)
        except subprocess.TimeoutExpired:
            srv.kill()
            rc = "still running 20 s after SIGTERM"
        check(rc == 0, f"SIGTERM: exit status {rc}: {srv.stderr.read().decode()}")
    os.chdir("/")
    shutil.rmtree(work, ignore_errors=True)
    if failures:
        sys.exit(f"{len(failures)} failed")
    print("cli/peer_serve: all passed")


def run_checks(client, prompt, want, port):
    models = client.models.list()
    check([m.id for m in models.data] == ["tiny"], f"models: {models}")

    # greedy: the same tokens as `nabla generate`
    r = client.completions.create(model="tiny", prompt=prompt, max_tokens=24, temperature=0)
    check(r.choices[0].text == want, f"greedy completion {r.choices[0].text!r} != nabla generate's {want!r}")
    check(r.choices[0].finish_reason == "length", f"finish_reason {r.choices[0].finish_reason}")
    check(r.usage.prompt_tokens == len(prompt.encode()) and r.usage.completion_tokens == 24, f"usage {r.usage}")

    # streaming: the chunks add up to the whole, then the usage chunk
    chunks = list(client.completions.create(model="tiny", prompt=prompt, max_tokens=24, temperature=0, stream=True,
                                            stream_options={"include_usage": True}))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    check(text == want, f"streamed {text!r} != {want!r}")
    check(len([c for c in chunks if c.choices]) > 2, f"only {len(chunks)} chunks: not streamed")
    check(chunks[-1].choices == [] and chunks[-1].usage and chunks[-1].usage.completion_tokens == 24,
          f"last chunk {chunks[-1]}")
    check(all(c.usage is None for c in chunks[:-1]), "usage before the last chunk")
    finals = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    check(finals == ["length"], f"finish reasons {finals}")

    # stop strings: the text ends before the first occurrence, never partially
    # emitted, streamed or not (a 3-character stop that starts mid-text)
    at = 5
    stop = want[at:at + 3]
    cut = want[:want.find(stop)]
    r = client.completions.create(model="tiny", prompt=prompt, max_tokens=24, temperature=0, stop=[stop, "zzzz"])
    check(r.choices[0].text == cut and r.choices[0].finish_reason == "stop",
          f"stop {stop!r}: {r.choices[0].text!r} ({r.choices[0].finish_reason}), want {cut!r}")
    parts = [c.choices[0].text for c in client.completions.create(model="tiny", prompt=prompt, max_tokens=24,
                                                                  temperature=0, stop=stop, stream=True)]
    check("".join(parts) == cut, f"streamed stop {stop!r}: {parts!r}, want {cut!r}")

    # echo, token-id prompts
    r = client.completions.create(model="tiny", prompt=prompt, max_tokens=4, temperature=0, echo=True)
    check(r.choices[0].text == prompt + want[:len(r.choices[0].text) - len(prompt)] and
          r.choices[0].text.startswith(prompt), f"echo: {r.choices[0].text!r}")
    r = client.completions.create(model="tiny", prompt=list(prompt.encode()), max_tokens=24, temperature=0)
    check(r.choices[0].text == want, f"token-id prompt: {r.choices[0].text!r} != {want!r}")

    # sampling: a seed reproduces, another seed (most likely) differs
    def sample(seed, **kw):
        return client.completions.create(model="tiny", prompt=prompt, max_tokens=16, temperature=1.5, top_p=0.95,
                                         seed=seed, **kw).choices

    def seeds():
        a, b, c = sample(7), sample(7), sample(8)
        check(a[0].text == b[0].text, f"seed 7 twice: {a[0].text!r} != {b[0].text!r}")
        check(a[0].text != c[0].text, f"seeds 7 and 8 gave the same 16 tokens {a[0].text!r}")
        # n > 1 with a seed: the samples differ from each other, and reproduce
        n1, n2 = sample(9, n=3), sample(9, n=3)
        check([x.text for x in n1] == [x.text for x in n2], "n=3 seed 9 twice differs")
        check(len({x.text for x in n1}) > 1, f"n=3 sampled three equal texts {n1[0].text!r}")
    seeds()

    # n > 1 and lists of prompts: choices indexed prompt-major, usage counts
    # each prompt once and every choice's tokens
    r = client.completions.create(model="tiny", prompt=[prompt, "line 22"], n=2, max_tokens=24, temperature=0)
    alone = client.completions.create(model="tiny", prompt="line 22", max_tokens=24, temperature=0).choices[0].text
    check([c.index for c in r.choices] == [0, 1, 2, 3], f"indices {[c.index for c in r.choices]}")
    check([c.text for c in r.choices] == [want, want, alone, alone], f"n=2 x 2 prompts: {[c.text for c in r.choices]}")
    check(r.usage.prompt_tokens == len(prompt) + len("line 22") and r.usage.completion_tokens == 4 * 24,
          f"usage {r.usage}")

    # logprobs: completions {tokens, token_logprobs, top_logprobs, text_offset}
    r = client.completions.create(model="tiny", prompt=prompt, max_tokens=24, temperature=0, logprobs=0)
    lp = r.choices[0].logprobs
    check(lp is not None and len(lp.tokens) == 24 and len(lp.token_logprobs) == 24 and len(lp.text_offset) == 24,
          f"logprobs shape {lp}")
    check(lp is not None and "".join(lp.tokens) == want and all(x <= 0 for x in lp.token_logprobs),
          f"logprobs tokens {lp.tokens if lp else None}")
    check(lp is not None and lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(24)],
          f"text_offset {lp.text_offset if lp else None}")

    def top_logprobs():
        r = client.completions.create(model="tiny", prompt=prompt, max_tokens=8, temperature=0, logprobs=3)
        lp = r.choices[0].logprobs
        check(all(len(d) == 3 for d in lp.top_logprobs), f"top_logprobs {lp.top_logprobs}")
        # greedy: the drawn token is the most likely one
        check(all(max(d, key=d.get) == t and abs(d[t] - x) < 1e-5
                  for d, t, x in zip(lp.top_logprobs, lp.tokens, lp.token_logprobs)), f"greedy vs top {lp}")
    top_logprobs()

    # chat logprobs: content [{token, logprob, bytes, top_logprobs}]
    cm = [{"role": "user", "content": "line 3"}]
    r = client.chat.completions.create(model="tiny", messages=cm, max_tokens=8, temperature=0, logprobs=True)
    content = r.choices[0].logprobs.content if r.choices[0].logprobs else []
    check(len(content) == r.usage.completion_tokens and all(bytes(c.bytes).decode("utf-8", "replace") == c.token or
                                                            c.bytes == [] for c in content), f"chat logprobs {content}")

    def chat_top():
        r = client.chat.completions.create(model="tiny", messages=cm, max_tokens=8, temperature=0, logprobs=True,
                                           top_logprobs=4)
        check(all(len(c.top_logprobs) == 4 and c.top_logprobs[0].token == c.token
                  for c in r.choices[0].logprobs.content), f"chat top_logprobs {r.choices[0].logprobs}")
    chat_top()

    # a concurrent mix (completions and chat, streamed and not): each answer
    # is the one the same request gets alone
    def one(i):
        p = f"line {10 + i}"
        if i % 2:
            if i % 4 == 1:
                return "".join(c.choices[0].text for c in client.completions.create(
                    model="tiny", prompt=p, max_tokens=20, temperature=0, stream=True) if c.choices)
            return client.completions.create(model="tiny", prompt=p, max_tokens=20, temperature=0).choices[0].text
        return client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": p}], max_tokens=20,
                                              temperature=0).choices[0].message.content
    solo = [one(i) for i in range(8)]
    with concurrent.futures.ThreadPoolExecutor(8) as ex:
        mixed = list(ex.map(one, range(8)))
    check(mixed == solo, f"concurrent mix {mixed} != alone {solo}")

    # chat (ChatML), whole and streamed
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "line 3"}]
    r = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=8, temperature=0)
    m = r.choices[0].message
    check(m.role == "assistant" and isinstance(m.content, str) and r.object == "chat.completion", f"chat: {r}")
    n_prompt = len("<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nline 3<|im_end|>\n"
                   "<|im_start|>assistant\n".encode())
    check(r.usage.prompt_tokens == n_prompt, f"chat prompt tokens {r.usage.prompt_tokens} != {n_prompt} (ChatML)")
    chunks = list(client.chat.completions.create(model="tiny", messages=msgs, max_tokens=8, temperature=0,
                                                 stream=True))
    check(chunks[0].choices[0].delta.role == "assistant", f"first chat chunk {chunks[0]}")
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    check(text == m.content, f"streamed chat {text!r} != {m.content!r}")
    check(chunks[-1].choices[0].finish_reason in ("length", "stop"), f"last chat chunk {chunks[-1]}")

    # errors, as the client sees them
    def expect(exc, fn, needle):
        try:
            fn()
            check(False, f"no {exc.__name__} ({needle})")
        except exc as e:
            check(needle in str(e), f"{exc.__name__}: {e} lacks {needle!r}")
    expect(openai.BadRequestError, lambda: client.completions.create(model="tiny", prompt=prompt, max_tokens=200),
           "maximum context length is 128 tokens")
    expect(openai.NotFoundError, lambda: client.completions.create(model="gpt-4", prompt=prompt), "does not exist")
    expect(openai.BadRequestError, lambda: client.completions.create(model="tiny", prompt=prompt, logprobs=6),
           "'logprobs' is 6, outside [0, 5]")
    expect(openai.BadRequestError, lambda: client.completions.create(model="tiny", prompt=prompt, n=0), "'n' is 0")
    bad = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="wrong", max_retries=0, timeout=30)
    expect(openai.AuthenticationError, lambda: bad.models.list(), "API key")


if __name__ == "__main__":
    main()
