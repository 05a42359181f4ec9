"""One GPU, world size 1: zerocomm beside its peers, every figure next to the one it is compared with.

    zerocomm-bench gpu                                  # every section, about 2 minutes on an H100/H200
    zerocomm-bench gpu --sections calls,codec --tests skip
    zerocomm-bench gpu --tests cuda-tests.xml           # summarize a pytest --junitxml run instead

Sections, each in a freshly spawned process (CUDA cannot be forked), one after the other so that none
shares the GPU with another:

``calls``     host cost per call of an 8-byte collective over NCCL at world size 1: torch's own
              ``ProcessGroupNCCL`` (``torch.distributed``) beside zerocomm's ``nccl`` backend, blocking
              and ``async_op=True`` + ``wait()``; ``--calls`` calls back to back, the device synchronized
              once at the end; µs per call.
``training``  the 109 M-parameter GPT (d_model 1024, 8 layers, 16 heads, vocabulary 8192, 16 x 256 tokens,
              AdamW): torch DDP, DDP under ``torch.autocast(bfloat16)`` and FSDP2 (fp32, and bf16 through
              ``MixedPrecisionPolicy(param_dtype=bfloat16)``) in one process, zerocomm ZeRO stages 1-3
              at fp32 and bf16 in another.  ``step ms``: ``--steps`` steps back to back after ``--warmup``,
              the device synchronized at both ends, divided by the steps.  Peers: DDP for fp32, DDP +
              autocast for bf16, and FSDP2 at the same precision; ``peak GiB``: the CUDA caching
              allocator's peak while the variant was built and trained.
``codec``     the 1-bit codec's three steps (``ErrorFeedback``: encode = worker step, server step, decode)
              on a ``--codec-mib`` float32 tensor sized for 2 ranks, against one device copy of the same
              tensor (``copy_``), timed with CUDA events over ``--codec-reps`` back-to-back calls; the
              whole-tensor torch codec (what runs without cupy) beside the cupy kernels.
``tests``     a summary of the CUDA tests: ``--tests run`` runs them (pytest on the files in
              ``CUDA_TEST_FILES``, ``-k`` ``CUDA_TEST_WORDS``, beside this package's sources), ``--tests
              FILE.xml`` summarizes a ``pytest --junitxml`` report, ``--tests skip`` leaves them out.

The targets printed beside the ratios are the project's: ZeRO-1/2 in bf16 at most 1.0x DDP + autocast,
ZeRO-3 1.1x, every bf16 stage at most 0.7x FSDP2 in bf16, fp32 at most 1.02x DDP; encode and server step
at most 2x a device copy, decode 1.5x.  Results are timings, not assertions: compare within one run.
Without a CUDA device the command says so and exits with status 1.
"""
from __future__ import annotations

import argparse
import datetime
import multiprocessing
import os
import subprocess
import sys
import tempfile
import time
import traceback
import xml.etree.ElementTree as ElementTree
from typing import Optional

DESCRIPTION = """\
One GPU, world size 1: zerocomm beside its peers, each section in a fresh process, one after another:

  calls     host time per call of an 8-byte collective over NCCL: torch's ProcessGroupNCCL beside
            zerocomm's nccl backend, blocking and async_op=True + wait() (µs per call)
  training  a 109 M-parameter GPT: torch DDP, DDP + autocast(bfloat16) and FSDP2 beside zerocomm's
            ZeRO stages 1-3, at fp32 and bf16 (step ms, peak GiB, ratios to the peers)
  codec     the 1-bit codec's encode, server step and decode beside one device copy of the tensor
  tests     a summary of the CUDA tests (run them, skip them, or read a pytest --junitxml report)

Examples:
  zerocomm-bench gpu                                  # every section, about 2 minutes on an H100/H200
  zerocomm-bench gpu --sections calls,codec --tests skip
  zerocomm-bench gpu --tests cuda-tests.xml

Timings are for comparing within one run.  Without a CUDA device it says so and exits with status 1.
"""
HELP = ("one GPU, world size 1: NCCL per call, DDP/FSDP2 against ZeRO 1-3, the 1-bit codec against a copy, "
        "the CUDA tests")

