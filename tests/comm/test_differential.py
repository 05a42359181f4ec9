"""torch's gloo beside zerocomm on the same inputs: every call torch serves, zerocomm serves, with equal results.

hypothesis draws cases over every collective and list form and point-to-point (``send``/``recv`` and
``isend``/``irecv``), 11 dtypes (zerocomm's nine, and int16 and complex64), every reduce op, the shape classes
0-dim, empty, odd sizes and large (10-40K elements), the layouts contiguous, transposed (``x.t()``) and sliced
(``x[:, ::2]``), every root and pair, uneven ``all_to_all_single`` splits, blocking and ``async_op``.  Each case runs
on torch's own gloo group and on zerocomm's, in the same forked ranks (support/differential_checks.py), with
``algorithm`` left to "auto" and then with every algorithm the capability matrix says serves the cell.  Tensors
whose elements share memory (``expand``) are left out: torch's gloo reads past their storage (and the process
aborts); zerocomm refuses them (tests/comm/test_errors.py).  A 0-dim ``reduce_scatter_tensor`` runs on zerocomm
alone: torch's gloo segfaults on it.  Besides hypothesis's draw, every run includes ``explicit_cases``: bool with
every op in the reducing forms, and a strided call of every list form and of point-to-point.

A call of zerocomm's is judged against torch's result on contiguous tensors of the same values (torch's gloo
refuses some strided layouts, e.g. ``send`` of ``x.t()``, and gets some wrong: its ``broadcast`` of ``x[:, ::2]``
moves the first ``numel`` elements of memory from the tensor's start; such cases are counted apart), or for a
contiguous case against torch's result as it is:

* **agree**: served, every output equal to the reference (floats within the reduction-order bound below), every
  output still in the caller's tensor with its strides, and the memory around a sliced output untouched; or refused
  where torch refuses too;
* **refused**: zerocomm refused, on every rank, with one of its typed errors (``CommError``) naming the cell (the
  rank, the collective, and the dtype or the op), where torch refuses too (counted in agree as well);
* **wrong**: anything else: a refusal of what torch serves (with "auto", or with an algorithm the matrix lists for
  the cell), a different result, a layout not kept, an untyped error, a refusal on some ranks only;
* **beyond**: served where torch refuses both layouts (no reference): every algorithm must then give the same
  result as "auto".

[Note: the float tolerance]  Inputs are either multiples of 1/4 in [-2, 2] (every sum, product, min and max of 3
of them is exact in every float dtype, in any order: compared exactly, AVG within one rounding) or normal samples.
For those, two reduction orders of n terms differ by at most (n - 1) roundings of a partial result on each side,
each at most eps/2 of a partial sum bounded by sum |x_i| <= 4.5 n: ``|a - b| <= 2 n eps (|b| + 4.5 n)`` covers it.

The summary line (cases, calls, agree, refused, wrong, beyond, and the cases where torch's own strided result
differed from its contiguous one) is printed per world size at the end of the session; ``-s`` also lists those
cases and every distinct refusal met.
The examples are a fixed, derandomized draw (``EXAMPLES`` per world size), so CI runs the same cases every time.
"""
from __future__ import annotations

import collections

import pytest
import torch
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st

from support import differential_checks as checks
from support.harness import ForkPool
from support.worlds import STANDIN

pytestmark = pytest.mark.skipif(STANDIN, reason="compares torch.distributed with zerocomm: no stand-in")

EXAMPLES = 400
"""Drawn cases per world size (about 0.05 s each on 2 cores: some 45 s for both world sizes, all told)."""
RUN_TIMEOUT_S = 60.0

COLLECTIVES = tuple(checks.REGISTRY)
REDUCING = ("all_reduce", "reduce", "reduce_scatter_tensor", "reduce_scatter")
DTYPES = ("float32", "float64", "float16", "bfloat16", "int8", "int32", "int64", "uint8", "bool", "int16",
          "complex64")
