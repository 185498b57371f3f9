"""Framework integrations on real runs: transformers Trainer, Lightning, accelerate, the example.

Each test runs a small real job in a subprocess with ``LORA_OTEL=1`` and reads its journal.
"""

from __future__ import annotations

import subprocess
import textwrap
from pathlib import Path

import pytest
from procs import PYTHON, REPO, clean_env, only_journal, run_traced, span_named

pytestmark = pytest.mark.slow

pytest.importorskip("torch")

QUIET = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1",
    "WANDB_DISABLED": "true",
    "TOKENIZERS_PARALLELISM": "false",
    "PYTHONWARNINGS": "ignore",
}

HF_JOB = """
import sys, torch
{imports}

class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 1)

    def forward(self, x, labels=None):
        out = self.lin(x).squeeze(-1)
        return {{"loss": torch.nn.functional.mse_loss(out, labels), "logits": out}}

data = [{{"x": torch.randn(4), "labels": torch.tensor(float(i % 3))}} for i in range(16)]
args = TrainingArguments(output_dir=sys.argv[1], num_train_epochs=2, per_device_train_batch_size=4,
                         logging_steps=1, eval_strategy="epoch", save_strategy="epoch", report_to=[],
                         disable_tqdm=True, use_cpu=True, dataloader_pin_memory=False)
{make_trainer}
{after}
trainer.train()
print("CALLBACKS=%d" % sum(type(cb).__name__ == "LoraOtelCallback" for cb in trainer.callback_handler.callbacks))
"""


