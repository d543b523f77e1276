"""Goldens of the preference losses (tests/posttrain/test_pref_loss.c) from
TRL's own loss code, on Debian's CPU torch, in float64.

  /usr/bin/python3 -m venv --system-site-packages VENV
  VENV/bin/pip install --no-deps trl==1.16.0
  VENV/bin/pip download --no-deps trl==0.12.2 -d DIR      # the cDPO formula (below)
  VENV/bin/python tests/posttrain/golden/make_pref_goldens.py DIR/trl-0.12.2-py3-none-any.whl

TRL's trainers import transformers and accelerate, which need a newer torch
than Debian's 1.13, so this script does not import trl: it reads trl's
source files and executes the loss code itself (ast), unchanged:
  - trl 1.16.0 trainer/utils.py selective_log_softmax (per-token log-probs);
  - trl 1.16.0 trainer/dpo_trainer.py DPOTrainer._compute_loss: the branches
    `if loss_type == "sigmoid" | "hinge" | "ipo"` of its loss loop, and its
    rewards (beta * logratio), accuracy and margin lines as written there;
  - trl 0.12.2 DPOTrainer.dpo_loss's `sigmoid` branch for label_smoothing > 0
    (cDPO): TRL 1.16's sigmoid no longer reads label_smoothing;
  - trl 1.16.0 experimental/orpo/orpo_trainer.py: log1mexp,
    ORPOTrainer.get_batch_logps (average_log_prob=True),
    ORPOTrainer.odds_ratio_loss, the chosen NLL (cross_entropy_loss of
    concatenated_forward, over prompt and completion) and
    `loss = policy_nll_loss - losses.mean()`.
The batch follows TRL's layout: 2B rows (chosen, then rejected) of
input_ids [2B, L] with logits [2B, L, V]; nabla's rows are shifted by one
(targets = input_ids[:, 1:], logits[:, :L-1]), so the goldens store those
and the gradient w.r.t. logits[:, :L-1] (the last position's is zero).
"""
import ast
import json
import os
import sys
import textwrap
import types
import zipfile

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

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
    code = textwrap.dedent(ast.get_source_segment(src, node))
    exec(compile(code, "<trl>", "exec"), ns)
    return ns[node.name]


def branch_body(src, fn, loss_type):
    """The statements of `if loss_type == "<loss_type>":` inside fn, as code."""
    for node in ast.walk(fn):
        if isinstance(node, ast.If) and isinstance(node.test, ast.Compare):
            t = node.test
            if (isinstance(t.left, ast.Name) and t.left.id == "loss_type" and isinstance(t.comparators[0], ast.Constant)
                    and t.comparators[0].value == loss_type):
                lines = [textwrap.dedent(ast.get_source_segment(src, s, padded=True)) for s in node.body]
                return compile("\n".join(textwrap.dedent(l) for l in lines), "<trl " + loss_type + ">", "exec")
    raise KeyError(loss_type)


NS = {"torch": torch, "F": F, "nn": nn, "is_triton_available": lambda: False,
      "_supports_trl_loss_kernel": lambda *a: False}
UTILS = read(os.path.join(TRL, "trainer", "utils.py"))
selective_log_softmax = exec_def(UTILS, find_def(ast.parse(UTILS), "selective_log_softmax"), NS)
DPO = read(os.path.join(TRL, "trainer", "dpo_trainer.py"))
DPO_FN = find_def(ast.parse(DPO), "_compute_loss", "DPOTrainer")
ORPO = read(os.path.join(TRL, "experimental", "orpo", "orpo_trainer.py"))
ORPO_T = ast.parse(ORPO)
exec_def(ORPO, find_def(ORPO_T, "log1mexp"), NS)
odds_ratio_loss = exec_def(ORPO, find_def(ORPO_T, "odds_ratio_loss", "ORPOTrainer"), NS)
get_batch_logps = exec_def(ORPO, find_def(ORPO_T, "get_batch_logps", "ORPOTrainer"), NS)
cross_entropy_loss_src = find_def(find_def(ORPO_T, "concatenated_forward", "ORPOTrainer"), "cross_entropy_loss")
OLD = zipfile.ZipFile(sys.argv[1]).read("trl/trainer/dpo_trainer.py").decode()
assert "trl-0.12.2" in os.path.basename(sys.argv[1])


