"""The one-file HTML report of a job (``lora-otel report -o job.html``): a picture of it to look at
or attach to a bug report, with no server and no network.

`render_html` turns the journals of a job (a launcher, its ranks, their workers) into one
self-contained page — inline styles, script and SVG, a Content-Security-Policy that lets the page
fetch nothing — that shows, per job:

- the outcome in one sentence and, for a stall, the stall's line and diagnosis
  (`lora_otel.analysis.verdict`), as ``inspect`` prints them;
- a waterfall of every process in lanes (launcher first, ranks in order, then their workers; the
  order of `lora_otel.analysis.job`), each span a bar on one time axis; an open span runs to now
  (its process still runs) or to its process's last sign of life; the stalled span is drawn in its
  own colour *and* with stripes, a ``STALLED`` label and the diagnosis in words under it, so that
  it can be told without colour; a span open when its process was killed says ``KILLED``;
- steps over time: optimizer steps per second between beats, one line per process that trained;
- details on demand: clicking a span shows its attributes, events, status, and for the stalled or
  deepest open span and the process span, the stall's evidence, the last stack dump (the thread
  the diagnosis is about first) and where the main thread was at the last beat; the environment
  self-check; the drift from the baseline ``LORA_OTEL_BASELINE`` names, when set.

Every text shown passes the same redaction as the other outputs (`redact_text` for secret shapes
and ``name=value`` pairs, ``scrub`` for the values redacted at the job's start); the journal was
redacted when written. The page's data is one JSON document inside the page; its script renders only
the rows in view, so a journal of 10,000 spans opens and scrolls smoothly (docs/performance.md).
Standard library only.
"""

from __future__ import annotations

import html
import json
import os
import re
from typing import Any, Optional

from lora_otel._boot.seam import redact, redact_text, stalled_line
from lora_otel._version import __version__
from lora_otel.analysis import job as jobs_mod
from lora_otel.analysis import verdict as verdict_mod
from lora_otel.cli import jobs as jobs_view
from lora_otel.journal.reader import Journal, Span, format_duration, process_state
from lora_otel.journal.tree import deepest_open_span, iso_time, walk_tree

MAX_STACK_LINES = 400
"""Lines of the last stack dump a process's details show (the relevant thread first)."""
MAX_PLOT_POINTS = 400
"""Beats plotted per process; a longer journal's beats are thinned evenly (the last one kept)."""
MAX_LOG_LINES = 200
"""The last human lines of the process called out, shown in the report."""
ENV_PREFIXES = (
    "process.",
    "host.",
    "os.",
    "lora_otel.pkg.",
    "lora_otel.env.",
    "lora_otel.torch.",
    "lora_otel.cuda",
    "lora_otel.cudnn.",
    "lora_otel.nvidia.",
    "lora_otel.python.",
)
"""The root attributes that make up the environment self-check (`lora_otel._boot.envfacts`)."""

CSP = "default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:"
"""The page's Content-Security-Policy: it may fetch nothing, from anywhere (its styles and script are inline)."""

# The flag of a span row, as the page's script knows it.
OK, ERROR, OPEN, STALLED, KILLED = 0, 1, 2, 3, 4
_SERIES_STYLES = [("#0072B2", ""), ("#D55E00", "6 3"), ("#009E73", "2 2"), ("#CC79A7", "8 3 2 3"), ("#E69F00", "1 3")]
"""Okabe–Ito colours with dash patterns: lines of the steps plot told apart without colour too."""


