"""The layering contracts in pyproject.toml keep up with the modules on disk."""

from __future__ import annotations

from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib", reason="needs Python 3.11+ to read pyproject.toml")

ROOT = Path(__file__).resolve().parent.parent
BOOT = ROOT / "lora_otel" / "_boot"
SEAM_CONTRACT = "The reading side reaches the in-process half only through lora_otel._boot.seam"


def _contract(name: str) -> dict[str, object]:
    with open(ROOT / "pyproject.toml", "rb") as f:
        contracts = tomllib.load(f)["tool"]["importlinter"]["contracts"]
    found = [c for c in contracts if c["name"] == name]
    assert len(found) == 1, "pyproject.toml has no single import-linter contract named %r" % name
    return found[0]


def _boot_modules() -> set[str]:
    """Every module and package directly under lora_otel/_boot, as a dotted name."""
    names = {p.stem for p in BOOT.glob("*.py") if p.name != "__init__.py"}
    names |= {p.name for p in BOOT.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    return {"lora_otel._boot." + n for n in names}


def test_seam_contract_forbids_every_boot_module_but_the_seam() -> None:
    """The reading side may import lora_otel._boot.seam and nothing else of _boot: the contract
    lists every other module (or package) of lora_otel._boot on disk, so a new one is forbidden
    from the day it is added, and does not list the seam."""
    contract = _contract(SEAM_CONTRACT)
    assert contract["type"] == "forbidden"
    forbidden = contract["forbidden_modules"]
    assert isinstance(forbidden, list)
    boot_forbidden = {m for m in forbidden if m.startswith("lora_otel._boot.")}
    on_disk = _boot_modules()
    assert "lora_otel._boot.seam" in on_disk
    assert "lora_otel._boot.seam" not in boot_forbidden
    missing = sorted(on_disk - {"lora_otel._boot.seam"} - boot_forbidden)
    assert missing == [], "add to the seam contract's forbidden_modules in pyproject.toml: %s" % missing
    stale = sorted(boot_forbidden - on_disk)
    assert stale == [], "the seam contract names modules that no longer exist: %s" % stale
