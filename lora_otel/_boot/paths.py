"""Where a process's journal and human log go. Shared by the preamble and ``lora-otel run``."""

from __future__ import annotations

import os
import time

TYPE_CHECKING = False
if TYPE_CHECKING:  # never true at runtime: no typing import
    from collections.abc import Mapping, Sequence

JOURNAL_SUFFIX = ".otel.jsonl"


LOG_OPTIONS = ("--log", "--log-file", "--log_file")
"""The argv options read as the program's log file unless ``LORA_OTEL_LOG_ARG`` says otherwise."""
LOG_SUFFIXES = (".log", ".txt", ".out", ".err")
"""A value from argv is taken for a log file only with one of these endings (see README.md, "Your
program's --log"): a value without one is as likely a level, a directory or a run name."""
_LEVELS = frozenset(("debug", "info", "warning", "warn", "error", "critical", "fatal", "notset", "trace"))
_SNIFF = 4096
"""Bytes read from each end of an existing log file to judge its content."""


def log_options(environ: Mapping[str, str]) -> tuple[tuple[str, ...], str]:
    """``(option names, problem)``: the argv options that may name the log (``LORA_OTEL_LOG_ARG``:
    ``none``, or names such as ``--log,--log_file``); problem is one English sentence when the
    value is unusable (the default is used then), else ""."""
    raw = (environ.get("LORA_OTEL_LOG_ARG") or "").strip()
    if not raw:
        return LOG_OPTIONS, ""
    if raw.lower() == "none":
        return (), ""
    names = tuple(n.strip() for n in raw.split(",") if n.strip())
    if names and all(n.startswith("-") and n.strip("-") and "=" not in n and " " not in n for n in names):
        return names, ""
    return LOG_OPTIONS, "LORA_OTEL_LOG_ARG=%r is not 'none' nor option names such as --log,--log_file; using %s" % (
        raw,
        ",".join(LOG_OPTIONS),
    )


def log_arg(argv: Sequence[str], options: Sequence[str] = LOG_OPTIONS) -> tuple[str, str | None]:
    """``(option, value)`` of the first of ``options`` in a program's argv (``--log PATH`` or
    ``--log=PATH``; value None when nothing follows), or ``("", None)``; given more than once, its
    last value, as argparse keeps it (``--log a.log --log b.log``: b.log). Not a decision: see
    :func:`choose_log`."""
    n = len(argv)
    found: tuple[str, str | None] = ("", None)
    i = 1
    while i < n:
        a = argv[i]
        if a == "--":
            break
        name, eq, value = a.partition("=") if a.startswith("--") else (a, "", "")
        if a in options and found[0] in ("", a):
            found = (a, argv[i + 1] if i + 1 < n else None)
            i += 1  # (its value is no option of its own, whatever it looks like)
        elif eq and name in options and found[0] in ("", name):
            found = (name, value)
        i += 1
    return found


def log_path_from_argv(argv: Sequence[str], environ: Mapping[str, str] | None = None) -> str | None:
    """The raw value of the program's log option (``--log PATH``, ``--log=PATH``), or None: what the
    program was given, not whether lora_otel writes there (:func:`choose_log` decides)."""
    return log_arg(argv, log_options(environ or {})[0])[1] or None


def name_problem(value: str | None) -> str:
    """Why an argv value does not look like a log file's path ("" when it does): not empty, not
    another option, not a level, ending in one of `LOG_SUFFIXES`, not under ``/dev`` or ``/proc``,
    in a directory that exists (lora_otel creates none)."""
    if not value:
        return "is given no value (a flag?)"
    if value[0] == "-":
        return "is followed by the option %s, not a path (a flag?)" % value
    if value.lower() in _LEVELS:
        return "is given %s, a log level" % value
    path = os.path.abspath(value)
    if path.startswith(("/dev/", "/proc/")):
        return "names %s, not a regular file" % value
    base = os.path.basename(path)
    if not base.lower().endswith(LOG_SUFFIXES) or base.lower() in LOG_SUFFIXES:
        return "is given %s, which does not end in %s (a directory, a data file, a name?)" % (
            value,
            "/".join(LOG_SUFFIXES),
        )
    d = os.path.dirname(path)
    if not os.path.isdir(d):
        return "is given %s, whose directory %s does not exist (lora_otel creates none)" % (value, d)
    return ""


