"""``attnviz heads --probe retrieval``: needle-in-a-haystack prompts, generation with the
engine's cache, and each head's retrieval score (Wu et al. 2024; measures/retrieval.py).

A prompt of ``length`` tokens is built as

    [specials the tokenizer adds]  haystack[:d]  KEY NEEDLE  haystack[d:]  KEY

with the needle at depth ``d`` = round(depth × haystack length). The closing KEY is the
question: a model that retrieves writes the NEEDLE after it. The model writes as many tokens
as the needle has (greedy); at each step each head's strongest key is kept, nothing more,
so a case at 32k tokens holds (layers × heads) integers per step besides the model's cache.

Needle, key and haystack are drawn from the tokenizer's own vocabulary (its special tokens
aside) with numpy's seeded generator; the haystack never holds a needle or key token, so a
key that holds the written token inside the needle is a copy of the needle and nothing
else. Or they come from a JSON file ``{"haystack": ..., "needle": ..., "question": ...}``:
the haystack's tokens are repeated to the length, the needle inserted at each depth, the
question appended.

Each case runs alone (one generation); with Ray the cases go to a pool of actors that each
load the model once.
"""

from __future__ import annotations

import contextlib
import pickle
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import UsageError
from ..measures.retrieval import CaseScore, RetrievalReport, retrieval_counts
from ..tokens import Tokens

if TYPE_CHECKING:
    from tokenizers import Tokenizer

    from ..engines import Engine

KEY_TOKENS = 2  # the key that precedes the needle and closes the prompt
MAX_FILE_BYTES = 1 << 24


@dataclass(frozen=True)
class NeedleSpec:
    """What to build: prompt lengths (tokens), needle depths (0 = first, 1 = last), the
    needle's length in tokens (vocabulary needles), the seed, or a JSON file."""

    lengths: tuple[int, ...]
    depths: tuple[float, ...]
    needle_length: int = 8
    seed: int = 0
    file: Path | None = None

    def __post_init__(self) -> None:
        if not self.lengths or not self.depths:
            raise UsageError("the retrieval probe needs at least one length and one depth", hint="e.g. --lengths 1k")
        if self.needle_length < 1:
            raise UsageError(f"a needle of {self.needle_length} tokens", hint="--needle-length 1 or more")
        if any(n < 1 for n in self.lengths):
            raise UsageError(f"lengths {list(self.lengths)}: each must be a positive number of tokens", hint=None)
        if any(not 0 <= d <= 1 for d in self.depths):
            raise UsageError(f"depths {list(self.depths)}: each must lie in [0, 1]", hint="0 = first, 1 = last")


def within_positions(spec: NeedleSpec, config: dict[str, Any]) -> None:
    """Before loading: the longest prompt plus the needle written after it within the
    config's positions (a file's needle counts one token until it is tokenized)."""
    from ..architectures.base import config_value

    limit = config_value(config, "max_position_embeddings", "n_positions", "n_ctx", "seq_length")
    written = spec.needle_length if spec.file is None else 1
    if isinstance(limit, int) and max(spec.lengths) + written > limit:
        raise UsageError(
            f"a prompt of {max(spec.lengths)} tokens plus the {written}-token needle written after it passes "
            f"the model's {limit} positions",
            hint=f"lengths of at most {limit - written} tokens",
        )


def check_model(engine: Engine, spec: NeedleSpec) -> None:
    """After loading, before generating: a decoder with a language-model head, every prompt
    long enough for needle, key and question, and within the positions with the needle."""
    from ..generation import _lm_head, check_request

    p = parts(engine.tokenizer, spec)
    if min(spec.lengths) < shortest(p):
        raise UsageError(
            f"a prompt of {min(spec.lengths)} tokens cannot hold the {p.fixed} tokens of needle, key and question",
            hint=f"lengths of at least {shortest(p)} tokens",
        )
    longest = max(spec.lengths)
    check_request(
        engine, Tokens("", (0,) * longest, ("",) * longest, ((0, 0),) * longest, (False,) * longest), len(p.needle)
    )
    _lm_head(engine)


@dataclass(frozen=True)
class NeedleCase:
    """One prompt: its indices into the spec's lengths and depths, its token ids, the
    needle's span [start, stop) in them and the needle's ids (what a retriever writes)."""

    length: int
    depth: int
    ids: tuple[int, ...]
    span: tuple[int, int]
    needle: tuple[int, ...]


