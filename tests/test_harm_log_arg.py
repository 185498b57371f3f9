"""The program's ``--log``, safely (issue 20, item 1; and item 7's ``-p no:cacheprovider``).

A ``--log`` in a program's argv is lora_otel's log file only when it surely is one: a value that
looks like a log file's path (a ``.log``/``.txt``/``.out``/``.err`` name in a directory that exists,
not an option, not a level), a file that is new or holds plain text lines — and the program's
argparse, when it parses that option, does not show it to be a flag, a choice, a number or a file it
reads (then lora_otel stops and takes back what it wrote). Each case runs a real program that a
hostile user wrote with ``LORA_OTEL=1`` exported; what must hold is that the program's files, their
modes and directories are what they would be without lora_otel, and that the seed's case (a
launcher's ``--log runs/x/train.log``, the job stuck in an import) still gets its lines.

Journals go to ``LORA_OTEL_DIR`` (``j/``) here, away from the program's files, unless a test is
about the journal beside the log.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from procs import PYTHON, clean_env, journals, wait_for

from lora_otel._boot.redact import REDACTED, redact_argv
from lora_otel.journal.reader import read_journal

FROZEN_MOD = "import ctypes\ndef hold():\n    while True:\n        ctypes.PyDLL(None).pause()\nhold()\n"


def run(
    cwd: Path, script: str, *args: str, traced: bool = True, umask: int | None = None, **env: str
) -> subprocess.CompletedProcess:
    """``python job.py ARGS`` in ``cwd`` (with ``LORA_OTEL=1`` unless not ``traced``), journals in
    ``cwd/j`` unless ``env`` says otherwise."""
    (cwd / "job.py").write_text(script, encoding="utf-8")
    base = {"LORA_OTEL": "1", "LORA_OTEL_DIR": str(cwd / "j")} if traced else {}
    base.update(env)
    return subprocess.run(
        [PYTHON, "job.py", *args],
        cwd=cwd,
        env=clean_env(**base),
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=(lambda: os.umask(umask)) if umask is not None else None,
    )


def files_in(d: Path) -> set[str]:
    """Every path under ``d`` (relative), but the script and the journal directory ``j/``."""
    return {
        str(p.relative_to(d)) for p in d.rglob("*") if p.name != "job.py" and not str(p.relative_to(d)).startswith("j")
    }


def sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def lora_lines(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln.startswith("[lora-otel]")]


def said(cwd: Path) -> list[str]:
    """Every line lora_otel journaled under ``cwd`` (a short process shows none on its terminal:
    issue 36 item 9; run it with ``LORA_OTEL_KEEP_SHORT=1`` to keep its journal)."""
    return [ln.msg for p in journals(cwd) for ln in read_journal(p).lines]


PLOT = """
import argparse, csv
p = argparse.ArgumentParser()
p.add_argument("--log", action="store_true", help="log-scale axes")
p.add_argument("data")
a = p.parse_args()
with open(a.data, newline="") as f:
    rows = [[float(x) for x in row] for row in csv.reader(f)]   # dies on a damaged file
