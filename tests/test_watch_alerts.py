"""``lora-otel watch`` for unattended batches: an alert command or webhook once per stall, exit 4 on a stall."""

from __future__ import annotations

import http.server
import json
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import JournalBuilder
from procs import journal_has_open, journals, lora_otel_cli, wait_for
from test_hangs import kill_and_reap, make_module, start_traced
from test_watch import Watch

from lora_otel.cli import main
from lora_otel.cli import watch as watch_mod
from lora_otel.journal.reader import read_journal

STALL = ("--interval", "0.2", "--stall-after", "import=1")


def stuck_job(tmp_path: Path):
    """A real traced job stuck in ``import slowmod`` (sleeping, so alive), its span already on disk."""
    make_module(tmp_path, "slowmod", "import time\ntime.sleep(600)\n")
    job = start_traced(tmp_path, "import os\nimport slowmod\n")
    wait_for(lambda: journal_has_open(tmp_path / "lora-otel", "import slowmod"), what="import span")
    return job


def lines_of(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines() if path.exists() else []


def stuck_here(path: Path, rank: int | None = None) -> JournalBuilder:
    """This test process as a running job stuck in ``import slowmod`` for 300 s (past the 120 s default)."""
    journal = JournalBuilder(path, t0=time.time_ns() - 300 * 10**9)
    attrs = {"service.name": "train.py", "process.pid": os.getpid(), "host.name": "node7"}
    if rank is not None:
        attrs["rank"] = rank
    journal.process(alive=True, attrs=attrs)
    journal.start("import slowmod", 0.01)
    journal.beat(299.5)
    return journal


class Hook:
    """A local HTTP server in a thread that keeps each POSTed body."""

    def __init__(self) -> None:
        bodies = self.bodies = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                bodies.append((self.path, self.headers.get("Content-Type"), self.rfile.read(length)))
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = "http://127.0.0.1:%d/hook" % self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=10)


@pytest.fixture
def hook() -> Iterator[Hook]:
    server = Hook()
    yield server
    server.close()


@pytest.mark.slow
def test_alert_command_gets_the_stall_as_json_once(tmp_path: Path) -> None:
    """One stall of a real job: the command runs exactly once, the stall as JSON on stdin, stage and
    kind in its environment; watch goes on following, and ends with the job (status 3, killed)."""
    job = stuck_job(tmp_path)
    [journal_path] = journals(tmp_path / "lora-otel")
    command = 'cat >> alerts.jsonl; echo "$LORA_OTEL_ALERT_STAGE|$LORA_OTEL_ALERT_KIND|$LORA_OTEL_ALERT_PID" >> env.txt'
    watcher = Watch("lora-otel", *STALL, "--alert-command", command, cwd=tmp_path)
    try:
        watcher.wait_line("STALLED: import slowmod")
        wait_for(lambda: lines_of(tmp_path / "env.txt"), what="the alert command to run")
        time.sleep(1.5)  # seven more polls, the job still stalled: no second alert
        assert watcher.proc.poll() is None, "watch keeps following after the alert"
        kill_and_reap(job)
        status, out, err = watcher.finish()
    finally:
        kill_and_reap(job)
        watcher.kill()
    assert status == 3, (out, err)
    assert err == ""
    [line] = lines_of(tmp_path / "alerts.jsonl")
    alert = json.loads(line)
    trace_id = read_journal(journal_path).root.trace_id
    assert alert["event"] == "stall"
    assert alert["stage"] == "import slowmod" and alert["kind"] == "alive"
    assert alert["pid"] == job.pid and alert["journal"] == str(journal_path)
    assert alert["trace_id"] == trace_id and len(alert["span_id"]) == 16
    assert alert["limit_s"] == 1 and alert["open_for_s"] >= 1
    assert alert["status_message"].startswith("stalled: import slowmod open for ")
    assert "limit 1 s" in alert["reason"]
    assert alert["service"] == "job" and alert["host"] == os.uname().nodename
    assert "rank" not in alert, "no rank outside a distributed launch"
    assert alert["time"].endswith("Z") and alert["time"][:2] == "20"
    assert lines_of(tmp_path / "env.txt") == ["import slowmod|alive|%d" % job.pid]


@pytest.mark.slow
def test_a_failing_alert_command_is_one_line_and_watch_goes_on(tmp_path: Path) -> None:
    job = stuck_job(tmp_path)
    watcher = Watch("lora-otel", *STALL, "--alert-command", "exit 3", cwd=tmp_path)
    try:
        watcher.wait_line("STALLED: import slowmod")
        time.sleep(1.0)
        assert watcher.proc.poll() is None, "a failed alert does not stop watch"
        kill_and_reap(job)
        status, out, err = watcher.finish()
    finally:
        kill_and_reap(job)
        watcher.kill()
    assert status == 3, (out, err)
    assert err.splitlines() == ["lora-otel watch: alert command failed (exit status 3): exit 3"]
    assert "process gone without an exit record" in out


