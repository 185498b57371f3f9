"""Harmless everywhere, API values (issue 12, item 9): ``lora_otel.progress(step=step, loss=loss)``
never raises into the training loop for a value a user would pass — torch tensors, numpy scalars,
``Decimal``, ``Fraction``, bools — with tracing on or off; it records the number a value holds and
drops a value that holds none with one line per key. ``stage(**attrs)`` takes the same values."""

from __future__ import annotations

import re
import subprocess
import textwrap
from pathlib import Path

import pytest
from procs import LINE_RE, PYTHON, clean_env, only_journal, span_named

pytestmark = pytest.mark.slow

pytest.importorskip("torch")
pytest.importorskip("numpy")

VALUES = textwrap.dedent("""
    import sys, time
    from decimal import Decimal
    from fractions import Fraction
    import numpy as np
    import torch
    import lora_otel

    loss = torch.tensor(0.5, requires_grad=True) * 1.0   # a 0-d tensor with a graph, as in a loop
    for i in range(3):
        lora_otel.progress(step=torch.tensor(i + 1), loss=loss, lr=np.float32(0.25), tokens=np.int64(7),
                           d=Decimal("1.5"), f=Fraction(1, 4), flag=True, nflag=np.bool_(False),
                           one=torch.tensor([2.0]), arr=np.array(3.5), f64=np.float64(0.125), plain=1.0)
        lora_otel.progress(many=torch.zeros(3), text="low", nothing=None, cplx=1j)
    lora_otel.progress(step=np.int64(4))
    lora_otel.progress(step=-1)
    lora_otel.progress(step=2.5)
    print("DONE", flush=True)
""")

NUMBERS = {
    "loss": 0.5,
    "lr": 0.25,
    "tokens": 7,
    "d": 1.5,
    "f": 0.25,
    "flag": 1,
    "nflag": 0,
    "one": 2.0,
    "arr": 3.5,
    "f64": 0.125,
    "plain": 1.0,
}
BAD = ("many", "text", "nothing", "cplx", "step")


def run_job(tmp_path: Path, script: str, **env: str) -> subprocess.CompletedProcess:
    (tmp_path / "job.py").write_text(script)
    return subprocess.run(
        [PYTHON, "job.py"], cwd=tmp_path, env=clean_env(**env), capture_output=True, text=True, timeout=120
    )


def test_progress_values_untraced_do_not_raise(tmp_path: Path) -> None:
    """Tracing off: the README's ``progress(step=step, loss=loss)`` with tensors, numpy scalars,
    Decimal, Fraction, bools and values that hold no number runs to the end, silently."""
    r = run_job(tmp_path, VALUES)
    assert r.returncode == 0, r.stderr
    assert r.stdout == "DONE\n" and r.stderr == ""
    assert not (tmp_path / "lora-otel").exists()


def test_progress_values_traced_are_recorded_as_numbers(tmp_path: Path) -> None:
    """Tracing on: the journal's beat metrics hold each value's number and the step; each key
    whose value holds no number gets one line (stderr and journal), though passed three times."""
    r = run_job(tmp_path, VALUES, LORA_OTEL="1", LORA_OTEL_BEAT_S="0.2")
    assert r.returncode == 0, r.stderr
    assert r.stdout == "DONE\n"
    j = only_journal(tmp_path / "lora-otel")
    assert j.metrics == NUMBERS, j.metrics
    assert all(type(v) is type(NUMBERS[k]) for k, v in j.metrics.items()), j.metrics
    assert j.steps == 4  # the last good step; -1 and 2.5 were dropped
    printed = [m.group(3) for m in (re.match(LINE_RE, ln) for ln in r.stderr.splitlines()) if m]
    for key in BAD:
        said = [msg for msg in printed if msg.startswith("lora_otel.progress(%s=" % key)]
        assert len(said) == 1, (key, printed)
        assert "not recorded" in said[0]
        assert len([ln for ln in j.lines if ln.msg == said[0] and ln.level == "error"]) == 1
    assert "Tensor of shape (3,)" in next(m for m in printed if m.startswith("lora_otel.progress(many="))
    assert "Traceback" not in r.stderr


def test_progress_without_torch_or_numpy_imports_neither(tmp_path: Path) -> None:
    """Duck typing: a program that never imports torch or numpy passes Decimal and Fraction, and
    lora_otel imports neither."""
    script = textwrap.dedent("""
        import sys
        from decimal import Decimal
        from fractions import Fraction
        import lora_otel
        lora_otel.progress(step=1, loss=Decimal("0.75"), lr=Fraction(1, 8))
        print(sorted(m for m in ("torch", "numpy") if m in sys.modules))
    """)
    r = run_job(tmp_path, script, LORA_OTEL="1")
    assert r.returncode == 0, r.stderr
    assert r.stdout == "[]\n"
    assert only_journal(tmp_path / "lora-otel").metrics == {"loss": 0.75, "lr": 0.125}


