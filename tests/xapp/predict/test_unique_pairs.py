"""unique_pairs: the distinct (cell, cell) pairs of a batch, as np.unique over rows gives them."""

import numpy as np
import pytest

from xapp.predict.combined import unique_pairs


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("n", [1, 2, 7, 250])
def test_unique_pairs_match_numpy_unique_over_rows(seed, n):
    # cell identities of 36 bits and -1 (unknown), many repeats: the same rows, in the same
    # order, and the same index of each row into them
    rng = np.random.default_rng(seed)
    cells = np.concatenate([[-1, 0, (1 << 36) - 1], rng.integers(0, 1 << 36, 4)])
    pairs = np.stack([rng.choice(cells, n), rng.choice(cells, n)], 1).astype(np.int64)
    want_u, want_inv = np.unique(pairs, axis=0, return_inverse=True)
    got_u, got_inv = unique_pairs(pairs)
    assert got_u.tolist() == want_u.tolist() and got_u.dtype == want_u.dtype
    assert got_inv.tolist() == want_inv.reshape(-1).tolist()
    assert (got_u[got_inv] == pairs).all()


def test_unique_pairs_of_none():
    u, inv = unique_pairs(np.zeros((0, 2), np.int64))
    assert u.shape == (0, 2) and inv.shape == (0,)
