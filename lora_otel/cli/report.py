"""``lora-otel report``: a job as one file — an HTML page to look at (`lora_otel.cli.report_html`)
or a Trace Event JSON for Perfetto UI / ``chrome://tracing`` (`lora_otel.export.perfetto`).

The input is found the way ``inspect`` finds it: a journal (with the journals beside it of the same
trace: its launcher, ranks and workers), the ``--log`` path a job was given (its newest run's
journal), or a directory (every journal in it; one section per job).
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import os
import stat
import sys
import tempfile
import time
from typing import Optional

from lora_otel.journal.reader import Journal, JournalError, left_out_line, listed_journals, read_journal
from lora_otel.journal.tree import _display

DEFAULT_OUTPUT = {"html": "lora-otel-report.html", "perfetto": "lora-otel-trace.json"}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "path",
        nargs="?",
        metavar="JOURNAL|LOG|DIR",
        help="a journal, the --log path of a job, or a directory of journals (default: the newest run in "
        "$LORA_OTEL_DIR, else in ~/.local/state/lora-otel/)",
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
    "  lora-otel report -o job.html                       the newest run (in $LORA_OTEL_DIR, else the state dir)\n"
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
        try:
            paths, left_out = listed_journals(path)  # only this user's regular files, as inspect DIR
        except OSError as e:
            raise JournalError(f"{path}: cannot list: {e.strerror or e}") from None
        if left_out:
            print(f"lora-otel report: {_display(path)}: {left_out_line(left_out)}", file=sys.stderr)
        if not paths:
            whose = " of this user's" if left_out else ""
            raise JournalError(f"{_display(path)}: no journals (*.otel.jsonl){whose} in this directory")
        journals = []
        owner = os.geteuid()
        for one in paths:
            try:
                journals.append(read_journal(one, owner))
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

    if args.path is None:
        from lora_otel.cli.inspect import newest_run_or_none

        args.path = newest_run_or_none("report")
        if args.path is None:
            return 2
    try:
        journals = read_input(args.path)
    except JournalError as e:
        return fail(e)
    if not any(journal.spans for journal in journals):
        unread = [journal.problems[0] for journal in journals if journal.problems]
        return fail(
            f"{args.path}: nothing to show: no journal there could be read" + (f" ({unread[0]})" if unread else "")
        )
    out = args.output or DEFAULT_OUTPUT[fmt]
    if out != "-":
        clash = _job_file(out, journals)
        if clash is not None:
            return fail(f"{out} is the job's own file ({clash}): not overwritten; name another -o")
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
    data = text.encode("utf-8", "backslashreplace")
    if out == "-":
        sys.stdout.buffer.write(data)
        sys.stdout.flush()
        return 0
    try:
        replaced = _write_new(out, data)
    except OSError as e:
        return fail(f"{out}: cannot write: {e.strerror or e}")
    processes = sum(1 for journal in journals if journal.spans)
    spans = sum(len(journal.spans) for journal in journals)
    print(
        f"lora-otel report: {'replaced' if replaced else 'wrote'} {out} ({processes} "
        f"process{'es' if processes != 1 else ''}, {spans} spans, {len(data) / 1024:.0f} KB)",
        file=sys.stderr,
    )
    return 0


def _job_file(out: str, journals: list[Journal]) -> Optional[str]:
    """The job's own file ``out`` names (a journal, its ``--log`` file, stacks or sidecar log), or None:
    a report written over it would destroy the job's only record."""
    if not os.path.exists(out):
        return None
    own: list[str] = []
    for journal in journals:
        own.append(journal.path)
        if journal.log_path:
            own.append(journal.log_path)
        root_attrs = journal.root.attrs if journal.root is not None else {}
        for key in ("lora_otel.stacks.path", "lora_otel.sidecar.log"):
            value = root_attrs.get(key)
            if isinstance(value, str):
                own.append(value)
    for path in own:
        try:
            if os.path.samefile(out, path):
                return path
        except OSError:
            continue
    return None


def _write_new(out: str, data: bytes) -> bool:
    """Write ``out`` whole or not at all: a new file (mode 0600, as the journals) beside it, renamed
    over it. A symlink at ``out`` is replaced, never written through; a device or pipe (``/dev/stdout``)
    is written in place. True when a file was there before."""
    try:
        st = os.lstat(out)
    except FileNotFoundError:
        st = None
    if st is not None and not (stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode)):
        if stat.S_ISDIR(st.st_mode):
            raise IsADirectoryError(errno.EISDIR, "is a directory")
        with open(out, "wb") as f:  # a device or a pipe: written as it is
            f.write(data)
        return False
    directory = os.path.dirname(os.path.abspath(out))
    fd, tmp = tempfile.mkstemp(prefix=".lora-otel-report-", dir=directory)  # mode 0600
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, out)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return st is not None
