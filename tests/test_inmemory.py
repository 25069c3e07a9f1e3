"""Models already in memory (attnviz.engines.inmemory): ``inspect(text, model=<a
transformers model>, tokenizer=<its tokenizer>)`` equals the path-loaded result on both
engines, takes the weights without copying them, leaves the caller's model as it was, and
refuses what it cannot read with one clear AttnvizError."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import attnviz
from attnviz.errors import AttnvizError, DeviceError, UnsupportedArchitectureError, UsageError
from attnviz.example import EXAMPLE

from .builders import SPECS_BY_NAME, save_tiny

TEXT = "the cat sat on the mat because it was tired"


@pytest.fixture(scope="module")
def minilm(minilm_dir: Path) -> tuple[Any, Any]:
    from transformers import AutoModel, AutoTokenizer

    return AutoModel.from_pretrained(str(minilm_dir)), AutoTokenizer.from_pretrained(str(minilm_dir))


def same(a: Any, b: Any) -> float:
    assert a.tokens.ids == b.tokens.ids and a.layers == b.layers and a.queries == b.queries
    return float(np.abs(a.weights - b.weights).max())


@pytest.mark.parametrize("engine", ["own", "hf"])
def test_minilm_in_memory_equals_the_packaged_path(minilm: tuple[Any, Any], engine: str) -> None:
    model, tokenizer = minilm
    mem = attnviz.inspect(EXAMPLE, model=model, tokenizer=tokenizer, engine=engine, device="cpu")
    path = attnviz.inspect(EXAMPLE, engine=engine, device="cpu")
    assert same(mem, path) <= 1e-6
    assert mem.provenance.engine == engine and mem.provenance.model.startswith("BertModel in memory")
    # The README's finding, from the model in memory: layer 3 head 1, "it" -> "animal".
    it = attnviz.inspect(EXAMPLE, "it", model=model, tokenizer=tokenizer, engine=engine, layers=3, device="cpu")
    assert it.rows(it.queries[0])[0, 1, it.tokens.labels.index("animal")] == pytest.approx(0.64, abs=0.01)


@pytest.mark.parametrize("name", ["bert", "gpt2", "llama", "qwen2"])
@pytest.mark.parametrize("engine", ["own", "hf"])
def test_tiny_families_in_memory_equal_their_checkpoint(tmp_path: Path, name: str, engine: str) -> None:
    from transformers import AutoModel, AutoModelForCausalLM, AutoModelForMaskedLM, PreTrainedTokenizerFast

    directory = save_tiny(SPECS_BY_NAME[name], tmp_path / name)
    path = attnviz.inspect(TEXT, model=str(directory), engine=engine, device="cpu")
    # The saved tokenizer.json as it is (AutoTokenizer would rebuild Qwen2's from its own
    # class, with other ids than the test's word-level vocabulary: not what is tested here).
    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(directory))
    head = AutoModelForCausalLM if SPECS_BY_NAME[name].head == "causal" else AutoModelForMaskedLM
    for cls in (AutoModel, head):  # the base model, and one with its task head
        model = cls.from_pretrained(str(directory))
        mem = attnviz.inspect(TEXT, model=model, tokenizer=tokenizer, engine=engine, device="cpu")
        assert same(mem, path) <= 1e-6, cls


def test_the_own_engine_takes_the_weights_without_a_copy(minilm: tuple[Any, Any]) -> None:
    from attnviz.engines.inmemory import from_model

    model, tokenizer = minilm
    engine = from_model(model, tokenizer, "own", "cpu")
    theirs = {p.data_ptr() for p in model.parameters()}
    ours = [p.data_ptr() for p in engine.model.parameters()]
    assert ours and all(ptr in theirs for ptr in ours)  # views of the caller's tensors


def test_the_hf_engine_switches_to_eager_for_the_call_and_restores(minilm: tuple[Any, Any]) -> None:
    model, tokenizer = minilm
    model.train()  # dropout on: attnviz must read it in eval mode, then leave it training
    try:
        before = model.config._attn_implementation
        assert before != "eager"
        a = attnviz.inspect(EXAMPLE, model=model, tokenizer=tokenizer, engine="hf", device="cpu")
        b = attnviz.inspect(EXAMPLE, model=model, tokenizer=tokenizer, engine="hf", device="cpu")
        assert same(a, b) == 0.0  # no dropout in either run
        assert model.config._attn_implementation == before and model.training
    finally:
        model.eval()


class HookedTransformer:  # TransformerLens' class, by name and shape (it is not installed)
    cfg = object()

    def run_with_cache(self) -> None: ...


def test_objects_attnviz_cannot_read_are_refused_saying_what_is_accepted(minilm: tuple[Any, Any]) -> None:
    import torch

    model, tokenizer = minilm
    for thing, says in (
        (HookedTransformer(), "TransformerLens HookedTransformer"),
        (torch.nn.Linear(2, 2), "not a transformers model"),
        (object(), "not a transformers model"),
    ):
        with pytest.raises(UnsupportedArchitectureError, match=says) as info:
            attnviz.inspect(EXAMPLE, model=thing, tokenizer=tokenizer)
        assert "accepted: a transformers PreTrainedModel" in str(info.value)
    model.config.quantization_config = {"quant_method": "bitsandbytes", "load_in_8bit": True}
    try:
        with pytest.raises(UnsupportedArchitectureError, match="a quantized BertModel"):
            attnviz.inspect(EXAMPLE, model=model, tokenizer=tokenizer)
    finally:
        del model.config.quantization_config


def test_bad_companions_are_one_clear_error(minilm: tuple[Any, Any], tmp_path: Path) -> None:
    import torch
    from transformers import AutoConfig, AutoModel, AutoTokenizer

    model, tokenizer = minilm
    tiny = save_tiny(SPECS_BY_NAME["bert"], tmp_path / "bert")
    small_model = AutoModel.from_pretrained(str(tiny))
    with pytest.raises(UsageError, match="the tokenizer has 30,522 tokens but BertModel in memory .* embeds"):
        attnviz.inspect(TEXT, model=small_model, tokenizer=tokenizer)
    with pytest.raises(UsageError, match="came without a tokenizer"):
        attnviz.inspect(TEXT, model=model)
    with pytest.raises(UsageError, match="not a fast"):
        attnviz.inspect(TEXT, model=model, tokenizer=object())
    if not torch.cuda.is_available():
        with pytest.raises(DeviceError, match="CUDA is not available"):
            attnviz.inspect(TEXT, model=model, tokenizer=tokenizer, device="cuda")
    with torch.device("meta"):
        ghost = AutoModel.from_config(AutoConfig.from_pretrained(str(tiny)))
    with pytest.raises(DeviceError, match="meta device"):
        attnviz.inspect(TEXT, model=ghost, tokenizer=AutoTokenizer.from_pretrained(str(tiny)))
    for engine in ("own", "hf"):
        with pytest.raises(UsageError, match="this model reads at most 512"):
            attnviz.inspect("word " * 600, model=model, tokenizer=tokenizer, engine=engine)
    with pytest.raises(UsageError, match="the hf engine runs the model where and as it is"):
        attnviz.inspect(TEXT, model=model, tokenizer=tokenizer, engine="hf", dtype="bfloat16")
    with pytest.raises(AttnvizError):  # every refusal is an AttnvizError, never a traceback of torch's
        attnviz.inspect(TEXT, model=model, tokenizer=tokenizer, engine="neither")


def test_threads_sharing_one_model_under_the_hf_engine_all_succeed(minilm: tuple[Any, Any]) -> None:
    """The switch to eager attention and back is per model and was not locked: a thread
    restoring sdpa under another's forward pass left it without weights."""
    from concurrent.futures import ThreadPoolExecutor

    model, tokenizer = minilm
    ref = attnviz.inspect(TEXT, model=model, tokenizer=tokenizer, engine="hf", layers=[0, 1], device="cpu")

    def one(_: int) -> float:
        got = attnviz.inspect(TEXT, model=model, tokenizer=tokenizer, engine="hf", layers=[0, 1], device="cpu")
        return same(got, ref)

    with ThreadPoolExecutor(4) as pool:
        assert max(pool.map(one, range(12))) <= 1e-6
    assert model.config._attn_implementation != "eager"  # the caller's setting, restored