SECTIONS = ("calls", "training", "codec", "tests")
#: The test files that hold CUDA tests (relative to the package root), and the words that select them.
CUDA_TEST_FILES = ("tests/comm/test_nccl.py", "tests/comm/test_cuda_staging.py", "tests/ops/test_onebit.py",
                   "tests/ops/test_onebit_kernels.py", "tests/ops/test_reduce.py", "tests/zero/test_zero_cuda.py",
                   "tests/zero/test_zero_api_cuda.py")
CUDA_TEST_WORDS = "cuda or nccl or cupy or gpu"
#: The GPT of the measurements (about 109 M parameters).
GPT = dict(vocab=8192, d_model=1024, n_heads=16, n_layers=8, seq_len=256)
#: ``--dry-run-cpu``: a tiny model on CPU ranks over gloo, to exercise this module without a GPU.
TINY = dict(vocab=64, d_model=32, n_heads=2, n_layers=2, seq_len=16)
TARGETS = {("zero 1", "bf16"): (1.0, 0.7), ("zero 2", "bf16"): (1.0, 0.7), ("zero 3", "bf16"): (1.1, 0.7),
           ("zero 1", "fp32"): (1.02, None), ("zero 2", "fp32"): (1.02, None), ("zero 3", "fp32"): (1.02, None)}
CODEC_TARGETS = {"encode": 2.0, "server": 2.0, "decode": 1.5}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from .options import list_of

    def section(text: str) -> str:
        if text not in SECTIONS:
            raise argparse.ArgumentTypeError(f"unknown section {text!r}; expected one of {', '.join(SECTIONS)}")
        return text

    parser.add_argument("--sections", type=list_of(section, "section"), default=list(SECTIONS),
                        metavar="S[,S...]",
                        help=f"comma-separated, in this order: {','.join(SECTIONS)} (default: all)")
    parser.add_argument("--steps", type=int, default=10, metavar="N", help="measured training steps per variant (default 10)")
    parser.add_argument("--warmup", type=int, default=3, metavar="N", help="training steps before the measured ones (default 3)")
    parser.add_argument("--batch", type=int, default=16, metavar="B", help="sequences of 256 tokens per step (default 16)")
    parser.add_argument("--calls", type=int, default=2000, metavar="N", help="calls per collective and mode (default 2000)")
    parser.add_argument("--codec-mib", type=int, default=256, metavar="MIB", help="the codec's float32 tensor in MiB (default 256)")
    parser.add_argument("--codec-reps", type=int, default=20, metavar="N", help="timed back-to-back codec calls (default 20)")
    parser.add_argument("--tests", default="run", metavar="run|skip|FILE.xml",
                        help="run the CUDA tests, leave them out, or summarize a pytest --junitxml report")
    parser.add_argument("--tests-timeout", type=float, default=900.0, metavar="SECONDS", help="seconds for the test run (default 900)")
    parser.add_argument("--timeout", type=float, default=600.0, metavar="SECONDS",
                        help="seconds for each measuring process (default 600)")
    parser.add_argument("--json", metavar="PATH", help="also write every section's figures as JSON")
    parser.add_argument("--dry-run-cpu", action="store_true", help=argparse.SUPPRESS)  # tiny, CPU, gloo: a smoke run


def cuda_missing() -> Optional[str]:
    """``None`` when a CUDA device is visible, else why not (decided without creating a CUDA context)."""
    import torch

    if not torch.backends.cuda.is_built():
        return f"this torch ({torch.__version__}) is built without CUDA"
    if torch.cuda.device_count() < 1:
        return "no CUDA device is visible (CUDA_VISIBLE_DEVICES=%r)" % os.environ.get("CUDA_VISIBLE_DEVICES")
    return None


