"""Where a process's journal and human log go. Shared by the preamble and ``lora-otel run``."""

from __future__ import annotations

import os
import time

TYPE_CHECKING = False
if TYPE_CHECKING:  # never true at runtime: no typing import
    from collections.abc import Mapping, Sequence

JOURNAL_SUFFIX = ".otel.jsonl"


def log_path_from_argv(argv: Sequence[str]) -> str | None:
    """The value of ``--log PATH`` or ``--log=PATH`` in a program's argv, or None."""
    n = len(argv)
    for i in range(1, n):
        a = argv[i]
        if a == "--":
            break
        if a == "--log" and i + 1 < n:
            return argv[i + 1] or None
        if a.startswith("--log="):
            return a[6:] or None
    return None


def is_log_file(log: str) -> bool:
    """Whether ``--log`` names a regular file (or nothing yet) outside ``/dev`` and ``/proc``: the
    only kind lora_otel copies lines to and puts a journal beside."""
    import stat

    path = os.path.abspath(log)
    if path.startswith(("/dev/", "/proc/")):
        return False
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        return True  # not there yet: it will be a file


def journal_name(pid: int, now_s: float) -> str:
    """``<UTC time>-<pid>.otel.jsonl``, e.g. ``20261130T221348Z-4242.otel.jsonl``."""
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now_s)) + "-%d%s" % (pid, JOURNAL_SUFFIX)


def state_dir(environ: Mapping[str, str]) -> str:
    """The per-user directory journals go to when nobody chose a place: ``$XDG_STATE_HOME/lora-otel``
    (an absolute ``XDG_STATE_HOME`` only, as the XDG spec says), else ``~/.local/state/lora-otel``
    (``$HOME``, else the password database); "" when there is no home to use."""
    base, parts, _ = state_dir_parts(environ)
    return os.path.join(base, *parts) if base else ""


def state_dir_parts(environ: Mapping[str, str]) -> tuple[str, tuple[str, ...], bool]:
    """``(base, parts, make_base)`` of `state_dir`: the directory someone chose (``$XDG_STATE_HOME``,
    created 0700 when missing as the XDG spec says, or the home, never created) and the components
    below it that lora_otel creates (0700) and uses only while they are this user's."""
    xdg = environ.get("XDG_STATE_HOME", "")
    if xdg and os.path.isabs(xdg):
        return os.path.normpath(xdg), ("lora-otel",), True
    home = environ.get("HOME") or ""
    if not home:
        try:
            home = os.path.expanduser("~")  # the password database (no $HOME: cron, some containers)
        except Exception:  # noqa: BLE001 - no passwd entry
            home = ""
    if not home or not os.path.isabs(home):
        return "", (), False
    return os.path.normpath(home), (".local", "state", "lora-otel"), False


def dir_journal_path(environ: Mapping[str, str], pid: int, now_s: float, cwd: str | None = None) -> str:
    """``LORA_OTEL_DIR``/<name>, else `state_dir`/<name>, else `fallback_dir`/<name>: a journal named
    by lora_otel (`journal_name`) in a directory of journals, not one a user named."""
    base = environ.get("LORA_OTEL_DIR") or ""
    if base and not os.path.isabs(base):
        try:
            base = os.path.join(cwd or os.getcwd(), base)
        except OSError:  # the working directory is gone: nothing to be relative to
            base = ""
    base = base or state_dir(environ) or fallback_dir(environ)
    return os.path.join(os.path.normpath(base), journal_name(pid, now_s))


def choose_journal_path(
    argv: Sequence[str], environ: Mapping[str, str], pid: int, now_s: float, cwd: str | None = None
) -> str:
    """The journal path for a process, first match wins (see docs/journal.md).

    1. ``LORA_OTEL_JOURNAL``; 2. ``--log PATH`` in argv → ``PATH.otel.jsonl``;
    3. ``LORA_OTEL_DIR``/<name> (relative: to ``cwd``); 4. `state_dir`/<name>.
    A ``--log`` that is not a regular file (``/dev/stdout``, a FIFO, a device) gets no journal
    beside it: 3 or 4 apply. With no home either: `fallback_dir`/<name>.
    """
    exact = environ.get("LORA_OTEL_JOURNAL")
    if exact:
        return os.path.abspath(exact)
    log = log_path_from_argv(argv)
    if log and is_log_file(log):
        return os.path.abspath(log) + JOURNAL_SUFFIX
    return dir_journal_path(environ, pid, now_s, cwd)


def fallback_dir(environ: Mapping[str, str]) -> str:
    """``$TMPDIR/lora-otel-<uid>``: where a journal goes when its directory cannot be used."""
    return os.path.join(
        environ.get("TMPDIR") or "/tmp", "lora-otel-%d" % os.getuid() if hasattr(os, "getuid") else "lora-otel"
    )


def stem(journal_path: str) -> str:
    """``run.log.otel.jsonl`` → ``run.log``: the name a journal's sibling files are made from
    (``.stacks.txt``, ``.sidecar.log``, ``.children``, forked children's journals)."""
    return journal_path[: -len(JOURNAL_SUFFIX)] if journal_path.endswith(JOURNAL_SUFFIX) else journal_path


def child_journal_path(parent_path: str, pid: int) -> str:
    """A forked child's journal: the parent's with ``.<pid>`` before the suffix."""
    if parent_path.endswith(JOURNAL_SUFFIX):
        return parent_path[: -len(JOURNAL_SUFFIX)] + ".%d%s" % (pid, JOURNAL_SUFFIX)
    return parent_path + ".%d" % pid


def unique_variant(path: str, pid: int, now_s: float) -> str:
    """``run.log.otel.jsonl`` → ``run.log.<UTC time>-<pid>-<random>.otel.jsonl``: for when the first is taken.

    Several processes can share one ``--log`` (ranks of one job, or a re-run of the same job);
    each still gets a journal of its own. The random part makes the name one nobody can prepare
    in advance (a shared directory).
    """
    return "%s.%s-%s%s" % (
        stem(path),
        journal_name(pid, now_s)[: -len(JOURNAL_SUFFIX)],
        os.urandom(3).hex(),
        JOURNAL_SUFFIX,
    )
