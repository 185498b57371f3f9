"""Module paths users may have named keep working for one release (CHANGELOG.md, issue 15)."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow


def test_the_old_reader_path_imports_with_a_deprecation_warning() -> None:
    """`from lora_otel.export.reader import read_journal, Journal, JournalTail` (the path
    docs/journal.md named before issue 15) still works, and says where the module went."""
    code = (
        "import warnings\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    warnings.simplefilter('always')\n"
        "    from lora_otel.export.reader import Journal, JournalTail, read_journal\n"
        "import lora_otel.journal.reader as new\n"
        "assert read_journal is new.read_journal and Journal is new.Journal\n"
        "assert JournalTail.__module__.startswith('lora_otel.journal.')\n"
        "[w] = [w for w in caught if issubclass(w.category, DeprecationWarning)]\n"
        "print(w.message)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "moved to lora_otel.journal.reader" in proc.stdout


@pytest.mark.parametrize(
    "argv",
    [["-m", "lora_otel.export.sidecar", "--help"], ["-m", "lora_otel", "--help"], ["-m", "lora_otel.cli", "--help"]],
)
def test_module_paths_launched_processes_name_still_run(argv: list[str]) -> None:
    """`python -m lora_otel.export.sidecar` is what a running job's preamble starts; it did not move."""
    proc = subprocess.run([sys.executable, *argv], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "usage" in proc.stdout.lower()
