"""Error messages, checksum verification and the download/extract path on local files.

Downloads are tested with ``file://`` URLs to archives built in ``tmp_path`` (urllib
handles them like any URL) or with the fetch function replaced by a failing one.
"""
from __future__ import annotations

import hashlib
import io
import os
import stat
import tarfile
import zipfile
from pathlib import Path

import pytest
from conftest import data_root, missing_data

from fedlib.data import download
from fedlib.data.download import download_dataset, resolve_file, verify_file
from fedlib.data.errors import (
    ChecksumError,
    EmptyUserError,
    FedlibDataError,
    MalformedDataError,
    MissingDataError,
    PartialDataError,
    UnknownDatasetError,
    UnknownProtocolError,
    UnknownVariantError,
    UnsafeArchiveError,
)
from fedlib.data.loaders import load_interactions, load_sequences, parse_amazon_reviews, parse_c2dsr_file
from fedlib.data.registry import ArchiveSpec, DatasetSpec, FileSpec, VariantSpec, get_spec

TOY_RATINGS = b"1\t10\t4\t100\n2\t11\t5\t200\n"
TOY_SHA = hashlib.sha256(TOY_RATINGS).hexdigest()


pytestmark = pytest.mark.usefixtures("isolated_data_env")  # offline, private cache (tests/conftest.py)


@pytest.fixture
def online(monkeypatch):
    monkeypatch.delenv("FEDLIB_OFFLINE", raising=False)


@pytest.fixture(scope="session")
def reference_root() -> Path:
    root = data_root()
    if not (root / "ml-1m").is_dir():
        missing_data(f"reference data collection not found at {root} (set FEDLIB_DATA to it)")
    return root


def _toy_spec(url: str, *, archive_sha=None, file_sha=TOY_SHA, fmt="zip", file_urls=()) -> DatasetSpec:
    """A one-file dataset whose archive lives at ``url`` (a ``file://`` URL in these tests)."""
    return DatasetSpec(
        id="toy",
        title="Toy dataset",
        status="complete",
        full_status="complete",
        files=(FileSpec("toy/ratings.txt", file_sha, len(TOY_RATINGS), "interactions", urls=tuple(file_urls),
                        in_archive=not file_urls),),
        variants=(VariantSpec(None, "all", ("toy/ratings.txt",)),),
        url="https://example.org/toy",
        licence="test data",
        licence_short="test",
        parser="load_movielens_100k",
        archive=None if file_urls else ArchiveSpec(url, archive_sha, fmt),
        manual="copy ratings.txt into {root}/toy/",
    )


def _zip(path: Path, members: dict, symlinks: dict = None) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)
        for name, target in (symlinks or {}).items():
            info = zipfile.ZipInfo(name)
            info.external_attr = (stat.S_IFLNK | 0o777) << 16
            zf.writestr(info, target)
    return path


def _leftovers(root: Path):
    """Temporary download files or folders left under the root."""
    if not root.exists():
        return []
    return [p for p in root.rglob("*") if ".part" in p.name or p.name.startswith(".fedlib-download-")]


# ----------------------------------------------------------------------------------------
# Messages of the lookup errors
# ----------------------------------------------------------------------------------------

def test_unknown_dataset_lists_ids_and_closest_match():
    with pytest.raises(UnknownDatasetError) as info:
        load_interactions("movielens-100k")
    text = str(info.value)
    assert "'movielens-100k'" in text and "ml-100k" in text and "douban-gadtcdr" in text
    assert info.value.suggestion == "ml-100k"
    assert isinstance(info.value, LookupError) and isinstance(info.value, FedlibDataError)


def test_unknown_variant_and_missing_variant():
    with pytest.raises(UnknownVariantError, match="'u1'"):
        load_interactions("ml-100k", variant="u9")
    with pytest.raises(UnknownVariantError, match="no default variant.*phone_sport"):
        load_interactions("amazon-cdr-disencdr")


def test_protocol_errors_are_defined_for_the_protocols_layer():
    error = UnknownProtocolError("f3crec-blocks", ["f3crec", "fedrkg"], dataset="ml-100k")
    assert "Did you mean 'f3crec'" in str(error) and "'ml-100k'" in str(error)
    assert issubclass(EmptyUserError, FedlibDataError) and issubclass(EmptyUserError, ValueError)


