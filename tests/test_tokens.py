"""Finding a word's tokens through the tokenizer's offsets."""

from __future__ import annotations

import pytest

from attnviz.cli import hint_for
from attnviz.errors import TokenNotFoundError, UsageError
from attnviz.example import EXAMPLE
from attnviz.tokens import Tokens, check_index, find_word, load_tokenizer, tokenize, word_occurrences


@pytest.fixture(scope="module")
def tok(minilm_dir):
    return load_tokenizer(minilm_dir)


def test_no_padding_or_truncation(tok) -> None:
    tokens = tokenize(tok, EXAMPLE)
    assert tokens.pieces[0] == "[CLS]" and tokens.pieces[-1] == "[SEP]"
    assert "[PAD]" not in tokens.pieces
    long = tokenize(tok, "word " * 300)
    assert len(long) == 302  # the shipped tokenizer.json would have cut this at 128


def test_word_is_found_case_insensitively_and_whole(tok) -> None:
    tokens = tokenize(tok, "With IT, it was It.")
    # "it" inside "With" is not a match; the three whole-word "it"s are.
    occurrences = word_occurrences(tokens, "it")
    assert [tokens.labels[i] for (i,) in occurrences] == ["IT", "it", "It"]
    assert find_word(tokens, "it", occurrence=2) == occurrences[1]


def test_split_word_gives_all_its_pieces(tok) -> None:
    tokens = tokenize(tok, "Tokenization of antidisestablishmentarianism")
    pieces = find_word(tokens, "antidisestablishmentarianism")
    assert len(pieces) > 1
    assert pieces == tuple(range(pieces[0], pieces[-1] + 1))
    assert "".join(tokens.labels[i].removeprefix("##") for i in pieces) == "antidisestablishmentarianism"
    assert all(tokens.labels[i].startswith("##") for i in pieces[1:])


def test_repeated_word_needs_an_occurrence(tok) -> None:
    tokens = tokenize(tok, "the cat saw the dog")
    with pytest.raises(TokenNotFoundError, match=r"occurs 2 times in the sentence \(at token 1, 4\)") as info:
        find_word(tokens, "the")
    assert info.value.facts == {"reason": "ambiguous", "count": 2}
    assert "--occurrence 1..2" in (hint_for(info.value) or "")
    assert find_word(tokens, "the", occurrence=2) == (4,)
    with pytest.raises(TokenNotFoundError, match="out of range"):
        find_word(tokens, "the", occurrence=3)


def test_missing_word_lists_the_tokens(tok) -> None:
    tokens = tokenize(tok, "the cat sat")
    with pytest.raises(TokenNotFoundError) as info:
        find_word(tokens, "dog")
    assert "0:[CLS] 1:the 2:cat 3:sat 4:[SEP]" in info.value.message


def test_special_and_subword_tokens_by_their_strings(tok) -> None:
    tokens = tokenize(tok, "the cat sat")
    assert find_word(tokens, "[SEP]") == (4,)
    assert find_word(tokens, "[cls]") == (0,)


def test_multiword_target(tok) -> None:
    tokens = tokenize(tok, EXAMPLE)
    assert [tokens.labels[i] for i in find_word(tokens, "the street")] == ["the", "street"]


def test_empty_inputs(tok) -> None:
    with pytest.raises(UsageError, match="empty"):
        tokenize(tok, "   ")
    tokens = tokenize(tok, "the cat")
    with pytest.raises(TokenNotFoundError):
        find_word(tokens, "  ")


def test_too_long_for_the_model(tok) -> None:
    with pytest.raises(UsageError, match="reads at most 16"):
        tokenize(tok, "word " * 20, max_length=16)


def test_check_index(tok) -> None:
    tokens = tokenize(tok, "the cat")
    assert check_index(tokens, -1) == 3
    with pytest.raises(TokenNotFoundError, match=r"0\.\.3"):
        check_index(tokens, 4)


def test_labels_mark_word_continuations() -> None:
    tokens = Tokens(
        text="unbelievable, it",
        ids=(1, 2, 3, 4, 5, 6),
        pieces=("<s>", "un", "believable", ",", "Ġit", "</s>"),
        offsets=((0, 0), (0, 2), (2, 12), (12, 13), (13, 16), (0, 0)),
        special=(True, False, False, False, False, True),
    )
    assert tokens.labels == ("<s>", "un", "##believable", ",", "it", "</s>")
    assert find_word(tokens, "it") == (4,)
    assert find_word(tokens, "unbelievable") == (1, 2)


def test_tokens_validate_lengths() -> None:
    with pytest.raises(ValueError, match="one entry per token"):
        Tokens(text="a", ids=(1, 2), pieces=("a",), offsets=((0, 1),), special=(False,))


