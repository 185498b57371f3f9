"""LLaMA-Factory's ``llamafactory-cli train`` as its users run it, on a tiny Llama with random
weights and a word-level tokenizer made here, and a local dataset named in ``dataset_info.json``
(nothing is downloaded). Run with the python of LLaMA-Factory's own venv (`trainer_venv.py`).

    python lf_job.py setup DIR              # the model, the tokenizer, the dataset and DIR/train.yaml
    python lf_job.py train DIR/train.yaml   # what `llamafactory-cli train DIR/train.yaml` does,
                                            # with the hang LF_HANG names (LF_RELEASE: the file
                                            # whose existence lets it go on)

The hangs (``LF_HANG``), each one LLaMA-Factory's users report:

- ``collator``: its data collator blocks at its third batch (``dataloader_num_workers: 0``, the
  main process);
- ``map``: its dataset preprocessing blocks on one example in a ``preprocessing_num_workers: 2``
  pool (datasets' ``map(num_proc=2)``);
- ``hub``: the model is a hub id and ``HF_ENDPOINT`` an endpoint that accepts and never answers.

The hang is put in by wrapping one of LLaMA-Factory's own functions before its CLI runs, so the
frames below it are LLaMA-Factory's, as in a user's job.
"""

from __future__ import annotations

import json
import os
import sys

from sft_job import black_hole, tokenizer_dir, wait_for_release


def setup(out: str) -> None:
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    os.makedirs(out, exist_ok=True)
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir(out))
    model_dir = os.path.join(out, "model")
    LlamaForCausalLM(
        LlamaConfig(
            vocab_size=len(tokenizer),
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=2,
            max_position_embeddings=64,
            pad_token_id=tokenizer.pad_token_id,
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
        )
    ).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    data_dir = os.path.join(out, "data")
    os.makedirs(data_dir, exist_ok=True)
    rows = [
        {
            "instruction": " ".join("w%d" % ((i * 7 + j) % 60) for j in range(6)),
            "input": "",
            "output": " ".join("w%d" % ((i * 3 + j) % 60) for j in range(6)),
        }
        for i in range(64)
    ]
    with open(os.path.join(data_dir, "tiny.json"), "w") as f:
        json.dump(rows, f)
    with open(os.path.join(data_dir, "dataset_info.json"), "w") as f:
        json.dump({"tiny": {"file_name": "tiny.json"}}, f)
    config = {
        "model_name_or_path": model_dir,
        "stage": "sft",
        "do_train": True,
        "finetuning_type": "lora",
        "lora_target": "q_proj,v_proj",
        "lora_rank": 4,
        "dataset": "tiny",
        "dataset_dir": data_dir,
        "template": "default",
        "cutoff_len": 32,
        "overwrite_cache": True,
        "preprocessing_num_workers": 1,
        "output_dir": os.path.join(out, "run"),
        "overwrite_output_dir": True,
        "per_device_train_batch_size": 4,
        "max_steps": 8,
        "logging_steps": 1,
        "learning_rate": 1.0e-3,
        "save_strategy": "no",
        "report_to": "none",
        "use_cpu": True,
        "dataloader_num_workers": 0,
        "disable_tqdm": True,
    }
    with open(os.path.join(out, "train.yaml"), "w") as f:
        f.write("".join("%s: %s\n" % (k, json.dumps(v)) for k, v in config.items()))


def inject(hang: str, release: str) -> None:
    """Wrap the LLaMA-Factory function the hang is in (see the module doc)."""
    if hang == "collator":
        from llamafactory.data import collator

        cls = collator.SFTDataCollatorWith4DAttentionMask
        inner = cls.__call__
        calls = [0]

        def blocking_call(self, features):
            calls[0] += 1
            if calls[0] == 3:
                wait_for_release(release)
            return inner(self, features)

        cls.__call__ = blocking_call
    elif hang == "map":
        from llamafactory.data.processor import supervised

        cls = supervised.SupervisedDatasetProcessor
        inner_pre = cls.preprocess_dataset

        def blocking_preprocess(self, examples):
            if any(text.startswith("w35 ") for text in (p[0]["content"] for p in examples["_prompt"])):
                wait_for_release(release)
            return inner_pre(self, examples)

        cls.preprocess_dataset = blocking_preprocess
    elif hang == "hub":
        os.environ["HF_ENDPOINT"] = black_hole()
        os.environ.pop("HF_HUB_OFFLINE", None)


def main() -> None:
    if len(sys.argv) != 3 or sys.argv[1] not in ("setup", "train"):
        raise SystemExit("usage: lf_job.py setup DIR | lf_job.py train DIR/train.yaml")
    if sys.argv[1] == "setup":
        setup(sys.argv[2])
        return
    hang = os.environ.get("LF_HANG", "none")
    inject(hang, os.environ.get("LF_RELEASE", ""))
    from llamafactory.cli import main as cli

    sys.argv = ["llamafactory-cli", "train", sys.argv[2]]
    cli()


if __name__ == "__main__":
    main()
