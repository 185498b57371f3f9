"""``lora-otel inspect``: where a process is or was stuck, and its span tree, from its journal.

The first line of the text output is one sentence about the *deepest open span* (the most recently
started open span with no open child), or about how the process ended:

- ``stuck in import bitsandbytes for 312 s (process gone)``: open for last evidence − start when
  the process is gone, now − start while it runs (``no beat for N s`` when it froze);
- ``still in training for 20 s (process running, 1200 steps, last step 400 ms ago)`` while steps
  advance; ``died in training after 3600 s (process gone, …)`` when they did until the end;
- ``ended with spans open: process (process gone)`` when it died between stages;
- ``finished normally in 12.3 s (exit code 0)``, ``failed: <message> (exit code 1)``,
  ``failed with exit code 3``, ``ended with spans open: a, b (exit code 1)``;
- ``empty journal: no records``.

Then come the journal line, the span tree, and the journal's problems as ``note:`` lines. With
``LORA_OTEL_BASELINE`` naming a baseline file (`lora_otel.analysis.baseline`), the drift from it that
bears on the stuck stage comes right after the first line, then the rest of the drift in brief.
``--json`` prints the schema documented in docs/journal.md.

A directory is shown job by job (journals grouped by trace id, ranks in order, the process to look at
called out; `lora_otel.analysis.job`); ``--summary`` gives one line per job and exits by outcome.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import TYPE_CHECKING, Any, Optional

from lora_otel.cli import baseline as baseline_view
from lora_otel.cli import jobs as jobs_view
from lora_otel.cli.jobs import write as _write
from lora_otel.journal.reader import (
    Journal,
    JournalError,
    left_out_line,
    listed_journals,
    process_state,
    read_journal,
)
from lora_otel.journal.tree import View, _display

if TYPE_CHECKING:
    from lora_otel.analysis.job import Job


def run_inspect(args: argparse.Namespace) -> int:
    """Print the journal ``args.journal`` as text, or as JSON when ``args.json``.

    A directory is shown job by job (`run_inspect_dir`); so is a single journal with ``--summary``.

    Returns:
        0, or 2 when the journal cannot be read (one line on stderr); ``--summary``: the outcome
        (`run_inspect_dir`).
    """
    if args.journal is None:
        args.journal = newest_run_or_none("inspect")
        if args.journal is None:
            return 2
    resolved = resolve_path(args.journal)
    if resolved != args.journal:
        print(f"lora-otel inspect: reading {resolved}", file=sys.stderr)
        args.journal = resolved
    if os.path.isdir(args.journal) or getattr(args, "summary", False):
        return run_inspect_dir(args)
    try:
        journal = read_journal(args.journal)
    except JournalError as e:
        print(f"lora-otel inspect: {e}", file=sys.stderr)
        return 2
    if not_a_journal(journal):
        print(f"lora-otel inspect: {args.journal}: {no_journal_beside(args.journal, journal)}", file=sys.stderr)
        return 2
    from lora_otel.analysis import baseline
    from lora_otel.analysis.stall import StallConfigError, detect, frozen_after_from_env, parse_limits

    stall_after = getattr(args, "stall_after", None)
    given = "--stall-after" if stall_after is not None else "LORA_OTEL_STALL_AFTER"
    try:
        parse_limits(stall_after if stall_after is not None else os.environ.get(given))
        frozen_after_from_env()
    except StallConfigError as e:
        print(f"lora-otel inspect: {given}: {e}", file=sys.stderr)
        return 2
    # One set of limits: the journal's recorded ones (`stall.journal_limits`) unless --stall-after.
    from lora_otel.analysis import verdict as verdict_mod
    from lora_otel.analysis.stall import journal_limits

    limits, frozen_after = journal_limits(journal, parse_limits(stall_after) if stall_after is not None else None)
    now_ns = time.time_ns()
    state = process_state(journal)
    stall = detect(journal, now_ns, state == "running", limits, frozen_after)
    verdict = verdict_mod.current(journal, stall, now_ns, same_trace(journal), frozen_after)
    drift = baseline.inspect_report(journal, now_ns)  # None unless LORA_OTEL_BASELINE is set
    if drift is not None and drift["error"]:
        print(f"lora-otel inspect: {drift['error']}; shown without it", file=sys.stderr)
    stalled = stall is not None or verdict is not None if state == "running" else (verdict is not None or None)
    view = View(journal, state, now_ns, verdict=verdict, stalled=stalled)
    if args.json:
        doc = view.to_json()
        if drift is not None:
            doc["baseline"] = baseline_view.report_json(drift)
        text = json.dumps(doc, indent=2) + "\n"  # ensure_ascii keeps lone surrogates as \udcXX
    else:
        text = "\n".join(view.text_lines()) + "\n"
        if drift is not None:  # the drift that bears on the stuck stage, right after the first line
            first, _, rest = text.partition("\n")
            text = "\n".join([first, *(_display(line) for line in baseline_view.report_lines(drift)), rest])
        if verdict is not None or stall is not None:
            text += report_command(args.journal) + "\n"
    _write(text)
    return 0


def run_inspect_dir(args: argparse.Namespace) -> int:
    """``lora-otel inspect DIR``: every journal in the directory, grouped into jobs (by trace id).

    Text: per job a heading, its processes in rank order, the process to look at called out, and
    its tree (every tree with ``--all``). ``--summary``: one line per job. ``--json``: the directory
    document of docs/journal.md (spans only with ``--all``).

    Returns:
        2 (one line on stderr) when the directory holds no journal, a journal cannot be read, or
        ``--stall-after`` is bad. Else 0; with ``--summary``, the outcome: 0 every job finished
        normally or runs, 1 some job failed, 3 some job was killed or is stalled (wins over 1).
    """
    from lora_otel.analysis import job as jobs_mod
    from lora_otel.analysis.stall import StallConfigError, frozen_after_from_env, parse_limits

    def usage(message: object) -> int:
        print(f"lora-otel inspect: {message}", file=sys.stderr)
        return 2

    path = args.journal
    stall_after = getattr(args, "stall_after", None)
    given = "--stall-after" if stall_after is not None else "LORA_OTEL_STALL_AFTER"
    try:
        limits: dict[str, float] | None = parse_limits(
            stall_after if stall_after is not None else os.environ.get(given)
        )
    except StallConfigError as e:
        return usage(f"{given}: {e}")
    try:
        frozen_after_from_env()
    except StallConfigError as e:
        return usage(e)
    # One set of limits: each journal's recorded ones (`stall.journal_limits`) unless --stall-after.
    limits_given = limits if stall_after is not None else None
    limits, frozen_after = limits_given, None
    now_ns = time.time_ns()
    if os.path.isdir(path):
        try:
            paths, left_out = listed_journals(path)
        except OSError as e:
            return usage(f"{path}: cannot list: {e.strerror or e}")
        if left_out:  # (stderr: the --json and --summary output stays what a script parses)
            print(f"lora-otel inspect: {_display(path)}: {left_out_line(left_out)}", file=sys.stderr)
        if not paths:
            whose = " of this user's" if left_out else ""
            return usage(f"{_display(path)}: no journals (*.otel.jsonl){whose} in this directory")
        jobs, unreadable = jobs_mod.read_dir(path, now_ns, limits, frozen_after, paths)
    else:
        try:
            journal = read_journal(path)
        except JournalError as e:
            return usage(e)
        reason = jobs_mod.unreadable_reason(journal)
        if reason is not None:
            jobs, unreadable = [], [jobs_mod.Unreadable(path, reason)]
        else:
            proc = jobs_mod.make_proc(journal, process_state(journal), now_ns, limits, frozen_after)
            jobs, unreadable = jobs_mod.group_jobs([proc]), []
    show_all = getattr(args, "all", False)
    summary = getattr(args, "summary", False)
    if not summary:
        jobs_mod.attach_verdicts(jobs, now_ns, frozen_after)
    drift = {} if summary else _drift_by_proc(jobs, now_ns)  # LORA_OTEL_BASELINE: the focus processes' drift
    if args.json:
        doc = jobs_view.render_json(path, jobs, unreadable, with_spans=show_all)
        for job, job_doc in zip(jobs, doc["jobs"]):
            first = jobs_mod.focus(job)
            if first is not None and id(first) in drift:
                job_doc["baseline"] = baseline_view.report_json(drift[id(first)])
        text = jobs_view.dumps(doc)
    elif summary:
        text = jobs_view.render_summary(jobs, unreadable)
    else:
        text = jobs_view.render_text(
            jobs,
            unreadable,
            show_all=show_all,
            notes={key: baseline_view.report_lines(report) for key, report in drift.items()},
        )
        if any(stalled_job(job) for job in jobs):
            text += report_command(path) + "\n"
    _write(text)
    return jobs_mod.exit_status(jobs) if summary else 0


def stalled_job(job: Any) -> bool:
    """Whether a job (`lora_otel.analysis.job.Job`) stalled: a process stuck now or when it ended,
    or a stall record leading its view."""
    focus = job.callout.proc if job.callout is not None else None
    return (job.callout is not None and job.callout.kind == "stuck") or (
        focus is not None and focus.view.verdict is not None
    )


def report_command(path: str) -> str:
    """The line a stalled job's output ends with: the command that writes its report,
    ``report: lora-otel report runs/ -o job.html``."""
    import shlex

    if path.startswith("-"):
        path = os.path.join(".", path)  # an argument, not an option
    shown = _display(path)
    if shown != path:  # a newline or control character: no line to paste would name it
        return "report: lora-otel report PATH -o job.html (the path has characters a line cannot show)"
    return f"report: lora-otel report {shlex.quote(path)} -o job.html"


def _drift_by_proc(jobs: list[Job], now_ns: int) -> dict[int, dict[str, Any]]:
    """With ``LORA_OTEL_BASELINE`` set: each job's focus process's drift report, by ``id`` of its
    `Proc` (a baseline that cannot be used: one line on stderr, and no reports)."""
    from lora_otel.analysis import baseline
    from lora_otel.analysis import job as jobs_mod

    reports: dict[int, dict[str, Any]] = {}
    for job in jobs:
        first = jobs_mod.focus(job)
        if first is None:
            continue
        report = baseline.inspect_report(first.journal, now_ns)
        if report is None:
            return {}
        if report["error"]:
            print(f"lora-otel inspect: {report['error']}; shown without it", file=sys.stderr)
            return {}
        reports[id(first)] = report
    return reports


def newest_run_or_none(command: str) -> Optional[str]:
    """For ``lora-otel COMMAND`` given no journal: the newest run's journal in ``$LORA_OTEL_DIR``,
    else in the per-user state directory (`lora_otel.journal.runs.default_dir`). One line on stderr
    names the file chosen, or says that there is none (then None)."""
    from lora_otel.journal.runs import default_dir, newest_run

    directory = default_dir()
    where = "$LORA_OTEL_DIR" if os.environ.get("LORA_OTEL_DIR") else "the journal directory"
    found = newest_run(directory) if os.path.isdir(directory) else None
    if found is None:
        print(
            f"lora-otel {command}: no journal given, and no run in {directory} ({where}); "
            "name a journal, a --log file or a directory",
            file=sys.stderr,
        )
        return None
    print(f"lora-otel {command}: reading {found} (the newest run in {directory})", file=sys.stderr)
    return found


def resolve_path(path: str) -> str:
    """``runs/demo.log`` (a ``--log`` file, not a journal) → the journal of its newest run:
    ``runs/demo.log.otel.jsonl`` or a re-run's ``runs/demo.log.<UTC>-<pid>-<hex>.otel.jsonl``,
    whichever started last: only regular files of the log's owner (this user's when there is no
    log file): a file another user put there under such a name, in a shared directory, is never
    taken for the job's. Anything else is returned as it is."""
    import stat

    from lora_otel._boot.seam import JOURNAL_SUFFIX

    if path.endswith(JOURNAL_SUFFIX) or os.path.isdir(path):
        return path
    try:
        owner = os.stat(path).st_uid
    except OSError:
        owner = os.geteuid()

    def ours(p: str) -> bool:
        try:
            st = os.lstat(p)
        except OSError:
            return False
        return stat.S_ISREG(st.st_mode) and st.st_uid == owner

    runs = [p for p in [path + JOURNAL_SUFFIX] if ours(p)]
    import glob
    import re

    rerun = re.compile(
        re.escape(os.path.basename(path)) + r"\.\d{8}T\d{6}Z-\d+(?:-[0-9a-f]+)?" + re.escape(JOURNAL_SUFFIX)
    )
    runs += [
        p
        for p in glob.glob(glob.escape(path) + ".*" + JOURNAL_SUFFIX)
        if rerun.fullmatch(os.path.basename(p)) and ours(p)
    ]
    if not runs:
        return path
    return max(runs, key=lambda p: (_first_ts(p), p))


