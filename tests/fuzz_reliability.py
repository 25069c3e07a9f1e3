"""Generators for what the command-line grammar cannot reach (issue 38), each a hypothesis
strategy of one case and a function that runs it and returns its problems ("" = none):

    family     a family config with one numeric key at a boundary (0, 1, negative, a
               fraction, above the head dim, huge, null, a string): our stack refuses it
               (an AttnvizError), or builds and computes what transformers computes from
               the same config and weights (≤ 1e-4), or transformers cannot run it at all
    memory     a transformers model in memory with an edit (its config changed after
               loading, a forward hook, a weight changed through .data, a layer in
               float16): the own engine refuses (an AttnvizError) or equals the hf engine
    notebook   notebook and widget arguments (views, layers, tokens with odd digits,
               options of odd types): a NotebookView always, never an exception
    settings   a hostile config.toml and environment (deep, huge, binary, a directory, a
               symlink loop, a long or odd XDG_CONFIG_HOME): read_config returns or raises
               ConfigError; matplotlib's probe never raises

A case's numbers are held to transformers, never only to "exit 0". bench/fuzz_reliability.py
runs thousands; tests/test_fuzz_reliability.py a few of each.
"""

from __future__ import annotations

import copy
import math
import os
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

TEXT = "the cat sat on the mat and the dog sat by the door"
FAMILIES = ("llama", "gpt_neox", "gpt_neo", "gemma2", "phi", "qwen2", "bloom", "gpt2", "bert")
BOUNDARY: tuple[Any, ...] = (0, 1, -1, 2, 0.5, 1.5, 0.0, -0.5, 1e-12, 1e308, None, "x", True)
TOL = 1e-4


@dataclass
class Saved:
    """The tiny checkpoints, saved once: config, weights and the path, per family."""

    root: Path
    paths: dict[str, Path] = field(default_factory=dict)
    configs: dict[str, dict[str, Any]] = field(default_factory=dict)
    tensors: dict[str, dict[str, Any]] = field(default_factory=dict)

    def load(self, name: str) -> None:
        import json

        from safetensors.torch import load_file

        from .builders import SPECS_BY_NAME, save_tiny
        from .builders.families_a import SPECS_A_BY_NAME

        spec = {**SPECS_BY_NAME, **SPECS_A_BY_NAME}[name]
        path = save_tiny(spec, self.root / name)
        self.paths[name] = path
        self.configs[name] = json.loads((path / "config.json").read_text(encoding="utf-8"))
        self.tensors[name] = load_file(str(path / "model.safetensors"))


def numeric_keys(config: dict[str, Any]) -> list[tuple[str, ...]]:
    """Every numeric key the config holds (nested rope parameters too), bools left out."""
    keys: list[tuple[str, ...]] = []
    for key, value in config.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool) and not key.endswith("token_id"):
            keys.append((key,))
        elif isinstance(value, dict):
            keys += [(key, k) for k, v in value.items() if isinstance(v, (int, float)) and not isinstance(v, bool)]
    # Keys a family reads with a default when absent: set them too.
    keys += [("partial_rotary_factor",), ("window_size",), ("sliding_window",), ("head_dim",), ("rope_theta",)]
    return keys


@st.composite
def family_cases(draw: Any, saved: Saved) -> tuple[str, tuple[str, ...], Any]:
    name = draw(st.sampled_from(sorted(saved.configs)))
    key = draw(st.sampled_from(numeric_keys(saved.configs[name])))
    head_dim = 16
    value = draw(st.sampled_from((*BOUNDARY, head_dim + 1, 2 * head_dim, 3)))
    return name, key, value


def _with(config: dict[str, Any], key: tuple[str, ...], value: Any) -> dict[str, Any]:
    out = copy.deepcopy(config)
    if len(key) == 1:
        out[key[0]] = value
    else:
        out.setdefault(key[0], {})[key[1]] = value
    return out


