"""Harmless everywhere, verdicts: the journal says how a process really ended (issue 12, items 5, 6).

Every case runs a real program the way a user runs it and checks what the user sees: the
program's exit status, the journal's exit record and root span, the ``exiting: …`` line, and
``lora-otel inspect DIR --summary``'s verdict and exit status.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from procs import PYTHON, REPO, clean_env, journals

from lora_otel.journal.reader import read_journal

pytestmark = pytest.mark.slow

MODES = ("LORA_OTEL=1", "lora-otel run", "python -m lora_otel", "import lora_otel.auto")


def run_in_mode(tmp_path: Path, mode: str, program: str, python: str = PYTHON) -> subprocess.CompletedProcess:
    """Run ``program`` (a script's text) traced in ``mode``; journals go to ``tmp_path/j``."""
    jdir = tmp_path / "j"
    if mode == "import lora_otel.auto":
        program = "import lora_otel.auto\n" + program
    (tmp_path / "prog.py").write_text(program)
    env = clean_env(LORA_OTEL_DIR=str(jdir))
    if python != PYTHON:  # another interpreter (3.12+): lora_otel from this checkout, not installed there
        env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "") if env.get("PYTHONPATH") else str(REPO)
    if mode == "LORA_OTEL=1":
        env["LORA_OTEL"] = "1"
        cmd = [python, "prog.py"]
    elif mode == "lora-otel run":
        cmd = [python, "-m", "lora_otel", "run", "--dir", str(jdir), "--", python, "prog.py"]
    elif mode == "python -m lora_otel":
        cmd = [python, "-m", "lora_otel", "prog.py"]
    else:
        cmd = [python, "prog.py"]
    return subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)


def summary(directory: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [PYTHON, "-m", "lora_otel", "inspect", str(directory), "--summary"],
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )


def assert_outcome(tmp_path: Path, r: subprocess.CompletedProcess, status: int, message: str | None) -> None:
    """The journal, the root span, the stderr line and inspect --summary all give ``status``."""
    assert r.returncode == status, r.stderr
    (path,) = journals(tmp_path / "j")
    j = read_journal(path)
    assert j.exit is not None and j.exit["code"] == status, j.exit
    assert j.root is not None and j.root.attrs["process.exit.code"] == status
    assert j.root.status == ("error" if status else "ok")
    if message is None:  # (on the terminal only for a job; in the journal always)
        assert any(ln.msg.startswith("exiting normally") for ln in j.lines) or "--" in r.args, j.lines
    else:
        assert message in (j.exit["message"] or ""), j.exit
    s = summary(tmp_path / "j")
    assert s.returncode == (1 if status else 0), s.stdout + s.stderr
    assert ("failed" if status else "finished") in s.stdout, s.stdout


OWN_HOOK_CRASH = """\
import sys

def pretty(kind, value, tb):  # what rich.traceback.install() and many CLIs do
    sys.stderr.write("custom report: %s\\n" % value)

sys.excepthook = pretty
raise ValueError("boom")
"""


class TestUncaughtExceptionWithItsOwnExcepthook:
    @pytest.mark.parametrize("mode", MODES)
    def test_crash_is_recorded_as_a_crash(self, tmp_path: Path, mode: str) -> None:
        """A program that installs its own sys.excepthook and dies of an uncaught exception exits
        with status 1; the journal, the root span, the `exiting:` line and inspect --summary say
        so (before: `exiting normally`, exit code 0, finished)."""
        r = run_in_mode(tmp_path, mode, OWN_HOOK_CRASH)
        assert "custom report: boom" in r.stderr  # the program's own hook still ran
        assert_outcome(tmp_path, r, 1, "uncaught ValueError: boom")
        said = [ln.msg for p in journals(tmp_path) for ln in read_journal(p).lines]
        assert any("exiting: uncaught ValueError: boom" in m for m in said), said  # (stderr too, for a job)

    def test_an_interactive_interpreters_error_is_not_a_crash(self, tmp_path: Path) -> None:
        """code.InteractiveInterpreter reports an error of the code it runs (and sets
        sys.last_value) without the program failing: the program ends normally, and so does its
        journal (before: recorded as an uncaught ZeroDivisionError, exit code 1)."""
        program = "import code\ncode.InteractiveInterpreter().runsource('1/0')\nprint('still fine')\n"
        r = run_in_mode(tmp_path, "LORA_OTEL=1", program)
        assert "still fine" in r.stdout and "ZeroDivisionError" in r.stderr
        assert_outcome(tmp_path, r, 0, None)


