"""Downloads that survive a broken host: failover to a mirror, hash checks, the insecure-TLS option.

Two local servers on 127.0.0.1 play the hosts: the first serves HTTPS with a certificate that
EXPIRED in 2020 (made with the ``openssl`` command line), the second is the mirror (HTTPS
with a valid self-signed certificate, which also signed the expired one). The valid one is
trusted through ``SSL_CERT_FILE``, so the first host fails for one reason only: its
certificate expired.
Servers are started and stopped by each test; every socket has a timeout.
"""
from __future__ import annotations

import hashlib
import io
import os
import shutil
import ssl
import subprocess
import threading
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from fedlib.data import cli as data_cli
from fedlib.data import doctor, download
from fedlib.data.errors import ChecksumError, MissingDataError
from fedlib.data.registry import ArchiveSpec, DatasetSpec, FileSpec, VariantSpec
from fedlib.data.sources import AllSourcesFailedError

SOCKET_TIMEOUT_S = 5.0
RATINGS = b"1\t10\t4\t100\n2\t11\t5\t200\n"
README = b"toy dataset\n"

_CA_CONFIG = """
[ca]
default_ca = expired
[expired]
database = index.txt
new_certs_dir = .
serial = serial
default_md = sha256
policy = anything
copy_extensions = copy
unique_subject = no
[anything]
commonName = supplied
[req]
distinguished_name = dn
prompt = no
[dn]
CN = 127.0.0.1
[ext]
subjectAltName = IP:127.0.0.1
basicConstraints = CA:FALSE
"""


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


@pytest.fixture(scope="module")
def certificates(tmp_path_factory):
    """``(expired_cert, expired_key, valid_cert, valid_key, bundle)`` paths."""
    if shutil.which("openssl") is None:
        message = "the openssl command is needed to make the test certificates (Debian: apt-get install openssl)"
        if os.environ.get("CI") == "true":
            pytest.fail(message + "; CI must run the failover test, not skip it")
        pytest.skip(message)
    work = tmp_path_factory.mktemp("certs")
    (work / "ca.cnf").write_text(_CA_CONFIG)
    (work / "index.txt").write_text("")
    (work / "serial").write_text("01\n")
    # The mirror's certificate, valid for two days; it also signs the expired one.
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "valid.key", "-out", "valid.pem",
             "-days", "2", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1", cwd=work)
    # Expired: valid from 1 Jan to 1 Feb 2020 (openssl req cannot back-date, openssl ca can). Signed by a
    # trusted certificate, so "certificate has expired" is the only reason it is refused.
    _openssl("req", "-new", "-newkey", "rsa:2048", "-nodes", "-keyout", "expired.key", "-out", "expired.csr",
             "-config", "ca.cnf", cwd=work)
    _openssl("ca", "-batch", "-config", "ca.cnf", "-cert", "valid.pem", "-keyfile", "valid.key", "-in", "expired.csr",
             "-out", "expired.pem", "-startdate", "20200101000000Z", "-enddate", "20200201000000Z",
             "-extensions", "ext", "-notext", cwd=work)
    bundle = work / "trusted.pem"
    bundle.write_text((work / "valid.pem").read_text())
    return work / "expired.pem", work / "expired.key", work / "valid.pem", work / "valid.key", bundle


class _Server:
    """A local HTTP(S) server for ``{path: bytes}``, run in a thread; use as a context manager."""

    def __init__(self, files, cert=None, key=None):
        files = dict(files)

        class Handler(BaseHTTPRequestHandler):
            def _send(self, with_body: bool):
                body = files.get(self.path)
                self.send_response(200 if body is not None else 404)
                self.send_header("Content-Length", str(len(body or b"")))
                self.end_headers()
                if with_body and body:
                    self.wfile.write(body)

            def do_GET(self):
                self._send(True)

            def do_HEAD(self):
                self._send(False)

            def log_message(self, *args):
                pass

        context = None
        if cert is not None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(cert, key)

        class Server(ThreadingHTTPServer):
            daemon_threads = True

            def get_request(self):
                sock, address = self.socket.accept()
                sock.settimeout(SOCKET_TIMEOUT_S)
                if context is not None:  # handshake in the handler thread, bounded by the timeout
                    sock = context.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
                return sock, address

            def finish_request(self, request, client_address):
                try:
                    if context is not None:
                        request.do_handshake()
                    super().finish_request(request, client_address)
                except (OSError, ssl.SSLError):
                    pass  # the client refused our certificate: that is the point of the test

        self.httpd = Server(("127.0.0.1", 0), Handler)
        self.scheme = "https" if cert is not None else "http"
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def url(self, path: str) -> str:
        return f"{self.scheme}://127.0.0.1:{self.httpd.server_address[1]}{path}"

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=SOCKET_TIMEOUT_S)
        assert not self.thread.is_alive(), "the test server did not stop"


