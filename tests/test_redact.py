"""Tests for lora_otel._boot.redact: secrets never reach the journal, near-misses stay readable.

The corpus below is the contract: each case is a real-looking input and the exact output.
Secrets are fake but have the real shapes.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lora_otel._boot import redact
from lora_otel._boot.redact import (
    MAX_VALUE_CHARS,
    REDACTED,
    is_secret_name,
    redact_argv,
    redact_env,
    redact_text,
    redact_value,
)

REPO_ROOT = Path(__file__).resolve().parent.parent
R = REDACTED

# Fake secrets with the real shapes.
HF = "hf_" + "AbCdEfGhIjKlMnOpQrStUvWxYz01234567"  # hf_ + 34 alnum
OPENAI = "sk-" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8S9t0U1v2W3x4"
OPENAI_PROJ = "sk-proj-" + "Zx9_Yw8-Vu7Ts6Rq5Po4Nm3Lk2Ji1Hg0FeDcBa"
ANTHROPIC = "sk-ant-api03-" + "q1W2e3R4t5Y6u7I8o9P0a1S2d3F4g5H6j7K8"
AWS_ID = "AKIAIOSFODNN7EXAMPLE"
AWS_STS_ID = "ASIAY34FZKBOKMUTVV7A"
JWT = (
    "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9"
    ".eyJzdWIiOiIxMjM0NTY3ODkwIiwibmFtZSI6IkpvaG4gRG9lIiwiaWF0IjoxNTE2MjM5MDIyfQ"
    ".SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c"
)
GHP = "ghp_" + "R2d2C3poB8bA1b2C3d4E5f6G7h8I9j0K1l2M"
GHS = "ghs_" + "16C7e42F292c6912E7710c838347Ae178B4a"
GH_PAT = "github_pat_" + "11ABCDEFG0123456789abc_" + "x" * 40 + "Y" * 19
SLACK = "xoxb-" + "123456789012-1234567890123-AbCdEfGhIjKlMnOpQrStUvWx"
GOOGLE = "AIza" + "SyA1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q"


# ------------------------------------------------------------------------------------------
# corpus
# ------------------------------------------------------------------------------------------

VALUE_CORPUS = [
    # --- secrets that must vanish, context kept
    ("hf token alone", HF, R),
    ("hf token in sentence", f"using token {HF} for download", f"using token {R} for download"),
    ("hf token after chinese", f"令牌{HF}结束", f"令牌{R}结束"),
    ("openai key", OPENAI, R),
    ("openai project key", f"key={OPENAI_PROJ};", f"key={R};"),
    ("anthropic key", f"ANTHROPIC {ANTHROPIC}", f"ANTHROPIC {R}"),
    ("aws access key id", AWS_ID, R),
    ("aws sts key id in text", f"id {AWS_STS_ID}, region us-east-1", f"id {R}, region us-east-1"),
    ("jwt", f"token: {JWT}", f"token: {R}"),
    ("jwt without signature", "eyJhbGciOiJub25lIn0.eyJzdWIiOiIxIn0.", R),
    ("github classic pat", f"git push https://{GHP}@github.com/o/r.git", f"git push https://{R}@github.com/o/r.git"),
    ("github app token", GHS, R),
    ("github fine-grained pat", GH_PAT, R),
    ("slack bot token", f"slack={SLACK}", f"slack={R}"),
    ("google api key", f"maps {GOOGLE}", f"maps {R}"),
    ("bearer header value", "Authorization: Bearer abcDEF123456789", f"Authorization: Bearer {R}"),
    ("bearer percent-encoded", "Authorization=Bearer%20abcDEF123456789", f"Authorization=Bearer%20{R}"),
    ("url password", "https://user:s3cr3t@example.com/path", f"https://{R}@example.com/path"),
    (
        "database url password",
        "postgres://trainer:hunter2@db.internal:5432/runs",
        f"postgres://{R}@db.internal:5432/runs",
    ),
    ("redis url empty user", "redis://:p4ss@localhost:6379/0", f"redis://{R}@localhost:6379/0"),
    ("url password with @", "https://u:p@ss@host/x", f"https://{R}@host/x"),
    # issue 12 item 8: URLs lose their whole user-info, the user part too
    ("s3 url user part", "s3://AKIDEXAMPLE:wJalrXUtnFEMI@bucket/key", f"s3://{R}@bucket/key"),
    (
        "otlp endpoint user-info and api_key",
        "http://alice:pw@127.0.0.1:4318/v1/traces?api_key=abc123",
        f"http://{R}@127.0.0.1:4318/v1/traces?api_key={R}",
    ),
    (
        "slack webhook url (its path is the credential)",
        "--webhook https://hooks.slack.com/services/T0000/B0000/XXXXXXXXXXXXXXXXXXXXXXXX",
        f"--webhook https://hooks.slack.com/services/{R}",
    ),
    (
        "discord webhook url",
        "https://discord.com/api/webhooks/123456/abcdefTOKENxyz?wait=true",
        f"https://discord.com/api/webhooks/{R}?wait=true",
    ),
    (
        "teams webhook url",
        "https://acme.webhook.office.com/webhookb2/0000-1111@2222/IncomingWebhook/abc/def",
        f"https://acme.webhook.office.com/webhookb2/{R}",
    ),
    ("url user name", "https://user@example.com/x", f"https://{R}@example.com/x"),
    (
        "token as url user name",
        "https://0123456789abcdef0123456789abcdef01234567@github.com/o/r",
        f"https://{R}@github.com/o/r",
    ),
    ("query token", "https://h.example/dl?token=abc123&x=1", f"https://h.example/dl?token={R}&x=1"),
    (
        "query access_token in fragment",
        "https://app/cb#access_token=zzz&state=ok",
        f"https://app/cb#access_token={R}&state=ok",
    ),
    (
        "s3 presigned url",
        "https://b.s3.amazonaws.com/k?X-Amz-Credential=AKIAX%2F2024&X-Amz-Signature=deadbeef&X-Amz-Expires=60",
        f"https://b.s3.amazonaws.com/k?X-Amz-Credential={R}&X-Amz-Signature={R}&X-Amz-Expires=60",
    ),
    (
        "azure sas sig",
        "https://acct.blob.core.windows.net/c/b?sv=2022&sig=AbC%2Bd%3D&se=2030",
        f"https://acct.blob.core.windows.net/c/b?sv=2022&sig={R}&se=2030",
    ),
    (
        "google key param",
        "https://maps.googleapis.com/api?key=k123&q=x",
        f"https://maps.googleapis.com/api?key={R}&q=x",
    ),
    ("two secrets", f"{HF} and {OPENAI}", f"{R} and {R}"),
    # --- near-misses that must stay untouched
    ("plain path", "/home/user/.cache/huggingface/hub", "/home/user/.cache/huggingface/hub"),
    ("hf repo id", "meta-llama/Llama-3-8B-Instruct", "meta-llama/Llama-3-8B-Instruct"),
    ("short hf_ word", "use_hf_transfer", "use_hf_transfer"),
    ("task- is not sk-", "task-specific-fine-tuning-run-0001", "task-specific-fine-tuning-run-0001"),
    ("sk-learn is not a key", "sk-learn-compatible-estimator-wrapper", "sk-learn-compatible-estimator-wrapper"),
    ("AKIA prefix too long", "AKIAIOSFODNN7EXAMPLEXX", "AKIAIOSFODNN7EXAMPLEXX"),
    ("ASIA the continent", "ASIA-PACIFIC region", "ASIA-PACIFIC region"),
    (
        "url without userinfo",
        "https://huggingface.co/models?search=llama&sort=downloads",
        "https://huggingface.co/models?search=llama&sort=downloads",
    ),
    ("database url no creds", "sqlite:///data/runs.db", "sqlite:///data/runs.db"),
    ("bearer in prose", "the bearer instrument", "the bearer instrument"),
    ("query tokenizer param", "http://h/x?tokenizer=gpt2&max_tokens=10", "http://h/x?tokenizer=gpt2&max_tokens=10"),
    ("eyJ base64 without dots", "eyJmb28iOiJiYXIifQ==", "eyJmb28iOiJiYXIifQ=="),
    ("chinese prompt", "一只猫坐在窗台上", "一只猫坐在窗台上"),
    ("empty", "", ""),
    ("already redacted", f"https://{R}@h/?token={R}", f"https://{R}@h/?token={R}"),
    ("url @ after the path", "https://h.example/users/@alice", "https://h.example/users/@alice"),
]

TEXT_CORPUS = [
    ("env assignment", "export HF_TOKEN=abc123", f"export HF_TOKEN={R}"),
    ("yaml pair", "password: hunter2", f"password: {R}"),
    ("dict repr", "config={'hf_token': 'abc', 'lr': 0.001}", f"config={{'hf_token': '{R}', 'lr': 0.001}}"),
    ("json pair", '{"api_key": "k-123", "model": "gpt2"}', f'{{"api_key": "{R}", "model": "gpt2"}}'),
    ("environ subscript", "os.environ['WANDB_API_KEY']='0123abcd'", f"os.environ['WANDB_API_KEY']='{R}'"),
    (
        "logged command line",
        "started: python train.py --hf_token abc --lr 1e-4",
        f"started: python train.py --hf_token {R} --lr 1e-4",
    ),
    ("logged option with =", "args: --api-key=xyz --epochs=3", f"args: --api-key={R} --epochs=3"),
    ("basic auth header", "Authorization: Basic dXNlcjpwYXNz", f"Authorization: {R}"),
    ("cookie header rest of line", "Cookie: session=abc; csrftoken=def\nnext line", f"Cookie: {R}\nnext line"),
    (
        "connection string",
        "DefaultEndpointsProtocol=https;AccountName=acct;AccountKey=Zm9vYmFy==;EndpointSuffix=core.windows.net",
        f"DefaultEndpointsProtocol=https;AccountName=acct;AccountKey={R};EndpointSuffix=core.windows.net",
    ),
    ("shape inside text", f"logged in with {HF} ok", f"logged in with {R} ok"),
    ("chinese with secret", f"提示: 一只猫 HF_TOKEN={HF}", f"提示: 一只猫 HF_TOKEN={R}"),
    # near-misses
    (
        "training log line",
        "step 100/1000 loss=1.234 lr=2e-4 tokens/s=12345 max_tokens=100",
        "step 100/1000 loss=1.234 lr=2e-4 tokens/s=12345 max_tokens=100",
    ),
    ("timestamp", "2025-01-01 12:34:56 INFO saving checkpoint", "2025-01-01 12:34:56 INFO saving checkpoint"),
    ("torch key error", "KeyError: 'lm_head.weight'", "KeyError: 'lm_head.weight'"),
    ("missing keys warning", "missing_keys: ['a.b', 'c.d']", "missing_keys: ['a.b', 'c.d']"),
    (
        "tokenizer option",
        "loading --tokenizer_name gpt2 --pad_token_id 0",
        "loading --tokenizer_name gpt2 --pad_token_id 0",
    ),
    (
        "token path is not a token",
        "HF_TOKEN_PATH=/root/.cache/huggingface/token",
        "HF_TOKEN_PATH=/root/.cache/huggingface/token",
    ),
    ("url scheme colon", "see https://example.com/a:b", "see https://example.com/a:b"),
    ("author field", "author: Jane Doe", "author: Jane Doe"),
]

ARGV_CORPUS = [
    ("space form", ["--hf-token", "abc"], ["--hf-token", R]),
    ("equals form", ["--hf_token=abc"], [f"--hf_token={R}"]),
    ("api key", ["--api-key", "xyz", "--epochs", "3"], ["--api-key", R, "--epochs", "3"]),
    ("password equals", ["--password=x"], [f"--password={R}"]),
    ("hydra key=value", ["token=abc", "lr=0.1"], [f"token={R}", "lr=0.1"]),
    ("hydra nested with spaces", ["+db.password=a b c"], [f"+db.password={R}"]),
    ("docker -e", ["-e", "HF_TOKEN=abc", "-e", "HF_HOME=/x"], ["-e", f"HF_TOKEN={R}", "-e", "HF_HOME=/x"]),
    ("go style single dash", ["-password", "pw", "-v"], ["-password", R, "-v"]),
    ("last item without value", ["train.py", "--hf_token"], ["train.py", "--hf_token"]),
    (
        "flag followed by option",
        ["--use_auth_token", "--output_dir", "out"],
        ["--use_auth_token", "--output_dir", "out"],
    ),
    ("empty secret value", ["--hf_token", ""], ["--hf_token", ""]),
    ("camelCase option", ["--hfToken", "abc"], ["--hfToken", R]),
    ("wandb key by name", ["--wandb_api_key", "0123456789abcdef0123456789abcdef01234567"], ["--wandb_api_key", R]),
    ("shape in positional", ["download", HF], ["download", R]),
    ("shape in non-secret option", ["--resume=https://u:pw@h/x"], [f"--resume=https://{R}@h/x"]),
    (
        "python -c code",
        ["-c", "import os; os.environ['HF_TOKEN']='abc'"],
        ["-c", f"import os; os.environ['HF_TOKEN']='{R}'"],
    ),
    ("chinese prompt and token", ["--prompt", "一只猫", "--hf_token", HF], ["--prompt", "一只猫", "--hf_token", R]),
    # issue 12 item 8: short options for passwords and keys, argparse abbreviations
    ("short -p", ["mysql", "-u", "root", "-p", "hunter2"], ["mysql", "-u", "root", "-p", R]),
    ("short -k", ["-k", "k3y-v4lue", "--epochs", "1"], ["-k", R, "--epochs", "1"]),
    ("short -p with =", ["-p=hunter2"], [f"-p={R}"]),
    # issue 37 (hostile trial item 4): the programs found at the other end of a pipe
    ("attached -p", ["hold.py", "-uroot", "-pS3CRETPW"], ["hold.py", "-uroot", f"-p{R}"]),
    ("attached -P", ["tool", "-PS3CRETPW"], ["tool", f"-P{R}"]),
    ("attached -p port kept", ["mysql", "-P3306", "-p/run/x"], ["mysql", "-P3306", "-p/run/x"]),
    ("short -P", ["sshpass", "-P", "S3CRETPW", "ssh"], ["sshpass", "-P", R, "ssh"]),
    ("short -P port kept", ["mysql", "-P", "3306"], ["mysql", "-P", "3306"]),
    ("redis-cli -a", ["/usr/bin/redis-cli", "-a", "S3CRETPW", "ping"], ["/usr/bin/redis-cli", "-a", R, "ping"]),
    ("-a elsewhere kept", ["ls", "-a", "dir"], ["ls", "-a", "dir"]),
    ("curl -u user:pw", ["curl", "-u", "admin:CURLPW", "x"], ["curl", "-u", f"admin:{R}", "x"]),
    ("curl --user user:pw", ["--user", "admin:CURLPW"], ["--user", f"admin:{R}"]),
    ("curl --user=user:pw", ["--user=admin:CURLPW"], [f"--user=admin:{R}"]),
    ("curl -uuser:pw", ["-uadmin:CURLPW"], [f"-uadmin:{R}"]),
    ("docker -u uid:gid kept", ["docker", "-u", "1000:1000"], ["docker", "-u", "1000:1000"]),
    ("python -u kept", ["python", "-u", "train.py"], ["python", "-u", "train.py"]),
    ("-u then an option", ["prog", "-u", "--password", "pw1"], ["prog", "-u", "--password", R]),
    ("-password go style", ["prog", "-password", "pw1"], ["prog", "-password", R]),
    ("abbreviated --tok", ["--tok", "abc"], ["--tok", R]),
    ("abbreviated --hf_tok=", ["--hf_tok=abc"], [f"--hf_tok={R}"]),
    ("abbreviated --passw", ["--passw", "pw"], ["--passw", R]),
    # near-misses
    ("keyboard layout", ["--keyboard-layout", "us"], ["--keyboard-layout", "us"]),
    ("max steps", ["--max_steps", "100"], ["--max_steps", "100"]),
    ("tokenizer name", ["--tokenizer_name", "gpt2"], ["--tokenizer_name", "gpt2"]),
    ("max tokens", ["--max_tokens", "512", "--keep_tokens", "1"], ["--max_tokens", "512", "--keep_tokens", "1"]),
    ("max token length", ["--max_token_length", "225"], ["--max_token_length", "225"]),
    (
        "special tokens",
        ["--eos_token", "</s>", "--placeholder_token", "<cat-toy>"],
        ["--eos_token", "</s>", "--placeholder_token", "<cat-toy>"],
    ),
    ("hub private repo", ["--hub_private_repo", "true"], ["--hub_private_repo", "true"]),
    ("other short options untouched", ["-v", "x", "-n", "8"], ["-v", "x", "-n", "8"]),
    ("abbreviated tokenizer option", ["--max_tok", "512"], ["--max_tok", "512"]),
    ("negative number", ["--lr", "-1e-4"], ["--lr", "-1e-4"]),
    ("double dash separator", ["--", "--hf_token"], ["--", "--hf_token"]),
    ("token path option", ["--hf_token_path", "/root/.hf/token"], ["--hf_token_path", "/root/.hf/token"]),
    ("empty argv item", ["", "x"], ["", "x"]),
]


@pytest.mark.parametrize(("label", "value", "expected"), VALUE_CORPUS, ids=[c[0] for c in VALUE_CORPUS])
def test_redact_value_corpus(label: str, value: str, expected: str) -> None:
    """redact_value replaces exactly the secret-shaped substrings and keeps everything else."""
    assert redact_value(value) == expected


@pytest.mark.parametrize(("label", "text", "expected"), TEXT_CORPUS, ids=[c[0] for c in TEXT_CORPUS])
def test_redact_text_corpus(label: str, text: str, expected: str) -> None:
    """redact_text removes secret-named pair values and secret shapes from a human line."""
    assert redact_text(text) == expected


@pytest.mark.parametrize(("label", "argv", "expected"), ARGV_CORPUS, ids=[c[0] for c in ARGV_CORPUS])
def test_redact_argv_corpus(label: str, argv: list[str], expected: list[str]) -> None:
    """redact_argv keeps option names and non-secret items, and drops secret values."""
    assert redact_argv(argv) == expected


@pytest.mark.parametrize(
    ("fn", "text"),
    [(redact_value, c[1]) for c in VALUE_CORPUS] + [(redact_text, c[1]) for c in TEXT_CORPUS],
)
def test_redaction_is_idempotent(fn, text: str) -> None:
    """Redacting an already redacted string changes nothing (no `[REDACTED]]` artefacts)."""
    once = fn(text)
    assert fn(once) == once


# ------------------------------------------------------------------------------------------
# names
# ------------------------------------------------------------------------------------------

SECRET_NAMES = [
    "HF_TOKEN",
    "HUGGING_FACE_HUB_TOKEN",
    "HUGGINGFACE_TOKEN",
    "WANDB_API_KEY",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "OPENAI_API_KEY",
    "ANTHROPIC_API_KEY",
    "OTEL_EXPORTER_OTLP_HEADERS",
    "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
    "GITHUB_TOKEN",
    "MLFLOW_TRACKING_PASSWORD",
    "PGPASSWORD",
    "MYSQL_PWD",
    "DB_PASS",
    "SECRET_KEY",
    "SECRET_KEY_BASE",
    "CLIENT_SECRET",
    "api_key",
    "apikey",
    "apiKey",
    "access_key",
    "secret_key",
    "private_key",
    "hf_token",
    "hf-token",
    "hfToken",
    "HFToken",
    "auth_token",
    "access_token",
    "use_auth_token",
    "hub_token",
    "password",
    "passwd",
    "Authorization",
    "Cookie",
    "session",
    "X-Amz-Signature",
    "sig",
    "bearer",
    "credentials",
    "GOOGLE_APPLICATION_CREDENTIALS",
    "API_KEYS",
    "key",
    "STRIPE_KEY",
    "PASSWORD2",
    "db.password",
    "--hf_token",
    "SSH_PASSPHRASE",
]

NOT_SECRET_NAMES = [
    "DATABASE_URL",
    "PATH",
    "HOME",
    "PWD",
    "OLDPWD",
    "tokenizer_name",
    "tokenizer",
    "TOKENIZERS_PARALLELISM",
    "max_tokens",
    "max_new_tokens",
    "keep_tokens",
    "num_tokens",
    "max_token_length",
    "pad_token_id",
    "eos_token",
    "bos_token",
    "pad_token",
    "placeholder_token",
    "initializer_token",
    "token_warmup_step",
    "keyboard",
    "keyboard_layout",
    "monkey",
    "KEY_PATH",
    "KEY_FILE",
    "HF_TOKEN_PATH",
    "SECRET_KEY_FILE",
    "AWS_SHARED_CREDENTIALS_FILE",
    "AWS_ACCESS_KEY_ID",
    "AWS_REGION",
    "AUTH_TYPE",
    "author",
    "sort_key",
    "caption_key",
    "image_key",
    "prng_key",
    "ignore_keys",
    "missing_keys",
    "hub_private_repo",
    "private",
    "XDG_SESSION_ID",
    "XDG_SESSION_TYPE",
    "DBUS_SESSION_BUS_ADDRESS",
    "SESSION_MANAGER",
    "SSH_AUTH_SOCK",
    "XAUTHORITY",
    "WANDB_PROJECT",
    "MASTER_ADDR",
    "CUDA_VISIBLE_DEVICES",
    "passes",
    "bypass",
    "max_steps",
    "",
    "-",
    "__",
]


@pytest.mark.parametrize("name", SECRET_NAMES)
def test_secret_names(name: str) -> None:
    """Names of credentials are recognised in env, option, camelCase and dotted spellings."""
    assert is_secret_name(name) is True


@pytest.mark.parametrize("name", NOT_SECRET_NAMES)
def test_not_secret_names(name: str) -> None:
    """Whole-word matching: tokenizer words, counts, paths to secrets and lookup keys are
    not secret names."""
    assert is_secret_name(name) is False


# ------------------------------------------------------------------------------------------
# environment
# ------------------------------------------------------------------------------------------


def test_redact_env() -> None:
    """Secret-named variables lose their value (empty stays empty); other values are
    redacted by shape only; names are kept; the input is not modified."""
    env = {
        "HF_TOKEN": HF,
        "WANDB_API_KEY": "0123456789abcdef0123456789abcdef01234567",
        "OTEL_EXPORTER_OTLP_HEADERS": "Authorization=Basic dXNlcjpwYXNz",
        "GITHUB_TOKEN": "",
        "DATABASE_URL": "postgres://trainer:hunter2@db:5432/runs",
        "PIP_INDEX_URL": f"https://__token__:{OPENAI}@pypi.example/simple",
        "HF_HOME": "/data/hf",
        "PWD": "/home/user/project",
        "HF_TOKEN_PATH": "/root/.cache/huggingface/token",
        "SOME_NOTE": f"uses {HF}",
    }
    before = dict(env)
    assert redact_env(env) == {
        "HF_TOKEN": R,
        "WANDB_API_KEY": R,
        "OTEL_EXPORTER_OTLP_HEADERS": R,
        "GITHUB_TOKEN": "",
        "DATABASE_URL": f"postgres://{R}@db:5432/runs",
        "PIP_INDEX_URL": f"https://{R}@pypi.example/simple",
        "HF_HOME": "/data/hf",
        "PWD": "/home/user/project",
        "HF_TOKEN_PATH": "/root/.cache/huggingface/token",
        "SOME_NOTE": f"uses {R}",
    }
    assert env == before


def test_redact_env_accepts_os_environ() -> None:
    """os.environ (a Mapping, not a dict) is accepted and every name comes back."""
    out = redact_env(os.environ)
    assert isinstance(out, dict)
    assert set(out) == set(os.environ)


# ------------------------------------------------------------------------------------------
# odd input: surrogates, huge, empty, wrong types
# ------------------------------------------------------------------------------------------

SURROGATE = os.fsdecode(b"\xff\xfe")  # what undecodable argv bytes look like


def test_lone_surrogates_survive_untouched() -> None:
    """Lone surrogates from non-UTF-8 argv bytes neither raise nor get mangled, and a
    secret next to them is still removed."""
    assert SURROGATE == "\udcff\udcfe"
    assert redact_value(SURROGATE) == SURROGATE
    assert redact_text(f"{SURROGATE} token={SURROGATE}") == f"{SURROGATE} token={R}"
    assert redact_argv([SURROGATE, "--hf_token", SURROGATE, f"{SURROGATE}{HF}"]) == [
        SURROGATE,
        "--hf_token",
        R,
        f"{SURROGATE}{R}",
    ]
    assert redact_env({SURROGATE: SURROGATE, "HF_TOKEN": SURROGATE}) == {SURROGATE: SURROGATE, "HF_TOKEN": R}
    assert is_secret_name(SURROGATE) is False


def test_empty_inputs() -> None:
    """Empty strings, lists and mappings come back empty."""
    assert redact_value("") == ""
    assert redact_text("") == ""
    assert redact_argv([]) == []
    assert redact_argv([""]) == [""]
    assert redact_env({}) == {}
    assert redact_env({"": ""}) == {"": ""}
    assert is_secret_name("") is False


def test_huge_value_is_truncated_with_marker() -> None:
    """A value over 4096 characters is cut, keeps its readable start, and says how much was cut."""
    value = "word " * 3000  # 15000 chars
    out = redact_value(value)
    assert out.startswith("word word ")
    kept = len(out) - len(out[out.index("\u2026[truncated ") :])
    assert kept <= MAX_VALUE_CHARS
    assert out.endswith(f"\u2026[truncated {len(value) - kept} chars]")
    assert redact_text(value) == out


def test_huge_single_word_is_dropped_whole() -> None:
    """A huge value with no word break is not split: nothing of it is kept but the marker."""
    assert redact_value("A" * 100_000) == "\u2026[truncated 100000 chars]"


def test_value_at_limit_is_not_truncated() -> None:
    """Exactly MAX_VALUE_CHARS characters is kept in full."""
    value = "a" * MAX_VALUE_CHARS
    assert redact_value(value) == value


@pytest.mark.parametrize("offset", range(MAX_VALUE_CHARS - 45, MAX_VALUE_CHARS + 3))
def test_token_crossing_the_cut_never_leaks(offset: int) -> None:
    """Wherever a token sits relative to the truncation point, no 8-character piece of it
    survives (a partial secret is still a leak)."""
    for secret, join in ((HF, " "), ("hunter2hunter2hunter2", "https://u:"), (JWT, "x ")):
        value = "x" * (offset - len(join)) + join + secret + "@host/ tail " + "y" * 100
        out = redact_value(value)
        for k in range(len(secret) - 8):
            assert secret[k : k + 8] not in out, (offset, secret, out[-80:])


def test_huge_value_is_clipped() -> None:
    """A pathological 2 MB value comes back clipped to the 4096-char head plus a marker."""
    value = "hf_hf_?a=b&#eyJ://" * 120_000
    for out in (redact_text(value), redact_value(value)):
        assert len(out) < 4096 + 64
        assert "truncated" in out


@pytest.mark.parametrize("bad", [None, 42, 3.5, b"hf_x\xff", bytearray(b"abc"), object()])
def test_wrong_types_never_raise(bad: object) -> None:
    """Non-str input never raises: bytes are decoded with surrogateescape, others str()-ed."""
    assert isinstance(redact_value(bad), str)  # type: ignore[arg-type]
    assert isinstance(redact_text(bad), str)  # type: ignore[arg-type]
    assert isinstance(is_secret_name(bad), bool)  # type: ignore[arg-type]
    assert all(isinstance(x, str) for x in redact_argv([bad, "--hf_token", bad]))  # type: ignore[list-item]
    assert isinstance(redact_env({"A": bad}), dict)  # type: ignore[dict-item]
    if bad.__hash__ is not None:
        assert isinstance(redact_env({bad: "x"}), dict)  # type: ignore[dict-item]
    assert redact_argv(None) == []  # type: ignore[arg-type]
    assert redact_env(None) == {}  # type: ignore[arg-type]


def test_bytes_with_secret_are_redacted() -> None:
    """A bytes value containing a token is decoded and redacted, not passed through."""
    assert redact_value(HF.encode() + b" \xff") == f"{R} \udcff"


def test_str_subclass_that_raises_fails_closed() -> None:
    """If a value misbehaves inside redaction, the whole value is replaced (fail closed)."""

    class Evil(str):
        def find(self, *a, **k):
            raise RuntimeError("boom")

    out = redact_value(Evil("hf_" + "a" * 40))
    assert HF not in out and "a" * 40 not in out


# ------------------------------------------------------------------------------------------
# properties
# ------------------------------------------------------------------------------------------

_CHARS = [*"=:@?&#/-_ .'\"`\n\t[]{}", "\udcff", "\udc80", "猫"]
_PIECES = ["://", "--", "hf_", "Bearer ", "token=", "password: ", "eyJ", "sk-", "AKIA", "%20", "?x=", R]
_text = st.text(st.one_of(st.characters(exclude_categories=()), st.sampled_from(_CHARS)), max_size=80)
_chunks = st.lists(st.one_of(_text, st.sampled_from(_PIECES)), max_size=8).map("".join)
_token = st.text(
    st.sampled_from("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"), min_size=34, max_size=34
).map(lambda s: "hf_" + s)


@settings(max_examples=400, deadline=None)
@given(text=_chunks)
def test_never_raises(text: str) -> None:
    """For arbitrary text (surrogates included) no redact function raises, and each returns
    the right type."""
    assert isinstance(redact_value(text), str)
    assert isinstance(redact_text(text), str)
    assert isinstance(is_secret_name(text), bool)
    out = redact_argv([text, text, "--" + text, text + "=" + text])
    assert len(out) == 4 and all(isinstance(x, str) for x in out)
    assert set(redact_env({text: text})) == {text}


@pytest.mark.slow
@settings(max_examples=400, deadline=None)
@given(before=_chunks, after=_chunks, token=_token, pad=st.sampled_from([0, 4000, 4050, 4090]))
def test_planted_hf_token_never_survives(before: str, after: str, token: str, pad: int) -> None:
    """A Hugging Face token planted anywhere in arbitrary text (even across the truncation
    point) never appears in any redact function's output."""
    text = "x" * pad + before + token + after
    assert token not in redact_value(text)
    assert token not in redact_text(text)
    assert all(token not in x for x in redact_argv([text, "--" + text, text + "=" + text, "--hf_token", text]))
    assert token not in "".join(redact_env({"NOTE": text}).values())


