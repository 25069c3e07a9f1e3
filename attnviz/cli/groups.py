"""Option groups: the options several commands share, as dataclasses.

A command takes a group as one parameter (``model: ModelChoice``); ``grouped`` spreads the
group's fields into the flat signature typer reads (each field an ``Annotated`` option of
``options.py``), and hands the command the group rebuilt from them. The flags, their
help, their order in ``--help`` (``layout``: as they were listed before the groups), the
config file's and the environment's defaults are those of the flat options: click never
sees a group. This is llm's and httpie's shape (one definition of a shared option, named
by the commands that take it) on typer, which has no groups of its own.

Each group also holds what the commands did with those options: the checks made before
any model loads, and the values the library takes.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar, get_type_hints

from .ablating import AblateOpt, AblateWith, AblateWithOpt
from .generating import GenerateOpt, SampleOpt, TemperatureOpt, TopPOpt
from .options import (
    DEFAULT_MEASURE,
    DeviceOpt,
    DType,
    DtypeOpt,
    EngineName,
    EngineOpt,
    FileOpt,
    HeadsOpt,
    HideSpecialOpt,
    LayersMeanOpt,
    MaxMemoryOpt,
    Measure,
    MeasureOpt,
    ModelOpt,
    NoRenormOpt,
    PairOpt,
    Part,
    PartOpt,
    RolloutOpt,
    TargetFileOpt,
    TargetTextOpt,
    TextArg,
    WordsOpt,
)

if TYPE_CHECKING:
    from ..engines import Engine
    from ..generation import Generation, Sampling
    from ..pipeline import Selection
    from ..tokens import Tokens
    from ..transforms import View

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class TextInput:
    """The text: the SENTENCE argument, or --file ('-' in either: standard input)."""

    sentence: TextArg = None
    file: FileOpt = None

    def need(self) -> None:
        """No text at all is the first thing to say (before which token: there is none yet)."""
        from .common import need_text

        need_text(self.sentence, self.file)

    def read(self) -> str:
        from .common import read_input

        return read_input(self.sentence, self.file)


@dataclass(frozen=True)
class ModelChoice:
    """Which model, engine, device and dtype, and the forward pass's memory budget."""

    model: ModelOpt = None
    engine: EngineOpt = EngineName.own
    device: DeviceOpt = "auto"
    dtype: DtypeOpt = DType.float32
    max_memory: MaxMemoryOpt = None

    def budget(self) -> int | None:
        """--max-memory in bytes (None: the free memory is the limit)."""
        from .common import budget

        return budget(self.max_memory)

    def load(self, text: str) -> Engine:
        """Check the text, then load the engine (the text's mistakes cost no model load)."""
        from .common import load

        return load(text, self.model, EngineName(self.engine).value, self.device, DType(self.dtype).value)


@dataclass(frozen=True)
class Reading:
    """How to read the weights (``attnviz.transforms``), and the measure read."""

    words: WordsOpt = False
    hide_special: HideSpecialOpt = False
    no_renorm: NoRenormOpt = False
    heads: HeadsOpt = None
    rollout: RolloutOpt = False
    measure: MeasureOpt = DEFAULT_MEASURE
    layers_mean: LayersMeanOpt = False

    @property
    def measure_name(self) -> str:
        return Measure(self.measure).value

    def view(self) -> tuple[View, tuple[int, ...] | None]:
        """The ``transforms.View`` and the heads picked with --heads N,M, checked."""
        from .common import view_from

        return view_from(
            self.words, self.hide_special, self.no_renorm, self.heads, self.rollout, self.measure_name, self.layers_mean
        )


@dataclass(frozen=True)
class TextPair:
    """A second text: an encoder-decoder's decoder text and part, or a BERT-like's --pair."""

    target_text: TargetTextOpt = None
    target_file: TargetFileOpt = None
    part: PartOpt = None
    pair: PairOpt = None

    @property
    def part_name(self) -> str | None:
        return Part(self.part).value if self.part is not None else None

    def decoder_text(self) -> str | None:
        """The decoder's text (read, checked), or None."""
        from .common import decoder_text

        return decoder_text(self.target_text, self.target_file)

    def source(self, eng: Engine, text: str, target: str | None) -> Tokens | str:
        """The text as the engine reads it: with --pair, the typed sentence pair."""
        from .common import sentence_tokens

        return sentence_tokens(eng, text, self.pair, target)


