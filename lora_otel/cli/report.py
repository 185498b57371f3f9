"""``lora-otel report``: a job as one file — an HTML page to look at (`lora_otel.cli.report_html`)
or a Trace Event JSON for Perfetto UI / ``chrome://tracing`` (`lora_otel.export.perfetto`).

The input is found the way ``inspect`` finds it: a journal (with the journals beside it of the same
trace: its launcher, ranks and workers), the ``--log`` path a job was given (its newest run's
journal), or a directory (every journal in it; one section per job).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from lora_otel.journal.reader import Journal, JournalError, journal_paths, read_journal

DEFAULT_OUTPUT = {"html": "lora-otel-report.html", "perfetto": "lora-otel-trace.json"}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "path", metavar="JOURNAL|LOG|DIR", help="a journal, the --log path of a job, or a directory of journals"
    )
    p.add_argument(
        "-o",
        "--output",
        metavar="OUT",
        help="the file to write (default: ./lora-otel-report.html, or ./lora-otel-trace.json for "
        "--format perfetto); - for standard output",
    )
    p.add_argument(
        "--format",
        choices=("html", "perfetto"),
        default="html",
        help="html: one self-contained page (default); perfetto: Trace Event JSON for Perfetto UI or chrome://tracing",
    )


EPILOG = (
    "examples:\n"
    "  lora-otel report runs/ -o job.html                 every job journaling into runs/, one page\n"
    "  lora-otel report runs/a.log -o job.html            the newest run of the job given --log runs/a.log\n"
    "  lora-otel report runs/ --format perfetto -o job.json   open in https://ui.perfetto.dev\n"
    "\nThe page needs no network and no server (inline styles, script and SVG); what it shows is\n"
    "redacted as every other output is. exit status: 0, or 2 when nothing can be read."
)


def read_input(path: str) -> list[Journal]:
    """The journals ``path`` stands for (module docstring). Raises `JournalError` (one line) when
    there is nothing to read."""
    from lora_otel.cli.inspect import not_a_journal, resolve_path, same_trace

    path = resolve_path(path)
    if os.path.isdir(path):
        paths = journal_paths(path)
        if not paths:
            raise JournalError(f"{path}: no journals (*.otel.jsonl) in this directory")
        journals = []
        for one in paths:
            try:
                journals.append(read_journal(one))
            except JournalError as e:  # listed as not read, as inspect DIR does
                journals.append(Journal(one, problems=[str(e)]))
        return journals
    journal = read_journal(path)
    if not_a_journal(journal):
        raise JournalError(f"{path}: not a journal ({journal.problems[0]})")
    return [journal, *same_trace(journal)]


def run_report(args: argparse.Namespace) -> int:
    """Write the report of ``args.path`` to ``args.output`` in ``args.format``; one line on stderr.

    Returns:
        0; 2 (one line on stderr) when nothing can be read or the output cannot be written.
    """
    fmt = getattr(args, "format", "html") or "html"

    def fail(message: object) -> int:
        print(f"lora-otel report: {message}", file=sys.stderr)
        return 2

    try:
        journals = read_input(args.path)
    except JournalError as e:
        return fail(e)
    now_ns = time.time_ns()
    if fmt == "perfetto":
        try:
            from lora_otel.export.perfetto import trace_events
        except ImportError:
            return fail("--format perfetto is not available: this installation has no lora_otel.export.perfetto")
        text = json.dumps(trace_events(journals, now_ns), ensure_ascii=False, separators=(",", ":"))
    else:
        from lora_otel.cli.report_html import render_html

        text = render_html(journals, now_ns)
    out = args.output or DEFAULT_OUTPUT[fmt]
    data = text.encode("utf-8", "backslashreplace")
    if out == "-":
        sys.stdout.buffer.write(data)
        sys.stdout.flush()
        return 0
    try:
        with open(out, "wb") as f:
            f.write(data)
    except OSError as e:
        return fail(f"{out}: cannot write: {e.strerror or e}")
    processes = sum(1 for journal in journals if journal.spans)
    spans = sum(len(journal.spans) for journal in journals)
    print(
        f"lora-otel report: wrote {out} ({processes} process{'es' if processes != 1 else ''}, {spans} spans, "
        f"{len(data) / 1024:.0f} KB)",
        file=sys.stderr,
    )
    return 0
