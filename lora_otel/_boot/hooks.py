"""Hooks that turn what the program does into spans, with no change to its code.

- **imports**: ``builtins.__import__`` is wrapped; each *top-level* import statement the program
  makes of a module not yet loaded becomes a span ``import <module>`` (nested imports run inside
  it untraced). ``importlib.import_module`` does not go through ``__import__`` and is not traced.
- **argparse**: ``ArgumentParser.parse_known_args`` (which ``parse_args`` calls) is wrapped as
  soon as the program imports argparse; the first outermost return ends the ``arguments`` span.
  A parse that takes the option lora_otel's log file came from (``--log``) as a flag, a choice, a
  number or a file the program reads stops the copy there (`core.drop_log`) before it returns.
- **torch**: as soon as torch is loaded, :mod:`lora_otel._boot.torch_hooks` (loaded then, not
  before) counts optimizer steps, opens ``training`` at the first one, and makes CUDA's
  initialisation and first probe spans.
- **frameworks**: when ``transformers.trainer``, ``lightning.pytorch``/``pytorch_lightning`` or
  ``accelerate`` finishes loading (also lazily, through ``importlib``), the matching module of
  :mod:`lora_otel.integrations` instruments it (a ``sys.meta_path`` entry sees the load).
- **children's ends**: ``os.wait``/``waitpid``/``wait3``/``wait4``/``waitid`` (so ``subprocess`` and
  multiprocessing, which reap with them) journal each child they reap as a ``child exit`` event
  on the root span: its pid, exit code or signal, core dump. A child killed without a word (SIGKILL,
  the OOM killer) so still has its end said, by its parent.
- **child processes**: ``subprocess`` and multiprocessing's spawn hand a child started inside a
  span a ``TRACEPARENT`` naming that span, so its ``process`` span hangs under the stage, import
  or ``training`` that started it (forked children already do).

Every wrapper runs its own bookkeeping inside :class:`~lora_otel._boot.core.fail_open` and calls
the original exactly once, whatever happens to the bookkeeping.
"""

from __future__ import annotations

import builtins
import os
import sys
from _thread import RLock, get_ident

from lora_otel._boot import core, stages
from lora_otel._boot.stages import arguments_done

TYPE_CHECKING = False
if TYPE_CHECKING:  # pragma: no cover - never true at runtime: no typing import in the process
    from argparse import ArgumentParser
    from collections.abc import Callable, Mapping, MutableMapping, Sequence
    from importlib.machinery import ModuleSpec
    from types import ModuleType, TracebackType
    from typing import Any, TypeVar

    from typing_extensions import Concatenate, ParamSpec

    _F = TypeVar("_F", bound=Callable[..., object])
    _P = ParamSpec("_P")
    _R = TypeVar("_R")

_orig_import = builtins.__import__
_importing: dict[int, bool] = {}  # thread id -> True while a traced import runs in that thread
_argparse_done = False
_torch_done = False
_modules = sys.modules
# Imports made by the standard library itself (argparse's lazy ``import shutil``, site's
# ``import sitecustomize``) and by lora_otel are not the program's: they are not traced.
_STDLIB_DIR = os.path.dirname(os.__file__) + os.sep


HEAVY_MODULES = frozenset(
    (
        # Deep-learning frameworks and the libraries that load them: each loads native code (CUDA,
        # NCCL, XLA) and is where a job's first minutes go. The first import of one makes the
        # process a job (`core.promote`) before the import runs, so a freeze inside it is watched.
        "torch",
        "torchvision",
        "torchaudio",
        "tensorflow",
        "keras",
        "jax",
        "jaxlib",
        "flax",
        "paddle",
        "mxnet",
        "onnxruntime",
        "tensorrt",
        "transformers",
        "datasets",
        "accelerate",
        "deepspeed",
        "lightning",
        "pytorch_lightning",
        "peft",
        "trl",
        "diffusers",
        "vllm",
        "bitsandbytes",
        "xformers",
        "flash_attn",
        "triton",
        "unsloth",
        "sentence_transformers",
        "optimum",
        "megatron",
        "apex",
        "colossalai",
    )
)
"""Modules whose first import makes a process a job (`core.promote`), whoever imports them."""
NATIVE_BY_HAND = frozenset(("ctypes", "cffi"))
"""Modules that make a job of a process when its *own* code imports them (not a library's): a
program calling C by hand may hold the GIL there from its first second (``ctypes.PyDLL(None).pause()``)."""


def _maybe_promote(name: str, module_globals: Mapping[str, object] | None) -> None:
    """Make the process a job before the first import of a heavy module (`HEAVY_MODULES`), or of
    `NATIVE_BY_HAND` by the program's own code."""
    top = name.partition(".")[0]
    if top in HEAVY_MODULES or (
        top in NATIVE_BY_HAND and _program_import(module_globals) and not _library_import(module_globals)
    ):
        core.promote("import " + top)


def _after_import() -> None:
    """Install the hooks for modules that have just become available (cheap when none have)."""
    if not _argparse_done and "argparse" in _modules:
        with core.fail_open("argparse hook"):
            install_argparse_hook()
    if not _torch_done and "torch" in _modules:
        torch = _modules["torch"]
        if getattr(torch, "optim", None) is not None and getattr(torch, "cuda", None) is not None:
            with core.fail_open("torch hooks"):
                install_torch_hooks(torch)
    if _integrations:
        _check_integrations()


def install_torch_hooks(torch: ModuleType) -> None:
    """Install :mod:`lora_otel._boot.torch_hooks` on ``torch`` (once; loaded only now, so a process
    that never imports torch never loads it)."""
    global _torch_done
    _torch_done = True
    from lora_otel._boot import torch_hooks

    torch_hooks.install(torch)


