"""Does each view name the place and the cause of the hangs real trainers' users report? (issue 22's
figures: hang × view × right/wrong)

    .venv/bin/python bench/trainer_hangs.py [--trainer NAME ...] [--case HANG ...] [--json PATH]

For each trainer and each hang its test puts in, the real job is started traced exactly as the test
starts it (the test modules' own ``start``/``accelerate_launch``, their short
``LORA_OTEL_STALL_AFTER`` limits, ``HF_HUB_OFFLINE=1``, a fresh temporary directory):

- ``trl``: TRL's SFTTrainer, ``map``, ``collator``, ``worker``, ``hub``, ``exit`` (`test_trl.CASES`);
- ``accelerate``: ``accelerate launch`` with 2 ranks, ``rank``: rank 1's collator blocks, so rank 0
  waits in a collective for a rank that never reaches it
  (``test_accelerate_launch_a_rank_that_never_reaches_the_collective``);
- ``llamafactory``: ``collator``, ``map``, ``hub`` (`test_llamafactory.CASES`, in its own venv);
- ``axolotl``: ``collator``, ``exit`` (`test_axolotl.CASES`, in its own venv).

Once the watchdog's sentence is in the job's stderr (waited for as the tests do, up to
``--deadline``), the bench reads each view and records whether it names the place and the cause:

- ``why line``: the job's own sentence on stderr (the test module's ``why_line``; for accelerate,
  each rank's ``why training is stalled`` line);
- ``inspect``: ``lora-otel inspect DIR``; ``watch``: ``lora-otel watch --once --no-color DIR``;
  ``report``: ``lora-otel report DIR -o -`` (the page as the test reads it, and its unescaped text).

*cause* is right when the view has what the test asserts of it (every view: the test's cause; the
why line also the test's other words, e.g. axolotl's ``Waiting on the network``); *place* when it
has the test's place (``in wait_for_release``, ``sft_job.py:``, …) — the tests ask it of the why
line only, the bench of every view; ``—`` where the test names no place (the hub cases). Then the
job is released (the release file) or killed (a socket read nothing releases) as the test does; a
job that does not then finish as the test expects is a note under the table. (None of these tests
gives the job ``--log`` or reads the journal for the hang, so neither is a view here.)
"""

from __future__ import annotations

import argparse
import html
import json
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import pytest
from trainer_overhead import TRAINERS, stop, trainer_files, trainer_python

# trainer_overhead put tests/ and tests/trainers on sys.path: the tests' own helpers.
import test_axolotl  # isort: skip
import test_llamafactory  # isort: skip
import test_trl  # isort: skip
from procs import lora_otel_cli, wait_for  # isort: skip

VIEWS = ("inspect", "watch", "report")
"""The views read from the job's directory, after its own line(s)."""


@dataclass
class Expect:
    """Regexes a view must have, all of them: ``place`` (none: the test names no place) and ``cause``."""

    place: tuple[str, ...]
    cause: tuple[str, ...]

    @staticmethod
    def words(place: tuple[str, ...], cause: tuple[str, ...]) -> Expect:
        return Expect(tuple(re.escape(w) for w in place if w), tuple(re.escape(w) for w in cause))


@dataclass
class Case:
    """One hang of one trainer: the job's line(s) to wait for and check, and what the views must say."""

    trainer: str
    hang: str
    lines: dict[str, tuple[Callable[[Path], str], Expect]]
    """view name → (the line picked from the job's stderr, what it must have)."""
    views: Expect
    stalled_line: bool = False
    """The test also waits for the job's own ``STALLED`` line before reading the views (TRL)."""


@dataclass
class Row:
    trainer: str
    hang: str
    view: str
    place: str
    cause: str
    text: str = field(repr=False)


def why_stalled(err: Path, words: str) -> str:
    """The first ``why training is stalled`` line of the job's stderr that has ``words`` (a rank's)."""
    for line in err.read_text(encoding="utf-8", errors="replace").splitlines():
        if "] why training is stalled: " in line and words in line:
            return line
    return ""