def run_family(saved: Saved, case: tuple[str, tuple[str, ...], Any]) -> tuple[str, str]:
    """(outcome, problem): outcome is refused / both / ours_only / neither."""
    import torch

    from attnviz import architectures
    from attnviz.errors import AttnvizError

    name, key, value = case
    config = _with(saved.configs[name], key, value)
    try:
        from attnviz.io.checkpoint import validate_config

        validate_config(config)
        ours: Any = architectures.build_from(config, dict(saved.tensors[name]), Path(f"fuzz/{name}"), "cpu")
    except AttnvizError:
        return "refused", ""
    except Exception:
        return "error", "building: " + traceback.format_exc(limit=-3)
    ids = torch.arange(3, 12)[None]  # (1, 9): ordinary tokens
    try:
        with torch.inference_mode():
            got = ours(ids, torch.ones_like(ids))
    except AttnvizError:
        return "refused", ""
    except Exception:
        return "error", "our forward pass: " + traceback.format_exc(limit=-3)
    mine = [a.double() for a in getattr(got, "attentions", [])]
    try:
        theirs = _transformers_attentions(name, config, saved, ids)
    except Exception:
        # transformers cannot build or run this config. Ours answering is no wrong number
        # to hold against it; it is counted (ours_only), and the weights must be sane.
        bad = [a for a in mine if not torch.isfinite(a).all()]
        return "ours_only", "non-finite weights from a config transformers cannot run" if bad else ""
    if len(theirs) != len(mine):
        return "both", f"{len(mine)} layers of weights, transformers {len(theirs)}"
    for layer, (a, b) in enumerate(zip(mine, theirs, strict=True)):
        if a.shape != b.shape:
            return "both", f"layer {layer}: shape {tuple(a.shape)}, transformers {tuple(b.shape)}"
        finite = torch.isfinite(b)
        if not finite.all():
            return "both", "" if not torch.isfinite(a).all() else ""  # transformers' NaN: nothing to hold to
        gap = float((a - b).abs().max())
        if not gap <= TOL:
            return "both", f"layer {layer} differs from transformers by {gap:.3g} ({key}={value!r})"
    return "both", ""


def _transformers_attentions(name: str, config: dict[str, Any], saved: Saved, ids: Any) -> list[Any]:
    import torch
    from transformers import AutoConfig, AutoModel

    fields = {k: v for k, v in config.items() if k not in ("model_type", "architectures", "transformers_version")}
    cfg = AutoConfig.for_model(config["model_type"], **fields)
    cfg._attn_implementation = "eager"
    with torch.device("cpu"):
        model = AutoModel.from_config(cfg, attn_implementation="eager").eval()
    prefixes = ("model.", "transformer.", "gpt_neox.", "bert.")
    state = {}
    for k, v in saved.tensors[name].items():
        for p in prefixes:
            if k.startswith(p):
                k = k[len(p) :]
                break
        state[k] = v
    missing, _ = model.load_state_dict(state, strict=False)
    if [m for m in missing if not m.endswith(("inv_freq", "bias", "masked_bias", "position_ids"))]:
        raise RuntimeError(f"missing weights: {missing[:3]}")
    with torch.inference_mode():
        out = model(input_ids=ids, attention_mask=torch.ones_like(ids), output_attentions=True)
    return [a.double() for a in out.attentions]


# --- models in memory ------------------------------------------------------------------

EDITS = ("heads", "eps", "act", "hook", "pre_hook", "data", "half", "theta", "none")


@st.composite
def memory_cases(draw: Any) -> tuple[str, str, Any]:
    name = draw(st.sampled_from(("llama", "bert", "gpt2")))
    edit = draw(st.sampled_from(EDITS))
    amount = draw(st.sampled_from((0.0, 0.5, 2.0, 10.0, 1e-12)))
    return name, edit, amount


