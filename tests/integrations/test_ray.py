"""Ray Train's ``TorchTrainer`` on zerocomm (``zerocomm.integrations.ray.ZerocommConfig``).

The recipe of docs/running-on-many-machines.md ("Ray Train"), run as shown on a local Ray cluster of 2 CPU
workers: ZeRO-2 on zerocomm's world.  The reference is Ray's own run of the same model, data and optimizer
settings with ``TorchConfig()`` (gloo) and ``prepare_model`` (torch's DDP): worker 0's loss at every step and
the final parameters must agree to float32 rounding (both average two gradients, so the sums agree up to the
order of two additions; AdamW is elementwise).  During the recipe's run each worker also writes down what it
sees of the world (the script's ``train_loop`` is wrapped for that; the rest of it, its ``__main__`` block
included, runs as the page shows it).

One Ray cluster serves the module (started here, shut down after it; its files in a temporary folder that is
removed).  Where Ray cannot start, the tests skip saying why.
"""
import json
import os
import pathlib
import re
import shutil
import sys
import tempfile

import pytest
import torch

ray = pytest.importorskip("ray", reason="needs Ray Train: pip install 'ray[train]' (in zerocomm's test extra)")
pytest.importorskip("ray.train.torch", reason="needs Ray Train: pip install 'ray[train]' (in zerocomm's test extra)")

import ray._private.ray_constants  # noqa: E402
import ray.cloudpickle  # noqa: E402
import ray.train  # noqa: E402
from ray.train import RunConfig, ScalingConfig  # noqa: E402
from ray.train.torch import TorchConfig, TorchTrainer  # noqa: E402

from zerocomm.integrations.ray import ZerocommConfig  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]
#: Each run's deadline of joining and of every collective: a stuck worker fails the run, not the session.
WORLD_TIMEOUT_S = 60

# A last resort (the two runs take 1-3 minutes here, by load); the fixture's teardown still shuts Ray down.
pytestmark = pytest.mark.timeout(480, method="signal")


def recipe_script() -> str:
    """The python block after ``<!-- ray-train-script -->`` in docs/running-on-many-machines.md, verbatim."""
    text = (ROOT / "docs" / "running-on-many-machines.md").read_text()
    match = re.search(r"<!-- ray-train-script -->\s*```python\n(.*?)```", text, re.S)
    assert match, "running-on-many-machines.md has no python block after <!-- ray-train-script -->"
    return match.group(1)


#: The cluster's environment (its processes inherit the driver's): the run's controller polls its workers every
#: 0.5 s instead of 2 s, and no preemption watcher is started (one process fewer on 2 cores).
CLUSTER_ENV = {"RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.5", "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0"}


@pytest.fixture(scope="module")
def ray_cluster():
    """A local Ray cluster of 2 CPUs on loopback, light on memory; shut down and its folder removed after the
    module.  Ray's session folder is short (its socket paths must fit in 107 bytes), so not pytest's tmp_path."""
    folder = tempfile.mkdtemp(prefix="ray")
    module = sys.modules[__name__]
    with pytest.MonkeyPatch.context() as patch:
        for name, value in CLUSTER_ENV.items():
            patch.setenv(name, value)
        patch.delenv("RAY_ADDRESS", raising=False)  # a cluster of this test's own, never one found running
        # Ray's local-only mode (its default on macOS): the node's address, which every worker and Ray Train's
        # rendezvous use, is 127.0.0.1 rather than this machine's network address.  Read while ray.init runs.
        patch.setattr(ray._private.ray_constants, "ENABLE_RAY_CLUSTER", False)
        try:
            try:
                ray.init(num_cpus=2, include_dashboard=False, object_store_memory=200 * 2**20, _temp_dir=folder,
                         log_to_driver=False)
            except (RuntimeError, OSError, ray.exceptions.RayError) as error:
                pytest.skip(f"Ray cannot start a local cluster here: {type(error).__name__}: {error}")
            # The loops below are this module's functions; Ray's workers cannot import it by name (pytest's sys.path).
            ray.cloudpickle.register_pickle_by_value(module)
            try:
                yield
            finally:
                ray.cloudpickle.unregister_pickle_by_value(module)
        finally:
            ray.shutdown()
            shutil.rmtree(folder, ignore_errors=True)


