"""What ``lora-otel report`` costs: the page's size and the time to write it, for the example LoRA
job and a 10,000-span journal; the time to first paint of those pages in headless Chromium, and the
frame times while the 10,000-span waterfall is scrolled from top to bottom.

    python bench/report_cost.py              # example job (--steps 40), 10,000 spans, 5 runs each
    python bench/report_cost.py --runs 3 --spans 20000

"write" is what the command does after parsing its arguments: read the journal(s), build the page,
write the file (in this process, median of --runs). "first paint" is Chromium's own
``performance.getEntriesByType('paint')`` (first-contentful-paint) of the file opened in a fresh
page, median of --runs; the scroll moves the waterfall 2000 px per animation frame to its end.
Needs Debian's chromium (/usr/bin/chromium) and Playwright (the test extra).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))
CHROMIUM = "/usr/bin/chromium"


def example_journal(directory: Path, steps: int) -> Path:
    """Run examples/train_lora.py traced; its journal."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LORA_OTEL", "OTEL_"))}
    env.update(LORA_OTEL="1", PYTHONPATH=str(REPO))
    subprocess.run(
        [sys.executable, str(REPO / "examples" / "train_lora.py"), "--steps", str(steps), "--log", "run.log"],
        cwd=directory,
        env=env,
        check=True,
        capture_output=True,
        timeout=600,
    )
    return directory / "run.log.otel.jsonl"


def big_journal_file(directory: Path, spans: int) -> Path:
    from conftest import JournalBuilder
    from test_report import big_journal

    builder = JournalBuilder(directory / "big.otel.jsonl")
    big_journal(builder, spans)
    return builder.path


def write_times(journal: Path, out: Path, runs: int) -> tuple[list[float], int, int]:
    """Seconds per write (read + render + write), the page's size in bytes, and the spans drawn."""
    from lora_otel.cli.report import read_input
    from lora_otel.cli.report_html import render_html

    times = []
    for _ in range(runs):
        started = time.perf_counter()
        journals = read_input(str(journal))
        page = render_html(journals, time.time_ns()).encode("utf-8", "backslashreplace")
        out.write_bytes(page)
        times.append(time.perf_counter() - started)
    return times, out.stat().st_size, sum(len(j.spans) for j in journals)


def browser_figures(pages: list[Path], runs: int) -> dict[Path, dict[str, object]]:
    """First contentful paint (ms, per run) of each page; frame times (ms) scrolling the last one."""
    from playwright.sync_api import sync_playwright

    figures: dict[Path, dict[str, object]] = {}
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=CHROMIUM,
            headless=True,
            args=["--proxy-server=http://127.0.0.1:9", "--host-resolver-rules=MAP * ~NOTFOUND"],
        )
        try:
            for page_path in pages:
                paints, frames = [], []
                for _ in range(runs):
                    context = browser.new_context(viewport={"width": 1400, "height": 1000}, offline=True)
                    page = context.new_page()
                    page.goto(page_path.resolve().as_uri())
                    page.wait_for_selector(".wf-space .row")
                    entries = dict(
                        page.evaluate("performance.getEntriesByType('paint').map(e => [e.name, e.startTime])")
                    )
                    paints.append(float(entries["first-contentful-paint"]))
                    frames = page.evaluate(
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
                    )[1:]
                    context.close()
                figures[page_path] = {"paint": paints, "frames": frames}
        finally:
            browser.close()
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--steps", type=int, default=40, help="the example job's optimizer steps")
    parser.add_argument("--spans", type=int, default=10_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="report-cost-") as tmp:
        where = Path(tmp)
        (where / "example").mkdir()
        (where / "big").mkdir()
        cases = [
            (f"example LoRA job (train_lora.py --steps {args.steps})", example_journal(where / "example", args.steps)),
            (f"{args.spans:,}-span journal", big_journal_file(where / "big", args.spans)),
        ]
        rows, pages = [], []
        for name, journal in cases:
            out = journal.parent / "job.html"
            times, size, spans = write_times(journal, out, args.runs)
            rows.append((name, spans, journal.stat().st_size, size, times))
            pages.append(out)
        browser = browser_figures(pages, args.runs)
    print(f"lora-otel report, {args.runs} runs each, {os.cpu_count()} CPUs, Python {sys.version.split()[0]}")
    print()
    print(
        "| journal | spans | journal size | page size | time to write (median, min-max) "
        "| first contentful paint (median, min-max) | scroll frame ms (median / p95 / max) |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for (name, spans, journal_size, size, times), page in zip(rows, pages):
        paints = browser[page]["paint"]
        frames = sorted(browser[page]["frames"])  # type: ignore[arg-type]
        p95 = frames[min(len(frames) - 1, int(0.95 * len(frames)))] if frames else 0.0
        print(
            f"| {name} | {spans:,} | {journal_size / 1024:,.0f} KB | {size / 1024:,.0f} KB "
            f"| {statistics.median(times) * 1000:,.0f} ms ({min(times) * 1000:,.0f}-{max(times) * 1000:,.0f}) "
            f"| {statistics.median(paints):,.0f} ms ({min(paints):,.0f}-{max(paints):,.0f}) "  # type: ignore[arg-type]
            + (
                f"| {statistics.median(frames):.1f} / {p95:.1f} / {frames[-1]:.1f} ({len(frames)} frames) |"
                if frames
                else "| — (fits without scrolling) |"
            )
        )


if __name__ == "__main__":
    main()
