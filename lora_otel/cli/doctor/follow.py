"""The parent following the check process: its messages over the pipe, each step held to its time
limit, and what happens when one is passed (a hang: the evidence gathered, the Python stack's
innermost frames, the whole process group killed, the ``exit`` record appended to the journal) or
when the check process dies; then the hang's or the death's line of the report."""

from __future__ import annotations

import os
import sys
import time

from lora_otel.cli.doctor.child import MATMUL_N, own_frame
from lora_otel.cli.doctor.report import Check, _frame_text, _limit, _secs

TYPE_CHECKING = False
if TYPE_CHECKING:  # never true at runtime: the check process imports every module here, and not typing
    import subprocess
    from typing import Any


EXIT_LIMIT_S = 30.0
"""How long the check process may take to exit after its last step."""


# --- stacks ------------------------------------------------------------------------------------


def _threads(stacks: str) -> list[tuple[str, list[tuple[str, int, str]]]]:
    """faulthandler's dump → ``[(header, [(path, line, func), ...innermost first])]``."""
    import re

    frame_re = re.compile(r'\s*File "(.*)", line (\d+) in (.*)')
    threads: list[tuple[str, list[tuple[str, int, str]]]] = []
    for line in stacks.splitlines():
        if line.startswith(("Current thread", "Thread ")):
            threads.append((line.strip(), []))
            continue
        m = frame_re.match(line)
        if m and threads:
            threads[-1][1].append((m.group(1), int(m.group(2)), m.group(3).strip()))
    return threads


def stack_excerpt(stacks: str, max_frames: int = 8) -> list[tuple[str, int, str, str]]:
    """The check process's main thread in a faulthandler dump: ``[(path, line, func, source)]``,
    innermost first, up to the doctor's own frame, without importlib's frozen frames."""
    import linecache

    threads = _threads(stacks)
    pick = None
    for _, frames in threads:
        if any(own_frame(p) for p, _, _ in frames):
            pick = frames
            break
    if pick is None:
        for _, frames in threads:
            if frames and "lora_otel/_boot/" not in frames[0][0]:
                pick = frames
                break
    out: list[tuple[str, int, str, str]] = []
    for path, line, func in pick or []:
        if own_frame(path):
            break
        if path.startswith("<frozen") or "lora_otel/_boot/" in path.replace("\\", "/"):
            continue  # importlib's machinery and lora_otel's import hook
        out.append((path, line, func, linecache.getline(path, line).strip()))
        if len(out) >= max_frames:
            break
    return out


# --- following the check process -------------------------------------------------------------


class _Step:
    __slots__ = ("began", "kind", "limit", "name")

    def __init__(self, name: str, kind: str, limit: float) -> None:
        self.name, self.kind, self.limit, self.began = name, kind, limit, time.monotonic()


class _Run:
    """What the check process said, and how it ended."""

    def __init__(self) -> None:
        self.hello: dict[str, Any] = {}
        self.results: dict[str, dict[str, Any]] = {}  # step name -> end message
        self.order: list[str] = []  # step names in the order they began
        self.hung: dict[str, Any] | None = None  # {"step", "kind", "limit", "waited", "evidence", "excerpt", ...}
        self.died: dict[str, Any] | None = None  # {"step", "status", "log_tail"}
        self.done = False
        self.exit_hung: dict[str, Any] | None = None
        self.returncode: int | None = None
        self.pid: int | None = None


def _timeout_for(step: str, kind: str, limits: dict[str, float], import_limits: dict[str, float]) -> float:
    if kind == "import":
        module = step[len("import ") :] if step.startswith("import ") else step
        for key in (module, module.partition(".")[0]):
            if key in import_limits:
                return import_limits[key]
    return limits.get(kind, limits["import"])


def _log_tail(path: str | None, n: int = 20) -> str:
    if not path:
        return ""
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            size = f.tell()
            f.seek(max(0, size - 65536))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    lines = [line for line in text.splitlines() if line.strip() and not line.startswith("[lora-otel]")]
    return "\n".join(lines[-n:])


def _describe_status(rc: int) -> str:
    from lora_otel.cli.run import describe_status

    return describe_status(rc)


def _append_exit(journal: str | None, rc: int, why: str | None) -> bool:
    """Append the ``exit`` record the check process could not write (docs/journal.md), once."""
    from lora_otel.cli.run import record_exit

    return record_exit(journal, rc, "lora-otel doctor: %s" % why if why else None, by="lora-otel doctor", hint="")


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    import signal

    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        try:
            proc.kill()
        except OSError:
            pass


def _gather(pid: int, stacks_path: str | None) -> dict[str, Any]:
    """Evidence about the check process (lora_otel's own child: its stack handler is the preamble's,
    or the one the check script registers on the same signal)."""
    from lora_otel._boot.seam import stack_signal
    from lora_otel.analysis import evidence

    try:
        signum = stack_signal()
        request = evidence.StackRequest(signum, stacks_path) if stacks_path and signum else None
        return evidence.gather(pid, request)
    except Exception as e:  # noqa: BLE001 - evidence is best effort
        return {evidence.PREFIX + "error": "%s: %s" % (type(e).__name__, e)}


