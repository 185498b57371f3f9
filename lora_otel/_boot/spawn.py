"""Start the live-export sidecar for this process: detached, holding nothing of the launcher's.

Standard library only; called once by the preamble, when the process becomes a job
(``preamble.promote``: its first beat, a heavy import, a stage; at start under ``lora-otel run``).
The sidecar (``python -m lora_otel.export.sidecar``) is started without a fork of this process (no
``os.register_at_fork`` handler of the program runs, no ``os.fork`` audit event): ``os.posix_spawn``
starts a tiny intermediate (``/bin/sh``; this Python where there is no shell) in a new session
(``setsid``), which starts the sidecar in the background from "/", writes its pid on a pipe and
exits; it is reaped here. So the sidecar is never this process's child (``os.wait()`` in the
user's program never sees it) and has its own session (a terminal's Ctrl-C or a launcher killing
the process group does not reach it). The sidecar's stdin and stdout are ``/dev/null``, its stderr
its own log file beside the journal, and every other descriptor is closed before the
intermediate's exec: it never holds the launcher's pipes.

When is it started: for every job (a traced process that became one, see ``preamble.promote``; a
child of a job registers with the job's sidecar instead), unless ``LORA_OTEL_LIVE=0``. It exports
over OTLP (`exports`) with ``LORA_OTEL_LIVE=1``, or when an
OTLP endpoint is configured (``OTEL_EXPORTER_OTLP_ENDPOINT`` or ``..._TRACES_ENDPOINT``) and neither
``OTEL_SDK_DISABLED=true`` nor ``OTEL_TRACES_EXPORTER=none`` is set; otherwise it runs as the local
watchdog, which needs no OpenTelemetry SDK. ``LORA_OTEL_SIDECAR_PYTHON``
names the Python that runs it (default: this one), e.g. a separate virtual environment with
``lora_otel`` and the OpenTelemetry SDK installed, so that the training environment needs neither.
"""

from __future__ import annotations

import os
import sys

from lora_otel._boot import paths

TYPE_CHECKING = False
if TYPE_CHECKING:  # never true at runtime: no typing import
    from collections.abc import Callable, Mapping

REGISTRY_ENV = "LORA_OTEL_LIVE_REGISTRY"
"""``<sidecar pid>:<registry file>``, set for the children of a process that started a sidecar.

A traced child (a forked or spawned worker, a torchrun rank, anything started below) that finds it,
with that sidecar alive, starts no sidecar of its own: it appends its journal's path to the
registry file (``<journal stem>.children``) and the job's one sidecar follows it too."""

_OFF = ("0", "false", "no", "off")
_ON = ("1", "true", "yes", "on")


def wanted(env: Mapping[str, str]) -> bool:
    """Whether this process should start a sidecar: always, unless ``LORA_OTEL_LIVE=0``."""
    return env.get("LORA_OTEL_LIVE", "").strip().lower() not in _OFF


def exports(env: Mapping[str, str]) -> bool:
    """Whether the sidecar exports over OTLP (else it is the local watchdog; see the module docstring)."""
    live = env.get("LORA_OTEL_LIVE", "").strip().lower()
    if live in _OFF:
        return False
    if live in _ON:
        return True
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    if env.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower() == "none":
        return False
    return bool(
        env.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip() or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip()
    )


def log_path(journal_path: str) -> str:
    """``run.log.otel.jsonl`` → ``run.log.sidecar.log``: where the sidecar says what it did."""
    return paths.stem(journal_path) + ".sidecar.log"


def registry_path(journal_path: str) -> str:
    """``run.log.otel.jsonl`` → ``run.log.children``: the journals the sidecar also follows."""
    return paths.stem(journal_path) + ".children"


