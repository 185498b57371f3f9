"""Tests for lora_otel._boot.envfacts, the environment self-check run at interpreter start."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lora_otel._boot import envfacts

REPO_ROOT = Path(__file__).resolve().parent.parent
HAVE_TORCH = importlib.util.find_spec("torch") is not None


@pytest.fixture(autouse=True)
def _fresh_cache():
    envfacts.clear_cache()
    yield
    envfacts.clear_cache()


def _site(tmp_path: Path, name: str, entries: list[str]) -> Path:
    site = tmp_path / name
    site.mkdir()
    for entry in entries:
        (site / entry).mkdir()
    return site


def _fake_torch(site: Path, version_py: str) -> None:
    pkg = site / "torch"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("raise RuntimeError('must never be imported')\n")
    (pkg / "version.py").write_text(version_py)


# --- package versions ---------------------------------------------------------------------------


@pytest.mark.parametrize("dist", ["torch", "pytest", "opentelemetry-sdk", "opentelemetry_api"])
def test_versions_match_importlib_metadata(dist):
    """For real installed distributions the version read from the dist-info directory names is
    exactly what importlib.metadata.version() reports."""
    if dist == "torch" and not HAVE_TORCH:
        pytest.skip("torch not installed")
    assert envfacts.package_version(dist) == importlib.metadata.version(dist)


def test_missing_package_is_none():
    """A distribution that is not installed gives None, and every requested name is a key."""
    got = envfacts.package_versions(["surely-not-installed-xyz", "pytest"])
    assert got == {
        "surely-not-installed-xyz": None,
        "pytest": importlib.metadata.version("pytest"),
    }


def test_pep503_normalised_name_found_in_fake_site(tmp_path, monkeypatch):
    """`Foo_Bar-1.2.3.dist-info` is found when asked for `foo-bar`, `Foo.Bar` or `foo__bar`: names
    are compared after PEP 503 normalisation, and the result is keyed by the name as asked."""
    site = _site(tmp_path, "site", ["Foo_Bar-1.2.3.dist-info", "unrelated"])
    monkeypatch.setattr(sys, "path", [str(site), *sys.path])
    got = envfacts.package_versions(["foo-bar", "Foo.Bar", "foo__bar"])
    assert got == {"foo-bar": "1.2.3", "Foo.Bar": "1.2.3", "foo__bar": "1.2.3"}


def test_first_match_in_sys_path_order_wins(tmp_path, monkeypatch):
    """With the same distribution in two sys.path directories, the earlier directory's version is
    reported, as the import system and importlib.metadata would."""
    first = _site(tmp_path, "first", ["foo_bar-2.0.dist-info"])
    second = _site(tmp_path, "second", ["foo_bar-1.0.dist-info"])
    monkeypatch.setattr(sys, "path", [str(first), str(second)])
    assert envfacts.package_version("foo-bar") == "2.0"
    envfacts.clear_cache()
    monkeypatch.setattr(sys, "path", [str(second), str(first)])
    assert envfacts.package_version("foo-bar") == "1.0"


def test_egg_info_forms(tmp_path, monkeypatch):
    """egg-info entries count too: the `-pyX.Y` suffix is not part of the version, and an egg-info
    with no version in its name (setup.py develop) is read from its PKG-INFO."""
    site = _site(tmp_path, "site", ["old_pkg-0.9.1-py3.11.egg-info", "devpkg.egg-info"])
    (site / "devpkg.egg-info" / "PKG-INFO").write_text(
        "Metadata-Version: 2.1\nName: devpkg\nVersion: 4.5.6.dev0\n\nlong description\n"
    )
    monkeypatch.setattr(sys, "path", [str(site)])
    assert envfacts.package_versions(["old-pkg", "devpkg"]) == {
        "old-pkg": "0.9.1",
        "devpkg": "4.5.6.dev0",
    }


def test_listing_is_cached_once_per_directory(tmp_path, monkeypatch):
    """Each sys.path directory is listed once: a dist-info added afterwards is not seen until
    clear_cache(), so repeated calls cost no further directory scans."""
    site = _site(tmp_path, "site", [])
    monkeypatch.setattr(sys, "path", [str(site)])
    assert envfacts.package_version("late") is None
    (site / "late-1.0.dist-info").mkdir()
    assert envfacts.package_version("late") is None
    envfacts.clear_cache()
    assert envfacts.package_version("late") == "1.0"


def test_odd_sys_path_entries_do_not_raise(tmp_path, monkeypatch):
    """Missing directories, plain files, zip paths and non-string entries on sys.path are skipped;
    nothing raises and later directories are still searched."""
    afile = tmp_path / "afile.zip"
    afile.write_bytes(b"PK\x05\x06" + b"\0" * 18)
    site = _site(tmp_path, "site", ["foo-1.0.dist-info"])
    monkeypatch.setattr(sys, "path", [str(tmp_path / "missing"), str(afile), None, b"bytes", str(site)])
    assert envfacts.package_version("foo") == "1.0"
    assert isinstance(envfacts.collect(environ={}), dict)


# --- torch build --------------------------------------------------------------------------------


def test_fake_cuda_torch_is_a_cuda_build(tmp_path, monkeypatch):
    """A torch/version.py with annotated assignments (`cuda: Optional[str] = '12.1'`) is parsed
    as a CUDA 12.1 build without importing it (its __init__ raises), and the cuDNN version comes
    from the installed nvidia-cudnn-cu12 distribution."""
    site = _site(tmp_path, "site", ["torch-2.3.1.dist-info", "nvidia_cudnn_cu12-9.1.0.70.dist-info"])
    _fake_torch(
        site,
        "from typing import Optional\n\n"
        "__all__ = ['__version__', 'debug', 'cuda', 'git_version', 'hip']\n"
        "__version__ = '2.3.1+cu121'\n"
        "debug = False\n"
        "cuda: Optional[str] = '12.1'\n"
        'git_version = "d44533f9d073df13895333e70b66f81c513c1889"\n'
        "hip: Optional[str] = None\n",
    )
    monkeypatch.setattr(sys, "path", [str(site)])
    build = envfacts.torch_build()
    assert build == {
        "torch.version": "2.3.1+cu121",
        "torch.cuda_build": "12.1",
        "torch.hip_build": None,
        "torch.git_version": "d44533f9d073df13895333e70b66f81c513c1889",
        "cudnn.version": "9.1.0.70",
    }
    assert "torch" not in sys.modules or sys.modules["torch"].__file__ != str(site / "torch" / "__init__.py")
    facts = envfacts.collect(environ={})
    assert facts["lora_otel.torch.cuda_build"] == "12.1"
    assert facts["lora_otel.cudnn.version"] == "9.1.0.70"
    assert facts["lora_otel.pkg.torch"] == "2.3.1"
    assert "torch 2.3.1 (CUDA 12.1 build)" in envfacts.lines(facts)[0]


def test_old_style_and_hip_version_py(tmp_path, monkeypatch):
    """Unannotated assignments, a ROCm build (`hip = '6.0...'`, `cuda = None`) and look-alike
    names (`cuda_foo`, indented code) are handled; with no dist-info the version comes from the
    file."""
    site = tmp_path / "site"
    site.mkdir()
    _fake_torch(
        site,
        "__version__ = '2.2.0+rocm6.0'\n"
        "cuda_foo = '99.9'\n"
        "cuda = None\n"
        "def f():\n    cuda = '1.0'\n"
        "hip = '6.0.32830-d62f6a171'  # comment\n",
    )
    monkeypatch.setattr(sys, "path", [str(site)])
    build = envfacts.torch_build()
    assert build["torch.version"] == "2.2.0+rocm6.0"
    assert build["torch.cuda_build"] is None
    assert build["torch.hip_build"] == "6.0.32830-d62f6a171"
    assert build["cudnn.version"] is None
    facts = envfacts.collect(environ={})
    assert facts["lora_otel.pkg.torch"] == "2.2.0+rocm6.0"
    assert "lora_otel.torch.cuda_build" not in facts
    assert "ROCm/HIP" in envfacts.lines(facts)[0]


def test_no_torch_gives_all_none(tmp_path, monkeypatch):
    """Without torch on sys.path every torch_build value is None, and the summary says so."""
    monkeypatch.setattr(sys, "path", [str(tmp_path)])
    assert set(envfacts.torch_build().values()) == {None}
    facts = envfacts.collect(environ={})
    assert "lora_otel.pkg.torch" not in facts
    assert "torch not installed" in envfacts.lines(facts)[0]


@pytest.mark.torch
@pytest.mark.skipif(not HAVE_TORCH, reason="torch not installed")
def test_real_torch_build_matches_torch_version():
    """For the installed torch the parsed build equals torch.version (read here by importing
    torch in the test, never in envfacts): a CPU wheel reports cuda None, i.e. a CPU build."""
    import torch  # the test may import it; envfacts must not

    build = envfacts.torch_build()
    assert build["torch.version"] == torch.version.__version__
    assert build["torch.cuda_build"] == torch.version.cuda
    assert build["torch.hip_build"] == torch.version.hip
    if torch.version.cuda is None and torch.version.hip is None:
        facts = envfacts.collect(environ={})
        assert "lora_otel.torch.cuda_build" not in facts
        assert "(CPU build)" in envfacts.lines(facts)[0]


# --- NVIDIA driver ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  Sat Aug 19 01:15:15 UTC 2023\n"
        "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n",
        "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  535.104.05  Release Build  "
        "(dvs-builder@U16-I3-B03-4-3)  Tue Aug 22 18:01:17 UTC 2023\nGCC version:  gcc 12\n",
    ],
    ids=["proprietary", "open"],
)
def test_driver_facts_from_proc(tmp_path, monkeypatch, text):
    """The driver version is parsed from both the proprietary and the open kernel module's
    /proc/driver/nvidia/version text, and the GPU count is the number of gpus/ entries."""
    version = tmp_path / "version"
    version.write_text(text)
    gpus = tmp_path / "gpus"
    gpus.mkdir()
    for bus in ("0000:17:00.0", "0000:65:00.0"):
        (gpus / bus).mkdir()
    monkeypatch.setattr(envfacts, "_NVIDIA_VERSION_FILE", str(version))
    monkeypatch.setattr(envfacts, "_NVIDIA_GPUS_DIR", str(gpus))
    assert envfacts.driver_facts() == {"nvidia.driver_version": "535.104.05", "nvidia.gpu_count": 2}
    facts = envfacts.collect(environ={})
    assert facts["lora_otel.nvidia.driver_version"] == "535.104.05"
    assert facts["lora_otel.nvidia.gpu_count"] == 2
    assert envfacts.lines(facts)[2].startswith("CUDA: driver 535.104.05 (2 GPUs)")


def test_no_driver_means_absent_keys(tmp_path, monkeypatch):
    """Without /proc/driver/nvidia the keys are absent (not None), and the CUDA line says the
    version file is missing."""
    monkeypatch.setattr(envfacts, "_NVIDIA_VERSION_FILE", str(tmp_path / "nope"))
    monkeypatch.setattr(envfacts, "_NVIDIA_GPUS_DIR", str(tmp_path / "nope-gpus"))
    assert envfacts.driver_facts() == {}
    facts = envfacts.collect(environ={})
    assert not any(k.startswith("lora_otel.nvidia.") for k in facts)
    if facts.get("os.type") == "linux":
        assert envfacts.lines(facts)[2].startswith("CUDA: no NVIDIA driver found (/proc/driver/nvidia/version missing)")


# --- environment variables ----------------------------------------------------------------------

ENV = {
    "CUDA_VISIBLE_DEVICES": "0,1",
    "RANK": "0",
    "HF_HOME": "/data/hf",
    "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
    "NCCL_DEBUG": "INFO",
    "HOME": "/root",
    "PATH": "/usr/bin:/bin",
    "RANKING": "no",  # not RANK
    "AWS_SECRET_ACCESS_KEY": "abc",
}


def test_env_filter_keeps_device_vars_and_drops_others():
    """CUDA_VISIBLE_DEVICES, RANK, HF_HOME, PYTORCH_*, NCCL_* are kept; HOME, PATH, look-alikes
    (RANKING) and unrelated secrets are dropped."""
    got = envfacts.relevant_env(ENV, redact=dict)
    assert got == {
        "CUDA_VISIBLE_DEVICES": "0,1",
        "HF_HOME": "/data/hf",
        "NCCL_DEBUG": "INFO",
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
        "RANK": "0",
    }


def test_redact_callable_is_applied():
    """Every recorded value is what redact(mapping) returned for it, in the facts too; the
    redactor sees only the relevant variables; a name it drops is left out."""
    seen = []

    def redact(env):
        seen.append(dict(env))
        return {k: "<%s:%d>" % (k, len(v)) for k, v in env.items() if k != "NCCL_DEBUG"}

    env = dict(ENV, HF_TOKEN="hf_secret")
    got = envfacts.relevant_env(env, redact=redact)
    assert got["HF_TOKEN"] == "<HF_TOKEN:9>"
    assert got["CUDA_VISIBLE_DEVICES"] == "<CUDA_VISIBLE_DEVICES:3>"
    assert "NCCL_DEBUG" not in got
    assert len(seen) == 1 and "HOME" not in seen[0] and "PATH" not in seen[0]
    facts = envfacts.collect(environ=env, redact=redact)
    assert facts["lora_otel.env.HF_TOKEN"] == "<HF_TOKEN:9>"
    assert "hf_secret" not in repr(facts)


def test_failing_redactor_fails_closed():
    """If the redactor raises on the whole set it is retried per variable; a variable it still
    fails on is left out rather than recorded unredacted, and nothing raises."""

    def redact(env):
        if "HF_TOKEN" in env:
            raise ValueError("boom")
        return {k: v.upper() for k, v in env.items()}

    got = envfacts.relevant_env({"HF_TOKEN": "hf_secret", "HF_HOME": "/x", "HOME": "/root"}, redact)
    assert got == {"HF_HOME": "/X"}
    assert envfacts.relevant_env({"RANK": "0"}, redact=lambda env: None) == {}


def test_real_redact_env_is_compatible():
    """The project's own redactor (lora_otel._boot.redact.redact_env) plugs in as `redact`:
    secrets are masked and ordinary device variables come through unchanged."""
    redact_mod = pytest.importorskip("lora_otel._boot.redact")
    env = {
        "HF_TOKEN": "hf_abcdefghijklmnopqrstuvwxyz0123456789",
        "CUDA_VISIBLE_DEVICES": "0,1",
        "RANK": "0",
        "HOME": "/root",
    }
    facts = envfacts.collect(environ=env, redact=redact_mod.redact_env)
    assert "hf_abcdefghijklmnopqrstuvwxyz0123456789" not in repr(facts)
    assert "lora_otel.env.HF_TOKEN" in facts
    assert facts["lora_otel.env.CUDA_VISIBLE_DEVICES"] == "0,1"
    assert facts["lora_otel.env.RANK"] == "0"
    assert "lora_otel.env.HOME" not in facts


def test_default_redaction_hides_secret_names_and_url_passwords():
    """Without a redactor, secret-looking variables (HF_TOKEN) are masked and user:password@ is
    cut from URLs, so a raw secret never ends up in the facts."""
    env = {"HF_TOKEN": "hf_secret", "HF_ENDPOINT": "https://u:pw@hub.example/x", "RANK": "1"}
    got = envfacts.relevant_env(env)
    assert got["RANK"] == "1"
    assert "hf_secret" not in got["HF_TOKEN"]
    assert "pw" not in got["HF_ENDPOINT"] and got["HF_ENDPOINT"].endswith("@hub.example/x")


def test_env_line_lists_only_the_set_ones():
    """The env line shows the set variables, most useful first, and only those."""
    facts = envfacts.collect(environ=ENV, redact=dict)
    env_line = envfacts.lines(facts)[1]
    assert env_line.startswith("env: CUDA_VISIBLE_DEVICES=0,1 RANK=0 ")
    assert "HF_HOME=/data/hf" in env_line
    assert "HOME=/root" not in env_line.replace("HF_HOME", "") and "PATH=" not in env_line
    assert envfacts.lines(envfacts.collect(environ={}))[1].startswith("env: no ")


# --- collect / lines ----------------------------------------------------------------------------


def test_collect_shape():
    """collect() returns OpenTelemetry-style attributes with str/int/bool values only, the
    runtime and OS keys filled from sys/os, and one lora_otel.pkg.* per installed package."""
    facts = envfacts.collect(environ={"RANK": "3"})
    assert all(isinstance(v, (str, int, bool)) for v in facts.values())
    assert facts["process.runtime.name"] == sys.implementation.name
    v = sys.version_info
    assert facts["process.runtime.version"].startswith("%d.%d.%d" % (v[0], v[1], v[2]))
    assert "\n" not in facts["process.runtime.description"]
    assert facts["lora_otel.python.executable"] == sys.executable
    assert facts["lora_otel.env.RANK"] == "3"
    if sys.platform.startswith("linux"):
        assert facts["os.type"] == "linux"
        assert facts["os.version"] == os.uname().release
        machine = os.uname().machine
        assert facts["host.arch"] == {"x86_64": "amd64", "aarch64": "arm64"}.get(machine, machine)
    for name in envfacts.PACKAGES:
        key = "lora_otel.pkg." + name
        expected = envfacts.package_version(name)
        if expected is None and name != "torch":
            assert key not in facts
        elif expected is not None:
            assert facts[key] == expected
    json.dumps(facts)  # plain values only


def test_lines_shape():
    """lines() gives 2-4 short lines: environment, env and CUDA, in that order."""
    out = envfacts.lines(envfacts.collect(environ={"CUDA_VISIBLE_DEVICES": "0"}))
    assert 2 <= len(out) <= 4
    assert out[0].startswith("environment: Python ")
    assert out[1] == "env: CUDA_VISIBLE_DEVICES=0"
    assert out[2].startswith("CUDA: ")
    assert all("\n" not in line for line in out)


def test_lines_of_garbage_does_not_raise():
    """lines() copes with an empty or odd facts dict."""
    assert len(envfacts.lines({})) >= 2
    assert len(envfacts.lines({"lora_otel.nvidia.gpu_count": "x", "host.arch": 5})) >= 2


# --- import discipline --------------------------------------------------------------------------


def _run(code: str) -> list[str]:
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True, timeout=60
    ).stdout
    return eval(out.strip().splitlines()[-1])  # a printed list of str


FORBIDDEN = {
    "torch",
    "numpy",
    "transformers",
    "re",
    "json",
    "importlib",
    "importlib.metadata",
    "platform",
    "threading",
    "typing",
    "subprocess",
    "pathlib",
    "email",
    "zipfile",
}


@pytest.mark.slow
def test_collect_loads_only_lora_otel_modules():
    """Importing envfacts and running collect() in a fresh interpreter loads only lora_otel
    modules and __future__ (plus whatever the lora_otel package's own __init__ loads, which must
    not include torch, re, json, importlib.metadata, ...); envfacts itself adds nothing but
    itself."""
    new = _run(
        "import sys; before=set(sys.modules); import lora_otel._boot.envfacts as e; "
        "e.collect(); print(sorted(set(sys.modules)-before))"
    )
    package_only = _run(
        "import sys; before=set(sys.modules); import lora_otel._boot; print(sorted(set(sys.modules)-before))"
    )
    assert "lora_otel._boot.envfacts" in new
    assert not FORBIDDEN & set(new), new
    strays = [m for m in new if not (m == "lora_otel" or m.startswith("lora_otel.") or m == "__future__")]
    assert set(strays) <= set(package_only), strays  # anything else comes from the package __init__

    # envfacts on its own: with the package already imported, only envfacts itself appears.
    own = _run(
        "import sys; import lora_otel._boot; before=set(sys.modules); "
        "import lora_otel._boot.envfacts as e; e.lines(e.collect()); e.torch_build(); "
        "print(sorted(set(sys.modules)-before))"
    )
    assert own == ["lora_otel._boot.envfacts"], own
