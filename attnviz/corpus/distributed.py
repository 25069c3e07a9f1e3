"""``attnviz heads --ray``: the scan's batches on a pool of Ray actors.

The only module that imports ray (the optional extra ``attnviz[ray]``). The driver reads
and tokenizes the corpus (so every error still names its file and line), hands padded
batches to actors that each load the model once for the whole run, and merges the
per-head accumulators they send back (``HeadAccumulator.merge``: exact, in any order).
Actors get a GPU each when the cluster has GPUs, else a CPU each.

At most ``IN_FLIGHT`` batches per actor are out at a time, so the driver's memory stays
flat in the corpus size, as in the single-process scan.
"""

from __future__ import annotations

import contextlib
import logging
import pickle
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from ..errors import AttnvizError, Reason, UsageError
from .scan import CorpusText, Prepared, Progress, Scan, ScanOptions, ScanReport, score_batch

if TYPE_CHECKING:
    from ..engines import Engine

IN_FLIGHT = 2  # batches handed to each actor at a time: one scoring, one waiting


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise UsageError("Ray is not installed", hint="pip install 'attnviz[ray]', or scan in this process") from None
    return ray


def start(ray: Any, address: str | None) -> bool:
    """Connect to the Ray cluster at ``address`` (None: start a local instance with 2 CPUs and
    no dashboard); True when this call started it (and so should shut it down)."""
    if ray.is_initialized():
        return False
    quiet = {"logging_level": logging.ERROR, "log_to_driver": False, "configure_logging": True}
    if address is None:
        try:
            ray.init(num_cpus=2, include_dashboard=False, **quiet)
        except Exception as exc:  # Ray raises a bare Exception when its node does not come up
            with contextlib.suppress(Exception):
                ray.shutdown()
            said = (str(exc).splitlines() or [type(exc).__name__])[0]
            raise AttnvizError(
                f"Ray could not start a local instance: {said}",
                hint="a busy machine can keep Ray's processes from starting within its 30 s: try again, "
                "or run without --ray",
            ) from None
    else:
        reach(address)  # ray.init waits forever on an address where nothing listens
        try:
            ray.init(address=address, **quiet)
        except (ConnectionError, ValueError, RuntimeError) as exc:
            raise UsageError(
                f"cannot connect to the Ray cluster at {address!r}: {str(exc).splitlines()[0]}",
                hint="check the address: auto on a node of the cluster, or ray://HEAD:10001 from outside",
            ) from None
    logging.getLogger("ray").setLevel(logging.ERROR)
    return True


class _Scorer:
    """A Ray actor: loads the model once, scores each batch it is handed."""

    def __init__(self, model: str | None, engine: str, device: str, dtype: str, options: ScanOptions) -> None:
        from ..engines import load_engine

        self.engine = load_engine(engine, model, device, dtype)
        self.options = options

    def score(self, blob: bytes) -> bytes:
        batch: list[Prepared] = pickle.loads(blob)
        acc, tally = score_batch(self.engine, batch, self.options)
        return pickle.dumps((acc, tally, len(batch)))


