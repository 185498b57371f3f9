"""A wait in native code (issue 37 item 1): which library a worker waits in, and a thread pool that
its fork lost.

The table (`native.LIBRARIES`) and the reading of native frames are tested in milliseconds on
py-spy dumps as py-spy prints them; the rule over the recorded evidence of the real case
(``tests/data/evidence/pool_worker_openmp_after_fork.json``); and the real case itself (slow): a
``LORA_OTEL=1`` job whose parent ran torch matmuls on more than one OpenMP thread and then forked a
``multiprocessing.Pool`` worker that runs one too — the libgomp-after-fork hang (GCC bug 52303),
which hangs here with torch 2.13's CPU wheel (MKL's sgemm over libgomp).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from pathlib import Path
from typing import Any, Optional

import evidence_cases as cases
import pytest
from procs import journals, lora_otel_cli, run_traced, wait_for
from test_local_beat import launch_detached, messages, stop

from lora_otel.analysis import diagnose, native, pools
from lora_otel.analysis.diagnose import explain
from lora_otel.analysis.evidence import PREFIX, gather
from lora_otel.analysis.stall import Stall
from lora_otel.journal.reader import Journal, read_journal

EVIDENCE = Path(__file__).resolve().parent / "data" / "evidence"
CASE = EVIDENCE / "pool_worker_openmp_after_fork.json"

GOMP_AFTER_FORK = """Process 3409: /venv/bin/python job.py
Python v3.11.7 (/usr/bin/python3.11)

Thread 3409 (idle): "MainThread"
    0x7faac541e073 (libgomp.so.1)
    0x7faac541ca9d (libgomp.so.1)
    mkl_blas_sgemm_omp_driver_v1 (libtorch_cpu.so)
    mkl_blas_sgemm (libtorch_cpu.so)
    sgemm_ (libtorch_cpu.so)
    at::native::cpublas::gemm (libtorch_cpu.so)
    torch::autograd::TypeError_to_NotImplemented_<&torch::autograd::THPVariable_matmul(_object*)> (libtorch_python.so)
    task (/job/job.py:12)
    mapstar (/usr/lib/python3.11/multiprocessing/pool.py:48)
    0x7faac664524a (libc.so.6)
Thread 3410 (idle): "beat"
    clock_nanosleep (libc.so.6)
