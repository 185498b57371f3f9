"""Diagnosis sentences from real evidence: a hub download that hangs, a frozen native call."""

from __future__ import annotations

import socket
import textwrap
import time
from pathlib import Path

import evidence_cases as cases
import pytest
from procs import journal_has_open, journals, wait_for
from test_hangs import kill_and_reap, start_traced

from lora_otel.analysis.diagnose import diagnose
from lora_otel.analysis.evidence import gather, py_spy_path, stack_request
from lora_otel.analysis.stall import detect, parse_limits
from lora_otel.journal.reader import read_journal

pytestmark = pytest.mark.slow


def evidence_for(tmp_path: Path, pid: int, native: bool = False):
    """What the watchdog gathers (``native``: for a frozen stall, as it asks)."""
    [path] = journals(tmp_path / "lora-otel")
    return gather(pid, stack_request(read_journal(path)), native=native)


def test_hub_download_that_never_answers(tmp_path: Path) -> None:
    """A package named huggingface_hub reading from a local server that accepts and never answers."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    pkg = tmp_path / "huggingface_hub"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(
        textwrap.dedent(
            """
        import socket
        def hf_hub_download():
            s = socket.create_connection(("127.0.0.1", %d))
            s.sendall(b"GET /model.safetensors HTTP/1.1\\r\\n\\r\\n")
            return s.recv(1)
        hf_hub_download()
    """
            % port
        )
    )
    proc = start_traced(tmp_path, "import huggingface_hub\n")
    try:
        wait_for(lambda: journal_has_open(tmp_path / "lora-otel", "import huggingface_hub"), what="import span")
        time.sleep(1.2)
        [path] = journals(tmp_path / "lora-otel")
        stall = detect(read_journal(path), time.time_ns(), alive=True, limits=parse_limits("import=1"))
        assert stall is not None and stall.span.name == "import huggingface_hub"
        evidence = evidence_for(tmp_path, proc.pid)
        sentence = diagnose(stall, evidence)
        cases.record_explained(stall, evidence, read_journal(path), "tests/test_diagnose.py")
        assert sentence.startswith("Waiting on the network inside huggingface_hub (a hub download or API call)")
        assert "-> 127.0.0.1:%d ESTABLISHED" % port in sentence
    finally:
        kill_and_reap(proc)
        server.close()


def test_frozen_native_call(tmp_path: Path) -> None:
    """GIL held in pause(): frozen, and the sentence says native code holding the GIL (with py-spy
    installed; else that the GIL is unknown), naming the frame."""
    (tmp_path / "frozenmod.py").write_text(
        "import ctypes\ndef hold():\n    while True:\n        ctypes.PyDLL(None).pause()\nhold()\n"
    )
    proc = start_traced(tmp_path, "import frozenmod\n")
    try:
        wait_for(lambda: journal_has_open(tmp_path / "lora-otel", "import frozenmod"), what="import span")
        [path] = journals(tmp_path / "lora-otel")
        stall = wait_for(
            lambda: detect(read_journal(path), time.time_ns(), alive=True, frozen_after_s=2), what="frozen", timeout=15
        )
        evidence = evidence_for(tmp_path, proc.pid, native=True)
        sentence = diagnose(stall, evidence)
        cases.record_explained(stall, evidence, read_journal(path), "tests/test_diagnose.py")
        if py_spy_path() is not None:  # the GIL is said held only when py-spy's stacks show it
            assert sentence.startswith("Holding the GIL in native code while blocked"), sentence
        else:
            assert "whether it holds the GIL is unknown without native stacks" in sentence, sentence
        assert "frozenmod.py" in sentence
    finally:
        kill_and_reap(proc)
