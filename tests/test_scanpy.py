"""scanpy's neighbour graph through knnkit's KNeighborsTransformer (issue "Fit where users already
work"): ``sc.pp.neighbors(adata, transformer=...)`` runs, and its connectivities and distances agree
with scanpy's own exact neighbours. Skipped where scanpy is not installed (it is not a test
dependency: its install pulls ~20 packages; run it with ``pip install scanpy``)."""

import numpy as np
import pytest

sc = pytest.importorskip("scanpy")
anndata = pytest.importorskip("anndata")


def _edges(m):
    m = m.tocoo()
    return set(zip(m.row.tolist(), m.col.tolist()))


def test_scanpy_neighbors_with_knnkit_transformer(rng):
    from knnkit.sklearn import KNeighborsTransformer

    centres = rng.standard_normal((8, 20)).astype(np.float32) * 4
    X = (centres[rng.integers(0, 8, 1200)] + rng.standard_normal((1200, 20))).astype(np.float32)
    ours = anndata.AnnData(X.copy())
    ref = anndata.AnnData(X.copy())
    sc.pp.neighbors(ours, n_neighbors=15, use_rep="X",
                    transformer=KNeighborsTransformer(n_neighbors=15, metric="euclidean", method="exact"))
    sc.pp.neighbors(ref, n_neighbors=15, use_rep="X", transformer="sklearn")
    d_ours, d_ref = ours.obsp["distances"], ref.obsp["distances"]
    assert d_ours.shape == d_ref.shape == (1200, 1200)
    # the same exact neighbour sets (ties aside) and the same Euclidean distances on them
    e_ours, e_ref = _edges(d_ours), _edges(d_ref)
    assert len(e_ours & e_ref) >= 0.99 * len(e_ref)
    common = np.array(sorted(e_ours & e_ref))
    np.testing.assert_allclose(np.asarray(d_ours[common[:, 0], common[:, 1]]).ravel(),
                               np.asarray(d_ref[common[:, 0], common[:, 1]]).ravel(), rtol=1e-4, atol=1e-4)
    c_ours, c_ref = ours.obsp["connectivities"], ref.obsp["connectivities"]
    assert abs(c_ours.sum() - c_ref.sum()) <= 1e-3 * c_ref.sum()
    # and the usual next step runs on it (leiden would need igraph)
    sc.tl.umap(ours, random_state=0)
    assert ours.obsm["X_umap"].shape == (1200, 2) and np.isfinite(ours.obsm["X_umap"]).all()
