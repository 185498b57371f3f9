"""``lora-otel baseline save|diff``, and the baseline lines ``lora-otel inspect`` prints.

``lora-otel baseline save FILE [--from-journal J] [JOURNAL ...]`` writes a baseline file (JSON,
docs/baselines.md): the environment (of this interpreter, or with ``--from-journal`` the one
recorded in a journal's root span) and, from the journals of good runs given, the median duration
of each start-up phase.

``lora-otel baseline diff FILE [JOURNAL|FILE]`` lists the drift of a journal, of another baseline,
or of this interpreter (the default) from the baseline, phases counting as slower by
``--slower-factor`` (2) and ``--slower-by`` (1 s). Exit status 0 no drift, 1 drift, 2 usage error
(one line on stderr).

What a baseline holds and how drift is found: `lora_otel.analysis.baseline`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Iterable
from typing import Any, Optional

from lora_otel.analysis.baseline import (
    SLOWER_BY_S,
    SLOWER_FACTOR,
    BaselineError,
    brief,
    compare,
    compare_journal,
    interpreter_environment,
    journal_environment,
    load_baseline,
    make_baseline,
    median_phases,
    write_baseline,
)
from lora_otel.cli.jobs import write as _write
from lora_otel.journal.reader import Journal, JournalError, read_journal


def report_json(report: dict[str, Any]) -> dict[str, Any]:
    return {
        **report,
        "relevant": [d.to_json() for d in report["relevant"]],
        "other": [d.to_json() for d in report["other"]],
    }


def report_lines(report: dict[str, Any]) -> list[str]:
    """The lines ``inspect`` prints after its first line (none when the report is an error)."""
    if report["error"]:
        return []
    path, stage = report["path"], report["stage"]
    relevant, other = report["relevant"], report["other"]
    lines: list[str] = []
    if relevant:
        lines.append("drift from baseline %s%s:" % (path, " bearing on %s" % stage if stage else ""))
        lines.extend("  %s" % d.text for d in relevant)
        if other:
            lines.append("other drift: %s" % brief(other))
    elif other:
        lines.append(
            "baseline %s: %sother drift: %s"
            % (path, "nothing that bears on %s differs; " % stage if stage else "", brief(other))
        )
    else:
        lines.append("baseline %s: no drift" % path)
    lines.extend("baseline note: %s" % note for note in report["notes"])
    return lines


class _Intermixed(argparse.ArgumentParser):
    """Options anywhere among the positionals: ``save FILE --from-journal J J1 J2``."""

    _inside = False

    def parse_known_args(self, args: Optional[Iterable[str]] = None, namespace: Any = None) -> tuple[Any, list[str]]:
        if self._inside:
            return super().parse_known_args(args, namespace)
        self._inside = True
        try:
            return self.parse_known_intermixed_args(args, namespace)
        finally:
            self._inside = False


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``save`` and ``diff`` actions of ``lora-otel baseline``."""
    actions = parser.add_subparsers(dest="action", metavar="ACTION", parser_class=_Intermixed)
    actions.required = True
    save = actions.add_parser(
        "save",
        help="record the environment, and the start-up phases of good runs, in FILE",
        description="Record in FILE the environment (of this interpreter, or with --from-journal the one a "
        "journal's self-check recorded) and, from the journals of good runs given, the median "
        "duration of each start-up phase (arguments, import X, cuda probe, cuda init, stages before "
        "training, and start-up: process start to training).",
    )
    save.add_argument("file", metavar="FILE", help="the baseline file to write (JSON)")
    save.add_argument("journals", nargs="*", metavar="JOURNAL", help="journals of good runs: their start-up phases")
    save.add_argument(
        "--from-journal",
        metavar="JOURNAL",
        help="take the environment from this journal's self-check, not from this interpreter",
    )
    diff = actions.add_parser(
        "diff",
        help="list the drift from the baseline FILE",
        description="List the drift of a journal, of another baseline file, or of this interpreter (the default) "
        "from the baseline FILE: packages, Python, torch's CUDA build, cuDNN, the NVIDIA driver, the "
        "GPUs, the relevant environment variables, and the phases much slower than the baseline's "
        '("import torch took 48 s; baseline 2.1 s"). Exit status: 0 no drift, 1 drift, 2 usage error.',
    )
    diff.add_argument("file", metavar="FILE", help="the baseline file")
    diff.add_argument(
        "against",
        nargs="?",
        metavar="JOURNAL|FILE",
        help="a journal, or another baseline file (default: this interpreter)",
    )
    diff.add_argument("--json", action="store_true", help="print machine-readable JSON")
    diff.add_argument(
        "--slower-factor",
        type=float,
        default=SLOWER_FACTOR,
        metavar="X",
        help="a phase is slower when it took more than X times the baseline (default %g)" % SLOWER_FACTOR,
    )
    diff.add_argument(
        "--slower-by",
        type=float,
        default=SLOWER_BY_S,
        metavar="S",
        help="... and more than S seconds longer (default %g)" % SLOWER_BY_S,
    )


def run_baseline(args: argparse.Namespace) -> int:
    """``lora-otel baseline save|diff``; 2 with one line on stderr when something cannot be used."""
    try:
        if args.action == "save":
            return _save(args)
        return _diff(args)
    except BaselineError as e:
        print("lora-otel baseline: %s" % e, file=sys.stderr)
        return 2


