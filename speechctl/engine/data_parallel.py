"""Data parallelism: whole jobs split over independent engine replicas, one process each.

This is what vLLM's data parallelism is for a dense model (both 0.26 and 0.32):

* its served DP runs every rank of a non-MoE model as an independent engine reconfigured to
  DP=1 ("Non-MoE DP ranks are completely independent, so treat like DP=1", ``EngineCoreProc``),
  each on the devices of its rank (the rank's slice of the visible devices);
* offline DP of a dense model is refused: ``VLLM_DP_*`` variables give "Offline data parallel
  mode is not supported/useful for dense models", ``data_parallel_rank`` gives "Non-MoE models do
  not support external data parallel mode. For external load balancing, launch independent vLLM
  instances without --data-parallel-* arguments", and ``data_parallel_size`` alone makes an
  in-process ``LLMEngine`` wait in the DP group's rendezvous for ranks that never come;
* the DP lock-step (``has_unfinished_requests`` all-reduced over the DP group, dummy batches from
  ``execute_dummy_batch`` on ranks without work) exists only inside a DP group, i.e. for MoE
  models, whose forward has expert-parallel collectives.

So a replica here is exactly such a rank: a process holding one ``Speech`` (engine + codec) with
vLLM at DP=1 on its own GPUs (CPU: its own cores); no DP group, so no rank waits for another and
``SpeechEngine``'s loop stays as it is (``vllm_compat.check_independent_replica``).

No scheduler of ours: job *i* goes to replica ``i % N`` (round robin by job index, whatever the
load), each replica batches its share continuously as one engine does, and results come back in
job order. A job is one ``StreamRequest`` inside one ``SpeechEngine``, which creates both
members of a CFG pair from it, so a pair never spans two replicas.
"""

from __future__ import annotations

import atexit
import os
import pickle
import queue
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from speechctl.accelerator import has_cuda, split_cores
from speechctl.errors import EngineError, InputError

END = "end"  # closes one run's share of jobs; None stops a replica
QUEUE_SIZE = 64  # jobs in flight to one replica beyond what its engine has taken


def replica_of(index: int, size: int) -> int:
    """The replica that runs job ``index``: round robin, so the split depends on nothing but the
    job order (a job is never split: a CFG pair is made inside the replica from one job)."""
    return index % size


@dataclass(frozen=True)
class Placement:
    """Where replica ``rank`` runs: environment set for its process (None: unset) and, on the
    CPU, the cores it may use."""

    rank: int
    env: dict
    cores: tuple[int, ...] | None = None


def placements(size: int, tensor_parallel_size: int = 1, on_gpu: bool | None = None) -> list[Placement]:
    """One placement per replica. GPU: replica r sees the visible devices r·TP … (r+1)·TP − 1, the
    slice vLLM gives DP rank r. CPU: an equal share of this process's cores (its TP ranks split
    that share again, ``vllm_compat.apply_engine_environment``)."""
    if size < 1 or tensor_parallel_size < 1:
        raise InputError(f"data parallel size {size} and tensor parallel size {tensor_parallel_size} must be >= 1")
    on_gpu = has_cuda() if on_gpu is None else on_gpu
    need = size * tensor_parallel_size
    what = f"data parallel size {size} x tensor parallel size {tensor_parallel_size} needs {need}"
    if on_gpu:
        import torch

        count = torch.cuda.device_count()
        visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
        devices = visible.split(",")[:count] if visible else [str(i) for i in range(count)]
        if need > len(devices):
            raise InputError(f"{what} GPUs; {len(devices)} visible")
        tp = tensor_parallel_size
        return [Placement(r, {"CUDA_VISIBLE_DEVICES": ",".join(devices[r * tp : (r + 1) * tp])}) for r in range(size)]
    available = len(os.sched_getaffinity(0))
    if need > available:
        raise InputError(f"{what} CPU cores; {available} available")
    return [Placement(r, {"OMP_NUM_THREADS": str(len(cores))}, cores) for r, cores in enumerate(split_cores(size))]


