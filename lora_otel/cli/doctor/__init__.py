"""``lora-otel doctor``: the start-up of a LoRA training job, run once, traced, with a verdict per step.

Two processes. The **parent** (``lora-otel doctor``) does the checks that need nothing imported and
judges everything; the **check process** (``python -m lora_otel.cli.doctor --child``, started
with ``LORA_OTEL=1``) does what a real job does first, traced like a real job: its preamble writes a
journal (``--dir``, else ``$LORA_OTEL_DIR``, else ``~/.local/state/lora-otel/``, named ``doctor-<UTC>-<pid>``)
and, when an OTLP endpoint is configured, starts the live-export sidecar. The check process

1. imports the training stack, each package under its own ``import NAME`` span (the import hook
   makes it): torch, transformers, diffusers, accelerate, peft, bitsandbytes, xformers, those that
   are installed, then the ``--also-import`` modules;
2. probes and initialises CUDA (the torch hooks make the ``cuda probe`` / ``cuda init`` spans);
3. on each visible GPU allocates, multiplies two 1024x1024 matrices and reads the result back,
   compared against the CPU (a ``gpu N matmul`` stage);
4. when peft is installed, one LoRA forward and backward on a tiny model (a 1-layer Llama from
   transformers when it imports, else a two-layer MLP), on GPU 0 when it works, else the CPU.

It tells the parent where it is over a pipe (one JSON line as each step begins and ends); its own
stdout and stderr go to ``<journal stem>.log`` beside the journal. The parent holds every step to a
time limit (``--import-timeout``, ``--cuda-timeout``, ``--gpu-timeout``, ``--lora-timeout``). A step
past its limit is a hang: the parent gathers the evidence (``evidence.gather``: the process state
and wait channel from /proc and every thread's Python stack through the stack request signal), kills the check
process's whole process group, appends the ``exit`` record to the journal and reports the step as
failed, with the innermost frames of the stack and their source lines. A check process that dies
(a segfault in a native library) fails the step it was in, with the tail of its log.

The parent's own checks: the Python version against ``Requires-Python`` of lora_otel and of every
installed training-stack package; each such package's declared requirements (package metadata,
markers evaluated for this interpreter, extras ignored) against what is installed; torch's CUDA
build against the CUDA version the NVIDIA driver supports (``cuDriverGetVersion`` from
``libcuda.so.1``, else a table of minimum driver versions); free GPU memory (measured in the check
process after CUDA initialised) against ``--need-gpu-memory``.

Standard library only, plus ``packaging`` when it is importable (a small built-in parser for
versions, specifiers and markers otherwise). Statuses: ``ok``, ``warn``, ``fail``; exit status 0
without a fail, 1 with one, 2 on a usage error. See docs/doctor.md.

The modules, by what they check: `packages` (Python, the packages' requirements), `cuda` (torch's
CUDA build against the driver, the GPUs, their memory), `training` (the imports, the LoRA step),
`journal` (the check process's journal and its live export), `follow` (the parent following the
check process: time limits, hangs, deaths), `child` (the check process itself, also run as
``python -m lora_otel.cli.doctor --child``), `report` (a `Check` and how its numbers are written);
this one runs them in order, turns the result into the report and holds the command's arguments.

The check process imports this package: no module in it imports anything at module level but what
every interpreter has loaded (``os``, ``sys``, ``time``) and its siblings, not even ``typing``, so
that the journal's import spans are the training stack's and not the doctor's own.
"""

from __future__ import annotations

import os
import sys
import time

from lora_otel.cli.doctor.child import PROTO_ENV, arch_supported
from lora_otel.cli.doctor.cuda import (
    _cuda_runtime_checks,
    check_cuda_build,
    driver_cuda_version,
    max_cuda_for_driver,
)
from lora_otel.cli.doctor.follow import (
    _describe_status,
    _died_check,
    _follow,
    _hang_check,
    _kill_group,
    _log_tail,
    _Run,
    stack_excerpt,
)
from lora_otel.cli.doctor.journal import _journal_check
from lora_otel.cli.doctor.packages import check_python, check_requirements, checked_distributions
from lora_otel.cli.doctor.report import Check, _frame_text, _rel, _secs, format_bytes, parse_size
from lora_otel.cli.doctor.training import STACK, _import_check, _lora_check