def render_html(journals: list[Journal], now_ns: int) -> str:
    """The report of ``journals`` (one job or several: grouped by trace id) as one HTML page.

    Args:
        journals: journals as `lora_otel.journal.reader.read_journal` gives them; those without
            a span are listed as not read.
        now_ns: the time the report is written (Unix ns): open spans of running processes run to it.

    Returns:
        The page, a ``str`` of valid Unicode (lone surrogates written as ``\\udcXX`` text).
    """
    procs: list[jobs_mod.Proc] = []
    unreadable: list[jobs_mod.Unreadable] = []
    for journal in journals:
        reason = jobs_mod.unreadable_reason(journal)
        if reason is not None:
            unreadable.append(jobs_mod.Unreadable(journal.path, reason))
            continue
        state = process_state(journal)
        if state == "running":
            _learn_secrets(journal.pid)
        procs.append(jobs_mod.make_proc(journal, state, now_ns, None, None))
    jobs = jobs_mod.group_jobs(procs)
    jobs_mod.attach_verdicts(jobs, now_ns, None)  # None: each journal's recorded limit
    data = {"jobs": [_job_data(job, now_ns) for job in jobs]}
    title = jobs[0].name if len(jobs) == 1 else f"{len(jobs)} jobs"
    body = "".join(_job_html(job, index, data["jobs"][index]) for index, job in enumerate(jobs))
    if unreadable:
        items = "".join(f"<li>{_h(bad.path)}: {_h(bad.reason)}</li>" for bad in unreadable)
        body += f'<section class="job"><h2>Not read</h2><ul class="notes">{items}</ul></section>'
    if not jobs and not unreadable:
        body = '<section class="job"><p>No journal to show.</p></section>'
    parts = {
        "TITLE": _h(f"lora-otel report: {title}"),
        "HEADING": _h(title),
        "META": _h(f"written {iso_time(now_ns)} by lora-otel {__version__} from {len(procs)} journal(s)"),
        "BODY": body,
        "CSP": CSP,
        "STYLE": _asset("report.css"),
        "SCRIPT": _asset("report.js"),
        "DATA": _script_json(data),
    }
    # One pass, so that a placeholder inside the journal's text is never replaced.
    return re.sub(r"%(TITLE|HEADING|META|BODY|CSP|STYLE|SCRIPT|DATA)%", lambda m: parts[m.group(1)], _PAGE)


def _asset(name: str) -> str:
    """The page's stylesheet or script (``report.css``, ``report.js`` beside this module)."""
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), name), encoding="utf-8") as f:
        return f.read()


# --- redaction ---------------------------------------------------------------------------------


def _learn_secrets(pid: Optional[int]) -> None:
    """Teach ``redact.scrub`` the values the running process ``pid`` had redacted at its start (its
    command line's secret options), as the live export does; nothing when it cannot be read."""
    if not pid:
        return
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = [os.fsdecode(a) for a in f.read().split(b"\0")[:-1]]
    except (OSError, ValueError):
        return
    redact.redact_argv(argv)


def _text(value: object) -> str:
    """``value`` as text fit to show: valid Unicode, secret shapes and known secret values redacted."""
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return redact.scrub(redact_text(text))


def _clean(value: Any, key: str = "") -> Any:
    """A journal value (attribute, event attribute) fit to show: strings through `_text`, a secret
    name's string value replaced whole, numbers as they are, containers item by item."""
    if isinstance(value, str):
        if key and value and value != redact.REDACTED and redact.is_secret_name(key.rsplit(".", 1)[-1]):
            return redact.REDACTED
        return _text(value)
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, (int, float)):
        return value if abs(value) < 2**53 and value == value else _text(value)
    if isinstance(value, list):
        return [_clean(item, key) for item in value]
    if isinstance(value, dict):
        return {_text(str(k)): _clean(v, str(k)) for k, v in value.items()}
    return _text(str(value))


def _attrs(attrs: dict[str, Any]) -> dict[str, Any]:
    return {_text(str(key)): _clean(value, str(key)) for key, value in attrs.items()}


def _h(text: object) -> str:
    """HTML-escaped, redacted text."""
    return html.escape(_text(text), quote=True)