class ReplicaPool:
    """``size`` replica processes, each running ``factory()`` (picklable; returns an object with
    ``run(jobs) -> iterator of results``, each result carrying its job's ``id``).

    ``run(jobs)`` hands job *i* to replica ``i % size`` and yields the results in job order. Job
    ids must be unique within a run. A run that ends early (an error, or the caller stopping)
    stops the replicas; ``close()`` stops them too (also at exit)."""

    def __init__(self, factory: Callable[[], object], size: int, *, tensor_parallel_size: int = 1, on_gpu: bool | None = None):
        import multiprocessing as mp

        self.placements = placements(size, tensor_parallel_size, on_gpu)
        ctx = mp.get_context("spawn")  # CUDA and vLLM's engines are not fork-safe
        self._results = ctx.Queue()
        self._jobs = [ctx.Queue(QUEUE_SIZE) for _ in range(size)]
        self._procs = []
        self._closed = False
        atexit.register(self.close)  # runs before multiprocessing's exit hook joins the children
        try:
            for place in self.placements:
                proc = ctx.Process(
                    target=_replica_main,
                    # the factory as bytes: unpickling it may import vLLM, after the quietness is set
                    args=(place.rank, pickle.dumps(factory), self._jobs[place.rank], self._results, _quietness()),
                    name=f"speechctl-replica-{place.rank}",
                )
                with _placed(place):  # the child inherits its devices/cores from the start
                    proc.start()
                self._procs.append(proc)
            ready = set()
            while len(ready) < size:
                if (message := self._next()) is None:
                    continue
                kind, rank, payload = message
                if kind != "ready":
                    raise EngineError(f"data-parallel replica {rank} did not start: {payload}")
                ready.add(rank)
        except BaseException:
            self.close(wait=False)
            raise

    @property
    def size(self) -> int:
        return len(self._procs)

    def run(self, jobs: Iterable) -> Iterator:
        if self._closed:
            raise EngineError("the data-parallel replicas were stopped (an earlier run ended early)")
        feeder = _Feeder(iter(jobs), self._jobs)
        feeder.start()
        done, ahead, next_index = False, {}, 0  # ahead: results that finished before earlier jobs
        try:
            while feeder.count is None or next_index < feeder.count:
                if (message := self._next(feeder)) is None:
                    continue
                kind, rank, payload = message
                if kind != "result":
                    raise EngineError(f"data-parallel replica {rank}: {payload}")
                index, result = payload
                ahead[index] = result
                while next_index in ahead:
                    yield ahead.pop(next_index)
                    next_index += 1
            done = True
        finally:
            feeder.stop.set()
            if not done:  # replicas still hold jobs of this run: they cannot serve the next one
                self.close(wait=False)

    def _next(self, feeder: _Feeder | None = None) -> tuple | None:
        """The next message from a replica, or None after a short wait without one; raises when
        the feeder failed or a replica died."""
        if feeder is not None and feeder.error is not None:
            raise feeder.error
        try:
            return self._results.get(timeout=0.5)
        except queue.Empty:
            pass
        for rank, proc in enumerate(self._procs):
            if proc.exitcode is not None:
                raise EngineError(f"data-parallel replica {rank} exited (code {proc.exitcode})")
        return None

    def close(self, wait: bool = True) -> None:
        """Stop the replicas: let each finish and shut its engine down (``wait``), else end them."""
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self.close)
        for jobs in self._jobs:
            try:
                jobs.put_nowait(None)
            except queue.Full:
                pass
        for proc in self._procs:
            proc.join(timeout=60 if wait else 0.1)
            if proc.exitcode is None:
                proc.terminate()
                proc.join(timeout=10)
            if proc.exitcode is None:
                proc.kill()
                proc.join()