def _module_facts(name: str) -> dict[str, str]:
    attrs: dict[str, str] = {}
    mod = _modules.get(name)
    top = name.partition(".")[0]
    version = getattr(_modules.get(top), "__version__", None)
    if not isinstance(version, str) and top not in getattr(sys, "stdlib_module_names", ()):
        # (A stdlib module has no package version: 3.13 imports linecache for ``python -c``, which
        # loaded envfacts in every ``python -c pass``.)
        from lora_otel._boot import envfacts

        version = envfacts.package_version(top)
    if version:
        attrs["lora_otel.package.version"] = str(version)
    f = getattr(mod, "__file__", None)
    if isinstance(f, str):
        attrs["code.filepath"] = f
    return attrs


def _program_import(module_globals: Mapping[str, Any] | None) -> bool:
    """Whether an import statement with these module globals is the program's own."""
    if not module_globals:
        return True
    modname = module_globals.get("__name__")
    if isinstance(modname, str) and modname.startswith("lora_otel"):
        return False
    f = module_globals.get("__file__")
    return not (isinstance(f, str) and f.startswith(_STDLIB_DIR) and "-packages" not in f)


def _stdlib_by_stdlib(name: str, by: Mapping[str, object] | None) -> bool:
    """Whether module ``name`` is the standard library's and so is the code importing it."""
    return bool(by) and not _program_import(by) and _stdlib_module(name)


def _stdlib_module(name: str) -> bool:
    """Whether the top-level package of ``name`` is the standard library's, by where it loads from
    (a name is not enough: a program's own ``code/`` or ``test/`` package has a stdlib name): a
    built-in or frozen module, or one whose file lies in the standard library's folder outside
    site-packages. Asked only for the rare imports that come without an importing module (a direct
    ``__import__`` call, an import made from C); a finder that fails says "not the library's"."""
    top = name.partition(".")[0]
    if top in sys.builtin_module_names:
        return True
    mod = _modules.get(top)
    if mod is not None:
        origin = getattr(mod, "__file__", None)
        if origin is None and getattr(getattr(mod, "__spec__", None), "origin", None) == "frozen":
            return True
    else:
        try:
            import _imp

            if _imp.is_frozen(top):
                return True
            spec = next((s for s in (_find_spec(f, top) for f in sys.meta_path) if s is not None), None)
        except Exception:  # noqa: BLE001 - a finder of the program's that fails: no claim made
            return False
        origin = getattr(spec, "origin", None)
        if origin == "frozen":
            return True
    return isinstance(origin, str) and origin.startswith(_STDLIB_DIR) and "-packages" not in origin


def _find_spec(finder: object, name: str) -> object:
    find = getattr(finder, "find_spec", None)
    return find(name, None) if find is not None else None


def _caller_globals() -> Mapping[str, object] | None:
    """The globals of the code that called ``__import__`` directly (two frames up from here)."""
    try:
        return sys._getframe(2).f_globals
    except ValueError:  # (no such frame: called from C at the bottom of the stack)
        return None


def _importer(module_globals: Mapping[str, object] | None) -> str:
    return str((module_globals or {}).get("__name__") or "?")


def _library_import(module_globals: Mapping[str, object] | None) -> bool:
    """Whether the importing code lives in an installed package (site-packages/dist-packages)."""
    f = (module_globals or {}).get("__file__")
    return isinstance(f, str) and "-packages" in f


# ``warnings.warn(..., stacklevel=n)`` and ``logging`` do not count the import machinery's frames
# when they look for the code to blame: a frame whose file name contains "importlib" and
# "_bootstrap" is skipped. The import hook's frames sit inside that machinery, so their code says
# so in its file name: a module's import-time warning then names the line that imported it and is
# shown or hidden by the default filters exactly as without lora_otel. (Tracebacks still show the
# frame, with its source.) The name is a real path to this file, through the empty folder
# `importlib_bootstrap/` beside it: `python -m trace --count` and coverage open a code object's
# file, and failed on a name that was no file (`hooks.py (importlib._bootstrap)`, hostile trial).
_MARK_DIR = os.path.join(os.path.dirname(__file__), "importlib_bootstrap")
_IMPORT_MACHINERY_FILE = (
    os.path.join(_MARK_DIR, os.pardir, os.path.basename(__file__))
    if os.path.isdir(_MARK_DIR)
    else __file__ + " (importlib._bootstrap)"  # an install without the folder: skipped all the same
)


def _as_import_machinery(func: _F) -> _F:
    """``func`` with its frames skipped by ``warnings``' stack levels, like importlib's own."""
    func.__code__ = func.__code__.replace(co_filename=_IMPORT_MACHINERY_FILE)
    return func


