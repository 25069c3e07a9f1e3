"""--generate on show: the model writes a continuation, and each written token's attention
is shown (attnviz/generation computes it; this module checks the options, streams the
continuation to a terminal's stderr and prints the views)."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Annotated, Any

import typer

if TYPE_CHECKING:
    from ..engines import Engine
    from ..generation import Generation

GenerateOpt = Annotated[
    int | None,
    typer.Option(
        "--generate",
        metavar="N",
        help="Let a decoder write up to N tokens (greedy; stops at end-of-sequence) and show what each "
        "written token attends to; --token may name a written word.",
        show_default=False,
    ),
]
SampleOpt = Annotated[bool, typer.Option("--sample", help="With --generate: sample instead of greedy.")]
TemperatureOpt = Annotated[
    float, typer.Option("--temperature", metavar="T", help="With --sample: divide the logits by T.")
]
TopPOpt = Annotated[
    float, typer.Option("--top-p", metavar="P", help="With --sample: draw from the smallest set of tokens of mass P.")
]
SeedOpt = Annotated[
    int | None, typer.Option("--seed", metavar="S", help="With --sample: the random seed.", show_default=False)
]

WRITTEN = "«{}»"  # how a written token is marked among keys and queries


def check(count: int | None, sample: bool, temperature: float, top_p: float, seed: int | None, **others: bool) -> Any:
    """The generation options against each other and against show's other outputs, before
    any model work: the ``Sampling`` to use, or None without --generate."""
    from ..errors import UsageError
    from ..generation import Sampling

    if count is None:
        if sample or seed is not None or temperature != 1.0 or top_p != 1.0:
            raise UsageError(
                "--sample, --temperature, --top-p and --seed choose how --generate writes", hint="add --generate N"
            )
        return None
    if count <= 0:
        raise UsageError(
            f"--generate {count}: the number of tokens to write must be at least 1", hint="e.g. --generate 20"
        )
    if not sample and (seed is not None or temperature != 1.0 or top_p != 1.0):
        raise UsageError("--temperature, --top-p and --seed apply to sampling", hint="add --sample")
    clash = [f"--{name.replace('_', '-')}" for name, on in others.items() if on]
    if clash:
        raise UsageError(f"{', '.join(clash)} cannot be combined with --generate", hint="drop it, or drop --generate")
    try:
        return Sampling(sample, temperature, top_p, seed)
    except UsageError as exc:
        raise UsageError(f"--temperature/--top-p: {exc.message}", hint=exc.hint) from None


def asked(count: int | None, sample: bool, temperature: float, top_p: float, seed: int | None) -> bool:
    """Whether any generation option was given."""
    return count is not None or sample or seed is not None or temperature != 1.0 or top_p != 1.0


def show(
    text: Any,
    model: Any,
    reading: Any,
    second: Any,
    ablation: Any,
    layer: str,
    token: list[str] | None,
    json_out: bool,
    top_keys: int | None,
    others: dict[str, Any],
    generation: Any,
    seed: int | None,
) -> Any:
    """show --generate, its options checked before any model work. The compact per-step
    view (each written token's strongest keys, ``run``) unless a reading option, --ablate
    or an output of show's full view is asked: then the ``Sampling`` comes back, and show
    reads prompt + continuation as any text (``Generating.continued``)."""
    full = any(value not in (None, False) for value in others.values()) or ablation.ablate
    full = full or reading.words or reading.hide_special or bool(reading.heads) or reading.rollout
    full = full or reading.layers_mean or reading.measure_name != "weight"
    sampling = generation.check(seed, target_text=second.decoder_text() is not None, pair=bool(second.pair))
    if full:
        return sampling
    if second.part_name == "encoder":
        from ..errors import UsageError

        raise UsageError("the encoder reads the source; it writes nothing", hint="use --part cross or --part decoder")
    model.budget()  # checks --max-memory
    sentence = text.read()
    eng = model.load(sentence)
    run(eng, sentence, generation.generate, sampling, layer, token, json_out, top_keys, second.part_name)
    return None


def run(
    eng: Engine,
    sentence: str,
    count: int,
    sampling: Any,
    layer: str,
    token: list[str] | None,
    json_out: bool,
    top_keys: int | None,
    part: str | None = None,
) -> None:
    """Generate and print: the continuation, then the per-step view (or --token's). An
    encoder-decoder's rows are its cross-attention's over the source (``part`` "decoder":
    its self-attention's over what it wrote)."""
    from ..select import parse_layers

    shape = eng.part_shape("decoder") if eng.parts else eng.shape
    layers = parse_layers(layer, shape.num_layers, shape.attention_layers)
    gen = write(eng, eng.tokenize(sentence), count, sampling, json_out, layers)
    assert gen.tokens is not None  # set by generate()
    cross = gen.seq2seq and part != "decoder"
    labels = list((gen.prompt if cross else gen.tokens).labels)
    rows = gen.cross if cross else gen.rows
    if json_out:
        from .output import emit_json

        emit_json(document(gen, labels, rows, "cross" if cross else "decoder" if gen.seq2seq else None))
    else:
        from .common import stdout_console

        console = stdout_console()
        for line in lines(gen, labels, rows, token, top_keys or 3):
            console.print(line, markup=False, highlight=False, soft_wrap=True)
    if gen.partial:
        raise typer.Exit(130)


def before_writing(eng: Engine, tokens: Any, selection: Any) -> None:
    """What the view after generation would refuse from the model and the options alone,
    refused before the model writes (no written token streamed, no pass): a decoder's
    plan of the prompt (layers, heads, rollout on a hybrid; the queries and targets may
    name written words, so they wait), and a measure the engine cannot record for this
    family (the norm on transformers' fused q/k/v projections, on a gated attention)."""
    from dataclasses import replace

    from ..measures.base import measure_named
    from ..pipeline import plan

    if eng.parts:  # an encoder-decoder's view reads the written decoder text: planned after
        return
    plan(tokens, eng, replace(selection, queries=(), targets=()))
    if measure_named(selection.measure).needs_values:
        eng.head_outputs(None)  # raises the measure's refusal (MeasureError)


def write(
    eng: Engine, tokens: Any, count: int, sampling: Any, json_out: bool, layers: Sequence[int] = ()
) -> Generation:
    """The model writes up to ``count`` tokens after ``tokens`` (checked first: --generate's
    numbers in the message), streamed to a terminal's stderr; ``layers``' rows are kept."""
    from ..errors import UsageError
    from ..generation import check_request, generate

    try:
        check_request(eng, tokens, count)
    except UsageError as exc:
        raise UsageError(f"--generate {count}: {exc.message}", hint=exc.hint, reason=exc.reason) from None
    stream = sys.stderr.isatty() and not json_out
    if stream:
        sys.stderr.write(f"writing: {tokens.text.strip()}")

    def show_token(_: int, label: str) -> None:
        sys.stderr.write(f" {label}")
        sys.stderr.flush()

    gen = generate(eng, tokens, count, layers=layers, sampling=sampling, on_token=show_token if stream else None)
    if stream:
        sys.stderr.write("\n")
    if gen.partial:
        sys.stderr.write(f"note: interrupted: the view shows the {len(gen.ids)} tokens written before Ctrl-C\n")
    return gen


def _label(eng: Engine, index: int) -> str:
    from ..tokens import vocab_label

    return vocab_label(eng.tokenizer, index)


def document(gen: Generation, labels: list[str], rows: list[Any], part: str | None = None) -> dict[str, Any]:
    """The JSON document: the continuation and each written token's rows (layers × heads ×
    keys: ``labels``; an encoder-decoder's ``part``, cross-attention's keys being the source)."""
    assert gen.tokens is not None  # set by generate()
    out: dict[str, Any] = {
        "prompt": gen.prompt.text,
        "continuation": gen.text,
        "written": gen.pieces,
        "written_ids": gen.ids,
        "stopped": gen.stopped,
        "partial": gen.partial,
        "layers": list(gen.layers),
        "tokens": list(gen.tokens.labels),
        "given": gen.given,
    }
    if part is not None:
        out["part"] = part
        out["keys"] = labels
    else:
        # Per layer and head: the fraction of written tokens whose choosing query's strongest
        # key holds that token (measures/retrieval.py).
        out["copy_scores"] = gen.copy_scores().round(6).tolist()
    out["steps"] = [
        {"position": p, "token": gen.pieces[i], "rows": rows[i].tolist()} for i, p in enumerate(gen.positions)
    ]
    return out


def lines(gen: Generation, labels: list[str], rows: list[Any], token: list[str] | None, top: int) -> list[str]:
    """The terminal view: the continuation, then per written token and layer each head's
    strongest key (of ``labels``) in its ``rows``; with ``token``, that written token's
    ``top`` strongest keys per head."""
    from ..errors import TokenNotFoundError

    given = gen.given
    out = [
        f"{'source' if gen.seq2seq else 'prompt'}:       {gen.prompt.text.strip()}",
        f"continuation: {gen.text.strip()}"
        + (f"   (partial: interrupted after {len(gen.ids)} tokens)" if gen.partial else f"   (stopped: {gen.stopped})"),
        f"{given} token{'s' * (given != 1)} given, {len(gen.ids)} written ({WRITTEN.format('like this')}); "
        "weights of each written token's query, per head (h), layer (L)"
        + ("; cross-attention: over the source" if rows is gen.cross and gen.seq2seq else ""),
    ]
    steps = list(range(len(gen.ids)))
    if token:
        wanted = [w.lower() for w in token]
        steps = [i for i in steps if gen.pieces[i].lower().lstrip("#") in wanted]
        if not steps:
            raise TokenNotFoundError(
                f"no written token is {', '.join(token)!s}: the model wrote {' '.join(gen.pieces)}",
                hint="name one of the written words with --token, or drop --token for every step",
            )
    for i in steps:
        step = rows[i]  # (layers, H, S)
        out.append("")
        out.append(f"{WRITTEN.format(gen.pieces[i])} at position {given + i}:")
        for slot, layer in enumerate(gen.layers):
            if token:
                for h in range(step.size(1)):
                    weights, keys = step[slot, h].topk(min(top, step.size(-1)))
                    cells = "  ".join(
                        f"{labels[k]} {w:.2f}" for w, k in zip(weights.tolist(), keys.tolist(), strict=True)
                    )
                    out.append(f"  L{layer} h{h}  {cells}")
                continue
            weights, keys = step[slot].max(dim=-1)  # (H,)
            cells = "  ".join(
                f"h{h} {labels[k]} {w:.2f}"
                for h, (w, k) in enumerate(zip(weights.tolist(), keys.tolist(), strict=True))
            )
            out.append(f"  L{layer}  {cells}")
    return out