"""


def dump(*frames: str, name: str = "MainThread") -> str:
    return 'Thread 1 (idle): "%s"\n' % name + "".join("    %s\n" % f for f in frames)


# --- the table ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("symbol", "where", "library"),
    [
        ("0x7f00", "libgomp.so.1", "OpenMP"),
        ("gomp_team_barrier_wait_end", "libgomp-a34b3233.so.1", "OpenMP"),
        ("__kmp_suspend_64", "libiomp5.so", "OpenMP"),
        ("0x7f00", "libomp.so.5", "OpenMP"),
        ("mkl_blas_sgemm_omp_driver_v1", "libtorch_cpu.so", "MKL"),
        ("0x7f00", "libmkl_intel_thread.so.2", "MKL"),
        ("blas_thread_server", "libscipy_openblas64_-ff651d7f.so", "OpenBLAS"),
        ("0x7f00", "libopenblasp-r0-2c7e5bb2.3.27.so", "OpenBLAS"),
        ("ncclCommInitRank", "libtorch_cuda.so", "NCCL"),
        ("0x7f00", "libnccl.so.2", "NCCL"),
        ("0x7f00", "libcuda.so.1", "the CUDA driver"),
        ("0x7f00", "libcudart.so.12", "the CUDA runtime"),
        ("je_malloc_mutex_lock_slow", "libjemalloc.so.2", "the memory allocator (jemalloc)"),
        ("0x7f00", "libtcmalloc_minimal.so.4", "the memory allocator (tcmalloc)"),
        ("_dl_open", "ld-linux-x86-64.so.2", "the dynamic loader (dlopen)"),
        ("tbb::detail::r1::market::wait", "libtbb.so.12", "TBB"),
        ("at::native::cpublas::gemm", "libtorch_cpu.so", "torch"),
        ("cv::parallel_for_", "cv2.abi3.so", "OpenCV"),
        ("0x7f00", "libopencv_core.so.4.5", "OpenCV"),
    ],
)
def test_a_native_frame_is_named_by_its_library(symbol: str, where: str, library: str) -> None:
    found = native.library_of(symbol, where)
    assert found is not None and found.name == library


def test_an_unknown_object_and_the_c_library_are_no_library() -> None:
    assert native.library_of("foo", "_myext.cpython-311-x86_64-linux-gnu.so") is None
    assert native.library_of("pthread_cond_wait", "libc.so.6") is None


def test_the_dump_is_parsed_with_cxx_symbols_holding_parentheses() -> None:
    frames = native.main_thread_frames(GOMP_AFTER_FORK)
    assert frames[0] == ("0x7faac541e073", "libgomp.so.1")
    assert frames[6][1] == "libtorch_python.so" and frames[6][0].endswith("(_object*)>")
    assert frames[7] == ("task", "/job/job.py:12")


# --- where a thread waits -------------------------------------------------------------------------


def test_openmp_called_by_mkl_from_the_program() -> None:
    wait = native.native_wait(native.main_thread_frames(GOMP_AFTER_FORK))
    assert wait is not None and wait.library is not None and wait.library.name == "OpenMP"
    assert wait.caller is not None and wait.caller.name == "MKL"
    assert wait.phrase() == (
        "it waits in OpenMP (libgomp.so.1, called by MKL's mkl_blas_sgemm_omp_driver_v1), called from job.py:12 in task"
    )


def test_the_c_librarys_wait_is_the_kind_and_the_next_frame_the_library() -> None:
    frames = native.main_thread_frames(
        dump(
            "futex_wait (libc.so.6)",
            "__pthread_cond_wait (libc.so.6)",
            "tcmalloc::CentralFreeList::Populate (libtcmalloc.so.4)",
            "train (/job/train.py:3)",
        )
    )
    wait = native.native_wait(frames)
    assert wait is not None
    assert wait.phrase() == (
        "it waits in the memory allocator (tcmalloc) (tcmalloc::CentralFreeList::Populate, libtcmalloc.so.4) on a "
        "condition, called from train.py:3 in train"
    )


def test_an_extension_no_table_knows_is_named_by_its_file() -> None:
    frames = native.main_thread_frames(
        dump(
            "__lll_lock_wait (libc.so.6)",
            "___pthread_mutex_lock (libc.so.6)",
            "grab (_myext.cpython-311-x86_64-linux-gnu.so)",
            "_PyEval_EvalFrameDefault (libpython3.11.so.1.0)",
            "load (/job/data.py:9)",
        )
    )
    wait = native.native_wait(frames)
    assert wait is not None and wait.library is None
    assert wait.phrase() == (
        "it waits in native code (grab, _myext.cpython-311-x86_64-linux-gnu.so) on a lock, called from data.py:9 in "
        "load"
    )


def test_frames_read_with_debug_information() -> None:
    """Where the C library and CPython were built with debug information, py-spy shows their frames'
    source files (``…/nptl/pthread_cond_wait.c:503``, ``…/Modules/_ctypes/callproc.c:943``): they
    are still the C library's wait and the interpreter's call, not a library of their own."""
    frames = native.main_thread_frames(
        dump(
            "__futex_abstimed_wait_common (/build/glibc-x/nptl/futex-internal.c:57)",
            "___pthread_cond_wait (/build/glibc-x/nptl/pthread_cond_wait.c:618)",
            "0x7f00 (/opt/conda/lib/libopenblas.so.0)",
            "ffi_call (/usr/lib/x86_64-linux-gnu/libffi.so.8.1.2)",
            "_call_function_pointer (/tmp/python-build/Python-3.11.7/Modules/_ctypes/callproc.c:943)",
            "<module> (/job/job.py:16)",
        )
    )
    wait = native.native_wait(frames)
    assert wait is not None
    assert wait.phrase() == "it waits in OpenBLAS (libopenblas.so.0) on a condition, called from job.py:16 in <module>"
    # libgomp's own frames with their sources (a gdb backtrace in h2oai/h2o4gpu#830, as py-spy prints it)
    gomp = native.main_thread_frames(
        dump(
            "futex_wait (/work/.build/src/gcc/libgomp/config/linux/x86/futex.h:44)",
            "do_wait (/work/.build/src/gcc/libgomp/config/linux/wait.h:67)",
            "gomp_team_barrier_wait_end (/work/.build/src/gcc/libgomp/config/linux/bar.c:112)",
            "LGBM_BoosterUpdateOneIter (/opt/conda/lib/python3.7/site-packages/lightgbm/lib_lightgbm.so)",
            "update (/job/train.py:40)",
        )
    )
    wait = native.native_wait(gomp)
    assert wait is not None and wait.library is not None and wait.library.name == "OpenMP"
    assert wait.phrase() == (
        "it waits in OpenMP (gomp_team_barrier_wait_end, bar.c:112), called from train.py:40 in update"
    )
    python_lock = native.main_thread_frames(
        dump(
            "do_futex_wait (/build/glibc-x/nptl/sem_waitcommon.c:111)",
            "PyThread_acquire_lock_timed (/tmp/python-build/Python-3.11.7/Python/thread_pthread.h:483)",
            "run (/job/job.py:4)",
        )
    )
    assert native.native_wait(python_lock) is None


@pytest.mark.parametrize(
    "frames",
    [
        # a Python lock: the C library's wait, called by the interpreter itself
        ("do_futex_wait (libc.so.6)", "PyThread_acquire_lock_timed (python3.11)", "run (/job/job.py:4)"),
        # time.sleep: py-spy shows the Python frame in place of the call
        ("clock_nanosleep (libc.so.6)", "<module> (/job/job.py:2)"),
        # Python frames only (py-spy --nonblocking)
        ("<module> (/job/job.py:2)",),
    ],
)
def test_a_wait_of_pythons_own_names_no_library(frames: tuple[str, ...]) -> None:
    assert native.native_wait(native.main_thread_frames(dump(*frames))) is None


def test_known_objects_from_maps() -> None:
    maps = (
        "7f0-7f1 r-xp 00000000 fd:00 1 /venv/torch/lib/libgomp-a34b3233.so.1\n"
        "7f1-7f2 r--p 00000000 fd:00 1 /venv/torch/lib/libgomp-a34b3233.so.1\n"
        "7f2-7f3 r-xp 00000000 fd:00 2 /usr/lib/x86_64-linux-gnu/libc.so.6\n"
        "7f3-7f4 r-xp 00000000 fd:00 3 /venv/torch/lib/libtorch_cpu.so\n"
        "7f4-7f5 rw-p 00000000 00:00 0 [heap]\n"
    )
    assert native.known_objects(maps) == ["libgomp-a34b3233.so.1", "libtorch_cpu.so"]
    assert [lib.name for lib in native.loaded(native.known_objects(maps))] == ["OpenMP", "torch"]


# --- a worker's reading: the fork -----------------------------------------------------------------


class _Root:
    def __init__(self, attrs: dict[str, Any]) -> None:
        self.attrs = attrs


class _Journal:
    def __init__(self, attrs: dict[str, Any]) -> None:
        self.root = _Root(attrs)


FORKED = _Journal({"lora_otel.activation": "fork", "process.fork.parent_threads": 2})
SPAWNED = _Journal({"lora_otel.activation": "pth"})


def row(**extra: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "pid": 4711,
        "state": "S",
        "wchan": "futex_do_wait",
        "libraries": ["libgomp.so.1", "libtorch_cpu.so"],
        # its main thread's futex call made in libgomp; lora_otel's beat and a thread of torch's own in libc
        "syscalls": [[4711, "libgomp.so.1"], [4712, "libc.so.6"], [4715, "libc.so.6"]],
        "native": [list(f) for f in native.main_thread_frames(GOMP_AFTER_FORK)],
    }
    base.update(extra)
    return base


def test_a_forked_worker_in_its_parents_pool_gets_the_why_and_the_advice() -> None:
    found = native.worker_native(row(), FORKED)
    assert found is not None
    assert found.phrase == (
        "it waits in OpenMP (libgomp.so.1, called by MKL's mkl_blas_sgemm_omp_driver_v1), called from job.py:12 in "
        "task — OpenMP's thread pool, which its parent started before it forked this worker (the parent had 2 other "
        "threads then) and a forked child does not have (none of its 2 other threads is OpenMP's): the pool's threads "
        "it waits for do not exist here, so the wait never ends"
    )
    assert found.advice == (
        "Start the workers with the spawn start method — multiprocessing.set_start_method('spawn') before they "
        "start (or 'forkserver') — so that each worker starts OpenMP threads of its own; or keep the parent to one "
        "thread before it forks: OMP_NUM_THREADS=1 or MKL_NUM_THREADS=1 in its environment, or "
        "torch.set_num_threads(1)."
    )
    assert found.attrs["lora_otel.native.fork_unsafe"] is True
    loader = native.worker_native(row(), FORKED, dataloader=True)
    assert loader is not None and "DataLoader(..., multiprocessing_context='spawn')" in loader.advice


@pytest.mark.parametrize(
    ("journal", "extra"),
    [
        (SPAWNED, {}),  # not forked: its pool is its own
        (_Journal({"lora_otel.activation": "fork", "process.fork.parent_threads": 0}), {}),  # no pool at the fork
        # the worker has OpenMP threads of its own (waiting in libgomp): the pool is there
        (FORKED, {"syscalls": [[4711, "libgomp.so.1"], [4712, "libc.so.6"], [4713, "libgomp.so.1"]]}),
        (FORKED, {"syscalls": []}),  # its threads not read: whether the pool is there is not known
        (None, {}),  # no journal: whether it was forked is not known
    ],
)
def test_no_fork_story_without_its_evidence(journal: Optional[_Journal], extra: dict[str, Any]) -> None:
    found = native.worker_native(row(**extra), journal)
    assert found is not None and found.phrase.startswith("it waits in OpenMP (libgomp.so.1")
    assert "forked" not in found.phrase and found.advice == ""


def test_a_setting_that_is_a_call() -> None:
    """OpenCV's pool is kept to one thread by a call, not a variable."""
    frames = [["0x7f00", "libc.so.6"], ["cv::ParallelJob::execute", "cv2.abi3.so"], ["load", "/job/data.py:7"]]
    found = native.worker_native(
        row(native=frames, syscalls=[[4711, "libc.so.6"], [4712, "libc.so.6"]]), FORKED, dataloader=True
    )
    assert found is not None and found.phrase.startswith("it waits in OpenCV (cv::ParallelJob::execute, cv2.abi3.so)")
    assert found.advice.endswith("or keep the parent to one thread before it forks: cv2.setNumThreads(0).")


