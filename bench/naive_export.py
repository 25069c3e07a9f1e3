"""The naive way to get the same picture: transformers + pyplot, as a one-off script.

What a user writes today without attnviz: load the model with eager attention, run
output_attentions, and draw each layer's heads × tokens rows for "it" with pyplot.
Same figure as `attnviz export ... --token it`: 6 layers × 12 heads on a 2 × 3 grid,
one shared colour scale, one colour bar, PNG at 150 dpi.

    python bench/naive_export.py MODEL_DIR OUT.png
"""

from __future__ import annotations

import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402
from transformers import AutoModel, AutoTokenizer  # noqa: E402

from attnviz.example import EXAMPLE as SENTENCE  # noqa: E402


def main(model_dir: str, out: str) -> None:
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModel.from_pretrained(model_dir, attn_implementation="eager").eval()
    enc = tokenizer(SENTENCE, return_tensors="pt")
    with torch.no_grad():
        attentions = model(**enc, output_attentions=True).attentions  # N × (1, H, S, S)
    tokens = tokenizer.convert_ids_to_tokens(enc["input_ids"][0])
    q = tokens.index("it")
    fig, axes = plt.subplots(2, 3, figsize=(13, 5.5), sharex=True, sharey=True)
    for layer, ax in enumerate(axes.flat):
        im = ax.imshow(attentions[layer][0, :, q, :].numpy(), cmap="viridis", vmin=0, vmax=1, aspect="auto")
        ax.set_title(f"layer {layer}", fontsize=8, loc="left")
        ax.set_xticks(range(len(tokens)), tokens, rotation=90, fontsize=7)
        ax.set_yticks(
            range(attentions[layer].shape[1]), [f"h{h}" for h in range(attentions[layer].shape[1])], fontsize=7
        )
    fig.suptitle(f"{SENTENCE} · all-MiniLM-L6-v2 · 'it'")
    fig.tight_layout()
    fig.colorbar(im, ax=axes, label="attention weight")
    fig.savefig(out, dpi=150)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
