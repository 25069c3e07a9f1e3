"""Renderers: data (an ``Attention``) in, terminal renderables, image files or an
interactive HTML page out."""

# Here, not in render.image / render.html, so the CLI can check an output path and show its
# defaults without importing matplotlib or numpy.
IMAGE_FORMATS = (".png", ".svg", ".pdf")
HTML_FORMATS = (".html",)
EXPORT_FORMATS = IMAGE_FORMATS + HTML_FORMATS
DEFAULT_DPI = 150
# The largest HTML page `attnviz export -o view.html` writes. The page holds every weight of
# every kept layer and head (layers × heads × tokens², 2 bytes each, base64: 8/3 bytes), so
# 16 MB is e.g. MiniLM's 6 layers × 12 heads at 288 tokens, or one of its layers at 707 tokens.
# Past it a browser spends seconds parsing and the page is no longer something to mail.
HTML_BUDGET_BYTES = 16_000_000