TYPE_CHECKING = False
if TYPE_CHECKING:  # never true at runtime: the check process imports every module here, and not typing
    import argparse
    from types import FrameType
    from typing import IO, Any

__all__ = [
    "EPILOG",
    "STACK",
    "Check",
    "add_arguments",
    "arch_supported",
    "check_cuda_build",
    "check_python",
    "check_requirements",
    "doctor",
    "driver_cuda_version",
    "format_bytes",
    "max_cuda_for_driver",
    "parse_size",
    "render_text",
    "run_doctor",
    "stack_excerpt",
]

DEFAULT_TIMEOUTS = {"import": 120.0, "cuda": 120.0, "gpu": 60.0, "lora": 120.0}

# The check process runs ``python -c _CHILD_CODE``: ``python -m`` would add ``import runpy`` and
# ``import lora_otel.cli`` spans to its journal; this imports the doctor as lora_otel (untraced).
_CHILD_CODE = (
    "import sys; d = __import__('lora_otel.cli.doctor.child', {'__name__': 'lora_otel'}, None, ['_child_main']); "
    "sys.exit(d._child_main(sys.argv[1:]))"
)

EPILOG = """examples:
  lora-otel doctor                               the whole start-up flow, one line per check
  lora-otel doctor --need-gpu-memory 40G         ... and at least 40 GiB free on every visible GPU
  lora-otel doctor --also-import mytrain.data    ... and import your own modules too
  lora-otel doctor --import-timeout 300 --import-timeout bitsandbytes=600
  lora-otel doctor --json | jq '.checks[] | select(.status != "ok")'
  OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4318 lora-otel doctor   the run exported live too

sizes: 16G, 16GiB, 16Gi = 16 x 2^30 bytes; 16GB = 16 x 10^9; also K, M, T; a plain number is bytes.
exit status: 0 no check failed (warnings allowed), 1 some check failed, 2 usage error.
The check process's journal is written like a real job's (docs/journal.md); docs/doctor.md."""


# --- the whole run -----------------------------------------------------------------------------


def _installed(name: str) -> bool:
    """Whether a top-level module can be found (its finder only: nothing of it runs)."""
    import importlib.util

    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _journal_path(args: argparse.Namespace) -> str:
    from lora_otel._boot.seam import paths

    base = getattr(args, "dir", None) or os.environ.get("LORA_OTEL_DIR") or paths.state_dir(os.environ)
    base = base or paths.fallback_dir(os.environ)
    return os.path.join(os.path.abspath(base), "doctor-" + paths.journal_name(os.getpid(), time.time()))


def _child_env(journal: str, wfd: int) -> dict[str, str]:
    env = dict(os.environ)
    env["LORA_OTEL"] = "1"
    env.pop("LORA_OTEL_SIDECAR", None)
    env["LORA_OTEL_JOURNAL"] = journal
    env["LORA_OTEL_JOURNAL_OWNER"] = str(os.getpid())
    env.setdefault("OTEL_SERVICE_NAME", "lora-otel-doctor")
    env[PROTO_ENV] = str(wfd)
    env.setdefault("PYTHONFAULTHANDLER", "1")  # a native crash writes its stack to the log
    return env


