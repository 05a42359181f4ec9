"""Stage 3 units: which modules gather their parameters together.

A *unit* is a module whose parameters (those not claimed by a unit deeper inside it) are one flat
bucket, gathered before the module's forward and again before its backward, released after each.
The default policy makes a unit of every child of an ``nn.ModuleList`` or ``nn.Sequential`` (the
blocks of a transformer, the layers of an MLP) and one of the root for everything else — FSDP's
usual wrapping, without asking the user for a policy.

[Note: shared parameters and small parameters]
A parameter used by modules of two different units (a tied embedding and head that sit in
different blocks) would be needed while its owner is released; it is moved to the root unit,
which stays gathered for the whole forward and the whole backward.  Parameters with fewer than
``stage3_param_persistence_threshold`` elements go to the *persistent* unit: gathered once and
kept, their gradients reduce-scattered like any other unit's and the updated shards all-gathered
after each step — one collective per step instead of two per small tensor.
"""
from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

from torch import nn


@dataclasses.dataclass(frozen=True, slots=True)
class UnitPlan:
    """One unit: its module, the managed parameters it owns (indices into the managed list)."""

    name: str
    """The module's qualified name ("" for the root), or "<persistent>"."""
    module: Optional[nn.Module]
    """None for the persistent unit (it has no module of its own)."""
    param_indices: tuple
    persistent: bool = False
    group: int = 0
    """The parameter group of every parameter of the unit (see ``split_units_by_group``)."""


def unit_module_names(model: nn.Module) -> list[str]:
    """Qualified names of the default unit modules: the root ("") and every child of a ModuleList/Sequential."""
    names = [""]
    for name, module in model.named_modules():
        if isinstance(module, (nn.ModuleList, nn.Sequential)) and module is not model:
            names.extend(f"{name}.{child}" if name else child for child, _ in module.named_children())
    return names


def _unit_of(module_path: str, unit_names: Sequence[str]) -> str:
    """The deepest unit whose module contains ``module_path``."""
    best = ""
    for name in unit_names:
        if name and (module_path == name or module_path.startswith(name + ".")) and len(name) > len(best):
            best = name
    return best


def plan_units(model: nn.Module, managed: Sequence[tuple[str, nn.Parameter]],
               persistence_threshold: int) -> list[UnitPlan]:
    """Units for ``managed`` (name, parameter) pairs, in module order, the persistent unit last.

    Units that would own no parameter are left out.  Within a unit parameters keep the order of
    ``managed``.
    """
    unit_names = unit_module_names(model)
    modules = dict(model.named_modules())
    index_of = {id(param): i for i, (_, param) in enumerate(managed)}
    owners: dict[int, set] = {i: set() for i in range(len(managed))}
    for module_name, module in model.named_modules(remove_duplicate=False):
        for _, param in module.named_parameters(recurse=False, remove_duplicate=False):
            if id(param) in index_of:
                owners[index_of[id(param)]].add(_unit_of(module_name, unit_names))
    by_unit: dict[str, list[int]] = {name: [] for name in unit_names}
    persistent: list[int] = []
    for i, (_, param) in enumerate(managed):
        if param.numel() < persistence_threshold:
            persistent.append(i)
            continue
        units = owners[i]
        by_unit[units.pop() if len(units) == 1 else ""].append(i)
    plans = [UnitPlan(name=name, module=modules[name], param_indices=tuple(indices))
             for name, indices in by_unit.items() if indices]
    if persistent:
        plans.append(UnitPlan(name="<persistent>", module=None, param_indices=tuple(persistent), persistent=True))
    return plans


def split_units_by_group(units: Sequence[UnitPlan], param_groups: Optional[Sequence[int]]) -> list[UnitPlan]:
    """Each unit as one unit per parameter group among its parameters (``param_groups[i]``: managed parameter
    i's group), in order of first appearance, so no bucket mixes groups.  Units of one module are gathered
    and released by that module's hooks alike; the unit keeps its name, with the group added when split."""
    if param_groups is None:
        return list(units)
    out = []
    for unit in units:
        by_group: dict[int, list[int]] = {}
        for index in unit.param_indices:
            by_group.setdefault(param_groups[index], []).append(index)
        for group, indices in by_group.items():
            name = unit.name if len(by_group) == 1 else f"{unit.name} (group {group})"
            out.append(dataclasses.replace(unit, name=name, param_indices=tuple(indices), group=group))
    return out
