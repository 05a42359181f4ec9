"""Pools of ranks that stay alive across tests and run one function on every rank.

``pool.run(fn, *args, timeout=60.0, **kwargs)`` sends ``fn`` (pickled by reference, so it
must be a module-level function) to every rank, calls ``fn(*args, **kwargs)`` there after the
rank has initialized its default group, and returns the per-rank return values (index = rank).

Two pools share one protocol (a pickled ``("run", fn, args, kwargs, timeout)`` in, a pickled
``("ok", value)`` or ``("err", type_name, message, traceback_text)`` out):

* ``ForkPool``: world_size children forked from the test process, each initializing
  ``backend`` over a ``FileStore``; messages go over ``multiprocessing`` pipes.
* ``MpiexecPool``: one ``mpiexec -n N python -m support.mpi_worker`` job whose ranks connect back
  to a TCP socket of the parent and initialize ``"mpi"``; messages are length-prefixed pickles.

[Note: why a failure kills the whole pool]
After an error, a death or a timeout the ranks may be out of step (one in a collective that the
others left), so the pool kills every process and starts afresh, lazily, on the next ``run``.
A function that expects an error must catch it itself and return, e.g., ``(type(e).__name__,
str(e))``; then the pool stays up.

Safety nets, so that nothing outlives the test session: the parent waits with deadlines only;
each rank arms ``SIGALRM`` for its task's timeout plus a grace period and exits when the test
process goes away; a rank that does not answer in time gets ``SIGUSR1`` first, which makes
``faulthandler`` write its Python stack, and that stack goes into the ``PoolTimeout`` message.
What runs inside a rank is in rank_loop.py.
"""
from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import os
import pickle
import secrets
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

from .rank_loop import (ENV_ADDR, ENV_PARENT, ENV_SYSPATH, ENV_TOKEN, RankSetup, SocketChannel, fork_child,
                        init_default_group, name_of)

__all__ = ["ForkPool", "MpiexecPool", "RankFailure", "PoolTimeout", "MpiUnavailable", "RankSetup",
           "init_default_group"]

FAILURE_GRACE_S = 2.0
"""After the first rank fails, how long the others may still answer before the pool is killed."""

STACK_WAIT_S = 0.5
"""How long a timed-out rank gets to write its stack after SIGUSR1."""


class RankFailure(Exception):
    """One or more ranks raised, died or did not answer.

    ``rank`` is the rank that failed first (the others often fail because of it), ``exc_type_name``
    the name of the exception it raised (``None`` when it died or timed out), ``signal_name`` the
    signal that killed it, and ``failures`` maps every failing rank to its report.
    """

    def __init__(self, message: str, *, rank: int, exc_type_name: str | None,
                 failures: dict[int, str], signal_name: str | None = None):
        super().__init__(message)
        self.rank = rank
        self.exc_type_name = exc_type_name
        self.failures = failures
        self.signal_name = signal_name


class PoolTimeout(RankFailure):
    """The deadline passed; ``ranks`` lists the ranks that had not answered."""

    def __init__(self, message: str, *, ranks: list[int], failures: dict[int, str]):
        super().__init__(message, rank=ranks[0], exc_type_name=None, failures=failures)
        self.ranks = ranks


class MpiUnavailable(RuntimeError):
    """mpi4py or the venv's mpiexec is missing, so an MpiexecPool cannot start."""


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _tail(text: str, lines: int) -> str:
    return "\n".join(text.rstrip().splitlines()[-lines:])


def _innermost_frames(dump: str, frames: int = 16) -> str:
    """A faulthandler dump with each thread's frames cut to the ``frames`` innermost."""
    kept, shown = [], 0
    for line in dump.rstrip().splitlines():
        if line.startswith("Extension modules:"):
            continue
        if line.startswith("  File "):
            shown += 1
            if shown == frames + 1:
                kept.append("  ... (outer frames left out)")
            if shown > frames:
                continue
            if line.endswith(" in _fork_child"):  # below it: the test process's frames, from before fork
                shown = frames + 1
        else:
            shown = 0
        kept.append(line)
    return "\n".join(kept)


