"""The Python matrix: the in-process half's tests on every Python lora_otel claims beside 3.11.

    python .ci/matrix.py                 # every Python of the matrix (builds its venvs once)
    python .ci/matrix.py --python 3.13   # one of them
    python .ci/matrix.py --list          # what runs where, and the cached venvs
    python .ci/matrix.py --jobs 2        # two Pythons at a time (each output printed whole)
    python .ci/matrix.py --widen-when F  # one at a time, two once the file F exists (.ci/run)

The code that runs inside the user's process has paths of its own per Python version
(``sys.monitoring`` on 3.12+, how a ``SystemExit`` is seen on <= 3.11, fork warnings on 3.12+,
frame and thread internals that change on 3.13); the main suite runs on 3.11 only. Here the tests
of that half — the preamble and its hooks, fork/exec, signals, exit verdicts, the harm tests, the
job's own lines, the watchdog against a real job — run on 3.9, 3.10, 3.12 and 3.13, each in a venv
of its own. On 3.9, 3.10 and 3.13 torch is installed (the newest PyPI serves for that Python) with
peft and transformers, and the LoRA example and a 2-rank torchrun case run too. 3.12 runs without
torch: the tests marked ``torch`` are skipped there, saying so (``LORA_OTEL_TEST_NO_TORCH``).

Each venv is cached under ``$LORA_OTEL_MATRIX_VENVS`` (default ``~/.cache/lora_otel/matrix``) by a
key of the interpreter's exact version and what is installed into it, and shared by every checkout
(a torch venv is 5 to 7 GB: one per checkout filled CI's disk). lora_otel is not installed into it:
each checkout runs the tests in a small venv of its own (``checkouts/<hash>/``, made in a second,
no pip in it) whose ``.pth`` files add the shared venv's site-packages, put this checkout on
``sys.path`` and lora_otel's start hook in site-packages (as ``pip install`` does), rewritten at
every run. A run holds the shared venv's lock file shared while it runs; building a new key for a
Python first removes that Python's venvs of other keys that no run holds (the cache keeps one per
Python, plus any in use). The interpreters
are pyenv's (``pyenv root``/versions/3.X.*) or ``python3.X`` on ``PATH``; a missing one fails the
run with its name. Exit status: 0 when every Python passed, 1 otherwise (pytest's "no tests
collected" included).
"""

from __future__ import annotations

import argparse
import fcntl
import functools
import glob
import hashlib
import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parents[1]

IN_PROCESS = [
    "tests/test_harm_verdicts.py",
    "tests/test_harm_signals.py",
    "tests/test_harm_streams.py",
    "tests/test_harm_descriptors.py",
    "tests/test_harm_fine_programs.py",
    "tests/test_harm_interpreter.py",
    "tests/test_harm_log_arg.py",
    "tests/test_short_process.py",
    "tests/test_fork.py",
    "tests/test_exit_stage.py",
    "tests/test_activation.py",
    "tests/test_stack_requests.py",
    "tests/test_local_watchdog.py",
    "tests/test_local_beat.py",
    "tests/test_no_clutter.py",
    "tests/test_stdlib_only.py",
    "tests/test_child_exit.py",
    "tests/test_kill.py",
    "tests/test_progress_bars.py",
]
"""The in-process half's test files (every Python of the matrix)."""

WITH_TORCH = [
    "tests/test_integrations.py::TestExample",
    "tests/test_collective.py::test_rank_waits_in_all_reduce_that_the_other_rank_skipped",
]
"""The LoRA example (plain loop and HF Trainer) and two gloo ranks under torchrun, where torch is."""

OURS = ["opentelemetry-api>=1.20", "opentelemetry-sdk>=1.20", "opentelemetry-exporter-otlp>=1.20"]
TEST_DEPS = [
    "pytest>=7",
    "hypothesis>=6",
    "pyyaml>=5.1",
    "jsonschema>=4",
    "freezegun>=1.2",
    "time-machine>=2.10",
    "rotel",
    "tqdm>=4",
]
TORCH_DEPS = ["numpy", "peft>=0.10", "transformers>=4.40", "accelerate>=0.30"]

PYTHONS: dict[str, str | None] = {"3.9": "2.8.0", "3.10": "2.14.1", "3.12": None, "3.13": "2.15.0"}
"""Each Python of the matrix and the torch installed into its venv (None: none). 2.14.1 and 2.15.0
are the newest PyPI serves for 3.10 and 3.13 (2026-12), 2.8.0 for 3.9 (its newest: about 7 minutes
and 6.6 GB the first time on a loaded machine, with transformers 4.57, peft 0.17, accelerate 1.10)."""


def cache_root() -> Path:
    return Path(os.environ.get("LORA_OTEL_MATRIX_VENVS") or Path.home() / ".cache" / "lora_otel" / "matrix")