def _diagnosis(step: _Step, ev: dict[str, Any], journal: str | None) -> str:
    """diagnose's sentence when it says something specific (network, CUDA init, frozen), else ""."""
    try:
        from lora_otel.analysis.diagnose import explain
        from lora_otel.analysis.stall import Stall
        from lora_otel.journal.reader import Span, read_journal
        from lora_otel.journal.tree import deepest_open_span

        j = None
        span = None
        if journal and os.path.exists(journal):
            j = read_journal(journal)
            span = deepest_open_span(j)
        if span is None:
            span = Span(
                name=step.name, span_id="0" * 15 + "1", parent_id=None, trace_id="0" * 31 + "1", start_ns=time.time_ns()
            )
        waited = time.monotonic() - step.began
        sentence = explain(Stall("alive", span, waited, step.limit, ""), ev, j).sentence
        return "" if sentence.startswith("Cannot tell") else sentence
    except Exception:  # noqa: BLE001
        return ""


def _follow(
    proc: subprocess.Popen[bytes],
    rfd: int,
    journal: str | None,
    log_path: str | None,
    fallback_stacks: str,
    limits: dict[str, float],
    import_limits: dict[str, float],
) -> _Run:
    """Read the check process's messages until it exits; kill it when a step passes its limit."""
    import json
    import selectors

    run = _Run()
    run.pid = proc.pid
    sel = selectors.DefaultSelector()
    sel.register(rfd, selectors.EVENT_READ)
    buf = b""
    current = _Step("start-up", "import", _timeout_for("start-up", "import", limits, import_limits))
    eof = False
    try:
        while True:
            now = time.monotonic()
            left = current.began + current.limit - now
            if left <= 0:
                _on_hang(run, proc, current, journal, fallback_stacks)
                break
            if not eof:
                for _key, _mask in sel.select(timeout=min(left, 0.25)):
                    try:
                        data = os.read(rfd, 65536)
                    except OSError:
                        data = b""
                    if not data:
                        eof = True
                        sel.unregister(rfd)
                        break
                    buf += data
            else:
                time.sleep(min(left, 0.05))
            while b"\n" in buf:
                raw, buf = buf.split(b"\n", 1)
                try:
                    msg = json.loads(raw.decode("utf-8", "replace"))
                except ValueError:
                    continue
                current = _on_message(run, msg, current, limits, import_limits)
            rc = proc.poll()
            if rc is not None and (eof or not buf):
                if not eof:  # whatever is still in the pipe
                    try:
                        while True:
                            data = os.read(rfd, 65536)
                            if not data:
                                break
                            buf += data
                    except OSError:
                        pass
                    for raw in buf.split(b"\n"):
                        try:
                            current = _on_message(
                                run, json.loads(raw.decode("utf-8", "replace")), current, limits, import_limits
                            )
                        except ValueError:
                            pass
                run.returncode = rc
                if not run.done:
                    run.died = {
                        "step": current.name,
                        "kind": current.kind,
                        "status": _describe_status(rc),
                        "log_tail": _log_tail(log_path),
                    }
                break
    finally:
        sel.close()
        if proc.poll() is None:  # interrupted (Ctrl-C, SIGTERM) or an error here: leave nothing behind
            _kill_group(proc)
            proc.wait()
            _append_exit(journal, proc.returncode, "lora-otel doctor was interrupted")
    if run.returncode is None:
        run.returncode = proc.returncode
    if (run.returncode is not None and run.returncode < 0) or run.hung or run.exit_hung:
        why = None
        if run.hung:
            why = "%s passed its %s limit" % (run.hung["step"], _limit(run.hung["limit"]))
        elif run.exit_hung:
            why = "no exit %s after the last check" % _limit(EXIT_LIMIT_S)
        _append_exit(journal, run.returncode if run.returncode is not None else -9, why)
    return run


def _on_message(
    run: _Run, msg: dict[str, Any], current: _Step, limits: dict[str, float], import_limits: dict[str, float]
) -> _Step:
    ev = msg.get("ev")
    if ev == "hello":
        run.hello = msg
        return _Step("after start-up", "import", max(limits.values()))
    if ev == "begin":
        name = str(msg.get("step"))
        kind = str(msg.get("kind") or "import")
        run.order.append(name)
        return _Step(name, kind, _timeout_for(name, kind, limits, import_limits))
    if ev == "end":
        name = str(msg.get("step"))
        run.results[name] = msg
        return _Step("after " + name, current.kind, max(limits.values()))
    if ev == "done":
        run.done = True
        return _Step("exit", "exit", EXIT_LIMIT_S)
    return current


