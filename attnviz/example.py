"""The example sentence of the docs, the CLI's help, the tests and the benches, defined
once: Vig's coreference example, where a head that resolves "it" looks at "animal".
Stdlib only (the CLI's ``--help`` shows it)."""

EXAMPLE = "The animal didn't cross the street because it was too tired"

# Its minimal pair (samples/minimal_pairs.tsv's first row): "it" now refers to the street.
# ``attnviz patch`` reads the two as the clean and the corrupted prompt.
EXAMPLE_PAIR = EXAMPLE.removesuffix("tired") + "wide"