def _fit(loop, config, torch_config, storage):
    trainer = TorchTrainer(loop, train_loop_config=config, torch_config=torch_config,
                           scaling_config=ScalingConfig(num_workers=2, use_gpu=False),
                           run_config=RunConfig(storage_path=str(storage)))
    return trainer.fit()


def _ddp_loop(config):
    """Ray's own recipe of the same training: gloo (``TorchConfig(backend="gloo")``), ``prepare_model`` (torch's
    DDP), torch's AdamW with the DeepSpeed config's settings; worker 0 reports its losses and the model."""
    model = ray.train.torch.prepare_model(config["make_model"]())
    optimizer = torch.optim.AdamW(model.parameters(), **config["ds_config"]["optimizer"]["params"])
    rank = ray.train.get_context().get_world_rank()
    losses = []
    for step in range(config["steps"]):
        x, y = config["batch"](step, rank)
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    with tempfile.TemporaryDirectory() as folder:
        checkpoint = None
        if rank == 0:
            torch.save(model.module.state_dict(), os.path.join(folder, "model.pt"))
            checkpoint = ray.train.Checkpoint.from_directory(folder)
        ray.train.report({"losses": losses}, checkpoint=checkpoint)


def _observing(train_loop, out: str):
    """``train_loop`` preceded by a note of what this worker sees of the world, in ``out/worker-RANK.json``,
    taken after one all_reduce through torch's API (it runs on zerocomm's world)."""
    def loop(config):
        import torch.distributed as td

        import zerocomm.comm as dist

        rank = ray.train.get_context().get_world_rank()
        total = torch.tensor([float(rank + 1)])
        td.all_reduce(total)
        seen = {"ray_rank": rank, "torch_backend": td.get_backend(), "torch_rank": td.get_rank(),
                "zerocomm_initialized": dist.is_initialized(), "zerocomm_rank": dist.get_rank(),
                "zerocomm_world_size": dist.get_world_size(), "zerocomm_backend": dist.get_backend(),
                "sum": total.item(), "timeout_s": dist.group.WORLD.timeout.total_seconds(),
                "env": {name: os.environ.get(name) for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK",
                                                                "LOCAL_WORLD_SIZE", "NODE_RANK", "MASTER_ADDR",
                                                                "MASTER_PORT")}}
        pathlib.Path(out, f"worker-{rank}.json").write_text(json.dumps(seen))
        train_loop(config)
    return loop


@pytest.fixture(scope="module")
def runs(ray_cluster, tmp_path_factory):
    """``(recipe's result, Ray's gloo DDP result, what each worker of the recipe's run saw)``."""
    folder = tmp_path_factory.mktemp("runs")
    definitions, main = recipe_script().split('if __name__ == "__main__":\n')
    recipe = {"__name__": "train_ray"}
    exec(compile(definitions, "train_ray.py", "exec"), recipe)
    recipe["train_loop"] = _observing(recipe["train_loop"], str(folder))
    here = os.getcwd()
    os.chdir(folder)  # the script's storage_path is ./ray_results
    try:
        exec(compile("if True:\n" + main, "train_ray.py", "exec"), recipe)  # the block, still indented
    finally:
        os.chdir(here)
    ours = recipe["result"]
    theirs = _fit(_ddp_loop, {"steps": 5, "make_model": recipe["make_model"], "batch": recipe["batch"],
                              "ds_config": recipe["DS_CONFIG"]},
                  TorchConfig(backend="gloo", timeout_s=WORLD_TIMEOUT_S), folder / "ddp")
    seen = [json.loads(path.read_text()) for path in sorted(folder.glob("worker-*.json"))]
    return ours, theirs, seen