@dataclass(frozen=True)
class Ablation:
    """--ablate: remove each head in turn, and with what."""

    ablate: AblateOpt = False
    ablate_with: AblateWithOpt = AblateWith.zero

    @property
    def mode(self) -> str | None:
        """The ablation mode ("zero", "mean"), or None without --ablate."""
        return AblateWith(self.ablate_with).value if self.ablate else None


@dataclass(frozen=True)
class Generating:
    """--generate N (with --sample, --temperature, --top-p; the command's --seed): the model
    writes a continuation first, and the view reads the prompt and what it wrote, the
    written tokens marked «like this». Without --token the first written token is the query."""

    generate: GenerateOpt = None
    sample: SampleOpt = False
    temperature: TemperatureOpt = 1.0
    top_p: TopPOpt = 1.0

    def asked(self, seed: int | None = None) -> bool:
        """Whether any generation option was given."""
        from .generating import asked

        return asked(self.generate, self.sample, self.temperature, self.top_p, seed)

    def check(self, seed: int | None = None, **clashes: bool) -> Sampling | None:
        """The options against each other and the command's (``clashes``: the flags that
        cannot go with --generate, by name), before any model work: the ``Sampling``, or
        None without --generate."""
        from .generating import check

        return check(self.generate, self.sample, self.temperature, self.top_p, seed, **clashes)

    def continued(
        self,
        eng: Engine,
        source: Tokens | str,
        selection: Selection,
        sampling: Sampling | None,
        json_out: bool = False,
    ) -> tuple[Tokens | str, Tokens | None, Selection, Generation | None]:
        """With --generate, the model writes after ``source`` (streamed to a terminal's
        stderr): the text and decoder text the view then reads (``Generation.source_and_target``)
        and the selection with the first written token as its query when it named none.
        Without, ``source`` and the selection unchanged."""
        if sampling is None or self.generate is None:
            return source, None, selection, None
        from dataclasses import replace

        from ..select import Query
        from .generating import before_writing, write

        tokens = eng.tokenize(source) if isinstance(source, str) else source
        before_writing(eng, tokens, selection)
        gen = write(eng, tokens, self.generate, sampling, json_out)
        text, target = gen.source_and_target()
        if not selection.queries and not selection.all_rows and gen.ids:
            selection = replace(selection, queries=(Query(index=gen.positions[0]),))
        return text, target, selection, gen


GROUPS = (TextInput, ModelChoice, Reading, TextPair, Ablation, Generating)


def grouped(layout: str) -> Callable[[F], F]:
    """Spread each option-group parameter of a command into its fields for typer.

    ``layout``: every flat parameter's name, in the order ``--help`` lists them. A name
    missing or unknown there is an error when the command is defined (at import).
    """

    def decorate(func: F) -> F:
        hints = get_type_hints(func, include_extras=True)
        flat: list[inspect.Parameter] = []
        groups: dict[str, tuple[type, tuple[str, ...]]] = {}
        for param in inspect.signature(func).parameters.values():
            kind = hints.get(param.name)
            if kind in GROUPS:
                assert isinstance(kind, type)
                fields = get_type_hints(kind, include_extras=True)
                names = tuple(f.name for f in dataclasses.fields(kind))
                groups[param.name] = (kind, names)
                for f in dataclasses.fields(kind):
                    flat.append(
                        inspect.Parameter(f.name, param.KEYWORD_ONLY, default=f.default, annotation=fields[f.name])
                    )
            else:
                flat.append(param.replace(kind=param.KEYWORD_ONLY, annotation=hints.get(param.name, param.annotation)))
        by_name = {p.name: p for p in flat}
        order = layout.split()
        if sorted(order) != sorted(by_name):
            raise TypeError(f"{func.__name__}: layout lists {sorted(set(order) ^ set(by_name))} wrongly")

        def command(**values: Any) -> Any:
            for name, (kind, names) in groups.items():
                values[name] = kind(**{n: values.pop(n) for n in names})
            return func(**values)

        params = [by_name[name] for name in order]
        for attr in ("__module__", "__name__", "__qualname__", "__doc__"):
            setattr(command, attr, getattr(func, attr))
        command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
        command.__annotations__ = {p.name: p.annotation for p in params}
        return command  # type: ignore[return-value]

    return decorate