OPS = tuple(checks.OPS)
LAYOUTS = ("contiguous", "transposed", "sliced")
#: Calls of 0-dim tensors that torch's gloo does not survive (the process dies from SIGSEGV), by collective: such
#: a case runs on zerocomm alone, judged as "beyond" (every algorithm gives what "auto" gives).
TORCH_CRASHES = {"reduce_scatter_tensor": "torch's gloo segfaults on a 0-dim output (torch 2.13)"}


# -- the cases ---------------------------------------------------------------------------------------

@st.composite
def cases(draw, n: int) -> dict:
    collective = draw(st.sampled_from(COLLECTIVES))
    layout = draw(st.sampled_from(LAYOUTS))
    size_class = draw(st.sampled_from(("scalar", "empty", "odd", "odd", "odd", "large")))
    two_d = layout != "contiguous" or draw(st.booleans())
    if size_class == "scalar" and collective != "all_to_all_single":
        shape = ()
    elif size_class == "empty":
        shape = (0, draw(st.integers(1, 3))) if two_d else (0,)
    elif size_class == "large":
        shape = (draw(st.integers(100, 200)), draw(st.integers(101, 201)))
    else:
        shape = (draw(st.integers(1, 5)), draw(st.integers(1, 5))) if two_d else (draw(st.integers(1, 9)),)
    root = draw(st.integers(0, n - 1))
    splits = None
    if collective == "all_to_all_single" and size_class != "large" and draw(st.booleans()):
        splits = [[draw(st.integers(0, 3)) for _ in range(n)] for _ in range(n)]
    crashes = TORCH_CRASHES.get(collective) if shape == () else None
    return {"collective": collective, "dtype": draw(st.sampled_from(DTYPES)), "torch_crashes": crashes,
            "op": draw(st.sampled_from(OPS)) if collective in REDUCING else None,
            "layout": layout, "shape": shape, "root": root, "peer": (root + draw(st.integers(1, n - 1))) % n,
            "splits": splits, "async_op": draw(st.booleans()), "exact": draw(st.booleans()),
            "seed": draw(st.integers(0, 2 ** 16))}


def explicit_cases(n: int) -> list:
    """Cases every run includes besides hypothesis's draw: bool's every op in the three reducing tensor forms (torch
    computes SUM as or, PRODUCT as and), and a strided call of every list form and of point-to-point, blocking and
    async."""
    def case(collective, dtype, op, layout, shape, async_op=False, seed=5):
        return {"collective": collective, "dtype": dtype, "torch_crashes": None, "op": op, "layout": layout,
                "shape": shape, "root": n - 1, "peer": 0, "splits": None, "async_op": async_op, "exact": True,
                "seed": seed}
    cases = [case(collective, "bool", op, layout, (3, 4))
             for op in OPS
             for collective, layout in (("all_reduce", "transposed"), ("reduce", "contiguous"),
                                        ("reduce_scatter_tensor", "sliced"), ("reduce_scatter", "transposed"))]
    for collective in ("all_gather", "gather", "scatter", "all_to_all", "reduce_scatter", "broadcast", "send_recv"):
        for async_op in (False, True):
            cases.append(case(collective, "float32", "sum" if collective in REDUCING else None, "transposed", (3, 2),
                              async_op))
    return cases


# -- judging -------------------------------------------------------------------------------------------

def _bound(dtype: torch.dtype, n: int, op, exact: bool):
    """``(rtol, atol)`` two reduction orders may differ by (see the module's note); ``None``: exactly equal."""
    if not (dtype.is_floating_point or dtype.is_complex) or op is None or op in ("min", "max"):
        return None
    eps = torch.finfo(dtype).eps
    if exact:
        return None if op != "avg" else (eps, 0.0)
    return 2 * n * eps, 2 * n * eps * 4.5 * n


