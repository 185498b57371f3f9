"""``lora-otel watch``: follow running jobs live, their span trees updating and stalls highlighted.

PATH is a journal, or a directory whose ``*.otel.jsonl`` files (not recursive) are all followed,
new ones picked up as they appear: only this user's regular files (another user's, a symlink or a
FIFO put there in a shared directory is never opened; one line counts them). Every ``--interval``
s each journal's new bytes are read (`JournalTail`) and stalls checked by `stall.detect`
(``--stall-after``/``LORA_OTEL_STALL_AFTER``, ``LORA_OTEL_FROZEN_AFTER``).

- On a terminal the whole view is redrawn (ANSI clear + home): per process a heading (pid, state)
  and inspect's report, open spans counting up, a stalled span red and bold with its stall message
  (``--no-color`` or a non-empty ``NO_COLOR``: no colour, the stalled span still marked).
- Anywhere else (a launcher's log panel, a pipe) no escape codes, one line per change, e.g.
  ``[watch] 4242 started: import torch``, ``... ended: import torch (2.31 s)``, ``... STALLED: stalled:
  import x open for 121 s (alive, limit 120 s)``, ``... process exited: ...``; then the final tree.

In a directory, the journals that share a trace id (a launcher and its ranks or workers) are shown
together as one job, ranks in order, with the process to look at called out (the one stuck, the one
that failed first, or the slowest; see `lora_otel.analysis.job`): a job of several processes gets a
heading with its outcome, one line per process, the call-out, and the tree of that one process only.
In line mode a ranked process is named ``4243 (rank 1)`` and a call-out is one line, e.g.
``[watch] job 4bf92f35: rank 1 (pid 4243) is the one stuck: in import x for 121 s``.

Unattended batches: ``--alert-command CMD`` (run by ``sh -c``) and ``--alert-webhook URL`` (a JSON
POST) fire once per stall (per stalled span of a process, never twice for it), with the stall as a
JSON object (`alert_payload`) on the command's stdin / as the request body; the command also gets
``LORA_OTEL_ALERT_STAGE``, ``LORA_OTEL_ALERT_KIND``, ``LORA_OTEL_ALERT_PID`` and
``LORA_OTEL_ALERT_JOURNAL``. Neither blocks watch: each runs in a thread, the command killed after
`ALERT_COMMAND_TIMEOUT_S`, the request given up after `ALERT_WEBHOOK_TIMEOUT_S`; a failure is one
line on stderr (and under the view on a terminal), and watch goes on. Before watch exits it waits
for the alerts still running. ``--exit-on-stall``: exit with status 4 as soon as a stall is seen,
after its alerts have run.

Watch ends when no followed process is running any more (``--once``: at once). Exit status, job by
job as ``inspect --summary`` judges them (the process that failed or stuck first decides its job's
outcome; the others it took down with it do not): 0 all finished normally (or still running), 1
some failed, 3 some killed, gone without an exit record, or (``--once``) stalled now (wins over 1), 4 a
stall seen with ``--exit-on-stall`` (with ``--once``: a process stalled now), 2 usage, 130 Ctrl-C.

One module past 600 lines on purpose: the follow loop, its two renderings (terminal, log panel)
and the alerts all work on the same `Followed` state, and are one command.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Optional

from lora_otel._boot.seam import JOURNAL_SUFFIX, iso_time, stalled_line
from lora_otel.analysis import job as jobs_mod
from lora_otel.analysis.stall import (
    FROZEN_AFTER_S,
    Stall,
    StallConfigError,
    detect,
    frozen_after_from_env,
    parse_limits,
)
from lora_otel.cli import jobs as jobs_view
from lora_otel.cli.inspect import report_command
from lora_otel.cli.jobs import write as _write
from lora_otel.journal.reader import (
    Journal,
    JournalError,
    JournalTail,
    ProcessState,
    Span,
    format_duration,
    process_state,
)
from lora_otel.journal.tree import View, _display

CLEAR = "\x1b[H\x1b[2J"
RED_BOLD, YELLOW, BOLD, RESET = "\x1b[1;31m", "\x1b[33m", "\x1b[1m", "\x1b[0m"
STARTING_GRACE_S = 10.0
"""A journal with no records yet counts as a process starting up for this long, then as gone."""
STALLED_STATUS = 4
"""Exit status with ``--exit-on-stall`` once a stall is seen."""
ALERT_COMMAND_TIMEOUT_S = 30.0
"""An ``--alert-command`` still running after this long is killed (its whole process group)."""
ALERT_WEBHOOK_TIMEOUT_S = 10.0


_interrupted: list[int] = []
"""SIGINTs received while following: a KeyboardInterrupt that Python swallows (raised in a finalizer
or a callback, where it is only printed as ignored) still ends the loop at its next turn."""


def _on_sigint(signum: int, frame: object) -> None:
    _interrupted.append(signum)
    raise KeyboardInterrupt


def run_watch(args: argparse.Namespace) -> int:
    """Follow ``args.path`` until every process has ended; returns the exit status (module docstring)."""
    previous = None
    try:
        if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGINT) is (
            signal.default_int_handler
        ):
            previous = signal.signal(signal.SIGINT, _on_sigint)
        return _watch(args)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `lora-otel watch DIR | head`: the reader has gone
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)
        del _interrupted[:]


def _watch(args: argparse.Namespace) -> int:
    def usage(message: object) -> int:
        print(f"lora-otel watch: {message}", file=sys.stderr)
        return 2

    if not 0 < args.interval <= 3600:
        return usage(f"--interval must be a number of seconds above 0 and at most 3600, got {args.interval:g}")
    from lora_otel.cli.inspect import newest_run_or_none, resolve_path

    if args.path is None:
        args.path = newest_run_or_none("watch")
        if args.path is None:
            return 2
    resolved = resolve_path(args.path)  # a --log file: its newest run's journal
    if resolved != args.path:
        print(f"lora-otel watch: following {resolved}", file=sys.stderr)
        args.path = resolved
    if not os.path.exists(args.path):
        return usage(f"{args.path}: no such file or directory")
    given = "--stall-after" if args.stall_after is not None else "LORA_OTEL_STALL_AFTER"
    try:
        limits = parse_limits(args.stall_after if args.stall_after is not None else os.environ.get(given))
    except StallConfigError as e:
        return usage(f"{given}: {e}")
    command, webhook = getattr(args, "alert_command", None), getattr(args, "alert_webhook", None)
    if command is not None and not command.strip():
        return usage("--alert-command: empty command")
    if webhook is not None:
        url = urllib.parse.urlsplit(webhook)
        if url.scheme not in ("http", "https") or not url.netloc:
            return usage(f"--alert-webhook: not an http(s) URL: {_display(webhook)}")
    alerter = Alerter(command, webhook)
    exit_on_stall = bool(getattr(args, "exit_on_stall", False))
    try:
        frozen_after_from_env()  # a bad value is a usage error; each journal's recorded limits apply
        watcher = Watcher(args.path, limits if args.stall_after is not None else None, None)
        watcher.poll(time.time_ns())
        for f in watcher.followed.values():  # the file named has lines, but not one record
            if not watcher.is_dir and f.journal and f.journal.last_evidence_ns is None and f.journal.problems:
                raise JournalError(f"{f.tail.path}: not a journal ({f.journal.problems[0]})")
    except (StallConfigError, JournalError) as e:
        return usage(e)
    tty = sys.stdout.isatty()
    color = tty and not args.no_color and not os.environ.get("NO_COLOR")
    while True:
        now, done = time.time_ns(), watcher.finished()
        if args.once:
            _out(watcher.screen(now, color))
            watcher.alert(alerter, now)
            alerter.wait()
            return STALLED_STATUS if exit_on_stall and watcher.stalled() else watcher.exit_status()
        if tty:
            screen = watcher.screen(now, color, header=f"every {args.interval:g} s, Ctrl-C to stop")
            screen += "".join(f"alert: {_display(note)}\n" for note in alerter.notes())
            _out(CLEAR + (screen if done else _fit(screen)))
        else:
            _out("".join(f"[watch] {line}\n" for line in watcher.changes(now)))
        watcher.alert(alerter, now)
        if exit_on_stall and watcher.stalled():
            alerter.wait()
            if not tty:
                _out("[watch] stalled: exiting (--exit-on-stall)\n" + watcher.screen(time.time_ns(), False))
            return STALLED_STATUS
        if done:
            break
        if _interrupted:
            raise KeyboardInterrupt
        time.sleep(args.interval)
        watcher.poll(time.time_ns())
    if not tty:
        _out("[watch] every process has ended\n" + watcher.screen(time.time_ns(), False))
    alerter.wait()
    return watcher.exit_status()


class Alerter:
    """``--alert-command``/``--alert-webhook``: each alert sent in a thread of its own, so that a slow
    command or server never holds watch up; failures are one line on stderr, kept for the view."""

    def __init__(self, command: Optional[str], webhook: Optional[str]) -> None:
        self.command, self.webhook = command, webhook
        self.threads: list[threading.Thread] = []
        self._notes: collections.deque[str] = collections.deque(maxlen=3)
        self._lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        return self.command is not None or self.webhook is not None

    def send(self, payload: dict[str, Any]) -> None:
        """Run the command and/or post to the webhook with ``payload``, in the background."""
        body = (json.dumps(payload, sort_keys=True) + "\n").encode()
        jobs: list[tuple[Callable[..., None], tuple[Any, ...]]] = (
            [(self._run_command, (self.command, payload, body))] if self.command is not None else []
        )
        if self.webhook is not None:
            jobs.append((self._post, (self.webhook, body)))
        for target, target_args in jobs:
            thread = threading.Thread(
                target=self._guarded, args=(target, target_args), daemon=True, name="lora-otel-alert"
            )
            thread.start()
            self.threads.append(thread)

    def wait(self) -> None:
        """Wait for the alerts still running (each ends within its own timeout)."""
        while self.threads:
            self.threads.pop().join(ALERT_COMMAND_TIMEOUT_S + 10)

    def notes(self) -> list[str]:
        with self._lock:
            return list(self._notes)

    def _note(self, text: str) -> None:
        line = " ".join(text.split())
        with self._lock:
            self._notes.append(line)
        try:
            print(f"lora-otel watch: {line}", file=sys.stderr, flush=True)
        except (OSError, ValueError):
            pass

    def _guarded(self, target: Callable[..., None], target_args: tuple[Any, ...]) -> None:
        try:
            target(*target_args)
        except Exception as e:  # noqa: BLE001 - an alert never takes watch down
            self._note(f"alert failed: {type(e).__name__}: {e}")

    def _run_command(self, command: str, payload: dict[str, Any], body: bytes) -> None:
        env = dict(
            os.environ,
            LORA_OTEL_ALERT_STAGE=str(payload.get("stage", "")),
            LORA_OTEL_ALERT_KIND=str(payload.get("kind", "")),
            LORA_OTEL_ALERT_PID="" if payload.get("pid") is None else str(payload["pid"]),
            LORA_OTEL_ALERT_JOURNAL=str(payload.get("journal", "")),
        )
        shown = _short(command)
        try:
            proc = subprocess.Popen(
                ["sh", "-c", command], stdin=subprocess.PIPE, stdout=2, env=env, start_new_session=True
            )
        except OSError as e:
            self._note(f"alert command could not start ({e.strerror or e}): {shown}")
            return
        try:
            proc.communicate(body, timeout=ALERT_COMMAND_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except OSError:
                proc.kill()
            proc.wait()
            self._note(f"alert command killed after {ALERT_COMMAND_TIMEOUT_S:g} s: {shown}")
            return
        if proc.returncode != 0:
            how = f"killed by signal {-proc.returncode}" if proc.returncode < 0 else f"exit status {proc.returncode}"
            self._note(f"alert command failed ({how}): {shown}")

    def _post(self, url: str, body: bytes) -> None:
        request = urllib.request.Request(
            url, data=body, method="POST", headers={"Content-Type": "application/json", "User-Agent": "lora-otel-watch"}
        )
        try:
            with urllib.request.urlopen(request, timeout=ALERT_WEBHOOK_TIMEOUT_S) as response:
                response.read(65536)
        except urllib.error.HTTPError as e:
            self._note(f"alert webhook failed (HTTP {e.code} {e.reason}): {_short(url)}")
        except (urllib.error.URLError, OSError, ValueError) as e:
            reason = getattr(e, "reason", None) or e
            self._note(f"alert webhook failed ({reason}): {_short(url)}")


def alert_payload(f: Followed, stall: Stall, now_ns: int) -> dict[str, Any]:
    """The JSON object an alert carries: where the stall is, what it is, and when it was seen."""
    journal = f.journal
    root = journal.root if journal is not None else None
    attrs = root.attrs if root is not None else {}
    rank = attrs.get("rank")
    payload = {
        "event": "stall",
        "journal": os.path.abspath(f.tail.path),
        "pid": journal.pid if journal is not None else None,
        "trace_id": stall.span.trace_id,
        "span_id": stall.span.span_id,
        "stage": stall.span.name,
        "kind": stall.kind,
        "open_for_s": round(stall.open_for_s, 3),
        "limit_s": stall.limit_s,
        "reason": stall.reason,
        "status_message": stall.status_message,
        "service": attrs.get("service.name") if isinstance(attrs.get("service.name"), str) else None,
        "host": attrs.get("host.name") if isinstance(attrs.get("host.name"), str) else None,
        "time": _iso(now_ns),
        "stage_started": _iso(stall.span.start_ns),
    }
    if isinstance(rank, int) and not isinstance(rank, bool):
        payload["rank"] = rank
    return payload


def _iso(ns: int) -> str:
    """``2024-05-01T12:00:00.123Z`` (UTC, `seam.iso_time`)."""
    return iso_time(ns)


def _short(text: str, limit: int = 120) -> str:
    text = _display(" ".join(text.split()))
    return text if len(text) <= limit else text[: limit - 3] + "..."


@dataclass
class Followed:
    """One followed journal, its state at the last poll, and what the line output has said of it."""

    tail: JournalTail
    first_seen_ns: int
    journal: Optional[Journal] = None
    state: ProcessState = "running"
    starting: bool = True  # no records yet, for at most STARTING_GRACE_S
    stall: Optional[Stall] = None
    verdict: Optional[Any] = None  # the stall and its diagnosis (`lora_otel.analysis.verdict.Verdict`)
    verdict_key: str = ""
    alive_until_ns: Optional[int] = None  # the last poll that found the process there
    ended: Optional[tuple[int, str]] = None  # gone: its parent's reap of it (`View.ended`)
    was_stalled: bool = False  # stalled at the last poll that found it there
    error: Optional[str] = None
    said: set[str] = field(default_factory=set)
    label: Optional[str] = None  # "rank 1", "launcher", ... when its job has several processes

    @property
    def who(self) -> str:
        """The pid, or the file name while the journal does not name one."""
        pid = self.journal.pid if self.journal is not None else None
        return str(pid) if pid is not None else _display(os.path.basename(self.tail.path))

    @property
    def who_line(self) -> str:
        """What a line of line mode starts with: ``4243``, or ``4243 (rank 1)`` in a job of several."""
        return f"{self.who} ({self.label})" if self.label else self.who

    def heading(self) -> str:
        """``pid 4243: running``, or ``rank 1, pid 4243: running`` in a job of several."""
        who = f"{'pid ' if self.who.isdigit() else ''}{self.who}"
        if self.label:
            who = f"{self.label}, {who}"
        return f"{who}: {'starting' if self.starting else self.state}"

    @property
    def running(self) -> bool:
        return self.state == "running" or self.starting

    def once(self, key: str) -> bool:
        """True the first time it is asked about ``key``: so the line output says each thing once."""
        new = key not in self.said
        self.said.add(key)
        return new


class Watcher:
    """The journals under a path, polled together."""

    def __init__(
        self, path: str, limits: Optional[dict[str, float]], frozen_after_s: Optional[float] = FROZEN_AFTER_S
    ) -> None:
        """``limits``/``frozen_after_s`` None: each journal's recorded limits (`stall.journal_limits`)."""
        self.path, self.is_dir, self.limits, self.frozen_after_s = path, os.path.isdir(path), limits, frozen_after_s
        self.followed: dict[str, Followed] = {}
        self.said_waiting = False
        self.ignored: set[str] = set()
        """Names in the directory that are not this user's regular files (another user's, a
        symlink, a FIFO): never opened, counted in one line (`ignored_line`)."""
        self.said_ignored = 0

    def poll(self, now_ns: int) -> None:
        """Pick up new journals (directory), read what each gained, and check for stalls."""
        if self.is_dir:
            self._list(now_ns)
        elif self.path not in self.followed and os.path.isfile(self.path):
            self.followed[self.path] = Followed(JournalTail(self.path), now_ns)
        for f in self.followed.values():
            self._refresh(f, now_ns)

    def _list(self, now_ns: int) -> None:
        """Follow the new journals of the directory that are this user's regular files. In a
        directory others can write to, anyone can put a file there under a journal's name: an
        empty one (a process "gone" that fails watch), thousands (a line each), a symlink to a file
        of this user's (read and shown), a FIFO. Those are left alone (`ignored`), as retention
        leaves them (`lora_otel.journal.runs.runs_in`); ``lora-otel watch FILE`` follows one."""
        me, new = os.geteuid(), []
        try:
            with os.scandir(self.path) as entries:  # one entry at a time: 100,000 junk files listed whole cost MBs
                for entry in entries:
                    name = entry.name
                    if not name.endswith(JOURNAL_SUFFIX) or name in self.ignored:
                        continue
                    path = os.path.join(self.path, name)
                    if path in self.followed:
                        continue
                    try:
                        st = entry.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    if stat.S_ISREG(st.st_mode) and st.st_uid == me:
                        new.append(path)
                    else:
                        self.ignored.add(name)
        except OSError:
            return
        for path in sorted(new):
            self.followed[path] = Followed(JournalTail(path, nofollow=True), now_ns)

    def ignored_line(self) -> Optional[str]:
        """One line for every file left alone (`_list`), or None when there is none."""
        n = len(self.ignored)
        if not n:
            return None
        files = f"{n} file{'s' if n != 1 else ''} named *{JOURNAL_SUFFIX}"
        return f"ignored {files} that {'are' if n != 1 else 'is'} not this user's (another user's, a symlink, a FIFO)"

    def _refresh(self, f: Followed, now_ns: int) -> None:
        try:
            journal = f.tail.read()
            state = process_state(journal)
            if state == "gone":  # it may have written its exit record just after that read
                state = process_state(f.tail.read())
            f.error = None
        except JournalError as e:  # deleted or made unreadable while followed: keep what was read
            f.error = str(e)
            if f.journal is None:
                f.state, f.starting = "gone", False
                return
            journal, state = f.journal, process_state(f.journal)
        if state != "running":
            # a running process's journal stays open (followed through a rename); not thousands of old ones
            f.tail.close()
        f.starting = (
            journal.last_evidence_ns is None and state == "gone" and now_ns - f.first_seen_ns < STARTING_GRACE_S * 1e9
        )
        f.journal, f.state = journal, state
        f.stall = detect(journal, now_ns, state == "running", self.limits, self.frozen_after_s)
        if f.stall is None and state == "running":
            f.stall = jobs_mod.stall_from_record(journal, now_ns)
        if state == "running":
            f.alive_until_ns, f.was_stalled = now_ns, f.stall is not None
        f.verdict = self._verdict(f, journal, state, now_ns)

    def _verdict(self, f: Followed, journal: Journal, state: ProcessState, now_ns: int) -> Optional[Any]:
        """The stall record, or the diagnosis computed once per stall (it samples /proc for a second)."""
        from lora_otel.analysis import verdict as verdict_mod

        found = verdict_mod.from_record(journal, now_ns)
        if found is not None or state != "running" or f.stall is None:
            return found if found is not None else (f.verdict if state != "running" and f.was_stalled else None)
        key = f"{f.stall.span.span_id}:{f.stall.kind}"
        if key != f.verdict_key or f.verdict is None:
            peers = [
                other.journal
                for other in self.followed.values()
                if other is not f and other.journal is not None and other.journal.trace_id == journal.trace_id
            ]
            f.verdict, f.verdict_key = (
                verdict_mod.current(journal, f.stall, now_ns, peers, self.frozen_after_s, "watch"),
                key,
            )
        else:  # the same stall, longer now
            f.verdict.open_s = (
                f.stall.open_for_s if f.stall.kind != "frozen" else (now_ns - (journal.last_life_ns or 0)) / 1e9
            )
        return f.verdict

    def jobs(self, now_ns: int) -> tuple[list[jobs_mod.Job], dict[int, Followed], list[Followed]]:
        """The followed journals grouped into jobs (ordered, called out), which `Followed` each
        process is (by ``id`` of its `Proc`), and the journals without a span yet (by file name)."""
        procs, which, rest = [], {}, []
        for f in self.followed.values():
            if f.journal is None or not f.journal.spans:
                f.label = None
                rest.append(f)
                continue
            proc = jobs_mod.make_proc(
                f.journal, f.state, now_ns, self.limits, self.frozen_after_s, stall=f.stall, stall_known=True
            )
            procs.append(proc)
            which[id(proc)] = f
        jobs = jobs_mod.group_jobs(procs)
        for job in jobs:
            for proc in job.procs:
                f = which[id(proc)]
                f.label = proc.label if len(job.procs) > 1 else None
                f.ended = proc.view.ended
                if proc.end is not None and f.verdict is not None and f.verdict.kind == "died":
                    f.verdict = jobs_mod.reaped_verdict(f.verdict, proc)
        rest.sort(key=lambda f: f.tail.path)
        return jobs, which, rest

    def ordered(self, now_ns: Optional[int] = None) -> list[Followed]:
        """Followed journals job by job (jobs by start time, ranks in order), those without a span last."""
        jobs, which, rest = self.jobs(time.time_ns() if now_ns is None else now_ns)
        return [which[id(proc)] for job in jobs for proc in job.procs] + rest

    def finished(self) -> bool:
        return bool(self.followed) and not any(f.running for f in self.followed.values())

    def stalled(self) -> bool:
        """Some followed process is stalled now."""
        return any(f.stall is not None for f in self.followed.values())

    def alert(self, alerter: Alerter, now_ns: int) -> int:
        """Send an alert for each stall not alerted yet (once per stalled span of a process); how many."""
        sent = 0
        if not alerter.enabled:
            return sent
        for f in self.ordered(now_ns):
            stall = f.stall
            if stall is not None and f.once(f"a:{stall.span.span_id}"):
                alerter.send(alert_payload(f, stall, now_ns))
                sent += 1
        return sent

    def exit_status(self) -> int:
        """Job by job, as ``inspect --summary`` says it (a rank that failed first makes its job
        failed, though its launcher then killed the others); a job still running counts 0;
        journals without a span yet, process by process."""
        jobs, _, rest = self.jobs(time.time_ns())
        return jobs_mod.worst([job.status for job in jobs] + [_status(f) for f in rest])

    def screen(self, now_ns: int, color: bool, header: Optional[str] = None) -> str:
        """Every followed process one after another: heading, report, stall; ends with a newline."""
        lines = [f"lora-otel watch {_display(self.path)}  {time.strftime('%H:%M:%S')}  {header}"] if header else []
        if not self.followed:
            lines.append(f"waiting for journals (*{JOURNAL_SUFFIX}) in {_display(self.path)}")
        if self.ignored:
            lines.append(self.ignored_line() or "")
        jobs, which, rest = self.jobs(now_ns)
        for job in jobs:
            if len(job.procs) == 1:
                self._process(lines, which[id(job.procs[0])], now_ns, color)
                continue
            if lines:
                lines.append("")
            lines.append(_paint(jobs_view.job_heading(job), BOLD, color))
            lines.extend("  " + line for line in jobs_view.process_lines(job))
            shown = self._shown(job)
            if job.callout is not None:
                stuck = job.callout.kind in ("stuck", "failed", "killed")
                lines.append(_paint(_display(job.callout.text), RED_BOLD if stuck else YELLOW, color))
            if shown is not None:
                self._process(lines, which[id(shown)], now_ns, color)
            hidden = len(job.procs) - (shown is not None)
            lines.append(
                f"({jobs_view.others_trees(hidden, shown is not None)}: lora-otel inspect {_display(self.path)} --all)"
            )
        for f in rest:
            self._process(lines, f, now_ns, color)
        if any(job.callout is not None and job.callout.kind == "stuck" for job in jobs) or any(
            f.verdict is not None for f in self.followed.values()
        ):
            lines.append(report_command(self.path))  # a stalled job: the command that writes its picture
        return "\n".join(lines) + "\n"

    @staticmethod
    def _shown(job: jobs_mod.Job) -> Optional[jobs_mod.Proc]:
        """The one process of a job whose tree is shown: the one called out, else the first running rank."""
        if job.callout is not None:
            return job.callout.proc
        running = [proc for proc in job.procs if proc.outcome in ("running", "stalled")]
        return next((proc for proc in running if proc.effective_rank is not None), running[0] if running else None)

    def _process(self, lines: list[str], f: Followed, now_ns: int, color: bool) -> None:
        """A process's heading and report (and read error) appended to ``lines``."""
        if lines:
            lines.append("")
        lines.append(_paint(f.heading(), BOLD, color))
        if f.journal is not None:
            lines.extend(self._report(f, f.journal, now_ns, color))
        if f.error:
            lines.append(f"note: {_display(f.error)}")

    def _report(self, f: Followed, journal: Journal, now_ns: int, color: bool) -> list[str]:
        """inspect's text report, its notes replaced by their count, the stall under it."""
        view = _WatchView(
            journal,
            f.state,
            now_ns,
            verdict=f.verdict,
            stalled=self._stalled(f),
            alive_until_ns=f.alive_until_ns,
            ended=f.ended,
            stall=f.stall,
            color=color,
        )
        lines = view.text_lines()
        if journal.problems:
            lines = [line for line in lines if not line.startswith("note: ")]
            lines.append(f"problems: {len(journal.problems)} (lora-otel inspect lists them)")
        if f.verdict is not None:  # the stall and its diagnosis lead, red and bold; what to do under it, bold
            lines[1] = _paint(lines[1], RED_BOLD, color)
            if f.verdict.advice_line():
                lines[2] = _paint(lines[2], BOLD, color)
        return lines

    @staticmethod
    def _stalled(f: Followed) -> bool:
        return f.stall is not None if f.state == "running" else f.was_stalled

    def changes(self, now_ns: int) -> list[str]:
        """One line per change since the last call, for output that is not a terminal."""
        out: list[str] = []
        if len(self.ignored) != self.said_ignored:  # at most one line a poll, however many files come
            self.said_ignored = len(self.ignored)
            out.append(self.ignored_line() or "")
        if not self.followed and not self.said_waiting:
            self.said_waiting = True
            return [*out, f"waiting for journals (*{JOURNAL_SUFFIX}) in {_display(self.path)}"]
        jobs, which, rest = self.jobs(now_ns)
        for job in jobs:
            for proc in job.procs:
                f = which[id(proc)]
                out.extend(f"{f.who_line} {line}" for line in self._changes(f, now_ns))
            callout = job.callout
            if len(job.procs) > 1 and callout is not None:
                f = which[id(callout.proc)]
                if f.once(f"c:{job.trace_id}:{callout.kind}"):
                    out.append(f"job {job.trace_id[:8]}: {_display(callout.text)}")
        for f in rest:
            out.extend(f"{f.who_line} {line}" for line in self._changes(f, now_ns))
        return out

    def _changes(self, f: Followed, now_ns: int) -> list[str]:
        journal, out = f.journal, []
        if f.once("following"):
            out.append(f"following {_display(f.tail.path)} ({'starting' if f.starting else f.state})")
            if journal is not None:  # what ended before watch started, or before the file was found, is history
                f.said.update(
                    f"{'s' if span.is_open else 'e'}:{span.span_id}"
                    for span in journal.spans
                    if not span.is_open or not f.running
                )
        if journal is not None:
            timed: list[tuple[int, str]] = []
            for span in journal.spans:
                if span is journal.root:
                    continue
                if span.is_open and f.once(f"s:{span.span_id}"):
                    timed.append((span.start_ns, f"started: {_display(span.name)}"))
                elif not span.is_open and f.once(f"e:{span.span_id}"):
                    timed.append((span.end_ns or span.start_ns, f"ended: {_ended(span)}"))
            out.extend(text for _, text in sorted(timed, key=lambda pair: pair[0]))
            if journal.problems and f.once(f"problems {len(journal.problems)}"):
                out.append(f"journal problems: {len(journal.problems)} (lora-otel inspect lists them)")
        stall = f.stall
        if stall is not None and f.once(f"x:{stall.span.span_id}:{stall.kind}"):
            if f.verdict is not None:
                out.append(_display(f.verdict.line()))
                if f.verdict.advice_line():
                    out.append(_display(f.verdict.advice_line()))
            else:
                from lora_otel.analysis.verdict import what_phrase

                stage = None if stall.span is journal.root else stall.span.name  # type: ignore[union-attr]
                what = what_phrase(stage, stall.kind, stall.open_for_s, stall.limit_s)
                out.append(_display(stalled_line(what, None)))
        if f.error and f.once(f"!{f.error}"):
            out.append(f"note: {_display(f.error)}")
        if not f.running and f.once("end"):
            stuck = (
                View(
                    journal,
                    f.state,
                    now_ns,
                    stalled=self._stalled(f) or None,
                    alive_until_ns=f.alive_until_ns,
                    ended=f.ended,
                ).stuck()
                if journal is not None
                else "journal unreadable"
            )
            out.append(
                f"process exited: {stuck}"
                if f.state == "exited"
                else f"process {stuck}"
                if f.state == "exec'd"
                else f"process gone without an exit record (killed or vanished): {stuck}"
            )
        return out