def find_python(version: str) -> str:
    """The interpreter for ``version`` (``3.12``): pyenv's newest 3.12.*, else ``python3.12``."""
    roots = []
    try:
        out = subprocess.run(["pyenv", "root"], capture_output=True, text=True, timeout=30)
        if out.returncode == 0 and out.stdout.strip():
            roots.append(out.stdout.strip())
    except (OSError, subprocess.SubprocessError):
        pass
    roots.append(str(Path.home() / ".pyenv"))
    found = []
    for root in roots:
        for exe in glob.glob(os.path.join(root, "versions", version + ".*", "bin", "python" + version)):
            patch = exe.split(os.sep)[-3][len(version) + 1 :]
            if patch.isdigit():
                found.append((int(patch), exe))
    if found:
        return max(found)[1]
    exe = shutil.which("python" + version)
    if exe:
        return exe
    raise SystemExit(
        "matrix: Python %s not found (neither pyenv's versions/%s.* nor python%s on PATH)" % ((version,) * 3)
    )


def requirements(torch: str | None) -> list[str]:
    return OURS + TEST_DEPS + (["torch==%s" % torch, *TORCH_DEPS] if torch else [])


def build(version: str, exe: str, torch: str | None, what: dict, venv: Path, python: Path, log: Path) -> None:
    """The venv of one matrix entry, from nothing; pip's output goes to ``log``."""
    if venv.exists():
        shutil.rmtree(venv)
    venv.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    steps = [
        [exe, "-m", "venv", str(venv)],
        [str(python), "-m", "pip", "install", "-q", "--upgrade", "pip"],
        [str(python), "-m", "pip", "install", "-q", *requirements(torch)],
    ]
    with open(log, "wb") as out:
        for step in steps:
            out.write(("$ %s\n" % " ".join(step)).encode())
            out.flush()
            if subprocess.call(step, stdout=out, stderr=subprocess.STDOUT) != 0:
                tail = log.read_text(errors="replace")[-3000:]
                free = shutil.disk_usage(venv.parent).free / 2**30
                raise SystemExit(
                    "matrix: building the Python %s venv failed at `%s` (%.1f GiB free under %s; a venv with"
                    " torch takes 5 to 7 GiB):\n%s" % (version, " ".join(step), free, venv.parent, tail)
                )
    (venv / ".built").write_text(json.dumps(what) + "\n")
    print("matrix: built the Python %s venv in %.0f s (%s)" % (version, time.monotonic() - started, venv), flush=True)


_held: list = []
"""The lock files of the shared venvs this run uses, held shared until it exits (see ``prune``)."""


def prune(version: str, keep: str) -> list[Path]:
    """Remove Python ``version``'s shared venvs of keys other than ``keep`` that no run holds, with
    their logs, locks and checkouts' small venvs; returns what was removed."""
    root = cache_root()
    removed = []
    for lock_path in sorted(root.glob("py%s-*.lock" % version)):
        key = lock_path.name[len("py%s-" % version) : -len(".lock")]
        if key == keep:
            continue
        with open(lock_path, "a") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                continue  # a run is using it (or building it)
            venv = root / ("py%s-%s" % (version, key))
            shutil.rmtree(venv, ignore_errors=True)
            for small in root.glob("checkouts/*/py%s-%s" % (version, key)):
                shutil.rmtree(small, ignore_errors=True)
            (root / ("py%s-%s.log" % (version, key))).unlink(missing_ok=True)
            lock_path.unlink(missing_ok=True)
            removed.append(venv)
    return removed


def site_packages(python: Path) -> Path:
    return Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )


def checkout_venv(exe: str, shared: Path, small: Path) -> Path:
    """The python of this checkout's small venv over the ``shared`` venv's site-packages: made once
    (``venv --without-pip``, about a second), its ``.pth`` files rewritten at every run."""
    python = small / "bin" / "python"
    if not python.exists():
        shutil.rmtree(small, ignore_errors=True)
        small.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run([exe, "-m", "venv", "--without-pip", str(small)], check=True)
    site = site_packages(python)
    # .pth files are read in name order: the shared site-packages first (``addsitedir`` reads its own
    # .pth files too, as its interpreter would), then this checkout, then the start hook, which
    # imports lora_otel from it.
    (site / "_lora_otel_matrix_shared.pth").write_text(
        "import site; site.addsitedir(%r)\n" % str(site_packages(shared / "bin" / "python"))
    )
    (site / "lora_otel_checkout.pth").write_text(str(REPO) + "\n")
    shutil.copyfile(REPO / "lora_otel_hook.pth", site / "lora_otel_hook.pth")
    return python