@_as_import_machinery
def traced_import(
    name: str,
    globals: Mapping[str, object] | None = None,  # noqa: A002 - builtins.__import__'s own parameter names
    locals: Mapping[str, object] | None = None,  # noqa: A002
    fromlist: Sequence[str] | None = (),
    level: int = 0,
) -> ModuleType:
    """``builtins.__import__`` replacement: a span around each top-level import of a new module.
    An exception of the import leaves without this frame in its traceback (`_without_own_frame`)."""
    if level or not isinstance(name, str) or name in _modules or not core.active:
        try:
            return _orig_import(name, globals, locals, fromlist, level)
        except BaseException as e:
            _without_own_frame(e)
            raise
    tid = get_ident()
    # Who imports: an import statement passes its module's globals; a direct ``__import__(name)``
    # call passes none (runpy's import of ``python -m pkg.mod``'s package, importlib's fromlist
    # imports: the program's, as they always were), and its caller is the importer. A standard
    # library module imported so by standard library code (the codec search's ``encodings.idna``
    # inside a download) is no span of the program's. The interpreter's own imports come from C
    # with no Python code on the stack and globals that name no module (3.12+ imports runpy so for
    # ``python -m``, after site has run): a standard library module imported so is no span either.
    # Globals that are no dict (``__import__("csv", 5)`` works without lora_otel) count as none; any
    # oddity in them leaves the import untraced, as it is without lora_otel.
    try:
        own = globals if isinstance(globals, dict) else None
        by = own if own is not None else _caller_globals()
        untraced = (
            tid in _importing
            or not _program_import(own)
            or (own is None and _stdlib_by_stdlib(name, by))
            or (
                not (own or {}).get("__name__")
                and (by if own is None else _caller_globals()) is None  # (no Python code called)
                and _stdlib_module(name)
            )
        )
    except Exception:  # noqa: BLE001 - odd globals of the program's: the import as without lora_otel
        untraced, by = True, None
    if untraced:
        if not core.promoted:
            with core.fail_open("import hook"):
                _maybe_promote(name, globals)
        try:
            return _orig_import(name, globals, locals, fromlist, level)
        except BaseException as e:
            _without_own_frame(e)
            raise
    _importing[tid] = True
    sid = None
    try:
        with core.fail_open("import hook"):
            if not core.promoted:
                _maybe_promote(name, globals)
            sid = core.span_start("import " + name, {"lora_otel.module": name})
        try:
            mod = _orig_import(name, globals, locals, fromlist, level)
        except BaseException as e:
            if sid is not None:
                with core.fail_open("import hook"):
                    text = "%s: %s" % (type(e).__name__, e)
                    if isinstance(e, ImportError) and _library_import(by):
                        # A library probing for an optional package: a fact, not the job's error.
                        core.span_end(
                            sid, "ok", attrs={"lora_otel.import.error": text, "lora_otel.import.by": _importer(by)}
                        )
                    else:
                        core.span_end(sid, "error", text, {"lora_otel.import.by": _importer(by)})
            _without_own_frame(e)
            raise
        if sid is not None:
            facts: dict[str, str] = {}
            try:
                with core.fail_open("import hook"):
                    facts = _module_facts(name)  # runs the module's __getattr__, if it has one
            finally:  # (also when a Ctrl-C lands there: it is the program's, the span still ends)
                with core.fail_open("import hook"):
                    facts["lora_otel.import.by"] = _importer(by)
                    core.span_end(sid, "ok", attrs=facts)
    finally:
        _importing.pop(tid, None)
    _after_import()
    return mod


def _without_own_frame(e: BaseException) -> None:
    """Take `traced_import`'s own entry off the head of ``e``'s traceback, before a bare ``raise``
    re-raises it: the program's traceback (printed, logged, walked by pdb's post-mortem) shows its
    import statement, then the module that failed, as without lora_otel — the interpreter already
    hides its own import machinery so. On 3.11+ a bare ``raise`` re-raises ``e.__traceback__``.

    3.9 and 3.10 re-raise the traceback the ``except`` caught, kept in the thread's "exception
    being handled" (``sys.exc_info()``), which already holds this frame; every other way out of a
    Python frame (``raise e.with_traceback(...)``, a ``finally``, a ``with``) adds the frame again
    on the way through, and Python code cannot set ``sys.exc_info()``. So there the handled
    exception is replaced through the C API's ``PyErr_SetExcInfo`` (`_set_exc_info`), only on this
    path: an import that failed."""
    tb = e.__traceback__
    if tb is not None and tb.tb_frame.f_code is traced_import.__code__:
        e.__traceback__ = tb.tb_next
        if sys.version_info < (3, 11):
            _set_exc_info(e, tb.tb_next)


_exc_info_api: list[Any] = []
"""``[Py_IncRef, PyErr_SetExcInfo]`` once loaded (3.9, 3.10); ``[]`` before, ``[None]`` when unavailable."""


def _set_exc_info(e: BaseException, tb: TracebackType | None) -> None:
    """Make ``(type(e), e, tb)`` the exception this thread is handling (``sys.exc_info()``), which
    a bare ``raise`` re-raises on 3.9 and 3.10. Through ``_ctypes`` alone (not ``ctypes``, whose
    import would be the program's), loaded at the first failed import; fails open: unavailable (no
    ``_ctypes``, no ``/proc``-less dlopen), the frame stays in the traceback, as before."""
    try:
        if not _exc_info_api:
            _exc_info_api.append(None)  # (tried once)
            from lora_otel._boot import stdlib

            c = stdlib.module("_ctypes")

            class _Object(c._SimpleCData):  # type: ignore[misc, name-defined]  # ctypes.py_object
                _type_ = "O"

            flags = c.FUNCFLAG_CDECL | c.FUNCFLAG_PYTHONAPI

            class _IncRef(c.CFuncPtr):  # type: ignore[misc, name-defined]
                _flags_, _argtypes_, _restype_ = flags, (_Object,), None

            class _SetExcInfo(c.CFuncPtr):  # type: ignore[misc, name-defined]
                _flags_, _argtypes_, _restype_ = flags, (_Object, _Object, _Object), None

            handle = c.dlopen(None, c.RTLD_LOCAL)  # the interpreter's own symbols, as ctypes.pythonapi
            _exc_info_api[:] = [_IncRef(c.dlsym(handle, "Py_IncRef")), _SetExcInfo(c.dlsym(handle, "PyErr_SetExcInfo"))]
        incref, set_exc_info = _exc_info_api if len(_exc_info_api) == 2 else (None, None)
        if set_exc_info is None or incref is None:
            return
        triple = (type(e), e, tb)
        for obj in triple:  # PyErr_SetExcInfo takes over one reference to each
            incref(obj)
        set_exc_info(*triple)
    except Exception:  # noqa: BLE001 - fail open: the traceback keeps the frame, as before
        pass