# ----------------------------------------------------------------------------------------
# Missing, partial and corrupted data
# ----------------------------------------------------------------------------------------

def test_missing_file_offline_names_file_root_and_url(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDLIB_DATA", str(tmp_path / "empty"))
    monkeypatch.setattr(download, "_fetch", lambda *a, **k: pytest.fail("must not download while offline"))
    with pytest.raises(MissingDataError) as info:
        load_interactions("ml-100k")
    text = str(info.value)
    assert "ml-100k/u.data" in text
    assert str(tmp_path / "empty") in text and "FEDLIB_DATA" in text
    assert "https://files.grouplens.org/datasets/movielens/ml-100k.zip" in text
    assert "FEDLIB_OFFLINE=1" in text and "python -m fedlib data download ml-100k" in text
    assert info.value.missing == ("ml-100k/u.data",) and isinstance(info.value, FileNotFoundError)


def test_manual_only_dataset_names_every_missing_file_and_drive(tmp_path):
    with pytest.raises(MissingDataError) as info:
        load_sequences("c2dsr-entertainment-education", root=tmp_path)
    text = str(info.value)
    for name in ("validdata_new.txt", "testdata_new.txt", "Alist.txt", "Blist.txt"):
        assert name in text
    assert "drive.google.com/drive/folders/1xpnp6tH56xz8PF_xuTi9exEptmcvlAVU" in text
    assert str(tmp_path / "c2dsr-entertainment-education") in text


def test_douban_movie_request_is_a_clear_missing_error(reference_root):
    with pytest.raises(MissingDataError) as info:
        load_interactions("douban-gadtcdr", variant="movie", root=reference_root)
    assert "douban_movie/ratings.dat" in str(info.value) and "GA-DTCDR" in str(info.value)


def test_hetrec_movielens_ratings_missing(reference_root):
    with pytest.raises(MissingDataError) as info:
        load_interactions("hetrec2011-movielens-2k", root=reference_root)
    assert "user_ratedmovies-timestamps.dat" in str(info.value)
    assert "hetrec2011-movielens-2k-v2.zip" in str(info.value)


def test_amazon_industrial_missing_offline(tmp_path):
    with pytest.raises(MissingDataError) as info:
        load_interactions("amazon-industrial", root=tmp_path)
    text = str(info.value)
    assert "Industrial_and_Scientific_5.json.gz" in text and "nijianmo.github.io/amazon" in text


def test_partial_ml1m_refused_without_allow_partial(reference_root):
    with pytest.raises(PartialDataError) as info:
        load_interactions("ml-1m", root=reference_root)
    text = str(info.value)
    assert "allow_partial=True" in text and "487,650" in text and "1,000,209" in text
    assert "https://files.grouplens.org/datasets/movielens/ml-1m.zip" in text


def test_checksum_mismatch_names_file_and_both_hashes(tmp_path):
    folder = tmp_path / "ml-100k"
    folder.mkdir()
    (folder / "u.data").write_bytes(b"196\t242\t3\t881250949\n")
    with pytest.raises(ChecksumError) as info:
        load_interactions("ml-100k", root=tmp_path)
    text = str(info.value)
    expected = get_spec("ml-100k").file("ml-100k/u.data").sha256
    actual = hashlib.sha256(b"196\t242\t3\t881250949\n").hexdigest()
    assert "u.data" in text and expected in text and actual in text
    assert "data download ml-100k" in text
    assert (info.value.expected, info.value.actual) == (expected, actual)


def test_verification_can_be_switched_off(tmp_path, monkeypatch):
    folder = tmp_path / "ml-100k"
    folder.mkdir()
    (folder / "u.data").write_bytes(b"196\t242\t3\t881250949\n")
    monkeypatch.setenv("FEDLIB_VERIFY", "0")
    assert len(load_interactions("ml-100k", root=tmp_path).frame) == 1


def test_verification_is_cached_by_path_size_and_mtime(tmp_path, monkeypatch):
    target = tmp_path / "toy" / "ratings.txt"
    target.parent.mkdir()
    target.write_bytes(TOY_RATINGS)
    spec = _toy_spec("file:///nowhere")
    calls = []
    real = download.sha256_of
    monkeypatch.setattr(download, "sha256_of", lambda p: calls.append(p) or real(p))
    verify_file(spec, target, tmp_path)
    download._DIGEST_MEMO.clear()  # a new process: only the JSON cache remains
    verify_file(spec, target, tmp_path)
    assert len(calls) == 1
    assert (tmp_path / ".fedlib" / "verified.json").is_file()
    target.write_bytes(TOY_RATINGS.replace(b"4", b"3"))  # same size, new content and mtime
    os.utime(target, ns=(target.stat().st_atime_ns, target.stat().st_mtime_ns + 10_000_000))
    with pytest.raises(ChecksumError):
        verify_file(spec, target, tmp_path)
    assert len(calls) == 2


def test_unpublished_hash_is_recorded_then_enforced(tmp_path, capsys):
    target = tmp_path / "toy" / "ratings.txt"
    target.parent.mkdir()
    target.write_bytes(TOY_RATINGS)
    spec = _toy_spec("file:///nowhere", file_sha=None)
    assert verify_file(spec, target, tmp_path) == TOY_SHA
    assert TOY_SHA in capsys.readouterr().err
    assert download.recorded_hash(tmp_path, file="toy/ratings.txt") == TOY_SHA
    target.write_bytes(TOY_RATINGS + b"3\t12\t1\t300\n")
    with pytest.raises(ChecksumError, match="recorded on first use"):
        verify_file(spec, target, tmp_path)


def test_upstream_form_of_a_modified_reference_file_is_accepted(tmp_path):
    # The reference movies.dat lost its header line; the official file (other size) is recorded instead.
    folder = tmp_path / "hetrec2011-movielens-2k"
    folder.mkdir()
    (folder / "movies.dat").write_text("id\ttitle\n1\tToy story\n")
    verify_file("hetrec2011-movielens-2k", folder / "movies.dat", tmp_path)
    assert download.recorded_hash(tmp_path, file="hetrec2011-movielens-2k/movies.dat")


# ----------------------------------------------------------------------------------------
# Malformed lines
# ----------------------------------------------------------------------------------------

def _toy_table_spec(tmp_path: Path, content: bytes) -> DatasetSpec:
    (tmp_path / "toy").mkdir(exist_ok=True)
    (tmp_path / "toy" / "ratings.txt").write_bytes(content)
    return _toy_spec("file:///nowhere", file_sha=hashlib.sha256(content).hexdigest())


def _load_toy(spec: DatasetSpec, root: Path):
    # The toy spec uses the ml-100k parser: same tab-separated four-column format.
    return load_interactions(spec, root=root).frame


@pytest.mark.parametrize("bad_line, line_number, reason", [
    (b"3\t12\t5\n", 3, "expected 4 fields"),
    (b"3\tx12\t5\t300\n", 3, "field 'item'"),
    (b"3\t12\t5\t300\t9\n", 3, "expected 4 fields"),
    (b"3.5\t12\t5\t300\n", 3, "field 'user'"),
])
def test_malformed_line_reports_file_line_and_text(tmp_path, bad_line, line_number, reason):
    content = TOY_RATINGS + bad_line + b"4\t13\t2\t400\n"
    spec = _toy_table_spec(tmp_path, content)
    with pytest.raises(MalformedDataError) as info:
        _load_toy(spec, tmp_path)
    error = info.value
    assert error.line_number == line_number and error.path.name == "ratings.txt"
    assert error.line == bad_line.decode().rstrip("\n")
    text = str(error)
    assert f"ratings.txt, line {line_number}" in text and reason in text and repr(error.line) in text


def test_malformed_u_data_through_the_public_loader(tmp_path, monkeypatch):
    folder = tmp_path / "ml-100k"
    folder.mkdir()
    (folder / "u.data").write_text("196\t242\t3\t881250949\n186\t302\t3\n22\t377\t1\t878887116\n")
    monkeypatch.setenv("FEDLIB_VERIFY", "0")  # the checksum would (rightly) object first
    with pytest.raises(MalformedDataError) as info:
        load_interactions("ml-100k", root=tmp_path)
    assert info.value.line_number == 2 and info.value.line == "186\t302\t3"
    assert "u.data, line 2" in str(info.value)


def test_malformed_header_file_counts_the_header_line(tmp_path):
    from fedlib.data.reading import _read_table

    path = tmp_path / "ratings.csv"
    path.write_text("userId,movieId,rating,timestamp\r\n1,1,4.0,964982703\r\n1,3,abc,964981247\r\n")
    with pytest.raises(MalformedDataError) as info:
        _read_table(path, sep=",", header=True,
                    columns=(("user", "int"), ("item", "int"), ("rating", "float"), ("timestamp", "int")))
    assert info.value.line_number == 3 and "'abc' is not a number" in str(info.value)


def test_malformed_double_colon_and_sequence_and_json_lines(tmp_path):
    from fedlib.data.reading import _read_table

    dat = tmp_path / "ratings.dat"
    dat.write_text("1::1193::5::978300760\n1::661::3\n")
    with pytest.raises(MalformedDataError) as info:
        _read_table(dat, sep="::", columns=(("user", "int"), ("item", "int"), ("rating", "float"),
                                            ("timestamp", "int")))
    assert info.value.line_number == 2

    seq = tmp_path / "testdata_new.txt"
    seq.write_text("7\t10\t1|100|d|\t2|200|d|\n8\t11\t3|oops|d|\n")
    with pytest.raises(MalformedDataError) as info:
        parse_c2dsr_file(seq)
    assert info.value.line_number == 2 and "oops" in info.value.line

    reviews = tmp_path / "reviews.json"
    reviews.write_text('{"reviewerID": "A", "asin": "B", "overall": 5.0, "unixReviewTime": 1}\n'
                       '{"reviewerID": "A", "overall": 5.0, "unixReviewTime": 1}\n')
    with pytest.raises(MalformedDataError) as info:
        parse_amazon_reviews(reviews)
    assert info.value.line_number == 2 and "'asin'" in str(info.value)


# ----------------------------------------------------------------------------------------
# Download and extraction on local files
# ----------------------------------------------------------------------------------------

def test_download_zip_with_checksum_ok(tmp_path, online):
    archive = _zip(tmp_path / "toy.zip", {"toy/ratings.txt": TOY_RATINGS, "toy/README": b"hello",
                                          "__MACOSX/._ratings.txt": b"junk"})
    spec = _toy_spec(archive.as_uri(), archive_sha=download.sha256_of(archive))
    root = tmp_path / "data"
    path = resolve_file(spec, "ratings.txt", root)
    assert path == root / "toy" / "ratings.txt" and path.read_bytes() == TOY_RATINGS
    assert (root / "toy" / "README").read_bytes() == b"hello"  # top folder "toy/" stripped
    assert not (root / "toy" / "__MACOSX").exists()
    assert _leftovers(root) == []
    # Parsed through the ordinary loader path.
    assert len(load_interactions(spec, root=root).frame) == 2


def test_download_flat_zip_lands_in_the_dataset_folder(tmp_path, online):
    archive = _zip(tmp_path / "flat.zip", {"ratings.txt": TOY_RATINGS, "readme.txt": b"x"})
    spec = _toy_spec(archive.as_uri())
    report = download_dataset(spec, tmp_path / "data")
    assert (tmp_path / "data" / "toy" / "ratings.txt").read_bytes() == TOY_RATINGS
    assert "toy/ratings.txt" in report.written and report.ok


def test_download_checksum_mismatch_leaves_nothing(tmp_path, online):
    archive = _zip(tmp_path / "toy.zip", {"toy/ratings.txt": TOY_RATINGS})
    spec = _toy_spec(archive.as_uri(), archive_sha="0" * 64)
    root = tmp_path / "data"
    with pytest.raises(ChecksumError) as info:
        resolve_file(spec, "ratings.txt", root)
    assert "0" * 64 in str(info.value) and download.sha256_of(archive) in str(info.value)
    assert not (root / "toy").exists()
    assert _leftovers(root) == []


@pytest.mark.parametrize("members, symlinks", [
    ({"toy/ratings.txt": TOY_RATINGS, "toy/../../evil.txt": b"pwned"}, None),
    ({"toy/ratings.txt": TOY_RATINGS, "/tmp/evil-absolute.txt": b"pwned"}, None),
    ({"toy/ratings.txt": TOY_RATINGS}, {"toy/link": "../../../etc/passwd"}),
])
def test_unsafe_archive_members_are_refused(tmp_path, online, members, symlinks):
    archive = _zip(tmp_path / "evil.zip", members, symlinks)
    spec = _toy_spec(archive.as_uri())
    root = tmp_path / "data"
    with pytest.raises(UnsafeArchiveError):
        download_dataset(spec, root)
    assert not (root / "toy").exists()  # nothing extracted, not even the harmless member
    assert not (tmp_path / "evil.txt").exists() and not Path("/tmp/evil-absolute.txt").exists()
    assert _leftovers(root) == []
    assert download.recorded_hash(root, url=spec.archive.url) is None  # an unsafe archive is never trusted


def test_tar_links_are_refused(tmp_path, online):
    archive = tmp_path / "evil.tar.gz"
    with tarfile.open(archive, "w:gz") as tf:
        info = tarfile.TarInfo("toy/ratings.txt")
        info.size = len(TOY_RATINGS)
        tf.addfile(info, io.BytesIO(TOY_RATINGS))
        link = tarfile.TarInfo("toy/escape")
        link.type = tarfile.SYMTYPE
        link.linkname = "/etc"
        tf.addfile(link)
    spec = _toy_spec(archive.as_uri(), fmt="tar")
    with pytest.raises(UnsafeArchiveError, match="link"):
        download_dataset(spec, tmp_path / "data")
    assert not (tmp_path / "data" / "toy").exists()


def test_unknown_archive_hash_is_printed_recorded_and_enforced(tmp_path, online, capsys):
    archive = _zip(tmp_path / "toy.zip", {"toy/ratings.txt": TOY_RATINGS})
    spec = _toy_spec(archive.as_uri())
    root = tmp_path / "data"
    resolve_file(spec, "ratings.txt", root)
    first_sha = download.sha256_of(archive)
    assert first_sha in capsys.readouterr().err
    assert download.recorded_hash(root, url=archive.as_uri()) == first_sha
    # The server now serves different bytes under the same URL: refused, nothing replaced.
    _zip(archive, {"toy/ratings.txt": TOY_RATINGS, "toy/extra.txt": b"new"})
    with pytest.raises(ChecksumError) as info:
        download_dataset(spec, root, force=True)
    assert first_sha in str(info.value)
    assert not (root / "toy" / "extra.txt").exists() and _leftovers(root) == []


def test_single_file_download_verified_against_registry_hash(tmp_path, online):
    good = tmp_path / "ratings-good.txt"
    good.write_bytes(TOY_RATINGS)
    spec = _toy_spec("unused", file_urls=[good.as_uri()])
    root = tmp_path / "data"
    assert resolve_file(spec, "ratings.txt", root).read_bytes() == TOY_RATINGS

    bad = tmp_path / "ratings-bad.txt"
    bad.write_bytes(TOY_RATINGS + b"9\t9\t9\t9\n")
    spec = _toy_spec("unused", file_urls=[bad.as_uri()])
    other_root = tmp_path / "other"
    with pytest.raises(ChecksumError):
        resolve_file(spec, "ratings.txt", other_root)
    assert not (other_root / "toy" / "ratings.txt").exists() and _leftovers(other_root) == []


def test_network_failure_leaves_no_partial_file(tmp_path, online, monkeypatch):
    def broken_fetch(url, dest, timeout=None):
        Path(dest).write_bytes(b"PK\x03\x04 half an archive")
        raise OSError("connection reset by peer")

    monkeypatch.setattr(download, "_fetch", broken_fetch)
    spec = _toy_spec("https://example.org/toy.zip")
    root = tmp_path / "data"
    with pytest.raises(MissingDataError) as info:
        resolve_file(spec, "ratings.txt", root)
    text = str(info.value)
    assert "connection reset by peer" in text and "toy/ratings.txt" in text and "https://example.org/toy.zip" in text
    assert not (root / "toy").exists() and _leftovers(root) == []

    file_spec = _toy_spec("unused", file_urls=["https://example.org/ratings.txt"])
    with pytest.raises(MissingDataError):
        resolve_file(file_spec, "ratings.txt", root)
    assert not (root / "toy" / "ratings.txt").exists() and _leftovers(root) == []


def test_offline_download_dataset_refuses_with_instructions(tmp_path, monkeypatch):
    monkeypatch.setattr(download, "_fetch", lambda *a, **k: pytest.fail("must not download while offline"))
    with pytest.raises(MissingDataError) as info:
        download_dataset("ml-100k", tmp_path)
    assert "FEDLIB_OFFLINE" in str(info.value) and "ml-100k.zip" in str(info.value)