_OLD_PYTHON = sys.version_info < (3, 12)
"""Before 3.12 a ``raise SystemExit(n)`` leaves no trace an exit handler can read: the journal knows
it from how the ``__main__`` code ended (its frame's last instruction) and the constant raised;
a computed code (``raise SystemExit(main())``) is said to be unknown, never 0."""

SYSTEM_EXITS = [
    ("raise SystemExit(3)\n", 3, "exit code 3"),
    ("raise SystemExit('bad config')\n", 1, "bad config"),
    ("def main():\n    return 5\n\nif __name__ == '__main__':\n    raise SystemExit(main())\n", 5, "exit code 5"),
    ("exit(4)\n", 4, "exit code 4"),
    ("quit()\n", 0, None),
    ("raise SystemExit\n", 0, None),
    ("import sys\ntry:\n    sys.exit(2)\nexcept SystemExit:\n    pass\n", 0, None),
    ("import sys\nsys.exit(256)\n", 0, None),  # the OS keeps the low byte: 0
    ("import sys\nsys.exit(-1)\n", 255, "exit code 255"),
    # a sys.exit caught, then another SystemExit raised deeper: never the caught one's code (hostile trial)
    (
        "import sys\ntry:\n    sys.exit(3)\nexcept SystemExit:\n    pass\n"
        "def main():\n    raise SystemExit(0)\nmain()\n",
        0,
        None,
    ),
    # a sys.exit deeper down that leaves the main code through a handler that does not take it (as
    # `python -m json.tool` does): the code is exact (3.9-3.11: it read "unknown" once)
    (
        "import sys\ndef work():\n    sys.exit(3)\ntry:\n    work()\nexcept KeyError:\n    print('no')\n",
        3,
        "exit code 3",
    ),
    (
        "import sys\ndef work():\n    sys.exit(3)\ntry:\n    work()\nexcept KeyError as e:\n    print(e)\n",
        3,
        "exit code 3",
    ),
    ("import sys\ndef work():\n    sys.exit(3)\ntry:\n    work()\nfinally:\n    print('done')\n", 3, "exit code 3"),
    ("import sys, threading\ndef work():\n    sys.exit(3)\nwith threading.Lock():\n    work()\n", 3, "exit code 3"),
    # ... but a caught sys.exit does not give its code to another SystemExit that leaves by a handler
    (
        "import sys\ntry:\n    sys.exit(3)\nexcept SystemExit:\n    pass\n"
        "def main():\n    raise SystemExit(0)\ntry:\n    main()\nexcept KeyError:\n    print('no!')\n",
        0,
        None,
    ),
]


def _system_exit_cases():
    for mode in MODES:
        for program, status, message in SYSTEM_EXITS:
            yield pytest.param(
                mode,
                program,
                status,
                message,
                id="%s-%s" % (mode.replace(" ", "_"), program.splitlines()[-1].strip()),
            )


def assert_unknown(tmp_path: Path, r: subprocess.CompletedProcess, status: int) -> None:
    """The exit status is the program's; the journal, the root span and inspect say the code is
    unknown and claim neither 0 nor a failure."""
    assert r.returncode == status, r.stderr
    (path,) = journals(tmp_path / "j")
    j = read_journal(path)
    assert j.exit is not None and j.exit["code"] is None and j.exit["how"] == "unknown", j.exit
    assert re.fullmatch(r"exit code unknown: the program raised SystemExit at prog.py:\d+", j.exit["message"]), j.exit
    assert "process.exit.code" not in j.root.attrs and j.root.attrs["lora_otel.exit.code_unknown"]
    assert "exiting: exit code unknown: the program raised SystemExit at prog.py:" in r.stderr, r.stderr
    s = summary(tmp_path / "j")
    assert "exit code unknown" in s.stdout and "finished" not in s.stdout and "exit code 0" not in s.stdout, s.stdout


