"""``.ci/cpython_tests.py``: CPython's own regression tests under ``LORA_OTEL=1`` judge lora_otel,
not how the script was started (issue 36 item 10).

A real run of the script (regrtest of two modules, the SIGINT tests only) started as a background
job of a shell without job control, as ``cmd &`` in a CI script starts it: with SIGINT ignored.
"""

from __future__ import annotations

import subprocess

import pytest
from procs import PYTHON, REPO, clean_env

SIGINT_TESTS = [
    "test_sigint",
    "test_keyboard_interrupt_exit_code",
    "test_pidfd_send_signal",
    "test_interrupt_main_*thread",
]


@pytest.mark.slow
def test_sigint_tests_pass_when_the_script_starts_with_sigint_ignored(tmp_path) -> None:
    """Started with SIGINT ignored, the script gives regrtest SIGINT's default action back, so the
    SIGINT tests of test_signal and test_threading pass in its workers. (Before: Python kept SIGINT
    ignored, every worker and child inherited it, and these five tests failed, with lora_otel and
    without: the "SIGINT lost under -j2" of two runs in six.)"""
    if subprocess.run([PYTHON, "-c", "import test.libregrtest"], capture_output=True).returncode != 0:
        pytest.skip("this interpreter has no `test` package")
    version = subprocess.run(
        [PYTHON, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"], capture_output=True, text=True
    ).stdout.strip()
    args = [PYTHON, str(REPO / ".ci" / "cpython_tests.py"), "--python", version]
    args += ["--module", "test_signal", "--module", "test_threading"]
    for pattern in SIGINT_TESTS:
        args += ["--match", pattern]
    script = 'trap "" INT; "$@" </dev/null & wait $!'  # (a non-interactive shell's `&` ignores SIGINT too)
    r = subprocess.run(
        ["sh", "-c", script, "sh", *args],
        cwd=tmp_path,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    assert "| %s | on | ok |" % version in r.stdout, r.stdout[-4000:]