def _on_hang(run: _Run, proc: subprocess.Popen[bytes], step: _Step, journal: str | None, fallback_stacks: str) -> None:
    from lora_otel.analysis.evidence import PREFIX

    stacks_path = run.hello.get("stacks") or (fallback_stacks if os.path.exists(fallback_stacks) else None)
    if not run.hello and journal and not os.path.exists(journal):
        stacks_path = None  # no preamble, no handler: the stack request signal would only kill it
    waited = time.monotonic() - step.began
    ev = _gather(proc.pid, stacks_path)
    stacks = str(ev.get(PREFIX + "python.stacks") or ev.get(PREFIX + "py_spy.dump") or "")
    info = {
        "step": step.name,
        "kind": step.kind,
        "limit": step.limit,
        "waited": round(waited, 1),
        "evidence": {k[len(PREFIX) :] if k.startswith(PREFIX) else k: v for k, v in ev.items()},
        "stacks": stacks,
        "excerpt": stack_excerpt(stacks),
        "diagnosis": _diagnosis(step, ev, journal),
        "pid": proc.pid,
    }
    _kill_group(proc)
    try:
        proc.wait(timeout=30)
    except Exception:  # noqa: BLE001 - SIGKILL cannot be ignored; a D-state process may linger
        pass
    info["killed"] = proc.poll() is not None
    if step.kind == "exit":
        run.exit_hung = info
    else:
        run.hung = info


# --- a hang or a death, as a check -------------------------------------------------------------


_HANG_ADVICE = {
    "import": "find what %s waits for in the stack (a lock, the network, a GPU, a slow file system); if it "
    "is only slow, raise --import-timeout",
    "cuda": "CUDA initialisation hung: look at nvidia-smi and the kernel log (dmesg: Xid errors), check "
    "CUDA_VISIBLE_DEVICES; raise --cuda-timeout if the machine is only slow",
    "gpu": "the GPU did not finish a %dx%d matmul: look at nvidia-smi for a busy or faulty device and dmesg "
    "for Xid errors; raise --gpu-timeout if it is only slow" % (MATMUL_N, MATMUL_N),
    "lora": "the LoRA forward/backward did not finish: see the stack; raise --lora-timeout if it is only slow",
    "exit": "something the check process loaded blocks interpreter exit (an atexit handler or a non-daemon "
    "thread): see the stack",
}


def _hang_check(h: dict[str, Any], name: str | None = None) -> Check:
    ev = h["evidence"]
    parts = ["no result after %s (limit %s)" % (_secs(h["waited"]), _limit(h["limit"]))]
    if h["excerpt"]:
        parts.append("stuck at %s" % _frame_text(*h["excerpt"][0]))
    elif ev.get("python.stacks.error"):
        parts.append("no Python stack: %s" % ev["python.stacks.error"])
    if h["diagnosis"]:
        parts.append(h["diagnosis"].rstrip("."))
    state = ev.get("process.state")
    if state:
        text = "process %s" % str(state).split(" ", 1)[-1].strip("()")
        wchan = ev.get("process.wait_channel")
        if wchan and not str(wchan).startswith("(none"):
            text += " (wait channel %s)" % wchan
        cpu = ev.get("process.cpu_percent")
        if isinstance(cpu, (int, float)):
            text += ", %.0f%% CPU" % cpu
        parts.append(text)
    parts.append("check process (pid %d) %s" % (h["pid"], "killed" if h.get("killed") else "could not be killed"))
    step = h["step"]
    advice = _HANG_ADVICE.get(h["kind"], "see the stack")
    if step == "start-up":
        advice = (
            "the interpreter's start hangs before the first check (sitecustomize, a .pth file, "
            "lora_otel's preamble): see the stack; raise --import-timeout if it is only slow"
        )
    elif step.startswith("after ") or step == "after start-up":
        advice = "the check process hung between two steps, in lora-otel doctor itself: see the stack, and report it"
    elif "%s" in advice:
        advice = advice % step[len("import ") :]
    status = "warn" if h["kind"] == "exit" else "fail"
    return Check(
        name or step,
        status,
        "hung: " + "; ".join(parts),
        advice,
        duration_s=h["waited"],
        details={
            "pid": h["pid"],
            "limit_s": h["limit"],
            "killed": h.get("killed"),
            "stack": [{"file": p, "line": n, "function": f, "source": s} for p, n, f, s in h["excerpt"]],
            "stacks": h["stacks"],
            "diagnosis": h["diagnosis"],
            "evidence": h["evidence"],
        },
    )


def _died_check(d: dict[str, Any], name: str) -> Check:
    tail = d.get("log_tail") or ""
    last = tail.splitlines()[-1] if tail else ""
    evidence = "the check process died: %s%s" % (d["status"], "; last output: %s" % last if last else "")
    if d["status"].startswith("cannot start"):
        advice = "check that this Python (%s) can start programs" % sys.executable
    elif name.startswith("import "):
        advice = (
            "a crash in native code (a C extension, a CUDA library): run it alone to see the native stack, "
            "python -X faulthandler -c 'import %s'; the check process's log has the output" % name[7:]
        )
    else:
        advice = (
            "a crash in native code (the driver, a CUDA library): see the check process's log for the "
            "faulthandler stack, and dmesg for driver errors"
        )
    return Check(name, "fail", evidence, advice, details={"status": d["status"], "log_tail": tail})
