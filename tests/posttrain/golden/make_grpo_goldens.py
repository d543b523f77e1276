"""Goldens of the GRPO loss (tests/posttrain/test_grpo_loss.c) from TRL's own
code, on Debian's CPU torch, in float64.

  /usr/bin/python3 -m venv --system-site-packages VENV
  VENV/bin/pip install --no-deps trl==1.16.0
  VENV/bin/python tests/posttrain/golden/make_grpo_goldens.py

As make_pref_goldens.py, this does not import trl (its trainers need a newer
torch than Debian's 1.13): it reads trl's source files and executes, unchanged,
  - trl 1.16.0 trainer/utils.py selective_log_softmax and nanstd;
  - trl 1.16.0 trainer/grpo_trainer.py GRPOTrainer._compute_loss (the loss,
    the KL and clip-ratio metrics), on a stand-in `self` whose per-token
    log-probs are selective_log_softmax of the given logits;
  - the body of `if self.multi_objective_aggregation == "sum_then_normalize":`
    of GRPOTrainer._generate_and_score_completions (group-normalized
    advantages, scale_rewards "group" or "none").
The batch: N = 6 completions (2 prompts x G = 3) of T = 7 tokens with
logits [N, T, V] of the policy at the completion positions, the sampled
tokens, a completion mask (padding after an early end), the rollout
policy's (old) and the reference's per-token log-probs, one reward per
completion. nabla's rows are prompt + completion; the test feeds the
completion part only (mask 1 on completion targets), which is the same.
"""
import ast
import collections
import os
import sys
import textwrap
import types

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "core", "golden"))
from golden_util import arr, write  # noqa: E402

import importlib.metadata as md  # noqa: E402

TRL = os.path.dirname(str(md.distribution("trl").locate_file("trl/__init__.py")))
assert md.version("trl") == "1.16.0", md.version("trl")


def read(path):
    with open(path) as f:
        return f.read()


def find_def(tree, name, cls=None):
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and cls and node.name == cls:
            return find_def(node, name)
        if cls is None and isinstance(node, ast.FunctionDef) and node.name == name:
            return node
    raise KeyError(name)


def exec_def(src, node, ns):
    exec(compile(textwrap.dedent(ast.get_source_segment(src, node)), "<trl>", "exec"), ns)
    return ns[node.name]


def if_body(src, fn, test_text):
    for node in ast.walk(fn):
        if isinstance(node, ast.If) and ast.unparse(node.test) == test_text:
            return compile("\n".join(textwrap.dedent(ast.get_source_segment(src, s, padded=True)) for s in node.body),
                           "<trl advantages>", "exec")
    raise KeyError(test_text)


UTILS = read(os.path.join(TRL, "trainer", "utils.py"))
UT = ast.parse(UTILS)
NS = {"torch": torch, "is_triton_available": lambda: False}
selective_log_softmax = exec_def(UTILS, find_def(UT, "selective_log_softmax"), NS)
nanstd = exec_def(UTILS, find_def(UT, "nanstd"), NS)
nanmin = exec_def(UTILS, find_def(UT, "nanmin"), NS)
nanmax = exec_def(UTILS, find_def(UT, "nanmax"), NS)
GRPO = read(os.path.join(TRL, "trainer", "grpo_trainer.py"))
GT = ast.parse(GRPO)
NS.update(nanstd=nanstd, nanmin=nanmin, nanmax=nanmax)
compute_loss = exec_def(GRPO, find_def(GT, "_compute_loss", "GRPOTrainer"), NS)
ADV = if_body(GRPO, find_def(GT, "_generate_and_score_completions", "GRPOTrainer"),
              "self.multi_objective_aggregation == 'sum_then_normalize'")

# ---------------------------------------------------------------- the batch
P, G, T, V = 2, 3, 7, 5
N = P * G
rng = np.random.default_rng(20261128)
lengths = [7, 4, 6, 7, 2, 5]
mask = np.zeros((N, T), np.int64)
for r in range(N):
    mask[r, :lengths[r]] = 1
