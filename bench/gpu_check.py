"""The device check for a machine with an NVIDIA GPU, in one run of under 5 minutes.

    python bench/gpu_check.py [--out DIR]      # exits 0 when every check passes

lora_otel must be importable (PYTHONPATH=<checkout>) and its ``.pth`` hook in the interpreter's
site-packages, as an install puts it; ``nvidia-ml-py`` (pynvml) gives the watchdog its NVML facts.
Four cases, each a real traced process on the GPU, each printing what a user would read (the job's
lines, the stall record, ``lora-otel inspect``) and one PASS/FAIL line per fact:

1. ``cuda init``: a job that puts a tensor on the GPU: the span is ok and holds torch/CUDA/cuDNN
   versions, the driver version, device count, names, capabilities, total and free memory (the
   free memory read from NVML through ctypes), the visible devices.
2. ``CUDA_VISIBLE_DEVICES`` naming a device that does not exist: the job fails as it does without
   lora_otel (same exit code), and its ``cuda init`` span is an error naming torch's message.
3. A GPU kernel that never ends (``torch.cuda._sleep``, a spin kernel) awaited by
   ``torch.cuda.synchronize()`` after 30 optimizer steps: a ``training`` stall, the main thread's
   stack in ``synchronize``, and the watchdog's NVML facts (utilisation, the process's GPU memory).
4. Two NCCL ranks under torchrun on the one GPU: rank 1 sleeps before its first collective, rank 0
   waits in ``all_reduce``: rank 0's stall diagnosis and ``inspect DIR`` name rank 1 as never
   arrived. (Two ranks cannot share one GPU in an NCCL communicator; rank 1 never joins one.)

``--cpu`` runs the same harness with no GPU (the CUDA facts then fail; the hangs are plain
sleeps and gloo), to check the script itself on a machine without one. Not run by CI (no GPU).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Optional

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from lora_otel.journal.reader import journal_paths, read_journal  # noqa: E402

CUDA_FACTS = [
    "lora_otel.torch.version",
    "lora_otel.cuda.version",
    "lora_otel.cudnn.version",
    "lora_otel.nvidia.driver_version",
    "lora_otel.cuda.device_count",
    "lora_otel.cuda.device_names",
    "lora_otel.cuda.capabilities",
    "lora_otel.cuda.total_memory_bytes",
    "lora_otel.cuda.free_memory_bytes",
    "lora_otel.cuda.visible_devices",
]
RESULTS: list[tuple[str, bool, str]] = []


def check(name: str, ok: bool, detail: Any = "") -> None:
    RESULTS.append((name, bool(ok), str(detail)))
    print("%s  %s  %s" % ("PASS" if ok else "FAIL", name, str(detail)[:400]), flush=True)


def env(**extra: str) -> dict[str, str]:
    e = {k: v for k, v in os.environ.items() if not k.startswith(("LORA_OTEL", "OTEL_"))}
    e.update(PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])), PYTHONUNBUFFERED="1")
    e.update(extra)
    return e


def wait_for(what: str, fn: Callable[[], Any], timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            got = fn()
        except Exception:
            got = None
        if got:
            return got
        time.sleep(0.5)
    print("  (gave up waiting for %s after %.0f s)" % (what, timeout), flush=True)
    return None


def kill_group(proc: subprocess.Popen[bytes], pids: list[int] = ()) -> None:  # type: ignore[assignment]
    for pid in [proc.pid, *pids]:
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        pass


def show(title: str, text: str, last: int = 40) -> None:
    lines = text.splitlines()[-last:]
    print("---- %s (last %d lines)\n%s\n----" % (title, len(lines), "\n".join(lines)), flush=True)


def inspect(path: Path) -> str:
    r = subprocess.run(
        [sys.executable, "-m", "lora_otel", "inspect", str(path)],
        env=env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    return r.stdout + r.stderr


def case_cuda_init(work: Path, cpu: bool) -> None:
    d = work / "init"
    d.mkdir()
    (d / "job.py").write_text(
        "import torch\nx = torch.zeros(1024, device='cuda')\nprint('OK', x.device, float((x + 1).sum()))\n"
    )
    r = subprocess.run(
        [sys.executable, "-m", "lora_otel", "job.py"],
        cwd=d,
        env=env(LORA_OTEL_JOURNAL=str(d / "job.otel.jsonl")),
        capture_output=True,
        text=True,
        timeout=180,
    )
    show("1. the job's output", r.stdout + r.stderr, 25)
    check("1 job exits 0", r.returncode == 0, "rc=%s" % r.returncode)
    j = read_journal(d / "job.otel.jsonl")
    spans = {s.name: s for s in j.spans}
    for name in ("cuda probe", "cuda init"):
        s = spans.get(name)
        if s is not None:
            ms = (s.end_ns - s.start_ns) / 1e6 if s.end_ns else None
            print(name, json.dumps({"status": s.status, "ms": ms, "attrs": s.attrs}, indent=1, default=str))
    init = spans.get("cuda init")
    check("1 cuda init span ok", init is not None and init.status == "ok", None if init is None else init.status)
    missing = [k for k in CUDA_FACTS if init is None or init.attrs.get(k) in (None, "", [])]
    check("1 cuda init has every fact", not missing, "missing %s" % missing if missing else "")
    if init is not None:
        free, total = (
            init.attrs.get("lora_otel.cuda.free_memory_bytes"),
            init.attrs.get("lora_otel.cuda.total_memory_bytes"),
        )
        check("1 0 < free <= total memory (NVML)", _le(free, total), "free %s total %s" % (free, total))
    show("1. inspect", inspect(d / "job.otel.jsonl"), 30)


def _le(a: Any, b: Any) -> bool:
    try:
        a = a[0] if isinstance(a, list) else a
        b = b[0] if isinstance(b, list) else b
        return 0 < int(a) <= int(b)
    except (TypeError, ValueError, IndexError):
        return False


def case_bad_device(work: Path, cpu: bool) -> None:
    d = work / "baddev"
    d.mkdir()
    (d / "job.py").write_text("import torch\nx = torch.zeros(1, device='cuda')\nprint('never', x)\n")
    rcs = {}
    for traced in (False, True):
        extra = {"CUDA_VISIBLE_DEVICES": "7"}
        if traced:
            extra.update(LORA_OTEL="1", LORA_OTEL_JOURNAL=str(d / "job.otel.jsonl"))
        r = subprocess.run(
            [sys.executable, "job.py"], cwd=d, env=env(**extra), capture_output=True, text=True, timeout=180
        )
        rcs[traced] = r.returncode
        show("2. CUDA_VISIBLE_DEVICES=7, %s" % ("LORA_OTEL=1" if traced else "untraced"), r.stdout + r.stderr, 12)
    check("2 same exit code traced and not", rcs[True] == rcs[False] and rcs[True] != 0, rcs)
    j = read_journal(d / "job.otel.jsonl")
    init = next((s for s in j.spans if s.name == "cuda init"), None)
    check(
        "2 cuda init span is an error",
        init is not None and init.status == "error",
        None if init is None else (init.status, init.status_message if hasattr(init, "status_message") else init.attrs),
    )
    show("2. inspect", inspect(d / "job.otel.jsonl"), 20)


TRAIN_GPU_HANG = """\
import sys, time, torch
dev = "cpu" if "--cpu" in sys.argv else "cuda"
model = torch.nn.Linear(256, 256).to(dev)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(30):
    model(torch.randn(64, 256, device=dev)).square().mean().backward()
    opt.step()
    opt.zero_grad()
    time.sleep(0.02)
