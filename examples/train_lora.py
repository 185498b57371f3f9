"""A tiny, real LoRA fine-tune with peft: the main job lora_otel traces in its README and tests.

A small causal language model (Llama architecture: hidden size 64, 2 layers, 256-token
vocabulary) is built from a transformers config and randomly initialised — nothing is downloaded
— then wrapped with peft's LoRA adapters (rank ``--rank`` on the attention and MLP projections) and
trained with AdamW on synthetic token sequences, in a plain torch loop, or through
``transformers.Trainer`` with ``--trainer hf``. CPU by default, CUDA when available
(``--device``). Like the training frameworks, it takes ``--log PATH`` and writes its own log
lines there.

    python examples/train_lora.py --steps 40 --log runs/demo.log
    python examples/train_lora.py --steps 40 --trainer hf
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
import warnings

# Everything is built here: never reach for the Hugging Face hub, and keep its advice quiet.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
# peft 0.21 asks transformers 5 for a property it has deprecated; not this script's business.
warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)

import torch  # noqa: E402 - after the environment above
from peft import LoraConfig, get_peft_model  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

VOCAB = 256
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def build_model(rank: int, seq: int, device: str):
    """A randomly initialised tiny Llama with LoRA adapters (peft); only the adapters train."""
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=max(seq, 64),
        tie_word_embeddings=False,
    )
    base = LlamaForCausalLM(config)
    lora = LoraConfig(r=rank, lora_alpha=2 * rank, lora_dropout=0.0, target_modules=LORA_TARGETS, task_type="CAUSAL_LM")
    return get_peft_model(base, lora).to(device)


def counting_batch(batch: int, seq: int, device: str, generator: torch.Generator | None = None) -> torch.Tensor:
    """Synthetic data with structure to learn: each sequence counts up from a random start."""
    start = torch.randint(0, VOCAB, (batch, 1), generator=generator)
    return ((start + torch.arange(seq)) % VOCAB).to(device)


def train_plain(model, args, device: str, log) -> tuple:
    """The plain torch loop: AdamW on the adapters, the model shifts the labels itself."""
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=args.lr)
    model.train()
    first = last = None
    for step in range(1, args.steps + 1):
        ids = counting_batch(args.batch, args.seq, device)
        loss = model(input_ids=ids, labels=ids).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        last = loss.item()
        first = last if first is None else first
        if step % 10 == 0 or step == args.steps:
            log("step %d/%d loss %.4f" % (step, args.steps, last))
    return first, last


def train_hf(model, args, device: str, log) -> tuple:
    """The same through ``transformers.Trainer``: ten batches an epoch, so several epochs."""
    from transformers import PrinterCallback, Trainer, TrainerCallback, TrainingArguments

    class Counting(torch.utils.data.Dataset):
        def __init__(self, n: int) -> None:
            self.ids = counting_batch(n, args.seq, "cpu", torch.Generator().manual_seed(args.seed))

        def __len__(self) -> int:
            return len(self.ids)

        def __getitem__(self, i: int) -> dict:
            return {"input_ids": self.ids[i], "labels": self.ids[i]}

    losses: list = []

    class LogLines(TrainerCallback):
        def on_log(self, targs, state, control, logs=None, **kwargs):
            if logs and "loss" in logs:
                losses.append(float(logs["loss"]))
                log("step %d/%d loss %.4f" % (state.global_step, args.steps, logs["loss"]))

    with tempfile.TemporaryDirectory(prefix="train_lora-") as tmp:
        targs = TrainingArguments(
            output_dir=args.output_dir or tmp,
            max_steps=args.steps,
            per_device_train_batch_size=args.batch,
            learning_rate=args.lr,
            logging_steps=10,
            save_strategy="no",
            report_to=[],
            disable_tqdm=True,
            use_cpu=device == "cpu",
            seed=args.seed,
            dataloader_pin_memory=False,
        )
        trainer = Trainer(model=model, args=targs, train_dataset=Counting(10 * args.batch), callbacks=[LogLines()])
        trainer.remove_callback(PrinterCallback)  # LogLines says it, in this script's format
        trainer.train()
    return (losses[0], losses[-1]) if losses else (None, None)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=40, help="optimizer steps (default 40)")
    p.add_argument("--rank", type=int, default=8, help="LoRA rank (default 8)")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=32)
    p.add_argument("--device", default="auto", help="auto (CUDA when available), cpu or cuda")
    p.add_argument(
        "--trainer",
        choices=("plain", "hf"),
        default="plain",
        help="plain: a torch loop (default); hf: transformers.Trainer",
    )
    p.add_argument("--output-dir", help="--trainer hf: the Trainer's output_dir (default: a temporary one)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--log", help="also append this script's own log lines to PATH")
    args = p.parse_args()

    log_file = None
    if args.log:
        os.makedirs(os.path.dirname(os.path.abspath(args.log)), exist_ok=True)
        log_file = open(args.log, "a", encoding="utf-8")  # noqa: SIM115 - kept open for the whole run, written line by line

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
    model = build_model(args.rank, args.seq, device)
    trainable, total = model.get_nb_trainable_parameters()
    log(
        "model ready on %s: %d trainable LoRA parameters of %d (%.2f%%)"
        % (device, trainable, total, 100.0 * trainable / total)
    )
    train = train_hf if args.trainer == "hf" else train_plain
    first, last = train(model, args, device, log)
    if first is not None:
        log("done: loss %.4f -> %.4f" % (first, last))
    if log_file:
        log_file.close()


if __name__ == "__main__":
    main()
