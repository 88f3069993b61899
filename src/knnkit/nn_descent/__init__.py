"""k-NN graphs (placeholder being written)."""
__all__ = ["KnnGraph", "knn_graph", "merge_graphs", "knn_graph_out_of_core"]
class KnnGraph: pass
def knn_graph(*a, **k): raise NotImplementedError
def merge_graphs(*a, **k): raise NotImplementedError
def knn_graph_out_of_core(*a, **k): raise NotImplementedError
