"""Harmless everywhere: another local user cannot steer lora_otel through a shared directory
(issue 12, items 4 and 7).

The job runs in a world-writable sticky directory (``/tmp/...``, mode 1777) as ``--log`` or
``LORA_OTEL_DIR``. The attacker is a second, real, unprivileged account created here with
``useradd``; everything it does (symlinks, planted files, a forged registry and journal, a fallback
directory) runs as that account via ``setpriv``, so only what such a user can really do is done.
Planted FIFOs (issue 36, item 1) and requests from a stranger (item 8) too.
The victim is the test's own user (root in CI): root bypasses permission checks, which is the
worst case — only lora_otel's own checks (``O_EXCL``, ``O_NOFOLLOW``, the owner and mode of what it
opens) stand between the attacker and the victim's files. The kernel's ``fs.protected_symlinks``
and ``fs.protected_regular`` are off on this machine (0), as on many; the assertions do not rely
on them.
"""

from __future__ import annotations

import json
import os
import pwd
import re
import shutil
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from procs import PYTHON, clean_env, journals, wait_for
from test_sidecar import alive, wait_gone

from lora_otel.journal.reader import read_journal

pytestmark = pytest.mark.slow

ATTACKER = "lora_otel_attacker"
PRECIOUS = b"the victim's own data\n"


@pytest.fixture(scope="module")
def attacker() -> pwd.struct_passwd:
    """A second real user account (created once; kept, it is harmless)."""
    if os.geteuid() != 0:
        pytest.skip("needs root to create a second user and act as it (useradd, setpriv)")
    try:
        return pwd.getpwnam(ATTACKER)
    except KeyError:
        pass
    if not shutil.which("useradd") or not shutil.which("setpriv"):
        pytest.skip("useradd or setpriv is not installed: cannot act as a second real user")
    r = subprocess.run(
        ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", ATTACKER],
        capture_output=True,
        text=True,
    )
    if r.returncode != 0:
        pytest.skip("useradd failed: %s" % r.stderr.strip())
    return pwd.getpwnam(ATTACKER)


@pytest.fixture
def shared() -> Iterator[Path]:
    """A world-writable sticky directory, like /tmp/shared."""
    d = Path(tempfile.mkdtemp(prefix="lora-otel-shared-", dir="/tmp"))
    d.chmod(0o1777)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


_attacker_python: dict[int, str] = {}


def attacker_python(user: pwd.struct_passwd) -> str:
    """The interpreter the attacker runs (its code is plain standard library): the tested one, or,
    where another user cannot run it (a pyenv Python under root's home, as the Python matrix of
    ``.ci/run`` uses), the system's ``python3``."""
    if user.pw_uid not in _attacker_python:
        setpriv = ["setpriv", "--reuid=%d" % user.pw_uid, "--regid=%d" % user.pw_gid, "--clear-groups"]
        chosen = PYTHON
        for candidate in (PYTHON, "/usr/bin/python3"):
            r = subprocess.run([*setpriv, candidate, "-c", "pass"], capture_output=True, timeout=60, env=clean_env())
            if r.returncode == 0:
                chosen = candidate
                break
        _attacker_python[user.pw_uid] = chosen
    return _attacker_python[user.pw_uid]


def as_attacker(user: pwd.struct_passwd, code: str, *args: str, wait: bool = True, input: str | None = None):  # noqa: A002 - as subprocess.run
    """Run Python ``code`` as the attacker account (a real uid/gid change, no groups); ``input``:
    its stdin. Not waited for (``wait`` False): a `subprocess.Popen` with its stdin and stdout piped."""
    cmd = [
        "setpriv",
        "--reuid=%d" % user.pw_uid,
        "--regid=%d" % user.pw_gid,
        "--clear-groups",
        attacker_python(user),
        "-c",
        code,
        *args,
    ]
    if not wait:
        return subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=clean_env())
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=clean_env(), input=input)
    assert r.returncode == 0, r.stderr
    return r


def _victim_file(tmp_path: Path, name: str) -> Path:
    f = tmp_path / name
    f.write_bytes(PRECIOUS)
    f.chmod(0o600)
    return f


def _assert_own_private(path: Path) -> None:
    st = os.lstat(path)
    assert stat.S_ISREG(st.st_mode), path
    assert st.st_uid == os.geteuid(), "%s belongs to uid %d" % (path, st.st_uid)
    assert stat.S_IMODE(st.st_mode) == 0o600, "%s has mode %o" % (path, stat.S_IMODE(st.st_mode))


JOB = r"""
import os, signal, sys, time
import lora_otel
with lora_otel.stage("train"):
    time.sleep(0.3)
from lora_otel._boot import preamble
os.kill(os.getpid(), preamble.stack_signal())   # a stack dump beside the journal
time.sleep(0.3)
"""


def _sidecar_env(**extra: str) -> dict:
    return clean_env(
        LORA_OTEL="1",
        OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:9",
        OTEL_EXPORTER_OTLP_TIMEOUT="1",
        LORA_OTEL_DRAIN_S="1",
        **extra,
    )


def _wait_sidecar(journal: Path) -> None:
    pid = read_journal(journal).root.attrs.get("lora_otel.sidecar.pid")
    if pid and alive(pid):
        wait_gone(pid)