@dataclass(frozen=True)
class Parts:
    """The pieces every case is made of: the tokenizer's framing specials, the key
    (question), the needle and the haystack's token pool."""

    prefix: tuple[int, ...]
    key: tuple[int, ...]
    needle: tuple[int, ...]
    question: tuple[int, ...]
    haystack: tuple[int, ...]
    drawn: bool  # True: draw the haystack from ``haystack`` as a pool; False: repeat it in order

    @property
    def fixed(self) -> int:
        """Tokens of a prompt besides its haystack."""
        return len(self.prefix) + len(self.key) + len(self.needle) + len(self.question)


def parts(tokenizer: Tokenizer, spec: NeedleSpec) -> Parts:
    """The needle, key and haystack of ``spec``: from the vocabulary, or from its file."""
    frame = tokenizer.encode("a")
    mask = frame.special_tokens_mask
    prefix = tuple(frame.ids[: mask.index(0)]) if 0 in mask else ()
    if spec.file is not None:
        return _file_parts(tokenizer, spec.file, prefix)
    specials = {int(i) for i in tokenizer.get_added_tokens_decoder()}
    pool = np.array([i for i in range(tokenizer.get_vocab_size()) if i not in specials and tokenizer.id_to_token(i)])
    if len(pool) < KEY_TOKENS + spec.needle_length + 1:
        raise UsageError(
            f"the vocabulary has {len(pool)} ordinary tokens: too few for a key and a "
            f"{spec.needle_length}-token needle",
            hint="a shorter --needle-length, or --needle-file",
        )
    rng = np.random.default_rng(spec.seed)
    chosen = [int(i) for i in rng.choice(pool, size=KEY_TOKENS + spec.needle_length, replace=False)]
    key, needle = tuple(chosen[:KEY_TOKENS]), tuple(chosen[KEY_TOKENS:])
    hay = tuple(int(i) for i in pool if int(i) not in chosen)
    return Parts(prefix, key, needle, key, hay, drawn=True)


def _file_parts(tokenizer: Tokenizer, path: Path, prefix: tuple[int, ...]) -> Parts:
    from ..io.jsonread import loads

    try:
        raw = path.read_bytes()[: MAX_FILE_BYTES + 1]
    except OSError as exc:
        raise UsageError(f"cannot read --needle-file {str(path)!r}: {exc.strerror}", hint="check the path") from None
    hint = 'a JSON object {"haystack": "...", "needle": "...", "question": "..."}'
    record = loads(raw, f"--needle-file {str(path)!r}", max_bytes=MAX_FILE_BYTES, hint=hint)
    fields = ("haystack", "needle", "question")
    if not isinstance(record, dict) or not all(isinstance(record.get(f), str) and record[f].strip() for f in fields):
        raise UsageError(f"--needle-file {str(path)!r} is not {hint} with three non-empty texts", hint=hint)

    def ids(text: str) -> tuple[int, ...]:
        return tuple(tokenizer.encode(text, add_special_tokens=False).ids)

    return Parts(prefix, (), ids(record["needle"]), ids(record["question"]), ids(record["haystack"]), drawn=False)


def shortest(p: Parts) -> int:
    """The shortest prompt length these parts make (a haystack of one token)."""
    return p.fixed + 1


def cases(p: Parts, spec: NeedleSpec) -> Iterator[NeedleCase]:
    """Every (length, depth) prompt; one haystack per length, the same at every depth."""
    rng = np.random.default_rng(spec.seed + 1)
    pool = np.asarray(p.haystack)
    for a, length in enumerate(spec.lengths):
        size = length - p.fixed
        if size < 1:
            raise UsageError(
                f"a prompt of {length} tokens cannot hold the {p.fixed} tokens of needle, key and question",
                hint=f"lengths of at least {shortest(p)} tokens",
            )
        if p.drawn:
            hay = [int(i) for i in rng.choice(pool, size=size)]
        else:
            hay = [p.haystack[i % len(p.haystack)] for i in range(size)]
        for b, depth in enumerate(spec.depths):
            at = round(depth * size)
            ids = (*p.prefix, *hay[:at], *p.key, *p.needle, *hay[at:], *p.question)
            start = len(p.prefix) + at + len(p.key)
            yield NeedleCase(a, b, ids, (start, start + len(p.needle)), p.needle)