@pytest.mark.slow
def test_exit_on_stall_exits_4_after_the_alert(tmp_path: Path) -> None:
    """--exit-on-stall: status 4 while the job still runs, once the (slow) alert command has finished."""
    job = stuck_job(tmp_path)
    watcher = Watch(
        "lora-otel", *STALL, "--exit-on-stall", "--alert-command", "sleep 1; cat > alert.json", cwd=tmp_path
    )
    try:
        status, out, err = watcher.finish()
        assert job.poll() is None, "the job is left running: the batch script decides"
    finally:
        kill_and_reap(job)
        watcher.kill()
    assert status == watch_mod.STALLED_STATUS == 4, (out, err)
    assert err == ""
    assert json.loads((tmp_path / "alert.json").read_text())["stage"] == "import slowmod"
    assert out.index("STALLED: import slowmod") < out.index("[watch] stalled: exiting (--exit-on-stall)")
    assert "import slowmod  OPEN for" in out


@pytest.mark.slow
def test_webhook_gets_the_stall_as_json(tmp_path: Path, hook: Hook) -> None:
    job = stuck_job(tmp_path)
    watcher = Watch("lora-otel", *STALL, "--exit-on-stall", "--alert-webhook", hook.url, cwd=tmp_path)
    try:
        status, out, err = watcher.finish()
    finally:
        kill_and_reap(job)
        watcher.kill()
    assert status == 4, (out, err)
    assert err == ""
    [(path, content_type, body)] = hook.bodies
    assert path == "/hook" and content_type == "application/json"
    alert = json.loads(body)
    assert alert["stage"] == "import slowmod" and alert["kind"] == "alive" and alert["pid"] == job.pid


@pytest.mark.slow
def test_once_alerts_and_exits_4_only_with_exit_on_stall(tmp_path: Path, capfd, hook: Hook) -> None:
    """--once on a stalled process: alerts (command and webhook, rank and host from the journal);
    status 4 with --exit-on-stall, 3 without (stalled, as inspect DIR --summary says)."""
    stuck = stuck_here(tmp_path / "a.otel.jsonl", rank=1)
    out_file = tmp_path / "alert.json"
    args = ["watch", "--once", "--alert-command", "cat > %s" % out_file, "--alert-webhook", hook.url, str(stuck.path)]
    assert main(args) == 3
    alert = json.loads(out_file.read_text())
    assert alert["rank"] == 1 and alert["host"] == "node7" and alert["service"] == "train.py"
    assert alert["stage"] == "import slowmod" and alert["limit_s"] == 120 and alert["open_for_s"] >= 299
    assert json.loads(hook.bodies[0][2]) == alert
    assert main([*args, "--exit-on-stall"]) == 4
    assert len(hook.bodies) == 2, "each watch run alerts once"
    assert capfd.readouterr().err == ""
    finished = JournalBuilder(tmp_path / "done.otel.jsonl")
    root = finished.process()
    finished.span("import torch", 0.01, 2.3)
    finished.end(root, 3.0)
    finished.exit(3.0)
    assert main(["watch", "--once", "--exit-on-stall", "--alert-webhook", hook.url, str(finished.path)]) == 0
    assert len(hook.bodies) == 2, "no stall, no alert"


@pytest.mark.slow
def test_a_hanging_alert_command_is_killed(tmp_path: Path, capfd, monkeypatch) -> None:
    monkeypatch.setattr(watch_mod, "ALERT_COMMAND_TIMEOUT_S", 0.5)
    stuck = stuck_here(tmp_path / "a.otel.jsonl")
    began = time.monotonic()
    assert main(["watch", "--once", "--exit-on-stall", "--alert-command", "sleep 30", str(stuck.path)]) == 4
    assert time.monotonic() - began < 10
    err = capfd.readouterr().err
    assert err.splitlines() == ["lora-otel watch: alert command killed after 0.5 s: sleep 30"]


@pytest.mark.slow
def test_an_unreachable_webhook_is_one_line(tmp_path: Path, capfd) -> None:
    hook = Hook()
    url = hook.url
    hook.close()  # nothing listens there any more
    stuck = stuck_here(tmp_path / "a.otel.jsonl")
    assert main(["watch", "--once", "--alert-webhook", url, str(stuck.path)]) == 3  # stalled
    [line] = capfd.readouterr().err.splitlines()
    assert line.startswith("lora-otel watch: alert webhook failed (") and line.endswith("): " + url)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--alert-webhook", "ftp://example.org/x"], "--alert-webhook: not an http(s) URL: ftp://example.org/x"),
        (["--alert-webhook", "hook"], "--alert-webhook: not an http(s) URL: hook"),
        (["--alert-command", "  "], "--alert-command: empty command"),
    ],
)
def test_bad_alert_options_are_usage_errors(tmp_path: Path, capsys, args, message) -> None:
    stuck = stuck_here(tmp_path / "a.otel.jsonl")
    assert main(["watch", "--once", *args, str(stuck.path)]) == 2
    assert capsys.readouterr().err == "lora-otel watch: %s\n" % message


@pytest.mark.slow
def test_help_lists_the_exit_statuses_and_alerts() -> None:
    r = lora_otel_cli("watch", "--help")
    assert r.returncode == 0
    text = " ".join(r.stdout.split())
    for part in (
        "0 all finished normally",
        "1 some failed",
        "3 some killed",
        "4 stalled",
        "2 usage error",
        "130 Ctrl-C",
        "--alert-command CMD",
        "--alert-webhook URL",
        "--exit-on-stall",
        "$LORA_OTEL_ALERT_STAGE",
    ):
        assert part in text, part
