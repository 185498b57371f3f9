"""The in-process runtime: journal writer, human lines, and span records.

Everything here runs inside the training process, so it imports only what the interpreter has
already loaded (``os``, ``sys``, ``time``, ``_thread``) and never raises into the program: every
failure becomes one English line on stderr (see :func:`fail_open`). A fact is written with one
``os.write`` on an ``O_APPEND`` descriptor *before* the work it describes starts, so a freeze or a
SIGKILL cannot take it back.

Not a general tracing API: spans live in a flat table keyed by span id, with one stack of open
spans per thread to pick parents. That is all a journal needs.

One module on purpose (~700 lines): the writer, the lines and the span records share one process's
state (these module globals) on the hottest paths (`write`, `span_start`), and all of it is loaded
first in every traced process; a split would add a module to load and an attribute hop per record.
"""

from __future__ import annotations

import os
import time
from _thread import RLock, allocate_lock, get_ident
from sys import modules as _modules

from lora_otel._boot import jsonl, words
from lora_otel._boot.jsonl import dumps_line, printable

# --- clocks ----------------------------------------------------------------------------------
# Taken when the preamble starts, before the program can patch them: a test under freezegun
# (which replaces `time.time_ns`, `monotonic`, `perf_counter`… in every loaded module) or under
# `unittest.mock.patch("time.sleep")` is not a frozen process, and its beat must not spin. The
# functions are kept in a tuple, not as module attributes, which freezegun would replace too.
# time-machine patches the C functions themselves: its escape hatch gives the real clocks while
# it travels (`now_ns`; 2.x freezes the monotonic clock too, 3.x leaves it alone). Its originals
# are asked only while it travels: time-machine 2.x (the newest for Python 3.9) kills the process
# with SIGSEGV when `original_time_ns` is called before its first travel, which our span end for
# `import time_machine` did (a user's pytest loads its plugin).
_CLOCKS = (time.time_ns, time.monotonic_ns, time.perf_counter_ns, time.sleep, time.gmtime, time.strftime)


def _travelling() -> Any:
    """time-machine's C module while it travels (its public ``escape_hatch.is_travelling()``), else None."""
    try:
        if _modules["time_machine"].escape_hatch.is_travelling():
            return _modules["_time_machine"]
    except Exception:  # noqa: BLE001 - not loaded yet, or another version: the clocks as they are
        pass
    return None


def now_ns() -> int:
    """The system's wall clock (Unix time, ns), whatever the program did to ``time``."""
    tm = _travelling() if "_time_machine" in _modules else None
    if tm is not None:
        try:
            return int(tm.original_time_ns())
        except (AttributeError, ValueError):  # another version
            pass
    return _CLOCKS[0]()


def monotonic_ns() -> int:
    """``time.monotonic_ns`` as it was at start (time-machine 2.x's original while it travels)."""
    tm = _travelling() if "_time_machine" in _modules else None
    if tm is not None:
        try:
            return int(tm.original_monotonic_ns())
        except (AttributeError, ValueError):  # 3.x: not patched, no original
            pass
    return _CLOCKS[1]()


def perf_ns() -> int:
    """``time.perf_counter_ns`` as it was at start."""
    return _CLOCKS[2]()


def sleep(seconds: float) -> None:
    """``time.sleep`` as it was at start."""
    _CLOCKS[3](seconds)


TYPE_CHECKING = False
if TYPE_CHECKING:  # never true at runtime: no typing import
    from collections.abc import Callable, Mapping
    from types import TracebackType
    from typing import Any

    from lora_otel._boot.where import Frame

FORMAT_VERSION = 1

# --- state (module globals: this is a per-process singleton) -------------------------------
known_secrets: list[str] = []
"""Every value redacted so far in this process: ``redact`` puts its own list here when it first
remembers one (core does not import ``redact``, so the preamble's first evidence does not wait for it)."""
active = False
beat_interval = 1.0
"""Seconds between beats (``LORA_OTEL_BEAT_S``), set by the preamble."""
pid = 0
trace_id = ""
root_id = ""
sampled = True
journal_path = ""
log_path: str | None = None
import_threshold_ms = 5.0

_journal_fd = -1  # moved to a high number; written only while its identity is still this:
_journal_dev = _journal_ino = 0
_log_fd = -1
_log_dev = _log_ino = 0
_log_created = False  # the --log copy: created by lora_otel, its size at open, bytes written since
_log_size0 = _log_written = 0
_log_waits = False
"""The ``--log`` file named by an option held the program's own lines at start: it may be the
program's input as well as its log (``analyze.py --log access.log``), so lora_otel's lines wait
(`_log_waiting`, in memory) until this process holds it open for writing (:func:`program_writes`)."""
_log_may_create = False
"""The waiting ``--log`` file did not exist at start: lora_otel creates it only when its lines are
needed there — a job's warning or error (the narration's first "still in ... after 10 s", a stall, a
failing end) — with what waited; else it waits for the program to open it (a program that rotates
its log at start, or writes data there, finds the file as it would without lora_otel)."""
_log_waiting: list[bytes] = []
_log_waiting_dropped = 0
"""Lines past `_LOG_WAITING_MAX` not kept while the ``--log`` copy waits (said when it is written)."""
_LOG_WAITING_MAX = 256
log_option = ""
"""The argv option (``--log``) the log file was taken from, while the program may still show it is
no path (the argparse hook looks, then calls :func:`drop_log` or clears this); else ""."""
_journal_failed = False
_journal_lost = 0  # records not written since the journal failed
_log_failed = False
quiet = False
"""A process started by a traced process (see ``preamble._is_child``): its info lines go to the
journal and the ``--log`` file only, not to the terminal; error lines still go to stderr."""
JOB_LOG_ENV = "LORA_OTEL_JOB_LOG"
"""The job's ``--log`` file (an absolute path), set by the job's top process for the processes it
starts: a quiet child with no log of its own appends its warnings and errors there (`log_bad_only`)."""
log_bad_only = False
"""Only warn and error lines go to the ``--log`` file: it is the job's (a quiet child's, a forked
worker's), where the job's own narration goes; their start-up and info lines stay in their journals."""
worker = False
"""A `quiet` process that is a worker of its parent — a forked child (a DataLoader or pool worker),
or a ``multiprocessing``/``multiprocess``/loky spawn worker, resource tracker or fork server —
which idles between tasks by design and is never called stalled between stages. A quiet child that
is no worker (``python train.py`` started by a launcher, ``accelerate launch``'s single trainer) is
watched like the job's top process: its quiet time may be a hang (issue 22 item 3)."""
beat_off = ""
"""Why this process has no beat thread ("" when it has one): `preamble.beat_off_reason`."""

# span_id -> (name, parent_id, thread id, start ts ns); only open spans, in start order
open_spans: dict[str, tuple[str, str | None, int, int]] = {}
last_ended: tuple[str, str, int] | None = None
"""``(span_id, name, end ts ns)`` of the stage that ended last — not counting imports shorter than
``import_threshold_ms``, which export drops: the beat's narration says what ended before a quiet time."""
ended_at: dict[str, int] = {}
"""``span_id -> end ts ns`` of the spans that ended last (64 at most): the narration's "X took N s"
line, written at the next beat, gives the span's own end, not the time of the beat."""
_ENDED_KEPT = 64
main_ident = 0
"""The thread id of the main thread (the one that ran the preamble, or that forked this process):
the beat samples where it is."""
# thread id -> list of open span ids (innermost last)
_stacks: dict[int, list[str]] = {}

