"""Direct logit attribution and the logit lens: what each component writes to the answer.

The residual stream at the last layer is a sum (Elhage et al. 2021, "A Mathematical
Framework for Transformer Circuits"): at position q,

    x = embeddings + Σ_l ( Σ_h z_{l,h} W^O_{l,h} + b^O_l + mlp_l )

where z_{l,h} is head h's output before W^O (the tap ``blocks.l.attn.z``), W^O_{l,h} its
rows of the output projection, b^O_l that projection's bias and mlp_l the tap
``blocks.l.mlp_out``; the embeddings are ``blocks.0.resid_pre``. The final norm is affine
once its scale is frozen at the clean run (TransformerLens's ``apply_ln_to_stack``):

    LayerNorm  f(c) = γ ⊙ (c − mean(c)) / σ_x          σ_x = sqrt(var(x) + ε)
    RMSNorm    f(c) = γ ⊙ c / rms_x                    rms_x = sqrt(mean(x²) + ε)

so with u = W_U[answer] − W_U[wrong] each component's direct effect on the logit difference
is f(c) · u, and the biases' term collects β · u (LayerNorm's shift) and b_U[answer] −
b_U[wrong]. The components sum to the clean run's logit difference; ``sum_error`` says by
how much they miss it (float rounding, or a family whose stream is not this sum).

The logit lens (nostalgebraist 2020): each layer's ``resid_post`` at q through the real
final norm (not frozen) and the unembedding; its top tokens.

Families: on the own engine, W^O from its modules (``Engine.head_outputs``) and the final
norm from its stack (``own_final_norm``), so every family whose last stream is that sum;
the run checks it is (``_check_sum``: post-norm stacks fail; ``_check_heads``: a norm
after W^O fails) and refuses otherwise, as it refuses logit soft-caps (not linear) and
hybrids. On the hf engine the final norm (``FINAL_NORMS``) and W^O
(``OUTPUT_PROJECTIONS``) are read from the checkpoint's files, as lm.py reads the LM head,
for GPT-2 and the Llama-likes. Reads the stream through taps. torch + numpy.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import Reason, UsageError
from ..io.models import shareable_name

if TYPE_CHECKING:
    import torch

    from ..engines import Engine
    from ..tokens import Tokens
    from .lm import LMHead

# model_type -> (final norm's weight name stem in a causal-LM checkpoint, kind, config eps
# key, default eps); a base model's checkpoint names it without the first part (``bare``)
FINAL_NORMS: dict[str, tuple[str, str, str, float]] = {
    "gpt2": ("transformer.ln_f", "layer", "layer_norm_epsilon", 1e-5),
    "llama": ("model.norm", "rms", "rms_norm_eps", 1e-6),
    "mistral": ("model.norm", "rms", "rms_norm_eps", 1e-6),
    "qwen2": ("model.norm", "rms", "rms_norm_eps", 1e-6),
}


def bare(stem: str) -> tuple[str, str]:
    """A weight's name stem as a causal-LM checkpoint and as its base model's spell it:
    model.norm and norm, transformer.ln_f and ln_f."""
    return stem, stem.split(".", 1)[1]


# model_type -> (W^O's weight name stems, layer N as {n}; stored (in, out) as a Conv1D)
OUTPUT_PROJECTIONS: dict[str, tuple[tuple[str, ...], bool]] = {
    "gpt2": (("transformer.h.{n}.attn.c_proj", "h.{n}.attn.c_proj"), True),
    "llama": (("model.layers.{n}.self_attn.o_proj", "layers.{n}.self_attn.o_proj"), False),
    "mistral": (("model.layers.{n}.self_attn.o_proj", "layers.{n}.self_attn.o_proj"), False),
    "qwen2": (("model.layers.{n}.self_attn.o_proj", "layers.{n}.self_attn.o_proj"), False),
}


@dataclass(frozen=True)
class FinalNorm:
    """The last norm before the unembedding: kind "layer" or "rms", γ (None: 1), β (or
    None), ε; ``project``: a linear map after the norm (OPT's project_out: (weight (E', E),
    bias or None)), or None."""

    kind: str
    weight: Any
    bias: Any
    eps: float
    project: tuple[Any, Any] | None = None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """The norm itself (the logit lens): x (..., E)."""
        return self.frozen(x, x) + self.shift()

    def shift(self) -> Any:
        """What the norm (and the projection) add whatever the input: β, then through the
        projection, plus its bias; a float 0.0 when nothing."""
        out: Any = 0.0 if self.bias is None else self.bias.double()
        if self.project is not None:
            weight, bias = self.project
            if self.bias is not None:
                out = weight.double() @ out
            out = out + (0.0 if bias is None else bias.double())
        return out

    def readout(self, u: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """w (E,) float64 with f(c) · u = c · w for every c, the scale frozen at x (E,):
        the direction each component is read along (LayerNorm's centring moves onto w:
        Σ (c_i − c̄) v_i = c · (v − v̄))."""
        import torch

        x, u = x.double(), u.double()
        if self.project is not None:
            u = self.project[0].double().T @ u  # (E,)
        gamma = 1.0 if self.weight is None else self.weight.double()
        if self.kind == "layer":
            v = gamma * u / torch.sqrt(x.var(-1, unbiased=False) + self.eps)
            return v - v.mean()
        return gamma * u / torch.sqrt(x.pow(2).mean() + self.eps)

    def frozen(self, c: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """f(c) without β, the scale taken from x: c (..., E), x (E,) or (..., E)."""
        import torch

        x, c = x.double(), c.double()
        gamma = 1.0 if self.weight is None else self.weight.double()
        if self.kind == "layer":
            scale = torch.sqrt(x.var(-1, unbiased=False, keepdim=True) + self.eps)
            out = gamma * (c - c.mean(-1, keepdim=True)) / scale
        else:
            scale = torch.sqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
            out = gamma * c / scale
        return out if self.project is None else out @ self.project[0].double().T


def _read(engine: Engine, names: set[str]) -> dict[str, Any]:
    """The tensors of ``names`` found in the checkpoint's safetensors files."""
    from safetensors import safe_open

    from ..io.checkpoint import weight_files

    tensors: dict[str, Any] = {}
    for path in weight_files(engine.files.path):
        if path.suffix != ".safetensors":
            continue
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 - safe_open is not a mapping
                if name in names:
                    tensors[name] = f.get_tensor(name).to(engine.device)
    return tensors