def _tiny_in_memory(tmp_path: Path, name: str) -> tuple[Any, Any]:
    from transformers import AutoModel, PreTrainedTokenizerFast

    directory = save_tiny(SPECS_BY_NAME[name], tmp_path / name)
    return AutoModel.from_pretrained(str(directory)), PreTrainedTokenizerFast.from_pretrained(str(directory))


def test_the_own_engine_refuses_a_model_carrying_forward_hooks(tmp_path: Path) -> None:
    """Our stack runs the state_dict, not the module: a hook that changes what the module
    computes would be silently left out."""
    import torch

    model, tokenizer = _tiny_in_memory(tmp_path, "llama")
    layer = model.layers[0].self_attn
    for add in (
        lambda: layer.register_forward_hook(lambda m, a, out: (out[0] * 0.0, *out[1:])),
        lambda: layer.o_proj.register_forward_pre_hook(lambda m, a: (torch.zeros_like(a[0]),)),
    ):
        handle = add()
        with pytest.raises(UnsupportedArchitectureError, match="hook") as info:
            attnviz.inspect(TEXT, model=model, tokenizer=tokenizer, engine="own", device="cpu")
        assert 'engine="hf"' in str(info.value)
        handle.remove()
    attnviz.inspect(TEXT, model=model, tokenizer=tokenizer, engine="own", device="cpu")  # unhooked: fine


