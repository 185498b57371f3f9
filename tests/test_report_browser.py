"""The HTML report in a real browser: Debian's Chromium, headless, driven by Playwright, kept off
the network. Four real jobs — the example LoRA run, an import hang, a 2-rank gloo job whose rank 1
never arrives, a job killed by SIGKILL — each written by ``lora-otel report`` and opened from its
file; what must hold is what a person sees: the lanes and their labels in order, the stalled bar
with a label that needs no colour and the diagnosis in words, a click on a span showing its
attributes and stacks (the thread the diagnosis is about first), the steps plot when beats carry
steps, not one request leaving the page, and no secret of the job in the file. Then a 10,000-span
journal: it opens and scrolls with the page drawing only the rows in view.

One screenshot per case lands in ``$LORA_OTEL_TEST_ARTIFACTS`` (else a temporary directory):
look at them. ``.ci/run`` installs Chromium (``apt-get install chromium``) and Playwright (the
test extra).
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import JournalBuilder
from procs import PYTHON, REPO, clean_env, lora_otel_cli, run_traced, wait_for
from test_collective import TRAIN, _kill_job, _ranks
from test_hangs import kill_and_reap, make_module, start_traced
from test_report import big_journal

from collector import free_port
from lora_otel.journal.reader import process_state, read_journal

pytestmark = pytest.mark.slow

CHROMIUM = "/usr/bin/chromium"
OFFLINE_FLAGS = [
    # every request that would leave the machine goes to a closed local port, every name fails to resolve
    "--proxy-server=http://127.0.0.1:9",
    "--proxy-bypass-list=<-loopback>",
    "--host-resolver-rules=MAP * ~NOTFOUND",
    # and the browser's own traffic (updates, metrics, safe browsing, sync) is off
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-domain-reliability",
    "--disable-sync",
    "--no-pings",
    "--no-first-run",
    "--metrics-recording-only",
    "--disable-features=OptimizationHints,Translate,MediaRouter,AutofillServerCommunication",
]
SECRET = "hf_aBcDeFgHiJkLmNoPqRsTuVwXyZ0123456789"
SECRET_ARGS = (f"--hf_token={SECRET}",)
SECRET_ENV = {"HF_TOKEN": SECRET}


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not os.path.exists(CHROMIUM):
        pytest.fail(f"{CHROMIUM} is missing: Debian's chromium package (.ci/run installs it with apt-get)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=OFFLINE_FLAGS)
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory) -> Path:
    """Where the screenshots go: ``$LORA_OTEL_TEST_ARTIFACTS``, else a temporary directory."""
    given = os.environ.get("LORA_OTEL_TEST_ARTIFACTS")
    if given:
        Path(given).mkdir(parents=True, exist_ok=True)
        return Path(given)
    return tmp_path_factory.mktemp("report-screenshots")


class Opened:
    """A report open in a page, and every request the page made."""

    def __init__(self, browser: Any, path: Path) -> None:
        self.path = path
        self.url = path.resolve().as_uri()
        self.context = browser.new_context(viewport={"width": 1400, "height": 1000}, offline=True)
        self.requests: list[str] = []
        self.errors: list[str] = []
        self.context.on("request", lambda request: self.requests.append(request.url))
        self.context.route("**/*", lambda route: route.continue_() if route.request.url == self.url else route.abort())
        self.page = self.context.new_page()
        self.page.on("pageerror", lambda error: self.errors.append(str(error)))
        self.page.goto(self.url)
        self.page.wait_for_selector(".wf-space .row")

    def close(self, screenshot: Path) -> None:
        self.page.screenshot(path=str(screenshot), full_page=True)
        self.context.close()

    def lanes(self) -> list[str]:
        """The lane headings, top to bottom. The waterfall draws only the rows in view, so it is
        scrolled through a view at a time (a launcher with many spans put the ranks' lanes out of
        view on a loaded machine), each drawing waited for; then scrolled back where it was."""
        was, height, view = self.page.evaluate(
            "() => { const b = document.querySelector('.wf-body');"
            " return [b.scrollTop, b.scrollHeight, b.clientHeight || 600]; }"
        )
        seen: list[str] = []
        top = 0
        while True:
            self._scroll_to(top)
            seen += [text for text in self.page.locator(".row.lane .n").all_inner_texts() if text not in seen]
            if top + view >= height:
                break
            top += view
        self._scroll_to(was)
        return seen

    def _scroll_to(self, top: int) -> None:
        """Scroll the waterfall to ``top`` and wait until it has drawn the rows there (two frames:
        its scroll handler draws in the next one)."""
        self.page.evaluate("(top) => { document.querySelector('.wf-body').scrollTop = top; }", top)
        self.page.evaluate("() => new Promise(done => requestAnimationFrame(() => requestAnimationFrame(done)))")

    def row(self, name: str, flag: int | None = None) -> Any:
        """The span row named ``name`` (optionally with that flag: 3 stalled, 4 killed), scrolled
        into the drawn rows when it is not there (as a user scrolls to it)."""
        css = f".row.f{flag}" if flag is not None else ".row:not(.lane):not(.diag)"
        found = self.page.locator(css).filter(has=self.page.locator(".n", has_text=name)).first
        if found.count() == 0:
            height, view = self.page.evaluate(
                "() => { const b = document.querySelector('.wf-body');"
                " return [b.scrollHeight, b.clientHeight || 600]; }"
            )
            top = 0
            while found.count() == 0 and top < height:
                self._scroll_to(top)
                top += view
        return found

    def details(self) -> str:
        return self.page.locator(".details").inner_text()

    def assert_stayed_home(self) -> None:
        """Not one request but the file itself; no script error."""
        assert self.requests == [self.url], self.requests
        assert self.errors == [], self.errors


def write_report(cwd: Path, source: str, out: Path) -> str:
    """``lora-otel report SOURCE -o OUT`` as a user runs it; the page's text."""
    r = lora_otel_cli("report", source, "-o", str(out), cwd=cwd)
    assert r.returncode == 0, r.stderr
    assert r.stderr.startswith(f"lora-otel report: wrote {out} ("), r.stderr
    return out.read_text(encoding="utf-8")


