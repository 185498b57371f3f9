"""The stall limits: one definition for the job itself (its narration) and every reader of its journal.

``LORA_OTEL_STALL_AFTER`` (``lora-otel run --stall-after`` sets it for the job): a number of
seconds for every stage (``300``), or per stage (``import=300,cuda init=60,training=900,
between=60,default=600``); a stage is matched by its full name first (``import bitsandbytes=900``),
then by kind (``import``), then ``default``. ``between`` is the quiet time with no stage open
(other than ``process``) since the last stage ended; ``exit`` the interpreter's exit (thread joins,
atexit handlers) after the main code returned. ``training`` is the time since the last
optimizer step: as given when the text names it (``training=900``, or one number for every stage);
by default 120 s or 20 × the median step, whichever is longer (`training_limit`).
``LORA_OTEL_FROZEN_AFTER``: seconds without a beat before a live process counts as frozen.

Standard library only, no imports at all: the training process parses these in its preamble, and
:mod:`lora_otel.analysis.stall` uses the same parser and defaults.
"""

from __future__ import annotations

from lora_otel._boot.words import duration

DEFAULT_LIMITS_S = {
    "arguments": 60.0,
    "import": 120.0,
    "cuda init": 120.0,
    "cuda probe": 120.0,
    "load model": 600.0,  # transformers' from_pretrained (a download included when not cached)
    "prepare dataset": 900.0,  # datasets' map/filter (a big tokenisation takes minutes)
    "training": 120.0,  # the floor of the step-gap limit
    "between": 120.0,  # no stage open (other than process) since the last one ended
    "exit": 120.0,  # the interpreter's exit: non-daemon thread joins, the program's atexit handlers
}
FROZEN_AFTER_S = 10.0
TRAINING_STEP_FACTOR = 20.0
GIVEN_TRAINING = "training as given"
"""In what `parse_limits` returns when the text gave the training limit itself (its value: that
limit): then that number is the limit, never the step-based one."""
STALL_AFTER_ENV = "LORA_OTEL_STALL_AFTER"
FROZEN_AFTER_ENV = "LORA_OTEL_FROZEN_AFTER"

TYPE_CHECKING = False
if TYPE_CHECKING:  # never true at runtime: no typing import
    from collections.abc import Mapping


class LimitError(ValueError):
    """A bad limit value; the message is one line."""


def parse_limits(text: str | None) -> dict[str, float]:
    """``"300"`` or ``"import=300,cuda init=60,between=60"`` → limits merged over the defaults.

    Raises:
        LimitError: not a positive number of seconds, or not ``NAME=SECONDS`` pairs.
    """
    limits = dict(DEFAULT_LIMITS_S)
    if text is None or not text.strip():
        return limits
    text = text.strip()
    try:
        every = float(text)
    except ValueError:
        every = None
    if every is not None:
        _check(every, text)
        return dict.fromkeys([*limits, "default", GIVEN_TRAINING], every)
    for part in text.split(","):
        name, sep, value = part.partition("=")
        name = name.strip()
        if not sep or not name:
            raise LimitError("stall limit %r is not NAME=SECONDS (e.g. import=300,training=900)" % part.strip())
        try:
            seconds = float(value)
        except ValueError:
            raise LimitError("stall limit for %r is not a number of seconds: %r" % (name, value.strip())) from None
        _check(seconds, part)
        limits[name] = seconds
        if name == "training":
            limits[GIVEN_TRAINING] = seconds
    return limits


def _check(seconds: float, given: str) -> None:
    if not seconds > 0 or seconds != seconds or seconds == float("inf"):
        raise LimitError("stall limit must be a positive number of seconds, got %r" % given.strip())


def parse_frozen_after(text: str | None) -> float:
    """``LORA_OTEL_FROZEN_AFTER``'s text → seconds (empty: the default). Raises `LimitError`."""
    text = (text or "").strip()
    if not text:
        return FROZEN_AFTER_S
    try:
        value = float(text)
    except ValueError:
        raise LimitError("%s=%r is not a number of seconds" % (FROZEN_AFTER_ENV, text)) from None
    if not value > 0:
        raise LimitError("%s=%r must be more than 0 seconds" % (FROZEN_AFTER_ENV, text))
    return value


def training_limit(limits: Mapping[str, float], median_step_s: float | None) -> tuple[float, str]:
    """(the training limit, why it is not the one given or the floor — "" when it is).

    Given (``training=N``, `GIVEN_TRAINING`): N, whatever the steps. Else the floor (120 s, or a
    ``default=``) or 20 × the median step when that is longer: ``20x the median step of 2 s``."""
    floor = limits.get("training") or limits.get("default") or DEFAULT_LIMITS_S["training"]
    if GIVEN_TRAINING in limits or not median_step_s:
        return floor, ""
    by_steps = TRAINING_STEP_FACTOR * median_step_s
    if by_steps <= floor:
        return floor, ""
    return by_steps, "%dx the median step of %s" % (TRAINING_STEP_FACTOR, duration(median_step_s))


def limit_for(name: str, limits: Mapping[str, float]) -> float | None:
    """The limit of a stage called ``name``: by full name, then kind (``import``), then ``default``."""
    if name in limits:
        return limits[name]
    kind = "import" if name.startswith("import ") else name
    if kind in limits:
        return limits[kind]
    return limits.get("default")