def shared_key(version: str, torch: str | None) -> tuple[str, dict[str, object], str]:
    """The interpreter, what goes into Python ``version``'s shared venv, and its key."""
    exe = find_python(version)
    full = subprocess.run([exe, "-c", "import sys; print(sys.version)"], capture_output=True, text=True, check=True)
    what = {"python": full.stdout.strip(), "requirements": requirements(torch), "v": 2}
    return exe, what, hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:16]


@functools.cache  # once per Python: a second lock of the file held here would wait on this run
def venv_for(version: str, torch: str | None) -> Path:
    """The python this checkout runs Python ``version``'s tests with: a small venv of its own over
    the shared venv of this key, which is built when the cache has none."""
    exe, what, key = shared_key(version, torch)
    venv = cache_root() / ("py%s-%s" % (version, key))
    python = venv / "bin" / "python"
    cache_root().mkdir(parents=True, exist_ok=True)
    lock = open(cache_root() / ("py%s-%s.lock" % (version, key)), "a")  # noqa: SIM115 (held till exit)
    # Held shared while this run lasts: no prune removes the venv under us, and other runs (another
    # checkout's, CI's) use it beside us. Only a build takes it exclusive: two runs that find no
    # venv, one builds and the other waits for it (an exclusive lock asked for first would wait for
    # every run using the venv to end: a whole matrix run).
    fcntl.flock(lock, fcntl.LOCK_SH)
    if not (venv / ".built").exists():
        fcntl.flock(lock, fcntl.LOCK_UN)
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (venv / ".built").exists():
            for gone in prune(version, key):
                print("matrix: removed %s (another key of Python %s, in use by no run)" % (gone, version), flush=True)
            build(version, exe, torch, what, venv, python, cache_root() / ("py%s-%s.log" % (version, key)))
        fcntl.flock(lock, fcntl.LOCK_SH)
    _held.append(lock)
    checkout = hashlib.sha256(str(REPO).encode()).hexdigest()[:12]
    return checkout_venv(exe, venv, cache_root() / "checkouts" / checkout / venv.name)


ROTEL_WHEEL_PYTHON = "3.11"
"""The Python whose ``rotel`` wheel gives the agent where a venv's own does not run: PyPI's newest
rotel for 3.9 (0.0.1a10) needs glibc 2.38, Debian 12 has 2.36. The agent is one binary whatever the
Python; tests/collector.py takes it from ``LORA_OTEL_TEST_ROTEL_AGENT``."""


