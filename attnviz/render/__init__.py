"""Renderers: data (an ``Attention``) in, terminal renderables or image files out."""

# Here, not in render.image, so the CLI can check an output path and show its defaults
# without importing matplotlib.
IMAGE_FORMATS = (".png", ".svg", ".pdf")
DEFAULT_DPI = 150
