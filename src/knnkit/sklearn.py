"""scikit-learn estimators backed by knnkit: :class:`NearestNeighbors` and
:class:`KNeighborsTransformer` (drop-ins for their ``sklearn.neighbors`` namesakes).

Importing this module imports scikit-learn (``pip install "knnkit[sklearn]"``); ``import knnkit``
does not. Example, a GPU k-NN graph in a scikit-learn pipeline::

    from sklearn.manifold import Isomap
    from sklearn.pipeline import make_pipeline
    from knnkit.sklearn import KNeighborsTransformer

    model = make_pipeline(KNeighborsTransformer(n_neighbors=10), Isomap(n_neighbors=10, metric="precomputed"))
"""

from .api._sklearn import KNeighborsTransformer, NearestNeighbors

__all__ = ["KNeighborsTransformer", "NearestNeighbors"]