def old_sigmoid_branch():
    fn = find_def(ast.parse(OLD), "dpo_loss", "DPOTrainer")
    for node in ast.walk(fn):
        if (isinstance(node, ast.If) and isinstance(node.test, ast.Compare)
                and ast.unparse(node.test) == "self.loss_type == 'sigmoid'"):
            return compile("\n".join(textwrap.dedent(ast.get_source_segment(OLD, s, padded=True)) for s in node.body),
                           "<trl 0.12.2 sigmoid>", "exec")
    raise KeyError("sigmoid")


CDPO = old_sigmoid_branch()

# ---------------------------------------------------------------- the batch
B, L, V = 3, 8, 6
rng = np.random.default_rng(20261127)
input_ids = rng.integers(0, V, size=(2 * B, L))
prompt_len = [3, 2, 3, 3, 2, 3]           # chosen rows, then rejected (same prompts)
total_len = [8, 6, 7, 5, 8, 7]            # prompt + completion; the rest is padding
attention_mask = np.zeros((2 * B, L), np.int64)
completion_mask = np.zeros((2 * B, L), np.int64)
for r in range(2 * B):
    attention_mask[r, :total_len[r]] = 1
    completion_mask[r, prompt_len[r]:total_len[r]] = 1
    input_ids[r, total_len[r]:] = 0
policy_logits = rng.standard_normal((2 * B, L, V)) * 1.5
ref_logits = policy_logits + rng.standard_normal((2 * B, L, V)) * 0.5

ids_t = torch.tensor(input_ids)
cmask_t = torch.tensor(completion_mask)
amask_t = torch.tensor(attention_mask)


def dpo_logps(logits):
    """Per-token log-probs of the completion, summed (DPOTrainer: outputs.log_probs with prompt and padding labels
    -100, .sum(dim=1))."""
    shift_mask = cmask_t[..., 1:]
    tok = selective_log_softmax(logits[:, :-1], ids_t[:, 1:])
    return (tok * shift_mask).sum(dim=1)


class Self:
    pass


def run_dpo(loss_type, beta, label_smoothing):
    logits = torch.tensor(policy_logits, requires_grad=True)
    self = Self()
    self.beta, self.label_smoothing = beta, label_smoothing
    logps = dpo_logps(logits)
    ref_logps = dpo_logps(torch.tensor(ref_logits)).detach()
    chosen_logps, rejected_logps = logps.chunk(2, dim=0)
    ref_chosen_logps, ref_rejected_logps = ref_logps.chunk(2, dim=0)
    # as DPOTrainer._compute_loss (f_divergence_type reverse_kl)
    chosen_logratios = chosen_logps - ref_chosen_logps
    rejected_logratios = rejected_logps - ref_rejected_logps
    chosen_scores, rejected_scores = chosen_logratios, rejected_logratios
    delta_score = chosen_scores - rejected_scores
    ns = dict(NS, self=self, delta_score=delta_score, chosen_scores=chosen_scores, rejected_scores=rejected_scores,
              completion_mask=cmask_t, logits=delta_score)
    if label_smoothing > 0:
        exec(CDPO, ns)
        per_sequence_loss = ns["losses"]
    else:
        exec(branch_body(DPO, DPO_FN, loss_type), ns)
        per_sequence_loss = ns["per_sequence_loss"]
    loss = per_sequence_loss.mean()
    loss.backward()
    chosen_rewards = self.beta * chosen_logratios.detach()
    rejected_rewards = self.beta * rejected_logratios.detach()
    reward_accuracies = (chosen_rewards > rejected_rewards).double()
    margins = chosen_rewards - rejected_rewards
    return {"loss": arr(loss.detach().numpy()), "losses": arr(per_sequence_loss.detach().numpy()),
            "chosen_rewards": arr(chosen_rewards.numpy()), "rejected_rewards": arr(rejected_rewards.numpy()),
            "accuracy": float(reward_accuracies.mean()), "margin": float(margins.mean()),
            "chosen_logps": arr(chosen_logps.detach().numpy()), "rejected_logps": arr(rejected_logps.detach().numpy()),
            "grad": arr(logits.grad[:, :-1].numpy()), "grad_last_zero": bool((logits.grad[:, -1] == 0).all())}


