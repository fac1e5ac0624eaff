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


def assert_steps_like_per_tensor_adam(step, params, lr, weight_decay, steps=3, atol=1e-12):
    """``step()`` (an optimiser's step over ``params``, float64) moves every parameter exactly as
    ``torch.optim.Adam``'s default per-tensor loop does on copies fed the same random gradients."""
    import torch

    copies = [torch.nn.Parameter(p.detach().clone()) for p in params]
    initial = [p.detach().clone() for p in params]
    reference = torch.optim.Adam(copies, lr=lr, weight_decay=weight_decay, foreach=False)
    g = torch.Generator().manual_seed(0)
    for _ in range(steps):
        for p, q in zip(params, copies):
            p.grad = torch.randn(p.shape, dtype=torch.float64, generator=g)
            q.grad = p.grad.clone()
        step()
        reference.step()
    assert all(torch.allclose(p, q, rtol=0, atol=atol) for p, q in zip(params, copies))
    assert all(not torch.equal(p, p0) for p, p0 in zip(params, initial))  # every parameter moved
