"""The Mamba2 mixer (Dao and Gu 2024, "Transformers are SSMs"): the token mixer of the
hybrids' non-attention layers (Bamba; also Granite-4.0-H, Nemotron-H, Falcon-H1, Zamba2).
It has no attention weights; it is computed exactly, as transformers' torch path
(``torch_forward``, what runs without the CUDA kernels) computes it, so that the hidden
states reaching the next softmax layer are transformers'.

With I = ``expand``·E = H·P channels in H heads of width P, G groups of the state's
input and output projections (each shared by H/G heads) and a state of N per channel:

    z, xBC, dt = x·W^in                         (I, I + 2·G·N, H wide)
    x, B, C    = act(causal depthwise conv(xBC))    (kernel ``d_conv``, with a bias;
                                                 act: SiLU); x: (H, P), B and C: (G, N)
    y          = SSM(x, dt, B, C)               (``selective_scan``, below)
    out        = W^out · (RMSNorm_g(y ⊙ SiLU(z)) · w)   the gate before the norm; the
                                                 norm over each of the G groups of I/G
                                                 channels apart (``GatedGroupRMSNorm``)

Padding tokens are zeroed before ``in_proj`` and after the convolution, so they write
nothing into the state (as transformers does).

torch only.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from .base import activation


def selective_scan(
    x: Tensor, dt: Tensor, a: Tensor, b: Tensor, c: Tensor, d: Tensor, limit: tuple[float, float]
) -> Tensor:
    """The selective state-space scan, token by token, in float32: the readable reference.

    Per head h, with state S (P × N) starting at zero, from ``dt`` with ``dt_bias``
    already added:

        Δ_t = clamp(softplus(dt_t), lo, hi)          the time step, per head
        S_t = exp(Δ_t·A)·S_{t-1} + Δ_t·x_t ⊗ B_t      A = -exp(A_log) < 0: a decay
        y_t = S_t·C_t + D·x_t                        D: a skip past the state

    B_t and C_t of group g serve heads g·H/G ... (g+1)·H/G - 1.

    Args:
        x: (B, T, H, P); dt: (B, T, H) with dt_bias added; a: (H,) the negative A;
        b, c: (B, T, G, N); d: (H,); limit: (lo, hi) of Δ.

    Returns:
        (B, T, H, P) float32.
    """
    batch, t, h, p = x.shape
    per_group = h // b.size(2)
    x, a = x.float(), a.float()
    b = b.float().repeat_interleave(per_group, dim=2)  # (B, T, H, N)
    c = c.float().repeat_interleave(per_group, dim=2)  # (B, T, H, N)
    step = nn.functional.softplus(dt.float()).clamp(limit[0], limit[1])  # Δ: (B, T, H)
    state = x.new_zeros(batch, h, p, b.size(-1))  # S: (B, H, P, N)
    out = x.new_empty(batch, t, h, p)
    for i in range(t):
        # 1. Decay the state by exp(Δ·A), write Δ·x ⊗ B.
        decay = (step[:, i] * a).exp()[..., None, None]  # (B, H, 1, 1)
        state = state * decay + (step[:, i, :, None] * x[:, i])[..., None] * b[:, i, :, None, :]
        # 2. Read it with C, add the skip.
        out[:, i] = (state @ c[:, i, :, :, None])[..., 0] + d[:, None] * x[:, i]  # (B, H, P)
    return out


def _segment_sum(a: Tensor) -> Tensor:
    """(..., C) -> (..., C, C): entry [i, j] = a_{j+1} + ... + a_i for j ≤ i, -inf above
    the diagonal; summed by a masked cumsum, as transformers does (not by a difference of
    cumsums, which rounds otherwise)."""
    size = a.size(-1)
    a = a[..., None].expand(*a.size(), size)  # (..., C, C): column j holds a
    below = torch.ones(size, size, device=a.device, dtype=torch.bool).tril(-1)
    total = a.masked_fill(~below, 0).cumsum(dim=-2)
    return total.masked_fill(~torch.ones(size, size, device=a.device, dtype=torch.bool).tril(), -torch.inf)


def chunked_scan(
    x: Tensor, dt: Tensor, a: Tensor, b: Tensor, c: Tensor, d: Tensor, limit: tuple[float, float], chunk: int
) -> Tensor:
    """``selective_scan`` by chunks of ``chunk`` tokens (the state-space duality), in
    transformers' order of float operations (``mamba2_chunk_scan``'s torch fallback), so
    the hidden states round alike. With L_ij = exp(Σ_{j<l≤i} Δ_l·A) the decay from token j
    to token i of one chunk:

        y_diag  = ((C·Bᵀ) ⊙ L)·(Δ ⊙ x)                   within the chunk: a masked
                                                          "attention" of the chunk's tokens
        S_chunk = Σ_j exp(Σ_{l>j} Δ_l·A)·B_j ⊗ Δ_j·x_j   each chunk's own write to the state
        S_start = the chunks' writes carried forward with the decays between them
        y       = y_diag + exp(cum Δ·A)·C·S_start + D·x  (the state from before the chunk)

    Args and returns as ``selective_scan``.
    """
    batch, t, h, p = x.shape
    per_group = h // b.size(2)
    step = nn.functional.softplus(dt).clamp(limit[0], limit[1])  # Δ: (B, T, H)
    x = x.float()
    b = b.float().repeat_interleave(per_group, dim=2)  # (B, T, H, N)
    c = c.float().repeat_interleave(per_group, dim=2)  # (B, T, H, N)
    pad = (chunk - t % chunk) % chunk
    skip = d[..., None] * nn.functional.pad(x, (0, 0, 0, 0, 0, pad))  # D·x: (B, T', H, P)
    # 1. Discretise: Δ·x and Δ·A, then cut T into chunks (padding writes nothing: Δ·x = 0).
    x = x * step[..., None].float()
    a = a.to(x.dtype) * step.float()  # (B, T, H)
    x, b, c = (nn.functional.pad(v, (0, 0, 0, 0, 0, pad)).reshape(batch, -1, chunk, h, v.size(-1)) for v in (x, b, c))
    a = nn.functional.pad(a, (0, 0, 0, pad)).reshape(batch, -1, chunk, h).permute(0, 3, 1, 2)  # (B, H, K, C)
    cum = a.cumsum(dim=-1)  # (B, H, K, C): log decay from the chunk's start
    # 2. Within each chunk: C·Bᵀ masked by the decays, applied to Δ·x.
    decays = _segment_sum(a).exp()  # L: (B, H, K, C, C)
    scores = torch.einsum("bclhn,bcshn->bclsh", c, b)  # (B, K, C, C, H)
    y_diag = torch.einsum("bclsh,bcshp->bclhp", scores * decays.permute(0, 2, 3, 4, 1), x)  # (B, K, C, H, P)
    # 3. Each chunk's write to the state, decayed to the chunk's end.
    to_end = (cum[:, :, :, -1:] - cum).exp()  # (B, H, K, C)
    writes = torch.einsum("bclhn,bclhp->bchpn", b * to_end.permute(0, 2, 3, 1)[..., None], x)  # (B, K, H, P, N)
    # 4. Between chunks: the state at each chunk's start, the writes carried forward.
    writes = torch.cat([torch.zeros_like(writes[:, :1]), writes], dim=1)  # (B, K+1, H, P, N)
    between = _segment_sum(nn.functional.pad(cum[:, :, :, -1], (1, 0))).exp().transpose(1, 3)  # (B, K+1, K+1, H)
    starts = torch.einsum("bzch,bzhpn->bchpn", between, writes)[:, :-1]  # (B, K, H, P, N)
    # 5. What each token reads of the state its chunk started from.
    from_start = torch.einsum("bclhn,bchpn->bclhp", c, starts) * cum.exp().permute(0, 2, 3, 1)[..., None]
    y = (y_diag + from_start).contiguous().reshape(batch, -1, h, p) + skip  # (B, T', H, P)
    return y[:, :t]


class GatedGroupRMSNorm(nn.Module):
    """RMSNorm(y ⊙ SiLU(z)) · w, the mean of squares over each of ``groups`` equal groups
    of channels apart (Mamba2's ``RMSNormGated`` with the gate before the norm)."""

    def __init__(self, dim: int, groups: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.groups, self.eps = groups, eps

    def forward(self, y: Tensor, z: Tensor) -> Tensor:
        h = y.float() * nn.functional.silu(z.float())  # (..., I)
        grouped = h.view(*h.shape[:-1], self.groups, -1)  # (..., G, I/G)
        grouped = grouped * torch.rsqrt(grouped.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * grouped.view(h.shape).to(y.dtype)


class Mamba2Mixer(nn.Module):
    """One Mamba2 layer's token mixer (module docstring). Parameters under transformers'
    names: in_proj, conv1d, dt_bias, A_log, D, norm, out_proj."""

    def __init__(
        self,
        hidden: int,
        heads: int,
        head_dim: int,
        groups: int,
        state: int,
        kernel: int,
        chunk: int,
        *,
        act: str = "silu",
        eps: float = 1e-6,
        conv_bias: bool = True,
        proj_bias: bool = False,
        limit: tuple[float, float] = (0.0, math.inf),
    ) -> None:
        super().__init__()
        if heads % groups:
            raise ValueError(f"mamba_n_groups={groups} does not divide mamba_n_heads={heads}")
        self.heads, self.head_dim, self.groups, self.state = heads, head_dim, groups, state
        self.inner = heads * head_dim  # I
        self.chunk, self.limit = chunk, limit
        channels = self.inner + 2 * groups * state  # x, B, C
        self.in_proj = nn.Linear(hidden, self.inner + channels + heads, bias=proj_bias)
        self.conv1d = nn.Conv1d(channels, channels, kernel, groups=channels, bias=conv_bias)
        self.dt_bias = nn.Parameter(torch.ones(heads))
        self.A_log = nn.Parameter(torch.zeros(heads))
        self.D = nn.Parameter(torch.ones(heads))
        self.norm = GatedGroupRMSNorm(self.inner, groups, eps)
        self.out_proj = nn.Linear(self.inner, hidden, bias=proj_bias)
        self.act = activation(act)

    def forward(self, x: Tensor, padding: Tensor | None = None) -> Tensor:
        """x (B, T, E), padding (B, T) boolean (True = real token) -> (B, T, E)."""
        keep = None if padding is None else padding[:, :, None].to(x.dtype)  # (B, T, 1)
        if keep is not None:
            x = x * keep  # padding tokens write nothing into the state
        batch, t, _ = x.shape
        # 1. One projection: the gate z, the convolved channels xBC, the time steps dt.
        z, xbc, dt = self.in_proj(x).split([self.inner, self.conv1d.in_channels, self.heads], dim=-1)
        # 2. The causal depthwise convolution (position t sees t-kernel+1..t), then act.
        kernel = self.conv1d.kernel_size[0]
        xbc = nn.functional.conv1d(
            xbc.transpose(1, 2), self.conv1d.weight, self.conv1d.bias, padding=kernel - 1, groups=xbc.size(-1)
        )[:, :, :t]  # (B, C, T)
        xbc = self.act(xbc).transpose(1, 2)  # (B, T, C)
        if keep is not None:
            xbc = xbc * keep
        size = self.groups * self.state
        xs, b, c = xbc.split([self.inner, size, size], dim=-1)
        # 3. The scan, by chunks, in float32 (dt_bias added first, softplus inside).
        y = chunked_scan(
            xs.reshape(batch, t, self.heads, self.head_dim),
            dt + self.dt_bias.to(dt.dtype),
            -self.A_log.float().exp(),
            b.reshape(batch, t, self.groups, self.state),
            c.reshape(batch, t, self.groups, self.state),
            self.D,
            self.limit,
            self.chunk,
        )  # (B, T, H, P)
        # 4. Gated, normed per group, out of the heads.
        y = self.norm(y.reshape(batch, t, self.inner), z)  # (B, T, I)
        return self.out_proj(y.to(x.dtype))  # (B, T, E)