def assert_stalled_bar(opened: Opened, name: str, diagnosis: str) -> None:
    """The stalled span: a striped bar, a STALLED label in words, the diagnosis on the row under it."""
    row = opened.row(name, 3)
    assert row.locator(".d").inner_text().startswith("⚠ STALLED "), row.inner_text()
    pattern = row.locator(".bar").evaluate("el => getComputedStyle(el).backgroundImage")
    assert "repeating-linear-gradient" in pattern, "stalled is striped, not only coloured"
    diag = opened.page.locator(".row.diag").first.inner_text()
    assert diag.startswith("STALLED: ") and diagnosis in diag, diag


def click_shows(opened: Opened, name: str, flag: int | None = None) -> str:
    """Click another span, then the one named: the details panel follows the click."""
    other = opened.page.locator(".row:not(.lane):not(.diag)").filter(has_not_text=name).first
    other.click()
    assert name not in opened.page.locator(".details h3").inner_text()
    opened.row(name, flag).click()
    assert opened.page.locator(".details h3").inner_text() == name
    return opened.details()


def test_example_lora_run(tmp_path: Path, browser, artifacts: Path) -> None:
    """examples/train_lora.py, 30 steps: one lane, its imports and training as bars, nothing stalled,
    the steps plot; the page is under 200 KB."""
    r = run_traced(
        [str(REPO / "examples" / "train_lora.py"), "--steps", "30", "--log", "run.log"],
        tmp_path,
        timeout=240,
        **SECRET_ENV,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    out = tmp_path / "job.html"
    text = write_report(tmp_path, "run.log", out)
    assert out.stat().st_size < 200 * 1024, out.stat().st_size
    assert SECRET not in text
    opened = Opened(browser, out)
    try:
        [lane] = opened.lanes()
        assert lane.startswith("▾ process · pid ") and lane.endswith(" · train_lora"), lane
        assert opened.page.locator(".row.f3").count() == 0, "nothing stalled"
        assert opened.page.locator(".phrase").inner_text().startswith("finished in ")
        details = click_shows(opened, "training")
        assert "lora_otel.training.steps" in details and "30" in details
        assert opened.row("import torch").locator(".bar.b0").count() == 1
        plot = opened.page.locator("svg.steps")
        assert plot.locator("polyline").count() == 1 and "process: 30 steps" in plot.text_content()
        details = click_shows(opened, "process")
        assert "lora_otel.env.HF_TOKEN" in details and "[REDACTED]" in details
        opened.assert_stayed_home()
    finally:
        opened.close(artifacts / "report-example-lora.png")


SLOWMOD = """
import time


def wait_for_hub():
    time.sleep(600)


wait_for_hub()
"""


def test_import_hang(tmp_path: Path, browser, artifacts: Path) -> None:
    """A job stuck in an import, reported while it hangs: the import's bar stalled, the watchdog's
    diagnosis, and a click shows the main thread's stack in the import first."""
    make_module(tmp_path, "slowmod", SLOWMOD)
    proc = start_traced(
        tmp_path,
        "import os\nimport slowmod\n",
        *SECRET_ARGS,
        "--log",
        "run.log",
        LORA_OTEL_STALL_AFTER="import=2",
        **SECRET_ENV,
    )
    try:
        path = tmp_path / "run.log.otel.jsonl"
        wait_for(lambda: path.exists() and read_journal(path).stalls, what="the watchdog's stall record", timeout=30)
        stacks = tmp_path / "run.log.stacks.txt"
        wait_for(lambda: "slowmod.py" in stacks.read_text(errors="replace"), what="the stack dump", timeout=10)
        out = tmp_path / "job.html"
        text = write_report(tmp_path, "run.log", out)
    finally:
        kill_and_reap(proc)
    assert SECRET not in text
    opened = Opened(browser, out)
    try:
        [lane] = opened.lanes()
        assert lane.startswith("▾ process · pid ") and lane.endswith(" · job"), lane
        assert opened.page.locator(".badge").inner_text() == "STALLED"
        assert_stalled_bar(opened, "import slowmod", "import slowmod open for")
        details = click_shows(opened, "import slowmod", 3)
        assert "main thread at job.py:2 in <module> → slowmod.py:" in details
        stack = opened.page.locator(".details pre.stacks").inner_text().splitlines()
        assert stack[1] == "  main thread:" and "slowmod.py" in stack[2], stack[:4]
        assert opened.page.locator("svg.steps").count() == 0, "no steps, no plot"
        opened.assert_stayed_home()
    finally:
        opened.close(artifacts / "report-import-hang.png")


@pytest.mark.torch
def test_two_ranks_rank_1_never_arrives(tmp_path: Path, browser, artifacts: Path) -> None:
    """torchrun, 2 gloo ranks, no collector (the local watchdog): rank 1 skips an all_reduce, rank 0
    waits in it. Reported while it hangs: launcher, rank 0, rank 1 in that order; rank 0's training
    stalled with the diagnosis naming rank 1; its stack in all_reduce; both ranks' steps plotted; the
    callout blames rank 1 (stuck too, elsewhere), rank 0 waiting for it in the collective."""
    pytest.importorskip("torch.distributed")
    (tmp_path / "train.py").write_text(TRAIN)
    where = tmp_path / "journals"
    env = clean_env(
        LORA_OTEL="1", LORA_OTEL_STALL_AFTER="training=3", LORA_OTEL_DIR=str(where), OMP_NUM_THREADS="1", **SECRET_ENV
    )
    with open(tmp_path / "torchrun.out", "wb") as log:
        proc = subprocess.Popen(
            [PYTHON, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", str(free_port()),
             "train.py", *SECRET_ARGS],
            cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    ranks: dict = {}
    try:

        def rank0_stalled() -> bool:
            found = _ranks(where) if where.exists() else {}
            stalls = found[0].stalls if 0 in found else []
            return any("rank 1 never arrived" in str(s.get("diagnosis")) for s in stalls)

        wait_for(rank0_stalled, what="rank 0's stall record naming rank 1", timeout=90)
        # rank 1, past its own step limit too, is the one the job's callout blames
        wait_for(lambda: _ranks(where)[1].stalls, what="rank 1's stall record", timeout=90)
        ranks = _ranks(where)
        out = tmp_path / "job.html"
        text = write_report(tmp_path, "journals", out)
    finally:
        ranks = (_ranks(where) if where.exists() else {}) or ranks
        _kill_job(proc, ranks)
        wait_for(
            lambda: all(process_state(j) != "running" for j in ranks.values()), what="the ranks to be gone", timeout=10
        )
    assert SECRET not in text
    opened = Opened(browser, out)
    try:
        lanes = opened.lanes()
        assert [lane.split(" · ")[0] for lane in lanes] == ["▾ launcher", "▾ rank 0", "▾ rank 1"], lanes
        assert lanes[1].startswith(f"▾ rank 0 · pid {ranks[0].pid} · ")
        callout = opened.page.locator(".callout").inner_text()
        assert callout.startswith(f"rank 1 (pid {ranks[1].pid}) is the one stuck"), callout
        assert f"; rank 0 (pid {ranks[0].pid}) waits for it in a collective" in callout, callout
        assert_stalled_bar(opened, "training", "rank 1 never arrived")
        verdict = opened.page.locator(".verdict").inner_text()  # the called-out rank 1's: where it is
        assert "STALLED: training: no optimizer step" in verdict and "train.py:" in verdict, verdict
        details = click_shows(opened, "training", 3)
        assert "rank 0 (pid" in details and "rank 1 never arrived" in details
        stack = opened.page.locator(".details pre.stacks").first.inner_text().splitlines()
        assert stack[1] == "  main thread:" and "all_reduce" in stack[2], stack[:4]
        legend = opened.page.locator("svg.steps").text_content()
        assert "rank 0: 39 steps" in legend and "rank 1: 40 steps" in legend
        opened.assert_stayed_home()
    finally:
        opened.close(artifacts / "report-2-ranks-stalled.png")


TRAINING = """
import time
import lora_otel

with lora_otel.stage("load model"):
    time.sleep(0.3)
for step in range(1, 100000):
    time.sleep(0.05 if step < 30 else 0.15)
    lora_otel.progress(step=step, loss=1.0 / step)
"""


def test_killed_by_sigkill(tmp_path: Path, browser, artifacts: Path) -> None:
    """A job SIGKILLed in training: the lane says KILLED, its open spans end at its last sign of
    life marked killed, the watchdog's account of the death under it, the slowing steps plotted."""
    proc = start_traced(tmp_path, TRAINING, *SECRET_ARGS, "--log", "run.log", **SECRET_ENV)
    path = tmp_path / "run.log.otel.jsonl"
    try:
        wait_for(lambda: path.exists() and read_journal(path).steps >= 40, what="40 steps", timeout=30)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        kill_and_reap(proc)
    wait_for(lambda: any(s.get("kind") == "died" for s in read_journal(path).stalls), what="the death record")
    out = tmp_path / "job.html"
    text = write_report(tmp_path, "run.log", out)
    assert SECRET not in text
    opened = Opened(browser, out)
    try:
        assert len(opened.lanes()) == 1
        assert opened.page.locator(".row.lane .d").inner_text() == "KILLED"
        assert opened.row("training", 4).locator(".d").inner_text().startswith("† KILLED ")
        diag = opened.page.locator(".row.diag").inner_text()
        assert "The process was killed (by a signal: SIGKILL" in diag, diag
        details = click_shows(opened, "training", 4)
        assert "until the process's last sign of life" in details
        assert "main thread was at job.py:" in details
        plot = opened.page.locator("svg.steps")
        assert plot.count() == 1 and "process: " in plot.text_content()
        opened.assert_stayed_home()
    finally:
        opened.close(artifacts / "report-sigkill.png")


def test_ten_thousand_spans_open_and_scroll(tmp_path: Path, browser, artifacts: Path) -> None:
    """A 10,000-span journal: painted, only the rows in view in the page, scrolled to its end where
    the stalled checkpoint is, every frame of the scroll drawn in time."""
    builder = JournalBuilder(tmp_path / "big.otel.jsonl")
    big_journal(builder)
    out = tmp_path / "big.html"
    write_report(tmp_path, str(builder.path), out)
    opened = Opened(browser, out)
    try:
        paint = opened.page.evaluate("performance.getEntriesByType('paint').map(e => [e.name, e.startTime])")
        assert "first-contentful-paint" in dict(paint), paint
        assert opened.page.locator(".row").count() < 200, "only the rows in view are drawn"
        frames = opened.page.evaluate(
            """() => new Promise(done => {
                const body = document.querySelector('.wf-body'), times = [];
                let last = performance.now();
                body.scrollTop = 0;
                function step() {
                    const now = performance.now(); times.push(now - last); last = now;
                    if (body.scrollTop + body.clientHeight >= body.scrollHeight - 1) return done(times);
                    body.scrollTop += 2000; requestAnimationFrame(step);
                }
                requestAnimationFrame(step);
            })"""
        )
        assert len(frames) > 50
        assert max(frames[1:]) < 500, f"a frame took {max(frames):.0f} ms"
        opened.page.wait_for_timeout(100)
        assert opened.row("save checkpoint", 3).is_visible()
        opened.assert_stayed_home()
    finally:
        opened.close(artifacts / "report-10000-spans.png")
