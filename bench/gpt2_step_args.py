"""Shared by the GPT-2 step peers (gpt2_step_torch.py, gpt2_step_jax.py): the
model shapes of nabla's presets, the command line both take and the timed
loop with its RESULT line, so the peers and bench/gpt2_step.c measure the same
model the same way."""
import argparse
import statistics
import time

PRESETS = {  # vocab, d_model, layers, heads, d_ff, max positions (include/nabla/models.h)
    "gpt2-tiny": (256, 128, 4, 4, 512, 128),
    "gpt2-124m": (50257, 768, 12, 12, 3072, 1024),
}


def parse_args():
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="gpt2-124m", choices=sorted(PRESETS))
    ap.add_argument("--vocab", type=int, default=0)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="cpu", help="the peer's device (torch: cpu or cuda)")
    return ap.parse_args()


def time_steps(a, framework, version, n, layers, d, vocab, run_step, extra=""):
    """Runs run_step() (one training step, returns the loss as a float) a.steps
    + 1 times, the first a warm-up, and prints each step and the RESULT line
    bench/gpt2_step.sh collects: the median step, tokens/s and model FLOP/s,
    and the median CPU time of the process per step (all its threads)
    (6 N per token plus 12 L d T per token of attention, as bench/gpt2_step.c)."""
    B, T = a.batch, a.seq
    times, cpus, losses = [], [], []
    for r in range(a.steps + 1):
        t0, c0 = time.perf_counter(), time.process_time()
        lv = run_step()
        dt, dc = time.perf_counter() - t0, time.process_time() - c0
        losses.append(lv)
        if r > 0:
            times.append(dt)
            cpus.append(dc)
        print(f"step {r}: {dt:.3f} s, loss {lv:.5f}", flush=True)
    step = statistics.median(times)
    flops = 6.0 * n * B * T + 12.0 * layers * d * T * B * T
    print(f"RESULT {framework} {a.preset} B={B} T={T} vocab={vocab} params={n} threads={a.threads}: step {step:.4f} s "
          f"(median of {a.steps}), {B * T / step:.0f} tokens/s, model {flops / 1e9:.1f} GFLOP/step, "
          f"{flops / step / 1e9:.2f} GFLOP/s, loss {losses[0]:.4f} -> {losses[-1]:.4f}{extra}, {framework} {version}, "
          f"cpu {statistics.median(cpus):.4f} s/step")