def _same(mine: dict, reference: dict, case: dict, n: int) -> list:
    """What differs between two served outcomes of one rank (empty: they agree)."""
    problems = []
    if set(mine["outputs"]) != set(reference["outputs"]):
        return [f"outputs {sorted(mine['outputs'])} against {sorted(reference['outputs'])}"]
    dtype = getattr(torch, case["dtype"])
    bound = _bound(dtype, n, case["op"], case["exact"])
    for name, expected in reference["outputs"].items():
        got = mine["outputs"][name]
        if got.shape != expected.shape:
            problems.append(f"{name}: shape {tuple(got.shape)}, expected {tuple(expected.shape)}")
        elif bound is None:
            if not torch.equal(got, expected):
                problems.append(f"{name}: {got.flatten()[:6].tolist()} against {expected.flatten()[:6].tolist()}")
        elif not torch.allclose(got.to(torch.complex128 if dtype.is_complex else torch.float64),
                                expected.to(torch.complex128 if dtype.is_complex else torch.float64),
                                rtol=bound[0], atol=bound[1]):
            worst = (got.double() - expected.double()).abs().max().item() if not dtype.is_complex else "?"
            problems.append(f"{name}: differs by up to {worst} (rtol {bound[0]:.2g}, atol {bound[1]:.2g})")
    return problems


def _named(outcome: dict, rank: int, case: dict) -> bool:
    """A refusal that is zerocomm's typed error and names the cell: the rank, the collective, and the dtype or the op
    it refuses."""
    text = outcome["message"].lower()
    collective = checks.REGISTRY[case["collective"]]
    names = ("send", "recv") if collective == "send/recv" else (collective,)
    cell = [case["dtype"]] + ([case["op"]] if case["op"] else [])
    return outcome["typed"] and f"rank {rank}" in text and any(name in text for name in names) \
        and any(word in text for word in cell)


class Tally:
    def __init__(self, n: int):
        self.n = n
        self.counts = collections.Counter()
        self.wrong = []
        self.torch_wrong = []
        """Cases where torch's gloo served a layout with a result unlike its own on contiguous tensors."""
        self.refusals = set()
        """The distinct refusals (type and message) of zerocomm's that the suite met."""
        self.beyond = []
        """Calls zerocomm served where torch refused (or was not run): no reference but "auto"."""

    def line(self) -> str:
        c = self.counts
        return (f"differential vs torch gloo at {self.n} ranks: {c['cases']} cases, {c['calls']} calls: "
                f"{c['agree']} agree ({c['refused']} refused as torch refuses), {c['wrong']} wrong, "
                f"{c['beyond']} served beyond torch; torch's own result on the layout differed from its contiguous "
                f"one in {c['torch_wrong']} cases")

    def judge(self, case: dict, per_rank: list) -> None:
        """Count one case's calls and record what is wrong."""
        n = self.n
        self.counts["cases"] += 1
        torch_served = all(r["torch"]["served"] for r in per_rank)
        contiguous_served = per_rank[0]["torch_contiguous"] is not None \
            and all(r["torch_contiguous"]["served"] for r in per_rank)
        reference = ([r["torch_contiguous"] for r in per_rank] if contiguous_served
                     else [r["torch"] for r in per_rank] if torch_served else None)
        if torch_served and contiguous_served and any(
                not r["torch"]["layout_kept"] or _same(r["torch"], r["torch_contiguous"], case, n) for r in per_rank):
            self.counts["torch_wrong"] += 1
            self.torch_wrong.append(_describe(case))
        auto = [r["zerocomm"]["auto"] for r in per_rank]
        for algorithm in per_rank[0]["zerocomm"]:
            self.counts["calls"] += 1
            mine = [r["zerocomm"][algorithm] for r in per_rank]
            served = [m["served"] for m in mine]
            problems = []
            if any(served) and not all(served):
                problems.append("served on some ranks only: " + "; ".join(
                    f"rank {rank}: {m.get('type')}: {m.get('message')}" for rank, m in enumerate(mine)
                    if not m["served"]))
            elif all(served):
                against = reference if reference is not None else (auto if algorithm != "auto" else None)
                for rank, m in enumerate(mine):
                    if not m["layout_kept"]:
                        problems.append(f"rank {rank}: an output lost its strides or the memory around it changed")
                    if against is not None and against[rank]["served"]:
                        problems += [f"rank {rank}: {p}" for p in _same(m, against[rank], case, n)]
                if not problems and reference is None:
                    self.counts["beyond"] += 1
                    refusal = per_rank[0]["torch"]
                    self.beyond.append(f"{_describe(case)} algorithm={algorithm} (torch: {refusal['type']}: "
                                       f"{refusal['message'][:120]})")
            else:
                if reference is not None:
                    problems.append(f"refused what torch serves: {mine[0]['type']}: {mine[0]['message']}")
                elif algorithm != "auto" and all(a["served"] for a in auto):
                    problems.append(f"refused what auto serves: {mine[0]['type']}: {mine[0]['message']}")
                problems += [f"rank {rank}: not a typed refusal naming the rank and the collective: "
                             f"{m['type']}: {m['message']}" for rank, m in enumerate(mine) if not _named(m, rank, case)]
                if not problems:
                    self.counts["refused"] += 1
                    self.refusals.add(f"{mine[0]['type']}: {mine[0]['message'][:160]}")
            if problems:
                self.counts["wrong"] += 1
                self.wrong.append(f"{_describe(case)} algorithm={algorithm}: " + " | ".join(problems))
            else:
                self.counts["agree"] += 1