def test_without_native_frames_the_object_of_its_system_call() -> None:
    """No py-spy: the program counter of its main thread's system call is in libgomp — the wait,
    read without pausing it."""
    found = native.worker_native(row(native=None, native_error="py-spy is not installed"), FORKED)
    assert found is not None and "OMP_NUM_THREADS=1" in found.advice
    assert found.phrase.startswith(
        "it waits in OpenMP (libgomp.so.1) (its system call is made from there; no native frames: py-spy is not "
        "installed) — OpenMP's thread pool, which its parent started"
    )
    # a wait through the C library (pthread_cond_wait): its object names no library
    assert native.worker_native(row(native=None, syscalls=[[4711, "libc.so.6"]]), FORKED) is None
    assert native.worker_native({"pid": 1, "state": "S"}, FORKED) is None


def test_the_object_of_a_system_call() -> None:
    maps = (
        "7f1000-7f2000 r--p 00000000 fd:00 1 /venv/torch/lib/libgomp.so.1\n"
        "7f2000-7f3000 r-xp 00001000 fd:00 1 /venv/torch/lib/libgomp.so.1\n"
        "7f3000-7f4000 r-xp 00000000 fd:00 2 /usr/lib/x86_64-linux-gnu/libc.so.6\n"
    )
    ranges = native.executable_ranges(maps)
    assert native.syscall_object("202 0x55 0x80 0x0 0x0 0x0 0x0 0x7ffc68 0x7f2073", ranges) == "libgomp.so.1"
    assert native.syscall_object("202 0x55 0x80 0x0 0x0 0x0 0x0 0x7ffc68 0x7f3001", ranges) == "libc.so.6"
    assert native.syscall_object("202 0x55 0x80 0x0 0x0 0x0 0x0 0x7ffc68 0x7f1001", ranges) == ""  # not executable
    assert native.syscall_object("running", ranges) == "running"
    assert native.syscall_object("", ranges) == ""