def case_tokens(engine: Engine, case: NeedleCase) -> Tokens:
    """The case's prompt as ``Tokens`` (labels from the vocabulary; no character offsets)."""
    tok = engine.tokenizer
    pieces = tuple(tok.id_to_token(i) or "" for i in case.ids)
    specials = {int(i) for i in tok.get_added_tokens_decoder()}
    return Tokens(" ".join(pieces), case.ids, pieces, ((0, 0),) * len(case.ids), tuple(i in specials for i in case.ids))


def score_case(engine: Engine, case: NeedleCase, layers: tuple[int, ...]) -> CaseScore:
    """Generate the needle's length of tokens after the case's prompt (greedy, the engine's
    cache) keeping each step's strongest keys, and count Wu et al.'s steps."""
    from ..generation import generate

    gen = generate(engine, case_tokens(engine, case), len(case.needle), layers=layers, keep=_strongest)
    if gen.partial:
        raise KeyboardInterrupt
    copied = sum(int(w == n) for w, n in zip(gen.ids, case.needle, strict=False))
    counts = retrieval_counts(gen, case.span)
    return CaseScore(case.length, case.depth, counts, len(case.needle), copied, len(case.ids))


def _strongest(rows: Any) -> Any:
    return rows.argmax(dim=-1)  # (layers, H, S) -> (layers, H)


Progress = Callable[[int], None]


def run_probe(
    engine: Engine,
    spec: NeedleSpec,
    layers: tuple[int, ...],
    progress: Progress | None = None,
    ray: str | None = None,
    worker: dict[str, Any] | None = None,
) -> RetrievalReport:
    """Every case of ``spec`` scored here (``ray`` None) or on Ray (``ray`` 'local' or an
    address; ``worker`` says how each actor loads the model). Ctrl-C returns the cases
    scored so far, marked partial."""
    p = parts(engine.tokenizer, spec)
    report = RetrievalReport(layers, engine.shape.num_heads, spec.lengths, spec.depths, len(p.needle))
    started = time.perf_counter()
    todo = cases(p, spec)
    try:
        scored = (
            (score_case(engine, c, layers) for c in todo)
            if ray is None
            else _on_ray(todo, layers, None if ray == "local" else ray, worker or {})
        )
        for score in scored:
            report.add(score)
            if progress is not None:
                progress(1)
    except KeyboardInterrupt:
        report.partial = True
    report.seconds = time.perf_counter() - started
    return report


class _Scorer:
    """A Ray actor: loads the model once, scores each case it is handed."""

    def __init__(self, model: str | None, engine: str, device: str, dtype: str) -> None:
        from ..engines import load_engine

        self.engine = load_engine(engine, model, device, dtype)

    def score(self, blob: bytes) -> bytes:
        case, layers = pickle.loads(blob)
        return pickle.dumps(score_case(self.engine, case, layers))


def _on_ray(todo: Iterable[NeedleCase], layers: tuple[int, ...], address: str | None, worker: dict[str, Any]) -> Any:
    """The cases' scores from a pool of Ray actors, as each comes back (two in flight per actor)."""
    from .distributed import _ray, start

    ray = _ray()
    started = start(ray, address)
    actors: list[Any] = []
    try:
        resources = ray.cluster_resources()
        gpus = int(resources.get("GPU", 0))
        count = gpus or max(1, min(int(resources.get("CPU", 1)) - 1, 8))
        device = "cuda" if gpus else "cpu"
        remote = ray.remote(**({"num_gpus": 1} if gpus else {"num_cpus": 1}))(_Scorer)
        load = (worker.get("model"), worker.get("engine", "own"), device, worker.get("dtype", "float32"))
        actors = [remote.remote(*load) for _ in range(count)]
        free = [actor for actor in actors for _ in range(2)]
        out: dict[Any, Any] = {}
        for case in todo:
            if not free:
                (ref,), _ = ray.wait(list(out), num_returns=1)
                free.append(out.pop(ref))
                yield pickle.loads(ray.get(ref))
            actor = free.pop()
            out[actor.score.remote(pickle.dumps((case, layers)))] = actor
        while out:
            (ref,), _ = ray.wait(list(out), num_returns=1)
            out.pop(ref)
            yield pickle.loads(ray.get(ref))
    finally:
        for actor in actors:
            with contextlib.suppress(Exception):
                ray.kill(actor)
        if started:
            ray.shutdown()