promoted = ""
"""Why this process counts as a job (a process worth watching), or "" while it does not yet: set
once, by the preamble, when it first lives to a beat, imports something heavy or opens a stage (and
then starts the sidecar). A process that ends before that, normally, leaves nothing behind."""
_promoter: Callable[[str], None] | None = None
"""The preamble's ``promote`` (set at start): what `promote` calls."""
_promotion_waiter: Callable[[], None] | None = None
"""The preamble's ``_await_promotion`` (set at start): what `await_promotion` calls."""
forked_at = 0
"""In a forked child that has not taken over its own state yet: when the fork happened (ns); else
0. The fork hook only sets this and a few flags (`forked`): every page a child writes after the
fork is a copy, so a fork that exits at once should write few. The child's first record, span,
beat or promotion takes over (`settle`): its root span, its journal (deferred until a record),
its environment."""
_settler: Callable[[], None] | None = None
"""The preamble's ``_settle_child`` (set at start): what `settle` calls."""


def forked(new_pid: int, now_ns: int) -> None:
    """In the fork hook: this is process ``new_pid`` now, forked at ``now_ns``, not settled yet
    (`forked_at`); not a job, its lines off the terminal (`quiet`)."""
    global pid, main_ident, forked_at, promoted, quiet, worker, log_bad_only, hold_terminal
    pid, main_ident, forked_at, promoted, quiet, worker = new_pid, get_ident(), now_ns, "", True, True
    log_bad_only, hold_terminal = True, False
    del _terminal_held[:]  # (the parent's, not yet shown: never the child's to show)


hold_terminal = False
"""While set — a process that is no job yet (`promoted` ""), with a beat thread that makes it one
within a beat interval — its info lines for the terminal wait in `_terminal_held` (the journal and
the ``--log`` copy have them at once): a process that ends before that (``python -c 'import x'``,
``pip --version``, a CLI's usage error) prints nothing on stderr, as without lora_otel. Cleared, and
what waited shown, at promotion (`show_held`)."""
_terminal_held: list[str] = []
_TERMINAL_HELD_MAX = 64


def show_held() -> None:
    """Stop holding info lines for the terminal, and show those that waited (at promotion)."""
    global hold_terminal
    hold_terminal = False
    held = _terminal_held[:]
    del _terminal_held[: len(held)]
    if held and not quiet:
        _stderr("".join(held))


def settle() -> None:
    """A forked child takes over its own state now, once (`forked_at`); nothing otherwise."""
    if forked_at and _settler is not None:
        _settler()


def promote(reason: str) -> None:
    """Make this process a job now, unless it is one already (see `promoted`): the triggers below
    the preamble (a heavy import, CUDA initialisation, a stage, training) call this. Cheap when
    there is nothing to do: one truth test."""
    if not promoted and _promoter is not None:
        _promoter(reason)


def await_promotion() -> None:
    """Before a child process starts: wait (briefly, bounded) while another thread is promoting
    this process, so that the child inherits the registry of this job's sidecar."""
    if promoted and _promotion_waiter is not None:
        _promotion_waiter()


steps = 0
last_step_ns: int | None = None
metrics: dict[str, object] = {}


STRICT_ENV = "LORA_OTEL_STRICT_INTERNAL"
"""Set to ``1`` by the project's own test suite (``tests/conftest.py``) only: there an internal error
is raised, so that a bug fails a test instead of hiding. Never keyed on ``PYTEST_CURRENT_TEST``: a
user's own pytest run sets that too, and must pass exactly as without lora_otel."""


def strict() -> bool:
    """Whether internal errors are raised instead of reported: `STRICT_ENV` is ``1`` and
    ``LORA_OTEL_TEST_FAIL_OPEN`` is not set (tests of the fail-open behaviour itself set it)."""
    env = os.environ
    return env.get(STRICT_ENV) == "1" and not env.get("LORA_OTEL_TEST_FAIL_OPEN")


class fail_open:  # noqa: N801 - named as the function-like context managers of contextlib are
    """Context manager for code that runs inside the user's program.

    Swallows an ``Exception`` and reports it as one line on stderr, naming ``where``; under the
    project's own test suite (`strict`) it re-raises so that bugs fail tests instead of hiding.
    ``KeyboardInterrupt`` and ``SystemExit`` pass through: a Ctrl-C, or a signal handler's
    ``sys.exit``, that lands while lora_otel's bookkeeping runs is the program's to handle.
    """

    __slots__ = ("where",)

    def __init__(self, where: str) -> None:
        self.where = where

    def __enter__(self) -> None:
        return None

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> bool:
        if et is None or not issubclass(et, Exception) or strict():
            return False
        try:
            error_line(
                "internal error in %s: %s: %s (instrumentation continues without it)" % (self.where, et.__name__, ev)
            )
        except Exception:  # noqa: BLE001 - reporting must not raise either
            pass
        return True


# --- ids and time ----------------------------------------------------------------------------


def new_span_id() -> str:
    while True:
        s = os.urandom(8).hex()
        if s != "0000000000000000":
            return s


def new_trace_id() -> str:
    while True:
        s = os.urandom(16).hex()
        if s != "0" * 32:
            return s


def iso_ms(ns: int) -> str:
    """``2026-11-30T22:13:48.123Z`` for a Unix time in nanoseconds."""
    return words.iso_time(ns)


# --- writing ---------------------------------------------------------------------------------

stderr_id: tuple[int, ...] | None = None
"""``(st_dev, st_ino)`` of descriptor 2 when the preamble started (``()``: closed then); None when
not recorded. lora_otel writes to descriptor 2 only while it is still that file: a program that
closed every descriptor and opened its own files (daemonising code) may have its data file there."""


def stderr_is_ours() -> bool:
    """Whether descriptor 2 is still the stderr this process started with (one ``fstat``)."""
    if stderr_id is None:
        return True
    try:
        st = os.fstat(2)
    except OSError:
        return False
    return (st.st_dev, st.st_ino) == stderr_id


stderr_path: str | None = None
"""The path of descriptor 2 when it was a regular file at start (``prog 2>> log.txt``), else None."""


stderr_kind = ""
"""What descriptor 2 is (`record_stderr`): ``"file"`` (a regular file, /dev/null: it takes a write at
once), ``"pipe"`` (a pipe or FIFO), ``"tty"`` or ``"socket"``; "" until known."""

PIPE_BUF = 4096
"""A write of at most this many bytes to a pipe is atomic (POSIX; Linux's value): all of it or none.
A line to a pipe, a terminal or a socket is cut to this length (the journal has it whole)."""

_stderr_dropped = 0
"""Lines that did not fit on stderr since the last one that did (the next one that fits says how many)."""


def _kind_of(st: os.stat_result) -> str:
    fmt = st.st_mode & 0o170000  # S_IFMT, without importing stat
    if fmt == 0o010000:
        return "pipe"
    if fmt == 0o140000:
        return "socket"
    if fmt == 0o020000 and os.isatty(2):
        return "tty"
    return "file"


