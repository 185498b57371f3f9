"""lora_otel's lines never glue onto a progress bar's unfinished ``\\r`` line (issue 22 item 5).

tqdm (every transformers load shows a bar) writes ``\\r 33%|███ | 10/30`` with no newline; a line of
ours written then used to continue that line (``…10/30 [00:01<00:02][lora-otel][…] mark: …``),
which a launcher's log panel shows as one unreadable line and a line-based reader never sees as
ours. A line written while stderr is mid-line now starts with a newline: told by the file's last
byte when stderr is a file, by a live tqdm bar on the process's stderr when it is a pipe.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from procs import PYTHON, clean_env

pytestmark = pytest.mark.slow

pytest.importorskip("tqdm")

JOB = """\
import sys, time, lora_otel
from tqdm import tqdm
for i in tqdm(range(40), mininterval=0, file=sys.stderr):  # (2 s: a job, its lines shown, issue 36)
    time.sleep(0.05)
    if i == 30:
        lora_otel.mark("half way")
print("done", flush=True)
"""


def ours_start_lines(text: str) -> None:
    """Every ``[lora-otel]`` in ``text`` starts a line, and the mark is among them."""
    starts = [m.start() for m in re.finditer(r"\[lora-otel\]\[", text)]
    assert starts and all(i == 0 or text[i - 1] == "\n" for i in starts), text
    assert re.search(r"(?m)^\[lora-otel\]\[\d+\]\[[^]]+\] mark: half way$", text), text
    assert "%|" in text  # the bar itself is there, untouched


@pytest.mark.parametrize("stream", ["file", "pipe"])
def test_a_line_written_during_a_bar_starts_on_its_own_line(tmp_path: Path, stream: str) -> None:
    (tmp_path / "job.py").write_text(JOB, encoding="utf-8")
    env = clean_env(LORA_OTEL="1", LORA_OTEL_DIR=str(tmp_path / "j"))
    if stream == "file":
        with open(tmp_path / "log.txt", "wb") as log:  # as a launcher does: `>> log.txt 2>&1`
            r = subprocess.run([PYTHON, "job.py"], cwd=tmp_path, stdout=log, stderr=log, env=env, timeout=120)
        text = (tmp_path / "log.txt").read_text(encoding="utf-8")
    else:
        r = subprocess.run([PYTHON, "job.py"], cwd=tmp_path, capture_output=True, env=env, timeout=120)
        text = r.stderr.decode("utf-8")
        assert r.stdout == b"done\n"
    assert r.returncode == 0, text
    ours_start_lines(text)