def doctor(args: argparse.Namespace) -> dict[str, Any]:
    """Run every check; the report as the ``--json`` object (docs/doctor.md)."""
    import subprocess

    from lora_otel import __version__
    from lora_otel._boot import preamble
    from lora_otel._boot.seam import envfacts, files, paths
    from lora_otel.cli.run import die_with_parent

    started = time.monotonic()
    also = list(getattr(args, "also_import", None) or [])
    limits = dict(DEFAULT_TIMEOUTS)
    import_limits: dict[str, float] = {}
    for name, seconds in getattr(args, "import_timeout", None) or []:
        if name is None:
            limits["import"] = seconds
        else:
            import_limits[name] = seconds
    for kind in ("cuda", "gpu", "lora"):
        value = getattr(args, "%s_timeout" % kind, None)
        if value is not None:
            limits[kind] = value
    need = getattr(args, "need_gpu_memory", None)

    plan = [m for m in STACK if _installed(m)]
    not_installed = [m for m in STACK if m not in plan]
    imports = plan + [m for m in also if m not in plan]
    lora = "peft" in plan and "torch" in plan

    journal = _journal_path(args)
    log_path = paths.stem(journal) + ".log"
    fallback_stacks = preamble.stacks_path(journal)
    log: IO[bytes]
    try:
        os.makedirs(os.path.dirname(journal), mode=0o700, exist_ok=True)
        log = os.fdopen(files.open_append(log_path), "ab")  # new, or this user's: never a FIFO put there
    except OSError:
        import tempfile

        # the check process's stdout and stderr, closed once it has started (as the fdopen above)
        log = tempfile.NamedTemporaryFile(prefix="lora-otel-doctor-", suffix=".log", delete=False)  # noqa: SIM115
        log_path = log.name
    argv = [sys.executable, "-c", _CHILD_CODE, "--child", "--stacks", fallback_stacks, "--output", log_path]
    for m in imports:
        argv += ["--import", m]
    if lora:
        argv.append("--lora")
    if "torch" not in plan and "torch" not in also:
        argv.append("--no-cuda")
    rfd, wfd = os.pipe()
    checks: list[Check] = []
    static_cuda = None
    proc = None
    try:
        try:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                env=_child_env(journal, wfd),
                pass_fds=(wfd,),
                start_new_session=True,
                preexec_fn=die_with_parent(),
            )
        except OSError as e:
            run = _Run()
            run.died = {
                "step": "start-up",
                "kind": "import",
                "status": "cannot start %s: %s" % (sys.executable, e.strerror or e),
                "log_tail": "",
            }
        finally:
            os.close(wfd)
            log.close()
        # While the check process starts (seconds), the checks that need nothing imported.
        try:
            dists = checked_distributions(also)
            checks += check_python(dists)
            checks += check_requirements(dists)
        except Exception as e:  # noqa: BLE001 - a broken metadata store must not stop the flow's report
            checks.append(
                Check(
                    "requirements",
                    "warn",
                    "cannot read the installed packages' metadata: %s: %s" % (type(e).__name__, e),
                    "reinstall the package named in the error",
                )
            )
        build = envfacts.torch_build()
        drv_facts = envfacts.driver_facts()
        driver_cuda = driver_cuda_version() if drv_facts.get("nvidia.driver_version") else None
        static_cuda = check_cuda_build(build, drv_facts, driver_cuda)
        if proc is not None:
            run = _follow(proc, rfd, journal, log_path, fallback_stacks, limits, import_limits)
    finally:
        os.close(rfd)
        if proc is not None and proc.poll() is None:  # interrupted before or while following it
            _kill_group(proc)
            proc.wait()

    # The imports, in plan order.
    stopped_at = (run.hung or run.died or {}).get("step")
    failed: list[str] = []
    for m in imports:
        name = "import " + m
        if name in run.results:
            checks.append(_import_check(name, run.results[name], failed))
            if run.results[name].get("status") != "ok":
                failed.append(m)
        elif run.hung and run.hung["step"] == name:
            checks.append(_hang_check(run.hung))
        elif run.died and run.died["step"] == name:
            checks.append(_died_check(run.died, name))
    if "torch" not in plan and "torch" not in also:
        checks.append(
            Check(
                "import torch",
                "fail",
                "torch is not installed",
                "pip install torch (a CUDA build for GPU training: https://pytorch.org/get-started/locally/)",
            )
        )
    checks += _cuda_runtime_checks(run, static_cuda, need)
    for step in ("cuda probe", "cuda init"):
        if run.hung and run.hung["step"] == step:
            checks.append(_hang_check(run.hung, step))
        elif run.died and run.died["step"] == step:
            checks.append(_died_check(run.died, step))
    if run.hung and run.hung["kind"] == "gpu":
        checks.append(_hang_check(run.hung))
    elif run.died and run.died["kind"] == "gpu":
        checks.append(_died_check(run.died, run.died["step"]))
    if "lora" in run.results:
        checks.append(_lora_check(run.results["lora"]))
    elif run.hung and run.hung["step"] == "lora":
        checks.append(_hang_check(run.hung, "lora"))
    elif run.died and run.died["step"] == "lora":
        checks.append(_died_check(run.died, "lora"))
    handled = {c.name for c in checks}
    if run.hung and run.hung["step"] not in handled and run.hung["kind"] != "exit":
        checks.append(_hang_check(run.hung))  # start-up, or between steps
    if run.died and run.died["step"] not in handled:
        checks.append(_died_check(run.died, run.died["step"]))
    if run.exit_hung:
        checks.append(_hang_check(run.exit_hung, "exit"))
    elif run.done and run.returncode not in (0, None):
        checks.append(
            Check(
                "exit",
                "warn",
                "the check process finished its checks but exited with %s" % _describe_status(run.returncode),
                "see its log %s" % _rel(log_path),
                details={"log_tail": _log_tail(log_path)},
            )
        )
    left = [("import " + m) for m in imports if "import " + m not in run.results and "import " + m != stopped_at]
    if "torch" in imports and "cuda probe" not in run.results and stopped_at not in ("cuda probe", "cuda init"):
        left.append("cuda")
    if lora and "lora" not in run.results and stopped_at != "lora":
        left.append("lora")
    if left:
        if stopped_at and not run.done:
            why, first = "the check process was stopped at %s" % stopped_at, stopped_at
        else:
            failed = [n for n in ("import torch", "import peft") if (run.results.get(n) or {}).get("status") == "error"]
            why = "%s failed" % " and ".join(failed) if failed else "skipped"
            first = failed[0] if failed else "the failures above"
        checks.append(
            Check(
                "not run",
                "warn",
                "%s: %s" % (", ".join(left), why),
                "fix %s first, then run lora-otel doctor again" % first,
                details={"steps": left},
            )
        )
    checks.append(_journal_check(journal, run))
    counts = {s: sum(1 for c in checks if c.status == s) for s in ("ok", "warn", "fail")}
    status = "fail" if counts["fail"] else "warn" if counts["warn"] else "ok"
    actual_journal = run.hello.get("journal") or (journal if os.path.exists(journal) else None)
    return {
        "lora_otel_version": __version__,
        "status": status,
        "exit_code": 1 if counts["fail"] else 0,
        "counts": counts,
        "duration_s": round(time.monotonic() - started, 3),
        "python": sys.version.split()[0],
        "executable": sys.executable,
        "journal": actual_journal,
        "log": log_path,
        "pid": run.pid,
        "not_installed": not_installed,
        "timeouts_s": {**limits, **{"import " + k: v for k, v in import_limits.items()}},
        "need_gpu_memory": need,
        "checks": [c.to_dict() for c in checks],
    }