def load_output_projections(engine: Engine) -> list[tuple[Any, Any]]:
    """Per layer, W^O as (weight (E, H·Dv), bias (E,) or None), read from the checkpoint."""
    stems, conv1d = OUTPUT_PROJECTIONS[engine.files.model_type]
    n = engine.num_layers
    wanted = {f"{s.format(n=layer)}.{p}" for s in stems for layer in range(n) for p in ("weight", "bias")}
    tensors = _read(engine, wanted)
    out = []
    for layer in range(n):
        stem = next((s.format(n=layer) for s in stems if f"{s.format(n=layer)}.weight" in tensors), None)
        if stem is None:
            raise UsageError(f"{engine.files.spec} has no {stems[0].format(n=layer)}.weight", reason=Reason.PATCH_DLA)
        weight = tensors[f"{stem}.weight"]
        out.append((weight.T if conv1d else weight, tensors.get(f"{stem}.bias")))
    return out


def load_final_norm(engine: Engine) -> FinalNorm:
    """The checkpoint's final norm. Raises UsageError (reason "patch_dla") for a family
    not in ``FINAL_NORMS`` or a checkpoint without its weights."""
    files = engine.files
    found = FINAL_NORMS.get(files.model_type)
    if found is None:
        raise UsageError(
            f"direct logit attribution reads the final norm of {', '.join(FINAL_NORMS)} checkpoints; "
            f"{files.spec} is {files.model_type!r}",
            reason=Reason.PATCH_DLA,
        )
    stem, kind, key, default = found
    stems = bare(stem)
    tensors = _read(engine, {f"{s}.{p}" for s in stems for p in ("weight", "bias")})
    for stem in stems:
        if f"{stem}.weight" in tensors:
            eps = files.config.get(key, default)
            return FinalNorm(kind, tensors[f"{stem}.weight"], tensors.get(f"{stem}.bias"), float(eps))
    raise UsageError(f"{files.spec} has no final norm weights ({stems[0]}.weight)", reason=Reason.PATCH_DLA)


