"""The sidecar: a detached process that follows one traced process's journal and exports it live.

    python -m lora_otel.export.sidecar --journal PATH --pid PID

The traced process starts it (see ``lora_otel._boot.spawn``) for every job (``LORA_OTEL_LIVE=0``
turns it off). It runs in its own session with ``/dev/null`` for stdin and stdout and its own log
file (``<journal stem>.sidecar.log``) for stderr, so it never holds the launcher's pipes.

Without an OTLP endpoint it runs in *local mode* (`follow_local`): the watchdog of
`lora_otel.export.watchdog` for each journal of the job — stall records in the journals, the
STALLED and death lines the job cannot write itself — and it never imports the OpenTelemetry SDK.
It exits as soon as every process of the job is gone.

With an endpoint it is the only process that imports the OpenTelemetry SDK. It polls the journal
(`lora_otel.export.live.Follower`: spans as they end, stalls as incomplete spans with evidence,
human lines and stalls as log records), and once the watched process is gone it finalises the
spans still open with how the process ended, sends what is queued (for up to
``LORA_OTEL_DRAIN_S``, default 30 s, while the backend is unreachable) and exits.

At its start it applies the retention rule to the journal's directory (`retain`,
`lora_otel.journal.runs.prune`): the job is starting, so the short processes that never start a
sidecar pay nothing for it.

It can run from another virtual environment than the training process: set
``LORA_OTEL_SIDECAR_PYTHON`` to a Python that has ``lora_otel`` with its dependencies installed.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import TYPE_CHECKING, Callable, Optional

from lora_otel.export.watchdog import owned_file_reason
from lora_otel.journal.reader import JournalError, exec_phrase, process_state

if TYPE_CHECKING:
    from lora_otel.export.live import Follower
    from lora_otel.export.watchdog import StderrHint
    from lora_otel.journal.reader import Journal

POLL_S = 0.5
DRAIN_S = 30.0
EXIT_GRACE_S = 0.3  # `lora-otel run` appends the exit record of a child killed by a signal right after reaping it


def other_journals(followers: dict[str, Follower], path: str) -> list[Journal]:
    """The journals of the job's other processes (``followers``: path -> `Follower`, all but
    ``path``'s), read up to now: the peers of a stall in a collective."""
    out = []
    for other, f in list(followers.items()):
        if other == path:
            continue
        try:
            out.append(f.tail.read())
        except JournalError:
            if f.journal is not None:
                out.append(f.journal)
    return out


def _say(msg: str) -> None:
    """One line in the sidecar's log, redacted: an endpoint URL with credentials or an API key in
    its query, quoted by an exporter error, and every value the traced process redacted."""
    from lora_otel._boot.seam import iso_time, redact_text

    msg = redact_text(" ".join(msg.splitlines()))  # one line per message, whatever the journal's exit message holds
    sys.stderr.write("[lora-otel sidecar][%d][%s] %s\n" % (os.getpid(), iso_time(time.time_ns()), msg))
    sys.stderr.flush()


def _tell_job(journal_path: str, stderr_hint: Optional[StderrHint], msg: str) -> None:
    """``msg`` in the sidecar's log and as one of the job's lines (its stderr, its ``--log``)."""
    _say(msg)
    from lora_otel.export.watchdog import JobLines
    from lora_otel.journal.reader import read_journal

    try:
        JobLines(stderr_hint).say(read_journal(journal_path), msg, alive=True)
    except Exception as e:  # noqa: BLE001 - the line in the sidecar's log stands
        _say("could not tell the job: %s: %s" % (type(e).__name__, e))


def _float_env(name: str, default: float) -> float:
    try:
        return float(os.environ.get(name, default))
    except ValueError:
        return default


def describe_end(journal: Journal, oom: Optional[str] = None, state: Optional[str] = None) -> str:
    """How the process ended, from its exit record; that it exec'd another program (its exec
    record, or ``state`` "exec'd"); or that it vanished without either.

    ``oom``: the OOM killer's trace in the process's memory cgroup, when it rose meanwhile.
    """
    exit_ = journal.exit
    if exit_ is None and (journal.exec is not None or state == "exec'd"):
        return exec_phrase(journal)
    if exit_ is None:
        if oom:
            return "killed by %s: SIGKILL, exit status 137" % oom
        return "vanished without an exit record: killed by a signal (SIGKILL, SIGTERM, ...) or os._exit"
    if exit_.get("message"):
        message: str = exit_["message"]
        return message
    code = exit_.get("code")
    return "exit code %s" % code if code is not None else "exited"


