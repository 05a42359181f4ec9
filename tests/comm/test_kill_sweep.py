"""The kill sweep's short version (``zerocomm-bench kills`` runs 200): a rank SIGKILLed at a random moment of
each kind of call once -- all_reduce by ring, tree, recursive doubling, shm, native and hierarchical, every other
collective and list form, send/recv, isend/irecv and a ZeRO-3 step; every survivor raises a typed error (of
``zerocomm.comm.errors`` or ``zerocomm.zero.errors``) within the bound, none hangs, none returns a wrong result.
Each kill is a fresh world of forked gloo ranks."""
import pytest

from zerocomm.benchmarks import kill_sweep

KILLS = len(kill_sweep.KINDS)  # one per kind
NPROCS = 3
BOUND_S = 5.0


@pytest.mark.timeout(600)
def test_every_survivor_of_a_kill_raises_a_typed_error_in_time():
    results = kill_sweep.sweep(KILLS, NPROCS, BOUND_S, seed=11)
    text, ok = kill_sweep.summarize(results, NPROCS, BOUND_S)
    assert {r["kind"] for r in results} == set(kill_sweep.KINDS)
    assert all(len(r["survivors"]) == NPROCS - 1 for r in results), text
    assert ok, text


def test_the_summary_counts_untyped_wrong_and_hung_survivors_as_failures():
    """The table's verdict is not vacuous: each bad outcome makes it fail and is named."""
    for status in ("untyped", "wrong", "hung", "late"):
        survivor = {"status": status, "seconds": 1.0, "error": "RuntimeError", "message": "boom"}
        results = [{"kind": "barrier", "numel": 8, "victim": 2, "survivors": {0: {"status": "typed", "seconds": 0.1},
                                                                              1: survivor}}]
        text, ok = kill_sweep.summarize(results, NPROCS, BOUND_S)
        assert not ok and f"rank 1 {status}" in text, text
