"""Every public name of torch.distributed exists in zerocomm.comm or is listed, with its reason, in
docs/migrating-from-torch-distributed.md; the names zerocomm shares behave as torch's."""
import inspect
import pathlib
import re
import types

import pytest
import torch
import torch.distributed as td
import torch.distributed.distributed_c10d as c10d

import zerocomm.comm as dist

DOC = pathlib.Path(__file__).resolve().parents[2] / "docs" / "migrating-from-torch-distributed.md"


def torch_public_names() -> set:
    """torch 2.13's ``torch.distributed`` has no ``__all__``: its public non-module attributes, plus
    ``distributed_c10d.__all__``."""
    own = {name for name in dir(td) if not name.startswith("_") and not isinstance(getattr(td, name), types.ModuleType)}
    return own | set(getattr(td, "__all__", ())) | set(c10d.__all__)


def documented_absent() -> dict:
    """``{name: reason}`` from the doc's "Names zerocomm does not provide" table."""
    text = DOC.read_text()
    section = text.split("## Names zerocomm does not provide", 1)[1]
    absent = {}
    for names, reason in re.findall(r"^\| (`[^|]+`) \| ([^|]+) \|$", section, flags=re.M):
        for name in re.findall(r"`([^`]+)`", names):
            absent[name] = reason.strip()
    return absent


def provided(name: str) -> bool:
    """``zerocomm.comm`` has ``name`` as an API object (a submodule of the same name does not count)."""
    return hasattr(dist, name) and not isinstance(getattr(dist, name), types.ModuleType)


@pytest.mark.filterwarnings("ignore::FutureWarning")  # dir(torch.distributed) touches the deprecated reduce_op
def test_every_torch_name_exists_or_is_documented():
    absent = documented_absent()
    assert len(absent) >= 5, f"the doc's table was not parsed: {absent}"
    missing = sorted(name for name in torch_public_names() if not provided(name) and name not in absent)
    assert not missing, f"torch.distributed names neither in zerocomm.comm nor documented as absent: {missing}"
    stale = sorted(name for name in absent if provided(name))
    assert not stale, f"documented as absent but zerocomm.comm has them: {stale}"
    unknown = sorted(name for name in absent if name not in torch_public_names())
    assert not unknown, f"documented as absent but torch.distributed has no such name: {unknown}"


def test_all_lists_only_existing_names():
    assert not [name for name in dist.__all__ if not hasattr(dist, name)]


@pytest.mark.parametrize("name", ["all_reduce_coalesced", "all_gather_coalesced", "monitored_barrier", "new_subgroups",
                                  "new_subgroups_by_enumeration", "get_process_group_ranks", "get_node_local_rank",
                                  "send_object_list", "recv_object_list", "is_backend_available", "get_pg_count",
                                  "get_backend_config"])
def test_signatures_match_torch(name):
    ours = [p.name for p in inspect.signature(getattr(dist, name)).parameters.values()]
    theirs = [p.name for p in inspect.signature(getattr(td, name)).parameters.values()]
    assert ours == theirs, f"{name}: zerocomm {ours} vs torch {theirs}"


def test_torch_objects_are_shared():
    for name in ("Backend", "DebugLevel", "get_debug_level", "set_debug_level", "set_debug_level_from_env",
                 "DistBackendError", "DistError", "FileStore", "TCPStore", "ReduceOp", "AllreduceOptions"):
        assert getattr(dist, name) is getattr(td, name), name
    assert dist.Backend("gloo") == "gloo" and dist.Backend.GLOO == "gloo" and dist.Backend("zerocomm") == "zerocomm"
    assert dist.is_gloo_available() and not dist.is_ucc_available()


def test_backend_errors_are_torch_backend_errors():
    for error in (dist.CommTimeoutError, dist.PeerError, dist.CollectiveMismatchError):
        assert issubclass(error, td.DistBackendError) and issubclass(error, dist.CommError), error
    for error in (dist.UnsupportedError, dist.InvalidArgumentError, dist.NotInitializedError):
        assert issubclass(error, td.DistError), error


def test_node_local_rank(monkeypatch):
    for key in ("LOCAL_RANK", "MPI_LOCALRANKID", "OMPI_COMM_WORLD_LOCAL_RANK", "PMI_LOCAL_RANK"):
        monkeypatch.delenv(key, raising=False)
    with pytest.raises(RuntimeError, match="LOCAL_RANK is not in the environment"):
        dist.get_node_local_rank()
    assert dist.get_node_local_rank(fallback_rank=3) == 3
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert dist.get_node_local_rank() == 1


def test_docs_example_runs(tmp_path):
    """The "use zerocomm as torch's backend" example, run as written in a fresh interpreter."""
    import subprocess
    import sys
    code = DOC.read_text().split("## Use zerocomm as torch's backend", 1)[1].split("```python", 1)[1].split("```", 1)[0]
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
