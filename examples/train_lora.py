"""A tiny, real LoRA fine-tune: the main job lora_otel traces in its README and tests.

A small causal language model (embedding, two transformer blocks, LM head) is built from a config
and randomly initialised — nothing is downloaded — then frozen; low-rank adapters (LoRA, rank
``--rank``) are added to its attention and MLP projections and trained with AdamW on synthetic
token sequences. CPU by default, CUDA when available (``--device``). Like the training frameworks,
it takes ``--log PATH`` and writes its own log lines there.

    python examples/train_lora.py --steps 40 --log runs/demo.log
"""

from __future__ import annotations

import argparse
import math
import time

import torch
from torch import nn


class LoRALinear(nn.Module):
    """``y = W x + (alpha / r) · B A x`` with ``W`` frozen and ``A``, ``B`` trained (B starts at 0)."""

    def __init__(self, base: nn.Linear, rank: int, alpha: float) -> None:
        super().__init__()
        self.base = base
        self.base.requires_grad_(False)
        self.lora_a = nn.Parameter(torch.empty(rank, base.in_features))
        self.lora_b = nn.Parameter(torch.zeros(base.out_features, rank))
        nn.init.kaiming_uniform_(self.lora_a, a=math.sqrt(5))
        self.scale = alpha / rank

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + (x @ self.lora_a.t() @ self.lora_b.t()) * self.scale


class Block(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.ln2 = nn.LayerNorm(dim)
        self.up = nn.Linear(dim, 4 * dim)
        self.down = nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.down(torch.nn.functional.gelu(self.up(self.ln2(x))))


class TinyCausalLM(nn.Module):
    def __init__(self, vocab: int, dim: int, heads: int, layers: int, ctx: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(ctx, dim)
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.head = nn.Linear(dim, vocab)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        n = ids.shape[1]
        mask = torch.triu(torch.full((n, n), float("-inf"), device=ids.device), 1)
        x = self.embed(ids) + self.pos(torch.arange(n, device=ids.device))
        for b in self.blocks:
            x = b(x, mask)
        return self.head(x)


def add_lora(model: TinyCausalLM, rank: int, alpha: float) -> int:
    """Freeze the model and wrap its MLP projections and LM head in LoRA; return trainable params."""
    model.requires_grad_(False)
    for b in model.blocks:
        b.up = LoRALinear(b.up, rank, alpha)
        b.down = LoRALinear(b.down, rank, alpha)
    model.head = LoRALinear(model.head, rank, alpha)
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=40, help="optimizer steps (default 40)")
    p.add_argument("--rank", type=int, default=8, help="LoRA rank (default 8)")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=32)
    p.add_argument("--device", default="auto", help="auto (CUDA when available), cpu or cuda")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--log", help="also append this script's own log lines to PATH")
    args = p.parse_args()

    log_file = open(args.log, "a", encoding="utf-8") if args.log else None

    def log(msg: str) -> None:
        line = "%s train_lora: %s" % (time.strftime("%H:%M:%S"), msg)
        print(line, flush=True)
        if log_file:
            log_file.write(line + "\n")
            log_file.flush()

    torch.manual_seed(args.seed)
    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    vocab = 256
    model = TinyCausalLM(vocab=vocab, dim=64, heads=4, layers=2, ctx=args.seq).to(device)
    trainable = add_lora(model, args.rank, alpha=2.0 * args.rank)
    model.to(device)
    log("model ready on %s: %d trainable LoRA parameters" % (device, trainable))
    opt = torch.optim.AdamW([q for q in model.parameters() if q.requires_grad], lr=args.lr)

    # Synthetic data with structure to learn: each sequence counts up from a random start.
    def batch() -> torch.Tensor:
        start = torch.randint(0, vocab, (args.batch, 1), device=device)
        return (start + torch.arange(args.seq + 1, device=device)) % vocab

    first = last = None
    for step in range(1, args.steps + 1):
        seq = batch()
        logits = model(seq[:, :-1])
        loss = nn.functional.cross_entropy(logits.reshape(-1, vocab), seq[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        last = loss.item()
        first = last if first is None else first
        if step % 10 == 0 or step == args.steps:
            log("step %d/%d loss %.4f" % (step, args.steps, last))
    log("done: loss %.4f -> %.4f" % (first, last))
    if log_file:
        log_file.close()


if __name__ == "__main__":
    main()
