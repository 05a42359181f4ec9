"""torch's ``_DistTestBase`` with its module's ``dist`` replaced by ``zerocomm.comm`` (run it through
run_torch_suite.py, which sets the environment torch's test module reads at import).

With ``ZEROCOMM_SUITE_TORCH_PG=1`` (``--torch-default-group``), ``init_process_group`` also initializes
torch's own default group with backend "zerocomm", so the cases that hand torch's DDP the default group run
DDP on zerocomm's c10d backend; ``dist`` is still ``zerocomm.comm`` for everything else.
"""
import multiprocessing
import os
import types
import unittest

import torch.distributed as td
import zerocomm.comm
from torch.testing._internal.distributed import distributed_test


class _DistWithTorchDefaultGroup(types.ModuleType):
    """``zerocomm.comm``, except that init/destroy also set up torch's default group on backend "zerocomm"."""

    def __getattr__(self, name):
        return getattr(zerocomm.comm, name)

    @staticmethod
    def init_process_group(*args, **kwargs):
        zerocomm.comm.init_process_group(*args, **kwargs)
        torch_kwargs = dict(kwargs, backend="zerocomm")
        if torch_kwargs.get("init_method"):
            torch_kwargs["init_method"] = torch_kwargs["init_method"] + "_torch"
        td.init_process_group(**torch_kwargs)

    @staticmethod
    def destroy_process_group(group=None):
        zerocomm.comm.destroy_process_group(group)
        if group is None and td.is_initialized():
            td.destroy_process_group()


if os.environ.get("ZEROCOMM_SUITE_TORCH_PG") == "1":
    distributed_test.dist = _DistWithTorchDefaultGroup("zerocomm_comm_with_torch_default_group")
else:
    distributed_test.dist = zerocomm.comm


class TestZerocommAsDist(distributed_test.TestDistBackend, distributed_test.DistributedTest._DistTestBase):
    def setUp(self):
        super().setUp()
        self._start_processes(multiprocessing.get_context("fork").Process)


_DDP_ON_A_ZEROCOMM_GROUP = (
    "hands torch's DistributedDataParallel the zerocomm Group object itself (dist.group.WORLD); DDP's C++ "
    "(_verify_params_across_processes, the Reducer) takes only a c10d ProcessGroup, which a zerocomm Group is not "
    "(made one, every attribute read on the collective hot path is several times slower); the supported routes are "
    "init_process_group('zerocomm') and zerocomm.comm.c10d.as_process_group(group)")

#: Cases left out, with the reason; the runner prints them and the report counts them.
EXCLUDED = {
    "test_accumulate_gradients_no_sync": _DDP_ON_A_ZEROCOMM_GROUP,
    "test_accumulate_gradients_no_sync_grad_is_view": _DDP_ON_A_ZEROCOMM_GROUP,
    "test_accumulate_gradients_no_sync_allreduce_hook": _DDP_ON_A_ZEROCOMM_GROUP,
    "test_accumulate_gradients_no_sync_allreduce_with_then_hook": _DDP_ON_A_ZEROCOMM_GROUP,
    "test_ddp_logging_data_cpu": (
        "compares the backend DDP logs for torch's default group (on backend 'zerocomm', this runner's second world) "
        "with dist.get_backend() of zerocomm.comm's own default group (transport 'gloo'); each names its own group "
        "rightly, and under plain torch code (one world) the two agree ('zerocomm')"),
}

if int(os.environ["WORLD_SIZE"]) >= 3:  # with two ranks, the case's subgroup [0, 1] is the whole world
    EXCLUDED["test_monitored_barrier_gloo_subgroup"] = (
        "expects monitored_barrier on a group this process is not a member of to return silently; zerocomm raises "
        "InvalidArgumentError for every call on a non-member group, by design (a silent no-op hides bugs; see "
        "docs/migrating-from-torch-distributed.md, 'Non-members')")

for _name, _reason in EXCLUDED.items():
    setattr(TestZerocommAsDist, _name, unittest.skip(f"excluded by zerocomm: {_reason}")(
        getattr(TestZerocommAsDist, _name)))
