"""Files: checkpoint validation before allocation, model resolution, safe whole-file
writes and bounded JSON readers."""
