"""Small training sets shared by the engine tests."""
import numpy as np

from fedlib.data.splits import Pairs

NUM_USERS, NUM_ITEMS, DIM, BATCH = 14, 60, 8, 16


def toy_train(seed=0):
    """1..18 positives per user: one-batch clients and clients with up to 6+ local batches of 16
    (with 4 negatives per positive)."""
    rng = np.random.default_rng(seed)
    users, items = [], []
    for u, n in enumerate([1, 2, 3, 18, 5, 9, 14, 2, 7, 16, 1, 11, 4, 6]):
        users += [u] * n
        items += rng.choice(NUM_ITEMS, size=n, replace=False).tolist()
    return Pairs.from_arrays(users, items, NUM_USERS)