def record_stderr() -> None:
    """Remember what descriptor 2 is now (the preamble calls this first), and its path when it is a
    regular file (the watchdog may append a line to it by path for a job that cannot speak)."""
    global stderr_id, stderr_path, stderr_kind
    try:
        st = os.fstat(2)
        stderr_id = (st.st_dev, st.st_ino)
        stderr_kind = _kind_of(st)
    except OSError:
        stderr_id = ()
        return
    if stderr_kind == "file" and st.st_mode & 0o170000 == 0o100000:  # S_ISREG
        try:
            path = os.readlink("/proc/self/fd/2")
        except OSError:
            return
        if path.startswith("/") and not path.endswith(" (deleted)"):
            stderr_path = path


def _stderr(text: str) -> None:
    """Write ``text`` (whole lines) on descriptor 2, while it is still the stderr this process started
    with, as far as it fits *now*: never blocks, never raises.

    Not through ``sys.stderr``: a write there blocks on a full pipe or a stopped terminal (and its
    lock with it, which a forked child inherits), leaves an ``EPIPE`` in its buffer for the
    interpreter to fail on at exit (exit status 120), and lands in a notebook cell under ipykernel.
    The program's own ``sys.stderr`` is line-buffered, so its whole lines are on descriptor 2
    already and keep their order with ours. What does not fit (a full pipe nobody reads, a terminal
    stopped with Ctrl-S, a reader gone) is dropped here, with a count given on the next line that
    fits; the journal and the ``--log`` file have every line."""
    global _stderr_dropped
    try:
        if not stderr_is_ours():
            return
        encoding = _stderr_encoding()
        data = text.encode(encoding, "backslashreplace")
        if _stderr_dropped:
            n = _stderr_dropped
            said = "%d line%s not shown here: stderr had no room (the journal has every line)" % (
                n,
                "" if n == 1 else "s",
            )
            data = _format_line(said).encode(encoding, "backslashreplace") + data
        if _mid_line():
            data = b"\n" + data
        if _put_stderr(data):
            _stderr_dropped = 0
        else:
            _stderr_dropped += text.count("\n") or 1
    except Exception:  # noqa: BLE001 - nowhere left to report
        pass


def _stderr_encoding() -> str:
    """The encoding of the program's own stderr (``PYTHONIOENCODING``, the locale): a line of ours
    there is encoded as the program's output is, non-ASCII backslash-escaped on an ASCII console.
    UTF-8 when it is unknown or not a codec this interpreter has. (The ``--log`` file and the
    journal are UTF-8 always.)"""
    import sys

    encoding = getattr(sys.__stderr__, "encoding", None)
    if not isinstance(encoding, str) or encoding.lower().replace("-", "").replace("_", "") in ("", "utf8"):
        return "utf-8"
    try:
        "".encode(encoding)
    except (LookupError, ValueError):
        return "utf-8"
    return encoding


def _mid_line() -> bool:
    """Whether descriptor 2 is in the middle of a line now — a progress bar's unfinished ``\r`` line
    (tqdm's, every transformers load shows one): then a line of ours starts with a newline instead of
    being glued onto it.

    A regular file (``>> log.txt 2>&1``) tells by its last byte, read through a description of our
    own (``/proc/self/fd/2``: the program's may be write-only). A terminal or a pipe cannot be read
    back: a live, enabled tqdm bar on the process's stderr says it (attribute reads only — the
    class's set of instances, each one's ``disable`` and ``fp``; nothing of tqdm's is called)."""
    try:
        kind = stderr_kind or _learn_stderr_kind()
        if kind == "file":
            fd = os.open("/proc/self/fd/2", os.O_RDONLY | os.O_CLOEXEC | os.O_NOCTTY)
            try:
                size = os.fstat(fd).st_size
                return size > 0 and os.pread(fd, 1, size - 1) != b"\n"
            finally:
                os.close(fd)
        return _tqdm_bar_on_stderr()
    except Exception:  # noqa: BLE001 - unknown: as before, no newline added
        return False


def _tqdm_bar_on_stderr() -> bool:
    import sys

    std = _modules.get("tqdm.std")
    instances = getattr(getattr(std, "tqdm", None), "_instances", None)
    if not instances:
        return False
    streams = (sys.stderr, sys.__stderr__)
    for bar in list(instances):
        if getattr(bar, "disable", True):
            continue
        fp = getattr(bar, "fp", None)
        if fp in streams or getattr(fp, "wrapped", None) in streams:  # tqdm wraps it (DisableOnWriteError)
            return True
    return False