def install_import_hook() -> None:
    if builtins.__import__ is not traced_import:
        builtins.__import__ = traced_import
    install_os_system_hook()
    install_wait_hooks()
    if _integration_finder not in sys.meta_path:
        sys.meta_path.insert(0, _integration_finder)
    _after_import()


# --- framework integrations ----------------------------------------------------------------

# Module -> the module of lora_otel.integrations that instruments it, or a hook of this module's
# (installed by name, see below). An entry leaves once installed, so the checks cost nothing after
# that (and a dict lookup before).
_integrations: dict[str, str] = {
    "transformers.trainer": "transformers",
    "lightning.pytorch": "lightning",
    "pytorch_lightning": "lightning",
    "accelerate": "accelerate",
    "transformers.hf_argparser": "hf_args",  # HfArgumentParser.parse_dict/parse_yaml_file end arguments
    "transformers.modeling_utils": "hf_models",  # from_pretrained: "load model"
    "datasets.arrow_dataset": "datasets",  # Dataset.map/filter: "prepare dataset"
    "subprocess": "install_subprocess_hook",
    "bdb": "install_bdb_hook",  # pdb's step passes over lora_otel's frames
    "multiprocessing.util": "install_mp_spawn_hook",  # loaded lazily, when a spawn starts
    "multiprocessing.process": "install_mp_terminate_hook",
}
_INTEGRATION_MODULES = tuple(_integrations)