def join_parent_sidecar(journal_path: str, env: Mapping[str, str]) -> int:
    """Register this journal with the sidecar a parent started; its pid, or 0 when there is none alive."""
    pid_text, _, registry = env.get(REGISTRY_ENV, "").partition(":")
    if not pid_text.isdigit() or not registry:
        return 0
    pid = int(pid_text)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return 0
    except OSError:
        pass  # alive, not ours to signal
    if not _is_sidecar(pid, registry):
        return 0
    from lora_otel._boot import files

    try:
        fd = files.open_append(registry)  # no symlink, only a file of this user's
        try:
            os.write(fd, (os.path.abspath(journal_path) + "\n").encode("utf-8", "surrogateescape"))
        finally:
            os.close(fd)
    except OSError:
        return 0
    return pid


def _is_sidecar(pid: int, registry: str) -> bool:
    """Whether ``pid`` is a sidecar of this user's following ``registry`` (its ``/proc/<pid>/cmdline``
    names both; taken on trust where there is no ``/proc``). A variable left in a long-lived shell
    after its sidecar ended, with the pid reused, or one naming any live process (``1:...``), made
    every job below start no sidecar and go unwatched: a frozen job was never told while frozen."""
    if not os.path.isdir("/proc/self"):
        return True
    try:
        if os.stat("/proc/%d" % pid).st_uid != os.geteuid():
            return False
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            args = f.read(1 << 16).split(b"\0")
    except OSError:
        return False
    return b"lora_otel.export.sidecar" in args and os.fsencode(registry) in args


opened_log = ""
"""The sidecar log :func:`start` opened last (``log_path``, or a unique name beside it when that was taken)."""
opened_registry = ""
"""The children registry :func:`start` created last."""


def _package_root() -> str:
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _has_sdk(python: str) -> bool:
    """For this interpreter: is the OpenTelemetry SDK on its path? (a stat per entry, no import)"""
    if python != sys.executable:
        return True  # another environment: trust the user's setting; the sidecar log says otherwise
    return any(os.path.isdir(os.path.join(entry or ".", "opentelemetry", "sdk")) for entry in sys.path)


_POSIX_SPAWN: Callable[..., int] | None = getattr(os, "posix_spawn", None)


