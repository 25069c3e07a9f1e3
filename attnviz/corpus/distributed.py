"""``attnviz heads --ray``: the scan's batches as Ray Data ``map_batches`` on a cluster.

The only module that imports ray (the optional extra ``attnviz[ray]``). The driver reads
and tokenizes the corpus (so every error still names its file and line), ships padded-batch
work items to actor workers that each load the model once, and merges the per-head
accumulators they send back (``HeadAccumulator.merge``: exact, in any order). Workers get a
GPU each when the cluster has GPUs, else CPUs.

The corpus goes to Ray in chunks of ``chunk_batches`` batches, one dataset per chunk, so the
driver's memory stays flat in the corpus size, as in the single-process scan.
"""

from __future__ import annotations

import contextlib
import logging
import pickle
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import AttnvizError, UsageError
from .scan import CorpusText, Prepared, Progress, Scan, ScanOptions, ScanReport, score_batch

if TYPE_CHECKING:
    from ..engines import Engine


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise UsageError(
            "Ray is not installed", hint="pip install 'attnviz[ray]' (Ray Data), or scan in this process"
        ) from None
    return ray


class _Scorer:
    """A Ray Data actor: loads the model once, scores each batch it is handed."""

    def __init__(self, model: str | None, engine: str, device: str, dtype: str, options: ScanOptions) -> None:
        from ..engines import load_engine

        self.engine = load_engine(engine, model, device, dtype)
        self.options = options

    def __call__(self, rows: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        results, texts = [], []
        for blob in rows["batch"]:
            batch: list[Prepared] = pickle.loads(blob)
            acc, tally = score_batch(self.engine, batch, self.options)
            results.append(pickle.dumps((acc, tally)))
            texts.append(len(batch))
        return {"result": np.array(results, dtype=object), "texts": np.array(texts)}


class RayScan:
    """The scan of ``corpus.Scan``, with the forward passes on Ray.

    Args:
        engine: the driver's engine, for tokenizing and the model's shape.
        options: as for ``Scan``.
        address: a Ray cluster address (``auto``, ``ray://head:10001``); None starts a local
            instance with 2 CPUs and no dashboard.
        model, engine_name, device, dtype: how each worker loads the model (the model spec
            must resolve on every node: a shared path, the packaged model or a cached Hub id).
        chunk_batches: batches per Ray dataset.
    """

    def __init__(
        self,
        engine: Engine,
        options: ScanOptions,
        address: str | None = None,
        *,
        model: str | None = None,
        engine_name: str = "own",
        device: str = "auto",
        dtype: str = "float32",
        chunk_batches: int = 256,
    ) -> None:
        self.ray = _ray()
        self.scan = Scan(engine, options)
        self.options = options
        self.address = address
        self.worker = {"model": model, "engine": engine_name, "device": device, "dtype": dtype, "options": options}
        self.chunk_batches = chunk_batches

    def _start(self) -> bool:
        """Connect to (or start) Ray; True when this call started it."""
        ray = self.ray
        if ray.is_initialized():
            return False
        quiet = {"logging_level": logging.ERROR, "log_to_driver": False, "configure_logging": True}
        if self.address is None:
            try:
                ray.init(num_cpus=2, include_dashboard=False, **quiet)
            except Exception as exc:  # Ray raises a bare Exception when its node does not come up
                with contextlib.suppress(Exception):
                    ray.shutdown()
                said = (str(exc).splitlines() or [type(exc).__name__])[0]
                raise AttnvizError(
                    f"Ray could not start a local instance: {said}",
                    hint="a busy machine can keep Ray's processes from starting within its 30 s: try again, "
                    "or scan without --ray",
                ) from None
        else:
            reach(self.address)  # ray.init waits forever on an address where nothing listens
            try:
                ray.init(address=self.address, **quiet)
            except (ConnectionError, ValueError, RuntimeError) as exc:
                raise UsageError(
                    f"cannot connect to the Ray cluster at {self.address!r}: {str(exc).splitlines()[0]}",
                    hint="check the address: auto on a node of the cluster, or ray://HEAD:10001 from outside",
                ) from None
        ctx = ray.data.DataContext.get_current()
        # After ray.data's import, which configures its own loggers.
        for name in ("ray", "ray.data"):
            logging.getLogger(name).setLevel(logging.ERROR)
        ctx.enable_progress_bars = False
        for name in ("print_on_execution_start", "enable_operator_progress_bars"):
            if hasattr(ctx, name):
                setattr(ctx, name, False)
        return True

    def _placement(self) -> dict[str, Any]:
        """Actors per GPU where the cluster has GPUs, else one per spare CPU."""
        resources = self.ray.cluster_resources()
        gpus = int(resources.get("GPU", 0))
        pool = self.ray.data.ActorPoolStrategy
        if gpus:
            self.worker["device"] = "cuda"
            return {"num_gpus": 1, "compute": pool(size=gpus)}
        self.worker["device"] = "cpu"
        cpus = int(resources.get("CPU", 1))
        return {"num_cpus": 1, "compute": pool(size=max(1, min(cpus - 1, 8)))}

    def run(self, items: Iterable[CorpusText], progress: Progress | None = None) -> ScanReport:
        started = self._start()
        try:
            placement = self._placement()
            for chunk in _chunks(self.scan.batches(items, progress), self.chunk_batches):
                ds = self.ray.data.from_items([{"batch": pickle.dumps(batch)} for batch in chunk])
                scored = ds.map_batches(
                    _Scorer, fn_constructor_kwargs=self.worker, batch_size=1, batch_format="numpy", **placement
                )
                for row in scored.iter_rows():
                    acc, tally = pickle.loads(row["result"])
                    self.scan.fold(acc, tally, int(row["texts"]))
                    if progress is not None:
                        progress(int(row["texts"]))
            return self.scan.report()
        finally:
            if started:
                self.ray.shutdown()

    def report(self, partial: bool = False) -> ScanReport:
        return self.scan.report(partial)


def _chunks(batches: Iterator[list[Prepared]], size: int) -> Iterator[list[list[Prepared]]]:
    chunk: list[list[Prepared]] = []
    for batch in batches:
        chunk.append(batch)
        if len(chunk) >= size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


CONNECT_TIMEOUT = 10.0  # seconds for one TCP connection to a Ray head


def reach(address: str, timeout: float = CONNECT_TIMEOUT) -> None:
    """A TCP connection to a ``HOST:PORT`` or ``ray://HOST:PORT`` address succeeds within
    ``timeout`` seconds (``auto`` and other forms are left to Ray).

    ``ray.init(address="127.0.0.1:1")`` retried for ever (issue 25); this bounds it.

    Raises:
        UsageError: nothing answers there, naming the address and the reason.
    """
    import socket

    target = address.removeprefix("ray://")
    host, sep, port = target.rpartition(":")
    if not sep or not port.isdigit() or not host:
        return
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            pass
    except (OSError, ValueError, OverflowError) as exc:
        reason = "timed out" if isinstance(exc, TimeoutError) else (getattr(exc, "strerror", None) or str(exc))
        raise UsageError(
            f"cannot connect to the Ray cluster at {address!r}: {reason} (after at most {timeout:g} s)",
            hint="check the address and that the Ray head is running: auto on a node of the cluster, "
            "or ray://HEAD:10001 from outside",
            reason="ray_unreachable",
        ) from None