def render_text(report: dict[str, Any]) -> str:
    """One line per check: ``ok    import torch            2.13.0+cpu in 1.3 s``, then a summary."""
    checks = report["checks"]
    width = max([len(c["name"]) for c in checks] + [20]) + 2
    lines = []
    for c in checks:
        text = "%-6s%-*s%s" % (c["status"], width, c["name"], c["evidence"])
        if c["advice"] and c["status"] != "ok":
            text += " \u2014 " + c["advice"]
        lines.append(text)
        for frame in (c.get("details") or {}).get("stack") or []:
            lines.append(
                "%s%s" % (" " * 8, _frame_text(frame["file"], frame["line"], frame["function"], frame["source"]))
            )
    if report.get("not_installed"):
        lines.append("not installed (not checked): %s" % ", ".join(report["not_installed"]))
    n = report["counts"]
    lines.append(
        "doctor: %d ok, %d warn, %d fail in %s; journal: %s"
        % (
            n["ok"],
            n["warn"],
            n["fail"],
            _secs(report["duration_s"]),
            _rel(report["journal"]) if report.get("journal") else "none",
        )
    )
    return "\n".join(lines) + "\n"


def run_doctor(args: argparse.Namespace) -> int:
    """``lora-otel doctor``: print the report, return 0 (no fail) or 1."""
    import json
    import signal
    import threading

    def terminated(signum: int, _frame: FrameType | None) -> None:
        raise SystemExit(128 + signum)  # unwinds through the cleanup that kills the check process

    old = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGHUP):
            old[sig] = signal.signal(sig, terminated)
    try:
        report = doctor(args)
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
    if getattr(args, "json", False):
        sys.stdout.write(json.dumps(report, indent=2) + "\n")
    else:
        sys.stdout.write(render_text(report))
    sys.stdout.flush()
    return int(report["exit_code"])


