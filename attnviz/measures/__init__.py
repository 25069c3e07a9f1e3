"""Measures and analyses on the forward passes: what a head's weight or norm is, the
metrics and findings over them, and the analyses that run passes of their own through
the engines' taps (check, explain, ablation, patching, attribution)."""
