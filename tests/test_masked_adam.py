"""The compiled masked Adam step (:mod:`fedlib.engine.adam_kernel`) against its torch formulation.

``masked_adam_step`` runs one compiled pass on CPU float tensors and falls back to
``masked_adam_step_reference`` (the torch operations, checked against ``torch.optim.Adam`` in
``tests/test_engine_adam.py``) elsewhere. Here both run the same sequence of steps from the same
state, over every case the callers use: rows of their own (``owner=None``) or ragged rows with an
owner, every client stepping or a mask, weight decay or not, step counts differing per client,
1-d/2-d/3-d tensors and views into a bigger tensor (the kernel must write into the caller's
storage). Both dtypes agree bit for bit (float32 training is chaotic enough that an ulp per step
moves the frozen FedKDRec metrics; the loops fuse the multiply-adds torch fuses and use torch's
square root). The reference is replaced by a function that raises while the fast path is
checked, so a silent fallback cannot make the comparison trivial.
"""
from __future__ import annotations

import pytest
import torch

import fedlib.engine.method as method_module
from fedlib.engine.method import masked_adam_step, masked_adam_step_reference

NUM_CLIENTS = 5
OWNER = torch.tensor([0, 0, 1, 2, 2, 2, 3, 4, 4])  # ragged rows: clients own 2, 1, 3, 1 and 2 rows
STEPS = 6


def _no_fallback(*args, **kwargs):
    raise AssertionError("masked_adam_step fell back to the torch formulation where the compiled pass applies")


def _states(shape, dtype, gen, view: bool):
    """Parameters and both moments (mid-training: non-zero), as fresh tensors or as views
    ``big[1:1+N, :w]`` of bigger tensors (rows not contiguous with each other)."""
    n = shape[0]
    if not view:
        return [torch.randn(shape, generator=gen, dtype=dtype).abs_() if k == 2 else
                torch.randn(shape, generator=gen, dtype=dtype) for k in range(3)]
    bigger = (n + 3, shape[1] + 2, *shape[2:]) if len(shape) > 1 else (n + 3,)
    bigs = [torch.randn(bigger, generator=gen, dtype=dtype) for _ in range(3)]
    bigs[2].abs_()
    cut = (slice(1, 1 + n),) + ((slice(0, shape[1]),) if len(shape) > 1 else ())
    views = [b[cut] for b in bigs]
    if len(shape) > 1:
        assert not views[0].is_contiguous()
    return views


def _run_both(shape, dtype, owner, masked, weight_decay, view, seed=0):
    """``STEPS`` steps of the fast path and of the reference from one state; returns the
    two runs' final states ``[param, exp_avg, exp_avg_sq]`` (fast, reference)."""
    gen = torch.Generator().manual_seed(seed)
    fast = _states(shape, dtype, gen, view)
    ref = [t.clone() for t in fast]
    storage_before = [t.data_ptr() for t in fast]
    start = torch.tensor([0, 3, 7, 1, 12])  # step counts differ per client
    fast_step, ref_step = start.clone(), start.clone()
    for k in range(STEPS):
        grad = torch.randn(shape, generator=gen, dtype=dtype)
        mask = (torch.rand(NUM_CLIENTS, generator=gen) < 0.6) if masked else torch.ones(NUM_CLIENTS, dtype=torch.bool)
        mask[k % NUM_CLIENTS] = not masked or bool(mask[k % NUM_CLIENTS])
        options = dict(lr=0.05, betas=(0.8, 0.99), eps=1e-6, weight_decay=weight_decay, owner=owner)
        unmoved = [t.clone() for t in fast]
        masked_adam_step(fast[0], grad, fast[1], fast[2], fast_step, mask, **options)
        masked_adam_step_reference(ref[0], grad.clone(), ref[1], ref[2], ref_step, mask, **options)
        stays = ~(mask if owner is None else mask[owner])
        for before, after in zip(unmoved, fast):  # masked clients' rows: bit for bit unchanged
            assert torch.equal(before[stays], after[stays])
        assert torch.equal(fast_step, ref_step)
    assert [t.data_ptr() for t in fast] == storage_before
    return fast, ref


def _ulps(fast, ref):
    """Largest difference in units of ``eps(dtype) · max|ref|`` (the tensor's scale)."""
    scale = torch.finfo(ref.dtype).eps * float(ref.abs().max())
    return float((fast - ref).abs().max()) / scale


CASES = [(shape, owner) for shape in [(9,), (9, 4), (9, 3, 2)] for owner in (None, OWNER)]


@pytest.mark.parametrize("view", [False, True], ids=["fresh", "view"])
@pytest.mark.parametrize("weight_decay", [0.0, 0.01], ids=["no_decay", "decay"])
@pytest.mark.parametrize("masked", [False, True], ids=["all_step", "masked"])
@pytest.mark.parametrize("shape, owner", CASES, ids=[f"{len(s)}d-{'owner' if o is not None else 'own'}"
                                                     for s, o in CASES])
