"""Registry contents, status computation and the ``data`` command line."""
from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

import pytest
from conftest import data_root, missing_data

from fedlib.data import cli as data_cli
from fedlib.data import download
from fedlib.data.errors import FedlibDataError, UnknownDatasetError, UnknownVariantError
from fedlib.data.registry import STATUSES, get_spec, list_specs

EXPECTED_IDS = (
    "ml-100k", "ml-latest-small", "ml-1m", "hetrec2011-movielens-2k", "hetrec2011-lastfm-2k", "filmtrust",
    "amazon-video", "amazon-industrial", "c2dsr-food-kitchen", "c2dsr-movie-book", "c2dsr-entertainment-education",
    "amazon-cdr-disencdr", "douban-gadtcdr",
)

# Status of the reference collection, as documented in its MANIFEST.md.
EXPECTED_STATUS = {
    "ml-100k": "complete",
    "ml-latest-small": "complete",
    "ml-1m": "partial",
    "hetrec2011-movielens-2k": "metadata-only",
    "hetrec2011-lastfm-2k": "partial",
    "filmtrust": "complete",
    "amazon-video": "processed",
    "amazon-industrial": "missing",
    "c2dsr-food-kitchen": "partial",
    "c2dsr-movie-book": "partial",
    "c2dsr-entertainment-education": "metadata-only",
    "amazon-cdr-disencdr": "substitute",
    "douban-gadtcdr": "substitute",
}


pytestmark = pytest.mark.usefixtures("isolated_data_env")  # offline, private cache (tests/conftest.py)


@pytest.fixture(scope="session")
def reference_root() -> Path:
    root = data_root()
    if not (root / "manifest.json").is_file():
        missing_data(f"reference data collection not found at {root} (set FEDLIB_DATA to it)")
    return root


# ----------------------------------------------------------------------------------------
# Registry contents
# ----------------------------------------------------------------------------------------

def test_registry_holds_exactly_the_expected_datasets():
    assert tuple(spec.id for spec in list_specs()) == EXPECTED_IDS
    for spec in list_specs():
        assert spec.status in STATUSES
        assert spec.status == EXPECTED_STATUS[spec.id]
        assert spec.url.startswith("https://")
        assert spec.licence and spec.licence_short


def test_registry_checksums_match_the_manifest(reference_root):
    manifest = json.loads((reference_root / "manifest.json").read_text())
    seen = set()
    for entry in manifest["datasets"]:
        spec = get_spec(entry["id"])
        for f in entry["files"]:
            registered = next((r for r in spec.files if r.path == f["path"]), None)
            assert registered is not None, f"{f['path']} is not registered"
            assert registered.sha256 == f["sha256"], f["path"]
            assert registered.size == f["bytes"], f["path"]
            seen.add(f["path"])
    # Every registered hash comes from the manifest (none invented).
    hashed = {f.path for spec in list_specs() for f in spec.files if f.sha256 is not None}
    assert hashed == seen