def cases() -> list[Case]:
    """Every case, from the tests' own ``CASES`` (see the module doc for how they map)."""
    out = []
    for hang, (place, cause) in test_trl.CASES.items():
        extra = ("in __call__",) if hang == "worker" else ()  # the worker's own place, asserted in its line
        out.append(
            Case(
                "trl",
                hang,
                {"why line": (test_trl.why_line, Expect.words((place, *extra), (cause,)))},
                Expect.words((place,), (cause,)),
                stalled_line=True,
            )
        )
    out.append(
        Case(
            "accelerate",
            "rank",
            {
                "why line, rank 0": (
                    lambda err: why_stalled(err, "Waiting inside a collective"),
                    Expect.words(
                        ("rank 1 is not in a collective (at sft_job.py:", "in wait_for_release"),
                        ("Waiting inside a collective", "rank 1 never arrived"),
                    ),
                ),
                "why line, rank 1": (
                    lambda err: why_stalled(err, "The DataLoader makes its batch"),
                    Expect.words(("in wait_for_release",), ("The DataLoader makes its batch",)),
                ),
            },
            # the test's inspect check: the job's verdict leads with rank 1
            Expect(
                (re.escape("in wait_for_release"),),
                (r"rank 1 \(pid \d+\) is the one stuck: .*rank 0 \(pid \d+\) waits for it in a collective",),
            ),
        )
    )
    for hang, (place, cause) in test_llamafactory.CASES.items():
        expect = Expect.words((place,), (cause,))
        out.append(Case("llamafactory", hang, {"why line": (test_llamafactory.why_line, expect)}, expect))
    for hang, (cause, detail) in test_axolotl.CASES.items():
        if detail.startswith("in "):  # collator: the detail is the place
            line = views = Expect.words((detail,), (cause,))
        else:  # exit: the place (the handler) is in the cause's words; the detail is what it waits on
            views = Expect.words(("flush_telemetry() in axo_job.py",), (cause,))
            line = Expect.words(("flush_telemetry() in axo_job.py",), (cause, detail))
        out.append(Case("axolotl", hang, {"why line": (test_axolotl.why_line, line)}, views))
    return out


def judge(text: str, patterns: tuple[str, ...]) -> str:
    """``right`` when every pattern is in ``text`` (or in its HTML-unescaped form), ``—`` when none is asked."""
    if not patterns:
        return "—"
    found = any(all(re.search(p, t) for p in patterns) for t in (text, html.unescape(text)))
    return "right" if found else "wrong"


class Job:
    """One trainer's hang jobs, started and ended as its test does; the venv and files made once."""

    def __init__(self, trainer: str, workdir: Path, venv_wait_s: float) -> None:
        self.trainer = trainer
        self.python: Path | None = None
        self.files = workdir / "files"
        if trainer in ("llamafactory", "axolotl"):
            self.python = trainer_python(trainer, venv_wait_s)
            trainer_files(trainer, self.python, self.files)

    def start(self, tmp: Path, hang: str) -> subprocess.Popen:
        if self.trainer == "trl":
            return test_trl.start(tmp, hang)[0]
        if self.trainer == "accelerate":
            return test_trl.accelerate_launch(tmp, 2, hang)
        module = test_llamafactory if self.trainer == "llamafactory" else test_axolotl
        return module.start(self.python, self.files, tmp, hang)

    def end(self, proc: subprocess.Popen, tmp: Path, hang: str) -> str:
        """Release or kill the job as the test does; a note when it then does not finish as the test expects."""
        if (self.trainer, hang) in (("trl", "hub"), ("llamafactory", "hub"), ("axolotl", "exit")):
            stop(proc)  # blocked in a socket read nothing releases: ended as a user would
            return ""
        if self.trainer == "accelerate":
            (tmp / "go").touch()
            try:
                proc.wait(timeout=300)
            except subprocess.TimeoutExpired:
                stop(proc)
            trained = (tmp / "stdout.txt").read_text().count("TRAINED") == 2
            if proc.returncode != 0 or not trained:
                return "released, exit %s, %s" % (proc.returncode, "both ranks trained" if trained else "not trained")
            return ""
        module = {"trl": test_trl, "llamafactory": test_llamafactory, "axolotl": test_axolotl}[self.trainer]
        try:
            out = module.finish(proc, tmp)  # touches the release file; asserts exit code 0
        except AssertionError as e:
            return "released, exit %s: %s" % (proc.returncode, str(e)[-300:])
        done = out.splitlines()[-1:] == ["TRAINED 8"] if self.trainer == "trl" else "train_loss" in out
        return "" if done else "released, exit 0 but not trained"