def _put_stderr(data: bytes) -> bool:
    """``data`` written on descriptor 2 if it fits without blocking; whether it was.

    A regular file takes it at once. A pipe or a terminal is written through a description of
    lora_otel's own, opened non-blocking (``/proc/self/fd/2``): ``O_NONBLOCK`` on the program's
    descriptor would change the program's stderr too. A line of at most `PIPE_BUF` bytes goes into
    a pipe whole or not at all. A socket (systemd's journal) is sent to with ``MSG_DONTWAIT``."""
    kind = stderr_kind or _learn_stderr_kind()
    if kind == "file":
        os.write(2, data)
        return True
    if len(data) > PIPE_BUF:
        data = data[: PIPE_BUF - 4].decode("utf-8", "ignore").encode() + b"...\n"
    if kind == "socket":
        return _send_stderr(data)
    if kind == "pipe" and not _sigpipe_ignored() and not _room_on_stderr():
        return False  # (the program takes SIGPIPE itself: a write with no reader left would kill it)
    try:
        fd = os.open("/proc/self/fd/2", os.O_WRONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as e:
        if e.errno in (5, 6) or (e.errno == 2 and os.path.isdir("/proc/self/fd")):
            return False  # EIO: the terminal hung up; ENXIO: a FIFO with no reader; descriptor 2 gone
        # No /proc, or not allowed to open it (a pipe a container runtime made as another user):
        # a free pipe slot takes a line of PIPE_BUF bytes without blocking.
        if not _room_on_stderr():
            return False
        os.write(2, data)
        return True
    try:
        st = os.fstat(fd)
        if stderr_id and (st.st_dev, st.st_ino) != stderr_id:
            return False  # descriptor 2 changed hands meanwhile
        os.write(fd, data)  # a pipe: all of it, or BlockingIOError; a terminal may take a part
        return True
    except OSError:  # no room (BlockingIOError), the reader left (BrokenPipeError)
        return False
    finally:
        os.close(fd)


def _learn_stderr_kind() -> str:
    global stderr_kind
    stderr_kind = _kind_of(os.fstat(2))
    return stderr_kind


def _sigpipe_ignored() -> bool:
    import _signal  # type: ignore[import-not-found]  # no stub: the C half of signal (no enum to build)

    return _signal.getsignal(_signal.SIGPIPE) is _signal.SIG_IGN  # (Python's own setting at start)


def _room_on_stderr() -> bool:
    """Whether descriptor 2 has room for a write (``poll``, no wait) and a reader."""
    from lora_otel._boot.stdlib import module

    select = module("select")  # (never a select.py of the working directory: lora_otel._boot.stdlib)
    poller = select.poll()
    poller.register(2, select.POLLOUT)
    events = poller.poll(0)
    return bool(events) and events[0][1] & (select.POLLOUT | select.POLLERR | select.POLLHUP) == select.POLLOUT


def _send_stderr(data: bytes) -> bool:
    from lora_otel._boot.stdlib import module

    _socket = module("_socket")
    fd = os.dup(2)
    try:
        sock = _socket.socket(fileno=fd)
    except OSError:
        os.close(fd)
        return False
    try:
        sock.send(data, getattr(_socket, "MSG_DONTWAIT", 0x40) | getattr(_socket, "MSG_NOSIGNAL", 0x4000))
        return True
    except OSError:
        return False
    finally:
        sock.close()


created_dirs: list[tuple[str, int, int]] = []
"""``(path, st_dev, st_ino)`` of each directory `open_journal` created for this process's journal
(not the state directory, which stays): a short run that removes its journal removes these too,
deepest first, when they are empty."""


def _dir_reason(d: str, created: list[tuple[str, int, int]]) -> str:
    """Why the journal directory ``d`` is not used ("" when it is), creating it (0700) when missing.

    The per-user state directory (`paths.state_dir`) is checked component by component
    (`files.state_dir_reason`); any other directory (``LORA_OTEL_DIR``, beside ``--log``) was
    chosen by the user: only what would let another user steer it counts. Directories created for
    it are added to ``created``. Raises ``OSError`` when it cannot be created."""
    from lora_otel._boot import files, paths

    base, parts, make_base = paths.state_dir_parts(os.environ)
    if base and d == os.path.join(base, *parts):
        return files.state_dir_reason(base, parts, make_base)
    reason = files.steered_dir_reason(d, default=False)
    if reason or os.path.isdir(d):
        return reason
    missing = []
    p = d
    while p and not os.path.lexists(p):
        missing.append(p)
        p = os.path.dirname(p)
    os.makedirs(d, mode=0o700, exist_ok=True)
    for m in missing:  # deepest first
        try:
            st = os.lstat(m)
            created.append((m, st.st_dev, st.st_ino))
        except OSError:
            pass
    return ""


def _create_journal(path: str, exact: bool) -> tuple[int, str]:
    """``(fd, path)``: ``path`` created new (``O_EXCL``, 0600); when something is already there, a
    unique variant beside it (another process's journal, or a name someone planted). With ``exact``
    (``LORA_OTEL_JOURNAL``, or the file `lora-otel run` created for its child) an existing file is
    appended to when it is safely this user's."""
    from lora_otel._boot import files, paths

    if exact:
        return files.open_append(path), path
    try:
        return files.create_new(path), path
    except FileExistsError:
        pass
    for _ in range(8):
        other = paths.unique_variant(path, os.getpid(), now_ns() / 1e9)
        try:
            return files.create_new(other), other
        except FileExistsError:
            continue
    raise files.UnsafeFile("%s and 8 unique variants are taken" % path)


def open_journal(path: str, exact: bool = False, make_dir: bool = True) -> str:
    """Open the journal at ``path`` (or a unique name beside it); on failure fall back to
    ``$TMPDIR/lora-otel-<uid>/``, saying so.

    Every process gets a journal of its own: the file is created new (see `_create_journal`), its
    descriptor moved to a high number and its identity recorded for :func:`write_line`. Without
    ``make_dir`` (a forked child), a directory that is gone is not created again: the process goes
    on without a journal, saying so. Returns the path actually opened, or "".
    """
    global journal_path
    from lora_otel._boot import files

    tried = []
    d = os.path.dirname(path)
    if not make_dir and d and not os.path.isdir(d):
        _emit(
            "the journal directory %s is gone (removed by the program?); pid %d goes on without a "
            "journal rather than create it again" % (d, os.getpid()),
            "error",
        )
        journal_path = ""
        return ""
    created: list[tuple[str, int, int]] = []
    for fallback in (False, True):
        cand = path
        try:
            if fallback:
                from lora_otel._boot import paths

                base = paths.fallback_dir(os.environ)
                cand_dir = files.private_dir(base)
                if cand_dir != base:
                    tried.append("%s (%s)" % (base, files.unsafe_dir_reason(base)))
                cand = os.path.join(cand_dir, os.path.basename(path))
            elif d:
                reason = _dir_reason(d, created) if make_dir else files.steered_dir_reason(d, default=False)
                if reason:
                    tried.append("%s (%s)" % (cand, reason))
                    continue
            try:
                fd, cand = _create_journal(cand, exact and not fallback)
            except FileNotFoundError:
                if fallback or not make_dir or not d:
                    raise
                # Another process's short run removed the (empty) directory it had created, just now.
                _dir_reason(d, created)
                fd, cand = _create_journal(cand, exact)
        except OSError as e:
            tried.append("%s (%s)" % (cand, e.strerror or e))
            continue
        created_dirs[:] = created if not fallback else []
        _set_journal(fd, cand)
        if tried:
            error_line("cannot write journal at %s; using %s instead" % ("; not in ".join(tried), cand))
        return cand
    error_line("cannot write a journal anywhere (%s); the program goes on untraced on disk" % "; ".join(tried))
    journal_path = ""
    return ""


_deferred: tuple[str, Callable[[], dict[str, Any]]] | None = None
"""A forked child's journal not created yet: its path and what makes its first record (the root
span). `defer_journal` sets it; the first record written creates the file (`ensure_journal`)."""
_deferred_lock = allocate_lock()


def defer_journal(path: str, first_record: Callable[[], dict[str, Any]]) -> None:
    """Create the journal at ``path`` only when the first record is written (a forked child: its
    first span, line or beat, or its promotion), starting with ``first_record()``. A fork that
    exits at once, normally, so creates no file at all. Until then `journal_path` is ""."""
    global _deferred, _deferred_lock, journal_path
    _deferred, _deferred_lock, journal_path = (path, first_record), allocate_lock(), ""


def journal_name() -> str:
    """The journal's path, also while it waits for its first record (`defer_journal`)."""
    return _deferred[0] if _deferred is not None else journal_path


def journal_deferred() -> bool:
    """Whether this process's journal waits for its first record (`defer_journal`)."""
    return _deferred is not None


_creator = 0
"""The thread creating the deferred journal now (`ensure_journal`); 0 when none. Until its first
record is in, other threads' records wait (they would come before it, or be lost with it at an
``os._exit``)."""


def ensure_journal() -> bool:
    """Create a deferred journal now (`defer_journal`), with its first record; whether there is a
    journal to write to. Another thread creating it meanwhile is waited for, at most 5 s (a loaded
    machine): a record written then (a forked child's exit record while its beat thread creates
    the journal) waits for the file, and is not lost, nor the child's exit left before the first
    record is in the file."""
    global _deferred, _creator
    if _deferred is None and not _deferred_lock.locked():
        return _journal_fd >= 0
    if _creator == get_ident():
        return _journal_fd >= 0  # (a line said while this thread creates the journal)
    if not _deferred_lock.acquire(True, 5.0):
        return False
    try:
        if _deferred is None:
            return _journal_fd >= 0
        _creator = get_ident()
        (path, first_record), _deferred = _deferred, None
        # The parent's directory, only while it exists: never create again one the program removed.
        if open_journal(path, make_dir=False):
            write(first_record())
    finally:
        _creator = 0
        _deferred_lock.release()
    return _journal_fd >= 0


# Record fields that are never free text: a remembered secret is not looked for in them.
_ID_FIELDS = frozenset(("v", "k", "ts", "trace_id", "span_id", "parent_id", "pid", "ppid", "start_ticks"))


def _scrubbed(obj: object) -> object:
    """A record with every value redacted so far (``redact.scrub``) replaced in its texts."""
    if type(obj) is str:
        from lora_otel._boot.redact import scrub

        return scrub(obj)
    if type(obj) is dict:
        return {k: (v if k in _ID_FIELDS else _scrubbed(v)) for k, v in obj.items()}
    if type(obj) is list or type(obj) is tuple:
        return [_scrubbed(v) for v in obj]
    return obj


alone = False
"""Whether no other thread of this process can run now (the preamble at interpreter start, a
forked child's hook): descriptors are moved without ``fcntl`` then (`files.move_high`)."""


def _set_journal(fd: int, path: str) -> None:
    global _journal_fd, _journal_dev, _journal_ino, journal_path
    from lora_otel._boot import files

    fd = files.move_high(fd, alone)
    _journal_dev, _journal_ino = files.identity(fd)
    _journal_fd = fd
    journal_path = path


def lock_journal(fd: int = -1) -> None:
    """Hold a shared ``flock`` on the journal (``fd``: the journal's descriptor) for as long as it
    is open: the proof, across pid namespaces and hosts sharing the directory, that its owner still
    runs (retention, `lora_otel.journal.runs.prune`, removes no journal it cannot lock
    exclusively). Taken when the process becomes a job (`preamble.promote`; a process that ends at
    once pays nothing) and on every descriptor reopened after that.
    A forked child shares the lock through the descriptor it inherits, until it lets go of it.
    Never blocks (only retention's probe asks for more than a shared lock), never raises."""
    fd = _journal_fd if fd < 0 else fd
    if fd < 0:
        return
    try:
        from lora_otel._boot.stdlib import module

        fcntl = module("fcntl")  # (never a fcntl.py of the working directory)
        for _ in range(5):
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                return
            except BlockingIOError:  # retention's probe holds it for a moment (`runs._lock`)
                sleep(0.002)
    except (OSError, ImportError):
        pass  # no lock (a file system without locks): retention goes by the pid, as before


_swap_lock = RLock()
"""Held while the journal's descriptor is swapped for a reopened one: a few assignments, never a
call into the OS or the program. Reentrant: a signal handler that writes a record in the thread
that holds it goes on. Renewed in a forked child (`_after_fork_in_child`)."""


def _reopen_journal() -> bool:
    """The journal's descriptor was closed, or its number now names another file (the program
    closed it and opened its own): never write to that number again; reopen the journal by its
    path (``O_APPEND``, no symlink, only a file of this user's, created new when it was removed)
    and say so in one line. Returns whether there is a journal to write to.

    Threads (and signal handlers) that find the descriptor broken at the same time each open the
    file; the first to swap it in wins and the others close theirs: no lock is held across the
    ``open``."""
    global _journal_fd, _journal_dev, _journal_ino
    from lora_otel._boot import files

    old = _journal_fd
    if old < 0:
        return False
    if files.same(old, (_journal_dev, _journal_ino)):
        return True  # another thread reopened it meanwhile
    fd, ident, error = -1, (0, 0), None
    try:
        from lora_otel._boot.stdlib import module

        module("fcntl")  # loaded before the open: the low number the open takes is held for µs, not for an import

        fd = files.move_high(files.open_append(journal_path))
        ident = files.identity(fd)
        if promoted:
            lock_journal(fd)  # (the lock went with the descriptor the program closed)
    except OSError as e:
        error = e
    with _swap_lock:
        won = _journal_fd == old
        if won:
            _journal_fd = -1  # (a write meanwhile finds no journal, never a half-set one)
            _journal_dev, _journal_ino = ident
            _journal_fd = fd if error is None else -1
    if not won or error is not None:
        if fd >= 0:
            os.close(fd)
        if won:
            _stderr(
                _format_line(
                    "the journal's descriptor %d was closed or reused by the program, and %s cannot be "
                    "reopened (%s); the program goes on without a journal"
                    % (old, journal_path, getattr(error, "strerror", None) or error)
                )
            )
        return _journal_fd >= 0
    error_line(
        "the journal's descriptor %d was closed or reused by the program (os.closerange?); reopened %s "
        "as descriptor %d, nothing was written to the old number" % (old, journal_path, fd)
    )
    return True


def write(rec: dict[str, Any]) -> None:
    """Append one record to the journal with a single ``os.write``. Never raises.

    Texts lose every value redacted so far in this process (a password from argv quoted in an
    exception message, an exit message, an event): one truth test while there is none."""
    if forked_at:
        settle()
    if _journal_fd < 0 and _deferred is None and not _deferred_lock.locked():
        return
    try:
        if known_secrets:
            rec = _scrubbed(rec)  # type: ignore[assignment]
        data = dumps_line(rec)
    except Exception as e:  # noqa: BLE001 - the program must go on
        _write_failed(e)
        return
    write_line(data)


def write_line(
    data: bytes,
    _fstat: Callable[[int], os.stat_result] = os.fstat,
    _write: Callable[[int, bytes], int] = os.write,
) -> None:
    """Append one encoded record (a `dumps_line` result, or the same line built from a template)
    with a single ``os.write``. Never raises."""
    global _journal_failed, _journal_lost
    if forked_at:
        settle()
    fd = _journal_fd
    if fd < 0 or _creator:  # (no journal yet: one deferred, or one another thread is creating)
        if not ensure_journal():
            return
        fd = _journal_fd
    try:  # the identity check: is this number still our journal? (~0.5 µs, see docs/performance.md)
        st = _fstat(fd)
        if st.st_ino != _journal_ino or st.st_dev != _journal_dev:
            raise OSError
    except OSError:
        if not _reopen_journal():
            return
        fd = _journal_fd
        try:
            st = _fstat(fd)
        except OSError as e:
            _write_failed(e)
            return
    try:
        limit = _size_limit()
        if limit == _journal_full_at or st.st_size + len(data) > limit:
            # (and every record after it while the limit stays: a smaller one that would still fit
            # is not written, nor "journal writes work again" said, record after record)
            _set_journal_full_at(limit)
            raise OSError(27, "the file size limit (RLIMIT_FSIZE) would be passed")
        n = _write(fd, data)
        if n != len(data):  # short write: the disk filled mid-record; end the broken line
            os.write(_journal_fd, b"\n")
            raise OSError(28, "short write (disk full?)")
    except Exception as e:  # noqa: BLE001 - the program must go on
        _write_failed(e)
        return
    if _journal_failed:
        # Writes work again (space was freed): say how much is missing, in the journal and on stderr.
        _journal_failed = False
        lost, _journal_lost = _journal_lost, 0
        msg = "journal writes work again; %d record%s could not be written before this" % (
            lost,
            "" if lost == 1 else "s",
        )
        _stderr(_format_line(msg))
        write({"v": FORMAT_VERSION, "k": "line", "ts": now_ns(), "level": "error", "msg": msg})


_journal_full_at = -1.0
"""The file size limit (`_size_limit`) at which the journal stopped; -1 while it has not."""


def _set_journal_full_at(limit: float) -> None:
    global _journal_full_at
    _journal_full_at = limit


def _size_limit() -> float:
    """The process's soft RLIMIT_FSIZE in bytes (infinity when none, or when SIGXFSZ is ignored, as
    CPython sets it at start: a write past the limit then only fails, the short-write path handles
    it): a write past it raises SIGXFSZ, which kills a program that restored that signal's default,
    so lora_otel stops short of it. (``getsignal`` costs ~30 ns, the ``getrlimit`` call ~0.5 µs.)"""
    try:
        import _signal

        if _signal.getsignal(_signal.SIGXFSZ) == _signal.SIG_IGN:
            return float("inf")
        from lora_otel._boot.stdlib import module

        resource = module("resource")
        soft = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    except Exception:  # noqa: BLE001 - no such limit on this platform
        return float("inf")
    return float("inf") if soft == resource.RLIM_INFINITY or soft < 0 else float(soft)


def _write_failed(e: BaseException) -> None:
    global _journal_failed, _journal_lost
    _journal_lost += 1
    if not _journal_failed:
        _journal_failed = True
        _stderr(
            _format_line(
                "journal write failed (%s): %s; the program goes on, and writing is "
                "retried with each record" % (getattr(e, "strerror", None) or e, journal_path)
            )
        )


def _format_line(msg: str) -> str:
    """The one place a human line is made (stderr and the ``--log`` file): ``msg`` with its control
    characters escaped (`jsonl.printable`), so no value in it forges a line or drives the terminal."""
    return "[lora-otel][%d][%s] %s\n" % (pid or os.getpid(), iso_ms(now_ns()), printable(msg))


def _same_as_std(dev_ino: tuple[int, int]) -> bool:
    for fd in (1, 2):
        try:
            st = os.fstat(fd)
        except OSError:
            continue
        if (st.st_dev, st.st_ino) == dev_ino:
            return True
    return False


def open_log(path: str, explicit: bool = False, job_log: bool = False) -> None:
    """Also append human lines to ``path``: the program's log file as `paths.choose_log` chose it.

    Created new with the mode the program would give it (0666 minus the umask), in a directory that
    exists (created only for an ``explicit`` ``LORA_OTEL_LOG``); or an existing regular file of
    this user's, not a symlink, that nobody outside its group can write (`files.open_program_log`).
    Not when it is the stream the lines already go to (stdout redirected to the same file): then
    each line would be there twice. ``job_log``: the log of the job this process is a child of
    (``LORA_OTEL_JOB_LOG``): only when it exists, and no line about it when it cannot be used (the
    job's own process said so already, or the job moved it away).
    """
    global _log_fd, _log_failed, _log_dev, _log_ino, _log_created, _log_size0, _log_written
    from lora_otel._boot import files

    try:
        if explicit:
            d = os.path.dirname(os.path.abspath(path))
            if not os.path.isdir(d):
                os.makedirs(d, exist_ok=True)
        fd, created = files.open_program_log(path, create=not job_log)
        st = os.fstat(fd)
        ident = (st.st_dev, st.st_ino)
        if _same_as_std(ident):  # `prog --log run.log > run.log`: the lines reach it already
            os.close(fd)
            return
        _log_fd = files.move_high(fd)
        _log_dev, _log_ino = ident
        _log_created, _log_size0, _log_written = created, st.st_size, 0
    except OSError as e:
        _log_failed = True
        if job_log:
            return
        _stderr(
            _format_line("cannot append to log file %s (%s); lines go to the terminal only" % (path, e.strerror or e))
        )


def names_std_stream(path: str | None) -> bool:
    """Whether ``path`` is the file stdout or stderr is (``--log /dev/stdout``): lines reach it already."""
    if not path:
        return False
    try:
        st = os.stat(path)
    except OSError:
        return False
    return _same_as_std((st.st_dev, st.st_ino))


def drop_log(reason: str) -> None:
    """The program has shown that its ``--log`` is no file path (``reason``, e.g. argparse's
    ``store_true``): never write to that file again, and take back what lora_otel wrote there —
    the file removed when lora_otel created it and it holds only lora_otel's bytes; cut back to its
    size at open when it existed and nothing else has been written since. One line says so, and a
    root ``attrs`` record (``lora_otel.log.copied`` false) tells the watchdog not to write there."""
    global _log_fd, log_path, log_option
    from lora_otel._boot import files

    fd, path, created, size0, written = _log_fd, log_path, _log_created, _log_size0, _log_written
    _log_fd, log_path, log_option = -1, None, ""  # first: no line goes there from now on
    os.environ.pop(JOB_LOG_ENV, None)  # nor a line of the processes it starts
    undone = ""
    if fd >= 0 and files.same(fd, (_log_dev, _log_ino)):
        try:
            size = os.fstat(fd).st_size
            here = os.stat(path or "", follow_symlinks=False) if path else None
            ours = here is not None and (here.st_dev, here.st_ino) == (_log_dev, _log_ino)
            if created and ours and size == written:
                os.unlink(path or "")
                undone = "; removed %s, which lora_otel had created" % path
            elif not created and written and size == size0 + written:
                os.ftruncate(fd, size0)
                undone = "; the %d bytes lora_otel appended to %s are taken back" % (written, path)
            elif written:
                undone = "; the %d bytes lora_otel wrote to %s stay (the file has changed since)" % (written, path)
        except OSError as e:
            undone = "; what lora_otel wrote to %s stays (%s)" % (path, e.strerror or e)
        try:
            os.close(fd)
        except OSError:
            pass
    span_attrs(root_id, {"lora_otel.log.copied": False, "lora_otel.log.refused": reason})
    info_line(
        "%s: lora_otel's lines are no longer copied to %s%s; the journal stays at %s"
        % (reason, path, undone, journal_path or "(none)")
    )


def _write_log(data: bytes) -> None:
    """Append to the ``--log`` copy, after the same identity check as the journal's."""
    global _log_fd, _log_failed, _log_written
    from lora_otel._boot import files

    fd = _log_fd
    if not files.same(fd, (_log_dev, _log_ino)):
        old, _log_fd = fd, -1  # never touch that number again: it may be the program's now
        open_log(log_path or "")
        fd = _log_fd
        if fd < 0:
            return
        msg = _format_line(
            "the --log file's descriptor %d was closed or reused by the program; reopened %s" % (old, log_path)
        )
        _stderr(msg)
        _log_written += os.write(fd, msg.encode("utf-8", "backslashreplace"))
    if os.fstat(fd).st_size + len(data) > _size_limit():
        raise OSError(27, "the file size limit (RLIMIT_FSIZE) would be passed")
    _log_written += os.write(fd, data)


def wait_for_log(path: str, create: bool = False) -> None:
    """Copy lines to ``path`` only once the program writes it (`_log_waits`), or — ``create``, a
    file that does not exist yet — once a job's warning or error needs them there (`_log_may_create`)."""
    global _log_waits, _log_may_create
    _log_waits, _log_may_create = True, create
    del _log_waiting[:]


def check_log() -> None:
    """At a beat, while the ``--log`` copy waits: write what waited once the program writes the
    file (one ``stat`` while it does not exist)."""
    if _log_waits and log_path and program_writes(log_path):
        _flush_waiting()


def program_writes(path: str) -> bool:
    """Whether one of this process's descriptors is ``path`` (same device and inode) open for
    writing (``/proc/self/fdinfo`` flags); False where there is no ``/proc``."""
    try:
        st = os.stat(path)
        fds = os.listdir("/proc/self/fd")
    except OSError:
        return False
    for name in fds:
        try:
            fst = os.stat("/proc/self/fd/" + name)
            if (fst.st_dev, fst.st_ino) != (st.st_dev, st.st_ino):
                continue
            info = os.open("/proc/self/fdinfo/" + name, os.O_RDONLY | os.O_CLOEXEC)
            try:
                text = os.read(info, 4096)
            finally:
                os.close(info)
            for line in text.splitlines():
                if line.startswith(b"flags:") and int(line.split()[1], 8) & 3:
                    return True
        except (OSError, ValueError, IndexError):
            continue
    return False


def _wait_log(data: bytes, level: str = "info") -> None:
    """Keep ``data`` for the waiting ``--log`` copy; write it all there once the program writes it,
    or once a job's warning or error needs it in a file that is still not there (`_log_may_create`)."""
    global _log_waiting_dropped
    if len(_log_waiting) < _LOG_WAITING_MAX:
        _log_waiting.append(data)
    else:
        _log_waiting_dropped += 1
    if not log_path:
        return
    needed = _log_may_create and promoted and level in ("warn", "error") and not _log_holds_theirs(log_path)
    if needed or program_writes(log_path):
        _flush_waiting()


def _log_holds_theirs(path: str) -> bool:
    """Whether ``path`` exists with lines that are not lora_otel's (the program's: not ours to add
    to before it writes there); not when it is absent or holds only lora_otel's lines (made by a
    child process of this job or the watchdog, with a warning of theirs)."""
    if not os.path.lexists(path):
        return False
    from lora_otel._boot import paths

    return paths.holds_lines(path) or not os.path.isfile(path)


def _flush_waiting() -> None:
    """Open the ``--log`` copy now and write what waited there; the journal records its identity
    (``lora_otel.log.id``: the watchdog writes only to that file, at the path of the first record)."""
    global _log_waits, _log_waiting_dropped
    _log_waits = False
    if log_path:
        open_log(log_path)
        if _log_fd >= 0:
            span_attrs(root_id, {"lora_otel.log.id": [_log_dev, _log_ino]})
            dropped, _log_waiting_dropped = _log_waiting_dropped, 0
            if dropped:  # (the journal has them all)
                note = (
                    "%d more line%s, written while the program had not yet opened this file, are in the journal %s only"
                    % (dropped, "" if dropped == 1 else "s", journal_path or "(none)")
                )
                _log_waiting.append(_format_line(note).encode("utf-8", "backslashreplace"))
            _write_log(b"".join(_log_waiting))
        del _log_waiting[:]


def _emit(msg: str, level: str) -> None:
    """Print a line on stderr (never stdout: that is the program's), unless it is an info line of a
    `quiet` process, and append it to the ``--log`` file."""
    global _log_failed
    if known_secrets:
        msg = _scrubbed(msg)  # type: ignore[assignment]
    text = _format_line(msg)
    if level == "info" and hold_terminal and not quiet:
        if len(_terminal_held) < _TERMINAL_HELD_MAX:
            _terminal_held.append(text)
        if not hold_terminal:  # promotion showed what waited meanwhile (another thread)
            show_held()
    elif level != "note" and (level != "info" or not quiet):
        _stderr(text)
    if (_log_fd >= 0 or (_log_waits and log_path)) and (not log_bad_only or level in ("warn", "error")):
        try:
            if _log_fd >= 0:
                _write_log(text.encode("utf-8", "backslashreplace"))
            else:
                _wait_log(text.encode("utf-8", "backslashreplace"), level)
        except Exception as e:  # noqa: BLE001
            if not _log_failed:
                _log_failed = True
                _stderr(_format_line("cannot append to log file %s (%s)" % (log_path, getattr(e, "strerror", e))))


def info_line(msg: str) -> None:
    """Print an English line to stderr (flushed; not in a `quiet` process) and the ``--log`` file,
    and journal it."""
    _emit(msg, "info")
    write({"v": FORMAT_VERSION, "k": "line", "ts": now_ns(), "level": "info", "msg": msg})


def note_line(msg: str) -> None:
    """An info line for the journal and the ``--log`` file only, never the terminal: what a process
    that is not a job (`promoted`) says that nobody needs to see live (its normal exit, its
    start-up facts at an early failure). Its journal record is level ``info``."""
    _emit(msg, "note")
    write({"v": FORMAT_VERSION, "k": "line", "ts": now_ns(), "level": "info", "msg": msg})


def warn_line(msg: str) -> None:
    """Print an English line to stderr — also in a `quiet` process: something to report, such as a
    stage running long — and the ``--log`` file, and journal it (level ``warn``)."""
    _emit(msg, "warn")
    write({"v": FORMAT_VERSION, "k": "line", "ts": now_ns(), "level": "warn", "msg": msg})


def error_line(msg: str) -> None:
    """Print an English line to stderr and the ``--log`` file, and journal it."""
    _emit(msg, "error")
    write({"v": FORMAT_VERSION, "k": "line", "ts": now_ns(), "level": "error", "msg": msg})


# --- spans -------------------------------------------------------------------------------------


def traceparent(span_id: str) -> str:
    """The W3C ``traceparent`` that makes ``span_id`` the parent of a child process's root span."""
    return "00-%s-%s-%s" % (trace_id, span_id, "01" if sampled else "00")


def current_span_id() -> str:
    """The innermost open span of the calling thread, else the root span."""
    if forked_at:
        settle()
    stack = _stacks.get(get_ident())
    return stack[-1] if stack else root_id


def span_start(
    name: str,
    attrs: Mapping[str, object] | None = None,
    parent_id: str | None = None,
    ts: int | None = None,
    push: bool = True,
) -> str:
    """Write a span's start record and return its id. The record is on disk when this returns."""
    if forked_at:
        settle()
    sid = new_span_id()
    tid = get_ident()
    parent = parent_id or current_span_id()
    ts = ts or now_ns()
    if known_secrets and type(name) is str:
        name = _scrubbed(name)  # type: ignore[assignment]
    if not attrs and type(name) is str and type(parent) is str and type(ts) is int:
        # The same line as the record below, from a template: a third of the encoding time.
        write_line(
            (
                '{"v":%d,"k":"start","ts":%d,"trace_id":%s,"span_id":"%s","parent_id":%s,"name":%s,'
                '"attrs":{}}\n'
                % (FORMAT_VERSION, ts, jsonl._quote(trace_id), sid, jsonl._quote(parent), jsonl._quote(name))
            ).encode("utf-8", "backslashreplace")
        )
    else:
        write(
            {
                "v": FORMAT_VERSION,
                "k": "start",
                "ts": ts,
                "trace_id": trace_id,
                "span_id": sid,
                "parent_id": parent,
                "name": name,
                "attrs": attrs or {},
            }
        )
    open_spans[sid] = (name, parent, tid, ts)
    if push:
        _stacks.setdefault(tid, []).append(sid)
    return sid


def span_end(
    sid: str,
    status: str = "ok",
    message: str | None = None,
    attrs: Mapping[str, object] | None = None,
    ts: int | None = None,
) -> None:
    """Write a span's end record (once; a second end for the same span is ignored)."""
    global last_ended
    if forked_at:
        settle()  # (a span the parent opened is none of this child's)
    info = open_spans.pop(sid, None)
    if info is None:
        return
    stack = _stacks.get(info[2])
    if stack and sid in stack:
        stack.remove(sid)
    ts = ts or now_ns()
    ended_at[sid] = ts
    if len(ended_at) > _ENDED_KEPT:
        try:
            del ended_at[next(iter(ended_at))]
        except (KeyError, RuntimeError, StopIteration):
            pass  # (another thread's end trimmed it first)
    if (
        type(info[0]) is not str or not info[0].startswith("import ") or ts - info[3] >= import_threshold_ms * 1_000_000
    ):  # an import too short to export is no stage
        last_ended = (sid, info[0], ts)
    if not message and not attrs and type(sid) is str and type(status) is str and type(ts) is int:
        write_line(
            (
                '{"v":%d,"k":"end","ts":%d,"span_id":%s,"status":%s}\n'
                % (FORMAT_VERSION, ts, jsonl._quote(sid), jsonl._quote(status))
            ).encode("utf-8", "backslashreplace")
        )
        return
    rec = {"v": FORMAT_VERSION, "k": "end", "ts": ts, "span_id": sid, "status": status}
    if message:
        rec["message"] = message
    if attrs:
        rec["attrs"] = attrs
    write(rec)


def _settled(sid: str) -> str:
    """``sid`` once a forked child has settled (`settle`): its parent's root span is its own now."""
    stale = root_id
    settle()
    return root_id if sid == stale else sid


def span_event(sid: str, name: str, attrs: Mapping[str, object] | None = None) -> None:
    if forked_at:
        sid = _settled(sid)
    write({"v": FORMAT_VERSION, "k": "event", "ts": now_ns(), "span_id": sid, "name": name, "attrs": attrs or {}})


def span_attrs(sid: str, attrs: Mapping[str, object]) -> None:
    if forked_at:
        sid = _settled(sid)
    write({"v": FORMAT_VERSION, "k": "attrs", "ts": now_ns(), "span_id": sid, "attrs": attrs})


def find_open(name: str) -> str | None:
    """The id of an open span called ``name`` (the most recent), or None."""
    if forked_at:
        settle()
    found = None
    for sid, info in list(open_spans.items()):
        if info[0] == name:
            found = sid
    return found


def training_attrs() -> dict[str, object]:
    """The step counters, as attributes for the end of a ``training`` span."""
    attrs: dict[str, object] = {"lora_otel.training.steps": steps}
    if last_step_ns is not None:
        attrs["lora_otel.training.last_step"] = iso_ms(last_step_ns)
    for k, v in metrics.items():
        attrs["lora_otel.metric." + k] = v
    return attrs


main_frames: list[Frame] | None = None
"""Where the main thread was at the last beat (``where.sample``), or None."""


BEAT_RECORD_EVERY = 60
"""A beat that changes nothing — the same steps, metrics, open spans and main-thread frames as the
last beat record — is written only every this many beats (60 s at the default 1 s beat); at the
others the journal is only touched (`touch_journal`): its modification time is the sign of life
the readers take with the records (docs/journal.md). An idle process's journal so grows by some
60 records an hour, not 3,600."""
_beat_state: tuple[object, ...] | None = None
_beats_unwritten = 0
_touch_ok = True


def touch_journal() -> bool:
    """Set the journal's modification time to now (``futimens``), after the same identity check as
    `write_line`: a sign of life that adds no byte. False when there is no journal to touch or the
    file system refuses (then the caller writes a record instead, from then on)."""
    global _touch_ok
    if forked_at:
        settle()
    fd = _journal_fd
    if fd < 0 or not _touch_ok:
        return False
    try:
        st = os.fstat(fd)
        if st.st_ino != _journal_ino or st.st_dev != _journal_dev:
            raise OSError
    except OSError:
        if not _reopen_journal():
            return False
        fd = _journal_fd
    try:
        os.utime(fd)
    except (OSError, NotImplementedError, TypeError, ValueError):
        _touch_ok = False
        return False
    return True


def beat(force: bool = False) -> None:
    """The liveness record: steps, metrics, and where the main thread is (``"main"``).

    Written when any of those or the open spans changed since the last beat record, at least every
    `BEAT_RECORD_EVERY` beats, and with ``force`` (the exit hook's last beat); any other beat only
    touches the journal (`touch_journal`)."""
    global main_frames, _beat_state, _beats_unwritten
    if forked_at:
        settle()
    frames = None
    if main_ident and main_ident != get_ident():  # the exit hook's last beat runs in the main thread
        try:
            from lora_otel._boot.where import sample

            frames = sample(main_ident)
        except Exception:  # noqa: BLE001 - a beat without "main" is still a beat
            frames = None
    main_frames = frames
    try:
        state: tuple[object, ...] | None = (steps, last_step_ns, dict(metrics), frames, tuple(open_spans))
    except RuntimeError:  # a dict changed size under us (another thread): say it all
        state = None
    _beats_unwritten += 1
    unchanged = not force and state is not None and state == _beat_state and _beats_unwritten < BEAT_RECORD_EVERY
    if unchanged and touch_journal():
        return
    _beat_state, _beats_unwritten = state, 0
    rec = {"v": FORMAT_VERSION, "k": "beat", "ts": now_ns(), "steps": steps, "last_step_ts": last_step_ns}
    if metrics:
        rec["metrics"] = dict(metrics)
    if frames:
        rec["main"] = frames
    write(rec)


def reset_for_child(parent_span: str, fork_ns: int) -> None:
    """A forked child settling (`settle`): forget the parent's open spans; let go of the parent's
    journal descriptor (closed only while it is still the journal: the number may be the
    program's file by now); open the child's root span under ``parent_span``, at ``fork_ns``.

    The span stacks are dropped, not cleared (every page written after a fork is a copy);
    `_deferred_lock` is made anew by `defer_journal`."""
    global _journal_fd, steps, last_step_ns, _stacks, last_ended, main_frames
    global _beat_state, _beats_unwritten, root_id, open_spans, ended_at
    last_ended, main_frames = None, None
    ended_at = {}
    _beat_state, _beats_unwritten = None, 0
    if _journal_fd >= 0:
        try:
            st = os.fstat(_journal_fd)
            if st.st_ino == _journal_ino and st.st_dev == _journal_dev:
                os.close(_journal_fd)
        except OSError:
            pass
    _journal_fd = -1
    root_id = new_span_id()
    open_spans = {root_id: ("process", parent_span, 0, fork_ns)}
    _stacks = {}
    steps, last_step_ns = 0, None
    if metrics:
        metrics.clear()


def _after_fork_in_child() -> None:
    """In a forked child: a new `_swap_lock` (a thread of the parent may have held the old one at
    the fork; it does not exist here to release it), and no lines of the parent's counted as not shown."""
    global _swap_lock, _stderr_dropped
    _swap_lock = RLock()
    _stderr_dropped = 0


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
