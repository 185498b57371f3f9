"""Hooks that turn what the program does into spans, with no change to its code.

- **imports**: ``builtins.__import__`` is wrapped; each *top-level* import statement the program
  makes of a module not yet loaded becomes a span ``import <module>`` (nested imports run inside
  it untraced). ``importlib.import_module`` does not go through ``__import__`` and is not traced.
- **argparse**: ``ArgumentParser.parse_known_args`` (which ``parse_args`` calls) is wrapped as
  soon as the program imports argparse; the first outermost return ends the ``arguments`` span.
- **torch**: as soon as torch is loaded, a global optimizer step hook (``torch.optim``'s
  ``register_optimizer_step_pre_hook``/``post_hook``) counts steps and opens ``training`` at the
  first one; ``torch.cuda._lazy_init`` is wrapped into the ``cuda init`` span and the first
  ``torch.cuda.is_available()`` into a ``cuda probe`` span.
- **frameworks**: when ``transformers.trainer``, ``lightning.pytorch``/``pytorch_lightning`` or
  ``accelerate`` finishes loading (also lazily, through ``importlib``), the matching module of
  :mod:`lora_otel.integrations` instruments it (a ``sys.meta_path`` entry sees the load).
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
import time
from _thread import allocate_lock, get_ident

from lora_otel._boot import core, stages
from lora_otel._boot.stages import arguments_done, ensure_training

_orig_import = builtins.__import__
_importing: dict = {}  # thread id -> True while a traced import runs in that thread
_argparse_done = False
_torch_done = False
_modules = sys.modules
# Imports made by the standard library itself (argparse's lazy ``import shutil``, site's
# ``import sitecustomize``) and by lora_otel are not the program's: they are not traced.
_STDLIB_DIR = os.path.dirname(os.__file__) + os.sep


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


def _module_facts(name: str) -> dict:
    attrs: dict = {}
    mod = _modules.get(name)
    top = name.partition(".")[0]
    version = getattr(_modules.get(top), "__version__", None)
    if not isinstance(version, str):
        from lora_otel._boot import envfacts

        version = envfacts.package_version(top)
    if version:
        attrs["lora_otel.package.version"] = str(version)
    f = getattr(mod, "__file__", None)
    if isinstance(f, str):
        attrs["code.filepath"] = f
    return attrs


def _program_import(globals) -> bool:
    """Whether an import statement with these module globals is the program's own."""
    if not globals:
        return True
    modname = globals.get("__name__") or ""
    if modname.startswith("lora_otel"):
        return False
    f = globals.get("__file__")
    if isinstance(f, str) and f.startswith(_STDLIB_DIR) and "-packages" not in f:
        return False
    return True


def _importer(globals) -> str:
    return str((globals or {}).get("__name__") or "?")


def _library_import(globals) -> bool:
    """Whether the importing code lives in an installed package (site-packages/dist-packages)."""
    f = (globals or {}).get("__file__")
    return isinstance(f, str) and "-packages" in f


# ``warnings.warn(..., stacklevel=n)`` and ``logging`` do not count the import machinery's frames
# when they look for the code to blame: a frame whose file name contains "importlib" and
# "_bootstrap" is skipped. The import hook's frames sit inside that machinery, so their code says
# so in its file name: a module's import-time warning then names the line that imported it and is
# shown or hidden by the default filters exactly as without lora_otel. (Tracebacks still show the
# frame, with its source: linecache finds it through the module's loader.)
_IMPORT_MACHINERY_FILE = __file__ + " (importlib._bootstrap)"


def _as_import_machinery(func):
    """``func`` with its frames skipped by ``warnings``' stack levels, like importlib's own."""
    func.__code__ = func.__code__.replace(co_filename=_IMPORT_MACHINERY_FILE)
    return func