def test_planted_symlinks_for_sidecar_log_stacks_and_registry(tmp_path: Path, shared: Path, attacker) -> None:
    """Symlinks planted where the job's sidecar log, stacks file and children registry would go
    (``run.log.sidecar.log``, ``run.log.stacks.txt``, ``run.log.children``), pointing at the
    victim's own files: those files keep their bytes; lora_otel's files are new ones of the
    victim's, mode 0600, beside them."""
    targets = {
        suffix: _victim_file(tmp_path, "victim" + suffix) for suffix in (".sidecar.log", ".stacks.txt", ".children")
    }
    plant = "import os, sys\nfor a in sys.argv[1:]:\n    link, target = a.split('=', 1)\n    os.symlink(target, link)\n"
    as_attacker(attacker, plant, *("%s=%s" % (shared / ("run.log" + s), t) for s, t in targets.items()))
    (tmp_path / "job.py").write_text(JOB)
    r = subprocess.run(
        [PYTHON, str(tmp_path / "job.py"), "--log", str(shared / "run.log")],
        cwd=tmp_path,
        env=_sidecar_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    journal = shared / "run.log.otel.jsonl"
    _wait_sidecar(journal)
    for t in targets.values():
        assert t.read_bytes() == PRECIOUS, "lora_otel wrote into %s through a planted symlink" % t
    _assert_own_private(journal)
    root = read_journal(journal).root.attrs
    for key in ("lora_otel.stacks.path", "lora_otel.sidecar.log"):
        p = Path(root[key])
        assert p.parent == shared and not p.is_symlink()
        _assert_own_private(p)
    assert b"File" in Path(root["lora_otel.stacks.path"]).read_bytes()  # the dump is there
    assert b"following" in Path(root["lora_otel.sidecar.log"]).read_bytes()


SPRAY = r"""
import os, sys, time
d, pid, kind, target, seconds = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], float(sys.argv[5])
t0 = int(time.time())
stamps = [time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(s)) + "-" + pid for s in range(t0 - 1, t0 + int(seconds) + 1)]
names = [os.path.join(d, a + ".otel.jsonl") for a in stamps]
# and the "unique" variant a taken name used to get: <stem>.<UTC second>-<pid>.otel.jsonl
names += [os.path.join(d, "%s.%s.otel.jsonl" % (a, b)) for i, a in enumerate(stamps) for b in stamps[i:]]
if kind == "fifo":  # the journal's name left free; FIFOs at its siblings' (stacks, sidecar log, children)
    names = [os.path.join(d, a + s) for a in stamps for s in (".stacks.txt", ".sidecar.log", ".children")]
for name in names:
    try:
        if kind == "symlink":
            os.symlink(target, name)
        elif kind == "fifo":
            os.mkfifo(name, 0o666)
        else:
            fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
            os.fchmod(fd, 0o666)
            os.close(fd)
    except FileExistsError:
        pass
print("PLANTED", flush=True)
"""


@pytest.mark.parametrize("how", ["zero-code", "lora-otel run"])
@pytest.mark.parametrize("kind", ["symlink", "file", "fifo"])
def test_predicted_journal_names_cannot_be_prepared(
    tmp_path: Path, shared: Path, attacker, kind: str, how: str
) -> None:
    """The attacker prepares every ``<UTC second>-<pid>.otel.jsonl`` the job could get, and the
    ``<name>.<UTC second>-<pid>.otel.jsonl`` variants a taken name led to (its pid is known: a
    launcher started it) — symlinks to the victim's file, or world-readable files of the
    attacker's — or FIFOs at the names of those journals' stacks file, sidecar log and children
    registry (issue 36: the job, a stage so a job at once, hung forever opening its stacks file):
    the victim's file keeps its bytes, the planted files stay empty, the job ends, and its journal
    is a new file of the victim's (mode 0600) under a name with a random part nobody could
    prepare (``<UTC second>-<random>-<pid>``), stage and stack handler recorded."""
    victim = _victim_file(tmp_path, "victim.txt")
    (tmp_path / "job.py").write_text("import lora_otel\nwith lora_otel.stage('train'):\n    pass\n")
    prefix = [PYTHON, "-m", "lora_otel", "run", "--"] if how == "lora-otel run" else []
    # The launcher: the pid is fixed before Python starts (sh exec's it), and the attacker knows it.
    p = subprocess.Popen(
        ["sh", "-c", 'read go; exec "$@"', "sh", *prefix, PYTHON, str(tmp_path / "job.py")],
        cwd=tmp_path,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=clean_env(LORA_OTEL_DIR=str(shared), **({} if prefix else {"LORA_OTEL": "1"})),
    )
    try:
        as_attacker(attacker, SPRAY, str(shared), str(p.pid), kind, str(victim), "4")
        assert p.stdin is not None
        p.stdin.write(b"\n")
        p.stdin.flush()
        _out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 0, err
    assert victim.read_bytes() == PRECIOUS
    planted = [f for f in shared.iterdir() if os.lstat(f).st_uid == attacker.pw_uid]
    assert planted
    for f in planted:
        if stat.S_ISREG(os.lstat(f).st_mode):
            assert f.read_bytes() == b"", "the journal went into the attacker's file %s" % f
    mine = [f for f in journals(shared) if os.lstat(f).st_uid == os.geteuid()]
    assert len(mine) == 1, sorted(os.listdir(shared))
    _assert_own_private(mine[0])
    assert re.fullmatch(r"\d{8}T\d{6}Z-[0-9a-f]{8}-%d\.otel\.jsonl" % p.pid, mine[0].name), mine[0].name
    j = read_journal(mine[0])
    assert j.exit is not None and [s.name for s in j.spans if s.name == "train"] == ["train"]
    _assert_own_private(Path(j.root.attrs["lora_otel.stacks.path"]))


FORGED = r"""
import json, os, sys
d, reg, forged = sys.argv[1], sys.argv[2], sys.argv[3]
rec = {"v": 1, "k": "start", "ts": 1, "trace_id": "ab" * 16, "span_id": "cd" * 8, "parent_id": None,
       "name": "process", "pid": 1, "start_ticks": 1, "attrs": {"service.name": "forged"}}
with open(forged, "w") as f:
    f.write(json.dumps(rec) + "\n")
with open(reg, "w") as f:
    f.write(forged + "\n")
os.chmod(forged, 0o644)
os.chmod(reg, 0o666)
"""


def test_planted_children_registry_is_not_followed(tmp_path: Path, shared: Path, attacker) -> None:
    """A ``run.log.children`` planted by the attacker, naming a forged journal (a process with
    pid 1): the victim's sidecar never follows the forged journal."""
    reg, forged = shared / "run.log.children", shared / "forged.otel.jsonl"
    as_attacker(attacker, FORGED, str(shared), str(reg), str(forged))
    child = "import lora_otel\nwith lora_otel.stage('child'):\n    pass\n"  # a stage: a job, which joins
    (tmp_path / "job.py").write_text(
        "import lora_otel, subprocess, sys\nwith lora_otel.stage('run'):\n"
        "    subprocess.run([sys.executable, '-c', %r])\n" % child
    )
    r = subprocess.run(
        [PYTHON, str(tmp_path / "job.py"), "--log", str(shared / "run.log")],
        cwd=tmp_path,
        env=_sidecar_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    journal = shared / "run.log.otel.jsonl"
    _wait_sidecar(journal)
    log = Path(read_journal(journal).root.attrs["lora_otel.sidecar.log"]).read_text()
    assert "following %s" % journal in log
    assert str(forged) not in log.replace("ignoring", "")  # never followed
    assert "following" in log and log.count("too") >= 1, log  # the job's real child was followed


def test_sidecar_ignores_a_forged_registry_entry(tmp_path: Path, shared: Path, attacker) -> None:
    """The sidecar itself, given a registry that names an attacker's journal (the registry reached
    through a path the attacker controls), follows only journals of the job's user, and says once
    in its log what it ignored."""
    reg, forged = shared / "reg.children", shared / "forged.otel.jsonl"
    as_attacker(attacker, FORGED, str(shared), str(reg), str(forged))
    journal = tmp_path / "job.otel.jsonl"
    (tmp_path / "job.py").write_text("pass\n")
    subprocess.run(
        [PYTHON, str(tmp_path / "job.py")],
        env=clean_env(LORA_OTEL="1", LORA_OTEL_JOURNAL=str(journal)),
        check=True,
        capture_output=True,
        timeout=60,
    )
    own_reg = tmp_path / "own.children"
    own_reg.write_text(str(forged) + "\n")
    own_reg.chmod(0o600)
    for registry in (reg, own_reg):
        r = subprocess.run(
            [PYTHON, "-m", "lora_otel.export.sidecar", "--journal", str(journal), "--children", str(registry)],
            env=_sidecar_env(LORA_OTEL_SIDECAR="1"),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert "following %s too" % forged not in r.stderr
        assert "ignoring" in r.stderr, r.stderr


def test_fallback_dir_prepared_by_another_user_is_not_used(tmp_path: Path, shared: Path, attacker) -> None:
    """``$TMPDIR/lora-otel-<uid>`` pre-created by the attacker, mode 777, and a ``--log`` the job
    cannot write (``/sys``, where even root cannot create a file, stands in for a read-only mount):
    the journal goes to a new private directory (0700, the victim's), and one line says why."""
    fallback = shared / ("lora-otel-%d" % os.geteuid())
    as_attacker(attacker, "import os, sys; os.mkdir(sys.argv[1]); os.chmod(sys.argv[1], 0o777)", str(fallback))
    (tmp_path / "job.py").write_text("pass\n")
    r = subprocess.run(
        [PYTHON, str(tmp_path / "job.py"), "--log", "/sys/run.log"],
        cwd=tmp_path,
        env=clean_env(LORA_OTEL="1", TMPDIR=str(shared)),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    assert list(fallback.iterdir()) == []
    found = journals(shared)
    assert len(found) == 1
    d = found[0].parent
    st = os.lstat(d)
    assert d != fallback and st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) == 0o700
    _assert_own_private(found[0])
    assert "using %s instead" % found[0] in r.stdout + r.stderr


def test_fallback_journal_is_never_shared_between_runs(tmp_path: Path) -> None:
    """Two runs of the same job with ``--log`` where no file can be created (``/sys``): each run
    gets its own journal in the fallback directory, one process per journal, so a later job's
    sidecar can never read an earlier job's exit record."""
    (tmp_path / "job.py").write_text("pass\n")
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    for _ in range(2):
        subprocess.run(
            [PYTHON, str(tmp_path / "job.py"), "--log", "/sys/run.log"],
            cwd=tmp_path,
            env=clean_env(LORA_OTEL="1", TMPDIR=str(tmp)),
            check=True,
            capture_output=True,
            timeout=60,
        )
    found = journals(tmp)
    assert len(found) == 2, found
    for f in found:
        j = read_journal(f)
        assert len([s for s in j.spans if s.name == "process"]) == 1
        _assert_own_private(f)


@pytest.mark.parametrize("planted", ["symlink", "open-dir"])
def test_default_journal_dir_planted_by_another_user_is_not_used(
    tmp_path: Path, shared: Path, attacker, planted: str
) -> None:
    """A job started in a shared directory (mode 1777) with ``LORA_OTEL_DIR=lora-otel`` (relative,
    as `clean_env` gives it; once the default) where another user planted ``lora-otel``: a symlink
    to a directory of the attacker's choosing, or a directory of the attacker's, mode 777 (they
    could delete the journals and stack dumps there). lora_otel does not put the journal there: it
    uses a private directory of its own and one line says why. (Found by the hostile trial: the
    journal and the stacks file went where the symlink pointed.) The default state directory
    planted the same way: test_no_clutter.py."""
    target = tmp_path / "elsewhere"
    target.mkdir(mode=0o700)
    if planted == "symlink":
        as_attacker(
            attacker, "import os, sys; os.symlink(sys.argv[1], sys.argv[2])", str(target), str(shared / "lora-otel")
        )
    else:
        as_attacker(
            attacker, "import os, sys; os.mkdir(sys.argv[1]); os.chmod(sys.argv[1], 0o777)", str(shared / "lora-otel")
        )
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    r = subprocess.run(
        [PYTHON, "-c", "print('hi')"],
        cwd=shared,
        env=clean_env(LORA_OTEL="1", TMPDIR=str(tmp)),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0 and r.stdout == "hi\n", r.stderr
    assert list(target.iterdir()) == []
    if planted == "open-dir":
        assert list((shared / "lora-otel").iterdir()) == []
    [journal] = journals(tmp)
    _assert_own_private(journal)
    assert "using %s instead" % journal in r.stderr


FIFO_JOB = r"""
import sys, time
if sys.argv[1] == "import":
    import ctypes  # a heavy import: the process becomes a job in its main thread
else:
    time.sleep(1.5)  # it lives a beat: the process becomes a job in the beat thread
print("DONE", flush=True)
"""

HOLD_OPEN = r"""
import os, sys
fds = [os.open(p, os.O_RDONLY | os.O_NONBLOCK) for p in sys.argv[1:]]  # a reader: a writer's open succeeds
print("READY", flush=True)
sys.stdin.read()
"""


def _assert_job_watched(journal: Path, planted: list[Path]) -> None:
    """The job was watched as without the FIFOs: it became a job, its stack handler and its
    sidecar are recorded, and none of lora_otel's files is a planted one."""
    root = read_journal(journal).root.attrs
    assert root.get("lora_otel.promoted"), root
    assert root.get("lora_otel.sidecar.pid"), root
    for key in ("lora_otel.stacks.path", "lora_otel.sidecar.log"):
        assert Path(root[key]) not in planted
        _assert_own_private(Path(root[key]))
    registries = [f for f in journal.parent.glob("run.log*.children") if f not in planted]
    assert len(registries) == 1, sorted(os.listdir(journal.parent))
    _assert_own_private(registries[0])


@pytest.mark.parametrize("promoted_by", ["import", "beat"])
@pytest.mark.parametrize("suffix", [".stacks.txt", ".sidecar.log", ".children"])
def test_a_fifo_planted_at_a_sibling_name_blocks_nothing(
    tmp_path: Path, shared: Path, attacker, suffix: str, promoted_by: str
) -> None:
    """A FIFO the attacker made where the job's stacks file, sidecar log or children registry goes
    (``run.log.stacks.txt``, ``run.log.sidecar.log``, ``run.log.children`` beside ``--log
    run.log`` in a shared directory), nobody reading it. Before issue 36 the job hung forever
    opening it: at ``import ctypes`` (becoming a job in its main thread), or at its exit (the
    registry read back). The job ends at once, as without lora_otel, and is watched all the same
    (`_assert_job_watched`): lora_otel's file is a new one beside the FIFO."""
    fifo = shared / ("run.log" + suffix)
    as_attacker(attacker, "import os, sys; os.mkfifo(sys.argv[1], 0o666)", str(fifo))
    (tmp_path / "job.py").write_text(FIFO_JOB)
    t0 = time.monotonic()
    r = subprocess.run(
        [PYTHON, str(tmp_path / "job.py"), promoted_by, "--log", str(shared / "run.log")],
        cwd=tmp_path,
        env=clean_env(LORA_OTEL="1"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0 and r.stdout == "DONE\n", r.stderr
    assert time.monotonic() - t0 < 30
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    _assert_job_watched(shared / "run.log.otel.jsonl", [fifo])


def test_fifos_the_attacker_holds_open_are_not_used(tmp_path: Path, shared: Path, attacker) -> None:
    """The three sibling FIFOs, each held open for reading by the attacker (so that opening one for
    writing succeeds at once): lora_otel sees on the open descriptor that none is a regular file,
    writes nothing into them (the attacker would read the job's stacks), and uses new files."""
    fifos = [shared / ("run.log" + s) for s in (".stacks.txt", ".sidecar.log", ".children")]
    as_attacker(attacker, "import os, sys\nfor p in sys.argv[1:]: os.mkfifo(p, 0o666)", *map(str, fifos))
    holder = as_attacker(attacker, HOLD_OPEN, *map(str, fifos), wait=False)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == b"READY\n"
        (tmp_path / "job.py").write_text(FIFO_JOB)
        r = subprocess.run(
            [PYTHON, str(tmp_path / "job.py"), "import", "--log", str(shared / "run.log")],
            cwd=tmp_path,
            env=clean_env(LORA_OTEL="1"),
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        try:
            holder.communicate(timeout=60)  # its stdin closed: it lets go of the FIFOs
        finally:
            if holder.poll() is None:
                holder.kill()
                holder.communicate()
    assert r.returncode == 0 and r.stdout == "DONE\n", r.stderr
    _assert_job_watched(shared / "run.log.otel.jsonl", fifos)


def test_lora_otel_journal_naming_a_fifo_blocks_nothing(tmp_path: Path, shared: Path, attacker) -> None:
    """``LORA_OTEL_JOURNAL`` naming a FIFO the attacker made (the name is in a job script others
    can read): before issue 36 the interpreter hung before the program's first instruction. The
    program runs as without lora_otel; its journal goes to the private fallback directory, and one
    line says why."""
    fifo = shared / "job.otel.jsonl"
    as_attacker(attacker, "import os, sys; os.mkfifo(sys.argv[1], 0o666)", str(fifo))
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    r = subprocess.run(
        [PYTHON, "-c", "import ctypes; print('hi')"],
        cwd=tmp_path,
        env=clean_env(LORA_OTEL="1", LORA_OTEL_JOURNAL=str(fifo), TMPDIR=str(tmp)),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0 and r.stdout == "hi\n", r.stderr
    assert "%s is not a regular file" % fifo in r.stderr
    [journal] = journals(tmp)
    _assert_own_private(journal)
    assert read_journal(journal).root.attrs.get("lora_otel.promoted") == "import ctypes"


ASK_JOB = r"""
import os, sys, time
import lora_otel
with lora_otel.stage("train"):
    step = 0
    while not os.path.exists(sys.argv[1]):  # a step each 50 ms: each beat writes a beat record
        step += 1
        lora_otel.progress(step=step)
        time.sleep(0.05)
"""


def test_a_stack_request_from_another_user_is_never_obeyed(tmp_path: Path, shared: Path, attacker) -> None:
    """A stack request file put by the attacker where the job's beat looks for one — at the name
    the journal records (``lora_otel.stacks.ask``, random: only the journal, 0600, tells it; the
    test reads it for the attacker) and at the name it had before issue 36, ``run.log.stacks.ask``
    — in a sticky directory, where a job that is not root cannot remove it. Before, the job
    dumped every thread's stack at each beat, forever. Over five beats it writes no dump and
    leaves the files alone; a request of its own user is still answered."""
    go = tmp_path / "go"
    (tmp_path / "job.py").write_text(ASK_JOB)
    p = subprocess.Popen(
        [PYTHON, str(tmp_path / "job.py"), str(go), "--log", str(shared / "run.log")],
        cwd=tmp_path,
        env=clean_env(LORA_OTEL="1", LORA_OTEL_BEAT_S="0.2"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        journal = shared / "run.log.otel.jsonl"

        def recorded() -> dict:
            j = read_journal(journal) if journal.exists() else None
            return (
                j.root.attrs if j is not None and j.root is not None and "lora_otel.stacks.ask" in j.root.attrs else {}
            )

        attrs = wait_for(recorded, timeout=60, what="the stack request file's name in the journal")
        ask, stacks = Path(attrs["lora_otel.stacks.ask"]), Path(attrs["lora_otel.stacks.path"])
        old = shared / "run.log.stacks.ask"
        as_attacker(attacker, "import sys\nfor p in sys.argv[1:]: open(p, 'w').close()", str(ask), str(old))
        beats = read_journal(journal).beats
        wait_for(lambda: read_journal(journal).beats >= beats + 5, timeout=60, what="five beats")
        assert "most recent call first" not in stacks.read_text(), "the job obeyed another user's request"
        for f in (ask, old):
            assert os.lstat(f).st_uid == attacker.pw_uid  # left alone
        assert ask.parent == shared and re.fullmatch(r"run\.log\.stacks\.[0-9a-f]{8}\.ask", ask.name), ask
        # The job's own user asks (as the watchdog does): answered, and the request removed.
        ask.unlink()
        fd = os.open(ask, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.close(fd)
        wait_for(lambda: not ask.exists(), timeout=60, what="the beat's answer")
        assert "Current thread" in stacks.read_text()
    finally:
        go.touch()
        try:
            p.communicate(timeout=60)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()


CRAFT = r"""
import sys
with open(sys.argv[1], "w") as f:
    f.write(sys.stdin.read())
"""


def _stalled_journal(tmp_path: Path) -> Path:
    """A real journal of a job killed in a stage after its watchdog declared it stalled."""
    (tmp_path / "job.py").write_text("import time, lora_otel\nwith lora_otel.stage('train'):\n    time.sleep(60)\n")
    p = subprocess.Popen(
        [PYTHON, str(tmp_path / "job.py"), "--log", str(tmp_path / "run.log")],
        cwd=tmp_path,
        env=clean_env(LORA_OTEL="1", LORA_OTEL_STALL_AFTER="train=1"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    journal = tmp_path / "run.log.otel.jsonl"
    try:
        wait_for(lambda: journal.exists() and b'"k":"stall"' in journal.read_bytes(), timeout=60, what="a stall record")
    finally:
        p.kill()
        p.wait()
    return journal


def _without_stacks_text(obj: object) -> object:
    """A record without the dumps it carries (``python.stacks``): the reader then takes the file."""
    if isinstance(obj, dict):
        return {k: _without_stacks_text(v) for k, v in obj.items() if not k.endswith("python.stacks")}
    if isinstance(obj, list):
        return [_without_stacks_text(v) for v in obj]
    return obj


@pytest.mark.parametrize("where", ["outside", "beside, a symlink"])
def test_a_crafted_journal_cannot_make_inspect_read_another_file(
    tmp_path: Path, shared: Path, attacker, where: str
) -> None:
    """A journal the attacker wrote (a real stalled job's, edited) whose ``lora_otel.stacks.path``
    names a file only root can read, shaped like a stack dump: by its path, or as a symlink beside
    the journal under the stacks file's own name. ``lora-otel inspect`` and ``report``, run by
    root on it, show none of that file's text (before issue 36, inspect printed it); the real
    journal shows its own stacks."""
    real = _stalled_journal(tmp_path)
    r = subprocess.run(
        [PYTHON, "-m", "lora_otel", "inspect", str(real)], env=clean_env(), capture_output=True, text=True, timeout=60
    )
    assert "stacks (last dump in %s" % real.with_name("run.log.stacks.txt") in r.stdout, r.stdout
    secret = tmp_path / "secret.txt"
    secret.write_text(
        'Current thread 0x00007f0000000001 (most recent call first):\n  File "/x.py", line 1 in ROOT_ONLY_TEXT\n\n'
    )
    secret.chmod(0o600)
    crafted = shared / "evil.otel.jsonl"
    target = str(secret) if where == "outside" else str(shared / "evil.stacks.txt")
    records = []
    for line in real.read_text().splitlines():
        rec = _without_stacks_text(json.loads(line))
        attrs = rec.get("attrs") if isinstance(rec, dict) else None
        if isinstance(attrs, dict) and "lora_otel.stacks.path" in attrs:
            attrs["lora_otel.stacks.path"] = target
        records.append(json.dumps(rec))
    code = CRAFT if where == "outside" else CRAFT + "import os; os.symlink(sys.argv[2], sys.argv[3])\n"
    as_attacker(attacker, code, str(crafted), str(secret), target, input="\n".join(records) + "\n")
    assert os.lstat(crafted).st_uid == attacker.pw_uid
    shown = subprocess.run(
        [PYTHON, "-m", "lora_otel", "inspect", str(crafted)],
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "STALLED" in shown.stdout, shown.stdout + shown.stderr  # it was read as a journal
    out = tmp_path / "report.html"
    subprocess.run(
        [PYTHON, "-m", "lora_otel", "report", str(crafted), "-o", str(out)],
        env=clean_env(),
        capture_output=True,
        timeout=120,
    )
    for text in (shown.stdout, shown.stderr, out.read_text() if out.exists() else ""):
        assert "ROOT_ONLY_TEXT" not in text


PLANT_PACKAGES = r"""
import os, sys
d = sys.argv[1]
os.mkdir(os.path.join(d, "numpy-9.9.dist-info"))
with open(os.path.join(d, "numpy-9.9.dist-info", "METADATA"), "w") as f:
    f.write("Metadata-Version: 2.1\nName: numpy\nVersion: 9.9\n")
os.mkdir(os.path.join(d, "torch"))
open(os.path.join(d, "torch", "__init__.py"), "w").close()
os.mkfifo(os.path.join(d, "torch", "version.py"), 0o666)
"""


def test_package_files_planted_in_a_shared_working_directory(tmp_path: Path, shared: Path, attacker) -> None:
    """``python -c`` run in a shared directory puts it first on ``sys.path``; the attacker put a
    ``numpy-9.9.dist-info`` there and a ``torch/version.py`` that is a FIFO. The process does not
    import either. Before issue 36, becoming a job (``import ctypes``) hung on the FIFO while
    lora_otel read torch's build facts, and the environment line reported numpy 9.9. Now it ends
    at once and reports none of the attacker's facts."""
    as_attacker(attacker, PLANT_PACKAGES, str(shared))
    r = subprocess.run(
        [PYTHON, "-c", "import ctypes; print('hi')"],
        cwd=shared,
        env=clean_env(LORA_OTEL="1", LORA_OTEL_DIR=str(tmp_path / "j")),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0 and r.stdout == "hi\n", r.stderr
    assert "environment:" in r.stderr
    assert "numpy 9.9" not in r.stderr


LOCK_WAITS = "import sys\nfrom lora_otel.analysis.diagnose import lock_waits\nprint(lock_waits(sys.argv[1]))\n"


def test_a_frame_naming_a_fifo_never_hangs_the_reader(tmp_path: Path, shared: Path, attacker) -> None:
    """A stack dump (a crafted journal's or stacks file's) whose innermost frame names a FIFO the
    attacker made: the reading of which lock a thread waits for (`diagnose.lock_waits`, used by
    inspect, report and the watchdog; it reads the frame's source line) returns at once, reading
    nothing. Before, the source line's open waited forever for a writer."""
    fifo = shared / "evil.py"
    as_attacker(attacker, "import os, sys; os.mkfifo(sys.argv[1], 0o666)", str(fifo))
    stacks = 'Current thread 0x00007f0000000001 (most recent call first):\n  File "%s", line 1 in <module>\n\n' % fifo
    r = subprocess.run(
        [PYTHON, "-c", LOCK_WAITS, stacks], cwd=tmp_path, env=clean_env(), capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0 and r.stdout == "None\n", r.stderr


PLANT_SPARSE = """
import os, sys
with open(os.path.join(sys.argv[1], "zz-big.otel.jsonl"), "wb") as f:
    for size in (1 << 40, 1 << 36, 1 << 33):  # 1 TiB of zeros, no newline, no disk used (less where refused)
        try:
            f.truncate(size)
            break
        except OSError:
            continue
"""


def test_a_sparse_terabyte_named_like_a_journal_is_not_read_whole(tmp_path: Path, shared: Path, attacker) -> None:
    """The attacker puts a 1 TiB sparse file (zeros, no newline, no disk used) under a journal's
    name in the shared ``LORA_OTEL_DIR``. ``inspect``, ``report`` and ``watch --once`` of that
    directory, run by root, still show the victim's job, leave the planted file alone (counted in
    one line; named on the command line it is read up to `reader.MAX_LINE`), and end within the
    limit. Before, ``inspect`` and ``report`` died with MemoryError reading it whole and ``watch``
    grew its memory without end, copying the never-ending line."""
    r = subprocess.run(
        [PYTHON, "-c", "pass"],
        env=clean_env(LORA_OTEL="1", LORA_OTEL_LIVE="0", LORA_OTEL_DIR=str(shared)),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    assert journals(shared)
    as_attacker(attacker, PLANT_SPARSE, str(shared))
    for args in (["inspect", str(shared)], ["report", str(shared), "-o", str(tmp_path / "r.html")]):
        r = subprocess.run(
            [PYTHON, "-m", "lora_otel", *args], env=clean_env(), capture_output=True, text=True, timeout=120
        )
        assert r.returncode == 0, r.stderr[-2000:]
        assert "ignored 1 file named *.otel.jsonl that is not this user's" in r.stderr, r.stderr
        if args[0] == "inspect":
            assert "exited" in r.stdout
    r = _cli("inspect", str(shared / "zz-big.otel.jsonl"))  # named: read, up to the limit
    assert r.returncode == 2 and "zz-big.otel.jsonl: not a journal (a line longer than" in r.stderr, r.stderr
    r = subprocess.run(
        [PYTHON, "-m", "lora_otel", "watch", str(shared), "--once"],
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert "exited" in r.stdout


FAKE_SIDECAR = """
import sys, time
sys.stdout.write("up\\n"); sys.stdout.flush()
time.sleep(120)
"""


@pytest.mark.parametrize("who", ["attacker", "init"])
def test_a_registry_variable_naming_no_sidecar_of_ours_is_not_joined(
    tmp_path: Path, shared: Path, attacker, who: str
) -> None:
    """``LORA_OTEL_LIVE_REGISTRY`` names a live process that is not a sidecar of this user's: the
    attacker's, whose command line even reads ``-m lora_otel.export.sidecar --children <registry>``,
    or pid 1 (a variable left in a long-lived shell, its sidecar gone and the pid reused). The job
    starts its own sidecar (its journal names that one and its log), and no registry is written.
    Before, it joined the stranger, started none, and a frozen job went untold while frozen."""
    registry = shared / "reg.children"
    fake = None
    if who == "attacker":
        fake = as_attacker(
            attacker, FAKE_SIDECAR, "-m", "lora_otel.export.sidecar", "--children", str(registry), wait=False
        )
        assert fake.stdout is not None and fake.stdout.readline() == b"up\n"
        pid = fake.pid
    else:
        pid = 1
    try:
        r = subprocess.run(
            [PYTHON, "-c", "import lora_otel\nwith lora_otel.stage('x'):\n    pass\n"],
            cwd=tmp_path,
            env=clean_env(
                LORA_OTEL="1", LORA_OTEL_DIR=str(tmp_path / "j"), LORA_OTEL_LIVE_REGISTRY="%d:%s" % (pid, registry)
            ),
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        if fake is not None:
            fake.kill()
            fake.communicate()
    assert r.returncode == 0, r.stderr
    [path] = journals(tmp_path / "j")
    attrs = read_journal(path).root.attrs
    assert attrs.get("lora_otel.sidecar.pid") not in (None, pid), attrs
    assert "lora_otel.sidecar.log" in attrs, attrs
    assert not registry.exists()


PLANT_MANY = """
import os, sys
for i in range(100000):
    os.close(os.open(os.path.join(sys.argv[1], "0-%06d.otel.jsonl" % i), os.O_CREAT | os.O_WRONLY, 0o644))
"""


def _peak_rss_mb(pid: int) -> float:
    for line in Path("/proc/%d/status" % pid).read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM for pid %d" % pid)


def test_a_hundred_thousand_planted_files_do_not_swell_the_sidecar(tmp_path: Path, shared: Path, attacker) -> None:
    """The attacker fills the shared ``LORA_OTEL_DIR`` with 100,000 empty ``*.otel.jsonl`` files.
    The job's sidecar, once past its start (retention done, the job followed), peaks under 60 MB
    (16 MB in an empty directory). Before, retention listed the whole directory at once and the
    sidecar peaked at 110 MB: enough to get a job in a tight memory cgroup OOM-killed."""
    as_attacker(attacker, PLANT_MANY, str(shared))
    p = subprocess.Popen(
        [PYTHON, "-c", "import lora_otel, time\nwith lora_otel.stage('x'):\n    time.sleep(60)\n"],
        cwd=tmp_path,
        env=clean_env(LORA_OTEL="1", LORA_OTEL_DIR=str(shared)),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        path = wait_for(
            lambda: next((j for j in journals(shared) if j.name.endswith("-%d.otel.jsonl" % p.pid)), None),
            what="the job's journal",
        )
        attrs = wait_for(
            lambda: (a := read_journal(path).root.attrs).get("lora_otel.sidecar.log") and a, what="the sidecar"
        )
        log = Path(attrs["lora_otel.sidecar.log"])
        wait_for(lambda: "following" in log.read_text(), what="the sidecar following the job", timeout=120)
        assert _peak_rss_mb(attrs["lora_otel.sidecar.pid"]) < 60
    finally:
        p.kill()
        p.wait()


PLANT_SORTED_FIRST = """
import os, sys
for i in range(300):
    name = "0-%04d-%s.otel.jsonl" % (i, sys.argv[2])
    os.close(os.open(os.path.join(sys.argv[1], name), os.O_CREAT | os.O_WRONLY, 0o644))
"""


def test_files_named_to_sort_first_hide_no_journal_of_the_job(tmp_path: Path, shared: Path, attacker) -> None:
    """A traced parent and its traced child write their journals in the shared ``LORA_OTEL_DIR``;
    the attacker adds 300 files named to sort before them, ending like the parent's
    (``0-0000-<parent pid>.otel.jsonl``). The watchdog still finds the child's parent journal and
    the job's other journal (`watchdog.parent_journal`, `watchdog.job_journals`). Before, only
    the first 256 names were looked at, all the attacker's, and the job's own were missed."""
    from lora_otel.export.watchdog import job_journals, parent_journal

    code = "import subprocess, sys, lora_otel\nwith lora_otel.stage('x'):\n"
    code += "    subprocess.run([sys.executable, '-c', 'pass'])\n"
    r = subprocess.run(
        [PYTHON, "-c", code],
        cwd=tmp_path,
        env=clean_env(LORA_OTEL="1", LORA_OTEL_LIVE="0", LORA_OTEL_DIR=str(shared), LORA_OTEL_KEEP_SHORT="1"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    parent, child = sorted((read_journal(p) for p in journals(shared)), key=lambda j: j.root.start_ns)
    assert parent_journal(child) is not None and len(job_journals(child)) == 1
    as_attacker(attacker, PLANT_SORTED_FIRST, str(shared), str(parent.pid))
    found = parent_journal(child)
    assert found is not None and found.path == parent.path
    assert [j.path for j in job_journals(child)] == [parent.path]


PLANT_FOR_WATCH = """
import os, sys
d, target = sys.argv[1], sys.argv[2]
os.close(os.open(os.path.join(d, "a-empty.otel.jsonl"), os.O_CREAT | os.O_WRONLY, 0o644))
for i in range(2000):
    with open(os.path.join(d, "j-%04d.otel.jsonl" % i), "w") as f:
        f.write("junk\\n")
os.symlink(target, os.path.join(d, "link.otel.jsonl"))
os.mkfifo(os.path.join(d, "fifo.otel.jsonl"))
"""


def test_watch_of_a_shared_dir_leaves_other_users_files_alone(tmp_path: Path, shared: Path, attacker) -> None:
    """In the shared ``LORA_OTEL_DIR`` of a finished job, the attacker puts an empty journal, 2,000
    junk files, a symlink to a journal of the victim's elsewhere and a FIFO, all named
    ``*.otel.jsonl``. ``lora-otel watch DIR`` (line mode and ``--once``) follows only the victim's
    journal, says the others are ignored in one line, and exits 0 as without them. Before, the
    empty file counted as a process gone without an exit record (exit 3), each junk file printed
    its own lines, and the symlink was followed."""
    r = subprocess.run(
        [PYTHON, "-c", "pass"],
        env=clean_env(LORA_OTEL="1", LORA_OTEL_LIVE="0", LORA_OTEL_DIR=str(shared)),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    [own] = journals(shared)
    private = tmp_path / "private.otel.jsonl"
    shutil.copy(own, private)
    as_attacker(attacker, PLANT_FOR_WATCH, str(shared), str(private))
    for extra in (["--interval", "0.2"], ["--once"]):
        r = subprocess.run(
            [PYTHON, "-m", "lora_otel", "watch", str(shared), *extra],
            env=clean_env(),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
        assert "ignored 2003 files named *.otel.jsonl that are not this user's" in r.stdout, r.stdout[-3000:]
        assert "link.otel.jsonl" not in r.stdout and "j-0000" not in r.stdout and "a-empty" not in r.stdout
        assert len(r.stdout.splitlines()) < 30, r.stdout[-3000:]
        if extra[0] == "--interval":
            assert r.stdout.count("following ") == 1, r.stdout[-3000:]


RECEIVER = r"""
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        sys.stdout.write("got %s\n" % self.path); sys.stdout.flush()
        self.send_response(200); self.send_header("Content-Length", "0"); self.end_headers()
    def log_message(self, *a):
        pass
server = http.server.HTTPServer(("127.0.0.1", 4318), H)
sys.stdout.write("up\n"); sys.stdout.flush()
server.serve_forever()
"""

LIVE_JOB = r"""
import time
import lora_otel
from lora_otel._boot import preamble
with lora_otel.stage("secret stage"):  # a job: its sidecar starts, and says what it does in its log
    deadline = time.time() + 120
    while time.time() < deadline:
        log = preamble._sidecar_log
        if log and "following" in open(log).read():
            break
        time.sleep(0.05)
print(preamble._sidecar_log, preamble._sidecar_pid, flush=True)
"""

# Run inside a new network namespace (its own loopback, port 4318 free whatever else runs here):
# the receiver (as argv[1]'s command), then the job as root, then the receiver's output.
LIVE_DRIVER = r"""
import json, os, subprocess, sys, time
subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
receiver_cmd, python, job, env = json.loads(sys.argv[1])
receiver = subprocess.Popen(receiver_cmd, stdout=subprocess.PIPE, text=True)
assert receiver.stdout.readline() == "up\n"
r = subprocess.run([python, "-c", job], env=env, capture_output=True, text=True, timeout=300)
log, pid = r.stdout.split()
deadline = time.time() + 120
while time.time() < deadline:  # the sidecar drains and ends once the job has
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        break
    time.sleep(0.05)
receiver.kill()
out = receiver.communicate()[0]
print(json.dumps({"rc": r.returncode, "stderr": r.stderr, "log": open(log).read(), "received": out}))
"""


def _can_unshare_net() -> bool:
    if os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("ip"):
        return False
    return subprocess.run(["unshare", "--net", "ip", "link", "set", "lo", "up"], capture_output=True).returncode == 0


@pytest.mark.skipif(not _can_unshare_net(), reason="needs root, unshare and ip (a network namespace)")
@pytest.mark.parametrize("who", ["attacker", "own"])
def test_live_export_without_an_endpoint_goes_only_to_an_own_listener(tmp_path: Path, attacker, who: str) -> None:
    """``LORA_OTEL_LIVE=1`` with no OTLP endpoint set sends to the default ``localhost:4318``. When
    another user listens there (it bound the port first), the job's sidecar sends it nothing, runs
    as the local watchdog, and says why in one line on the job's stderr and in its log; when the
    listener is the job's own user's, the spans go there as before. Before, the attacker's
    listener received every span. In a network namespace of the test's own (a real loopback)."""
    python_of_receiver = attacker_python(attacker) if who == "attacker" else PYTHON
    receiver_cmd = [python_of_receiver, "-c", RECEIVER]
    if who == "attacker":
        ids = ["--reuid=%d" % attacker.pw_uid, "--regid=%d" % attacker.pw_gid, "--clear-groups"]
        receiver_cmd = ["setpriv", *ids, *receiver_cmd]
    env = clean_env(LORA_OTEL="1", LORA_OTEL_LIVE="1", LORA_OTEL_DIR=str(tmp_path), LORA_OTEL_DRAIN_S="10")
    r = subprocess.run(
        ["unshare", "--net", PYTHON, "-c", LIVE_DRIVER, json.dumps([receiver_cmd, PYTHON, LIVE_JOB, env])],
        capture_output=True,
        text=True,
        timeout=400,
        env=clean_env(),
    )
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout)
    assert out["rc"] == 0, out["stderr"]
    if who == "attacker":
        assert out["received"] == "", out
        line = "live export off: LORA_OTEL_LIVE=1 names no OTLP endpoint and localhost:4318 is listened on by uid %d"
        assert line % attacker.pw_uid in out["stderr"], out["stderr"]
        assert line % attacker.pw_uid in out["log"] and "in local mode" in out["log"], out["log"]
    else:
        assert "got /v1/traces" in out["received"], out
        assert "live export off" not in out["stderr"] + out["log"]


# Run inside a new network namespace: the receiver (argv[1]'s command, or none), then
# `lora-otel replay JOURNAL` with the environment given, then what the receiver got.
REPLAY_DRIVER = r"""
import json, subprocess, sys
subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
receiver_cmd, python, journal, env = json.loads(sys.argv[1])
receiver = None
if receiver_cmd:
    receiver = subprocess.Popen(receiver_cmd, stdout=subprocess.PIPE, text=True)
    assert receiver.stdout.readline() == "up\n"
r = subprocess.run([python, "-m", "lora_otel", "replay", journal], env=env, capture_output=True, text=True, timeout=300)
out = ""
if receiver is not None:
    receiver.kill()
    out = receiver.communicate()[0]
print(json.dumps({"rc": r.returncode, "stdout": r.stdout, "stderr": r.stderr, "received": out}))
"""


@pytest.mark.skipif(not _can_unshare_net(), reason="needs root, unshare and ip (a network namespace)")
@pytest.mark.parametrize(
    ("listener", "endpoint"), [("attacker", ""), ("nobody", ""), ("own", ""), ("attacker", "http://localhost:4318")]
)
def test_replay_without_an_endpoint_sends_only_to_an_own_listener(
    tmp_path: Path, attacker, listener: str, endpoint: str
) -> None:
    """``lora-otel replay JOURNAL`` with no OTLP endpoint set would send to the default
    ``localhost:4318``. When another user listens there (it bound the port first), or nobody does
    (anyone could bind it), replay sends nothing and exits 2 with one line saying why and how to
    name an endpoint (``OTEL_EXPORTER_OTLP_ENDPOINT=…``); a listener of the user's own gets the
    spans as before, and so does any listener an endpoint names explicitly (the user's choice).
    Before, the attacker's listener received every span. In a network namespace of the test's own."""
    r = subprocess.run(
        [PYTHON, "-c", "import lora_otel\nwith lora_otel.stage('secret stage'):\n    pass\n"],
        env=clean_env(LORA_OTEL="1", LORA_OTEL_LIVE="0", LORA_OTEL_DIR=str(tmp_path), LORA_OTEL_KEEP_SHORT="1"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    [journal] = journals(tmp_path)
    receiver_cmd: list[str] = []
    if listener == "attacker":
        ids = ["--reuid=%d" % attacker.pw_uid, "--regid=%d" % attacker.pw_gid, "--clear-groups"]
        receiver_cmd = ["setpriv", *ids, attacker_python(attacker), "-c", RECEIVER]
    elif listener == "own":
        receiver_cmd = [PYTHON, "-c", RECEIVER]
    env = clean_env(OTEL_EXPORTER_OTLP_TIMEOUT="5", **({"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint} if endpoint else {}))
    r = subprocess.run(
        ["unshare", "--net", PYTHON, "-c", REPLAY_DRIVER, json.dumps([receiver_cmd, PYTHON, str(journal), env])],
        capture_output=True,
        text=True,
        timeout=400,
        env=clean_env(),
    )
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout)
    if listener == "own" or endpoint:
        assert out["rc"] == 0, out
        assert "got /v1/traces" in out["received"] and "replayed 3 spans" in out["stdout"], out
        return
    assert out["rc"] == 2 and out["received"] == "" and out["stdout"] == "", out
    why = (
        "localhost:4318 is listened on by uid %d, not this user nor root" % attacker.pw_uid
        if listener == "attacker"
        else "nothing listens on localhost:4318 (another user could take the port)"
    )
    assert out["stderr"] == (
        "lora-otel replay: not sent: no OTLP endpoint is set and %s; name your collector: "
        "OTEL_EXPORTER_OTLP_ENDPOINT=http://HOST:4318 lora-otel replay %s\n" % (why, journal)
    ), out["stderr"]


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [PYTHON, "-m", "lora_otel", *args], env=clean_env(), capture_output=True, text=True, timeout=300
    )


def test_inspect_and_report_of_a_shared_dir_leave_other_users_files_alone(
    tmp_path: Path, shared: Path, attacker
) -> None:
    """In the shared ``LORA_OTEL_DIR`` of a finished job, the attacker puts an empty journal, 2,000
    junk files, a symlink to a journal of the victim's elsewhere (a stage of its own in it) and a
    FIFO, all named ``*.otel.jsonl``. ``lora-otel inspect DIR`` (text, ``--summary``, ``--json``)
    and ``lora-otel report DIR`` show only the victim's job, say the others are ignored in one line
    on stderr, and exit as without them; a file named on the command line is still read (the
    attacker's junk: "not a journal"; the FIFO: "not a regular file", at once). Before, every junk
    file came out as a "not read" line (a process each in the report), and the symlinked journal's
    private stage was shown as a job of the directory."""
    r = subprocess.run(
        [PYTHON, "-c", "pass"],
        env=clean_env(LORA_OTEL="1", LORA_OTEL_LIVE="0", LORA_OTEL_DIR=str(shared)),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    [own] = journals(shared)
    elsewhere = tmp_path / "private"
    elsewhere.mkdir()
    r = subprocess.run(
        [PYTHON, "-c", "import lora_otel\nwith lora_otel.stage('private stage'):\n    pass\n"],
        env=clean_env(LORA_OTEL="1", LORA_OTEL_LIVE="0", LORA_OTEL_DIR=str(elsewhere), LORA_OTEL_KEEP_SHORT="1"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    [private] = journals(elsewhere)
    as_attacker(attacker, PLANT_FOR_WATCH, str(shared), str(private))
    ignored = (
        "%s: ignored 2003 files named *.otel.jsonl that are not this user's (another user's, a symlink, a FIFO)\n"
        % shared
    )
    for args in ([], ["--summary"], ["--json"]):
        r = _cli("inspect", str(shared), *args)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
        assert r.stderr == "lora-otel inspect: " + ignored, r.stderr[-3000:]
        for name in ("j-0000", "a-empty", "link.otel", "fifo.otel", "private stage"):
            assert name not in r.stdout, (name, r.stdout[-3000:])
        assert len(r.stdout.splitlines()) < (60 if args else 10), r.stdout[-3000:]
        if args == ["--json"]:
            doc = json.loads(r.stdout)
            assert [p["pid"] for job in doc["jobs"] for p in job["processes"]] == [read_journal(own).pid]
            assert doc["unreadable"] == []
    out = tmp_path / "job.html"
    r = _cli("report", str(shared), "-o", str(out))
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stderr.startswith("lora-otel report: " + ignored), r.stderr
    assert "(1 process, " in r.stderr, r.stderr
    page = out.read_text()
    assert "private stage" not in page and "j-0000" not in page and "a-empty" not in page
    r = _cli("inspect", str(shared / "j-0000.otel.jsonl"))  # named: read, whoever owns it
    assert r.returncode == 2 and "j-0000.otel.jsonl: not a journal" in r.stderr, r.stderr
    r = _cli("inspect", str(shared / "fifo.otel.jsonl"))
    assert r.returncode == 2 and r.stderr.endswith("fifo.otel.jsonl: not a regular file\n"), r.stderr
    r = _cli("inspect", str(own))  # its job's journals beside it: none of the attacker's files
    assert r.returncode == 0 and "private stage" not in r.stdout, r.stdout + r.stderr


PEAK = """\
import runpy, sys
sys.argv[0] = "lora-otel"
try:
    runpy.run_module("lora_otel", run_name="__main__")
finally:  # (VmHWM: this process's own peak; ru_maxrss keeps the forking parent's across exec)
    with open("/proc/self/status") as f:
        print("peak", next(line.split()[1] for line in f if line.startswith("VmHWM:")), file=sys.stderr)
"""


def test_a_hundred_thousand_planted_files_keep_inspect_and_report_small(tmp_path: Path, shared: Path, attacker) -> None:
    """The attacker fills the shared ``LORA_OTEL_DIR`` of a finished job with 100,000 empty
    ``*.otel.jsonl`` files. ``inspect DIR --summary`` prints one line (the job) and ``report DIR``
    writes a page of one process, each with one line on stderr counting the rest, peaking under
    60 MB. Before, inspect printed 100,001 lines (6.7 MB) and report wrote a 7 MB page of 100,001
    "processes", peaking at 65 MB and 166 MB."""
    r = subprocess.run(
        [PYTHON, "-c", "pass"],
        env=clean_env(LORA_OTEL="1", LORA_OTEL_LIVE="0", LORA_OTEL_DIR=str(shared)),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    as_attacker(attacker, PLANT_MANY, str(shared))
    out = tmp_path / "job.html"
    for args in (["inspect", str(shared), "--summary"], ["report", str(shared), "-o", str(out)]):
        r = subprocess.run([PYTHON, "-c", PEAK, *args], env=clean_env(), capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-3000:]
        lines = r.stderr.splitlines()
        assert "ignored 100000 files named *.otel.jsonl" in lines[0], r.stderr[-3000:]
        assert int(lines[-1].split()[1]) < 60 * 1024, r.stderr[-3000:]
        if args[0] == "inspect":
            assert len(r.stdout.splitlines()) == 1 and "finished" in r.stdout, r.stdout[-3000:]
        else:
            assert "(1 process, " in r.stderr and out.stat().st_size < 200_000, r.stderr[-3000:]


PLANT_NEWER_RUN = """
import json, os, sys
path = os.path.join(sys.argv[1], "run.log.20991231T000000Z-1.otel.jsonl")
with open(path, "w") as f:
    f.write(json.dumps({"v": 1, "k": "start", "ts": 4102444800 * 10**9, "trace_id": "1" * 32,
                        "span_id": "2" * 16, "parent_id": None, "name": "process", "pid": 1}) + "\\n")
"""


def test_a_planted_newer_run_is_not_taken_for_a_logs_journal(tmp_path: Path, shared: Path, attacker) -> None:
    """A job's ``--log`` is ``shared/run.log``, its journal ``run.log.otel.jsonl`` beside it. The
    attacker adds ``run.log.20991231T000000Z-1.otel.jsonl`` (a re-run's name, a start in 2099).
    ``lora-otel inspect shared/run.log`` still reads the job's own journal. Before, the attacker's
    file was taken for the newest run and shown."""
    r = subprocess.run(
        [PYTHON, "-c", "pass"],
        env=clean_env(LORA_OTEL="1", LORA_OTEL_LIVE="0", LORA_OTEL_DIR=str(tmp_path)),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    [own] = journals(tmp_path)
    log = shared / "run.log"
    log.write_text("the job's own log\n")
    shutil.copy(own, shared / "run.log.otel.jsonl")
    as_attacker(attacker, PLANT_NEWER_RUN, str(shared))
    r = _cli("inspect", str(log))
    assert r.stderr.startswith("lora-otel inspect: reading %s.otel.jsonl\n" % log), r.stderr
    assert r.returncode == 0 and "finished normally" in r.stdout, r.stdout + r.stderr
