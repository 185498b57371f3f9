"""Collective hangs: a rank waits in a collective that another rank never joins.

End to end, two gloo ranks on CPU under torchrun (zero-code mode, a real collector): rank 1 skips
the ``all_reduce`` of step 3 and sleeps, so rank 0 waits in it. The job's one sidecar (started by
torchrun, which is a traced Python process; the ranks register with it) reports rank 0's
``training`` as stalled with the collective in its stack, and the diagnosis names rank 1 from rank
1's journal (and stack). Then, with synthetic journals, the diagnosis function itself: a peer that
exited, a peer at a lower step, no peers ("cannot tell").
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import textwrap
from pathlib import Path

import pytest
from conftest import JournalBuilder
from procs import PYTHON, clean_env, journals, start_torchrun, wait_for
from test_sidecar import assert_unique, sidecar_pid, wait_gone

from lora_otel.analysis.diagnose import collective_in, explain, world_peers
from lora_otel.analysis.evidence import PREFIX
from lora_otel.analysis.stall import Stall
from lora_otel.journal.reader import Journal, process_state, read_journal

# Steps of 50 ms, so that the median step time the stall limit scales with (20x) stays under the
# 3 s floor even measured from beats a second apart.
TRAIN = """\
import datetime, time
import torch
import torch.distributed as dist

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
rank = dist.get_rank()
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(1, 61):
    model(torch.ones(1, 4)).sum().backward()
    if rank == 1 and step == 40:
        opt.step()  # without the all_reduce: rank 0 waits in it for ever
        print("rank 1 skipped the all_reduce of step 40", flush=True)
        time.sleep(600)
    for p in model.parameters():
        dist.all_reduce(p.grad)
    opt.step()
    opt.zero_grad()
    time.sleep(0.05)