class _Registry:
    """The journals the job's other processes registered (``<stem>.children``, one path per line).

    Read only while it is a regular file of the job's user, not a symlink; a path it names is
    returned only when that journal is one too (:func:`owned_file_reason`). Anything else is
    ignored, with one line in the sidecar's log.
    """

    def __init__(self, path: Optional[str]) -> None:
        self.path = path
        self.offset = 0
        self.pending = b""
        self.refused: set[str] = set()

    def _refuse(self, what: str, why: str) -> None:
        if why not in self.refused:
            self.refused.add(why)
            _say("ignoring %s: %s" % (what, why))

    def new_paths(self) -> list[str]:
        if not self.path:
            return []
        why = owned_file_reason(self.path)
        if why:
            if not why.endswith("No such file or directory"):
                self._refuse("the children registry", why)
            return []
        from lora_otel._boot.seam import files

        try:
            fd = files.open_regular(self.path, os.O_RDONLY | os.O_NOFOLLOW)  # (a FIFO put there since)
            with open(fd, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except OSError:
            return []
        self.offset += len(data)
        lines = (self.pending + data).split(b"\n")
        self.pending = lines.pop()
        out = []
        for line in lines:
            if not line.strip():
                continue
            path = os.fsdecode(line)
            if os.path.isabs(path) and not os.path.lexists(path):
                continue  # a short run of a child, which removed its journal at its exit
            why = owned_file_reason(path) if os.path.isabs(path) else "%r is not an absolute path" % path
            if why:
                self._refuse("a journal named in %s" % self.path, why)
                continue
            out.append(path)
        return out


def _unreadable(path: str, journal_path: str, e: JournalError) -> str:
    """How a followed journal that cannot be read ended: a child's that is gone was a short run,
    removed at its exit before it was first read (said in no line); anything else is said once."""
    if path != journal_path and not os.path.lexists(path):
        return "removed at its exit (a short run)"
    _say("cannot read %s: %s" % (path, e))
    return "unreadable journal"


def retain(journal_path: str) -> None:
    """The retention rule for the journal's directory (`lora_otel.journal.runs.prune`, limits from
    ``LORA_OTEL_KEEP``, ``LORA_OTEL_KEEP_MB``); what it removed is said in one line. Never raises."""
    from lora_otel.journal import runs

    try:
        keep, keep_bytes, problems = runs.limits()
        for problem in problems:
            _say(problem)
        directory = os.path.dirname(os.path.abspath(journal_path))
        removed = runs.prune(directory, keep, keep_bytes)
    except Exception as e:  # noqa: BLE001 - retention is housekeeping: the job is followed regardless
        _say("retention skipped: %s: %s" % (type(e).__name__, e))
        return
    if removed:
        _say(
            "retention: removed the %d oldest finished run(s) from %s (%.1f MB, %d files); keeping %s runs "
            "and %s MB (LORA_OTEL_KEEP, LORA_OTEL_KEEP_MB)"
            % (
                len(removed),
                directory,
                sum(r.size for r in removed) / 1e6,
                sum(len(r.files) for r in removed),
                keep or "any number of",
                keep_bytes // 1_000_000 or "any number of",
            )
        )


def _image_lives(pid: int, start_ticks: Optional[int]) -> bool:
    """Whether ``pid`` still runs (not a zombie) and is the process that exec'd (its start time)."""
    try:
        with open("/proc/%d/stat" % pid, "rb") as f:
            fields = f.read().rpartition(b")")[2].split()
    except OSError:
        return False
    if not fields or fields[0] in (b"Z", b"X"):
        return False
    return start_ticks is None or len(fields) < 20 or int(fields[19]) == start_ticks


def follow_local(
    journal_path: str,
    pid: Optional[int],
    poll_s: float = POLL_S,
    cgroup: Optional[str] = None,
    oom_kills: Optional[int] = None,
    children: Optional[str] = None,
    stderr_hint: Optional[StderrHint] = None,
) -> int:
    """Local mode: watch the job until every process of it is gone (no OpenTelemetry imported).

    Each journal gets a `watchdog.Watch`: stalls under the recorded (and learned) limits, a
    ``stall`` record in the journal, the STALLED line where the job cannot write it; a process that
    vanished without an exit record gets a ``died`` record and its death line. Returns 0."""
    from lora_otel.analysis.oom import OomWatch
    from lora_otel.export.watchdog import JobLines, Watch

    _say(
        "following %s (pid %s) in local mode: stalls go into the journal and the job's lines; no OTLP endpoint"
        % (journal_path, pid)
    )
    oom = OomWatch(cgroup, oom_kills)
    if pid is not None:
        oom.see(pid)
    registry = _Registry(children)

    def peers_of(path: str) -> Callable[[], list[Journal]]:
        return lambda: [w.journal for p, w in list(watches.items()) if p != path and w.journal is not None]

    def watch(path: str, hint: Optional[StderrHint] = None) -> Watch:
        return Watch(path, lines=JobLines(hint), by="watchdog", peers=peers_of(path), say=_say)

    watches = {journal_path: watch(journal_path, stderr_hint)}
    ended: dict[str, str] = {}
    execd_pids: dict[int, Optional[int]] = {}  # a process that exec'd: its new image may join (register) later
    while True:
        for path in registry.new_paths():
            if path not in watches:
                watches[path] = watch(path)
                _say("following %s too" % path)
        for path, w in watches.items():
            if path in ended:
                continue
            try:
                w.poll()
            except JournalError as e:
                ended[path] = _unreadable(path, journal_path, e)
                w.close()
                continue
            if path == journal_path and pid is not None:
                oom.see(pid)
            journal = w.journal
            state = process_state(journal) if journal is not None else "gone"
            if state != "running":
                if path == journal_path and state != "exec'd":
                    time.sleep(EXIT_GRACE_S)  # `lora-otel run` may be appending the exit record
                final = w.read()
                execd = final.exit is None and (final.exec is not None or state == "exec'd")
                struck = (
                    None
                    if execd or final.exit is not None
                    else (oom.struck() if path == journal_path else w.oom.struck())
                )
                told = None if execd else w.ended(struck or "")
                if execd and final.pid:
                    execd_pids[final.pid] = final.start_ticks
                how = describe_end(final, struck, state)
                ended[path] = how
                w.close()
                _say("%s: process ended (%s)%s" % (path, how, "; told the job's log: %s" % told if told else ""))
        if len(ended) == len(watches) and journal_path in ended:
            for path in registry.new_paths():
                if path not in watches:
                    watches[path] = watch(path)
            if len(ended) == len(watches) and not any(_image_lives(p, t) for p, t in execd_pids.items()):
                # (a process that exec'd lives on as its new image, which registers its journal when it
                # becomes a job: `axolotl train` execs into `accelerate launch`, slow to import torch)
                break
        time.sleep(poll_s)
    stalls = sum(len(w.records) for w in watches.values())
    _say("job ended (%s); %d journal(s); %d stall(s) recorded" % (ended[journal_path], len(watches), stalls))
    return 0


def follow(
    journal_path: str,
    pid: Optional[int],
    poll_s: float = POLL_S,
    drain_s: float = DRAIN_S,
    cgroup: Optional[str] = None,
    oom_kills: Optional[int] = None,
    children: Optional[str] = None,
    stderr_hint: Optional[StderrHint] = None,
) -> int:
    """Follow the job until every process of it is gone, finalise, drain.

    The job is the process that started this sidecar (``journal_path``) and every process that
    registered its journal in ``children`` (forked and spawned workers, ranks, anything below it).
    Without an OTLP endpoint: `follow_local`. Returns 0 when everything was delivered.
    """
    from lora_otel._boot.seam import starts_sidecar as exports

    if not exports(os.environ):
        return follow_local(journal_path, pid, poll_s, cgroup, oom_kills, children, stderr_hint)
    from lora_otel.export import loopback

    why = loopback.stranger(os.environ)
    if why is not None:  # LORA_OTEL_LIVE=1 and no endpoint: the default port, not provably ours
        _tell_job(
            journal_path,
            stderr_hint,
            "live export off: LORA_OTEL_LIVE=1 names no OTLP endpoint and %s; the watchdog runs locally "
            "(set OTEL_EXPORTER_OTLP_ENDPOINT to export anyway)" % why,
        )
        return follow_local(journal_path, pid, poll_s, cgroup, oom_kills, children, stderr_hint)
    import logging

    # The SDK's exporters log every failed attempt; during an outage that is noise here, and the
    # sidecar reports the outage once itself. (Only here: the local watchdog loads no logging.)
    logging.basicConfig(level=logging.WARNING, format="[otel] %(levelname)s %(name)s: %(message)s")
    logging.getLogger("opentelemetry").setLevel(logging.CRITICAL)
    from lora_otel.export.live import Follower, outboxes
    from lora_otel.export.otlp import (
        ExporterConfigError,
        describe_endpoint,
        learn_secrets,
        make_exporter,
        make_log_exporter,
    )
    from lora_otel.export.watchdog import JobLines, Watch

    learn_secrets(pid)  # before anything is said or sent

    try:
        exporter = make_exporter(timeout=5)
    except ExporterConfigError as e:
        _say("live export off: %s; the journal remains for `lora-otel replay %s`" % (e, journal_path))
        return 2
    log_exporter = None
    logs_why = loopback.stranger(os.environ, "LOGS")  # a traces endpoint set, the logs' left to the default
    if logs_why is not None:
        _say("log records off: no OTLP endpoint for them and %s" % logs_why)
    elif os.environ.get("OTEL_LOGS_EXPORTER", "otlp").strip().lower() != "none":
        try:
            log_exporter = make_log_exporter(timeout=5)
        except Exception as e:  # noqa: BLE001 - log records are extra; spans go on
            _say("log records off: %s" % e)
    from lora_otel.analysis.stall import StallConfigError, frozen_after_from_env, parse_limits

    try:
        parse_limits(os.environ.get("LORA_OTEL_STALL_AFTER")), frozen_after_from_env()
    except StallConfigError as e:
        _say("%s; using the default limits" % e)
    limits = frozen_after = None  # each journal's own recorded limits (`stall.journal_limits`)
    _say("following %s (pid %s), exporting to %s" % (journal_path, pid, describe_endpoint(exporter)))
    spans_out, logs_out = outboxes(exporter, log_exporter)
    spans_out.on_change = _say
    if logs_out is not None:
        logs_out.on_change = _say

    def follower(path: str, hint: Optional[StderrHint] = None) -> Follower:
        # The same watchdog as in local mode writes the stall record and the lines the job cannot.
        watch = Watch(path, limits, frozen_after, lines=JobLines(hint), by="sidecar", say=_say)
        return Follower(
            path,
            limits=limits,
            frozen_after_s=frozen_after,
            spans_out=spans_out,
            logs_out=logs_out,
            peers=lambda: other_journals(followers, path),
            watch=watch,
        )

    from lora_otel.analysis.oom import OomWatch

    oom = OomWatch(cgroup, oom_kills)  # to tell a death by the OOM killer from other SIGKILLs
    if pid is not None:
        oom.see(pid)
    registry = _Registry(children)
    followers = {journal_path: follower(journal_path, stderr_hint)}
    ended: dict[str, str] = {}  # path -> how its process ended
    while True:
        for path in registry.new_paths():
            if path not in followers:
                followers[path] = follower(path)
                _say("following %s too" % path)
        for path, f in followers.items():
            if path in ended:
                continue
            try:
                f.poll()
            except JournalError as e:
                ended[path] = _unreadable(path, journal_path, e)
                f.tail.close()
                continue
            if path == journal_path and pid is not None:
                oom.see(pid)
            journal = f.journal
            state = process_state(journal) if journal is not None else "gone"
            if state != "running":
                if path == journal_path and state != "exec'd":
                    time.sleep(EXIT_GRACE_S)  # `lora-otel run` may be appending the exit record
                final = f.tail.read()
                execd = final.exit is None and (final.exec is not None or state == "exec'd")
                struck = None if execd or final.exit is not None else oom.struck()
                how = describe_end(final, struck, state)
                if not execd and f.watch is not None:
                    f.watch.ended(struck or "")
                f.finalize(how, failed=not execd)
                ended[path] = how
                f.tail.close()  # a job of many short-lived processes must not hold a descriptor for each
                if path != journal_path:
                    _say("%s: process ended (%s)" % (path, how))
        if len(ended) == len(followers) and journal_path in ended:
            for path in registry.new_paths():  # a last look: a child may have registered just now
                if path not in followers:
                    followers[path] = follower(path)
            if len(ended) == len(followers):
                break
        time.sleep(poll_s)
    deadline = time.monotonic() + drain_s
    for f in followers.values():
        f.drain(deadline)
        f.close(0)
    delivered = spans_out.close(max(deadline - time.monotonic(), 0.1))
    if logs_out is not None:
        delivered = logs_out.close(max(deadline - time.monotonic(), 0.1)) and delivered
    sent_logs = logs_out.sent if logs_out else 0
    unsent = spans_out.unsent + (logs_out.unsent if logs_out else 0)
    dropped = sum(f.dropped for f in followers.values()) + spans_out.dropped + (logs_out.dropped if logs_out else 0)
    refused = spans_out.rejected + (logs_out.rejected if logs_out else 0)
    _say(
        "process ended (%s); %d journal(s); sent %d spans and %d log records; %d dropped by a full queue, "
        "%d refused by the backend, %d unsent"
        % (ended[journal_path], len(followers), spans_out.sent, sent_logs, dropped, refused, unsent)
    )
    if not delivered:
        _say(
            "not everything reached the backend (%s); the journals remain for `lora-otel replay`"
            % (spans_out.last_error or (logs_out.last_error if logs_out else None))
        )
    return 0 if delivered else 1


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m lora_otel.export.sidecar",
        description="Follow a traced process's journal: the local watchdog, and live "
        "export over OTLP when an endpoint is configured.",
        # A fixed width: argparse's own reads the terminal's through `shutil`, which loads `bz2`,
        # `lzma` and `locale` into a process that has no terminal (0.5 MB for the job's lifetime).
        formatter_class=lambda prog: argparse.HelpFormatter(prog, width=100),
    )
    parser.add_argument("--journal", required=True, help="the journal to follow (*.otel.jsonl)")
    parser.add_argument("--pid", type=int, help="the traced process (default: the journal's)")
    parser.add_argument(
        "--poll",
        type=float,
        default=_float_env("LORA_OTEL_POLL_S", POLL_S),
        help="seconds between reads of the journal (default 0.5)",
    )
    parser.add_argument("--children", help="the file where the job's other processes register their journals")
    parser.add_argument("--cgroup", help="the process's memory cgroup when it started")
    parser.add_argument("--oom-kills", type=int, help="that cgroup's oom_kill count when the process started")
    parser.add_argument(
        "--stderr", help="DEV:INO of the process's stderr at start, for a journal that does not record it"
    )
    parser.add_argument("--stderr-path", help="that stderr's path, when it was a regular file")
    args = parser.parse_args(argv)
    hint: Optional[StderrHint] = None
    if args.stderr and args.stderr.count(":") == 1 and all(p.isdigit() for p in args.stderr.split(":")):
        dev, ino = args.stderr.split(":")
        hint = ((int(dev), int(ino)), args.stderr_path or None)
    retain(args.journal)
    try:
        return follow(
            args.journal,
            args.pid,
            args.poll,
            _float_env("LORA_OTEL_DRAIN_S", DRAIN_S),
            args.cgroup,
            args.oom_kills,
            args.children,
            hint,
        )
    except KeyboardInterrupt:
        return 130
    except Exception as e:  # noqa: BLE001 - say it in the log file, once
        _say("stopped by %s: %s; the journal remains for `lora-otel replay %s`" % (type(e).__name__, e, args.journal))
        return 1


if __name__ == "__main__":
    sys.exit(main())
