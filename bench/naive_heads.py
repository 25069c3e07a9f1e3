"""The naive way to score heads over a corpus: transformers eager, one sentence at a time,
``output_attentions=True``, numpy scores per sentence, every score kept in a list.

The same nine detectors and definitions as ``attnviz heads`` (README), written the way a
one-off script would. Prints one JSON line: texts, seconds (the loop only, not the model
load), and the mean of each detector per (layer, head), for checking against attnviz.

    python bench/naive_heads.py MODEL_DIR CORPUS.txt
"""

from __future__ import annotations

import json
import sys
import time
import unicodedata

import numpy as np
import torch
from transformers import AutoModel, AutoTokenizer

DETECTORS = ("previous", "next", "self", "sink", "punctuation", "duplicate", "induction", "local", "entropy")


def is_punct(token: str) -> bool:
    token = token.removeprefix("##").removeprefix("Ġ").removeprefix("▁").strip()
    return bool(token) and all(unicodedata.category(c).startswith("P") for c in token)


def scores(att: np.ndarray, ids: list[int], special: list[bool], pieces: list[str]) -> dict[str, np.ndarray]:
    """att (N, H, S, S) of one sentence -> {detector: (N, H)} (absent where undefined)."""
    n = len(ids)
    q = np.array([not s for s in special])
    pos = np.arange(n)
    out: dict[str, np.ndarray] = {}

    def mean_mass(queries: np.ndarray, targets: np.ndarray) -> np.ndarray:
        mass = (att * targets[None, None]).sum(-1)  # (N, H, S)
        return mass[..., queries].mean(-1)

    i, j = pos[:, None], pos[None, :]
    out["previous"] = mean_mass(q & (pos >= 1), j == i - 1)
    out["next"] = mean_mass(q & (pos + 1 < n), j == i + 1)
    out["self"] = mean_mass(q, j == i)
    sinks = np.array(special) if any(special) else pos == 0
    out["sink"] = mean_mass(q & ~sinks, np.broadcast_to(sinks, (n, n)))
    punct = np.array([not s and is_punct(p) for s, p in zip(special, pieces)])
    out["punctuation"] = mean_mass(q, np.broadcast_to(punct, (n, n)))
    arr = np.array(ids)
    same = (arr[:, None] == arr[None, :]) & q[:, None] & q[None, :] & (j < i)
    if same.any():
        out["duplicate"] = mean_mass(q & same.any(1), same)
    after = np.zeros_like(same)
    after[:, 1:] = same[:, :-1]
    after &= j < i
    if after.any():
        out["induction"] = mean_mass(q & after.any(1), after)
    out["local"] = mean_mass(q, np.abs(i - j) <= 2)
    p = np.clip(att, 1e-30, None)
    h = -(att * np.log(p)).sum(-1) / np.log(n)  # (N, H, S)
    out["entropy"] = h[..., q].mean(-1)
    return out


def main(model_dir: str, corpus: str) -> None:
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModel.from_pretrained(model_dir, attn_implementation="eager").eval()
    kept: dict[str, list[np.ndarray]] = {d: [] for d in DETECTORS}
    texts = 0
    start = time.perf_counter()
    with open(corpus, encoding="utf-8") as handle:
        for line in handle:
            if not line.strip():
                continue
            enc = tokenizer(line.rstrip("\n"), return_tensors="pt", return_special_tokens_mask=True)
            special = [bool(s) for s in enc.pop("special_tokens_mask")[0].tolist()]
            with torch.no_grad():
                attentions = model(**enc, output_attentions=True).attentions
            att = torch.stack([a[0] for a in attentions]).double().numpy()  # (N, H, S, S)
            ids = enc["input_ids"][0].tolist()
            for name, value in scores(att, ids, special, tokenizer.convert_ids_to_tokens(ids)).items():
                kept[name].append(value)
            texts += 1
    seconds = time.perf_counter() - start
    means = {d: np.mean(v, axis=0).tolist() for d, v in kept.items() if v}
    sds = {d: np.std(v, axis=0, ddof=1).tolist() for d, v in kept.items() if len(v) > 1}
    print(json.dumps({"texts": texts, "seconds": seconds, "mean": means, "sd": sds}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
