"""Renderers: data (an ``Attention``) in, terminal renderables or image files out."""

# Here, not in render.image, so the CLI can check an output path without importing matplotlib.
IMAGE_FORMATS = (".png", ".svg", ".pdf")