class _Pool:
    """Shared logic: launch lazily, send one task to every rank, gather answers with a deadline."""

    kind = "pool"

    def __init__(self, world_size: int, backend: str, *, workdir: str | os.PathLike | None,
                 init: Callable[[RankSetup], None] | None, init_timeout_s: float, op_timeout_s: float):
        if world_size < 1:
            raise ValueError(f"world_size must be at least 1, got {world_size}")
        self.world_size = world_size
        self.backend = backend
        self.init = init or init_default_group
        self.init_timeout_s = init_timeout_s
        self.op_timeout_s = op_timeout_s
        self._own_workdir = workdir is None
        self.workdir = Path(workdir) if workdir is not None else Path(tempfile.mkdtemp(prefix="zerocomm-pool-"))
        self.generation = 0  # how many times ranks were launched; names the store and stack files
        self._pids: list[int] | None = None
        self.deadline_limit: float | None = None
        """An absolute ``time.monotonic()`` no run or start may wait past (set by the ``world``
        fixture from the test's pytest-timeout, so that the pool's message comes first)."""

    def __repr__(self) -> str:
        state = f"pids {self._pids}" if self._pids else "not started"
        return f"{type(self).__name__}({self.backend}, world_size={self.world_size}, {state})"

    @property
    def started(self) -> bool:
        return self._pids is not None

    @property
    def pids(self) -> list[int]:
        """Process ids of the ranks (index = rank); starts the pool if needed."""
        self.start()
        return list(self._pids)

    def start(self) -> None:
        """Launch the ranks and wait until every one initialized (no-op when running)."""
        if self._pids is not None:
            return
        self.generation += 1
        deadline, limit = self._deadline(self.init_timeout_s, "init_timeout_s")
        try:
            self._launch(deadline)
            self._pids = self._collect(f"initialization ({name_of(self.init)})", deadline, limit)
        except BaseException:
            self.kill()
            raise

    def run(self, fn: Callable, *args, timeout: float = 60.0, **kwargs) -> list:
        """Call ``fn(*args, **kwargs)`` on every rank; return the values, index = rank.

        Raises ``RankFailure`` (or its subclass ``PoolTimeout``) and kills the pool when a rank
        raises, dies or has not answered within ``timeout`` seconds.
        """
        try:
            payload = pickle.dumps(("run", fn, args, kwargs, timeout))
        except Exception as exc:
            raise TypeError(f"pool.run needs a module-level function and picklable arguments: "
                            f"{name_of(fn)}: {exc}") from exc
        self.start()
        try:
            self._send_all(payload)
            return self._collect(name_of(fn), *self._deadline(timeout, "timeout"))
        except BaseException as exc:
            if not isinstance(exc, RankFailure) and self._pids is not None:
                exc.add_note(f"{self!r} was killed while running {name_of(fn)}")
            self.kill()
            raise

    def _collect(self, what: str, deadline: float, limit: str) -> list:
        pending = set(range(self.world_size))
        values: list = [None] * self.world_size
        failures: dict[int, str] = {}
        # The first failure in time is reported first: under mpiexec the death of one rank ends
        # the others, and their deaths come later.
        first: tuple[int, str | None, str | None] | None = None  # (rank, exc type, signal)
        while pending:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            for rank, data in sorted(self._wait(pending, left), key=lambda answer: answer[0]):
                pending.discard(rank)
                if data is None:
                    text, sig = self._death_report(rank, first_failure=first is None)
                    headline, _, details = text.partition("\n")
                    failures[rank] = (f"rank {rank} (pid {self._pid_of(rank)}) {headline} while running {what}"
                                      + (f"\n{details}" if details else ""))
                    stack = self._read_stack(rank)
                    if stack:
                        failures[rank] += f"\nits Python stack when it crashed:\n{stack}"
                    first = first or (rank, None, sig)
                    continue
                reply = pickle.loads(data)
                if reply[0] == "ok":
                    values[rank] = reply[1]
                    continue
                _, type_name, message, text = reply
                failures[rank] = (f"rank {rank} (pid {self._pid_of(rank)}) raised {type_name} in {what}: "
                                  f"{message}\n{text}")
                first = first or (rank, type_name, None)
            if failures:
                deadline = min(deadline, time.monotonic() + FAILURE_GRACE_S)
        if failures:
            rank, type_name, sig = first
            lines = [f"{len(failures)} of {self.world_size} ranks of {self!r} failed in {what}; "
                     f"first rank {rank}"]
            if pending:
                lines.append(f"ranks {sorted(pending)} had not answered {FAILURE_GRACE_S} s after "
                             f"the first failure (killed)")
            lines += [failures[rank]] + [failures[r] for r in sorted(failures) if r != rank]
            raise RankFailure("\n".join(lines), rank=rank, exc_type_name=type_name,
                              failures=failures, signal_name=sig)
        if pending:
            raise self._timeout(what, sorted(pending), limit)
        return values

    def _deadline(self, seconds: float, name: str) -> tuple[float, str]:
        """The absolute deadline for waiting ``seconds``, within ``deadline_limit``; and its description."""
        now = time.monotonic()
        if self.deadline_limit is not None and self.deadline_limit < now + seconds:
            return self.deadline_limit, (f"{max(0.0, self.deadline_limit - now):.1f} s (what the test's "
                                         f"pytest-timeout left of {name}={seconds})")
        return now + seconds, f"{seconds} s ({name})"

    def _timeout(self, what: str, pending: list[int], limit: str) -> PoolTimeout:
        stacks = self._dump_stacks(pending)
        answered = sorted(set(range(self.world_size)) - set(pending))
        lines = [f"{what} timed out after {limit} on {self!r}: ranks {pending} had not answered"
                 f" (answered: {answered})"]
        failures = {}
        for rank in pending:
            failures[rank] = f"rank {rank} (pid {self._pid_of(rank)}) had not answered; its Python stack:\n" \
                             f"{stacks.get(rank) or '(no stack written)'}"
            lines.append(failures[rank])
        return PoolTimeout("\n".join(lines), ranks=pending, failures=failures)

    def _dump_stacks(self, ranks: list[int]) -> dict[int, str]:
        """Asks ``ranks`` for their Python stacks (SIGUSR1 -> faulthandler) and returns them."""
        offsets = {}
        for rank in ranks:
            pid = self._pid_of(rank)
            if pid is None:
                continue
            try:
                offsets[rank] = self._stack_path(rank).stat().st_size  # read only the new dump
                os.kill(pid, signal.SIGUSR1)
            except OSError:
                pass
        if not offsets:
            return {}
        time.sleep(STACK_WAIT_S)
        return {rank: self._read_stack(rank, offset) for rank, offset in offsets.items()}

    def _read_stack(self, rank: int, offset: int = 0) -> str:
        """What faulthandler wrote for ``rank`` after ``offset`` (on SIGUSR1 or a crash), each
        thread cut to its innermost frames: a forked rank's stack goes on into the test process's."""
        try:
            with open(self._stack_path(rank), errors="replace") as handle:
                handle.seek(offset)
                return _innermost_frames(handle.read())
        except OSError:
            return ""

    def _stack_path(self, rank: int) -> Path:
        return self.workdir / f"stack-g{self.generation}-rank{rank}.txt"

    def close(self) -> None:
        """Ask the ranks to exit, kill what is left, and remove a workdir the pool created."""
        if self._pids is not None:
            try:
                self._send_all(pickle.dumps(("exit",)))
            except OSError:
                pass
            self._await_exit(5.0)
        self.kill()
        if self._own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    # Backend hooks --------------------------------------------------------------------------
    def _launch(self, deadline: float) -> None:
        raise NotImplementedError

    def _send_all(self, payload: bytes) -> None:
        raise NotImplementedError

    def _wait(self, pending: set[int], timeout: float) -> list[tuple[int, bytes | None]]:
        """Blocks up to ``timeout`` s; returns (rank, message) pairs, message None for a dead rank."""
        raise NotImplementedError

    def _death_report(self, rank: int, first_failure: bool) -> tuple[str, str | None]:
        """Says how ``rank`` ended ("died from signal SIGKILL", then details on further lines)
        and the signal's name; ``first_failure`` is False for ranks that failed after another."""
        raise NotImplementedError

    def _pid_of(self, rank: int) -> int | None:
        raise NotImplementedError

    def _await_exit(self, timeout: float) -> None:
        raise NotImplementedError

    def kill(self) -> None:
        """Kill every process of the pool now; the next ``run`` starts new ones."""
        raise NotImplementedError


