"""Checkpoints: atomic saves, and a run killed with SIGKILL resumes to the identical result."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
import torch

from fedlib.engine import Checkpointer, FederatedConfig, checkpoint_progress
from fedlib.engine.loop import config_dict

CHILD = textwrap.dedent(
    """
    import sys, time
    import numpy as np, torch
    torch.set_num_threads(1)
    from fedlib.data.splits import Pairs
    from fedlib.engine import (Checkpointer, FederatedConfig, RankingEvaluator, fedncf_method, run_federated)
    from fedlib.models import FedNCF

    mode, directory, out = sys.argv[1], sys.argv[2], sys.argv[3]
    rng = np.random.default_rng(0)
    num_users, num_items = 25, 50
    tr, va, te = ([], []), ([], []), ([], [])
    for u in range(num_users):
        n = int(rng.integers(2, 20))
        chosen = rng.choice(num_items, n + 2, replace=False)
        tr[0].extend([u] * n); tr[1].extend(chosen[:n].tolist())
        va[0].append(u); va[1].append(int(chosen[n])); te[0].append(u); te[1].append(int(chosen[n + 1]))
    train, valid, test = (Pairs.from_arrays(a, b, num_users) for a, b in (tr, va, te))
    method = fedncf_method(FedNCF(num_users, num_items, 8, variant="neumf", hidden=(8,)), lr=0.05, lr_eta=2.0)
    config = FederatedConfig(rounds=12, seed=3, batch_size=16, clients_per_round=15, eval_every=2,
                             selection_metric="NDCG@10")
    checkpointer = None if mode == "full" else Checkpointer(directory, name="run", every=2)
    slow = (lambda run, record: time.sleep(0.25)) if mode == "killable" else None
    run = run_federated(method, train, config, evaluator=RankingEvaluator(train, valid, test, ks=(10,)),
                        checkpointer=checkpointer, on_round_end=slow)
    torch.save({"global": run.state.global_state, "private": run.state.private_state, "history": run.history,
                "best_round": run.best_round, "best_metrics": run.best_metrics,
                "test_metrics": run.test_metrics}, out)
    """
)


def _child(tmp_path, mode, directory):
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    out = tmp_path / f"{mode}.pt"
    return [sys.executable, str(script), mode, str(directory), str(out)], out


def _round_in_checkpoint(path):
    try:
        return checkpoint_progress(path)["round_index"]
    except Exception:  # not there yet
        return None


def test_killed_run_resumes_bit_for_bit(tmp_path):
    directory = tmp_path / "checkpoints"
    cmd, full_out = _child(tmp_path, "full", directory)
    subprocess.run(cmd, check=True, timeout=120)

    cmd, _ = _child(tmp_path, "killable", directory)
    proc = subprocess.Popen(cmd)
    ckpt = directory / "run.pt"
    deadline = time.time() + 90
    while time.time() < deadline:
        saved = _round_in_checkpoint(ckpt) if ckpt.exists() else None
        if saved is not None and saved >= 4:
            break
        time.sleep(0.05)
    time.sleep(0.3)  # let it run into the next rounds before the kill
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL, "the run finished before it could be killed"
    killed_at = _round_in_checkpoint(ckpt)
    assert killed_at is not None and 4 <= killed_at < 12

    cmd, _ = _child(tmp_path, "resume", directory)
    subprocess.run(cmd, check=True, timeout=120)
    resumed = torch.load(tmp_path / "resume.pt", weights_only=True)
    full = torch.load(full_out, weights_only=True)
    for part in ("global", "private"):
        for name in full[part]:
            assert torch.equal(full[part][name], resumed[part][name]), (part, name)
    assert full["history"] == resumed["history"]
    assert full["best_round"] == resumed["best_round"]
    assert full["best_metrics"] == resumed["best_metrics"]
    assert full["test_metrics"] == resumed["test_metrics"]
    assert not [p for p in directory.iterdir() if p.suffix == ".tmp"]


def _tiny_run(config, checkpointer=None):
    """FedMF on 12 users x 20 items, no evaluation: a parameter-averaging run for the trainer to checkpoint."""
    from fedlib.data.splits import Pairs
    from fedlib.engine import fedmf_method, run_federated
    from fedlib.models import FedMF

    rng = np.random.default_rng(0)
    users = np.repeat(np.arange(12), 4)
    items = np.concatenate([rng.choice(20, 4, replace=False) for _ in range(12)])
    method = fedmf_method(FedMF(12, 20, 4), lr=0.5)
    return run_federated(method, Pairs.from_arrays(users, items, 12), config, checkpointer=checkpointer, device="cpu")


def test_the_trainers_snapshot_is_atomic_and_checks_the_config(tmp_path, monkeypatch):
    """A parameter-averaging run saves the trainer's snapshot; a run under another configuration refuses it."""
    config = FederatedConfig(rounds=3, seed=1, batch_size=8)
    ck = Checkpointer(tmp_path, name="x", every=3)
    run = _tiny_run(config, ck)
    loaded = Checkpointer(tmp_path, name="x").load_snapshot(config_dict(config))
    assert loaded["round_index"] == 3 and loaded["history"] == run.history and len(run.history) == 3
    assert torch.equal(loaded["state"]["global_state"]["item_emb"], run.state.global_state["item_emb"])
    assert torch.equal(loaded["state"]["private_state"]["user_emb"], run.state.private_state["user_emb"])
    # Extending the number of rounds is allowed (and continues from round 3); changing anything else is not.
    longer = FederatedConfig(rounds=5, seed=1, batch_size=8)
    extended = _tiny_run(longer, Checkpointer(tmp_path, name="x", every=3))
    assert [h["round"] for h in extended.history] == [1, 2, 3, 4, 5] and extended.history[:3] == run.history
    torch.testing.assert_close(extended.state.global_state["item_emb"], _tiny_run(longer).state.global_state["item_emb"],
                               rtol=0, atol=0)
    with pytest.raises(ValueError, match="different configuration"):
        _tiny_run(FederatedConfig(rounds=5, seed=2, batch_size=8), Checkpointer(tmp_path, name="x", every=3))

    # A crash while writing leaves the previous checkpoint intact and no temporary file.
    def boom(*args, **kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr(torch, "save", boom)
    with pytest.raises(RuntimeError):
        ck.save_snapshot({**loaded, "round_index": 6}, config_dict(longer))
    monkeypatch.undo()
    assert Checkpointer(tmp_path, name="x").load_snapshot(config_dict(longer))["round_index"] == 5
    assert sorted(os.listdir(tmp_path)) == ["x.pt"]


def test_snapshots_of_other_round_loops_round_trip_and_are_not_confused_with_a_run_of_the_trainer(tmp_path):
    config = {"rounds": 10, "model": {"dim": 8}, "train": {"lr": 1e-3}}
    saver = Checkpointer(tmp_path, name="loop", every=2)
    assert not saver.due(1) and saver.due(2) and saver.due(3, finished=True)
    rng = np.random.default_rng(7)
    snapshot = {"round_index": 4, "weights": {"w": torch.arange(3.0)}, "numpy_rng": rng.bit_generator.state,
                "history": [{"round": 1, "loss": 0.5}], "best": None}
    saver.save_snapshot(snapshot, config)
    expected_next = rng.integers(0, 1 << 40, size=3)

    loader = Checkpointer(tmp_path, name="loop", every=2)
    loaded = loader.load_snapshot({**config, "rounds": 20})          # a run may be extended
    assert loader.resumed_at == [4] and loaded["history"] == snapshot["history"]
    assert torch.equal(loaded["weights"]["w"], torch.arange(3.0))
    again = np.random.default_rng(0)
    again.bit_generator.state = loaded["numpy_rng"]                   # 128-bit PCG64 state survives weights_only
    assert again.integers(0, 1 << 40, size=3).tolist() == expected_next.tolist()
    with pytest.raises(ValueError, match="different configuration"):
        loader.load_snapshot({**config, "train": {"lr": 1e-2}})
    with pytest.raises(ValueError, match="round_index"):
        saver.save_snapshot({"weights": {}}, config)
    with pytest.raises(ValueError, match="different configuration"):   # a parameter-averaging run refuses it
        _tiny_run(FederatedConfig(rounds=10), Checkpointer(tmp_path, name="loop", every=2))
    assert Checkpointer(tmp_path, name="none").load_snapshot(config) is None

    # A checkpoint of the older flat layout (TrainState fields under "state") is refused, saying what to do.
    torch.save({"format": 1, "config": config, "state": {"round_index": 1}}, tmp_path / "state.pt")
    with pytest.raises(ValueError, match="older flat 'state' layout.*delete it"):
        Checkpointer(tmp_path, name="state").load_snapshot(config)


def test_a_checkpoint_records_its_code_and_is_refused_under_other_sources(tmp_path, monkeypatch):
    import fedlib.engine.checkpoint as checkpoint_module
    from fedlib.paths import current_commit, source_fingerprint

    config = {"rounds": 10, "train": {"lr": 1e-3}}
    Checkpointer(tmp_path, name="run", every=2).save_snapshot({"round_index": 2}, config)
    payload = torch.load(tmp_path / "run.pt", weights_only=True)
    assert payload["commit"] == current_commit() and payload["source"] == source_fingerprint()
    assert Checkpointer(tmp_path, name="run", every=2).load_snapshot(config)["round_index"] == 2  # same code
    # Another version of fedlib/ (an edit, another checkout) must not finish the run.
    monkeypatch.setattr(checkpoint_module, "source_fingerprint", lambda: "0123456789abcdef")
    with pytest.raises(ValueError, match=rf"written by commit {re.escape(payload['commit'])}.*sources differ.*delete the file"):
        Checkpointer(tmp_path, name="run", every=2).load_snapshot(config)
    # A checkpoint from before the field is refused too: its code cannot be told.
    monkeypatch.undo()
    torch.save({key: value for key, value in payload.items() if key not in ("commit", "source")}, tmp_path / "old.pt")
    with pytest.raises(ValueError, match="recorded no commit"):
        Checkpointer(tmp_path, name="old", every=2).load_snapshot(config)


def test_the_source_fingerprint_follows_every_python_file(tmp_path):
    from fedlib.paths import source_fingerprint

    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "a.py").write_text("x = 1\n")
    (package / "sub" / "b.py").write_text("y = 2\n")
    (package / "notes.txt").write_text("not code\n")
    first = source_fingerprint(package)
    source_fingerprint.cache_clear()
    (package / "notes.txt").write_text("still not code\n")
    assert source_fingerprint(package) == first
    source_fingerprint.cache_clear()
    (package / "sub" / "b.py").write_text("y = 3\n")
    edited = source_fingerprint(package)
    assert edited != first
    source_fingerprint.cache_clear()
    (package / "sub" / "b.py").rename(package / "b.py")  # the same bytes elsewhere is other code
    assert source_fingerprint(package) not in (first, edited)
    source_fingerprint.cache_clear()