def run_memory(saved: Saved, case: tuple[str, str, Any]) -> tuple[str, str]:
    import numpy as np
    import torch
    from transformers import AutoModel, PreTrainedTokenizerFast

    import attnviz
    from attnviz.errors import AttnvizError

    name, edit, amount = case
    path = saved.paths[name]
    model = AutoModel.from_pretrained(str(path))
    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(path))
    cfg = model.config
    handle = None
    if edit == "heads" and name == "llama":
        cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim = 8, 4, 8
    elif edit == "heads":
        cfg.num_attention_heads = (
            cfg.num_attention_heads * 2 if cfg.hidden_size % (cfg.num_attention_heads * 2) == 0 else 1
        )
    elif edit == "eps":
        for k in ("layer_norm_eps", "rms_norm_eps", "layer_norm_epsilon"):
            if hasattr(cfg, k):
                setattr(cfg, k, amount or 1.0)
    elif edit == "act":
        for k in ("hidden_act", "activation_function"):
            if hasattr(cfg, k):
                setattr(cfg, k, "relu")
    elif edit == "theta" and hasattr(cfg, "rope_parameters") and cfg.rope_parameters:
        cfg.rope_parameters = {**cfg.rope_parameters, "rope_theta": 7.0}
    elif edit in ("hook", "pre_hook"):
        target = next(m for n, m in model.named_modules() if n.endswith(("layers.0", "layer.0", "h.0")))
        if edit == "hook":
            handle = target.register_forward_hook(lambda m, a, out: out)  # even a no-op hook is refused
        else:
            handle = target.register_forward_pre_hook(lambda m, a: None)
    elif edit == "data":
        weight = next(p for n, p in model.named_parameters() if "weight" in n and p.ndim == 2)
        weight.data.mul_(amount or 3.0)
    elif edit == "half":
        next(m for n, m in model.named_modules() if n.endswith(("layers.0", "layer.0", "h.0"))).to(torch.float16)
    results: dict[str, Any] = {}
    for engine in ("hf", "own"):
        try:
            results[engine] = attnviz.inspect(TEXT, model=model, tokenizer=tokenizer, engine=engine, device="cpu")
        except AttnvizError as exc:
            results[engine] = exc
        except Exception:
            return "error", f"{engine} engine: " + traceback.format_exc(limit=-3)
    if handle is not None:
        handle.remove()
    own, hf = results["own"], results["hf"]
    if isinstance(own, AttnvizError):
        return "refused", ""
    if isinstance(hf, AttnvizError):
        return "ours_only", ""
    if own.weights.shape != hf.weights.shape:
        return "both", f"{edit}: shape {own.weights.shape} vs the module's {hf.weights.shape}"
    gap = float(np.abs(own.weights - hf.weights).max())
    low = edit == "half"
    if not gap <= (2e-2 if low else TOL):
        return "both", f"{edit} ({amount}): the own engine differs from the module by {gap:.3g}"
    return "both", ""


# --- notebook and widget arguments -------------------------------------------------------

ODD_TOKENS = ("it", "it:2", "it:²", "²", "١", "it:١", "", " ", "it:0", "it:-1", "zebra", "[CLS]", "99", "-1")
ODD = st.one_of(
    st.none(),
    st.integers(-3, 20),
    st.sampled_from(ODD_TOKENS),
    st.floats(allow_nan=True),
    st.booleans(),
    st.text(max_size=6),
    st.lists(st.integers(-2, 8), max_size=3),
)


@st.composite
def notebook_cases(draw: Any) -> dict[str, Any]:
    return {
        "view": draw(st.one_of(st.sampled_from(("head", "model", "neuron", "tree", "")), ODD)),
        "layer": draw(ODD),
        "token": draw(ODD),
        "options": draw(
            st.dictionaries(
                st.sampled_from(("head", "words", "hide_special", "mean", "shown", "rollout")), ODD, max_size=3
            )
        ),
        "measure": draw(st.sampled_from(("weight", "norm"))),
        "inspect": draw(
            st.dictionaries(
                st.sampled_from(("index", "layers", "occurrence", "token", "heads", "words")), ODD, max_size=2
            )
        ),
    }