def _script_json(doc: Any) -> str:
    """``doc`` as JSON to sit inside ``<script type="application/json">``: no ``<``, ``>`` or ``&``."""
    text = json.dumps(doc, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    return text.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")


# --- the data the page's script draws ----------------------------------------------------------


def _ms(ns: int, t0: int) -> float:
    return round((ns - t0) / 1e6, 3)


def _job_data(job: jobs_mod.Job, now_ns: int) -> dict[str, Any]:
    t0 = job.start_ns
    lanes = [_lane_data(proc, job, t0) for proc in job.procs]
    end = max([lane["end"] for lane in lanes] + [0.001])
    running = any(proc.state == "running" for proc in job.procs)
    return {"end": end, "now": _ms(now_ns, t0) if running else None, "lanes": lanes}


def _verdict_of(proc: jobs_mod.Proc) -> Optional[verdict_mod.Verdict]:
    found = proc.view.verdict
    if isinstance(found, verdict_mod.Verdict):
        return found
    return verdict_mod.from_record(proc.journal, proc.view.reference_ns)


def _stalled_span(proc: jobs_mod.Proc, verdict: Optional[verdict_mod.Verdict]) -> Optional[Span]:
    """The span to mark stalled: the stall found (running, or when the journal ends), else the one
    the journal's last stall record names (not for a death: that is a kill, not a stall)."""
    if proc.stall is not None:
        return proc.stall.span
    if verdict is not None and verdict.kind != "died" and proc.journal.stalls:
        span_id = proc.journal.stalls[-1].get("span_id")
        return proc.journal.span(span_id) if isinstance(span_id, str) else proc.journal.root
    return None


def _lane_data(proc: jobs_mod.Proc, job: jobs_mod.Job, t0: int) -> dict[str, Any]:
    journal, view = proc.journal, proc.view
    reference = view.reference_ns
    verdict = _verdict_of(proc)
    stalled = _stalled_span(proc, verdict)
    killed = proc.outcome == "killed" or (journal.exit is None and proc.state == "gone")
    deepest = deepest_open_span(journal)
    spans: list[list[Any]] = []
    details: list[dict[str, Any]] = []
    tree = walk_tree(journal)
    for depth, span in tree:
        end = span.end_ns if span.end_ns is not None else max(reference, span.start_ns)
        if span is stalled:
            flag = STALLED
        elif span.is_open:
            flag = KILLED if killed else OPEN
        else:
            flag = ERROR if span.status == "error" else OK
        spans.append([_text(span.name), depth, _ms(span.start_ns, t0), _ms(end, t0), flag])
        details.append(_span_details(span, proc, t0, show_stacks=span is stalled or span is deepest))
    diagnosis = None
    if stalled is not None:
        diagnosis = _text(verdict.line() if verdict is not None else stalled_line(proc.view.stuck(), None))
    elif verdict is not None:  # a death the watchdog recorded
        diagnosis = _text(verdict.line())
    diag_at = stalled if stalled is not None else deepest if diagnosis is not None else None
    stacks = [_text(line) for line in verdict_mod.stacks_lines(journal, verdict, MAX_STACK_LINES)]
    return {
        "label": _text(proc.label),
        "who": _text(proc.who),
        "name": _text(proc.name),
        "pid": journal.pid,
        "outcome": proc.outcome,
        "sentence": _text(jobs_mod.stopped_phrase(proc) if proc.outcome == "stopped" else view.stuck()),
        "steps": journal.steps,
        "start": _ms(proc.start_ns, t0),
        "end": _ms(max(reference, proc.start_ns), t0),
        "journal": _text(journal.path),
        "diagnosis": diagnosis,
        "advice": _text(verdict.advice_line()) or None if verdict is not None and diagnosis is not None else None,
        "diag_at": next((i for i, (_, span) in enumerate(tree) if span is diag_at), None),
        "stall": _stall_data(verdict, proc) if diagnosis is not None else None,
        "stacks": stacks,
        "main": _text(view.main_thread_line()) or None,
        "spans": spans,
        "details": details,
        "problems": [_text(problem) for problem in journal.problems[:20]],
        "focus": job.callout is not None and job.callout.proc is proc,
    }


def _stall_data(verdict: Optional[verdict_mod.Verdict], proc: jobs_mod.Proc) -> dict[str, Any]:
    if verdict is None:
        stall = proc.stall
        return {"kind": stall.kind if stall else None, "evidence": {}, "by": "inspect"}
    return {
        "kind": verdict.kind,
        "limit_s": verdict.limit_s,
        "open_s": verdict.open_s,
        "by": verdict.by,
        "diagnosis": _text(verdict.diagnosis),
        "evidence": _attrs(verdict.evidence) if isinstance(verdict.evidence, dict) else {},
    }


def _span_details(span: Span, proc: jobs_mod.Proc, t0: int, show_stacks: bool) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": span.span_id,
        "start": iso_time(span.start_ns),
        "status": span.status if not span.is_open else "open",
    }
    if span.end_ns is not None:
        out["end"] = iso_time(span.end_ns)
        out["dur"] = format_duration(span.end_ns - span.start_ns)
    else:
        out["open"] = format_duration(proc.view.open_for_ns(span) or 0)
    if span.message:
        out["message"] = _text(span.message)
    if span.attrs:
        out["attrs"] = _attrs(span.attrs)
    if span.events:
        out["events"] = [[_ms(ts, t0), _text(name), _attrs(attrs)] for ts, name, attrs in span.events]
    if show_stacks or span is proc.journal.root:
        out["stacks"] = 1
    return out