def run(args) -> int:
    from .options import UsageError

    for name in ("steps", "warmup", "batch", "calls", "codec_mib", "codec_reps"):
        if getattr(args, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if args.tests not in ("run", "skip") and not os.path.isfile(args.tests):
        raise UsageError(f"--tests must be run, skip or an existing pytest --junitxml file, got {args.tests!r}")
    if not args.dry_run_cpu and any(name != "tests" for name in args.sections):  # a test summary needs no GPU
        missing = cuda_missing()
        if missing is not None:
            print(f"zerocomm-bench gpu needs a CUDA device: {missing}. Nothing was measured.", file=sys.stderr)
            return 1
    settings = {key: value for key, value in vars(args).items() if key not in ("argv",)}
    started = time.perf_counter()
    if any(name != "tests" for name in args.sections):
        print(_machine(args), flush=True)
    results, failed = {}, []
    children = {"calls": ("calls_torch", "calls_zerocomm"), "training": ("training_torch", "training_zerocomm"),
                "codec": ("codec",)}
    for section_name in args.sections:
        if section_name == "tests":
            continue
        for child in children[section_name]:
            t0 = time.perf_counter()
            status, value = _in_child(child, settings, args.timeout)
            if status != "ok":
                failed.append(child)
                print(f"\n{child} failed:\n{value}", flush=True)
                continue
            results[child] = value
            print(f"({child}: {time.perf_counter() - t0:.0f} s)", file=sys.stderr, flush=True)
        printer = {"calls": _print_calls, "training": _print_training, "codec": _print_codec}[section_name]
        printer(results)
    if "tests" in args.sections and args.tests != "skip":
        summary = _tests(args)
        results["tests"] = summary
        if summary.get("failed") or summary.get("error"):
            failed.append("tests")
    print(f"\nzerocomm-bench gpu: {time.perf_counter() - started:.0f} s in all"
          + (f"; failed: {', '.join(failed)}" if failed else ""), flush=True)
    if args.json:
        import json

        with open(args.json, "w") as handle:
            json.dump(results, handle, indent=1, default=str)
    return 1 if failed else 0


def _machine(args) -> str:
    import torch

    if args.dry_run_cpu:
        return f"# zerocomm-bench gpu --dry-run-cpu: CPU ranks over gloo, a tiny model (no figure here means anything)"
    props = torch.cuda.get_device_properties(0)
    nccl = ".".join(map(str, torch.cuda.nccl.version())) if torch.distributed.is_nccl_available() else "none"
    try:
        import cupy
        cupy_version = cupy.__version__
    except Exception as exc:  # noqa: BLE001 - reported
        cupy_version = f"missing ({type(exc).__name__})"
    return (f"# {props.name}, {props.multi_processor_count} SMs, {props.total_memory / 2**30:.0f} GiB; torch "
            f"{torch.__version__} (CUDA {torch.version.cuda}), NCCL {nccl}, cupy {cupy_version}; "
            f"{os.cpu_count()} CPUs; load {os.getloadavg()[0]:.2f}")


# --- child processes ------------------------------------------------------------------------------------------

def _in_child(name: str, settings: dict, timeout: float) -> tuple[str, object]:
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    process = context.Process(target=_child_main, args=(name, settings, queue), daemon=True)
    process.start()
    deadline = time.monotonic() + timeout
    result = None
    while result is None:
        try:
            result = queue.get(timeout=1.0)
        except Exception:  # noqa: BLE001 - queue.Empty
            if not process.is_alive():
                result = ("err", f"the process exited with status {process.exitcode} without a result")
            elif time.monotonic() > deadline:
                process.kill()
                result = ("err", f"no result within {timeout:.0f} s (--timeout); killed")
    process.join(30)
    return result


def _child_main(name: str, settings: dict, queue) -> None:
    try:
        queue.put(("ok", globals()[f"_{name}"](argparse.Namespace(**settings))))
    except BaseException:  # noqa: BLE001 - reported by the parent
        queue.put(("err", traceback.format_exc()))


def _device(args):
    import torch

    return torch.device("cpu") if args.dry_run_cpu else torch.device("cuda", 0)


def _sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _store(folder: str):
    import torch.distributed as td

    return td.FileStore(os.path.join(folder, "store"), 1)


def _collectives(dist, device, calls: int) -> dict:
    """µs per call of each 8-byte collective through ``dist`` (``torch.distributed`` or ``zerocomm.comm``),
    blocking and async + wait."""
    import torch

    t = torch.ones(2, device=device)
    out = torch.empty(2, device=device)
    ops = {"all_reduce": lambda a: dist.all_reduce(t, async_op=a),
           "all_gather_into_tensor": lambda a: dist.all_gather_into_tensor(out, t, async_op=a),
           "reduce_scatter_tensor": lambda a: dist.reduce_scatter_tensor(out, t, async_op=a),
           "broadcast": lambda a: dist.broadcast(t, src=0, async_op=a)}
    figures = {}
    for op, call in ops.items():
        for mode in ("blocking", "async"):
            asynchronous = mode == "async"
            for _ in range(50):  # warm-up: plans, communicators, caches
                work = call(asynchronous)
                if asynchronous:
                    work.wait()
            _sync(device)
            start = time.perf_counter()
            for _ in range(calls):
                work = call(asynchronous)
                if asynchronous:
                    work.wait()
            _sync(device)
            figures[f"{op} {mode}"] = (time.perf_counter() - start) / calls * 1e6
    return figures


def _calls_torch(args) -> dict:
    import torch
    import torch.distributed as td

    device = _device(args)
    with tempfile.TemporaryDirectory() as folder:
        backend = "gloo" if args.dry_run_cpu else "nccl"
        extra = {} if args.dry_run_cpu else {"device_id": device}
        td.init_process_group(backend, store=_store(folder), rank=0, world_size=1,
                              timeout=datetime.timedelta(seconds=120), **extra)
        try:
            torch.ones(1, device=device)
            return _collectives(td, device, args.calls)
        finally:
            td.destroy_process_group()


def _calls_zerocomm(args) -> dict:
    import zerocomm.comm as dist

    device = _device(args)
    with tempfile.TemporaryDirectory() as folder:
        dist.init_process_group("gloo" if args.dry_run_cpu else "nccl", store=_store(folder), rank=0, world_size=1,
                                timeout=datetime.timedelta(seconds=120))
        try:
            return _collectives(dist, device, args.calls)
        finally:
            dist.destroy_process_group()


def _print_calls(results: dict) -> None:
    from tabulate import tabulate

    peer, mine = results.get("calls_torch"), results.get("calls_zerocomm")
    if not peer or not mine:
        return
    rows = []
    for key in peer:
        op, mode = key.rsplit(" ", 1)
        rows.append([op, mode, f"{peer[key]:.1f}", f"{mine[key]:.1f}", f"{mine[key] / peer[key]:.2f}"])
    print("\n## Per call, 8 B, NCCL at world size 1 (µs per call, back to back, host-bound)")
    print(tabulate(rows, headers=["collective", "mode", "torch ProcessGroupNCCL", "zerocomm nccl", "× torch"],
                   tablefmt="github", disable_numparse=True))


def _gpt(args):
    import torch

    from .models import LMShape, TinyLM

    torch.manual_seed(0)
    return TinyLM(LMShape(**(TINY if args.dry_run_cpu else GPT))).to(_device(args))


def _batches(model, args, count: int = 4) -> list:
    import torch

    generator = torch.Generator().manual_seed(1)
    shape = model.shape
    out = []
    for _ in range(count):
        tokens = torch.randint(0, shape.vocab, (args.batch, shape.seq_len + 1), generator=generator)
        tokens = tokens.to(_device(args))
        out.append((tokens[:, :-1], tokens[:, 1:]))
    return out


def _train(model, optimizer, batches, args, *, autocast: bool = False, synchronize=None,
           data_model=None) -> tuple[float, float]:
    """(ms per step, last loss): ``--warmup`` steps, then ``--steps`` back to back, synchronized at both ends.
    ``data_model``: the TinyLM inside a wrapper (DDP), which picks the loss."""
    import contextlib

    import torch

    from .models import loss_fn

    device = _device(args)
    context = (lambda: torch.autocast(device.type, dtype=torch.bfloat16)) if autocast else contextlib.nullcontext
    loss = None

    def step(index: int):
        x, y = batches[index % len(batches)]
        with context():
            output = model(x)
        loss = loss_fn(data_model or model, output, y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss

    for index in range(args.warmup):
        loss = step(index)
    if synchronize is not None:
        synchronize()
    _sync(device)
    start = time.perf_counter()
    for index in range(args.steps):
        loss = step(args.warmup + index)
    if synchronize is not None:
        synchronize()
    _sync(device)
    return (time.perf_counter() - start) / args.steps * 1e3, float(loss.detach())


def _peak_reset(device) -> None:
    import gc

    import torch

    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.init()  # a process that has not touched CUDA yet has no statistics to reset
        torch.cuda.reset_peak_memory_stats(_index(device))


def _peak_gib(device) -> Optional[float]:
    import torch

    return torch.cuda.max_memory_allocated(_index(device)) / 2**30 if device.type == "cuda" else None


def _index(device) -> int:
    """The CUDA device's index (torch's memory statistics refuse a bare "cuda")."""
    import torch

    return torch.cuda.current_device() if device.index is None else device.index


def _adamw(params):
    import torch

    return torch.optim.AdamW(params, lr=1e-4)


def _training_torch(args) -> dict:
    import torch
    import torch.distributed as td
    from torch.nn.parallel import DistributedDataParallel

    device = _device(args)
    figures = {}
    with tempfile.TemporaryDirectory() as folder:
        backend = "gloo" if args.dry_run_cpu else "nccl"
        extra = {} if args.dry_run_cpu else {"device_id": device}
        td.init_process_group(backend, store=_store(folder), rank=0, world_size=1,
                              timeout=datetime.timedelta(seconds=300), **extra)
        try:
            for name, precision in (("DDP", "fp32"), ("DDP + autocast", "bf16"), ("FSDP2", "fp32"),
                                    ("FSDP2", "bf16")):
                _peak_reset(device)
                model = _gpt(args)
                batches = _batches(model, args)
                if name.startswith("DDP"):
                    wrapped = DistributedDataParallel(model, device_ids=None if device.type == "cpu" else [device])
                else:
                    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

                    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16) if precision == "bf16" else \
                        MixedPrecisionPolicy()
                    for block in model.blocks:
                        fully_shard(block, mp_policy=policy)
                    wrapped = fully_shard(model, mp_policy=policy)
                optimizer = _adamw(wrapped.parameters())
                ms, loss = _train(wrapped, optimizer, batches, args, autocast=name == "DDP + autocast",
                                  data_model=model)
                figures[f"{name}|{precision}"] = {"ms": ms, "loss": loss, "peak": _peak_gib(device)}
                del model, wrapped, optimizer, batches
        finally:
            td.destroy_process_group()
    return figures


def _training_zerocomm(args) -> dict:
    import zerocomm.comm as dist
    from zerocomm.zero import ZeroConfig, initialize

    device = _device(args)
    figures = {}
    with tempfile.TemporaryDirectory() as folder:
        dist.init_process_group("gloo" if args.dry_run_cpu else "nccl", store=_store(folder), rank=0, world_size=1,
                                timeout=datetime.timedelta(seconds=300))
        try:
            for precision in ("fp32", "bf16"):
                for stage in (1, 2, 3):
                    _peak_reset(device)
                    model = _gpt(args)
                    batches = _batches(model, args)
                    model, optimizer = initialize(model, _adamw, ZeroConfig(stage=stage, precision=precision))
                    ms, loss = _train(model, optimizer, batches, args, synchronize=optimizer.synchronize)
                    figures[f"zero {stage}|{precision}"] = {"ms": ms, "loss": loss, "peak": _peak_gib(device)}
                    optimizer.remove_hooks()
                    del model, optimizer, batches
        finally:
            dist.destroy_process_group()
    return figures


def _print_training(results: dict) -> None:
    from tabulate import tabulate

    figures = {**results.get("training_torch", {}), **results.get("training_zerocomm", {})}
    if not figures:
        return
    peer_of = {"fp32": "DDP|fp32", "bf16": "DDP + autocast|bf16"}
    rows = []
    for key, value in figures.items():
        name, precision = key.split("|")
        ddp, fsdp = figures.get(peer_of[precision]), figures.get(f"FSDP2|{precision}")
        target = TARGETS.get((name, precision), (None, None))
        rows.append([name.replace("zero", "ZeRO-").replace("- ", "-"), precision, f"{value['ms']:.1f}",
                     f"{value['ms'] / ddp['ms']:.2f}" if ddp else "-",
                     f"≤ {target[0]}" if target[0] else "",
                     f"{value['ms'] / fsdp['ms']:.2f}" if fsdp else "-",
                     f"≤ {target[1]}" if target[1] else "",
                     "-" if value["peak"] is None else f"{value['peak']:.2f}", f"{value['loss']:.4f}"])
    rows.sort(key=lambda row: (row[1] != "fp32", row[0]))
    print("\n## Training step, 109 M GPT, 16 x 256 tokens, AdamW, world size 1 (DDP's peer for bf16: DDP + autocast)")
    print(tabulate(rows, headers=["variant", "precision", "step ms", "× DDP", "target", "× FSDP2", "target",
                                  "peak GiB", "last loss"], tablefmt="github", disable_numparse=True))


def _codec(args) -> dict:
    import torch

    import zerocomm.ops.onebit_kernels as kernels
    from zerocomm.ops import ErrorFeedback

    device = _device(args)
    numel = (args.codec_mib << 20) // 4 if not args.dry_run_cpu else 1 << 16
    generator = torch.Generator().manual_seed(0)
    tensor = torch.randn(numel, generator=generator).to(device)
    out = torch.empty_like(tensor)
    reps = args.codec_reps

    def timed(call) -> float:
        call()
        _sync(device)
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(reps):
                call()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / reps / 1e3
        began = time.perf_counter()
        for _ in range(reps):
            call()
        return (time.perf_counter() - began) / reps

    figures = {"numel": numel, "copy": timed(lambda: out.copy_(tensor))}
    import zerocomm.ops.onebit as onebit
    original = onebit.codec_for
    for variant in ("fused", "torch"):
        if variant == "torch":
            onebit.codec_for = lambda *key: kernels._TorchCodec(*key)
        try:
            state = ErrorFeedback(variant)
            codec = state.worker_step(tensor, 2, 0)
            codec.recv.copy_(codec.send)  # this rank's row twice: the server's work does not depend on the bits
            state.server_step()
            codec.gathered.copy_(codec.send)
            figures[variant] = {"codec": type(codec).__name__,
                                "encode": timed(lambda: state.worker_step(tensor, 2, 0)),
                                "server": timed(state.server_step),
                                "decode": timed(lambda: codec.decode(out))}
        finally:
            onebit.codec_for = original
        del state, codec
    figures["fused"]["cupy"] = __import__("zerocomm.ops.onebit_cuda", fromlist=["x"]).cupy_available() or "imports"
    return figures


def _print_codec(results: dict) -> None:
    from tabulate import tabulate

    figures = results.get("codec")
    if not figures:
        return
    copy, numel = figures["copy"], figures["numel"]
    size = numel * 4
    rows = [["copy_", "device copy", f"{copy * 1e6:.1f}", f"{size / copy / 1e9:.0f}", "1.00", ""]]
    for variant in ("fused", "torch"):
        for step in ("encode", "server", "decode"):
            seconds = figures[variant][step]
            rows.append([step, figures[variant]["codec"], f"{seconds * 1e6:.1f}", f"{size / seconds / 1e9:.0f}",
                         f"{seconds / copy:.2f}", f"≤ {CODEC_TARGETS[step]}" if variant == "fused" else ""])
    print(f"\n## 1-bit codec, {size / 2**20:.0f} MiB float32 sized for 2 ranks (cupy: {figures['fused']['cupy']}); "
          "µs per call (CUDA events, back to back), GB/s of float32 input")
    print(tabulate(rows, headers=["step", "codec", "µs", "GB/s", "× copy", "target"], tablefmt="github",
                   disable_numparse=True))


# --- the CUDA tests --------------------------------------------------------------------------------------------

def _package_root() -> str:
    import zerocomm

    return os.path.dirname(os.path.abspath(zerocomm.__file__))


def _tests(args) -> dict:
    if args.tests == "run":
        root = _package_root()
        files = [f for f in CUDA_TEST_FILES if os.path.isfile(os.path.join(root, f))]
        if not files:
            print(f"\n## CUDA tests: none found under {root} (an installed package carries no tests)")
            return {"error": "no test files"}
        report = os.path.join(tempfile.mkdtemp(prefix="zerocomm-gpu-tests-"), "cuda-tests.xml")
        command = [sys.executable, "-m", "pytest", *files, "-q", "-p", "no:cacheprovider", "-k", CUDA_TEST_WORDS,
                   f"--junitxml={report}"]
        print(f"\n## CUDA tests: {' '.join(command[1:])}", flush=True)
        began = time.perf_counter()
        try:
            done = subprocess.run(command, cwd=root, capture_output=True, text=True, timeout=args.tests_timeout)
        except subprocess.TimeoutExpired:
            print(f"the tests ran past --tests-timeout {args.tests_timeout:.0f} s and were stopped")
            return {"error": "timeout"}
        print(f"pytest exit status {done.returncode} after {time.perf_counter() - began:.0f} s")
        if not os.path.isfile(report):
            print(done.stdout[-4000:] + done.stderr[-4000:])
            return {"error": f"pytest wrote no report (exit status {done.returncode})"}
    else:
        report = args.tests
        print(f"\n## CUDA tests: the report {report}")
    summary = summarize_junit(report)
    print(format_summary(summary))
    return summary


def summarize_junit(path: str) -> dict:
    """Counts per test file and the failures' and skips' messages of a ``pytest --junitxml`` report."""
    tree = ElementTree.parse(path)
    files: dict = {}
    failures, skips = [], {}
    for case in tree.iter("testcase"):
        # the module (a test class's methods: module.Class); a module skipped at collection is named in "name"
        where = case.get("classname") or case.get("name") or "?"
        counts = files.setdefault(where, {"passed": 0, "failed": 0, "skipped": 0})
        outcome = "passed"
        for child in case:
            if child.tag in ("failure", "error"):
                outcome = "failed"
                message = (child.get("message") or child.text or "").strip().splitlines()
                failures.append(f"{where}::{case.get('name')}: {message[0][:300] if message else child.tag}")
            elif child.tag == "skipped":
                outcome = "skipped"
                reason = (child.get("message") or "").strip()[:200]
                skips[reason] = skips.get(reason, 0) + 1
        counts[outcome] += 1
    totals = {k: sum(c[k] for c in files.values()) for k in ("passed", "failed", "skipped")}
    return {**totals, "files": files, "failures": failures, "skips": skips}


def format_summary(summary: dict) -> str:
    from tabulate import tabulate

    rows = [[name, c["passed"], c["failed"], c["skipped"]] for name, c in sorted(summary["files"].items())]
    rows.append(["all", summary["passed"], summary["failed"], summary["skipped"]])
    lines = [tabulate(rows, headers=["module", "passed", "failed", "skipped"], tablefmt="github")]
    lines += [f"FAILED {line}" for line in summary["failures"]]
    lines += [f"skipped {count}: {reason}" for reason, count in summary["skips"].items()]
    return "\n".join(lines)
