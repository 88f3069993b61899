"""File formats (placeholder)."""
