"""The corpus scan of ``attnviz heads``: what the command reads, what it measures, how.

    sources.py      the corpora, read streaming: text, JSONL, stdin, the induction probe,
                    coreference pairs
    detectors.py    per-head detectors as streaming, mergeable accumulators (numpy only)
    scan.py         the scan loop: tokenize, batch by length, one forward pass a batch,
                    fold the scores; the JSON and CSV of a report
    distributed.py  the same scan over a Ray cluster (``--ray``); ray is imported here alone

Nothing is imported here: import the module you need (the CLI checks a corpus with
``sources`` before it loads anything else).
"""