def own_final_norm(engine: Engine) -> FinalNorm:
    """The own engine's final norm, read from its module (``final_norm`` of the stack):
    LayerNorm (γ, β; Cohere's without β; OLMo's without either), RMSNorm (γ; Gemma's
    1 + γ), OPT's norm followed by project_out.

    Raises:
        UsageError: (reason PATCH_DLA) a stack without a final norm this knows.
    """
    from torch import nn

    module: Any = getattr(getattr(engine, "model", None), "final_norm", None)
    project = None
    if type(module).__name__ == "OutputHead":  # OPT: the norm (pre-norm only), then project_out
        proj = module.project
        project = None if proj is None else (proj.weight.detach(), getattr(proj, "bias", None))
        module = module.norm
    name = type(module).__name__
    if isinstance(module, nn.LayerNorm):
        found = FinalNorm("layer", module.weight, module.bias, float(module.eps), project)
    elif name in ("RMSNorm", "GemmaRMSNorm") and getattr(module, "weight", None) is not None:
        weight = module.weight.detach() + (1.0 if name == "GemmaRMSNorm" else 0.0)
        found = FinalNorm("rms", weight, None, float(module.eps), project)
    elif name == "CohereLayerNorm" and module.weight.dim() == 1:
        found = FinalNorm("layer", module.weight, None, float(module.eps), project)
    elif name == "OlmoLayerNorm":
        found = FinalNorm("layer", None, None, 1e-5, project)
    else:
        what = "no final norm" if module is None else f"a final norm direct logit attribution does not know ({name})"
        raise UsageError(f"{engine.files.spec} ({engine.files.model_type}) has {what}", reason=Reason.PATCH_DLA)
    detached = (
        None if found.weight is None else found.weight.detach(),
        None if found.bias is None else found.bias.detach(),
    )
    return FinalNorm(found.kind, *detached, found.eps, found.project)


def own_output_projections(engine: Engine) -> list[tuple[Any, Any]]:
    """Per layer, W^O as (weight (E, H·Dv), bias (E,) or None), from the own engine's
    modules (``Engine.head_outputs``). Raises UsageError (PATCH_DLA) where a head's output
    does not split by W^O's columns (a gated attention) or a layer has no attention."""
    from ..errors import MeasureError

    if tuple(engine.shape.layers) != tuple(range(engine.num_layers)):
        raise UsageError(
            f"{engine.files.spec} has layers without attention (a hybrid): their mixers write to the stream "
            "too, and direct logit attribution splits it into heads, MLPs and embeddings only",
            reason=Reason.PATCH_DLA,
        )
    try:
        outputs = engine.head_outputs()
    except MeasureError as exc:
        raise UsageError(
            f"direct logit attribution splits W^O by head: {exc.message}", reason=Reason.PATCH_DLA
        ) from None
    # Granite multiplies each sub-layer's output by residual_multiplier before adding it:
    # folded into W^O (and its bias), so a head's direct effect is what it adds.
    scale = (
        float(engine.files.config.get("residual_multiplier", 1.0))
        if engine.files.model_type.startswith("granite")
        else 1.0
    )
    out = []
    for n in range(engine.num_layers):
        weight, bias = outputs[n].weight.detach(), outputs[n].bias
        out.append((weight * scale if scale != 1.0 else weight, None if bias is None else bias.detach() * scale))
    return out


