"""``comm.slurm``: Slurm's host lists and tasks-per-node strings, and torch's launch variables derived from
srun's environment (what is derived, what wins, when nothing is).  Pure functions over dicts: no process
starts here (tests/launchers/test_slurm.py starts simulated srun tasks).

Expected host lists are written out by hand from Slurm's hostlist syntax, not computed."""
import pytest

from zerocomm.comm.errors import InvalidArgumentError
from zerocomm.comm.slurm import (MAX_HOSTS, expand_nodelist, expand_tasks_per_node, fill_torch_env, launch,
                                 master_address, master_port, torch_variables)

NODELISTS = [
    ("node01", ["node01"]),
    ("node[01-04,07]", ["node01", "node02", "node03", "node04", "node07"]),
    ("node[08-11]", ["node08", "node09", "node10", "node11"]),  # padding kept as written, across 09 -> 10
    ("node[8-11]", ["node8", "node9", "node10", "node11"]),  # no padding written, none added
    ("n[098-101]", ["n098", "n099", "n100", "n101"]),
    ("n[1-3]", ["n1", "n2", "n3"]),
    ("n[5]", ["n5"]),
    ("n[007,3,10-11]", ["n007", "n3", "n10", "n11"]),  # each item keeps its own width, order as written
    ("gpu[1-2],cpu05,io[003-004]", ["gpu1", "gpu2", "cpu05", "io003", "io004"]),
    ("a,b,c", ["a", "b", "c"]),
    ("a b\tc", ["a", "b", "c"]),  # white space separates too
    ("a, b ,c", ["a", "b", "c"]),
    ("rack[1-2]-ib", ["rack1-ib", "rack2-ib"]),
    ("c[1-2]n[1-2]", ["c1n1", "c1n2", "c2n1", "c2n2"]),
    ("zc12-host[0-1]", ["zc12-host0", "zc12-host1"]),
    ("node-1.cluster.example", ["node-1.cluster.example"]),
    ("x[1-2].example,y", ["x1.example", "x2.example", "y"]),
]


@pytest.mark.parametrize("text,expected", NODELISTS)
def test_node_lists_expand_as_slurm_writes_them(text, expected):
    assert expand_nodelist(text) == expected


BAD_NODELISTS = [
    ("", "empty host list"),
    ("   ", "empty host list"),
    ("node[01-04", "unbalanced '['"),
    ("node01]", "unbalanced ']'"),
    ("node[[1-2]]", "bracket inside a bracket"),
    ("node[1-2],,node3", "empty host name"),
    (",node1", "empty host name"),
    ("node1,", "empty host name"),
    ("[1-2]", "no host name before it"),
    ("node[]", "is not a number"),
    ("node[a-b]", "is not a number"),
    ("node[1-2-3]", "is not a number"),
    ("node[1,,2]", "is not a number"),
    ("node[4-2]", "runs backwards"),
    ("node[0-99999999]", f"more than {MAX_HOSTS} hosts"),
]


@pytest.mark.parametrize("text,why", BAD_NODELISTS)
def test_malformed_node_lists_raise_naming_the_variable_and_value(text, why):
    with pytest.raises(InvalidArgumentError) as raised:
        expand_nodelist(text, "SLURM_STEP_NODELIST")
    message = str(raised.value)
    assert f"SLURM_STEP_NODELIST={text!r}" in message and why in message, message
    assert isinstance(raised.value, ValueError)


@pytest.mark.parametrize("text,expected", [("2(x3),1", [2, 2, 2, 1]), ("4", [4]), ("1(x4)", [1, 1, 1, 1]),
                                           ("3,2(x2),1", [3, 2, 2, 1])])
def test_tasks_per_node_expand(text, expected):
    assert expand_tasks_per_node(text) == expected


@pytest.mark.parametrize("text", ["", "2(x)", "x", "2(3)", "2,,1", "-1"])
def test_malformed_tasks_per_node_raise(text):
    with pytest.raises(InvalidArgumentError, match="SLURM_TASKS_PER_NODE="):
        expand_tasks_per_node(text)


@pytest.mark.parametrize("job_id,port", [("1234567", 19567), ("42", 15042), ("9999", 24999), ("10000", 15000)])
def test_master_port_from_the_job_id(job_id, port):
    assert master_port(job_id) == port


