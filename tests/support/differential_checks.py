"""What a rank does in the differential suite (tests/comm/test_differential.py): one case, on torch's gloo and on
zerocomm, on the same inputs.

Every rank of a ``ForkPool`` started with :func:`init_both` holds two default groups over the pool's store: torch's
own (``torch.distributed``, backend gloo, under the prefix ``torch-<generation>/``) and zerocomm's (``zerocomm.comm``,
backend gloo, under ``zerocomm/``).  :func:`run_case` takes one case (a plain dict, see ``test_differential.py``),
builds every tensor argument in the case's layout from values that depend only on the case's seed and the rank,
and calls the collective

1. on torch's group as the case says;
2. for a layout other than contiguous, on torch's group again with contiguous tensors of the same values: the
   reference (torch's gloo refuses some layouts, e.g. ``send`` of ``x.t()``, and gets some wrong: its
   ``broadcast`` of ``x[:, ::2]`` moves the first ``numel`` elements of memory from the tensor's start);
3. on zerocomm's group with ``algorithm`` left to "auto", then with every algorithm the capability matrix says
   serves the cell.

Each call gets fresh tensors.  Its outcome is plain data: the outputs this rank holds (contiguous copies, in the
case's logical shapes), whether every output still has the strides it was made with and whether the memory around
a strided output (the other half of a ``[:, ::2]`` slice) is untouched; or the error's type, its message and
whether it is one of zerocomm's typed errors.  The parent judges (``test_differential.py``).

A torch call that raised may have left torch's group out of step (one rank refused before sending, another was
already waiting); after any torch error on any rank (the ranks agree over zerocomm's group) every rank makes torch's
group anew under a fresh prefix.
"""
from __future__ import annotations

import datetime

import torch
import torch.distributed as td

import zerocomm.comm as zc
from zerocomm.comm.algorithms import ALGORITHM_NAMES, COMPRESSED
from zerocomm.comm.capabilities import lookup

#: torch's group waits at most this long: a call that one rank refused and another entered ends with a timeout.
TORCH_TIMEOUT = datetime.timedelta(seconds=10)
#: What the case's names of collectives are in the capability matrix (its registry collectives).
REGISTRY = {"all_reduce": "all_reduce", "reduce": "reduce", "broadcast": "broadcast",
            "all_gather_into_tensor": "all_gather", "all_gather": "all_gather", "gather": "gather",
            "scatter": "scatter", "reduce_scatter_tensor": "reduce_scatter", "reduce_scatter": "reduce_scatter",
            "all_to_all_single": "all_to_all", "all_to_all": "all_to_all", "send_recv": "send/recv"}
OPS = {"sum": td.ReduceOp.SUM, "avg": td.ReduceOp.AVG, "product": td.ReduceOp.PRODUCT, "min": td.ReduceOp.MIN,
       "max": td.ReduceOp.MAX, "band": td.ReduceOp.BAND, "bor": td.ReduceOp.BOR, "bxor": td.ReduceOp.BXOR}
#: Written around a strided output (the elements its slice skips): still there after the call, or it wrote there.
SENTINEL = 7

_STATE = {}


# -- the two groups ------------------------------------------------------------------------------

def init_both(setup) -> None:
    """The pool's ``init``: zerocomm's default group and torch's, both gloo, over the pool's FileStore."""
    store = setup.store
    _STATE.update(store=store, rank=setup.rank, size=setup.world_size, generation=0)
    _torch_group()  # first: zerocomm's init then leaves torch's default group alone (else it stands for zerocomm's)
    zc.init_process_group("gloo", store=td.PrefixStore("zerocomm/", store), rank=setup.rank,
                          world_size=setup.world_size, timeout=setup.timeout)


def _torch_group() -> None:
    _STATE["generation"] += 1
    td.init_process_group("gloo", store=td.PrefixStore(f"torch-{_STATE['generation']}/", _STATE["store"]),
                          rank=_STATE["rank"], world_size=_STATE["size"], timeout=TORCH_TIMEOUT)


def _renew_torch_group() -> None:
    td.destroy_process_group()
    _torch_group()


# -- inputs and layouts ----------------------------------------------------------------------------

def values(case: dict, rank: int, index: int, shape: tuple) -> torch.Tensor:
    """Rank ``rank``'s ``index``-th input of ``case``: a contiguous tensor of ``shape`` and the case's dtype that
    depends only on (seed, rank, index).  Integers stay small (products of 3 ranks fit int8); floats are multiples
    of 1/4 in [-2, 2] when the case is ``exact`` (every sum, product, min and max of them is exact in every float
    dtype, in any order), else normal samples."""
    dtype = getattr(torch, case["dtype"])
    generator = torch.Generator().manual_seed(case["seed"] * 1000 + rank * 37 + index)
    if dtype is torch.bool:
        return torch.randint(0, 2, shape, generator=generator).bool()
    if dtype is torch.uint8:
        return torch.randint(0, 4, shape, generator=generator).to(dtype)
    if not dtype.is_floating_point and not dtype.is_complex:
        return torch.randint(-3, 4, shape, generator=generator).to(dtype)
    real = torch.float64
    if case["exact"]:
        def part():
            return torch.randint(-8, 9, shape, generator=generator).to(real) / 4
    else:
        def part():
            return torch.randn(shape, generator=generator, dtype=real)
    if dtype.is_complex:
        return torch.complex(part(), part()).to(dtype)
    return part().to(dtype)