class TestSystemExit:
    @pytest.mark.parametrize(("mode", "program", "status", "message"), list(_system_exit_cases()))
    def test_exit_status_is_the_real_one(
        self, tmp_path: Path, mode: str, program: str, status: int, message: str | None
    ) -> None:
        """`raise SystemExit(n)`, `SystemExit("msg")`, `exit(n)`, `quit()`: the journal's exit
        record, the root span, and inspect --summary give the status the program exited with
        (before: exit code 0 and `finished` for all but `lora-otel run`'s own status)."""
        r = run_in_mode(tmp_path, mode, program)
        if _OLD_PYTHON and "main()" in program and mode == "import lora_otel.auto":
            assert_unknown(tmp_path, r, status)  # (3.12+: exact, TestSystemExitOnPython312)
        elif _OLD_PYTHON and "main()" in program and mode == "LORA_OTEL=1":
            # a short process whose code is unknown: the program's status, no line on its stderr, a
            # journal that says unknown (kept here by the tests' LORA_OTEL_KEEP_SHORT=1), else none
            # (a job's: `test_a_jobs_unknown_code_is_said_unknown`; 3.12+: exact)
            assert r.returncode == status and "exiting" not in r.stderr, r.stderr
            (path,) = journals(tmp_path / "j")
            assert read_journal(path).exit["how"] == "unknown" and read_journal(path).exit["code"] is None
            env = clean_env(LORA_OTEL="1", LORA_OTEL_DIR=str(tmp_path / "short"), LORA_OTEL_KEEP_SHORT="")
            again = subprocess.run([PYTHON, "prog.py"], cwd=tmp_path, env=env, capture_output=True, timeout=60)
            assert again.returncode == status and not (tmp_path / "short").exists(), os.listdir(tmp_path / "short")
        else:
            assert_outcome(tmp_path, r, status, message)

    @pytest.mark.torch
    @pytest.mark.skipif(not _OLD_PYTHON, reason="3.12+ knows the code (sys.monitoring): TestSystemExitOnPython312")
    @pytest.mark.parametrize("mode", ["LORA_OTEL=1", "import lora_otel.auto"])
    def test_a_jobs_unknown_code_is_said_unknown(self, tmp_path: Path, mode: str) -> None:
        """A job (it imports torch) ending in ``raise SystemExit(main())`` on Python <= 3.11: the
        code is nowhere an exit handler can read, so the journal, its line and inspect say it is
        unknown (before: ``exiting normally``, exit code 0, while the process exited 5)."""
        program = (
            "import torch\n\ndef main():\n    return 5\n\nif __name__ == '__main__':\n    raise SystemExit(main())\n"
        )
        assert_unknown(tmp_path, run_in_mode(tmp_path, mode, program), 5)

    def test_a_caught_sys_exit_is_not_the_outcome_under_lora_otel_run(self, tmp_path: Path) -> None:
        """A sys.exit(2) caught by the program, which then ends normally: exit code 0 in the
        journal and finished, under `lora-otel run` whatever the Python version."""
        program = "import sys\ntry:\n    sys.exit(2)\nexcept SystemExit:\n    pass\n"
        r = run_in_mode(tmp_path, "lora-otel run", program)
        assert_outcome(tmp_path, r, 0, None)


def _python312() -> str | None:
    import glob
    import shutil

    for candidate in [
        shutil.which("python3.13"),
        shutil.which("python3.12"),
        *sorted(glob.glob("/root/.pyenv/versions/3.1[23]*/bin/python3")),
    ]:
        if (
            candidate
            and subprocess.run(
                [candidate, "-c", "import sys; assert sys.version_info >= (3, 12)"], capture_output=True
            ).returncode
            == 0
        ):
            return candidate
    return None