def _job(
    tmp_path: Path, code: str, *args: str, traced: bool = True, timeout: float = 180
) -> subprocess.CompletedProcess:
    (tmp_path / "job.py").write_text(textwrap.dedent(code))
    if traced:
        r = run_traced(["job.py", *args], cwd=tmp_path, timeout=timeout, **QUIET)
    else:
        r = subprocess.run(
            [PYTHON, "job.py", *args],
            cwd=tmp_path,
            env=clean_env(**QUIET),
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    assert r.returncode == 0, r.stderr[-4000:]
    assert "internal error" not in r.stderr, r.stderr[-4000:]
    return r


def _spans(j, name: str) -> list:
    return [s for s in j.spans if s.name == name]


def _metrics_events(j) -> list:
    return sorted((ev for s in j.spans for ev in s.events if ev[1] == "metrics"), key=lambda ev: ev[0])


def _assert_rate_limited(events: list) -> None:
    """At most one ``metrics`` event a second, but for the final flush when the run ends."""
    assert events, "no metrics event"
    gaps = [(b[0] - a[0]) / 1e9 for a, b in zip(events, events[1:])]
    assert all(gap >= 0.99 for gap in gaps[:-1]), gaps


class TestTransformers:
    def test_trainer_run_loaded_lazily(self, tmp_path: Path) -> None:
        """`transformers.Trainer` (loaded lazily, no import statement) is instrumented before its first use:
        `training` with the trainer's facts, `epoch 0`/`epoch 1`, an `evaluate` and a `save checkpoint`
        span per epoch, rate-limited `metrics` events, progress for the beat, `accelerate` spans."""
        code = HF_JOB.format(
            imports="import transformers\nTrainer = transformers.Trainer  # lazy: importlib, not __import__\n"
            "print('WRAPPED=%s' % getattr(Trainer.__init__, '_lora_otel', False))\n"
            "TrainingArguments = transformers.TrainingArguments",
            make_trainer="trainer = Trainer(model=Tiny(), args=args, train_dataset=data, eval_dataset=data[:8])",
            after="",
        )
        r = _job(tmp_path, code, str(tmp_path / "out"))
        assert "WRAPPED=True" in r.stdout and "CALLBACKS=1" in r.stdout
        assert "training started (transformers Trainer)" in r.stderr
        j = only_journal(tmp_path / "lora-otel")
        assert "transformers.trainer" in j.root.attrs["lora_otel.integrations"]
        [train] = _spans(j, "training")
        assert train.status == "ok" and train.parent_id == j.root.span_id
        a = train.attrs
        assert a["lora_otel.training.started_by"] == "transformers Trainer"
        assert a["lora_otel.trainer.framework"] == "transformers"
        assert a["lora_otel.trainer.max_steps"] == 8 and a["lora_otel.trainer.global_step"] == 8
        assert a["lora_otel.trainer.world_size"] == 1 and a["lora_otel.trainer.rank"] == 0
        assert a["lora_otel.model.class"] == "Tiny" and a["lora_otel.model.trainable_parameters"] == 5
        assert a["lora_otel.training.steps"] == 8 and j.steps == 8
        epochs = [span_named(j, "epoch %d" % i) for i in (0, 1)]
        assert len(_spans(j, "epoch 0")) == 1 and not _spans(j, "epoch 2")
        for i, epoch in enumerate(epochs):
            assert epoch.parent_id == train.span_id and epoch.status == "ok"
            assert epoch.attrs["lora_otel.epoch"] == i and epoch.attrs["lora_otel.epoch.steps"] == 4
        evals = _spans(j, "evaluate")
        assert len(evals) == 2 and all(s.parent_id == train.span_id for s in evals)
        assert all(isinstance(s.attrs["lora_otel.metric.eval_loss"], float) for s in evals)
        saves = _spans(j, "save checkpoint")
        assert [s.attrs["lora_otel.training.step"] for s in saves] == [4, 8]
        for s in saves:
            assert s.parent_id == train.span_id and s.status == "ok"
            assert Path(s.attrs["lora_otel.checkpoint.path"]).is_dir()
        assert not [ev for s in j.spans for ev in s.events if ev[1] in ("evaluate", "save checkpoint")]
        events = _metrics_events(j)
        _assert_rate_limited(events)
        assert any("lora_otel.metric.loss" in ev[2] for ev in events)
        assert any("lora_otel.metric.train_loss" in ev[2] for ev in events)  # flushed at the end
        assert "loss" in j.metrics  # progress() reached the beat
        init = span_named(j, "accelerate init")
        assert init.attrs["lora_otel.accelerate.num_processes"] == 1
        assert init.attrs["lora_otel.accelerate.distributed_type"] == "NO"
        assert span_named(j, "accelerate prepare").attrs["lora_otel.accelerate.process_index"] == 0

    def test_explicit_and_automatic_record_once(self, tmp_path: Path) -> None:
        """An explicit callback stops the automatic one being added; a second one added by hand
        records nothing: one `training`, one span per epoch."""
        code = HF_JOB.format(
            imports="from transformers import Trainer, TrainingArguments\n"
            "from lora_otel.integrations.transformers import LoraOtelCallback",
            make_trainer="trainer = Trainer(model=Tiny(), args=args, train_dataset=data, eval_dataset=data[:8],\n"
            "                  callbacks=[LoraOtelCallback()])",
            after="print('BEFORE=%d' % sum(type(cb).__name__ == 'LoraOtelCallback' "
            "for cb in trainer.callback_handler.callbacks))\n"
            "trainer.add_callback(LoraOtelCallback())",
        )
        r = _job(tmp_path, code, str(tmp_path / "out"))
        assert "BEFORE=1" in r.stdout and "CALLBACKS=2" in r.stdout
        j = only_journal(tmp_path / "lora-otel")
        assert len(_spans(j, "training")) == 1
        assert len(_spans(j, "epoch 0")) == 1 and len(_spans(j, "epoch 1")) == 1
        _assert_rate_limited(_metrics_events(j))

    def test_imported_before_lora_otel_started(self, tmp_path: Path) -> None:
        """`transformers.trainer` loaded before `import lora_otel.auto`: installed when the preamble runs."""
        code = """
        import transformers.trainer
        import lora_otel.auto
        print("WRAPPED=%s" % getattr(transformers.trainer.Trainer.__init__, "_lora_otel", False))
        """
        r = _job(tmp_path, code, traced=False)
        assert "WRAPPED=True" in r.stdout
        j = only_journal(tmp_path / "lora-otel")
        assert "transformers.trainer" in j.root.attrs["lora_otel.integrations"]

    def test_failed_training_ends_in_error(self, tmp_path: Path) -> None:
        """A training step that raises: `epoch 0` and `training` end in error with the exception's text."""
        code = HF_JOB.format(
            imports="from transformers import Trainer, TrainingArguments",
            make_trainer="class Boom(Trainer):\n"
            "    def training_step(self, *a, **k):\n"
            "        if self.state.global_step == 2:\n"
            "            raise RuntimeError('boom at step 2')\n"
            "        return super().training_step(*a, **k)\n"
            "trainer = Boom(model=Tiny(), args=args, train_dataset=data, eval_dataset=data[:8])",
            after="",
        )
        code = code.replace(
            "trainer.train()", "try:\n    trainer.train()\nexcept RuntimeError as e:\n    print('RAISED', e)"
        )
        r = _job(tmp_path, code, str(tmp_path / "out"))
        assert "RAISED boom at step 2" in r.stdout
        j = only_journal(tmp_path / "lora-otel")
        for name in ("training", "epoch 0"):
            span = span_named(j, name)
            assert span.status == "error" and span.message == "RuntimeError: boom at step 2", name

    def test_inactive_is_harmless(self, tmp_path: Path) -> None:
        """Without LORA_OTEL the integrations import, the explicit callback trains silently, nothing is
        wrapped and no journal is written."""
        code = HF_JOB.format(
            imports="from transformers import Trainer, TrainingArguments\n"
            "from lora_otel.integrations.transformers import LoraOtelCallback\n"
            "import lora_otel.integrations.accelerate, lora_otel.integrations.lightning as L\n"
            "assert L.LoraOtelCallback.__name__ == 'LoraOtelCallback'",
            make_trainer="trainer = Trainer(model=Tiny(), args=args, train_dataset=data, eval_dataset=data[:8],\n"
            "                  callbacks=[LoraOtelCallback()])",
            after="print('WRAPPED=%s' % getattr(Trainer.__init__, '_lora_otel', False))",
        )
        r = _job(tmp_path, code, str(tmp_path / "out"), traced=False)
        assert "WRAPPED=False" in r.stdout and "CALLBACKS=1" in r.stdout
        assert "[lora-otel]" not in r.stdout + r.stderr
        assert not list(tmp_path.rglob("*.otel.jsonl"))


LIGHTNING_JOB = """
import torch
from torch.utils.data import DataLoader, TensorDataset
import {package} as pl

class Tiny(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 1)

    def training_step(self, batch, i):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.lin(x).squeeze(-1), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, i):
        x, y = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self.lin(x).squeeze(-1), y))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

data = TensorDataset(torch.randn(16, 4), torch.randn(16))
trainer = pl.Trainer(max_epochs=2, accelerator="cpu", logger=False, enable_checkpointing=True,
                     default_root_dir={root!r}, enable_progress_bar=False, enable_model_summary=False)
trainer.fit(Tiny(), DataLoader(data, batch_size=4), DataLoader(data, batch_size=8))
print("CALLBACKS=%d" % sum(type(cb).__name__ == "LoraOtelCallback" for cb in trainer.callbacks))
"""


@pytest.mark.parametrize("package", ["lightning.pytorch", "pytorch_lightning"])
def test_lightning_run(tmp_path: Path, package: str) -> None:
    """A Lightning fit: `training` with the trainer's facts, `epoch 0`/`epoch 1`, a sanity-check and two
    real `validation` spans (these with val_loss), a `save checkpoint` span per epoch, rate-limited metrics."""
    pytest.importorskip(package)
    r = _job(tmp_path, LIGHTNING_JOB.format(package=package, root=str(tmp_path / "root")))
    assert "CALLBACKS=1" in r.stdout
    j = only_journal(tmp_path / "lora-otel")
    assert package in j.root.attrs["lora_otel.integrations"]
    [train] = _spans(j, "training")
    a = train.attrs
    assert train.status == "ok" and a["lora_otel.trainer.framework"] == "lightning"
    assert a["lora_otel.training.started_by"] == "lightning Trainer"
    assert a["lora_otel.trainer.epochs"] == 2 and a["lora_otel.trainer.world_size"] == 1
    assert a["lora_otel.trainer.global_step"] == 8 and a["lora_otel.training.steps"] == 8
    assert a["lora_otel.model.class"] == "Tiny" and a["lora_otel.model.parameters"] == 5
    for i in (0, 1):
        [epoch] = _spans(j, "epoch %d" % i)
        assert epoch.parent_id == train.span_id and epoch.attrs["lora_otel.epoch.steps"] == 4
    validations = _spans(j, "validation")
    assert [v.attrs["lora_otel.validation.sanity_check"] for v in validations] == [True, False, False]
    assert all(isinstance(v.attrs["lora_otel.metric.val_loss"], float) for v in validations[1:])
    assert all(v.status == "ok" for v in validations)
    saves = _spans(j, "save checkpoint")
    assert [s.attrs["lora_otel.training.step"] for s in saves] == [4, 8]
    assert all(s.attrs["lora_otel.checkpoint.path"].endswith(".ckpt") for s in saves)
    assert Path(saves[-1].attrs["lora_otel.checkpoint.path"]).is_file()
    _assert_rate_limited(_metrics_events(j))
    assert "train_loss" in j.metrics


def test_accelerate_prepare(tmp_path: Path) -> None:
    """`Accelerator()` and `prepare(model, optimizer)`: spans with the process facts and what was prepared."""
    code = """
    import torch
    from accelerate import Accelerator
    model = torch.nn.Linear(4, 1)
    acc = Accelerator(cpu=True)
    model, opt = acc.prepare(model, torch.optim.AdamW(model.parameters()))
    """
    r = _job(tmp_path, code)
    assert "accelerate init: done, 1 process(es)" in r.stderr
    j = only_journal(tmp_path / "lora-otel")
    init = span_named(j, "accelerate init")
    prep = span_named(j, "accelerate prepare")
    assert init.status == "ok" and prep.status == "ok" and init.end_ns <= prep.start_ns
    for span in (init, prep):
        assert span.attrs["lora_otel.accelerate.num_processes"] == 1
        assert span.attrs["lora_otel.accelerate.process_index"] == 0
        assert span.attrs["lora_otel.accelerate.distributed_type"] == "NO"
        assert span.attrs["lora_otel.accelerate.mixed_precision"] == "no"
        assert span.attrs["lora_otel.accelerate.device"] == "cpu"
    assert prep.attrs["lora_otel.accelerate.objects"] == ["Linear", "AdamW"]


class TestExample:
    def test_plain_loop(self, tmp_path: Path) -> None:
        """`examples/train_lora.py --steps 5`: a peft LoRA model, `training` counts 5 steps, exit 0."""
        r = run_traced([str(REPO / "examples" / "train_lora.py"), "--steps", "5"], cwd=tmp_path, timeout=180, **QUIET)
        assert r.returncode == 0, r.stderr[-4000:]
        assert "trainable LoRA parameters" in r.stdout
        j = only_journal(tmp_path / "lora-otel")
        train = span_named(j, "training")
        assert train.status == "ok" and train.attrs["lora_otel.training.steps"] == 5
        assert span_named(j, "import peft").status == "ok"

    def test_hf_trainer(self, tmp_path: Path) -> None:
        """`--trainer hf`: the Trainer run is recorded with the peft model's LoRA settings."""
        r = run_traced(
            [str(REPO / "examples" / "train_lora.py"), "--steps", "5", "--trainer", "hf"],
            cwd=tmp_path,
            timeout=180,
            **QUIET,
        )
        assert r.returncode == 0, r.stderr[-4000:]
        j = only_journal(tmp_path / "lora-otel")
        a = span_named(j, "training").attrs
        assert a["lora_otel.training.started_by"] == "transformers Trainer" and a["lora_otel.training.steps"] == 5
        assert a["lora_otel.peft.type"] == "LORA" and a["lora_otel.peft.r"] == 8
        assert 0 < a["lora_otel.model.trainable_parameters"] < a["lora_otel.model.parameters"]
        assert "q_proj" in a["lora_otel.peft.target_modules"]
