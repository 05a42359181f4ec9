"""The kill sweep's short version (``zerocomm-bench kills`` runs 200): a rank SIGKILLed at a random moment
of ring, tree, recursive doubling, shm, native and hierarchical all_reduce calls; every survivor raises a
typed error within the bound, none hangs.  Each kill is a fresh world of forked gloo ranks."""
import pytest

from zerocomm.benchmarks import kill_sweep

KILLS = 12  # two per algorithm
NPROCS = 3
BOUND_S = 5.0


@pytest.mark.timeout(600)
def test_every_survivor_of_a_kill_raises_a_typed_error_in_time():
    results = kill_sweep.sweep(KILLS, NPROCS, BOUND_S, seed=11)
    text, ok = kill_sweep.summarize(results, NPROCS, BOUND_S)
    assert {r["algorithm"] for r in results} == set(kill_sweep.ALGORITHMS)
    assert all(len(r["survivors"]) == NPROCS - 1 for r in results), text
    assert ok, text