print("30 steps done; launching a kernel that never ends", flush=True)
if dev == "cuda":
    torch.cuda._sleep(1 << 50)  # a spin kernel of ~2**50 cycles: days
    torch.cuda.synchronize()
else:
    time.sleep(600)
"""


def case_kernel_hang(work: Path, cpu: bool) -> None:
    d = work / "kernel"
    d.mkdir()
    (d / "train.py").write_text(TRAIN_GPU_HANG)
    with open(d / "out.txt", "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "train.py", "--log", "run.log"] + (["--cpu"] if cpu else []),
            cwd=d,
            env=env(LORA_OTEL="1", LORA_OTEL_STALL_AFTER="training=5"),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    jpath = d / "run.log.otel.jsonl"
    try:
        stalls = wait_for("the training stall record", lambda: read_journal(jpath).stalls, 120)
        wait_for("the why line", lambda: "is stalled: " in (d / "run.log").read_text(errors="replace"), 30)
        show("3. the job's --log", (d / "run.log").read_text(errors="replace"), 30)
        check("3 a stall record", bool(stalls))
        if stalls:
            rec = stalls[0]
            print(json.dumps(rec, indent=1, default=str)[:6000])
            ev = rec.get("evidence") or {}
            stacks = json.dumps(ev) + (d / "run.log").read_text(errors="replace")
            check("3 the stall is in training", rec.get("stage") == "training", rec.get("stage"))
            check("3 the stack is in synchronize", "synchronize" in stacks, rec.get("diagnosis"))
            util = {k: v for k, v in ev.items() if "gpu." in k}
            check("3 NVML utilisation in the evidence", any(k.endswith("utilization_percent") for k in util), util)
            mem = [v for k, v in util.items() if k.endswith("process_memory_bytes")]
            check("3 NVML: the process's GPU memory > 0", any(isinstance(v, int) and v > 0 for v in mem), mem)
            check("3 a diagnosis", bool(rec.get("diagnosis")), rec.get("diagnosis"))
        show("3. inspect", inspect(jpath), 30)
    finally:
        kill_group(proc)


TRAIN_NCCL = """\
import datetime, sys, time, torch
import torch.distributed as dist
cpu = "--cpu" in sys.argv
dist.init_process_group("gloo" if cpu else "nccl", timeout=datetime.timedelta(seconds=300))
rank = dist.get_rank()
dev = "cpu" if cpu else "cuda:0"
model = torch.nn.Linear(64, 64).to(dev)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(20):
    model(torch.randn(8, 64, device=dev)).sum().backward()
    opt.step()
    opt.zero_grad()
    time.sleep(0.02)