def run_notebook(engine: Any, cache: dict[str, Any], case: dict[str, Any]) -> tuple[str, str]:
    import attnviz
    from attnviz.errors import AttnvizError

    try:
        attnviz.inspect(TEXT, device="cpu", **case["inspect"])
    except AttnvizError:
        pass
    except Exception:
        return "error", f"inspect({case['inspect']!r}): " + traceback.format_exc(limit=-3)
    if case["measure"] not in cache:
        from .helpers import inspect

        cache[case["measure"]] = inspect(TEXT, engine, measure=case["measure"])
    att = cache[case["measure"]]
    try:
        view = att.show(case["view"], case["layer"], case["token"], **case["options"])
        shown = view._repr_mimebundle_()
        assert isinstance(shown["text/html"], str)
        if att.measure != "weight" and "<iframe" in shown["text/html"]:
            return "both", "norms drawn as a page of weights"
    except (AttnvizError, TypeError):
        # TypeError: an option name show() does not take, from Python's own call check.
        return "refused", ""
    except Exception:
        return "error", f"show({case!r}): " + traceback.format_exc(limit=-3)
    return "both", ""


# --- config files and the environment ----------------------------------------------------


@st.composite
def settings_cases(draw: Any) -> dict[str, Any]:
    kind = draw(st.sampled_from(("text", "deep", "digits", "big", "binary", "dir", "loop", "none", "fifo")))
    return {
        "kind": kind,
        "text": draw(st.text(max_size=60)),
        "depth": draw(st.integers(1, 200_000)),
        "xdg": draw(st.sampled_from(("normal", "long", "file", "missing", "nul", "relative", "empty"))),
        "vars": draw(
            st.dictionaries(
                st.sampled_from(("ATTNVIZ_MODEL", "ATTNVIZ_ENGINE", "ATTNVIZ_DEVICE", "ATTNVIZ_MODEL_NAME", "HOME")),
                st.text(max_size=20).filter(lambda s: "\x00" not in s),
                max_size=2,
            )
        ),
    }


@contextmanager
def _environ(values: dict[str, str | None]) -> Iterator[None]:
    old = {k: os.environ.get(k) for k in values}
    try:
        for k, v in values.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def run_settings(root: Path, n: int, case: dict[str, Any]) -> tuple[str, str]:
    from attnviz.cli import conventions
    from attnviz.render import matplotlib_config_dir

    home = root / f"xdg-{n}"
    xdg = {
        "normal": str(home),
        "long": str(home) + ("/" + "d" * 250) * 20,
        "file": str(root / "a-file"),
        "missing": str(home / "nowhere"),
        "nul": str(home) + "\x00x",
        "relative": "relative/dir",
        "empty": "",
    }[case["xdg"]]
    (root / "a-file").write_text("x")
    if case["xdg"] == "normal":
        path = home / "attnviz" / "config.toml"
        path.parent.mkdir(parents=True, exist_ok=True)
        kind = case["kind"]
        if kind == "text":
            path.write_text(case["text"], encoding="utf-8", errors="surrogatepass") if "\ud800" not in case[
                "text"
            ] else path.write_bytes(b"\xff")
        elif kind == "deep":
            path.write_text("x = " + "[" * min(case["depth"], 60_000), encoding="utf-8")
        elif kind == "digits":
            path.write_text("engine = " + "7" * min(case["depth"], 60_000), encoding="utf-8")
        elif kind == "big":
            with path.open("wb") as f:
                f.truncate(64 * 1024 + case["depth"])
        elif kind == "binary":
            path.write_bytes(bytes(range(256)) * 3)
        elif kind == "dir":
            path.mkdir()
        elif kind == "loop":
            os.symlink(path, path)
        elif kind == "fifo":
            os.mkfifo(path)
    env: dict[str, str | None] = {"XDG_CONFIG_HOME": xdg if "\x00" not in xdg else None, "MPLCONFIGDIR": None}
    env.update(case["vars"])
    with _environ(env):
        try:
            conventions.read_config()
        except conventions.ConfigError:
            pass
        except Exception:
            return "error", f"read_config ({case['kind']}, {case['xdg']}): " + traceback.format_exc(limit=-3)
        try:
            matplotlib_config_dir()
        except Exception:
            return "error", f"matplotlib_config_dir ({case['xdg']}): " + traceback.format_exc(limit=-3)
    return "both", ""


def finite(x: float) -> bool:
    return math.isfinite(x)