# --- arguments ---------------------------------------------------------------------------------


def _seconds(text: str) -> float:
    import argparse

    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError("%r is not a number of seconds" % text) from None
    if not value > 0 or value != value or value == float("inf"):
        raise argparse.ArgumentTypeError("%r must be more than 0 seconds" % text)
    return value


def _import_timeout(text: str) -> tuple[str | None, float]:
    name, eq, value = text.rpartition("=")
    if not eq:
        return None, _seconds(text)
    import argparse

    name = name.strip()
    if not _is_module_name(name):
        raise argparse.ArgumentTypeError("%r: %r is not a module name (use SECONDS or MODULE=SECONDS)" % (text, name))
    return name, _seconds(value)


def _is_module_name(name: str) -> bool:
    return bool(name) and all(part.isidentifier() for part in name.split("."))


def _module(text: str) -> str:
    import argparse

    if not _is_module_name(text.strip()):
        raise argparse.ArgumentTypeError("%r is not a module name (e.g. mytrain or mytrain.data)" % text)
    return text.strip()


def _size(text: str) -> int:
    import argparse

    try:
        value = parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    if value <= 0:
        raise argparse.ArgumentTypeError("%r must be more than 0 bytes" % text)
    return value


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``lora-otel doctor`` (cli.py builds the subcommand)."""
    p.add_argument("--json", action="store_true", help="print the report as JSON (docs/doctor.md)")
    p.add_argument(
        "--dir",
        help="directory for the check process's journal (default: $LORA_OTEL_DIR, else "
        "$XDG_STATE_HOME/lora-otel/, by default ~/.local/state/lora-otel/)",
    )
    p.add_argument(
        "--need-gpu-memory",
        type=_size,
        metavar="SIZE",
        help="fail unless every visible GPU has this much free memory (16G, 80GB, 512M)",
    )
    p.add_argument(
        "--also-import",
        action="append",
        type=_module,
        metavar="MODULE",
        default=[],
        help="also import this module, after the training stack, with the same checks (repeatable)",
    )
    p.add_argument(
        "--import-timeout",
        action="append",
        type=_import_timeout,
        metavar="[MODULE=]S",
        default=[],
        help="seconds an import may take before it counts as hung (default 120); MODULE=S for one module (repeatable)",
    )
    p.add_argument(
        "--cuda-timeout",
        type=_seconds,
        metavar="S",
        help="seconds for the CUDA probe and for CUDA initialisation, each (default 120)",
    )
    p.add_argument("--gpu-timeout", type=_seconds, metavar="S", help="seconds for the matmul on each GPU (default 60)")
    p.add_argument(
        "--lora-timeout", type=_seconds, metavar="S", help="seconds for the LoRA forward and backward (default 120)"
    )
