"""The stages of a Hugging Face job that no trainer callback sees: its config parsed, its model
loaded, its dataset prepared.

Installed when the program loads the module (:mod:`lora_otel._boot.hooks`' integration finder):

- ``transformers.hf_argparser``: ``HfArgumentParser.parse_dict``, ``parse_yaml_file`` and
  ``parse_json_file`` end the ``arguments`` span when they return (LLaMA-Factory and axolotl
  parse their YAML this way, never with ``parse_args``, which the argparse hook sees);
- ``transformers.modeling_utils``: ``PreTrainedModel.from_pretrained`` → span ``load model``
  (``lora_otel.model.name``: the name or path given, redacted), the outermost call only (peft and
  the auto classes call it again inside);
- ``datasets.arrow_dataset``: ``Dataset.map`` and ``Dataset.filter`` → span ``prepare dataset``
  (``lora_otel.dataset.rows``, ``lora_otel.dataset.num_proc``, ``lora_otel.dataset.op``), the
  outermost call only: a ``map(num_proc=…)`` whose worker never returns is stuck inside it.

Their limits are `lora_otel._boot.limits.DEFAULT_LIMITS_S`'s ``load model`` and
``prepare dataset`` (``LORA_OTEL_STALL_AFTER`` sets them as any stage's). Standard library and
the framework only; nothing of the program's is changed but the wrapped methods, each called once
with its own arguments.
"""

from __future__ import annotations

import functools

from lora_otel._boot import core, stages
from lora_otel._boot.frameworks import spanned

TYPE_CHECKING = False
if TYPE_CHECKING:  # pragma: no cover - never true at runtime: no typing import in the process
    from collections.abc import Callable
    from types import ModuleType
    from typing import Any

PARSERS = ("parse_dict", "parse_yaml_file", "parse_json_file")


def install(kind: str, module: ModuleType) -> None:
    if kind == "hf_args":
        parser = getattr(module, "HfArgumentParser", None)
        for name in PARSERS:
            orig = getattr(parser, name, None) if parser is not None else None
            if orig is not None and not getattr(orig, "_lora_otel", False):
                setattr(parser, name, _ends_arguments(orig, "HfArgumentParser.%s" % name))
    elif kind == "hf_models":
        model = getattr(module, "PreTrainedModel", None)
        raw = model.__dict__.get("from_pretrained") if model is not None else None
        func = getattr(raw, "__func__", None)
        if model is not None and func is not None and not getattr(func, "_lora_otel", False):
            model.from_pretrained = classmethod(spanned(func, "load model", _model_attrs, outermost=True))
    elif kind == "datasets":
        dataset = getattr(module, "Dataset", None)
        for name in ("map", "filter"):
            orig = getattr(dataset, name, None) if dataset is not None else None
            if orig is not None and not getattr(orig, "_lora_otel", False):
                setattr(dataset, name, spanned(orig, "prepare dataset", _dataset_attrs(name), outermost=True))


_parsing = [0]  # depth of the parser calls running (parse_yaml_file calls parse_dict): the outermost names it


def _ends_arguments(orig: Callable[..., Any], how: str) -> Callable[..., Any]:
    @functools.wraps(orig)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        _parsing[0] += 1
        try:
            result = orig(*args, **kwargs)
        finally:
            _parsing[0] -= 1
        if core.active and not _parsing[0]:
            with core.fail_open("arguments"):
                stages.arguments_done(how)
        return result

    wrapper._lora_otel = True  # type: ignore[attr-defined]
    return wrapper


def _model_attrs(cls: object, *args: Any, **kwargs: Any) -> dict[str, object]:
    given = args[0] if args else kwargs.get("pretrained_model_name_or_path")
    return {
        "lora_otel.model.name": given if isinstance(given, str) else None,
        "lora_otel.model.class": getattr(cls, "__name__", None),
    }


def _dataset_attrs(op: str) -> Callable[..., dict[str, object]]:
    def attrs(dataset: object, *args: Any, **kwargs: Any) -> dict[str, object]:
        rows = getattr(dataset, "num_rows", None)
        num_proc = kwargs.get("num_proc")
        return {
            "lora_otel.dataset.op": op,
            "lora_otel.dataset.rows": rows if isinstance(rows, int) else None,
            "lora_otel.dataset.num_proc": num_proc if isinstance(num_proc, int) else None,
        }

    return attrs