def _describe(case: dict) -> str:
    extras = [f"op {case['op']}"] if case["op"] else []
    extras += [f"root {case['root']}"] if case["collective"] in ("reduce", "broadcast", "gather", "scatter") else []
    extras += [f"{case['root']} -> {case['peer']}"] if case["collective"] == "send_recv" else []
    extras += [f"splits {case['splits']}"] if case["splits"] else []
    return (f"{case['collective']} {case['dtype']} {tuple(case['shape'])} {case['layout']}"
            f"{' async' if case['async_op'] else ''} {' '.join(extras)} (seed {case['seed']})")


# -- the test -----------------------------------------------------------------------------------------------

@pytest.fixture(scope="module", params=[2, 3], ids=["gloo-2", "gloo-3"])
def both_world(request, tmp_path_factory):
    size = request.param
    pool = ForkPool(size, "gloo", workdir=tmp_path_factory.mktemp(f"differential-{size}"), init=checks.init_both)
    yield pool
    pool.close()


def test_zerocomm_serves_what_torch_gloo_serves_with_equal_results(both_world, differential_summary):
    n = both_world.world_size
    tally = Tally(n)

    def one(case):
        tally.judge(case, both_world.run(checks.run_case, case, timeout=RUN_TIMEOUT_S))

    run = given(case=cases(n))(one)
    for explicit in explicit_cases(n):
        run = example(case=explicit)(run)
    run = settings(max_examples=EXAMPLES, derandomize=True, deadline=None, database=None,
                   phases=(Phase.explicit, Phase.generate), suppress_health_check=list(HealthCheck))(run)
    try:
        run()
    finally:
        differential_summary.append(tally.line())
        # shown with -s, and where a rank failure ends the run early
        print("\n".join([tally.line(), "wrong:"] + tally.wrong[:40] + ["torch's own result differed on:"]
                        + tally.torch_wrong + ["served beyond torch:"] + tally.beyond + ["refusals:"]
                        + sorted(tally.refusals)))
    assert not tally.wrong, f"{len(tally.wrong)} wrong calls ({tally.line()}):\n" + "\n".join(tally.wrong[:40])
    assert tally.counts["agree"] > tally.counts["refused"] > 0, tally.line()
