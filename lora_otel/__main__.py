"""``python -m lora_otel script.py [args…]`` runs a script traced; ``python -m lora_otel inspect …`` is the CLI."""

from __future__ import annotations

import os
import sys

_USAGE = "usage: python -m lora_otel SCRIPT.py [ARGS...]   or   python -m lora_otel COMMAND ... (see --help)\n"


def main() -> int:
    args = sys.argv[1:]
    if not args:
        sys.stderr.write(_USAGE)
        return 2
    first = args[0]
    if first.endswith(".py") or (
        os.path.exists(first)
        and not first.startswith("-")
        and first not in ("run", "inspect", "replay", "watch", "doctor", "baseline")
    ):
        import runpy

        from lora_otel._boot import preamble

        script = first
        if not os.path.exists(script):
            sys.stderr.write("lora-otel: no such script: %s\n" % script)
            return 2
        sys.argv = args
        sys.path[0] = os.path.dirname(os.path.abspath(script))
        preamble.start("python -m lora_otel")
        preamble.promote("python -m lora_otel")  # started to be watched (also when LORA_OTEL=1 began it)
        try:
            runpy.run_path(script, run_name="__main__")
        except SystemExit as e:  # `raise SystemExit(n)` in the script: the exit record gives n
            preamble.note_system_exit(e.code, final=True)
            raise
        preamble.note_system_exit(None, final=True)  # it ended normally: a SystemExit it caught is not its end
        return 0
    from lora_otel.cli import main as cli_main

    return cli_main(args)


if __name__ == "__main__":
    sys.exit(main())