# --- the parts written as HTML here ------------------------------------------------------------


def _job_html(job: jobs_mod.Job, index: int, data: dict[str, Any]) -> str:
    count = len(job.procs)
    parts = [f'<section class="job" id="job-{index}" data-job="{index}">']
    parts.append(
        f'<h2><span class="badge o-{_h(job.outcome)}">{_h(job.outcome.upper())}</span> '
        f"{_h(job.name)} <small>{count} process{'es' if count != 1 else ''} · trace {_h(job.trace_id)}</small></h2>"
    )
    parts.append(f'<p class="phrase">{_h(job.phrase)}</p>')
    if job.callout is not None and count > 1:
        parts.append(f'<p class="callout">{_h(job.callout.text)}</p>')
    focus = jobs_mod.focus(job)
    focus_lane = data["lanes"][job.procs.index(focus)] if focus is not None else None
    if focus_lane is not None and focus_lane["diagnosis"]:
        parts.append(f'<p class="verdict" role="alert"><b>⚠</b> {html.escape(focus_lane["diagnosis"])}</p>')
        if focus_lane.get("advice"):
            parts.append(f'<p class="advice">{html.escape(focus_lane["advice"])}</p>')
    parts.append(_processes_table(job, data))
    plot = _steps_svg(job, data)
    if plot:
        parts.append(f'<h3>Steps over time</h3><div class="plot">{plot}</div>')
    parts.append(
        '<h3>Timeline</h3><p class="legend">'
        '<span class="key k0"></span> ok <span class="key k1"></span> ✕ error '
        '<span class="key k2"></span> … open <span class="key k3"></span> ⚠ stalled '
        '<span class="key k4"></span> † open when killed'
        " — click a span for its attributes, events and stacks; click a lane to fold it</p>"
        '<div class="wf-grid"><div class="wf"><div class="wf-axis"></div>'
        '<div class="wf-body" tabindex="0"><div class="wf-space"></div></div></div>'
        '<aside class="details" aria-live="polite"><p class="hint">Click a span to see its details.</p></aside></div>'
    )
    if focus is not None:
        parts.append(_environment_html(focus))
        parts.append(_baseline_html(focus))
        parts.append(_lines_html(focus))
    problems = [(proc, problem) for proc in job.procs for problem in proc.journal.problems[:20]]
    if problems:
        items = "".join(f"<li>{_h(proc.who)}: {_h(problem)}</li>" for proc, problem in problems)
        parts.append(
            f'<details><summary>Journal problems ({len(problems)})</summary><ul class="notes">{items}</ul></details>'
        )
    parts.append("</section>")
    return "".join(parts)