# --- the rule over the recorded real case ---------------------------------------------------------


def _journals(case: dict[str, Any], tmp: Path) -> list[Journal]:
    """The recorded job's journal, then its children's (tests/evidence_cases.py)."""
    job, peers = cases.journals_of(case)
    assert job is not None
    return [job, *peers]


# The recorded cases themselves are explained in tests/test_rules_over_evidence.py.


# --- the real case --------------------------------------------------------------------------------

JOB_PY = """import argparse, os, sys, time
argparse.ArgumentParser().parse_known_args()
import torch
import multiprocessing

torch.set_num_threads(2)  # (OpenMP's pool: one thread besides the caller's, even on one core)
x = torch.randn(300, 300)
for _ in range(10):
    y = x @ x  # the parent's matmuls start OpenMP's thread pool


def task(i):
    a = torch.randn(300, 300)
    return float((a @ a).sum())  # a forked worker's matmul waits for the pool's threads


if __name__ == "__main__":
    multiprocessing.set_start_method("fork")
    with multiprocessing.Pool(1) as pool:
        print(pool.map(task, [1]), flush=True)
"""


def _top(tmp: Path) -> Optional[Journal]:
    for path in sorted((tmp / "lora-otel").glob("*.otel.jsonl")):
        try:
            journal = read_journal(path)
        except Exception:
            continue
        if journal.root is not None and journal.root.parent_id is None:
            return journal
    return None


