"""Known helper threads are not read as the stuck ones (issue 22 item 2).

tqdm's monitor thread (started by every progress bar: every transformers model load shows one) and
an executor's idle workers wait in ``threading.Condition.wait`` for as long as the job runs; a job
stuck elsewhere must not be told "Waiting for a lock: thread run() waits in waiter.acquire".
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from procs import PYTHON, clean_env, journals

from lora_otel.analysis.diagnose import lock_waits
from lora_otel.journal.reader import read_journal

pytest.importorskip("tqdm")

JOB = """\
import concurrent.futures, glob, time, lora_otel
from tqdm import tqdm
for _ in tqdm(range(3), mininterval=0):  # a bar: tqdm's monitor thread now runs
    time.sleep(0.01)
pool = concurrent.futures.ThreadPoolExecutor(2)
pool.submit(time.sleep, 0).result()  # an idle worker thread
seen, deadline = None, time.monotonic() + 90
with lora_otel.stage("load model"):  # stuck in a sleep until the stall record is written, and 1 s more
    while time.monotonic() < deadline and (seen is None or time.monotonic() < seen + 1):
        time.sleep(0.2)
        if seen is None and any(b'"stall"' in open(p, 'rb').read() for p in glob.glob('j/*.otel.jsonl')):
            seen = time.monotonic()
print("stall seen", seen is not None, flush=True)
"""


@pytest.mark.slow
def test_tqdm_monitor_and_idle_executor_are_not_a_lock_wait(tmp_path: Path) -> None:
    (tmp_path / "job.py").write_text(JOB, encoding="utf-8")
    r = subprocess.run(
        [PYTHON, "job.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=150,
        env=clean_env(LORA_OTEL="1", LORA_OTEL_DIR="j", LORA_OTEL_STALL_AFTER="load model=2"),
    )
    assert r.returncode == 0 and r.stdout == "stall seen True\n", (r.stdout, r.stderr[-3000:])
    [path] = journals(tmp_path / "j")
    [record] = read_journal(path).stalls
    [stacks] = (tmp_path / "j").glob("*.stacks.txt")
    assert "tqdm/_monitor.py" in stacks.read_text() and "concurrent/futures/thread.py" in stacks.read_text()
    assert not record["diagnosis"].startswith(("Waiting for a lock", "Deadlock")), record["diagnosis"]
    assert "job.py:10 in <module>" in record["diagnosis"], record["diagnosis"]


MAIN_ON_LOCK = """\
Thread 0x00007f0000000002 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 331 in wait
  File "/venv/lib/python3.11/site-packages/tqdm/_monitor.py", line 60 in run
  File "/usr/lib/python3.11/threading.py", line 1045 in _bootstrap_inner
  File "/usr/lib/python3.11/threading.py", line 1002 in _bootstrap

Current thread 0x00007f0000000001 (most recent call first):
  File "/work/job.py", line 7 in <module>
"""


def test_a_helper_in_a_timed_wait_is_left_out_of_the_lock_sentence() -> None:
    assert lock_waits(MAIN_ON_LOCK) is None