@pytest.mark.parametrize("job_id", ["", "abc", "12_3", "-5"])
def test_a_job_id_that_is_not_a_number_raises(job_id):
    with pytest.raises(InvalidArgumentError, match="SLURM_JOB_ID=.*MASTER_PORT"):
        master_port(job_id)


# -- torch's variables from srun's -------------------------------------------------------------------------------

def srun(procid=5, **overrides) -> dict:
    """Task ``procid`` of ``srun --nodes=4 --ntasks=7`` (2, 2, 2 and 1 tasks per node, block layout) in job
    1234567, step 3, as srun sets its variables; ``overrides`` replace them (None removes one)."""
    node = min(procid // 2, 3)
    env = {"SLURM_JOB_ID": "1234567", "SLURM_STEP_ID": "3", "SLURM_PROCID": str(procid),
           "SLURM_LOCALID": str(procid - 2 * node), "SLURM_NODEID": str(node), "SLURM_NTASKS": "7",
           "SLURM_STEP_NUM_TASKS": "7", "SLURM_NNODES": "4", "SLURM_NODELIST": "node[08-10],gpu01",
           "SLURM_STEP_NODELIST": "node[08-10],gpu01", "SLURM_JOB_NODELIST": "node[08-10],gpu01",
           "SLURM_TASKS_PER_NODE": "2(x3),1", "SLURM_STEP_TASKS_PER_NODE": "2(x3),1", "PATH": "/usr/bin"}
    env.update(overrides)
    return {k: v for k, v in env.items() if v is not None}


def test_every_torch_variable_from_slurm():
    assert torch_variables(srun(5)) == {"RANK": "5", "WORLD_SIZE": "7", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
                                        "MASTER_ADDR": "node08", "MASTER_PORT": "19567"}
    assert torch_variables(srun(6))["LOCAL_WORLD_SIZE"] == "1"  # the fourth node runs one task
    assert torch_variables(srun(6))["LOCAL_RANK"] == "0"


def test_variables_set_explicitly_win_each_on_its_own():
    env = srun(5, MASTER_PORT="29500")
    derived = torch_variables(env)
    assert "MASTER_PORT" not in derived and derived["MASTER_ADDR"] == "node08" and derived["RANK"] == "5"
    derived = torch_variables(srun(5, MASTER_ADDR="10.0.0.7", RANK="0", WORLD_SIZE="1", LOCAL_RANK="0"))
    assert derived == {"LOCAL_WORLD_SIZE": "2", "MASTER_PORT": "19567"}


def test_an_empty_variable_counts_as_unset():
    assert torch_variables(srun(5, MASTER_ADDR=""))["MASTER_ADDR"] == "node08"


def test_nothing_is_read_when_torchs_variables_are_all_set():
    # torchrun started by srun sets all six; Slurm's variables, even malformed ones, are not read.
    env = srun(5, SLURM_NODELIST="node[", SLURM_STEP_NODELIST="node[", SLURM_NTASKS="x", RANK="1", WORLD_SIZE="8",
               LOCAL_RANK="1", LOCAL_WORLD_SIZE="4", MASTER_ADDR="head", MASTER_PORT="29500")
    assert torch_variables(env) == {}


def test_the_node_list_is_read_only_when_master_addr_is_missing():
    env = srun(5, SLURM_STEP_NODELIST="node[01-", MASTER_ADDR="head")
    assert torch_variables(env)["RANK"] == "5"
    with pytest.raises(InvalidArgumentError, match=r"SLURM_STEP_NODELIST='node\[01-'"):
        torch_variables(srun(5, SLURM_STEP_NODELIST="node[01-"))


def test_the_job_id_is_read_only_when_master_port_is_missing():
    assert torch_variables(srun(5, SLURM_JOB_ID="abc", MASTER_PORT="29500"))["RANK"] == "5"
    with pytest.raises(InvalidArgumentError, match="SLURM_JOB_ID='abc'"):
        torch_variables(srun(5, SLURM_JOB_ID="abc"))


def test_the_steps_own_variables_come_first():
    # A step on part of the allocation: its node list and task count, not the job's.
    env = srun(1, SLURM_JOB_NODELIST="big[001-100]", SLURM_NODELIST="node[09-10]", SLURM_STEP_NODELIST="node[09-10]",
               SLURM_NTASKS="400", SLURM_STEP_NUM_TASKS="4", SLURM_NODEID="0", SLURM_LOCALID="1",
               SLURM_TASKS_PER_NODE="4(x100)", SLURM_STEP_TASKS_PER_NODE="2(x2)")
    assert torch_variables(env) == {"RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
                                    "MASTER_ADDR": "node09", "MASTER_PORT": "19567"}
    # Without the step's variables (older Slurm, or a hand-made environment): the job's.
    env = srun(0, SLURM_STEP_NODELIST=None, SLURM_NODELIST=None, SLURM_STEP_NUM_TASKS=None,
               SLURM_STEP_TASKS_PER_NODE=None, SLURM_TASKS_PER_NODE=None, SLURM_NTASKS_PER_NODE="2")
    assert torch_variables(env) == {"RANK": "0", "WORLD_SIZE": "7", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2",
                                    "MASTER_ADDR": "node08", "MASTER_PORT": "19567"}


def test_outside_an_srun_step_nothing_is_derived():
    assert torch_variables({"PATH": "/usr/bin"}) == {}
    assert torch_variables(srun(0, SLURM_STEP_ID=None)) == {}  # the batch script's own shell
    assert torch_variables(srun(0, SLURM_PROCID=None)) == {}


def test_python_in_the_batch_script_without_srun_is_told_to_use_srun():
    env = srun(0, SLURM_STEP_ID=None, SLURM_NTASKS="8")
    with pytest.raises(InvalidArgumentError, match="SLURM_STEP_ID is not set.*srun python train.py"):
        fill_torch_env(None, env)
    assert "RANK" not in env
    # Set by hand, torch's variables work there as anywhere; and MPI with a world of one needs none.
    assert fill_torch_env("gloo", srun(0, SLURM_STEP_ID=None, MASTER_ADDR="h", MASTER_PORT="1")) == {}
    assert fill_torch_env("mpi", srun(0, SLURM_STEP_ID=None)) == {}


def test_mpi_launchers_keep_their_ranks():
    # srun --mpi=pmix: PMIX_RANK agrees with SLURM_PROCID. No backend named: "mpi" is the default, nothing set.
    assert torch_variables(srun(5, PMIX_RANK="5")) == {}
    assert torch_variables(srun(5, PMIX_RANK="5"), backend="nccl")["RANK"] == "5"
    assert torch_variables(srun(5, PMI_RANK="5", PMI_SIZE="7"), backend="gloo")["WORLD_SIZE"] == "7"
    # mpiexec inside the allocation starts its daemons with srun: Slurm's ids count daemons, not ranks.
    assert torch_variables(srun(1, PMI_RANK="9", PMI_SIZE="16"), backend="gloo") == {}
    assert torch_variables(srun(1, PMI_RANK="1", PMI_SIZE="16", SLURM_NTASKS="2", SLURM_STEP_NUM_TASKS="2",
                                SLURM_STEP_TASKS_PER_NODE="1(x2)", SLURM_LOCALID="0", SLURM_NODEID="1"),
                           backend="gloo") == {}
    assert torch_variables(srun(1, OMPI_COMM_WORLD_RANK="3", OMPI_COMM_WORLD_SIZE="16"), backend="gloo") == {}
    assert torch_variables(srun(1, PMI_FD="7"), backend="gloo") == {}  # nothing to compare: not Slurm's ranks


@pytest.mark.parametrize("overrides,why", [
    ({"SLURM_PROCID": "7"}, "SLURM_PROCID=7 is outside the step's 7 tasks"),
    ({"SLURM_LOCALID": "2"}, "SLURM_LOCALID=2 is outside the 2 tasks on node 2"),
    ({"SLURM_NODEID": "4"}, "SLURM_NODEID=4 is outside SLURM_STEP_TASKS_PER_NODE='2(x3),1' (4 nodes)"),
    ({"SLURM_NODEID": None}, "lists several nodes but SLURM_NODEID is not set"),
    ({"SLURM_NTASKS": None, "SLURM_STEP_NUM_TASKS": None}, "srun set none of SLURM_STEP_NUM_TASKS, SLURM_NTASKS"),
    ({"SLURM_STEP_TASKS_PER_NODE": None, "SLURM_TASKS_PER_NODE": None}, "none of SLURM_STEP_TASKS_PER_NODE, SLURM_TASKS_PER_NODE, SLURM_NTASKS_PER_NODE"),
    ({"SLURM_LOCALID": "one"}, "SLURM_LOCALID='one': not a non-negative integer"),
    ({"SLURM_STEP_TASKS_PER_NODE": "2(x3"}, "SLURM_STEP_TASKS_PER_NODE='2(x3'"),
])
def test_inconsistent_slurm_variables_raise_naming_them(overrides, why):
    with pytest.raises(InvalidArgumentError) as raised:
        torch_variables(srun(4, **overrides))
    assert why in str(raised.value), str(raised.value)


def test_fill_writes_only_whats_missing_and_says_what():
    env = srun(5, MASTER_PORT="29500", RANK="5")
    derived = fill_torch_env("gloo", env)
    assert derived == {"WORLD_SIZE": "7", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "node08"}
    assert env["MASTER_PORT"] == "29500" and env["RANK"] == "5" and env["MASTER_ADDR"] == "node08"
    assert fill_torch_env("gloo", env) == {}  # a second init finds them all set


def test_launch_and_master_address_read_slurm_alone():
    task = launch(srun(3, RANK="0"))
    assert (task.rank, task.world_size, task.local_rank, task.local_world_size, task.node_rank) == (3, 7, 1, 2, 1)
    assert master_address(srun(3, SLURM_STEP_NODELIST="gpu[1-2],cpu05")) == "gpu1"


def test_the_guide_names_what_is_read_and_the_port_rule():
    from pathlib import Path

    from zerocomm.comm import slurm

    page = (Path(__file__).parents[2] / "docs" / "running-on-many-machines.md").read_text()
    section = page.split("## Slurm\n", 1)[1].split("\n## ", 1)[0]
    read = (*slurm.NODELIST_VARIABLES, *slurm.NTASKS_VARIABLES, *slurm.TASKS_PER_NODE_VARIABLES, slurm.STEP_VARIABLE,
            "SLURM_NTASKS_PER_NODE", "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID", "SLURM_JOB_ID")
    assert [v for v in read if f"`{v}`" not in section] == []
    assert [v for v in slurm.TORCH_VARIABLES if f"| `{v}` |" not in section] == []
    assert f"`{slurm.PORT_BASE} + SLURM_JOB_ID % {slurm.PORT_SPAN}`" in section
    assert "#SBATCH --nodes=2" in section and "#SBATCH --ntasks-per-node=4" in section
    assert "\nsrun python train.py" in section


def test_mpi_launchers_are_recognised_as_init_recognises_them():
    # init_process_group() picks "mpi" on these variables; the Slurm reading must step aside on the same ones.
    from zerocomm.comm import bootstrap, slurm

    assert set(slurm._MPI_MARKERS) == set(bootstrap.MPI_LAUNCH_VARS)


@pytest.mark.parametrize("tasks_on_node,gpus,backend", [("2", 2, "cpu:gloo,cuda:nccl"), ("4", 2, "gloo"), ("2", 0, "gloo")])
def test_the_default_backend_counts_the_nodes_tasks_from_slurm(tasks_on_node, gpus, backend, monkeypatch):
    """init fills torch's variables before it picks the default backend: NCCL only where every task on the node
    (Slurm's count, as LOCAL_WORLD_SIZE) has a GPU of its own.  CUDA is faked; nothing initializes it."""
    import os

    import torch

    from zerocomm.comm import bootstrap

    env = srun(0, SLURM_NODEID="0", SLURM_LOCALID="0", SLURM_STEP_TASKS_PER_NODE=tasks_on_node,
               SLURM_STEP_NUM_TASKS=tasks_on_node, SLURM_STEP_NODELIST="gpu01")
    monkeypatch.setattr(os, "environ", env)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpus > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    slurm_filled = fill_torch_env(None, env)
    assert slurm_filled["LOCAL_WORLD_SIZE"] == tasks_on_node
    assert bootstrap.default_backend() == backend