def make(shape: tuple, layout: str, dtype: torch.dtype, fill=None) -> tuple:
    """``(tensor, base)``: a tensor of ``shape`` in ``layout`` ("contiguous"; "transposed": its dims in reverse
    memory order, as ``x.t()``; "sliced": every other element of its last dim, as ``x[..., ::2]``), holding ``fill``
    (or zeros), and the tensor whose memory it views, the elements outside the view set to ``SENTINEL``."""
    if layout == "transposed" and len(shape) >= 2:
        base = torch.zeros(tuple(reversed(shape)), dtype=dtype)
        tensor = base.permute(*reversed(range(len(shape))))
    elif layout == "sliced" and len(shape) >= 1:
        base = torch.full(shape[:-1] + (2 * shape[-1],), SENTINEL, dtype=dtype)
        tensor = base[..., ::2]
    else:
        base = tensor = torch.zeros(shape, dtype=dtype)
    if fill is not None:
        tensor.copy_(fill)
    return tensor, base


def _untouched(tensor: torch.Tensor, base: torch.Tensor) -> bool:
    """The elements of ``base`` outside ``tensor``'s view still hold ``SENTINEL``."""
    if base is tensor or base.numel() == tensor.numel():
        return True
    return bool((base[..., 1::2] == torch.tensor(SENTINEL, dtype=base.dtype)).all())


# -- one call ----------------------------------------------------------------------------------------

class _Args:
    """The tensors of one call of ``case`` on ``rank``, made in the case's layout (or contiguous)."""

    def __init__(self, case: dict, rank: int, n: int, contiguous: bool):
        self.case, self.rank, self.n = case, rank, n
        self.layout = "contiguous" if contiguous else case["layout"]
        self.dtype = getattr(torch, case["dtype"])
        self.outputs = []  # (name, tensor, base, strides made with)
        self.index = 0

    def input(self, shape: tuple) -> torch.Tensor:
        self.index += 1
        return make(shape, self.layout, self.dtype, values(self.case, self.rank, self.index, shape))[0]

    def output(self, name: str, shape: tuple, fill: bool = False) -> torch.Tensor:
        """A tensor the call writes; ``fill``: it also reads it (in place), so it holds this rank's input."""
        self.index += 1
        start = values(self.case, self.rank, self.index, shape) if fill else None
        tensor, base = make(shape, self.layout, self.dtype, start)
        self.outputs.append((name, tensor, base, tensor.stride()))
        return tensor

    def report(self) -> dict:
        return {"outputs": {name: tensor.detach().clone().contiguous() for name, tensor, _, _ in self.outputs},
                "layout_kept": all(tensor.stride() == strides and _untouched(tensor, base)
                                   for _, tensor, base, strides in self.outputs)}


def _stacked(shape: tuple, n: int) -> tuple:
    """The shape of ``n`` chunks of ``shape`` one after another along dim 0 (a 0-dim chunk: ``(n,)``)."""
    return (n,) if not shape else (n * shape[0],) + tuple(shape[1:])


