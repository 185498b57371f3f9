"""`lora-otel doctor`: real runs of the start-up flow on this machine, and its pure checks."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
from pathlib import Path

import pytest
from procs import PYTHON, clean_env

from lora_otel.cli import doctor
from lora_otel.cli.doctor import (
    Check,
    check_cuda_build,
    follow,
    format_bytes,
    max_cuda_for_driver,
    packages,
    parse_size,
)
from lora_otel.cli.doctor import cuda as doctor_cuda
from lora_otel.journal.reader import read_journal

HAVE_STACK = all(importlib.util.find_spec(m) is not None for m in ("torch", "transformers", "peft", "accelerate"))
needs_stack = pytest.mark.skipif(not HAVE_STACK, reason="needs torch, transformers, peft and accelerate installed")
CPU_ONLY = not os.path.exists("/proc/driver/nvidia/version")


def run_doctor(tmp_path: Path, *args: str, timeout: float = 180, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [PYTHON, "-m", "lora_otel", "doctor", "--dir", str(tmp_path / "j"), *args],
        cwd=tmp_path,
        env=clean_env(**env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def by_name(report: dict) -> dict:
    return {c["name"]: c for c in report["checks"]}


def line_of(out: str, name: str) -> str:
    lines = [ln for ln in out.splitlines() if ln[6:].startswith(name + " ")]
    assert lines, "no line for %r in:\n%s" % (name, out)
    return lines[0]


# --- real runs ---------------------------------------------------------------------------------


@pytest.mark.slow
@needs_stack
def test_doctor_on_this_machine(tmp_path: Path) -> None:
    """The whole flow: exit 0, ok imports, the LoRA step ok, CUDA a clear warn here (CPU only), and a
    journal with the import spans written like a real job's."""
    r = run_doctor(tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout
    for m in ("torch", "transformers", "accelerate", "peft"):
        assert line_of(out, "import " + m).startswith("ok    "), out
    assert line_of(out, "python").startswith("ok    ")
    assert line_of(out, "requirements").split()[0] in ("ok", "warn")
    lora = line_of(out, "lora")
    assert lora.startswith("ok    ") and "forward+backward" in lora and "LoRA tensors got gradients" in lora
    cuda = line_of(out, "cuda")
    if CPU_ONLY:
        # The CPU build says so; a CUDA build of torch (PyPI's default wheel) on a machine without a
        # driver names the CUDA it was built for and the missing driver.
        assert cuda.startswith("warn  ") and "no NVIDIA driver" in cuda, cuda
        assert "no CUDA: CPU build of torch" in cuda or re.search(r"is built for CUDA \d", cuda), cuda
        assert " \u2014 " in cuda  # with what to do
    summary = out.splitlines()[-1]
    assert summary.startswith("doctor: ") and " 0 fail " in summary and "journal: " in summary
    # the journal, as a real job's
    journals = sorted((tmp_path / "j").glob("doctor-*.otel.jsonl"))
    assert len(journals) == 1
    j = read_journal(journals[0])
    assert not j.problems and j.exit is not None and j.exit["code"] == 0
    names = [s.name for s in j.spans]
    for m in ("torch", "transformers", "accelerate", "peft"):
        assert "import " + m in names
    assert "cuda probe" in names and "lora forward+backward" in names
    assert not any(s.is_open for s in j.spans)
    assert j.root is not None and j.root.attrs.get("service.name") == "lora-otel-doctor"
    assert "import runpy" not in names and not any(n.startswith("import lora_otel") for n in names)


@pytest.mark.slow
@needs_stack
def test_json_report_and_need_gpu_memory(tmp_path: Path) -> None:
    """--json is the documented object; --need-gpu-memory 16G on a machine without a GPU fails, says so."""
    r = run_doctor(tmp_path, "--json", "--need-gpu-memory", "16G")
    report = json.loads(r.stdout)
    assert set(report) >= {
        "status",
        "exit_code",
        "counts",
        "duration_s",
        "journal",
        "log",
        "pid",
        "checks",
        "not_installed",
        "need_gpu_memory",
        "timeouts_s",
        "python",
        "lora_otel_version",
    }
    for c in report["checks"]:
        assert set(c) == {"name", "status", "evidence", "advice", "duration_s", "details"}
        assert c["status"] in ("ok", "warn", "fail")
    assert report["need_gpu_memory"] == 16 * 2**30
    checks = by_name(report)
    assert checks["import torch"]["status"] == "ok" and checks["import torch"]["details"]["version"]
    assert checks["lora"]["status"] == "ok"
    if CPU_ONLY:
        mem = checks["gpu memory"]
        assert mem["status"] == "fail" and mem["evidence"].startswith("no GPU: need 16 GiB free GPU memory"), mem
        assert r.returncode == 1 and report["exit_code"] == 1 and report["status"] == "fail"
    assert report["exit_code"] == r.returncode
    assert report["counts"]["fail"] == sum(1 for c in report["checks"] if c["status"] == "fail")
    assert os.path.exists(report["journal"])


def make_package(root: Path, name: str, code: str) -> None:
    (root / name).mkdir(parents=True)
    (root / name / "__init__.py").write_text(code)


@pytest.mark.slow
@needs_stack
def test_broken_missing_and_hanging_modules(tmp_path: Path) -> None:
    """--also-import: a module that raises fails with its error; a missing one says not installed;
    one that hangs fails after its limit with the stack showing the sleeping line, the check process
    killed and nothing left behind; exit status 1."""
    pkgs = tmp_path / "pkgs"
    make_package(pkgs, "brokenpkg", "import os\nraise ImportError('brokenpkg cannot load libfoo.so')\n")
    make_package(pkgs, "hangpkg", "import time\n\ntime.sleep(600)\n")
    r = run_doctor(
        tmp_path,
        "--json",
        "--also-import",
        "brokenpkg",
        "--also-import",
        "nosuchmod_doctor_test",
        "--also-import",
        "hangpkg",
        "--import-timeout",
        "hangpkg=2",
        PYTHONPATH=str(pkgs),
    )
    assert r.returncode == 1, r.stdout + r.stderr
    report = json.loads(r.stdout)
    checks = by_name(report)
    broken = checks["import brokenpkg"]
    assert broken["status"] == "fail"
    assert "ImportError: brokenpkg cannot load libfoo.so" in broken["evidence"]
    assert "brokenpkg/__init__.py:2" in broken["evidence"] and "reinstall brokenpkg" in broken["advice"]
    missing = checks["import nosuchmod_doctor_test"]
    assert missing["status"] == "fail" and "ModuleNotFoundError" in missing["evidence"]
    assert missing["advice"].startswith("not installed")
    hang = checks["import hangpkg"]
    assert hang["status"] == "fail" and hang["evidence"].startswith("hung: no result after")
    assert "(limit 2 s)" in hang["evidence"]
    assert "stuck at hangpkg/__init__.py:3 in <module>: time.sleep(600)" in hang["evidence"], hang["evidence"]
    assert hang["details"]["stack"][0]["source"] == "time.sleep(600)"
    assert "hangpkg/__init__.py" in hang["details"]["stacks"]  # the whole faulthandler dump
    assert hang["details"]["killed"] is True
    pid = hang["details"]["pid"]
    assert not os.path.exists("/proc/%d" % pid), "the check process is still there"
    assert 2 <= hang["duration_s"] < 30
    assert checks["not run"]["status"] == "warn" and "lora" in checks["not run"]["evidence"]
    # the text form of the same report: one line per check, the stack below the hang
    text = doctor.render_text(report)
    assert line_of(text, "import hangpkg").startswith("fail  ")
    assert "        hangpkg/__init__.py:3 in <module>: time.sleep(600)" in text
    # the journal: the import still open, the kill recorded
    j = read_journal(report["journal"])
    open_spans = [s.name for s in j.spans if s.is_open]
    assert "import hangpkg" in open_spans
    assert j.exit is not None and j.exit["how"] == "signal" and "lora-otel doctor" in j.exit["message"]
    assert next(s for s in j.spans if s.name == "import brokenpkg").status == "error"


@pytest.mark.slow
@pytest.mark.collector
@needs_stack
def test_exported_live_when_an_endpoint_is_set(tmp_path: Path, collector) -> None:
    """With OTEL_EXPORTER_OTLP_ENDPOINT the check process exports like a real job (its sidecar)."""
    r = run_doctor(tmp_path, OTEL_EXPORTER_OTLP_ENDPOINT=collector.http_endpoint)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "exported live to %s" % collector.http_endpoint in line_of(r.stdout, "journal")
    from procs import wait_for

    spans = wait_for(
        lambda: [s for s in collector.spans() if s.name == "process"] and collector.spans(),
        what="the doctor's spans",
        timeout=20,
    )
    names = {s.name for s in spans}
    assert {"import torch", "import peft", "lora forward+backward"} <= names
    assert {s.resource.get("service.name") for s in spans} == {"lora-otel-doctor"}


@pytest.mark.slow
def test_usage_errors_exit_2(tmp_path: Path) -> None:
    for bad in (
        ["--need-gpu-memory", "16x"],
        ["--import-timeout", "0"],
        ["--import-timeout", "a-b=3"],
        ["--also-import", "not a module"],
        ["--gpu-timeout", "soon"],
    ):
        r = run_doctor(tmp_path, *bad, timeout=60)
        assert r.returncode == 2, (bad, r.stdout, r.stderr)
        assert "lora-otel doctor: error:" in r.stderr and not r.stdout
    assert not (tmp_path / "j").exists()  # nothing started
    r = subprocess.run(
        [PYTHON, "-m", "lora_otel", "doctor", "--help"], env=clean_env(), capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0 and "examples:" in r.stdout and "--need-gpu-memory 40G" in r.stdout


# --- the pure parts ------------------------------------------------------------------------------


def test_parse_size() -> None:
    assert parse_size("16G") == parse_size("16GiB") == parse_size("16Gi") == parse_size("16 gib") == 16 * 2**30
    assert parse_size("16GB") == 16 * 10**9
    assert parse_size("512M") == 512 * 2**20 and parse_size("512MB") == 512 * 10**6
    assert parse_size("1.5T") == int(1.5 * 2**40) and parse_size("1000") == 1000 and parse_size("2K") == 2048
    for bad in ("", "G", "16X", "16 GG", "-1G", "16iB", "sixteen"):
        with pytest.raises(ValueError):
            parse_size(bad)
    assert format_bytes(16 * 2**30) == "16 GiB" and format_bytes(1.5 * 2**30) == "1.5 GiB"
    assert format_bytes(150323855360) == "140 GiB" and format_bytes(512) == "512 B"


def cuda(build: str | None, driver: str | None, driver_cuda: str | None = None, gpus: int = 8) -> Check:
    b = {"torch.version": "2.6.0" + ("+cu%s" % build.replace(".", "") if build else "+cpu"), "torch.cuda_build": build}
    d = {"nvidia.driver_version": driver, "nvidia.gpu_count": gpus} if driver else {}
    c = check_cuda_build(b, d, driver_cuda)
    assert c is not None
    return c


def test_cuda_build_against_the_driver() -> None:
    c = cuda(None, None)
    assert c.status == "warn" and c.evidence.startswith("no CUDA: CPU build of torch (2.6.0+cpu); no NVIDIA driver")
    c = cuda(None, "550.54.14")
    assert c.status == "fail" and "CPU build" in c.evidence and "550.54.14" in c.evidence
    c = cuda("12.4", None)
    assert c.status == "warn" and "built for CUDA 12.4" in c.evidence and "no NVIDIA driver" in c.evidence
    assert cuda("12.4", "570.86.10", "12.8").status == "ok"
    assert cuda("12.4", "550.54.14", "12.4").status == "ok"
    c = cuda("12.8", "535.104.05", "12.2")
    assert c.status == "warn" and "minor version compatibility" in c.evidence and "570.26" in c.advice
    c = cuda("12.1", "470.182.03", "11.4")
    assert c.status == "fail" and "too old" in c.evidence
    # without libcuda: the table
    assert cuda("12.4", "550.54.14").status == "ok"
    assert cuda("12.4", "535.54.03").status == "warn"
    assert cuda("13.1", "600.1").status == "ok"  # newer than the table knows: not flagged
    assert check_cuda_build({"torch.version": None}, {}, None) is None
    assert max_cuda_for_driver("535.104.05") == (12, 2) and max_cuda_for_driver("390.1") is None
    assert max_cuda_for_driver("garbage") is None


def test_fallback_specifiers_and_markers_agree_with_packaging() -> None:
    pk = pytest.importorskip("packaging.specifiers")
    from packaging.version import Version

    versions = [
        "1.0",
        "1.0.0",
        "1.0.post1",
        "1.0a1",
        "1.0rc2",
        "1.0.dev3",
        "1.0a1.dev2",
        "1.1",
        "2.0",
        "2.0rc1",
        "0.9",
        "1.0+local",
        "1.0.post1.dev1",
        "1!0.5",
        "1.0.1",
        "1.4.5",
        "1.5",
        "1.9",
        "2.13.0+cpu",
        "0.23.3",
        "4.46.0.dev0",
    ]
    specs = [
        ">1.0",
        ">=1.0",
        "<1.0",
        "<=1.0",
        "==1.0",
        "!=1.0",
        "~=1.0",
        "~=1.4",
        "~=1.4.2",
        "==1.*",
        "!=1.0.*",
        "<2",
        ">1.0.post1",
        "<1.0rc3",
        ">1.0a1",
        "==1.0+local",
        "!=1.0+local",
        "<=2.0rc1",
        ">=1.0.dev0",
        "==2.13.0",
        ">0.9,<1.1",
        "<0.23,>=0.22",
        "<=4.46",
        ">=2.0",
    ]
    for spec in specs:
        for version in versions:
            want = pk.SpecifierSet(spec).contains(Version(version), prereleases=True)
            assert packages._fallback_contains(spec, version) == want, (spec, version)
    env = packages._marker_env()
    from packaging.markers import Marker

    for marker in [
        'python_version >= "3.9"',
        'python_version < "3.8"',
        'sys_platform == "linux" and platform_machine == "x86_64"',
        '(os_name == "nt" or python_version > "3") and extra == ""',
        'extra == "torch"',
        'platform_system != "Darwin"',
        '"linux" in sys_platform',
    ]:
        assert packages._fallback_marker(marker, env) == Marker(marker).evaluate({"extra": ""}), marker


def test_requirement_checks_with_and_without_packaging(monkeypatch) -> None:
    """The fallback parser reaches the same verdicts on the installed packages as packaging."""
    dists = packages.checked_distributions()
    with_pk = [(c.status, c.evidence) for c in packages.check_requirements(dists)]
    monkeypatch.setattr(packages, "_USE_PACKAGING", False)
    without = [(c.status, c.evidence) for c in packages.check_requirements(dists)]
    assert with_pk == without


class FakeDist:
    def __init__(self, version: str, requires_python: str | None = None, requires: list | None = None) -> None:
        self.version = version
        self.metadata = {"Requires-Python": requires_python} if requires_python else {}
        self.requires = requires or []


def test_python_and_requirement_verdicts(monkeypatch) -> None:
    fakes = {
        "lora_otel": FakeDist("0.1.0", ">=3.9"),
        "newpkg": FakeDist("2.0", ">=4.0", ["dep>=2", "gone>=1", "win; sys_platform == 'win32'", "opt; extra == 'x'"]),
        "dep": FakeDist("1.5"),
    }
    monkeypatch.setattr(packages, "_dist", lambda name: fakes.get(name))
    checks = packages.check_python(["lora_otel", "newpkg"])
    assert [c.status for c in checks] == ["fail"]
    assert "outside newpkg 2.0's Requires-Python >=4.0" in checks[0].evidence
    ok = packages.check_python(["lora_otel"])
    assert ok[0].status == "ok" and "lora_otel (>=3.9)" in ok[0].evidence
    reqs = packages.check_requirements(["newpkg"])
    verdicts = {(c.status, c.evidence) for c in reqs}
    assert ("warn", "newpkg 2.0 requires dep>=2, but dep 1.5 is installed") in verdicts
    assert ("fail", "newpkg 2.0 requires gone>=1, which is not installed") in verdicts
    assert len(reqs) == 2  # the win32 and extra-only requirements do not apply


DUMP = """Thread 0x00007f0000000002 (most recent call first):
  File "/x/site-packages/lora_otel/_boot/preamble.py", line 400 in _beat_loop

Current thread 0x00007f0000000001 (most recent call first):
  File "{pkg}", line 3 in <module>
  File "<frozen importlib._bootstrap>", line 241 in _call_with_frames_removed
  File "/x/site-packages/lora_otel/_boot/hooks.py", line 106 in traced_import
  File "/x/site-packages/lora_otel/cli/doctor/child.py", line 1650 in _child_import
  File "/x/site-packages/lora_otel/cli/doctor/child.py", line 1590 in _child_main
  File "<string>", line 1 in <module>
"""


def test_stack_excerpt(tmp_path: Path) -> None:
    pkg = tmp_path / "hangpkg" / "__init__.py"
    pkg.parent.mkdir()
    pkg.write_text("import time\n\ntime.sleep(600)\n")
    excerpt = doctor.stack_excerpt(DUMP.format(pkg=pkg))
    assert excerpt == [(str(pkg), 3, "<module>", "time.sleep(600)")]
    assert doctor.stack_excerpt("") == []


def test_render_text_one_line_per_check() -> None:
    report = {
        "checks": [
            Check("import torch", "ok", "2.6.0 in 1.1 s", duration_s=1.1).to_dict(),
            Check("cuda", "warn", "no CUDA", "get a GPU").to_dict(),
        ],
        "not_installed": ["xformers"],
        "counts": {"ok": 1, "warn": 1, "fail": 0},
        "duration_s": 2.0,
        "journal": None,
    }
    lines = doctor.render_text(report).splitlines()
    assert lines[0] == "ok    import torch          2.6.0 in 1.1 s"
    assert lines[1] == "warn  cuda                  no CUDA \u2014 get a GPU"
    assert lines[2] == "not installed (not checked): xformers"
    assert lines[3] == "doctor: 1 ok, 1 warn, 0 fail in 2 s; journal: none"


def test_import_timeouts_per_module() -> None:
    limits = dict(doctor.DEFAULT_TIMEOUTS)
    assert follow._timeout_for("import hangpkg", "import", limits, {"hangpkg": 2.0}) == 2.0
    assert follow._timeout_for("import hangpkg.sub", "import", limits, {"hangpkg": 2.0}) == 2.0
    assert follow._timeout_for("import torch", "import", limits, {"hangpkg": 2.0}) == 120.0
    assert follow._timeout_for("gpu 0", "gpu", limits, {}) == 60.0
    assert doctor._import_timeout("300") == (None, 300.0)
    assert doctor._import_timeout("bitsandbytes=600") == ("bitsandbytes", 600.0)


def gpu_run(free0: int, free1: int) -> follow._Run:
    """A check process that saw two working GPUs (as on a GPU machine; none is lent to these tests)."""
    run = follow._Run()
    run.results["cuda probe"] = {"status": "ok", "available": True, "duration_s": 0.2}
    run.results["cuda init"] = {
        "status": "ok",
        "device_count": 2,
        "device_names": ["NVIDIA H200", "NVIDIA H200"],
        "duration_s": 1.5,
    }
    for i, free in enumerate((free0, free1)):
        run.results["gpu %d" % i] = {
            "status": "ok",
            "index": i,
            "device_name": "NVIDIA H200",
            "capability": "9.0",
            "free": free,
            "total": 150 * 10**9,
            "matmul_s": 0.01,
            "max_rel_error": 1e-6,
            "arch_list": ["sm_80", "sm_90"],
            "arch_ok": True,
            "duration_s": 0.3,
        }
    return run


def test_gpu_verdicts_from_the_check_process() -> None:
    static = cuda("12.4", "550.54.14", "12.8", gpus=2)
    checks = {c.name: c for c in doctor_cuda._cuda_runtime_checks(gpu_run(140 * 2**30, 10 * 2**30), static, 16 * 2**30)}
    assert checks["cuda"].status == "ok" and checks["cuda init"].status == "ok"
    assert checks["cuda init"].evidence.startswith("2 devices: NVIDIA H200, NVIDIA H200")
    assert checks["gpu 0"].status == "ok" and "1024x1024 matmul and read back" in checks["gpu 0"].evidence
    assert "140 GiB free of 140 GiB" in checks["gpu 0"].evidence
    mem = checks["gpu memory"]
    assert mem.status == "fail" and "gpu 1 has 10 GiB free" in mem.evidence and "gpu 0" not in mem.evidence
    checks = {c.name: c for c in doctor_cuda._cuda_runtime_checks(gpu_run(140 * 2**30, 20 * 2**30), static, 16 * 2**30)}
    assert checks["gpu memory"].status == "ok" and "the least: gpu 1 with 20 GiB free" in checks["gpu memory"].evidence
    # a CUDA build with a driver, but the probe says no: fail with the reason
    run = follow._Run()
    run.results["cuda probe"] = {
        "status": "ok",
        "available": False,
        "reason": "no visible device (CUDA_VISIBLE_DEVICES='')",
        "duration_s": 0.1,
    }
    checks = {c.name: c for c in doctor_cuda._cuda_runtime_checks(run, cuda("12.4", "550.54.14", "12.4"), None)}
    assert checks["cuda"].status == "fail" and "CUDA_VISIBLE_DEVICES=''" in checks["cuda"].evidence
    # a matmul that went wrong
    run = gpu_run(1, 1)
    run.results["gpu 1"].update(status="error", error="RuntimeError: CUDA error: an illegal memory access")
    checks = {c.name: c for c in doctor_cuda._cuda_runtime_checks(run, static, None)}
    assert checks["gpu 1"].status == "fail" and "illegal memory access" in checks["gpu 1"].evidence


def test_arch_supported() -> None:
    assert doctor.arch_supported((9, 0), ["sm_80", "sm_90"])
    assert doctor.arch_supported((8, 6), ["sm_80"])  # same major, lower minor
    assert not doctor.arch_supported((12, 0), ["sm_80", "sm_90"])
    assert doctor.arch_supported((12, 0), ["sm_90", "compute_90"])  # PTX, compiled at first use
    assert not doctor.arch_supported((9, 1), ["sm_90a"]) and doctor.arch_supported((9, 0), ["sm_90a"])
    assert doctor.arch_supported((10, 0), ["sm_100"]) and not doctor.arch_supported((7, 5), ["sm_80"])


@pytest.mark.slow
@pytest.mark.parametrize("signame", ["SIGTERM", "SIGKILL"])
def test_no_check_process_outlives_the_doctor(tmp_path: Path, signame: str) -> None:
    """The doctor killed while its check process hangs (here in sitecustomize, at start-up): SIGTERM
    unwinds through the cleanup, SIGKILL is answered by the kernel (PR_SET_PDEATHSIG)."""
    import signal
    import time

    from procs import wait_for

    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "import os, time\nif os.environ.get('LORA_OTEL_DOCTOR_FD'):\n    time.sleep(600)\n"
    )
    parent = subprocess.Popen(
        [PYTHON, "-m", "lora_otel", "doctor", "--dir", str(tmp_path / "j")],
        cwd=tmp_path,
        env=clean_env(PYTHONPATH=str(site)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        journal = wait_for(lambda: sorted((tmp_path / "j").glob("doctor-*.otel.jsonl")), what="the journal")[0]
        child = wait_for(lambda: read_journal(journal).pid, what="the check process's pid")
        time.sleep(0.3)
        assert os.path.exists("/proc/%d" % child)
        parent.send_signal(getattr(signal, signame))
        parent.communicate(timeout=30)
    finally:
        if parent.poll() is None:
            parent.kill()
    assert parent.returncode in (-signal.SIGKILL, 128 + signal.SIGTERM), parent.returncode

    def gone() -> bool:
        try:
            with open("/proc/%d/stat" % child) as f:
                return f.read().rpartition(")")[2].split()[0] in ("Z", "X")
        except OSError:
            return True

    wait_for(gone, timeout=10, what="the check process to be gone")
    # Nor its sidecar: it runs the user's sitecustomize too, and must not get the check's pipe
    # variable (before: this one slept there for 600 s after the doctor had gone).
    sidecar = read_journal(journal).root.attrs.get("lora_otel.sidecar.pid")
    if isinstance(sidecar, int):

        def sidecar_gone() -> bool:
            try:
                with open("/proc/%d/stat" % sidecar) as f:
                    return f.read().rpartition(")")[2].split()[0] in ("Z", "X")
            except OSError:
                return True

        wait_for(sidecar_gone, timeout=60, what="the check's sidecar to be gone")