def _processes_table(job: jobs_mod.Job, data: dict[str, Any]) -> str:
    rows = []
    for proc, lane in zip(job.procs, data["lanes"]):
        pid = proc.journal.pid if proc.journal.pid is not None else "?"
        rows.append(
            f'<tr class="o-{_h(proc.outcome)}"><td>{_h(proc.label)}</td><td>{_h(proc.name)}</td><td>{pid}</td>'
            f'<td>{_h(proc.outcome)}</td><td class="num">{proc.journal.steps}</td>'
            f"<td>{html.escape(lane['sentence'])}</td></tr>"
        )
    missing = job.missing_ranks()
    note = ""
    if missing and len(missing) < (job.world_size or 0):
        ranks = _h(jobs_view._ranges(missing))
        note = f'<p class="notes">No journal here for rank(s) {ranks} of world size {job.world_size}.</p>'
    return (
        '<table class="procs"><thead><tr><th>lane</th><th>program</th><th>pid</th><th>outcome</th>'
        f"<th>steps</th><th>where it is or was</th></tr></thead><tbody>{''.join(rows)}</tbody></table>{note}"
    )


def _environment_html(proc: jobs_mod.Proc) -> str:
    root = proc.journal.root
    attrs = root.attrs if root is not None else {}
    items = sorted((key, value) for key, value in attrs.items() if key.startswith(ENV_PREFIXES))
    if not items:
        return ""
    rows = "".join(f"<tr><th>{_h(key)}</th><td>{_h(_clean(value, key))}</td></tr>" for key, value in items)
    return (
        f"<details><summary>Environment self-check ({_h(proc.who)}, {len(items)} facts)</summary>"
        f'<table class="kv">{rows}</table></details>'
    )


def _baseline_html(proc: jobs_mod.Proc) -> str:
    """The drift from ``LORA_OTEL_BASELINE``'s baseline, as inspect prints it ('' when unset)."""
    from lora_otel.analysis import baseline
    from lora_otel.cli import baseline as baseline_view

    report = baseline.inspect_report(proc.journal, proc.view.now_ns)
    if report is None:
        return ""
    if report["error"]:
        lines = [report["error"]]
    else:
        lines = baseline_view.report_lines(report) or ["no drift from the baseline"]
    text = "\n".join(_text(line) for line in lines)
    summary = f"Baseline drift ({_h(report['path'])})"
    return f"<details open><summary>{summary}</summary><pre>{html.escape(text)}</pre></details>"


def _lines_html(proc: jobs_mod.Proc) -> str:
    lines = proc.journal.lines[-MAX_LOG_LINES:]
    if not lines:
        return ""
    t0 = proc.start_ns
    text = "\n".join(f"{format_duration(line.ts - t0):>9}  {_text(line.msg)}" for line in lines)
    return (
        f"<details><summary>What {_h(proc.who)} said ({len(lines)} lines of its log)</summary>"
        f"<pre>{html.escape(text)}</pre></details>"
    )


def beat_series(journal: Journal) -> list[tuple[int, int]]:
    """``(ts, steps)`` of every beat of the journal, read again from its file (the reader keeps only
    the last few hundred), thinned to `MAX_PLOT_POINTS`; the reader's samples when it cannot be read."""
    from lora_otel._boot.seam import files

    points: list[tuple[int, int]] = []
    try:
        with open(files.open_regular(journal.path), "rb") as f:  # (never a FIFO put there since)
            for raw in f:
                if b'"beat"' not in raw:
                    continue
                try:
                    record = json.loads(raw)
                except ValueError:
                    continue
                if not isinstance(record, dict) or record.get("k") != "beat":
                    continue
                ts, steps = record.get("ts"), record.get("steps")
                if type(ts) is int and type(steps) is int:
                    points.append((ts, steps))
    except OSError:
        points = list(journal.step_samples)
    if len(points) > MAX_PLOT_POINTS:
        stride = len(points) / MAX_PLOT_POINTS
        points = [points[int(i * stride)] for i in range(MAX_PLOT_POINTS - 1)] + [points[-1]]
    return points


