"""``lora-otel baseline save|diff``, and the drift that bears on the stuck stage in ``inspect`` and in the
live stall diagnosis (``LORA_OTEL_BASELINE``)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Optional

import pytest
from conftest import JournalBuilder
from procs import journals, run_traced

from lora_otel.analysis import baseline as bl
from lora_otel.analysis.stall import parse_limits
from lora_otel.cli import main
from lora_otel.export.live import Follower

FACTS: dict[str, Any] = {
    "process.runtime.name": "cpython",
    "process.runtime.version": "3.11.7",
    "os.type": "linux",
    "os.version": "6.5.0-35-generic",
    "host.arch": "amd64",
    "lora_otel.python.executable": "/srv/venv/bin/python",
    "lora_otel.pkg.torch": "2.3.1",
    "lora_otel.pkg.transformers": "4.44.2",
    "lora_otel.pkg.bitsandbytes": "0.45.0",
    "lora_otel.pkg.numpy": "1.26.4",
    "lora_otel.torch.cuda_build": "12.1",
    "lora_otel.cudnn.version": "8.9.2.26",
    "lora_otel.nvidia.driver_version": "535.104.05",
    "lora_otel.nvidia.gpu_count": 8,
    "lora_otel.env.CUDA_VISIBLE_DEVICES": "0,1",
    "lora_otel.env.HF_HUB_OFFLINE": "1",
    "lora_otel.env.HF_TOKEN": "[REDACTED]",
    "lora_otel.env.MASTER_PORT": "29500",
}
"""The self-check of a traced process (``envfacts.collect``'s attributes on ``process``)."""


def with_facts(journal: JournalBuilder, t: float = 0.0005, **changes: Any) -> str:
    """The ``process`` span and its self-check (an ``attrs`` record, as a real process writes it);
    ``changes``: attribute -> value (None leaves it out), ``.`` spelled ``__``."""
    root = journal.process()
    facts = dict(FACTS)
    for key, value in changes.items():
        key = key.replace("__", ".")
        if value is None:
            facts.pop(key, None)
        else:
            facts[key] = value
    journal.record("attrs", t, span_id=root, attrs=facts)
    return root


def good_run(path: Path, torch_s: float = 2.1, bnb_s: float = 1.2, **changes: Any) -> JournalBuilder:
    """A run that trains and finishes normally: arguments, import torch, import bitsandbytes, cuda init,
    load model, then training at 0.01 + torch_s + bnb_s + 5.3 s."""
    journal = JournalBuilder(path)
    root = with_facts(journal, **changes)
    journal.span("arguments", 0.0, 0.005)
    journal.span("import torch", 0.01, torch_s)
    t = 0.01 + torch_s
    journal.span("import bitsandbytes", t, bnb_s)
    t += bnb_s
    journal.span("cuda init", t, 0.8, attrs={"lora_otel.cuda.device_names": ["NVIDIA H100 80GB HBM3"] * 2})
    journal.span("load model", t + 0.8, 4.5)
    t += 5.3
    journal.span("training", t, 60.0)
    journal.span("import tabulate", t + 61, 3.0)  # after training started: not a start-up phase
    journal.end(root, t + 65)
    journal.exit(t + 65)
    return journal


def cli(capsys, *args: str) -> tuple[int, list[str], str]:
    status = main(list(args))
    out, err = capsys.readouterr()
    return status, out.splitlines(), err


def edit(path: Path, change) -> None:
    doc = json.loads(path.read_text())
    change(doc)
    path.write_text(json.dumps(doc, indent=2))


@pytest.fixture
def no_baseline(monkeypatch):
    monkeypatch.delenv("LORA_OTEL_BASELINE", raising=False)


def saved_from_good_runs(tmp_path: Path, capsys) -> Path:
    """A baseline of three good runs (import torch 2.0, 2.1, 2.4 s), environment from the first."""
    paths = []
    for i, torch_s in enumerate((2.0, 2.1, 2.4)):
        paths.append(str(good_run(tmp_path / ("good%d.otel.jsonl" % i), torch_s=torch_s).path))
    base = tmp_path / "good.json"
    status, out, err = cli(capsys, "baseline", "save", str(base), "--from-journal", paths[0], *paths)
    assert status == 0 and err == "", err
    assert out == [
        "saved baseline %s: Python 3.11.7, torch 2.3.1 (CUDA 12.1), driver 535.104.05, 8 GPUs, "
        "4 packages, 4 variables; 6 start-up phases (medians of 3 journals)" % base
    ]
    return base


# --- save and diff ------------------------------------------------------------------------------


def test_round_trip_on_this_interpreter(tmp_path: Path, capsys) -> None:
    """Saved from this interpreter and compared with it: no drift, exit 0 (text and JSON)."""
    base = tmp_path / "here.json"
    status, out, err = cli(capsys, "baseline", "save", str(base))
    assert status == 0 and err == "" and out[0].startswith("saved baseline %s: Python " % base)
    doc = json.loads(base.read_text())
    assert doc["format"] == "lora-otel baseline" and doc["version"] == 1 and doc["phases"] == {}
    assert doc["source"]["environment"] == "interpreter" and doc["created_at"].endswith("Z")
    import sys

    assert doc["environment"]["python_executable"] == sys.executable
    assert doc["environment"]["packages"].get("torch")  # the test environment has torch
    status, out, err = cli(capsys, "baseline", "diff", str(base))
    assert status == 0 and err == ""
    assert out == [
        "baseline %s (saved %s, environment of %s) vs this interpreter (%s): no drift"
        % (base, doc["created_at"], sys.executable, sys.executable)
    ]
    status, out, _ = cli(capsys, "baseline", "diff", "--json", str(base))
    found = json.loads("\n".join(out))
    assert status == 0 and found["drift"] == [] and found["against"]["kind"] == "interpreter"


@pytest.mark.slow
def test_real_traced_run_agrees_with_this_interpreter(tmp_path: Path, capsys) -> None:
    """The self-check a real traced job records is the environment `baseline save` sees here; and
    a run compared with a baseline of itself has no drift. (A stage makes the run a job.)"""
    r = run_traced(["-c", "import json\nimport lora_otel\nwith lora_otel.stage('x'):\n    pass"], tmp_path)
    assert r.returncode == 0, r.stderr
    [journal] = journals(tmp_path / "lora-otel")
    base = tmp_path / "run.json"
    assert cli(capsys, "baseline", "save", str(base), "--from-journal", str(journal), str(journal))[0] == 0
    doc = json.loads(base.read_text())
    assert "import json" in doc["phases"] and doc["source"]["environment"] == "journal"
    status, out, _ = cli(capsys, "baseline", "diff", str(base))
    assert status == 0, out
    status, out, _ = cli(capsys, "baseline", "diff", str(base), str(journal))
    assert (status, out[0].endswith(": no drift")) == (0, True), out


def test_phases_are_medians_of_the_start_up(tmp_path: Path, capsys) -> None:
    doc = json.loads(saved_from_good_runs(tmp_path, capsys).read_text())
    phases = {name: entry["median_s"] for name, entry in doc["phases"].items()}
    assert phases == {
        "arguments": 0.005,
        "import torch": 2.1,
        "import bitsandbytes": 1.2,
        "cuda init": 0.8,
        "load model": 4.5,
        "start-up": pytest.approx(8.61, abs=0.002),
    }
    assert all(entry["runs"] == 3 for entry in doc["phases"].values())
    env = doc["environment"]
    assert env["gpu_models"] == ["NVIDIA H100 80GB HBM3"] and env["env"]["HF_TOKEN"] == "[REDACTED]"


def test_diff_catches_version_variable_and_slow_phase(tmp_path: Path, capsys) -> None:
    """An older bitsandbytes and another HF_HUB_OFFLINE in the baseline, torch now slow to import."""
    base = saved_from_good_runs(tmp_path, capsys)

    def older(doc):
        doc["environment"]["packages"]["bitsandbytes"] = "0.43.1"
        doc["environment"]["env"]["HF_HUB_OFFLINE"] = "0"
        doc["environment"]["env"]["MASTER_PORT"] = "12345"  # names the run, not the environment

    edit(base, older)
    slow = good_run(tmp_path / "slow.otel.jsonl", torch_s=48.0)
    status, out, err = cli(capsys, "baseline", "diff", str(base), str(slow.path))
    assert status == 1 and err == ""
    assert out[0].endswith("vs %s: 4 differences" % slow.path)
    assert out[1:] == [
        "  bitsandbytes 0.43.1 → 0.45.0",
        "  HF_HUB_OFFLINE: 0 → 1",
        "  import torch took 48 s; baseline 2.1 s",
        "  start-up took 54.5 s; baseline 8.61 s",
    ]
    status, out, _ = cli(capsys, "baseline", "diff", "--json", str(base), str(slow.path))
    doc = json.loads("\n".join(out))
    assert status == 1 and doc["against"] == {"kind": "journal", "path": str(slow.path)}
    assert [(d["kind"], d["name"], d["change"]) for d in doc["drift"]] == [
        ("package", "bitsandbytes", "changed"),
        ("env", "HF_HUB_OFFLINE", "changed"),
        ("phase", "import torch", "slower"),
        ("phase", "start-up", "slower"),
    ]
    assert doc["drift"][2] == {
        "kind": "phase",
        "name": "import torch",
        "change": "slower",
        "baseline": 2.1,
        "current": 48.0,
        "text": "import torch took 48 s; baseline 2.1 s",
        "open": False,
    }
    # the rule is configurable: 48 s is not 30x 2.1 s
    status, out, _ = cli(capsys, "baseline", "diff", "--slower-factor", "30", str(base), str(slow.path))
    assert status == 1 and not any("import torch" in line for line in out)


def test_small_slowdowns_are_not_drift(tmp_path: Path, capsys) -> None:
    """Twice as slow but under 1 s longer, or 1.5 s longer but under twice: no drift."""
    base = saved_from_good_runs(tmp_path, capsys)
    for torch_s, bnb_s in ((2.9, 1.2), (2.1, 2.3)):
        run = good_run(tmp_path / "run.otel.jsonl", torch_s=torch_s, bnb_s=bnb_s)
        status, out, _ = cli(capsys, "baseline", "diff", str(base), str(run.path))
        assert (status, out[1:]) == (0, []), out
    base_bnb = good_run(tmp_path / "fast.otel.jsonl", bnb_s=0.3)
    status, out, _ = cli(capsys, "baseline", "diff", "--slower-by", "0.5", str(base), str(base_bnb.path))
    assert status == 0


def test_diff_of_two_baselines_and_environment_facts(tmp_path: Path, capsys) -> None:
    """Baseline against baseline: driver, CUDA build, cuDNN, GPUs, packages added and removed."""
    old = saved_from_good_runs(tmp_path, capsys)
    new = tmp_path / "new.json"
    run = good_run(
        tmp_path / "new.otel.jsonl",
        lora_otel__nvidia__driver_version="550.54.15",
        lora_otel__torch__cuda_build="12.4",
        lora_otel__cudnn__version="9.1.0.70",
        lora_otel__nvidia__gpu_count=4,
        lora_otel__pkg__numpy=None,
        lora_otel__pkg__xformers="0.0.27",
        lora_otel__env__NCCL_P2P_DISABLE="1",
        lora_otel__env__CUDA_VISIBLE_DEVICES=None,
    )
    assert cli(capsys, "baseline", "save", str(new), "--from-journal", str(run.path))[0] == 0
    status, out, _ = cli(capsys, "baseline", "diff", str(old), str(new))
    assert status == 1
    assert out[1:] == [
        "  xformers 0.0.27 (not installed in the baseline)",
        "  numpy not installed (baseline: 1.26.4)",
        "  torch CUDA build 12.1 → 12.4",
        "  cuDNN 8.9.2.26 → 9.1.0.70",
        "  NVIDIA driver 535.104.05 → 550.54.15",
        "  GPUs 8 → 4",
        "  CUDA_VISIBLE_DEVICES not set (baseline: 0,1)",
        "  NCCL_P2P_DISABLE=1 (not set in the baseline)",
    ]


def test_usage_errors_are_one_line(tmp_path: Path, capsys) -> None:
    base = saved_from_good_runs(tmp_path, capsys)
    garbage = tmp_path / "garbage.json"
    garbage.write_text("not json\n")
    other = tmp_path / "other.json"
    other.write_text('{"format": "something else"}\n')
    newer = tmp_path / "newer.json"
    newer.write_text('{"format": "lora-otel baseline", "version": 9}\n')
    empty = tmp_path / "empty.otel.jsonl"
    empty.write_text("")
    cases = [
        (["save", str(tmp_path / "b.json"), str(tmp_path / "missing.otel.jsonl")], "missing.otel.jsonl: no such file"),
        (["save", str(tmp_path / "b.json"), str(empty)], "empty.otel.jsonl: not a journal (no 'process' span)"),
        (["save", str(tmp_path / "no" / "dir.json")], "cannot write %s: No such file" % (tmp_path / "no" / "dir.json")),
        (["save", str(tmp_path)], "cannot write %s: is a directory" % tmp_path),
        (["diff", str(tmp_path / "missing.json")], "missing.json: no such file"),
        (["diff", str(garbage)], "garbage.json: not a baseline file (not JSON"),
        (["diff", str(other)], 'other.json: not a baseline file (no "format": "lora-otel baseline")'),
        (["diff", str(newer)], "newer.json: baseline version 9 is newer than this lora-otel reads (1)"),
        (["diff", str(base), str(tmp_path / "missing.otel.jsonl")], "missing.otel.jsonl: no such file"),
        (["diff", "--slower-factor", "0", str(base)], "--slower-factor must be a number more than 0"),
    ]
    for args, message in cases:
        status, out, err = cli(capsys, "baseline", *args)
        assert status == 2 and out == [], (args, out)
        assert err.count("\n") == 1 and err.startswith("lora-otel baseline: ") and message in err, (args, err)
    assert not (tmp_path / "b.json").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


def test_gpu_models_from_the_driver(tmp_path: Path) -> None:
    for i, model in enumerate(["NVIDIA H200", "NVIDIA H200", "NVIDIA A100-SXM4-80GB"]):
        d = tmp_path / ("0000:%02x:00.0" % i)
        d.mkdir()
        (d / "information").write_text("Model: \t\t %s\nIRQ:   \t\t 42\nGPU UUID: \t GPU-x\n" % model)
    assert bl.driver_gpu_models(str(tmp_path)) == ["NVIDIA A100-SXM4-80GB", "NVIDIA H200"]
    assert bl.driver_gpu_models(str(tmp_path / "none")) is None


# --- inspect ------------------------------------------------------------------------------------


def stuck_in_bitsandbytes(journal: JournalBuilder) -> None:
    """Killed 312 s into ``import bitsandbytes`` (0.45.0 now), torch imported in 2.3 s."""
    with_facts(journal, lora_otel__pkg__numpy="2.0.0", lora_otel__env__HF_HUB_OFFLINE="0")
    journal.span("arguments", 0.001, 0.0002)
    journal.span("import torch", 0.01, 2.3)
    journal.start("import bitsandbytes", 2.4)
    journal.beat(3.0)
    journal.beat(314.4)


def test_inspect_shows_the_drift_that_bears_on_the_stuck_import_first(
    tmp_path: Path, capsys, monkeypatch, journal
) -> None:
    base = saved_from_good_runs(tmp_path, capsys)
    edit(base, lambda doc: doc["environment"]["packages"].update(bitsandbytes="0.43.1", torch="2.2.2"))
    stuck_in_bitsandbytes(journal)
    monkeypatch.delenv("LORA_OTEL_BASELINE", raising=False)
    plain = cli(capsys, "inspect", str(journal.path))[1]
    monkeypatch.setenv("LORA_OTEL_BASELINE", str(base))
    status, out, err = cli(capsys, "inspect", str(journal.path))
    assert status == 0 and err == ""
    assert out[0] == "stuck in import bitsandbytes for 312 s (process gone)"
    assert out[1:5] == [
        "drift from baseline %s bearing on import bitsandbytes:" % base,
        "  bitsandbytes 0.43.1 → 0.45.0",
        "  import bitsandbytes has taken 312 s and not finished; baseline 1.2 s",
        "  torch 2.2.2 → 2.3.1",
    ]
    assert out[5] == (
        "other drift: numpy 1.26.4 → 2.0.0; HF_HUB_OFFLINE: 1 → 0; "
        "start-up has taken 314 s without reaching training; baseline 8.61 s"
    )
    assert out[6:] == plain[1:]  # then the report as without a baseline
    status, out, _ = cli(capsys, "inspect", "--json", str(journal.path))
    doc = json.loads("\n".join(out))["baseline"]
    assert doc["path"] == str(base) and doc["error"] is None and doc["stage"] == "import bitsandbytes"
    assert [d["name"] for d in doc["relevant"]] == ["bitsandbytes", "import bitsandbytes", "torch"]
    assert doc["relevant"][1]["open"] is True
    assert [d["name"] for d in doc["other"]] == ["numpy", "HF_HUB_OFFLINE", "start-up"]


def test_inspect_stuck_in_cuda_init_puts_the_driver_first(tmp_path: Path, capsys, monkeypatch, journal) -> None:
    base = saved_from_good_runs(tmp_path, capsys)
    edit(base, lambda doc: doc["environment"]["packages"].update(bitsandbytes="0.43.1"))
    with_facts(journal, lora_otel__nvidia__driver_version="550.54.15", lora_otel__env__CUDA_VISIBLE_DEVICES="3")
    journal.span("import torch", 0.01, 2.0)
    journal.start("cuda init", 2.1)
    journal.beat(3.0)
    journal.beat(5.0)
    monkeypatch.setenv("LORA_OTEL_BASELINE", str(base))
    out = cli(capsys, "inspect", str(journal.path))[1]
    assert out[0] == "stuck in cuda init for 2.9 s (process gone)"
    assert out[1:6] == [
        "drift from baseline %s bearing on cuda init:" % base,
        "  cuda init has taken 2.9 s and not finished; baseline 800 ms",
        "  NVIDIA driver 535.104.05 → 550.54.15",
        "  CUDA_VISIBLE_DEVICES: 0,1 → 3",
        "other drift: bitsandbytes 0.43.1 → 0.45.0",
    ]


def test_inspect_without_drift_says_so(tmp_path: Path, capsys, monkeypatch) -> None:
    base = saved_from_good_runs(tmp_path, capsys)
    run = good_run(tmp_path / "again.otel.jsonl")
    monkeypatch.setenv("LORA_OTEL_BASELINE", str(base))
    out = cli(capsys, "inspect", str(run.path))[1]
    assert out[0].startswith("finished normally") and out[1] == "baseline %s: no drift" % base


@pytest.mark.parametrize(
    "content",
    [
        None,
        "",
        "{not json",
        '{"format": "lora-otel baseline", "version": 1, "phases": {"import torch": {"median_s": "fast"}}}',
    ],
)
def test_inspect_with_a_bad_baseline_says_one_line(
    tmp_path: Path, capsys, monkeypatch, journal, content: Optional[str]
) -> None:
    stuck_in_bitsandbytes(journal)
    monkeypatch.delenv("LORA_OTEL_BASELINE", raising=False)
    plain = cli(capsys, "inspect", str(journal.path))[1]
    bad = tmp_path / "bad.json"
    if content is not None:
        bad.write_text(content)
    monkeypatch.setenv("LORA_OTEL_BASELINE", str(bad))
    status, out, err = cli(capsys, "inspect", str(journal.path))
    assert status == 0 and out == plain
    assert err.count("\n") == 1 and err.startswith("lora-otel inspect: LORA_OTEL_BASELINE=%s: " % bad)
    assert err.endswith("; shown without it\n")
    status, out, err = cli(capsys, "inspect", "--json", str(journal.path))
    assert status == 0 and json.loads("\n".join(out))["baseline"]["error"] in err


# --- the live stall diagnosis -------------------------------------------------------------------


class _Accepting:
    """A span exporter that accepts everything."""

    class _Ok:
        name = "SUCCESS"

    def export(self, batch):
        return self._Ok()

    def shutdown(self):
        pass


def _stalled_follower(tmp_path: Path) -> tuple[Follower, Any]:
    journal = JournalBuilder(tmp_path / "live.otel.jsonl", t0=time.time_ns() - 200 * 10**9)
    journal.process(alive=True)
    journal.record("attrs", 0.001, span_id=journal.root_id, attrs={**FACTS, "process.working_directory": str(tmp_path)})
    journal.span("import torch", 0.01, 2.0)
    journal.start("import bitsandbytes", 2.1)
    journal.beat(199.5)
    follower = Follower(
        str(journal.path),
        _Accepting(),
        limits=parse_limits("import=60"),
        frozen_after_s=60,
        evidence=lambda pid, stacks: {},
    )
    spans = follower.poll()
    follower.close(1.0)
    [stalled] = [s for s in spans if s.name == "import bitsandbytes"]
    return follower, stalled


def test_live_stall_diagnosis_leads_with_the_relevant_drift(tmp_path: Path, capsys, monkeypatch) -> None:
    base = saved_from_good_runs(tmp_path, capsys)
    edit(base, lambda doc: doc["environment"]["packages"].update(bitsandbytes="0.43.1", numpy="1.24.0"))
    monkeypatch.setenv("LORA_OTEL_BASELINE", os.path.relpath(base, tmp_path))  # relative to the process's cwd
    monkeypatch.chdir("/")
    _, stalled = _stalled_follower(tmp_path)
    attrs = stalled.attributes
    sentence = attrs["lora_otel.diagnosis"]
    assert sentence.startswith(
        "Drift from the baseline: bitsandbytes 0.43.1 → 0.45.0; import bitsandbytes has taken 19"
    ), sentence
    assert sentence.endswith(". Cannot tell from the evidence."), sentence
    assert attrs["lora_otel.baseline.drift"][0] == "bitsandbytes 0.43.1 → 0.45.0"
    other = list(attrs["lora_otel.baseline.other_drift"])
    assert other[0] == "numpy 1.24.0 → 1.26.4" and other[1].startswith("start-up has taken 20") and len(other) == 2
    assert attrs["lora_otel.baseline.path"].endswith("good.json")
    event = stalled.events[0].attributes
    assert event["lora_otel.diagnosis"] == sentence and "lora_otel.baseline.drift" in event


def test_live_stall_with_a_bad_baseline_goes_on(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("LORA_OTEL_BASELINE", str(tmp_path / "missing.json"))
    _, stalled = _stalled_follower(tmp_path)
    assert stalled.attributes["lora_otel.diagnosis"] == "Cannot tell from the evidence."
    assert stalled.attributes["lora_otel.baseline.error"] == "LORA_OTEL_BASELINE=%s: %s: no such file" % (
        tmp_path / "missing.json",
        tmp_path / "missing.json",
    )


def test_live_stall_without_a_baseline_is_unchanged(tmp_path: Path, no_baseline) -> None:
    _, stalled = _stalled_follower(tmp_path)
    assert stalled.attributes["lora_otel.diagnosis"] == "Cannot tell from the evidence."
    assert not [k for k in stalled.attributes if k.startswith("lora_otel.baseline.")]


# --- what bears on what -------------------------------------------------------------------------


def _drift(kind: str, name: str) -> bl.Drift:
    return bl.Drift(kind, name, "changed", "a", "b", "%s %s" % (kind, name))


@pytest.mark.parametrize(
    "stage, in_training, expected",
    [
        (
            "import bitsandbytes",
            False,
            [
                "package bitsandbytes",
                "package torch",
                "torch_cuda torch CUDA build",
                "driver NVIDIA driver",
                "env LD_LIBRARY_PATH",
            ],
        ),
        (
            "import transformers",
            False,
            ["package transformers", "package torch", "torch_cuda torch CUDA build", "env HF_HUB_OFFLINE"],
        ),
        ("import json", False, []),
        (
            "cuda init",
            False,
            [
                "package torch",
                "torch_cuda torch CUDA build",
                "driver NVIDIA driver",
                "gpu_count GPUs",
                "env LD_LIBRARY_PATH",
            ],
        ),
        (
            "training",
            False,
            [
                "package bitsandbytes",
                "package torch",
                "package transformers",
                "torch_cuda torch CUDA build",
                "driver NVIDIA driver",
                "gpu_count GPUs",
                "env NCCL_P2P_DISABLE",
            ],
        ),
        (
            "epoch 2",
            True,
            [
                "package bitsandbytes",
                "package torch",
                "package transformers",
                "torch_cuda torch CUDA build",
                "driver NVIDIA driver",
                "gpu_count GPUs",
                "env NCCL_P2P_DISABLE",
            ],
        ),
        ("load model", False, ["package transformers", "env HF_HUB_OFFLINE"]),
        ("arguments", False, []),
    ],
)
def test_what_bears_on_a_stage(stage: str, in_training: bool, expected: list) -> None:
    drift = [
        _drift("package", "torch"),
        _drift("package", "transformers"),
        _drift("package", "bitsandbytes"),
        _drift("package", "numpy"),
        _drift("torch_cuda", "torch CUDA build"),
        _drift("driver", "NVIDIA driver"),
        _drift("gpu_count", "GPUs"),
        _drift("env", "HF_HUB_OFFLINE"),
        _drift("env", "LD_LIBRARY_PATH"),
        _drift("env", "NCCL_P2P_DISABLE"),
    ]
    relevant, other = bl.split(drift, stage, in_training)
    assert sorted(d.text for d in relevant) == sorted(expected)
    own = [d for d in drift if d.kind == "package" and "import " + d.name == stage]
    if own:
        assert relevant[0] is own[0]  # the stage's own package first
    assert len(relevant) + len(other) == len(drift)


def test_inspect_dir_shows_the_focus_process_drift(tmp_path: Path, capsys, monkeypatch, journal) -> None:
    """`inspect DIR` (and `--json`) with LORA_OTEL_BASELINE: the stuck process's drift right after
    the job's lines, as `inspect FILE` gives it; `--summary` stays one line a job; a bad baseline is
    one line on stderr and the report without it."""
    base = saved_from_good_runs(tmp_path, capsys)
    edit(base, lambda doc: doc["environment"]["packages"].update(bitsandbytes="0.43.1", torch="2.2.2"))
    stuck_in_bitsandbytes(journal)
    monkeypatch.setenv("LORA_OTEL_BASELINE", str(base))
    one = cli(capsys, "inspect", str(journal.path))[1]
    directory = str(journal.path.parent)
    status, out, err = cli(capsys, "inspect", directory)
    assert status == 0 and err == ""
    start = out.index("drift from baseline %s bearing on import bitsandbytes:" % base)
    assert out[start : start + 5] == one[1:6]  # as `inspect FILE` gives it, after the job's lines
    assert start < next(i for i, line in enumerate(out) if line.lstrip().startswith("journal: "))  # before the tree
    doc = json.loads("\n".join(cli(capsys, "inspect", "--json", directory)[1]))
    [job] = doc["jobs"]
    assert job["baseline"]["stage"] == "import bitsandbytes"
    assert [d["name"] for d in job["baseline"]["relevant"]] == ["bitsandbytes", "import bitsandbytes", "torch"]
    status, out, _ = cli(capsys, "inspect", "--summary", directory)
    assert len(out) == 1 and "drift" not in out[0]
    Path(base).write_text("{not json")
    status, out, err = cli(capsys, "inspect", directory)
    assert status == 0 and len(err.splitlines()) == 1 and err.startswith("lora-otel inspect: ")
    assert not any(line.startswith("drift from baseline") for line in out)


def test_deeply_nested_files_are_one_line_errors(tmp_path: Path, capsys) -> None:
    """A baseline file or a journal of 100,000 nested brackets (found by the fuzzer: a
    RecursionError traceback): one line on stderr and the usage status, no traceback."""
    base = saved_from_good_runs(tmp_path, capsys)
    deep = tmp_path / "deep.otel.jsonl"
    deep.write_text("[" * 100_000 + "\n")
    status, _out, err = cli(capsys, "baseline", "diff", str(deep))
    assert status == 2 and len(err.splitlines()) == 1 and "nested too deeply" in err, err
    status, _out, err = cli(capsys, "baseline", "diff", str(base), str(deep))
    assert status == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, err


def test_local_watchdog_stall_leads_with_the_relevant_drift(tmp_path: Path, capsys, monkeypatch) -> None:
    """The local watchdog diagnoses through the live export's one function (`diagnose_stall`): its
    stall record leads with the drift from the baseline too."""
    from lora_otel.export.watchdog import Watch

    base = saved_from_good_runs(tmp_path, capsys)
    edit(base, lambda doc: doc["environment"]["packages"].update(bitsandbytes="0.43.1"))
    monkeypatch.setenv("LORA_OTEL_BASELINE", os.path.relpath(base, tmp_path))
    monkeypatch.chdir("/")
    journal = JournalBuilder(tmp_path / "local.otel.jsonl", t0=time.time_ns() - 200 * 10**9)
    journal.process(alive=True)
    journal.record("attrs", 0.001, span_id=journal.root_id, attrs={**FACTS, "process.working_directory": str(tmp_path)})
    journal.span("import torch", 0.01, 2.0)
    journal.start("import bitsandbytes", 2.1)
    journal.beat(199.5)
    watch = Watch(
        str(journal.path), limits=parse_limits("import=60"), frozen_after_s=60, evidence=lambda pid, stacks: {}
    )
    record = watch.poll()
    assert record is not None and record["diagnosis"].startswith(
        "Drift from the baseline: bitsandbytes 0.43.1 → 0.45.0; import bitsandbytes has taken 19"
    ), record
