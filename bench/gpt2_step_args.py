"""Shared by the GPT-2 step peers (gpt2_step_torch.py, gpt2_step_jax.py): the
model shapes of nabla's presets and the command line both take, so the peers
and bench/gpt2_step.c measure the same model."""
import argparse

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
    return ap.parse_args()