def _first_ts(path: str) -> int:
    from lora_otel._boot.seam import files

    try:
        with open(files.open_regular(path), "rb") as f:
            ts = json.loads(f.readline() or b"{}").get("ts")
        return ts if isinstance(ts, int) else 0
    except (OSError, ValueError, AttributeError):
        return 0


def no_journal_beside(path: str, journal: Journal) -> str:
    """Why ``path`` cannot be read: ``not a journal (…)``; for a file that is no journal and has none
    beside it (a ``--log`` whose directory did not exist when the run started: lora_otel creates
    none, and the journal went to the journal directory), where that run's journal is."""
    from lora_otel._boot.seam import JOURNAL_SUFFIX
    from lora_otel.journal.runs import default_dir

    why = f"not a journal ({journal.problems[0]})"
    if path.endswith(JOURNAL_SUFFIX):
        return why
    return (
        f"{why}, and no journal beside it ({path}{JOURNAL_SUFFIX}): a run given --log {path} writes "
        f"its journal there only when that directory exists as it starts; else it is in {default_dir()} "
        "(`lora-otel inspect` with no argument reads the newest run there)"
    )


def not_a_journal(journal: Journal) -> bool:
    """Nothing in the file was a journal record (a plain log, a binary file)."""
    return journal.last_evidence_ns is None and not journal.stalls and bool(journal.problems)


def same_trace(journal: Journal) -> list[Journal]:
    """The journals next to ``journal`` of the same trace (its job's other ranks and processes)."""
    from lora_otel.journal.reader import sibling_journals

    if journal.trace_id is None:
        return []
    return [other for other in sibling_journals(journal) if other.trace_id == journal.trace_id]


def render_text(journal: Journal, now_ns: Optional[int] = None) -> str:
    """The text report (first line, journal line, span tree, notes), ending with a newline."""
    return "\n".join(_view(journal, now_ns).text_lines()) + "\n"


def render_json(journal: Journal, now_ns: Optional[int] = None) -> dict[str, Any]:
    """The ``--json`` document (docs/journal.md) as a dict."""
    return _view(journal, now_ns).to_json()


def _view(journal: Journal, now_ns: Optional[int]) -> View:
    return View(journal, process_state(journal), time.time_ns() if now_ns is None else now_ns)