def _zip_bytes(members) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return buffer.getvalue()


def _spec(first_url: str, mirror_url: str, archive_sha, *, ratings_sha=None) -> DatasetSpec:
    return DatasetSpec(
        id="toy", title="Toy", status="missing", full_status="complete",
        files=(FileSpec("toy/ratings.txt", ratings_sha, None, "interactions"),
               FileSpec("toy/README", None, None, "docs")),
        variants=(VariantSpec(None, "all", ("toy/ratings.txt",)),),
        url="https://example.org/toy", licence="test data", licence_short="test", parser="load_movielens_100k",
        archive=ArchiveSpec(first_url, sha256=archive_sha, mirrors=(mirror_url,)),
        manual="copy toy.zip by hand into {root}/toy/")


def _leftovers(root: Path):
    return sorted(p.name for p in root.rglob("*") if p.name.startswith(".") and p.name != ".fedlib")


@pytest.fixture
def network(monkeypatch, certificates):
    """Downloads allowed, the test certificates trusted, the failed-URL memory empty."""
    monkeypatch.delenv("FEDLIB_OFFLINE", raising=False)
    monkeypatch.delenv("FEDLIB_INSECURE_TLS_IF_HASH_PINNED", raising=False)
    monkeypatch.setenv("SSL_CERT_FILE", str(certificates[4]))
    monkeypatch.setattr(download, "_FAILED_URLS", {})
    return certificates


GOOD_ZIP = _zip_bytes({"toy/ratings.txt": RATINGS, "toy/README": README})
GOOD_SHA = hashlib.sha256(GOOD_ZIP).hexdigest()


def test_expired_host_fails_over_to_the_mirror_which_is_verified_and_extracted(tmp_path, network, capsys):
    expired_cert, expired_key, valid_cert, valid_key, _ = network
    with _Server({"/toy.zip": GOOD_ZIP}, expired_cert, expired_key) as first, \
            _Server({"/toy.zip": GOOD_ZIP}, valid_cert, valid_key) as mirror:
        spec = _spec(first.url("/toy.zip"), mirror.url("/toy.zip"), GOOD_SHA,
                     ratings_sha=hashlib.sha256(RATINGS).hexdigest())
        root = tmp_path / "data"
        report = download.download_dataset(spec, root)
    err = capsys.readouterr().err
    assert report.ok and sorted(report.written) == ["toy/README", "toy/ratings.txt"]
    assert (root / "toy" / "ratings.txt").read_bytes() == RATINGS and (root / "toy" / "README").read_bytes() == README
    failure_lines = [line for line in err.splitlines() if "download failed" in line]
    assert len(failure_lines) == 1, err  # one line per failed source
    assert f"127.0.0.1:{first.httpd.server_address[1]}" in failure_lines[0]
    assert "certificate has expired" in failure_lines[0]
    assert "sha256 verified" in err and "WARNING" not in err
    assert _leftovers(root) == []