if rank == 1:
    print("rank 1 sleeps before its first collective", flush=True)
    time.sleep(600)
print("rank 0 enters all_reduce", flush=True)
t = torch.ones(4, device=dev)
dist.all_reduce(t)
print("rank 0 all_reduce returned", float(t.sum().item()), flush=True)
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def case_nccl(work: Path, cpu: bool) -> None:
    d = work / "nccl"
    d.mkdir()
    (d / "train.py").write_text(TRAIN_NCCL)
    where = d / "journals"
    argv = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", str(_free_port())]
    with open(d / "out.txt", "wb") as out:
        proc = subprocess.Popen(
            argv + ["train.py"] + (["--cpu"] if cpu else []),
            cwd=d,
            env=env(LORA_OTEL="1", LORA_OTEL_DIR=str(where), LORA_OTEL_STALL_AFTER="training=5", OMP_NUM_THREADS="1"),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def ranks() -> dict[int, Any]:
        out = {}
        for p in journal_paths(str(where)):
            j = read_journal(p)
            if j.root is not None and isinstance(j.root.attrs.get("rank"), int):
                out[j.root.attrs["rank"]] = j
        return out

    pids: list[int] = []
    try:
        got = wait_for("both ranks' journals", lambda: len(ranks()) == 2 and ranks(), 120) or {}
        pids = [j.pid for j in got.values()]

        def rank0_named() -> Optional[dict[str, Any]]:
            for rec in ranks()[0].stalls:
                if "rank 1" in str(rec.get("diagnosis")):
                    return rec
            return None

        rec = wait_for("rank 0's stall naming rank 1", rank0_named, 150)
        show("4. torchrun's output", (d / "out.txt").read_text(errors="replace"), 40)
        r0 = ranks().get(0)
        print(
            "rank 0 stalls:",
            json.dumps(
                [{k: s.get(k) for k in ("kind", "stage", "diagnosis")} for s in (r0.stalls if r0 else [])], indent=1
            ),
        )
        check(
            "4 rank 0's diagnosis names rank 1 never arriving",
            rec is not None and "never arrived" in str(rec.get("diagnosis")),
            None if rec is None else rec.get("diagnosis"),
        )
        check("4 it says all_reduce", rec is not None and "all_reduce" in str(rec.get("diagnosis")))
        text = inspect(where)
        show("4. inspect DIR", text, 40)
        check("4 inspect DIR names rank 1", "rank 1" in text, "")
    finally:
        kill_group(proc, pids)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", help="also copy the work folder (journals, logs) here as gpu_check.tgz")
    parser.add_argument("--cpu", action="store_true", help="no GPU: check the harness itself (CUDA facts then fail)")
    parser.add_argument("--only", help="comma-separated case numbers (1-4)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="lora-otel-gpu-"))
    print("python %s, work folder %s" % (sys.version.split()[0], work), flush=True)
    try:
        smi = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.TimeoutExpired) as e:
        smi = "nvidia-smi: %s" % e
    print(smi, flush=True)
    cases = [case_cuda_init, case_bad_device, case_kernel_hang, case_nccl]
    only = {int(x) for x in args.only.split(",")} if args.only else {1, 2, 3, 4}
    for n, case in enumerate(cases, 1):
        if n not in only:
            continue
        started = time.monotonic()
        print("\n==== case %d: %s" % (n, case.__name__), flush=True)
        try:
            case(work, args.cpu)
        except Exception as e:
            check("%d ran" % n, False, "%s: %s" % (type(e).__name__, e))
        print("==== case %d took %.1f s" % (n, time.monotonic() - started), flush=True)
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        with tarfile.open(Path(args.out) / "gpu_check.tgz", "w:gz") as tar:
            tar.add(str(work), arcname="gpu_check")
    failed = [n for n, ok, _ in RESULTS if not ok]
    print("\n%d checks, %d failed%s" % (len(RESULTS), len(failed), (": " + "; ".join(failed)) if failed else ""))
    shutil.rmtree(work, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
