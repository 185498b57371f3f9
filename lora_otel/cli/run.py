"""``lora-otel run``: start a command with the preamble active in it, and report on it.

The command inherits stdin, stdout and stderr untouched; SIGINT, SIGTERM and the other signals
that would end the supervisor are forwarded, unless the command got them already from its
process group (`lora_otel.cli.forward`); the command's exit status is passed through (a death by
signal is repeated on the supervisor, so the launcher above sees the same signal). ``--tree``
prints the span tree afterwards, on stderr: the supervisor's stdout carries the command's bytes
and nothing else, so ``lora-otel run -- python dump.py > out.json`` and ``… | jq`` work, and a
terminal or a log panel (they show both streams) still shows the tree.

It exports nothing itself: when an OTLP endpoint is configured by the standard ``OTEL_EXPORTER_OTLP_*``
variables, the traced process starts its own detached sidecar (``lora_otel._boot.spawn``), exactly
as in zero-code mode. So the supervisor exits the moment its child does and never holds the
launcher's pipes past that. What only the parent can know, the supervisor adds to the journal as
it exits: an ``exit`` record for a child that died by a signal or left without one.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import time
from typing import TYPE_CHECKING, Any

from lora_otel._boot.seam import paths

if TYPE_CHECKING:
    from collections.abc import Callable
    from types import FrameType


def die_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` that makes the kernel SIGKILL the child when this process dies, even by
    SIGKILL (Linux ``PR_SET_PDEATHSIG``); None elsewhere. libc is loaded here, before the fork, so
    what runs in the child is one foreign call and a ``getppid``: a parent that died between the
    fork and that call (the signal would never come) is caught by the parent pid having changed.

    The signal goes with the thread that forked: call from the main thread of a process that
    stays until the child ends (``lora-otel run``, ``lora-otel doctor``).
    """
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    sigkill = int(signal.SIGKILL)
    parent = os.getpid()

    def set_pdeathsig() -> None:
        prctl(1, sigkill, 0, 0, 0)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # the parent is already gone: die as the signal would have made it
            os.kill(os.getpid(), sigkill)

    return set_pdeathsig


def _child_env(cmd: list[str], args: argparse.Namespace) -> tuple[dict[str, str], str]:
    env = dict(os.environ)
    env["LORA_OTEL"] = "1"
    env.pop("LORA_OTEL_SIDECAR", None)
    if getattr(args, "dir", None):
        env["LORA_OTEL_DIR"] = args.dir
    if env.get("LORA_OTEL_DIR"):  # relative: to this working directory, for every process below
        env["LORA_OTEL_DIR"] = os.path.abspath(env["LORA_OTEL_DIR"])
    if getattr(args, "journal", None):
        env["LORA_OTEL_JOURNAL"] = os.path.abspath(args.journal)
    if getattr(args, "stall_after", None) is not None:
        env["LORA_OTEL_STALL_AFTER"] = args.stall_after
    now = time.time()
    journal = paths.choose_journal_path(cmd, env, os.getpid(), now)
    if not getattr(args, "journal", None):
        if journal == paths.dir_journal_path(env, os.getpid(), now):  # (a shared directory: a random part)
            journal = paths.unpredictable(journal)
        journal = _create_journal(journal)
    # Name the top process's journal here, so we know where to look afterwards; only for our
    # direct child (a shell's Pythons write beside it, see the preamble).
    env["LORA_OTEL_JOURNAL"] = journal
    env["LORA_OTEL_JOURNAL_OWNER"] = str(os.getpid())
    return env, journal


def _create_journal(journal: str) -> str:
    """Create the child's journal here, new (``O_EXCL``, no symlink, 0600), so that this run and no
    other owns it: a unique name beside it when the name is taken (a re-run, or a name someone
    prepared in a shared directory). The child appends to it after checking it is this user's.
    When it cannot be created, the name is passed on and the child falls back as without `run`."""
    from lora_otel._boot.seam import files

    d = os.path.dirname(journal)
    try:
        if d and not os.path.isdir(d):
            os.makedirs(d, mode=0o700, exist_ok=True)
    except OSError:
        return journal
    for attempt in range(9):
        name = journal if attempt == 0 else paths.unique_variant(journal, os.getpid(), time.time())
        try:
            os.close(files.create_new(name))
            return name
        except FileExistsError:
            continue
        except OSError:
            return journal
    return journal