def _call(mod, case: dict, rank: int, n: int, contiguous: bool, kw: dict) -> dict:
    """Make the arguments, call ``case``'s collective through ``mod`` (torch.distributed or zerocomm.comm) with
    the extra keywords ``kw``, wait for it, and report the outputs."""
    name, shape, root, async_op = case["collective"], tuple(case["shape"]), case["root"], case["async_op"]
    op = OPS[case["op"]] if case["op"] is not None else None
    a = _Args(case, rank, n, contiguous)
    work = None
    if name == "all_reduce":
        work = mod.all_reduce(a.output("tensor", shape, fill=True), op, async_op=async_op, **kw)
    elif name == "reduce":
        tensor = a.output("tensor", shape, fill=True)
        if rank != root:
            a.outputs.pop()  # only the root's result is defined (torch's gloo uses the others' as scratch)
        work = mod.reduce(tensor, root, op, async_op=async_op, **kw)
    elif name == "broadcast":
        work = mod.broadcast(a.output("tensor", shape, fill=rank == root), root, async_op=async_op, **kw)
    elif name == "all_gather_into_tensor":
        work = mod.all_gather_into_tensor(a.output("output", _stacked(shape, n)), a.input(shape), async_op=async_op,
                                          **kw)
    elif name == "all_gather":
        outputs = [a.output(f"output {r}", shape) for r in range(n)]
        work = mod.all_gather(outputs, a.input(shape), async_op=async_op, **kw)
    elif name == "gather":
        outputs = [a.output(f"output {r}", shape) for r in range(n)] if rank == root else None
        work = mod.gather(a.input(shape), outputs, root, async_op=async_op, **kw)
    elif name == "scatter":
        inputs = [a.input(shape) for _ in range(n)] if rank == root else None
        work = mod.scatter(a.output("output", shape), inputs, root, async_op=async_op, **kw)
    elif name == "reduce_scatter_tensor":
        work = mod.reduce_scatter_tensor(a.output("output", shape), a.input(_stacked(shape, n)), op,
                                         async_op=async_op, **kw)
    elif name == "reduce_scatter":
        inputs = [a.input(shape) for _ in range(n)]
        work = mod.reduce_scatter(a.output("output", shape), inputs, op, async_op=async_op, **kw)
    elif name == "all_to_all_single":
        splits = case["splits"]
        rows = tuple(shape[1:])
        if splits is None:
            work = mod.all_to_all_single(a.output("output", (n * shape[0],) + rows), a.input((n * shape[0],) + rows),
                                         async_op=async_op, **kw)
        else:
            sent = splits[rank]
            received = [splits[r][rank] for r in range(n)]
            work = mod.all_to_all_single(a.output("output", (sum(received),) + rows), a.input((sum(sent),) + rows),
                                         received, sent, async_op=async_op, **kw)
    elif name == "all_to_all":
        outputs = [a.output(f"output {r}", shape) for r in range(n)]
        work = mod.all_to_all(outputs, [a.input(shape) for _ in range(n)], async_op=async_op, **kw)
    elif name == "send_recv":
        source, destination = root, case["peer"]
        if rank == source:
            tensor = a.input(shape)
            work = mod.isend(tensor, destination) if async_op else mod.send(tensor, destination)
        elif rank == destination:
            tensor = a.output("received", shape)
            work = mod.irecv(tensor, source) if async_op else mod.recv(tensor, source)
        if not async_op:
            work = None
    else:
        raise ValueError(f"unknown collective {name!r}")
    if async_op and work is not None:
        work.wait()
    return a.report()


def _outcome(mod, case: dict, rank: int, n: int, contiguous: bool, kw: dict) -> dict:
    try:
        return {"served": True, **_call(mod, case, rank, n, contiguous, kw)}
    except Exception as error:  # judged by the parent: a refusal, or a failure
        return {"served": False, "type": type(error).__name__, "message": str(error)[:400],
                "typed": isinstance(error, zc.CommError),
                "argument": isinstance(error, (ValueError, TypeError))}


def algorithms_for(case: dict) -> list:
    """Every exact algorithm the capability matrix says serves ``case``'s cell on gloo (complex tensors travel as
    their real view: float32 for complex64)."""
    collective = REGISTRY[case["collective"]]
    if collective == "send/recv":
        return []
    dtype = getattr(torch, case["dtype"])
    if dtype.is_complex:
        dtype = torch.empty(0, dtype=dtype).real.dtype
    return [algorithm for algorithm in ALGORITHM_NAMES if algorithm not in COMPRESSED
            and lookup("gloo", "cpu", collective, algorithm, dtype, case["op"]).supported]


def run_case(case: dict) -> dict:
    """One case on this rank (see the module's note): ``{"torch", "torch_contiguous" (or None), "zerocomm":
    {algorithm or "auto": outcome}}``.  Every rank of the pool calls it with the same case."""
    rank, n = zc.get_rank(), zc.get_world_size()
    if case.get("torch_crashes"):  # torch is not called: it would end the process (the case says why)
        skipped = {"served": False, "type": "not run", "message": case["torch_crashes"], "typed": False,
                   "argument": False}
        result = {"torch": skipped, "torch_contiguous": skipped, "zerocomm": {}}
    else:
        result = {"torch": _outcome(td, case, rank, n, False, {}), "torch_contiguous": None, "zerocomm": {}}
        if _any_rank(not result["torch"]["served"]):
            _renew_torch_group()
    if case["layout"] != "contiguous" and not case.get("torch_crashes"):
        result["torch_contiguous"] = _outcome(td, case, rank, n, True, {})
        if _any_rank(not result["torch_contiguous"]["served"]):
            _renew_torch_group()
    result["zerocomm"]["auto"] = _outcome(zc, case, rank, n, False, {})
    for algorithm in algorithms_for(case):
        result["zerocomm"][algorithm] = _outcome(zc, case, rank, n, False, {"algorithm": algorithm})
    zc.barrier()  # every rank is done with the case: a rank that refused alone would hang here, named by the pool
    return result


def _any_rank(flag: bool) -> bool:
    """Whether ``flag`` holds on some rank (over zerocomm's group, which every refusal leaves usable)."""
    vote = torch.tensor([1 if flag else 0], dtype=torch.int32)
    zc.all_reduce(vote, zc.ReduceOp.MAX)
    return bool(vote.item())
