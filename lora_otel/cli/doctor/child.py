"""The check process (``python -m lora_otel.cli.doctor --child``, started by the parent with
``LORA_OTEL=1``): it does what a real job does first, traced like one — imports the training stack,
probes and initialises CUDA, a matmul on each GPU, one LoRA step — and tells the parent where it is,
one JSON line over a pipe as each step begins and ends.

It imports nothing at module level but what every interpreter has loaded (``os``, ``sys``,
``time``) so that the journal's import spans are the
training stack's and not the doctor's own; its imports of the in-process half (the journal writer,
the preamble, the hooks) are the one place the reading side runs that half itself.
"""

from __future__ import annotations

import os
import sys
import time

TYPE_CHECKING = False
if TYPE_CHECKING:  # never true at runtime: the check process imports every module here, and not typing
    from collections.abc import Callable, Sequence
    from types import ModuleType
    from typing import Any, BinaryIO

    Emit = Callable[..., None]  # emit(ev=..., step=..., **fields): one JSON line to the parent
MATMUL_N = 1024
"""The side of the square matrices the check process multiplies on each GPU."""
PROTO_ENV = "LORA_OTEL_DOCTOR_FD"
"""The variable that names the pipe's file descriptor in the check process."""
_PROGRAM = {"__name__": "__main__"}  # import as the program: the import hook traces it
_QUIET = {"__name__": "lora_otel.cli.doctor"}  # import as lora_otel: not traced
_OWN_DIR = os.path.join("lora_otel", "cli", "doctor")


def own_frame(path: str) -> bool:
    """Whether a frame's file is one of the doctor's own modules (a stack excerpt stops there)."""
    return os.path.dirname(path).endswith(_OWN_DIR)


def _child_main(argv: list[str]) -> int:
    """The check process: parse argv by hand (argparse would be an import of its own), then the flow."""
    imports: list[str] = []
    lora = False
    cuda = True
    stacks: str | None = None
    log: str | None = None
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "--import" and i + 1 < len(argv):
            imports.append(argv[i + 1])
            i += 1
        elif a == "--stacks" and i + 1 < len(argv):
            stacks = argv[i + 1]
            i += 1
        elif a == "--output" and i + 1 < len(argv):
            log = argv[i + 1]
            i += 1
        elif a == "--lora":
            lora = True
        elif a == "--no-cuda":
            cuda = False
        i += 1
    fd_text = os.environ.pop(PROTO_ENV, "")
    fd = int(fd_text) if fd_text.isdigit() else 1
    if fd != 1:
        try:
            os.set_inheritable(fd, False)  # not into the sidecar or any subprocess
        except OSError:
            fd = 1
    from lora_otel._boot import core, jsonl

    def emit(**msg: Any) -> None:
        data = jsonl.dumps_line(msg)
        try:
            while data:
                n = os.write(fd, data)
                data = data[n:]
        except OSError:
            pass

    if core.active and core.find_open("arguments") is not None:
        import lora_otel

        lora_otel.mark("arguments parsed")  # ends the `arguments` span: nothing more to wait for
    traced = bool(core.active and core.journal_path)
    stacks_path: str | None
    if traced:
        from lora_otel._boot import preamble

        stacks_path = preamble.stacks_path(core.journal_path)
    else:
        stacks_path = stacks
        if stacks_path:
            try:  # untraced (no .pth hook): stacks on demand all the same
                faulthandler = _quiet_import("faulthandler")
                from lora_otel._boot.seam import files, stack_signal

                f = os.fdopen(files.open_append(stacks_path), "ab")  # new, or this user's; never a FIFO
                faulthandler.register(stack_signal(), file=f, all_threads=True, chain=False)
                _KEEP.append(f)
            except Exception:  # noqa: BLE001
                stacks_path = None
    emit(
        ev="hello",
        pid=os.getpid(),
        traced=traced,
        journal=core.journal_path if traced else None,
        stacks=stacks_path,
        log=log,
        python=sys.version.split()[0],
    )

    ok: dict[str, bool] = {}
    for name in imports:
        ok[name] = _child_import(emit, name)
    torch = sys.modules.get("torch") if ok.get("torch") else None
    gpu0 = False
    if torch is not None and cuda:
        gpu0 = _child_cuda(emit, torch)
    if lora and torch is not None and ok.get("peft"):
        _child_lora(emit, torch, gpu0, bool(ok.get("transformers")))
    emit(ev="done")
    return 0


_KEEP: list[BinaryIO] = []


def _quiet_import(name: str) -> ModuleType:
    """Import infrastructure as lora_otel does (untraced), not as the program."""
    __import__(name, _QUIET, None, (), 0)
    return sys.modules[name]