def _drop_if_unused(journal: str) -> None:
    """The journal created for the child stays empty when the child is not a traced Python (a shell
    whose Pythons write beside it): remove it, as if it had never been made."""
    try:
        st = os.lstat(journal)
        if st.st_size == 0 and st.st_uid == os.geteuid() and not os.path.islink(journal):
            os.unlink(journal)
    except OSError:
        pass


FORWARDED = tuple(
    getattr(signal, name)
    for name in (
        "SIGHUP",
        "SIGINT",
        "SIGQUIT",
        "SIGTERM",
        "SIGUSR1",
        "SIGUSR2",
        "SIGALRM",
        "SIGVTALRM",
        "SIGPROF",
        "SIGXCPU",
        "SIGXFSZ",
        "SIGPWR",
        "SIGSTKFLT",
        "SIGPOLL",
    )
    if hasattr(signal, name)
)
"""The signals ``lora-otel run`` passes to its command (all that would otherwise end it)."""


def run_command(args: argparse.Namespace) -> int:
    cmd = list(args.cmd or [])
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        print("lora-otel run: no command given; usage: lora-otel run [options] -- python train.py ...", file=sys.stderr)
        return 2
    if getattr(args, "stall_after", None) is not None:
        from lora_otel.analysis.stall import StallConfigError, parse_limits

        try:
            parse_limits(args.stall_after)
        except StallConfigError as e:
            print("lora-otel run: --stall-after: %s" % e, file=sys.stderr)
            return 2
    env, journal = _child_env(cmd, args)
    from lora_otel.analysis.oom import OomWatch

    oom = OomWatch()
    oom.see(os.getpid())  # the child starts in the supervisor's memory cgroup
    from lora_otel.cli import forward as fw

    # Every signal whose default would end the supervisor and that a launcher, a scheduler or a
    # user sends to stop, checkpoint or wake a job (Slurm's --signal=USR1@90, Lightning's SIGUSR1
    # requeue, SIGQUIT, alarms) goes to the command instead: the supervisor dying of it would have
    # the kernel kill the command with it (its parent-death signal). A signal sent to the whole
    # group (Ctrl-C, GNU timeout, kill -- -PGID) reached the command already and is not sent again
    # (`lora_otel.cli.forward`); one sent to the supervisor alone is forwarded.
    try:
        if fw.can_witness():
            old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, [*FORWARDED, signal.SIGCHLD])
            witness = fw.Witness(FORWARDED)
            rc = _run_witnessed(cmd, env, witness if witness.start() else None, old_mask)
        else:
            rc = _run_with_handlers(cmd, env)
    except _StartError as e:
        return e.code
    _drop_if_unused(journal)
    killer = oom.struck() if rc == -signal.SIGKILL else None
    if record_exit(journal, rc, killer) and rc < 0:
        # The command died by a signal it did not handle, so its own last line never came: the
        # launcher's log ends with this one, not with a line from before the kill.
        with contextlib.suppress(OSError, ValueError):
            print(
                "lora-otel run: the command was %s%s (exit status %d)"
                % (describe_status(rc), " by %s" % killer if killer else "", 128 - rc),
                file=sys.stderr,
                flush=True,
            )
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


class _StartError(Exception):
    """The command could not be started (the line is printed); ``code`` is the exit status to give."""

    def __init__(self, code: int) -> None:
        self.code = code


def _start(cmd: list[str], env: dict[str, str], preexec: Callable[[], None] | None) -> subprocess.Popen[bytes]:
    try:
        # The job never outlives its wrapper: when a launcher SIGKILLs `lora-otel run`, the kernel
        # SIGKILLs the command too, as the launcher's SIGKILL would have without the wrapper.
        return subprocess.Popen(cmd, env=env, preexec_fn=preexec)
    except OSError as e:
        print("lora-otel run: cannot start %s: %s" % (cmd[0], e.strerror or e), file=sys.stderr)
        raise _StartError(127 if isinstance(e, FileNotFoundError) else 126) from None


