"""A TRL SFTTrainer + peft LoRA fine-tune as its users write one, on a tiny Llama with random
weights and a word-level tokenizer built here (nothing is downloaded), with one hang injected by
``--hang`` — each one a cause users report from these trainers:

- ``map``: ``datasets`` ``.map(num_proc=2)`` whose function blocks on one example (a worker pool);
- ``collator``: the data collator blocks in the main process (``dataloader_num_workers=0``);
- ``worker``: the collator blocks inside a DataLoader worker (``dataloader_num_workers=2``);
- ``hub``: a hub download from an endpoint that accepts and never answers (a black-holed
  ``HF_ENDPOINT``);
- ``exit``: training ends, then an exit handler never returns (a telemetry flush);
- ``rank``: under ``accelerate launch`` with 2 processes, rank 1's collate function blocks (main
  process), so rank 0 waits for it in DDP's gradient all-reduce.

The job prints ``TRAINED <steps>`` when training ends. ``--release FILE``: a blocked call returns
once FILE exists, so a test can let the job go on and finish.
"""

from __future__ import annotations

import argparse
import atexit
import os
import socket
import sys
import threading
import time


def wait_for_release(path: str) -> None:
    while not (path and os.path.exists(path)):
        time.sleep(0.1)


def tokenizer_dir(out: str) -> str:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["<pad>", "<unk>", "<s>", "</s>"] + ["w%d" % i for i in range(60)]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", unk_token="<unk>", bos_token="<s>", eos_token="</s>"
    )
    path = os.path.join(out, "tokenizer")
    fast.save_pretrained(path)
    return path


class BlockingCollator:
    """Pads as the default does; blocks at its third call until released."""

    def __init__(self, tokenizer, release: str) -> None:
        from transformers import DataCollatorForLanguageModeling

        self.inner = DataCollatorForLanguageModeling(tokenizer, mlm=False)
        self.release = release
        self.calls = 0

    def __call__(self, features):
        self.calls += 1
        if self.calls == 3:
            wait_for_release(self.release)
        return self.inner(features)


def black_hole() -> str:
    """A local endpoint that accepts connections and never answers."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    held = []
    threading.Thread(target=lambda: [held.append(server.accept()) for _ in range(8)], daemon=True).start()
    return "http://127.0.0.1:%d" % server.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--hang", choices=["none", "map", "collator", "worker", "hub", "exit", "rank"], default="none")
    parser.add_argument("--release", default="")
    parser.add_argument("--steps", type=int, default=8)
    args = parser.parse_args()
    if "RANK" in os.environ:  # each rank of `accelerate launch` makes its own files
        args.out = os.path.join(args.out, "rank" + os.environ["RANK"])

    if args.hang == "hub":
        os.environ["HF_ENDPOINT"] = black_hole()
        os.environ.pop("HF_HUB_OFFLINE", None)
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM
    from trl import SFTConfig, SFTTrainer

    torch.manual_seed(0)
    if args.hang == "hub":
        from huggingface_hub import hf_hub_download

        hf_hub_download("tiny/llama", "config.json", cache_dir=os.path.join(args.out, "hub"), etag_timeout=600)
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir(args.out))
    LlamaForCausalLM(  # random weights, saved where a user's checkpoint would be
        LlamaConfig(
            vocab_size=len(tokenizer),
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=2,
            max_position_embeddings=64,
            pad_token_id=tokenizer.pad_token_id,
        )
    ).save_pretrained(os.path.join(args.out, "model"))
    model = AutoModelForCausalLM.from_pretrained(os.path.join(args.out, "model"))
    texts = [" ".join("w%d" % ((i * 7 + j) % 60) for j in range(12)) for i in range(64)]
    data = Dataset.from_dict({"text": texts})

    def upper(example, idx):
        if args.hang == "map" and idx == 5:
            wait_for_release(args.release)
        return {"text": example["text"]}

    data = data.map(upper, with_indices=True, num_proc=2 if args.hang == "map" else None)
    config = SFTConfig(
        output_dir=os.path.join(args.out, "run"),
        max_steps=args.steps,
        per_device_train_batch_size=4,
        logging_steps=1,
        learning_rate=1e-3,
        report_to=[],
        save_strategy="no",
        use_cpu=True,
        max_length=16,
        dataloader_num_workers=2 if args.hang == "worker" else 0,
        disable_tqdm=True,
    )
    blocks = args.hang in ("collator", "worker") or (args.hang == "rank" and os.environ.get("RANK") == "1")
    collator = BlockingCollator(tokenizer, args.release) if blocks else None
    trainer = SFTTrainer(
        model=model,
        args=config,
        train_dataset=data,
        processing_class=tokenizer,
        data_collator=collator,
        peft_config=LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"),
    )
    trainer.train()
    print("TRAINED", trainer.state.global_step, flush=True)
    if trainer.accelerator.num_processes > 1:
        # torch's gloo process group under DDP cannot be trusted to tear down at exit, with or
        # without lora_otel: left to C++'s static teardown a rank sometimes aborts ("terminate
        # called without an active exception", SIGABRT; 1 launch in 36 here); destroyed first
        # (`end_training`, even after a barrier) the DDP reducer's destructor, at finalization and
        # holding the GIL, sometimes joins gloo's run loop thread while that thread waits for the
        # GIL to drop a gather's tensor: a deadlock (1 launch in 3 untraced, side by side). So a
        # rank ends as some launchers' jobs do: the exit handlers (lora_otel's among them), then
        # ``os._exit``, before the interpreter's finalization.
        sys.stdout.flush()
        sys.stderr.flush()
        atexit._run_exitfuncs()
        os._exit(0)
    if args.hang == "exit":
        atexit.register(wait_for_release, args.release)
    sys.exit(0)


if __name__ == "__main__":
    main()
