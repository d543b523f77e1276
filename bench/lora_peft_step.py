"""The PEFT side of bench/lora_vs_peft.sh: LoRA SFT steps on a GPT-2 Hugging Face folder with
peft + transformers on Debian's CPU torch, printing one line per timed step:
  step <i> wall_ms <w> cpu_ms <c>
  python bench/lora_peft_step.py MODEL_DIR BATCH SEQ RANK THREADS STEPS
  python bench/lora_peft_step.py --make MODEL_DIR      (a random gpt2-124m folder, seed 0)
Targets: c_attn and attn.c_proj (the attention projections, as nabla's '.*attn/w[qkvo]'), alpha 2r,
AdamW (lr 1e-4), no dropout, loss over every token (nabla's masked loss costs the same)."""
import sys, time

import torch


def make(out):
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    cfg = GPT2Config(resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)  # gpt2-124m: 12 layers, d 768, vocab 50257
    GPT2LMHeadModel(cfg).save_pretrained(out, safe_serialization=True)


def main():
    if sys.argv[1] == "--make":
        return make(sys.argv[2])
    model_dir, B, T, r, threads, steps = sys.argv[1], *map(int, sys.argv[2:7])
    torch.set_num_threads(threads)
    import peft
    from transformers import GPT2LMHeadModel
    model = GPT2LMHeadModel.from_pretrained(model_dir, attn_implementation="eager")
    model = peft.get_peft_model(model, peft.LoraConfig(r=r, lora_alpha=2 * r, lora_dropout=0.0, fan_in_fan_out=True,
                                                       target_modules=["c_attn", "attn.c_proj"]))
    model.train()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    g = torch.Generator().manual_seed(0)
    for i in range(steps + 1):  # step 0: warm-up, not timed
        ids = torch.randint(0, 256, (B, T), generator=g)
        w0, c0 = time.perf_counter(), time.process_time()
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        w1, c1 = time.perf_counter(), time.process_time()
        if i:
            print(f"step {i} wall_ms {(w1 - w0) * 1e3:.1f} cpu_ms {(c1 - c0) * 1e3:.1f}", flush=True)


if __name__ == "__main__":
    main()
