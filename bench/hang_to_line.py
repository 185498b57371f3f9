"""How soon a hang is named in the job's own log, with no collector (issue 13's figures).

    python bench/hang_to_line.py [--runs 3]

Each case is a real job launched as a UI launches it: ``LORA_OTEL=1``, detached, stdout and stderr
appended to ``log.txt``. The job writes the time just before it hangs into ``hung.at``; the bench
polls ``log.txt`` every 20 ms and measures from that moment to the first line that names the hang
and to the ``STALLED`` line. Cases:

- ``import (sleeps)``: an import whose body sleeps; default settings for the first line (the
  narration cadence starts at 10 s) and ``LORA_OTEL_STALL_AFTER=import=5`` for the STALLED line
  (limit 5 s: the goal is limit + 1 s);
- ``between stages``: after its arguments and ``import torch``, a read from a local server that
  never sends, no stage open; ``between=5``;
- ``frozen (GIL held)``: an import that holds the GIL in C (``ctypes.PyDLL(None).pause()``): the
  job cannot speak, its watchdog names it once the beat has stopped for ``frozen_after`` (10 s
  default; the goal is that + 1 s).

The baseline printed beside each figure is the goal itself (10 s cadence start + 1 s, or the
limit + 1 s), since the thing measured has no cheaper twin. Medians of ``--runs``.
"""

from __future__ import annotations

import argparse
import calendar
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

PY = sys.executable
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

RUN = "import sys, time\nopen('hung.at', 'w').write(repr(time.time()))\nimport hang_%s\n"
HANG = {
    "sleep": "import time\ntime.sleep(600)\n",
    "gil": "import ctypes\nctypes.PyDLL(None).pause()\n",
}
BETWEEN = (
    "import argparse, socket, sys, time\nargparse.ArgumentParser().parse_known_args()\nimport torch\n"
    "s = socket.create_connection(('127.0.0.1', int(sys.argv[1])))\n"
    "open('hung.at', 'w').write(repr(time.time()))\ns.recv(1)\n"
)


def _env(**extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LORA_OTEL", "OTEL_")) and k != "TRACEPARENT"}
    env.update(LORA_OTEL="1", PYTHONPATH=REPO, **extra)
    return env


def _silent_server() -> tuple:
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)
    held: list = []

    def accept() -> None:
        while True:
            try:
                held.append(srv.accept()[0])
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    return srv, held


def one(case: str, needle: str, env: dict, timeout: float = 60.0) -> float:
    """Seconds from the hang to the first line of ``log.txt`` containing ``needle``."""
    with tempfile.TemporaryDirectory() as d:
        args: list = []
        srv = None
        if case == "between":
            srv, _ = _silent_server()
            with open(os.path.join(d, "job.py"), "w") as f:
                f.write(BETWEEN)
            args = [str(srv.getsockname()[1])]
        else:
            with open(os.path.join(d, "hang_%s.py" % case), "w") as f:
                f.write(HANG[case])
            with open(os.path.join(d, "job.py"), "w") as f:
                f.write(RUN % case)
        log = open(os.path.join(d, "log.txt"), "ab")  # noqa: SIM115 - the job's stdout and stderr, closed after it
        proc = subprocess.Popen(
            [PY, "job.py", *args],
            cwd=d,
            env=dict(env, LORA_OTEL_DIR=os.path.join(d, "lora-otel")),  # not the user's state directory
            stdout=log,
            stderr=log,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            deadline = time.time() + timeout
            while time.time() < deadline:
                try:
                    with open(os.path.join(d, "log.txt"), "rb") as f:
                        text = f.read().decode("utf-8", "replace")
                    with open(os.path.join(d, "hung.at")) as f:
                        at = float(f.read())
                except (OSError, ValueError):
                    time.sleep(0.02)
                    continue
                for line in text.splitlines():
                    if needle in line and "[lora-otel]" in line:
                        stamp = line.split("][", 2)[2].split("]", 1)[0]  # the line's own UTC time
                        seen = calendar.timegm(time.strptime(stamp[:19], "%Y-%m-%dT%H:%M:%S"))
                        return seen + float(stamp[19:-1]) - at
                time.sleep(0.02)
            raise RuntimeError("%s: no line with %r within %s s:\n%s" % (case, needle, timeout, text[-2000:]))
        finally:
            proc.kill()
            proc.wait()
            log.close()
            if srv is not None:
                srv.close()


CASES = [
    # (label, case, the line looked for, env, the goal in seconds)
    ("import (sleeps): first line, default settings", "sleep", "still in import hang_sleep", {}, 11.0),
    ("import (sleeps): STALLED, import=5", "sleep", "STALLED", {"LORA_OTEL_STALL_AFTER": "import=5"}, 6.0),
    ("between stages: first line, default settings", "between", "no stage open", {}, 11.0),
    ("between stages: STALLED, between=5", "between", "STALLED", {"LORA_OTEL_STALL_AFTER": "between=5"}, 6.0),
    ("frozen (GIL held): STALLED, frozen after 10 s", "gil", "STALLED", {}, 11.0),
]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3, help="jobs per case (default 3); the median is shown")
    args = ap.parse_args()
    print(
        "lora_otel: from a hang to the job's own line naming it — %s, Python %s, %d CPUs, %s; "
        "median of %d runs\n"
        % (os.uname().machine, sys.version.split()[0], os.cpu_count() or 0, time.strftime("%Y-%m-%d"), args.runs)
    )
    print("| case | seconds to the line | goal (the baseline) | within |")
    print("|---|---:|---:|---|")
    for label, case, needle, extra, goal in CASES:
        times = [one(case, needle, _env(**extra)) for _ in range(args.runs)]
        median = statistics.median(times)
        print(
            "| %s | %.2f (%s) | ≤ %.0f | %s |"
            % (label, median, ", ".join("%.2f" % t for t in times), goal, "yes" if median <= goal else "no")
        )
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