@dataclass
class _WatchView(View):
    """inspect's `View`, with open spans yellow and the stalled span red, bold and marked."""

    stall: Optional[Stall] = None
    color: bool = False

    def _span_line(self, span: Span) -> str:
        line = super()._span_line(span)
        if self.stall is not None and span is self.stall.span:
            return _paint(f"{line}  <- STALLED", RED_BOLD, self.color)
        return _paint(line, YELLOW, self.color) if span.is_open else line


def _status(f: Followed) -> int:
    """0 finished normally (or still running), 1 failed, 3 killed or vanished."""
    exit_ = f.journal.exit if f.journal is not None else None
    if f.running:
        return 0
    if exit_ is None or exit_["how"] == "signal":
        return 3
    return 1 if exit_["how"] == "exception" or exit_["code"] not in (0, None) else 0


def _ended(span: Span) -> str:
    """``import torch (2.31 s)``, or ``load model (1.5 s, error: OSError: EIO)``."""
    text = f"{_display(span.name)} ({format_duration((span.end_ns or span.start_ns) - span.start_ns)}"
    if span.status == "error":
        text += ", error" + (f": {_display(span.message)}" if span.message else "")
    return text + ")"


def _fit(screen: str) -> str:
    """The screen cut to the terminal's height, so that redrawing it does not scroll: the top lines
    (heading, where it is stuck) and the newest at the bottom (open spans, the stall) are kept."""
    lines, rows = screen.splitlines(), shutil.get_terminal_size().lines
    if len(lines) < rows:
        return screen
    head = min(4, rows // 3)
    tail = max(rows - 2 - head, 0)
    hidden = f"... {len(lines) - head - tail} lines hidden (a taller window shows them)"
    return "\n".join([*lines[:head], hidden, *lines[len(lines) - tail :]]) + "\n"


def _paint(text: str, code: str, color: bool) -> str:
    return f"{code}{text}{RESET}" if color else text


def _out(text: str) -> None:
    if text:
        _write(text)
        sys.stdout.flush()
