"""Remove secrets from argv, the environment and human log lines before they are journaled.

This module runs inside the traced training process, at interpreter start. It imports
nothing at all at runtime (``from __future__`` is a compiler directive plus a tiny stdlib
module): no ``re``, no ``os``, no ``typing``. Every check is a plain ``str`` operation
(``find``, ``lstrip``, slicing), so a typical argv plus a 100-variable environment costs a
few hundred microseconds. No public function ever raises: on an unexpected internal error a
value is replaced by ``[REDACTED]`` as a whole (fail closed).

One module on purpose (~1,100 lines, a third of them this docstring): the name rules, value shapes
and pair rules below make one redactor, applied together to every argv item, variable and line, and
the preamble loads it at start in every traced process, where each extra file costs (~0.4 ms).

Public API
----------
``REDACTED``                       the replacement text, ``"[REDACTED]"``.
``is_secret_name(name)``           does a variable / option / key *name* denote a secret?
``redact_value(value)``            replace secret-shaped substrings inside one value.
``redact_env(env)``                a redacted copy of an environment mapping.
``redact_argv(argv)``              a redacted copy of a command line.
``redact_text(text)``              redact a free-text human line (value shapes + ``name=value``).
``scrub(text)``                    replace only the values redacted so far in this process.
``remembered()`` / ``forget()``    those values / forget them.

Redacted once, redacted everywhere
----------------------------------
Every value any function here replaces (an argv option's value, a secret variable's value, a
URL's user-info, a shape) is remembered for the life of the process (up to 64 values of 4 to
1024 characters; ``true``, ``none``... are not kept), and every later call — and ``scrub`` —
replaces it wherever it reappears as a whole word: a password given as ``--password X`` and
quoted later in ``RuntimeError("login failed for X")`` is ``[REDACTED]`` in the exit message too.
"Whole word": a value starting (ending) with a letter or digit is not matched right after
(before) another one, so ``1234`` is not cut out of a timestamp. ``lora_otel._boot.core`` scrubs
every journal record and human line this way; the exporting side learns the same values from
the traced process's command line (``lora_otel.export.otlp.learn_secrets``).

What is caught
--------------
By **name** (``is_secret_name``). The name is split into words on ``_ - . / : space`` and on
camelCase boundaries (``hfToken`` -> ``hf token``, ``HFToken`` -> ``hf token``), lower-cased,
trailing digits dropped (``PASSWORD2`` -> ``password``). It is secret when it contains one of
these whole words:

* ``token secret secrets password passwords passwd pwd pass passphrase auth authorization
  credential credentials creds cookie cookies session signature sig bearer apikey headers``
* a single word *ending* in ``token password passwd secret passphrase apikey accesskey
  secretkey privatekey authkey`` (``PGPASSWORD``, ``hftoken``);
* ``key`` — unless the word before it says it is a lookup key (``sort_key``, ``caption_key``,
  ``image_key``, ``prng_key``, ``primary_key`` ...). A lone ``key`` counts (``?key=AIza...``).
  ``keys`` (plural) counts only after ``api access secret private ssh signing ...``
  (``API_KEYS``), because ``ignore_keys`` / ``missing_keys`` are lists of dict keys;
  ``private`` alone is not secret (``--hub_private_repo``), ``private_key`` is;

and that word is not neutralised:

* **followed by a descriptor** (after skipping further secret words): ``path file dir name id
  type length size count num url uri host port user mode format enabled timeout version
  warmup column field error manager sock ...``. So ``HF_TOKEN_PATH``, ``SECRET_KEY_FILE``,
  ``AUTH_TYPE``, ``max_token_length``, ``pad_token_id``, ``XDG_SESSION_ID`` are *not* secret
  (their values still go through ``redact_value``);
* **``token`` preceded by a tokenizer word**: ``pad eos bos unk sep cls mask special
  placeholder initializer class instance trigger max min num ...`` (``--eos_token "</s>"``,
  ``--placeholder_token "<cat-toy>"``);
* the exact environment name ``PWD`` (the shell's working directory; ``DB_PWD`` and
  ``MYSQL_PWD`` are secret).

Whole words only: ``tokenizer``, ``max_tokens``, ``keep_tokens`` (``tokens`` is a count),
``keyboard``, ``monkey``, ``author``, ``passes``, ``bypass`` are not secret.

By **value shape** (``redact_value``), anywhere inside a value; the rest of the string is kept:

* Hugging Face ``hf_`` + 30 or more letters/digits;
* OpenAI / Anthropic style ``sk-`` + 20 or more ``[A-Za-z0-9_-]`` containing a digit, at a word
  start (``sk-proj-...``, ``sk-ant-...``; ``task-specific`` and ``sk-learn`` are kept);
* AWS access key ids ``AKIA`` / ``ASIA`` + exactly 16 ``[A-Z0-9]``;
* JWTs: ``eyJ...`` base64url ``.`` base64url ``.`` base64url (and more ``.`` segments, JWE);
* GitHub ``ghp_ gho_ ghs_ ghu_ ghr_`` + 30 or more, ``github_pat_`` + 22 or more; GitLab
  ``glpat-``; Slack ``xoxa- xoxb- xoxp- xoxr- xoxs-``; Google ``AIza`` + 35; npm ``npm_``;
  PyPI ``pypi-``; Replicate ``r8_``;
* ``Bearer <token>`` (any case of ``Bearer``/``bearer``/``BEARER``, space or ``%20``) when the
  token has 8 or more characters and is not just lower-case letters ("bearer instrument");
* URL user-info, whole: ``scheme://user:pass@host`` and ``scheme://token@host`` ->
  ``scheme://[REDACTED]@host`` (the user part can be a key id: ``s3://AKID:...@``);
* URL query / fragment parameters with a secret name: ``?token=abc&x=1`` ->
  ``?token=[REDACTED]&x=1`` (``access_token``, ``X-Amz-Signature``, ``sig``, ``key`` ...).

``redact_env``: a secret-named variable's value becomes ``[REDACTED]`` (an *empty* value stays
empty, so "the token is set but empty" remains visible); other values go through
``redact_value``. Variable names are kept as they are.

``redact_argv``: long options (``--x`` and Go-style ``-xx``) with a secret name keep their
name and lose their value, in both ``--hf-token abc`` and ``--hf_token=abc`` forms, and so do
the short options ``-p`` and ``-k`` (a password, a key: ``mysql -p``, ``curl``-like tools) and
names whose last word is cut short as argparse allows (``--tok``, ``--hf_tok``, ``--passw``,
``--secr``; ``--max_tok`` stays a tokenizer option); a secret
option that is the last item, or is followed by another ``--option``, is a flag and consumes
nothing. Items ``name=value`` (hydra / kohya / docker ``-e`` style, leading ``+`` / ``~``
allowed) with a secret name become ``name=[REDACTED]``. Every other item goes through
``redact_text``.

``redact_text``: ``redact_value`` plus ``NAME=value``, ``name: value``, ``"name": "value"``,
``['NAME']='value'`` and ``--name value`` pairs whose name is secret. The value is one word,
or a quoted string; after an auth scheme word (``Basic``, ``Bearer``, ``Token``...) the next
word too; for ``Cookie`` / ``Authorization`` / ``*_HEADERS`` names, the rest of the line.

Values longer than 4096 characters are cut at 4096 and marked ``…[truncated N chars]``. The
cut never splits a word: the word running into the cut is dropped whole, so no partial
secret survives.

What is NOT caught (limits)
---------------------------
* Secrets without a recognisable shape under a non-secret name: a W&B key (40 hex digits), an
  AWS *secret* access key (40 base64 chars), a random password, passed as a positional
  argument, under an unusual name (``--wandb_blob x``), or in ``DATABASE_URL`` without the
  ``user:pass@`` form. Name rules and shapes are heuristics, not a guarantee.
* Short options other than ``-p``, ``-P``, ``-k`` (and ``-a`` of ``redis-cli``): their meaning
  is program specific. ``-p``/``-P`` are redacted attached too (``-phunter2`` -> ``-p[REDACTED]``,
  so ``-print`` loses its tail: fail closed; a port or path value is kept, as ``-p 8080`` is not).
  After ``-u``/``--user`` (curl) the password of ``user:password`` is redacted, unless it is all
  digits (``docker -u 1000:1000``): a password of digits only is kept there.
* URL passwords containing an unescaped ``/ ? #`` or whitespace (RFC 3986 requires them
  percent-encoded); credentials without a scheme (``user:pass@host``) (an ``@`` inside the
  path or query is not user-info).
* A remembered value that reappears transformed (percent-encoded, split, in another case), or
  is shorter than 4 characters; values redacted after a line was written do not reach back.
* Key/value pairs inside values given to ``redact_value`` / ``redact_env``, such as
  ``AccountKey=...`` in an Azure connection string, unless the variable name itself is secret;
  ``redact_text`` does catch them.
* ``Basic <base64>`` outside an ``Authorization`` / header pair.
* Secrets split across several argv items other than ``--name value``, or assembled at runtime.
* Output may still contain lone surrogates (from undecodable argv bytes); the journal writer
  must encode with ``surrogateescape`` or ``backslashreplace``.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:  # pragma: no cover - never true at runtime: no typing import
    from collections.abc import Mapping, Sequence

__all__ = [
    "MAX_VALUE_CHARS",
    "REDACTED",
    "is_secret_name",
    "redact_argv",
    "redact_env",
    "redact_text",
    "redact_value",
    "remembered",
    "scrub",
]

REDACTED = "[REDACTED]"
MAX_VALUE_CHARS = 4096

# Every value redacted so far in this process, longest first (see ``scrub``). A list, not a set:
# ``if _known:`` is the whole cost of scrubbing while nothing secret was seen.
_known: list[str] = []
_KNOWN_MAX = 64  # values kept; later ones are still redacted where their own rules catch them
_KNOWN_MIN = 4  # shorter values would blank ordinary words and numbers
_KNOWN_LONGEST = 1024
_NOT_REMEMBERED = frozenset(("true", "false", "none", "null", "yes", "no", "off", "auto", "default"))

# --- character classes (plain strings: ``c in s`` and ``str.lstrip(s)`` are C loops) --------
_DIGITS = "0123456789"
_UPPER = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
_LOWER = "abcdefghijklmnopqrstuvwxyz"
_LETTERS = _UPPER + _LOWER
_ALNUM = _LETTERS + _DIGITS
_B64URL = _ALNUM + "_-"
_B64TOKEN = _ALNUM + "-._~+/="  # RFC 6750 b64token
_NAME_CHARS = _ALNUM + "_-."
_WS = " \t\n\r\f\v"
_QUOTES = "\"'`"
# Characters that end a run when truncating (a word may not be split by the cut).
_CUT_DELIMS = _WS + _QUOTES + ":,;&?#@<>()[]{}=|"
# End of a URL authority / query.
_URL_STOPS = _WS + _QUOTES + "<>\\"
# End of an unquoted value in free text.
_VALUE_STOPS = _WS + _QUOTES + ",;&)}]<>"
_NAME_MAX = 64

# --- name rules ---------------------------------------------------------------------------
_STRONG = frozenset(
    (
        "token",
        "secret",
        "secrets",
        "password",
        "passwords",
        "passwd",
        "pwd",
        "pass",
        "passphrase",
        "auth",
        "authorization",
        "credential",
        "credentials",
        "creds",
        "cookie",
        "cookies",
        "session",
        "signature",
        "sig",
        "bearer",
        "apikey",
        "headers",
        "accesskey",
        "secretkey",
        "privatekey",
        "authkey",
    )
)
_COMPOUND_SUFFIXES = (
    "token",
    "password",
    "passwd",
    "secret",
    "passphrase",
    "apikey",
    "accesskey",
    "secretkey",
    "privatekey",
    "authkey",
)
# Any secret word must contain one of these; a name without any is rejected at once.
_QUICK = ("tok", "secr", "pass", "pwd", "auth", "cred", "cookie", "session", "sig", "bearer", "key", "header")
# A name's last word cut short, as argparse accepts (``--tok`` for ``--token``): the whole word.
_ABBREVIATIONS = {
    "tok": "token",
    "toke": "token",
    "passw": "password",
    "passwo": "password",
    "passwor": "password",
    "secr": "secret",
    "secre": "secret",
}
# Short options that mean a password or a key in nearly every program (``mysql -p``, ``-k KEY``),
# unless their value has a shape no secret has (`_plain_short_value`) or the program is pytest.
# ``-P`` too (a password in sshpass, mysqladmin-style tools; ``mysql -P 3306``, a port, is kept by shape),
# and both attached (``-pS3CRET``). Per program: ``redis-cli -a PASSWORD`` (`_PROGRAM_SHORTS`).
_SHORT_SECRET_OPTIONS = frozenset(("p", "k", "P"))
_ATTACHED_SECRET_OPTIONS = frozenset(("p", "P"))
_PROGRAM_SHORTS = {"redis-cli": frozenset(("a",)), "keydb-cli": frozenset(("a",))}
# ``user:password`` after these (curl, wget, httpie, docker's ``-u uid:gid`` kept by shape).
_USER_OPTIONS = frozenset(("-u", "--user", "--proxy-user", "--http-user", "--auth", "-U"))
_PORT_CHARS = frozenset("0123456789.:/")
_PYTESTS = frozenset(("pytest", "py.test", "pytest-3"))
# A secret word followed by one of these describes something else (a path to the secret,
# its type, its length ...).
_NEUTRAL_AFTER = frozenset(
    (
        "path",
        "paths",
        "file",
        "files",
        "filename",
        "filepath",
        "dir",
        "directory",
        "folder",
        "name",
        "names",
        "id",
        "ids",
        "type",
        "types",
        "kind",
        "length",
        "len",
        "size",
        "count",
        "num",
        "number",
        "max",
        "min",
        "limit",
        "limits",
        "env",
        "var",
        "mode",
        "format",
        "fmt",
        "dim",
        "position",
        "pos",
        "index",
        "idx",
        "url",
        "urls",
        "uri",
        "endpoint",
        "host",
        "hostname",
        "port",
        "server",
        "domain",
        "provider",
        "method",
        "scheme",
        "enabled",
        "enable",
        "disable",
        "disabled",
        "required",
        "timeout",
        "ttl",
        "expiry",
        "expires",
        "expiration",
        "lifetime",
        "strategy",
        "backend",
        "version",
        "algorithm",
        "alg",
        "prefix",
        "suffix",
        "column",
        "col",
        "field",
        "error",
        "errors",
        "exception",
        "warmup",
        "embedding",
        "embeddings",
        "lr",
        "rate",
        "weight",
        "ratio",
        "prob",
        "dropout",
        "budget",
        "usage",
        "location",
        "source",
        "manager",
        "bus",
        "sock",
        "socket",
        "address",
        "addr",
        "class",
        "module",
        "helper",
        "handler",
        "parser",
        "level",
        "policy",
        "user",
        "username",
        "login",
    )
)
# ``token`` after one of these is a tokenizer token, not a credential.
_TOKEN_NOT_SECRET_AFTER = frozenset(
    (
        "pad",
        "eos",
        "bos",
        "unk",
        "sep",
        "cls",
        "mask",
        "special",
        "start",
        "end",
        "stop",
        "class",
        "instance",
        "trigger",
        "placeholder",
        "initializer",
        "image",
        "begin",
        "new",
        "added",
        "vocab",
        "max",
        "min",
        "num",
        "first",
        "last",
        "next",
        "prev",
        "sample",
        "output",
        "input",
        "decoder",
        "prompt",
        "text",
    )
)
# ``key`` after one of these is a lookup key (dict, column, PRNG ...).
_KEY_NOT_SECRET_AFTER = frozenset(
    (
        "sort",
        "primary",
        "foreign",
        "partition",
        "group",
        "cache",
        "dict",
        "column",
        "field",
        "image",
        "text",
        "caption",
        "label",
        "input",
        "output",
        "target",
        "prompt",
        "metric",
        "data",
        "dataset",
        "lookup",
        "index",
        "hash",
        "shard",
        "join",
        "map",
        "row",
        "sample",
        "batch",
        "json",
        "yaml",
        "record",
        "audio",
        "video",
        "mask",
        "class",
        "instance",
        "condition",
        "conditioning",
        "feature",
        "attention",
        "query",
        "value",
        "hot",
        "short",
        "model",
        "state",
        "weight",
        "weights",
        "module",
        "layer",
        "param",
        "sequence",
        "seq",
        "time",
        "split",
        "task",
        "event",
        "message",
        "unique",
        "cluster",
        "routing",
        "object",
        "bucket",
        "dedup",
        "order",
        "lock",
        "idempotency",
        "missing",
        "unexpected",
        "ignore",
        "random",
        "rng",
        "prng",
        "seed",
        "registry",
        "file",
    )
)
# ``keys`` (plural) is secret only after one of these.
_KEY_QUALIFIERS = frozenset(
    (
        "api",
        "access",
        "secret",
        "private",
        "signing",
        "sign",
        "encryption",
        "client",
        "master",
        "license",
        "account",
        "ssh",
        "gpg",
        "pgp",
        "auth",
        "service",
        "subscription",
        "deploy",
        "app",
        "admin",
        "storage",
        "shared",
        "hmac",
        "consumer",
    )
)
_STRONG_KIND = 1
_KEY_KIND = 2
_KEYS_KIND = 3
_NAME_SEPARATORS = "-. /:[]'\"+~$@\\"
# Values of these names run to the end of the line in free text.
_WHOLE_LINE_NAMES = frozenset(("cookie", "cookies", "authorization", "headers"))
_AUTH_SCHEMES = frozenset(("basic", "bearer", "token", "digest", "negotiate", "ntlm"))

# --- value shapes -------------------------------------------------------------------------
# (prefixes, allowed characters after the prefix, minimum run, exact run (0: any),
#  needs a non-alnum character before, needs a digit in the run)
_PREFIX_RULES = (
    (("hf_",), _ALNUM, 30, 0, False, False),
    (("sk-",), _B64URL, 20, 0, True, True),
    (("ghp_", "gho_", "ghs_", "ghu_", "ghr_"), _ALNUM, 30, 0, False, False),
    (("github_pat_",), _ALNUM + "_", 22, 0, False, False),
    (("glpat-",), _B64URL, 20, 0, False, False),
    (("xoxa-", "xoxb-", "xoxp-", "xoxr-", "xoxs-"), _ALNUM + "-", 10, 0, True, True),
    (("AIza",), _B64URL, 35, 0, True, False),
    (("AKIA", "ASIA"), _UPPER + _DIGITS, 16, 16, True, False),
    (("npm_",), _ALNUM, 36, 0, False, False),
    (("pypi-",), _B64URL, 50, 0, True, False),
    (("r8_",), _ALNUM, 30, 0, True, False),
)


# ==========================================================================================
# names
# ==========================================================================================


def is_secret_name(name: str) -> bool:
    """True when *name* (an environment variable, option, key or URL parameter name)
    denotes a secret. See the module docstring for the exact rules."""
    try:
        if not isinstance(name, str):
            name = _coerce(name)
        if name == "PWD":
            return False
        low = name.lower()
        for q in _QUICK:
            if q in low:
                break
        else:
            return False
        return _parts_are_secret(_split_name(name))
    except Exception:  # noqa: BLE001  # pragma: no cover - defensive: fail closed
        return True


def _split_name(name: str) -> list[str]:
    if not (name.isupper() or name.islower()):
        name = _decamel(name)
    low = name.lower()
    for sep in _NAME_SEPARATORS:
        if sep in low:
            low = low.replace(sep, "_")
    parts = []
    for p in low.split("_"):
        if p:
            parts.append(p.rstrip(_DIGITS) or p)
    if parts and parts[-1] in _ABBREVIATIONS:
        parts[-1] = _ABBREVIATIONS[parts[-1]]
    return parts


def _decamel(s: str) -> str:
    out = []
    n = len(s)
    prev = ""
    for i in range(n):
        c = s[i]
        if (
            i
            and c in _UPPER
            and (prev in _LOWER or prev in _DIGITS or (prev in _UPPER and i + 1 < n and s[i + 1] in _LOWER))
        ):
            out.append("_")
        out.append(c)
        prev = c
    return "".join(out)


def _word_kind(p: str) -> int:
    if p in _STRONG:
        return _STRONG_KIND
    if p == "key":
        return _KEY_KIND
    if p == "keys":
        return _KEYS_KIND
    if len(p) > 5 and p.endswith(_COMPOUND_SUFFIXES):
        return _STRONG_KIND
    return 0


def _parts_are_secret(parts: list[str]) -> bool:
    n = len(parts)
    for i in range(n):
        p = parts[i]
        kind = _word_kind(p)
        if not kind:
            continue
        prev = parts[i - 1] if i else ""
        if kind == _STRONG_KIND:
            if p == "token" and prev in _TOKEN_NOT_SECRET_AFTER:
                continue
        elif kind == _KEY_KIND:
            if prev in _KEY_NOT_SECRET_AFTER:
                continue
        elif prev not in _KEY_QUALIFIERS:  # keys
            continue
        j = i + 1
        while j < n and _word_kind(parts[j]):
            j += 1
        if j < n and parts[j] in _NEUTRAL_AFTER:
            continue
        return True
    return False


# ==========================================================================================
# helpers
# ==========================================================================================


def _coerce(value: object) -> str:
    if isinstance(value, str):
        return value
    if value is None:
        return ""
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", "surrogateescape")
    return str(value)


def _clip(s: str) -> tuple[str, str]:
    """Cut *s* to MAX_VALUE_CHARS without splitting a word; return (head, marker)."""
    if len(s) <= MAX_VALUE_CHARS:
        return s, ""
    head = s[:MAX_VALUE_CHARS]
    if head[-1] not in _CUT_DELIMS:
        cut = -1
        for d in _CUT_DELIMS:
            k = head.rfind(d, cut + 1)
            if k > cut:
                cut = k
        head = head[: cut + 1]
    return head, "\u2026[truncated %d chars]" % (len(s) - len(head))


def _find_any(s: str, chars: str, start: int, end: int) -> int:
    """Index of the first character of *chars* in s[start:end], or *end*."""
    best = end
    for c in chars:
        k = s.find(c, start, best)
        if k != -1:
            best = k
    return best


def _run(s: str, start: int, chars: str) -> int:
    """End index of the run of *chars* starting at *start*."""
    w = s[start:]
    return start + len(w) - len(w.lstrip(chars))


def _apply(s: str, spans: list[tuple[int, int]]) -> str:
    if not spans:
        return s
    spans.sort()
    out = []
    pos = 0
    cur_a, cur_b = spans[0]
    for a, b in spans[1:]:
        if a < cur_b:
            if b > cur_b:
                cur_b = b
            continue
        out.append(s[pos:cur_a])
        out.append(REDACTED)
        _remember(s[cur_a:cur_b])
        pos = cur_b
        cur_a, cur_b = a, b
    out.append(s[pos:cur_a])
    out.append(REDACTED)
    _remember(s[cur_a:cur_b])
    out.append(s[cur_b:])
    return "".join(out)


def _remember(value: str) -> None:
    """Keep a value just redacted, so that it is redacted wherever it reappears (``scrub``)."""
    v = value.strip(_WS + _QUOTES)
    if (
        len(v) < _KNOWN_MIN
        or len(v) > _KNOWN_LONGEST
        or REDACTED in v
        or v in _known
        or len(_known) >= _KNOWN_MAX
        or v.lower() in _NOT_REMEMBERED
    ):
        return
    _known.append(v)
    _known.sort(key=len, reverse=True)
    import sys  # built in, always loaded: costs nothing

    core = sys.modules.get("lora_otel._boot.core")
    if core is not None:  # the journal writer scrubs its records once there is something to scrub
        core.known_secrets = _known  # type: ignore[attr-defined]  # core, found in sys.modules (not imported)


def _known_spans(s: str, spans: list[tuple[int, int]]) -> None:
    """Where a remembered value reappears in *s*, as a whole word: a value that begins (ends) with
    a letter or digit must not be preceded (followed) by one, so ``1234`` is not found inside a
    timestamp and ``dead`` not inside a span id."""
    n = len(s)
    for v in _known:
        i = s.find(v)
        if i == -1:
            continue
        lead, trail = v[0] in _ALNUM, v[-1] in _ALNUM
        while i != -1:
            e = i + len(v)
            if (not lead or i == 0 or s[i - 1] not in _ALNUM) and (not trail or e == n or s[e] not in _ALNUM):
                spans.append((i, e))
                i = s.find(v, e)
            else:
                i = s.find(v, i + 1)


# ==========================================================================================
# value shapes
# ==========================================================================================


def _value_spans(s: str, spans: list[tuple[int, int]]) -> None:
    if _known:
        _known_spans(s, spans)
    for prefixes, chars, min_run, exact, boundary, need_digit in _PREFIX_RULES:
        for prefix in prefixes:
            if prefix in s:
                _scan_prefix(s, spans, prefix, chars, min_run, exact, boundary, need_digit)
    if "eyJ" in s:
        _scan_jwt(s, spans)
    if "earer" in s or "EARER" in s:
        _scan_bearer(s, spans)
    if "://" in s:
        _scan_url_userinfo(s, spans)
        if "hook" in s:
            _scan_webhook(s, spans)
    if "=" in s and ("?" in s or "#" in s):
        _scan_query(s, spans)


def _scan_prefix(
    s: str,
    spans: list[tuple[int, int]],
    prefix: str,
    chars: str,
    min_run: int,
    exact: int,
    boundary: bool,
    need_digit: bool,
) -> None:
    plen = len(prefix)
    i = s.find(prefix)
    while i != -1:
        nxt = i + 1
        if not boundary or i == 0 or s[i - 1] not in _ALNUM:
            a = i + plen
            e = _run(s, a, chars)
            run = e - a
            ok = run >= min_run
            if ok and exact:
                ok = run == exact and (e == len(s) or s[e] not in _ALNUM)
            if ok and need_digit:
                ok = False
                for d in _DIGITS:
                    if d in s[a:e]:
                        ok = True
                        break
            if ok:
                spans.append((i, e))
                nxt = e
            elif not exact:
                # A later occurrence that starts inside this run and ends inside it has a
                # shorter run with fewer digits, so it fails too; one that overlaps the end
                # of the run (``hf_hf_<token>``) must still be looked at.
                nxt = max(nxt, e - plen + 1)
        i = s.find(prefix, nxt)


def _scan_jwt(s: str, spans: list[tuple[int, int]]) -> None:
    n = len(s)
    i = s.find("eyJ")
    while i != -1:
        nxt = i + 1
        if i == 0 or s[i - 1] not in _B64URL:
            e1 = _run(s, i, _B64URL)
            nxt = max(nxt, e1)
            if e1 - i >= 10 and e1 < n and s[e1] == ".":
                e2 = _run(s, e1 + 1, _B64URL)
                if e2 - e1 - 1 >= 4 and e2 < n and s[e2] == ".":
                    e = _run(s, e2 + 1, _B64URL)
                    while e + 1 < n and s[e] == "." and s[e + 1] in _B64URL:
                        e = _run(s, e + 1, _B64URL)
                    spans.append((i, e))
                    nxt = e
        i = s.find("eyJ", nxt)


def _scan_bearer(s: str, spans: list[tuple[int, int]]) -> None:
    n = len(s)
    for word in ("Bearer", "bearer", "BEARER"):
        i = s.find(word)
        while i != -1:
            nxt = i + 6
            if i == 0 or s[i - 1] not in _LETTERS:
                j = i + 6
                while j < n:
                    if s[j] == " " or s[j] == "\t":
                        j += 1
                    elif s.startswith("%20", j):
                        j += 3
                    else:
                        break
                if j > i + 6:
                    e = _run(s, j, _B64TOKEN)
                    tok = s[j:e]
                    if len(tok) >= 8 and not (tok.isalpha() and tok.islower()):
                        spans.append((j, e))
                        nxt = e
            i = s.find(word, nxt)


def _scan_url_userinfo(s: str, spans: list[tuple[int, int]]) -> None:
    n = len(s)
    i = s.find("://")
    while i != -1:
        a = i + 3
        e = _find_any(s, "/?#" + _URL_STOPS, a, n)
        at = s.rfind("@", a, e)
        if at > a and s[a:at] != REDACTED:
            # The whole user-info: a password, and the user part too (``s3://AKID:...@``, a token
            # used as the user name).
            spans.append((a, at))
        i = s.find("://", a)


# Webhook URLs whose path is the credential (anyone holding it can post): what follows the marker.
_WEBHOOK_MARKERS = (
    "hooks.slack.com/services/",
    "hooks.slack.com/workflows/",
    "hooks.slack.com/triggers/",
    "/api/webhooks/",
    "webhook.office.com/webhookb2/",
)


def _scan_webhook(s: str, spans: list[tuple[int, int]]) -> None:
    n = len(s)
    for marker in _WEBHOOK_MARKERS:
        i = s.find(marker)
        while i != -1:
            a = i + len(marker)
            e = _find_any(s, "?#" + _URL_STOPS, a, n)
            if e - a >= 8:
                spans.append((a, e))
            i = s.find(marker, max(a, e))


def _scan_query(s: str, spans: list[tuple[int, int]]) -> None:
    n = len(s)
    for mark in "?#":
        stops = _URL_STOPS + ("#" if mark == "?" else "")
        i = s.find(mark)
        while i != -1:
            end = _find_any(s, stops, i + 1, n)
            seg = i + 1
            while seg < end:
                amp = _find_any(s, "&?", seg, end)
                eq = s.find("=", seg, amp)
                if eq > seg and eq + 1 < amp and not s.startswith(REDACTED, eq + 1) and is_secret_name(s[seg:eq]):
                    spans.append((eq + 1, amp))
                seg = amp + 1
            i = s.find(mark, max(i + 1, end))


# ==========================================================================================
# free-text pairs
# ==========================================================================================


def _pair_spans(s: str, spans: list[tuple[int, int]]) -> None:
    for sep in "=:":
        p = s.find(sep)
        while p != -1:
            nxt = _pair_at(s, p, sep, spans)
            p = s.find(sep, max(nxt, p + 1))


def _pair_at(s: str, p: int, sep: str, spans: list[tuple[int, int]]) -> int:
    n = len(s)
    if sep == ":" and s.startswith("//", p + 1):
        return p + 3
    # -- the name before the separator
    j = p
    k = 0
    while j > 0 and s[j - 1] in " \t" and k < 4:
        j -= 1
        k += 1
    if j > 0 and s[j - 1] == "]":
        j -= 1
    if j > 0 and s[j - 1] in _QUOTES:
        q = s[j - 1]
        start = s.rfind(q, max(0, j - 2 - _NAME_MAX), j - 1)
        if start == -1:
            return p + 1
        name = s[start + 1 : j - 1]
    else:
        w = s[max(0, j - _NAME_MAX) : j]
        name = w[len(w.rstrip(_NAME_CHARS)) :]
    if not name or not is_secret_name(name):
        return p + 1
    # -- the value after it
    v = p + 1
    while v < n and s[v] == "=":
        v += 1
    k = 0
    while v < n and s[v] in " \t" and k < 4:
        v += 1
        k += 1
    return _value_span_at(s, v, name, spans)


def _value_span_at(s: str, v: int, name: str, spans: list[tuple[int, int]]) -> int:
    n = len(s)
    if v >= n:
        return v
    if s.startswith(REDACTED, v):
        return v + len(REDACTED)
    c = s[v]
    if c in _QUOTES:
        e = s.find(c, v + 1)
        if e == -1:
            e = _find_any(s, "\n\r", v + 1, n)
        if e > v + 1:
            spans.append((v + 1, e))
        return e
    if c in "\n\r":
        return v
    parts = _split_name(name)
    if parts and parts[-1] in _WHOLE_LINE_NAMES:
        e = _find_any(s, "\n\r", v, n)
    else:
        e = _find_any(s, _VALUE_STOPS, v, n)
        if s[v:e].lower() in _AUTH_SCHEMES:
            w = e
            while w < n and s[w] in " \t":
                w += 1
            if w > e and w < n:
                e = _find_any(s, _VALUE_STOPS, w, n)
    if e > v:
        spans.append((v, e))
    return e


def _option_spans(s: str, spans: list[tuple[int, int]]) -> None:
    """``--secret-name value`` inside free text (a logged command line)."""
    n = len(s)
    i = s.find("--")
    while i != -1:
        nxt = i + 2
        if i == 0 or s[i - 1] in _WS or s[i - 1] in _QUOTES:
            a = i + 2
            e = _run(s, a, _NAME_CHARS)
            nxt = max(nxt, e)
            if e > a and e < n and s[e] in " \t" and s[a] in _ALNUM:
                v = e
                while v < n and s[v] in " \t":
                    v += 1
                if v < n and s[v] != "-" and is_secret_name(s[a:e]):
                    nxt = max(nxt, _value_span_at(s, v, "", spans))
        i = s.find("--", nxt)


# ==========================================================================================
# public API
# ==========================================================================================


def scrub(text: str) -> str:
    """*text* with every value redacted so far in this process replaced by ``[REDACTED]`` where it
    reappears as a whole word (a password given as ``--password X`` and then quoted in an
    exception message). Nothing else is changed; costs one truth test while nothing is known."""
    if not _known:
        return text
    try:
        spans: list[tuple[int, int]] = []
        _known_spans(text, spans)
        return _apply(text, spans) if spans else text
    except Exception:  # noqa: BLE001  # pragma: no cover - defensive: fail closed
        return REDACTED


def remembered() -> tuple[str, ...]:
    """The values :func:`scrub` replaces (every value redacted so far, up to 64, longest first)."""
    return tuple(_known)


def forget() -> None:
    """Forget the values redacted so far (tests; a process that starts over)."""
    del _known[:]


def redact_value(value: str) -> str:
    """Replace every secret-shaped substring of *value* with ``[REDACTED]``; keep the rest.
    Values over MAX_VALUE_CHARS are truncated with a ``…[truncated N chars]`` marker."""
    try:
        s, tail = _clip(_coerce(value))
        spans: list[tuple[int, int]] = []
        _value_spans(s, spans)
        return _apply(s, spans) + tail
    except Exception:  # noqa: BLE001  # pragma: no cover - defensive: fail closed
        return REDACTED


def redact_text(text: str) -> str:
    """Redact a free-text human line: value shapes plus ``name=value``, ``name: value``
    and ``--name value`` pairs whose name is secret."""
    try:
        s, tail = _clip(_coerce(text))
        spans: list[tuple[int, int]] = []
        _value_spans(s, spans)
        if "=" in s or ":" in s:
            _pair_spans(s, spans)
        if "--" in s:
            _option_spans(s, spans)
        return _apply(s, spans) + tail
    except Exception:  # noqa: BLE001  # pragma: no cover - defensive: fail closed
        return REDACTED


def redact_env(env: Mapping[str, str]) -> dict[str, str]:
    """A copy of *env*: secret-named variables get ``[REDACTED]`` (empty stays empty),
    every other value goes through :func:`redact_value`. Names are kept."""
    out: dict[str, str] = {}
    try:
        items = list(env.items())
    except Exception:  # noqa: BLE001 - fail closed
        return out
    for k, v in items:
        try:
            key = k if isinstance(k, str) else _coerce(k)
        except Exception:  # noqa: BLE001 - fail closed
            continue
        try:
            val = v if isinstance(v, str) else _coerce(v)
            if is_secret_name(key):
                out[key] = REDACTED if val else ""
                _remember(val)
            else:
                out[key] = redact_value(val)
        except Exception:  # noqa: BLE001  # pragma: no cover - defensive: fail closed
            out[key] = REDACTED
    return out


def _is_option_name(bare: str) -> bool:
    return bool(bare) and bare[0] in _LETTERS and not bare.strip(_NAME_CHARS)


def redact_argv(argv: list[str]) -> list[str]:
    """A copy of *argv* with the values of secret-named long options and ``name=value``
    items removed, and secret-shaped substrings redacted everywhere. Any iterable works."""
    out: list[str] = []
    try:
        items = list(argv)
    except Exception:  # noqa: BLE001 - fail closed
        return out
    n = len(items)
    i = 0
    pytest = _is_pytest(items)
    shorts = _SHORT_SECRET_OPTIONS.union(
        *(_PROGRAM_SHORTS.get(a.rpartition("/")[2], ()) for a in items[:2] if type(a) is str)
    )
    while i < n:
        try:
            item = _coerce(items[i])
            nxt = _coerce(items[i + 1]) if i + 1 < n else None
            if item in _USER_OPTIONS and nxt and nxt[0] != "-" and not pytest:
                out.extend((item, _user_password(nxt)))
                i += 2
                continue
            text, takes_value = _redact_arg(item, nxt, pytest, shorts)
            out.append(text)
            if takes_value:
                out.append(REDACTED if nxt else "")
                _remember(nxt or "")
                i += 1
        except Exception:  # noqa: BLE001  # pragma: no cover - defensive: fail closed
            out.append(REDACTED)
        i += 1
    return out


def _is_pytest(items: Sequence[object]) -> bool:
    """Whether argv is pytest's (``pytest ...``, ``python -m pytest ...``): its ``-p`` loads a
    plugin and its ``-k`` selects tests by expression; neither is a secret there."""
    return any(type(a) is str and a.rpartition("/")[2] in _PYTESTS for a in items[:3])


def _plain_short_value(value: str) -> bool:
    """A value of ``-p``/``-k`` shaped as no password is: a port or a port mapping (``2222``,
    ``8080:80``, ``127.0.0.1:80/tcp``), a plugin (``no:cacheprovider``, ``pytest_cov.plugin``), a
    path (``/x/y``, ``./d``, ``~/d``), or an expression with spaces (``-k "slow and not gpu"``)."""
    if not value:
        return True
    port = value[: -len(value.rpartition("/")[2]) - 1] if value.endswith(("/tcp", "/udp", "/sctp")) else value
    if port and all(c in _PORT_CHARS for c in port) and any(c.isdigit() for c in port):
        return True
    if value.startswith(("no:", "/", "./", "../", "~/")) or " " in value:
        return True
    parts = value.split(".")
    return len(parts) > 1 and all(p.isidentifier() for p in parts)


def _user_password(value: str) -> str:
    """``user:password`` -> ``user:[REDACTED]`` (the password remembered); a ``uid:gid`` (digits after
    the colon) and a value without a colon stay, through `redact_text`."""
    user, colon, password = value.partition(":")
    if not colon or not password or password.isdigit():
        return redact_text(value)
    _remember(password)
    return redact_text(user) + ":" + REDACTED


def _redact_arg(
    item: str, nxt: str | None, pytest: bool = False, shorts: frozenset[str] = _SHORT_SECRET_OPTIONS
) -> tuple[str, bool]:
    """Redact one argv item; the flag says whether it consumes *nxt* as its secret value."""
    if len(item) > 1 and item[0] == "-":
        name, eq, val = item.partition("=")
        bare = name.lstrip("-")
        dashes = len(name) - len(bare)
        if dashes == 2 and eq and name in _USER_OPTIONS and not pytest:  # --user=admin:pw
            return name + "=" + _user_password(val), False
        if dashes == 1 and len(item) > 2 and not pytest:
            if item[:2] in ("-u", "-U") and ":" in item:  # -uadmin:pw (curl)
                return item[:2] + _user_password(item[2:]), False
            if (
                item[1] in _ATTACHED_SECRET_OPTIONS
                and len(bare) > 1
                and not is_secret_name(bare)
                and not _plain_short_value(item[2:])
            ):
                # -pS3CRET (mysql): fail closed, so ``-print`` or ``-pthread`` lose their tail too
                _remember(item[2:])
                return item[:2] + REDACTED, False
        short = dashes == 1 and bare in shorts
        if short and (pytest or _plain_short_value(val if eq else nxt or "") or (not eq and nxt and nxt[0] == "-")):
            return redact_text(item), False  # `-p no:cacheprovider`, `-p 2222`, `-p -v`: no password
        # long options (--x), single-dash words of 2+ characters (-password, Go style), and the
        # short options that mean a password or a key nearly everywhere (-p, -k)
        if dashes <= 2 and _is_option_name(bare) and (dashes == 2 or len(bare) > 1 or short):
            if is_secret_name(bare) or short:
                if eq:
                    _remember(val)
                    return redact_value(name) + "=" + (REDACTED if val else ""), False
                # a value follows unless this is the last item or another --option follows
                return redact_value(item), nxt is not None and not nxt.startswith("--")
            if eq:
                return redact_value(name) + "=" + redact_text(val), False
        return redact_text(item), False
    name, eq, val = item.partition("=")
    if eq:
        bare = name.lstrip("+~")
        if _is_option_name(bare) and is_secret_name(bare):
            _remember(val)
            return redact_value(name) + "=" + (REDACTED if val else ""), False
    return redact_text(item), False
