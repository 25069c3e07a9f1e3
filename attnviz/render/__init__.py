"""Renderers: data (an ``Attention``) in, terminal renderables or image files out."""

# Here, not in render.image, so the CLI can check an output path without importing matplotlib,
# and head_label below, so the image renderer need not import rich (render.terminal).
IMAGE_FORMATS = (".png", ".svg", ".pdf")


def head_label(head: int, num_heads: int, num_kv_heads: int) -> str:
    """'h5', or 'h5 kv2' when heads share key/value heads (grouped-query attention)."""
    if num_kv_heads and num_kv_heads < num_heads:
        return f"h{head} kv{head // (num_heads // num_kv_heads)}"
    return f"h{head}"
