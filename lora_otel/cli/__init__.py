"""The ``lora-otel`` command. One function per subcommand; its docstring is the help."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

TYPE_CHECKING = False
if TYPE_CHECKING:  # never true at runtime: doctor's check process imports this package, and not typing
    from typing import Any


def cmd_run(args: argparse.Namespace) -> int:
    """Run a command with lora_otel active in it (and in every Python process it starts).

    Everything after ``--`` is the command, passed through untouched, e.g.
    ``lora-otel run -- python train.py --log run.log``. The journal goes where the program's
    ``--log`` points, else to ``--dir`` / ``$LORA_OTEL_DIR``, else ``~/.local/state/lora-otel/``
    (``$XDG_STATE_HOME/lora-otel/``).
    """
    from lora_otel.cli.run import run_command

    return run_command(args)


def cmd_inspect(args: argparse.Namespace) -> int:
    """Print a journal's span tree, open spans marked, with where the process is or was stuck.

    The first line says where the process is or was stuck, e.g.
    ``stuck in import bitsandbytes for 312 s (process gone)``. ``--json`` prints the schema
    documented in docs/journal.md. No JOURNAL: the newest run in ``$LORA_OTEL_DIR``, else in
    ``~/.local/state/lora-otel/`` (a line on stderr names it).

    DIR: every *.otel.jsonl journal of this user's in it (not recursive; another user's file, a
    symlink or a FIFO there is left alone, counted in one line on stderr), grouped into jobs (journals sharing a
    trace id: a launcher and its ranks or workers). Per job a heading with its outcome, one line
    per process (ranks in order, a launcher first), the process to look at called out ("rank 1
    (pid 4243) is the one stuck: in import bitsandbytes for 312 s", or the one that failed first,
    or the slowest) and its span tree; --all shows every tree. --summary prints one line per job
    instead, by start time, for unattended batches.
    """
    from lora_otel.cli.inspect import run_inspect

    return run_inspect(args)


def cmd_replay(args: argparse.Namespace) -> int:
    """Send a journal's spans to the OTLP endpoint set by the standard OTEL_EXPORTER_OTLP_* variables.

    http/protobuf by default; gRPC when OTEL_EXPORTER_OTLP_PROTOCOL=grpc. Spans still open in the
    journal go out once as incomplete (status ERROR, lora_otel.incomplete=true), ending at the
    journal's last evidence. With no endpoint set, the default localhost:4318 is used only when
    its listener is this user's or root's (another user could have bound the port); else one line
    on stderr says how to name one (OTEL_EXPORTER_OTLP_ENDPOINT=...), exit 2.
    """
    from lora_otel.export.replay import run_replay

    return run_replay(args)


def cmd_watch(args: argparse.Namespace) -> int:
    """Follow running jobs live: the span tree updating, open spans counting up, stalls highlighted.

    JOURNAL|DIR: a journal, or a directory whose *.otel.jsonl journals are all followed (new ones picked
    up as they appear). On a terminal the view is redrawn every --interval seconds; anywhere else
    (a launcher's log panel, a pipe) one plain line is printed per change, then the final tree.
    In a directory, the journals of one job (a launcher and its ranks, sharing a trace id) are shown
    together, ranks in order, with the stuck, first failed or slowest process called out.
    Watch ends when no followed process is running any more. No JOURNAL: the newest run, as for
    inspect.
    """
    from lora_otel.cli.watch import run_watch

    return run_watch(args)


def cmd_report(args: argparse.Namespace) -> int:
    """Write a job as one file: an HTML page (a timeline of every process) or a Perfetto trace.

    JOURNAL|LOG|DIR as for inspect: a journal and the journals beside it of the same trace, the
    --log path of a job (its newest run), or a directory (one section per job). --format html
    (default): one self-contained page, no network or server needed: the processes in lanes
    (launcher, ranks in order, workers) on one time axis, the stalled span marked with its
    diagnosis, steps over time, and a span's attributes, events and stacks on a click.
    --format perfetto: Trace Event JSON for Perfetto UI or chrome://tracing. Redacted as every
    other output is.
    """
    from lora_otel.cli.report import run_report

    return run_report(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lora-otel",
        description="Make silent hangs of training jobs visible: trace a process from its first "
        "instruction into a local journal, and export it as OpenTelemetry traces.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n"
        "  lora-otel run --tree -- python train.py --log runs/a.log   trace one job, print its tree\n"
        "  LORA_OTEL=1 python train.py                                 the same with no wrapper\n"
        "  lora-otel inspect runs/a.log.otel.jsonl                     where is it stuck?\n"
        "  lora-otel report runs/ -o job.html                          the job as one HTML page\n"
        "  OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4318 \\\n"
        "    lora-otel replay runs/a.log.otel.jsonl                    ship it to Jaeger/Tempo\n"
        "\njournals: beside --log, else $LORA_OTEL_DIR, else $XDG_STATE_HOME/lora-otel/ (by default\n"
        "~/.local/state/lora-otel/); the last 100 runs / 500 MB are kept (LORA_OTEL_KEEP, LORA_OTEL_KEEP_MB);\n"
        "a short run that ends normally leaves none (docs/journal.md)",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    def add(name: str, func: Callable[[argparse.Namespace], int], **kw: Any) -> argparse.ArgumentParser:
        doc = (func.__doc__ or "").strip()
        p = sub.add_parser(
            name, help=doc.splitlines()[0], description=doc, formatter_class=argparse.RawDescriptionHelpFormatter, **kw
        )
        p.set_defaults(func=func)
        return p

    p = add(
        "run",
        cmd_run,
        epilog="examples:\n"
        "  lora-otel run --tree -- python train.py --log runs/a.log\n"
        "  OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4318 \\\n"
        "    lora-otel run --stall-after import=300,training=900 -- accelerate launch train.py\n"
        "\nWith an OTLP endpoint set, each traced process starts a detached sidecar that exports\n"
        "live (stalls as incomplete spans with evidence); see README 'Live export and stalls'.",
    )
    p.add_argument(
        "--stall-after",
        metavar="SPEC",
        help="stall limits for live export: 300, or import=300,cuda init=60,training=900 "
        "(sets $LORA_OTEL_STALL_AFTER for the job)",
    )
    p.add_argument(
        "--dir",
        help="directory for journals (default: beside --log, else $LORA_OTEL_DIR, else ~/.local/state/lora-otel/)",
    )
    p.add_argument("--journal", help="exact journal path for the top process")
    p.add_argument("--tree", action="store_true", help="print the span tree when the command ends")
    p.add_argument("cmd", nargs=argparse.REMAINDER, help="-- COMMAND [ARGS...]")

    p = add(
        "inspect",
        cmd_inspect,
        epilog="examples:\n"
        "  lora-otel inspect                              the newest run: where is it stuck?\n"
        "  lora-otel inspect runs/a.log.otel.jsonl        that journal\n"
        "  lora-otel inspect runs/                        every job in the directory, ranks side by side\n"
        "  lora-otel inspect runs/ --summary              one line per job: finished / failed / stalled / killed\n"
        "  lora-otel inspect runs/ --json --all           the directory as JSON, with every span\n"
        "\nexit status: 0, or 2 when nothing can be read (a missing or unreadable journal, a directory\n"
        "without *.otel.jsonl journals, a bad --stall-after). With --summary, the jobs' outcome:\n"
        "0 all finished normally (or still run), 1 some failed, 3 some killed or stalled (wins\n"
        "over 1), as lora-otel watch; unreadable journals are listed but do not count.",
    )
    p.add_argument(
        "journal",
        nargs="?",
        metavar="JOURNAL|DIR",
        help="a journal file (*.otel.jsonl), or a directory of them (default: the newest run in "
        "$LORA_OTEL_DIR, else in ~/.local/state/lora-otel/)",
    )
    p.add_argument("--json", action="store_true", help="print machine-readable JSON")
    p.add_argument(
        "--summary", action="store_true", help="one line per job (trace id, name, outcome); exit status by outcome"
    )
    p.add_argument(
        "--all", action="store_true", help="DIR: every process's tree, not only the one called out (--json: with spans)"
    )
    p.add_argument(
        "--stall-after",
        metavar="SPEC",
        help="DIR/--summary: stall limits for running processes, as for watch (default: "
        "$LORA_OTEL_STALL_AFTER, else import 120 s, training 120 s or 20x the median step "
        "unless training=N is given, ...)",
    )

    p = add("replay", cmd_replay)
    p.add_argument("journal", help="a journal file (*.otel.jsonl)")

    p = add(
        "watch",
        cmd_watch,
        epilog="examples:\n"
        "  lora-otel watch runs/                          follow every job journaling into runs/\n"
        "  lora-otel watch runs/a.log.otel.jsonl          follow one job\n"
        "  lora-otel watch --stall-after 300              the newest run; any stage open 5 minutes is a stall\n"
        "  lora-otel watch runs/ --once                   print the current state once and exit\n"
        "  lora-otel watch runs/ >> watch.log             one line per event, no screens\n"
        "  lora-otel watch runs/ --exit-on-stall --alert-command 'mail -s stalled me@example.org'\n"
        "                                                 unattended: alert once, exit 4 on a stall\n"
        "\nexit status, job by job as `inspect --summary` judges them (the rank that failed first decides):\n"
        "0 all finished normally, 1 some failed, 3 some killed or vanished without an "
        "exit record\n(wins over 1), 4 stalled (with --exit-on-stall: a stall was seen; with --once too: "
        "a process is\nstalled now), 2 usage error, 130 Ctrl-C. Colour is off with --no-color or NO_COLOR set.\n"
        "\nalerts: --alert-command and --alert-webhook fire once per stall (per stalled span of a process)\n"
        "with the stall as JSON (journal, pid, rank, trace_id, span_id, stage, kind, open_for_s, limit_s,\n"
        "reason, status_message, service, host, time); the command gets it on stdin and\n"
        "$LORA_OTEL_ALERT_STAGE, $LORA_OTEL_ALERT_KIND, $LORA_OTEL_ALERT_PID, $LORA_OTEL_ALERT_JOURNAL.\n"
        "Alerts run in the background (command killed after 30 s, webhook timeout 10 s); a failure is\n"
        "one line on stderr and watch goes on.",
    )
    p.add_argument(
        "path",
        nargs="?",
        metavar="JOURNAL|DIR",
        help="a journal file, or a directory of *.otel.jsonl journals (default: the newest run, as for inspect)",
    )
    p.add_argument("--interval", type=float, default=1.0, metavar="S", help="seconds between updates (default 1)")
    p.add_argument(
        "--stall-after",
        metavar="SPEC",
        help="stall limits: 300, or import=300,training=900 (default: $LORA_OTEL_STALL_AFTER, "
        "else import 120 s, training 120 s or 20x the median step unless training=N is given, ...)",
    )
    p.add_argument("--once", action="store_true", help="print the current view once and exit")
    p.add_argument("--no-color", action="store_true", help="no colour on a terminal (also: NO_COLOR=1)")
    p.add_argument(
        "--alert-command",
        metavar="CMD",
        help="shell command (sh -c) run once per stall, the stall as JSON on its stdin",
    )
    p.add_argument("--alert-webhook", metavar="URL", help="http(s) URL the stall JSON is POSTed to, once per stall")
    p.add_argument(
        "--exit-on-stall",
        action="store_true",
        help="exit with status 4 as soon as a stall is seen (after its alerts have run)",
    )

    from lora_otel.cli import report as report_module

    report_module.add_arguments(add("report", cmd_report, epilog=report_module.EPILOG))

    from lora_otel.cli.baseline import add_arguments as baseline_arguments

    baseline_arguments(
        add(
            "baseline",
            cmd_baseline,
            epilog="examples:\n"
            "  lora-otel baseline save good.json runs/ok1.otel.jsonl runs/ok2.otel.jsonl\n"
            "  lora-otel baseline diff good.json                     this interpreter\n"
            "  lora-otel baseline diff good.json runs/a.otel.jsonl   a run (slow phases too)\n"
            "  LORA_OTEL_BASELINE=good.json lora-otel inspect runs/a.otel.jsonl\n"
            "\nexit status (diff): 0 no drift, 1 drift, 2 usage error. See docs/baselines.md.",
        )
    )

    from lora_otel.cli import doctor as doctor_module

    doctor_module.add_arguments(add("doctor", cmd_doctor, epilog=doctor_module.EPILOG))
    return parser


def cmd_doctor(args: argparse.Namespace) -> int:
    """Run a training job's start-up once, traced, and say what is wrong: one line per check.

    Imports the training stack (torch, transformers, diffusers, accelerate, peft, bitsandbytes,
    xformers: those installed), each under its own span and time limit; initialises CUDA; runs a
    small matmul on every visible GPU; one LoRA forward and backward on a tiny model (with peft).
    Checks torch's CUDA build against the driver, the packages' declared requirements and
    Requires-Python, and free GPU memory against --need-gpu-memory. The flow runs in a traced check
    process (a journal in --dir, and live OTLP export when an endpoint is set); a step past its limit
    is killed and reported with its Python stack. Each line: ok / warn / fail, the evidence, what to do.
    """
    from lora_otel.cli.doctor import run_doctor

    return run_doctor(args)


def cmd_baseline(args: argparse.Namespace) -> int:
    """Record a good run's environment and start-up times; list the drift of a run from them.

    save FILE [--from-journal J] [JOURNAL ...]: the environment (this interpreter's, or a journal's
    self-check) and the median duration of each start-up phase of the good runs given.
    diff FILE [JOURNAL|FILE]: packages, CUDA/cuDNN/driver, GPUs and variables that differ, and phases
    much slower than the baseline ("import torch took 48 s; baseline 2.1 s"). With LORA_OTEL_BASELINE
    set, inspect and the live stall diagnosis show the drift that bears on the stuck stage first.
    """
    from lora_otel.cli.baseline import run_baseline

    return run_baseline(args)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("lora-otel: interrupted", file=sys.stderr)
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
