"""Words in scripts written without spaces (issue 25): CJK text was one "word" under
``--words`` and ``--token 東京`` was not found, because words came from letter adjacency.
Words now come from the tokenizer's word ids (transformers' ``word_ids()`` is the
reference), and a query matches where its ends are word boundaries."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from attnviz.errors import TokenNotFoundError
from attnviz.tokens import find_word, tokenize
from attnviz.transforms import word_groups

from .builders import Spec, _encoder, build_tiny

ROOT = Path(__file__).resolve().parent.parent
VOCAB = [
    *("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "council", "##men", "didn", "'", "t", "go"),
    *("!", ".", "我", "在", "東", "京", "工", "作", "は", "日", "本", "の", "首", "都", "で", "##す", "。"),
]
TEXTS = ["我在東京工作。", "東京は日本の首都です", "我在東京工作。The councilmen didn't go!"]


def bert_tokenizer() -> Any:
    """A BERT WordPiece tokenizer (BERT's normalizer puts each Han character apart)."""
    from tokenizers import Tokenizer, normalizers, pre_tokenizers, processors
    from tokenizers.models import WordPiece
    from transformers import PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(VOCAB)}
    tok = Tokenizer(WordPiece(vocab, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])],
    )
    specials = {"unk_token": "[UNK]", "pad_token": "[PAD]", "cls_token": "[CLS]", "sep_token": "[SEP]"}
    return PreTrainedTokenizerFast(tokenizer_object=tok, mask_token="[MASK]", **specials)


# The suite's tiny BERT over VOCAB, at transformers' default initializer_range (0.02).
CJK_BERT = Spec(
    "cjk-bert", "bert", _encoder("BertConfig", vocab_size=len(VOCAB), initializer_range=0.02), "masked", "bert"
)


@pytest.fixture(scope="module")
def cjk_bert(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("cjk") / "bert"
    build_tiny(CJK_BERT).save_pretrained(path)
    bert_tokenizer().save_pretrained(path)
    return path


def reference_groups(word_ids: list[int | None]) -> tuple[tuple[int, ...], ...]:
    """transformers' words: consecutive tokens with one word id; special tokens alone."""
    groups: list[list[int]] = []
    for i, word in enumerate(word_ids):
        if groups and word is not None and word_ids[i - 1] == word:
            groups[-1].append(i)
        else:
            groups.append([i])
    return tuple(tuple(g) for g in groups)


@pytest.mark.parametrize("text", TEXTS)
def test_words_are_the_tokenizers_word_ids(cjk_bert: Path, text: str) -> None:
    from transformers import AutoTokenizer

    from attnviz.engines import load_engine

    reference = AutoTokenizer.from_pretrained(cjk_bert)(text).word_ids()
    tokens = load_engine("own", str(cjk_bert), "cpu").tokenize(text)
    assert word_groups(tokens) == reference_groups(reference)
    assert len(word_groups(tokens)) > 3  # not one "word" for the whole CJK run


def test_tokyo_is_found_and_read_as_its_tokens_mean(cjk_bert: Path) -> None:
    """--token 東京: the rows of 東 and 京 averaged, against transformers' eager weights."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    import attnviz

    text = TEXTS[0]
    tok = AutoTokenizer.from_pretrained(cjk_bert)
    enc = tok(text, return_tensors="pt")
    pieces = tok.convert_ids_to_tokens(enc["input_ids"][0])
    at = (pieces.index("東"), pieces.index("京"))
    model = AutoModel.from_pretrained(cjk_bert, attn_implementation="eager").eval()
    with torch.no_grad():
        ref = model(**enc, output_attentions=True).attentions[1][0].numpy()  # (H, S, S)
    for words in (False, True):
        att = attnviz.inspect(text, "東京", model=str(cjk_bert), layers=1, words=words, renorm=False)
        np.testing.assert_allclose(att.weights[0, :, 0], ref[:, list(at)].mean(1), atol=1e-5)
    assert attnviz.inspect(text, "東", model=str(cjk_bert), layers=1).queries == (at[0],)


def test_show_words_token_tokyo_through_the_cli(cjk_bert: Path) -> None:
    from .helpers import in_process

    args = ["show", TEXTS[2], "--token", "東京", "--words", "--layer", "0", "--model", str(cjk_bert), "--json"]
    done = in_process(*args)
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["tokens"][:8] == ["[CLS]", "我", "在", "東", "京", "工", "作", "。"]
    assert "councilmen" in doc["tokens"]  # council ##men: one word, as its word ids say


def test_pieces_are_the_words_where_the_tokenizer_has_no_cjk_words() -> None:
    """A tokenizer that splits at spaces only (SentencePiece, byte-level BPE) gives one
    word id to a whole CJK run: its pieces are then the words."""
    from tokenizers import Tokenizer, pre_tokenizers
    from tokenizers.models import WordPiece

    vocab = {"[UNK]": 0, "我在": 1, "##東京": 2, "##工作": 3, "cat": 4}
    tok = Tokenizer(WordPiece(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokens = tokenize(tok, "我在東京工作 cat")
    assert tokens.word_ids == (0, 0, 0, 1)  # the tokenizer's words: the run, and "cat"
    assert word_groups(tokens) == ((0,), (1,), (2,), (3,))
    assert find_word(tokens, "東京") == (1,)
    assert find_word(tokens, "我在東京") == (0, 1)
    with pytest.raises(TokenNotFoundError):
        find_word(tokens, "在東")  # inside two pieces: no word starts or ends there


def test_latin_words_are_unchanged() -> None:
    tok = bert_tokenizer()._tokenizer
    tokens = tokenize(tok, "the councilmen didn't go!")
    assert [tokens.labels[i] for g in word_groups(tokens) for i in g][2:4] == ["council", "##men"]
    assert [len(g) for g in word_groups(tokens)] == [1, 1, 2, 1, 1, 1, 1, 1, 1]
    with pytest.raises(TokenNotFoundError):
        find_word(tokens, "men")  # the end of "councilmen" is not a word