def test_corrupted_mirror_is_a_hash_error_and_nothing_is_written(tmp_path, network):
    expired_cert, expired_key, valid_cert, valid_key, _ = network
    corrupted = bytearray(GOOD_ZIP)
    corrupted[len(corrupted) // 2] ^= 0xFF
    with _Server({"/toy.zip": GOOD_ZIP}, expired_cert, expired_key) as first, \
            _Server({"/toy.zip": bytes(corrupted)}, valid_cert, valid_key) as mirror:
        spec = _spec(first.url("/toy.zip"), mirror.url("/toy.zip"), GOOD_SHA)
        root = tmp_path / "data"
        with pytest.raises(ChecksumError) as info:
            download.download_dataset(spec, root)
    text = str(info.value)
    assert GOOD_SHA in text and hashlib.sha256(bytes(corrupted)).hexdigest() in text
    assert first.url("/toy.zip") in text and mirror.url("/toy.zip") in text  # every source and its reason
    assert "certificate has expired" in text and f"data root: {root}" in text and "copy toy.zip by hand" in text
    assert not (root / "toy").exists() and _leftovers(root) == []


def test_insecure_tls_option_accepts_the_expired_host_for_a_pinned_hash_only(tmp_path, network, capsys):
    expired_cert, expired_key, _, _, _ = network
    with _Server({"/toy.zip": GOOD_ZIP}, expired_cert, expired_key) as first, _Server({}) as empty_mirror:
        pinned = _spec(first.url("/toy.zip"), empty_mirror.url("/toy.zip"), GOOD_SHA)
        root = tmp_path / "data"
        report = download.download_dataset(pinned, root, insecure_tls_if_hash_pinned=True)
        err = capsys.readouterr().err
        assert report.ok and (root / "toy" / "ratings.txt").read_bytes() == RATINGS
        assert "WARNING" in err and "WITHOUT certificate checks" in err and GOOD_SHA in err

        # Without a pinned hash the option does not apply: the expired host stays refused,
        # and the mirror is not used either (a mirror is only trusted through a pinned hash).
        unpinned = _spec(first.url("/toy.zip"), empty_mirror.url("/toy.zip"), None)
        other = tmp_path / "other"
        report = download.download_dataset(unpinned, other, insecure_tls_if_hash_pinned=True)
    assert not report.ok and "certificate has expired" in report.failed[0]
    assert "only used for files whose sha256 is pinned" in report.failed[0]
    assert not (other / "toy").exists() and _leftovers(other) == []


def test_every_source_failing_names_each_source_the_root_and_the_manual_steps(tmp_path, network):
    expired_cert, expired_key, _, _, _ = network
    with _Server({"/toy.zip": GOOD_ZIP}, expired_cert, expired_key) as first, _Server({}) as missing_mirror:
        spec = _spec(first.url("/toy.zip"), missing_mirror.url("/toy.zip"), GOOD_SHA)
        root = tmp_path / "data"
        with pytest.raises(MissingDataError) as info:
            download.resolve_file(spec, "ratings.txt", root)
        with pytest.raises(AllSourcesFailedError) as direct:
            download.download_archive(spec, root)
    text = str(info.value)
    assert "certificate has expired" in text and "HTTP 404" in text
    assert first.url("/toy.zip") in text and missing_mirror.url("/toy.zip") in text
    assert f"data root: {root}" in text and "copy toy.zip by hand" in text and "--insecure-tls-if-hash-pinned" in text
    assert [f.source.mirror for f in direct.value.failures] == [False, True]
    assert not (root / "toy").exists() and _leftovers(root) == []


def test_extracted_member_with_a_pinned_hash_is_checked(tmp_path, network):
    # The archive's hash is accepted (pinned), but a member differs from its pinned hash.
    with _Server({"/toy.zip": GOOD_ZIP}) as first:
        spec = _spec(first.url("/toy.zip"), first.url("/absent.zip"), GOOD_SHA, ratings_sha="0" * 64)
        root = tmp_path / "data"
        with pytest.raises(ChecksumError, match="ratings.txt"):
            download.download_dataset(spec, root)
    assert not (root / "toy").exists() and _leftovers(root) == []


def test_doctor_runs_offline_and_prints_its_table(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(doctor, "probe", lambda *a, **k: pytest.fail("must not probe offline"))
    monkeypatch.setenv("FEDLIB_OFFLINE", "1")  # automatic offline detection, no flag
    (tmp_path / "ml-100k").mkdir()
    (tmp_path / "ml-100k" / "u.data").write_bytes(b"1\t1\t5\t1\n")
    assert data_cli.main(["doctor", "--root", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "network: not probed (FEDLIB_OFFLINE=1)" in out
    header = next(line for line in out.splitlines() if line.startswith("dataset"))
    assert all(word in header for word in ("status", "present", "missing", "sources", "used by lessons", "offline"))
    ml100k = next(line for line in out.splitlines() if line.startswith("ml-100k "))
    assert "1/21" in ml100k and "20 (20 by script)" in ml100k and "00_fedrec_from_scratch" in ml100k
    ml1m = next(line for line in out.splitlines() if line.startswith("ml-1m "))
    assert "needs download" in ml1m and "03_fedkdrec" in ml1m and "not probed (offline)" in ml1m
    assert "ml-1m: 01_fedrkg, 03_fedkdrec" in out


def test_doctor_online_probes_sources_and_stops_at_an_unreachable_network(tmp_path, monkeypatch, capsys):
    calls = []

    def fake_probe(url, timeout=doctor.PROBE_TIMEOUT_S):
        calls.append(url)
        return (False, "host name not resolved (no network)") if len(calls) == 2 else (True, "HTTP 200")

    monkeypatch.delenv("FEDLIB_OFFLINE", raising=False)
    monkeypatch.setattr(doctor, "probe", fake_probe)
    assert data_cli.main(["doctor", "--root", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert len(calls) == 2  # the second source was unreachable: nothing else was probed
    assert "network: unreachable" in out and "answers (HTTP 200)" in out and "FAILS (host name not resolved" in out
