"""gloo_exits.py against the installed torch: it reads torch's build (pybind11's instance layout, the vtables and
mangled names of gloo's send and receive works), which no API promises, so every torch upgrade runs these.

Two gloo process groups of one process (threads, a ``HashStore``) give real gloo works without starting ranks.
"""
import datetime
import threading
import time

import pytest
import torch
import torch.distributed as td

from zerocomm.comm.backends import gloo_exits


def _base(version: str) -> str:
    return version.split("+")[0]


@pytest.fixture(scope="module")
def pair():
    store = td.HashStore()
    groups = [None, None]
    errors = []

    def make(rank):
        try:
            groups[rank] = td.ProcessGroupGloo(store, rank, 2, datetime.timedelta(seconds=20))
        except Exception as error:  # noqa: BLE001 - reported below
            errors.append(error)

    threads = [threading.Thread(target=make, args=(rank,), daemon=True) for rank in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    if errors or None in groups:
        pytest.skip(f"two gloo process groups could not connect in one process: {errors or 'timed out'}")
    yield groups


def test_the_installed_torch_is_one_gloo_exits_was_verified_on():
    installed = _base(torch.__version__)
    assert installed in gloo_exits.VERIFIED_TORCH, (
        f"torch {torch.__version__} is not among the versions gloo_exits.py was verified on "
        f"{gloo_exits.VERIFIED_TORCH}: it reads torch's build (pybind11's layout, gloo's vtables and mangled "
        f"names). Run tests/comm/test_gloo_exits.py on this torch and, if the abort tests pass, add "
        f"{installed!r} to gloo_exits.VERIFIED_TORCH")


def test_abort_ends_a_real_gloo_receive_at_once(pair):
    """A receive no peer will answer: ``abort`` recognises it (its vtable is this torch's RecvWork's) and its wait
    returns False at once; without the abort it would last until gloo's 20 s timeout."""
    work = pair[0].recv([torch.empty(4)], 1, 7)
    assert gloo_exits.abort(work), (f"gloo_exits.abort does not recognise a gloo RecvWork of torch "
                                    f"{torch.__version__}: the layout or the symbols it reads changed")
    start = time.monotonic()
    assert work.wait() is False
    assert time.monotonic() - start < 5


def test_abort_recognises_a_gloo_send_and_the_data_still_arrives_once_received(pair):
    sent = torch.arange(4, dtype=torch.float32)
    work = pair[0].send([sent], 1, 8)
    assert gloo_exits.abort(work), f"gloo_exits.abort does not recognise a gloo SendWork of torch {torch.__version__}"
    work.wait()  # aborted: False, or True where the send had completed; either way it returns
    received = torch.zeros(4)
    assert pair[1].recv([received], 0, 8).wait(timeout=datetime.timedelta(seconds=20))
    assert torch.equal(received, sent)


def test_abort_leaves_anything_else_alone(pair):
    """Not a gloo send or receive work: nothing is called, ``abort`` says so."""
    assert gloo_exits.abort(object()) is False
    tensor = torch.ones(2)
    work = pair[0].allreduce([tensor])  # a gloo work of another C++ type: the vtable check refuses it
    peer = pair[1].allreduce([torch.ones(2)])
    assert gloo_exits.abort(work) is False
    assert work.wait() and peer.wait()
    assert torch.equal(tensor, torch.full((2,), 2.0))
