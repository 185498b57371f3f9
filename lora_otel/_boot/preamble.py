"""The preamble: what runs first in a traced process, however lora_otel was activated.

Order matters and is the point of this module:

1. the journal is opened and the root span ``process`` is written (its start is the
   interpreter's real start, read from ``/proc/self/stat``), then one line goes to stderr —
   the first evidence, before anything else is imported (a process started by a traced process
   keeps its info lines off the terminal: `is_child`);
2. the import hook goes in, so the program's first import is already traced;
3. ``arguments`` opens; argv (redacted), the environment self-check and the process attributes
   are added to ``process``; children get ``TRACEPARENT``;
4. exit, exception, fork and beat machinery.

Imports only what the interpreter has already loaded, plus ``_thread`` and ``atexit``.

One module on purpose (~1,000 lines): `_start` installs all of it — exit, exec, fork, stack-dump
and beat machinery — in every traced process, so a split would only add files to find and load
at interpreter start (~0.4 ms each, ``python -X importtime``); its sections are marked ``# ---``.
"""

from __future__ import annotations

import _thread
import os
import sys
import time

from lora_otel._boot import core, jsonl, paths, stages
from lora_otel._boot.image import image_identity
from lora_otel._boot.words import duration

TYPE_CHECKING = False
if TYPE_CHECKING:  # never true at runtime: no typing import
    from collections.abc import Callable, Iterable, Mapping, MutableMapping
    from os import _ExecEnv, _ExecVArgs
    from types import CodeType, FrameType
    from typing import Any, NoReturn

    from _typeshed import FileDescriptorOrPath, StrOrBytesPath

_os_posix_spawn, _os_waitpid = getattr(os, "posix_spawn", None), os.waitpid
"""The interpreter's own, for starting the sidecar (`promote`, maybe long after the program
replaced them: gevent's ``monkey.patch_all()``)."""
_started_ns = 0
_born_ns = 0
"""When this process began to be traced: the preamble's start, or the fork (a forked child)."""
_exit_code: object = None
_exit_noted = False
"""Whether a ``SystemExit`` code was noted (`note_system_exit`; ``sys.exit()`` notes None)."""
_fork_parent_span: str | None = None
_argv: list[str] = []
"""The program's argv at start (``python -m x``: the module's name first), for `promote`."""
_how = ""
_execd: str | bool = False
"""This pid started once already and exec'd into this program: the registry of the job's journals
its first image opened (its sidecar's, which follows this journal too), or True when none."""
"""How lora_otel was activated (`start`'s argument)."""
_image: dict[str, object] | None = None
"""This process's `image_identity` at start; a forked child runs the same image."""


def parse_traceparent(value: str | None) -> tuple[str | None, str | None, bool]:
    """``(trace_id, parent_span_id, sampled)`` from a W3C ``traceparent``, or ``(None, None, True)``."""
    if not value:
        return None, None, True
    parts = value.strip().split("-")
    hexdigits = "0123456789abcdef"
    if (
        len(parts) >= 4
        and len(parts[0]) == 2
        and parts[0] != "ff"
        and len(parts[1]) == 32
        and len(parts[2]) == 16
        and len(parts[3]) == 2
        and all(c in hexdigits for c in parts[1] + parts[2] + parts[3] + parts[0])
        and parts[1] != "0" * 32
        and parts[2] != "0" * 16
    ):
        return parts[1], parts[2], bool(int(parts[3], 16) & 1)
    return None, None, True


JOB_ENV = "LORA_OTEL_JOB"
"""``<trace id>:<pid>`` of the job's top process, set by it for everything it starts."""


RANK_ENV = "LORA_OTEL_JOB_RANK"
"""The rank (``RANK``, ``SLURM_PROCID``, …) of the nearest process above that speaks on the terminal."""


def _new_rank(env: Mapping[str, str]) -> str | None:
    """This process's rank when a distributed launcher (torchrun, accelerate, Slurm) started it as
    a rank of its own: the job's workers, whose lines a log panel must show although a traced
    launcher started them. Their own children (DataLoader workers, helpers) inherit the same rank
    and stay quiet. None otherwise."""
    rank = rank_attrs(env).get("rank")
    if rank is None or env.get(RANK_ENV) == str(rank):
        return None
    return str(rank)


def is_child(env: Mapping[str, str], trace_id: str | None) -> bool:
    """Whether this process was started (directly or not) by a traced process of the same job: it
    continues the trace that the job's top process (`JOB_ENV`) began or continued, and is not that
    process itself (an ``exec`` keeps the pid). A ``TRACEPARENT`` from a launcher that is not
    traced (a Slurm script, a web UI's own trace per run) makes a top process."""
    top_trace, _, top_pid = (env.get(JOB_ENV) or "").partition(":")
    return bool(trace_id) and top_trace == trace_id and top_pid != str(os.getpid())


_WORKER_ARGV = ("multiprocessing", "multiprocess.", "loky", "joblib")
"""Words of a ``-c``/``-m`` argument that starts a worker of its parent: ``multiprocessing.spawn``'s
``spawn_main``, its resource tracker and fork server (and ``multiprocess``'s, datasets' fork of it),
joblib's loky workers."""


def is_worker(argv: list[str]) -> bool:
    """Whether this exec'd interpreter is a worker of its parent (`core.worker`): a
    ``--multiprocessing-fork`` argument, or a ``-c``/``-m`` argument naming `_WORKER_ARGV` — read
    from ``/proc/self/cmdline``, since ``sys.argv`` holds neither the code of ``-c`` nor the module
    of ``-m`` yet (``argv`` where there is no /proc)."""
    try:
        args = [os.fsdecode(a) for a in _read_proc_self("cmdline").split(b"\0")[:12]]
    except OSError:
        args = argv[:12]
    if "--multiprocessing-fork" in args or "--multiprocessing-fork" in argv:
        return True
    return any(
        args[i] in ("-c", "-m") and i + 1 < len(args) and any(w in args[i + 1] for w in _WORKER_ARGV)
        for i in range(len(args))
    )


def _read_proc_self(name: str) -> bytes:
    """``/proc/self/<name>`` in one read (``OSError`` where there is no /proc)."""
    fd = os.open("/proc/self/" + name, os.O_RDONLY)
    try:
        return os.read(fd, 65536)
    finally:
        os.close(fd)


def _process_start(now_ns: int) -> tuple[int, int | None]:
    """``(start_ns, start_ticks)``: when this process really started (Linux), else now.

    The kernel gives the start in clock ticks (10 ms), rounded down; the end of that tick is used,
    so that a child never seems to start before the span of its parent that forked it (the fork
    comes after that span's start record; the preamble runs well over a tick after the fork). The
    two clocks are read together: ``now_ns``, taken earlier, would put the start that much early.
    """
    try:
        data = _read_proc_self("stat")
        ticks = int(data[data.rindex(b")") + 2 :].split()[19])
        hz = os.sysconf("SC_CLK_TCK")
        since_boot_ns = time.clock_gettime_ns(time.CLOCK_BOOTTIME)
        wall_ns = core.now_ns()
        start = wall_ns - since_boot_ns + (ticks + 1) * 1_000_000_000 // hz
        return min(start, now_ns), ticks
    except Exception:  # noqa: BLE001 - not Linux, or /proc not mounted
        return now_ns, None


def _start_ticks() -> int | None:
    """This process's start in clock ticks since boot (``/proc/self/stat``), or None."""
    try:
        data = _read_proc_self("stat")
        return int(data[data.rindex(b")") + 2 :].split()[19])
    except Exception:  # noqa: BLE001 - not Linux, or /proc not mounted
        return None


def _float_env(name: str, default: float, say: bool = True, low: float = 0.0, high: float = float("inf")) -> float:
    """A non-negative number from the environment, ``0`` or between ``low`` and ``high``; a bad one
    is said in one line (unless not ``say``)."""
    raw = os.environ.get(name)
    if not raw:
        return default
    try:
        v = float(raw)
        if v < 0 or v != v or (v and not low <= v <= high):
            raise ValueError
        return v
    except ValueError:
        if say:
            bounds = " from %s to %s" % (low, high) if high != float("inf") else ""
            core.error_line("%s=%r is not a non-negative number%s; using %s" % (name, raw, bounds, default))
        return default


BEAT_S_LOW, BEAT_S_HIGH = 0.01, 3600.0
"""``LORA_OTEL_BEAT_S`` outside these is bad (the default, and one line): 1e-9 made the beat thread
spin (30% of a core), 1e308 overflowed its deadline and ended it with a traceback on stderr."""


def _service_name(argv: list[str]) -> str:
    name = os.environ.get("OTEL_SERVICE_NAME")
    if name:
        return name
    script = argv[0] if argv else ""
    if script in ("", "-c", "-m", "-"):
        return "python"
    base = os.path.basename(script)
    return base[:-3] if base.endswith(".py") else base


def _traceparent() -> str:
    """The W3C ``traceparent`` that makes this process's root span the parent of its children
    (those started inside a span get that span instead: ``hooks.child_env_changes``)."""
    return core.traceparent(core.root_id)


def _write_root_start(start_ns: int, parent: str | None, ticks: int | None, how: str, argv: list[str]) -> None:
    """The journal's first record: the root span ``process`` (see docs/journal.md)."""
    core.write(_root_record(start_ns, parent, ticks, how, argv))
    core.open_spans[core.root_id] = ("process", parent, 0, start_ns)


def _root_record(start_ns: int, parent: str | None, ticks: int | None, how: str, argv: list[str]) -> dict[str, Any]:
    """The root span's start record (`_write_root_start`)."""
    env = os.environ
    rec = {
        "v": core.FORMAT_VERSION,
        "k": "start",
        "ts": start_ns,
        "trace_id": core.trace_id,
        "span_id": core.root_id,
        "parent_id": parent,
        "name": "process",
        "pid": core.pid,
        "ppid": os.getppid(),
        "start_ticks": ticks,
        "pidns": paths.pid_namespace(),
        "image": _image if _image is not None else image_identity(),
        "sampled": core.sampled,
        "config": {
            "import_threshold_ms": core.import_threshold_ms,
            "quiet": core.quiet,
            "worker": core.worker,
            # the limits the job runs with, as given (`lora_otel._boot.limits` reads them)
            "stall_after": env.get("LORA_OTEL_STALL_AFTER"),
            "frozen_after": env.get("LORA_OTEL_FROZEN_AFTER"),
            # a beat that changes nothing is a record only every `beat_record_every` beats (the
            # others touch the file): how long the modification time may run ahead of the records
            "beat_s": core.beat_interval,
            "beat_record_every": core.BEAT_RECORD_EVERY,
            **({"beat_off": core.beat_off} if core.beat_off else {}),
        },
        "stderr": list(core.stderr_id) if core.stderr_id else None,
        "attrs": {
            "service.name": _service_name(argv),
            "process.pid": core.pid,
            "process.parent_pid": os.getppid(),
            "host.name": os.uname().nodename,  # (known at once: an alert raised before the first beat names it)
            "lora_otel.activation": how,
            **rank_attrs(env),  # (a rank is known from its first record: the job's views group by it)
        },
    }
    if core.stderr_path:
        rec["stderr_path"] = core.stderr_path
    if core._log_fd >= 0 and core.log_path:
        # The --log copy as opened now: the only file the watchdog may write the job's lines to
        # (a later attrs record naming another path is not believed: the process may have changed
        # hands, e.g. dropped root, since).
        rec["log"] = [core._log_dev, core._log_ino]
        rec["log_path"] = os.path.abspath(core.log_path)
    elif core._log_waits and core.log_path:
        # Not open yet (`core.wait_for_log`): the path is fixed now; its identity follows in a
        # root attrs record (``lora_otel.log.id``) when lora_otel opens it.
        rec["log_path"] = os.path.abspath(core.log_path)
        rec["log_pending"] = True
    return rec


def start(how: str) -> None:
    """Run the preamble once in this process; ``how`` names the activation (pth, run, -m, import)."""
    if (
        core.active
        or os.environ.get("LORA_OTEL_SIDECAR")
        or os.path.basename(sys.argv[0] if sys.argv else "") == "lora-otel"
    ):
        return  # lora_otel's own processes are not traced
    if not main_interpreter():
        return  # a subinterpreter runs .pth files too: the process is traced by its main interpreter
    try:
        _start(how)
    except Exception as e:
        if core.strict():
            raise
        core._stderr(
            "[lora-otel] not started: %s (the program goes on untraced)\n"
            % jsonl.printable("%s: %s" % (type(e).__name__, e))
        )


NOWHERE_FD = 2**31 - 1
"""A descriptor number no process can hold (see `NOWHERE`)."""


def main_interpreter() -> bool:
    """Whether this code runs in the process's main interpreter (not a subinterpreter).

    A subinterpreter (``_testcapi.run_in_subinterp``, ``_interpreters``/``concurrent.interpreters``,
    mod_wsgi's) runs ``site`` and so the ``.pth`` hook too; lora_otel there would be a second copy in
    the same process, and its beat thread, still running when the subinterpreter ends, makes
    ``Py_EndInterpreter`` abort the whole process ("not the last thread"). The check imports nothing
    and changes nothing. The main interpreter loads ``_signal`` before ``site`` (to install its
    handlers), a subinterpreter does not — and must not: importing it there replaced the main
    interpreter's SIGINT handling (no ``KeyboardInterrupt`` any more: CPython's test_signal). Then
    ``signal.set_wakeup_fd`` refuses (``ValueError``) anywhere but the main thread of the main
    interpreter before it looks at its argument, and in that thread fails on a descriptor number no
    process holds (``OSError``) before it sets anything (3.9 to 3.13): a ``ValueError`` in the
    process's main OS thread (thread id = pid) is another interpreter's. Without ``_signal`` (a
    subinterpreter, or an interpreter embedded without signal handling), or in another thread
    (``import lora_otel.auto`` there), 3.12+ asks ``_interpreters``/``_xxsubinterpreters``; 3.9-3.11
    take no ``_signal`` for a subinterpreter, and a thread for the main interpreter's."""
    signals = sys.modules.get("_signal")
    if signals is not None:
        try:
            old = signals.set_wakeup_fd(NOWHERE_FD)
        except ValueError:
            pass
        except Exception:  # noqa: BLE001 - OSError (EBADF): the main thread of the main interpreter
            return True
        else:  # (no process holds that number: never here) the old one back
            signals.set_wakeup_fd(old)
            return True
        get_native_id = getattr(_thread, "get_native_id", None)
        if get_native_id is not None and get_native_id() == os.getpid():
            return False
    if sys.version_info < (3, 12):
        return signals is not None
    for name in ("_interpreters", "_xxsubinterpreters"):
        try:
            from lora_otel._boot.stdlib import module

            interpreters = module(name)
        except ImportError:
            continue
        try:
            return bool(interpreters.get_current() == interpreters.get_main())
        except Exception:  # noqa: BLE001 - another version's API: cannot tell
            return signals is not None
    return signals is not None


def _absolute_dir(env: MutableMapping[str, str]) -> None:
    """A relative ``LORA_OTEL_DIR`` is taken from the working directory at start, and exported
    absolute: the children, wherever they run, write beside this process."""
    d = env.get("LORA_OTEL_DIR")
    if d and not os.path.isabs(d):
        try:
            env["LORA_OTEL_DIR"] = os.path.abspath(d)
        except OSError:  # the working directory is gone: the journal falls back to $TMPDIR
            pass


def _module_argv(argv: list[str]) -> list[str]:
    """``python -m torch.distributed.run ...``: at this point sys.argv is ``['-m', ...]`` with the
    module's name already removed; take it back from /proc/self/cmdline."""
    try:
        with open("/proc/self/cmdline", "rb") as f:
            cmdline = [os.fsdecode(a) for a in f.read().split(b"\0")]
        i = cmdline.index("-m")
        return [cmdline[i + 1], *argv[1:]]
    except (OSError, ValueError, IndexError):
        return argv