def rotel_agent(python: Path) -> str | None:
    """A ``rotel-agent`` that runs here: the venv's own, else the one of rotel's 3.11 wheel (cached)."""
    site = subprocess.run(
        [str(python), "-c", "import rotel, os; print(os.path.dirname(rotel.__file__))"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    own = Path(site) / "rotel-agent" if site else None
    if own and own.is_file() and subprocess.run([str(own), "--version"], capture_output=True).returncode == 0:
        return None
    where = cache_root() / ("rotel-cp%s" % ROTEL_WHEEL_PYTHON.replace(".", ""))
    agent = where / "rotel" / "rotel-agent"
    if not agent.is_file():
        wheels = where / "wheel"
        step = [str(python), "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:"]
        step += ["--python-version", ROTEL_WHEEL_PYTHON, "-d", str(wheels), "rotel"]
        if subprocess.call(step) != 0:
            raise SystemExit("matrix: `%s` failed: the tests need a rotel agent that runs here" % " ".join(step))
        import zipfile

        [wheel] = sorted(wheels.glob("rotel-*.whl"))[-1:]
        with zipfile.ZipFile(wheel) as z:
            z.extract("rotel/rotel-agent", where)
        agent.chmod(0o755)
    return str(agent)


_print_lock = threading.Lock()
_running: set[subprocess.Popen[str]] = set()
"""The pytest runs under way: a SIGTERM (``.ci/run`` ending while the matrix runs beside its main
suite) stops them too."""


def _stop(signum: int, frame: object) -> None:
    for proc in list(_running):
        proc.terminate()
    os._exit(128 + signum)


def run(version: str, torch: str | None, pytest_args: list[str], side_by_side: bool = False) -> tuple[int, float, str]:
    python = venv_for(version, torch)
    env = {k: v for k, v in os.environ.items() if not k.startswith("LORA_OTEL")}
    if not torch:
        env["LORA_OTEL_TEST_NO_TORCH"] = "1"
    agent = rotel_agent(python)
    if agent:
        env["LORA_OTEL_TEST_ROTEL_AGENT"] = agent
    tests = IN_PROCESS + (WITH_TORCH if torch else [])
    # Each Python's run numbers and cleans temporary directories of its own: other pytest runs (the
    # main suite, another Python) may run beside it.
    basetemp = ["--basetemp", tempfile.mkdtemp(prefix="lora-otel-matrix-%s-" % version)]
    cmd = [str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", *basetemp, *pytest_args, *tests]
    header = "matrix: Python %s (%s): %s" % (
        version,
        "torch %s" % torch if torch else "no torch",
        " ".join(cmd[1:]),
    )
    if not side_by_side:
        print(header, flush=True)
    started = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    _running.add(proc)
    output, _ = proc.communicate()
    _running.discard(proc)
    took = time.monotonic() - started
    with _print_lock:
        if side_by_side:
            print("%s  [%.0f s]" % (header, took), flush=True)
        sys.stdout.write(output)
        sys.stdout.flush()
    if proc.returncode == 0:
        shutil.rmtree(basetemp[1], ignore_errors=True)
    last = [line for line in output.splitlines() if line.strip()][-1:] or [""]
    return proc.returncode, took, last[0].strip("= ")


def schedule(
    versions: list[str],
    work: Callable[[str], tuple[int, float, str]],
    jobs: int,
    widen_jobs: int,
    widen: Callable[[], bool],
    poll_s: float = 0.5,
) -> dict[str, tuple[int, float, str]]:
    """Run ``work(version)`` for each version in order, ``jobs`` at a time, ``widen_jobs`` at a time
    once ``widen()`` is true (.ci/run: once the main suite has ended and its cores are free). A
    ``work`` that raises counts as a failed run with the error as its summary."""
    done: queue.Queue[tuple[str, tuple[int, float, str]]] = queue.Queue()

    def one(version: str) -> None:
        started = time.monotonic()
        try:
            result = work(version)
        except Exception as e:  # noqa: BLE001 - one Python's failure must not hide the others' results
            result = (1, time.monotonic() - started, "%s: %s" % (type(e).__name__, e))
        done.put((version, result))

    pending = list(versions)
    running = 0
    results: dict[str, tuple[int, float, str]] = {}
    while pending or running:
        limit = widen_jobs if widen() else jobs
        while pending and running < limit:
            threading.Thread(target=one, args=(pending.pop(0),), daemon=True).start()
            running += 1
        try:
            version, result = done.get(timeout=poll_s)
        except queue.Empty:
            continue
        running -= 1
        results[version] = result
    return results


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--python", action="append", choices=sorted(PYTHONS), help="run only this Python (repeatable)")
    ap.add_argument("--list", action="store_true", help="say what runs on each Python and where its venv is cached")
    ap.add_argument("--build-only", action="store_true", help="build the venvs not cached yet, run no test")
    ap.add_argument(
        "--jobs",
        type=int,
        default=1,
        metavar="N",
        help="run N Pythons side by side (default 1; the ones with torch first)",
    )
    ap.add_argument(
        "--widen-when",
        type=Path,
        metavar="FILE",
        help="once FILE exists, run --widen-jobs Pythons side by side (.ci/run creates it when the\n"
        "main suite ends, so the matrix's last Pythons share the cores the suite leaves)",
    )
    ap.add_argument("--widen-jobs", type=int, default=2, metavar="N", help="see --widen-when (default 2)")
    ap.add_argument("pytest_args", nargs="*", help="passed to pytest (after --), e.g. -x")
    args = ap.parse_args()
    chosen = args.python or list(PYTHONS)
    if args.jobs < 1 or args.widen_jobs < 1:
        ap.error("--jobs and --widen-jobs must be 1 or more, not %d" % min(args.jobs, args.widen_jobs))
    if args.list:
        for version in chosen:
            torch = PYTHONS[version]
            print(
                "Python %s: %s; %d test files%s"
                % (
                    version,
                    "torch %s" % torch if torch else "no torch",
                    len(IN_PROCESS),
                    " + the LoRA example and torchrun" if torch else "",
                )
            )
        print("venvs cached under %s" % cache_root())
        return 0
    if args.build_only:
        for version in chosen:
            rotel_agent(venv_for(version, PYTHONS[version]))
        return 0
    signal.signal(signal.SIGTERM, _stop)
    for version in chosen:  # every venv is built before any test starts
        venv_for(version, PYTHONS[version])
    widen = args.widen_when.exists if args.widen_when else (lambda: False)
    side_by_side = args.jobs > 1 or args.widen_when is not None
    results = schedule(
        sorted(chosen, key=lambda v: PYTHONS[v] is None),  # the ones with torch (the longest) first
        lambda v: run(v, PYTHONS[v], args.pytest_args, side_by_side),
        args.jobs,
        args.widen_jobs if args.widen_when else args.jobs,
        widen,
    )
    rows = [(version, PYTHONS[version], *results[version]) for version in chosen]
    print("\n| Python | torch | result | time |\n|---|---|---|---:|")
    for version, torch, rc, took, summary in rows:
        print(
            "| %s | %s | %s%s | %.0f s |"
            % (version, torch or "none", "" if rc == 0 else "FAILED (exit %d): " % rc, summary, took)
        )
    return 0 if all(rc == 0 for _, _, rc, _, _ in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
