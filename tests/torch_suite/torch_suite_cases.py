"""torch's ``_DistTestBase`` with its module's ``dist`` replaced by ``zerocomm.comm`` (run it through
run_torch_suite.py, which sets the environment torch's test module reads at import)."""
import multiprocessing

import zerocomm.comm
from torch.testing._internal.distributed import distributed_test

distributed_test.dist = zerocomm.comm


class TestZerocommAsDist(distributed_test.TestDistBackend, distributed_test.DistributedTest._DistTestBase):
    def setUp(self):
        super().setUp()
        self._start_processes(multiprocessing.get_context("fork").Process)