def _error_fields(e: BaseException) -> dict[str, Any]:
    tb = e.__traceback__
    frames: list[list[Any]] = []  # [path, line, function]: JSON has no tuples
    while tb is not None:
        code = tb.tb_frame.f_code
        path = code.co_filename
        if not path.startswith("<frozen") and not own_frame(path):
            frames.append([path, tb.tb_lineno, code.co_name])
        tb = tb.tb_next
    text = None
    try:
        traceback = _quiet_import("traceback")
        text = "".join(traceback.format_exception(type(e), e, e.__traceback__))[-8000:]
    except Exception:  # noqa: BLE001
        pass
    message = str(e)
    if len(message) > 500:
        message = message[:500] + "..."
    chained: list[str] = []  # the files of the exceptions this one was raised from (``raise ... from e``)
    cause, seen = e.__cause__ or e.__context__, 0
    while cause is not None and seen < 5:
        tb = cause.__traceback__
        while tb is not None:
            path = tb.tb_frame.f_code.co_filename
            if not path.startswith("<frozen") and path not in chained:
                chained.append(path)
            tb = tb.tb_next
        cause, seen = cause.__cause__ or cause.__context__, seen + 1
    return {
        "status": "error",
        "error": "%s: %s" % (type(e).__name__, message),
        "error_type": type(e).__name__,
        "frames": frames[-6:],
        "chained_files": chained[-20:],
        "traceback": text,
    }


def _child_import(emit: Emit, name: str) -> bool:
    step = "import " + name
    emit(ev="begin", step=step, kind="import")
    t0 = time.perf_counter()
    try:
        __import__(name, _PROGRAM, None, (), 0)  # the import hook makes this the span `import NAME`
        mod = sys.modules[name]
    except (Exception, SystemExit) as e:  # noqa: BLE001 - what the import raised is its line in the report
        fields = _error_fields(e)
        if isinstance(e, ModuleNotFoundError):
            fields["missing"] = e.name
        emit(ev="end", step=step, duration_s=time.perf_counter() - t0, **fields)
        return False
    dt = time.perf_counter() - t0
    version = getattr(mod, "__version__", None)
    if not isinstance(version, str):
        try:
            from lora_otel._boot.seam import envfacts

            version = envfacts.package_version(name.partition(".")[0])
        except Exception:  # noqa: BLE001
            version = None
    emit(ev="end", step=step, status="ok", duration_s=dt, version=version, file=getattr(mod, "__file__", None))
    return True


def _child_cuda(emit: Emit, torch: ModuleType) -> bool:
    """Probe, initialise, then a matmul on every visible GPU. True when GPU 0 works."""
    emit(ev="begin", step="cuda probe", kind="cuda")
    t0 = time.perf_counter()
    try:
        available = bool(torch.cuda.is_available())  # the `cuda probe` span
    except Exception as e:  # noqa: BLE001
        emit(ev="end", step="cuda probe", duration_s=time.perf_counter() - t0, **_error_fields(e))
        return False
    reason = None
    if not available:
        try:
            from lora_otel._boot import torch_hooks

            reason = torch_hooks._cuda_absent_reason(torch)
        except Exception:  # noqa: BLE001
            reason = None
    emit(
        ev="end",
        step="cuda probe",
        status="ok",
        available=available,
        reason=reason,
        duration_s=time.perf_counter() - t0,
    )
    if not available:
        return False
    emit(ev="begin", step="cuda init", kind="cuda")
    t0 = time.perf_counter()
    try:
        torch.cuda.init()  # the `cuda init` span
        n = torch.cuda.device_count()
        names = [str(torch.cuda.get_device_name(i)) for i in range(n)]
    except Exception as e:  # noqa: BLE001
        emit(ev="end", step="cuda init", duration_s=time.perf_counter() - t0, **_error_fields(e))
        return False
    emit(
        ev="end", step="cuda init", status="ok", device_count=n, device_names=names, duration_s=time.perf_counter() - t0
    )
    try:
        arch_list = [str(a) for a in torch.cuda.get_arch_list()]
    except Exception:  # noqa: BLE001
        arch_list = []
    ok0 = False
    for i in range(n):
        ok = _child_gpu(emit, torch, i, arch_list)
        if i == 0:
            ok0 = ok
    return ok0


