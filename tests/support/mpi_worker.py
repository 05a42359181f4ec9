"""One rank of an ``MpiexecPool``: ``mpiexec -n N python -m support.mpi_worker`` (see harness.py)."""
from .rank_loop import mpi_worker_main

if __name__ == "__main__":
    mpi_worker_main()
