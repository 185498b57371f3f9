"""No clutter anywhere (issue 20, item 6): journals go beside ``--log`` or to a per-user state
directory, never into ``./lora-otel/`` of whatever directory a process ran in; a short normal run
of a process that is not a job leaves nothing behind; a directory of journals is kept to the last
runs by a retention rule; ``lora-otel inspect`` with no argument reads the newest run.

Every test runs real traced processes with the test session's ``XDG_STATE_HOME`` (conftest) or its
own, and unsets what `procs.clean_env` sets for the rest of the suite (``LORA_OTEL_DIR``,
``LORA_OTEL_KEEP_SHORT``) where the defaults are what is tested.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from procs import PYTHON, REPO, clean_env, journals, wait_for
from test_harm_shared_dirs import as_attacker, attacker, shared  # noqa: F401 - fixtures
from test_harm_verdicts import _python312
from test_sidecar import alive

from lora_otel.journal import runs
from lora_otel.journal.reader import read_journal

DEFAULTS = {"LORA_OTEL_DIR": "", "LORA_OTEL_KEEP_SHORT": ""}
"""What unsets `procs.TEST_DEFAULTS`: the defaults a user gets."""


def env_for(state: Path, **extra: str) -> dict:
    """A traced process's environment as a user's: journals by default, in ``state`` (XDG_STATE_HOME).
    One beat every 30 s: a short run stays short on a loaded machine (a run that lives to its first
    beat is a job)."""
    return clean_env(LORA_OTEL="1", XDG_STATE_HOME=str(state), **{**DEFAULTS, "LORA_OTEL_BEAT_S": "30", **extra})


def run(cmd: list[str], cwd: Path, env: dict, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def files_under(d: Path) -> list[str]:
    """Every file (not directory) below ``d``, relative, sorted."""
    return sorted(str(p.relative_to(d)) for p in d.rglob("*") if not p.is_dir()) if d.exists() else []


@pytest.fixture
def work(tmp_path: Path) -> Path:
    d = tmp_path / "work"
    d.mkdir()
    return d


@pytest.fixture
def state(tmp_path: Path) -> Path:
    return tmp_path / "state"


@pytest.fixture(scope="module")
def sidecar_for_every_process() -> bool:
    """Whether a process that ends at once still starts a sidecar (the sidecar's files are a job's:
    issue 20 starts it only when a process becomes one). A probe run, its journal kept."""
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        r = run([PYTHON, "-c", "pass"], Path(d), clean_env(LORA_OTEL="1", LORA_OTEL_DIR=d))
        assert r.returncode == 0, r.stderr
        [journal] = journals(Path(d))
        pid = read_journal(journal).root.attrs.get("lora_otel.sidecar.pid")
        if pid:
            wait_for(lambda: not alive(pid), what="the probe's sidecar to end")
        return bool(pid)


def _live(live: str, sidecar_for_every_process: bool) -> dict:
    if live == "default" and sidecar_for_every_process:
        pytest.skip("a process that ends at once still starts a sidecar here (its log and registry are a job's files)")
    return {"LORA_OTEL_LIVE": "0"} if live == "LORA_OTEL_LIVE=0" else {}


@pytest.mark.slow
class TestShortRunsLeaveNothing:
    @pytest.mark.parametrize("live", ["LORA_OTEL_LIVE=0", "default"])
    def test_twenty_python_c_pass_runs(
        self, work: Path, state: Path, live: str, sidecar_for_every_process: bool
    ) -> None:
        """20 ``python -c pass`` runs with ``LORA_OTEL=1`` leave no file in the working directory and
        none in the state directory (before: 20 journals and 20 stacks files in ./lora-otel/)."""
        env = env_for(state, **_live(live, sidecar_for_every_process))
        for _ in range(20):
            r = run([PYTHON, "-c", "pass"], work, env)
            assert r.returncode == 0, r.stderr
            assert r.stderr == ""  # (a short run: nothing of lora_otel's on its terminal, issue 36 item 9)
        assert files_under(work) == []
        assert files_under(state) == []
        assert (state / "lora-otel").is_dir()  # the state directory itself stays
        assert stat.S_IMODE((state / "lora-otel").stat().st_mode) == 0o700

    @pytest.mark.parametrize("live", ["LORA_OTEL_LIVE=0", "default"])
    def test_pip_version(self, work: Path, state: Path, live: str, sidecar_for_every_process: bool) -> None:
        """``python -m pip --version`` with ``LORA_OTEL=1`` prints what it prints without it and leaves
        nothing behind."""
        r = run([PYTHON, "-m", "pip", "--version"], work, env_for(state, **_live(live, sidecar_for_every_process)))
        assert r.returncode == 0 and r.stdout.startswith("pip "), r.stderr
        assert "[lora-otel]" not in r.stderr and (state / "lora-otel").is_dir()  # traced, its journal there
        assert files_under(work) == [] and files_under(state) == []

    def test_home_state_dir_is_created_private(self, work: Path, tmp_path: Path) -> None:
        """Without ``XDG_STATE_HOME``, journals go to ``~/.local/state/lora-otel``, each missing
        component created 0700; the short run leaves the directory empty."""
        home = tmp_path / "home"
        home.mkdir()
        env = clean_env(LORA_OTEL="1", LORA_OTEL_LIVE="0", LORA_OTEL_BEAT_S="30", HOME=str(home), **DEFAULTS)
        env.pop("XDG_STATE_HOME", None)
        r = run([PYTHON, "-c", "pass"], work, env)
        assert r.returncode == 0, r.stderr
        d = home / ".local" / "state" / "lora-otel"
        assert r.stderr == "" and d.is_dir()
        for p in (home / ".local", home / ".local" / "state", d):
            assert stat.S_IMODE(p.stat().st_mode) == 0o700, p
        assert files_under(home) == [] and files_under(work) == []

    def test_forked_children_that_exit_at_once(self, work: Path, state: Path) -> None:
        """A process forking 4 workers that each ``os._exit(0)`` at once, the parent ending normally:
        nothing left (neither the parent's journal nor the children's ``<stem>.<pid>`` ones)."""
        code = "import os\nfor _ in range(4):\n    pid = os.fork()\n    pid or os._exit(0)\n    os.waitpid(pid, 0)\n"
        r = run([PYTHON, "-c", code], work, env_for(state, LORA_OTEL_LIVE="0"))
        assert r.returncode == 0, r.stderr
        assert files_under(state) == [] and files_under(work) == []

    def test_a_per_run_directory_it_created_goes_too(self, work: Path, tmp_path: Path) -> None:
        """``LORA_OTEL_DIR=runs/7`` that did not exist: the short run removes the journal and the
        directories it created for it, so no empty ``runs/7`` is left; one that existed stays."""

        def short_run(d: str) -> subprocess.CompletedProcess:
            env = clean_env(
                LORA_OTEL="1", LORA_OTEL_LIVE="0", LORA_OTEL_BEAT_S="30", LORA_OTEL_DIR=d, LORA_OTEL_KEEP_SHORT=""
            )
            r = run([PYTHON, "-c", "pass"], work, env)
            assert r.returncode == 0, r.stderr
            return r

        assert (
            short_run("runs/7").stderr == ""
        )  # (a short run: nothing of lora_otel's on its terminal, issue 36 item 9)
        assert list(work.iterdir()) == []
        (work / "mine").mkdir()
        short_run("mine")
        assert [p.name for p in work.iterdir()] == ["mine"] and list((work / "mine").iterdir()) == []

    def test_keep_short_keeps_every_journal(self, work: Path, state: Path) -> None:
        """``LORA_OTEL_KEEP_SHORT=1``: a short normal run keeps its journal (for debugging)."""
        r = run([PYTHON, "-c", "pass"], work, env_for(state, LORA_OTEL_LIVE="0", LORA_OTEL_KEEP_SHORT="1"))
        assert r.returncode == 0, r.stderr
        [journal] = journals(state)
        assert read_journal(journal).exit["code"] == 0
        assert files_under(work) == []

    def test_a_file_put_at_the_journals_name_is_not_removed(self, work: Path, state: Path) -> None:
        """The program moves its journal aside (and the stacks file, where there is one) and puts
        files of its own under their names: at exit lora_otel removes nothing (it removes only the files it created, by
        identity), and the moved journal still holds the run."""
        code = (
            "import os\n"
            "from lora_otel._boot import core, preamble\n"
            "j, s = core.journal_path, preamble.stacks_path(core.journal_path)\n"
            "for p in (j, s):\n"
            "    if os.path.exists(p):  # the stacks file is made only when the process becomes a job\n"
            "        os.rename(p, p + '.moved')\n"
            "    with open(p, 'w') as f:\n"
            "        f.write('the program\\'s own\\n')\n"
            "print(j)\n"
        )
        r = run([PYTHON, "-c", code], work, env_for(state, LORA_OTEL_LIVE="0"))
        assert r.returncode == 0, r.stderr
        journal = Path(r.stdout.strip())
        stacks = journal.with_name(journal.name.replace(".otel.jsonl", ".stacks.txt"))
        assert journal.read_text() == stacks.read_text() == "the program's own\n"
        assert read_journal(str(journal) + ".moved").exit is not None


@pytest.mark.slow
class TestWhatIsKept:
    @pytest.mark.parametrize(
        "code",
        [
            "1 / 0",
            "import os; os._exit(0)",  # no exit handler ran: the journal does not say how it ended
            "import os, signal; os.kill(os.getpid(), signal.SIGTERM)",
        ],
    )
    def test_a_short_run_that_fails(self, work: Path, state: Path, code: str) -> None:
        """A short run that fails (an uncaught exception, a signal) or leaves without exit handlers
        keeps its journal. (One that ends by an exit code has said why itself: test_harm_lines.)"""
        r = run([PYTHON, "-c", code], work, env_for(state, LORA_OTEL_LIVE="0"))
        assert r.returncode != 0 or "_exit" in code, r.stderr
        [journal] = journals(state)
        assert read_journal(journal).root is not None
        assert files_under(work) == []

    def test_raise_system_exit_where_the_status_is_known(self, work: Path, state: Path) -> None:
        """``raise SystemExit(3)`` (which Python 3.11 and older hide from exit handlers) keeps its
        journal where the status is known: under ``python -m lora_otel``, and on 3.12+ with
        ``import lora_otel.auto`` (when such an interpreter is installed)."""
        (work / "prog.py").write_text("raise SystemExit(3)\n")
        r = run([PYTHON, "-m", "lora_otel", "prog.py"], work, env_for(state, LORA_OTEL_LIVE="0"))
        assert r.returncode == 3, r.stderr
        assert len(journals(state)) == 1
        python312 = _python312()
        if python312 is None:
            return
        (work / "prog.py").write_text("import lora_otel.auto\nraise SystemExit(3)\n")
        env = env_for(state, LORA_OTEL_LIVE="0", PYTHONPATH=str(REPO))
        env.pop("LORA_OTEL")
        r = run([python312, "prog.py"], work, env)
        assert r.returncode == 3, r.stderr
        assert len(journals(state)) == 2

    def test_a_run_that_lived_past_its_first_beat(self, work: Path, state: Path) -> None:
        """A normal run that lived past its first beat (``LORA_OTEL_BEAT_S=0.2``, 0.5 s) is a job:
        its journal stays; the worker it forked then, which exits at once, leaves nothing (it is
        judged from its own fork, not its parent's start)."""
        code = "import os, time\ntime.sleep(0.5)\npid = os.fork()\npid or os._exit(0)\nos.waitpid(pid, 0)\n"
        r = run([PYTHON, "-c", code], work, env_for(state, LORA_OTEL_LIVE="0", LORA_OTEL_BEAT_S="0.2"))
        assert r.returncode == 0, r.stderr
        [journal] = journals(state)
        assert read_journal(journal).pid == int(r.stderr.split("started pid ")[1].split()[0])

    def test_a_failed_forked_child_keeps_its_parents_journal(self, work: Path, state: Path) -> None:
        """A forked child that fails (an uncaught exception) keeps its journal, and the parent, though
        it ends normally, keeps its own: the child's journal refers to it."""
        code = "import os\npid = os.fork()\nif pid == 0:\n    raise RuntimeError(4)\nos.waitpid(pid, 0)\n"
        r = run([PYTHON, "-c", code], work, env_for(state, LORA_OTEL_LIVE="0"))
        assert r.returncode == 0, r.stderr
        found = journals(state)
        assert len(found) == 2, found
        parent, child = sorted(found, key=lambda p: len(p.name))
        assert child.name.startswith(parent.name[: -len(".otel.jsonl")] + ".")

    def test_a_spawned_child_still_running_keeps_its_parents_journal(self, work: Path, state: Path) -> None:
        """A launcher that starts a traced child and ends at once, normally: its journal stays
        while the child's journal (which names it as parent) is there."""
        code = (
            "import subprocess, sys\n"
            "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'],"
            " stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
            "from lora_otel._boot import core\n"
            "import glob, os, time\n"
            "while len(glob.glob(os.path.join(os.path.dirname(core.journal_path), '*.otel.jsonl'))) < 2:\n"
            "    time.sleep(0.01)\n"
            "print(p.pid)\n"
        )
        proc = subprocess.Popen(
            [PYTHON, "-c", code],
            cwd=work,
            env=env_for(state, LORA_OTEL_LIVE="0"),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        out, err = proc.communicate(timeout=60)
        try:
            assert proc.returncode == 0, err
            found = journals(state)
            assert len(found) == 2, found
            # a launcher that never became a job says its normal exit in its journal, not on the terminal
            parent = [j for j in map(read_journal, found) if j.root and j.root.attrs.get("process.pid") == proc.pid]
            assert len(parent) == 1 and parent[0].exit is not None
            assert (parent[0].exit["how"], parent[0].exit["code"]) == ("normal", 0)
        finally:
            if out.strip().isdigit():
                os.kill(int(out.strip()), 9)

    def test_beside_a_log_or_an_exact_journal(self, work: Path, state: Path) -> None:
        """A journal beside the program's ``--log`` file and one named by ``LORA_OTEL_JOURNAL``
        are the user's: a short normal run keeps them."""
        (work / "prog.py").write_text(
            "import argparse\np = argparse.ArgumentParser()\np.add_argument('--log')\n"
            "open(p.parse_args().log, 'a').write('my log\\n')\n"
        )
        r = run([PYTHON, "prog.py", "--log", "run.log"], work, env_for(state, LORA_OTEL_LIVE="0"))
        assert r.returncode == 0, r.stderr
        assert (work / "run.log.otel.jsonl").is_file()
        exact = work / "exact.otel.jsonl"
        r = run([PYTHON, "-c", "pass"], work, env_for(state, LORA_OTEL_LIVE="0", LORA_OTEL_JOURNAL=str(exact)))
        assert r.returncode == 0, r.stderr
        assert read_journal(exact).exit["code"] == 0
        assert files_under(state) == []

    def test_beside_a_log_the_program_showed_is_none(self, work: Path, state: Path) -> None:
        """``--log run.log`` that the program's argparse takes as a choice, not a file: lora_otel
        stops copying there (and takes back the file it made), and the journal it had put beside
        it goes at the short run's normal exit like any other: the directory is as before."""
        (work / "prog.py").write_text(
            "import argparse\np = argparse.ArgumentParser()\np.add_argument('--log', choices=['run.log', 'x'])\n"
            "p.parse_args()\n"
        )
        r = run([PYTHON, "prog.py", "--log", "run.log"], work, env_for(state, LORA_OTEL_LIVE="0"))
        assert r.returncode == 0, r.stderr
        assert "[lora-otel]" not in r.stderr  # (a short run: nothing of lora_otel's on its terminal, issue 36 item 9)
        assert files_under(work) == ["prog.py"] and files_under(state) == []


@pytest.mark.slow
class TestWhereJournalsGo:
    def test_never_in_the_working_directory(self, work: Path, state: Path) -> None:
        """A failing run (its journal kept) writes into the state directory, not ``./lora-otel/``."""
        r = run([PYTHON, "-c", "raise ValueError"], work, env_for(state, LORA_OTEL_LIVE="0"))
        assert r.returncode == 1
        assert files_under(work) == []
        assert [p.parent for p in journals(state)] == [state / "lora-otel"]

    def test_a_relative_dir_reaches_a_child_in_another_directory(self, work: Path) -> None:
        """``LORA_OTEL_DIR=j`` (relative) is taken from the working directory at start and given to
        children absolute: a child started in another directory writes beside its parent (before:
        into ``sub/j``), and sees the absolute path."""
        (work / "sub").mkdir()
        code = (
            "import subprocess, sys\n"
            "print(subprocess.run([sys.executable, '-c', 'import os; print(os.environ[\"LORA_OTEL_DIR\"])'],"
            " cwd='sub', capture_output=True, text=True, check=True).stdout, end='')\n"
        )
        r = run([PYTHON, "-c", code], work, clean_env(LORA_OTEL="1", LORA_OTEL_LIVE="0", LORA_OTEL_DIR="j"))
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip() == str(work / "j")
        assert len(journals(work / "j")) == 2
        assert not (work / "sub" / "j").exists()

    def test_lora_otel_run_makes_a_relative_dir_absolute(self, work: Path) -> None:
        """Under ``lora-otel run`` with ``LORA_OTEL_DIR=j``, a shell that changes directory before
        starting Python: that Python's journal is in the ``j`` of where ``run`` started."""
        (work / "sub").mkdir()
        r = run(
            [PYTHON, "-m", "lora_otel", "run", "--", "sh", "-c", 'cd sub && "$0" -c pass', PYTHON],
            work,
            clean_env(LORA_OTEL_LIVE="0", LORA_OTEL_DIR="j"),
        )
        assert r.returncode == 0, r.stderr
        assert len(journals(work / "j")) == 1
        assert not (work / "sub" / "j").exists()

    def test_an_unusable_home_falls_back_to_tmpdir(self, work: Path, tmp_path: Path) -> None:
        """A home where nothing can be created (``/proc``, as a read-only or absent home is): the
        journal goes to ``$TMPDIR/lora-otel-<uid>/`` and one line says why."""
        tmp = tmp_path / "tmp"
        tmp.mkdir()
        env = clean_env(LORA_OTEL="1", LORA_OTEL_LIVE="0", HOME="/proc", TMPDIR=str(tmp), **DEFAULTS)
        env.pop("XDG_STATE_HOME", None)
        r = run([PYTHON, "-c", "raise RuntimeError('no')"], work, env)
        assert r.returncode == 1
        [journal] = journals(tmp)
        assert journal.parent == tmp / ("lora-otel-%d" % os.geteuid())
        assert "cannot write journal at /proc/.local/state/lora-otel/" in r.stderr
        assert "using %s instead" % journal in r.stderr

    @pytest.mark.parametrize("planted", ["symlink", "open-dir"])
    @pytest.mark.parametrize("where", ["XDG_STATE_HOME", "HOME"])
    def test_a_state_dir_planted_by_another_user_is_not_used(
        self,
        work: Path,
        tmp_path: Path,
        shared: Path,  # noqa: F811 - the fixture
        attacker,  # noqa: F811 - the fixture
        planted: str,
        where: str,
    ) -> None:
        """``XDG_STATE_HOME`` or the home is a shared directory (mode 1777) where another user
        planted the component lora_otel would create (``lora-otel``, or ``.local``): a symlink to a
        directory of theirs, or a directory of theirs open to all. The journal goes to a private
        fallback directory, and one line says why."""
        name = shared / ("lora-otel" if where == "XDG_STATE_HOME" else ".local")
        target = tmp_path / "elsewhere"
        target.mkdir(mode=0o700)
        if planted == "symlink":
            as_attacker(attacker, "import os, sys; os.symlink(sys.argv[1], sys.argv[2])", str(target), str(name))
        else:
            as_attacker(attacker, "import os, sys; os.mkdir(sys.argv[1]); os.chmod(sys.argv[1], 0o777)", str(name))
        tmp = tmp_path / "tmp"
        tmp.mkdir()
        env = clean_env(LORA_OTEL="1", LORA_OTEL_LIVE="0", TMPDIR=str(tmp), **DEFAULTS)
        env[where] = str(shared)
        if where == "HOME":
            env.pop("XDG_STATE_HOME", None)
        r = run([PYTHON, "-c", "raise RuntimeError('kept')"], work, env)
        assert r.returncode == 1, r.stderr
        assert list(target.iterdir()) == []
        if planted == "open-dir":
            assert files_under(name) == []
        [journal] = journals(tmp)
        assert "using %s instead" % journal in r.stderr


def _make_run(directory: Path, code: str, **env: str) -> Path:
    """One real run in ``directory`` (its journal kept), started a little after the one before."""
    before = set(journals(directory))
    r = run(
        [PYTHON, "-c", code],
        directory,
        clean_env(LORA_OTEL="1", LORA_OTEL_LIVE="0", LORA_OTEL_DIR=str(directory), **env),
    )
    assert r.returncode != 0 or env, r.stderr
    new = sorted(set(journals(directory)) - before, key=lambda p: len(p.name))
    assert new, r.stderr
    return new[0]


def _age(paths: list[Path], seconds: float) -> None:
    t = time.time() - seconds
    for p in paths:
        os.utime(p, (t, t))


class TestRetention:
    @pytest.mark.slow
    def test_the_sidecar_prunes_the_oldest_finished_runs(self, tmp_path: Path) -> None:
        """``LORA_OTEL_KEEP=3``, a directory with a run still running (the oldest), five failed runs,
        a run with a forked child, and files that are not a run's: when a job starts, its sidecar
        removes the oldest finished runs beyond the newest 3 (every file of each, the forked child's
        journal with its parent's), says so in its log, and leaves the running run and every file
        that is not a run's alone."""
        d = tmp_path / "j"
        d.mkdir()
        running = subprocess.Popen(
            [PYTHON, "-c", "import sys; sys.stdin.read()"],
            cwd=d,
            env=clean_env(LORA_OTEL="1", LORA_OTEL_LIVE="0", LORA_OTEL_DIR=str(d)),
            stdin=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        try:
            wait_for(lambda: journals(d), what="the running process's journal")
            [running_journal] = journals(d)
            failed = []
            for _ in range(5):
                time.sleep(0.01)
                failed.append(_make_run(d, "raise RuntimeError(1)"))
            fork_code = "import os\nif os.fork() == 0:\n    raise RuntimeError(5)\nos.wait()\nraise RuntimeError(1)"
            forked = _make_run(d, fork_code)
            strangers = {
                "notes.txt": b"mine\n",
                "orphan.stacks.txt": b"no journal of this name\n",
                "keep.otel.jsonl.bak": b"{}\n",
                failed[0].name[: -len(".otel.jsonl")] + ".notes": b"a name that only starts like a run's\n",
            }
            for name, data in strangers.items():
                (d / name).write_bytes(data)
            (d / "link.otel.jsonl").symlink_to(failed[0])
            _age([p for p in d.iterdir() if not p.is_symlink() and p != running_journal], 3600)
            job = (
                "import lora_otel, time\nwith lora_otel.stage('train'):\n    time.sleep(0.2)\n"
                "from lora_otel._boot import core\nprint(core.journal_path)\n"
            )
            r = run(
                [PYTHON, "-c", job],
                d,
                clean_env(LORA_OTEL="1", LORA_OTEL_DIR=str(d), LORA_OTEL_KEEP="3"),
            )
            assert r.returncode == 0, r.stderr
            job_journal = Path(r.stdout.strip())
            log = Path(read_journal(job_journal).root.attrs["lora_otel.sidecar.log"])
            said = wait_for(
                lambda: [x for x in log.read_text().splitlines() if "retention:" in x], what="the retention line"
            )
            assert "removed the 4 oldest finished run(s) from %s" % d in said[0]
            left = {p.name for p in d.iterdir()}
            assert running_journal.name in left
            for gone in failed[:4]:
                stem = gone.name[: -len(".otel.jsonl")]
                assert not [n for n in left if n.startswith(stem + ".") and n != stem + ".notes"], gone
            for kept in (failed[4], forked, job_journal):
                assert kept.name in left
            forked_stem = forked.name[: -len(".otel.jsonl")]
            assert len([n for n in left if n.startswith(forked_stem) and n.endswith(".otel.jsonl")]) == 2
            for name, data in strangers.items():
                assert (d / name).read_bytes() == data
            assert (d / "link.otel.jsonl").is_symlink()
        finally:
            running.kill()
            running.communicate()

    @pytest.mark.slow
    def test_a_directory_over_its_size_limit(self, tmp_path: Path) -> None:
        """`runs.prune` with a byte limit: the newest runs that fit are kept, older finished ones go;
        the newest run is kept even when it alone is over the limit; runs changed within the last
        minute are kept."""
        d = tmp_path / "j"
        d.mkdir()
        made = []
        for _ in range(4):
            time.sleep(0.01)
            made.append(_make_run(d, "raise RuntimeError(1)"))
        size = {r.journal: r.size for r in runs.runs_in(str(d))}
        assert sorted(size) == sorted(str(p) for p in made)
        two = size[str(made[3])] + size[str(made[2])]
        assert runs.prune(str(d), keep_runs=0, keep_bytes=two) == []  # all changed within the last minute
        _age(list(d.iterdir()), 3600)
        removed = runs.prune(str(d), keep_runs=0, keep_bytes=two)
        assert [r.journal for r in removed] == [str(p) for p in made[:2]]
        removed = runs.prune(str(d), keep_runs=0, keep_bytes=size[str(made[3])] - 1)
        assert [r.journal for r in removed] == [str(made[2])]
        assert journals(d) == [made[3]]

    def test_limits_from_the_environment(self) -> None:
        """``LORA_OTEL_KEEP`` / ``LORA_OTEL_KEEP_MB``: defaults 100 runs and 500 MB; a bad value is
        one problem and the default."""
        assert runs.limits({}) == (100, 500_000_000, [])
        assert runs.limits({"LORA_OTEL_KEEP": "7", "LORA_OTEL_KEEP_MB": "0"}) == (7, 0, [])
        keep, mb, problems = runs.limits({"LORA_OTEL_KEEP": "-1", "LORA_OTEL_KEEP_MB": "lots"})
        assert (keep, mb) == (100, 500_000_000) and len(problems) == 2


@pytest.mark.slow
class TestNewestRun:
    def test_inspect_watch_and_report_with_no_argument(self, work: Path, state: Path) -> None:
        """``lora-otel inspect`` with no argument reads the newest run of the state directory and
        names it in its first line; with ``LORA_OTEL_DIR`` set, the newest run there. ``watch`` and
        ``report`` likewise."""
        env = env_for(state, LORA_OTEL_LIVE="0")
        for code in ("raise RuntimeError('first')", "raise RuntimeError('second')"):
            assert run([PYTHON, "-c", code], work, env).returncode == 1
            time.sleep(0.01)
        newest = max(journals(state), key=lambda p: read_journal(p).root.start_ns)
        cli = clean_env(XDG_STATE_HOME=str(state), **DEFAULTS)
        r = run([PYTHON, "-m", "lora_otel", "inspect"], work, cli)
        assert r.returncode == 0, r.stderr
        assert r.stderr.splitlines()[0] == "lora-otel inspect: reading %s (the newest run in %s)" % (
            newest,
            state / "lora-otel",
        )
        assert r.stdout.startswith("failed: uncaught RuntimeError: second"), r.stdout
        r = run([PYTHON, "-m", "lora_otel", "watch", "--once"], work, cli)
        assert str(newest) in r.stderr.splitlines()[0] and "second" in r.stdout, r.stderr
        r = run([PYTHON, "-m", "lora_otel", "report", "-o", str(work / "job.html")], work, cli)
        assert r.returncode == 0 and str(newest) in r.stderr.splitlines()[0], r.stderr
        assert (work / "job.html").is_file()

        other = work / "elsewhere"
        other.mkdir()
        _make_run(other, "raise RuntimeError('third')")
        r = run([PYTHON, "-m", "lora_otel", "inspect"], work, {**cli, "LORA_OTEL_DIR": str(other)})
        assert r.returncode == 0 and "(the newest run in %s)" % other in r.stderr.splitlines()[0], r.stderr
        assert r.stdout.startswith("failed: uncaught RuntimeError: third"), r.stdout

    def test_no_run_to_show(self, work: Path, state: Path) -> None:
        """Nothing in the directory: exit status 2 and one line saying where it looked."""
        r = run([PYTHON, "-m", "lora_otel", "inspect"], work, clean_env(XDG_STATE_HOME=str(state), **DEFAULTS))
        assert r.returncode == 2
        assert r.stderr.strip() == (
            "lora-otel inspect: no journal given, and no run in %s (the journal directory); name a "
            "journal, a --log file or a directory" % (state / "lora-otel")
        )


@pytest.mark.slow
class TestSidecarAndShortChildren:
    def test_a_forked_child_that_exits_at_once_under_a_job(self, work: Path, state: Path) -> None:
        """A job (its sidecar running) forks a worker that exits at once: the worker's journal is
        gone, the job's stays, and the sidecar says nothing about a journal it could not read."""
        code = (
            "import os, time, lora_otel\n"
            "with lora_otel.stage('train'):\n"
            "    pid = os.fork()\n"
            "    pid or os._exit(0)\n"
            "    os.waitpid(pid, 0)\n"
            "    time.sleep(0.3)\n"
            "from lora_otel._boot import core\nprint(core.journal_path)\n"
        )
        r = run([PYTHON, "-c", code], work, env_for(state))
        assert r.returncode == 0, r.stderr
        job = Path(r.stdout.strip())
        assert journals(state) == [job]
        pid = read_journal(job).root.attrs["lora_otel.sidecar.pid"]
        wait_for(lambda: not alive(pid), what="the sidecar to end")
        log = Path(read_journal(job).root.attrs["lora_otel.sidecar.log"]).read_text()
        assert "job ended" in log and "cannot read" not in log and "ignoring" not in log, log


if sys.platform != "linux":  # pragma: no cover
    pytestmark = pytest.mark.skip(reason="Linux: /proc tells whether a run's process still runs")