def _all(tmp: Path) -> list[Journal]:
    return [read_journal(p) for p in sorted((tmp / "lora-otel").glob("*.otel.jsonl"))]


@pytest.mark.slow
def test_a_pool_worker_forked_after_openmp_ran(tmp_path: Path) -> None:
    """The job's STALLED line names the worker, the library it waits in (OpenMP, called by MKL), and
    that the pool's threads were lost in the fork; `inspect` says the same; the diagnosis over the
    evidence gathered now carries the advice (spawn, or one thread before the fork)."""
    if not _has_py_spy():
        pytest.skip("py-spy is not installed: no native frames")
    (tmp_path / "job.py").write_text(JOB_PY)
    proc = launch_detached(tmp_path, "job.py", LORA_OTEL_STALL_AFTER="between=4")
    log = tmp_path / "log.txt"
    try:

        def stalled() -> list[str]:
            if proc.poll() is not None:
                pytest.skip("the forked worker's matmul returned: this torch build does not hang after fork here")
            lines = messages(log, "STALLED") + messages(log, "why ") if log.exists() else []
            return [m for m in lines if "worker pid" in m]

        [line] = wait_for(stalled, timeout=180, what="the STALLED line naming the worker")
        assert re.search(
            r"The main thread waits for its multiprocessing\.Pool \(map, called at job\.py:\d+ in <module>\) for "
            r"[\d.]+ s; worker pid (\d+) holds a task: its main thread has been at job\.py:14 in task for [\d.]+ s "
            r"\(its journal's beat\); it waits in OpenMP \(libgomp[^,]*\.so[^,]*, called by MKL's mkl_\w+\), called "
            r"from job\.py:14 in task — OpenMP's thread pool, which its parent started before it forked this worker "
            r"\(the parent had [1-9]\d* other threads? then\) and a forked child does not have \(none of its \d+ other "
            r"threads? is OpenMP's\): the pool's threads it waits for do not exist here, so the wait never ends\.$",
            line,
        ), line
        text = lora_otel_cli("inspect", str(tmp_path / "lora-otel")).stdout
        assert "it waits in OpenMP" in text and "a forked child does not have" in text, text
        # The same reading over the evidence gathered now, with its advice.
        job = _top(tmp_path)
        assert job is not None and job.root is not None and job.pid is not None
        evidence = gather(job.pid, None)
        journals = _all(tmp_path)
        now = time.time_ns()
        open_s = (now - job.root.start_ns) / 1e9
        found = explain(Stall("between", job.root, open_s, 4.0, ""), evidence, job, journals, now_ns=now)
        assert found.attrs["lora_otel.diagnosis.rule"] == "worker pool"
        assert "multiprocessing.set_start_method('spawn')" in found.advice and "OMP_NUM_THREADS=1" in found.advice
        if cases.record_dir() is not None:
            record(tmp_path, job, journals, evidence, open_s, now)
    finally:
        stop(proc)