@_as_import_machinery
def traced_import(name, globals=None, locals=None, fromlist=(), level=0):
    """``builtins.__import__`` replacement: a span around each top-level import of a new module."""
    if level or name in _modules or not core.active:
        return _orig_import(name, globals, locals, fromlist, level)
    tid = get_ident()
    if tid in _importing or not _program_import(globals):
        return _orig_import(name, globals, locals, fromlist, level)
    _importing[tid] = True
    sid = None
    try:
        with core.fail_open("import hook"):
            sid = core.span_start("import " + name, {"lora_otel.module": name})
        try:
            mod = _orig_import(name, globals, locals, fromlist, level)
        except BaseException as e:
            if sid is not None:
                with core.fail_open("import hook"):
                    text = "%s: %s" % (type(e).__name__, e)
                    if isinstance(e, ImportError) and _library_import(globals):
                        # A library probing for an optional package: a fact, not the job's error.
                        core.span_end(
                            sid, "ok", attrs={"lora_otel.import.error": text, "lora_otel.import.by": _importer(globals)}
                        )
                    else:
                        core.span_end(sid, "error", text, {"lora_otel.import.by": _importer(globals)})
            raise
        if sid is not None:
            with core.fail_open("import hook"):
                facts = _module_facts(name)
                facts["lora_otel.import.by"] = _importer(globals)
                core.span_end(sid, "ok", attrs=facts)
    finally:
        _importing.pop(tid, None)
    _after_import()
    return mod


def install_import_hook() -> None:
    if builtins.__import__ is not traced_import:
        builtins.__import__ = traced_import
    install_os_system_hook()
    if _integration_finder not in sys.meta_path:
        sys.meta_path.insert(0, _integration_finder)
    _after_import()


# --- framework integrations ----------------------------------------------------------------

