"""Communication ledger: byte counts computed by hand, summaries, units."""
from __future__ import annotations


import numpy as np
import pandas as pd
import pytest
import torch

from fedlib.engine.communication import CommunicationLedger, analytic_model_bytes, format_bytes, tensor_nbytes


def test_broadcast_download_and_stacked_upload():
    ledger = CommunicationLedger()
    item_table = torch.zeros(1682, 32)  # float32
    # Each of 3 clients downloads the whole table: 1682 * 32 * 4 B = 215,296 B.
    assert ledger.download(0, [0, 1, 2], "item_table", item_table) == 3 * 215_296
    # Stacked upload (3, 10, 4) float32: 10 * 4 * 4 B = 160 B per client, 480 B in total.
    assert ledger.upload(0, np.array([0, 1, 2]), "item_rows", torch.ones(3, 10, 4), per_client=False) == 480
    assert ledger.total() == 645_888 + 480
    assert ledger.total("download") == 645_888
    assert ledger.total("upload", name="item_rows") == 480
    assert ledger.total(name="nothing") == 0
    with pytest.raises(ValueError):
        ledger.total("sideways")


def test_sparse_rows_inferred_mask_and_counts():
    ledger = CommunicationLedger()
    deltas = torch.zeros(2, 5, 4)
    deltas[0, 0, 1] = 1.0
    deltas[0, 3, :] = 2.0
    deltas[1, 1, 3] = -1.0
    # Client 0 touched rows 0 and 3, client 1 row 1. A row = 4 float32 = 16 B + one int64 index 8 B
    # -> client 0: 2 * 24 = 48 B, client 1: 24 B.
    assert ledger.upload(1, [5, 9], "deltas", deltas, per_client=False, sparse_rows=True) == 72
    frame = ledger.to_frame(by_client=True)
    assert frame["bytes"].tolist() == [48, 24]
    assert frame["client"].tolist() == [5, 9]
    # Explicit (C, R) mask of sent rows: 3 rows and 0 rows.
    mask = torch.tensor([[True, True, True, False, False], [False] * 5])
    assert ledger.upload(2, [5, 9], "deltas", deltas, per_client=False, sparse_rows=mask) == 72
    # Integer row counts with int32 indices: (16 + 4) B per row, 2 and 1 rows.
    assert ledger.upload(3, [5, 9], "deltas", deltas, per_client=False, sparse_rows=np.array([2, 1]),
                         index_dtype=torch.int32) == 60
    # One client's 1-d prediction vector: 3 non-zero scores -> 3 * (4 B value + 8 B index) = 36 B.
    predictions = torch.tensor([0.0, 0.7, 0.0, 0.2, 0.9])
    assert ledger.download(3, 4, "predictions", predictions, sparse_rows=True) == 36
    with pytest.raises(ValueError):
        ledger.upload(4, [5, 9], "deltas", deltas, per_client=False, sparse_rows=torch.ones(2, 4, dtype=torch.bool))


def test_dtype_as_sent_lists_and_raw_byte_counts():
    ledger = CommunicationLedger()
    table = torch.zeros(10, 4)  # float32 in memory
    assert ledger.upload(0, [1], "half", table, sent_dtype=torch.float16) == 10 * 4 * 2
    # One tensor per client: (2, 3) float64 = 48 B and (5,) int64 = 40 B.
    assert ledger.upload(0, [1, 2], "mixed", [torch.zeros(2, 3, dtype=torch.float64), torch.zeros(5, dtype=torch.int64)],
                         per_client=False) == 88
    assert ledger.upload(0, [1, 2, 3], "raw", 100) == 300  # 100 B per client
    assert ledger.upload(0, [1, 2, 3], "raw_each", np.array([10, 20, 30]), per_client=False) == 60
    assert ledger.to_frame()["total_bytes"].tolist() == [80, 88, 300, 60]
    with pytest.raises(ValueError):
        ledger.upload(0, [1, 2], "raw", 100, per_client=False)  # ambiguous total
    with pytest.raises(ValueError):
        ledger.upload(0, [1, 2], "raw_each", [10, 20])  # a list needs per_client=False
    with pytest.raises(ValueError):
        ledger.upload(0, [1, 2], "stacked", torch.zeros(3, 4), per_client=False)  # 3 rows for 2 clients
    with pytest.raises(ValueError):
        ledger.upload(0, [1, 2], "raw_each", np.array([10, -1]), per_client=False)