@pytest.mark.skipif(_python312() is None, reason="no Python 3.12+ interpreter on this machine")
class TestSystemExitOnPython312:
    @pytest.mark.parametrize(
        ("program", "status", "message"),
        [
            ("raise SystemExit(3)\n", 3, "exit code 3"),
            (
                "def main():\n    return 5\n\nif __name__ == '__main__':\n    raise SystemExit(main())\n",
                5,
                "exit code 5",
            ),
            ("import sys\ntry:\n    sys.exit(2)\nexcept SystemExit:\n    pass\n", 0, None),
            ("try:\n    raise SystemExit(7)\nfinally:\n    print('cleanup')\n", 7, "exit code 7"),
            # A caught exception after the SystemExit was freed used to take its address (hostile trial).
            (
                "import atexit, sys\ndef cleanup():\n    try:\n        {}['missing']\n    except KeyError:\n"
                "        pass\natexit.register(cleanup)\nsys.exit(4)\n",
                4,
                "exit code 4",
            ),
            (
                "import sys\nfrom concurrent.futures import ThreadPoolExecutor\n"
                "with ThreadPoolExecutor(2) as ex:\n    list(ex.map(abs, range(9)))\nsys.exit(3)\n",
                3,
                "exit code 3",
            ),
            ("import sys\ntry:\n    sys.exit(6)\nexcept SystemExit as e:\n    raise e\n", 6, "exit code 6"),
            # A SystemExit Python ignores ("Exception ignored in ..."): the program ends with 0.
            ("class A:\n    def __del__(self):\n        raise SystemExit(5)\nA()\nprint('on')\n", 0, None),
            ("import atexit\ndef h():\n    raise SystemExit(4)\natexit.register(h)\n", 0, None),
            (
                "import gc, sys\ndef g():\n    try:\n        yield 1\n    finally:\n        sys.exit(9)\n"
                "it = g()\nnext(it)\ndel it\ngc.collect()\nprint('on')\n",
                0,
                None,
            ),
        ],
    )
    def test_in_process_without_a_supervisor(
        self, tmp_path: Path, program: str, status: int, message: str | None
    ) -> None:
        """On Python 3.12+ the traced process itself knows any SystemExit that ended it (and
        forgets one it caught), with no supervisor (`import lora_otel.auto`; the .pth hook is
        installed only in the test venv, whose Python is older)."""
        r = run_in_mode(tmp_path, "import lora_otel.auto", program, python=_python312() or "")
        assert_outcome(tmp_path, r, status, message)

    @pytest.mark.parametrize(
        ("program", "status", "message"),
        [
            (
                "import sys\nsys.monitoring.use_tool_id(4, 'mine')\n"
                "print(sys.monitoring.get_tool(4))\nraise SystemExit(3)\n",
                3,
                "exit code 3",
            ),
            (
                "import sys\nfor t in (4, 3):\n    sys.monitoring.use_tool_id(t, 'mine')\nsys.exit(4)\n",
                4,
                "exit code 4",
            ),
            ("import sys\nfor t in (4, 3):\n    sys.monitoring.use_tool_id(t, 'mine')\nraise SystemExit(3)\n", 3, None),
        ],
        ids=["takes-4", "takes-4-and-3-sys.exit", "takes-4-and-3-raise"],
    )
    def test_a_program_that_takes_our_monitoring_tool_id_gets_it(
        self, tmp_path: Path, program: str, status: int, message: str | None
    ) -> None:
        """A program (a profiler, a coverage tool of its own) that asks for ``sys.monitoring`` tool
        id 4, which lora_otel holds to see ``SystemExit``: it gets it (before: ValueError "tool 4
        is already in use", hostile trial) and lora_otel moves to id 3, the exit code still exact;
        with 3 taken too, a ``sys.exit`` is still seen and a bare ``raise SystemExit(3)`` is "exit
        code unknown", never 0."""
        r = run_in_mode(tmp_path, "import lora_otel.auto", program, python=_python312() or "")
        if "print(" in program:
            assert r.stdout == "mine\n", r.stderr
        if message is not None:
            assert_outcome(tmp_path, r, status, message)
            return
        assert r.returncode == status, r.stderr
        (path,) = journals(tmp_path / "j")
        j = read_journal(path)
        assert j.exit is not None and j.exit["code"] is None and j.exit["how"] == "unknown", j.exit
        assert j.exit["message"] == "exit code unknown: the program took the sys.monitoring tool ids 3 and 4", j.exit
        assert "exit code 0" not in r.stderr and "exiting normally" not in r.stderr, r.stderr

    @pytest.mark.parametrize(
        ("tail", "status", "message"),
        [
            ("", 0, None),
            ("import sys\nsys.exit(3)\n", 3, "exit code 3"),
            ("import sys\ntry:\n    sys.exit(2)\nexcept SystemExit:\n    pass\n", 0, None),
            ("def main():\n    return 5\n\nraise SystemExit(main())\n", 5, "unknown"),
        ],
        ids=["returns", "sys.exit", "caught-sys.exit", "raise"],
    )
    def test_after_a_recursion_error(self, tmp_path: Path, tail: str, status: int, message: str | None) -> None:
        """A program that met a ``RecursionError`` (the ``SystemExit`` watch stands down at the first
        one: `test_an_interrupt_ends_a_loop_that_retries_on_recursion_error`) still ends with an
        exact outcome for a return and a ``sys.exit``, and a ``raise SystemExit(n)`` after it is
        said unknown, never 0."""
        program = "def deep(n):\n    return deep(n + 1)\n\ntry:\n    deep(0)\nexcept RecursionError:\n    pass\n"
        r = run_in_mode(tmp_path, "import lora_otel.auto", program + tail, python=_python312() or "")
        if message != "unknown":
            assert_outcome(tmp_path, r, status, message)
            return
        assert r.returncode == status, r.stderr
        (path,) = journals(tmp_path / "j")
        j = read_journal(path)
        assert j.exit is not None and j.exit["code"] is None and j.exit["how"] == "unknown", j.exit
        assert re.fullmatch(r"exit code unknown: the program raised SystemExit at prog.py:\d+", j.exit["message"]), (
            j.exit
        )

    def test_an_interrupt_ends_a_loop_that_retries_on_recursion_error(self, tmp_path: Path) -> None:
        """CPython's ``test_threading`` ``test_print_exception_gh_102056``: a recursion that retries
        on ``RecursionError`` without end, stopped by ``_thread.interrupt_main()`` after a second,
        ends by that ``KeyboardInterrupt`` as without lora_otel, every time (before: hung in about
        half the runs on 3.12 and 3.13: the watch's RAISE callback, unable to run one frame short of
        the limit, turned the ``KeyboardInterrupt`` raised there into a ``RecursionError`` that the
        loop caught)."""
        program = (
            "import threading, time, _thread\n\n"
            "def f():\n    try:\n        f()\n    except RecursionError:\n        f()\n\n"
            "def g():\n    try:\n        raise ValueError()\n    except* ValueError:\n        f()\n\n"
            "def h():\n    time.sleep(1)\n    _thread.interrupt_main()\n\n"
            "t = threading.Thread(target=h)\nt.start()\ng()\nt.join()\n"
        )
        (tmp_path / "prog.py").write_text("import lora_otel.auto\n" + program)
        env = clean_env(LORA_OTEL_DIR=str(tmp_path / "j"), PYTHONPATH=str(REPO))
        for attempt in range(4):  # (it hung in about one run of two)
            try:
                r = subprocess.run(
                    [_python312() or "", "prog.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60
                )
            except subprocess.TimeoutExpired:
                pytest.fail(
                    "run %d: still running after 60 s (it ends in a second or three without lora_otel)" % attempt
                )
            assert r.returncode == -2 and "KeyboardInterrupt" in r.stderr, (r.returncode, r.stderr[-2000:])


POOL = """\
import multiprocessing as mp
import sys
import time


def square(x):
    return x * x


if __name__ == "__main__":
    ctx = mp.get_context(sys.argv[1])
    with ctx.Pool(4) as pool:
        print(sum(pool.map(square, range(100))))
        # Work still running when the with-block ends (the user's loop broke out early): the pool's
        # terminate() stops every worker with SIGTERM. (Idle workers race the pool's own "no more
        # work" sentinels and may leave by themselves first.)
        pool.map_async(time.sleep, [60] * 4)
        time.sleep(0.5)
"""


class TestPoolShutdown:
    @pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
    def test_workers_terminated_by_their_pool_are_not_a_failure(self, tmp_path: Path, method: str) -> None:
        """`with multiprocessing.Pool(4) as p: p.map(...)`: Pool.__exit__ terminates its idle
        workers (SIGTERM). The job finished as the user wanted: inspect DIR --summary says finished
        and exits 0, and the workers read as stopped by their parent (before: `killed (no exit
        record)`, exit status 3). (Forked workers that never wrote a record leave no journal: with
        ``fork`` and ``forkserver`` there may be none to judge.)"""
        (tmp_path / "pool.py").write_text(POOL)
        jdir = tmp_path / "j"
        r = subprocess.run(
            [PYTHON, "pool.py", method],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
            env=clean_env(LORA_OTEL="1", LORA_OTEL_DIR=str(jdir)),
        )
        assert r.returncode == 0 and "328350" in r.stdout, r.stderr
        s = summary(jdir)
        assert s.returncode == 0 and "finished" in s.stdout and "killed" not in s.stdout, s.stdout
        full = subprocess.run(
            [PYTHON, "-m", "lora_otel", "inspect", str(jdir)],
            env=clean_env(),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert full.returncode == 0, full.stdout + full.stderr
        if method == "spawn":  # a spawned worker has a journal from its first instruction
            assert "stopped by its parent with SIGTERM" in full.stdout, full.stdout


@pytest.mark.parametrize("mode", ["LORA_OTEL=1", "lora-otel run", "python -m lora_otel", "import lora_otel.auto"])
def test_sys_exit_in_a_thread_is_not_the_outcome(tmp_path: Path, mode: str) -> None:
    """``sys.exit(4)`` in a thread ends that thread only; the program goes on and exits 0, and every
    view says finished (found by the hostile trial: the journal said "exit code 4")."""
    r = run_in_mode(
        tmp_path, mode, "import sys, threading\nt = threading.Thread(target=lambda: sys.exit(4))\nt.start()\nt.join()\n"
    )
    assert_outcome(tmp_path, r, 0, None)


def test_python_dash_m_runs_its_package_import_unprofiled_and_keeps_the_code(tmp_path: Path) -> None:
    """``python -m pkg.run`` (as ``python -m axolotl.cli.train``): the package's import (a trainer
    imports torch there) runs with no profile function of lora_otel's (before, on 3.9-3.11, every
    call of it went through one: 3-5 times slower, hostile trial), and a ``raise SystemExit(3)`` at
    the module's end is still exit code 3 in the journal."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("import sys\nprint('profile during package import:', sys.getprofile())\n")
    # a job: it lives past its first beat
    (pkg / "run.py").write_text("import time\ntime.sleep(1.5)\nraise SystemExit(3)\n")
    r = subprocess.run(
        [PYTHON, "-m", "pkg.run"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        env=clean_env(LORA_OTEL="1", LORA_OTEL_DIR=str(tmp_path / "j")),
    )
    assert r.returncode == 3, r.stderr
    assert r.stdout == "profile during package import: None\n", r.stdout
    [path] = journals(tmp_path / "j")
    j = read_journal(path)
    assert j.exit is not None and j.exit.get("code") == 3, j.exit


def test_an_uncaught_keyboard_interrupt_is_an_end_by_sigint(tmp_path: Path) -> None:
    """An uncaught KeyboardInterrupt: Python ends itself with SIGINT (status 130 in a shell); the
    journal says so (before: "exit code 1", and "KeyboardInterrupt: " with nothing after it)."""
    r = run_in_mode(tmp_path, "LORA_OTEL=1", "raise KeyboardInterrupt\n")
    assert r.returncode == -2, r.stderr
    (path,) = journals(tmp_path / "j")
    j = read_journal(path)
    assert j.exit is not None and (j.exit["how"], j.exit["code"]) == ("signal", 130), j.exit
    assert j.exit["message"] == "interrupted (uncaught KeyboardInterrupt): ends by SIGINT", j.exit