def _generic(value: Any, tmp: Path) -> Any:
    """``value`` with the test's paths made generic (``/job``, ``/venv``) and redacted."""
    text = json.dumps(value)
    repo = Path(__file__).resolve().parent.parent
    for real, generic in (
        (str(tmp), "/job"),
        (str(Path(os.sys.executable).parent.parent), "/venv"),
        (str(repo), "/src"),
        (str(Path(os.__file__).parent.parent.parent), "/python"),
    ):
        text = text.replace(real, generic)
    return json.loads(text)


def record(
    tmp: Path,
    job: Journal,
    journals: list[Journal],
    evidence: dict[str, Any],
    open_s: float,
    now: int,
    path: Path = CASE,
    description: str = "",
    expect: Optional[dict[str, Any]] = None,
) -> None:
    """Write a real case's evidence as ``path``'s name in the directory ``LORA_OTEL_RECORD_EVIDENCE``
    names: the job's and its children's journals (every record but the beats, and each journal's
    last beat), the evidence, the stall, and what the diagnosis must say."""
    keep = (PREFIX + "process.", PREFIX + "python.", PREFIX + "py_spy.", PREFIX + "native.")
    ordered = [job] + [j for j in journals if j.path != job.path]
    records: list[dict[str, Any]] = []
    for i, journal in enumerate(ordered):
        rows = [json.loads(line) for line in Path(journal.path).read_text().splitlines() if line.strip()]
        beats = [r for r in rows if r.get("k") == "beat"]
        rows = [r for r in rows if r.get("k") not in ("beat", "stall")] + beats[-1:]
        name = "job" if i == 0 else "child%d" % i
        records.append({"path": "/job/lora-otel/%s.otel.jsonl" % name, "records": rows})
    expect = expect or {
        "rule": "worker pool",
        "sentence": [
            "holds a task",
            "it waits in OpenMP (libgomp",
            "called by MKL's mkl_",
            "which its parent started before it forked this worker",
            "a forked child does not have",
        ],
        "advice": ["multiprocessing.set_start_method('spawn')", "OMP_NUM_THREADS=1", "torch.set_num_threads(1)"],
    }
    case = {
        "case": path.stem,
        "description": description
        or "a multiprocessing.Pool worker forked after the parent ran OpenMP (torch matmul on 2 threads): "
        "its matmul waits in libgomp for the pool's threads, which the fork did not copy",
        "source": "tests/test_native.py (real run, paths made generic)",
        "stall": {"kind": "between", "stage": "process", "open_for_s": round(open_s, 3), "limit_s": 4.0},
        "now_ns": now,
        "evidence": {k: v for k, v in evidence.items() if k.startswith(keep)},
        "journal": records[0],
        "peers": records[1:],
        "expect": {
            "rule": expect["rule"],
            "sentence": [cases.literal(x) for x in expect["sentence"]],
            "advice": [cases.literal(x) for x in expect["advice"]] or "",
        },
    }
    out = cases.record_dir() or EVIDENCE
    (out / path.name).write_text(json.dumps(_generic(case, tmp), indent=1, sort_keys=False) + "\n")