dist.destroy_process_group()
"""
ALL_REDUCE_LINE = TRAIN.splitlines().index("        dist.all_reduce(p.grad)") + 1
SLEEP_LINE = TRAIN.splitlines().index("        time.sleep(600)") + 1


def _ranks(directory: Path) -> dict:
    """rank -> journal of the rank processes under ``directory`` (torchrun's own has no rank)."""
    out = {}
    for path in journals(directory):
        j = read_journal(path)
        if j.root is not None and isinstance(j.root.attrs.get("rank"), int):
            out[j.root.attrs["rank"]] = j
    return out


def _event_attributes(collector, span_id: str, event: str) -> str:
    """The collector's printout of ``event``'s attributes on the span ``span_id`` (rotel's debug log)."""
    text = collector.output.read_bytes().decode("utf-8", "replace").replace("\0", "")
    for chunk in re.split(r"(?m)^Span #", text):
        if re.search(r"(?m)^\s+ID\s*: %s\s*$" % span_id, chunk):
            for part in re.split(r"(?m)^SpanEvent #", chunk)[1:]:
                if re.search(r"-> Name: (Str\()?%s\b" % re.escape(event), part):
                    return part
    return ""


def _kill_job(proc: subprocess.Popen, ranks: dict) -> None:
    """SIGKILL torchrun's process group and each rank's (torchrun starts each rank in a session of its own)."""
    for j in ranks.values():
        if process_state(j) == "running":  # the pid is still that rank's (its start time matches)
            try:
                os.killpg(j.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=10)


@pytest.mark.slow
@pytest.mark.collector
@pytest.mark.torch
def test_rank_waits_in_all_reduce_that_the_other_rank_skipped(tmp_path: Path, collector) -> None:
    """About 15 s: torch's import, the group's init, 39 steps of 50 ms, the 3 s stall limit, a poll."""
    pytest.importorskip("torch.distributed")
    (tmp_path / "train.py").write_text(TRAIN)
    where = tmp_path / "journals"
    env = clean_env(
        LORA_OTEL="1",
        OTEL_EXPORTER_OTLP_ENDPOINT=collector.http_endpoint,
        LORA_OTEL_STALL_AFTER="training=3",
        LORA_OTEL_DIR=str(where),
        OMP_NUM_THREADS="1",
    )
    proc = start_torchrun(tmp_path, env, tmp_path / "torchrun.out")
    ranks: dict = {}
    try:
        ranks = wait_for(lambda: len(_ranks(where)) == 2 and _ranks(where), what="both ranks' journals", timeout=120)
        side = sidecar_pid(where)

        def stalled():
            pid0 = ranks[0].pid
            return [
                s
                for s in collector.spans()
                if s.name == "training"
                and s.resource.get("process.pid") == pid0
                and s.attributes.get("lora_otel.incomplete")
            ]

        [training] = wait_for(stalled, what="rank 0's stalled training at the collector", timeout=120)
        warn = wait_for(
            lambda: [r for r in collector.logs() if r.severity == "WARN" and r.span_id == training.span_id],
            what="rank 0's stall log record",
            timeout=60,
        )
        assert proc.poll() is None, "the stall must arrive while the job still runs"
    finally:
        ranks = _ranks(where) or ranks
        _kill_job(proc, ranks)
    output = (tmp_path / "torchrun.out").read_text(errors="replace")
    assert "rank 1 skipped the all_reduce of step 40" in output, output
    # rank 0's training: incomplete, alive (it still beats while gloo waits), the stack shows all_reduce
    assert training.attributes["lora_otel.stall.kind"] == "alive"
    assert training.status_message.startswith("stalled: training open for"), training.status_message
    assert "stall detected" in training.events
    event = _event_attributes(collector, training.span_id, "stall detected")
    assert "all_reduce" in event and "distributed_c10d.py" in event, event[:3000]
    # the diagnosis: waiting in all_reduce, and rank 1 never arrived, from rank 1's journal and stack
    sentence = training.attributes["lora_otel.diagnosis"]
    assert sentence == (
        "Waiting inside a collective (all_reduce, called at train.py:%d in <module>); rank 1 never "
        "arrived: rank 1 has made 40 optimizer steps (rank 0: 39), is not in a collective "
        "(at train.py:%d in <module>)." % (ALL_REDUCE_LINE, SLEEP_LINE)
    ), sentence
    assert training.attributes["lora_otel.collective.op"] == "all_reduce"
    assert training.attributes["lora_otel.collective.rank"] == 0
    missing = str(training.attributes["lora_otel.collective.missing_ranks"])  # rotel prints Slice(Int(1))
    assert "Int(1)" in missing and "Int(0)" not in missing, missing
    assert "lora_otel.evidence.rank.1.python.stacks" in event, event[:3000]
    [record] = warn
    assert record.body.startswith("stall detected: training open for") and sentence in record.body, record.body
    assert record.attributes["lora_otel.collective.op"] == "all_reduce"
    assert str(record.attributes["lora_otel.collective.missing_ranks"]) == missing
    # nothing is left: torchrun, both ranks, and the sidecar once it has finalised
    for j in ranks.values():
        wait_for(
            lambda: process_state(j) != "running",  # noqa: B023 - called in this iteration
            what="rank %s to be gone" % j.root.attrs["rank"],
            timeout=10,
        )
    wait_gone(side)
    assert_unique(collector.spans())
    assert not _processes_in(tmp_path), "processes left in %s: %s" % (tmp_path, _processes_in(tmp_path))


def _processes_in(directory: Path) -> list:
    """The pids of live processes whose working directory is ``directory`` (torchrun, ranks, sidecar)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.readlink("/proc/%s/cwd" % pid) == str(directory):
                found.append(int(pid))
        except OSError:  # gone, a zombie, or not ours to look at
            pass
    return found


# --- the diagnosis, with synthetic journals -------------------------------------------------------

STACKS = textwrap.dedent("""\
    Thread 0x00007f0000000002 (most recent call first):
      File "/venv/lib/python3.11/site-packages/lora_otel/_boot/core.py", line 90 in _beat
      File "/usr/lib/python3.11/threading.py", line 975 in run

    Current thread 0x00007f0000000001 (most recent call first):
      File "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", line 3252 in all_reduce
      File "/venv/lib/python3.11/site-packages/torch/distributed/c10d_logger.py", line 83 in wrapper
      File "/work/train.py", line 16 in <module>
""")
SLEEPING = textwrap.dedent("""\
    Current thread 0x00007f0000000001 (most recent call first):
      File "/work/train.py", line 14 in <module>
""")


def _rank_journal(path: Path, rank: int, steps: int, *, alive: bool = True, world: int = 2) -> JournalBuilder:
    """A rank's journal: started at 0, training from 1 s, ``steps`` steps by 2 s, beating until 10 s."""
    b = JournalBuilder(path)
    b.process(
        0.0,
        alive=alive,
        attrs={
            "service.name": "train.py",
            "process.pid": os.getpid(),
            "rank": rank,
            "local_rank": rank,
            "world_size": world,
        },
    )
    b.start("training", 1.0)
    for t in range(2, 11):
        b.beat(float(t), steps=steps, last_step_t=2.0)
    return b


def _stall(j: Journal) -> Stall:
    training = next(s for s in j.spans if s.name == "training")
    return Stall("alive", training, 8.0, 3.0, "no optimizer step for 8 s (limit 3 s)")


def _explain(me: JournalBuilder, peers: list, **kw):
    j = me.read()
    return explain(
        _stall(j),
        {PREFIX + "python.stacks": STACKS, PREFIX + "process.state": "S (sleeping)"},
        j,
        [p.read() for p in peers],
        now_ns=me.ns(10.5),
        **kw,
    )


def test_collective_in_stacks() -> None:
    found = collective_in(STACKS)
    assert found is not None and found.op == "all_reduce" and found.called_at == "train.py:16 in <module>"
    assert collective_in(SLEEPING) is None
    spy = (
        'Thread 7 (idle): "MainThread"\n    broadcast (torch/distributed/distributed_c10d.py:2800)\n'
        "    broadcast_object_list (torch/distributed/distributed_c10d.py:3400)\n    <module> (train.py:9)\n"
    )
    assert collective_in(spy).op == "broadcast_object_list" and collective_in(spy).called_at == "train.py:9 in <module>"
    agent = (
        'Current thread 0x1 (most recent call first):\n  File "/v/torch/distributed/elastic/multiprocessing/'
        'api.py", line 5 in wait\n  File "/v/torch/distributed/run.py", line 9 in main\n'
    )
    assert collective_in(agent) is None, "torchrun's agent waiting for its workers is no collective"


def test_peer_that_exited(tmp_path: Path) -> None:
    me = _rank_journal(tmp_path / "r0.otel.jsonl", 0, steps=2)
    peer = _rank_journal(tmp_path / "r1.otel.jsonl", 1, steps=2)
    peer.exit(4.0, code=1, how="exception", message="RuntimeError: boom")
    found = _explain(me, [peer])
    assert found.sentence.startswith(
        "Waiting inside a collective (all_reduce, called at train.py:16 in <module>); "
        "rank 1 never arrived: rank 1 exited (RuntimeError: boom, exit code 1) at "
    ), found.sentence
    assert found.attrs["lora_otel.collective.missing_ranks"] == [1]
    assert found.attrs["lora_otel.collective.op"] == "all_reduce" and found.attrs["lora_otel.collective.rank"] == 0
    # no exit record, and the process is gone (a pid whose start time does not match)
    vanished = _rank_journal(tmp_path / "r1b.otel.jsonl", 1, steps=2, alive=False)
    assert "rank 1 vanished without an exit record" in _explain(me, [vanished]).sentence


def test_peer_at_a_lower_step(tmp_path: Path) -> None:
    me = _rank_journal(tmp_path / "r0.otel.jsonl", 0, steps=5, world=4)
    behind = _rank_journal(tmp_path / "r2.otel.jsonl", 2, steps=4, world=4)
    level = _rank_journal(tmp_path / "r1.otel.jsonl", 1, steps=5, world=4)
    found = _explain(me, [level, behind])
    assert "; rank 2 never arrived: rank 2 has made 4 optimizer steps (rank 0: 5)." in found.sentence, found.sentence
    assert found.attrs["lora_otel.collective.missing_ranks"] == [2]
    # rank 1 is level with rank 0; its stack shows it in the same all_reduce, so it arrived
    assert "rank 1" not in found.sentence.split("never arrived")[1]
    frames = explain(
        _stall(me.read()),
        {PREFIX + "python.stacks": STACKS},
        me.read(),
        [level.read(), behind.read()],
        peer_stacks={str(level.path): STACKS, str(behind.path): SLEEPING},
        now_ns=me.ns(10.5),
    )
    assert (
        "rank 2 has made 4 optimizer steps (rank 0: 5), is not in a collective (at train.py:14 in <module>)"
        in frames.sentence
    ), frames.sentence


def test_no_peers_cannot_tell(tmp_path: Path) -> None:
    me = _rank_journal(tmp_path / "r0.otel.jsonl", 0, steps=2)
    found = _explain(me, [])
    assert found.sentence == (
        "Waiting inside a collective (all_reduce, called at train.py:16 in <module>); "
        "cannot tell which rank never arrived: no other rank of the world of 2 is followed "
        "here."
    ), found.sentence
    assert "lora_otel.collective.missing_ranks" not in found.attrs
    # a peer level with it and without a stack: still cannot tell
    level = _rank_journal(tmp_path / "r1.otel.jsonl", 1, steps=2)
    assert (
        "cannot tell which rank never arrived: rank 1 is at the same step and stage as rank 0"
        in _explain(me, [level]).sentence
    )
    # a process without a rank attribute
    plain = JournalBuilder(tmp_path / "plain.otel.jsonl")
    plain.process(0.0, alive=True)
    plain.start("training", 1.0)
    assert _explain(plain, [level]).sentence.endswith("cannot tell which rank never arrived: this process has no rank.")


def test_world_peers_picks_the_rank_processes(tmp_path: Path) -> None:
    """A DataLoader worker inherits its rank's variables; torchrun's own journal has no rank."""
    me = _rank_journal(tmp_path / "r0.otel.jsonl", 0, steps=2)
    rank1 = _rank_journal(tmp_path / "r1.otel.jsonl", 1, steps=2)
    worker = JournalBuilder(tmp_path / "w.otel.jsonl", t0=rank1.t0 + 10**9)
    worker.process(0.0, alive=True, attrs={"rank": 1, "world_size": 2, "process.parent_pid": os.getpid()})
    launcher = JournalBuilder(tmp_path / "torchrun.otel.jsonl")
    launcher.process(0.0, alive=True)
    other_world = _rank_journal(tmp_path / "o.otel.jsonl", 1, steps=2, world=8)
    peers = world_peers(me.read(), [rank1.read(), worker.read(), launcher.read(), other_world.read()])
    assert list(peers) == [1] and peers[1].path == str(rank1.path)


RENDEZVOUS = """\
import glob, os, threading, time, lora_otel
import torch.distributed as dist
def watch():  # end the wait once the stall record is written (and 1 s more), as a user's Ctrl-C would
    while not any(b'"stall"' in open(p, "rb").read() for p in glob.glob("j/*.otel.jsonl")):
        time.sleep(0.1)
    time.sleep(1)
    print("stall seen", flush=True)
    os._exit(0)
threading.Thread(target=watch, daemon=True).start()
with lora_otel.stage("join"):
    dist.init_process_group("gloo")  # WORLD_SIZE=2 left in the environment: rank 1 never comes
"""


@pytest.mark.slow
@pytest.mark.torch
def test_a_rendezvous_waiting_for_a_rank_never_started_is_named(tmp_path: Path) -> None:
    """``RANK=0 WORLD_SIZE=2`` left in the environment, one process: ``init_process_group`` waits
    in TCPStore for rank 1 forever. The diagnosis names the rendezvous and the world it waits for
    (a newcomer's trial: before, TCPStore's C++ retry sleep read as "sleeping (time.sleep) … not
    the network")."""
    pytest.importorskip("torch.distributed")
    from collector import free_port

    (tmp_path / "job.py").write_text(RENDEZVOUS, encoding="utf-8")
    r = subprocess.run(
        [PYTHON, "job.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=150,
        env=clean_env(
            LORA_OTEL="1",
            LORA_OTEL_DIR="j",
            LORA_OTEL_STALL_AFTER="join=3",
            RANK="0",
            WORLD_SIZE="2",
            LOCAL_RANK="0",
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(free_port()),
        ),
    )
    assert r.returncode == 0 and r.stdout == "stall seen\n", (r.stdout, r.stderr[-3000:])
    [path] = journals(tmp_path / "j")
    [record] = read_journal(path).stalls
    assert record["diagnosis"].startswith(
        "Waiting in torch.distributed's rendezvous (init_process_group, at job.py:11 in <module>): "
        "rank 0 of world size 2 waits for the other ranks"
    ), record["diagnosis"]
