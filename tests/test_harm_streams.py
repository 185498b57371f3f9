"""Harmless everywhere, output streams (issue 12, item 3): a traced program's stdout carries only
what the program writes; lora_otel's lines go to stderr and the ``--log`` file, and a process
started by a traced process keeps its info lines off the terminal (the journal has them all)."""

from __future__ import annotations

import json
import re
import subprocess
import textwrap
from pathlib import Path

import pytest
from procs import LINE_RE, PYTHON, clean_env, journals

from lora_otel.journal.reader import read_journal

pytestmark = pytest.mark.slow

PAYLOAD = {"rows": [1, 2, 3], "name": "ünïcode", "ok": True}
PRINT_JSON = "import json; print(json.dumps(%r))" % (PAYLOAD,)
EXPECTED = (json.dumps(PAYLOAD) + "\n").encode()

# A program that parses its child's output, as build tools, launchers and test runners do.
PARSE_CHILD = textwrap.dedent("""
    import json, subprocess, sys
    out = subprocess.check_output([sys.executable, "-c", %r])
    print("PARSED", json.loads(out) == %r, flush=True)
""") % (PRINT_JSON, PAYLOAD)


def lora_lines(text: str) -> list:
    """``(pid, message)`` of every ``[lora-otel]`` line in ``text``."""
    return [(int(m.group(1)), m.group(3)) for m in (re.match(LINE_RE, ln) for ln in text.splitlines()) if m]


def test_parsing_a_childs_json_output_under_lora_otel_1(tmp_path: Path) -> None:
    """``json.loads(subprocess.check_output([python, "-c", "print(json.dumps(...))"]))`` works with
    LORA_OTEL=1 in the environment: the child's stdout is the child's bytes, and so is the parent's."""
    (tmp_path / "parse.py").write_text(PARSE_CHILD)
    r = subprocess.run(
        [PYTHON, "parse.py"], cwd=tmp_path, env=clean_env(LORA_OTEL="1"), capture_output=True, timeout=60
    )
    assert r.returncode == 0, r.stderr.decode(errors="replace")
    assert r.stdout == b"PARSED True\n"
    assert len(journals(tmp_path / "lora-otel")) == 2  # both processes were traced all the same


def test_lora_otel_run_passes_the_programs_stdout_byte_exact(tmp_path: Path) -> None:
    """``lora-otel run [--tree] -- python -c 'print(json.dumps(...))'``: stdout is exactly the
    program's bytes, so ``lora-otel run ... | jq`` works; the span tree (with --tree) and the
    ``[lora-otel]`` lines are on stderr."""
    for extra in ([], ["--tree"]):
        r = subprocess.run(
            [PYTHON, "-m", "lora_otel", "run", *extra, "--", PYTHON, "-c", PRINT_JSON],
            cwd=tmp_path,
            env=clean_env(),
            capture_output=True,
            timeout=60,
        )
        err = r.stderr.decode(errors="replace")
        assert r.returncode == 0, err
        assert r.stdout == EXPECTED, (extra, r.stdout)
        assert json.loads(r.stdout) == PAYLOAD
        assert any("started pid" in msg for _, msg in lora_lines(err))
        if extra:
            assert "process " in err and "finished normally" in err  # the tree, where a terminal shows it


def test_lora_otel_run_parsed_by_a_parent(tmp_path: Path) -> None:
    """A program parsing ``lora-otel run -- python -c ...``'s output with json.loads works."""
    script = textwrap.dedent("""
        import json, subprocess, sys
        out = subprocess.check_output([sys.executable, "-m", "lora_otel", "run", "--", sys.executable, "-c", %r])
        print("PARSED", json.loads(out) == %r, flush=True)
    """) % (PRINT_JSON, PAYLOAD)
    (tmp_path / "parse.py").write_text(script)
    r = subprocess.run([PYTHON, "parse.py"], cwd=tmp_path, env=clean_env(), capture_output=True, timeout=60)
    assert r.returncode == 0, r.stderr.decode(errors="replace")
    assert r.stdout == b"PARSED True\n"