def test_per_round_and_per_client_per_round():
    ledger = CommunicationLedger()
    # Round 0: clients 0, 1 download 100 B each; both upload 40 B, client 1 also uploads an extra 20 B.
    ledger.download(0, [0, 1], "model", 100)
    ledger.upload(0, [0, 1], "update", 40)
    ledger.upload(0, [1], "extra", 20)
    # Round 1: only client 2 is active: downloads 100 B, uploads 10 B.
    ledger.download(1, [2], "model", 100)
    ledger.upload(1, [2], "update", 10)

    table = ledger.per_round()
    assert list(table.columns) == ["round", "direction", "total_bytes", "clients", "mean_bytes_per_client"]
    rows = {(r.round, r.direction): r for r in table.itertuples()}
    # Round 0 upload: 40 + 40 + 20 = 100 B from 2 distinct clients -> 50 B per client.
    assert rows[(0, "upload")].total_bytes == 100 and rows[(0, "upload")].clients == 2
    assert rows[(0, "upload")].mean_bytes_per_client == pytest.approx(50.0)
    assert rows[(0, "download")].total_bytes == 200 and rows[(0, "download")].mean_bytes_per_client == 100
    assert rows[(1, "upload")].total_bytes == 10 and rows[(1, "upload")].clients == 1

    by_name = ledger.per_round(by_name=True)
    assert len(by_name) == 5 and "name" in by_name.columns

    means = ledger.per_client_per_round()
    # (round, client) pairs: (0,0), (0,1), (1,2) in both directions.
    # upload: (100 + 10) / 3 = 36.667 B; download: 300 / 3 = 100 B; both: 410 / 3 = 136.667 B.
    assert means["upload"] == pytest.approx(110 / 3)
    assert means["download"] == pytest.approx(100.0)
    assert means["both"] == pytest.approx(410 / 3)
    assert "per client per round" in ledger.summary()


def test_empty_ledger():
    ledger = CommunicationLedger()
    assert ledger.total() == 0
    assert ledger.per_round().empty
    assert ledger.per_client_per_round().isna().all()
    assert ledger.summary() == "no communication recorded"
    assert isinstance(ledger.to_frame(by_client=True), pd.DataFrame)


def test_thousand_clients_recorded_without_per_client_work():
    ledger = CommunicationLedger()
    num_clients, rows, dim = 1000, 200, 8
    generator = torch.Generator().manual_seed(0)
    touched = torch.rand(num_clients, rows, generator=generator) < 0.05
    deltas = torch.randn(num_clients, rows, dim, generator=generator) * touched.unsqueeze(-1)
    for round_index in range(20):
        ledger.download(round_index, np.arange(num_clients), "item_table", torch.zeros(rows, dim))
        ledger.upload(round_index, torch.arange(num_clients), "deltas", deltas, per_client=False, sparse_rows=True)
    expected_upload = int(touched.sum()) * (dim * 4 + 8) * 20
    assert ledger.total("upload") == expected_upload
    assert ledger.total("download") == 20 * num_clients * rows * dim * 4
    assert ledger.per_round()["clients"].eq(num_clients).all()


def test_analytic_sizes_and_formatting():
    # FedKDRec Table 3, FedMF on ML-100K: 1,682 items x 32 dims x 4 B.
    assert analytic_model_bytes(1682 * 32) == 215_296
    assert format_bytes(215_296, "paper", unit="MB") == "0.205 MB"  # the paper's "MB" is 2^20 bytes
    assert format_bytes(215_296, "binary") == "210.250 KiB"
    assert format_bytes(215_296, "decimal") == "215.296 kB"
    assert format_bytes(215_296, "decimal", unit="MB") == "0.215 MB"
    # FedCSR: 100,000 items x 32 dims x 8 B (64-bit) = 25.6e6 B, reported as "24.41MB".
    fedcsr = analytic_model_bytes(100_000 * 32, dtype=torch.float64)
    assert fedcsr == 25_600_000
    assert format_bytes(fedcsr, "paper", precision=2) == "24.41 MB"  # largest unit >= 1 is MB
    assert format_bytes(215_296, "paper") == "210.250 KB"
    assert format_bytes(512) == "512 B"
    assert format_bytes(1023.5) == "1023.500 B"
    assert format_bytes(1024) == "1.000 KiB"
    assert format_bytes(float("nan")) == "nan"
    assert analytic_model_bytes(torch.nn.Linear(3, 2)) == (3 * 2 + 2) * 4
    assert analytic_model_bytes([torch.zeros(5), torch.zeros(2, 2)], dtype=torch.float16) == 18
    assert tensor_nbytes(torch.zeros(3, dtype=torch.int64)) == 24
    with pytest.raises(ValueError):
        format_bytes(10, "metric")
    with pytest.raises(ValueError):
        format_bytes(10, "binary", unit="MB")