@pytest.mark.parametrize(
    ("name", "edit"),
    [
        ("llama", {"num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 8}),  # other heads, same shapes
        ("gpt2", {"layer_norm_epsilon": 10.0}),
        ("llama", {"hidden_act": "relu"}),
        ("bert", {"hidden_act": "relu"}),
    ],
)
def test_the_own_engine_refuses_a_config_edited_after_loading(tmp_path: Path, name: str, edit: dict[str, Any]) -> None:
    """model.config edited in memory, the modules as they were: the own engine would read
    the config and answer for another model than the module computes."""
    model, tokenizer = _tiny_in_memory(tmp_path, name)
    hf = attnviz.inspect(TEXT, model=model, tokenizer=tokenizer, engine="hf", device="cpu")
    for key, value in edit.items():
        setattr(model.config, key, value)
    with pytest.raises(UnsupportedArchitectureError, match="does not compute what its config") as info:
        attnviz.inspect(TEXT, model=model, tokenizer=tokenizer, engine="own", device="cpu")
    assert 'engine="hf"' in str(info.value)
    assert same(attnviz.inspect(TEXT, model=model, tokenizer=tokenizer, engine="hf", device="cpu"), hf) <= 1e-6


def _one_spec_per_family() -> list[Any]:
    from .builders.families_a import FAMILY_A_SPECS
    from .builders.families_b import SPECS_B

    seen: dict[str, Any] = {}
    for spec in (*SPECS_BY_NAME.values(), *SPECS_B, *FAMILY_A_SPECS):
        seen.setdefault(spec.model_type, spec)
    return list(seen.values())


@pytest.mark.parametrize("spec", _one_spec_per_family(), ids=lambda s: s.model_type)
def test_the_probe_pass_accepts_every_unedited_family(tmp_path: Path, spec: Any) -> None:
    """No false refusal: each family's own stack computes what its module does, within
    the probe's tolerance (and the probe is run, not skipped, where it can be)."""
    from transformers import AutoModel, PreTrainedTokenizerFast

    from attnviz.engines.inmemory import from_model

    directory = save_tiny(spec, tmp_path / spec.name)
    model = AutoModel.from_pretrained(str(directory), experts_implementation="eager")
    from_model(model, PreTrainedTokenizerFast.from_pretrained(str(directory)), "own", "cpu")


def test_mixed_float_dtypes_are_one_clear_error_under_hf(tmp_path: Path) -> None:
    """One layer cast to float16: transformers' own pass fails inside (a RuntimeError, not
    ours); the own engine reads every weight in float32 and answers."""
    import torch

    model, tokenizer = _tiny_in_memory(tmp_path, "bert")
    model.encoder.layer[0].attention.self.query.to(torch.float16)
    with pytest.raises(UsageError, match="float16, float32") as info:
        attnviz.inspect(TEXT, model=model, tokenizer=tokenizer, engine="hf", device="cpu")
    assert "model.to(" in str(info.value)
    own = attnviz.inspect(TEXT, model=model, tokenizer=tokenizer, engine="own", device="cpu")
    assert np.isfinite(own.weights).all()


def test_a_tokenizer_with_a_python_pre_tokenizer_is_one_clear_error(minilm: tuple[Any, Any]) -> None:
    """A custom (Python) pre-tokenizer cannot be serialised, which the copy needs."""
    from tokenizers import pre_tokenizers
    from transformers import AutoTokenizer

    class Whole:
        def pre_tokenize(self, pretok: Any) -> None:
            pretok.split(lambda i, s: [s])

    model, tokenizer = minilm
    custom = AutoTokenizer.from_pretrained(tokenizer.name_or_path)
    custom.backend_tokenizer.pre_tokenizer = pre_tokenizers.PreTokenizer.custom(Whole())
    with pytest.raises(UsageError, match="cannot be copied") as info:
        attnviz.inspect(TEXT, model=model, tokenizer=custom, device="cpu")
    assert info.value.facts.get("reason") == "tokenizer"
