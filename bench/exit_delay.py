"""How long a traced process's exit is delayed when the OTLP collector is down, seen from its launcher.

    python bench/exit_delay.py [--runs 10] [--sdk-runs 3] [--modes refused,blackhole,slow,ok]

Every run starts one process the way a launcher (a job scheduler, a notebook, CI) does:
``subprocess.Popen(stdout=PIPE, stderr=PIPE)``, then reads both pipes until end-of-file while
another thread sits in ``wait()``. The script's very last statement writes ``time.time()`` to a
side file. Reported per row, in ms after that last statement:

- EOF: when the launcher has read end-of-file on BOTH pipes (every holder of the pipes is gone);
- wait: when ``wait()`` returned (the process was reaped);
- EOF − wait: end-of-file as seen after the launcher learnt of the exit (negative: before).

Nothing is subtracted: the bare interpreter's own teardown is a row of the same table, measured
interleaved in the same run, and the ratio column divides by it.

Set-ups (rows):
- bare: ``python script.py``, no tracing (the baseline);
- LORA_OTEL=1, no endpoint: the preamble's exit hook, no sidecar (a reference);
- LORA_OTEL=1 + endpoint: zero-code mode with ``OTEL_EXPORTER_OTLP_ENDPOINT`` set, so the process
  starts its detached sidecar;
- lora-otel run + endpoint: ``python -m lora_otel run -- python script.py`` (the supervisor);
- OTel SDK default: the script sets up ``TracerProvider`` + ``BatchSpanProcessor(OTLPSpanExporter())``
  (http/protobuf, endpoint from the environment), makes one span and returns; the SDK's atexit
  shutdown flushes. This is what a manual set-up or ``opentelemetry-instrument`` gives.

Collector modes:
- refused: a loopback port with nothing listening (connection refused at once);
- blackhole: a socket server in a thread that accepts connections and never reads or answers;
- slow: a collector that is up but slow: a socket server in a thread that reads each HTTP request
  whole and answers ``200`` (an empty OTLP response) only ``--slow-s`` seconds later (default 30);
- ok: a real collector (the ``rotel`` agent, as in tests/collector.py); skipped when absent.

The sidecar is checked in every lora_otel run: its pid is read from the journal (root attribute
``lora_otel.sidecar.pid``) and polled until it is gone; runs are serial, each waiting for the
previous sidecar to finish, so sidecars never overlap. ``LORA_OTEL_DRAIN_S`` is set to 5 s (default
30 s; ``--drain-s``), which bounds how long a sidecar retries an unreachable collector after the job.
"""

from __future__ import annotations

import argparse
import compileall
import glob
import os
import selectors
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))
from sidecar_cost import env_base, free_port  # noqa: E402

PY = sys.executable
DRAIN_S = 5.0
GOAL_MS = 100.0

PLAIN = """\
import sys, time
print("hello from the job")
with open(sys.argv[1], "w") as f: f.write(repr(time.time()))
"""

SDK = """\
import sys, time
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

provider = TracerProvider()
provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
trace.set_tracer_provider(provider)
with trace.get_tracer("bench").start_as_current_span("work"):
    print("hello from the job")
with open(sys.argv[1], "w") as f: f.write(repr(time.time()))
"""