# The final norm and W^O read once per checkpoint (its path, files' mtimes) and device:
# reading them from the files took longer than the forward pass itself (bench/patch_bench.py).
_LOADED: dict[tuple[str, tuple[int, ...], str], tuple[FinalNorm, list[tuple[Any, Any]]]] = {}


def _weights(engine: Engine) -> tuple[FinalNorm, list[tuple[Any, Any]]]:
    from ..io.checkpoint import weight_files

    if engine.name == "own":  # the modules in memory: nothing to read, nothing to cache
        return own_final_norm(engine), own_output_projections(engine)
    files = weight_files(engine.files.path)
    key = (str(engine.files.path), tuple(f.stat().st_mtime_ns for f in files), str(engine.device))
    if key not in _LOADED:
        if len(_LOADED) >= 4:
            _LOADED.clear()
        _LOADED[key] = (load_final_norm(engine), load_output_projections(engine))
    return _LOADED[key]


@dataclass(frozen=True)
class Attribution:
    """Each component's direct contribution to logit(answer) − logit(wrong) at one position.

    Attributes:
        heads: (N, H) float64, each head's.
        mlps: (N,) float64, each MLP's.
        attn_biases: (N,) float64, each attention output projection's bias.
        embeddings, biases: the embeddings' and the rest of the biases' (the final norm's
            shift, the unembedding's bias).
        logit_diff: the clean run's logit difference (from its logits).
        total: the sum of every component; sum_error = total − logit_diff.
        lens: per layer, the logit lens's top tokens at the position, (token, logit).
        lens_diff: (N,) the logit difference of each layer's lens.
    """

    model: str
    engine: str
    answer: str
    wrong: str
    position: int
    tokens: tuple[str, ...]
    heads: np.ndarray
    mlps: np.ndarray
    attn_biases: np.ndarray
    embeddings: float
    biases: float
    logit_diff: float
    lens: tuple[tuple[tuple[str, float], ...], ...]
    lens_diff: np.ndarray

    @property
    def total(self) -> float:
        return float(self.heads.sum() + self.mlps.sum() + self.attn_biases.sum() + self.embeddings + self.biases)

    @property
    def sum_error(self) -> float:
        return self.total - self.logit_diff

    def components(self) -> list[tuple[str, float]]:
        """(name, contribution) of every component, in stream order."""
        out = [("embeddings", self.embeddings)]
        for layer in range(self.heads.shape[0]):
            out += [(f"L{layer}.H{h}", float(self.heads[layer, h])) for h in range(self.heads.shape[1])]
            out.append((f"L{layer}.attn_bias", float(self.attn_biases[layer])))
            out.append((f"L{layer}.mlp", float(self.mlps[layer])))
        out.append(("biases", self.biases))
        return out

    def ranked(self, top: int | None = None) -> list[tuple[str, float]]:
        rows = sorted(self.components(), key=lambda r: -abs(r[1]))
        return rows if top is None else rows[:top]

    def label(self) -> str:
        return (
            f"direct logit attribution of logit({self.answer}) − logit({self.wrong}) at "
            f"{self.tokens[self.position]!r} (position {self.position}), final norm's scale frozen at this run"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": "attribution",
            "model": self.model,
            "engine": self.engine,
            "label": self.label(),
            "answer": self.answer,
            "wrong": self.wrong,
            "position": self.position,
            "tokens": list(self.tokens),
            "heads": self.heads.tolist(),
            "mlps": self.mlps.tolist(),
            "attn_biases": self.attn_biases.tolist(),
            "embeddings": self.embeddings,
            "biases": self.biases,
            "logit_diff": self.logit_diff,
            "sum": self.total,
            "sum_error": self.sum_error,
            "lens": [[{"token": t, "logit": v} for t, v in layer] for layer in self.lens],
            "lens_diff": self.lens_diff.tolist(),
        }


