"""The naive way to read one token's rows: transformers eager + output_attentions, printed.

What `attnviz show "..." --token it` answers, as a user writes it without attnviz: load the
model with eager attention, run one forward pass with output_attentions=True, print each
layer's heads × tokens rows for "it".

    python bench/naive_show.py MODEL_DIR
"""

from __future__ import annotations

import sys

import torch
from transformers import AutoModel, AutoTokenizer

from attnviz.example import EXAMPLE as SENTENCE


def main(model_dir: str) -> None:
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModel.from_pretrained(model_dir, attn_implementation="eager").eval()
    enc = tokenizer(SENTENCE, return_tensors="pt")
    with torch.no_grad():
        attentions = model(**enc, output_attentions=True).attentions  # N × (1, H, S, S)
    tokens = tokenizer.convert_ids_to_tokens(enc["input_ids"][0])
    q = tokens.index("it")
    print(" ".join(f"{t:>8s}" for t in tokens))
    for layer, att in enumerate(attentions):
        for head, row in enumerate(att[0, :, q, :].tolist()):
            print(f"L{layer} H{head:<2d} " + " ".join(f"{w:8.3f}" for w in row))


if __name__ == "__main__":
    main(sys.argv[1])