class _Feeder(threading.Thread):
    """Hands the jobs of one run to the replicas (job i to replica i % N), then an END to each;
    ``count`` is the number of jobs once all are handed out."""

    def __init__(self, jobs: Iterator, queues: list):
        super().__init__(name="speechctl-replica-feeder", daemon=True)
        self._source, self._queues = jobs, queues
        self.count: int | None = None
        self.error: BaseException | None = None
        self.stop = threading.Event()

    def run(self) -> None:
        try:
            seen: set = set()
            count = 0
            for index, job in enumerate(self._source):
                if job.id in seen:
                    raise InputError(f"job id {job.id!r} repeats: with data parallelism every job needs its own id")
                seen.add(job.id)
                self._put(self._queues[replica_of(index, len(self._queues))], (index, job))
                count = index + 1
            for jobs in self._queues:
                self._put(jobs, END)
            self.count = count
        except _Stopped:
            pass
        except BaseException as e:  # the job source failed (or a repeated id): run() raises it
            self.error = e

    def _put(self, jobs, item) -> None:
        while not self.stop.is_set():
            try:
                return jobs.put(item, timeout=0.5)
            except queue.Full:
                continue
        raise _Stopped


class _Stopped(Exception):
    pass


@contextmanager
def _placed(place: Placement):
    """This thread's environment and CPU affinity set to ``place`` while a child process starts
    (a spawned child inherits both: set before it imports torch or vLLM)."""
    saved_env = {k: os.environ.get(k) for k in place.env}
    saved_cores = os.sched_getaffinity(0) if place.cores else None
    try:
        _set_env(place.env)
        if place.cores:
            os.sched_setaffinity(0, place.cores)
        yield
    finally:
        _set_env(saved_env)
        if saved_cores:
            os.sched_setaffinity(0, saved_cores)


def _set_env(env: dict) -> None:
    for key, value in env.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def _quietness() -> tuple:
    """This process's warning filters and logger levels (say, the CLI's quiet vLLM logs)."""
    import logging
    import warnings

    loggers = logging.root.manager.loggerDict.items()
    return list(warnings.filters), {name: lg.level for name, lg in loggers if isinstance(lg, logging.Logger) and lg.level}


def _replica_main(rank: int, factory: bytes, jobs, results, quietness: tuple) -> None:
    """A replica process: build the runner, then run each share of jobs until told to stop."""
    import logging
    import multiprocessing as mp
    import warnings

    warnings.filters[:] = quietness[0]
    for name, level in quietness[1].items():
        logging.getLogger(name).setLevel(level)
    parent = mp.parent_process()
    try:
        runner = pickle.loads(factory)()
    except BaseException as e:
        results.put(("failed", rank, _one_line(e)))
        return
    results.put(("ready", rank, None))
    try:
        while (first := _take(jobs, parent)) is not None:
            ids: dict = {}  # job id -> job index (ids are unique within a run)

            def share(item=first, ids=ids):
                while isinstance(item, tuple):
                    index, job = item
                    ids[job.id] = index
                    yield job
                    item = _take(jobs, parent)

            for result in runner.run(share()):
                results.put(("result", rank, (ids.pop(result.id), result)))
    except BaseException as e:
        results.put(("error", rank, _one_line(e)))
    finally:
        getattr(runner, "close", lambda: None)()


def _take(jobs, parent):
    """The next item for this replica; None (stop) once the parent process is gone."""
    while True:
        try:
            return jobs.get(timeout=1.0)
        except queue.Empty:
            if parent is not None and not parent.is_alive():
                return None


def _one_line(e: BaseException) -> str:
    from speechctl.errors import SpeechctlError

    text = (str(e).strip().splitlines() or [""])[0]
    return text if isinstance(e, SpeechctlError) else f"{type(e).__name__}: {text}"


__all__ = ["Placement", "ReplicaPool", "placements", "replica_of"]