class RayScan:
    """The scan of ``corpus.Scan``, with the forward passes on Ray.

    Args:
        engine: the driver's engine, for tokenizing and the model's shape.
        options: as for ``Scan``.
        address: a Ray cluster address (``auto``, ``ray://head:10001``); None starts a local
            instance with 2 CPUs and no dashboard.
        model, engine_name, device, dtype: how each actor loads the model (the model spec
            must resolve on every node: a shared path, the packaged model or a cached Hub id).
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
    ) -> None:
        self.ray = _ray()
        self.scan = Scan(engine, options)
        self.address = address
        self.worker = {"model": model, "engine": engine_name, "device": device, "dtype": dtype, "options": options}

    def _start(self) -> bool:
        """Connect to (or start) Ray; True when this call started it."""
        return start(self.ray, self.address)

    def _actors(self) -> list[Any]:
        """One actor per GPU where the cluster has GPUs, else one per spare CPU (up to 8)."""
        count, need, self.worker["device"] = _slots(self.ray)
        scorer = self.ray.remote(**need)(_Scorer)
        return [scorer.remote(**self.worker) for _ in range(count)]

    def run(self, items: Iterable[CorpusText], progress: Progress | None = None) -> ScanReport:
        started = self._start()
        actors: list[Any] = []
        try:
            actors = self._actors()
            free = [actor for actor in actors for _ in range(IN_FLIGHT)]  # one entry per slot
            out: dict[Any, Any] = {}  # a result's ref -> the actor scoring it
            for batch in self.scan.batches(items, progress):
                if not free:
                    free.append(self._fold_next(out, progress))
                actor = free.pop()
                out[actor.score.remote(pickle.dumps(batch))] = actor
            while out:
                self._fold_next(out, progress)
            return self.scan.report()
        finally:
            for actor in actors:
                with contextlib.suppress(Exception):
                    self.ray.kill(actor)
            if started:
                self.ray.shutdown()

    def _fold_next(self, out: dict[Any, Any], progress: Progress | None) -> Any:
        """Wait for the first result to come back, merge it, and return its actor."""
        (ref,), _ = self.ray.wait(list(out), num_returns=1)
        acc, tally, texts = pickle.loads(self.ray.get(ref))
        self.scan.fold(acc, tally, texts)
        if progress is not None:
            progress(texts)
        return out.pop(ref)

    def report(self, partial: bool = False) -> ScanReport:
        return self.scan.report(partial)


def _slots(ray: Any) -> tuple[int, dict[str, int], str]:
    """(actors, each one's resources, their device): one per GPU where the cluster has
    GPUs, else one per spare CPU (up to 8)."""
    resources = ray.cluster_resources()
    gpus = int(resources.get("GPU", 0))
    if gpus:
        return gpus, {"num_gpus": 1}, "cuda"
    return max(1, min(int(resources.get("CPU", 1)) - 1, 8)), {"num_cpus": 1}, "cpu"


class _Patcher:
    """A Ray actor: loads the model once, patches each pair it is handed (``patch --pairs --ray``)."""

    def __init__(self, model: str | None, engine: str, device: str, dtype: str) -> None:
        from ..engines import load_engine

        self.engine = load_engine(engine, model, device, dtype)

    def patch(self, blob: bytes) -> bytes:
        from ..measures.patching import patch_texts

        pair, options = pickle.loads(blob)
        result = patch_texts(self.engine, pair.clean, pair.corrupted, answer=pair.answer, wrong=pair.wrong, **options)
        return pickle.dumps(result)


def ray_patch(
    pairs: Sequence[Any],
    options: Sequence[dict[str, Any]],
    address: str | None = None,
    *,
    model: str | None = None,
    engine_name: str = "own",
    device: str = "auto",
    dtype: str = "float32",
) -> Iterator[Any]:
    """Each pair's ``PatchResult`` from a pool of Ray actors, in the pairs' order, with at
    most ``IN_FLIGHT`` pairs out per actor (``options[i]``: ``patch_texts``'s keywords for
    pair i). Stopping the iteration early (Ctrl-C) kills the actors."""
    ray = _ray()
    started = start(ray, address)
    actors: list[Any] = []
    try:
        count, need, device = _slots(ray)
        patcher = ray.remote(**need)(_Patcher)
        actors = [patcher.remote(model, engine_name, device, dtype) for _ in range(count)]
        out: deque[Any] = deque()
        for i, (pair, opts) in enumerate(zip(pairs, options, strict=True)):
            if len(out) >= IN_FLIGHT * len(actors):
                yield pickle.loads(ray.get(out.popleft()))
            out.append(actors[i % len(actors)].patch.remote(pickle.dumps((pair, opts))))
        while out:
            yield pickle.loads(ray.get(out.popleft()))
    finally:
        for actor in actors:
            with contextlib.suppress(Exception):
                ray.kill(actor)
        if started:
            ray.shutdown()


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
    if not sep or not (port.isascii() and port.isdigit()) or not host:
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
            reason=Reason.RAY_UNREACHABLE,
        ) from None
