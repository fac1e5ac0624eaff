"""Protocol registry: names, unknown protocols, datasets a protocol cannot use."""
from __future__ import annotations

import pytest

from fedlib.data.errors import UnknownProtocolError
from fedlib.data.protocols import PROTOCOLS, build_split, get_protocol
from fedlib.data.protocols._common import UnsupportedDatasetError
from fedlib.paths import PAPER_SLUGS


def test_one_protocol_per_paper():
    assert set(PROTOCOLS) == set(PAPER_SLUGS)
    assert get_protocol("FedPCL-CDR") is PROTOCOLS["fedpcl_cdr"]


def test_unknown_protocol_lists_the_known_ones():
    with pytest.raises(UnknownProtocolError) as info:
        get_protocol("f3rec")
    message = str(info.value)
    assert "f3crec" in message and all(name in message for name in PROTOCOLS)


@pytest.mark.parametrize("protocol,dataset", [
    ("f3crec", "c2dsr-food-kitchen"),
    ("fedrkg", "c2dsr-movie-book"),
    ("fedkdrec", "douban-gadtcdr"),
    ("fedpcl_cdr", "ml-100k"),
    ("fedcsr", "amazon-video"),
])
def test_wrong_dataset_for_a_protocol(protocol, dataset):
    with pytest.raises(UnsupportedDatasetError) as info:
        build_split(protocol, dataset)
    assert protocol in str(info.value) and dataset in str(info.value)
    assert isinstance(info.value, ValueError)  # generic handlers keep working
