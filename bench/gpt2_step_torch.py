#!/usr/bin/python3
"""Peer of bench/gpt2_step.c: the same GPT-2 training step in PyTorch eager on
the CPU (Debian's python3-torch, run with /usr/bin/python3): tied token
embedding, learned positions, pre-LayerNorm blocks, GELU (tanh), causal
softmax attention (written out: Debian's torch 1.13 has no fused SDPA), mean
cross-entropy, and
torch.optim.AdamW(lr 3e-4, betas (0.9, 0.95), eps 1e-8, weight decay 0.1 on
every parameter), torch.set_num_threads(2). --device cuda runs it on the GPU
in f32 with TF32 off (the CUDA backend's comparison).

  /usr/bin/python3 bench/gpt2_step_torch.py [--preset gpt2-124m] [--vocab 50304] [--batch 4] [--seq 256] [--steps 3]
"""
import math

from gpt2_step_args import PRESETS, parse_args, time_steps

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, d, h, ff):
        super().__init__()
        self.h = h
        self.ln_1 = nn.LayerNorm(d, eps=1e-5)
        self.c_attn = nn.Linear(d, 3 * d)
        self.attn_proj = nn.Linear(d, d)
        self.ln_2 = nn.LayerNorm(d, eps=1e-5)
        self.c_fc = nn.Linear(d, ff)
        self.mlp_proj = nn.Linear(ff, d)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.h, C // self.h).transpose(1, 2) for t in (q, k, v))
        s = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(C // self.h))
        s = s.masked_fill(~torch.ones(T, T, dtype=torch.bool, device=x.device).tril(), float("-inf"))
        a = F.softmax(s, dim=-1) @ v
        x = x + self.attn_proj(a.transpose(1, 2).contiguous().view(B, T, C))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, vocab, d, layers, heads, ff, max_pos):
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(max_pos, d)
        self.blocks = nn.ModuleList(Block(d, heads, ff) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d, eps=1e-5)
        for name, p in self.named_parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02)
            elif "ln" not in name:
                nn.init.zeros_(p)

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        for b in self.blocks:
            x = b(x)
        logits = self.ln_f(x) @ self.wte.weight.t()  # tied head
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1))


def main():
    a = parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    vocab, d, layers, heads, ff, max_pos = PRESETS[a.preset]
    vocab = a.vocab or vocab
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    model = GPT(vocab, d, layers, heads, ff, max_pos).to(a.device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    n = sum(p.numel() for name, p in model.named_parameters() if "wpe" not in name)
    B, T = a.batch, a.seq
    tok = (torch.arange(B * T + 1) * 7919 + 13) % vocab
    x, y = tok[:-1].view(B, T).to(a.device), tok[1:].view(B, T).to(a.device)

    def run_step():
        loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss.item()

    time_steps(a, "torch", torch.__version__, n, layers, d, vocab, run_step, f", device {a.device}")

if __name__ == "__main__":
    main()