# ------------------------------------------------------------------------------------------
# cost at interpreter start
# ------------------------------------------------------------------------------------------

_ISOLATED_IMPORT = r"""
import sys
before = set(sys.modules)
# Stand-ins for the parent packages, so that only redact.py itself is measured (the real
# lora_otel/__init__.py is another module's business).
for name, sub in (("lora_otel", "lora_otel"), ("lora_otel._boot", "lora_otel/_boot")):
    mod = type(sys)(name)
    mod.__path__ = [sys.argv[1] + "/" + sub]
    sys.modules[name] = mod
import lora_otel._boot.redact
print("\n".join(sorted(set(sys.modules) - before)))
"""


@pytest.mark.slow
@pytest.mark.parametrize("flags", [[], ["-S"]], ids=["site", "no-site"])
def test_import_loads_nothing(flags: list[str]) -> None:
    """Importing redact.py in a fresh interpreter loads no module besides itself, its
    package stand-ins and ``__future__`` (no re, json, typing, threading, os needed)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LORA_OTEL", "PYTHON"))}
    proc = subprocess.run(
        [sys.executable, *flags, "-c", _ISOLATED_IMPORT, str(REPO_ROOT)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    loaded = set(proc.stdout.split())
    assert loaded <= {"lora_otel", "lora_otel._boot", "lora_otel._boot.redact", "__future__"}, loaded
    assert "lora_otel._boot.redact" in loaded


class TestRedactedValuesStayRedacted:
    """Issue 12 item 8: a value redacted anywhere is redacted everywhere it reappears."""

    def test_password_from_argv_in_exception_message(self) -> None:
        """``--password X`` on the command line, then ``X`` quoted in an exception message: gone."""
        redact_argv(["train.py", "--password", "hunter2sekrit"])
        assert redact_text("RuntimeError: login failed for hunter2sekrit") == f"RuntimeError: login failed for {R}"
        assert redact.scrub("login failed for 'hunter2sekrit'.") == f"login failed for '{R}'."

    @pytest.mark.parametrize(
        "argv",
        [
            ["-p", "hunter2sekrit"],
            ["-k", "hunter2sekrit"],
            ["--tok", "hunter2sekrit"],
            ["--password=hunter2sekrit"],
            ["db.password=hunter2sekrit"],
        ],
    )
    def test_every_argv_form_is_remembered(self, argv: list[str]) -> None:
        """Every form of a secret option teaches its value to `scrub`."""
        redact_argv(argv)
        assert redact.scrub("value hunter2sekrit here") == f"value {R} here"

    def test_env_and_url_values_are_remembered(self) -> None:
        """A secret variable's value and a URL's user-info reappearing in free text are redacted."""
        redact_env({"WANDB_API_KEY": "0123456789abcdef0123456789abcdef01234567"})
        redact_value("s3://AKIDEXAMPLE:wJalrXUtnFEMI@bucket/key")
        text = "wandb: key 0123456789abcdef0123456789abcdef01234567 rejected; s3 AKIDEXAMPLE:wJalrXUtnFEMI"
        assert redact.scrub(text) == f"wandb: key {R} rejected; s3 {R}"

    def test_whole_words_only(self) -> None:
        """A remembered value is not cut out of a longer word, a timestamp or a span id."""
        redact_argv(["--password", "1234", "--token", "dead"])
        text = '{"ts":1712345600,"span_id":"ab12dead34ef5678","msg":"pin 1234 dead"}'
        assert redact.scrub(text) == '{"ts":1712345600,"span_id":"ab12dead34ef5678","msg":"pin %s %s"}' % (R, R)

    def test_short_and_common_values_are_not_remembered(self) -> None:
        """Values under 4 characters and words like ``true`` would blank ordinary text: not kept."""
        redact_argv(["--hf_token", "abc", "--use_auth_token", "true", "--password", "None"])
        assert redact.remembered() == ()
        assert redact.scrub("abc is true") == "abc is true"

    def test_nothing_remembered_costs_nothing(self) -> None:
        """Without a redacted value, `scrub` returns its argument itself."""
        text = "a line " * 10
        assert redact.scrub(text) is text
