"""Graph search index (placeholder being written)."""
__all__ = ["GraphIndex"]
class GraphIndex: pass
