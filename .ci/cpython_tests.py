"""CPython's own regression tests for the modules lora_otel touches, run under ``LORA_OTEL=1``.

    python .ci/cpython_tests.py                 # every Python of the matrix, and this venv's
    python .ci/cpython_tests.py --python 3.13   # one of them
    python .ci/cpython_tests.py --without       # the same runs without lora_otel (the baseline)
    python .ci/cpython_tests.py --python 3.11 --module test_signal --match test_sigint   # a rerun

Every interpreter of the pyenv builds ships its ``test`` package: ``python -m test test_os
test_subprocess ...`` runs the interpreter's own tests of ``os``, ``subprocess``, ``threading``,
``signal``, ``faulthandler``, ``atexit``, ``site``, ``sys``, imports, ``fork`` and the tracers — a
peer's test suite for harmlessness. They pass without lora_otel; here they run with it (its ``.pth``
hook in the interpreter's site-packages: CI's ``.venv`` for 3.11, each matrix checkout's small venv
for the others, `matrix.venv_for`), and must pass too, but for the few tests in `IGNORED`, each of
which asserts what a traced process cannot be (docs/reliability.md, "CPython's own tests"): they
are skipped by name (regrtest's ``--ignore``), never a whole module. A Python whose interpreter has
no ``test`` package (a distribution's build without it) is skipped, saying so.

Each Python runs regrtest with ``-j2`` (about a minute without lora_otel on 2 cores), one Python at a
time; the journals go to a temporary directory removed after a run that passed. Exit status: 0 when
every Python passed, 1 otherwise.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import matrix  # .ci/matrix.py, beside this file

MODULES = [
    "test_os",
    "test_subprocess",
    "test_threading",
    "test_signal",
    "test_faulthandler",
    "test_atexit",
    "test_site",
    "test_sys",
    "test_traceback",
    "test_pdb",
    "test_cprofile",
    "test_profile",
    "test_tracemalloc",
    "test_warnings",
    "test_logging",
    "test_import",
    "test_pty",
    "test_fork1",
    "test_wait4",
    "test_posix",
    "test_select",
    "test_selectors",
    "test_threading_local",
    "test_sys_settrace",
    "test_sys_setprofile",
    "test_unittest",
    "test_argparse",
]

IGNORED: dict[str, str] = {
    # -- what a traced process has, by design (docs/reliability.md, "CPython's own tests") --
    # faulthandler's dumps list every thread: lora_otel's beat thread is one.
    "test.test_faulthandler.FaultHandlerTests.test_dump_traceback_later*": "the beat thread in the dump",
    "test.test_faulthandler.FaultHandlerTests.test_dump_traceback_threads*": "the beat thread in the dump",
    "test.test_faulthandler.FaultHandlerTests.test_enable_f*": "the beat thread in the dump",
    "test.test_faulthandler.FaultHandlerTests.test_fatal_error*": "the beat thread in the dump",
    "test.test_faulthandler.FaultHandlerTests.test_gc": "the beat thread in the dump",
    "test.test_faulthandler.FaultHandlerTests.test_gil_released": "the beat thread in the dump",
    "test.test_faulthandler.FaultHandlerTests.test_read_null": "the beat thread in the dump",
    "test.test_faulthandler.FaultHandlerTests.test_register_threads": "the beat thread in the dump",
    "test.test_faulthandler.FaultHandlerTests.test_sig*": "the beat thread in the dump",
    "test.test_faulthandler.FaultHandlerTests.test_stack_overflow": "the beat thread in the dump",
    # a child lists its own open descriptors: a traced child holds its journal's.
    "test.test_subprocess.POSIXProcessTestCase.test_pass_fds_redirected": "the child's own journal descriptor",
    # a forked child has its beat thread from the fork on (a child frozen at once is told frozen).
    "test.test_threading.*.test_clear_threads_states_after_fork": "the forked child's beat thread",
}
"""Patterns (regrtest's ``--ignore``, fnmatch on the test id) of the tests skipped, with why."""

IGNORED_ON: dict[str, dict[str, str]] = {
    "3.13": {
        # 3.13.0 to 3.13.9 count the threads for the fork warning after the after-fork hooks, where
        # the beat runs again (CPython gh-137109; preamble._PAUSE_AT_FORK): the warning cannot be spared.
        "test.test_threading.ThreadTests.test_main_thread_after_fork*": "the fork warning, 3.13.0-3.13.9",
    },
}
"""`IGNORED` for one Python only."""

SUMMARY = re.compile(r"Total tests: (.*)")
RESULT = re.compile(r"^(\d+ tests? OK\.|== Tests result: .*)$", re.M)


def interpreters(chosen: list[str] | None) -> list[tuple[str, Path]]:
    """``(version, python)`` for each Python: CI's own venv (3.11), then the matrix's."""
    found: list[tuple[str, Path]] = []
    own = "%d.%d" % sys.version_info[:2]
    if not chosen or own in chosen:
        found.append((own, Path(sys.executable)))
    for version, torch in matrix.PYTHONS.items():
        if (not chosen or version in chosen) and version != own:
            found.append((version, matrix.venv_for(version, torch)))
    return found


def run(
    version: str, python: Path, traced: bool, modules: list[str] | None = None, match: list[str] | None = None
) -> tuple[int, float, str]:
    """regrtest of `MODULES` on ``python``; ``(exit status, seconds, its "Total tests" line)``."""
    has_test = subprocess.run([str(python), "-c", "import test.libregrtest"], capture_output=True)
    if has_test.returncode != 0:
        return 0, 0.0, "skipped: this interpreter has no `test` package"
    journals = tempfile.mkdtemp(prefix="lora-otel-cpython-%s-" % version)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LORA_OTEL", "OTEL_")) and k != "TRACEPARENT"}
    env.pop("PYTHONPATH", None)  # (the venv's .pth files put lora_otel on the path: regrtest's -I children too)
    if traced:
        env.update(LORA_OTEL="1", LORA_OTEL_DIR=journals)
    cmd = [str(python), "-m", "test", *(modules or MODULES), "-j2", "--timeout", "600"]
    for pattern in match or []:
        cmd += ["-m", pattern]
    if traced:
        for pattern in [*IGNORED, *IGNORED_ON.get(version, {})]:
            cmd += ["--ignore", pattern]
    print("cpython tests: Python %s %s: %s" % (version, "with" if traced else "without", " ".join(cmd[1:6]) + " ..."))
    started = time.monotonic()
    proc = subprocess.run(cmd, cwd=journals, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    took = time.monotonic() - started
    totals = SUMMARY.findall(proc.stdout) or RESULT.findall(proc.stdout)  # (3.9 prints no total)
    summary = totals[-1].strip() if totals else "no summary"
    if proc.returncode != 0:
        sys.stdout.write(proc.stdout[-20000:])
    else:
        shutil.rmtree(journals, ignore_errors=True)
    return proc.returncode, took, summary


def default_sigint() -> None:
    """SIGINT's default action for regrtest, however this script was started. A background job of
    a shell without job control (``cmd &`` in a script) starts with SIGINT ignored; Python
    then keeps it ignored (no ``default_int_handler``) and every child inherits that: test_signal's
    ``test_sigint``, ``test_keyboard_interrupt_exit_code``, ``test_pidfd_send_signal`` and
    test_threading's ``test_interrupt_main_*thread`` fail, with or without lora_otel (two runs of
    six, with ``-W``, lost exactly these: issue 36 item 10; tests/conftest.py does the same for the
    suite). A Python handler here gives each child the default back at its exec."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--python", action="append", help="run only this Python (repeatable)")
    ap.add_argument("--without", action="store_true", help="run without lora_otel (the baseline)")
    ap.add_argument("--module", action="append", help="run only this test module (repeatable; a rerun)")
    ap.add_argument("--match", action="append", help="regrtest's -m: only the tests matching (repeatable)")
    args = ap.parse_args()
    default_sigint()
    rows = []
    for version, python in interpreters(args.python):
        rc, took, summary = run(version, python, not args.without, args.module, args.match)
        rows.append((version, rc, took, summary))
    print("\n| Python | lora_otel | result | tests | time |\n|---|---|---|---|---:|")
    for version, rc, took, summary in rows:
        print(
            "| %s | %s | %s | %s | %.0f s |"
            % (version, "off" if args.without else "on", "ok" if rc == 0 else "FAILED (%d)" % rc, summary, took)
        )
    return 0 if all(rc == 0 for _, rc, _, _ in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