def attribute(
    engine: Engine,
    tokens: Tokens,
    answer: int,
    wrong: int,
    lm: LMHead,
    *,
    position: int | None = None,
    top: int = 5,
    labels: tuple[str, str] | None = None,
    lens: bool = True,
) -> Attribution:
    """Direct logit attribution and the logit lens of one text at ``position`` (default:
    the last token), from one forward pass. ``labels``: the answer's and the wrong
    token's names (default: their vocabulary pieces). ``lens`` False: no logit lens (its
    N products with W_U cost ~0.4 of a forward pass at 15 tokens of GPT-2 small).

    Raises:
        UsageError: a family without a known final norm, a soft-capped LM head, an
            encoder-decoder, a position out of range.
    """
    import torch

    from ..nn.taps import Taps, tap_name

    if engine.parts or lm.kind != "causal":
        raise UsageError("direct logit attribution reads a causal LM's one stack", reason=Reason.PATCH_DLA)
    if lm.softcap is not None or lm.transform is not None:
        raise UsageError(
            "direct logit attribution needs a linear LM head (this one soft-caps)", reason=Reason.PATCH_DLA
        )
    norm, projections = _weights(engine)
    q = len(tokens) - 1 if position is None else position
    if not 0 <= q < len(tokens):
        raise UsageError(f"position {q} is out of range ({len(tokens)} tokens)", reason=Reason.INDEX)
    n, h = engine.num_layers, engine.num_heads
    taps = Taps().record(tap_name(None, 0, "resid_pre"), positions=[q])
    for what in ("z", "attn_out", "mlp_out", "resid_post"):
        taps.record(f"blocks.*.{'attn.z' if what == 'z' else what}", positions=[q])
    with torch.inference_mode():
        with engine.tapping(taps):
            hidden = engine.final_hidden(tokens)  # (1, Q, E)
        factor = (lm.scale or 1.0) / (lm.divisor or 1.0)
        u = (lm.unembed[answer].double() - lm.unembed[wrong].double()) * factor  # (E,)
        x = taps[tap_name(None, n - 1, "resid_post")][0, 0]  # (E,) the stream into the final norm
        w = norm.readout(u, x)  # (E,): each component's direct effect is c · w

        def at(layer: int, what: str) -> torch.Tensor:
            return taps[tap_name(None, layer, what)][0, 0]

        embedded = at(0, "resid_pre")  # (E,)
        _check_sum(engine, x, embedded, [at(layer, "attn_out") + at(layer, "mlp_out") for layer in range(n)])
        heads = np.zeros((n, h))
        attn_biases = np.zeros(n)
        mlps = np.zeros(n)
        for layer in range(n):
            z = at(layer, "z").reshape(-1)  # (H·Dv,)
            weight, bias = projections[layer]  # (E, H·Dv), (E,)
            _check_heads(engine, layer, at(layer, "attn_out"), weight @ z.to(weight) + (0 if bias is None else bias))
            read = (w.to(weight) @ weight).double()  # (H·Dv,): W^Oᵀ w, head h's Dv entries its own
            heads[layer] = (z.double() * read).view(h, -1).sum(-1).cpu().numpy()
            attn_biases[layer] = 0.0 if bias is None else float(bias.double() @ w)
            mlps[layer] = float(at(layer, "mlp_out").double() @ w)
        embeddings = float(embedded.double() @ w)
        shift = norm.shift()
        shift = float(shift @ u) if isinstance(shift, torch.Tensor) else 0.0
        lm_bias = 0.0 if lm.bias is None else float((lm.bias[answer] - lm.bias[wrong]).double()) * factor
        # The logit lens and the model's own output in one product with W_U (N + 1 rows): W_U
        # is read once, not once a layer (12 matrix-vector products cost 1.5 forward passes).
        streams = torch.stack([taps[tap_name(None, layer, "resid_post")][0, 0] for layer in range(n)])  # (N, E)
        lensed = norm(streams).to(hidden.dtype) if lens else streams[:0]
        rows = torch.cat([lensed, hidden[0, q][None]])  # (N + 1, E), or (1, E) without the lens
        # Without the lens only two logits are read: W_U's two rows, not its V (a tenth of a
        # forward pass at 15 tokens of GPT-2 small), in lm.logits's own order of operations.
        head = (
            lm
            if lens
            else replace(
                lm,
                unembed=lm.unembed[[answer, wrong]],
                bias=None if lm.bias is None else lm.bias[[answer, wrong]],
            )
        )
        every = head.logits(rows).double()  # (N + 1, V), or (1, 2) without the lens
        logits = every[-1]
        a, w_ = (answer, wrong) if lens else (0, 1)  # their columns
        lens_rows, lens_diff = [], np.full(n, np.nan)
        if lens:
            values, ids = every[:n].topk(top, dim=-1)  # (N, top)
            lens_rows = [
                tuple((lm.token(int(i)), float(v)) for v, i in zip(values[layer], ids[layer], strict=True))
                for layer in range(n)
            ]
            lens_diff = (every[:n, answer] - every[:n, wrong]).cpu().numpy()
    return Attribution(
        model=shareable_name(engine.files.spec),
        engine=engine.name,
        answer=lm.token(answer) if labels is None else labels[0],
        wrong=lm.token(wrong) if labels is None else labels[1],
        position=q,
        tokens=tuple(tokens.labels),
        heads=heads,
        mlps=mlps,
        attn_biases=attn_biases,
        embeddings=embeddings,
        biases=shift + lm_bias,
        logit_diff=float(logits[a] - logits[w_]),
        lens=tuple(lens_rows),
        lens_diff=lens_diff,
    )


