"""The code that runs inside the training process loads nothing but the standard library."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from procs import PYTHON, clean_env

pytestmark = pytest.mark.slow

PROBE = r"""
import sys, importlib.abc, importlib.machinery

class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "opentelemetry" or name.startswith("opentelemetry."):
            raise ImportError("opentelemetry is made unimportable for this test")
        return None

sys.meta_path.insert(0, Block())
before = set(sys.modules)
import lora_otel.auto                       # the preamble
import lora_otel
with lora_otel.stage("work", n=1):
    lora_otel.mark("arguments parsed")
    lora_otel.progress(step=1, loss=0.5)
import json                                 # a traced import, after which the hooks run
import argparse
argparse.ArgumentParser().parse_args([])    # the argparse hook
new = sorted(set(sys.modules) - before)
print("MODULES=" + json.dumps(new))
"""


def _stdlib_names() -> set:
    names = set(getattr(sys, "stdlib_module_names", ()))
    names.update(sys.builtin_module_names)
    return names


@pytest.mark.skipif(not hasattr(sys, "stdlib_module_names"), reason="needs Python 3.10+ to list the stdlib")
def test_preamble_loads_only_stdlib_and_itself(tmp_path: Path) -> None:
    """With opentelemetry unimportable, the preamble, API and hooks load only stdlib and lora_otel modules."""
    (tmp_path / "probe.py").write_text(PROBE)
    r = subprocess.run([PYTHON, "probe.py"], cwd=tmp_path, env=clean_env(), capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    line = next(ln for ln in r.stdout.splitlines() if ln.startswith("MODULES="))
    loaded = json.loads(line[len("MODULES=") :])
    stdlib = _stdlib_names()
    outside = [m for m in loaded if m.split(".")[0] not in stdlib and m.split(".")[0] != "lora_otel"]
    assert outside == [], "lora_otel loaded non-stdlib modules in-process: %s" % outside
    assert "lora_otel._boot.preamble" in loaded


@pytest.mark.skipif(not hasattr(sys, "stdlib_module_names"), reason="needs Python 3.10+ to list the stdlib")
@pytest.mark.parametrize(
    "mode",
    ["off", "local", "otlp"],
    ids=["journal only (LORA_OTEL_LIVE=0)", "starting the local watchdog", "starting the sidecar"],
)
def test_pth_activation_loads_only_stdlib(tmp_path: Path, mode: str) -> None:
    """`LORA_OTEL=1 python -X importtime -c CODE`: every module imported is stdlib or lora_otel, and
    none of the slow ones (json, re, typing, threading...), also when it starts the sidecar (for
    every job unless LORA_OTEL_LIVE=0; with an endpoint, or as the local watchdog). ``pass`` is no
    job: it starts no sidecar and loads nothing a job needs (``spawn``, ``envfacts``, ``redact``)."""
    live = mode != "off"
    extra = {
        "off": {"LORA_OTEL_LIVE": "0"},
        "local": {"LORA_OTEL_SIDECAR_PYTHON": "/bin/true"},
        "otlp": {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9", "LORA_OTEL_SIDECAR_PYTHON": "/bin/true"},
    }[mode]
    short = _modules(tmp_path, "pass", extra)
    assert not {"lora_otel._boot.spawn", "lora_otel._boot.envfacts", "lora_otel._boot.redact"} & set(short), short
    job = _modules(tmp_path, "import lora_otel\nwith lora_otel.stage('x'):\n    pass\n", extra)
    assert ("lora_otel._boot.spawn" in job) == live


def _modules(tmp_path: Path, code: str, extra: dict) -> list[str]:
    """The modules ``python -X importtime -c code`` imports, checked: stdlib or lora_otel, none slow."""
    r = subprocess.run(
        [PYTHON, "-X", "importtime", "-c", code],
        cwd=tmp_path,
        env=clean_env(LORA_OTEL="1", **extra),
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0
    mods = [ln.split("|")[-1].strip() for ln in r.stderr.splitlines() if ln.startswith("import time:")]
    mods = [m for m in mods if m and m != "imported package"]
    assert "lora_otel._boot.preamble" in mods
    stdlib = _stdlib_names() | {"sitecustomize", "usercustomize", "_distutils_hack"}
    outside = [
        m
        for m in mods
        if m.split(".")[0] not in stdlib and m.split(".")[0] != "lora_otel" and not m.startswith("_editable_impl")
    ]
    assert outside == [], outside
    slow = ("opentelemetry", "json", "re", "typing", "threading", "subprocess", "importlib.metadata")
    assert not [m for m in mods if m.split(".")[0] in slow or m.startswith("importlib.metadata")], mods
    return mods
