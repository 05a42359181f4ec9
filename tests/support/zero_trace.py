"""Rank-side tracing of one ZeRO training step: which zerocomm source files it enters.

A profile function (``sys.setprofile`` on this thread, ``threading.setprofile`` for threads started
afterwards) records the file of every Python function called while recording is on.  The ZeRO
optimizer runs on a group created *after* ``threading.setprofile``, so that group's executor thread
(where zerocomm runs collectives) is traced too.  Two warm-up steps come first, so one-time set-up
(lazy allocation, the first collective of a group) is not counted.
"""
from __future__ import annotations

import os
import sys
import threading

import zerocomm
from zerocomm.benchmarks.models import batch_for, build_model, loss_fn
from zerocomm.zero import ZeroConfig, initialize

from .dist import dist
from .zero_checks import adam

ROOT = os.path.dirname(os.path.abspath(zerocomm.__file__))


def files_of_one_step(stage: int = 2, **fields) -> list[str]:
    """Sorted paths (relative to the zerocomm package) of the library's files (comm/, zero/, ops/) one step
    (forward, backward, step) enters; the model's and the tests' own files are not counted."""
    rank = dist.get_rank()
    recording = {"on": False}
    files: set = set()

    def tracer(frame, event, arg):
        if recording["on"] and event == "call":
            files.add(frame.f_code.co_filename)

    threading.setprofile(tracer)
    try:
        group = dist.new_group(list(range(dist.get_world_size())))
        model, optimizer = initialize(build_model("lm", 0), adam, ZeroConfig(stage=stage, **fields), group=group)

        def step(index):
            x, y = batch_for(model, seed=0, rank=rank, step=index)
            loss_fn(model, model(x), y).backward()
            optimizer.step()
            optimizer.zero_grad()

        step(0)
        step(1)
        sys.setprofile(tracer)
        recording["on"] = True
        try:
            step(2)
        finally:
            recording["on"] = False
            sys.setprofile(None)
        optimizer.synchronize()
        optimizer.remove_hooks()
        dist.destroy_process_group(group)
    finally:
        threading.setprofile(None)
    library = [os.path.join(ROOT, part) + os.sep for part in ("comm", "zero", "ops")]
    return sorted(os.path.relpath(f, ROOT) for f in files if os.path.abspath(f).startswith(tuple(library)))
