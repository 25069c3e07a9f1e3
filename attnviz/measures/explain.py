"""The four steps of one head for one token, with the real numbers.

    1. project   q_i = x_i·W_h^Q + b_h^Q, k_j = x_j·W_g^K + b_g^K (after the rotary
                 embedding or the q/k norms where the family has them), g = h // (H/G)
    2. score     s_ij = q_i·k_j, times the scale (1/√d_k or the family's), plus any
                 position bias (T5), soft-capped (Gemma 2), masked (causal, window, padding)
    3. normalise α_ij = softmax_j(s_ij) (with a learned sink logit, GPT-OSS)
    4. mix       o_i = Σ_j α_ij·f_h(x_j), f_h(x) = (x·W_h^V + b_h^V)·W_h^O; the layer's
                 attention output is y_i = Σ_h o_i^h + b^O (Kobayashi et al. 2020)

Nothing is recomputed from a copy of the model: one forward pass asks the layer for row i
and records, through the layer's taps (nn/taps.py), what its weights are computed from
(``scores``: q and k as the module scores them, the scale, the mask, any bias, soft-cap or
sink), its values ``v`` and its output ``out``; W^O is ``Engine.head_outputs``. The
weights recomputed here from those terms are held to the pass's own before anything is
returned. ``neuron`` gives the
dimensions of q_i ⊙ k_j that make one score (bertviz's neuron view).

torch + numpy; the result is plain data (``Explanation``) for the renderers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import EngineError, Reason, UsageError

if TYPE_CHECKING:
    from ..engines import Engine
    from ..result import Provenance
    from ..tokens import Tokens

NEURON_DIMS = 8  # the largest positive and negative products shown by the neuron view


@dataclass(frozen=True)
class Neuron:
    """Where one score q_i·k_j comes from, dimension by dimension.

    Attributes:
        key: the key's token position.
        products: (D,) q_i[d]·k_j[d]; they sum to the raw score.
        top_positive / top_negative: dimensions of the largest positive / negative products,
            largest magnitude first (at most NEURON_DIMS each).
    """

    key: int
    products: np.ndarray
    top_positive: tuple[int, ...]
    top_negative: tuple[int, ...]


@dataclass(frozen=True)
class Explanation:
    """One head's four steps for one query token (S keys, D head dim, E model width, H heads).

    Attributes:
        tokens: the sentence; query: the query's position in it.
        layer, head, kv_head: the head (kv_head: the key/value head it reads).
        q: (D,) the query vector as the scores use it; k: (S, D) each key's vector.
        scores: (S,) q·k_j, before the scale.
        scale: the factor on the scores.
        bias: (S,) added after the scale (T5's position bias), or None.
        softcap: logit soft-capping (Gemma 2), or None.
        logits: (S,) what the softmax reads (scaled, biased, capped); masked keys NaN.
        mask: (S,) True = the query may attend to that key.
        sink: the learned sink logit (GPT-OSS), or None; sink_share: the weight it takes.
        weights: (S,) α_ij.
        value_norms: (S,) ‖f_h(x_j)‖; contribution: (S,) α_ij·‖f_h(x_j)‖.
        output: (E,) o_i = Σ_j α_ij·f_h(x_j), the head's part of the attention output.
        attention_output: (E,) y_i, the layer's attention output (every head, and b^O).
        head_shares: (H,) o_i^h·y_i / ‖y_i‖² for every head (with ``bias_share`` they sum to 1).
        bias_share: b^O·y_i / ‖y_i‖² (0 without an output bias).
        steps: the family's extras in words ("rotary", "q/k norm", ...).
        neuron: with a key asked for, its q ⊙ k (``Neuron``).
        provenance: the model and engine.
        query_indices: every token position of the asked word (``query`` is the first);
            () when not given.
    """

    tokens: Tokens
    query: int
    layer: int
    head: int
    kv_head: int
    q: np.ndarray
    k: np.ndarray
    scores: np.ndarray
    scale: float
    bias: np.ndarray | None
    softcap: float | None
    logits: np.ndarray
    mask: np.ndarray
    sink: float | None
    sink_share: float
    weights: np.ndarray
    value_norms: np.ndarray
    contribution: np.ndarray
    output: np.ndarray
    attention_output: np.ndarray
    head_shares: np.ndarray
    bias_share: float
    steps: tuple[str, ...]
    provenance: Provenance
    neuron: Neuron | None = None
    query_indices: tuple[int, ...] = ()

    @property
    def head_dim(self) -> int:
        return int(self.q.shape[0])

    @property
    def share(self) -> float:
        """This head's share of the layer's attention output at the query."""
        return float(self.head_shares[self.head])

    def to_dict(self) -> dict[str, Any]:
        """The JSON of ``attnviz explain --json`` (rounded by ``result.jsonable``)."""
        from ..result import jsonable

        labels = self.tokens.labels
        out: dict[str, Any] = {
            "tokens": list(labels),
            "layer": self.layer,
            "head": self.head,
            "kv_head": self.kv_head,
            "query_index": self.query,
            "query_token": labels[self.query],
            "head_dim": self.head_dim,
            "steps": list(self.steps),
            "query": self.q,
            "keys": self.k,
            "scores": self.scores,
            "scale": self.scale,
            "logits": self.logits,
            "mask": [bool(m) for m in self.mask],
            "weights": self.weights,
            "value_norms": self.value_norms,
            "contribution": self.contribution,
            "output": self.output,
            "output_norm": float(np.linalg.norm(self.output)),
            "attention_output_norm": float(np.linalg.norm(self.attention_output)),
            "share": self.share,
            "head_shares": self.head_shares,
            "bias_share": self.bias_share,
        }
        if self.bias is not None:
            out["bias"] = self.bias
        if self.softcap is not None:
            out["softcap"] = self.softcap
        if self.sink is not None:
            out.update(sink=self.sink, sink_share=self.sink_share)
        if self.neuron is not None:
            n = self.neuron
            out["neuron"] = {
                "key_index": n.key,
                "key_token": labels[n.key],
                "products": n.products,
                "top_positive": [[d, n.products[d]] for d in n.top_positive],
                "top_negative": [[d, n.products[d]] for d in n.top_negative],
            }
        p = self.provenance
        out.update(model=p.model, engine=p.engine, device=p.device, dtype=p.dtype, provenance=p.to_dict())
        if self.query_indices:
            out["query_indices"] = list(self.query_indices)
        return jsonable(out)


def neuron(q: np.ndarray, k: np.ndarray, key: int, dims: int = NEURON_DIMS) -> Neuron:
    """The products q[d]·k_key[d] and their largest positive and negative dimensions."""
    products = (q.astype(np.float64) * k[key].astype(np.float64)).astype(np.float32)  # (D,)
    order = np.argsort(-products, kind="stable")
    positive = tuple(int(d) for d in order if products[d] > 0)[:dims]
    negative = tuple(int(d) for d in order[::-1] if products[d] < 0)[:dims]
    return Neuron(key, products, positive, negative)


def check_head(num_layers: int, num_heads: int, layer: int, head: int) -> None:
    """The layer and head against the model's numbers (from config.json: no model work).

    Raises:
        UsageError: out of range (facts: reason "explain_layer" / "explain_head", ``count``).
    """
    if not 0 <= layer < num_layers:
        raise UsageError(
            f"layer {layer} is out of range: this model has {num_layers} layers (0..{num_layers - 1})",
            reason=Reason.EXPLAIN_LAYER,
            count=num_layers,
        )
    if not 0 <= head < num_heads:
        raise UsageError(
            f"head {head} is out of range: this model has {num_heads} heads (0..{num_heads - 1})",
            reason=Reason.EXPLAIN_HEAD,
            count=num_heads,
        )


def check_family(model_type: str, score_terms: tuple[str, ...]) -> None:
    """Refuse a family whose scores are more than q·k (and a bias) before any model work.

    Raises:
        UsageError: DeBERTa's disentangled scores (facts: reason "explain_family").
    """
    if score_terms:
        raise UsageError(
            f"{model_type!r} scores add content-to-position terms computed inside the layer "
            f"({', '.join(score_terms)}); explain shows scores that are q·k (plus a bias)",
            reason=Reason.EXPLAIN_FAMILY,
        )


def _reads_score_terms(engine: Engine) -> bool:
    """Whether ``engine`` maps the ``scores`` tap (our own attention modules do; the hf
    engine, whose attention is transformers' code, does not)."""
    from ..errors import UnsupportedArchitectureError
    from ..nn.taps import Taps, tap_name

    try:
        with engine.tapping(Taps().record(tap_name(None, engine.shape.layers[0], "scores"))):
            pass
    except UnsupportedArchitectureError:
        return False
    return True


def explain(engine: Engine, tokens: Tokens, query: int, layer: int, head: int, key: int | None = None) -> Explanation:
    """Head ``head`` of layer ``layer`` for the token at ``query``, step by step (an engine
    that maps the ``scores`` tap, nn/taps.py: the own engine).

    Raises:
        UsageError: the engine does not tap the score terms (hf; facts: reason
            "explain_engine"), or a family explain does not cover.
        EngineError: the recomputed weights disagree with the module's (a bug).
    """
    import torch

    from ..engines import cpu_threads_for, engine_provenance
    from ..errors import MeasureError
    from ..nn.attention import Mask
    from ..nn.taps import ScoreTerms, Taps, tap_name
    from .norms import transformed_values

    if not _reads_score_terms(engine):
        raise UsageError("explain reads our own attention modules", reason=Reason.EXPLAIN_ENGINE)
    check_head(engine.num_layers, engine.shape.num_heads, layer, head)
    unreadable = UsageError(
        f"the {engine.files.model_type!r} attention of layer {layer} does not go through a multi-head "
        "attention module explain can read",
        reason=Reason.EXPLAIN_FAMILY,
    )
    if layer not in engine.shape.layers:  # a hybrid's layer without softmax attention
        raise unreadable
    try:
        o_proj = engine.head_outputs()[layer]  # W^O, (E, H·Dv)
    except MeasureError:
        raise UsageError(
            f"the {engine.files.model_type!r} attention of layer {layer} gates each head's output by the query "
            "after the softmax; explain decomposes outputs that are the weights times the values",
            reason=Reason.EXPLAIN_FAMILY,
        ) from None
    # 1. The forward pass up to the layer (on the threads its work calls for, as show's
    # pass: the whole pool on a busy machine spins), the layer's score terms, values and
    # output recorded on the way by its taps; row ``query`` of its weights is the pass's.
    names = {what: tap_name(None, layer, what) for what in ("scores", "v", "out")}
    taps = Taps().record(names["scores"]).record(names["v"]).record(names["out"], positions=[query])
    with torch.inference_mode(), engine.tapping(taps), cpu_threads_for(engine, len(tokens)):
        weights = engine.forward(tokens, (layer,), (query,)).attentions[0]  # (1, H, 1, S)
    if names["scores"] not in taps:
        raise unreadable
    terms: ScoreTerms = taps[names["scores"]]
    out = taps[names["out"]]  # (1, 1, E): the layer's attention output at the query
    q_all, k_all, v = terms.q, terms.k, taps[names["v"]]  # (1, H, L, D), (1, G, S, D), (1, G, S, Dv)
    n_heads, groups = q_all.size(1), k_all.size(1)
    g = head // (n_heads // groups)
    q = q_all[0, head, query].double()  # (D,)
    k = k_all[0, g].double()  # (S, D)
    keys = k.size(0)
    scale = float(terms.scale) if terms.scale is not None else 1.0 / math.sqrt(q.size(0))
    # 3. The scores, the family's modifiers, the mask and the softmax, written out.
    scores = k @ q  # (S,)
    logits = scores * scale
    # The bias as the module adds it: a learned one (T5) or its own ALiBi (BLOOM, Falcon-RW),
    # in the module's dtype (left out, BLOOM's weights were off by 0.13).
    bias = terms.score_bias
    bias_row = None
    if bias is not None:
        b = bias[..., query, :] if bias.size(-2) > 1 else bias[..., 0, :]
        bias_row = b.expand(1, n_heads, keys)[0, head].double()  # (S,)
        logits = logits + bias_row
    softcap = terms.softcap
    if softcap is not None:
        logits = torch.tanh(logits / softcap) * softcap
    mask = terms.mask
    index = torch.tensor([query], device=k.device)
    if isinstance(mask, Mask):
        rows = mask.rows(index, keys)
    elif mask is not None:
        rows = mask if mask.dim() < 2 or mask.size(-2) == 1 else mask[..., index, :]
    else:
        rows = None
    allowed = torch.ones(keys, dtype=torch.bool) if rows is None else rows.expand(1, n_heads, 1, keys)[0, head, 0]
    allowed = allowed.cpu()
    masked = logits.cpu().masked_fill(~allowed, float("-inf"))
    sink = None if terms.sinks is None else float(terms.sinks[head].detach())
    full = masked if sink is None else torch.cat((masked, torch.tensor([sink], dtype=masked.dtype)))
    probs = torch.softmax(full, dim=-1)
    alpha = probs[:keys].masked_fill(~allowed, 0.0)  # (S,)
    theirs = weights[0, head, 0].double().cpu()
    gap = float((alpha - theirs).abs().max())
    if gap > 1e-5:
        raise EngineError(
            f"explain's weights differ from the module's by {gap:.2e} (layer {layer}, head {head})",
            hint="report this as a bug",
        )
    # 4. The values through W^O, their norms, and the head's part of the output.
    f = transformed_values(v, o_proj.weight, n_heads)[0].double().cpu()  # (H, S, E)
    all_weights = weights[0, :, 0].double().cpu()  # (H, S)
    outputs = torch.einsum("hs,hse->he", all_weights, f)  # (H, E)
    y = out[0, 0].double().cpu()  # (E,)
    b_o = o_proj.bias.detach().double().cpu() if o_proj.bias is not None else torch.zeros_like(y)
    rebuilt = outputs.sum(0) + b_o
    # Rebuilt in float64 against the layer's output in its dtype: a wrong decomposition is
    # off by the output's size, rounding by a few of the dtype's eps (measured on MiniLM,
    # relative to max |y|: 3e-7 in float32, 5e-4 in float16, 3e-3 in bfloat16, whose eps
    # is 7.8e-3; the float32 bound alone refused every half-precision explain).
    tolerance = max(1e-4, 2 * torch.finfo(out.dtype).eps) if out.dtype.is_floating_point else 1e-4
    if float((rebuilt - y).abs().max()) > tolerance * max(1.0, float(y.abs().max())):
        raise EngineError(
            "the heads' outputs do not add up to the layer's attention output", hint="report this as a bug"
        )
    denom = float(y @ y) or 1.0
    norms = torch.linalg.vector_norm(f[head], dim=-1)  # (S,)
    steps = []
    if terms.transformed:
        steps.append("q and k after the family's position transform (rotary)")
    if terms.normed:
        steps.insert(0, "q and k normed per head (q_norm, k_norm) before it")
    if terms.kv_layer is not None:
        steps.insert(0, f"keys and values projected by layer {terms.kv_layer}: this layer has none of its own")
    if terms.alibi:
        steps.append("ALiBi's linear position bias (slope · key position) added to the scaled scores")
    elif bias_row is not None:
        steps.append("a learned position bias added to the scaled scores")
    if softcap is not None:
        steps.append(f"scores soft-capped: {softcap:g}·tanh(s/{softcap:g})")
    if sink is not None:
        steps.append("a learned sink logit in each row's softmax")
    if groups != n_heads:
        steps.append(f"grouped-query attention: head {head} reads key/value head {g}")
    numpy_q = q.cpu().numpy().astype(np.float32)
    numpy_k = k.cpu().numpy().astype(np.float32)
    shown_logits = logits.cpu().masked_fill(~allowed, float("nan"))
    return Explanation(
        tokens=tokens,
        query=query,
        layer=layer,
        head=head,
        kv_head=g,
        q=numpy_q,
        k=numpy_k,
        scores=scores.cpu().numpy().astype(np.float32),
        scale=scale,
        bias=None if bias_row is None else bias_row.cpu().numpy().astype(np.float32),
        softcap=softcap,
        logits=shown_logits.numpy().astype(np.float32),
        mask=allowed.numpy(),
        sink=sink,
        sink_share=float(probs[keys]) if sink is not None else 0.0,
        weights=alpha.numpy().astype(np.float32),
        value_norms=norms.numpy().astype(np.float32),
        contribution=(alpha * norms).numpy().astype(np.float32),
        output=outputs[head].numpy().astype(np.float32),
        attention_output=y.numpy().astype(np.float32),
        head_shares=(outputs @ y / denom).numpy().astype(np.float32),
        bias_share=float(b_o @ y / denom),
        steps=tuple(steps),
        provenance=engine_provenance(engine),
        neuron=None if key is None else neuron(numpy_q, numpy_k, key),
    )