def _run_witnessed(cmd: list[str], env: dict[str, str], witness: Any, old_mask: Any) -> int:
    """The command run with this thread's signals blocked and taken one by one (`forward.supervise`);
    the command itself starts with the mask this process had."""
    from lora_otel.cli import forward as fw

    pdeathsig = die_with_parent()

    def preexec() -> None:
        signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
        if pdeathsig is not None:
            pdeathsig()

    try:
        return fw.supervise(_start(cmd, env, preexec), witness, FORWARDED)
    finally:
        if witness is not None:
            witness.stop()
        fw.drain(FORWARDED)
        signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)


def _run_with_handlers(cmd: list[str], env: dict[str, str]) -> int:
    """Where signals cannot be taken one by one: each forwarded signal is passed on."""
    child = _start(cmd, env, die_with_parent())

    def forward(signum: int, _frame: FrameType | None) -> None:
        try:
            child.send_signal(signum)
        except OSError:
            pass

    old = {sig: signal.signal(sig, forward) for sig in FORWARDED}
    try:
        return child.wait()
    finally:
        for sig, h in old.items():
            signal.signal(sig, h)


def _print_tree(journal: str) -> None:
    if not os.path.exists(journal):
        print(
            "lora-otel run: no journal was written at %s; is lora_otel installed in the Python that "
            "ran the command?" % journal,
            file=sys.stderr,
        )
        return
    from lora_otel.cli.inspect import render_text
    from lora_otel.journal.reader import read_journal

    try:
        sys.stderr.write(render_text(read_journal(journal)))
        sys.stderr.flush()
    except (OSError, ValueError, AttributeError):
        pass  # a closed stderr: the journal is there for `lora-otel inspect`


def describe_status(rc: int) -> str:
    """``0`` → "exit code 0"; ``-9`` → "killed by SIGKILL"."""
    if rc < 0:
        try:
            return "killed by %s" % signal.Signals(-rc).name
        except ValueError:
            return "killed by signal %d" % -rc
    return "exit code %d" % rc


def record_exit(
    journal: str | None, rc: int, killer: str | None = None, by: str = "lora-otel run", hint: str = " (os._exit?)"
) -> bool:
    """Append the ``exit`` record the child could not write (killed by a signal, or ``os._exit``),
    or one that corrects the child's own when the status it exited with is not the one it recorded
    (``raise SystemExit(n)`` before Python 3.12 leaves no trace an exit handler can read).

    One ``O_APPEND`` write after the child is gone, so it cannot interleave with the child's own
    records. Nothing is written when the journal already ends with an exit record that agrees
    with ``rc``, or does not exist. Returns True when a record was written. ``killer`` is added to
    a death by signal ("killed by SIGKILL by <killer>"), ``by`` names the writer, ``hint`` follows
    the no-exit-handlers message.
    """
    if not journal:
        return False
    from lora_otel._boot.seam import files

    try:
        fd = files.open_existing(journal, os.O_RDWR | os.O_APPEND | os.O_CLOEXEC)  # never a FIFO, only ours
    except OSError:
        return False
    try:
        size = os.fstat(fd).st_size
        os.lseek(fd, max(size - 65536, 0), os.SEEK_SET)
        tail = os.read(fd, 65536)
        rec = {"v": 1, "k": "exit", "ts": time.time_ns(), "by": by}
        if b'"k":"exit"' in tail:
            recorded = _last_exit_code(tail)  # (None: the process could not tell its code)
            if rc < 0 or (recorded is not None and recorded % 256 == rc):
                return False
            rec.update(code=rc, how="normal", corrects=recorded)
            if rc:
                told = "recorded %d" % recorded if recorded is not None else "could not tell it"
                rec["message"] = "exit code %d (the process %s)" % (rc, told)
        elif rc < 0:
            rec.update(code=128 - rc, how="signal", message=describe_status(rc) + (" by %s" % killer if killer else ""))
        else:
            rec.update(
                code=rc, how="no exit record", message="exit code %d without running exit handlers%s" % (rc, hint)
            )
        import json

        os.write(fd, (json.dumps(rec, separators=(",", ":")) + "\n").encode())
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def _last_exit_code(tail: bytes) -> int | None:
    """The code of the last exit record in the journal's tail, or None."""
    import json

    for line in reversed(tail.splitlines()):
        if b'"k":"exit"' in line:
            try:
                code = json.loads(line).get("code")
            except ValueError:
                return None
            return code if isinstance(code, int) and not isinstance(code, bool) else None
    return None
