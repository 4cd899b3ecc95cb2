"""lynxtop."""
