"""FedPCL-CDR protocol: shared overlap ids, overlap ratio, random leave-one-out, candidates."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from fedlib.data.errors import EmptyUserError
from fedlib.data.protocols import fedpcl_cdr
from fedlib.data.protocols._common import UnsupportedDatasetError


@pytest.fixture(scope="module")
def phone_sport_30(shared_data):
    return fedpcl_cdr.build("amazon-cdr-disencdr", variant="phone_sport", overlap_ratio=0.3, root=shared_data)


@pytest.fixture(scope="module")
def douban(shared_data):
    return fedpcl_cdr.build("douban-gadtcdr", root=shared_data)


def _raw_user_sets(split):
    return {d: set(split[d].extra["raw_users"][np.unique(split[d].train.users)].tolist()) for d in split.domains}


def test_overlap_ratio_is_honoured(phone_sport_30):
    split = phone_sport_30
    natural = split.extra["natural_overlap_users"]
    assert natural == 4998  # every user of a DisenCDR pair is in both domains
    n_o = split.num_overlap_users
    assert n_o == round(0.3 * natural)
    a, b = split.domains
    raw_a, raw_b = split[a].extra["raw_users"], split[b].extra["raw_users"]
    # Shared ids denote the same raw users in both domains ...
    assert np.array_equal(raw_a[:n_o], raw_b[:n_o])
    # ... and no one else is in both domains; every original user is still somewhere.
    assert set(raw_a[n_o:].tolist()).isdisjoint(raw_b[n_o:].tolist())
    assert set(raw_a[n_o:].tolist()).isdisjoint(raw_b[:n_o].tolist())
    assert len(set(raw_a.tolist()) | set(raw_b.tolist())) == natural
    assert abs((len(raw_a) - n_o) - (len(raw_b) - n_o)) < 0.1 * natural  # owners drawn uniformly


def test_natural_overlap_on_douban(shared_data, douban):
    from fedlib.data.loaders import load_interactions

    frame = load_interactions("douban-gadtcdr", root=shared_data).frame
    book = frame[frame["domain"] == "book"]
    music = frame[frame["domain"] == "music"]
    # The single-pass filter (items >= 5, then users >= 5) runs before the overlap is taken.
    def kept_users(part):
        part = part.drop_duplicates(["user", "item"])
        part = part[part["item"].map(part["item"].value_counts()) >= 5]
        return set(part["user"][part["user"].map(part["user"].value_counts()) >= 5])
    assert douban.num_overlap_users == len(kept_users(book) & kept_users(music))
    assert any("SUBSTITUTE" in note for note in douban.notes)


@pytest.mark.parametrize("fixture", ["phone_sport_30", "douban"])
def test_random_leave_one_out_with_validation(request, fixture):
    split = request.getfixturevalue(fixture)
    for d in split.domains:
        s = split[d]
        assert np.all(s.test.counts() == 1) and np.all(s.valid.counts() == 1) and np.all(s.train.counts() >= 1)
        stride = s.num_items
        keys = [p.users * stride + p.items for p in (s.train, s.valid, s.test)]
        assert np.unique(np.concatenate(keys)).size == sum(k.size for k in keys)  # disjoint pairs


@pytest.mark.parametrize("role", ["valid", "test"])
def test_candidates_exclude_positives(phone_sport_30, role):
    for d in phone_sport_30.domains:
        s = phone_sport_30[d]
        cands = s.extra[f"{role}_candidates"]
        held = getattr(s, role)
        assert cands.shape == (len(held), 100)
        assert np.array_equal(cands[:, 0], held.items)
        stride = s.num_items
        known = np.concatenate([p.users * stride + p.items for p in (s.train, s.valid, s.test)])
        assert not np.isin(held.users[:, None] * stride + cands[:, 1:], known).any()


def test_options_98_negatives_no_validation_and_seed(shared_data, phone_sport_30):
    code_like = fedpcl_cdr.build("amazon-cdr-disencdr", variant="phone_sport", overlap_ratio=0.3,
                                 num_negatives=98, valid_holdout=False, root=shared_data)
    d = code_like.domains[0]
    assert code_like[d].extra["test_candidates"].shape[1] == 99
    assert len(code_like[d].valid) == 0
    again = fedpcl_cdr.build("amazon-cdr-disencdr", variant="phone_sport", overlap_ratio=0.3, root=shared_data)
    other = fedpcl_cdr.build("amazon-cdr-disencdr", variant="phone_sport", overlap_ratio=0.3, seed=1, root=shared_data)
    assert np.array_equal(again[d].test.items, phone_sport_30[d].test.items)
    assert np.array_equal(again[d].extra["raw_users"], phone_sport_30[d].extra["raw_users"])
    assert not np.array_equal(other[d].extra["raw_users"], phone_sport_30[d].extra["raw_users"])


def test_three_domains_share_one_overlap_range():
    rng = np.random.default_rng(0)
    frames = {}
    for d, users in (("x", range(0, 60)), ("y", range(20, 80)), ("z", range(10, 70))):
        users = np.repeat(np.array(list(users)), 5)
        frames[d] = pd.DataFrame({"user": users, "item": rng.integers(0, 1000, users.size), "rating": 1.0})
    split = fedpcl_cdr.split_from_frames(frames, num_negatives=20, seed=0)
    assert split.num_overlap_users == 40  # users 20..59 are in all three domains
    for d in split.domains:
        assert split[d].extra["raw_users"][:40].tolist() == list(range(20, 60))


def test_errors(shared_data):
    tiny = {"a": pd.DataFrame({"user": [1, 1, 2, 2, 2], "item": [1, 2, 1, 2, 3]}),
            "b": pd.DataFrame({"user": [1, 1, 1], "item": [1, 2, 3]})}
    with pytest.raises(EmptyUserError, match="fewer than 3"):
        fedpcl_cdr.split_from_frames(tiny, num_negatives=0)
    with pytest.raises(ValueError, match="overlap_ratio"):
        fedpcl_cdr.split_from_frames(tiny, overlap_ratio=30)
    with pytest.raises(ValueError, match="at least two domains"):
        fedpcl_cdr.split_from_frames({"a": tiny["a"]})
    with pytest.raises(ValueError, match="variant"):
        fedpcl_cdr.build("amazon-cdr-disencdr", root=shared_data)
    with pytest.raises(UnsupportedDatasetError, match="fedcsr"):
        fedpcl_cdr.build("c2dsr-movie-book", root=shared_data)