TEAM_PY = """import argparse, ctypes, ctypes.util, glob, os, sys, time
argparse.ArgumentParser().parse_known_args()
import torch  # (its wheel ships libgomp)

found = glob.glob(os.path.join(os.path.dirname(torch.__file__), "lib", "libgomp*.so*"))
gomp = ctypes.CDLL(found[0] if found else ctypes.util.find_library("gomp"))
BODY = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


def body(_):
    if gomp.omp_get_thread_num() != 0:
        time.sleep(1000)  # one thread of the team never finishes its share


callback = BODY(body)
gomp.GOMP_parallel(callback, None, 2, 0)  # the main thread waits at the team's end for it
"""
TEAM_CASE = EVIDENCE / "main_thread_openmp_team_wait.json"
SPIN_CASE = EVIDENCE / "main_thread_openmp_team_spin.json"


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["PASSIVE", "ACTIVE"])
def test_the_main_thread_waits_in_openmp(tmp_path: Path, policy: str) -> None:
    """A job whose main thread waits in an OpenMP parallel region for a team thread that never
    finishes (libgomp's ``GOMP_parallel`` through ctypes, its body sleeping in one thread): not
    frozen (the wait releases the GIL), no Python wait of its own on the stack. ``PASSIVE``: it
    sleeps on a futex, and its threads' system calls show the main one's made from libgomp;
    ``ACTIVE``: it spins, and py-spy shows it running without the GIL. Either way its native frames
    are read: the why line names OpenMP, and no advice (it was not forked)."""
    if not _has_py_spy():
        pytest.skip("py-spy is not installed: no native frames")
    (tmp_path / "job.py").write_text(TEAM_PY)
    proc = launch_detached(tmp_path, "job.py", LORA_OTEL_STALL_AFTER="between=4", OMP_WAIT_POLICY=policy)
    log = tmp_path / "log.txt"
    try:
        [line] = wait_for(
            lambda: [m for m in messages(log, "why the job is stalled") if "OpenMP" in m] if log.exists() else [],
            timeout=180,
            what="the why line naming OpenMP",
        )
        assert re.fullmatch(
            r"why the job is stalled: The main thread %s in OpenMP \([^)]*libgomp[^)]*\.so[^)]*\), called from "
            r"job\.py:16 in <module>%s\."
            % (("waits", "") if policy == "PASSIVE" else ("runs", r" \(busy on the CPU: \d+ %\)")),
            line,
        ), line
        job = _top(tmp_path)
        assert job is not None and job.root is not None and job.pid is not None
        evidence = gather(job.pid, None)
        now = time.time_ns()
        open_s = (now - job.root.start_ns) / 1e9
        found = explain(Stall("between", job.root, open_s, 4.0, ""), evidence, job, [job], now_ns=now)
        assert found.attrs["lora_otel.diagnosis.rule"] == "native wait" and found.advice == ""
        if cases.record_dir() is not None:
            record(
                tmp_path,
                job,
                [job],
                evidence,
                open_s,
                now,
                TEAM_CASE if policy == "PASSIVE" else SPIN_CASE,
                "a main thread in an OpenMP parallel region (libgomp's GOMP_parallel through ctypes, "
                "OMP_WAIT_POLICY=%s) waiting at the team's end for a thread that sleeps: not frozen, not forked"
                % policy,
                {
                    "rule": "native wait",
                    "sentence": [
                        "The main thread %s in OpenMP (" % ("waits" if policy == "PASSIVE" else "runs"),
                        "libgomp",
                    ],
                    "advice": [],
                },
            )
    finally:
        stop(proc)


def _has_py_spy() -> bool:
    return shutil.which("py-spy") is not None or (Path(os.sys.executable).parent / "py-spy").exists()


DATALOADER_MAIN = """Current thread 0x0000000000000001 (most recent call first):
  File "/python/lib/python3.11/threading.py", line 331 in wait
  File "/python/lib/python3.11/multiprocessing/queues.py", line 113 in get
  File "/venv/lib/python3.11/site-packages/torch/utils/data/dataloader.py", line 1133 in _try_get_data
  File "/venv/lib/python3.11/site-packages/torch/utils/data/dataloader.py", line 1295 in _get_data
  File "/venv/lib/python3.11/site-packages/torch/utils/data/dataloader.py", line 1329 in _next_data
  File "/job/train.py", line 18 in <module>
"""