def test_accelerator_tensor_is_read_off_the_training_thread(tmp_path: Path) -> None:
    """A one-element tensor on an accelerator is not read (``.item()``: a device sync) in the
    training loop's call; it is read by another thread within a beat interval and lands in the
    beat metrics. No GPU here: the "CUDA tensor" is a stand-in with the attributes lora_otel
    reads (``device.type``, ``numel``, ``detach``, ``item``), recording the thread that reads it.
    A real torch tensor on the ``meta`` device (which has no data) is dropped with one line."""
    script = textwrap.dedent("""
        import threading, time, torch
        import lora_otel

        class Device:
            type = "cuda"
            def __str__(self):
                return "cuda:0"

        readers = []

        class CudaScalar:
            device = Device()
            shape = ()
            def __init__(self, value):
                self.value = value
            def numel(self):
                return 1
            def detach(self):
                return self
            def item(self):
                readers.append(threading.get_ident())
                return self.value

        main = threading.get_ident()
        for i in range(20):
            lora_otel.progress(step=i, loss=CudaScalar(0.5 / (i + 1)), meta=torch.empty((), device="meta"))
        assert readers == [], "read in the training loop"
        deadline = time.monotonic() + 10
        while not readers and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)
        print("READ", len(readers) > 0 and main not in readers, flush=True)
    """)
    r = run_job(tmp_path, script, LORA_OTEL="1", LORA_OTEL_BEAT_S="0.2")
    assert r.returncode == 0, r.stderr
    assert r.stdout == "READ True\n"
    j = only_journal(tmp_path / "lora-otel")
    assert j.metrics == {"loss": 0.5 / 20}
    assert j.steps == 19
    said = [ln.msg for ln in j.lines if ln.msg.startswith("lora_otel.progress(meta=")]
    assert len(said) == 1 and "on meta" in said[0], said


def test_stage_attributes_from_tensors_and_numpy(tmp_path: Path) -> None:
    """``stage(name, **attrs)`` with tensor, numpy, Decimal values: a one-element value becomes its
    number, a larger tensor a short description (not its data); nothing raises, traced or not."""
    script = textwrap.dedent("""
        from decimal import Decimal
        import numpy as np, torch
        import lora_otel
        with lora_otel.stage("eval", loss=torch.tensor(0.5), n=np.int64(3), d=Decimal("2.5"),
                             big=torch.zeros(2, 2), pair=[np.float32(0.5), 2], ok=np.bool_(True)):
            lora_otel.mark("evaluated")
        print("DONE", flush=True)
    """)
    for env in ({}, {"LORA_OTEL": "1"}):
        r = run_job(tmp_path, script, **env)
        assert r.returncode == 0, r.stderr
        assert r.stdout == "DONE\n"
    attrs = span_named(only_journal(tmp_path / "lora-otel"), "eval").attrs
    assert (attrs["loss"], attrs["n"], attrs["d"], attrs["pair"], attrs["ok"]) == (0.5, 3, 2.5, [0.5, 2], 1)
    assert attrs["big"] == "Tensor of shape (2, 2) on cpu"


def test_a_command_line_as_an_attribute_has_its_secrets_removed(tmp_path: Path) -> None:
    """``stage(name, cmd=[..., "--password", "x"])``: a list of strings shaped like a command line
    loses a secret-named option's value, as the process's own argv does (issue 16's hostile trial:
    it reached the journal, and from there the HTML report people attach to bug reports)."""
    script = textwrap.dedent("""
        import lora_otel
        with lora_otel.stage("launch", cmd=["train", "--password", "hunter2hunter2", "--api-key=k3yk3yk3y",
                                            "--epochs", "3"], names=["a", "b"]):
            pass
    """)
    r = run_job(tmp_path, script, LORA_OTEL="1")
    assert r.returncode == 0, r.stderr
    journal = only_journal(tmp_path / "lora-otel")
    attrs = span_named(journal, "launch").attrs
    assert "hunter2hunter2" not in str(attrs["cmd"]) and "k3yk3yk3y" not in str(attrs["cmd"]), attrs["cmd"]
    assert attrs["cmd"][0] == "train" and "--epochs" in attrs["cmd"] and "3" in attrs["cmd"]
    assert attrs["names"] == ["a", "b"]
    raw = Path(journal.path).read_text()
    assert "hunter2hunter2" not in raw and "k3yk3yk3y" not in raw