def test_one_punctuation_rule_for_compare_and_heads() -> None:
    """compare/show's 'punct' exclusion and the heads punctuation detector share one rule,
    Unicode punctuation (P*): '$', '+', '=' are symbols (S*) and count in neither
    (compare used to set '$' aside as punctuation while heads counted it as a word)."""
    from attnviz.corpus.detectors import features
    from attnviz.measures.metrics import excluded
    from attnviz.tokens import is_punctuation

    labels = ["[CLS]", "it", "costs", "$", "5", ",", "+", "10", "%", "=", "«", "…", "[SEP]"]
    punct = [False, False, False, False, False, True, False, False, True, False, True, True, False]
    assert [is_punctuation(label) for label in labels[1:-1]] == punct[1:-1]
    n = len(labels)
    special = tuple(i in (0, n - 1) for i in range(n))
    words = labels[1:-1]
    starts = [sum(len(w) + 1 for w in words[:i]) for i in range(len(words))]
    offsets = ((0, 0), *((a, a + len(w)) for a, w in zip(starts, words)), (0, 0))
    tokens = Tokens(" ".join(words), tuple(range(n)), tuple(labels), offsets, special)
    assert list(tokens.labels) == labels
    assert excluded(tokens, (1,), ("punct",)).tolist() == punct
    assert list(features(range(n), special, labels).punctuation) == punct
    assert not is_punctuation("$") and is_punctuation("Ġ,") and is_punctuation("##.")


def test_errors_call_a_paragraph_the_text_and_a_sentence_the_sentence(own_engine) -> None:  # type: ignore[no-untyped-def]
    """Errors about a paragraph said "the sentence" (issue 39): the noun follows the text."""
    from attnviz.errors import TokenNotFoundError
    from attnviz.io.safeio import text_noun
    from attnviz.select import find_targets

    assert text_noun(EXAMPLE + ".") == "the sentence"
    assert text_noun("It costs 3.5 dollars.") == "the sentence"  # a point inside a number ends nothing
    assert text_noun("The cat sat. Then it ran.") == "the text"
    assert text_noun("one line\nanother line") == "the text"
    assert text_noun('He said "stop." Then he left.') == "the text"
    paragraph = own_engine.tokenize("The cat sat. Then it ran away because it was scared.")
    sentence = own_engine.tokenize("The cat sat on the mat")
    for tokens, noun in ((paragraph, "the text"), (sentence, "the sentence")):
        with pytest.raises(TokenNotFoundError, match=f"'dog' is not in {noun};"):
            find_word(tokens, "dog")
        with pytest.raises(TokenNotFoundError, match=f"target 'dog' is not in {noun};"):
            find_targets(tokens, ["dog"])
        with pytest.raises(TokenNotFoundError, match=f"out of range: {noun} has"):
            check_index(tokens, 99)
    with pytest.raises(TokenNotFoundError, match="is not in sentence B"):
        find_word(paragraph, "dog", where="sentence B")  # a name given by the caller stays


def test_vocab_labels_follow_one_rule_for_every_tokenizer_kind() -> None:
    """A vocabulary entry (the ablation footer's predicted token) is labelled as the views
    label tokens: the decoded text, ``##`` on a continuation, whatever the tokenizer marks
    (WordPiece marks continuations; byte-level BPE and SentencePiece/Unigram word starts)."""
    from tokenizers import Tokenizer, decoders, pre_tokenizers
    from tokenizers.models import BPE, Unigram, WordLevel, WordPiece

    from attnviz.measures.lm import LMHead
    from attnviz.tokens import vocab_label

    wordpiece = Tokenizer(WordPiece({"[UNK]": 0, "[CLS]": 1, "she": 2, "##al": 3}, unk_token="[UNK]"))
    wordpiece.decoder = decoders.WordPiece()
    wordpiece.add_special_tokens(["[CLS]"])
    byte = pre_tokenizers.ByteLevel.alphabet()
    vocab = {c: i for i, c in enumerate(sorted(byte))}
    vocab.update({"Ġshe": len(vocab), "he": len(vocab) + 1, "<|endoftext|>": len(vocab) + 2})
    bpe = Tokenizer(BPE(vocab, []))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.add_special_tokens(["<|endoftext|>"])
    unigram = Tokenizer(Unigram([("<unk>", 0.0), ("▁she", -1.0), ("he", -2.0), ("</s>", 0.0)], 0))
    unigram.decoder = decoders.Metaspace()
    unigram.add_special_tokens(["</s>"])
    wordlevel = Tokenizer(WordLevel({"<unk>": 0, "<bos>": 1, "Mary": 2}, unk_token="<unk>"))  # no decoder
    wordlevel.add_special_tokens(["<bos>"])
    cases = [
        (wordpiece, "she", "she"),
        (wordpiece, "##al", "##al"),
        (wordpiece, "[CLS]", "[CLS]"),
        (bpe, "Ġshe", "she"),
        (bpe, "he", "##he"),
        (bpe, "<|endoftext|>", "<|endoftext|>"),
        (bpe, "Ã", "Ã"),  # one byte of a two-byte character: no whole character to show
        (unigram, "▁she", "she"),
        (unigram, "he", "##he"),
        (unigram, "</s>", "</s>"),
        (wordlevel, "Mary", "Mary"),  # every word-level entry is a whole word
        (wordlevel, "<bos>", "<bos>"),
    ]
    for tok, piece, label in cases:
        index = tok.token_to_id(piece)
        assert index is not None, piece
        assert vocab_label(tok, index) == label, (type(tok.model).__name__, piece)
    assert vocab_label(bpe, 10**6) == "<1000000>"
    lm = LMHead.__new__(LMHead)
    object.__setattr__(lm, "tokenizer", bpe)  # the footer's path: LMHead.token (a frozen dataclass)
    assert lm.token(bpe.token_to_id("Ġshe")) == "she"