def test_registry_does_not_need_the_reference_collection(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDLIB_DATA", str(tmp_path / "nowhere"))
    spec = get_spec("ml-100k")
    assert spec.file("ml-100k/u.data").sha256 == "06416e597f82b7342361e41163890c81036900f418ad91315590814211dca490"
    assert download.dataset_status("ml-100k") == "missing"


def test_computed_status_of_reference_collection_matches_registry(reference_root):
    for spec in list_specs():
        assert download.dataset_status(spec, reference_root) == spec.status, spec.id


def test_status_rules():
    spec = get_spec("ml-1m")
    assert spec.status_for([]) == "missing"
    assert spec.status_for(["ml-1m/README", "ml-1m/movies.dat"]) == "metadata-only"
    assert spec.status_for(["ml-1m/README", "ml-1m/movies.dat", "ml-1m/partial/ratings.dat.gz"]) == "partial"
    assert spec.status_for(["ml-1m/README", "ml-1m/movies.dat", "ml-1m/users.dat", "ml-1m/ratings.dat"]) == "complete"
    # A substitute stays a substitute even with a domain missing (the stronger caveat).
    douban = get_spec("douban-gadtcdr")
    assert douban.status_for(["douban-gadtcdr/douban_book/ratings.dat"]) == "substitute"
    # Logical names count as present for xz-stored files.
    ml100k = get_spec("ml-100k")
    everything = [f.logical_path for f in ml100k.files]
    assert ml100k.status_for(everything) == "complete"


def test_logical_path_strips_only_storage_xz():
    ml100k = get_spec("ml-100k")
    assert ml100k.file("ml-100k/u1.base").path == "ml-100k/u1.base.xz"
    assert ml100k.file("ml-100k/u1.base.xz").logical_path == "ml-100k/u1.base"
    partial = get_spec("ml-1m").file("ml-1m/partial/ratings.dat.gz")
    assert partial.logical_path == "ml-1m/partial/ratings.dat.gz"
    industrial = get_spec("amazon-industrial").files[0]
    assert industrial.logical_path.endswith(".json.gz")


def test_variants_only_name_registered_files_and_parsers_exist():
    from fedlib.data import loaders

    for spec in list_specs():
        assert loaders.parser_of(spec).__name__ == spec.parser
        for variant in spec.variants:
            for rel in variant.required + variant.optional:
                assert spec.file(rel) is not None, f"{spec.id} variant {variant.name!r}: {rel} not registered"


def test_a_parser_name_the_loaders_do_not_define_is_refused_with_where_to_fix_it():
    from fedlib.data.loaders import parser_of

    misspelt = dataclasses.replace(get_spec("ml-100k"), parser="load_movielens_100")
    with pytest.raises(FedlibDataError, match=r"'load_movielens_100'.*fedlib/data/registry\.py"):
        parser_of(misspelt)
    not_a_loader = dataclasses.replace(get_spec("ml-100k"), parser="data_root")  # a function, but not a parser
    with pytest.raises(FedlibDataError, match="does not define"):
        parser_of(not_a_loader)


def test_downloadability_and_manual_instructions():
    assert get_spec("ml-100k").script_downloadable
    assert get_spec("amazon-industrial").script_downloadable
    assert get_spec("amazon-cdr-disencdr").script_downloadable
    assert not get_spec("c2dsr-food-kitchen").script_downloadable
    assert not get_spec("douban-gadtcdr").script_downloadable
    text = get_spec("c2dsr-entertainment-education").manual_instructions("/data")
    assert "drive.google.com" in text and "/data/c2dsr-entertainment-education/" in text and "{root}" not in text
    douban = get_spec("douban-gadtcdr").manual_instructions("/data")
    assert "researchgate" in douban.lower() and "/data/douban-gadtcdr/douban_movie/ratings.dat" in douban
    # Single-file mirrors are pinned to a commit and only exist where a hash is known.
    for spec in list_specs():
        for f in spec.files:
            if f.urls and f.sha256 is not None:
                assert all(("raw.githubusercontent.com" not in u) or len(u.split("/")[5]) == 40 for u in f.urls)


def test_get_spec_unknown_and_variant_errors():
    with pytest.raises(UnknownDatasetError) as info:
        get_spec("ml100k")
    assert info.value.suggestion == "ml-100k"
    assert "ml-latest-small" in str(info.value) and "Did you mean 'ml-100k'" in str(info.value)
    with pytest.raises(UnknownVariantError) as info:
        get_spec("filmtrust").variant("fedrk")
    assert "'fedrkg'" in str(info.value)
    spec = get_spec("ml-100k")
    assert get_spec(spec) is spec  # a spec passes through unchanged


# ----------------------------------------------------------------------------------------
# Command line
# ----------------------------------------------------------------------------------------

def test_cli_list_counts_and_status(reference_root, capsys):
    code = data_cli.main(["list", "--root", str(reference_root)])
    out = capsys.readouterr().out
    assert code == 0
    lines = {line.split()[0]: line for line in out.splitlines() if line and line.split()[0] in EXPECTED_IDS}
    assert set(lines) == set(EXPECTED_IDS)
    assert "complete" in lines["ml-100k"] and "100,000" in lines["ml-100k"] and "1,682" in lines["ml-100k"]
    assert "partial" in lines["ml-1m"]
    assert "missing" in lines["amazon-industrial"]
    assert "substitute" in lines["amazon-cdr-disencdr"]


def test_cli_list_verify_flags_a_corrupted_file(tmp_path, capsys):
    root = tmp_path / "data"
    (root / "amazon-video").mkdir(parents=True)
    (root / "amazon-video" / "ratings.dat").write_text("0,0,2.0,1281052800\n")
    code = data_cli.main(["list", "--root", str(root), "--verify", "--no-counts"])
    out = capsys.readouterr().out
    assert code == 1
    assert "MISMATCH: amazon-video/ratings.dat" in out


def test_cli_path_and_download_offline(tmp_path, capsys):
    root = tmp_path / "data"
    assert data_cli.main(["path", "--root", str(root)]) == 0
    assert str(root) in capsys.readouterr().out
    assert data_cli.main(["path", "--root", str(root), "c2dsr-food-kitchen"]) == 0
    out = capsys.readouterr().out
    assert "MISSING" in out and "traindata_new.txt" in out and "[manual]" in out
    code = data_cli.main(["download", "--root", str(root), "ml-100k"])
    err = capsys.readouterr().err
    assert code == 1 and "FEDLIB_OFFLINE" in err
    assert not (root / "ml-100k").exists()


def test_cli_registered_subcommand_and_top_level_wiring(capsys):
    seen = {}

    def configure(parser):
        parser.add_argument("dataset")

    def run(args):
        seen["dataset"] = args.dataset
        return 7

    data_cli.register_data_subcommand("probe-stats", "test command", configure, run)
    try:
        top = argparse.ArgumentParser(prog="fedlib")
        data_cli.add_data_commands(top.add_subparsers(dest="command"))
        args = top.parse_args(["data", "probe-stats", "ml-100k"])
        assert args.func(args) == 7 and seen == {"dataset": "ml-100k"}
        args = top.parse_args(["data", "list", "--no-counts"])
        assert args.func is data_cli.run_list
    finally:
        data_cli._EXTRA_SUBCOMMANDS.pop("probe-stats", None)
    with pytest.raises(ValueError):
        data_cli.register_data_subcommand("list", "x", configure, run)