tokens = rng.integers(0, V, size=(N, T))
logits = rng.standard_normal((N, T, V)) * 1.5
cur = selective_log_softmax(torch.tensor(logits), torch.tensor(tokens)).numpy()
# the rollout policy: close to the current one, some tokens far enough for either clip to act
old = cur + rng.standard_normal((N, T)) * 0.25
ref = cur + rng.standard_normal((N, T)) * 0.4
rewards = np.array([1.0, 0.0, 0.5, 2.0, 2.0, -1.0])


class Acc:
    num_processes = 1

    def gather(self, x):
        return x

    def gather_for_metrics(self, x):
        return x

    def reduce(self, x, reduction="sum"):
        return x


def advantages(scale_rewards):
    self = types.SimpleNamespace(scale_rewards=scale_rewards, reward_weights=torch.ones(1))
    ns = dict(NS, self=self, rewards_per_func=torch.tensor(rewards).unsqueeze(1), num_generations=G, device="cpu",
              unscorable_mask=torch.zeros(N, dtype=torch.bool))
    exec(ADV, ns)
    return ns["advantages"]


def run(loss_type, eps_low, eps_high, beta, scale_rewards):
    adv = advantages(scale_rewards)
    lg = torch.tensor(logits, requires_grad=True)
    self = types.SimpleNamespace(
        top_entropy_quantile=1.0, off_policy_mask_threshold=None, importance_sampling_level="token", beta=beta,
        args=types.SimpleNamespace(use_bias_correction_kl=False, delta=None, steps_per_generation=1),
        loss_type=loss_type, epsilon_low=eps_low, epsilon_high=eps_high, use_vllm=False, max_completion_length=T,
        current_gradient_accumulation_steps=1, accelerator=Acc(), model=types.SimpleNamespace(training=True),
        _entropy_bonus_enabled=False, aux_loss_enabled=False, _metrics={"train": collections.defaultdict(list)},
        _get_per_token_logps_and_entropies=lambda model, ids, am, keep, **kw: (
            selective_log_softmax(lg, torch.tensor(tokens)), torch.zeros(N, T), None))
    inputs = {"prompt_ids": torch.zeros(N, 0, dtype=torch.long), "prompt_mask": torch.zeros(N, 0, dtype=torch.long),
              "completion_ids": torch.tensor(tokens), "completion_mask": torch.tensor(mask), "advantages": adv,
              "old_per_token_logps": torch.tensor(old), "ref_per_token_logps": torch.tensor(ref),
              "num_items_in_batch": torch.tensor(float(mask.sum()))}
    loss = compute_loss(self, None, inputs)
    loss.backward()
    m = self._metrics["train"]
    out = {"loss_type": loss_type, "epsilon_low": eps_low, "epsilon_high": eps_high, "beta": beta,
           "scale_rewards": scale_rewards, "advantages": arr(adv.numpy()), "loss": float(loss),
           "clip_low": m["clip_ratio/low_mean"][0], "clip_high": m["clip_ratio/high_mean"][0],
           "clip_region": m["clip_ratio/region_mean"][0], "grad": arr(lg.grad.numpy())}
    if beta != 0:
        out["kl"] = m["kl"][0]
    return out


cases = {
    "grpo": run("grpo", 0.2, 0.2, 0.04, "group"),
    "bnpo": run("bnpo", 0.2, 0.2, 0.1, "group"),
    "dr_grpo": run("dr_grpo", 0.2, 0.2, 0.0, "none"),
    "dapo": run("dapo", 0.2, 0.28, 0.0, "group"),
}
write(os.path.join(HERE, "grpo_losses.json"), {
    "inputs": {"logits": arr(logits), "tokens": arr(tokens.astype(np.int32)), "mask": arr(mask.astype(np.float64)),
               "old_logps": arr(old), "ref_logps": arr(ref), "rewards": arr(rewards), "group_size": G},
    "cases": cases})
print({k: (v["loss"], v["clip_region"]) for k, v in cases.items()})