def _final_parameters(result) -> list:
    state = torch.load(os.path.join(result.checkpoint.path, "model.pt"))
    return [state[name] for name in sorted(state)]


def test_recipe_zero2_matches_ray_gloo_ddp(runs):
    """The doc's script (``ZerocommConfig()``) against Ray's gloo DDP: worker 0's losses at each of the 5 steps and
    the final parameters agree to rtol 1e-5."""
    ours, theirs, _ = runs
    assert ours.error is None and theirs.error is None, (ours.error, theirs.error)
    zero_losses, ddp_losses = ours.metrics["losses"], theirs.metrics["losses"]
    print("\nstep  zerocomm ZeRO-2  Ray gloo DDP")
    for step, (a, b) in enumerate(zip(zero_losses, ddp_losses)):
        print(f"{step:4d}  {a:.9f}     {b:.9f}")
    assert len(zero_losses) == len(ddp_losses) == 5
    assert len(set(zero_losses)) == 5, f"the losses do not change: {zero_losses}"  # the model is trained
    torch.testing.assert_close(torch.tensor(zero_losses), torch.tensor(ddp_losses), rtol=1e-5, atol=1e-7)
    for a, b in zip(_final_parameters(ours), _final_parameters(theirs), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_every_worker_is_in_zerocomms_world(runs):
    """Under ``ZerocommConfig()`` each worker is in zerocomm's world of 2 (gloo) at Ray's rank, torch's default
    group is it (backend "zerocomm"; an all_reduce through torch sums both ranks), torchrun's variables are set,
    both meet at one loopback address and port, and the world's deadline is zerocomm's default (300 s)."""
    _, _, seen = runs
    assert [worker["ray_rank"] for worker in seen] == [0, 1], seen
    for rank, worker in enumerate(seen):
        assert worker["torch_rank"] == worker["zerocomm_rank"] == rank, worker
        assert worker["torch_backend"] == "zerocomm", worker
        assert worker["zerocomm_initialized"] and worker["zerocomm_world_size"] == 2, worker
        assert worker["zerocomm_backend"] == "gloo" and worker["sum"] == 3.0, worker
        assert worker["timeout_s"] == 300, worker
        env = worker["env"]
        assert (env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"], env["LOCAL_WORLD_SIZE"], env["NODE_RANK"]) == (
            str(rank), "2", str(rank), "2", "0"), env
        assert env["MASTER_ADDR"] == "127.0.0.1", env
    assert seen[0]["env"]["MASTER_PORT"] == seen[1]["env"]["MASTER_PORT"], seen


def test_config_refuses_what_a_ray_worker_cannot_start():
    """Bad settings fail on the driver, before any worker starts, naming the value (no cluster needed)."""
    from zerocomm.comm import InvalidArgumentError

    with pytest.raises(InvalidArgumentError, match=r"backend must be one of \('gloo', 'nccl', 'cpu:gloo,cuda:nccl'\).*'mpi'"):
        ZerocommConfig(backend="mpi")
    with pytest.raises(InvalidArgumentError, match="init_method must be 'env' or 'tcp', got 'file'"):
        ZerocommConfig(init_method="file")
    with pytest.raises(InvalidArgumentError, match="timeout_s must be a positive finite number.*got -1"):
        ZerocommConfig(timeout_s=-1)
    assert ZerocommConfig().backend_cls.__name__ == "_ZerocommBackend"


def test_local_ranks_number_each_nodes_workers_in_order():
    """torchrun's LOCAL_RANK, LOCAL_WORLD_SIZE and NODE_RANK from the node each worker runs on."""
    from zerocomm.integrations.ray import _local_ranks

    assert _local_ranks(["a", "a", "b", "b"]) == [(0, 2, 0), (1, 2, 0), (0, 2, 1), (1, 2, 1)]
    assert _local_ranks(["b", "a", "b"]) == [(0, 2, 0), (0, 1, 1), (1, 2, 0)]