def run_case(job: Job, case: Case, deadline_s: float) -> tuple[list[Row], list[str]]:
    rows: list[Row] = []
    notes: list[str] = []
    with tempfile.TemporaryDirectory(prefix="trainer-hangs-") as d:
        tmp = Path(d)
        err, journal_dir = tmp / "stderr.txt", str(tmp / "j")
        t0 = time.monotonic()
        proc = job.start(tmp, case.hang)
        try:
            try:
                wait_for(
                    lambda: all(pick(err) for pick, _ in case.lines.values()),
                    timeout=deadline_s,
                    what="the watchdog's sentence",
                )
                said = time.monotonic() - t0
            except pytest.fail.Exception:
                said = None
                notes.append(
                    "no watchdog sentence within %.0f s; stderr ends: %s" % (deadline_s, err.read_text()[-500:])
                )
            for view, (pick, expect) in case.lines.items():
                line = pick(err)
                rows.append(
                    Row(case.trainer, case.hang, view, judge(line, expect.place), judge(line, expect.cause), line)
                )
            if said is not None and case.stalled_line:
                try:  # the job's own STALLED line and the watchdog's sentence are written apart
                    wait_for(
                        lambda: "] STALLED: " in err.read_text(errors="replace"), timeout=60, what="the STALLED line"
                    )
                except pytest.fail.Exception:
                    notes.append("no STALLED line of the job's own within 60 s of its sentence")
            for view, args in (
                ("inspect", ("inspect", journal_dir)),
                ("watch", ("watch", "--once", "--no-color", journal_dir)),
                ("report", ("report", journal_dir, "-o", "-")),
            ):
                r = lora_otel_cli(*args)
                if view == "inspect" and r.returncode not in (0, 1):
                    notes.append("inspect exited %d: %s" % (r.returncode, r.stderr[-300:]))
                place = judge(r.stdout, case.views.place)
                cause = judge(r.stdout, case.views.cause) if view != "inspect" or r.returncode in (0, 1) else "wrong"
                rows.append(Row(case.trainer, case.hang, view, place, cause, r.stdout))
        finally:
            note = job.end(proc, tmp, case.hang)
        if note:
            notes.append(note)
    if said is not None:
        notes.insert(0, "sentence after %.0f s" % said)
    return rows, ["%s %s: %s" % (case.trainer, case.hang, n) for n in notes]


def table(rows: list[Row]) -> str:
    lines = ["| trainer | hang | view | place | cause |", "|---|---|---|---|---|"]
    lines += ["| %s | %s | %s | %s | %s |" % (r.trainer, r.hang, r.view, r.place, r.cause) for r in rows]
    if not rows:
        return "\n".join(lines)

    def tally(sub: list[Row]) -> str:
        placed = [r for r in sub if r.place != "—"]
        return "place %d/%d, cause %d/%d" % (
            sum(r.place == "right" for r in placed),
            len(placed),
            sum(r.cause == "right" for r in sub),
            len(sub),
        )

    lines += ["", "totals: %d rows; %s (place: where the test names one)" % (len(rows), tally(rows))]
    for view in ("why line", *VIEWS):
        lines.append("  %-9s %s" % (view, tally([r for r in rows if r.view.startswith(view)])))
    for trainer in TRAINERS:
        sub = [r for r in rows if r.trainer == trainer]
        if sub:
            lines.append("  %-12s %s" % (trainer, tally(sub)))
    return "\n".join(lines)


def main() -> None:
    every = cases()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--trainer", action="append", choices=TRAINERS, help="only this trainer (repeatable)")
    parser.add_argument(
        "--case", action="append", choices=sorted({c.hang for c in every}), help="only this hang (repeatable)"
    )
    parser.add_argument("--json", metavar="PATH", help="also write the rows, with each view's text, as JSON")
    parser.add_argument(
        "--deadline", type=float, default=600, help="seconds to wait for the watchdog's sentence (default 600)"
    )
    parser.add_argument(
        "--venv-wait", type=float, default=1800, help="seconds to wait for a trainer venv being built (default 1800)"
    )
    args = parser.parse_args()
    chosen = [
        c for c in every if (not args.trainer or c.trainer in args.trainer) and (not args.case or c.hang in args.case)
    ]
    if not chosen:
        raise SystemExit("no case of %s is %s" % (args.trainer or "any trainer", args.case))
    started = time.monotonic()
    rows: list[Row] = []
    notes: list[str] = []
    with tempfile.TemporaryDirectory(prefix="trainer-hangs-files-") as workdir:
        jobs: dict[str, Job] = {}
        for case in chosen:
            if case.trainer not in jobs:
                jobs[case.trainer] = Job(case.trainer, Path(workdir) / case.trainer, args.venv_wait)
            print("%s %s …" % (case.trainer, case.hang), file=sys.stderr, flush=True)
            got, said = run_case(jobs[case.trainer], case, args.deadline)
            rows += got
            notes += said
    print(table(rows))
    if notes:
        print("\nnotes:\n" + "\n".join("- " + n for n in notes))
    print("\n(%.0f s in all)" % (time.monotonic() - started))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump([r.__dict__ for r in rows], f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()