def arch_supported(capability: tuple[int, int], arch_list: Sequence[str]) -> bool:
    """Whether torch's ``get_arch_list()`` has kernels for a GPU of this compute capability: a cubin
    of the same major and an equal or lower minor (``sm_80`` runs on 8.6), or PTX of an equal or
    lower capability (``compute_90``, compiled by the driver at first use)."""
    for arch in arch_list:
        kind, _, number = str(arch).partition("_")
        digits = "".join(ch for ch in number if ch.isdigit())
        if not digits or kind not in ("sm", "compute"):
            continue
        cap = (int(digits) // 10, int(digits) % 10)
        suffixed = number != digits  # sm_90a: for exactly that capability
        if kind == "sm" and (
            cap == capability or (not suffixed and cap[0] == capability[0] and cap[1] <= capability[1])
        ):
            return True
        if kind == "compute" and not suffixed and cap <= capability:
            return True
    return False


def _child_gpu(emit: Emit, torch: ModuleType, i: int, arch_list: list[str]) -> bool:
    import lora_otel

    step = "gpu %d" % i
    emit(ev="begin", step=step, kind="gpu")
    t0 = time.perf_counter()
    facts: dict[str, Any] = {"index": i}
    try:
        props = torch.cuda.get_device_properties(i)
        facts["device_name"] = str(props.name)
        facts["capability"] = "%d.%d" % (props.major, props.minor)
        facts["arch_list"] = arch_list
        facts["arch_ok"] = arch_supported((props.major, props.minor), arch_list) if arch_list else None
        free, total = torch.cuda.mem_get_info(i)
        facts["free"], facts["total"] = int(free), int(total)
        with lora_otel.stage("gpu %d matmul" % i, device=facts["device_name"]):
            g = torch.Generator().manual_seed(i)
            a = torch.randn(MATMUL_N, MATMUL_N, generator=g)
            dev = torch.device("cuda", i)
            t1 = time.perf_counter()
            x = a.to(dev)
            y = x @ x
            torch.cuda.synchronize(dev)
            back = y.cpu()
            facts["matmul_s"] = time.perf_counter() - t1
            ref = a @ a
            err = float(((back - ref).abs().max() / ref.abs().max()).item())
            finite = bool(torch.isfinite(back).all().item())
            del x, y
            torch.cuda.empty_cache()
        facts["max_rel_error"] = err
        if not finite or err > 1e-2:
            emit(
                ev="end",
                step=step,
                status="error",
                duration_s=time.perf_counter() - t0,
                error="wrong result read back: %s"
                % ("not finite" if not finite else "max relative error %.3g against the CPU" % err),
                **facts,
            )
            return False
    except Exception as e:  # noqa: BLE001
        emit(ev="end", step=step, duration_s=time.perf_counter() - t0, **{**facts, **_error_fields(e)})
        return False
    emit(ev="end", step=step, status="ok", duration_s=time.perf_counter() - t0, **facts)
    return True


def _child_lora(emit: Emit, torch: ModuleType, on_gpu: bool, with_transformers: bool) -> None:
    import lora_otel

    emit(ev="begin", step="lora", kind="lora")
    t0 = time.perf_counter()
    device = "cuda:0" if on_gpu else "cpu"
    facts: dict[str, Any] = {"device": device}
    try:
        peft = sys.modules["peft"]
        facts["peft"] = getattr(peft, "__version__", None)
        torch.manual_seed(0)
        if with_transformers:
            facts["model"] = "LlamaForCausalLM"
        else:
            facts["model"] = "MLP"
        with lora_otel.stage("lora forward+backward", model=facts["model"], device=device):
            if with_transformers:
                transformers = sys.modules["transformers"]
                config = transformers.LlamaConfig(
                    vocab_size=128,
                    hidden_size=32,
                    intermediate_size=64,
                    num_hidden_layers=1,
                    num_attention_heads=2,
                    num_key_value_heads=2,
                    max_position_embeddings=64,
                )
                model = transformers.LlamaForCausalLM(config)
                targets = ["q_proj", "v_proj"]
            else:
                nn = torch.nn
                model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 16))
                targets = ["0", "2"]
            config = peft.LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=targets)
            model = peft.get_peft_model(model, config).to(device)
            t1 = time.perf_counter()
            if with_transformers:
                ids = torch.randint(0, 128, (2, 16), device=device)
                loss = model(input_ids=ids, labels=ids).loss
            else:
                x = torch.randn(4, 16, device=device)
                loss = model(x).pow(2).mean()
            loss.backward()
            if on_gpu:
                torch.cuda.synchronize()
            facts["compute_s"] = time.perf_counter() - t1
            facts["loss"] = float(loss.item())
            lora_params = [(n, p) for n, p in model.named_parameters() if "lora_" in n]
            facts["lora_tensors"] = len(lora_params)
            facts["lora_tensors_with_grad"] = sum(
                1 for _, p in lora_params if p.grad is not None and bool(torch.isfinite(p.grad).all().item())
            )
            facts["trainable"] = sum(p.numel() for p in model.parameters() if p.requires_grad)
            facts["total"] = sum(p.numel() for p in model.parameters())
            base_grads = [n for n, p in model.named_parameters() if "lora_" not in n and p.grad is not None]
        problems = []
        if facts["loss"] != facts["loss"] or facts["loss"] in (float("inf"), float("-inf")):
            problems.append("the loss is not finite")
        if not lora_params:
            problems.append("no LoRA parameters were added")
        elif facts["lora_tensors_with_grad"] == 0:
            problems.append("no LoRA parameter got a finite gradient")
        if base_grads:
            problems.append("base weights got gradients (%s)" % ", ".join(base_grads[:3]))
        if problems:
            emit(
                ev="end",
                step="lora",
                status="error",
                error="; ".join(problems),
                duration_s=time.perf_counter() - t0,
                **facts,
            )
            return
    except Exception as e:  # noqa: BLE001
        emit(ev="end", step="lora", duration_s=time.perf_counter() - t0, **{**facts, **_error_fields(e)})
        return
    emit(ev="end", step="lora", status="ok", duration_s=time.perf_counter() - t0, **facts)