def _journal(path: str) -> Journal:
    try:
        journal = read_journal(path)
    except JournalError as e:
        raise BaselineError(str(e)) from None
    if journal.root is None:
        raise BaselineError("%s: not a journal (no 'process' span)" % path)
    return journal


def _save(args: argparse.Namespace) -> int:
    journals = [_journal(path) for path in args.journals]
    for journal in journals:
        exit_ = journal.exit
        if exit_ is None or exit_["how"] != "normal" or exit_["code"] not in (0, None):
            print(
                "lora-otel baseline: note: %s did not finish normally; its finished start-up phases are used"
                % journal.path,
                file=sys.stderr,
            )
    source: dict[str, Any] = {"journals": [os.path.abspath(j.path) for j in journals]}
    if args.from_journal:
        journal = _journal(args.from_journal)
        environment = journal_environment(journal)
        if environment is None:
            raise BaselineError(
                "%s: has no environment self-check (the process ended before it ran)" % args.from_journal
            )
        source.update(environment="journal", journal=os.path.abspath(args.from_journal))
    else:
        environment = interpreter_environment()
        source.update(environment="interpreter", interpreter=sys.executable)
    phases = median_phases(journals)
    write_baseline(args.file, make_baseline(environment, phases, source))
    _write(
        "saved baseline %s: %s; %d start-up phase%s%s\n"
        % (  # the environment may be a journal's: any text
            args.file,
            _summary(environment),
            len(phases),
            "" if len(phases) == 1 else "s",
            " (medians of %d journal%s)" % (len(journals), "" if len(journals) == 1 else "s") if journals else "",
        )
    )
    return 0


def _summary(env: dict[str, Any]) -> str:
    """``Python 3.11.7, torch 2.3.1 (CUDA 12.1), driver 535.104.05, 8 GPUs, 9 packages, 4 variables``."""
    parts = ["Python %s" % (env.get("python") or "?")]
    torch = (env.get("packages") or {}).get("torch")
    if torch:
        parts.append("torch %s (%s)" % (torch, "CUDA %s" % env["torch_cuda"] if env.get("torch_cuda") else "CPU build"))
    if env.get("driver"):
        parts.append("driver %s" % env["driver"])
    if env.get("gpu_count") is not None:
        parts.append("%d GPU%s" % (env["gpu_count"], "" if env["gpu_count"] == 1 else "s"))
    parts.append("%d packages" % len(env.get("packages") or {}))
    n = len(env.get("env") or {})
    parts.append("%d variable%s" % (n, "" if n == 1 else "s"))
    return ", ".join(parts)


def _is_journal(path: str) -> bool:
    """Whether the file's first line is a journal record (a baseline file starts with ``{`` alone)."""
    try:
        with open(path, "rb") as f:
            first = f.readline(1 << 20)
    except OSError:
        return True  # read_journal says why
    try:
        record = json.loads(first)
    except (ValueError, RecursionError):
        return not first.strip().startswith(b"{")
    return isinstance(record, dict) and "k" in record and "v" in record


def _diff(args: argparse.Namespace) -> int:
    if not args.slower_factor > 0 or args.slower_factor != args.slower_factor:
        raise BaselineError("--slower-factor must be a number more than 0, got %g" % args.slower_factor)
    if not args.slower_by >= 0:
        raise BaselineError("--slower-by must be 0 seconds or more, got %g" % args.slower_by)
    baseline = load_baseline(args.file)
    factor, by_s = args.slower_factor, args.slower_by
    if args.against is None:
        against = {"kind": "interpreter", "path": sys.executable}
        result = compare(baseline, interpreter_environment(), None, "this interpreter", factor, by_s)
        where = "this interpreter (%s)" % sys.executable
    elif _is_journal(args.against):
        journal = _journal(args.against)
        against = {"kind": "journal", "path": args.against}
        result = compare_journal(baseline, journal, None, factor, by_s)
        where = args.against
    else:
        other = load_baseline(args.against)
        against = {"kind": "baseline", "path": args.against}
        phases = {name: (seconds, False) for name, seconds in other.phases.items()}
        result = compare(baseline, other.environment, phases, "the other baseline", factor, by_s)
        if other.environment is None:
            result.notes.append("the other baseline has no environment")
        where = args.against
    if args.json:
        doc = {
            "baseline": args.file,
            "created_at": baseline.doc.get("created_at"),
            "against": against,
            "rule": {"slower_factor": factor, "slower_by_s": by_s},
            "drift": [d.to_json() for d in result.drift],
            "notes": result.notes,
        }
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
    else:
        described = baseline.describe()
        head = "baseline %s%s" % (args.file, " (%s)" % described if described else "")
        n = len(result.drift)
        lines = [
            "%s vs %s: %s" % (head, where, "no drift" if not n else "%d difference%s" % (n, "" if n == 1 else "s"))
        ]
        lines += ["  %s" % d.text for d in result.drift]
        lines += ["note: %s" % note for note in result.notes]
        _write("\n".join(lines) + "\n")
    return 1 if result.drift else 0
