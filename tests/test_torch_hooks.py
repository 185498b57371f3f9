"""torch hooks on a real CPU torch: training from the optimizer step hook, and why CUDA is absent."""

from __future__ import annotations

from pathlib import Path

import pytest
from procs import REPO, only_journal, run_traced, span_named

pytestmark = pytest.mark.slow

torch = pytest.importorskip("torch")

ABSENT_REASON = (
    "CPU build of torch" if torch.version.cuda is None else "no NVIDIA driver (/proc/driver/nvidia/version missing)"
)
"""Why CUDA is absent here: a CPU build says so; PyPI's CUDA build on a machine without a GPU names
the missing driver (these tests run on machines without a GPU)."""


def test_example_training_run(tmp_path: Path) -> None:
    """The example LoRA run: `training` opens at the first optimizer step and counts every step."""
    log = tmp_path / "run.log"
    r = run_traced(
        [str(REPO / "examples" / "train_lora.py"), "--steps", "12", "--log", str(log)], cwd=tmp_path, timeout=300
    )
    assert r.returncode == 0, r.stderr
    j = only_journal(tmp_path)
    root = j.root
    train = span_named(j, "training")
    assert train.parent_id == root.span_id and train.status == "ok"
    assert train.attrs["lora_otel.training.steps"] == 12
    assert j.steps == 12
    imp = span_named(j, "import torch")
    assert imp.attrs["lora_otel.package.version"].startswith("2.")
    assert imp.end_ns - imp.start_ns > 100_000_000  # importing torch takes real time
    args = span_named(j, "arguments")
    assert args.end_ns <= train.start_ns
    probe = span_named(j, "cuda probe")
    assert probe.attrs["lora_otel.cuda.available"] is False
    assert probe.attrs["lora_otel.cuda.absent_reason"].startswith(ABSENT_REASON)
    assert "training started" in log.read_text(encoding="utf-8")


def test_cuda_init_on_cpu_torch_says_why(tmp_path: Path) -> None:
    """Asking for a CUDA tensor without CUDA: `cuda init` ends in error, saying why (CPU build, or no driver)."""
    (tmp_path / "job.py").write_text(
        "import torch\n"
        "try:\n    torch.zeros(1, device='cuda')\nexcept Exception as e:\n    print('RAISED', type(e).__name__)\n"
    )
    r = run_traced(["job.py"], cwd=tmp_path, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "RAISED" in r.stdout  # the program sees torch's own exception, unchanged
    j = only_journal(tmp_path / "lora-otel")
    span = span_named(j, "cuda init")
    assert span.status == "error"
    assert span.attrs["lora_otel.cuda.absent_reason"].startswith(ABSENT_REASON)
    assert span.attrs["lora_otel.cuda.available"] is False
    assert "cuda init failed" in r.stderr


def test_explicit_training_stage_and_progress(tmp_path: Path) -> None:
    """`lora_otel.stage("training")` opens training; progress() counts steps without a step hook."""
    (tmp_path / "job.py").write_text(
        "import lora_otel, time\n"
        "with lora_otel.stage('training', epochs=1):\n"
        "    for i in range(5):\n        lora_otel.progress(step=i + 1, loss=1.0 / (i + 1))\n"
        "    time.sleep(1.3)\n"
    )
    r = run_traced(["job.py"], cwd=tmp_path, timeout=60)
    assert r.returncode == 0, r.stderr
    j = only_journal(tmp_path / "lora-otel")
    [train] = [s for s in j.spans if s.name == "training"]
    assert train.attrs["epochs"] == 1 and train.status == "ok"
    assert j.steps == 5 and j.metrics["loss"] == pytest.approx(0.2)
    assert span_named(j, "arguments").attrs["lora_otel.arguments.parser"] == "none seen before training"


def test_sampled_step_spans(tmp_path: Path) -> None:
    """No span per step by default; LORA_OTEL_STEP_SPANS=5 gives `step 1`, `step 6`, ... under
    `training`, each ended; a bad value says so in one line and gives none."""
    (tmp_path / "job.py").write_text(
        "import torch\nm = torch.nn.Linear(2, 2)\nopt = torch.optim.SGD(m.parameters(), lr=0.1)\n"
        "for _ in range(12):\n    opt.zero_grad(); m(torch.ones(1, 2)).sum().backward(); opt.step()\n"
    )
    r = run_traced(["job.py"], cwd=tmp_path, LORA_OTEL_DIR="default")
    assert r.returncode == 0, r.stderr
    assert not [s for s in only_journal(tmp_path / "default").spans if s.name.startswith("step ")]
    r = run_traced(["job.py"], cwd=tmp_path, LORA_OTEL_DIR="sampled", LORA_OTEL_STEP_SPANS="5")
    assert r.returncode == 0, r.stderr
    j = only_journal(tmp_path / "sampled")
    train = span_named(j, "training")
    steps = [s for s in j.spans if s.name.startswith("step ")]
    assert [s.name for s in steps] == ["step 1", "step 6", "step 11"]
    assert all(s.parent_id == train.span_id and s.end_ns is not None for s in steps)
    r = run_traced(["job.py"], cwd=tmp_path, LORA_OTEL_DIR="bad", LORA_OTEL_STEP_SPANS="often")
    assert r.returncode == 0 and "LORA_OTEL_STEP_SPANS='often' is not a whole number" in r.stderr
    assert not [s for s in only_journal(tmp_path / "bad").spans if s.name.startswith("step ")]
