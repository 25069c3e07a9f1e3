"""The mechanisms: the seed's multi-head attention (attention.py), the named taps every
analysis reads and writes through, exact asked rows beside fused attention, kernels and
the kept rows. torch + stdlib only."""
