"""A stand-in group for testing ``Plan`` without a world: what ``Plan`` and ``validate._split_counts`` read of a
group, and a ``run`` that hands back the record it is given instead of running it."""


class RecordingGroup:
    on_cpu = True
    rank = 0
    my_global_rank = 0

    def __init__(self, size: int):
        self._size = size

    def size(self) -> int:
        return self._size

    def run(self, call):
        return call