def test_pip_list_json_is_parseable_under_lora_otel_1(tmp_path: Path) -> None:
    """``LORA_OTEL=1 pip list --format=json | python -c 'import json,sys; json.load(sys.stdin)'``:
    the real pip of this venv, traced, prints JSON that parses."""
    with subprocess.Popen(
        [PYTHON, "-m", "pip", "list", "--format=json", "--disable-pip-version-check"],
        cwd=tmp_path,
        # a short run says nothing until its first beat: 30 s away, so that a loaded machine's slow pip
        # (over a second in a busy CI run) is still a short run here
        env=clean_env(LORA_OTEL="1", LORA_OTEL_BEAT_S="30"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    ) as pip:
        reader = subprocess.run(
            [PYTHON, "-c", "import json,sys; d = json.load(sys.stdin); print(len(d) > 0)"],
            cwd=tmp_path,
            env=clean_env(LORA_OTEL="1"),
            stdin=pip.stdout,
            capture_output=True,
            timeout=120,
        )
        assert pip.stdout is not None
        pip.stdout.close()
        pip_err = pip.communicate(timeout=120)[1].decode(errors="replace")
    assert pip.returncode == 0, pip_err
    assert reader.returncode == 0, reader.stderr.decode(errors="replace")
    assert reader.stdout == b"True\n"
    assert journals(tmp_path / "lora-otel")  # traced (a short run: no line of lora_otel's on stderr, issue 36 item 9)
    assert not lora_lines(pip_err)


CHILDREN = textwrap.dedent("""
    import subprocess, sys
    ok = subprocess.run([sys.executable, "-c", "print('CHILD ok')", "--log", "child.log"])
    bad = subprocess.run([sys.executable, "-c", "import sys; print('CHILD bad'); sys.exit(3)"])
    print("PARENT", ok.returncode, bad.returncode, flush=True)
""")


def test_children_of_a_traced_process_are_quiet_unless_they_fail(tmp_path: Path) -> None:
    """A traced parent starts a traced child that succeeds and one that exits 3, all short: the
    terminal (stdout and stderr of the whole tree) shows nothing of lora_otel's (issue 36 item 9:
    a short process's start and end are in its journal); each child's journal holds its info lines
    and the failing one's its end; the ``--log child.log`` the child never opened is not made."""
    (tmp_path / "parent.py").write_text(CHILDREN)
    r = subprocess.run(
        [PYTHON, "parent.py"], cwd=tmp_path, env=clean_env(LORA_OTEL="1"), capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout == "CHILD ok\nCHILD bad\nPARENT 0 3\n"
    found = [read_journal(path) for path in journals(tmp_path)]
    assert len(found) == 3
    parent = [j for j in found if j.root.parent_id is None]
    assert len(parent) == 1
    ok_child = next(j for j in found if (j.log_path or "").endswith("child.log"))
    bad_child = next(j for j in found if j is not ok_child and j is not parent[0])
    assert lora_lines(r.stderr) == [], r.stderr
    assert any(ln.msg.startswith("exiting: exit code 3 after ") for ln in bad_child.lines)
    for child in (ok_child, bad_child):
        info = [ln.msg for ln in child.lines if ln.level == "info"]
        assert any(m.startswith("started pid %d" % child.pid) for m in info), info
    assert any(m.startswith("exiting normally") for m in (ln.msg for ln in ok_child.lines))
    assert not (tmp_path / "child.log").exists()


def test_log_file_still_receives_the_lines(tmp_path: Path) -> None:
    """A top process with ``--log`` that opens it and lives past a beat: every line it prints on
    stderr is in the file too, in order (what waited until the program opened the file first)."""
    (tmp_path / "job.py").write_text(
        "import argparse, logging, time\np = argparse.ArgumentParser()\np.add_argument('--log')\n"
        "a = p.parse_args()\nlogging.basicConfig(filename=a.log)\nfor _ in range(1000):\n"
        "    if '[lora-otel]' in open(a.log).read():\n        break\n    time.sleep(0.05)\nprint('PROGRAM')\n"
    )
    r = subprocess.run(
        [PYTHON, "job.py", "--log", "run.log"],
        cwd=tmp_path,
        env=clean_env(LORA_OTEL="1"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout == "PROGRAM\n"
    printed = lora_lines(r.stderr)
    logged = lora_lines((tmp_path / "run.log").read_text())
    assert printed and printed == logged
    assert logged[0][1].startswith("started pid") and logged[-1][1].startswith("exiting normally")


def test_forked_children_are_quiet(tmp_path: Path) -> None:
    """A ``multiprocessing`` fork worker of a traced process prints nothing of lora_otel's on the
    terminal (it used to print ``exiting normally`` per worker); one that wrote nothing and ended
    well at once leaves no journal either."""
    (tmp_path / "pool.py").write_text(
        textwrap.dedent("""
        import multiprocessing as mp
        def square(x):
            return x * x
        if __name__ == "__main__":
            ctx = mp.get_context("fork")
            p = ctx.Process(target=square, args=(3,))
            p.start(); p.join()
            print("DONE", p.exitcode, flush=True)
    """)
    )
    r = subprocess.run(
        [PYTHON, "pool.py"], cwd=tmp_path, env=clean_env(LORA_OTEL="1"), capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout == "DONE 0\n"
    found = [read_journal(p) for p in journals(tmp_path / "lora-otel")]
    top = [j for j in found if j.root.parent_id is None]
    assert len(top) == 1 and len(found) == 1
    assert lora_lines(r.stderr) == []  # (the top process too: a short run, issue 36 item 9)


def test_closed_stderr_does_not_raise(tmp_path: Path) -> None:
    """stderr closed by the launcher (and stdout a pipe): the program runs and exits 0, its stdout
    untouched; lora_otel's lines are still in the journal."""
    (tmp_path / "job.py").write_text("print('PROGRAM ran')\n")
    r = subprocess.run(
        [PYTHON, "job.py"],
        cwd=tmp_path,
        env=clean_env(LORA_OTEL="1"),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=60,
        preexec_fn=lambda: __import__("os").close(2),
    )
    assert r.returncode == 0
    assert r.stdout == "PROGRAM ran\n"
    j = read_journal(journals(tmp_path / "lora-otel")[0])
    assert any(ln.msg.startswith("started pid") for ln in j.lines)


RANKS = textwrap.dedent("""
    import os, subprocess, sys
    if len(sys.argv) == 1:  # the launcher (as torchrun is): two ranks, RANK set for each
        procs = [subprocess.Popen([sys.executable, __file__, "rank"], env=dict(os.environ, RANK=str(r), WORLD_SIZE="2"))
                 for r in (0, 1)]
        print("LAUNCHER", [p.wait() for p in procs], flush=True)
    elif sys.argv[1] == "rank":  # a rank starts a helper of its own (a DataLoader worker, a tool)
        subprocess.check_call([sys.executable, "-c", "pass"])
""")


def test_ranks_a_traced_launcher_starts_speak_their_helpers_do_not(tmp_path: Path) -> None:
    """A traced launcher (torchrun, a multi-process ``accelerate launch``) starts the job's ranks
    (``RANK`` set): their lines reach the terminal and the log panel as a top process's do, since
    the ranks are where training happens; the helpers each rank starts (same ``RANK``) stay quiet.
    (Here all are short: none says anything on the terminal, issue 36 item 9; the journals say
    which is which.)"""
    (tmp_path / "launch.py").write_text(RANKS)
    r = subprocess.run(
        [PYTHON, "launch.py"], cwd=tmp_path, env=clean_env(LORA_OTEL="1"), capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0 and r.stdout == "LAUNCHER [0, 0]\n", r.stderr
    found = [read_journal(path) for path in journals(tmp_path)]
    assert len(found) == 5
    by_kind: dict = {"launcher": [], "rank": [], "helper": []}
    for j in found:  # (no process here is a job: their journals hold no argv, only what they are)
        kind = "launcher" if j.root.parent_id is None else "helper" if j.config.get("quiet") else "rank"
        by_kind[kind].append(j.pid)
    assert [len(by_kind[k]) for k in ("launcher", "rank", "helper")] == [1, 2, 2], by_kind
    started = {pid for pid, msg in lora_lines(r.stderr) if msg.startswith("started pid")}
    assert started <= set(by_kind["launcher"]) | set(by_kind["rank"]), (started, by_kind)
