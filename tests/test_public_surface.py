"""The public surface: the names users import stay where they import them, and nothing else is public."""

from __future__ import annotations
import __future__

import importlib
import subprocess
import textwrap
import types

import pytest
from procs import PYTHON, REPO, clean_env

import lora_otel
import lora_otel.testing


def _public_names(module: types.ModuleType) -> list[str]:
    """The names ``module`` defines for its users: not ``_``-prefixed, not a submodule, not a
    ``from __future__`` feature."""
    return sorted(
        name
        for name, value in vars(module).items()
        if not name.startswith("_") and not isinstance(value, types.ModuleType) and value is not __future__.annotations
    )


class TestPackage:
    def test_all_is_sorted(self) -> None:
        """``lora_otel.__all__`` is a short, sorted list (case-sensitive, dunders first)."""
        assert lora_otel.__all__ == sorted(lora_otel.__all__)

    def test_all_is_the_public_names(self) -> None:
        """``lora_otel.__all__`` names exactly the package's public names, plus ``__version__`` (they
        load on first use: the .pth hook imports the package in every process)."""
        assert lora_otel.__all__ == ["__version__", "mark", "progress", "stage"]
        assert all(getattr(lora_otel, name) is not None for name in lora_otel.__all__)
        assert sorted(lora_otel.__all__) == sorted(["__version__", *_public_names(lora_otel)])

    def test_api_is_callable(self) -> None:
        """``stage``, ``mark`` and ``progress`` are callables and ``__version__`` a string."""
        assert callable(lora_otel.stage) and callable(lora_otel.mark) and callable(lora_otel.progress)
        assert isinstance(lora_otel.__version__, str) and lora_otel.__version__


class TestTesting:
    def test_all_is_the_public_names(self) -> None:
        """``lora_otel.testing`` offers the journal reader and ``find_span``, and nothing else."""
        expected = ["Journal", "JournalError", "Span", "find_span", "read_journal"]
        assert lora_otel.testing.__all__ == expected
        assert _public_names(lora_otel.testing) == expected


class TestIntegrations:
    @pytest.mark.parametrize(
        ("module", "names"),
        [
            ("lora_otel.integrations", ["install", "installed"]),
            ("lora_otel.integrations.accelerate", ["install"]),
            ("lora_otel.integrations.lightning", ["LoraOtelCallback", "callback_class", "install"]),
        ],
    )
    def test_all(self, module: str, names: list[str]) -> None:
        """Each public integration module's ``__all__`` is sorted and says what it offers."""
        mod = importlib.import_module(module)
        assert mod.__all__ == names

    @pytest.mark.slow
    def test_transformers_callback(self) -> None:
        """``from lora_otel.integrations.transformers import LoraOtelCallback`` gives a TrainerCallback
        (and the module's ``__all__`` says so; importing it imports transformers)."""
        pytest.importorskip("transformers")
        self._check(
            """
            from transformers import TrainerCallback
            import lora_otel.integrations.transformers as integration
            from lora_otel.integrations.transformers import LoraOtelCallback
            assert integration.__all__ == ["LoraOtelCallback", "install"], integration.__all__
            assert issubclass(LoraOtelCallback, TrainerCallback), LoraOtelCallback.__mro__
            """
        )

    @pytest.mark.slow
    @pytest.mark.parametrize("package", ["lightning.pytorch", "pytorch_lightning"])
    def test_lightning_callback(self, package: str) -> None:
        """``from lora_otel.integrations.lightning import LoraOtelCallback`` gives a Callback of the
        Lightning package the program loaded."""
        pytest.importorskip(package)
        self._check(
            """
            import %s as pl
            from lora_otel.integrations.lightning import LoraOtelCallback
            assert issubclass(LoraOtelCallback, pl.Callback), LoraOtelCallback.__mro__
            """
            % package
        )

    @staticmethod
    def _check(code: str) -> None:
        """Run ``code`` in a fresh interpreter (the frameworks' import-time warnings stay out of
        this one, where warnings are errors)."""
        r = subprocess.run(
            [PYTHON, "-c", textwrap.dedent(code)],
            cwd=REPO,
            env=clean_env(),
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert r.returncode == 0, r.stderr
