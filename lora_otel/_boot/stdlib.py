"""Standard library modules loaded from the standard library's own directory, never from the
working directory.

Interpreter start puts the working directory (``python -c``, ``python -m``) or the script's
directory first on ``sys.path``, after the ``.pth`` hook ran. A module lora_otel imports later by
name (``fcntl`` at a job's promotion, ``dis`` at an exit, ``warnings`` when the sidecar starts)
would then be a ``fcntl.py`` left in that directory — in a shared one, someone else's code, run as
whoever runs the job. Without lora_otel nothing imports it. `module` finds such a module in the
standard library's directories only (``lib-dynload`` for C extensions: ``fcntl``, ``select``), and
the modules that one imports in turn the same way, while it loads; once loaded it is the module
every later ``import`` gets, as without lora_otel. A built-in or frozen module, or one already
loaded, is taken as it is (nothing on ``sys.path`` can shadow those).

Thread-safe: the module's own import lock is held while it loads (another thread importing it
waits, as for any import), and nothing global (``sys.path``, ``builtins.__import__``) changes: the
stdlib-only lookup reaches only the code of the module being loaded, through its own
``__builtins__``.
"""

from __future__ import annotations

import builtins
import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:  # never true at runtime: no typing import
    from collections.abc import Mapping, Sequence
    from types import ModuleType

_dirs: list[str] = []


def stdlib_dirs() -> list[str]:
    """The standard library's directories: the one ``os`` was loaded from (the pure-Python modules)
    and its ``lib-dynload`` (the C extensions), and any other ``lib-dynload`` on ``sys.path``."""
    if not _dirs:
        base = getattr(sys, "_stdlib_dir", None) or os.path.dirname(os.__file__)
        found = [base, os.path.join(base, "lib-dynload")]
        found += [p for p in sys.path if isinstance(p, str) and p.endswith("lib-dynload") and os.path.isabs(p)]
        _dirs[:] = list(dict.fromkeys(found))
    return _dirs


def module(name: str) -> ModuleType:
    """The standard library's module ``name`` (``json.decoder`` too): the loaded one, else loaded
    now from `stdlib_dirs` only (a submodule: from its package's directory). Raises ``ImportError``
    when the standard library has none."""
    loaded = sys.modules.get(name)
    if loaded is not None:
        return loaded
    import _imp

    if name in sys.builtin_module_names or _imp.is_frozen(name):
        __import__(name)  # the built-in and frozen finders come before any path
        return sys.modules[name]
    bootstrap = sys.modules["_frozen_importlib"]
    external = sys.modules["_frozen_importlib_external"]
    parent, _, child = name.rpartition(".")
    package = module(parent) if parent else None
    where = getattr(package, "__path__", None) if parent else stdlib_dirs()
    spec = external.PathFinder.find_spec(name, where) if where is not None else None
    if spec is None or spec.loader is None:
        raise ImportError("no module named %r in the standard library" % name, name=name)
    with bootstrap._ModuleLockManager(name):
        loaded = sys.modules.get(name)
        if loaded is not None:
            return loaded
        new = bootstrap.module_from_spec(spec)
        spec._initializing = True  # another thread importing it meanwhile waits on its lock
        sys.modules[name] = new
        namespace = new.__dict__
        source = isinstance(spec.loader, external.SourceFileLoader)
        if source:  # its own imports, while it runs (and in its functions' later ones, 3.10+)
            namespace["__builtins__"] = _stdlib_builtins()
        try:
            spec.loader.exec_module(new)
        except BaseException:
            sys.modules.pop(name, None)
            raise
        finally:
            spec._initializing = False
            if source:
                namespace["__builtins__"] = builtins.__dict__
        new = sys.modules.get(name) or new
        if package is not None:
            setattr(package, child, new)
        return new


def _stdlib_import(
    name: str,
    globals: Mapping[str, object] | None = None,  # noqa: A002 - builtins.__import__'s own parameter names
    locals: Mapping[str, object] | None = None,  # noqa: A002
    fromlist: Sequence[str] | None = (),
    level: int = 0,
) -> ModuleType:
    """``__import__`` for the code of a module `module` loads: the module named, each package on
    its way and each submodule of ``fromlist`` come from the standard library (`module`); then the
    interpreter's own ``__import__`` binds them as usual."""
    bootstrap = sys.modules["_frozen_importlib"]
    absolute = name
    if level > 0:
        package = bootstrap._calc___package__(globals if globals is not None else {})
        absolute = bootstrap._resolve_name(name, package, level) if name else package
    prefix = ""
    for part in absolute.split("."):
        prefix = prefix + "." + part if prefix else part
        module(prefix)
    target = sys.modules[absolute]
    if fromlist and hasattr(target, "__path__"):
        for item in fromlist:
            if item != "*" and not hasattr(target, item):
                try:
                    module(absolute + "." + item)
                except ImportError:
                    pass  # a name the package defines itself, or none: the import says which
    return builtins.__import__(name, globals, locals, fromlist or (), level)


_builtins_copy: dict[str, object] = {}


def _stdlib_builtins() -> dict[str, object]:
    """A copy of the builtins whose ``__import__`` is `_stdlib_import`."""
    if not _builtins_copy:
        _builtins_copy.update(builtins.__dict__)
        _builtins_copy["__import__"] = _stdlib_import
    return _builtins_copy
