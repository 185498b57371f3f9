"""The device check for a machine with an NVIDIA GPU: is the `cuda init` span right on real hardware?

    python bench/gpu_check.py        # exits 0 when every expected fact is present

Runs a traced child that initialises CUDA (``torch.zeros(1, device="cuda")``), reads its journal
and prints the `cuda probe` / `cuda init` spans with their attributes; fails (exit 1) naming each
missing fact: torch/CUDA/cuDNN versions, driver version, device count, and per device name,
capability, total and free memory. Not run by CI (CI has no GPU); run it where one is lent.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from lora_otel.journal.reader import read_journal

EXPECTED = [
    "lora_otel.torch.version",
    "lora_otel.cuda.version",
    "lora_otel.cudnn.version",
    "lora_otel.nvidia.driver_version",
    "lora_otel.cuda.device_count",
    "lora_otel.cuda.device_names",
    "lora_otel.cuda.capabilities",
    "lora_otel.cuda.total_memory_bytes",
    "lora_otel.cuda.free_memory_bytes",
    "lora_otel.cuda.visible_devices",
]


def main() -> int:
    d = Path(tempfile.mkdtemp(prefix="lora-otel-gpu-"))
    (d / "job.py").write_text(
        "import torch\nprint(torch.cuda.is_available())\nx = torch.zeros(1, device='cuda')\nprint('OK', x.device)\n"
    )
    j = d / "job.otel.jsonl"
    r = subprocess.run(
        [sys.executable, "-m", "lora_otel", str(d / "job.py")],
        cwd=d,
        capture_output=True,
        text=True,
        env={**__import__("os").environ, "LORA_OTEL_JOURNAL": str(j)},
        timeout=300,
    )
    print(r.stdout[-3000:], r.stderr[-3000:], sep="\n")
    journal = read_journal(j)
    spans = {s.name: s for s in journal.spans}
    for name in ("cuda probe", "cuda init"):
        s = spans.get(name)
        print(
            name,
            json.dumps(
                None
                if s is None
                else {"status": s.status, "ms": (s.end_ns - s.start_ns) / 1e6 if s.end_ns else None, "attrs": s.attrs},
                indent=1,
            ),
        )
    init = spans.get("cuda init")
    missing = [k for k in EXPECTED if init is None or k not in init.attrs]
    if init is None or init.status != "ok" or missing:
        print("FAIL: cuda init %s; missing %s" % ("absent" if init is None else init.status, missing))
        return 1
    print("PASS: cuda init has every expected fact")
    return 0


if __name__ == "__main__":
    sys.exit(main())
