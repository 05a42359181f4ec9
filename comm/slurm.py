"""Slurm's launch environment, read as torch's: what ``srun`` tells each task, as ``RANK``, ``MASTER_ADDR``...

``srun python train.py`` starts one process per task and describes the job step in ``SLURM_*`` variables,
never in torch's ``RANK``/``WORLD_SIZE``/``LOCAL_RANK``/``LOCAL_WORLD_SIZE``/``MASTER_ADDR``/``MASTER_PORT``.
:func:`fill_torch_env` (called by ``init_process_group`` for ``env://``) sets those of torch's variables
that are missing from what Slurm says, as torchrun would have set them, so the rendezvous, the default
backend's choice and code that reads ``LOCAL_RANK`` after init all see one answer:

=================== =====================================================================================
``RANK``            ``SLURM_PROCID``
``WORLD_SIZE``      ``SLURM_STEP_NUM_TASKS``, else ``SLURM_NTASKS``
``LOCAL_RANK``      ``SLURM_LOCALID``
``LOCAL_WORLD_SIZE`` this node's entry (``SLURM_NODEID``) of ``SLURM_STEP_TASKS_PER_NODE``, else of
                    ``SLURM_TASKS_PER_NODE`` (``2(x3),1``: 2 tasks on each of 3 nodes, then 1), else
                    ``SLURM_NTASKS_PER_NODE``
``MASTER_ADDR``     the first host of ``SLURM_STEP_NODELIST``, else ``SLURM_NODELIST``, else
                    ``SLURM_JOB_NODELIST`` (task 0 runs there under srun's block and cyclic layouts)
``MASTER_PORT``     ``15000 + SLURM_JOB_ID % 10000`` (Lightning's rule, so 15000-24999)
=================== =====================================================================================

Precedence: a torch variable already set (and not empty) wins, each one on its own: ``MASTER_PORT`` exported
in the batch script keeps its value while the rest comes from Slurm; torchrun started by srun sets all six, and
nothing here changes them.  Only a process in a job step that srun started counts (``SLURM_STEP_ID`` set):
the batch script's own shell has ``SLURM_NTASKS`` of the whole allocation, and a ``python`` started there
directly must not take itself for one of N ranks and wait for peers that never start.

MPI launchers: when an MPI launcher's variables are present (``PMI_RANK``, ``PMIX_RANK``,
``OMPI_COMM_WORLD_RANK``...), ``init_process_group()`` without a backend keeps choosing ``"mpi"`` and nothing
is set here.  With a backend named, Slurm's variables are used only where they describe the same ranks
(srun as the PMI server: ``srun --mpi=pmix``); ``mpiexec`` inside an allocation starts its own daemons with
srun, and those tasks' ``SLURM_PROCID`` counts daemons, not ranks.

The port: every task computes it alone, so it must come from something they share; the job id is unique
among running jobs.  15000-24999 lies below Linux's ephemeral range (32768-60999), so it never meets a port
the kernel handed to an outgoing connection, and clear of the well-known ports below 1024.  Two job steps
of one job running at once on the same first node would meet on it: give each its own ``MASTER_PORT``.

This module reads the environment it is given (``os.environ`` by default) and writes only the torch
variables it derived.
"""
from __future__ import annotations

import dataclasses
import os
import re
from typing import List, Mapping, MutableMapping, Optional, Sequence

from .errors import InvalidArgumentError

#: torch's launch variables, as torchrun sets them; the ones missing are derived from Slurm's.
TORCH_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")

#: Set by srun in every task of a job step, and not in the batch script's shell.
STEP_VARIABLE = "SLURM_STEP_ID"

#: Where the node list, the task count and the tasks per node are read, first found wins (the step's own
#: variables first: a step may run on part of the allocation).
NODELIST_VARIABLES = ("SLURM_STEP_NODELIST", "SLURM_NODELIST", "SLURM_JOB_NODELIST")
NTASKS_VARIABLES = ("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS")
TASKS_PER_NODE_VARIABLES = ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE")

#: ``MASTER_PORT`` when the environment has none: ``PORT_BASE + job id % PORT_SPAN``.
PORT_BASE = 15000
PORT_SPAN = 10000