def _steps_svg(job: jobs_mod.Job, data: dict[str, Any]) -> str:
    """Optimizer steps per second between beats, one line per process that made steps ('' when none)."""
    series = []
    for proc, lane in zip(job.procs, data["lanes"]):
        if not proc.journal.steps:
            continue
        points = [(proc.start_ns, 0)] + [(t, s) for t, s in beat_series(proc.journal) if t > proc.start_ns]
        rates: list[tuple[float, float]] = [(lane["start"] / 1000, 0.0)]
        for (ta, sa), (tb, sb) in zip(points, points[1:]):  # a step line: the rate over each beat interval
            rate = max(sb - sa, 0) / ((tb - ta) / 1e9)
            rates += [((ta - job.start_ns) / 1e9, rate), ((tb - job.start_ns) / 1e9, rate)]
        last = rates[-1][1] if proc.state == "running" and proc.stall is None else 0.0
        rates += [(rates[-1][0], last), (lane["end"] / 1000, last)]
        series.append((lane["label"], proc.journal.steps, rates))
    if not series:
        return ""
    width, height, left, right, top, bottom = 900, 170, 48, 170, 18, 26
    span_s = max(float(data["end"]) / 1000, 1e-3)
    peak = max(rate for _, _, rates in series for _, rate in rates) or 1.0
    peak *= 1.1

    def x(t: float) -> float:
        return left + (width - left - right) * min(max(t, 0.0), span_s) / span_s

    def y(rate: float) -> float:
        return top + (height - top - bottom) * (1 - rate / peak)

    out = [
        f'<svg class="steps" viewBox="0 0 {width} {height}" width="100%" role="img" '
        f'aria-label="optimizer steps per second over time">'
    ]
    for frac in (0.0, 0.5, 1.0):
        value = peak / 1.1 * frac
        out.append(
            f'<line x1="{left}" x2="{width - right}" y1="{y(value):.1f}" y2="{y(value):.1f}" class="grid"/>'
            f'<text x="{left - 4}" y="{y(value) + 4:.1f}" text-anchor="end">{value:.3g}</text>'
        )
    for t in _ticks(span_s):
        label = _h(format_duration(round(t * 1e9))) if t else "0"
        out.append(f'<text x="{x(t):.1f}" y="{height - 8}" text-anchor="middle">{label}</text>')
    out.append(f'<text x="{left}" y="11" class="unit">optimizer steps per second, between beats</text>')
    for i, (label, steps, rates) in enumerate(series):
        colour, dash = _SERIES_STYLES[i % len(_SERIES_STYLES)]
        path = " ".join(f"{x(t):.1f},{y(r):.1f}" for t, r in rates)
        dash_attr = f' stroke-dasharray="{dash}"' if dash else ""
        out.append(f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="2"{dash_attr}/>')
        ly = top + 14 + 18 * i
        out.append(
            f'<line x1="{width - right + 10}" x2="{width - right + 40}" y1="{ly - 4}" y2="{ly - 4}" '
            f'stroke="{colour}" stroke-width="2"{dash_attr}/>'
            f'<text x="{width - right + 46}" y="{ly}" class="series">{html.escape(label)}: {steps} steps</text>'
        )
    out.append("</svg>")
    return "".join(out)


def _ticks(span: float) -> list[float]:
    """Round tick values from 0 to ``span``: steps of 1, 2 or 5 times a power of ten, at most 9."""
    import math

    raw = span / 8 or 1.0
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    return [i * step for i in range(int(span / step) + 1)]


_PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="%CSP%">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="referrer" content="no-referrer">
<link rel="icon" href="data:,">
<title>%TITLE%</title>
<style>%STYLE%</style></head>
<body><header><h1>%HEADING%</h1><p>%META%</p></header>
%BODY%
<script type="application/json" id="lora-otel-data">%DATA%</script>
<script>%SCRIPT%</script>
</body></html>
"""