print("plotted %d rows, log=%s" % (len(rows), a.log))
"""


@pytest.mark.slow
class TestTheProgramsFilesAreLeftAlone:
    """Each case of the issue's list: the file, its mode, its directory, its format stay as the
    program alone would leave them."""

    def test_store_true_log_before_a_csv_file(self, tmp_path: Path) -> None:
        """``plot.py --log data.csv`` (``--log`` a ``store_true`` flag): data.csv keeps its bytes,
        and the program, run twice, reads it both times."""
        data = tmp_path / "data.csv"
        data.write_text("1,2\n3,4\n")
        before = sha(data)
        for _ in range(2):
            r = run(tmp_path, PLOT, "--log", "data.csv")
            assert r.returncode == 0, r.stderr
            assert "plotted 2 rows, log=True" in r.stdout
        assert sha(data) == before
        assert files_in(tmp_path) == {"data.csv"}  # no data.csv.otel.jsonl, .stacks.txt, ... beside it

    def test_store_true_log_before_a_new_output_file(self, tmp_path: Path) -> None:
        """``report.py --log out.txt`` (``--log`` a flag, out.txt the output, created exclusively):
        lora_otel does not create out.txt before the program opens it (issue 36 item 4); the moment
        argparse shows ``--log`` is a flag, it stops waiting to copy there (one line in the journal
        says so), and the program creates its output as it would without lora_otel."""
        script = (
            "import argparse\np = argparse.ArgumentParser()\np.add_argument('--log', action='store_true')\n"
            "p.add_argument('out')\na = p.parse_args()\n"
            "with open(a.out, 'x') as f:\n    f.write('result\\n')\n"
        )
        r = run(tmp_path, script, "--log", "out.txt", LORA_OTEL_KEEP_SHORT="1")
        assert r.returncode == 0, r.stderr
        assert (tmp_path / "out.txt").read_text() == "result\n"
        [line] = [ln for ln in said(tmp_path) if "--log is a flag to this program" in ln]
        assert "out.txt" in line, line
        # the watchdog is told too: the journal takes the --log file back
        [jpath] = [p for p in journals(tmp_path) if p.name == "out.txt.otel.jsonl"]
        j = read_journal(jpath)
        assert j.log_id is None and j.root.attrs["lora_otel.log.copied"] is False

    def test_store_true_log_before_an_existing_text_file(self, tmp_path: Path) -> None:
        """``count.py --log notes.txt`` (a flag, notes.txt an existing text file the program reads):
        a file that holds lines at start waits for the program to open it for writing before
        lora_otel copies a line there, so nothing is ever written to it (before: lines were
        appended at start and taken back when argparse showed the flag)."""
        notes = tmp_path / "notes.txt"
        notes.write_text("alpha\nbeta\n")
        before, mtime = sha(notes), notes.stat().st_mtime_ns
        script = (
            "import argparse, hashlib\np = argparse.ArgumentParser()\np.add_argument('--log', action='store_true')\n"
            "p.add_argument('notes')\na = p.parse_args()\n"
            "print(hashlib.sha256(open(a.notes, 'rb').read()).hexdigest())\n"
        )
        r = run(tmp_path, script, "--log", "notes.txt")
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip() == before
        assert sha(notes) == before and notes.stat().st_mtime_ns == mtime
        assert not any("taken back" in ln for ln in lora_lines(r.stderr)), r.stderr

    @pytest.mark.parametrize(
        "script,args,expect",
        [
            pytest.param(
                "import argparse, collections\np = argparse.ArgumentParser()\np.add_argument('--log', required=True)\n"
                "a = p.parse_args()\n"
                "print(dict(collections.Counter(ln.split()[1] for ln in open(a.log) if ln.strip())))\n",
                ("--log", "access.log"),
                "{'200': 1, '404': 1}",
                id="argparse-str-option-read-as-input",
            ),
            pytest.param(
                "import sys\nlogscale = '--log' in sys.argv\n"
                "print('sum', sum(float(x) for x in open(sys.argv[-1])), logscale)\n",
                ("--log", "access.log"),
                None,
                id="manual-flag-then-a-data-file",
            ),
        ],
    )
    def test_an_existing_log_the_program_reads_is_never_written(
        self, tmp_path: Path, script: str, args: tuple, expect: str | None
    ) -> None:
        """A ``--log`` file that holds lines at start and that the program only reads (a log
        analyser's input; a flag before a data file, parsed by hand so no argparse hook can tell):
        lora_otel writes nothing there until the program opens it for writing, which it never does,
        so the program reads its own bytes and exits as without lora_otel (before: lora_otel's
        lines were appended at start and the analyser crashed on them)."""
        log = tmp_path / "access.log"
        log.write_text("GET 200\nGET 404\n" if expect else "1\n2\n")
        before = sha(log)
        untraced = run(tmp_path, script, *args, traced=False)
        r = run(tmp_path, script, *args, LORA_OTEL_KEEP_SHORT="0")  # as outside the tests: a short run goes
        assert (r.returncode, r.stdout) == (untraced.returncode, untraced.stdout) == (0, r.stdout), r.stderr
        if expect:
            assert r.stdout.strip() == expect
        assert sha(log) == before
        assert files_in(tmp_path) == {"access.log"}  # a short run: no journal left beside it either

    def test_an_existing_log_gets_the_lines_once_the_program_writes_it(self, tmp_path: Path) -> None:
        """A log file kept from earlier runs (it holds lines at start) that the program opens for
        appending: lora_otel's lines written before that wait and follow the program's first line;
        later lines go there as they are said."""
        log = tmp_path / "run.log"
        log.write_text("an earlier run\n")
        script = (
            "import logging, sys, time\nlogging.basicConfig(filename=sys.argv[2], level=logging.INFO)\n"
            "logging.info('my first line')\nimport json\ntime.sleep(1.5)\nlogging.info('my last line')\n"
        )
        r = run(tmp_path, script, "--log", "run.log", LORA_OTEL_KEEP_SHORT="1")
        assert r.returncode == 0, r.stderr
        lines = log.read_text().splitlines()
        assert lines[:2] == ["an earlier run", "INFO:root:my first line"], lines
        started = next(i for i, ln in enumerate(lines) if "] started pid " in ln)
        assert started == 2, lines
        assert any("exiting normally" in ln for ln in lines[lines.index("INFO:root:my last line") :]), lines

    def test_lines_past_what_waits_in_memory_are_said_to_be_in_the_journal(self, tmp_path: Path) -> None:
        """More of lora_otel's lines than wait in memory (256) before the program opens its log:
        the first ones follow the program's first line, then one line says how many more are in
        the journal only (before: dropped without a word)."""
        log = tmp_path / "run.log"
        log.write_text("an earlier run\n")
        script = (
            "import logging, sys\nimport lora_otel\n"
            "for i in range(300):\n    lora_otel.mark('before the log %d' % i)\n"
            "logging.basicConfig(filename=sys.argv[2], level=logging.INFO)\nlogging.info('my first line')\n"
            "import time\ntime.sleep(1.5)\n"  # a job: its exit line comes once the program writes the log
        )
        r = run(tmp_path, script, "--log", "run.log")
        assert r.returncode == 0, r.stderr
        lines = log.read_text().splitlines()
        assert lines[:2] == ["an earlier run", "INFO:root:my first line"], lines[:3]
        marks = [ln for ln in lines if "mark: before the log " in ln]
        assert 200 < len(marks) < 256 and marks[0].endswith("before the log 0"), len(marks)
        [said] = [ln for ln in lines if "written while the program had not yet opened this file" in ln]
        assert said.endswith("are in the journal %s only" % (tmp_path / "run.log.otel.jsonl")), said
        dropped = int(said.split("] ", 1)[1].split()[0])
        assert len(marks) + dropped >= 300, (len(marks), dropped)
        assert lines.index(said) > lines.index(marks[-1])

    def test_flag_given_a_value_exits_and_leaves_the_file(self, tmp_path: Path) -> None:
        """``count.py --log=notes.txt`` (a flag given a value: argparse exits with status 2): the
        lines lora_otel appended at start are taken back as the program exits."""
        notes = tmp_path / "notes.txt"
        notes.write_text("alpha\n")
        before = sha(notes)
        script = "import argparse\np = argparse.ArgumentParser()\np.add_argument('--log', action='store_true')\n"
        r = run(tmp_path, script + "p.parse_args()\n", "--log=notes.txt")
        assert r.returncode == 2 and "ignored explicit argument" in r.stderr, r.stderr
        assert sha(notes) == before

    def test_a_launchers_remainder_is_not_its_option(self, tmp_path: Path) -> None:
        """A launcher whose own ``--logdir`` flag ``--log`` would abbreviate, given ``train.py --log
        runs/a.log`` after the script (argparse ``REMAINDER``): the launcher's parse does not take
        the script's ``--log``, so runs/a.log stays lora_otel's log file (beside it the journal; the
        file itself is created only when the lines are needed there: issue 36 item 4)."""
        (tmp_path / "runs").mkdir()
        script = (
            "import argparse\np = argparse.ArgumentParser()\np.add_argument('--logdir', action='store_true')\n"
            "p.add_argument('script')\np.add_argument('rest', nargs=argparse.REMAINDER)\na = p.parse_args()\n"
            "print(a.script, a.rest)\n"
        )
        r = run(tmp_path, script, "train.py", "--log", "runs/a.log", LORA_OTEL_KEEP_SHORT="1")
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip() == "train.py ['--log', 'runs/a.log']"
        j = read_journal(tmp_path / "runs" / "a.log.otel.jsonl")
        assert j.log_path == str(tmp_path / "runs" / "a.log") and j.log_pending
        assert j.root.attrs.get("lora_otel.log.copied") is not False

    def test_log_read_as_input_by_filetype(self, tmp_path: Path) -> None:
        """``analyze.py --log train.log`` where ``--log`` is ``argparse.FileType('r')``, a log the
        program reads: it counts the lines that were there, and the file keeps its bytes."""
        log = tmp_path / "train.log"
        log.write_text("step 1 loss 0.9\nstep 2 loss 0.8\n")
        before = sha(log)
        script = (
            "import argparse\np = argparse.ArgumentParser()\np.add_argument('--log', type=argparse.FileType('r'))\n"
            "a = p.parse_args()\nprint('lines', len(a.log.readlines()))\n"
        )
        r = run(tmp_path, script, "--log", "train.log")
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip() == "lines 2"
        assert sha(log) == before

    @pytest.mark.parametrize("level", ["DEBUG", "info"])
    def test_log_level_creates_no_file(self, tmp_path: Path, level: str) -> None:
        """``--log DEBUG`` (a level): no file ``DEBUG``, ``DEBUG.otel.jsonl`` or any other appears."""
        script = (
            "import argparse, logging\np = argparse.ArgumentParser()\np.add_argument('--log', default='INFO')\n"
            "a = p.parse_args()\nlogging.basicConfig(level=a.log.upper())\nlogging.debug('program debug')\n"
        )
        r = run(tmp_path, script, "--log", level, LORA_OTEL_KEEP_SHORT="1")
        assert r.returncode == 0, r.stderr
        assert files_in(tmp_path) == set()
        assert any("a log level" in ln for ln in said(tmp_path)), r.stderr

    def test_log_followed_by_another_option_creates_no_file(self, tmp_path: Path) -> None:
        """``--log --verbose`` (two flags): no file named ``--verbose``."""
        script = (
            "import argparse\np = argparse.ArgumentParser()\np.add_argument('--log', action='store_true')\n"
            "p.add_argument('--verbose', action='store_true')\na = p.parse_args()\nprint(a.log, a.verbose)\n"
        )
        r = run(tmp_path, script, "--log", "--verbose")
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip() == "True True"
        assert files_in(tmp_path) == set()

    def test_json_lines_log_reads_back(self, tmp_path: Path) -> None:
        """A program writing JSON lines to its ``--log m.jsonl`` and reading them back: every line
        is its own JSON (no ``JSONDecodeError``)."""
        script = (
            "import argparse, json\np = argparse.ArgumentParser()\np.add_argument('--log')\na = p.parse_args()\n"
            "with open(a.log, 'a') as f:\n    f.write(json.dumps({'step': 1}) + '\\n')\n"
            "print([json.loads(x) for x in open(a.log)])\n"
        )
        r = run(tmp_path, script, "--log", "m.jsonl")
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip() == "[{'step': 1}]"

    def test_existing_json_lines_log_is_not_appended_to(self, tmp_path: Path) -> None:
        """A ``.log`` file that already holds JSON lines (a structured log, re-run): lora_otel does
        not append to it; the program's read-back of all its records works."""
        log = tmp_path / "events.log"
        log.write_text(json.dumps({"event": "first run"}) + "\n")
        script = (
            "import argparse, json\np = argparse.ArgumentParser()\np.add_argument('--log')\na = p.parse_args()\n"
            "with open(a.log, 'a') as f:\n    f.write(json.dumps({'event': 'second run'}) + '\\n')\n"
            "print(len([json.loads(x) for x in open(a.log)]))\n"
        )
        r = run(tmp_path, script, "--log", "events.log", LORA_OTEL_KEEP_SHORT="1")
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip() == "2"
        assert any("holds JSON lines" in ln for ln in said(tmp_path)), r.stderr

    @pytest.mark.parametrize(
        ("name", "content", "why"),
        [
            ("table.txt", "a,b,c\n1,2,3\n4,5,6\n", "CSV rows"),
            ("blob.out", "\x00\x01\x02binary\n", "binary"),
            ("partial.log", "no newline at the end", "newline"),
        ],
    )
    def test_existing_files_that_are_not_text_lines(self, tmp_path: Path, name: str, content: str, why: str) -> None:
        """An existing file named like a log but holding CSV rows, binary data, or a last line not
        ended: lora_otel does not write there, and says why."""
        f = tmp_path / name
        f.write_text(content)
        before = sha(f)
        r = run(
            tmp_path,
            "import argparse\np = argparse.ArgumentParser()\np.add_argument('--log')\np.parse_args()\n",
            "--log",
            name,
            LORA_OTEL_KEEP_SHORT="1",
        )
        assert r.returncode == 0, r.stderr
        assert sha(f) == before
        assert any(why in ln for ln in said(tmp_path)), r.stderr

    def test_program_log_gets_the_programs_mode(self, tmp_path: Path) -> None:
        """Under ``umask 002`` a program's ``logging.FileHandler`` log is 0664 without lora_otel: it is
        0664 with lora_otel too (a log shipper of the group can read it), and lora_otel's lines are in it
        (the program opened it and lived a beat: what waited is appended, issue 36 item 4)."""
        script = (
            "import argparse, logging, os, time\np = argparse.ArgumentParser()\np.add_argument('--log')\n"
            "a = p.parse_args()\nlogging.basicConfig(filename=a.log, level=logging.INFO)\n"
            "logging.info('program line')\nfor _ in range(1000):  # (traced: until a beat has appended)\n"
            "    if not os.environ.get('LORA_OTEL') or '[lora-otel]' in open(a.log).read():\n"
            "        break\n    time.sleep(0.05)\n"
        )
        modes = {}
        for traced in (False, True):
            d = tmp_path / ("traced" if traced else "bare")
            d.mkdir()
            r = run(d, script, "--log", "train.log", traced=traced, umask=0o002)
            assert r.returncode == 0, r.stderr
            modes[traced] = stat.S_IMODE(os.stat(d / "train.log").st_mode)
        assert modes[False] == 0o664
        assert modes[True] == modes[False]
        text = (tmp_path / "traced" / "train.log").read_text()
        assert "started pid" in text and "program line" in text

    def test_output_dir_that_must_be_new(self, tmp_path: Path) -> None:
        """``--out runs/exp1 --log runs/exp1/train.log``, a script refusing a non-empty output
        directory: lora_otel creates no directory, so the script runs (and says why in its journal)."""
        (tmp_path / "runs").mkdir()
        script = (
            "import argparse, os, sys\np = argparse.ArgumentParser()\n"
            "p.add_argument('--out')\np.add_argument('--log')\na = p.parse_args()\n"
            "if os.path.exists(a.out) and os.listdir(a.out):\n"
            "    sys.exit('refusing: %s is not empty' % a.out)\nos.makedirs(a.out, exist_ok=True)\n"
            "open(a.log, 'w').write('program line\\n')\n"
        )
        r = run(tmp_path, script, "--out", "runs/exp1", "--log", "runs/exp1/train.log", LORA_OTEL_KEEP_SHORT="1")
        assert r.returncode == 0, r.stderr
        assert (tmp_path / "runs" / "exp1" / "train.log").read_text() == "program line\n"
        assert any("does not exist (lora_otel creates none)" in ln for ln in said(tmp_path)), r.stderr

    @pytest.mark.parametrize("parent", ["", "runs/"])
    def test_log_used_as_a_directory(self, tmp_path: Path, parent: str) -> None:
        """``--log runs/tb`` (TensorBoard style: the program makes it a directory and writes event
        files there): the program runs, and the directory holds only its files."""
        (tmp_path / "runs").mkdir()
        script = (
            "import argparse, os\np = argparse.ArgumentParser()\np.add_argument('--log', default='runs')\n"
            "a = p.parse_args()\nos.makedirs(a.log, exist_ok=True)\n"
            "open(os.path.join(a.log, 'events.out.tfevents.1'), 'wb').write(b'\\x00\\x01')\n"
        )
        r = run(tmp_path, script, "--log", parent + "tb")
        assert r.returncode == 0, r.stderr
        assert os.listdir(tmp_path / parent / "tb") == ["events.out.tfevents.1"]


@pytest.mark.slow
class TestTheSeedCase:
    """A launcher's ``--log runs/x/train.log``: the directory exists, the file not yet."""

    def test_lines_from_the_first_instruction_while_an_import_hangs(self, tmp_path: Path) -> None:
        """The job hangs in an import before its own logging starts: ``runs/x/train.log`` already
        holds lora_otel's lines, and its journal lies beside it; when the job goes on, its own lines
        follow in the same file."""
        (tmp_path / "runs" / "x").mkdir(parents=True)
        (tmp_path / "slowmod.py").write_text("import os, time\nwhile not os.path.exists('go'):\n    time.sleep(0.05)\n")
        script = (
            "import argparse\np = argparse.ArgumentParser()\np.add_argument('--log')\na = p.parse_args()\n"
            "import slowmod\nimport logging\nlogging.basicConfig(filename=a.log, level=logging.INFO)\n"
            "logging.info('program started training')\n"
        )
        (tmp_path / "job.py").write_text(script)
        log = tmp_path / "runs" / "x" / "train.log"
        proc = subprocess.Popen(
            [PYTHON, "job.py", "--log", "runs/x/train.log"],
            cwd=tmp_path,
            env=clean_env(LORA_OTEL="1"),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            wait_for(lambda: log.exists() and "import slowmod" in log.read_text(), what="the import line in train.log")
            assert proc.poll() is None
            text = log.read_text()
            assert text.startswith("[lora-otel][%d][" % proc.pid) and "started pid" in text
            assert (tmp_path / "runs" / "x" / "train.log.otel.jsonl").exists()
            (tmp_path / "go").write_text("")
            assert proc.wait(timeout=60) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        text = log.read_text()
        assert "program started training" in text and text.index("started pid") < text.index("program started")


@pytest.mark.slow
class TestExplicitSettings:
    """``LORA_OTEL_LOG`` and ``LORA_OTEL_LOG_ARG`` win over any guess."""

    ARGS = "import argparse\np = argparse.ArgumentParser()\np.add_argument('%s')\na = p.parse_args()\n"

    def test_lora_otel_log_names_our_file(self, tmp_path: Path) -> None:
        """``LORA_OTEL_LOG=ours.log``: lora_otel's lines and journal go there; the program's own
        ``--log theirs.log`` gets only the program's line."""
        script = self.ARGS % "--log" + "open(a.log, 'a').write('program line\\n')\n"
        r = run(tmp_path, script, "--log", "theirs.log", LORA_OTEL_LOG=str(tmp_path / "ours.log"))
        assert r.returncode == 0, r.stderr
        assert (tmp_path / "theirs.log").read_text() == "program line\n"
        assert "started pid" in (tmp_path / "ours.log").read_text()
        assert (tmp_path / "ours.log.otel.jsonl").exists()

    def test_log_arg_none_reads_no_argv(self, tmp_path: Path) -> None:
        """``LORA_OTEL_LOG_ARG=none``: a ``--log run.log`` is not touched (the program here never
        writes it, so it must not exist)."""
        r = run(tmp_path, self.ARGS % "--log", "--log", "run.log", LORA_OTEL_LOG_ARG="none")
        assert r.returncode == 0, r.stderr
        assert files_in(tmp_path) == set()

    def test_log_arg_names_the_option(self, tmp_path: Path) -> None:
        """``LORA_OTEL_LOG_ARG=--logfile``: ``--logfile run.log`` is the log file (its journal beside it)."""
        r = run(
            tmp_path,
            self.ARGS % "--logfile",
            "--logfile",
            "run.log",
            LORA_OTEL_LOG_ARG="--logfile",
            LORA_OTEL_KEEP_SHORT="1",
        )
        assert r.returncode == 0, r.stderr
        assert read_journal(tmp_path / "run.log.otel.jsonl").log_path == str(tmp_path / "run.log")

    @pytest.mark.parametrize("option", ["--log_file", "--log-file"])
    def test_log_file_is_read_by_default(self, tmp_path: Path, option: str) -> None:
        """``--log_file`` / ``--log-file`` (common in trainers) name the log file by default."""
        r = run(tmp_path, self.ARGS % option, option, "train.log", LORA_OTEL_KEEP_SHORT="1")
        assert r.returncode == 0, r.stderr
        assert read_journal(tmp_path / "train.log.otel.jsonl").log_path == str(tmp_path / "train.log")

    def test_bad_log_arg_is_said_once_and_the_default_used(self, tmp_path: Path) -> None:
        """``LORA_OTEL_LOG_ARG=log`` (no dashes): one line says so; ``--log`` is read as by default."""
        r = run(tmp_path, self.ARGS % "--log", "--log", "run.log", LORA_OTEL_LOG_ARG="log", LORA_OTEL_KEEP_SHORT="1")
        assert r.returncode == 0, r.stderr
        assert len([ln for ln in lora_lines(r.stderr) if "LORA_OTEL_LOG_ARG='log'" in ln]) == 1
        assert read_journal(tmp_path / "run.log.otel.jsonl").log_path == str(tmp_path / "run.log")


@pytest.mark.slow
def test_watchdog_never_writes_to_a_log_the_program_disowned(tmp_path: Path) -> None:
    """``tool.py --log notes.txt`` (a flag; notes.txt an existing text file), then the job freezes
    holding the GIL: the watchdog's STALLED line reaches the job's stderr but not notes.txt, which
    keeps its bytes (the journal's root says ``lora_otel.log.copied`` false)."""
    (tmp_path / "frozenmod.py").write_text(FROZEN_MOD)
    notes = tmp_path / "notes.txt"
    notes.write_text("alpha\nbeta\n")
    before = sha(notes)
    (tmp_path / "job.py").write_text(
        "import argparse\np = argparse.ArgumentParser()\np.add_argument('--log', action='store_true')\n"
        "p.add_argument('notes')\np.parse_args()\nimport frozenmod\n"
    )
    with open(tmp_path / "out.txt", "wb") as out:
        proc = subprocess.Popen(
            [PYTHON, "job.py", "--log", "notes.txt"],
            cwd=tmp_path,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=clean_env(LORA_OTEL="1", LORA_OTEL_FROZEN_AFTER="2"),
            start_new_session=True,
        )
    try:
        wait_for(lambda: "STALLED:" in (tmp_path / "out.txt").read_text(errors="replace"), what="the STALLED line")
        assert proc.poll() is None
        assert sha(notes) == before
    finally:
        proc.kill()
        proc.wait(timeout=10)


# --- item 7: short options that are not secrets ------------------------------------------------

R = REDACTED
SHORT_OPTIONS = [
    ("pytest plugin off", ["pytest", "-q", "-p", "no:cacheprovider"], ["pytest", "-q", "-p", "no:cacheprovider"]),
    ("pytest plugin", ["/v/bin/pytest", "-p", "xdist", "-k", "slow"], ["/v/bin/pytest", "-p", "xdist", "-k", "slow"]),
    ("python -m pytest", ["pytest", "-p", "pytest_cov"], ["pytest", "-p", "pytest_cov"]),
    ("plugin module path", ["x.py", "-p", "myproj.plugins.db"], ["x.py", "-p", "myproj.plugins.db"]),
    ("pytest -k expression elsewhere", ["x.py", "-k", "slow and not gpu"], ["x.py", "-k", "slow and not gpu"]),
    ("ssh port", ["ssh", "-p", "2222", "host"], ["ssh", "-p", "2222", "host"]),
    (
        "docker port mapping",
        ["docker", "run", "-p", "127.0.0.1:8080:80/tcp"],
        ["docker", "run", "-p", "127.0.0.1:8080:80/tcp"],
    ),
    ("mkdir -p path", ["mkdir", "-p", "/data/run 1"], ["mkdir", "-p", "/data/run 1"]),
    ("-p then an option", ["x.py", "-p", "-v", "y"], ["x.py", "-p", "-v", "y"]),
    ("equals form plugin", ["x.py", "-p=no:warnings"], ["x.py", "-p=no:warnings"]),
    # still secrets
    ("mysql password", ["mysql", "-u", "root", "-p", "hunter2"], ["mysql", "-u", "root", "-p", R]),
    ("key", ["x.py", "-k", "k3y-v4lue", "--epochs", "1"], ["x.py", "-k", R, "--epochs", "1"]),
    ("password equals", ["x.py", "-p=hunter2"], ["x.py", f"-p={R}"]),
]


@pytest.mark.parametrize(("label", "argv", "expected"), SHORT_OPTIONS, ids=[c[0] for c in SHORT_OPTIONS])
def test_short_options_redacted_only_when_a_secret(label: str, argv: list[str], expected: list[str]) -> None:
    """``-p``/``-k`` hide their value only when it could be a password: not a plugin name, a pytest
    expression, a port or a port mapping, a path, or another option (nor anything in pytest's argv)."""
    assert redact_argv(argv) == expected


@pytest.mark.slow
def test_pytest_run_keeps_its_argv(tmp_path: Path) -> None:
    """A user's ``python -m pytest -p no:cacheprovider`` with ``LORA_OTEL=1``: the journal's argv
    and its ``argv:`` line show ``no:cacheprovider``, no ``[REDACTED]``."""
    # The test outlives the first beat (1 s), so the run is a job and says its argv: a run over in
    # less is a short process, which says nothing of its arguments (it failed so, by chance, in CI).
    (tmp_path / "test_one.py").write_text("import time\ndef test_one():\n    time.sleep(1.5)\n")
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_one.py"],
        cwd=tmp_path,
        env=clean_env(LORA_OTEL="1", LORA_OTEL_DIR=str(tmp_path / "j")),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    [jpath] = journals(tmp_path / "j")
    args = read_journal(jpath).root.attrs["process.command_args"]
    assert "no:cacheprovider" in args and R not in args, args
    # Said on the terminal when a heavy import made it a job, into the journal whichever way it became one.
    said = [json.loads(x)["msg"] for x in jpath.read_text().splitlines() if '"k":"line"' in x]
    [argv_line] = [msg for msg in said if msg.startswith("argv: ")]
    assert "no:cacheprovider" in argv_line and R not in argv_line
