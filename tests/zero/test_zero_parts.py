"""ZeRO's parts satisfy the interfaces zero/parts.py declares, and the wrapper no longer probes them.

* Every ``STAGES`` row and every ``STATE_PARTS`` entry names a class of its kind, and each implementation's
  methods take the interface's parameters, by name and in order (so ``placement`` has one signature).
* Three gloo ranks build the optimizer of every stage and of each optimizer-state and parameter-store variant
  (the same configs ``initialize`` takes) and report the parts' classes, their declared capabilities and what
  was passed into them (qgZ's reduce-scatter, the buckets), against a table written here; each trains a step.
* The source of zero/optimizer.py and zero/offload.py, parsed: no ``hasattr``/``getattr`` on a part, no attribute
  of a part assigned from outside it; nowhere in zero/ is a declared capability probed by its name.
"""
from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest
import torch
from torch import nn

from support.dist import dist
from support.worlds import worlds
from zerocomm.zero import ZeroConfig, initialize
from zerocomm.zero.gradients import FullGradients, ShardedGradients
from zerocomm.zero.offload import HostOptimizerState
from zerocomm.zero.offload_nvme import NvmeOptimizerState
from zerocomm.zero.offload_param import FileShards, HostShards, MemoryShards, UnitShards
from zerocomm.zero.optimizer_state import DeviceOptimizerState
from zerocomm.zero.parts import (BucketTakingState, FileParamStore, GradientsPart, OptimizerState, ParametersPart,
                                 ParamStore)
from zerocomm.zero.replicated import ReplicatedParameters
from zerocomm.zero.sharded import ShardedParameters
from zerocomm.zero.stages import STAGES, STATE_PARTS, Stage, StatePlacement

ZERO = Path(__file__).resolve().parents[2] / "zero"

IMPLEMENTATIONS = {
    GradientsPart: (FullGradients, ShardedGradients),
    ParametersPart: (ReplicatedParameters, ShardedParameters),
    OptimizerState: (DeviceOptimizerState, HostOptimizerState, NvmeOptimizerState),
    BucketTakingState: (HostOptimizerState, NvmeOptimizerState),
    ParamStore: (MemoryShards, UnitShards, HostShards, FileShards),
    FileParamStore: (FileShards,),
}

CAPABILITIES = {"store", "gradient_ready", "streams_gradients", "streamed_sum_of_squares", "placement",
                "gradient_placement", "path", "takes_reduced_buckets", "in_files", "reads_source_by_unit",
                "transient_buffers", "reduce_scatter", "buckets", "release"}
"""Names of declared capabilities and of what used to be patched on: none may be probed by name."""


# -- the table and the interfaces ------------------------------------------------------------------------------
def test_every_row_names_a_class_of_each_kind():
    assert set(STAGES) == set(Stage)
    for stage, row in STAGES.items():
        assert row.stage is stage
        assert issubclass(row.gradients, GradientsPart), (stage, row.gradients)
        assert issubclass(row.parameters, ParametersPart), (stage, row.parameters)
    assert [STAGES[s].parameters for s in Stage] == [ReplicatedParameters] * 3 + [ShardedParameters]
    assert [STAGES[s].gradients for s in Stage] == [FullGradients] * 2 + [ShardedGradients] * 2
    assert set(STATE_PARTS) == set(StatePlacement)
    for placement, build in STATE_PARTS.items():
        assert issubclass(build.__self__, OptimizerState), (placement, build)  # a bound classmethod: the class


def _parameters(function) -> list:
    return [name for name in inspect.signature(function).parameters if name not in ("self", "cls")]


@pytest.mark.parametrize("interface", list(IMPLEMENTATIONS), ids=lambda c: c.__name__)
def test_implementations_take_the_interface_s_parameters(interface):
    methods = sorted(name for name, value in vars(interface).items()
                     if getattr(value, "__isabstractmethod__", False)
                     or (isinstance(value, (classmethod, staticmethod)) and value.__func__.__isabstractmethod__))
    assert methods, interface
    for implementation in IMPLEMENTATIONS[interface]:
        assert issubclass(implementation, interface)
        assert not implementation.__abstractmethods__, (implementation, implementation.__abstractmethods__)
        for name in methods:
            declared = _parameters(getattr(interface, name))
            own = inspect.signature(getattr(implementation, name)).parameters
            names = [n for n in own if n not in ("self", "cls")]
            assert names[:len(declared)] == declared, (implementation.__name__, name, names, declared)
            extra = [own[n] for n in names[len(declared):]]
            assert all(p.default is not inspect.Parameter.empty for p in extra), (implementation.__name__, name)