def _start(how: str) -> None:
    global _started_ns, _born_ns, _argv, _how, _image, _start_cwd, _execd
    t0 = core.perf_ns()
    now = core.now_ns()
    _started_ns = _born_ns = now
    core.active = True
    core.alone = how != "import lora_otel.auto"  # the .pth hook and `python -m lora_otel` run first
    core.pid = os.getpid()
    core.main_ident = _thread.get_ident()
    core.record_stderr()
    core.beat_off = beat_off_reason()
    argv = list(sys.argv)
    env = os.environ
    if argv[:1] == ["-m"]:
        argv = _module_argv(argv)
    _argv, _how = argv, how
    owner = env.get("LORA_OTEL_JOURNAL_OWNER", "")
    if owner and env.get("LORA_OTEL_JOURNAL") and owner != str(os.getppid()):
        # `lora-otel run` named an exact journal for its direct child only; below a shell or a
        # launcher that is not Python, the others write beside it.
        env.setdefault("LORA_OTEL_DIR", os.path.dirname(env["LORA_OTEL_JOURNAL"]))
        env.pop("LORA_OTEL_JOURNAL", None)
    env.pop("LORA_OTEL_JOURNAL_OWNER", None)
    _absolute_dir(env)

    # 1. First evidence: the root span on disk, then one line on stderr (not in a child).
    trace_id, parent, sampled = parse_traceparent(env.get("TRACEPARENT"))
    rank = _new_rank(env)
    child = is_child(env, trace_id)
    global _launched
    _launched = child
    core.quiet = child and rank is None
    core.worker = core.quiet and is_worker(argv)
    core.trace_id = trace_id or core.new_trace_id()
    if not core.quiet:
        env[JOB_ENV] = "%s:%d" % (core.trace_id, core.pid)
        if rank is not None:
            env[RANK_ENV] = rank
    core.sampled = sampled
    core.root_id = core.new_span_id()
    # The program's log file, only when it surely is one (README.md, "Your program's --log").
    core.log_path, log_source, log_value, log_problem = paths.choose_log(argv, env)
    if core.log_path and log_source.startswith("-") and not os.path.lexists(core.log_path):
        # Not created before the program runs: it may rotate an old log away first, or write data
        # there; lora_otel's lines wait until the program opens it or a job's warning needs them.
        core.wait_for_log(core.log_path, create=True)
    elif core.log_path and log_source.startswith("-") and paths.holds_lines(core.log_path):
        core.wait_for_log(core.log_path)  # maybe the program's input too: not before it writes there
    elif core.log_path:
        core.open_log(core.log_path, explicit=log_source == "LORA_OTEL_LOG")
    if core.log_path and (core._log_fd >= 0 or core._log_waits) and log_source.startswith("-"):
        core.log_option = log_source  # until the program's argparse shows what it is
    # Each process creates a journal of its own (beside --log the name is shared by every process
    # given that --log: first come keeps it, the others get a unique name beside it).
    global _disposable, _beside_log
    exact = bool(env.get("LORA_OTEL_JOURNAL"))
    chosen = paths.choose_journal_path(argv, env, core.pid, now / 1e9, log=core.log_path)
    # Only a journal lora_otel named in a directory of journals may go at a short run's exit: not
    # one a user named (LORA_OTEL_JOURNAL, `lora-otel run`'s), nor the one beside a --log.
    _disposable = not exact and chosen == paths.dir_journal_path(env, core.pid, now / 1e9)
    if _disposable:  # in a directory others can write to, a name nobody can prepare
        chosen = paths.unpredictable(chosen)
    _beside_log = (
        not exact and bool(core.log_path) and chosen == os.path.abspath(core.log_path or "") + paths.JOURNAL_SUFFIX
    )
    core.open_journal(chosen, exact=exact)
    if not child:  # the processes it starts write their warnings to its log file, or none
        env.pop(core.JOB_LOG_ENV, None)
        if core.log_path and (core._log_fd >= 0 or core._log_may_create):
            env[core.JOB_LOG_ENV] = os.path.abspath(core.log_path)
    elif not core.log_path and env.get(core.JOB_LOG_ENV):  # a quiet child, a rank: into the job's log
        core.log_bad_only = True
        job_log = env[core.JOB_LOG_ENV]
        if not os.path.lexists(job_log):  # not made yet: made when a warning of this child needs it
            core.log_path = job_log
            core.wait_for_log(job_log, create=True)
        else:
            core.open_log(job_log, job_log=True)
            if core._log_fd >= 0:
                core.log_path = job_log
    core.import_threshold_ms = _float_env("LORA_OTEL_IMPORT_THRESHOLD_MS", 5.0)
    # (a bad value is said below)
    core.beat_interval = _float_env("LORA_OTEL_BEAT_S", 1.0, False, BEAT_S_LOW, BEAT_S_HIGH) or 1.0
    start_ns, ticks = _process_start(now)
    _image = image_identity()
    _write_root_start(start_ns, parent, ticks, how, argv)
    supervised = owner == str(os.getppid()) and owner.isdigit()
    if supervised:
        # Started by `lora-otel run` (or doctor), which the kernel makes this process follow in death.
        core.span_attrs(core.root_id, {"lora_otel.supervisor.pid": int(owner)})
    # Its info lines reach the terminal once it is a job (at the latest its first beat): a process
    # that ends before prints nothing there. Without a beat thread nothing would show them later.
    core.hold_terminal = not core.beat_off
    if env.pop(EXEC_FROM_ENV, None) == str(core.pid):  # this pid started once already, then exec'd
        _execd = env.get(REGISTRY_ENV, "").partition(":")[2] or True
        if isinstance(_execd, str):  # the image before was a job (it had a sidecar): this one goes on
            core.hold_terminal = False
        core.info_line(
            "pid %d exec'd into %s (%s); journal: %s"
            % (core.pid, _exec_image(argv), how, core.journal_path or "(none)")
        )
    else:
        core.info_line("started pid %d (%s); journal: %s" % (core.pid, how, core.journal_path or "(none)"))
    if log_problem and not core.names_std_stream(log_value):
        core.info_line("%s: lora_otel's lines are not copied there (LORA_OTEL_LOG=PATH chooses a file)" % log_problem)
    bad_log_arg = paths.log_options(env)[1] if "LORA_OTEL_LOG_ARG" in env else ""
    if bad_log_arg:
        core.error_line(bad_log_arg)
    first_evidence_us = (core.perf_ns() - t0) // 1000

    # 2. The program's first import is traced from here on.
    from lora_otel._boot import hooks

    hooks.install_import_hook()

    # 3. arguments, propagation. What only a job needs (the environment self-check and its lines,
    # the stack dump, the sidecar) waits for `promote`.
    core.span_start("arguments", {}, parent_id=core.root_id, ts=start_ns, push=False)
    try:
        _start_cwd = os.getcwd()
    except OSError:
        _start_cwd = ""
    if "--multiprocessing-fork" in argv or argv[:1] == ["-c"]:
        # A spawned worker (DataLoader, multiprocessing), its resource tracker, `python -c ...`:
        # no script arguments to wait for, so no `arguments` span left open to look stalled.
        stages.arguments_done("multiprocessing worker" if "--multiprocessing-fork" in argv else "python -c")
    if env.get("LORA_OTEL_JOURNAL"):
        # An exact path is for this process only; its children write beside it.
        env.pop("LORA_OTEL_JOURNAL", None)
        if core.journal_path and not env.get("LORA_OTEL_DIR"):
            env["LORA_OTEL_DIR"] = os.path.dirname(core.journal_path)
    env["TRACEPARENT"] = _traceparent()
    if core.journal_path and env.get("LORA_OTEL_LIVE", "").strip().lower() not in _OFF:
        # Named now, while no other thread runs, so that `promote` (maybe in the beat thread) only
        # replaces its value: adding a variable reallocates the C environment under any thread
        # reading it (getenv from C is not locked).
        env.setdefault(REGISTRY_ENV, "")

    # 4. Exit, exceptions, fork, beat.
    _install_exit_hooks()
    _install_exec_hooks()
    if hasattr(os, "register_at_fork"):
        os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_parent, after_in_child=_after_fork_child)
    # a bad value: one line, now that the first evidence is out
    _float_env("LORA_OTEL_BEAT_S", 1.0, True, BEAT_S_LOW, BEAT_S_HIGH)
    if env.get("LORA_OTEL_STALL_AFTER") or env.get("LORA_OTEL_FROZEN_AFTER") or env.get("LORA_OTEL_NARRATE_S"):
        from lora_otel._boot import narrate  # a bad value is said now, at start (else: at the first beat)

        narrate.configure(env)
    core._promoter, core._settler, core._promotion_waiter = promote, _settle_child, _await_promotion
    # A process started to be watched is a job from its first instruction.
    if supervised:
        promote("lora-otel run")
    elif how != "LORA_OTEL=1":
        promote(how)
    else:
        loaded = [name for name in hooks.HEAVY_MODULES if name in sys.modules]
        if loaded:
            promote("%s already loaded" % loaded[0])
    core.alone = False
    _start_beat()
    launched_by = env.pop("LORA_OTEL_LAUNCHED_BY", None)  # a UI started this run as a trace of its own
    ui_trace, ui_span, _ = parse_traceparent(launched_by)
    if ui_trace:
        core.span_attrs(
            core.root_id, {"lora_otel.launched_by.trace_id": ui_trace, "lora_otel.launched_by.span_id": ui_span}
        )
    core.span_attrs(
        core.root_id,
        {
            "lora_otel.preamble.first_evidence_us": int(first_evidence_us),
            "lora_otel.preamble.duration_us": int((core.perf_ns() - t0) // 1000),
        },
    )


# --- promotion: a process becomes a job -------------------------------------------------------

REGISTRY_ENV = "LORA_OTEL_LIVE_REGISTRY"
"""`spawn.REGISTRY_ENV` (named here too: the preamble does not load `spawn` before a promotion)."""
_OFF = ("0", "false", "no", "off")
_promote_lock = _thread.allocate_lock()
_promote_lock_pid = 0
"""The process `_promote_lock` belongs to: a forked child makes its own at its first `promote`
(another thread may have held the parent's at the fork), not in the fork hook."""
_promoting = 0
"""The thread promoting this process now, 0 when none (see `_await_promotion`)."""
PROMOTION_WAIT_S = 2.0
"""The longest a thread starting a child process waits for another thread's promotion (normally
milliseconds: a spawn and a few records)."""


def promote(reason: str) -> None:
    """Make this process a job (``core.promoted = reason``), once: register the stack dump, start
    the sidecar (or join the one a parent started) and write what only a job needs — the process
    attributes, the environment self-check and its lines (``argv``, ``cwd``, ``environment``,
    ``env``, ``CUDA``), on the terminal too unless this process is `quiet`.

    Called at the first beat (the process lived a beat interval), at the first import of a heavy
    framework or of ``ctypes``/``cffi`` by the program's own code (`hooks.HEAVY_MODULES`), at CUDA
    initialisation, when a stage or ``training`` opens, and at start for a process started to be
    watched (``lora-otel run``, ``python -m lora_otel``, ``import lora_otel.auto``). A process
    that ends before any of these (``python -c pass``, ``pip --version``, a forked worker that
    exits at once) pays for none of it. Never blocks: a second thread calling while the first
    promotes returns at once. Never raises.
    """
    global _promote_lock, _promote_lock_pid, _promoting
    core.settle()  # a forked child's own state first
    if core.promoted or not core.active or os.getpid() != core.pid:
        return
    if _promote_lock_pid != core.pid:
        _promote_lock, _promote_lock_pid, _promoting = _thread.allocate_lock(), core.pid, 0
    if not _promote_lock.acquire(False):
        return
    try:
        if core.promoted:
            return
        _promoting = _thread.get_ident()
        core.promoted = reason or "promoted"
        core.show_held()  # the start-up lines that waited for the terminal: a job's from now on
        jsonl.use_c_escaper()  # a job may write many records: the C escaper is worth its load now
        core.ensure_journal()  # a forked child's, deferred until now
        core.lock_journal()  # retention leaves a job's journal alone while it runs, in any pid namespace
        # The watchdog's means first (a stage opening right after this, watched from its start).
        with core.fail_open("stack dump"):
            _register_stack_dump()
        with core.fail_open("live export"):
            _start_sidecar(os.environ)
        with core.fail_open("promotion"):
            core.span_attrs(core.root_id, _promotion_attrs())
        with core.fail_open("thread exceptions"):
            _watch_thread_errors()
        with core.fail_open("process description"):
            for attempt in range(3):
                try:  # (maybe in the beat thread, while the program's threads change os.environ)
                    _describe_process(_argv, _how)
                    break
                except RuntimeError:  # a dict changed size during its iteration: read it again
                    if attempt == 2:
                        raise
    finally:
        _promoting = 0
        _promote_lock.release()


def _await_promotion() -> None:
    """Wait, at most `PROMOTION_WAIT_S`, for another thread's promotion to finish: a child process
    started now must inherit the registry of the sidecar that promotion starts, or it would start
    a sidecar of its own (the beat thread promoting at the first beat while the main thread, whose
    stage found the process promoted already, starts a child). Called where a child process is
    started (`hooks.child_env_changes`); nothing to do, one test, otherwise."""
    mine = _promote_lock_pid == core.pid  # (a forked child's promotion is its own)
    if _promoting and _promoting != _thread.get_ident() and mine and _promote_lock.acquire(True, PROMOTION_WAIT_S):
        _promote_lock.release()


def _promotion_attrs() -> dict[str, object]:
    """``lora_otel.promoted``, and ``lora_otel.cgroup.oom_kills``: the memory cgroup's ``oom_kill``
    count now, the baseline a child's ``child exit`` event is compared with (`hooks.CHILD_EXIT`)."""
    from lora_otel._boot import cgroup

    attrs: dict[str, object] = {"lora_otel.promoted": core.promoted}
    with core.fail_open("promotion"):
        kills = cgroup.oom_kill_count(cgroup.memory_cgroup())
        if kills is not None:
            attrs["lora_otel.cgroup.oom_kills"] = kills
    return attrs


ENDPOINT_VARIABLES = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")


def _without_bad_endpoints(env: MutableMapping[str, str]) -> MutableMapping[str, str]:
    """``env`` without the OTLP endpoint variables that are not an http(s) URL, each said in one
    line at start (stderr and the ``--log`` file): the OTel SDK would only report "backend not
    accepting" in the sidecar's log. The value is not printed (it may hold a token pasted there)."""
    bad = []
    for name in ENDPOINT_VARIABLES:
        value = env.get(name, "").strip()
        scheme, sep, rest = value.partition("://")
        if value and not (sep and scheme.lower() in ("http", "https") and rest.split("/", 1)[0].strip()):
            bad.append(name)
    if not bad:
        return env
    env = dict(env)
    for name in bad:
        del env[name]
        core.error_line(
            "%s is not an http(s) URL (such as http://localhost:4318): ignored, no live export; "
            "the journal remains for `lora-otel inspect` and `lora-otel replay`" % name
        )
    return env


def _start_sidecar(env: MutableMapping[str, str]) -> None:
    """The job's sidecar, detached (see ``spawn``): the local watchdog, exporting live as well
    when an OTLP endpoint is configured. ``LORA_OTEL_LIVE=0``: none. Called by `promote`.

    The sidecar is started without a fork (``os.posix_spawn``: no fork hook runs). If it
    cannot start, one line says so and the program goes on; the journal remains for ``lora-otel replay``.
    """
    global _sidecar_pid, _sidecar_log, _sidecar_owner
    if not core.journal_path or env.get("LORA_OTEL_LIVE", "").strip().lower() in ("0", "false", "no", "off"):
        return  # turned off: not even the import (spawn.wanted says the same)
    inherited = env  # the process's own environment: its children must find this job's sidecar there
    env = _without_bad_endpoints(env)
    from lora_otel._boot import spawn

    with core.fail_open("live export"):
        joined = spawn.join_parent_sidecar(core.journal_path, env)
        if joined:  # one sidecar per job: the one a parent started follows this journal too
            core.span_attrs(core.root_id, {"lora_otel.sidecar.pid": joined})
            spawn.allow_tracing_by(joined)
            return
        pid, why = spawn.start(core.journal_path, core.pid, env, core.stderr_id, _os_posix_spawn, _os_waitpid)
        if pid is None:
            core.error_line(
                "%s off: %s; the journal remains for `lora-otel replay %s`"
                % ("live export" if spawn.exports(env) else "the watchdog", why, core.journal_path)
            )
        else:
            _sidecar_pid, _sidecar_log, _sidecar_owner = pid, spawn.opened_log, core.pid
            core.span_attrs(core.root_id, {"lora_otel.sidecar.pid": pid, "lora_otel.sidecar.log": _sidecar_log})
            inherited[spawn.REGISTRY_ENV] = "%d:%s" % (pid, spawn.opened_registry)
            spawn.allow_tracing_by(pid)  # Yama ptrace_scope 1: py-spy may read the stacks, no signal needed


def stacks_path(journal_path: str) -> str:
    """``run.log.otel.jsonl`` → ``run.log.stacks.txt``: where a stack request dumps Python stacks."""
    return paths.stem(journal_path) + ".stacks.txt"


STACK_SIGNAL_OFFSET = 10
"""The stack request signal is ``SIGRTMIN + 10`` (44 with glibc): a real-time signal, so never one
a scheduler or framework sends or handles (Slurm and Lightning use SIGUSR1/SIGUSR2/SIGTERM), above
the low real-time signals programs allocate first (``timer_create`` examples, SIGRTMIN and +1)
and far from SIGRTMAX (Valgrind's), and none of systemd's manager commands (+0..+7, +13..+16,
+20..+26) in case the process is a container's PID 1. ``LORA_OTEL_STACK_SIGNAL`` overrides it."""

_stacks_fd = -1
_stacks_id: tuple[int, int] = (0, 0)
_stacks_ask = ""
"""The file whose presence asks the beat thread for a stack dump (`_answer_stack_ask`); "" when none."""
_stacks_created: tuple[str, tuple[int, int]] | None = None
"""``(path, identity)`` of the stacks file when this process created it (not one it reused)."""


NOWHERE = 2**31 - 1
"""A descriptor number no process can hold (above any ``RLIMIT_NOFILE``: Linux caps ``nr_open`` at
2**31 - 64): a dump aimed at it writes nothing, takes no number, blocks on nothing, raises no SIGPIPE."""
_stacks_interim = -1
"""The stacks file's number when the program closed or reused it, while faulthandler aims at
`NOWHERE` (`_guard_stacks_fd`); -1 otherwise."""


def _guard_stacks_fd() -> None:
    """At every beat, first: faulthandler writes to a descriptor number, at a signal, with no check
    of its own; when that number no longer names the stacks file (the program closed it, and may
    have opened its own file there), aim the dump at once at `NOWHERE`, so it never lands in the
    program's file, and forget the number. The stacks file is reopened a settled second later
    (`_check_stacks_fd`): opening it now would take the lowest free number in the very moments the
    program opens its own. A stack request meanwhile dumps nothing (the exporting side checks the
    stacks file's recorded descriptor before it asks, and a stack-ask file waits)."""
    global _stacks_fd, _stacks_interim
    from lora_otel._boot import files

    if _stacks_fd < 0 or _stacks_interim >= 0 or files.same(_stacks_fd, _stacks_id):
        return
    _stacks_interim, _stacks_fd = _stacks_fd, NOWHERE
    if _stack_signal:
        import faulthandler

        faulthandler.register(_stack_signal, file=NOWHERE, all_threads=True, chain=False)


def _check_stacks_fd() -> None:
    """At each settled beat: when the stacks file's number no longer names it (`_guard_stacks_fd`
    aimed the dump at `NOWHERE` meanwhile), register the dump again on a reopened stacks file."""
    global _stacks_fd, _stacks_id, _stacks_interim
    from lora_otel._boot import files

    if _stacks_fd < 0 or (_stacks_interim < 0 and files.same(_stacks_fd, _stacks_id)):
        return
    old = _stacks_interim if _stacks_interim >= 0 else _stacks_fd
    _stacks_interim, _stacks_fd = -1, -1
    _register_stack_dump()  # (not reopened: faulthandler stays aimed where it was)
    core.error_line(
        "the stacks file's descriptor %d was closed or reused by the program; stack dumps go to "
        "a reopened stacks file (descriptor %d)" % (old, _stacks_fd)
    )


_stack_signal = 0
"""The signal whose handler (faulthandler) lora_otel installed in this process; 0 when none."""
_stack_signal_warned = False
_faulthandler_signal = 0
"""The signal faulthandler.register was called on (kept when lora_otel gives up its claim)."""


USER_SIGNALS = (10, 12)
"""SIGUSR1, SIGUSR2: with the real-time signals, the only ones ``LORA_OTEL_STACK_SIGNAL`` may name.
Any other has a meaning the stack handler would take away: with 15 (SIGTERM), 2 (SIGINT) or 1
(SIGHUP) a running job survived ``kill`` and Ctrl-C; 17 (SIGCHLD) reached faulthandler at every
child's end."""


def stack_signal(env: Mapping[str, str] | None = None) -> int:
    """The stack request signal: ``LORA_OTEL_STACK_SIGNAL`` (a number) or ``SIGRTMIN + 10``; 0 where
    the platform has no real-time signals. A bad value: one line, and the default."""
    global _stack_signal_warned
    import _signal  # type: ignore[import-not-found]  # no stub: the C half of signal (no enum to build)

    rtmin, rtmax = getattr(_signal, "SIGRTMIN", 0), getattr(_signal, "SIGRTMAX", 0)
    default = rtmin + STACK_SIGNAL_OFFSET if rtmin and rtmin + STACK_SIGNAL_OFFSET <= rtmax else 0
    raw = (os.environ if env is None else env).get("LORA_OTEL_STACK_SIGNAL", "").strip()
    if not raw:
        return default
    try:
        n = int(raw)
        if not (1 <= n <= (rtmax or 64)) or (n not in USER_SIGNALS and not (rtmin and n >= rtmin)):
            raise ValueError
        return n
    except ValueError:
        if not _stack_signal_warned:
            _stack_signal_warned = True
            core.error_line(
                "LORA_OTEL_STACK_SIGNAL=%r is not a signal number lora_otel can use (SIGUSR1, SIGUSR2 or "
                "a real-time one, %d-%d); using %d" % (raw, rtmin, rtmax or 64, default)
            )
        return default


def _register_stack_dump() -> None:
    """The stack request signal (`stack_signal`) → ``faulthandler`` writes every thread's Python
    stack beside the journal.

    faulthandler's handler runs in C without the GIL, so it works on a frozen process (GIL held
    in native code) too: the exporting side sends the signal when it declares a stall, after
    checking the facts recorded here (root attributes ``lora_otel.stacks.*``: the signal, the file,
    its descriptor and identity). Skipped when the program already handles that signal.
    """
    global _stacks_fd, _stacks_id, _stack_signal, _faulthandler_signal
    import _signal
    import faulthandler

    _stack_signal = 0
    signum = stack_signal()
    if not core.journal_path or not signum:
        return
    if _signal.getsignal(signum) is not _signal.SIG_DFL:  # theirs: a handler, SIG_IGN, or set from C (None)
        core.span_attrs(
            core.root_id,
            {
                "lora_otel.stacks.signal": signum,
                "lora_otel.stacks.off": "the program handles signal %d itself" % signum,
            },
        )
        return
    from lora_otel._boot import files

    global _stacks_created
    path = stacks_path(core.journal_path)
    try:
        fd, path, created = files.create_sibling(path)  # created new, or safely this user's; no symlink
        fd = files.move_high(fd)
        ident = files.identity(fd)
    except OSError as e:
        core.error_line("cannot open stack dump file %s (%s); no stack dumps on demand" % (path, e.strerror or e))
        return
    if _stacks_fd >= 0 and files.same(_stacks_fd, _stacks_id):  # else the number may be the program's now
        try:
            os.close(_stacks_fd)
        except OSError:
            pass
    global _stacks_ask
    _stacks_fd, _stacks_id = fd, ident
    _stacks_created = (path, ident) if created else None
    _stacks_ask = ask_path(path)
    faulthandler.register(signum, file=fd, all_threads=True, chain=False)
    _stack_signal = _faulthandler_signal = signum
    core.span_attrs(
        core.root_id,
        {
            "lora_otel.stacks.path": path,
            "lora_otel.stacks.ask": _stacks_ask,
            "lora_otel.stacks.signal": signum,
            "lora_otel.stacks.fd": fd,
            "lora_otel.stacks.file": list(ident),
        },
    )


def ask_path(stacks: str) -> str:
    """``run.log.stacks.txt`` → ``run.log.stacks.<random>.ask``: the file a watchdog creates to ask
    the beat thread for a stack dump (`_answer_stack_ask`); the beat removes it when the dump is
    written. The random part makes it a name only the journal (0600) tells: another user cannot
    put a request there, even in a shared directory where the job could not remove theirs."""
    return "%s.%s.ask" % (stacks[:-4] if stacks.endswith(".txt") else stacks, os.urandom(4).hex())


MAX_DUMP_FRAMES = 100
"""Frames written per thread, as faulthandler does (then ``  ...``)."""


def _answer_stack_ask() -> None:
    """Each beat: when a watchdog has created the ask file (`ask_path`), write every thread's
    Python stack to the stacks file, in faulthandler's format (``Current thread`` is the main
    thread), then remove the ask file: that is the answer the watchdog waits for.

    The dump is made here, by Python code holding the GIL, so no thread's frames change under it.
    faulthandler's signal handler walks the frames without the GIL from a signal, and a thread
    running Python meanwhile (the beat at its own work) made it crash the process with SIGSEGV;
    the signal is left for a frozen process, whose beat cannot answer and whose frames stand still.
    One ``stat`` per beat when nobody asks.

    Only a request of this user's is obeyed, and only a regular file with one name (``lstat``, no
    symlink followed): anything else at that name (another user's file, a hard link, a FIFO) is
    neither answered nor removed nor opened."""
    ask = _stacks_ask
    if not ask or _stacks_fd < 0 or _stacks_interim >= 0:  # (meanwhile the ask waits for the stacks file)
        return
    try:
        st = os.lstat(ask)
    except OSError:
        return
    if st.st_mode & 0o170000 != 0o100000 or st.st_nlink != 1 or st.st_uid != os.geteuid():
        return  # not a watchdog's request: a stranger cannot make this process dump, nor remove it
    from lora_otel._boot import files

    try:
        if files.same(_stacks_fd, _stacks_id):  # (`_check_stacks_fd` ran just before)
            data = _stack_dump().encode("utf-8", "backslashreplace")
            while data:
                data = data[os.write(_stacks_fd, data) :]
    finally:
        try:
            os.unlink(ask)
        except OSError:
            pass


LOCALS_FRAMES = 3
"""Innermost frames of each thread whose simple locals (and the globals their code names) the
beat's dump adds (`_simple_locals`)."""
LOCALS_MAX = 16
"""Locals (and ``self``'s attributes) written per frame."""
LOCAL_CHARS = 300
"""Characters of a local's value written."""


def _simple_locals(frame: Any) -> list[str]:
    """``    local path = '/x/y.lock'`` lines: the frame's locals of simple types (str, bytes, int,
    float, bool, a pathlib path) and those attributes of ``self`` (its ``__dict__``, read through
    the C slot of ``object``'s layout only), and the module globals of those types its code names (a
    ``<module>`` frame: only those), so that what a poll loop polls can be read (the sidecar's
    `lora_otel.analysis.pollfacts`): py-spy shows no attribute. No code of the program runs: names
    and values of exact types only (a ``str`` subclass's ``__str__``/``__format__``/``__repr__`` is
    the program's; ``type(...) is``, never ``==`` or ``in`` on types, whose metaclass may define
    ``__eq__``), no property, no ``__getattr__``. Secret-named values are left out, long ones cut,
    each value redacted; an int too long to print is ``<int of N bits>``. Each value is guarded on
    its own (``BaseException``: a ``SystemExit`` raised anyhow stays here): one that fails is left
    out, the others stay. Fail-open: [] on any other error."""
    from lora_otel._boot.redact import is_secret_name, redact_value

    paths = sys.modules.get("pathlib")
    path_types = tuple(
        t
        for t in (getattr(paths, n, None) for n in ("PosixPath", "PurePosixPath", "WindowsPath", "PureWindowsPath"))
        if isinstance(t, type)
    )

    def said(name: object, value: object) -> str:
        try:
            if type(name) is not str or is_secret_name(name):
                return ""
            kind = type(value)
            if any(kind is t for t in path_types):
                value = object.__getattribute__(value, "__fspath__")()  # (pathlib's own method, not a subclass's)
                kind = type(value)
            if kind is bytes:
                value = value[:LOCAL_CHARS].decode("utf-8", "replace")  # type: ignore[index]
                kind = str
            if kind is str:
                return "    local %s = %s\n" % (name, repr(redact_value(value[:LOCAL_CHARS])))  # type: ignore[index]
            if kind is int and value.bit_length() > 1000:  # type: ignore[attr-defined]
                # (printing costs quadratic time and raises past sys.get_int_max_str_digits())
                return "    local %s = <int of %d bits>\n" % (name, value.bit_length())  # type: ignore[attr-defined]
            if kind is int or kind is float or kind is bool:
                return "    local %s = %s\n" % (name, repr(value))
        except BaseException:  # noqa: BLE001 - this value only; the beat and the program go on
            pass
        return ""

    out: list[str] = []
    try:
        code = frame.f_code
        # (a module's code has the module's globals for locals: only the names it uses, below)
        local = {} if code.co_name == "<module>" else frame.f_locals
        if type(local) is not dict:  # (3.13's proxy: a plain dict of it)
            local = dict(local)
        for name, value in list(local.items())[: LOCALS_MAX * 2]:
            if type(name) is str and name == "self":
                attrs = _instance_dict(value)
                if attrs is not None:
                    out.extend(said("self." + k, v) for k, v in list(attrs.items())[:LOCALS_MAX] if type(k) is str)
                continue
            out.append(said(name, value))
        # The module globals the code names (``while os.path.exists(PIDFILE)``), where no local hides them.
        glob = frame.f_globals
        if type(glob) is dict:
            for name in code.co_names[: LOCALS_MAX * 4]:
                try:
                    if type(name) is str and name not in local and name in glob:
                        out.append(said(name, glob[name]))
                except BaseException:  # noqa: BLE001 - this name only
                    pass
    except BaseException:  # noqa: BLE001 - fail open: the stack without locals
        return []
    return [line for line in out if line][:LOCALS_MAX]


def _instance_dict(value: object) -> dict[str, Any] | None:
    """``value.__dict__`` when it is the plain C slot (a ``getset_descriptor`` found on its type's
    MRO) holding an exact dict; None otherwise (a class defining its own ``__dict__`` property runs
    program code to answer). Reads types through ``type``'s own descriptors: no metaclass code."""
    try:
        mro = type.__dict__["__mro__"].__get__(type(value))
        type_dict = type.__dict__["__dict__"]
        for base in mro:
            found = type_dict.__get__(base).get("__dict__")
            if found is None:
                continue
            if type(found) is not type(type_dict):  # (not a getset_descriptor)
                return None
            attrs = found.__get__(value)
            return attrs if type(attrs) is dict else None
    except BaseException:  # noqa: BLE001 - no attributes then
        pass
    return None


def _stack_dump() -> str:
    """Every thread's Python stack but the calling one's (the beat), innermost first, as
    faulthandler writes it: ``Current thread 0x… (most recent call first):`` for the main thread,
    ``Thread 0x…`` for the others, ``  File "…", line N in f`` lines, a blank line after each."""
    from lora_otel._boot.where import other_interpreters

    if other_interpreters():  # (reading their threads' frames races them: `where.other_interpreters`)
        return "Python stacks not read: the program runs interpreters of its own\n\n"
    me = _thread.get_ident()
    frames = sys._current_frames()
    out: list[str] = []
    for ident in sorted(frames, key=lambda t: t != core.main_ident):
        if ident == me:
            continue
        title = "Current thread" if ident == core.main_ident else "Thread"
        out.append("%s 0x%016x (most recent call first):\n" % (title, ident))
        frame: Any = frames[ident]
        n = 0
        while frame is not None and n < MAX_DUMP_FRAMES:
            code, line = frame.f_code, frame.f_lineno
            where = (code.co_filename[:500], "???" if line is None else line, code.co_name)
            out.append('  File "%s", line %s in %s\n' % where)
            if n < LOCALS_FRAMES:
                out.extend(_simple_locals(frame))
            frame, n = frame.f_back, n + 1
        if frame is not None:
            out.append("  ...\n")
        out.append("\n")
    return "".join(out)


def _kernel_disposition(signum: int) -> str:
    """``caught``, ``ignored`` or ``default``: this process's disposition for ``signum`` as the
    kernel has it (``SigCgt``/``SigIgn`` of ``/proc/self/status``); ``""`` when unreadable."""
    try:
        data = _read_proc_self("status")
        masks = {}
        for name in (b"SigCgt:", b"SigIgn:"):
            i = data.index(name)
            masks[name] = int(data[i + 7 : data.index(b"\n", i)].strip(), 16) >> (signum - 1) & 1
    except (OSError, ValueError):
        return ""
    return "caught" if masks[b"SigCgt:"] else "ignored" if masks[b"SigIgn:"] else "default"


def _check_stack_signal() -> None:
    """Each beat: is faulthandler still the handler of the stack request signal?

    - The program installed its own Python handler for it (``signal.signal``, which replaced
      faulthandler's): say so once in the journal (``lora_otel.stacks.off``) and claim it no more;
      the sidecar reads that and never signals.
    - It was set back to the default from Python (``signal.getsignal`` still says SIG_DFL but the
      kernel shows no handler: PyTorch Lightning's teardown restores every signal to what
      ``getsignal`` reported, SIG_DFL, at the end of each ``fit``): the program did not take it,
      it is as it was when lora_otel registered, so lora_otel registers again.
    """
    global _stack_signal
    signum = _stack_signal
    if not signum:
        return
    import _signal

    if _signal.getsignal(signum) is not _signal.SIG_DFL:
        _stack_signal = 0
        core.span_attrs(
            core.root_id, {"lora_otel.stacks.off": "the program installed its own handler for signal %d" % signum}
        )
    elif _stacks_fd >= 0 and _kernel_disposition(signum) == "default":
        import faulthandler

        faulthandler.unregister(signum)
        faulthandler.register(signum, file=_stacks_fd, all_threads=True, chain=False)


_RANK_VARIABLES = (
    # attribute, then the variables that carry it: torchrun/accelerate/deepspeed, then Slurm, then Open MPI
    ("rank", ("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK")),
    ("local_rank", ("LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK")),
    ("world_size", ("WORLD_SIZE", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE")),
)


def rank_attrs(env: Mapping[str, str]) -> dict[str, int]:
    """``rank``, ``local_rank``, ``world_size`` from the launcher's variables, where set and numeric."""
    out: dict[str, int] = {}
    for attr, names in _RANK_VARIABLES:
        for name in names:
            value = env.get(name, "").strip()
            if value.isdigit():
                out[attr] = int(value)
                break
    return out


_start_cwd = ""
"""The working directory at start ("" when it was deleted): the beat shows paths under it relative to it."""


def _describe_process(argv: list[str], how: str, terminal: bool = True) -> None:
    """The process attributes and the environment self-check, on the root span, and their lines
    (``argv``, ``cwd``, ``environment``, ``env``, ``CUDA``): at `promote`, or at an early exit that
    is not normal (then for the journal and the ``--log`` file only: ``terminal=False``)."""
    from lora_otel._boot import envfacts, redact

    say = core.info_line if terminal else core.note_line
    clean_argv = redact.redact_argv(argv)
    exe = sys.executable or ""
    cwd = _start_cwd or "(deleted)"
    u = os.uname()
    attrs: dict[str, object] = {
        "process.executable.path": exe,
        "process.executable.name": os.path.basename(exe),
        "process.command": clean_argv[0] if clean_argv else "",
        "process.command_args": [exe, *clean_argv],
        "process.parent_pid": os.getppid(),
        "process.working_directory": redact.redact_value(cwd),
        "host.name": u.nodename,
        "lora_otel.journal.path": core.journal_path,
    }
    try:
        import pwd

        attrs["process.owner"] = pwd.getpwuid(os.getuid()).pw_name
    except Exception:  # noqa: BLE001 - no passwd entry in containers
        pass
    if core.log_path:
        attrs["lora_otel.log.path"] = core.log_path
    facts = envfacts.collect(os.environ, redact.redact_env)
    attrs.update(facts)
    core.span_attrs(core.root_id, attrs)
    say("argv: %s" % " ".join(clean_argv))
    if _execd:  # said at this pid's first start already: the journal keeps them, the terminal not twice
        say = core.note_line
    say("cwd: %s" % attrs["process.working_directory"])
    for line in envfacts.lines(facts):
        say(line)


# --- exit -----------------------------------------------------------------------------------


def _install_exit_hooks() -> None:
    """An atexit handler that writes the exit record, and what lets it know the real outcome.

    The outcome is read when the interpreter exits, not kept from hooks a program may replace: an
    uncaught exception is left in ``sys.last_exc``/``sys.last_value`` by the interpreter itself,
    whatever ``sys.excepthook`` the program installed (rich, many CLIs). A ``SystemExit`` leaves
    nothing there, so its code is noted where it is raised: ``sys.exit`` and the ``exit()``/
    ``quit()`` builtins are wrapped (they pass through unchanged), and on Python 3.12+ a
    ``sys.monitoring`` tool sees every ``SystemExit`` of the main thread, ``raise SystemExit(n)``
    included, and forgets one that was caught.
    """
    import atexit

    atexit.register(_on_exit)
    orig_exit = sys.exit

    def exit(code: str | int | None = None) -> NoReturn:  # noqa: A001 - mirrors sys.exit
        note_system_exit(code)
        orig_exit(code)

    exit.__wrapped__ = orig_exit  # type: ignore[attr-defined]
    sys.exit = exit
    quitter = getattr(sys.modules.get("_sitebuiltins"), "Quitter", None)
    orig_call = getattr(quitter, "__call__", None)  # noqa: B004 - the method, to wrap it
    if quitter is not None and orig_call is not None and not hasattr(orig_call, "__wrapped__"):
        # the exit() and quit() builtins raise SystemExit themselves; named as the method it replaces
        def __call__(self: object, code: object = None) -> object:  # noqa: N807
            note_system_exit(code)
            return orig_call(self, code)

        __call__.__wrapped__ = orig_call  # type: ignore[attr-defined]
        quitter.__call__ = __call__
    _watch_system_exit()
    _find_main_frame()


# --- the exit stage -------------------------------------------------------------------------

EXIT_STAGE = "exit"
_exit_began: tuple[int, int, int] | None = None
"""(when, pid, steps then) of this job's interpreter exit: set when ``threading._shutdown`` begins
in the main thread (`_watch_exit`)."""
_exit_sid: str | None = None
"""The open ``exit`` span's id, once the beat opened it."""
_exit_done = False
"""The exit stage is over for this process: ended, or work went on after the main thread returned."""
_exit_watched = 0
"""The pid in which ``threading._shutdown`` is wrapped (0: not yet)."""


def _watch_exit() -> None:
    """In a job, once ``threading`` is loaded: wrap ``threading._shutdown``, which the interpreter
    calls as it exits, before the atexit handlers, to join the non-daemon threads (and run
    ``concurrent.futures``' exit joins). From then on the process is in its ``exit`` stage: the
    threads' joins and the program's atexit handlers (a telemetry flush, a logger's upload, a
    process group torn down) run inside it, and ours, registered first, runs last and ends it.

    The wrapper only notes the time; the beat opens the span (`_exit_tick`) once the exit has lasted
    a beat's interval, so an exit quicker than that writes nothing. Never raises."""
    global _exit_watched
    threading = sys.modules.get("threading")
    if _exit_watched == os.getpid() or threading is None:
        return
    shutdown = getattr(threading, "_shutdown", None)
    if not callable(shutdown) or getattr(shutdown, "_lora_otel", False):
        _exit_watched = os.getpid()
        return

    def _shutdown() -> object:
        global _exit_began
        if (
            _exit_began is None
            and core.promoted
            and core.active
            and os.getpid() == core.pid
            and _thread.get_ident() == core.main_ident
        ):
            _exit_began = (core.now_ns(), core.pid, core.steps)
        return shutdown()

    _shutdown._lora_otel = True  # type: ignore[attr-defined]
    _shutdown.__wrapped__ = shutdown  # type: ignore[attr-defined]
    threading._shutdown = _shutdown  # type: ignore[attr-defined]
    _exit_watched = os.getpid()


THREAD_EXCEPTION = "thread exception"
"""The root span event for a thread of the program that ended by an uncaught exception
(`_watch_thread_errors`): ``thread.name``, ``exception.type``, ``exception.message`` (redacted,
clipped), and where it was raised (``code.filepath``, ``code.lineno``, ``code.function``)."""
_thread_errors_watched = 0
"""The pid in which ``threading.excepthook`` is wrapped (0: not yet)."""


def _watch_thread_errors() -> None:
    """In a job, once ``threading`` is loaded: wrap ``threading.excepthook`` (whatever it is now:
    the default or the program's own), so that a thread ending by an uncaught exception is journaled
    (`THREAD_EXCEPTION`) before the hook it wraps runs — a consumer left waiting on a queue that
    thread filled is then told why. The wrapped hook always runs, with the same argument; a program
    that installs its own hook later replaces the wrapper (and is not journaled). Never raises."""
    global _thread_errors_watched
    threading = sys.modules.get("threading")
    if _thread_errors_watched == os.getpid() or threading is None:
        return
    _thread_errors_watched = os.getpid()
    hook = getattr(threading, "excepthook", None)
    if not callable(hook) or getattr(hook, "_lora_otel", False):
        return

    from lora_otel._boot import redact  # now, in the beat: the hook must not import (another thread may hold that lock)

    def excepthook(args: Any) -> object:
        with core.fail_open("thread exception"):
            _journal_thread_error(args, redact.redact_text)
        return hook(args)

    excepthook._lora_otel = True  # type: ignore[attr-defined]
    excepthook.__wrapped__ = hook  # type: ignore[attr-defined]
    # named as the hook it wraps: a program (CPython's test__all__ on 3.9) that reads where
    # `threading.excepthook` comes from sees the module it came from
    for name in ("__module__", "__name__", "__qualname__", "__doc__"):
        try:
            setattr(excepthook, name, getattr(hook, name))
        except (AttributeError, TypeError):
            pass
    threading.excepthook = excepthook  # type: ignore[attr-defined]


def _journal_thread_error(args: Any, scrub: Callable[[str], str]) -> None:
    exc_type, exc, tb, thread = (getattr(args, k, None) for k in ("exc_type", "exc_value", "exc_traceback", "thread"))
    if not (core.active and core.promoted and os.getpid() == core.pid) or exc_type is None:
        return
    if issubclass(exc_type, SystemExit):  # threading ends such a thread quietly: not an error
        return
    name = getattr(exc_type, "__name__", "exception")
    said = str(exc) if exc is not None else ""
    attrs: dict[str, object] = {
        "thread.name": str(getattr(thread, "name", "") or ""),
        "exception.type": name,
        "exception.message": scrub(said[:300]),
    }
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    if tb is not None:
        code = tb.tb_frame.f_code
        attrs.update({"code.filepath": code.co_filename, "code.lineno": tb.tb_lineno, "code.function": code.co_name})
    core.span_event(core.root_id, THREAD_EXCEPTION, attrs)


MAX_EXIT_THREADS = 8


def _exit_tick() -> None:
    """Each beat once the interpreter exits: open the ``exit`` span (started when the exit began,
    with the non-daemon threads still alive and the atexit handlers the program registered), or
    end it as not an exit after all — a thread the main one left made an optimizer step or opened
    a stage (a program whose work runs in its own threads after the main thread returned)."""
    global _exit_sid, _exit_done
    began = _exit_began
    if began is None or _exit_done or began[1] != core.pid:
        return
    if _exit_sid is None:
        if core.now_ns() - began[0] < core.beat_interval * 1e9:
            return  # an exit shorter than a beat is no stage, wherever the beat fell in it
        threading = sys.modules.get("threading")
        alive = []
        with core.fail_open("exit stage"):
            main = threading.main_thread() if threading is not None else None
            for t in threading.enumerate() if threading is not None else ():
                if t is not main and not t.daemon and t.is_alive():
                    alive.append(str(t.name)[:80])
        attrs: dict[str, object] = {"lora_otel.exit.threads": alive[:MAX_EXIT_THREADS]}
        count = getattr(sys.modules.get("atexit"), "_ncallbacks", None)
        if callable(count):
            with core.fail_open("exit stage"):
                attrs["lora_otel.exit.atexit_handlers"] = max(int(count()) - 1, 0)  # (ours is one)
        stages.arguments_done("none seen")
        _exit_sid = core.span_start(EXIT_STAGE, attrs, parent_id=core.root_id, ts=began[0], push=False)
        return
    later = [info for sid, info in core.open_spans.items() if sid != _exit_sid and info[3] > began[0]]
    if core.steps != began[2] or later:
        _exit_done = True
        if _exit_sid in core.open_spans:
            core.span_end(_exit_sid, "ok", attrs={"lora_otel.exit.work_went_on": True})
        core.note_line("the main thread has returned, but the program's threads go on working: not its exit yet")


def note_system_exit(code: object, *, final: bool = False) -> None:
    """Remember the code of a ``SystemExit`` about to be raised (the exit record gives it).

    Only in the main thread: ``sys.exit`` in another thread ends that thread, not the process.
    ``final``: the caller knows this is how the program ends (``python -m lora_otel``'s runner)."""
    global _exit_code, _exit_noted, _exit_noted_at
    if _thread.get_ident() != core.main_ident:  # the thread that ran the preamble
        return
    _exit_code, _exit_noted = code, True
    _exit_noted_at = None
    main = _main_frame  # 3.9-3.11: where the __main__ code was when it was called (`_noted_exit_ended`)
    if main is not None and not final:
        with core.fail_open("exit note"):
            frame: FrameType | None = sys._getframe(1)
            while frame is not None and frame is not main:
                frame = frame.f_back
            if frame is not None:
                _exit_noted_at = frame.f_lasti


_exit_noted_at: int | None = None
"""3.9-3.11: the ``__main__`` frame's last instruction when the noted ``sys.exit`` was called, if
it was on the stack then."""


def _noted_exit_ended() -> bool:
    """3.9-3.11: whether the noted ``sys.exit`` may be what ended the ``__main__`` code: that code
    stopped where it was when ``sys.exit`` was called (a ``sys.exit`` caught there, with the code
    going on to end by another ``SystemExit``, does not give the code; hostile trial)."""
    main = _main_frame
    if _exit_noted_at is None or main is None or main.f_lasti == _exit_noted_at:
        return True
    with core.fail_open("exit note"):
        return _left_through_handler(main.f_code, _exit_noted_at, main.f_lasti)
    return False


def _left_through_handler(code: CodeType, noted: int, lasti: int) -> bool:
    """3.9-3.11: whether an exception raised at offset ``noted`` of ``code`` ended the frame at the
    ``RERAISE`` at ``lasti`` by the handler of the innermost ``try``/``with`` around ``noted``
    (``try: main() except BrokenPipeError: ...``, as ``json.tool`` has: the handler runs, the
    exception goes on). A later ``SystemExit`` that left by another ``try``'s handler does not."""
    from lora_otel._boot.stdlib import module

    opcode = module("opcode")
    ops = code.co_code
    reraise = opcode.opmap["RERAISE"]
    if not (0 <= lasti < len(ops) and ops[lasti] == reraise):
        return False
    table = getattr(code, "co_exceptiontable", None)
    if table is not None:  # 3.11: the exception table routes each handler to its cleanup
        entries = _exception_table(table)
        around = [target for start, end, target in entries if start <= noted < end]
        if not around:
            return False
        handler = [target for start, end, target in entries if start <= around[0] < end]
        here = [target for start, end, target in entries if start <= lasti < end]
        return bool(handler) and handler == here
    # 3.9/3.10: the innermost SETUP_FINALLY/SETUP_WITH before ``noted`` whose handler is after it;
    # that handler runs up to where its try's normal path jumps to.
    scale = 2 if sys.version_info >= (3, 10) else 1  # 3.10's jump arguments count instructions
    setups = (opcode.opmap["SETUP_FINALLY"], opcode.opmap.get("SETUP_WITH", -1))
    instructions: list[tuple[int, int, int]] = []
    ext = 0
    for off in range(0, len(ops), 2):
        op, arg = ops[off], ops[off + 1] | ext
        ext = (arg << 8) if op == opcode.EXTENDED_ARG else 0
        instructions.append((off, op, arg))
    tries = [(off, off + 2 + arg * scale) for off, op, arg in instructions if op in setups]
    inner = [(off, target) for off, target in tries if off < noted < target]
    if not inner:
        return False
    begins: int = max(inner)[1]
    end = -1
    for off, op, arg in instructions:
        if off == begins - 2:  # how the try's normal path leaves: past the handler, or returns
            if op == opcode.opmap["JUMP_FORWARD"]:
                end = off + 2 + arg * scale
            elif op == opcode.opmap["JUMP_ABSOLUTE"]:
                end = arg * scale
            elif op == opcode.opmap["RETURN_VALUE"]:  # 3.10: the try ends the code
                end = len(ops)
    return begins <= lasti < end


def _exception_table(table: bytes) -> list[tuple[int, int, int]]:
    """3.11's ``co_exceptiontable``: (start, end, handler) byte offsets of each entry."""
    out: list[tuple[int, int, int]] = []
    pos = 0

    def varint() -> int:
        nonlocal pos
        byte = table[pos]
        pos += 1
        value = byte & 63
        while byte & 64:
            byte = table[pos]
            pos += 1
            value = (value << 6) | (byte & 63)
        return value

    while pos < len(table):
        start = varint() * 2
        end = start + varint() * 2
        target = varint() * 2
        varint()  # depth and lasti
        out.append((start, end, target))
    return out


_main_frame: FrameType | None = None
"""Python 3.9-3.11: the frame of the ``__main__`` module's code (`_find_main_frame`). Its last
instruction once it is over tells a normal end (the code's final return) from one by an exception
that no excepthook saw: a ``SystemExit`` the program raised itself, whose code the interpreter
keeps from exit handlers (`main_ended`)."""
_RETURN_VALUE = 83
"""The opcode a module's code ends with on Python 3.9-3.11."""


def _is_main_code(frame: FrameType) -> bool:
    return frame.f_code.co_name == "<module>" and frame.f_globals.get("__name__") == "__main__"


def _find_main_frame() -> None:
    """Before 3.12 (no ``sys.monitoring``), keep the ``__main__`` module's frame: the bottom one of
    this stack when the preamble runs inside it (``import lora_otel.auto``), else the first such
    frame the interpreter enters after ``site`` (a profile function, on the main thread only, that
    removes itself there; none when the program or a tool has one). Never raises."""
    global _main_frame
    if sys.version_info >= (3, 12) or _thread.get_ident() != core.main_ident or sys.flags.interactive:
        return
    with core.fail_open("main frame"):
        frame: FrameType | None = sys._getframe()
        while frame is not None:
            if _is_main_code(frame):
                _main_frame = frame
            frame = frame.f_back
        if _main_frame is not None or sys.getprofile() is not None:
            return

        def spot(frame: FrameType, event: str, arg: object) -> None:
            global _main_frame
            if event == "call" and _is_main_code(frame):
                _main_frame = frame
                sys.setprofile(None)

        if sys.argv[:1] == ["-m"]:
            # `python -m pkg.mod`: runpy imports pkg (torch, a trainer...) before it runs the module's
            # code; a profile function from now on would slow every call of those imports 3-5 times.
            # It is set only as runpy starts that code (runpy is imported for -m at once anyway).
            import runpy

            real = runpy._run_code  # type: ignore[attr-defined]

            def run_code(*args: Any, **kwargs: Any) -> Any:
                runpy._run_code = real  # type: ignore[attr-defined]
                if sys.getprofile() is None and _thread.get_ident() == core.main_ident:
                    sys.setprofile(spot)
                return real(*args, **kwargs)

            runpy._run_code = run_code  # type: ignore[attr-defined]
            return
        sys.setprofile(spot)


_UNKNOWN = object()


def main_ended() -> tuple[str, object]:
    """How the ``__main__`` module's code ended (3.9-3.11): ``("return", None)``; ``("raise",
    code)`` — code the constant of a ``raise SystemExit(<constant>)`` that ended it, else
    `_UNKNOWN` —; or ``("", None)`` when not known (no frame, a REPL, still running)."""
    frame = _main_frame
    if frame is None or frame.f_code.co_filename == "<stdin>":
        return "", None
    here: FrameType | None = sys._getframe()
    while here is not None:
        if here is frame:
            return "", None  # (still running: an exit from inside it)
        here = here.f_back
    code = frame.f_code
    lasti = frame.f_lasti
    if lasti < 0 or lasti >= len(code.co_code):
        return "", None
    if code.co_code[lasti] == _RETURN_VALUE:
        return "return", None
    try:  # a raise of a constant SystemExit: its code is in the code object itself
        from lora_otel._boot.stdlib import module

        # (a forked child imports nothing on its way out: `_load_for_children` loaded it, or not known)
        dis = sys.modules.get("dis") if _child_of[1] or core.forked_at else module("dis")
        if dis is None or getattr(getattr(dis, "__spec__", None), "_initializing", False):
            return "raise", _UNKNOWN
        skip = ("CACHE", "PRECALL", "PUSH_NULL", "KW_NAMES")
        ins = [i for i in dis.get_instructions(code) if i.offset <= lasti and i.opname not in skip][-4:]
        names = [i.opname for i in ins]
        if names[-1:] == ["RAISE_VARARGS"] and ins[-1].arg == 1:
            if names[-2:-1] in (["LOAD_NAME"], ["LOAD_GLOBAL"]) and ins[-2].argval == "SystemExit":
                return "raise", None  # raise SystemExit
            if (
                len(ins) == 4
                and names[0] in ("LOAD_NAME", "LOAD_GLOBAL")
                and ins[0].argval == "SystemExit"
                and names[1] == "LOAD_CONST"
                and names[2] in ("CALL_FUNCTION", "CALL")
                and ins[2].arg == 1
            ):
                return "raise", ins[1].argval
    except Exception:  # noqa: BLE001 - not known, then
        pass
    return "raise", _UNKNOWN


_MONITORING_TOOL = 4
"""The ``sys.monitoring`` tool id lora_otel takes on 3.12+ (0-2 and 5 are the debugger's,
coverage's, the profiler's and the optimizer's); none when it is already in use."""
_raised_exit: tuple[BaseException | None, object, FrameType | None, set[int]] | None = None
"""(the exception, its code, the bottom frame of the stack it was raised on, the offsets in that
frame where it was raised or re-raised) of the last ``SystemExit`` raised in the main thread
(3.12+); ``(None, status, None, set())``: the status is known (``os._exit`` in a forked child). The
exception itself is kept, not its id: once freed, another exception could take its address (a wrong
code was read so)."""
_watching_exit = False


def _ended_main(raised: tuple[BaseException | None, object, FrameType | None, set[int]]) -> bool:
    """Whether the ``SystemExit`` noted by `_watch_system_exit` is what ended the main program: it
    was raised on the stack of the main code (a ``<module>`` frame, or runpy's for ``python -m``; not
    an atexit handler's), went through that bottom frame (the head of its traceback), and that frame
    stopped where it raised or re-raised it (a ``finally`` re-raises; a frame that caught it and
    went on has moved past). One caught anywhere, or ignored in a finalizer (``__del__``, a
    generator closed by the collector: "Exception ignored"), is not."""
    exc, _, bottom, offsets = raised
    if exc is None:
        return True
    tb = exc.__traceback__
    return (
        bottom is not None
        and tb is not None
        and tb.tb_frame is bottom
        and (bottom.f_lasti == tb.tb_lasti or bottom.f_lasti in offsets)
        and (bottom.f_code.co_name == "<module>" or bottom.f_code.co_name == "_run_module_as_main")
    )


def _watch_system_exit() -> None:
    """On 3.12+: follow ``SystemExit`` in the main thread with ``sys.monitoring`` (RAISE and RERAISE
    events: a call per frame an exception unwinds, none per instruction; whether it was caught is
    read at exit, `_ended_main`).

    A Python callback cannot run in a frame at the recursion limit: there its call fails, and the
    ``RecursionError`` of that failure replaces the exception being raised (CPython's rule for a
    RAISE callback that fails). A ``KeyboardInterrupt`` raised there became a ``RecursionError``,
    which a program retrying on ``RecursionError`` caught, and ``_thread.interrupt_main()`` no longer
    ended it (CPython's ``test_print_exception_gh_102056`` hung). Only a program that recursed to the
    limit is ever there, and it raised a ``RecursionError`` on its way: at the first one the callback
    sees, the watch stands down for the rest of the process, and how the main code
    ended is read at exit from where its frame stopped (`_stood_down_ended`)."""
    global _watching_exit
    mon = getattr(sys, "monitoring", None)
    if mon is None:
        return
    with core.fail_open("SystemExit watch"):
        tool = _free_tool(mon)
        if tool is None:
            _set_exit_watch_lost()
            return
        mon.use_tool_id(tool, "lora_otel")
        from _thread import get_ident

        main = get_ident()

        def raised(code: CodeType, offset: int, exc: BaseException) -> None:
            global _raised_exit, _watching_exit, _exit_watch_stood_down, _stood_down_main
            if isinstance(exc, RecursionError):
                # Stand down for good (inline: this frame may be one short of the limit, where no
                # Python function can be called), and keep the main thread's bottom frame to read at
                # exit how the main code ended. Never raises (a callback's exception replaces the
                # program's) but for what a signal handler of the program's raises here.
                try:
                    if held:
                        mon.set_events(held[0], 0)
                        for event, _ in callbacks:
                            mon.register_callback(held[0], event, None)
                        mon.free_tool_id(held.pop())
                    _watching_exit = False
                    _exit_watch_stood_down = True
                    frame = sys._current_frames().get(main)
                    while frame is not None and frame.f_back is not None:
                        frame = frame.f_back
                    _stood_down_main = frame
                except Exception:  # noqa: BLE001 - fail open, silently: inside the program's raise
                    pass
            elif isinstance(exc, SystemExit) and get_ident() == main:
                frame = bottom = sys._getframe(1)  # the frame the event is for; then the stack's bottom
                while bottom.f_back is not None:
                    bottom = bottom.f_back
                if _raised_exit is None or _raised_exit[0] is not exc or _raised_exit[2] is not bottom:
                    _raised_exit = (exc, exc.code, bottom, set())
                if frame is bottom:
                    _raised_exit[3].add(offset)

        events = mon.events
        callbacks = ((events.RAISE, raised), (events.RERAISE, raised))

        def take(tool: int) -> None:
            for event, callback in callbacks:
                mon.register_callback(tool, event, callback)
            mon.set_events(tool, events.RAISE | events.RERAISE)

        def release(tool: int) -> None:
            mon.set_events(tool, 0)
            for event, _ in callbacks:
                mon.register_callback(tool, event, None)
            mon.free_tool_id(tool)

        take(tool)
        held = [tool]
        program_use_tool_id = mon.use_tool_id

        def use_tool_id(tool_id: int, name: str, /) -> None:
            """``sys.monitoring.use_tool_id``, but a program asking for the id lora_otel holds gets
            it: lora_otel moves to another free one first (or stops watching when none is left)."""
            global _watching_exit
            if held and tool_id == held[0] and mon.get_tool(tool_id) == "lora_otel":
                with core.fail_open("SystemExit watch"):
                    release(held.pop())
                    _watching_exit = False
                    other = _free_tool(mon, besides=tool_id)
                    if other is None:
                        _set_exit_watch_lost()
                    else:
                        program_use_tool_id(other, "lora_otel")
                        take(other)
                        held.append(other)
                        _watching_exit = True
            program_use_tool_id(tool_id, name)

        use_tool_id.__wrapped__ = program_use_tool_id  # type: ignore[attr-defined]
        mon.use_tool_id = use_tool_id
        _watching_exit = True


_exit_watch_lost = False
"""3.12+: the program took both tool ids (`_free_tool`): a ``raise SystemExit(n)`` is not seen."""
_exit_watch_stood_down = False
"""3.12+: the watch stood down at the first ``RecursionError`` it saw (`_watch_system_exit`)."""
_stood_down_main: FrameType | None = None
"""3.12+: the bottom frame of the main thread's stack when the watch stood down (the main code's,
or runpy's for ``python -m``); where it stopped tells at exit how the main code ended."""


def _stood_down_ended() -> str:
    """3.12+, the watch stood down: ``"return"`` when the frame `_stood_down_main` ended by its
    return, ``"raise"`` when by an exception (a ``SystemExit``: an uncaught other one is known
    otherwise), ``""`` when not known (no frame, still running, ``opcode`` not loaded in a forked
    child, which imports nothing on its way out)."""
    frame = _stood_down_main
    if frame is None:
        return ""
    here: FrameType | None = sys._getframe()
    while here is not None:
        if here is frame:
            return ""  # (still running: an exit from inside it)
        here = here.f_back
    opcode = sys.modules.get("opcode")
    if opcode is None and not (_child_of[1] or core.forked_at):
        from lora_otel._boot.stdlib import module

        with core.fail_open("exit note"):
            opcode = module("opcode")
    if opcode is None:
        return ""
    ops, lasti = frame.f_code.co_code, frame.f_lasti
    if not 0 <= lasti < len(ops):
        return ""
    returns = {opcode.opmap[name] for name in ("RETURN_VALUE", "RETURN_CONST") if name in opcode.opmap}
    return "return" if ops[lasti] in returns else "raise"


def _set_exit_watch_lost() -> None:
    global _exit_watch_lost
    _exit_watch_lost = True


def _free_tool(mon: Any, besides: int = -1) -> int | None:
    """A ``sys.monitoring`` tool id no one uses: 4, else 3 (0-2 and 5 are the debugger's, coverage's,
    the profiler's and the optimizer's by convention); None when both are taken."""
    for tool in (_MONITORING_TOOL, 3):
        if tool != besides and mon.get_tool(tool) is None:
            return tool
    return None


def _uncaught_exception() -> BaseException | None:
    """The exception the main program died of, as the interpreter left it for exit handlers.

    ``sys.last_exc`` (3.12+) or ``sys.last_value`` is set by the interpreter before it calls
    ``sys.excepthook``, whoever replaced that. ``code.InteractiveInterpreter`` and C extensions
    that print an error also set it without ending the program: a real uncaught exception's
    traceback starts at the bottom of the stack (its first frame has no caller).
    """
    exc = getattr(sys, "last_exc", None) or getattr(sys, "last_value", None)
    tb = getattr(exc, "__traceback__", None)
    if not isinstance(exc, BaseException) or tb is None or tb.tb_frame.f_back is not None:
        return None
    return exc


def exit_outcome() -> tuple[str, int, str | None]:
    """``(how, status, message)`` of this process's end, read at exit (see _install_exit_hooks)."""
    exc = _uncaught_exception()
    if exc is not None:
        from lora_otel._boot import redact

        said = str(exc)
        text = redact.redact_text("%s: %s" % (type(exc).__name__, said) if said else type(exc).__name__)
        if isinstance(exc, KeyboardInterrupt):  # the interpreter then ends itself with SIGINT (3.8+)
            return "signal", 128 + 2, "interrupted (uncaught %s): ends by SIGINT" % text
        return "exception", 1, "uncaught %s" % text
    if _raised_exit is not None and _ended_main(_raised_exit):
        code = _raised_exit[1]
    elif _watching_exit:
        code = None  # sys.monitoring saw every SystemExit: the noted ones were caught
    elif _exit_watch_stood_down:
        ended = _stood_down_ended()
        if ended == "return":
            code = None  # the main code returned: a SystemExit noted before was caught
        elif _exit_noted:
            code = _exit_code
        else:
            frame = _stood_down_main
            where = "%s:%s" % (os.path.basename(frame.f_code.co_filename), frame.f_lineno) if frame else "?"
            return "unknown", -1, "exit code unknown: the program raised SystemExit at %s" % where
    elif _exit_watch_lost:
        if not _exit_noted:
            return "unknown", -1, "exit code unknown: the program took the sys.monitoring tool ids 3 and 4"
        code = _exit_code
    else:
        ended, code = main_ended()
        if ended == "return":
            code = None  # the main code returned: a SystemExit noted before was caught
        elif ended == "raise" and code is _UNKNOWN:
            if not _exit_noted or not _noted_exit_ended():
                frame = _main_frame
                where = "%s:%s" % (os.path.basename(frame.f_code.co_filename), frame.f_lineno) if frame else "?"
                return "unknown", -1, "exit code unknown: the program raised SystemExit at %s" % where
            code = _exit_code
        elif ended != "raise":
            code = _exit_code
    if isinstance(code, int):  # the status the OS gets: the C int's low byte (-1 past a long long)
        code = int(code) & 0xFF if -(2**63) <= code < 2**63 else 255
    if code is None or code == 0:
        return "normal", 0, None
    if isinstance(code, int):
        return "normal", code, "exit code %d" % code
    return "normal", 1, "exit: %s" % code


def _on_exit() -> None:
    try:
        _end()
    finally:
        _forget_frames()
        _ignore_stack_signal()


def _ignore_stack_signal() -> None:
    """The last thing lora_otel does in a process that exits (its exit hook runs last): ignore the
    stack request signal from here on. faulthandler gives a registered signal its default action
    back at interpreter finalization, and a real-time signal's default action ends the process: a
    stack request arriving after that (a process slow in its C++ teardown, gloo's or NCCL's, or
    stalled there) killed a process that was exiting 0, by signal 44. Ignored, it is lost, and the
    journal already says the process is exiting. Only a real-time signal is ignored so: one set by
    ``LORA_OTEL_STACK_SIGNAL`` (SIGTERM, SIGUSR1) gets its default back, as without lora_otel, so a
    supervisor's signal still ends a stuck teardown. A SIG_IGN of the program's own is kept past
    finalization (faulthandler would put the default back over it); a handler of its own is left
    alone."""
    global _stack_signal, _faulthandler_signal
    signum = _faulthandler_signal
    _stack_signal = _faulthandler_signal = 0
    if not signum:
        return
    try:
        import _signal
        import faulthandler

        now = _signal.getsignal(signum)
        rtmin, rtmax = getattr(_signal, "SIGRTMIN", 0), getattr(_signal, "SIGRTMAX", 0)
        if now is _signal.SIG_DFL and not rtmin <= signum <= rtmax:
            return  # SIGTERM, SIGUSR1...: faulthandler gives back the default, as without lora_otel
        if now is not _signal.SIG_DFL and now is not _signal.SIG_IGN:
            return  # a Python handler (Python resets it itself) or one set from C
        # SIG_DFL: ours, ignored from here on; SIG_IGN: the program's, kept past finalization
        old = _signal.pthread_sigmask(_signal.SIG_BLOCK, {signum})
        try:
            faulthandler.unregister(signum)
            _signal.signal(signum, _signal.SIG_IGN)
        finally:
            _signal.pthread_sigmask(_signal.SIG_SETMASK, old)
    except (OSError, ValueError, RuntimeError):
        pass


def _forget_frames() -> None:
    """Let go of the frames kept to judge the exit (`_main_frame`, `_raised_exit`): a frame holds its
    module's globals, and the ``__main__`` module's dict kept alive past this exit handler is never
    cleared at shutdown — its objects' ``__del__`` never ran (3.9-3.11: a writer's last flush, a
    "closed" line, an "Exception ignored" report all lost; a hostile trial)."""
    global _main_frame, _raised_exit, _stood_down_main
    _main_frame = None
    _raised_exit = None
    _stood_down_main = None


def _end() -> None:
    with core.fail_open("exit hook"):
        threads_begun()
        if not core.active or os.getpid() != core.pid:
            return
        how, status_code, message = exit_outcome()
        quiet_end = not message or (how == "unknown" and not core.promoted)  # (`python -m pytest` ends so)
        # Worth reading after a short run: a job's end, an uncaught exception or a signal (the
        # message and the stage it met), a launched child's failure (part of its job's story). A
        # process that is no job and ends by an exit code (a CLI's usage error, a forked worker's
        # `sys.exit(1)`) has said why on its own stderr, and its parent has the code.
        worth = bool(core.promoted) or how not in ("normal", "unknown") or (_launched and not core.forked_at)
        if (core.forked_at or (core.journal_deferred() and not core.promoted)) and (quiet_end or not worth):
            core.active = False  # a fork that wrote nothing and ends well or by a code: nothing to say, no file
            return
        core.settle()
        at_exit = getattr(sys.modules.get("lora_otel._boot.narrate"), "at_exit", None)
        if at_exit is not None:  # (the beat thread may be importing it right now: then not yet there)
            with core.fail_open("narration at exit"):
                at_exit(core.now_ns())
        stages.arguments_done("none seen")
        for sid, info in reversed(list(core.open_spans.items())):
            if sid != core.root_id:
                core.span_end(sid, "ok", attrs=core.training_attrs() if info[0] == "training" else None)
        elapsed = (core.now_ns() - _started_ns) / 1e9
        if message:
            if not core.promoted and how != "unknown" and worth and not _child_of[1]:
                # A short process that failed: the facts for its journal (a forked child's are its
                # parent's: it imports nothing on its way out, `_load_for_children`).
                with core.fail_open("process description"):
                    _describe_process(_argv, _how, terminal=False)
            # A short process's end is in its journal, not after its own output on its stderr (a
            # CLI's usage error, `python -c 'import x'`); a job's on the terminal too (a code
            # unknown as a warning: `python -m pytest` ends so).
            say_end = core.note_line if not core.promoted else core.error_line if how != "unknown" else core.warn_line
            say_end("exiting: %s after %s" % (message, duration(elapsed)))
        else:
            # A process that never became a job ends as quietly as it would without lora_otel.
            say = core.info_line if core.promoted else core.note_line
            below = _steps_below() if core.promoted and not core.steps else ""
            say("exiting normally after %s (%d optimizer steps%s)" % (duration(elapsed), core.steps, below))
        core.beat(force=True)
        if how == "unknown":  # neither failed nor 0: said so, no code claimed
            core.span_end(core.root_id, "ok", None, {"lora_otel.exit.code_unknown": message})
        else:
            core.span_end(core.root_id, "error" if message else "ok", message, {"process.exit.code": status_code})
        code = None if how == "unknown" else status_code
        rec = {"v": core.FORMAT_VERSION, "k": "exit", "ts": core.now_ns(), "code": code, "how": how}
        if message:
            rec["message"] = message
        core.write(rec)
        core.active = False
        if (how == "normal" and (status_code == 0 or not worth)) or (how == "unknown" and not core.promoted):
            _discard_short_run()  # (a code unknown, or a failure not worth reading: nothing left, as at 0)
        else:
            _bound_short_runs()  # a short failure kept: at most SHORT_RUNS_KEPT such journals stay


def _steps_below(max_named: int = 4) -> str:
    """``" here; train, pid 4242, made 10"``: the optimizer steps of the processes below
    this one that trained (a launcher's trainer, its ranks), from their journals in this job's
    registry (`spawn.registry_path`: the first record's pid and ``service.name``, the last beat's
    ``steps``); "" when none did. Read once, at exit, from the files' two ends only (no ``re``: the
    process imports nothing it would not have)."""
    from lora_otel._boot import files

    reading = os.O_RDONLY | files.O_CLOEXEC
    spawn = sys.modules.get("lora_otel._boot.spawn")  # loaded when this process started a sidecar
    try:
        registry = (
            _execd
            if isinstance(_execd, str)
            else getattr(spawn, "opened_registry", "") or paths.stem(core.journal_path or "") + ".children"
        )
        fd = files.open_existing(registry, reading)  # never blocks (a FIFO), only a file of this user's
        try:
            text = os.read(fd, 65536).decode("utf-8", "replace")
        finally:
            os.close(fd)
        journals = [line.strip() for line in text.splitlines() if line.strip()]
    except (OSError, ValueError):
        return ""
    named: list[str] = []
    for path in dict.fromkeys(journals):
        if path == core.journal_path or len(named) > max_named:
            continue
        try:
            fd = files.open_existing(path, reading)
        except OSError:
            continue
        try:
            head = os.pread(fd, 4096, 0).decode("utf-8", "replace")
            size = os.fstat(fd).st_size
            tail = os.pread(fd, 16384, max(size - 16384, 0)).decode("utf-8", "replace")
        except OSError:
            continue
        finally:
            os.close(fd)
        beat = tail.rfind('"k":"beat"')
        steps = _number_after(tail[beat:], '"steps":') if beat >= 0 else ""
        pid = _number_after(head, '"pid":')
        if not steps or not pid or int(steps) == 0:
            continue
        at = head.find('"service.name":"')
        name = head[at + 16 : head.find('"', at + 16)] if at >= 0 else ""
        who = "%s, pid %s," % (name, pid) if name and len(name) <= 60 and "\\" not in name else "pid %s" % pid
        named.append("%s made %s" % (who, steps))
    if not named:
        return ""
    return " here; %s%s" % ("; ".join(named[:max_named]), "; ..." if len(named) > max_named else "")


def _number_after(text: str, key: str) -> str:
    """The digits right after the first ``key`` in ``text`` ("" when none)."""
    at = text.find(key)
    if at < 0:
        return ""
    digits = text[at + len(key) : at + len(key) + 20]
    end = next((i for i, ch in enumerate(digits) if not ch.isdigit()), len(digits))
    return digits[:end]


# --- a short run leaves nothing behind ------------------------------------------------------

_launched = False
"""Whether a traced process started this one (a launcher's rank or trainer, a helper): its end, a
failure by an exit code too, is part of its job's story and worth its journal (`_end`)."""
_disposable = False
"""Whether this process's journal is one lora_otel named in a directory of journals (``LORA_OTEL_DIR``,
the state directory): only such a journal is removed at a short run's exit (`_discard_short_run`)."""
_beside_log = False
"""Whether the journal was put beside the program's log file: it is the user's while that file is a
log (kept), and may go like a named one once the program showed it is not (``core.drop_log``)."""

_NOT_SET = ("", "0", "false", "no", "off")


def _discard_short_run() -> None:
    """At a normal exit with code 0 — or a code not worth reading (see `_end`) — of a process that
    never became a job (``core.promoted`` is "":
    it ended before its first beat, heavy import, stage or sidecar): remove its journal and the
    stacks file, and the directories it created for them when empty, so that ``python -c pass`` or
    ``pip --version`` leaves nothing behind.

    Kept: ``LORA_OTEL_KEEP_SHORT=1``; a process that lived a beat interval (a job, whether or not
    its beat has said so yet); a journal a user named or one beside a ``--log`` that is one
    (`_disposable`, `_beside_log`); while a sidecar started by this process follows it; while a traced child
    refers to it (`_has_children`). Only the files this process created, each checked by identity
    (device, inode) right before it is unlinked: never a file someone put under that name."""
    if (
        core.promoted
        or core.now_ns() - _born_ns >= core.beat_interval * 1e9  # it lived to its first beat: a job
        or not (_disposable or (_beside_log and (not core.log_path or (core._log_fd < 0 and not _log_there()))))
        or _sidecar_pid
        or os.environ.get("LORA_OTEL_KEEP_SHORT", "").strip().lower() not in _NOT_SET
    ):
        return
    path = core.journal_path
    if not path or _has_children(path):
        return
    from lora_otel._boot import files

    fd = core._journal_fd
    if not files.same(fd, (core._journal_dev, core._journal_ino)):
        return  # the program closed or reused its descriptor: the journal is not this process's to judge
    if not _unlink_own(path, (core._journal_dev, core._journal_ino)):
        return
    core._journal_fd = -1  # nothing more goes into a journal that is gone
    try:
        os.close(fd)
    except OSError:
        pass
    if _stacks_created is not None and _stacks_created[0] == stacks_path(path):
        # (this process's own: a forked child inherits its parent's `_stacks_created`, and must
        # never take the parent's file.) faulthandler keeps its descriptor: a late dump lands in no file
        _unlink_own(*_stacks_created)
    for d, dev, ino in core.created_dirs:  # deepest first
        try:
            st = os.lstat(d)
            if (st.st_dev, st.st_ino) != (dev, ino):
                break
            os.rmdir(d)  # only when empty
        except OSError:
            break
    core.journal_path = ""


def _log_there() -> bool:
    """Whether the ``--log`` file, absent at start, exists now: the program made it (lora_otel's
    copy still waiting), so the journal beside it is beside a log, and stays."""
    return core._log_may_create and bool(core.log_path) and os.path.lexists(core.log_path or "")


def _unlink_own(path: str, ident: tuple[int, int]) -> bool:
    """Unlink ``path`` when it is still the file ``ident`` names (not a symlink); whether it went."""
    try:
        st = os.lstat(path)
        if (st.st_dev, st.st_ino) != tuple(ident) or st.st_mode & 0o170000 != 0o100000:
            return False
        os.unlink(path)
        return True
    except OSError:
        return False


def _has_children(path: str, names: list[str] | None = None) -> bool:
    """Whether a traced child of this process refers to its journal: a journal beside it whose
    root record names this trace and this pid as its parent (a forked child, ``<stem>.<pid>``, or a
    spawned one) — still running, or kept because it failed; or an empty journal (just created,
    its first record not written yet). Only the journals named after this one (forked children) or
    created since this process started are read, their first 8 KiB. ``names``: the directory's
    names when the caller listed it already (`_bound_short_runs`)."""
    d, name = os.path.split(path)
    if names is None:
        try:  # streamed: 100,000 names another user left in the directory are never held at once
            with os.scandir(d or ".") as entries:
                return _names_have_children(d, name, (entry.name for entry in entries))
        except OSError:
            return True  # cannot tell: keep
    return _names_have_children(d, name, names)


def _names_have_children(d: str, name: str, names: Iterable[str]) -> bool:
    """`_has_children` over the names ``names`` of the directory ``d`` (``name``: this journal's)."""
    from lora_otel._boot import files

    own_stem = paths.stem(name) + "."
    since = paths.journal_name(core.pid, _born_ns / 1e9)[:16]  # "<UTC second>": names sort by time
    trace = ('"trace_id":"%s"' % core.trace_id).encode()
    ppid = (',"ppid":%d,' % core.pid).encode()
    for other in names:
        if other == name or not other.endswith(paths.JOURNAL_SUFFIX):
            continue
        if not (other.startswith(own_stem) or (other[:1].isdigit() and other[:16] >= since)):
            continue
        try:
            fd = files.open_existing(os.path.join(d, other), os.O_RDONLY | files.O_CLOEXEC)  # only ours
        except OSError:
            continue
        try:
            head = os.read(fd, 8192).split(b"\n", 1)[0]
        except OSError:
            continue
        finally:
            os.close(fd)
        if trace in head and ppid in head:
            return True
        if not head and _my_child(other):
            return True  # a child that has just created its journal: its first record may name us
    return False


SHORT_RUNS_KEPT = 20
"""The most journals of short failed runs (`_bound_short_runs`) kept per directory and user, the
newest ones; ``LORA_OTEL_KEEP`` lowers it (``0``: no bound). The one home of this value
(docs/journal.md, "Retention")."""
SHORT_MARK = "-short-"
"""Put before the pid in the name of a short failed run's journal at its exit:
``20261130T221348Z-4242.otel.jsonl`` → ``20261130T221348Z-short-4242.otel.jsonl``."""
SHORT_SCAN_MAX = 10_000
"""The most directory entries `_bound_short_runs` reads at an exit: a bigger directory is left to a
job's retention (`lora_otel.journal.runs.prune`), its journal kept under its first name."""
SHORT_MAX_BYTES = 1 << 20
"""A marked journal bigger than this is not one a short run wrote (a few KiB): never removed here."""


def is_short_run_name(name: str) -> bool:
    """Whether ``name`` is a short failed run's journal as `_bound_short_runs` names it:
    ``<UTC second>-[<8 hex>-]short-<pid>.otel.jsonl``."""
    if not name.endswith(paths.JOURNAL_SUFFIX) or len(name) < 16 or name[8:9] != "T" or name[15:16] != "Z":
        return False
    head, mark, pid = name[: -len(paths.JOURNAL_SUFFIX)].rpartition(SHORT_MARK)
    return bool(mark) and pid.isdigit() and head[:8].isdigit() and len(head) in (16, 25)


def _short_runs_kept() -> int:
    """`SHORT_RUNS_KEPT`, or ``LORA_OTEL_KEEP`` when that is lower (``0``: no bound; a bad value
    is said by the sidecar that reads it, and ignored here)."""
    raw = os.environ.get("LORA_OTEL_KEEP", "").strip()
    if raw.isdigit():
        return min(SHORT_RUNS_KEPT, int(raw))
    return SHORT_RUNS_KEPT


def _bound_short_runs() -> None:
    """At the exit of a short process that failed and keeps its journal (an uncaught exception, a
    signal): bound such journals without waiting for a job's sidecar (600 failing ``python -c`` runs
    left 600 journals). The journal gets a second name marking it a finished short run
    (`SHORT_MARK`, given by its process on its way out, after its last record), its first name
    goes; then, of this user's journals so marked in the directory, all but the newest
    `_short_runs_kept` are removed.

    Only what `_discard_short_run` could remove takes part: a journal lora_otel named in a directory
    of journals (not a fallback one, whose path a line on stderr named), of a process that never
    became a job, was not started by a traced process (part of its job's story), started no
    sidecar, has no stacks file and no traced child referring to it; nothing with
    ``LORA_OTEL_KEEP_SHORT=1``. One listing of the directory, after the mark (of short runs ending
    together, the last to list sees every mark), at most `SHORT_SCAN_MAX` entries, names only
    (a forked child's journal found there undoes the mark); a file is removed only when it is a
    regular file of this user's with one name, under `SHORT_MAX_BYTES`, that nobody holds a lock on
    (a job locks its journal: a non-blocking exclusive ``flock`` is asked, never waited for), still
    the one listed (device, inode). Never raises; fails open (the journal kept, under its first
    name when the mark could not be given)."""
    if (
        core.promoted
        or core.forked_at
        or _launched
        or not _disposable
        or not hasattr(os, "geteuid")
        or _sidecar_pid
        or _stacks_fd >= 0
        or core.now_ns() - _born_ns >= core.beat_interval * 1e9  # it lived to its first beat: a job
        or os.environ.get("LORA_OTEL_KEEP_SHORT", "").strip().lower() not in _NOT_SET
    ):
        return
    keep = _short_runs_kept()
    path = core.journal_path
    if not keep or not path or not path.endswith(paths.JOURNAL_SUFFIX):
        return
    d, name = os.path.split(path)
    if d != os.path.dirname(paths.dir_journal_path(os.environ, core.pid, 0.0)):
        return  # a fallback directory, its path said on stderr ("using ... instead"): the name stays
    head, dash, pid = name[: -len(paths.JOURNAL_SUFFIX)].rpartition("-")
    marked_name = head + SHORT_MARK + pid + paths.JOURNAL_SUFFIX
    if not dash or not pid.isdigit() or not is_short_run_name(marked_name):
        return
    from lora_otel._boot import files

    ident = (core._journal_dev, core._journal_ino)
    if not files.same(core._journal_fd, ident):
        return  # the program closed or reused its descriptor: the journal is not this process's to judge
    new = os.path.join(d, marked_name)
    try:
        os.link(path, new, follow_symlinks=False)  # never over a file someone put at that name
    except (OSError, NotImplementedError):
        return  # (a file system without hard links: kept under its first name, for a job's retention)
    if not _unlink_own(path, ident):
        _unlink_own(new, ident)
        return
    core.journal_path = new
    # Listed after the mark: of short runs ending together, the last to list sees every mark.
    journals: list[str] = []
    marked: list[str] = []
    try:
        with os.scandir(d) as entries:
            for i, entry in enumerate(entries):  # (the loop is the cost: ~0.4 µs an entry)
                if i >= SHORT_SCAN_MAX:
                    return  # a huge directory: left to a job's retention
                other = entry.name
                if other.endswith(paths.JOURNAL_SUFFIX):
                    (marked if SHORT_MARK in other else journals).append(other)
    except OSError:
        return
    journals += [other for other in marked if not is_short_run_name(other)]
    marked = [other for other in marked if is_short_run_name(other)]
    if _has_children(path, journals):  # (forked children are named after the first name)
        try:
            os.link(new, path, follow_symlinks=False)
        except (OSError, NotImplementedError):
            return
        if _unlink_own(new, ident):
            core.journal_path = path
        return
    me = os.geteuid()
    own: list[tuple[int, str, tuple[int, int]]] = []
    for other in marked:
        if other == marked_name:
            continue
        try:
            st = os.lstat(os.path.join(d, other))
        except OSError:
            continue
        if (
            st.st_mode & 0o170000 == 0o100000
            and st.st_uid == me
            and st.st_nlink == 1  # (a hard link to a file of ours, put there by someone else: not counted)
            and st.st_size <= SHORT_MAX_BYTES
        ):
            own.append((st.st_mtime_ns, other, (st.st_dev, st.st_ino)))
    if len(own) < keep:
        return
    own.sort()
    fcntl = None
    for _, other, other_id in own[: len(own) - (keep - 1)]:
        if fcntl is None:
            from lora_otel._boot.stdlib import module

            try:
                fcntl = module("fcntl")
            except ImportError:
                return
        _remove_finished(os.path.join(d, other), other_id, fcntl)


def _remove_finished(path: str, ident: tuple[int, int], fcntl: Any) -> None:
    """Unlink the short run's journal at ``path`` when it is still the file ``ident`` names, a
    regular file of this user's with one name, opened without blocking, and nobody holds a lock on
    it (asked without waiting)."""
    from lora_otel._boot import files

    try:
        fd = files.open_existing(path, os.O_RDONLY | files.O_CLOEXEC)
    except OSError:
        return
    try:
        if files.identity(fd) != tuple(ident):
            return
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # held: a live process's (OSError)
        _unlink_own(path, ident)
    except OSError:
        pass
    finally:
        os.close(fd)


def _my_child(journal_name: str) -> bool:
    """Whether the process a journal is named after (its last ``-<pid>``/``.<pid>``) is a child of
    this one now (``/proc/<pid>/stat``'s parent). An empty journal of a sibling or a stranger —
    created a moment ago, written a moment later — keeps nothing (a hostile trial's fork tree left
    every journal behind, each kept for a sibling's empty file)."""
    stem = journal_name[: -len(paths.JOURNAL_SUFFIX)]
    tail = stem.replace("-", ".").rsplit(".", 1)[-1]
    if not tail.isdigit():
        return True  # not named after a pid: cannot tell, keep
    try:
        with open("/proc/%s/stat" % tail, "rb") as f:
            stat = f.read()
        return int(stat.rsplit(b")", 1)[1].split()[1]) == core.pid
    except (OSError, ValueError, IndexError):
        return not os.path.isdir("/proc/self")  # gone (or no /proc: cannot tell, keep)


# --- exec -----------------------------------------------------------------------------------

# None where os has no exec (not POSIX), and then the wrappers below are never installed: typed as
# what they are wherever the wrappers run (the ignores say so).
_real_execv: Callable[[StrOrBytesPath, _ExecVArgs], NoReturn]
_real_execve: Callable[[FileDescriptorOrPath, _ExecVArgs, _ExecEnv], NoReturn]
_real_execv = getattr(os, "execv", None)  # type: ignore[assignment]
_real_execve = getattr(os, "execve", None)  # type: ignore[assignment]


def _exec_record(
    path: FileDescriptorOrPath,
    argv: Iterable[StrOrBytesPath],
    via: str | None = None,
    error: BaseException | None = None,
) -> None:
    """Journal an ``exec`` record: this process is about to become ``path`` (or, with ``error``,
    its attempt failed and it goes on as it was). Only the program's own argv, redacted."""
    with core.fail_open("exec hook"):
        core.settle()  # a forked child's journal, not its parent's
        if not core.active or os.getpid() != core.pid:
            return
        from lora_otel._boot import redact

        where = "/proc/self/fd/%d" % path if isinstance(path, int) else os.fsdecode(path)
        rec: dict[str, Any] = {
            "v": core.FORMAT_VERSION,
            "k": "exec",
            "ts": core.now_ns(),
            "path": redact.redact_value(where),
        }
        if error is not None:
            rec["error"] = redact.redact_text("%s: %s" % (type(error).__name__, error))
        else:
            try:
                rec["argv"] = redact.redact_argv([os.fsdecode(a) for a in argv])
            except Exception:  # noqa: BLE001 - an argv exec itself will refuse
                pass
            if via:
                rec["via"] = via
        _write_by_path(rec)


def _exec_image(argv: list[str]) -> str:
    """``python -m axolotl.cli.train``: what the process runs now, short (redacted, at most 3 words)."""
    from lora_otel._boot import redact

    words = redact.redact_argv([os.path.basename(sys.executable), *argv[:2]])
    text = " ".join(words)
    return text if len(text) <= 120 else text[:117] + "..."


def _write_by_path(rec: dict[str, Any]) -> None:
    """Append ``rec`` to the journal through a descriptor opened for it alone: right before an exec
    the journal's own descriptor may already be closed (``close_fds`` in gevent's subprocess child,
    ``os.closerange`` in daemonising code). Execs are rare; the extra open costs nothing that matters."""
    from lora_otel._boot import files
    from lora_otel._boot.jsonl import dumps_line

    try:
        fd = files.open_existing(core.journal_path)  # never blocks, only a file of this user's
    except (OSError, TypeError, ValueError):
        core.write(rec)
        return
    try:
        os.write(fd, dumps_line(rec))
    except OSError:
        pass
    finally:
        os.close(fd)


EXEC_FROM_ENV = "LORA_OTEL_EXEC_FROM"
"""Set (to the pid) in the environment an exec hands on, when a traced process execs: the image it
becomes, traced too, says it was exec'd instead of a second ``started pid`` line. Popped at start."""


def _execv(path: StrOrBytesPath, argv: _ExecVArgs) -> NoReturn:
    _exec_record(path, argv)
    had = os.environ.get(EXEC_FROM_ENV)
    marked = _exec_marker(os.environ)
    if marked:
        os.environ[EXEC_FROM_ENV] = marked
    try:
        _real_execv(path, argv)  # never returns: the process becomes another program, or it raises
    except BaseException as e:
        if marked:
            if had is None:
                os.environ.pop(EXEC_FROM_ENV, None)
            else:
                os.environ[EXEC_FROM_ENV] = had
        _exec_record(path, argv, error=e)
        raise


def _execve(path: FileDescriptorOrPath, argv: _ExecVArgs, env: _ExecEnv) -> NoReturn:
    _exec_record(path, argv)
    marked = _exec_marker(env)
    try:
        # A copy with the marker: the program's own mapping is left as it was.
        handed: Any = dict(env) if marked else env
        if marked:
            handed[EXEC_FROM_ENV] = marked
        _real_execve(path, argv, handed)
    except BaseException as e:
        _exec_record(path, argv, error=e)
        raise


def _exec_marker(env: object) -> str:
    """The pid to hand on in `EXEC_FROM_ENV`, or "" when the image exec'd will not be traced (no
    ``LORA_OTEL`` in the environment it gets) or this process is not the traced one."""
    try:
        get = getattr(env, "get", None)
        if not core.active or os.getpid() != core.pid or get is None:
            return ""
        if not (get("LORA_OTEL") or get(b"LORA_OTEL")):
            return ""
        return str(core.pid)
    except Exception:  # noqa: BLE001 - an exec is never stopped by lora_otel
        return ""


def _install_exec_hooks() -> None:
    """Wrap ``os.execv`` and ``os.execve``: every other ``os.exec*`` function ends in one of them
    (looked up as module globals of ``os`` at call time), so each exec from Python is journaled
    before it happens, and a failed one after. Exec from C is seen from outside (the image)."""
    if _real_execv is not None and getattr(os.execv, "__wrapped__", None) is None:
        _execv.__wrapped__ = _real_execv  # type: ignore[attr-defined]
        os.execv = _execv
    if _real_execve is not None and getattr(os.execve, "__wrapped__", None) is None:
        _execve.__wrapped__ = _real_execve  # type: ignore[attr-defined]
        if _real_execve in getattr(os, "supports_fd", ()):
            os.supports_fd.add(_execve)
        os.execve = _execve


def _subprocess_exec_target() -> tuple[str | bytes, object] | None:
    """In a child forked by ``subprocess.Popen`` with ``preexec_fn`` (CPython runs the at-fork
    hooks then, and execs from C right after): ``(executable, args)``; else None. (Asked only
    when the subprocess hook says such a start is under way in the forking thread.)"""
    if getattr(sys.modules.get("lora_otel._boot.hooks"), "preexec_fork", 0) != core.main_ident:
        return None
    try:
        frame = sys._getframe(2)  # 0: this, 1: _after_fork_child, 2: who forked (C frames are skipped)
    except ValueError:
        return None
    code = frame.f_code
    if code.co_name != "_execute_child" or frame.f_globals.get("__name__") != "subprocess":
        return None
    local = frame.f_locals
    args = local.get("args")
    executable = local.get("executable") or (args[0] if isinstance(args, (list, tuple)) and args else None)
    return (executable, args) if isinstance(executable, (str, bytes)) else None


# --- fork -----------------------------------------------------------------------------------


def _before_fork() -> None:
    global _fork_parent_span, _fork_other_threads
    _fork_parent_span = core.current_span_id() if core.active else None
    if core.active and _loaded_for_children != core.pid and _thread.get_ident() == core.main_ident:
        # (from another thread: the child loads them itself, `_load_in_child`; not here, where the
        # imports let the main thread run on into its finalization before the fork)
        with _FORK_HOOK:
            _load_for_children()
    if _PAUSE_AT_FORK and core.active:
        with _FORK_HOOK:
            _pause_beat()
    if core.active and _thread.get_ident() == core.main_ident:
        # (one read of /proc/self/stat, ~10 µs: the forking thread and a running beat are not counted;
        # not from another thread, where a read gives up the GIL and the main thread runs on into its
        # finalization before the fork: 3.12+ then refuse the child a thread, `_load_for_children`)
        threads = _os_threads()
        _fork_other_threads = threads - 1 - (_beat_stop is not None) if threads else -1
    else:
        _fork_other_threads = -1


_fork_other_threads = -1
"""The threads this process had at its last fork besides the forking one and the beat (-1: not
known): a forked child's root span records it (``process.fork.parent_threads``) — the threads of a
pool the parent had started (OpenMP's, a BLAS library's) are not in the child, which still waits
for them if it uses that pool (`lora_otel.analysis.native`)."""


_loaded_for_children = 0
"""The pid that has loaded what its forked children may need (`_load_for_children`)."""
FORK_CHILD_NEEDS = ("fcntl", "select", "_socket")
"""The standard library modules a forked child's records and lines use (a journal moved to a high
descriptor, a line on a stderr that is a pipe or a socket)."""


def _load_for_children() -> None:
    """Before this process's first fork from its main thread: load what a forked child may use on
    its way (its exit or exec record, redacted; its lines), so that the child imports nothing (a few
    milliseconds, once; ``dis``, for how a child's main code ended on 3.9-3.11, is not loaded for
    it: `main_ended`). In a child, a module that another thread of the parent was importing at the
    fork stays locked for ever (that thread does not exist there): an import of it on the child's
    way out waited for ever, and so did the parent waiting for the child (``os.spawnve`` whose exec
    fails: CPython's test_os). A fork from another thread leaves this to the child
    (`_load_in_child`): an import there gives up the GIL, the main thread runs on into its
    finalization meanwhile, and 3.12+ refuse a thread to a child forked after that (CPython's
    ``test_3_join_in_forked_from_thread`` failed in 24 runs of 30, none without lora_otel)."""
    global _loaded_for_children
    _loaded_for_children = core.pid
    from lora_otel._boot import files, redact  # noqa: F401 - loaded for the children
    from lora_otel._boot.stdlib import module

    for name in FORK_CHILD_NEEDS:
        module(name)
    if sys.version_info >= (3, 12) and not _PAUSE_AT_FORK:
        # This fork will warn (the beat runs, `_PAUSE_AT_FORK`), and the interpreter imports
        # ``warnings`` for it by name: the standard library's, never a warnings.py of the working
        # directory (3.13.0-3.13.9, 3.14.0).
        module("warnings")


def _load_in_child() -> None:
    """In a child forked from a thread other than the main one before its parent loaded what a
    child needs (`_load_for_children`): load it now, in the child, but never a module whose import
    lock is held (a thread of the parent, which does not exist here, was importing it at the fork:
    it would wait for ever)."""
    locks = getattr(sys.modules.get("_frozen_importlib"), "_module_locks", None)
    if not isinstance(locks, dict):
        return
    from lora_otel._boot.stdlib import module

    for name in ("lora_otel._boot.redact", *FORK_CHILD_NEEDS):
        held = locks.get(name)
        if name in sys.modules or (held is not None and held() is not None):
            continue
        if name == "lora_otel._boot.redact":
            from lora_otel._boot import redact  # noqa: F401 - loaded for the way out (untraced: ours)
        else:
            module(name)


_PAUSE_AT_FORK = (3, 12) <= sys.version_info < (3, 13) or (3, 13, 10) <= sys.version_info[:3] != (3, 14, 0)
"""Python 3.12+ warns at ``os.fork`` in a process with other threads (`_pause_beat`). 3.13.0 to
3.13.9 and 3.14.0 count the threads after the ``after_in_parent`` hooks, where the beat has started
again (CPython gh-137109): there the warning cannot be avoided but by leaving the parent without a
beat, so the beat is not paused. (A ``-W error`` run sees nothing: CPython drops the exception.)"""


_real_os_exit = os._exit


def _forked_child_exit(status: int = 0) -> NoReturn:
    """``os._exit`` in a forked child: write the exit record first (multiprocessing's fork workers
    end with ``os._exit(exitcode)``, which skips atexit), then leave as asked. The parameter has
    ``os._exit``'s name, so ``os._exit(status=1)`` works."""
    global _exit_code, _raised_exit
    if core.forked_at and _settle_lock.acquire(True, SETTLE_WAIT_S):
        _settle_lock.release()  # another thread settling this child meanwhile has finished
    if core.forked_at or (core._deferred is not None and not core.promoted):
        # A fork that wrote nothing and ends by a code (0 or not): nothing worth reading (see
        # _end); its parent has the code.
        _real_os_exit(status)
    try:
        if core.active and os.getpid() == core.pid:
            _exit_code, _raised_exit = status, (None, status, None, set())
            _on_exit()
    finally:
        _real_os_exit(status)


_child_of: tuple[str, int] = ("", 0)
"""A settled forked child's root span: the span that forked it and when (`_settle_child`)."""


def _child_root() -> dict[str, Any]:
    """A forked child's root span start record, made when its journal is created (`core.defer_journal`)."""
    rec = _root_record(_child_of[1], _child_of[0], _start_ticks(), "fork", sys.argv)
    if _fork_other_threads >= 0:
        rec["attrs"]["process.fork.parent_threads"] = _fork_other_threads
    return rec


def _after_fork_child() -> None:
    """A forked child of a traced process: the beat, and nothing it need not do yet — every page
    the child writes after the fork is a copy (~3 µs each), so a fork that exits at once should
    write few (`core.forked`). Its first record, span, beat or promotion settles it
    (`_settle_child`); it becomes a job like any process (`promote`)."""
    global _born_ns, _next_beat_ns, _beat_paused, _settle_lock, _forked_from_thread
    with _FORK_HOOK:
        if not core.active:
            return
        from_thread = _thread.get_ident() != core.main_ident  # (the parent's, until `core.forked` below)
        if from_thread:
            _forked_from_thread = os.getpid()
        loaded = _loaded_for_children == core.pid  # (the parent's pid, until `core.forked`)
        _settle_lock = _thread.allocate_lock()  # (a thread of the parent may have held the old one)
        _born_ns = core.now_ns()
        core.forked(os.getpid(), _born_ns)
        if from_thread and not loaded:
            _load_in_child()
        target = _subprocess_exec_target()
        if target is not None:  # subprocess with preexec_fn: it execs from C, unseen by os.execv
            _exec_record(target[0], target[1] if isinstance(target[1], (list, tuple)) else [], via="subprocess")
        os._exit = _forked_child_exit  # multiprocessing's fork children leave by os._exit: record it
        _next_beat_ns, _beat_paused = 0, False  # the child's first beat: an interval from now
        _start_beat()


_FORK_HOOK = core.fail_open("fork hook")  # made once: nothing new to allocate in each child
_settle_lock = _thread.allocate_lock()
SETTLE_WAIT_S = 5.0
"""How long a thread waits for another settling this child (microseconds of work; a loaded machine
can hold the settling thread off the CPU for long: at 1 s a forked child's exit record was lost)."""


def _settle_child() -> None:
    """A forked child takes over its own state (`core.settle`, at its first record, span, beat or
    promotion): a root span under the span that forked it, a journal of its own — created by its
    first record, with the root span's start first (`core.defer_journal`): a fork that writes
    nothing and exits normally leaves no file — and ``TRACEPARENT`` naming its root for what it
    starts. A second thread arriving meanwhile waits for it (`SETTLE_WAIT_S` at most)."""
    global _child_of
    locked = _settle_lock.acquire(True, SETTLE_WAIT_S)
    try:
        fork_ns = core.forked_at
        if not fork_ns:
            return
        parent_span = _fork_parent_span or core.root_id
        parent_path = core.journal_name()
        _child_of = (parent_span, fork_ns)
        core.reset_for_child(parent_span, fork_ns)
        stages.training_id = None
        importing = getattr(sys.modules.get("lora_otel._boot.hooks"), "_importing", None)
        if importing:  # a thread inside a traced import at the fork (it does not exist here)
            importing.clear()
        core.defer_journal(
            paths.child_journal_path(parent_path, core.pid)
            if parent_path
            else paths.choose_journal_path(sys.argv, os.environ, core.pid, fork_ns / 1e9),
            _child_root,
        )
        os.environ["TRACEPARENT"] = _traceparent()
        reset = getattr(sys.modules.get("lora_otel._boot.narrate"), "reset", None)
        if reset is not None:
            reset()  # the parent's stages are not this process's (and a new lock, before the new beat)
        core.forked_at = 0
    finally:
        if locked:
            _settle_lock.release()


# --- beat -----------------------------------------------------------------------------------

_sidecar_pid = 0
"""The live-export sidecar this process started (0: none); the beat watches it."""
_sidecar_owner = 0
"""The pid of the process that started `_sidecar_pid` (a forked child has it in memory too)."""
_sidecar_log = ""


def _sidecar_gone(pid: int) -> bool:
    """The sidecar has died (killed, or an error): no process, or a zombie nobody reaped."""
    try:
        with open("/proc/%d/stat" % pid, "rb") as f:
            return f.read().rpartition(b")")[2].split()[:1] == [b"Z"]
    except FileNotFoundError:
        return True
    except OSError:
        return False  # cannot tell (no /proc): say nothing


def _check_sidecar() -> None:
    """Once, when the sidecar is gone while the job runs: live export has stopped; say so (stderr,
    journal) with how to ship the journal later. (A forked child leaves that to its parent.)"""
    global _sidecar_pid
    if _sidecar_pid and _sidecar_owner == core.pid and _sidecar_gone(_sidecar_pid):
        core.error_line(
            "live export stopped: the sidecar (pid %d) is gone (its log: %s); the journal goes "
            "on, ship it later with `lora-otel replay %s`" % (_sidecar_pid, _sidecar_log, core.journal_path)
        )
        _sidecar_pid = 0


_next_beat_ns = 0
"""When the next beat is due (monotonic ns; 0: one interval after the beat thread starts). A beat
thread restarted after a fork waits only for what is left of the interval."""
_beat_stop: Any = None
"""The running beat thread's wake-up lock (held while it waits): released, the thread ends (`_pause_beat`)."""
_beat_paused = False
_beat_begun: tuple[int, Any] | None = None
"""(pid, a lock held until that process's beat thread runs its first instruction): `threads_begun`."""

THREAD_BEGIN_WAIT_S = 2.0


def threads_begun() -> None:
    """At exit: wait until the threads lora_otel started have begun to run (at once, unless the
    machine is so loaded that a thread started a moment ago has not run yet; never more than
    `THREAD_BEGIN_WAIT_S`). A thread whose OS thread first runs after the interpreter has
    finalized crashes CPython 3.9 in its bootstrap (SIGSEGV in ``_PyThreadState_Init``: a ``python
    -c pass`` child of a job on a loaded machine, 2 runs in 100); a thread that has begun is
    stopped safely by the finalization."""
    api = sys.modules.get("lora_otel._boot.api")  # (not imported at exit when the program never used it)
    for begun in (_beat_begun, getattr(api, "converter_begun", None)):
        if begun is not None and begun[0] == os.getpid():  # (a forked child's are its parent's)
            begun[1].acquire(True, THREAD_BEGIN_WAIT_S)


def _wait_beat(wake: Any) -> bool:
    """Wait until the next beat is due; True when the thread is to end instead (``wake`` was
    released). A lock's timed wait: neither a patched ``time.sleep`` nor a frozen clock changes it."""
    global _next_beat_ns
    now = core.monotonic_ns()
    if not _next_beat_ns:
        _next_beat_ns = now + int(core.beat_interval * 1e9)
    if wake.acquire(True, max(_next_beat_ns - now, 0) / 1e9):
        return True
    _next_beat_ns = max(_next_beat_ns + int(core.beat_interval * 1e9), core.monotonic_ns())
    return False


ASYNC_SIGNALS = (1, 2, 3, 10, 12, 13, 14, 15, 16, 17, 18, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30)
"""The standard asynchronous signals (Linux numbers): HUP, INT, QUIT, USR1, USR2, PIPE, ALRM, TERM,
STKFLT, CHLD, CONT, TSTP, TTIN, TTOU, URG, XCPU, XFSZ, VTALRM, PROF, WINCH, POLL, PWR. Not the faults
(SEGV, BUS, FPE, ILL, TRAP, SYS, ABRT) and not the real-time ones (the stack request is one)."""


def _beat_loop(my_pid: int, wake: Any = None, begun: Any = None) -> None:
    if begun is not None:
        begun.release()
    from lora_otel._boot import hooks

    if sys.platform.startswith("linux"):
        # The program's signals are not ours to take: a program that blocks SIGTERM in its main
        # thread to take it with sigwaitinfo (the documented way) would otherwise have it delivered
        # here, where its default action ends the whole process, or Python's handler runs late.
        import _signal  # the C half of signal (no enum to build)

        with core.fail_open("beat signal mask"):
            _signal.pthread_sigmask(_signal.SIG_BLOCK, ASYNC_SIGNALS)
    narrate_loaded = False
    while core.active and os.getpid() == my_pid:
        if wake is not None:
            if _wait_beat(wake):
                return
        else:
            core.sleep(core.beat_interval)
        if not core.active or os.getpid() != my_pid:
            return
        if _forked_from_thread == my_pid and _only_thread_left():
            return
        if _standard_fd_closed():
            continue
        try:
            if not narrate_loaded:  # after the first sleep: a short program never pays for it
                promote("first beat")  # it lived a beat: a job, watched from now on
                from lora_otel._boot import narrate, where

                narrate_loaded = True
                where.set_cwd(_start_cwd)
            _guard_stacks_fd()
            with core.fail_open("--log copy"):
                core.check_log()
            if _program_closing_ours():
                continue
            narrate.note_interactive()
            core.beat()
            narrate.tick(core.now_ns(), core.main_frames)
            _check_stacks_fd()
            _answer_stack_ask()
            if _exit_watched != my_pid and core.promoted:
                _watch_exit()
            if _thread_errors_watched != my_pid and core.promoted:
                _watch_thread_errors()
            _exit_tick()
            if not hooks._importing:
                hooks._after_import()
            _check_sidecar()
            _check_stack_signal()
        except Exception as e:  # noqa: BLE001 - the beat must not die on a hook problem
            core._stderr("[lora-otel] beat: %s\n" % jsonl.printable("%s: %s" % (type(e).__name__, e)))


REOPEN_SETTLE_NS = 1_000_000_000
"""How long the beat thread waits, after it finds a descriptor of ours closed or reused by the
program, before a beat reopens it (`_program_closing_ours`)."""
_closed_seen_ns = 0
"""When the beat thread first found a descriptor of ours closed (monotonic ns); 0: all are open."""


def _program_closing_ours() -> bool:
    """Beat thread: whether the journal's, the stacks file's or the ``--log`` file's descriptor was
    found closed or reused by the program less than `REOPEN_SETTLE_NS` ago; then this beat does
    nothing. Reopening a file takes the lowest free number for a moment, and a program that has
    just closed every descriptor (``os.closerange(3, ...)``, the daemon idiom; on Python 3.9 a loop
    of 65,000 ``close`` calls the beat runs beside) opens its own files right after, counting on
    3, 4, ...; a second later it is done, and the reopen races no open of the program's. (The
    program's own thread, writing a record, reopens at once: its next open comes after.)"""
    global _closed_seen_ns, _next_beat_ns
    from lora_otel._boot import files

    closed = (
        (core._journal_fd >= 0 and not files.same(core._journal_fd, (core._journal_dev, core._journal_ino)))
        or (_stacks_fd >= 0 and not files.same(_stacks_fd, _stacks_id))
        or (core._log_fd >= 0 and not files.same(core._log_fd, (core._log_dev, core._log_ino)))
    )
    if not closed:
        _closed_seen_ns = 0
        return False
    now = core.monotonic_ns()
    if not _closed_seen_ns:
        _closed_seen_ns = now
    if now - _closed_seen_ns < REOPEN_SETTLE_NS:
        _next_beat_ns = min(_next_beat_ns, _closed_seen_ns + REOPEN_SETTLE_NS)  # (not a whole interval later)
        return True
    _closed_seen_ns = 0
    return False


STDIO_SETTLE_NS = 1_000_000_000
"""How long the beat thread waits for the program to give a closed descriptor 0, 1 or 2 back
(`_standard_fd_closed`) before it does its work anyway."""
STDIO_RETRY_NS = 20_000_000
"""How soon the beat looks again meanwhile."""
_stdio_closed_ns = 0
"""When the beat thread first found one of descriptors 0-2 closed (monotonic ns); 0: all are open."""


def _standard_fd_closed() -> bool:
    """Beat thread: whether descriptor 0, 1 or 2 is closed, for less than `STDIO_SETTLE_NS` yet;
    then this beat waits (`STDIO_RETRY_NS`, then again) and does nothing meanwhile.

    Every file the beat opens (the journal's reads, ``/proc``, a module it imports, the sidecar's
    pipes, what glibc opens for it) takes the lowest free number, so with 0-2 closed it takes one of
    those for a moment. A program that closes them for a while puts its own back with ``dup2``
    (CPython's test_subprocess ``test_close_fds_0_1_2``, a daemon pointing them at ``/dev/null``),
    and ``dup2`` closes whatever holds the number without a word: the beat then closed the
    program's restored stdin or the pipe it took that number for (EBADF in the program, 1 run in 7
    of test_subprocess under load; at every promotion in a loop that closes and restores 0-2).
    A program that keeps one closed for good (started with ``<&-``) gets its beats a second late,
    once. Three ``fstat`` per beat (~1 µs)."""
    global _stdio_closed_ns, _next_beat_ns
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            break
        except Exception:  # noqa: BLE001 - never into the beat
            return False
    else:
        _stdio_closed_ns = 0
        return False
    now = core.monotonic_ns()
    if not _stdio_closed_ns:
        _stdio_closed_ns = now
    if now - _stdio_closed_ns < STDIO_SETTLE_NS:
        _next_beat_ns = min(_next_beat_ns, now + STDIO_RETRY_NS)
        return True
    return False


BEAT_STACK = 256 * 1024
"""The beat thread's stack: what it needs with room to spare, not the 8 MiB default (``ulimit -s``),
which a program under a finite address-space limit would have lost."""
NPROC_ROOM = 16
"""Tasks (processes and threads) that must stay free under ``RLIMIT_NPROC`` for the beat thread to start."""


def beat_off_reason() -> str:
    """Why this process gets no beat thread ("" when it does): its resources are the program's.

    Under a finite ``RLIMIT_AS`` (``ulimit -v``) a thread costs address space (its stack, and the
    malloc arena glibc gives a thread that allocates: 64 MiB reserved), which the program's largest
    allocation would lose. Under ``RLIMIT_NPROC`` (``ulimit -u``), a thread is a task of the user's:
    where fewer than `NPROC_ROOM` are left, the program's own fork or thread would fail because of
    ours. Without a beat, the watchdog does not call the process frozen (``config.beat_off``); its
    stages are still journaled and still stall. ``/proc/self/limits`` is read (``import resource``
    would cost ~1 ms at every start)."""
    text = _read_small("/proc/self/limits")
    address_space = nproc = b"unlimited"
    for line in text.splitlines():
        if line.startswith(b"Max address space"):
            address_space = line[26:].split()[0]
        elif line.startswith(b"Max processes"):
            nproc = line[26:].split()[0]
    if address_space != b"unlimited":
        return "RLIMIT_AS is %s bytes (ulimit -v): a thread would take address space from the program" % (
            address_space.decode()
        )
    if nproc != b"unlimited":
        try:
            limit = int(nproc)
        except ValueError:
            return ""
        used = _tasks_of_user(limit) if _tasks_of_all() + NPROC_ROOM >= limit else 0
        if used + NPROC_ROOM >= limit:
            return (
                "RLIMIT_NPROC is %d (ulimit -u) and this user runs %d tasks: a thread would take one "
                "the program may need" % (limit, used)
            )
    return ""


def _tasks_of_all() -> int:
    """How many tasks the whole machine runs (``/proc/loadavg``, one small read): a bound on any
    user's, so that the count of this user's (a read per process) is needed only when it is near."""
    try:
        return int(_read_small("/proc/loadavg").split()[3].partition(b"/")[2])
    except (ValueError, IndexError):
        return 1 << 30


def _read_small(path: str) -> bytes:
    """A small ``/proc`` file's bytes (b"" when it cannot be read): two system calls, no file object."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return b""
    try:
        return os.read(fd, 8192)
    except OSError:
        return b""
    finally:
        os.close(fd)


def _tasks_of_user(stop: int) -> int:
    """How many tasks (threads) this process's real user runs, counting no further than ``stop``."""
    uid = b"%d" % os.getuid()
    count = 0
    try:
        names = os.listdir("/proc")
    except OSError:
        return 0
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open("/proc/%s/status" % name, "rb") as f:
                status = f.read()
        except OSError:
            continue
        i = status.find(b"\nUid:")
        t = status.find(b"\nThreads:")
        if i < 0 or t < 0 or status[i + 5 :].split()[:1] != [uid]:
            continue
        count += int(status[t + 9 :].split()[0])
        if count >= stop:
            break
    return count


def _start_beat() -> None:
    """The beat thread, on a small stack (set for our thread only, and only while no other Python
    thread could start one meanwhile); none where `beat_off_reason` says so."""
    if core.beat_off:
        return
    old = -1
    try:
        if not _thread._count():  # no other Python thread: the size is ours alone until restored
            old = _thread.stack_size(BEAT_STACK)
    except (ValueError, RuntimeError):  # a platform that cannot set it
        old = -1
    global _beat_stop, _beat_begun
    wake = _thread.allocate_lock()
    wake.acquire()
    begun = _thread.allocate_lock()
    begun.acquire()
    # Born with the program's asynchronous signals blocked (a thread inherits its creator's mask):
    # until the thread's own first instruction blocks them, a signal the program's thread blocks
    # (to take it with sigwait, or later) went to the beat thread and its handler ran at once
    # (CPython's test_signal test_pthread_sigmask, a loaded machine). Put back right after.
    signals = sys.modules.get("_signal") if sys.platform.startswith("linux") else None
    mask = None
    try:
        if signals is not None:
            mask = signals.pthread_sigmask(signals.SIG_BLOCK, ASYNC_SIGNALS)
    except (OSError, ValueError, AttributeError):
        mask = None
    try:
        _thread.start_new_thread(_beat_loop, (core.pid, wake, begun))
        _beat_stop, _beat_begun = wake, (os.getpid(), begun)
    finally:
        if old >= 0:
            _thread.stack_size(old)
        if mask is not None:
            signals.pthread_sigmask(signals.SIG_SETMASK, mask)  # type: ignore[union-attr]


_forked_from_thread = 0
"""The pid of this process when it is a child forked from a thread other than its parent's main one
(`_only_thread_left` is asked only there: it opens a file, and the beat opens nothing it need not)."""


def _only_thread_left() -> bool:
    """Whether every other thread of this process has ended without the interpreter's exit: a child
    forked from a thread, whose thread then returned. CPython ends such a process when its last
    thread ends, so the beat thread must end too, or it keeps the process alive for ever (CPython's
    test_threading). The kernel then shows the main thread as a zombie still counted among the
    threads (``/proc/self/stat``: state ``Z``, 2 threads: it and this one)."""
    fields = _read_small("/proc/self/stat").rpartition(b")")[2].split()
    return len(fields) > 17 and fields[0] == b"Z" and fields[17] == b"2"


def _os_threads() -> int:
    """This process's threads, as the kernel counts them (what Python 3.12+ counts to warn at a fork)."""
    try:
        return int(_read_small("/proc/self/stat").rpartition(b")")[2].split()[17])
    except (ValueError, IndexError):
        return 0


def _pause_beat() -> None:
    """Before ``os.fork`` on Python 3.12+, where the beat thread is the only other thread: end it,
    and wait (50 ms at most) until the kernel no longer counts it, so that the fork does not warn
    ``DeprecationWarning: This process is multi-threaded, use of fork() may lead to deadlocks``
    because of lora_otel. The beat starts again after the fork, in both processes, on its old
    schedule. Where the program has threads of its own, the warning is its own: nothing is done."""
    global _beat_stop, _beat_paused
    wake = _beat_stop
    if wake is None or _thread._count() > 1 or _os_threads() != 2:
        return  # (a Python thread of the program's besides the beat: known without reading /proc,
        # whose read gives up the GIL, and the main thread may run on into its finalization)
    caller = sys._getframe(2)  # (0: here, 1: the fork hook, 2: who forks)
    if caller.f_code.co_filename.endswith("subprocess.py"):
        return  # `subprocess` forks to exec at once and does not warn
    if not _fork_warning_shown(caller):
        return  # filtered out (multiprocessing's forks, by Python's default filters): nothing to avoid
    _beat_stop, _beat_paused = None, True
    wake.release()
    deadline = core.monotonic_ns() + 50_000_000
    while _os_threads() > 1 and core.monotonic_ns() < deadline:
        core.sleep(0.0002)


def _fork_warning_shown(frame: Any) -> bool:
    """Whether Python's warning filters would show the fork warning raised for ``frame``'s line:
    by default only in ``__main__`` (``ignore::DeprecationWarning`` elsewhere, as in
    multiprocessing's fork workers). ``error`` counts as not shown: CPython drops that exception."""
    warnings = sys.modules.get("warnings")
    filters = getattr(warnings, "filters", None)
    if filters is None:
        return True
    module = frame.f_globals.get("__name__", "")
    text = "This process (pid=%d) is multi-threaded, use of fork() may lead to deadlocks in the child." % os.getpid()
    action = getattr(warnings, "defaultaction", "default")
    for f in filters:
        try:
            f_action, msg, category, mod, lineno = f
            if (
                (msg is None or msg.match(text))
                and issubclass(DeprecationWarning, category)
                and (mod is None or mod.match(module))
                and (not lineno or lineno == frame.f_lineno)
            ):
                action = f_action
                break
        except (TypeError, ValueError, AttributeError):
            return True
    return action not in ("ignore", "error")


def _after_fork_parent() -> None:
    global _beat_paused
    if _beat_paused:
        _beat_paused = False
        with _FORK_HOOK:
            _start_beat()