def test_compiled_step_equals_torch_formulation(shape, owner, masked, weight_decay, view, monkeypatch):
    monkeypatch.setattr(method_module, "masked_adam_step_reference", _no_fallback)
    if owner is None:
        shape = (NUM_CLIENTS,) + shape[1:]
    for dtype in (torch.float64, torch.float32):
        fast, ref = _run_both(shape, dtype, owner, masked, weight_decay, view)
        for name, a, b in zip(("param", "exp_avg", "exp_avg_sq"), fast, ref):
            assert torch.equal(a, b), (name, dtype, _ulps(a, b))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_every_row_moves_on_a_large_tensor(dtype, monkeypatch):
    """The comparison is not trivial (every row moves far), and holds on a tensor long enough
    for torch's vectorised kernels (and their tails: 1001 is odd)."""
    monkeypatch.setattr(method_module, "masked_adam_step_reference", _no_fallback)
    fast, ref = _run_both((NUM_CLIENTS, 7, 1001), dtype, None, True, 0.01, False)
    start = _states((NUM_CLIENTS, 7, 1001), dtype, torch.Generator().manual_seed(0), False)
    assert float((fast[0] - start[0]).abs().amax(dim=(1, 2)).min()) > 1e-3
    for a, b in zip(fast, ref):
        assert torch.equal(a, b)


def test_large_beta1_uses_lerps_other_form(monkeypatch):
    """β₁ ≤ 0.5 makes lerp's weight 1 − β₁ ≥ 0.5 (torch.lerp's other formula)."""
    monkeypatch.setattr(method_module, "masked_adam_step_reference", _no_fallback)
    gen = torch.Generator().manual_seed(3)
    for dtype in (torch.float64, torch.float32):
        states = [torch.randn(4, 301, generator=gen, dtype=dtype) for _ in range(3)]
        states[2].abs_()
        ref = [t.clone() for t in states]
        grad = torch.randn(4, 301, generator=gen, dtype=dtype)
        step, mask = torch.tensor([1, 0, 5, 2]), torch.tensor([True, True, False, True])
        options = dict(lr=0.01, betas=(0.3, 0.9), weight_decay=0.1)
        masked_adam_step(states[0], grad, states[1], states[2], step.clone(), mask, **options)
        masked_adam_step_reference(ref[0], grad, ref[1], ref[2], step.clone(), mask, **options)
        for a, b in zip(states, ref):
            assert torch.equal(a, b)


def test_unmergeable_view_falls_back_and_writes_in_place(monkeypatch):
    """A 3-d view whose trailing dims do not merge into one row stride takes the torch path,
    still in place."""
    calls = []

    def spy(*args, **kwargs):
        calls.append(1)
        return masked_adam_step_reference(*args, **kwargs)

    monkeypatch.setattr(method_module, "masked_adam_step_reference", spy)
    big = torch.randn(7, 4, 5, dtype=torch.float64)
    param = big[1:6, :, :3]  # strides (20, 5, 1): a row is not one strided run
    expected = param.clone()
    masked_adam_step_reference(expected, torch.ones_like(expected), torch.zeros_like(expected),
                               torch.zeros_like(expected), torch.zeros(5, dtype=torch.int64),
                               torch.ones(5, dtype=torch.bool), lr=0.1)
    masked_adam_step(param, torch.ones_like(param), torch.zeros_like(param), torch.zeros_like(param),
                     torch.zeros(5, dtype=torch.int64), torch.ones(5, dtype=torch.bool), lr=0.1)
    assert calls == [1]
    assert torch.equal(big[1:6, :, :3], expected)


def test_autograd_sees_the_in_place_write():
    """A tensor saved for backward and then stepped makes backward fail, as with torch's in-place ops."""
    leaf = torch.randn(3, 2, dtype=torch.float64, requires_grad=True)
    param = leaf.detach()  # shares storage and version counter with the leaf
    loss = (leaf * leaf).sum()
    masked_adam_step(param, torch.ones_like(param), torch.zeros_like(param), torch.zeros_like(param),
                     torch.zeros(3, dtype=torch.int64), torch.ones(3, dtype=torch.bool), lr=0.1)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


def test_owner_out_of_range_is_an_error():
    param = torch.zeros(3, 2)
    with pytest.raises(IndexError):
        masked_adam_step(param, torch.ones_like(param), torch.zeros_like(param), torch.zeros_like(param),
                         torch.zeros(2, dtype=torch.int64), torch.ones(2, dtype=torch.bool), lr=0.1,
                         owner=torch.tensor([0, 1, 2]))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_takes_the_torch_path():
    param = torch.randn(4, 3, device="cuda")
    cpu = param.cpu()
    args = lambda p: (p, torch.ones_like(p), torch.zeros_like(p), torch.zeros_like(p),  # noqa: E731
                      torch.zeros(4, dtype=torch.int64, device=p.device), torch.ones(4, dtype=torch.bool,
                                                                                       device=p.device))
    masked_adam_step(*args(param), lr=0.1)
    masked_adam_step_reference(*args(cpu), lr=0.1)
    torch.testing.assert_close(param.cpu(), cpu)


def test_transposed_gradient_is_read_through_a_copy(monkeypatch):
    """A gradient whose rows do not flatten (a batched matmul's weight gradient comes transposed)
    is read through a copy; parameters and moments are still written in place."""
    monkeypatch.setattr(method_module, "masked_adam_step_reference", _no_fallback)
    gen = torch.Generator().manual_seed(4)
    for dtype in (torch.float64, torch.float32):
        states = [torch.randn(NUM_CLIENTS, 6, 3, generator=gen, dtype=dtype) for _ in range(3)]
        states[2].abs_()
        ref = [t.clone() for t in states]
        grad = torch.randn(NUM_CLIENTS, 3, 6, generator=gen, dtype=dtype).transpose(1, 2)
        step, mask = torch.tensor([1, 0, 5, 2, 0]), torch.tensor([True, True, False, True, True])
        masked_adam_step(states[0], grad, states[1], states[2], step.clone(), mask, lr=0.01)
        masked_adam_step_reference(ref[0], grad, ref[1], ref[2], step.clone(), mask, lr=0.01)
        for a, b in zip(states, ref):
            assert torch.equal(a, b)