#: MPI launchers' (rank variable, size variable or None): when present, they must agree with Slurm's.
_MPI_RANKS = (("PMI_RANK", "PMI_SIZE"), ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"), ("PMIX_RANK", None))
#: Variables that mean an MPI launcher started this process (as ``process_group`` detects one).
_MPI_MARKERS = ("PMI_RANK", "PMIX_RANK", "OMPI_COMM_WORLD_RANK", "MPI_LOCALRANKID", "PMI_FD", "PMI_PORT")

#: More hosts than this in one node list is a malformed list, not a cluster (``node[0-999999999]``).
MAX_HOSTS = 1 << 20


def _bad(variable: str, text: str, why: str) -> InvalidArgumentError:
    return InvalidArgumentError(f"environment variable {variable}={text!r}: {why}")


# -- node lists ------------------------------------------------------------------------------------------------

_SEPARATOR = re.compile(r"\s*,\s*|\s+")
_PIECE = re.compile(r"([^\[\]]+)|\[([^\[\]]*)\]")


def expand_nodelist(text: str, variable: str = "SLURM_NODELIST") -> List[str]:
    """The host names of a Slurm host list, in order: ``"gpu[1-2],cpu05,io[003-004]"`` ->
    ``["gpu1", "gpu2", "cpu05", "io003", "io004"]``.

    Slurm's syntax: names separated by commas (or white space) outside brackets; a bracket holds a comma list of
    numbers and ``lo-hi`` ranges, each expanded with the zero padding ``lo`` is written with (``node[08-11]``
    -> ``node08`` ... ``node11``); text may follow a bracket (``rack[1-2]-ib``), and several brackets in one
    name expand left to right, the first varying slowest (``c[1-2]n[1-2]`` -> ``c1n1 c1n2 c2n1 c2n2``).
    A malformed list raises ``InvalidArgumentError`` naming ``variable`` and the text.
    """
    if not isinstance(text, str) or not text.strip():
        raise _bad(variable, text, "an empty host list")
    hosts: List[str] = []
    for item in _split_outside_brackets(text.strip(), variable, text):
        if not item:
            raise _bad(variable, text, "an empty host name (two commas in a row, or one at an end)")
        names = [""]
        offset = 0
        for match in _PIECE.finditer(item):
            if match.start() != offset:
                break
            offset = match.end()
            if match.group(1) is not None:
                alternatives = [match.group(1)]
            elif not names[0] and len(names) == 1:
                raise _bad(variable, text, f"{item!r}: a bracket with no host name before it")
            else:
                alternatives = _expand_ranges(match.group(2), variable, text)
            names = [name + piece for name in names for piece in alternatives]
            if len(hosts) + len(names) > MAX_HOSTS:
                raise _bad(variable, text, f"more than {MAX_HOSTS} hosts")
        if offset != len(item):
            raise _bad(variable, text, f"{item!r} is not names and bracketed ranges")
        hosts.extend(names)
    return hosts


def _split_outside_brackets(text: str, variable: str, original: str) -> List[str]:
    """``text`` cut at the commas and white space that lie outside brackets."""
    items, start, depth, i = [], 0, 0, 0
    while i < len(text):
        char = text[i]
        if char == "[":
            if depth:
                raise _bad(variable, original, f"a bracket inside a bracket at offset {i}")
            depth = 1
        elif char == "]":
            if not depth:
                raise _bad(variable, original, f"an unbalanced ']' at offset {i}")
            depth = 0
        elif not depth and (char == "," or char.isspace()):
            items.append(text[start:i])
            i = start = _SEPARATOR.match(text, i).end()
            continue
        i += 1
    if depth:
        raise _bad(variable, original, "an unbalanced '[' (no closing bracket)")
    items.append(text[start:])
    return items


def _expand_ranges(inside: str, variable: str, text: str) -> List[str]:
    """``"01-03,07"`` -> ``["01", "02", "03", "07"]``: each range keeps its low end's width."""
    out: List[str] = []
    for item in inside.split(","):
        item = item.strip()
        match = re.fullmatch(r"(\d+)(?:-(\d+))?", item)
        if not match:
            raise _bad(variable, text, f"[{inside}]: {item!r} is not a number or a lo-hi range of numbers")
        lo_text, hi_text = match.group(1), match.group(2) or match.group(1)
        lo, hi = int(lo_text), int(hi_text)
        if hi < lo:
            raise _bad(variable, text, f"[{inside}]: the range {item!r} runs backwards")
        if len(out) + hi - lo + 1 > MAX_HOSTS:
            raise _bad(variable, text, f"more than {MAX_HOSTS} hosts")
        out.extend(str(n).zfill(len(lo_text)) for n in range(lo, hi + 1))
    return out


def expand_tasks_per_node(text: str, variable: str = "SLURM_TASKS_PER_NODE") -> List[int]:
    """Tasks on each node, in node order: ``"2(x3),1"`` -> ``[2, 2, 2, 1]``."""
    counts: List[int] = []
    for item in text.split(","):
        match = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", item)
        if not match:
            raise _bad(variable, text, f"{item!r} is not N or N(xM)")
        repeat = int(match.group(2) or 1)
        if len(counts) + repeat > MAX_HOSTS:
            raise _bad(variable, text, f"more than {MAX_HOSTS} nodes")
        counts.extend([int(match.group(1))] * repeat)
    return counts


def master_port(job_id: str, variable: str = "SLURM_JOB_ID") -> int:
    """The port every task of job ``job_id`` derives alike: ``PORT_BASE + job_id % PORT_SPAN``."""
    if not re.fullmatch(r"\s*\d+\s*", job_id or ""):
        raise _bad(variable, job_id, "not a job number (set MASTER_PORT to choose the port yourself)")
    return PORT_BASE + int(job_id) % PORT_SPAN


# -- the launch --------------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class SlurmLaunch:
    """One task's place in its job step, as Slurm describes it (torch's variables not consulted)."""

    rank: int
    """``SLURM_PROCID``: this task's index in the step, 0 to ``world_size - 1``."""
    world_size: int
    """Tasks in the step."""
    local_rank: int
    """``SLURM_LOCALID``: this task's index among the step's tasks on its node."""
    local_world_size: int
    """The step's tasks on this node."""
    node_rank: int
    """``SLURM_NODEID``: this node's index in the step's node list (0 when Slurm does not say and there is one)."""

    def __post_init__(self) -> None:
        if not 0 <= self.rank < self.world_size:
            raise InvalidArgumentError(f"Slurm's task rank SLURM_PROCID={self.rank} is outside the step's "
                                       f"{self.world_size} tasks")
        if not 0 <= self.local_rank < self.local_world_size:
            raise InvalidArgumentError(f"Slurm's local task id SLURM_LOCALID={self.local_rank} is outside the "
                                       f"{self.local_world_size} tasks on node {self.node_rank}")


def in_srun_step(environ: Optional[Mapping[str, str]] = None) -> bool:
    """Whether this process is a task srun started (``SLURM_STEP_ID`` and ``SLURM_PROCID`` set)."""
    env = os.environ if environ is None else environ
    return bool(env.get(STEP_VARIABLE)) and bool(env.get("SLURM_PROCID"))


def _first(env: Mapping[str, str], variables: Sequence[str]) -> tuple:
    for variable in variables:
        if env.get(variable, "").strip():
            return variable, env[variable]
    raise InvalidArgumentError(f"srun set none of {', '.join(variables)}: cannot tell the job step's layout "
                               "(set torch's RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT instead)")


def _int(env: Mapping[str, str], variables: Sequence[str]) -> int:
    variable, text = _first(env, variables)
    if not re.fullmatch(r"\s*\d+\s*", text):
        raise _bad(variable, text, "not a non-negative integer")
    return int(text)


def launch(environ: Optional[Mapping[str, str]] = None) -> SlurmLaunch:
    """This task's rank, world size, local rank and local world size from Slurm's variables alone."""
    env = os.environ if environ is None else environ
    rank = _int(env, ("SLURM_PROCID",))
    world_size = _int(env, NTASKS_VARIABLES)
    local_rank = _int(env, ("SLURM_LOCALID",))
    node_rank = _int(env, ("SLURM_NODEID",)) if env.get("SLURM_NODEID", "").strip() else None
    present = [v for v in TASKS_PER_NODE_VARIABLES if env.get(v, "").strip()]
    if present:
        counts = expand_tasks_per_node(env[present[0]], present[0])
        if node_rank is None and len(counts) > 1:
            raise InvalidArgumentError(f"{present[0]}={env[present[0]]!r} lists several nodes but SLURM_NODEID "
                                       "is not set: cannot tell which one this task runs on")
        node_rank = node_rank or 0
        if node_rank >= len(counts):
            raise InvalidArgumentError(f"SLURM_NODEID={node_rank} is outside {present[0]}={env[present[0]]!r} "
                                       f"({len(counts)} nodes)")
        local_world_size = counts[node_rank]
    else:
        local_world_size = _int(env, TASKS_PER_NODE_VARIABLES + ("SLURM_NTASKS_PER_NODE",))
        node_rank = node_rank or 0
    return SlurmLaunch(rank=rank, world_size=world_size, local_rank=local_rank,
                       local_world_size=local_world_size, node_rank=node_rank)


def master_address(environ: Optional[Mapping[str, str]] = None) -> str:
    """The first host of the step's node list: where task 0 runs, so where its store listens."""
    env = os.environ if environ is None else environ
    variable, text = _first(env, NODELIST_VARIABLES)
    return expand_nodelist(text, variable)[0]


def _mpi_disagrees(env: Mapping[str, str], rank: int, world_size: int) -> Optional[str]:
    """Why an MPI launcher's variables describe other ranks than Slurm's, or None when they agree."""
    compared = False
    for rank_variable, size_variable in _MPI_RANKS:
        if rank_variable in env:
            compared = True
            if env[rank_variable].strip() != str(rank):
                return f"{rank_variable}={env[rank_variable]} but SLURM_PROCID={rank}"
            if size_variable and size_variable in env and env[size_variable].strip() != str(world_size):
                return f"{size_variable}={env[size_variable]} but Slurm's task count is {world_size}"
    return None if compared else "an MPI launcher started this process without a rank variable to compare"


def torch_variables(environ: Optional[Mapping[str, str]] = None, *, backend: Optional[str] = None) -> dict:
    """torch's launch variables that ``environ`` lacks (unset or empty) and Slurm's describe, as strings.

    Empty when this process is not a task of an srun job step, when torch's variables are all set, or when an
    MPI launcher started it and ``backend`` is None (the default backend is then "mpi") or its ranks differ
    from Slurm's.  Slurm's variables are read only for what is missing: a node list is parsed only when
    ``MASTER_ADDR`` is, the job id only when ``MASTER_PORT`` is.
    """
    env = os.environ if environ is None else environ
    missing = [v for v in TORCH_VARIABLES if not env.get(v, "").strip()]
    if not missing or not in_srun_step(env):
        return {}
    if any(env.get(v) for v in _MPI_MARKERS) and backend is None:
        return {}
    task = launch(env)
    if any(env.get(v) for v in _MPI_MARKERS) and _mpi_disagrees(env, task.rank, task.world_size):
        return {}
    values = {"RANK": task.rank, "WORLD_SIZE": task.world_size, "LOCAL_RANK": task.local_rank,
              "LOCAL_WORLD_SIZE": task.local_world_size}
    out = {}
    for variable in missing:
        if variable == "MASTER_ADDR":
            out[variable] = master_address(env)
        elif variable == "MASTER_PORT":
            out[variable] = str(master_port(env.get("SLURM_JOB_ID", "")))
        else:
            out[variable] = str(values[variable])
    return out


def fill_torch_env(backend: Optional[str] = None, environ: Optional[MutableMapping[str, str]] = None) -> dict:
    """Set in ``environ`` (``os.environ``) the torch variables :func:`torch_variables` derives; return them.

    ``init_process_group`` calls it for ``env://`` before it picks the default backend (which reads
    ``LOCAL_WORLD_SIZE``) and meets the other ranks (``RANK``, ``MASTER_ADDR``...).  Writing them, as torchrun
    would have, lets code that reads ``LOCAL_RANK`` after init, and torch's own ``env://``, agree with it.
    In a Slurm job but outside an srun step (a ``python`` started by the batch script itself) with
    ``MASTER_ADDR`` or ``MASTER_PORT`` missing, it raises ``InvalidArgumentError`` saying to start the ranks
    with srun, where ``env://`` would only have named the missing variable.
    """
    env = os.environ if environ is None else environ
    if (env.get("SLURM_JOB_ID") and not env.get(STEP_VARIABLE) and str(backend).lower() != "mpi"
            and not any(env.get(v) for v in _MPI_MARKERS)
            and not all(env.get(v, "").strip() for v in ("MASTER_ADDR", "MASTER_PORT"))):
        # env:// would fail on the missing variable anyway; say why it is missing.
        raise InvalidArgumentError(
            f"init_process_group: env:// needs MASTER_ADDR and MASTER_PORT, and this process runs in Slurm job "
            f"{env['SLURM_JOB_ID']} but not in a job step that srun started ({STEP_VARIABLE} is not set): start "
            "each rank with srun (srun python train.py), or set RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT")
    derived = torch_variables(env, backend=backend)
    env.update(derived)
    return derived