# Module -> the module of lora_otel.integrations that instruments it, or a hook of this module's
# (installed by name, see below). An entry leaves once installed, so the checks cost nothing after
# that (and a dict lookup before).
_integrations: dict = {
    "transformers.trainer": "transformers",
    "lightning.pytorch": "lightning",
    "pytorch_lightning": "lightning",
    "accelerate": "accelerate",
    "subprocess": "install_subprocess_hook",
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

    def find_spec(self, name, path=None, target=None):
        if name not in _integrations or not core.active:
            return None
        spec = None
        with core.fail_open("integration finder"):
            spec = _watched_spec(name, path, target)
        return spec


_integration_finder = _IntegrationFinder()


def _watched_spec(name: str, path, target):
    for finder in sys.meta_path:
        find = getattr(finder, "find_spec", None) if finder is not _integration_finder else None
        spec = find(name, path, target) if find is not None else None
        if spec is not None:
            break
    else:
        return None
    orig = getattr(spec.loader, "exec_module", None)
    if orig is None or getattr(orig, "_lora_otel", False):
        return spec

    def exec_module(module):
        orig(module)
        if getattr(module, "__name__", None) == name:  # a loader shared by many modules (zipimport)
            _install_integration(name, module)

    _as_import_machinery(exec_module)
    exec_module._lora_otel = True  # type: ignore[attr-defined]
    spec.loader.exec_module = exec_module  # this spec's own loader object, made for this module
    return spec


def _check_integrations() -> None:
    """Install integrations whose module is loaded already (imported before the preamble ran)."""
    for name in _INTEGRATION_MODULES:
        if name in _integrations:
            mod = _modules.get(name)
            if mod is not None and not getattr(getattr(mod, "__spec__", None), "_initializing", False):
                _install_integration(name, mod)


def _install_integration(name: str, module) -> None:
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


def child_env_changes() -> dict | None:
    """What a child process started now from this thread needs in its environment, or None (the
    inherited one, naming the root span, is right).

    Inside a span, ``{"TRACEPARENT": <that span>}``: the thread's innermost span, or at the top of a
    thread while ``training`` is open, ``training`` (a DataLoader starting its workers). Outside any
    span of a UI (`run_gets_own_trace`), no TRACEPARENT and ``LORA_OTEL_LAUNCHED_BY`` (None: remove)."""
    if not core.active or os.getpid() != core.pid:
        return None
    sid = core.current_span_id()
    if sid == core.root_id and stages.training_id is not None and stages.training_id in core.open_spans:
        sid = stages.training_id
    if sid and sid != core.root_id:
        return {"TRACEPARENT": core.traceparent(sid)}
    if run_gets_own_trace():
        return {"TRACEPARENT": None, "LORA_OTEL_LAUNCHED_BY": core.traceparent(core.root_id)}
    return None


def _apply(env: dict, changes: dict) -> None:
    for key, value in changes.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value


def install_subprocess_hook(subprocess) -> None:
    """Wrap ``subprocess.Popen._execute_child`` (every subprocess call, ``os.popen`` too) with
    `child_env_changes`. An ``env`` the caller built keeps its own TRACEPARENT unless that is the
    inherited one (``os.environ.copy()`` and edits)."""
    popen = getattr(subprocess, "Popen", None)
    orig = getattr(popen, "_execute_child", None)
    if orig is None or getattr(orig, "_lora_otel", False):
        return

    def _execute_child(self, args, executable, preexec_fn, close_fds, pass_fds, cwd, env, *rest):
        with core.fail_open("subprocess hook"):
            changes = child_env_changes()
            inherited = core.traceparent(core.root_id)  # now: a forked child has a root of its own
            if changes is not None and (env is None or (hasattr(env, "get") and env.get("TRACEPARENT") == inherited)):
                env = dict(os.environ if env is None else env)
                _apply(env, changes)
        return orig(self, args, executable, preexec_fn, close_fds, pass_fds, cwd, env, *rest)

    _execute_child._lora_otel = True  # type: ignore[attr-defined]
    popen._execute_child = _execute_child


_environ_lock = allocate_lock()


def _in_child_environ(orig, where: str):
    """``orig`` (a call that starts a process inheriting the C environment: multiprocessing's
    spawn, ``os.system``) run with `child_env_changes` made in ``os.environ`` for its duration."""

    def call(*args, **kwargs):
        changes = None
        with core.fail_open(where):
            changes = child_env_changes()
        if not changes:
            return orig(*args, **kwargs)
        with _environ_lock:
            before = {key: os.environ.get(key) for key in changes}
            _apply(os.environ, changes)
            try:
                return orig(*args, **kwargs)
            finally:
                _apply(os.environ, before)

    call._lora_otel = True  # type: ignore[attr-defined]
    call.__wrapped__ = orig  # type: ignore[attr-defined]
    return call


def install_mp_spawn_hook(util) -> None:
    """Wrap ``multiprocessing.util.spawnv_passfds`` (spawn and forkserver start methods)."""
    orig = getattr(util, "spawnv_passfds", None)
    if orig is not None and not getattr(orig, "_lora_otel", False):
        util.spawnv_passfds = _in_child_environ(orig, "multiprocessing hook")


TERMINATED_CHILD = "terminated child"
"""The root span event a process writes before it stops a child of its own with ``terminate()`` or
``kill()`` (``multiprocessing.Pool`` does, for its workers, when it shuts down): the readers judge
that child, gone without an exit record, as stopped by its parent, not killed."""


def install_mp_terminate_hook(process) -> None:
    """Wrap ``multiprocessing.process.BaseProcess.terminate`` and ``kill``: journal which child is
    about to be stopped, then stop it as asked."""
    cls = getattr(process, "BaseProcess", None)
    for method, signal_name in (("terminate", "SIGTERM"), ("kill", "SIGKILL")):
        orig = getattr(cls, method, None)
        if orig is not None and not getattr(orig, "_lora_otel", False):
            setattr(cls, method, _journal_stop(orig, signal_name))


def _journal_stop(orig, signal_name: str):
    def stop(self):
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


def install_os_system_hook() -> None:
    """Wrap ``os.system`` (a shell inheriting the C environment)."""
    orig = getattr(os, "system", None)
    if orig is not None and not getattr(orig, "_lora_otel", False):
        os.system = _in_child_environ(orig, "os.system hook")


# --- argparse ------------------------------------------------------------------------------

_parse_depth: dict = {}


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


def _wrap_parser_method(orig):
    def method(self, *args, **kwargs):
        tid = get_ident()
        if _parse_depth.get(tid):
            return orig(self, *args, **kwargs)
        _parse_depth[tid] = 1
        try:
            result = orig(self, *args, **kwargs)
        except SystemExit as e:
            code = e.code
            with core.fail_open("argparse hook"):
                failed = code not in (0, None)
                arguments_done(
                    "argparse", "error" if failed else "ok", "argparse exited with status %s" % code if failed else None
                )
            raise
        finally:
            _parse_depth.pop(tid, None)
        with core.fail_open("argparse hook"):
            arguments_done("argparse")
        return result

    method._lora_otel = True  # type: ignore[attr-defined]
    method.__wrapped__ = orig  # type: ignore[attr-defined]
    method.__name__ = orig.__name__
    method.__doc__ = orig.__doc__
    return method


# --- torch -----------------------------------------------------------------------------------


def _step_spans_every() -> int:
    """``LORA_OTEL_STEP_SPANS=N``: one ``step K`` span every N optimizer steps (default 0: none)."""
    text = os.environ.get("LORA_OTEL_STEP_SPANS", "").strip()
    if not text:
        return 0
    if text.isdigit():
        return int(text)
    core.error_line("LORA_OTEL_STEP_SPANS=%r is not a whole number; no step spans" % text)
    return 0


_step_every = -1  # read on the first step
_step_span: str | None = None


def on_step_pre(*_args) -> None:
    global _step_every, _step_span
    if stages.training_id is None or stages.training_id not in core.open_spans:
        with core.fail_open("optimizer step hook"):
            ensure_training("optimizer step", "first optimizer step")
    if _step_every:  # -1: not read yet; 0: no step spans (the default)
        if _step_every < 0:
            _step_every = _step_spans_every()
            if not _step_every:
                return
        if core.steps % _step_every:
            return
        with core.fail_open("step span"):
            _step_span = core.span_start(
                "step %d" % (core.steps + 1),
                {"lora_otel.step": core.steps + 1},
                parent_id=stages.training_id,
                push=False,
            )


def on_step_post(*_args) -> None:
    global _step_span
    core.steps += 1
    core.last_step_ns = time.time_ns()
    if _step_span is not None:
        with core.fail_open("step span"):
            core.span_end(_step_span)
        _step_span = None


def install_torch_hooks(torch) -> None:
    global _torch_done
    _torch_done = True
    # Said on the root span, which every reader keeps (ended import spans may be dropped by a live
    # tail): a process that imported torch idling with no stage open may be a stuck job.
    core.span_attrs(core.root_id, {"lora_otel.torch.imported": True})
    try:
        from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook
    except ImportError:
        core.error_line(
            "this torch (%s) has no global optimizer step hooks; use lora_otel.progress()"
            % getattr(torch, "__version__", "?")
        )
    else:
        register_optimizer_step_pre_hook(on_step_pre)
        register_optimizer_step_post_hook(on_step_post)
    _install_cuda_hooks(torch)


def _cuda_absent_reason(torch) -> str:
    from lora_otel._boot import envfacts

    if getattr(torch.version, "cuda", None) is None:
        if getattr(torch.version, "hip", None):
            return "ROCm build of torch (%s); no NVIDIA CUDA" % torch.__version__
        return "CPU build of torch (%s)" % torch.__version__
    if not envfacts.driver_facts().get("lora_otel.nvidia.driver_version") and not os.path.exists("/dev/nvidiactl"):
        return "no NVIDIA driver (/proc/driver/nvidia/version missing)"
    cvd = os.environ.get("CUDA_VISIBLE_DEVICES")
    if cvd is not None and cvd.strip() in ("", "-1", "none", "NoDevFiles"):
        return "no visible device (CUDA_VISIBLE_DEVICES=%r)" % cvd
    return "no visible device"


def _cuda_facts(torch) -> dict:
    from lora_otel._boot import envfacts, gpu

    attrs: dict = {
        "lora_otel.torch.version": str(torch.__version__),
        "lora_otel.cuda.version": str(torch.version.cuda),
    }
    with core.fail_open("cuda facts"):
        v = torch.backends.cudnn.version()
        if v:
            attrs["lora_otel.cudnn.version"] = str(v)
    drv = envfacts.driver_facts().get("lora_otel.nvidia.driver_version")
    if drv:
        attrs["lora_otel.nvidia.driver_version"] = drv
    cvd = os.environ.get("CUDA_VISIBLE_DEVICES")
    attrs["lora_otel.cuda.visible_devices"] = cvd if cvd is not None else "(unset)"
    n = torch.cuda.device_count()
    attrs["lora_otel.cuda.device_count"] = n
    names, caps, totals, frees = [], [], [], []
    for i in range(n):
        p = torch.cuda.get_device_properties(i)
        names.append(str(p.name))
        caps.append("%d.%d" % (p.major, p.minor))
        totals.append(int(p.total_memory))
        uuid = getattr(p, "uuid", None)
        free = gpu.free_memory(str(uuid) if uuid is not None else None, i)
        frees.append(-1 if free is None else int(free))
    attrs["lora_otel.cuda.device_names"] = names
    attrs["lora_otel.cuda.capabilities"] = caps
    attrs["lora_otel.cuda.total_memory_bytes"] = totals
    attrs["lora_otel.cuda.free_memory_bytes"] = frees
    return attrs


def _install_cuda_hooks(torch) -> None:
    tc = torch.cuda
    orig_init = getattr(tc, "_lazy_init", None)
    if orig_init is not None and not getattr(orig_init, "_lora_otel", False):
        state = {"done": False}

        def _lazy_init():
            if state["done"]:
                return orig_init()
            try:
                initialized = tc.is_initialized()
            except Exception:  # noqa: BLE001
                initialized = False
            if initialized:
                state["done"] = True
                return orig_init()
            sid = None
            with core.fail_open("cuda init hook"):
                sid = core.span_start(
                    "cuda init", {"lora_otel.cuda.visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES", "(unset)")}
                )
                core.info_line("cuda init: starting")
            try:
                result = orig_init()
            except BaseException as e:
                state["done"] = True
                if sid is not None:
                    with core.fail_open("cuda init hook"):
                        reason = _cuda_absent_reason(torch)
                        core.span_end(
                            sid,
                            "error",
                            "%s: %s" % (type(e).__name__, e),
                            {
                                "lora_otel.cuda.available": False,
                                "lora_otel.cuda.absent_reason": reason,
                                "lora_otel.torch.version": str(torch.__version__),
                            },
                        )
                        core.error_line("cuda init failed: %s: %s (%s)" % (type(e).__name__, e, reason))
                raise
            state["done"] = True
            if sid is not None:
                with core.fail_open("cuda init hook"):
                    facts = _cuda_facts(torch)
                    facts["lora_otel.cuda.available"] = True
                    core.span_end(sid, "ok", attrs=facts)
                    core.info_line(
                        "cuda init: done, %d device(s): %s"
                        % (facts["lora_otel.cuda.device_count"], ", ".join(facts["lora_otel.cuda.device_names"]))
                    )
            return result

        _lazy_init._lora_otel = True  # type: ignore[attr-defined]
        _lazy_init.__wrapped__ = orig_init  # type: ignore[attr-defined]
        # Modules that did ``from torch.cuda import _lazy_init`` hold their own reference.
        for modname, mod in list(_modules.items()):
            if (modname == "torch.cuda" or modname.startswith("torch.cuda.")) and getattr(
                mod, "_lazy_init", None
            ) is orig_init:
                mod._lazy_init = _lazy_init

    orig_avail = getattr(tc, "is_available", None)
    if orig_avail is not None and not getattr(orig_avail, "_lora_otel", False):
        probed = {"done": False}

        def is_available():
            if probed["done"]:
                return orig_avail()
            probed["done"] = True
            sid = None
            with core.fail_open("cuda probe hook"):
                sid = core.span_start("cuda probe", {})
            try:
                result = orig_avail()
            except BaseException as e:
                if sid is not None:
                    with core.fail_open("cuda probe hook"):
                        core.span_end(sid, "error", "%s: %s" % (type(e).__name__, e))
                raise
            if sid is not None:
                with core.fail_open("cuda probe hook"):
                    attrs = {
                        "lora_otel.cuda.available": bool(result),
                        "lora_otel.torch.version": str(torch.__version__),
                    }
                    if not result:
                        attrs["lora_otel.cuda.absent_reason"] = _cuda_absent_reason(torch)
                        core.info_line("CUDA not available: %s" % attrs["lora_otel.cuda.absent_reason"])
                    core.span_end(sid, "ok", attrs=attrs)
            return result

        is_available._lora_otel = True  # type: ignore[attr-defined]
        is_available.__wrapped__ = orig_avail  # type: ignore[attr-defined]
        tc.is_available = is_available