class ForkPool(_Pool):
    """``world_size`` ranks forked from this process, each in ``backend`` over a FileStore in ``workdir``.

    Fork only from a process that has not initialized CUDA (checked).
    """

    kind = "fork"

    def __init__(self, world_size: int, backend: str = "gloo", *, workdir=None, init=None,
                 init_timeout_s: float = 60.0, op_timeout_s: float = 30.0):
        super().__init__(world_size, backend, workdir=workdir, init=init,
                         init_timeout_s=init_timeout_s, op_timeout_s=op_timeout_s)
        self._procs: list = []
        self._conns: list = []

    def _launch(self, deadline: float) -> None:
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_initialized():
            raise RuntimeError("ForkPool cannot fork: this process has initialized CUDA; "
                               "keep CUDA out of the test process or use spawn")
        context = multiprocessing.get_context("fork")
        store_path = self.workdir / f"store-g{self.generation}"
        parent_ends = []
        for rank in range(self.world_size):
            parent_end, child_end = context.Pipe(duplex=True)
            process = context.Process(
                target=fork_child, daemon=True, name=f"{self.backend}-rank{rank}",
                args=(rank, self.world_size, child_end, parent_ends + [parent_end], store_path,
                      self.backend, self.op_timeout_s, self.init, self.init_timeout_s,
                      self._stack_path(rank), os.getpid()))
            process.start()
            child_end.close()
            parent_ends.append(parent_end)
            self._procs.append(process)
            self._conns.append(parent_end)

    def _send_all(self, payload: bytes) -> None:
        for conn in self._conns:
            conn.send_bytes(payload)

    def _wait(self, pending, timeout):
        by_object = {}
        for rank in pending:
            by_object[self._conns[rank]] = rank
            by_object[self._procs[rank].sentinel] = rank
        ready = multiprocessing.connection.wait(list(by_object), timeout)
        answers = {}
        for obj in ready:
            rank = by_object[obj]
            if rank in answers:
                continue
            conn = self._conns[rank]
            try:  # a rank may have answered and then exited: read its answer first
                answers[rank] = conn.recv_bytes() if conn.poll() else None
            except (EOFError, OSError):
                answers[rank] = None
        return list(answers.items())

    def _death_report(self, rank, first_failure):
        process = self._procs[rank]
        process.join(1.0)
        code = process.exitcode
        if code is None:
            return "closed its pipe but is still running", None
        if code < 0:
            name = _signal_name(-code)
            return f"died from signal {name}", name
        return f"exited with code {code}", None

    def _pid_of(self, rank):
        return self._procs[rank].pid if rank < len(self._procs) else None

    def _await_exit(self, timeout):
        deadline = time.monotonic() + timeout
        for process in self._procs:
            process.join(max(0.0, deadline - time.monotonic()))

    def kill(self):
        for process in self._procs:
            if process.is_alive():
                process.kill()
        for process in self._procs:
            process.join(5.0)
        for conn in self._conns:
            conn.close()
        self._procs, self._conns, self._pids = [], [], None


