"""axolotl as its users run it, on the tiny Llama and local alpaca data of `lf_job.setup` (nothing is
downloaded). Run with the python of axolotl's own venv (`trainer_venv.py`).

    python axo_job.py setup DIR                        # model, tokenizer, data and DIR/axolotl.yml
    accelerate launch -m axo_job DIR/axolotl.yml       # `accelerate launch -m axolotl.cli.train`,
                                                       # with the hang AXO_HANG names (AXO_RELEASE:
                                                       # the file whose existence lets it go on)

The unchanged run is ``axolotl train DIR/axolotl.yml`` itself, which execs into ``accelerate
launch -m axolotl.cli.train``: the trainer is a quiet child of the launcher. The hangs
(``AXO_HANG``), each one axolotl's users report:

- ``collator``: its data collator (``axolotl.utils.collators.DataCollatorForSeq2Seq``) blocks at
  its third batch (``dataloader_num_workers: 0``: the trainer process itself);
- ``exit``: a telemetry flush at exit that never gets an answer (an atexit handler posting to an
  endpoint that accepts and never answers: axolotl's own telemetry without network hung so).
"""

from __future__ import annotations

import atexit
import os
import sys
import urllib.request

from lf_job import setup as lf_setup
from sft_job import black_hole, wait_for_release


def setup(out: str) -> None:
    lf_setup(out)
    model = os.path.join(out, "model")
    config = {
        "base_model": model,
        "tokenizer_config": model,
        "model_type": "LlamaForCausalLM",
        "tokenizer_type": "AutoTokenizer",
        "datasets": [{"path": os.path.join(out, "data", "tiny.json"), "ds_type": "json", "type": "alpaca"}],
        "dataset_prepared_path": os.path.join(out, "prepared"),
        "val_set_size": 0,
        "output_dir": os.path.join(out, "run"),
        "adapter": "lora",
        "lora_r": 4,
        "lora_alpha": 8,
        "lora_dropout": 0.0,
        "lora_target_modules": ["q_proj", "v_proj"],
        "sequence_len": 64,
        "micro_batch_size": 4,
        "gradient_accumulation_steps": 1,
        "max_steps": 8,
        "num_epochs": 1,
        "optimizer": "adamw_torch",
        "lr_scheduler": "constant",
        "learning_rate": 0.001,
        "logging_steps": 1,
        "save_strategy": "no",
        "bf16": False,
        "fp16": False,
        "tf32": False,
        "dataloader_num_workers": 0,
    }
    import json

    with open(os.path.join(out, "axolotl.yml"), "w") as f:
        f.write(json.dumps(config, indent=1))  # JSON is YAML


def flush_telemetry(endpoint: str) -> None:
    urllib.request.urlopen(endpoint + "/batch", data=b"{}", timeout=3600)


def inject(hang: str, release: str) -> None:
    if hang == "collator":
        from axolotl.utils.collators import batching

        cls = batching.DataCollatorForSeq2Seq
        inner = cls.__call__
        calls = [0]

        def blocking_collate(self, features, return_tensors=None):
            calls[0] += 1
            if calls[0] == 3:
                wait_for_release(release)
            return inner(self, features, return_tensors)

        cls.__call__ = blocking_collate
    elif hang == "exit":
        atexit.register(flush_telemetry, black_hole())


def main() -> None:
    if sys.argv[1:2] == ["setup"]:
        setup(sys.argv[2])
        return
    inject(os.environ.get("AXO_HANG", "none"), os.environ.get("AXO_RELEASE", ""))
    import fire
    from axolotl.cli.train import do_cli

    fire.Fire(do_cli)


if __name__ == "__main__":
    main()