def run_orpo(lam):
    logits = torch.tensor(policy_logits, requires_grad=True)
    self = Self()
    self.beta, self.is_encoder_decoder = lam, False
    self.accelerator = types.SimpleNamespace(device="cpu")
    cross_entropy_loss = exec_def(ORPO, cross_entropy_loss_src, dict(NS, self=self))
    labels = torch.where(cmask_t == 1, ids_t, -100)           # concatenated_labels: prompt and padding -100
    all_logps = get_batch_logps(logits, labels, average_log_prob=True, is_encoder_decoder=False)
    nll_labels = torch.where(amask_t == 1, ids_t, -100)       # concatenated_forward's NLL labels
    policy_nll_loss = cross_entropy_loss(logits[:B], nll_labels[:B])
    chosen_logps, rejected_logps = all_logps[:B], all_logps[B:]
    losses, chosen_rewards, rejected_rewards, log_odds_ratio, log_odds_chosen = odds_ratio_loss(
        self, chosen_logps, rejected_logps)
    loss = policy_nll_loss - losses.mean()                    # ORPOTrainer.get_batch_loss_metrics
    loss.backward()
    return {"loss": arr(loss.detach().numpy()), "nll": float(policy_nll_loss), "log_odds_ratio": float(log_odds_ratio),
            "log_odds": float(log_odds_chosen), "chosen_rewards": arr(chosen_rewards.numpy()),
            "rejected_rewards": arr(rejected_rewards.numpy()),
            "accuracy": float((chosen_rewards > rejected_rewards).double().mean()),
            "margin": float((chosen_rewards - rejected_rewards).mean()),
            "chosen_logps": arr(chosen_logps.detach().numpy()), "rejected_logps": arr(rejected_logps.detach().numpy()),
            "grad": arr(logits.grad[:, :-1].numpy()), "grad_last_zero": bool((logits.grad[:, -1] == 0).all())}


torch.set_default_dtype(torch.float64)
cases = {
    "sigmoid": dict(run_dpo("sigmoid", 0.1, 0.0), beta=0.1, label_smoothing=0.0),
    "cdpo": dict(run_dpo("sigmoid", 0.3, 0.2), beta=0.3, label_smoothing=0.2),
    "ipo": dict(run_dpo("ipo", 0.1, 0.0), beta=0.1, label_smoothing=0.0),
    "hinge": dict(run_dpo("hinge", 0.25, 0.0), beta=0.25, label_smoothing=0.0),
    "orpo": dict(run_orpo(0.2), orpo_lambda=0.2),
}
for name, c in cases.items():
    assert c["grad_last_zero"], name
    del c["grad_last_zero"]
    print(name, c["loss"]["data"], "acc", c["accuracy"], "margin", c["margin"])
ref_sum = dpo_logps(torch.tensor(ref_logits))
out = {
    "meta": {"trl": md.version("trl"), "trl_cdpo": "0.12.2", "torch": torch.__version__, "python": sys.version.split()[0],
             "B": B, "T": L - 1, "V": V},
    "inputs": {"logits": arr(policy_logits[:, :-1]), "ref_logits": arr(ref_logits[:, :-1]),
               "targets": arr(input_ids[:, 1:].astype(np.int32)),
               "mask": arr(completion_mask[:, 1:].astype(np.float64)),
               "valid": arr(attention_mask[:, 1:].astype(np.float64)), "ref_logps": arr(ref_sum.numpy())},
    "cases": cases,
}
write(os.path.join(HERE, "pref_losses.json"), out)