class MpiexecPool(_Pool):
    """One ``mpiexec -n world_size`` job whose ranks connect back to this process over TCP.

    Raises ``MpiUnavailable`` when mpi4py or the mpiexec next to ``sys.executable`` is missing.
    ``init`` must be a module-level function (it is pickled by reference to the ranks).
    """

    kind = "mpiexec"

    def __init__(self, world_size: int, backend: str = "mpi", *, workdir=None, init=None,
                 init_timeout_s: float = 120.0, op_timeout_s: float = 30.0,
                 env: dict[str, str] | None = None):
        import importlib.util

        self.mpiexec = Path(sys.executable).parent / "mpiexec"
        if importlib.util.find_spec("mpi4py") is None or not self.mpiexec.exists():
            raise MpiUnavailable(f"MpiexecPool needs mpi4py and {self.mpiexec}: pip install 'zerocomm[mpi]'")
        super().__init__(world_size, backend, workdir=workdir, init=init,
                         init_timeout_s=init_timeout_s, op_timeout_s=op_timeout_s)
        self.env = dict(env or {})
        package = __name__.rpartition(".")[0]
        self.worker_module = f"{package}.mpi_worker" if package else "mpi_worker"
        # The folder that holds the package of this module, so that `-m` finds the worker.
        self._import_root = str(Path(__file__).resolve().parents[1 if package else 0])
        self._proc: subprocess.Popen | None = None
        self._channels: dict[int, SocketChannel] = {}
        self._worker_pids: dict[int, int] = {}
        self._log_path: Path | None = None

    def _launch(self, deadline: float) -> None:
        listener = socket.create_server(("127.0.0.1", 0))
        token = secrets.token_hex(16)
        env = dict(os.environ)
        env.update(self.env)
        env[ENV_ADDR] = f"127.0.0.1:{listener.getsockname()[1]}"
        env[ENV_TOKEN] = token
        env[ENV_PARENT] = str(os.getpid())
        env[ENV_SYSPATH] = os.pathsep.join(p for p in sys.path if p)
        env["PYTHONPATH"] = os.pathsep.join([self._import_root] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
        self._log_path = self.workdir / f"mpiexec-g{self.generation}.log"
        with open(self._log_path, "wb") as log:
            self._proc = subprocess.Popen(
                [str(self.mpiexec), "-n", str(self.world_size), sys.executable, "-m", self.worker_module],
                env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            self._accept_all(listener, token, deadline)
        finally:
            listener.close()
        for rank, channel in self._channels.items():
            channel.send_bytes(pickle.dumps((self.backend, self.op_timeout_s, self.init,
                                             self.init_timeout_s, str(self._stack_path(rank)))))

    def _accept_all(self, listener: socket.socket, token: str, deadline: float) -> None:
        listener.settimeout(0.5)  # wakes up to notice an mpiexec that exited before connecting
        while len(self._channels) < self.world_size:
            if time.monotonic() > deadline:
                raise PoolTimeout(f"mpiexec ranks {sorted(set(range(self.world_size)) - set(self._channels))} "
                                  f"did not connect within {self.init_timeout_s} s; mpiexec output:\n"
                                  f"{self._log_tail()}",
                                  ranks=sorted(set(range(self.world_size)) - set(self._channels)), failures={})
            if self._proc.poll() is not None:
                raise RankFailure(f"mpiexec exited with code {self._proc.returncode} before all ranks "
                                  f"connected; its output:\n{self._log_tail()}",
                                  rank=min(set(range(self.world_size)) - set(self._channels)),
                                  exc_type_name=None, failures={})
            try:
                sock, _ = listener.accept()
            except TimeoutError:
                continue
            sock.settimeout(max(1.0, deadline - time.monotonic()))
            channel = SocketChannel(sock)
            try:
                kind, their_token, rank, size, pid = pickle.loads(channel.recv_bytes())
            except Exception:
                sock.close()
                continue
            if kind != "hello" or their_token != token or size != self.world_size:
                sock.close()
                continue
            sock.settimeout(None)
            self._channels[rank] = channel
            self._worker_pids[rank] = pid

    def _log_tail(self, lines: int = 30) -> str:
        try:
            return _tail(self._log_path.read_text(errors="replace"), lines) or "(empty)"
        except (OSError, AttributeError):
            return "(no output)"

    def _send_all(self, payload):
        for rank in range(self.world_size):
            self._channels[rank].send_bytes(payload)

    def _wait(self, pending, timeout):
        select = selectors.DefaultSelector()
        for rank in pending:
            select.register(self._channels[rank].sock, selectors.EVENT_READ, rank)
        answers = []
        for key, _ in select.select(timeout):
            channel = self._channels[key.data]
            channel.sock.settimeout(max(1.0, timeout))  # the rest of a message follows its header
            try:
                answers.append((key.data, channel.recv_bytes()))
            except (EOFError, OSError):
                answers.append((key.data, None))
            finally:
                channel.sock.settimeout(None)
        select.close()
        return answers

    def _death_report(self, rank, first_failure):
        if not first_failure:
            return "closed its connection (mpiexec ends every rank when one fails)", None
        try:
            code = self._proc.wait(2.0)
        except subprocess.TimeoutExpired:
            code = None
        log = self._log_tail(12)
        signal_name = None
        for line in log.splitlines():
            if "signal" in line.lower() and "(signal " in line:
                number = line.rsplit("(signal ", 1)[1].split(")")[0]
                if number.isdigit():
                    signal_name = _signal_name(int(number))
        if signal_name:
            how = f"died from signal {signal_name}"
        elif code is None:
            how = "closed its connection: it exited or died, and mpiexec has not said how"
        else:
            how = f"closed its connection; mpiexec exited with code {code}"
        return f"{how}\nmpiexec output:\n{log}", signal_name

    def _pid_of(self, rank):
        return self._worker_pids.get(rank)

    def _await_exit(self, timeout):
        try:
            self._proc.wait(timeout)
        except subprocess.TimeoutExpired:
            pass

    def kill(self):
        for pid in self._worker_pids.values():  # hydra puts each rank in its own session
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        if self._proc is not None:
            if self._proc.poll() is None:
                try:
                    os.killpg(self._proc.pid, signal.SIGKILL)
                except OSError:
                    pass
            try:
                self._proc.wait(5.0)
            except subprocess.TimeoutExpired:
                pass
        for channel in self._channels.values():
            channel.close()
        self._proc, self._channels, self._worker_pids, self._pids = None, {}, {}, None