def content_problem(fd: int) -> str:
    """Why the file open on ``fd`` is not plain text lines lora_otel may append to ("" when it is):
    empty, or text ending in a newline whose first and last 4 KiB hold no NUL or other control
    byte, no JSON line and no CSV rows (the same count, at least one, of ``,`` ``;`` or a tab on
    each line the program wrote). Lines of lora_otel's own (``[lora-otel]...``) are not judged."""
    size = os.fstat(fd).st_size
    if size == 0:
        return ""
    head = os.pread(fd, _SNIFF, 0)
    tail = head if size <= _SNIFF else os.pread(fd, _SNIFF, size - _SNIFF)
    if not tail.endswith(b"\n"):
        return "does not end with a newline"
    for chunk in (head, tail):
        for b in chunk:
            if b < 32 and b not in (9, 10, 12, 13, 27):
                return "holds binary data"
    lines = head.split(b"\n")[:-1] if size <= _SNIFF else head.split(b"\n")[:-1][:20]
    if size > _SNIFF:
        lines += tail.split(b"\n")[1:-1][-20:]
    theirs = [ln.strip() for ln in lines if ln.strip() and not ln.startswith(b"[lora-otel]")]
    for ln in theirs:
        if _json_line(ln):
            return "holds JSON lines"
    if theirs:
        for sep in (b",", b";", b"\t"):
            counts = {_count_separators(ln, sep) for ln in theirs}
            if len(counts) == 1 and 0 not in counts:
                return "holds CSV rows"
    return ""


def _json_line(line: bytes) -> bool:
    if line[:1] == b"{" and line[-1:] == b"}":
        return True
    if line[:1] == b"[" and line[-1:] == b"]":
        from lora_otel._boot.stdlib import module

        json = module("json")  # only for a line that may be a JSON array ("[INFO] done [ok]" is not)

        try:
            json.loads(line)
        except ValueError:
            return False
        return True
    return False


def _count_separators(line: bytes, sep: bytes) -> int:
    """Occurrences of ``sep`` in ``line``, not counting the comma of a time's milliseconds
    (``12:00:00,123``, Python logging's default ``asctime``)."""
    n = line.count(sep)
    if sep == b"," and n:
        i = line.find(b",")
        while i >= 0:
            if line[i - 3 : i - 2] == b":" and line[i - 2 : i].isdigit() and line[i + 1 : i + 4].isdigit():
                n -= 1
            i = line.find(b",", i + 1)
    return n


def file_problem(path: str) -> str:
    """Why the existing ``path`` is not a file lora_otel may append to ("" when it is, or when
    nothing is there): not a regular file, or not plain text lines (:func:`content_problem`)."""
    import stat

    try:
        st = os.stat(path)
    except OSError:
        return ""  # not there yet: it will be a new file
    if not stat.S_ISREG(st.st_mode):
        return "names %s, not a regular file" % path
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return ""  # unreadable: opening it for appending says why
    try:
        why = content_problem(fd)
    except OSError:
        why = ""
    finally:
        os.close(fd)
    return "names %s, which %s" % (path, why) if why else ""


def choose_log(argv: Sequence[str], environ: Mapping[str, str]) -> tuple[str | None, str, str | None, str]:
    """``(path, source, value, problem)``: the file lora_otel copies its lines to and puts the journal
    beside, first match wins (README.md, "Your program's --log"):

    1. ``LORA_OTEL_LOG=PATH`` (source ``"LORA_OTEL_LOG"``): taken as given, unless it is not a
       regular file (``/dev/stderr``, a FIFO);
    2. the first of ``LORA_OTEL_LOG_ARG``'s options (default `LOG_OPTIONS`; ``none``: argv is not
       read) in argv, when its value passes :func:`name_problem` and :func:`file_problem`
       (source: the option, e.g. ``"--log"``).

    value is what the source gave. path is None when there is none; problem then says why the
    source was not taken, as ``"--log is given DEBUG, a log level"`` ("" when nothing names a log).
    Never raises ``OSError``.
    """
    explicit = environ.get("LORA_OTEL_LOG")
    if explicit:
        if not is_log_file(explicit):
            return None, "LORA_OTEL_LOG", explicit, "LORA_OTEL_LOG names %s, not a regular file" % explicit
        return os.path.abspath(explicit), "LORA_OTEL_LOG", explicit, ""
    options, _ = log_options(environ)
    if not options:
        return None, "", None, ""
    option, value = log_arg(argv, options)
    if not option:
        return None, "", None, ""
    why = name_problem(value) or file_problem(value or "")
    if why:
        return None, option, value, "%s %s" % (option, why)
    return value, option, value, ""