def _check_sum(engine: Engine, x: torch.Tensor, embedded: torch.Tensor, layers: list[torch.Tensor]) -> None:
    """Refuse a family whose last stream is not the embeddings plus every layer's attention
    and MLP outputs (post-norm: each layer normalises the sum, so nothing writes to it directly)."""
    import torch

    total = embedded.double() + torch.stack(layers).double().sum(0)
    if float((total - x.double()).norm()) > 1e-3 * max(float(x.double().norm()), 1e-12):
        raise UsageError(
            f"{engine.files.spec} ({engine.files.model_type}): its residual stream is not the sum of the "
            "embeddings and each layer's attention and MLP outputs (a post-norm layer normalises the sum), "
            "so no component writes to it directly",
            reason=Reason.PATCH_DLA,
        )


def _check_heads(engine: Engine, layer: int, attn_out: torch.Tensor, split: torch.Tensor) -> None:
    """Refuse a family whose attention output is not Σ_h z_h W^O_h + b^O (a norm after W^O)."""
    if float((attn_out.double() - split.double()).norm()) > 1e-3 * max(float(attn_out.double().norm()), 1e-12):
        raise UsageError(
            f"{engine.files.spec} ({engine.files.model_type}): layer {layer}'s attention output is not the sum "
            "of its heads' z·W^O (a norm after the output projection), so a head has no direct effect of its own",
            reason=Reason.PATCH_DLA,
        )


def attribute_text(
    engine: Engine, text: str, answer: str, wrong: str, *, position: Any = None, top: int = 5
) -> Attribution:
    """``attribute`` from a text and two answer words (``patching.answer_id``); ``position``
    a ``select.Query`` (its last piece), an int, or None (the last token)."""
    from ..select import Query
    from .lm import load_lm_head
    from .patching import answer_id

    _weights(engine)  # refuse a family before the pass
    lm = None if engine.parts else load_lm_head(engine)
    if lm is None or lm.kind != "causal":
        raise UsageError(
            f"direct logit attribution needs a causal LM head, and {engine.files.spec} has none",
            reason=Reason.PATCH_DLA,
        )
    tokens = engine.tokenize(text)
    at = position.resolve(tokens)[-1] if isinstance(position, Query) else position
    a, a_label = answer_id(engine.tokenizer, answer)
    w, w_label = answer_id(engine.tokenizer, wrong)
    return attribute(engine, tokens, a, w, lm, position=at, top=top, labels=(a_label, w_label))
