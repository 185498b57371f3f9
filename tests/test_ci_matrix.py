"""``.ci/matrix.py``'s cache: one shared venv per Python and key, a small venv per checkout over it,
and the pruning that keeps the cache from filling the disk (CI's checkout once built its own 18 GB
of torch venvs beside the developers' and ran out of space).

Real venvs (``python -m venv --without-pip``) and a real second process holding a lock; no pip.
"""

from __future__ import annotations

import fcntl
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
from procs import REPO

spec = importlib.util.spec_from_file_location("ci_matrix", REPO / ".ci" / "matrix.py")
assert spec and spec.loader
matrix = importlib.util.module_from_spec(spec)
spec.loader.exec_module(matrix)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    root = tmp_path / "matrix"
    root.mkdir()
    monkeypatch.setenv("LORA_OTEL_MATRIX_VENVS", str(root))
    return root


@pytest.mark.slow
def test_checkout_venv_sees_the_shared_packages_this_checkout_and_the_start_hook(cache, tmp_path):
    shared = cache / "py3.99-aaaa"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(shared)], check=True)
    shared_site = matrix.site_packages(shared / "bin" / "python")
    (shared_site / "matrix_probe_mod.py").write_text("WHERE = 'shared'\n")
    extra = tmp_path / "extra"
    extra.mkdir()
    (extra / "matrix_probe_extra.py").write_text("WHERE = 'extra'\n")
    (shared_site / "probe_extra.pth").write_text(str(extra) + "\n")  # a .pth of the shared venv's own

    python = matrix.checkout_venv(sys.executable, shared, cache / "checkouts" / "c0ffee" / shared.name)
    assert python.parent.parent == cache / "checkouts" / "c0ffee" / shared.name
    out = subprocess.run(
        [
            str(python),
            "-c",
            "import sys, matrix_probe_mod, matrix_probe_extra, lora_otel; "
            "print(matrix_probe_mod.WHERE, matrix_probe_extra.WHERE, lora_otel.__file__, sys.prefix)",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert out.returncode == 0, out.stderr
    where, extra_where, lora_file, prefix = out.stdout.split()
    assert (where, extra_where) == ("shared", "extra")
    assert Path(lora_file).resolve() == (REPO / "lora_otel" / "__init__.py").resolve()
    assert Path(prefix) == python.parent.parent
    site = matrix.site_packages(python)
    assert (site / "lora_otel_hook.pth").read_text() == (REPO / "lora_otel_hook.pth").read_text()
    # nothing of this checkout's is written into the shared venv: two checkouts never point it elsewhere
    assert not list(shared_site.glob("lora_otel*.pth"))


@pytest.mark.slow
def test_prune_removes_other_keys_of_that_python_unless_a_run_holds_them(cache):
    for key in ("keep", "held", "stale"):
        (cache / ("py3.99-%s" % key) / "bin").mkdir(parents=True)
        (cache / ("py3.99-%s.lock" % key)).touch()
        (cache / ("py3.99-%s.log" % key)).write_text("$ pip install\n")
        (cache / "checkouts" / "c0ffee" / ("py3.99-%s" % key)).mkdir(parents=True)
    (cache / "py3.98-other").mkdir()
    (cache / "py3.98-other.lock").touch()
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, sys; f = open(sys.argv[1], 'a'); fcntl.flock(f, fcntl.LOCK_SH); print('held', flush=True);"
            " sys.stdin.read()",
            str(cache / "py3.99-held.lock"),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        removed = matrix.prune("3.99", "keep")
    finally:
        holder.stdin.close()
        holder.wait(timeout=60)
        holder.stdout.close()
    assert removed == [cache / "py3.99-stale"]
    left = sorted(p.relative_to(cache).as_posix() for p in cache.rglob("*") if p.name != "bin")
    assert left == [
        "checkouts",
        "checkouts/c0ffee",
        "checkouts/c0ffee/py3.99-held",
        "checkouts/c0ffee/py3.99-keep",
        "py3.98-other",
        "py3.98-other.lock",
        "py3.99-held",
        "py3.99-held.lock",
        "py3.99-held.log",
        "py3.99-keep",
        "py3.99-keep.lock",
        "py3.99-keep.log",
    ]
    # once nothing holds it, the next prune removes it
    assert matrix.prune("3.99", "keep") == [cache / "py3.99-held"]
    with open(cache / "py3.99-keep.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # prune left no lock of the kept key taken


def test_schedule_runs_one_python_at_a_time_then_two_once_widened():
    """.ci/run's matrix: one Python at a time beside the main suite, two once the suite has ended."""
    import threading

    widened = threading.Event()
    release = {v: threading.Event() for v in ("a", "b", "c")}
    started: list[str] = []
    running: list[int] = []
    lock = threading.Lock()
    now = [0]

    def work(version):
        with lock:
            started.append(version)
            now[0] += 1
            running.append(now[0])
        assert release[version].wait(60), version
        with lock:
            now[0] -= 1
        if version == "c":
            raise RuntimeError("no interpreter")
        return 0, 1.0, version + " passed"

    results = {}
    thread = threading.Thread(
        target=lambda: results.update(matrix.schedule(["a", "b", "c"], work, 1, 2, widened.is_set, poll_s=0.05))
    )
    thread.start()

    def wait_for(cond):
        for _ in range(1200):
            with lock:
                if cond():
                    return
            threading.Event().wait(0.05)
        raise AssertionError("schedule did not get there: started %s" % started)

    wait_for(lambda: started == ["a"])
    release["a"].set()
    wait_for(lambda: started == ["a", "b"])
    widened.set()  # the suite ended: "c" starts beside "b"
    wait_for(lambda: started == ["a", "b", "c"])
    assert max(running) == 2
    release["b"].set()
    release["c"].set()
    thread.join(60)
    assert not thread.is_alive()
    assert results["a"] == (0, 1.0, "a passed") and results["b"] == (0, 1.0, "b passed")
    assert results["c"][0] == 1 and results["c"][2] == "RuntimeError: no interpreter"


@pytest.mark.slow
def test_a_built_venv_is_used_at_once_while_another_run_uses_it(cache):
    """A second run (CI's checkout beside a developer's .ci/run) must not wait for the first to end:
    it once asked for the venv's lock exclusive first, and waited a whole matrix run."""
    version = "%d.%d" % sys.version_info[:2]
    exe, _, key = matrix.shared_key(version, None)
    shared = cache / ("py%s-%s" % (version, key))
    subprocess.run([exe, "-m", "venv", "--without-pip", str(shared)], check=True)
    (shared / ".built").touch()
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, sys; f = open(sys.argv[1], 'a'); fcntl.flock(f, fcntl.LOCK_SH); print('held', flush=True);"
            " sys.stdin.read()",
            str(cache / ("py%s-%s.lock" % (version, key))),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        second = subprocess.run(
            [
                sys.executable,
                "-c",
                "import importlib.util, sys; spec = importlib.util.spec_from_file_location('m', sys.argv[1]);"
                " m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m);"
                " print(m.venv_for(sys.argv[2], None))",
                str(REPO / ".ci" / "matrix.py"),
                version,
            ],
            capture_output=True,
            text=True,
            timeout=120,  # the holder never lets go: a run that waits for it times out here
        )
    finally:
        holder.stdin.close()
        holder.wait(timeout=60)
        holder.stdout.close()
    assert second.returncode == 0, second.stderr
    assert Path(second.stdout.strip()).parent.parent.name == shared.name
    assert "removed" not in second.stdout  # nothing was rebuilt or pruned