class BlackHole:
    """Accepts TCP connections on a loopback port and never reads from or answers them."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(1024)
        self.port = self.sock.getsockname()[1]
        self.conns: list = []
        self._stop = False
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        while not self._stop:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(conn)

    def close(self) -> None:
        self._stop = True
        self.sock.close()
        for c in self.conns:
            c.close()


class SlowCollector:
    """An OTLP/HTTP server that is up but slow: reads each request whole, answers 200 after ``delay`` s."""

    def __init__(self, delay: float = 30.0) -> None:
        self.delay = delay
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(1024)
        self.port = self.sock.getsockname()[1]
        self.conns: list = []
        self.requests = 0
        self._stop = threading.Event()
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        buf = b""
        try:
            while not self._stop.is_set():
                while b"\r\n\r\n" not in buf:
                    data = conn.recv(65536)
                    if not data:
                        return
                    buf += data
                head, buf = buf.split(b"\r\n\r\n", 1)
                length = 0
                for line in head.split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value.strip())
                while len(buf) < length:
                    data = conn.recv(65536)
                    if not data:
                        return
                    buf += data
                buf = buf[length:]
                self.requests += 1
                if self._stop.wait(self.delay):
                    return
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/x-protobuf\r\nContent-Length: 0\r\n\r\n")
        except (OSError, ValueError):
            return

    def close(self) -> None:
        self._stop.set()
        self.sock.close()
        for c in self.conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            c.close()


def refused_port() -> int:
    port = free_port()
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", port)) != 0, "port %d unexpectedly accepts" % port
    return port


def measure_one(cmd: list, env: dict, cwd: str, side: str, timeout: float = 120.0) -> dict:
    """One launch as a launcher does it; times are ``time.time()`` (the script's clock)."""
    if os.path.exists(side):
        os.unlink(side)
    p = subprocess.Popen(
        cmd, env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    waited: dict = {}

    def waiter() -> None:
        p.wait()
        waited["t"] = time.time()

    th = threading.Thread(target=waiter, daemon=True)
    th.start()
    sel = selectors.DefaultSelector()
    err_fd = p.stderr.fileno()
    out = {p.stdout.fileno(): bytearray(), err_fd: bytearray()}
    for f in (p.stdout, p.stderr):
        sel.register(f.fileno(), selectors.EVENT_READ)
    deadline = time.monotonic() + timeout
    while sel.get_map():
        events = sel.select(max(deadline - time.monotonic(), 0))
        if not events:
            p.kill()
            raise RuntimeError("no EOF after %.0f s: %s" % (timeout, cmd))
        for key, _ in events:
            data = os.read(key.fd, 65536)
            if data:
                out[key.fd] += data
            else:
                sel.unregister(key.fd)
    t_eof = time.time()
    sel.close()
    th.join(timeout)
    p.stdout.close()
    p.stderr.close()
    try:
        last = float(Path(side).read_text())
    except (OSError, ValueError):
        raise RuntimeError(  # noqa: B904 - the message says what went wrong; the OSError adds nothing
            "the script did not write its timestamp (rc %s): %s\n%s"
            % (p.returncode, cmd, out[err_fd].decode(errors="replace"))
        )
    return {
        "eof": (t_eof - last) * 1000,
        "wait": (waited["t"] - last) * 1000,
        "t_wait": waited["t"],
        "rc": p.returncode,
    }


def proc_gone(pid: int) -> bool:
    """Gone, or a zombie nobody has reaped yet (PID 1 in a container may not reap)."""
    try:
        with open("/proc/%d/stat" % pid, "rb") as f:
            data = f.read()
    except OSError:
        return True
    return data[data.rindex(b")") + 2 :].split()[0] in (b"Z", b"X")


def is_sidecar(pid: int) -> bool:
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            return b"lora_otel.export.sidecar" in f.read()
    except OSError:
        return False


def check_sidecar(jdir: str, t_job_end: float, timeout: float) -> dict:
    """Read the sidecar pid from the journal, poll it until gone; seconds after the job's end."""
    from lora_otel.journal.reader import read_journal

    journals = sorted(glob.glob(os.path.join(jdir, "*.otel.jsonl")))
    if not journals:
        return {"pid": None, "why": "no journal in %s" % jdir}
    j = read_journal(journals[0])
    pid = j.root.attrs.get("lora_otel.sidecar.pid") if j.root else None
    if not pid:
        return {"pid": None, "why": "no lora_otel.sidecar.pid in the journal"}
    alive_at_check = not proc_gone(pid) and is_sidecar(pid)
    deadline = time.time() + timeout
    while not proc_gone(pid) and time.time() < deadline:
        time.sleep(0.01)
    t_gone = time.time()
    logs = glob.glob(os.path.join(jdir, "*.sidecar.log"))
    last_line = ""
    if logs:
        lines = Path(logs[0]).read_text(errors="replace").strip().splitlines()
        last_line = lines[-1] if lines else ""
        summary = [x for x in lines if "process ended" in x]
        last_line = summary[-1] if summary else last_line
    return {
        "pid": pid,
        "alive_at_check": alive_at_check,
        "gone": proc_gone(pid),
        "after_s": t_gone - t_job_end,
        "log": last_line,
    }


def fmt(x: float) -> str:
    return "%.1f" % x if abs(x) < 1000 else "%.0f" % x


LORA_ZERO_CODE = "LORA_OTEL=1 + endpoint (sidecar)"
LORA_RUN = "lora-otel run + endpoint"
SDK_DEFAULT = "OTel SDK default (BatchSpanProcessor)"
BARE = "bare python"


def measure(
    runs: int = 10,
    sdk_runs: int = 3,
    modes=("refused", "blackhole", "slow", "ok"),
    drain_s: float = DRAIN_S,
    slow_s: float = 30.0,
) -> dict:
    """Every row of the table, interleaved; the raw samples per (set-up, collector mode).

    Returns ``rows`` (name, mode, is_sdk, has_sidecar), ``samples`` (dicts from :func:`measure_one`),
    ``sidecars`` (dicts from :func:`check_sidecar`), ``endpoints`` and ``notes``.
    """
    compileall.compile_dir(str(REPO / "lora_otel"), quiet=1)
    work = tempfile.mkdtemp(prefix="lora-otel-exit-")
    plain, sdk = os.path.join(work, "job.py"), os.path.join(work, "sdk_job.py")
    Path(plain).write_text(PLAIN)
    Path(sdk).write_text(SDK)
    compileall.compile_dir(work, quiet=1)
    side = os.path.join(work, "last.txt")
    base = env_base()

    endpoints: dict = {}
    cleanup = []
    notes = []
    try:
        if "refused" in modes:
            endpoints["refused"] = "http://127.0.0.1:%d" % refused_port()
        if "blackhole" in modes:
            bh = BlackHole()
            cleanup.append(bh.close)
            endpoints["blackhole"] = "http://127.0.0.1:%d" % bh.port
        if "slow" in modes:
            slow = SlowCollector(slow_s)
            cleanup.append(slow.close)
            endpoints["slow"] = "http://127.0.0.1:%d" % slow.port
        if "ok" in modes:
            sys.path.insert(0, str(REPO / "tests"))
            from collector import Collector, rotel_agent_path

            binary = rotel_agent_path()
            if binary is None:
                notes.append("ok mode skipped: the rotel package is not installed")
            else:
                cdir = Path(work, "rotel")
                cdir.mkdir()
                col = Collector(binary, cdir)
                cleanup.append(col.stop)
                endpoints["ok"] = col.http_endpoint

        # (name, mode, cmd, env-maker, sdk?, has sidecar?)
        rows: list = [
            (BARE, "-", lambda d, ep: ([PY, plain, side], dict(base)), False, False),
            (
                "LORA_OTEL=1, no endpoint",
                "-",
                lambda d, ep: ([PY, plain, side], dict(base, LORA_OTEL="1", LORA_OTEL_DIR=d)),
                False,
                False,
            ),
        ]
        for mode, ep in endpoints.items():
            live = dict(base, OTEL_EXPORTER_OTLP_ENDPOINT=ep, LORA_OTEL_DRAIN_S=str(drain_s))
            rows.append(
                (
                    LORA_ZERO_CODE,
                    mode,
                    lambda d, ep, live=live: ([PY, plain, side], dict(live, LORA_OTEL="1", LORA_OTEL_DIR=d)),
                    False,
                    True,
                )
            )
            rows.append(
                (
                    LORA_RUN,
                    mode,
                    lambda d, ep, live=live: (
                        [PY, "-m", "lora_otel", "run", "--", PY, plain, side],
                        dict(live, LORA_OTEL_DIR=d),
                    ),
                    False,
                    True,
                )
            )
            rows.append(
                (
                    SDK_DEFAULT,
                    mode,
                    lambda d, ep, ep_=ep: (
                        [PY, sdk, side],
                        dict(base, OTEL_EXPORTER_OTLP_ENDPOINT=ep_, OTEL_SERVICE_NAME="bench"),
                    ),
                    True,
                    False,
                )
            )

        samples: dict = {(r[0], r[1]): [] for r in rows}
        sidecars: dict = {(r[0], r[1]): [] for r in rows if r[4]}
        # Warm the page cache (not counted).
        for _name, mode, mk, is_sdk, _ in rows:
            if not is_sdk and mode in ("-", "ok"):
                d = tempfile.mkdtemp(dir=work)
                cmd, env = mk(d, None)
                measure_one(cmd, env, work, side)
                try:
                    check_sidecar(d, time.time(), drain_s + 20)
                except Exception:
                    pass
        t_start = time.time()
        for i in range(max(runs, sdk_runs)):
            for name, mode, mk, is_sdk, has_sidecar in rows:
                if i >= (sdk_runs if is_sdk else runs):
                    continue
                d = tempfile.mkdtemp(dir=work)
                cmd, env = mk(d, None)
                r = measure_one(cmd, env, work, side)
                samples[(name, mode)].append(r)
                if has_sidecar:
                    sidecars[(name, mode)].append(check_sidecar(d, r["t_wait"], drain_s + 30))
            print("exit_delay: run %d done (%.0f s)" % (i + 1, time.time() - t_start), file=sys.stderr, flush=True)
        if "slow" in endpoints:
            notes.append(
                "slow collector: %d requests received, each to be answered after %g s" % (slow.requests, slow_s)
            )
    finally:
        for c in cleanup:
            c()
        shutil.rmtree(work, ignore_errors=True)
    return {
        "rows": [(r[0], r[1], r[3], r[4]) for r in rows],
        "samples": samples,
        "sidecars": sidecars,
        "endpoints": endpoints,
        "notes": notes,
        "runs": runs,
        "sdk_runs": sdk_runs,
        "drain_s": drain_s,
        "slow_s": slow_s,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=10, help="runs per row (default 10)")
    ap.add_argument("--sdk-runs", type=int, default=3, help="runs per OTel SDK row (~10 s each; default 3)")
    ap.add_argument("--modes", default="refused,blackhole,slow,ok", help="collector modes (default all four)")
    ap.add_argument("--slow-s", type=float, default=30.0, help="the slow collector's delay per answer (default 30)")
    ap.add_argument("--drain-s", type=float, default=DRAIN_S, help="LORA_OTEL_DRAIN_S for the sidecars (default 5)")
    args = ap.parse_args()
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    res = measure(args.runs, args.sdk_runs, modes, args.drain_s, args.slow_s)
    rows, samples, sidecars, endpoints = res["rows"], res["samples"], res["sidecars"], res["endpoints"]

    bare_eof = statistics.median(r["eof"] for r in samples[(BARE, "-")])
    print(
        "lora_otel exit-delay benchmark — %s, Python %s, %d CPUs, %s; %d runs per row (OTel SDK rows: %d), "
        "interleaved; LORA_OTEL_DRAIN_S=%g for the sidecars; slow collector answers after %g s"
        % (
            os.uname().machine,
            sys.version.split()[0],
            os.cpu_count(),
            time.strftime("%Y-%m-%d"),
            args.runs,
            args.sdk_runs,
            args.drain_s,
            args.slow_s,
        )
    )
    print(
        "Times in ms after the script's last statement; EOF = end-of-file read on both stdout and stderr "
        "pipes; wait = wait() returned."
    )
    for note in res["notes"]:
        print(note)
    print()
    print(
        "| set-up | collector | runs | EOF median | EOF max | wait median | wait max | EOF−wait max "
        "| EOF median vs bare |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, mode, *_ in rows:
        s = samples[(name, mode)]
        eof = [r["eof"] for r in s]
        wt = [r["wait"] for r in s]
        gap = [r["eof"] - r["wait"] for r in s]
        med = statistics.median(eof)
        print(
            "| %s | %s | %d | %s | %s | %s | %s | %+.1f | %.2fx |"
            % (
                name,
                mode,
                len(s),
                fmt(med),
                fmt(max(eof)),
                fmt(statistics.median(wt)),
                fmt(max(wt)),
                max(gap),
                med / bare_eof if bare_eof > 0 else float("nan"),
            )
        )
    print()
    print("| figure | value | goal |")
    print("|---|---:|---|")
    for name, mode, _is_sdk, has_sidecar in rows:
        if not has_sidecar:
            continue
        s = samples[(name, mode)]
        worst = max(r["eof"] for r in s)
        print(
            "| %s, %s: worst EOF delay | %s ms | ≤ %d ms: %s |"
            % (name, mode, fmt(worst), GOAL_MS, "yes" if worst <= GOAL_MS else "NO")
        )
        worst_gap = max(r["eof"] - r["wait"] for r in s)
        print(
            "| %s, %s: worst EOF after the launcher's wait() | %+.1f ms | ≤ %d ms: %s |"
            % (name, mode, worst_gap, GOAL_MS, "yes" if worst_gap <= GOAL_MS else "NO")
        )
    for mode in endpoints:
        s = samples.get((SDK_DEFAULT, mode))
        if s:
            print(
                "| OTel SDK default, %s: median EOF delay | %s ms | (reference) |"
                % (mode, fmt(statistics.median(r["eof"] for r in s)))
            )
    print()
    for key, checks in sidecars.items():
        print(sidecar_summary(key, checks))
    rcs = {(k, r["rc"]) for k, s in samples.items() for r in s if r["rc"] != 0}
    if rcs:
        print("non-zero exit codes: %s" % sorted(rcs))


def sidecar_summary(key: tuple, checks: list) -> str:
    """One paragraph per (set-up, mode): did the sidecar outlive the job, and exit by itself?"""
    seen = [c for c in checks if c.get("pid")]
    alive = [c for c in seen if c.get("alive_at_check")]
    gone = [c for c in seen if c.get("gone")]
    after = [c["after_s"] for c in gone]
    line = (
        "sidecar check, %s / %s: pid in the journal in %d/%d runs, still running when the job had exited "
        "in %d, exited by itself in %d" % (key[0], key[1], len(seen), len(checks), len(alive), len(gone))
    )
    if after:
        line += ", %.2f s (median) / %.2f s (max) after the launcher's wait()" % (statistics.median(after), max(after))
    missing = [c["why"] for c in checks if not c.get("pid")]
    if missing:
        line += "\n    no sidecar: %s" % missing[0]
    if seen and seen[-1].get("log"):
        line += "\n    last run's sidecar log: %s" % seen[-1]["log"]
    return line


if __name__ == "__main__":
    main()
