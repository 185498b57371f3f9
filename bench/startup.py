"""Interpreter start-up cost of lora_otel, side by side with a bare interpreter and opentelemetry-instrument.

    python bench/startup.py [--runs 40]

Prints one table. Every row is the median wall time of ``--runs`` fresh interpreters running
``pass``, measured interleaved in the same run (so machine noise hits all rows alike), with the
ratio to the bare interpreter. Byte code is compiled first (``compileall``), as ``pip install``
does, because this machine sets PYTHONDONTWRITEBYTECODE.

Rows:
- bare: ``python -c pass``, LORA_OTEL unset (the .pth hook is installed and does nothing);
- hook off: the .pth hook's own cost with LORA_OTEL unset, measured directly: the hook line
  exec'd in-process (per call), and ``site.addsitedir`` of a directory holding only the hook vs
  an empty directory;
- lora_otel: ``LORA_OTEL=1 python -c pass`` (the whole preamble: journal, lines, self-check, hooks);
- opentelemetry-instrument: ``opentelemetry-instrument python -c pass`` with the OTLP exporter
  (needs ``pip install opentelemetry-distro``; skipped when absent);
- first evidence: microseconds from the preamble's start to the first line and start record on
  disk (read from the journal, ``lora_otel.preamble.first_evidence_us``).
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))
from sidecar_cost import env_base  # noqa: E402

PY = sys.executable
BARE = "bare python -c pass"
ON = "LORA_OTEL=1 python -c pass"
NO_PYC = "LORA_OTEL=1, no byte code"
SIDECAR = "LORA_OTEL=1 + OTLP endpoint (starts the sidecar)"
SITE_EMPTY = "site.addsitedir(empty dir)"
SITE_HOOK = "site.addsitedir(dir with hook), unset"
OTEL_INSTRUMENT = "opentelemetry-instrument python -c pass"


def time_once(cmd: list, env: dict, cwd: str) -> float:
    t = time.perf_counter()
    subprocess.run(cmd, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    return (time.perf_counter() - t) * 1000


def hook_line_cost_us(n: int = 20000) -> float:
    line = (REPO / "lora_otel_hook.pth").read_text().strip()
    env_had = os.environ.pop("LORA_OTEL", None)
    code = compile(line, "lora_otel_hook.pth", "exec")  # site.py compiles each line the same way
    g: dict = {}
    t = time.perf_counter()
    for _ in range(n):
        exec(code, g)
    dt = (time.perf_counter() - t) / n * 1e6
    if env_had is not None:
        os.environ["LORA_OTEL"] = env_had
    return dt


def measure(runs: int = 40, extra_rows: bool = True) -> dict:
    """Time every row ``runs`` times, interleaved; medians in ms and the first-evidence figures.

    ``extra_rows=False`` leaves out the rows that only explain the others (no byte code, the
    ``site.addsitedir`` pair), for a shorter run.
    """
    compileall.compile_dir(str(REPO / "lora_otel"), quiet=1)
    work = tempfile.mkdtemp(prefix="lora-otel-bench-")
    try:
        hookdir = os.path.join(work, "hook")
        emptydir = os.path.join(work, "empty")
        os.makedirs(hookdir)
        os.makedirs(emptydir)
        shutil.copy(REPO / "lora_otel_hook.pth", hookdir)
        base = env_base()
        on = dict(base, LORA_OTEL="1", LORA_OTEL_DIR=os.path.join(work, "journals"))
        otel_inst = shutil.which("opentelemetry-instrument", path=os.path.dirname(PY))
        otel_env = dict(
            base,
            OTEL_TRACES_EXPORTER="otlp",
            OTEL_METRICS_EXPORTER="none",
            OTEL_LOGS_EXPORTER="none",
            OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:9",
            OTEL_SERVICE_NAME="bench",
        )
        nopyc = os.path.join(work, "no-pyc")
        rows = {
            BARE: ([PY, "-c", "pass"], base),
            ON: ([PY, "-c", "pass"], on),
            # A source tree with no byte code (PYTHONDONTWRITEBYTECODE, read-only checkout): every
            # lora_otel module is compiled at each start. Shown for honesty; pip installs compile.
            NO_PYC: ([PY, "-c", "pass"], dict(on, PYTHONPYCACHEPREFIX=nopyc, PYTHONDONTWRITEBYTECODE="1")),
            # With an OTLP endpoint the preamble also starts the sidecar (double fork + exec). The
            # sidecar here is /bin/true, so that forty sidecars importing the OTel SDK do not load
            # the machine during the timing; the job pays the same either way.
            SIDECAR: (
                [PY, "-c", "pass"],
                dict(
                    on,
                    OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:9",
                    LORA_OTEL_SIDECAR_PYTHON=shutil.which("true") or "/bin/true",
                ),
            ),
            SITE_EMPTY: ([PY, "-I", "-S", "-c", "import site; site.addsitedir(%r)" % emptydir], base),
            SITE_HOOK: ([PY, "-I", "-S", "-c", "import site; site.addsitedir(%r)" % hookdir], base),
        }
        if not extra_rows:
            for k in (NO_PYC, SITE_EMPTY, SITE_HOOK):
                del rows[k]
        if otel_inst:
            rows[OTEL_INSTRUMENT] = ([otel_inst, PY, "-c", "pass"], otel_env)
        samples: dict = {k: [] for k in rows}
        for _name, (cmd, env) in rows.items():  # warm the page cache
            time_once(cmd, env, work)
        for _ in range(runs):
            for name, (cmd, env) in rows.items():
                samples[name].append(time_once(cmd, env, work))
        med = {k: statistics.median(v) for k, v in samples.items()}

        fe = []
        for p in Path(work, "journals").glob("*.otel.jsonl"):
            for line in p.read_text().splitlines():
                rec = json.loads(line)
                if rec.get("k") == "attrs" and "lora_otel.preamble.first_evidence_us" in rec["attrs"]:
                    fe.append(
                        (
                            rec["attrs"]["lora_otel.preamble.first_evidence_us"],
                            rec["attrs"]["lora_otel.preamble.duration_us"],
                        )
                    )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return {
        "runs": runs,
        "rows": list(rows),
        "med": med,
        "samples": samples,
        "bare": med[BARE],
        "first_evidence": fe,
        "hook_line_us": hook_line_cost_us(),
        "otel_instrument": otel_inst,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=40)
    args = ap.parse_args()
    r = measure(args.runs)
    med, bare, fe, per_exec = r["med"], r["bare"], r["first_evidence"], r["hook_line_us"]

    print(
        "lora_otel start-up benchmark — %s, Python %s, %d runs per row (median), %s"
        % (os.uname().machine, sys.version.split()[0], args.runs, time.strftime("%Y-%m-%d"))
    )
    print()
    print("| what | median ms | vs bare | added ms |")
    print("|---|---:|---:|---:|")
    for k in r["rows"]:
        ref = med[SITE_EMPTY] if k == SITE_HOOK else bare
        print("| %s | %.2f | %.2fx | %+.2f |" % (k, med[k], med[k] / ref if ref else 0, med[k] - ref))
    print()
    print("| figure | value | goal |")
    print("|---|---:|---|")
    print("| .pth hook line exec'd with LORA_OTEL unset | %.2f µs | < 1000 µs |" % per_exec)
    print(
        "| hook dir vs empty dir, whole interpreter (noise-bound) | %+.2f ms | < 1 ms |"
        % (med[SITE_HOOK] - med[SITE_EMPTY])
    )
    print("| preamble added to interpreter start | %+.2f ms | ≤ 15 ms |" % (med[ON] - bare))
    print("| preamble + starting the sidecar (OTLP endpoint set) | %+.2f ms | ≤ 15 ms |" % (med[SIDECAR] - bare))
    print("| same, without byte code (compiled at every start) | %+.2f ms | |" % (med[NO_PYC] - bare))
    if r["otel_instrument"]:
        print(
            "| opentelemetry-instrument added | %+.2f ms | (reference, ~600 ms here) |" % (med[OTEL_INSTRUMENT] - bare)
        )
    if fe:
        print(
            "| first evidence after preamble start (median) | %d µs | ≤ 5000 µs |" % statistics.median(x[0] for x in fe)
        )
        print(
            "| first evidence after preamble start (max of %d) | %d µs | ≤ 5000 µs |" % (len(fe), max(x[0] for x in fe))
        )
        print("| whole preamble, measured inside (median) | %d µs | |" % statistics.median(x[1] for x in fe))


if __name__ == "__main__":
    main()
