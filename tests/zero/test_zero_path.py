"""How many zerocomm files one ZeRO-2 training step (forward, backward, step) enters.

A path that grows is a design smell: the step should run through the optimizer wrapper and its parts
(zero/optimizer.py, gradients.py, replicated.py, optimizer_state.py, plus precision.py when clipping or
fp16 need the global norm) and the public collective calls.  See support/zero_trace.py for how files are
counted (this thread and the group's executor thread, after two warm-up steps).
"""
import pytest

from support import zero_trace
from support.worlds import worlds

# (ZeroConfig fields, most zero/ files, most files in all).  The bound for zero/ is 5 and for the whole step 11.
# On one host the step's collectives run with "shm" (zero/optimizer.py step_algorithm): 4 files in zero/ and 7
# in comm/, one role each (api, plan, group, check, work, shm for the arena, algorithms/shm; the full checks of
# validate only on a cell's first call).  Clipping adds zero/precision.py (the float64 norm); the norm's
# all_reduce takes the same path.
CASES = [({}, 4, 11), ({"gradient_clipping": 1.0}, 5, 12)]


@pytest.mark.parametrize("world", worlds(backends=("gloo",), sizes=(2,)), indirect=True)
@pytest.mark.parametrize("fields, zero_max, total_max", CASES, ids=["plain", "clipping"])
def test_one_zero2_step_enters_few_files(world, fields, zero_max, total_max):
    for rank, files in enumerate(world.run(zero_trace.files_of_one_step, 2, **fields)):
        zero = [f for f in files if f.startswith("zero/")]
        print(f"rank {rank} {fields}: {len(files)} files, {len(zero)} in zero/: {files}")
        assert "zero/optimizer.py" in zero and "zero/gradients.py" in zero, files  # the tracer did see the step
        assert len(zero) <= zero_max, f"rank {rank}: one ZeRO-2 step entered {len(zero)} zero/ files: {zero}"
        assert len(files) <= total_max, f"rank {rank}: one ZeRO-2 step entered {len(files)} files: {files}"
