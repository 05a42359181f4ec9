"""The module the tests call ``dist``: ``zerocomm.comm``, or ``torch.distributed`` as a stand-in.

``ZEROCOMM_TEST_STANDIN=torch`` swaps in ``torch.distributed`` so that the harness and the tests
themselves can be developed before ``zerocomm.comm`` exists (torch's gloo lacks some cells, so
some tests fail there).  Under the stand-in the zerocomm-only error classes are placeholders that
nothing raises, and ``STANDIN`` is True so tests can leave out zerocomm-only arguments such as
``algorithm=``.
"""
from __future__ import annotations

import os

_CHOICE = os.environ.get("ZEROCOMM_TEST_STANDIN", "")

if _CHOICE == "torch":
    import torch.distributed as dist

    STANDIN = True

    class _Placeholder(Exception):
        """Nothing raises these: torch.distributed has no zerocomm errors."""

    class UnsupportedError(_Placeholder):
        pass

    class InvalidArgumentError(_Placeholder, ValueError):
        pass

    class NotInitializedError(_Placeholder, ValueError):
        pass

elif _CHOICE:
    raise ValueError(f"ZEROCOMM_TEST_STANDIN={_CHOICE!r}: the only stand-in is 'torch'; unset it to test zerocomm")
else:
    import zerocomm.comm as dist
    from zerocomm.comm import InvalidArgumentError, NotInitializedError, UnsupportedError

    STANDIN = False

__all__ = ["dist", "STANDIN", "UnsupportedError", "InvalidArgumentError", "NotInitializedError"]