def holds_lines(path: str) -> bool:
    """Whether ``path`` is a regular file with something in it (not only lora_otel's own lines)."""
    from lora_otel._boot import files

    try:
        if os.stat(path).st_size == 0:
            return False
        head = files.read_head(path, _SNIFF)  # never waits on a FIFO put there since the stat
    except OSError:
        return False
    return any(ln.strip() and not ln.startswith(b"[lora-otel]") for ln in head.split(b"\n"))


def is_log_file(log: str) -> bool:
    """Whether ``log`` names a regular file (or nothing yet) outside ``/dev`` and ``/proc``."""
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


def others_can_create_in(directory: str) -> bool:
    """Whether a user other than this one (root aside) can create a file in ``directory``: it is
    group- or world-writable (``/tmp``, a shared ``LORA_OTEL_DIR``), or another user's. False when
    it does not exist yet (lora_otel creates it, 0700)."""
    try:
        st = os.stat(directory)
    except OSError:
        return False
    if st.st_mode & 0o022:
        return True
    return hasattr(os, "geteuid") and st.st_uid not in (os.geteuid(), 0)


def unpredictable(path: str) -> str:
    """A journal name lora_otel chose (`journal_name`) with a random part before the pid when
    another user can create files in its directory (`others_can_create_in`):
    ``20261130T221348Z-4242.otel.jsonl`` → ``20261130T221348Z-9f3a61c2-4242.otel.jsonl``. Nobody can
    prepare that name, nor the sibling files named after it (stacks, sidecar log, children), for a
    pid and a second they can guess. The pid stays last: readers look for ``-<pid>.otel.jsonl``."""
    d, name = os.path.split(path)
    head, dash, tail = name.rpartition("-")
    if not dash or not tail.endswith(JOURNAL_SUFFIX) or not others_can_create_in(d or "."):
        return path
    return os.path.join(d, "%s-%s-%s" % (head, os.urandom(4).hex(), tail))


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
    argv: Sequence[str],
    environ: Mapping[str, str],
    pid: int,
    now_s: float,
    cwd: str | None = None,
    log: str | bool | None = True,
) -> str:
    """The journal path for a process, first match wins (see docs/journal.md).

    1. ``LORA_OTEL_JOURNAL``; 2. the program's log file → ``PATH.otel.jsonl``;
    3. ``LORA_OTEL_DIR``/<name> (relative: to ``cwd``); 4. `state_dir`/<name> (with no home
    either: `fallback_dir`/<name>).
    ``log``: the log file already chosen (:func:`choose_log`; None: there is none); by default it is
    chosen here from ``argv`` and ``environ``.
    """
    exact = environ.get("LORA_OTEL_JOURNAL")
    if exact:
        return os.path.abspath(exact)
    if log is True:
        log = choose_log(argv, environ)[0]
    if isinstance(log, str) and log:
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


def pid_namespace() -> int | None:
    """The inode of this process's pid namespace (``/proc/self/ns/pid``), or None without ``/proc``:
    where a journal's ``pid`` means its process (retention judges a journal by its pid only in that
    namespace, on that host: `lora_otel.journal.runs`)."""
    try:
        link = os.readlink("/proc/self/ns/pid")  # "pid:[4026531836]" (~3.5 µs; a stat of it ~7 µs)
        return int(link[link.index("[") + 1 : -1])
    except (OSError, ValueError):
        return None