def test_placement_has_one_signature_across_every_part():
    found = []
    for path in sorted(ZERO.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef) and node.name == "placement":
                found.append(path.name)
                assert [a.arg for a in node.args.args] == ["self", "where"] and not node.args.kwonlyargs, \
                    f"{path.name}:{node.lineno}: placement({ast.unparse(node.args)})"
    assert {"parts.py", "replicated.py", "sharded.py", "optimizer_state.py", "offload.py", "offload_nvme.py",
            "offload_param.py"} <= set(found), found


def test_the_never_called_release_of_full_gradients_is_gone():
    assert not hasattr(FullGradients, "release") and hasattr(ShardedGradients, "release")


# -- the parts of real optimizers ------------------------------------------------------------------------------
# (name, ZeroConfig fields, expected: gradients, parameters, state, store, reduce_scatter, shard kept)
CASES = [
    ("stage0", {"stage": 0}, ("FullGradients", "ReplicatedParameters", "DeviceOptimizerState", None, None, None)),
    ("stage1", {"stage": 1}, ("FullGradients", "ReplicatedParameters", "DeviceOptimizerState", None, None, None)),
    ("stage2", {"stage": 2},
     ("ShardedGradients", "ReplicatedParameters", "DeviceOptimizerState", None, "reduce_scatter_tensor", True)),
    ("stage3", {"stage": 3},
     ("ShardedGradients", "ShardedParameters", "DeviceOptimizerState", "MemoryShards", "reduce_scatter_tensor",
      True)),
    # a CPU model's host is its device: offload_optimizer 'cpu' keeps the device state
    ("stage2-cpu", {"stage": 2, "offload_optimizer": "cpu"},
     ("ShardedGradients", "ReplicatedParameters", "DeviceOptimizerState", None, "reduce_scatter_tensor", True)),
    ("stage1-nvme", {"stage": 1, "offload_optimizer": "nvme"},
     ("FullGradients", "ReplicatedParameters", "NvmeOptimizerState", None, None, None)),
    ("stage2-nvme", {"stage": 2, "offload_optimizer": "nvme"},
     ("ShardedGradients", "ReplicatedParameters", "NvmeOptimizerState", None, "reduce_scatter_tensor", False)),
    ("stage3-nvme-params", {"stage": 3, "offload_optimizer": "nvme", "offload_param": "nvme"},
     ("ShardedGradients", "ShardedParameters", "NvmeOptimizerState", "FileShards", "reduce_scatter_tensor", False)),
    ("stage2-qgz", {"stage": 2, "zero_quantized_gradients": True},
     ("ShardedGradients", "ReplicatedParameters", "DeviceOptimizerState", None, "QuantizedReduceScatter", True)),
    ("stage1-qgz", {"stage": 1, "zero_quantized_gradients": True},  # qgZ replaces a reduce-scatter into a shard
     ("FullGradients", "ReplicatedParameters", "DeviceOptimizerState", None, None, None)),
]


