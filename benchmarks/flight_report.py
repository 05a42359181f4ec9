"""``zerocomm-trace flight DIR``: merge the ranks' flight records and say where they parted.

    ZEROCOMM_FLIGHT_DUMP=flight torchrun --nproc-per-node 4 train.py   # each rank: flight/flight-rank<R>.json
    zerocomm-trace flight flight

Each rank writes its record (the last calls of each of its groups, see docs/failures.md) on a timeout or a lost
peer and at ``destroy_process_group``.  This reads every ``flight-rank<R>.json`` of the folder and prints, for
each group, the first call number on which its ranks diverge -- a rank that has no such call (missing), or one
whose call differs in collective, size or dtype -- then where each rank stands: its last call, that call's state
(queued, started, issued, completed, failed) and the caller's ``file:line`` where it is known (a call in
progress at a failure, or every call under ``ZEROCOMM_FLIGHT_CALLERS=1``).  A rank that wrote no file is named
as such.  It reads JSON only: it runs on any machine, without a world.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import re
import sys
from typing import Dict, List, Optional

#: What two ranks' records of one call must agree on: collective, nbytes, numel, dtype (``FIELDS`` order).
FIELDS = ("seq", "collective", "nbytes", "numel", "dtype", "algorithm", "state", "where")
_SAME = (1, 2, 3, 4)


def load(folder: str) -> Dict[int, dict]:
    """Every rank's record in ``folder`` (``flight-rank<R>.json``), by rank."""
    found = {}
    for path in sorted(glob.glob(os.path.join(folder, "flight-rank*.json"))):
        match = re.search(r"flight-rank(\d+)\.json$", path)
        if match is None:
            continue
        with open(path) as source:
            found[int(match.group(1))] = json.load(source)
    return found


def _call(row: list) -> str:
    seq, collective, nbytes, numel, dtype, algorithm, state, where = row
    at = "" if where == "?" else f" at {where}"  # "?": the caller was not recorded (ZEROCOMM_FLIGHT_CALLERS)
    return f"#{seq} {collective} {nbytes} B {dtype} ({algorithm}, {state}){at}"


def _standing(content: dict) -> str:
    """Where the rank's thread stood when it wrote the record, if outside any collective."""
    now = content.get("now")
    if not now or now.get("in_call"):
        return ""
    return f"; it stood at {now['at']}, outside any collective"


def diverge(group_ranks: List[int], rows_by_rank: Dict[int, Optional[List[list]]]) -> Optional[dict]:
    """The first call of one group on which its ranks diverge, or ``None``.

    ``rows_by_rank``: each member's records of the group (``None``: the rank wrote no file).  Returns
    ``{"seq": n, "missing": [ranks without call n], "differ": [ranks whose call n differs from the most
    common one, or in a tie from the lowest rank's], "rows": {rank: row or None}}``.  Calls before the latest
    first record of any rank (a ring that wrapped) are not compared: nothing is known of them."""
    known = {rank: rows for rank, rows in rows_by_rank.items() if rows is not None}
    if not known:
        return None
    by_seq = {rank: {row[0]: row for row in rows} for rank, rows in known.items()}
    firsts = [rows[0][0] for rows in known.values() if rows]
    lasts = [rows[-1][0] for rows in known.values() if rows]
    if not lasts:
        return None
    start = max(firsts) if len(firsts) == len(known) else 1
    for seq in range(start, max(lasts) + 1):
        rows = {rank: by_seq[rank].get(seq) for rank in known}
        keys = [tuple(row[i] for i in _SAME) for rank, row in sorted(rows.items()) if row is not None]
        common = max(keys, key=keys.count)  # the most common call; a tie: the lowest rank's
        missing = sorted(rank for rank, row in rows.items() if row is None)
        differ = sorted(rank for rank, row in rows.items()
                        if row is not None and tuple(row[i] for i in _SAME) != common)
        if missing or differ:
            return {"seq": seq, "missing": missing, "differ": differ, "rows": rows}
    return None


def report(records: Dict[int, dict]) -> str:
    """The text ``zerocomm-trace flight`` prints for the records of one run (:func:`load`)."""
    if not records:
        return "no flight-rank<R>.json records found"
    world_size = max(content.get("world_size", 0) for content in records.values())
    lines = [f"flight records of {len(records)} of {world_size} ranks"]
    absent = [rank for rank in range(world_size) if rank not in records]
    if absent:
        lines.append(f"no record from rank(s) {absent}: they never wrote one (killed, or still running)")
    groups: Dict[str, List[int]] = {}
    for content in records.values():
        for name, group in content.get("groups", {}).items():
            groups.setdefault(name, group["ranks"])
    for name, ranks in groups.items():
        rows_by_rank = {rank: records[rank]["groups"].get(name, {}).get("records", [])
                        if rank in records else None for rank in ranks}
        found = diverge(ranks, rows_by_rank)
        if found is None:
            count = max((rows[-1][0] for rows in rows_by_rank.values() if rows), default=0)
            unknown = [rank for rank in ranks if rows_by_rank[rank] is None]
            if unknown:  # a rank that died writes nothing: its peers' failures (below) say what it last called
                lines.append(f"group {name} (ranks {ranks}): the ranks with a record agree on their {count} "
                             f"call(s); rank(s) {unknown} left none (see the failures below)")
            else:
                lines.append(f"group {name} (ranks {ranks}): no divergence in its {count} recorded call(s)")
            continue
        seq = found["seq"]
        lines.append(f"group {name} (ranks {ranks}): the ranks diverge first at call #{seq}")
        for rank in ranks:
            if rank not in found["rows"]:
                lines.append(f"  rank {rank}: no record")
                continue
            row = found["rows"][rank]
            if row is None:
                rows = rows_by_rank[rank]
                last = f"its last call is {_call(rows[-1])}" if rows else "it made no call on this group"
                lines.append(f"  rank {rank}: missing ({last})")
            else:
                mark = "  <- differs" if rank in found["differ"] else ""
                lines.append(f"  rank {rank}: {_call(row)}{mark}")
        if found["missing"]:
            lines.append(f"  missing at call #{seq}: rank(s) {found['missing']}")
        if found["differ"]:
            lines.append(f"  different call at #{seq}: rank(s) {found['differ']}")
    lines.append("where each rank stands (its last call on each group):")
    for rank in sorted(records):
        content = records[rank]
        last = [f"{name}: {_call(group['records'][-1])}" for name, group in content.get("groups", {}).items()
                if group.get("records")]
        lines.append(f"  rank {rank} (host {content.get('host', '?')}, pid {content.get('pid', '?')}): "
                     + ("; ".join(last) if last else "no calls") + _standing(content))
        if content.get("failure"):
            lines.append(f"    its failure: {content['failure']}")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="zerocomm-trace", description="Read zerocomm's records of a run.")
    commands = parser.add_subparsers(dest="command", required=True)
    flight = commands.add_parser("flight", help="merge the ranks' flight records (ZEROCOMM_FLIGHT_DUMP) and print "
                                                "the first call on which they diverge")
    flight.add_argument("folder", metavar="DIR", help="the folder ZEROCOMM_FLIGHT_DUMP named")
    args = parser.parse_args(argv)
    if not os.path.isdir(args.folder):
        print(f"zerocomm-trace flight: {args.folder} is not a folder", file=sys.stderr)
        return 2
    records = load(args.folder)
    print(report(records))
    return 0 if records else 1


if __name__ == "__main__":
    sys.exit(main())
