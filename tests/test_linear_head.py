"""Closed-form gradients of the linear-head backbones against the model's own logits and autograd (float64)."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from fedlib.engine import LocalBatch, bce_client_loss, fedmf_method, personal_table_method, pfedrec_method
from fedlib.engine.linear_head import linear_head_gradients, linear_head_tables
from fedlib.models import FedMF, PersonalItemTableModel, PFedRec
from fedlib.papers.fedrkg.guidance import GuidedPFedRec
from fedlib.papers.fedrkg.method import guided_method

torch.set_num_threads(1)

NUM_USERS, NUM_ITEMS, DIM = 6, 9, 4


def _models():
    return {
        "pfedrec": PFedRec(NUM_USERS, NUM_ITEMS, DIM),
        "personal": PersonalItemTableModel(NUM_USERS, NUM_ITEMS, DIM),
        "personal_shared": PersonalItemTableModel(NUM_USERS, NUM_ITEMS, DIM, shared_table=True),
        "guided_pfedrec": GuidedPFedRec(NUM_USERS, NUM_ITEMS, DIM),  # FedRKG's PFedRec backbone
    }


def _random_step(model, seed):
    """Row slots, heads and an unpadded step of 4 clients with 1-5 examples each (a row drawn twice included)."""
    gen = torch.Generator().manual_seed(seed)
    num_clients, num_slots = 4, 7
    params = {name: torch.randn(num_slots, DIM, generator=gen, dtype=torch.float64) for name in model.linear_head_tables}
    params["head_w"] = torch.randn(num_clients, DIM, generator=gen, dtype=torch.float64)
    params["head_b"] = torch.randn(num_clients, generator=gen, dtype=torch.float64)
    sizes = [1, 5, 3, 2]
    client = torch.repeat_interleave(torch.arange(num_clients), torch.tensor(sizes))  # (E,) sorted by client
    row = torch.randint(0, num_slots, (client.numel(),), generator=gen)
    row[2] = row[1]  # client 1 reads one row twice
    labels = (torch.rand(client.numel(), generator=gen) < 0.4).to(torch.float64)
    return params, client, row, labels, sizes


def _padded(client, row, labels, sizes):
    width = max(sizes)
    rows = torch.zeros(len(sizes), width, dtype=torch.int64)
    padded_labels = torch.zeros(len(sizes), width, dtype=torch.float64)
    mask = torch.zeros(len(sizes), width, dtype=torch.float64)
    column = torch.cat([torch.arange(n) for n in sizes])
    rows[client, column], padded_labels[client, column], mask[client, column] = row, labels, 1.0
    return LocalBatch(clients=torch.arange(len(sizes)), rows=rows, items=rows, labels=padded_labels, mask=mask)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("name", ["pfedrec", "personal", "personal_shared", "guided_pfedrec"])
def test_closed_form_equals_autograd_on_the_models_logits(name, seed):
    model = _models()[name]
    params, client, row, labels, sizes = _random_step(model, seed)
    live = {key: value.clone().requires_grad_(True) for key, value in params.items()}
    reference = bce_client_loss(model, live, _padded(client, row, labels, sizes))  # (C,)
    expected = torch.autograd.grad(reference.sum(), list(live.values()))

    tables = model.linear_head_tables
    rows_sum = sum(params[table] for table in tables)
    loss, grads = linear_head_gradients(rows_sum, params["head_w"], params["head_b"], row, client, labels)
    torch.testing.assert_close(loss, reference.detach(), atol=1e-12, rtol=0)
    for key, want in zip(live, expected):
        got = grads["rows"] if key in tables else grads[key]
        torch.testing.assert_close(got, want, atol=1e-12, rtol=0, msg=key)
    assert float(grads["rows"].abs().max()) > 1e-3  # a real problem, not all zeros
    assert linear_head_gradients(rows_sum, params["head_w"], params["head_b"], row, client, labels,
                                 need_loss=False)[0] is None


def test_closed_form_applies_only_to_linear_heads_under_the_default_loss():
    models = _models()
    assert linear_head_tables(pfedrec_method(models["pfedrec"])) == ("item_emb",)
    assert linear_head_tables(personal_table_method(models["personal"])) == ("personal_item_emb",)
    assert linear_head_tables(personal_table_method(models["personal_shared"])) == ("personal_item_emb", "item_emb")
    assert linear_head_tables(fedmf_method(FedMF(NUM_USERS, NUM_ITEMS, DIM))) is None  # no linear head
    guided = GuidedPFedRec(NUM_USERS, NUM_ITEMS, DIM)
    assert linear_head_tables(guided_method(guided)) == ("personal_item_emb",)
    assert linear_head_tables(guided_method(GuidedPFedRec(NUM_USERS, NUM_ITEMS, DIM, hidden=(3,)))) is None  # an MLP

    def other_loss(model, params, batch):
        return bce_client_loss(model, params, batch) * 2.0

    method = dataclasses.replace(pfedrec_method(models["pfedrec"]), client_loss=other_loss)
    assert linear_head_tables(method) is None