def test_a_dataloader_worker_is_read_the_same_way(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The recorded worker's evidence under a DataLoader's wait: the DataLoader rule names the
    library and the fork, and its advice is the DataLoader's own start-method switch."""
    case = json.loads(CASE.read_text())
    journals = _journals(case, tmp_path)
    running = {j.path: "running" for j in journals if j.exit is None and j.exec is None}
    for module in (pools, diagnose):
        real = module.process_state
        monkeypatch.setattr(module, "process_state", lambda j, real=real: running.get(j.path) or real(j))
    evidence = dict(case["evidence"])
    evidence[PREFIX + "python.stacks"] = DATALOADER_MAIN
    job = journals[0]
    assert job.root is not None
    stall = Stall("alive", job.root, 30.0, 4.0, "")
    found = explain(stall, evidence, job, journals, now_ns=case["now_ns"])
    assert found.attrs["lora_otel.diagnosis.rule"] == "DataLoader"
    assert "The main thread waits for a DataLoader batch (at train.py:18 in <module>)" in found.sentence
    assert "it waits in OpenMP (libgomp" in found.sentence and "a forked child does not have" in found.sentence
    assert "DataLoader(..., multiprocessing_context='spawn')" in found.advice


def test_an_untraced_worker_in_a_library_holds_a_task(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker with no journal (not traced), asleep on a futex — which alone reads as waiting for
    work — whose main thread's system call is made from libgomp: it holds a task, in OpenMP; not
    known to be forked, so no advice."""
    case = json.loads(CASE.read_text())
    journals = _journals(case, tmp_path)
    job = journals[0]
    monkeypatch.setattr(pools, "process_state", lambda j: "running")
    monkeypatch.setattr(diagnose, "process_state", lambda j: "running")
    evidence = dict(case["evidence"])
    evidence[PREFIX + "process.children"] = [
        {
            "pid": 999999,
            "state": "S",
            "wchan": "futex_do_wait",
            "cpu_percent": 0,
            "cmdline": "python job.py",
            "libraries": ["libgomp.so.1"],
            "syscalls": [[999999, "libgomp.so.1"], [1000000, "libc.so.6"]],
        }
    ]
    assert native.in_library(evidence[PREFIX + "process.children"][0])
    assert job.root is not None
    found = explain(Stall("between", job.root, 30.0, 4.0, ""), evidence, job, [job], now_ns=case["now_ns"])
    assert found.attrs["lora_otel.diagnosis.rule"] == "worker pool"
    assert (
        "worker pid 999999 (python job.py) holds a task: sleeping in futex_do_wait, 0 % CPU; it waits in OpenMP "
        "(libgomp.so.1) (its system call is made from there; no native frames)." in found.sentence
    ), found.sentence
    assert found.advice == ""


FORKS_PY = """import os, sys, threading
release = threading.Event()
threads = [threading.Thread(target=release.wait) for _ in range(int(sys.argv[1]))]
for t in threads:
    t.start()
pid = os.fork()
if pid == 0:
    import time
    time.sleep(1)  # (lives to its first beat: its journal is made)
    print("child", flush=True)
    os._exit(0)
os.waitpid(pid, 0)
release.set()
"""


@pytest.mark.slow
@pytest.mark.parametrize("threads", [0, 2])
def test_a_forked_childs_root_says_how_many_threads_its_parent_had(tmp_path: Path, threads: int) -> None:
    """``process.fork.parent_threads``: the parent's threads at the fork besides the forking one and
    lora_otel's beat — the program's own."""
    (tmp_path / "forks.py").write_text(FORKS_PY)
    r = run_traced(["forks.py", str(threads)], tmp_path, LORA_OTEL_BEAT_S="0.2")
    assert r.returncode == 0 and "child" in r.stdout, r.stderr[-2000:]
    children = [
        j
        for j in map(read_journal, journals(tmp_path))
        if j.root is not None and j.root.attrs.get("lora_otel.activation") == "fork"
    ]
    assert len(children) == 1
    assert children[0].root is not None and children[0].root.attrs["process.fork.parent_threads"] == threads
