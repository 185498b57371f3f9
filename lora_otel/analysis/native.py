"""Which native library a thread waits in, and a thread pool that a forked child does not have.

A worker that "holds a task" while its Python frame calls into C (``torch.matmul``, a numpy BLAS
call, an OpenCV resize), or a main thread blocked in such a call, waits somewhere in a native
library. Its native frames (py-spy ``dump --native``: `lora_otel.analysis.evidence.native_facts`
for a worker, `evidence.gather` for the stalled process) say which: each frame's symbol, shared
object or (with debug information) source directory is looked up in one table, `LIBRARIES`
(``libgomp`` → OpenMP, ``mkl_`` → MKL, ``libopenblas`` → OpenBLAS, ``libnccl`` → NCCL,
``libcuda`` → the CUDA driver …); the C library's own frames (``pthread_cond_wait``,
``__lll_lock_wait``, ``sem_wait``) say only what kind of wait it is (a condition, a lock), so the
library named is the first one outside them, with the one that called it (MKL's sgemm calling
OpenMP); a wait the interpreter itself made (a Python lock, ``time.sleep``) names none.

Without native frames, each thread's system call (``/proc/<pid>/task/<tid>/syscall``: its program
counter, looked up in ``/proc/<pid>/maps``; nothing paused) says which object made it: a library
that waits with its own ``futex`` call (libgomp) is named so; one that waits through the C
library's ``pthread_cond_wait`` is not, and nothing is said.

A forked child (its journal's root ``lora_otel.activation`` is ``fork``) inherits the memory of
its parent's thread pools but none of their threads. A pool library (`Library.pool`) that the
parent had started — the child's journal records the threads the parent had besides the forking
one (``process.fork.parent_threads``) — and that none of the child's own threads is in (their
system calls), waits in the child for threads that do not exist, for ever (the libgomp-after-fork
hang, GCC bug 52303). The advice: start the workers with the ``spawn`` or ``forkserver`` start
method, or keep that library to one thread in the parent before it forks.

Pure functions of recorded evidence; standard library only.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Optional

NativeFrame = tuple[str, str]
"""``(symbol, where)`` of one frame as py-spy prints it: ``("gomp_team_barrier_wait_end",
"libgomp.so.1")``, ``("0x7faac541e073", "libgomp.so.1")`` (no symbol), ``("task", "job.py:12")``
(a Python frame)."""


@dataclass(frozen=True)
class Library:
    """One native library a thread can wait in: ``name`` in plain words, ``objects`` (shared-object
    name prefixes), ``symbols`` (symbol prefixes: statically linked copies, such as MKL inside
    ``libtorch_cpu.so``, are known by these), and ``pool`` (its worker threads, in words) when it
    keeps a thread pool that a forked child does not have; ``threads_setting`` limits that pool to
    one thread: an environment variable (``OMP_NUM_THREADS=1``) or a call (``cv2.setNumThreads(0)``)."""

    name: str
    objects: tuple[str, ...] = ()
    symbols: tuple[str, ...] = ()
    pool: str = ""
    threads_setting: str = ""
    sources: tuple[str, ...] = ()
    """Directories of its source tree, for a frame read with debug information
    (``…/libgomp/config/linux/wait.h:67``)."""


LIBRARIES: tuple[Library, ...] = (
    Library(
        "OpenMP",
        ("libgomp",),
        ("gomp_", "GOMP_", "omp_"),
        "OpenMP's thread pool",
        "OMP_NUM_THREADS=1",
        ("/libgomp/",),
    ),
    Library(
        "OpenMP",
        ("libiomp5", "libiomp"),
        ("__kmp", "__kmpc_", "kmp_"),
        "OpenMP's thread pool",
        "OMP_NUM_THREADS=1",
    ),
    Library("OpenMP", ("libomp.so", "libomp-"), (), "OpenMP's thread pool", "OMP_NUM_THREADS=1", ("/openmp/runtime/",)),
    Library("MKL", ("libmkl",), ("mkl_", "MKL_"), "MKL's threads", "MKL_NUM_THREADS=1"),
    Library(
        "OpenBLAS",
        ("libopenblas", "libscipy_openblas"),
        ("blas_thread_", "exec_blas", "openblas_", "scipy_openblas", "blas_memory_alloc"),
        "OpenBLAS's thread pool",
        "OPENBLAS_NUM_THREADS=1",
        ("/OpenBLAS/", "/openblas/"),
    ),
    Library("oneDNN", ("libdnnl",), ("dnnl::", "dnnl_")),
    Library("OpenCV", ("libopencv", "cv2."), ("cv::",), "OpenCV's thread pool", "cv2.setNumThreads(0)"),
    Library("TBB", ("libtbb",), ("tbb::",), "TBB's thread pool"),
    Library("NCCL", ("libnccl",), ("nccl",), sources=("/nccl/",)),
    Library("gloo", ("libgloo",), ("gloo::",)),
    Library("the CUDA driver", ("libcuda.so", "libcuda-")),
    Library("the CUDA runtime", ("libcudart",)),
    Library("cuBLAS", ("libcublas",)),
    Library("cuDNN", ("libcudnn",)),
    Library("the memory allocator (jemalloc)", ("libjemalloc",), ("je_", "jemalloc"), sources=("/jemalloc/",)),
    Library("the memory allocator (tcmalloc)", ("libtcmalloc",), ("tcmalloc::", "tc_")),
    Library("the dynamic loader (dlopen)", ("ld-linux", "ld64.so", "ld.so"), ("_dl_", "dlopen")),
    Library(
        "torch", ("libtorch", "libc10"), ("at::", "c10::", "torch::"), sources=("/aten/src/", "/c10/", "/torch/csrc/")
    ),
)
"""The libraries named in a sentence, most specific first: a frame's symbol is looked up before its
shared object (MKL and OpenMP frames live in ``libtorch_cpu.so`` in torch's wheels)."""

_WAITS: tuple[tuple[tuple[str, ...], str], ...] = (
    (("pthread_cond_", "__pthread_cond_", "___pthread_cond_"), "a condition"),
    (("pthread_mutex_lock", "__pthread_mutex_lock", "___pthread_mutex_lock", "__lll_lock_wait"), "a lock"),
    (("pthread_rwlock_", "__pthread_rwlock_"), "a lock"),
    (("pthread_barrier_wait",), "a barrier"),
    (("sem_wait", "sem_timedwait", "sem_clockwait", "do_futex_wait", "__new_sem_wait"), "a semaphore"),
    (("pthread_join", "__pthread_clockjoin", "__pthread_join"), "a thread to end"),
    (("poll", "__poll", "ppoll", "select", "__select", "epoll_wait", "__GI___poll"), "a descriptor"),
    (("read", "__libc_read", "recv", "__libc_recv", "recvmsg", "accept"), "a descriptor"),
    (("nanosleep", "__nanosleep", "clock_nanosleep", "__clock_nanosleep", "usleep", "sleep"), "a sleep"),
    (("futex", "__futex", "syscall"), "a futex (a lock or condition)"),
)
"""What a C library frame says about the wait itself (its kind, never its owner)."""
_FUTEX = _WAITS[-1][1]
_LIBC = ("libc.so", "libc-", "libpthread", "[vdso]", "linux-vdso", "libc.musl", "ld-musl")
_LIBC_SOURCES = ("/nptl/", "/sysdeps/", "/glibc", "/misc/", "/io/")
"""Where a C library frame read with its debug information is (``…/nptl/pthread_cond_wait.c:503``)."""
_INTERPRETER = ("libpython", "python3", "python", "libffi", "_ctypes")
_INTERPRETER_SOURCES = ("/Modules/", "/Python/", "/Objects/", "/Include/")
"""Where a frame of CPython read with its debug information is (``…/Modules/_ctypes/callproc.c:943``)."""
_INTERPRETER_SYMBOLS = ("Py", "_Py", "ffi_call", "_call_function_pointer", "_ctypes_", "take_gil", "drop_gil")
_PY_SOURCE = re.compile(r":\d+$")
_NATIVE_SOURCE = re.compile(r"\.(?:c|cc|cpp|cxx|h|hpp|rs|S|s):\d+$")
_HEADER = re.compile(r'^Thread (0x[0-9a-fA-F]+|\d+) \(([^)]*)\)(?::\s*"([^"]*)")?')


def is_python(where: str) -> bool:
    """A Python frame's place (``job.py:12``); a native one is ``libgomp.so.1`` or ``callproc.c:943``."""
    return _PY_SOURCE.search(where) is not None and _NATIVE_SOURCE.search(where) is None


def _object(where: str) -> str:
    return where.replace("\\", "/").rsplit("/", 1)[-1]


def _is_libc(where: str) -> bool:
    path = where.replace("\\", "/")
    return _object(path).startswith(_LIBC) or (
        _NATIVE_SOURCE.search(path) is not None and any(d in path for d in _LIBC_SOURCES)
    )


def _is_interpreter(symbol: str, where: str) -> bool:
    """A frame of CPython itself or of ctypes' call (libffi): the eval loop, a Python lock, a call."""
    path = where.replace("\\", "/")
    if _object(path).startswith(_INTERPRETER):
        return True
    if _NATIVE_SOURCE.search(path) is not None and any(d in path for d in _INTERPRETER_SOURCES):
        return True
    return _symbolized(symbol) and symbol.startswith(_INTERPRETER_SYMBOLS) and library_of(symbol, "") is None


def _symbolized(symbol: str) -> bool:
    return bool(symbol) and not symbol.startswith("0x")


def library_of(symbol: str, where: str) -> Optional[Library]:
    """The `LIBRARIES` entry of one native frame, by its symbol first, then its shared object."""
    if _symbolized(symbol):
        for library in LIBRARIES:
            if library.symbols and symbol.startswith(library.symbols):
                return library
    obj = _object(where)
    for library in LIBRARIES:
        if library.objects and obj.startswith(library.objects):
            return library
    if _NATIVE_SOURCE.search(where):  # read with debug information: its source file's directory
        path = where.replace("\\", "/")
        for library in LIBRARIES:
            if library.sources and any(d in path for d in library.sources):
                return library
    return None


def _wait_kind(symbol: str) -> str:
    name = symbol.lstrip("_") if _symbolized(symbol) else ""
    for prefixes, kind in _WAITS:
        if any(name.startswith(p.lstrip("_")) for p in prefixes):
            return kind
    return ""


def parse_dump(dump: str) -> list[tuple[str, str, list[NativeFrame]]]:
    """``(thread id, name, frames innermost first)`` of each thread in a ``py-spy dump --native``
    text. A C++ symbol may hold parentheses: the place is the last parenthesised group."""
    threads: list[tuple[str, str, list[NativeFrame]]] = []
    for line in dump.splitlines():
        head = _HEADER.match(line)
        if head:
            threads.append((head.group(1), head.group(3) or "", []))
            continue
        if not threads or not line.startswith((" ", "\t")):
            continue
        text = line.strip()
        if not text.endswith(")") or " (" not in text:
            continue
        symbol, _, where = text[:-1].rpartition(" (")
        threads[-1][2].append((symbol.strip(), where.strip()))
    return threads


def main_thread_frames(dump: str) -> list[NativeFrame]:
    """The main thread's frames (innermost first) in a ``py-spy dump --native`` text; [] if none."""
    threads = parse_dump(dump)
    named = [frames for _, name, frames in threads if name == "MainThread"]
    return named[0] if named else (threads[0][2] if threads else [])


@dataclass(frozen=True)
class NativeWait:
    """Where a thread waits in native code: ``library`` (None: none of `LIBRARIES`), its frame
    (``symbol``, ``obj``), the kind of wait its C library frames show (``wait``: "a condition"),
    the library that called it (``caller``, ``caller_symbol``), and the Python frame that called
    into native code (``python``: ``job.py:12 in task``)."""

    library: Optional[Library]
    obj: str
    symbol: str
    wait: str
    caller: Optional[Library]
    caller_symbol: str
    python: str

    def phrase(self, subject: str = "it", verb: str = "waits") -> str:
        """``it waits in OpenMP (libgomp.so.1, called by MKL's mkl_blas_sgemm_omp_driver_v1), called from
        job.py:12 in task``."""
        where = self.library.name if self.library is not None else "native code"
        inside = [_plain_symbol(self.symbol) if _symbolized(self.symbol) else "", self.obj]
        if self.caller is not None and self.caller is not self.library:
            inside.append(
                "called by %s%s"
                % (self.caller.name, "'s %s" % _plain_symbol(self.caller_symbol) if self.caller_symbol else "")
            )
        details = ", ".join(d for d in inside if d)
        text = "%s %s in %s%s" % (subject, verb, where, " (%s)" % details if details else "")
        if self.wait:
            text += " on %s" % self.wait
        if self.python:
            text += ", called from %s" % self.python
        return text


def _plain_symbol(symbol: str) -> str:
    """A C++ symbol without its template and argument lists: ``at::native::cpublas::gemm``."""
    depth, out = 0, []
    for ch in symbol:
        if ch in "<(":
            depth += 1
        elif ch in ">)":
            depth = max(0, depth - 1)
        elif depth == 0:
            out.append(ch)
    text = "".join(out).strip()
    return text if len(text) <= 60 else text[:59] + "\u2026"


def _python_place(symbol: str, where: str) -> str:
    file, _, line = where.rpartition(":")
    return "%s:%s in %s" % (_object(file), line, symbol.rsplit(".", 1)[-1])


def native_wait(frames: Sequence[NativeFrame]) -> Optional[NativeWait]:
    """Where a thread with these frames (innermost first) waits in native code, or None when its
    innermost frame is a Python one (no native frames read) or none of its native frames, short of
    the interpreter's own, tells anything."""
    if not frames or is_python(frames[0][1]):
        return None
    wait = ""
    found: Optional[tuple[Library, str, str]] = None
    unknown: Optional[tuple[str, str]] = None
    caller: Optional[tuple[Library, str]] = None
    python = ""
    interpreter = False
    for symbol, where in frames:
        if is_python(where):
            python = _python_place(symbol, where)
            break
        obj = _object(where)
        if found is None and unknown is None and _is_libc(where):
            kind = _wait_kind(symbol)
            if kind and (not wait or wait == _FUTEX):  # pthread_cond_wait says more than the futex under it
                wait = kind
            continue
        if _is_interpreter(symbol, where):
            if found is None and unknown is None:
                return None  # the C library's wait, called by the interpreter (a Python lock, time.sleep)
            interpreter = True  # (the eval loop, ctypes' call: no library past it, only the Python caller)
            continue
        if interpreter:
            continue
        library = library_of(symbol, where)
        if found is None and unknown is None:
            if library is not None:
                found = (library, symbol, obj)
            else:
                unknown = (symbol, obj)
            continue
        if found is not None and caller is None and library is found[0] and _better(found[1], symbol, library):
            found = (library, symbol, obj)  # (gomp_team_barrier_wait_end says more than its futex_wait)
            continue
        if caller is None and library is not None and (found is None or library is not found[0]):
            caller = (library, symbol if _symbolized(symbol) else "")
    if found is not None:
        library, symbol, obj = found
        return NativeWait(
            library, obj, symbol, wait, caller[0] if caller else None, caller[1] if caller else "", python
        )
    if unknown is not None:
        symbol, obj = unknown
        # a shared object none of the table knows (a C extension): named by its file, with its caller
        return NativeWait(None, obj, symbol, wait, caller[0] if caller else None, caller[1] if caller else "", python)
    return None  # only the C library's wait, called by the interpreter (a Python lock, time.sleep)


def _better(named: str, symbol: str, library: Library) -> bool:
    """Whether ``symbol``, a frame further out in the same library, names its wait better than
    ``named``: one of the library's own symbols where ``named`` is none (an address, a helper)."""
    own = bool(library.symbols) and _symbolized(symbol) and symbol.startswith(library.symbols)
    return own and not (_symbolized(named) and named.startswith(library.symbols))


def loaded(maps_objects: Iterable[str]) -> list[Library]:
    """The `LIBRARIES` among shared objects a process has mapped (``/proc/<pid>/maps``' file names),
    in the table's order."""
    names = [_object(str(o)) for o in maps_objects]
    return [lib for lib in LIBRARIES if lib.objects and any(n.startswith(lib.objects) for n in names)]


def known_objects(maps_text: str) -> list[str]:
    """The file names of ``/proc/<pid>/maps`` that one of `LIBRARIES` is known by, once each, in order."""
    seen: list[str] = []
    for line in maps_text.splitlines():
        parts = line.split(None, 5)
        if len(parts) < 6 or not parts[5].startswith("/"):
            continue
        name = _object(parts[5].strip())
        if name not in seen and any(lib.objects and name.startswith(lib.objects) for lib in LIBRARIES):
            seen.append(name)
    return seen


def executable_ranges(maps_text: str) -> list[tuple[int, int, str]]:
    """``(start, end, file name)`` of each executable mapping of a file in ``/proc/<pid>/maps``."""
    out: list[tuple[int, int, str]] = []
    for line in maps_text.splitlines():
        parts = line.split(None, 5)
        if len(parts) < 6 or "x" not in parts[1] or not parts[5].startswith("/"):
            continue
        lo, _, hi = parts[0].partition("-")
        try:
            out.append((int(lo, 16), int(hi, 16), _object(parts[5].strip())))
        except ValueError:
            continue
    return out


def syscall_object(syscall_text: str, ranges: Sequence[tuple[int, int, str]]) -> str:
    """The shared object whose code made the system call a thread waits in: the program counter,
    the last field of ``/proc/<pid>/task/<tid>/syscall`` (``202 0x… … 0x7ffc… 0x7f17…``), looked
    up in ``ranges`` (`executable_ranges`). ``running`` for a thread in no system call; "" when not
    known. A library that makes its own ``futex`` call (libgomp) is found so without a pause; one
    that waits through the C library's ``pthread_cond_wait`` shows as ``libc.so.6``."""
    fields = syscall_text.split()
    if fields[:1] == ["running"]:
        return "running"
    if len(fields) < 3:
        return ""
    try:
        pc = int(fields[-1], 16)
    except ValueError:
        return ""
    return next((name for lo, hi, name in ranges if lo <= pc < hi), "")


def in_library(row: Optional[Mapping[str, Any]]) -> bool:
    """Whether a ``process.children`` row's main thread waits in one of `LIBRARIES` by its system
    call (``syscalls``: its first entry is the main thread's) — a worker in a task, never one in its
    pool's wait for work (Python's own waits are the C library's)."""
    calls = row.get("syscalls") if row else None
    if not isinstance(calls, list) or not calls or not isinstance(calls[0], (list, tuple)) or len(calls[0]) != 2:
        return False
    return row is not None and calls[0][0] == row.get("pid") and library_of("", str(calls[0][1])) is not None


def fork_of(journal: Any) -> Optional[int]:
    """How many threads the parent of a forked child had besides the forking one and lora_otel's
    beat when it forked (``process.fork.parent_threads`` on the child's root span), or None when
    the child was not forked (or its journal does not say)."""
    root = getattr(journal, "root", None)
    attrs = getattr(root, "attrs", None) or {}
    if attrs.get("lora_otel.activation") != "fork":
        return None
    count = attrs.get("process.fork.parent_threads")
    return count if isinstance(count, int) and not isinstance(count, bool) else -1


@dataclass(frozen=True)
class WorkerNative:
    """What a worker's native evidence says: the phrase for its sentence, the advice it supports
    ("" when none), and attributes for the stall (``lora_otel.native.*``)."""

    phrase: str
    advice: str
    attrs: dict[str, Any]


def _advice(library: Library, caller: Optional[Library], torch_used: bool, who: str) -> str:
    """What to do about a pool lost in a fork: the spawn start method, or one thread in the parent."""
    settings = [library.threads_setting] if library.threads_setting else []
    if caller is not None and caller.threads_setting and caller.threads_setting not in settings:
        settings.append(caller.threads_setting)
    variables = [v for v in settings if not v.endswith(")")]  # OMP_NUM_THREADS=1; a call: cv2.setNumThreads(0)
    calls = [c for c in settings if c.endswith(")")]
    limit = ", or ".join((["%s in its environment" % " or ".join(variables)] if variables else []) + calls)
    if torch_used:
        limit = ("%s, or torch.set_num_threads(1)" % limit) if limit else "torch.set_num_threads(1)"
    if who == PROCESS:
        text = (
            "Start this process with the spawn start method — multiprocessing.set_start_method('spawn') in the "
            "program that starts it (or 'forkserver') — so that it starts %s threads of its own" % library.name
        )
    else:
        how = (
            "DataLoader(..., multiprocessing_context='spawn')"
            if who == DATALOADER
            else "multiprocessing.set_start_method('spawn') before they start (or 'forkserver')"
        )
        text = (
            "Start the workers with the spawn start method — %s — so that each worker starts %s threads of its own"
            % (
                how,
                library.name,
            )
        )
    if limit:
        text += "; or keep the parent to one thread before it forks: %s" % limit
    return text + "."


_TORCH_POOLS = ("OpenMP", "MKL")
WORKER, DATALOADER, PROCESS = "worker", "DataLoader worker", "process"
"""Whose wait `worker_native` reads: a pool's worker, a DataLoader's, or the stalled process itself."""


def _same(library: Library, obj: str) -> bool:
    return bool(obj) and library_of("", obj) is library


def worker_native(
    row: Optional[Mapping[str, Any]], journal: Any = None, dataloader: bool = False, who: str = WORKER
) -> Optional[WorkerNative]:
    """The native reading of one worker (its ``process.children`` row: ``native`` frames,
    ``syscalls`` — the shared object each thread's system call is made from, its main thread
    first — and ``libraries``; its journal for the fork), or None when the row holds no native
    evidence that names a library. ``who``: `WORKER`, `DATALOADER` (``dataloader`` True) or
    `PROCESS` (the stalled process itself: "The main thread waits in …")."""
    if not row:
        return None
    who = DATALOADER if dataloader else who
    native = row.get("native")
    frames = (
        [(str(f[0]), str(f[1])) for f in native if isinstance(f, (list, tuple)) and len(f) == 2]
        if isinstance(native, list)
        else []
    )
    wait = native_wait(frames) if frames else None
    calls = [c for c in row.get("syscalls") or () if isinstance(c, (list, tuple)) and len(c) == 2]
    main_call = str(calls[0][1]) if calls and calls[0][0] == row.get("pid") else ""
    if wait is None and main_call and library_of("", main_call) is not None:
        # no native frames: the object its main thread's system call is made from
        wait = NativeWait(library_of("", main_call), main_call, "", "", None, "", "")
    attrs: dict[str, Any] = {}
    if wait is None:
        return None
    forked = fork_of(journal) if journal is not None else None
    library = wait.library
    if library is not None:
        attrs["lora_otel.native.library"] = library.name
    if wait.obj:
        attrs["lora_otel.native.object"] = wait.obj
    if wait.caller is not None:
        attrs["lora_otel.native.caller"] = wait.caller.name
    running = str(row.get("state") or "").startswith("R")  # (running native code: a spin, a loop)
    phrase = wait.phrase("The main thread" if who == PROCESS else "it", "runs" if running else "waits")
    if running and wait.wait:
        phrase = phrase.replace(" on %s" % wait.wait, "", 1)  # (a frame's wait it has left)
    if not frames:
        phrase += " (its system call is made from there; %s)" % (
            "no native frames: %s" % row.get("native_error") if row.get("native_error") else "no native frames"
        )
    pool_lib = library if library is not None and library.pool else None
    # The pool's threads are not in the child: none of its other threads waits in that library.
    others = [str(c[1]) for c in calls[1:]]
    alone = bool(calls) and main_call != "" and pool_lib is not None and not any(_same(pool_lib, o) for o in others)
    if pool_lib is not None and forked is not None and forked != 0 and alone:
        attrs["lora_otel.native.fork_unsafe"] = True
        phrase += (
            " — %s, which its parent started before it forked this %s%s and a forked child does not have "
            "(none of its %d other thread%s is %s's): the pool's threads it waits for do not exist here, so the "
            "wait never ends"
            % (
                pool_lib.pool,
                "process" if who == PROCESS else "worker",
                _parent_threads(forked),
                len(others),
                "" if len(others) == 1 else "s",
                pool_lib.name,
            )
        )
        libraries = loaded(row.get("libraries") or ())
        # torch.set_num_threads sets OpenMP's and MKL's thread counts (its intra-op pool): not another library's
        torch_used = pool_lib.name in _TORCH_POOLS and (
            any(lib.name == "torch" for lib in libraries)
            or any(getattr(library_of(s, w), "name", "") == "torch" for s, w in frames)
        )
        return WorkerNative(phrase, _advice(pool_lib, wait.caller, torch_used, who), attrs)
    return WorkerNative(phrase, "", attrs)


def _parent_threads(count: int) -> str:
    if count is None or count < 0:
        return ""
    return " (the parent had %d other thread%s then)" % (count, "" if count == 1 else "s")