def start(
    journal_path: str,
    watched_pid: int,
    env: Mapping[str, str] | None = None,
    stderr_id: tuple[int, ...] | None = None,
    posix_spawn: Callable[..., int] | None = _POSIX_SPAWN,
    waitpid: Callable[[int, int], tuple[int, int]] = os.waitpid,
) -> tuple[int, None] | tuple[None, str]:
    """Start the sidecar. Returns ``(pid, None)``, or ``(None, one-line reason)`` when it cannot start.

    ``stderr_id``: ``(st_dev, st_ino)`` of this process's stderr at start (`core.stderr_id`), so
    the sidecar can write the lines this process cannot (frozen, killed) to that stderr only.
    ``posix_spawn``/``waitpid``: the interpreter's own, taken before the program could replace them
    (gevent's and eventlet's monkey-patching replace ``waitpid``, and theirs fails outside the main thread)."""
    env = os.environ if env is None else env
    python = env.get("LORA_OTEL_SIDECAR_PYTHON", "").strip() or sys.executable
    if not python or not os.access(python, os.X_OK):
        return None, "LORA_OTEL_SIDECAR_PYTHON=%s is not an executable Python" % python if env.get(
            "LORA_OTEL_SIDECAR_PYTHON"
        ) else "no Python executable to run the sidecar"
    if not os.path.isabs(python):
        python = os.path.abspath(python)  # the sidecar starts in "/": the file checked here, not one there
    try:
        if os.stat(python).st_mode & 0o170000 != 0o100000:
            return None, "cannot start the sidecar %s: not a file" % python
    except OSError as e:
        return None, "cannot start the sidecar %s: %s" % (python, e.strerror or e)
    if posix_spawn is None:
        return None, "cannot start the sidecar: this Python has no os.posix_spawn"
    if exports(env) and not _has_sdk(python):
        return None, (
            "the OpenTelemetry SDK is not installed for %s (pip install lora-otel with its "
            "dependencies, or set LORA_OTEL_SIDECAR_PYTHON to a Python that has it)" % python
        )
    global opened_log, opened_registry
    from lora_otel._boot import files

    # The registry is created here, new (or a unique name), so nobody can have prepared it.
    try:
        reg_fd, registry = files.open_sibling(os.path.abspath(registry_path(journal_path)))
        os.close(reg_fd)
    except OSError as e:
        return None, "cannot create the children registry %s (%s)" % (registry_path(journal_path), e.strerror or e)
    argv = [
        python,
        "-m",
        "lora_otel.export.sidecar",
        "--journal",
        os.path.abspath(journal_path),
        "--pid",
        str(watched_pid),
        "--children",
        registry,
    ]
    from lora_otel._boot import cgroup

    memory = cgroup.memory_cgroup()
    kills = cgroup.oom_kill_count(memory)
    if memory is not None and kills is not None:
        # The baseline from now: a job can be OOM-killed before the sidecar has even started.
        argv += ["--cgroup", memory, "--oom-kills", str(kills)]
    if stderr_id:
        argv += ["--stderr", "%d:%d" % tuple(stderr_id)]
        try:
            target = os.readlink("/proc/self/fd/2")
            import stat

            st = os.stat(target)
            if target.startswith("/") and stat.S_ISREG(st.st_mode) and (st.st_dev, st.st_ino) == tuple(stderr_id):
                argv += ["--stderr-path", target]
        except OSError:
            pass
    child_env = dict(env)
    # (LORA_OTEL_DOCTOR_FD: the doctor's check process's pipe, its own, never the sidecar's)
    for name in ("LORA_OTEL", "LORA_OTEL_JOURNAL", "LORA_OTEL_DOCTOR_FD"):
        child_env.pop(name, None)
    child_env["LORA_OTEL_SIDECAR"] = "1"  # lora_otel's own processes are not traced
    if python == sys.executable:
        # The sidecar runs from "/": make this lora_otel importable there as it is here.
        root = _package_root()
        old = child_env.get("PYTHONPATH")
        child_env["PYTHONPATH"] = root + (os.pathsep + old if old else "")
    try:
        log_fd, opened_log = files.open_sibling(log_path(journal_path))
    except OSError:
        log_fd, opened_log = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC), os.devnull
    opened_registry = registry
    try:
        open_fds = [int(name) for name in os.listdir("/proc/self/fd")]
    except (OSError, ValueError):
        open_fds = list(range(3, 1024))  # no /proc: the usual range (a close of a free number is ignored)
    pid_r = pid_w = -1
    try:
        pid_r, pid_w = os.pipe()
        pid_r, pid_w, log_fd = _above_stdio(pid_r), _above_stdio(pid_w), _above_stdio(log_fd)
        if os.access(SHELL, os.X_OK):
            # `sh -c SCRIPT PYTHON ARGS...`: the shell starts the sidecar in the background and
            # says its pid; the sidecar's stdout is /dev/null, not the pid pipe (else the read
            # below would wait for the sidecar's end).
            path, args = SHELL, [SHELL, "-c", _SCRIPT, python, *argv[1:]]
        else:  # no shell (a distroless image): this Python does the shell's part, at its own start's cost
            path, args = sys.executable, [sys.executable, "-I", "-S", "-c", _PY_SCRIPT, python, *argv[1:]]
        actions: list[tuple[int, ...] | tuple[int, int, str, int, int]] = [
            (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
            (os.POSIX_SPAWN_DUP2, pid_w, 1),
            (os.POSIX_SPAWN_DUP2, log_fd, 2),
        ]
        # Every other descriptor closed: the launcher's pipes, the program's files. (One closed
        # since the listing, or a close-on-exec one opened by another thread since: glibc ignores
        # the close of a free number, the exec closes the other.)
        actions += [(os.POSIX_SPAWN_CLOSE, fd) for fd in sorted(set(open_fds) | {pid_r, pid_w, log_fd}) if fd > 2]
        first = posix_spawn(path, args, child_env, file_actions=actions, setsid=True)
    except (OSError, ValueError, TypeError, AttributeError) as e:
        for fd in (log_fd, pid_r, pid_w):
            _close(fd)
        return None, "cannot start the sidecar's intermediate process (%s)" % (getattr(e, "strerror", None) or e)
    os.close(pid_w)
    _close(log_fd)
    try:
        waitpid(first, 0)
    except ChildProcessError:
        pass  # reaped already: the program ignores SIGCHLD, or its own os.wait() took it
    try:
        data = os.read(pid_r, 256)
    finally:
        os.close(pid_r)
    try:
        return int(data), None
    except ValueError:
        text = data.decode("utf-8", "replace").strip()
        return None, "cannot start the sidecar %s: %s" % (python, text[1:].strip() or "the intermediate process failed")


SHELL = "/bin/sh"
_SCRIPT = 'command cd / || exit; "$0" "$@" </dev/null >/dev/null & command echo $!'
"""The intermediate's work: start the sidecar from "/" in the background, say its pid, exit. The
sidecar is then the child of nobody in the job (``os.wait()`` in the program never sees it), and in
the session the intermediate was started in (``setsid``): not the job's. An exec that fails is said
by the shell in the sidecar's log, and by the job's next beat (`preamble._check_sidecar`).
(``command``: a shell function of that name exported by the program's environment is not run.)"""
_PY_SCRIPT = (
    "import os,sys\n"
    "os.chdir('/')\n"
    "try:\n"
    " p=os.posix_spawn(sys.argv[1],sys.argv[1:],os.environ,"
    "file_actions=[(os.POSIX_SPAWN_OPEN,1,os.devnull,os.O_WRONLY,0)])\n"
    "except OSError as e:\n"
    " p='-%s'%(e.strerror or e)\n"
    "os.write(1,str(p).encode())\n"
)
"""The same without a shell (``python -I -S -c``: nothing of the working directory, no site)."""


def _above_stdio(fd: int) -> int:
    """``fd``, or a copy numbered above 2 that replaces it (the program closed its stdin or stdout:
    the pipe took that number), so that the spawn's own 0-2 do not overwrite it before it moves there,
    and the program's ``dup2`` that puts its own 0-2 back does not close ours while the intermediate
    runs. The low number is closed only while it still names our file: a ``dup2`` of the program's
    onto it meanwhile made it the program's (its restored stdin), which is never ours to close."""
    if not 0 <= fd <= 2:
        return fd
    st = os.fstat(fd)
    new = _above_stdio(os.dup(fd))
    try:
        now = os.fstat(fd)
    except OSError:
        return new
    if (now.st_dev, now.st_ino) == (st.st_dev, st.st_ino):
        os.close(fd)
    return new


def _close(fd: int) -> None:
    if fd >= 0:
        try:
            os.close(fd)
        except OSError:
            pass


YAMA_PTRACE_SCOPE = "/proc/sys/kernel/yama/ptrace_scope"
PR_SET_PTRACER = 0x59616D61  # "Yama"


def allow_tracing_by(pid: int, scope_path: str = YAMA_PTRACE_SCOPE) -> bool:
    """Let the sidecar ``pid`` (and py-spy, its child) read this process's stacks with ptrace, where
    Yama's ``ptrace_scope`` is 1: then only an ancestor may trace a process, and the sidecar, started
    by an intermediate process, is none, unless the process names it with ``prctl(PR_SET_PTRACER, pid)``.

    Called once, when the process becomes a job and knows its sidecar. Under any other scope (0:
    any process of the same user may; 2, 3: only CAP_SYS_PTRACE, or nobody) it does nothing. It
    replaces a tracer the program itself may have named (a crash handler's): those are rare and
    set after start-up, when a later call of theirs replaces this one. Returns whether it was set;
    never raises."""
    try:
        with open(scope_path, "rb") as f:
            if f.read(8).strip() != b"1":
                return False
        from lora_otel._boot.stdlib import module

        ctypes = module("ctypes")  # (never a ctypes.py of the working directory)
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(PR_SET_PTRACER, ctypes.c_ulong(pid), 0, 0, 0) == 0)
    except Exception:  # noqa: BLE001 - not Linux, no Yama, no libc: the sidecar goes on without ptrace
        return False