class _IntegrationFinder:
    """A ``sys.meta_path`` entry that installs an integration the moment its framework module ran.

    transformers loads ``transformers.trainer`` lazily through ``importlib`` (no import statement
    the import hook could see). For a watched module this finder asks the other finders for the
    spec and wraps that spec's loader's ``exec_module``, so the integration goes in before any
    code can use the module; for every other module it is one dict lookup and finds nothing.
    """

    def find_spec(
        self, name: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if not core.promoted and name in HEAVY_MODULES and core.active:
            # (loaded through importlib too, which the import hook does not see)
            with core.fail_open("integration finder"):
                core.promote("import " + name)
        if name not in _integrations or not core.active:
            return None
        spec = None
        with core.fail_open("integration finder"):
            spec = _watched_spec(name, path, target)
        return spec


_integration_finder = _IntegrationFinder()


def _watched_spec(name: str, path: Sequence[str] | None, target: ModuleType | None) -> ModuleSpec | None:
    for finder in sys.meta_path:
        find = getattr(finder, "find_spec", None) if finder is not _integration_finder else None
        spec: ModuleSpec | None = find(name, path, target) if find is not None else None
        if spec is not None:
            return _watch_loader(name, spec)
    return None


def _watch_loader(name: str, spec: ModuleSpec) -> ModuleSpec:
    """``spec`` with its loader's ``exec_module`` wrapped to install the integration for ``name``."""
    loader = spec.loader
    orig = getattr(loader, "exec_module", None)
    if loader is None or orig is None or getattr(orig, "_lora_otel", False):
        return spec

    def exec_module(module: ModuleType) -> None:
        orig(module)
        if getattr(module, "__name__", None) == name:  # a loader shared by many modules (zipimport)
            _install_integration(name, module)

    _as_import_machinery(exec_module)
    exec_module._lora_otel = True  # type: ignore[attr-defined]
    # This spec's own loader object, made for this module (mypy sees a method of the class).
    loader.exec_module = exec_module  # type: ignore[method-assign]
    return spec


def _check_integrations() -> None:
    """Install integrations whose module is loaded already (imported before the preamble ran)."""
    for name in _INTEGRATION_MODULES:
        if name in _integrations:
            mod = _modules.get(name)
            if mod is not None and not getattr(getattr(mod, "__spec__", None), "_initializing", False):
                _install_integration(name, mod)


def _install_integration(name: str, module: ModuleType) -> None:
    kind = _integrations.pop(name, None)
    if kind is None or not core.active:
        return
    with core.fail_open("%s integration" % kind):
        if kind.startswith("install_"):
            globals()[kind](module)
            return
        from lora_otel._boot import frameworks as integrations

        integrations.install(kind, module)


# --- processes started inside a span --------------------------------------------------------

# The environment's TRACEPARENT names the root span (set once by the preamble). A process started
# while a span is open (a stage, an import, training) should hang under that span instead, so
# ``subprocess`` and multiprocessing's spawn get a TRACEPARENT naming it, for that child only.

UI_MODULES = ("gradio", "uvicorn", "streamlit")
"""Web UI servers (kohya_ss and lora-scripts run on these): a traced process that has one loaded
starts each run as a trace of its own (`run_gets_own_trace`)."""


def run_gets_own_trace() -> bool:
    """Whether a process started now from outside any span begins a trace of its own, linked to this
    one by ``LORA_OTEL_LAUNCHED_BY`` (root attributes ``lora_otel.launched_by.*``), instead of
    hanging under this process's root span: ``LORA_OTEL_TRACE_PER_RUN=1``/``0``, else whether a
    web UI server is loaded (a UI session launches many runs over days; one trace each is what a
    backend can show)."""
    setting = os.environ.get("LORA_OTEL_TRACE_PER_RUN", "").strip()
    if setting in ("0", "1"):
        return setting == "1"
    return any(name in _modules for name in UI_MODULES)


def child_env_changes() -> dict[str, str | None] | None:
    """What a child process started now from this thread needs in its environment, or None (the
    inherited one, naming the root span, is right).

    Inside a span, ``{"TRACEPARENT": <that span>}``: the thread's innermost span, or at the top of a
    thread while ``training`` is open, ``training`` (a DataLoader starting its workers). Outside any
    span of a UI (`run_gets_own_trace`), no TRACEPARENT and ``LORA_OTEL_LAUNCHED_BY`` (None: remove)."""
    core.settle()  # a forked child names its own spans (and its TRACEPARENT) from here on
    if not core.active or os.getpid() != core.pid:
        return None
    core.await_promotion()  # another thread's promotion puts the sidecar's registry in os.environ
    sid = core.current_span_id()
    if sid == core.root_id and stages.training_id is not None and stages.training_id in core.open_spans:
        sid = stages.training_id
    if sid and sid != core.root_id:
        return {"TRACEPARENT": core.traceparent(sid)}
    if run_gets_own_trace():
        return {"TRACEPARENT": None, "LORA_OTEL_LAUNCHED_BY": core.traceparent(core.root_id)}
    return None


def _apply(env: MutableMapping[str, str], changes: Mapping[str, str | None]) -> None:
    for key, value in changes.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value


_OWN_MODULES = ("lora_otel._boot.", "lora_otel.integrations.")
"""Modules whose frames run inside the program's calls (the import hook, wrapped functions)."""


def install_bdb_hook(bdb: ModuleType) -> None:
    """pdb (and any debugger built on ``bdb``) never stops in lora_otel's own frames: ``step`` on an
    import statement stops where it stops without lora_otel (importlib's first frame, or the
    module's code), not in `traced_import`; nor in a wrapper of a function the program calls. A
    frame of these modules is one ``Bdb.stop_here`` says no to, as for the modules of pdb's own
    ``skip``: not traced line by line, while the frames it calls still are. A breakpoint set in
    lora_otel's files still stops there."""
    cls = getattr(bdb, "Bdb", None)
    orig = getattr(cls, "stop_here", None)
    if cls is None or orig is None or getattr(orig, "_lora_otel", False):
        return

    def stop_here(self: object, frame: Any) -> bool:
        name = frame.f_globals.get("__name__")
        if isinstance(name, str) and name.startswith(_OWN_MODULES):
            return False
        return bool(orig(self, frame))

    stop_here._lora_otel = True  # type: ignore[attr-defined]
    stop_here.__wrapped__ = orig  # type: ignore[attr-defined]
    cls.stop_here = stop_here


def install_subprocess_hook(subprocess: ModuleType) -> None:
    """Wrap ``subprocess.Popen._execute_child`` (every subprocess call, ``os.popen`` too) with
    `child_env_changes`. An ``env`` the caller built keeps its own TRACEPARENT unless that is the
    inherited one (``os.environ.copy()`` and edits)."""
    popen = getattr(subprocess, "Popen", None)
    orig = getattr(popen, "_execute_child", None)
    if popen is None or orig is None or getattr(orig, "_lora_otel", False):
        return

    def _execute_child(
        self: object,
        args: object,
        executable: object,
        preexec_fn: object,
        close_fds: object,
        pass_fds: object,
        cwd: object,
        env: Any,
        *rest: object,
    ) -> object:
        global preexec_fork
        with core.fail_open("subprocess hook"):
            changes = child_env_changes()
            inherited = core.traceparent(core.root_id)  # now: a forked child has a root of its own
            if env is None and _overrides:  # another thread's os.system has set its span's variables
                env = _environ_as_before()
            if changes is not None and (env is None or (hasattr(env, "get") and env.get("TRACEPARENT") == inherited)):
                env = dict(os.environ if env is None else env)
                _apply(env, changes)
        if preexec_fn is None:
            return orig(self, args, executable, preexec_fn, close_fds, pass_fds, cwd, env, *rest)
        preexec_fork = get_ident()  # the fork hooks run (preexec_fn is Python); the child execs from C
        try:
            return orig(self, args, executable, preexec_fn, close_fds, pass_fds, cwd, env, *rest)
        finally:
            preexec_fork = 0

    _execute_child._lora_otel = True  # type: ignore[attr-defined]
    popen._execute_child = _execute_child
    _reap_through_hook(subprocess, popen)


def _reap_through_hook(subprocess: ModuleType, popen: Any) -> None:
    """``subprocess`` loaded before the wait hooks (``import lora_otel.auto`` late) took the plain
    ``os.waitpid`` for ``Popen.poll``: give it the hooked one."""
    hooked = os.waitpid
    plain = getattr(hooked, "__wrapped__", None)
    if plain is None or getattr(subprocess, "_waitpid", None) is not plain:
        return
    subprocess._waitpid = hooked  # type: ignore[attr-defined]  # subprocess's own module global
    poll = getattr(popen, "_internal_poll", None)
    defaults = getattr(poll, "__defaults__", None)
    if type(defaults) is tuple and plain in defaults:
        poll.__defaults__ = tuple(hooked if value is plain else value for value in defaults)  # type: ignore[union-attr]


preexec_fork = 0
"""The thread starting a ``subprocess`` with ``preexec_fn`` right now (its id), else 0: a child
forked then runs the fork hooks and execs from C (`preamble._subprocess_exec_target`)."""

# A call that starts a process inheriting the C environment (``os.system``, multiprocessing's
# spawn) gets its TRACEPARENT from ``os.environ``. The variables are set for the duration of the
# call, with no lock held across it: concurrent calls of the program's threads run concurrently
# (a child started by one thread in the moment another thread's call sets its own variables may
# name that other span: the same trace). The first call to begin notes what the variables were;
# the last to end puts that back.

_environ_lock = RLock()
"""Held while `_override_environ` and `_restore_environ` do their bookkeeping (a few dict operations,
never the call itself). Reentrant: a signal handler that starts a process while its thread holds
it goes on. Renewed in a forked child (`_after_fork_in_child`)."""
_overrides: list[object] = []
"""One token per call now running with its `child_env_changes` made in ``os.environ``."""
_environ_before: dict[str, str | None] = {}
"""What the overridden variables were before the first of those calls (None: unset)."""
_environ_set: dict[str, str | None] = {}
"""The last value a call gave each variable: it is put back only while it still holds that value
(else the program has set it since, and its value stays)."""


def _override_environ(token: object, changes: Mapping[str, str | None]) -> None:
    with _environ_lock:
        if not _overrides:
            _environ_before.clear()
            _environ_set.clear()
        _overrides.append(token)
        for key in changes:
            if key not in _environ_before:
                _environ_before[key] = os.environ.get(key)
        _apply(os.environ, changes)
        _environ_set.update(changes)


def _restore_environ(token: object) -> None:
    with _environ_lock:
        if token not in _overrides:
            return
        _overrides.remove(token)
        if _overrides:
            return
        before, ours = dict(_environ_before), dict(_environ_set)
        _environ_before.clear()
        _environ_set.clear()
        _put_back(os.environ, before, ours)


def _put_back(env: MutableMapping[str, str], before: Mapping[str, str | None], ours: Mapping[str, str | None]) -> None:
    """``env``'s variables set to ``before`` where they still hold what an override set (``ours``)."""
    _apply(env, {key: value for key, value in before.items() if env.get(key) == ours.get(key)})


def _environ_as_before() -> dict[str, str]:
    """``os.environ`` as it is without the variables calls running now have set (for a child that
    does not inherit from those calls' spans)."""
    with _environ_lock:
        env = dict(os.environ)
        before, ours = dict(_environ_before), dict(_environ_set)
    _put_back(env, before, ours)
    return env


def _in_child_environ(orig: Callable[_P, _R], where: str) -> Callable[_P, _R]:
    """``orig`` (a call that starts a process inheriting the C environment: multiprocessing's
    spawn, ``os.system``) run with `child_env_changes` made in ``os.environ`` for its duration."""

    def call(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        changes = None
        with core.fail_open(where):
            changes = child_env_changes()
            if changes is None and _overrides:  # another thread's call has set its span's variables
                changes = dict(_environ_before)
        if not changes:
            return orig(*args, **kwargs)
        token = object()
        try:
            with core.fail_open(where):
                _override_environ(token, changes)
            return orig(*args, **kwargs)
        finally:
            with core.fail_open(where):
                _restore_environ(token)

    call._lora_otel = True  # type: ignore[attr-defined]
    call.__wrapped__ = orig  # type: ignore[attr-defined]
    return call


def _after_fork_in_child() -> None:
    """In a forked child: a new `_environ_lock` (another thread may have held the old one at the
    fork), and the variables of calls still running in the parent put back as they were (the
    threads that would have put them back do not exist here)."""
    global _environ_lock
    _environ_lock = RLock()
    if _overrides:
        del _overrides[:]
        _put_back(os.environ, _environ_before, _environ_set)
        _environ_before.clear()
        _environ_set.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def install_mp_spawn_hook(util: ModuleType) -> None:
    """Wrap ``multiprocessing.util.spawnv_passfds`` (spawn and forkserver start methods)."""
    orig = getattr(util, "spawnv_passfds", None)
    if orig is not None and not getattr(orig, "_lora_otel", False):
        # multiprocessing.util's own function (mypy sees only a module).
        util.spawnv_passfds = _in_child_environ(orig, "multiprocessing hook")  # type: ignore[attr-defined]


TERMINATED_CHILD = "terminated child"
"""The root span event a process writes before it stops a child of its own with ``terminate()`` or
``kill()`` (``multiprocessing.Pool`` does, for its workers, when it shuts down): the readers judge
that child, gone without an exit record, as stopped by its parent, not killed."""


def install_mp_terminate_hook(process: ModuleType) -> None:
    """Wrap ``multiprocessing.process.BaseProcess.terminate`` and ``kill``: journal which child is
    about to be stopped, then stop it as asked."""
    cls = getattr(process, "BaseProcess", None)
    for method, signal_name in (("terminate", "SIGTERM"), ("kill", "SIGKILL")):
        orig = getattr(cls, method, None)
        if orig is not None and not getattr(orig, "_lora_otel", False):
            setattr(cls, method, _journal_stop(orig, signal_name))


def _journal_stop(orig: Callable[[Any], _R], signal_name: str) -> Callable[[Any], _R]:
    def stop(self: Any) -> _R:
        with core.fail_open("multiprocessing terminate hook"):
            popen = getattr(self, "_popen", None)
            if core.active and popen is not None and popen.poll() is None:
                core.span_event(
                    core.root_id,
                    TERMINATED_CHILD,
                    {
                        "process.pid": popen.pid,
                        "lora_otel.signal": signal_name,
                        "lora_otel.process.name": str(getattr(self, "name", "")),
                    },
                )
        return orig(self)

    stop._lora_otel = True  # type: ignore[attr-defined]
    stop.__wrapped__ = orig  # type: ignore[attr-defined]
    return stop


# --- children's ends ------------------------------------------------------------------------

CHILD_EXIT = "child exit"
"""The root span event a process writes for each child it reaps (``os.wait*``, hence ``subprocess``
and multiprocessing): ``child.pid``, ``child.exit_code`` (it exited) or ``child.signal`` (a name
such as ``SIGKILL``: it was killed), ``child.core_dumped``; and, for a SIGKILL, ``child.oom_kills``:
the ``oom_kill`` count of this process's memory cgroup just after (`lora_otel.analysis.ends`
compares it with the count before)."""

# Linux's numbers (x86, arm, powerpc, s390: all but alpha, mips and sparc). The `signal` module is
# not imported for this: it costs 4 ms (enum) and a process that reaps a child may not have it.
_SIGNAL_NAMES = (
    "",
    "SIGHUP",
    "SIGINT",
    "SIGQUIT",
    "SIGILL",
    "SIGTRAP",
    "SIGABRT",
    "SIGBUS",
    "SIGFPE",
    "SIGKILL",
    "SIGUSR1",
    "SIGSEGV",
    "SIGUSR2",
    "SIGPIPE",
    "SIGALRM",
    "SIGTERM",
    "SIGSTKFLT",
    "SIGCHLD",
    "SIGCONT",
    "SIGSTOP",
    "SIGTSTP",
    "SIGTTIN",
    "SIGTTOU",
    "SIGURG",
    "SIGXCPU",
    "SIGXFSZ",
    "SIGVTALRM",
    "SIGPROF",
    "SIGWINCH",
    "SIGIO",
    "SIGPWR",
    "SIGSYS",
)
_LINUX_NUMBERS = sys.platform.startswith("linux") and os.uname().machine.startswith(
    ("x86", "i686", "i386", "aarch64", "arm", "ppc", "s390", "riscv")
)


def signal_name(number: int) -> str:
    """``SIGKILL`` for 9: the name of a signal number (``SIGRTMIN+2``, or ``signal 77`` when unknown)."""
    signal = _modules.get("signal")
    if signal is not None:
        try:
            name = signal.Signals(number).name
            if type(name) is str:
                return name
        except (ValueError, AttributeError):
            pass
        rtmin = getattr(signal, "SIGRTMIN", None)
        if type(rtmin) is int and rtmin <= number <= getattr(signal, "SIGRTMAX", rtmin):
            return "SIGRTMIN+%d" % (number - rtmin)
    if _LINUX_NUMBERS and 0 < number < len(_SIGNAL_NAMES):
        return _SIGNAL_NAMES[number]
    return "signal %d" % number


def _journal_reaped(pid: int, status: int) -> None:
    """The ``child exit`` event for a child reaped with wait status ``status`` (nothing for a
    stopped or continued child, or none reaped)."""
    if pid <= 0 or not core.active:
        return
    if os.WIFEXITED(status):
        attrs: dict[str, object] = {
            "child.pid": pid,
            "child.exit_code": os.WEXITSTATUS(status),
            "child.core_dumped": False,
        }
    elif os.WIFSIGNALED(status):
        number = os.WTERMSIG(status)
        attrs = {"child.pid": pid, "child.signal": signal_name(number), "child.core_dumped": os.WCOREDUMP(status)}
        if number == 9:
            _add_oom_kills(attrs)
    else:
        return
    core.span_event(core.root_id, CHILD_EXIT, attrs)


def _journal_waitid(result: object) -> None:
    """The ``child exit`` event from ``os.waitid``'s ``siginfo`` result (None: none ready)."""
    if result is None or not core.active:
        return
    code, pid, value = getattr(result, "si_code", None), getattr(result, "si_pid", 0), getattr(result, "si_status", 0)
    if type(pid) is not int or type(value) is not int or pid <= 0:
        return
    if code == getattr(os, "CLD_EXITED", 1):
        attrs: dict[str, object] = {"child.pid": pid, "child.exit_code": value, "child.core_dumped": False}
    elif code in (getattr(os, "CLD_KILLED", 2), getattr(os, "CLD_DUMPED", 3)):
        attrs = {
            "child.pid": pid,
            "child.signal": signal_name(value),
            "child.core_dumped": code == getattr(os, "CLD_DUMPED", 3),
        }
        if value == 9:
            _add_oom_kills(attrs)
    else:
        return
    core.span_event(core.root_id, CHILD_EXIT, attrs)


_memory_cgroup: tuple[int, str | None] | None = None
"""(pid, this process's memory cgroup) found at the first SIGKILLed child's reap, for the next ones."""


def _add_oom_kills(attrs: dict[str, object]) -> None:
    """``child.oom_kills``: this process's memory cgroup's ``oom_kill`` count now (one small read,
    and a few more the first time: made only for a child killed by SIGKILL)."""
    global _memory_cgroup
    from lora_otel._boot import cgroup

    pid = os.getpid()
    if _memory_cgroup is None or _memory_cgroup[0] != pid:
        _memory_cgroup = (pid, cgroup.memory_cgroup())
    kills = cgroup.oom_kill_count(_memory_cgroup[1])
    if kills is not None:
        attrs["child.oom_kills"] = kills


def install_wait_hooks() -> None:
    """Wrap ``os.wait``, ``waitpid``, ``wait3``, ``wait4`` and ``waitid``: each journals the child it
    reaped (`CHILD_EXIT`), then returns (or raises) exactly what the call did. Installed with the
    import hook, before ``subprocess`` (which takes ``os.waitpid`` when it loads) can be imported."""
    for name in ("wait", "waitpid", "wait3", "wait4"):
        orig = getattr(os, name, None)
        if orig is not None and not getattr(orig, "_lora_otel", False):
            setattr(os, name, _reaping(orig, name))
    orig_waitid = getattr(os, "waitid", None)
    if orig_waitid is not None and not getattr(orig_waitid, "_lora_otel", False):
        os.waitid = _reaping_waitid(orig_waitid)


def _reaping(orig: Callable[..., Any], name: str) -> Callable[..., Any]:
    where = "os.%s hook" % name

    def call(*args: Any, **kwargs: Any) -> Any:
        result = orig(*args, **kwargs)
        # (pid, status) from wait/waitpid, (pid, status, rusage) from wait3/wait4; pid 0: none ready
        if result[0]:
            with core.fail_open(where):
                _journal_reaped(result[0], result[1])
        return result

    call._lora_otel = True  # type: ignore[attr-defined]
    call.__wrapped__ = orig  # type: ignore[attr-defined]
    call.__name__ = orig.__name__
    call.__qualname__ = orig.__name__
    call.__doc__ = orig.__doc__
    return call


def _reaping_waitid(orig: Callable[..., Any]) -> Callable[..., Any]:
    nowait = getattr(os, "WNOWAIT", 0x01000000)

    def waitid(*args: Any, **kwargs: Any) -> Any:
        result = orig(*args, **kwargs)
        if result is not None:
            with core.fail_open("os.waitid hook"):
                options = args[2] if len(args) > 2 else kwargs.get("options", 0)
                if type(options) is int and not options & nowait:  # WNOWAIT: still to be reaped
                    _journal_waitid(result)
        return result

    waitid._lora_otel = True  # type: ignore[attr-defined]
    waitid.__wrapped__ = orig  # type: ignore[attr-defined]
    waitid.__name__ = orig.__name__
    waitid.__qualname__ = orig.__name__
    waitid.__doc__ = orig.__doc__
    return waitid


def install_os_system_hook() -> None:
    """Wrap ``os.system`` (a shell inheriting the C environment)."""
    orig = getattr(os, "system", None)
    if orig is not None and not getattr(orig, "_lora_otel", False):
        os.system = _in_child_environ(orig, "os.system hook")


# --- argparse ------------------------------------------------------------------------------

_parse_depth: dict[int, int] = {}


def install_argparse_hook() -> None:
    global _argparse_done
    _argparse_done = True
    import argparse

    cls = argparse.ArgumentParser
    # parse_args calls parse_known_args and may then exit on leftovers; wrap both, and let only
    # the outermost call of a thread decide.
    for attr in ("parse_args", "parse_known_args", "parse_intermixed_args", "parse_known_intermixed_args"):
        orig = getattr(cls, attr, None)
        if orig is not None and not getattr(orig, "_lora_otel", False):
            setattr(cls, attr, _wrap_parser_method(orig))


def _wrap_parser_method(
    orig: Callable[Concatenate[ArgumentParser, _P], _R],
) -> Callable[Concatenate[ArgumentParser, _P], _R]:
    def method(self: ArgumentParser, /, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        action = _log_action(self, args[0] if args else kwargs.get("args")) if core.log_option else None
        tid = get_ident()
        outer = not _parse_depth.get(tid)
        if outer:
            _parse_depth[tid] = 1
        try:
            result = orig(self, *args, **kwargs)
        except SystemExit as e:
            if action is not None:
                _judge_log_option(action, None)
            if outer:
                code = e.code
                with core.fail_open("argparse hook"):
                    failed = code not in (0, None)
                    arguments_done(
                        "argparse",
                        "error" if failed else "ok",
                        "argparse exited with status %s" % code if failed else None,
                    )
            raise
        finally:
            if outer:
                _parse_depth.pop(tid, None)
        if action is not None:
            _judge_log_option(action, result)
        if outer:
            with core.fail_open("argparse hook"):
                arguments_done("argparse")
        return result

    method._lora_otel = True  # type: ignore[attr-defined]
    method.__wrapped__ = orig  # type: ignore[attr-defined]
    method.__name__ = orig.__name__
    method.__doc__ = orig.__doc__
    return method


def _log_action(parser: ArgumentParser, args: object) -> object:
    """The parser's action for the option the log file was taken from (``core.log_option``), when
    this parse is given that option (``--log`` itself, or a prefix argparse would expand to one
    action); None otherwise, or on any error."""
    with core.fail_open("argparse hook"):
        option = core.log_option
        given = sys.argv[1:] if args is None else args
        if not isinstance(given, (list, tuple)):  # an iterator would be used up here
            return None
        if not any(type(a) is str and (a == option or a.startswith(option + "=")) for a in given):
            return None
        actions = getattr(parser, "_option_string_actions", None)
        if not isinstance(actions, dict):
            return None
        action = actions.get(option)
        if action is None and getattr(parser, "allow_abbrev", True):
            found = {id(a): a for name, a in actions.items() if name.startswith(option)}
            if len(found) == 1:  # argparse takes a unique prefix for the whole option name
                action = next(iter(found.values()))
        return action
    return None


def _judge_log_option(action: object, result: object) -> None:
    """After a parse that was given the log file's option, returning ``result`` (None: it exited):
    when the parser took that option (its value in the namespace is not the default) as no file
    path the program writes (`_not_a_path`), the copy stops (`core.drop_log`) before the program
    reads its arguments; taken as a plain value, the log file is confirmed and no parser is asked
    again. Exiting (an error, ``--help``) with a flag there stops the copy too."""
    with core.fail_open("argparse hook"):
        option = core.log_option
        if not option:
            return
        why = _not_a_path(action)
        if result is not None:
            ns = result[0] if type(result) is tuple else result
            dest = getattr(action, "dest", None)
            default = getattr(action, "default", None)
            value = getattr(ns, dest, default) if type(dest) is str else default
            if value is default or value == default:
                return  # not this parse's option (a launcher's REMAINDER holds the script's --log)
        if why:
            core.drop_log("%s is %s to this program (argparse)" % (option, why))
        elif result is not None:
            core.log_option = ""


def _not_a_path(action: object) -> str:
    """What an argparse action makes of its value when that is not a file path the program writes
    ("" otherwise): a flag (no value: ``store_true``, ``count``, ``nargs=0``), a choice, a number,
    or a file it reads (``FileType('r')``)."""
    if getattr(action, "nargs", None) == 0:
        return "a flag"
    choices = getattr(action, "choices", None)
    if choices is not None:
        return "one of %s" % ", ".join(str(c) for c in list(choices)[:6])
    kind = getattr(action, "type", None)
    if kind in (int, float, complex) or (isinstance(kind, type) and issubclass(kind, (int, float))):
        return "a number (type=%s)" % kind.__name__
    mode = getattr(kind, "_mode", None)  # argparse.FileType
    if isinstance(mode, str) and mode.startswith("r") and "+" not in mode:
        return "a file it reads (FileType(%r))" % mode
    return ""
