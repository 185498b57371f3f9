"""``lora-otel run``: start a command with the preamble active in it, and report on it.

The command inherits stdin, stdout and stderr untouched; SIGINT and SIGTERM sent to the supervisor
are forwarded; the command's exit status is passed through (a death by signal is repeated on the
supervisor, so the launcher above sees the same signal). When an OTLP endpoint is configured by the
standard ``OTEL_EXPORTER_OTLP_*`` variables it follows the top process's journal and exports it live
(stalls included, see :mod:`lora_otel.export.live`); ``--tree`` prints the span tree afterwards.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time

from lora_otel._boot import paths


def _child_env(cmd: list, args: argparse.Namespace) -> tuple:
    env = dict(os.environ)
    env["LORA_OTEL"] = "1"
    env.pop("LORA_OTEL_SIDECAR", None)
    if getattr(args, "dir", None):
        env["LORA_OTEL_DIR"] = os.path.abspath(args.dir)
    if getattr(args, "journal", None):
        env["LORA_OTEL_JOURNAL"] = os.path.abspath(args.journal)
    journal = paths.choose_journal_path(cmd, env, os.getpid(), time.time())
    if os.path.exists(journal) and not getattr(args, "journal", None):
        journal = paths.unique_variant(journal, os.getpid(), time.time())  # a re-run: keep the old one
    # Name the top process's journal here, so we know where to look afterwards.
    env["LORA_OTEL_JOURNAL"] = journal
    return env, journal


def run_command(args: argparse.Namespace) -> int:
    cmd = list(args.cmd or [])
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        print("lora-otel run: no command given; usage: lora-otel run [options] -- python train.py ...",
              file=sys.stderr)
        return 2
    env, journal = _child_env(cmd, args)
    try:
        child = subprocess.Popen(cmd, env=env)
    except OSError as e:
        print("lora-otel run: cannot start %s: %s" % (cmd[0], e.strerror or e), file=sys.stderr)
        return 127 if isinstance(e, FileNotFoundError) else 126

    def forward(signum, _frame):
        try:
            child.send_signal(signum)
        except OSError:
            pass

    live = _start_live_export(journal)
    old = {}
    for sig in (signal.SIGTERM, signal.SIGHUP):
        old[sig] = signal.signal(sig, forward)
    # The terminal sends Ctrl-C to the whole foreground group, the child included; a SIGINT sent
    # to the supervisor alone is forwarded.
    old[signal.SIGINT] = signal.signal(signal.SIGINT, forward)
    try:
        rc = child.wait()
    finally:
        for sig, h in old.items():
            signal.signal(sig, h)

    if live is not None:
        live.finish(rc)
    if getattr(args, "tree", False):
        _print_tree(journal)
    if rc < 0:
        sig = -rc
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            signal.signal(sig, signal.SIG_DFL)
        except (OSError, ValueError):
            pass  # SIGKILL and SIGSTOP cannot be handled, so they already act by default
        os.kill(os.getpid(), sig)
        return 128 + sig
    return rc


def _print_tree(journal: str) -> None:
    if not os.path.exists(journal):
        print("lora-otel run: no journal was written at %s; is lora_otel installed in the Python that "
              "ran the command?" % journal, file=sys.stderr)
        return
    from lora_otel.export.inspect import render_text
    from lora_otel.export.reader import read_journal

    sys.stdout.write(render_text(read_journal(journal)))
    sys.stdout.flush()


def describe_status(rc: int) -> str:
    """``0`` → "exit code 0"; ``-9`` → "killed by SIGKILL"."""
    if rc < 0:
        try:
            return "killed by %s" % signal.Signals(-rc).name
        except ValueError:
            return "killed by signal %d" % -rc
    return "exit code %d" % rc


class _LiveExport:
    """Follows the top process's journal in a thread and exports it live (stalls included)."""

    POLL_S = 0.5
    FINISH_TIMEOUT_S = 3.0

    def __init__(self, journal: str) -> None:
        import threading

        self.journal = journal
        self.done = threading.Event()
        self.rc: int | None = None
        self.thread = threading.Thread(target=self._run, name="lora-otel-live", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        from lora_otel.export.live import Follower
        from lora_otel.export.otlp import make_exporter

        try:
            exporter = make_exporter()
        except Exception as e:  # noqa: BLE001 - bad settings: say so once, the job goes on
            print("lora-otel run: live export off: %s" % e, file=sys.stderr)
            return
        follower = None
        while not self.done.wait(self.POLL_S):
            if follower is None and os.path.exists(self.journal):
                follower = Follower(self.journal, exporter)
            if follower is not None:
                try:
                    follower.poll()
                except Exception as e:  # noqa: BLE001 - keep following; the journal remains for replay
                    print("lora-otel run: live export: %s: %s" % (type(e).__name__, e), file=sys.stderr)
        if follower is None and os.path.exists(self.journal):
            follower = Follower(self.journal, exporter)
        if follower is not None and self.rc is not None:
            try:
                follower.finalize(describe_status(self.rc))
            except Exception as e:  # noqa: BLE001
                print("lora-otel run: final export: %s: %s" % (type(e).__name__, e), file=sys.stderr)
        exporter.shutdown()

    def finish(self, rc: int) -> None:
        self.rc = rc
        self.done.set()
        self.thread.join(self.FINISH_TIMEOUT_S)


def _start_live_export(journal: str) -> "_LiveExport | None":
    """Live export when an OTLP endpoint is configured by the standard variables; else journal only."""
    if not (os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")):
        return None
    if os.environ.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower() == "none":
        return None
    return _LiveExport(journal)