class TwoLayers(nn.Module):
    """Two Linear layers in a ``Sequential``: two buckets at every stage (stage 3: a unit each)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.layers = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))

    def forward(self, x):
        return self.layers(x)


def parts_of(cases: list, folder: str) -> list:
    """Rank side: for each case, the parts' classes, their declared capabilities, what was passed into them, and
    whether one training step applied."""
    out = []
    for name, fields, _ in cases:
        config = ZeroConfig(nvme_path=folder, reduce_bucket_numel=100, stage3_param_persistence_threshold=0,
                            **fields)
        model, optimizer = initialize(TwoLayers(), lambda params: torch.optim.SGD(params, lr=0.1), config)
        gradients, parameters, state = optimizer.gradients, optimizer.parameters, optimizer.optimizer_state
        store = parameters.store
        scatter = getattr(gradients, "reduce_scatter", None)  # the test's own look, not the wrapper's
        x = torch.randn(4, 8, generator=torch.Generator().manual_seed(dist.get_rank()))
        model(x).square().mean().backward()
        applied = optimizer.step()
        report = optimizer.memory_report()
        optimizer.remove_hooks()
        out.append({
            "case": name,
            "classes": (type(gradients).__name__, type(parameters).__name__, type(state).__name__,
                        None if store is None else type(store).__name__,
                        None if scatter is None else getattr(scatter, "__name__", type(scatter).__name__),
                        None if not isinstance(gradients, ShardedGradients) else gradients.shard is not None),
            "interfaces": (isinstance(gradients, GradientsPart), isinstance(parameters, ParametersPart),
                           isinstance(state, OptimizerState), store is None or isinstance(store, ParamStore)),
            "capabilities": (state.takes_reduced_buckets, isinstance(state, BucketTakingState),
                             state.streams_gradients, store is not None and store.in_files,
                             parameters.reads_source_by_unit),
            "buckets": (gradients.buckets is optimizer.buckets, len(optimizer.buckets), len(optimizer.layouts),
                        all(b.layout is l for b, l in zip(optimizer.buckets, optimizer.layouts))),
            "hooked": [b._on_reduced is not None for b in optimizer.buckets],
            "applied": applied,
            "report": sorted(report),
        })
    return out


# Three ranks, not two: a pool's ranks remember the last four places that called a collective (comm/flight.py), and
# test_zero_path.py counts the files one step of the two-rank pool enters after two warm-up steps; this test's calls
# from other places (stage 1's reduction, qgZ's) would leave that memory in a state two warm-ups do not settle.
@pytest.mark.parametrize("world", worlds(backends=("gloo",), sizes=(3,)), indirect=True)
def test_each_row_builds_parts_that_satisfy_their_interfaces(world, tmp_path):
    for rank, rows in enumerate(world.run(parts_of, CASES, str(tmp_path), timeout=120)):
        assert [row["case"] for row in rows] == [name for name, _, _ in CASES]
        for row, (name, fields, expected) in zip(rows, CASES):
            where = f"rank {rank} {name}"
            assert row["classes"] == expected, (where, row["classes"])
            assert row["interfaces"] == (True, True, True, True), where
            nvme = expected[2] == "NvmeOptimizerState"
            files = expected[3] == "FileShards"
            assert row["capabilities"] == (nvme, nvme, nvme, files, expected[1] == "ShardedParameters"), where
            built, count, layouts, matched = row["buckets"]
            assert built and count == layouts > 1 and matched, (where, row["buckets"])
            assert row["hooked"] == [nvme] * count, where  # only a state that takes buckets is handed each one
            assert row["applied"] is True, where
            assert row["report"] == ["buffers", "grads", "optimizer_state", "params"], where


# -- the source: declared, not probed ---------------------------------------------------------------------------
def _tree(name: str) -> ast.Module:
    return ast.parse((ZERO / name).read_text(), filename=name)


def _probes(tree: ast.Module) -> list:
    return [node for node in ast.walk(tree) if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            and node.func.id in ("hasattr", "getattr")]


@pytest.mark.parametrize("name", ["optimizer.py", "offload.py"])
def test_the_wrapper_and_the_offload_choice_probe_no_part(name):
    for call in _probes(_tree(name)):
        # the one look left: the name of the user's optimizer factory, for an error message
        assert ast.unparse(call.args[0]) == "optimizer_factory", f"{name}:{call.lineno}: {ast.unparse(call)}"


def test_no_declared_capability_is_probed_by_name_anywhere_in_zero():
    for path in sorted(ZERO.glob("*.py")):
        for call in _probes(_tree(path.name)):
            if len(call.args) > 1 and isinstance(call.args[1], ast.Constant):
                assert call.args[1].value not in CAPABILITIES, f"{path.name}:{call.lineno}: {ast.unparse(call)}"


def test_the_wrapper_assigns_no_attribute_of_a_part():
    parts = {"gradients", "parameters", "optimizer_state"}
    for node in ast.walk(_tree("optimizer.py")):
        targets = node.targets if isinstance(node, ast.Assign) else \
            [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else []
        for target in (t for top in targets for t in ast.walk(top)):
            if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Attribute) \
                    and target.value.attr in parts and isinstance(target.value.value, ast.Name) \
                    and target.value.value.id == "self":
                raise AssertionError(f"optimizer.py:{node.lineno}: {ast.unparse(node)} patches a part")
