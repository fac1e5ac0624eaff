"""The dataset registry: one entry per dataset id, in one place.

A :class:`~fedlib.data.specs.DatasetSpec` says everything the rest of the data layer needs to know about a
dataset without touching the disk: which raw files make it up (relative paths under the
data root, with the sha256 and byte size of the reference copy), which files each loader
variant needs, where the files can be downloaded (or how to fetch them by hand), the
licence, and which parser turns them into a tidy frame.

The checksums were read once from the shared data collection's ``manifest.json`` and are
written here as literals, so the registry works on a machine that only has downloaded
copies. A file whose checksum is ``None`` is one the reference collection does not hold
(too large to collect); its hash is recorded the first time it is seen (see
:mod:`fedlib.data.download`).

Status vocabulary (``DatasetSpec.status`` and :func:`DatasetSpec.status_for`):

* ``complete``      every registered file present, original data;
* ``partial``       the data can be (partly) loaded but registered files are missing;
* ``processed``     only a third party's processed copy exists (re-indexed, filtered);
* ``substitute``    a processed copy that stands in for data a paper used but that differs
                    from it (other filtering, other split, missing domain or side data);
* ``metadata-only`` only item/user metadata, no interactions;
* ``missing``       nothing present.
"""
from __future__ import annotations

import dataclasses
from typing import Dict, Iterable, Tuple

from fedlib.data.errors import UnknownDatasetError
# The entry types live in fedlib.data.specs; the registry is where the rest of the library finds them.
from fedlib.data.specs import (COMPRESSION_SUFFIXES, INTERACTION_ROLES, STATUSES, ArchiveSpec, DatasetSpec,  # noqa: F401
                               FileSpec, VariantSpec)


# ----------------------------------------------------------------------------------------
# Helpers to keep the literal tables below short.
# ----------------------------------------------------------------------------------------

def _files(rows, role_of, **common) -> Tuple[FileSpec, ...]:
    """Build FileSpecs from ``(path, sha256, size, compression)`` rows; ``role_of(path)``."""
    out = []
    for path, sha, size, compression in rows:
        out.append(FileSpec(path=path, sha256=sha, size=size, role=role_of(path), compression=compression, **common))
    return tuple(out)


def _raw_github(repo: str, commit: str, path: str) -> str:
    """A pinned raw-file URL; pinned to a commit so the bytes cannot change under us."""
    return f"https://raw.githubusercontent.com/{repo}/{commit}/{path}"


def _mirrored(files: Iterable[FileSpec], repo: str, commit: str, source_dir: str, local_dir: str) -> Tuple[FileSpec, ...]:
    """Give each file with a known hash a pinned GitHub URL (``local_dir/x`` <- ``source_dir/x``)."""
    out = []
    for f in files:
        if f.sha256 is None:
            out.append(f)
            continue
        tail = f.path[len(local_dir) + 1:]
        out.append(dataclasses.replace(f, urls=(_raw_github(repo, commit, f"{source_dir}/{tail}"),)))
    return tuple(out)


_GROUPLENS_LICENCE = (
    "GroupLens MovieLens usage licence (README): research use only; acknowledge/cite "
    "Harper & Konstan 2015; no endorsement; no redistribution without separate permission; "
    "no commercial use without permission."
)
_AMAZON_LICENCE = (
    "Amazon review data (McAuley et al.): research use; cite McAuley et al. (SIGIR 2015) / "
    "He & McAuley (WWW 2016) for the 2014 data, Ni, Li & McAuley (EMNLP 2019) for 2018."
)
_ARCHIVE_MANUAL = (
    "On a machine with network access download {url} , unzip it and copy the files so that "
    "they sit in {{root}}/{dir}/ (for example {{root}}/{dir}/{example}). Then set "
    "FEDLIB_DATA={{root}} on the machine that runs fedlib."
)
_C2DSR_DRIVE = "https://drive.google.com/drive/folders/1xpnp6tH56xz8PF_xuTi9exEptmcvlAVU"
_MOVIELENS_COPY = (
    " A byte-identical copy of the MovieLens zips (compared by SHA-256 in recommenders-team/recommenders pull "
    "request #2369) is published at https://huggingface.co/datasets/Recommenders/MovieLens ."
)


# ----------------------------------------------------------------------------------------
# MovieLens
# ----------------------------------------------------------------------------------------

_ML100K_SPLITS = ("u1", "u2", "u3", "u4", "u5", "ua", "ub")

_ML100K = DatasetSpec(
    id="ml-100k",
    title="MovieLens 100K",
    status="complete",
    full_status="complete",
    files=_files(
        [
            ("ml-100k/README", "4883b8cf340ed0059971b33f56ad3adc88a40792108ebca3d24aafc4c82e8b52", 6750, None),
            ("ml-100k/u.data", "06416e597f82b7342361e41163890c81036900f418ad91315590814211dca490", 1979173, None),
            ("ml-100k/u.genre", "9757e0d3e6b298159a80dd48eaf938114690e911e39af97a76949ef1663610bb", 202, None),
            ("ml-100k/u.info", "5b0a40b2e47a729ee6203063f6dcf8790c2e63f5a18663e6ee318a72c5f3c27b", 36, None),
            ("ml-100k/u.item", "553841ebc7de3a0fd0d6b62a204ea30c1e651aacfb2814c7a6584ac52f2c5701", 236344, None),
            ("ml-100k/u.occupation", "cd5fbec9afe345d993a62fc7817df1a4a9079c4feb267b3118763b8fd942137d", 193, None),
            ("ml-100k/u.user", "f120e114da2e8cf314fd28f99417c94ae9ddf1cb6db8ce0e4b5995d40e90e62c", 22628, None),
            ("ml-100k/u1.base.xz", "ad412a563365eda728e5e5ba029fabaa10462ef2f6811d9755a9ed2ef142852c", 308696, "xz"),
            ("ml-100k/u1.test.xz", "0d36bab152a0e618336a66f84167b78b6c45fdd50adec91184af7e135e7a9b07", 84744, "xz"),
            ("ml-100k/u2.base.xz", "a3be78664bd5ba78facd57d9cf0dd1b713d6d303e00ff1cb143654e0e1c6138f", 305584, "xz"),
            ("ml-100k/u2.test.xz", "dc2b595d63874afd15492be2cc9bd8301fd5b3ca9a8a843908594e501a5067ea", 88024, "xz"),
            ("ml-100k/u3.base.xz", "51e7d018ae115cf677391af2775bd315a054574c7b393581c135c5b31a35992e", 307676, "xz"),
            ("ml-100k/u3.test.xz", "0774ca389bd1e3dfd42dd9e3bf40de630b86cb6360430d7b53c97a1c38340db8", 89544, "xz"),
            ("ml-100k/u4.base.xz", "8f49cba7008bdb7118125a902f83de434e09dba3803b41cab7ccbe06a31d24dc", 305888, "xz"),
            ("ml-100k/u4.test.xz", "d6ea30d080c663817726c4695ade50d8d39fd626966c969e5ef0c398a644e368", 89312, "xz"),
            ("ml-100k/u5.base.xz", "1ef5237ea6e0935c36af94f24acedd60473e752be84ebf6e18059b60e7083ee9", 305324, "xz"),
            ("ml-100k/u5.test.xz", "90244125650830dbdb7cd17d9a08e99de281e6efef853b762de012651b81b1ab", 88856, "xz"),
            ("ml-100k/ua.base.xz", "0a43b1915f698ddf1c10d564fa795445dede5e9605124277d8697a7454b03110", 339644, "xz"),
            ("ml-100k/ua.test.xz", "c7857a38fda5a6e5ef539057625bbad08a7387a6f437920b9695ba51852b34ed", 45540, "xz"),
            ("ml-100k/ub.base.xz", "0dcadc7a10526f393f3f7464364fae43bcbb2aac30dcf85dcc304b6a05aa4902", 340268, "xz"),
            ("ml-100k/ub.test.xz", "470b72167f75592afc6609735eccc365fc00eb0bfb49204db28479c98ad7d3d9", 45424, "xz"),
        ],
        lambda p: "interactions" if p.endswith("u.data") else ("split" if ".base" in p or ".test" in p
                                                               else ("docs" if p.endswith(("README", "u.info")) else "metadata")),
    ),
    variants=(
        VariantSpec(None, "all 100,000 ratings of u.data, file order", ("ml-100k/u.data",)),
        *(
            VariantSpec(s, f"GroupLens split {s}: {s}.base rows (split=train) then {s}.test rows (split=test)",
                        (f"ml-100k/{s}.base", f"ml-100k/{s}.test"))
            for s in _ML100K_SPLITS
        ),
    ),
    url="https://files.grouplens.org/datasets/movielens/ml-100k.zip",
    # The archive hash and size as published in NVIDIA/accelerated-computing-hub PR #273; the
    # members shared with the reference copy (u.data, u.item, ...) are also checked one by one.
    archive=ArchiveSpec("https://files.grouplens.org/datasets/movielens/ml-100k.zip",
                        sha256="50d2a982c66986937beb9ffb3aa76efe955bf3d5c6b761f4e3a7cd717c6a3229", size=4924029,
                        hash_source="github.com/NVIDIA/accelerated-computing-hub pull request #273"),
    manual=_ARCHIVE_MANUAL.format(url="https://files.grouplens.org/datasets/movielens/ml-100k.zip",
                                  dir="ml-100k", example="u.data") + _MOVIELENS_COPY,
    licence=_GROUPLENS_LICENCE,
    licence_short="GroupLens: research only, no redistribution",
    parser="load_movielens_100k",
    provenance="github.com/ChristianGWalsh/ml-100k @ e49256c12c465d88e5ca5c49a97719035f8bcea1 (unmodified originals; "
               "u1-u5/ua/ub stored xz-compressed)",
    figures="u.data: 100,000 ratings, 943 users, 1,682 items, ratings 1-5, timestamps 1997-09-20 to 1998-04-23; "
            "u1-u5 80,000/20,000, ua/ub 90,570/9,430",
)

_ML_LATEST_SMALL = DatasetSpec(
    id="ml-latest-small",
    title="MovieLens latest-small (2018)",
    status="complete",
    full_status="complete",
    files=_files(
        [
            ("ml-latest-small/README.txt", "63d22ac138e80fae37021797ed8e1b9424b5239dc576a137422adf783ae3f404", 8342, None),
            ("ml-latest-small/links.csv", "97ad18e4e56a09363c65676b6cb3482ce3e2cea2372a24620c1599c843325f31", 197979, None),
            ("ml-latest-small/movies.csv", "5a5f32dd9bb3797b8e728a1b98958789d2b13f294a69fdfbc5727f8a9611aa07", 494431, None),
            ("ml-latest-small/ratings.csv", "aa289ca83157595d0df6aea1be6a4ded676ddc4385472e8313a8ed9805352646", 2483723, None),
            ("ml-latest-small/tags.csv", "92a9f8bb7916dceef6151209845788c3643f794dfa79d1feaec7121b5960399d", 118660, None),
        ],
        lambda p: "interactions" if p.endswith("ratings.csv") else ("docs" if p.endswith("README.txt") else "metadata"),
    ),
    variants=(VariantSpec(None, "all 100,836 ratings of ratings.csv, file order", ("ml-latest-small/ratings.csv",)),),
    url="https://files.grouplens.org/datasets/movielens/ml-latest-small.zip",
    archive=ArchiveSpec("https://files.grouplens.org/datasets/movielens/ml-latest-small.zip"),
    manual=_ARCHIVE_MANUAL.format(url="https://files.grouplens.org/datasets/movielens/ml-latest-small.zip",
                                  dir="ml-latest-small", example="ratings.csv"),
    licence="GroupLens licence (README.txt): research use; redistribution (also transformed) only under the same "
            "licence conditions; no commercial use without permission; cite Harper & Konstan 2015.",
    licence_short="GroupLens: research only, same-licence redistribution",
    parser="load_movielens_latest_small",
    provenance="github.com/allegrastrippoli/recommender @ e3a2667e8d66c15ad15f4910ec78d22d0bd9f065 (first commit; "
               "later commits rewrote user ids)",
    figures="100,836 ratings, 610 users, 9,724 rated movies, half-star ratings 0.5-5.0, 1996-03-29 to 2018-09-24",
)

_ML_1M = DatasetSpec(
    id="ml-1m",
    title="MovieLens 1M",
    status="partial",
    full_status="complete",
    files=(
        *_files(
            [
                ("ml-1m/README", "2d5ddce86ccbd247207456165827b4b9ddf27282bca93807d4c763e28414f133", 5577, None),
                ("ml-1m/movies.dat", "0140fc2356357c1a851d0f52e893a1e4d3696df632c4141cea8d5bc3d621f0b9", 171308, None),
                ("ml-1m/users.dat", "1dc3a95300cb19f7c10e027daf29b8cdf1d908dab65b5edfb45950aa389a10a3", 134368, None),
            ],
            lambda p: "docs" if p.endswith("README") else "metadata",
        ),
        # The full ratings file: no reference copy (24.6 MB), so no hash yet.
        FileSpec("ml-1m/ratings.dat", None, None, "interactions"),
        # A gzip of the first 487,650 rows, kept exactly as found; never part of the archive.
        FileSpec("ml-1m/partial/ratings.dat.gz", "2fedcf5405373a49df4041e3d3fe1e8db9eacf2c77c209ae1f686ea06b7a16d9",
                 2882903, "partial-interactions", compression="gzip", in_archive=False, in_full=False),
    ),
    variants=(VariantSpec(None, "ratings.dat (1,000,209 ratings); the partial copy only with allow_partial=True",
                          ("ml-1m/ratings.dat",)),),
    url="https://files.grouplens.org/datasets/movielens/ml-1m.zip",
    archive=ArchiveSpec("https://files.grouplens.org/datasets/movielens/ml-1m.zip"),
    manual=_ARCHIVE_MANUAL.format(url="https://files.grouplens.org/datasets/movielens/ml-1m.zip",
                                  dir="ml-1m", example="ratings.dat") + _MOVIELENS_COPY,
    licence=_GROUPLENS_LICENCE,
    licence_short="GroupLens: research only, no redistribution",
    parser="load_movielens_1m",
    provenance="github.com/srimatta/movielense @ 785fc9bf32b775a8c1b3c1b19fa0a3e77b3659e8 (metadata); "
               "partial/ratings.dat.gz from github.com/dev-sumanta/dsmlai @ ccdc1fec54b4ab00fe37154ce2a38200c932bf6a",
    figures="canonical 1,000,209 ratings / 6,040 users / 3,706 items; partial copy 487,650 ratings = users 1..2,999, "
            "3,615 items",
    notes=("The reference collection holds only the first 487,650 of 1,000,209 ratings (users 1..2,999); "
           "never report ml-1m results on it.",),
)

_HETREC_ML = DatasetSpec(
    id="hetrec2011-movielens-2k",
    title="HetRec 2011 MovieLens 2K (v2)",
    status="metadata-only",
    full_status="complete",
    files=(
        FileSpec("hetrec2011-movielens-2k/movie_genres.dat",
                 "34f71164882a10041b0c6824526f72b53ed521bd77c070a13a9cba846da0477d", 279996, "metadata",
                 upstream_differs="header line removed in the reference copy"),
        FileSpec("hetrec2011-movielens-2k/movies.dat",
                 "c8c08cb210d6415e79a35d94b192a4a15ac9e4fdf7d1c547b94fdc602d8a76ba", 2835962, "metadata",
                 upstream_differs="header line removed in the reference copy"),
        FileSpec("hetrec2011-movielens-2k/readme.txt",
                 "fa5a69643a936323159beaa9e08b1b0e9635bf3e339ed55571470acb7ecd68b9", 8105, "docs"),
        FileSpec("hetrec2011-movielens-2k/user_ratedmovies-timestamps.dat", None, None, "interactions"),
        FileSpec("hetrec2011-movielens-2k/user_ratedmovies.dat", None, None, "interactions"),
    ),
    variants=(VariantSpec(None, "user_ratedmovies-timestamps.dat (855,598 ratings, ms timestamps -> s)",
                          ("hetrec2011-movielens-2k/user_ratedmovies-timestamps.dat",)),),
    url="https://files.grouplens.org/datasets/hetrec2011/hetrec2011-movielens-2k-v2.zip",
    archive=ArchiveSpec("https://files.grouplens.org/datasets/hetrec2011/hetrec2011-movielens-2k-v2.zip"),
    manual=_ARCHIVE_MANUAL.format(url="https://files.grouplens.org/datasets/hetrec2011/hetrec2011-movielens-2k-v2.zip",
                                  dir="hetrec2011-movielens-2k", example="user_ratedmovies-timestamps.dat"),
    licence="readme.txt: distributed with permission of GroupLens; non-commercial use only; also subject to the "
            "MovieLens terms.",
    licence_short="non-commercial; MovieLens terms",
    parser="load_hetrec_movielens",
    provenance="github.com/sliu817/MovieGraphSearch @ fab0bebb06e35618fb68b266030db37aedcdba7c (movies.dat, "
               "movie_genres.dat with header removed, readme.txt)",
    figures="canonical 855,598 ratings / 2,113 users / 10,109 rated movies (10,197 in movies.dat)",
    notes=("The ratings files (user_ratedmovies*.dat, about 20 MB each) are not in the reference collection.",),
)

# ----------------------------------------------------------------------------------------
# Last.fm
# ----------------------------------------------------------------------------------------

_LASTFM = DatasetSpec(
    id="hetrec2011-lastfm-2k",
    title="HetRec 2011 Last.fm 2K",
    status="partial",
    full_status="complete",
    files=(
        FileSpec("hetrec2011-lastfm-2k/artists.dat", "c173881362c6b28551368fecb3c0be5a6a30a6cd859e1f5775413dfe46d48648",
                 1925879, "metadata"),
        FileSpec("hetrec2011-lastfm-2k/readme.txt", "6fe5d1e6f67b025fc50cd70883dd1a1ff16c5ff37b5b7abfb33644b83468b209",
                 4627, "docs"),
        FileSpec("hetrec2011-lastfm-2k/tags.dat", "e95175f259be4c0c47644ae23d66131cd6d5767142a1405000e79f5584691d70",
                 234468, "metadata"),
        FileSpec("hetrec2011-lastfm-2k/user_artists.dat",
                 "001400dc3c7d2667fca6e4ea6dc6acc31a9dd28ad5cd0f74cea988c019934d3b", 1296455, "interactions"),
        FileSpec("hetrec2011-lastfm-2k/user_friends.dat",
                 "9a3a8f7fa5f5ec832335e5b58ed69a4cf27c6f6f6afcde62134810eea46445a7", 251565, "metadata"),
        FileSpec("hetrec2011-lastfm-2k/user_taggedartists.dat",
                 "c4a9ffae9ab47a9f9b2f0678ab1f7e5c1db4ca818837d8cddd1f5699c5bbf048", 4180216, "interactions",
                 upstream_differs="reference copy has LF line endings; the official zip presumably CRLF"),
        FileSpec("hetrec2011-lastfm-2k/user_taggedartists-timestamps.dat", None, None, "timestamps"),
    ),
    variants=(
        VariantSpec("listens",
                    "user_artists.dat: (user, artist, listening count as rating); timestamp = first tag time of the "
                    "pair, -1 for pairs the user never tagged",
                    ("hetrec2011-lastfm-2k/user_artists.dat",),
                    ("hetrec2011-lastfm-2k/user_taggedartists-timestamps.dat",
                     "hetrec2011-lastfm-2k/user_taggedartists.dat")),
        VariantSpec("tagged",
                    "user_taggedartists: one row per (user, artist) pair the user tagged, rating 1.0, timestamp = first "
                    "tag time of the pair; every row has a time",
                    ("hetrec2011-lastfm-2k/user_taggedartists.dat",),
                    ("hetrec2011-lastfm-2k/user_taggedartists-timestamps.dat",)),
        VariantSpec("tag_assignments",
                    "every tag assignment (186,479 rows), rating 1.0, timestamp = tag time, extra column 'tag'",
                    ("hetrec2011-lastfm-2k/user_taggedartists.dat",),
                    ("hetrec2011-lastfm-2k/user_taggedartists-timestamps.dat",)),
    ),
    default_variant="listens",
    url="https://files.grouplens.org/datasets/hetrec2011/hetrec2011-lastfm-2k.zip",
    archive=ArchiveSpec("https://files.grouplens.org/datasets/hetrec2011/hetrec2011-lastfm-2k.zip"),
    manual=_ARCHIVE_MANUAL.format(url="https://files.grouplens.org/datasets/hetrec2011/hetrec2011-lastfm-2k.zip",
                                  dir="hetrec2011-lastfm-2k", example="user_taggedartists-timestamps.dat"),
    licence="readme.txt: non-commercial use; commercial use needs Last.fm's permission; cite Last.fm and the "
            "HetRec'11 workshop (Cantador et al., RecSys 2011).",
    licence_short="non-commercial; cite Last.fm + HetRec'11",
    parser="load_lastfm",
    provenance="github.com/DarakhTech/lastfm-dataset @ 1763b7b633092d6d250ad6661ce2a66bb94562bd (first upload); "
               "user_taggedartists.dat from github.com/Coder-Yu/QRec @ 734bcdb59796020fa0f0825ef8ae85703c774967",
    figures="user_artists 92,834 rows / 1,892 users / 17,632 artists; user_taggedartists 186,479 rows / 1,892 users / "
            "12,523 artists, years 1956-2011",
    notes=("user_taggedartists-timestamps.dat is not in the reference collection; its times are Madrid local "
           "midnight of the day/month/year given in user_taggedartists.dat.",),
)

# ----------------------------------------------------------------------------------------
# FilmTrust and the FedRKG-processed Amazon Video
# ----------------------------------------------------------------------------------------

_FILMTRUST = DatasetSpec(
    id="filmtrust",
    title="FilmTrust",
    status="complete",
    full_status="complete",
    files=(
        *_mirrored(
            _files(
                [
                    ("filmtrust/ratings.txt", "241167424e24d588e8871d68641e94ead98d5b3a4f0db01ef3181a74ad35e7a1", 376445, None),
                    ("filmtrust/readme.txt", "8790048bef340f52a8e2abf40e8f7bff59aba4e37cb5dc3efdae3efd46922041", 615, None),
                    ("filmtrust/trust.txt", "64573a033add72b988a0fb140fdbc0ad3464cb9821f940007aff6fda44b09603", 19611, None),
                ],
                lambda p: {"ratings.txt": "interactions", "readme.txt": "docs"}.get(p.rsplit("/", 1)[1], "metadata"),
            ),
            "Coder-Yu/QRec", "a141bb37cb7706b2f53b2eed5843de3269f9f37f", "dataset/FilmTrust", "filmtrust",
        ),
        FileSpec("filmtrust/fedrkg/ratings.dat", "a2cad0f0adf435cf50484f54a86641f4acbf7128115f7c5bd3cd6f25c69d4585",
                 529703, "interactions", in_archive=False,
                 urls=(_raw_github("Jaehyung-Lim/fedrkg", "bfab01e5c8513a408a5332014c02b47aef1cfb9b",
                                   "data/filmtrust/ratings.dat"),)),
    ),
    variants=(
        VariantSpec("raw", "LibRec ratings.txt: 35,497 ratings 0.5-4.0, no timestamps (-1)", ("filmtrust/ratings.txt",)),
        VariantSpec("fedrkg", "FedRKG's processed ratings.dat: users with >= 10 ratings, ids re-indexed from 0, "
                              "FABRICATED timestamps (item first-appearance rank)", ("filmtrust/fedrkg/ratings.dat",)),
    ),
    default_variant="raw",
    url="https://guoguibing.github.io/librec/datasets/filmtrust.zip",
    archive=ArchiveSpec("https://guoguibing.github.io/librec/datasets/filmtrust.zip"),
    licence="No formal licence; readme.txt asks users to cite Guo, Zhang & Yorke-Smith, IJCAI 2013.",
    licence_short="no formal licence; cite Guo et al. 2013",
    parser="load_filmtrust",
    provenance="github.com/Coder-Yu/QRec @ a141bb37cb7706b2f53b2eed5843de3269f9f37f dataset/FilmTrust; fedrkg/ratings.dat "
               "from github.com/Jaehyung-Lim/fedrkg @ bfab01e5c8513a408a5332014c02b47aef1cfb9b data/filmtrust/ratings.dat",
    figures="ratings.txt 35,497 rows / 1,508 users / 2,071 items, ratings 0.5-4.0; trust.txt 1,853 links; "
            "fedrkg/ratings.dat 34,889 rows / 1,227 users / 2,059 items",
)

_AMAZON_VIDEO = DatasetSpec(
    id="amazon-video",
    title="Amazon Video (FedRKG-processed)",
    status="processed",
    full_status="processed",
    files=(
        FileSpec("amazon-video/ratings.dat", "82eb5856b173e8f52a93521b33a402429f81aa92645fdbb7bae6b78316738ba0", 555978,
                 "interactions",
                 urls=(_raw_github("Jaehyung-Lim/fedrkg", "bfab01e5c8513a408a5332014c02b47aef1cfb9b",
                                   "data/video/ratings.dat"),)),
    ),
    variants=(VariantSpec(None, "FedRKG's ratings.dat: 23,181 ratings 1-5 with real timestamps", ("amazon-video/ratings.dat",)),),
    url="https://cseweb.ucsd.edu/~jmcauley/datasets/amazon/links.html",
    licence=_AMAZON_LICENCE,
    licence_short="Amazon reviews: research use, cite McAuley et al.",
    parser="load_amazon_video",
    provenance="github.com/Jaehyung-Lim/fedrkg @ bfab01e5c8513a408a5332014c02b47aef1cfb9b data/video/ratings.dat",
    figures="23,181 ratings / 1,372 users / 7,957 items, ratings 1-5, 2000-08-26 to 2014-07-23",
    notes=("Processed by FedRKG: users with >= 10 ratings kept and ids re-indexed; the raw 'amazon.edges' input is not "
           "available. The time range suggests the 2014 'Amazon Instant Video' dump (not stated by FedRKG).",),
)

_INDUSTRIAL_URLS = (
    "https://mcauleylab.ucsd.edu/public_datasets/data/amazon_v2/categoryFilesSmall/Industrial_and_Scientific_5.json.gz",
    "https://jmcauley.ucsd.edu/data/amazon_v2/categoryFilesSmall/Industrial_and_Scientific_5.json.gz",
    "https://datarepo.eng.ucsd.edu/mcauley_group/data/amazon_v2/categoryFilesSmall/Industrial_and_Scientific_5.json.gz",
)

_AMAZON_INDUSTRIAL = DatasetSpec(
    id="amazon-industrial",
    title="Amazon 2018 Industrial and Scientific (5-core)",
    status="missing",
    full_status="complete",
    files=(
        # No reference copy, so no hash: the direct URLs are tried and the first download's
        # hash is recorded (trust on first use).
        FileSpec("amazon-industrial/Industrial_and_Scientific_5.json.gz", None, None, "interactions",
                 compression="gzip", in_archive=False, in_full=True, urls=_INDUSTRIAL_URLS),
    ),
    variants=(VariantSpec(None, "5-core reviews: reviewerID, asin, overall, unixReviewTime (77,071 rows expected)",
                          ("amazon-industrial/Industrial_and_Scientific_5.json.gz",)),),
    url="https://nijianmo.github.io/amazon/index.html",
    manual=("Open https://nijianmo.github.io/amazon/index.html , section 'Small subsets for experimentation', row "
            "'Industrial and Scientific', link '5-core' (file Industrial_and_Scientific_5.json.gz, 77,071 reviews). "
            "Do not decompress it; save it as {root}/amazon-industrial/Industrial_and_Scientific_5.json.gz . "
            "Direct links: " + " , ".join(_INDUSTRIAL_URLS)),
    licence="Amazon review data 2018: research use; cite Ni, Li & McAuley, EMNLP 2019.",
    licence_short="Amazon 2018: research use, cite Ni et al.",
    parser="load_amazon_industrial",
    figures="canonical 5-core: 77,071 reviews / 11,041 users / 5,334 items",
)

# ----------------------------------------------------------------------------------------
# C2DSR cross-domain sequences
# ----------------------------------------------------------------------------------------

_FEDCSR_COMMIT = "0f07854cb7233bd14ded0e3a5599b664545468d3"


def _c2dsr_manual(dataset_id: str, drive_folder: str) -> str:
    return (
        f"The C2DSR 'corrected' datasets are on Google Drive (linked from the README of "
        f"https://github.com/cjx96/C2DSR ): open {_C2DSR_DRIVE} , open the entry '{drive_folder}' "
        f"(a folder, or a zip file of that name), download traindata_new.txt (and any of Alist.txt, Blist.txt, "
        f"userlist.txt, validdata_new.txt, testdata_new.txt that is missing) and put them, unrenamed and "
        f"uncompressed, in {{root}}/{dataset_id}/ (e.g. {{root}}/{dataset_id}/traindata_new.txt)."
    )


def _c2dsr_spec(dataset_id: str, folder: str, title: str, rows, figures: str) -> DatasetSpec:
    role = {"Alist.txt": "item-list", "Blist.txt": "item-list", "userlist.txt": "metadata"}
    present = _files(rows, lambda p: role.get(p.rsplit("/", 1)[1], "sequences"), in_archive=False)
    return DatasetSpec(
        id=dataset_id,
        title=title,
        status="partial",
        full_status="complete",
        files=(
            *_mirrored(present, "zhengdongyi-sysu/FedCSR", _FEDCSR_COMMIT, f"dataset/{folder}", dataset_id),
            FileSpec(f"{dataset_id}/traindata_new.txt", None, None, "sequences", in_archive=False),
        ),
        variants=(VariantSpec(None, "load_sequences: train (if present) / valid / test sequences",
                              (f"{dataset_id}/Alist.txt", f"{dataset_id}/Blist.txt",
                               f"{dataset_id}/validdata_new.txt", f"{dataset_id}/testdata_new.txt"),
                              (f"{dataset_id}/traindata_new.txt",)),),
        url=_C2DSR_DRIVE,
        manual=_c2dsr_manual(dataset_id, folder),
        licence="Derived from the Amazon review data (research use); cite McAuley et al. and Cao et al., CIKM 2022 "
                "(C2DSR).",
        licence_short="Amazon-derived: research use, cite C2DSR",
        parser="load_c2dsr_sequences",
        kind="sequences",
        provenance=f"github.com/zhengdongyi-sysu/FedCSR @ {_FEDCSR_COMMIT} dataset/{folder}/",
        figures=figures,
        notes=("traindata_new.txt (4 MiB or more in every copy found) is not in the reference collection.",),
    )


_C2DSR_FOOD_KITCHEN = _c2dsr_spec(
    "c2dsr-food-kitchen", "Food-Kitchen", "C2DSR Food-Kitchen (Amazon cross-domain sequences)",
    [
        ("c2dsr-food-kitchen/Alist.txt", "6961a3420ab9345d967991d5940737a549339ff65b36c3da4cfa619c07dbfc7b", 649954, None),
        ("c2dsr-food-kitchen/Blist.txt", "6dd8c154773fdd2a63f3d7d4938a51be9180eda07f4092f2f69798fae9975e2b", 792521, None),
        ("c2dsr-food-kitchen/testdata_new.txt", "a5bbf914f862cf25552eb28cc07ede1ca5db6c66e61421de7ace7e114cd8df9d", 3205198, None),
        ("c2dsr-food-kitchen/userlist.txt", "9f9c85ce351c6fc0821a164d36c3ef1a6cffb20ccaaa25e56f3101eb42d6954f", 332699, None),
        ("c2dsr-food-kitchen/validdata_new.txt", "119222e24c6446231fd5d91d44bfc103ce7a445395a4ebc4e54be6c52a31135c", 3114696, None),
    ],
    "16,579 users; 29,207 Food (A) / 34,886 Kitchen (B) items; valid 8,173 / test 8,406 sequences "
    "(FedCSR Table 1: 34,117 train)",
)

_C2DSR_MOVIE_BOOK = _c2dsr_spec(
    "c2dsr-movie-book", "Movie-Book", "C2DSR Movie-Book (Amazon cross-domain sequences)",
    [
        ("c2dsr-movie-book/Alist.txt", "65b797e8c3db2751c0f715a68a055b94d1989f8261d1c08c0e2b07f54f615cc5", 825380, None),
        ("c2dsr-movie-book/Blist.txt", "f716f02f99d5753cb62da913e774c6c1d75210adcb7867ac054a330a29bb6228", 1492627, None),
        ("c2dsr-movie-book/testdata_new.txt", "a8cab476ee18c3ed5ae84b0884ee31a90cde936932e4429986ed75bfd9f60ae8", 2892405, None),
        ("c2dsr-movie-book/userlist.txt", "9e0c5cf26a143d3af9e2fa03310ab67efb994fec28ece66d3ecbdea2942d87fb", 307380, None),
        ("c2dsr-movie-book/validdata_new.txt", "4bb3257825d5e970e686b152ae7e149c16f7ebc87481d312492511b9a5cbd803", 2844281, None),
    ],
    "15,352 users; 36,845 Movie (A) / 63,937 Book (B) items; valid 7,644 / test 7,708 sequences "
    "(FedCSR Table 1: 58,515 train)",
)

_C2DSR_EE_COMMIT = "fc35340bae4486767a3856a8f0794247511d2bb5"
_C2DSR_ENT_EDU = DatasetSpec(
    id="c2dsr-entertainment-education",
    title="C2DSR Entertainment-Education",
    status="metadata-only",
    full_status="complete",
    files=(
        *_mirrored(
            _files(
                [
                    ("c2dsr-entertainment-education/items_x.txt",
                     "bbadca3fdd7cd8b27e1071fabea59482272e41f6f8c843e7b48039702c644294", 130549, None),
                    ("c2dsr-entertainment-education/items_y.txt",
                     "a98858bfe5262f9ab0be425eab36d09b0f312715834588a8658c9a2aa1eff4ff", 206960, None),
                ],
                lambda p: "item-list", in_archive=False, in_full=False,
            ),
            "crystal22/C2DSR", _C2DSR_EE_COMMIT, "data/raw/Entertainment-Education", "c2dsr-entertainment-education",
        ),
        *(
            FileSpec(f"c2dsr-entertainment-education/{name}", None, None,
                     "item-list" if name.endswith("list.txt") else "sequences", in_archive=False)
            for name in ("Alist.txt", "Blist.txt", "traindata_new.txt", "validdata_new.txt", "testdata_new.txt")
        ),
    ),
    variants=(VariantSpec(None, "load_sequences: train / valid / test sequences",
                          ("c2dsr-entertainment-education/validdata_new.txt",
                           "c2dsr-entertainment-education/testdata_new.txt"),
                          ("c2dsr-entertainment-education/traindata_new.txt",
                           "c2dsr-entertainment-education/Alist.txt", "c2dsr-entertainment-education/Blist.txt")),),
    url=_C2DSR_DRIVE,
    manual=_c2dsr_manual("c2dsr-entertainment-education", "Entertainment-Education"),
    licence="Unknown; derived from public review data, research use.",
    licence_short="unknown; research use",
    parser="load_c2dsr_sequences",
    kind="sequences",
    provenance=f"github.com/crystal22/C2DSR @ {_C2DSR_EE_COMMIT} data/raw/Entertainment-Education/ (items_x.txt, items_y.txt)",
    figures="items_x.txt 8,367 items (ids 0-8366); items_y.txt 11,404 items (ids 8367-19770)",
    notes=("Only the item lists are in the reference collection (items_x/items_y, probably this dataset's "
           "Alist/Blist); every sequence file is missing.",),
)

# ----------------------------------------------------------------------------------------
# Cross-domain substitutes for FedPCL-CDR
# ----------------------------------------------------------------------------------------

DISENCDR_PAIRS = ("phone_sport", "sport_phone", "phone_electronic", "electronic_phone",
                  "sport_cloth", "cloth_sport", "electronic_cloth", "cloth_electronic")
"""DisenCDR folder names. Folder ``a_b`` holds domain ``a``'s interactions of the users shared by
``a`` and ``b``; folder ``b_a`` holds domain ``b``'s interactions of the same users (same user ids)."""

_DISENCDR_COMMIT = "4e6d60bad4d5185c99ab60423b48f87f88aa03a3"
_DISENCDR_ROWS = [
    ("amazon-cdr-disencdr/cloth_electronic/test.txt", "0b604b69d3eb531bf99a11e2322f247694f7a593905e0c0c04c54e2a58fb0f78", 161965, None),
    ("amazon-cdr-disencdr/cloth_electronic/test_original.txt", "ab4c404114d7d641edfa1f5759ec1aae9b0cc5eb55c4d5ea61437c43c96b1800", 204562, None),
    ("amazon-cdr-disencdr/cloth_electronic/train.txt", "678124e0dbf8d162041f8b656bd5e89ee2a678df2c85812f94fd7c0bd2062f6f", 1569278, None),
    ("amazon-cdr-disencdr/cloth_sport/test.txt", "0d034810261027b080d506399426d3eb4f26b4b90a121fe79ebaef246a82b1bd", 93917, None),
    ("amazon-cdr-disencdr/cloth_sport/test_original.txt", "1e35975cd187d2d69a52cd6ae14f1ce8845ad0cba897ca65481e74c3ca487ff2", 124110, None),
    ("amazon-cdr-disencdr/cloth_sport/train.txt", "3e039ec9baff975cb47722c4704f7d2103c2bbf2a3c30ed2d264e17b69d4fd0a", 1097669, None),
    ("amazon-cdr-disencdr/electronic_cloth/test.txt", "1a1a5ce75f986052afc05337ea5d1e5ac44c7017f06f1ecc5ccadb523aadf08d", 181464, None),
    ("amazon-cdr-disencdr/electronic_cloth/test_original.txt", "1db273571bb0e59f7d595c682d4074e9f976bcaf2fe21e15c4623bc16bc14686", 206892, None),
    ("amazon-cdr-disencdr/electronic_cloth/train.txt", "fbccec759f2acfec35927c07a1a4bd911f75106de34d6b21e7d7a8a7ffc68e81", 2711201, None),
    ("amazon-cdr-disencdr/electronic_phone/test.txt", "322a8e4c7b5d10e2a3d91dbb2d7833eaf2ba684f4c5109dc1ea4e6ee08119c46", 31982, None),
    ("amazon-cdr-disencdr/electronic_phone/test_original.txt", "b513255035eb30808e9cc396b180f48df7e6bbd6726ed7415c00f0aab78ba565", 41498, None),
    ("amazon-cdr-disencdr/electronic_phone/train.txt", "cb09610ab143478097937c235c4932fe39b5c664d434dd5abba3c5eb5d75f028", 1424620, None),
    ("amazon-cdr-disencdr/phone_electronic/test.txt", "a3d0d2fb03c25994c3509af3acc6eeca5009b00751f9b12e28fdf52843a027c6", 31077, None),
    ("amazon-cdr-disencdr/phone_electronic/test_original.txt", "9e7f12e47f649c721bbe4e45e49d59e3b4cf4aecea0f2f45ac007fa188077b65", 40318, None),
    ("amazon-cdr-disencdr/phone_electronic/train.txt", "a439eb3fdf4d08e58da1d86e1f711cf0acf59f28944d347ad4b3fb9454df54f9", 609415, None),
    ("amazon-cdr-disencdr/phone_sport/test.txt", "1665b2846c5011ca870ff79bcfb3cc632aa3eeaa6ea9853ee45549ac0858b444", 48067, None),
    ("amazon-cdr-disencdr/phone_sport/test_original.txt", "17894bfdd8daecda579ca2f454b4a1282187efc52705b731dd16893c44a0abdb", 60073, None),
    ("amazon-cdr-disencdr/phone_sport/train.txt", "d38cd0da5379bbec03a19cc3eb95a8b52caeeb179dfb515ba2d894b1e193572d", 510647, None),
    ("amazon-cdr-disencdr/sport_cloth/test.txt", "7b43d370047f23cbc6862188aba53b3a3241948255584a1f3f5c189118f16490", 103831, None),
    ("amazon-cdr-disencdr/sport_cloth/test_original.txt", "79c4f4ca9e6a694652df32c8eabc73f6b6e62719f9579e89a44210ccb0c2d460", 124070, None),
    ("amazon-cdr-disencdr/sport_cloth/train.txt", "45c517a6fc7721f168411b69eb3f6e6ef896bbe06f599f6f7b4a5844ff925629", 1150235, None),
    ("amazon-cdr-disencdr/sport_phone/test.txt", "5ff3bc25da94612e7a35672edba277c4acc497cc8d87d268bca891e64dc98640", 45250, None),
    ("amazon-cdr-disencdr/sport_phone/test_original.txt", "78cd3e7fa755fc0c7ffe10ab61a20f3626ed81b099dfc633b08e59cf83dcc535", 61239, None),
    ("amazon-cdr-disencdr/sport_phone/train.txt", "c55f3f576465795163f45cdb6df9484626dfbb12799393a7d06e4401cfcb6f3a", 612708, None),
]


def _disencdr_pair_files(pair: str) -> Tuple[str, ...]:
    first, second = pair.split("_")
    reverse = f"{second}_{first}"
    return tuple(f"amazon-cdr-disencdr/{folder}/{name}.txt" for folder in (pair, reverse) for name in ("train", "test"))


_AMAZON_CDR = DatasetSpec(
    id="amazon-cdr-disencdr",
    title="Amazon cross-domain pairs (DisenCDR-processed)",
    status="substitute",
    full_status="substitute",
    files=_mirrored(
        _files(_DISENCDR_ROWS, lambda p: "split", in_archive=False),
        "cjx96/DisenCDR", _DISENCDR_COMMIT, "dataset", "amazon-cdr-disencdr",
    ),
    variants=tuple(
        VariantSpec(pair, f"domains {pair.split('_')[0]} (folder {pair}) + {pair.split('_')[1]} (folder "
                          f"{pair.split('_')[1]}_{pair.split('_')[0]}), shared users, train/test",
                    _disencdr_pair_files(pair))
        for pair in DISENCDR_PAIRS
    ),
    url="https://cseweb.ucsd.edu/~jmcauley/datasets/amazon/links.html",
    licence="Derived from the Amazon review data (research use); the DisenCDR code is licensed separately "
            "and is not used.",
    licence_short="Amazon-derived: research use",
    parser="load_amazon_cdr",
    provenance=f"github.com/cjx96/DisenCDR @ {_DISENCDR_COMMIT} dataset/<pair>/{{train,test,test_original}}.txt",
    figures="train rows/users: phone_sport 42,446/4,998; sport_phone 50,558/4,998; phone_electronic 50,407/3,325; "
            "electronic_phone 115,554/3,325; sport_cloth 92,612/9,928; cloth_sport 87,829/9,928; "
            "electronic_cloth 210,865/15,761; cloth_electronic 121,083/15,761",
    notes=("SUBSTITUTE: DisenCDR's processed Amazon pairs (implicit, re-indexed, no text, no timestamps), not "
           "FedPCL-CDR's own preprocessing (which reads raw ratings_*.csv and review files that are not public "
           "with its code). Same domain pairs, different filtering and split.",),
)

_GADTCDR_COMMIT = "11a1dc6fda5148c8b1ce412ed4e2f0c4f124e2d0"
DOUBAN_DOMAINS = ("book", "music", "movie")

_DOUBAN = DatasetSpec(
    id="douban-gadtcdr",
    title="Douban book/music/movie (GA-DTCDR-processed)",
    status="substitute",
    full_status="substitute",
    files=(
        *_mirrored(
            _files(
                [
                    ("douban-gadtcdr/douban_book/ratings.dat", "cc1c191fabe2e05e95cd6dbe7be19d13ed3e1b27b80be2050e4f6b4e40945ddd", 1116081, None),
                    ("douban-gadtcdr/douban_music/ratings.dat", "40944be25f79e6cf80ab9acf0dca8f4b9b9fe2724a068702294608883ad46775", 811063, None),
                ],
                lambda p: "interactions", in_archive=False,
            ),
            "fengzhu1/GA-DTCDR", _GADTCDR_COMMIT, "Data", "douban-gadtcdr",
        ),
        FileSpec("douban-gadtcdr/douban_movie/ratings.dat", None, None, "interactions", in_archive=False),
    ),
    variants=(
        VariantSpec(None, "book and music (and movie when present), with a domain column; one user id space",
                    ("douban-gadtcdr/douban_book/ratings.dat", "douban-gadtcdr/douban_music/ratings.dat"),
                    ("douban-gadtcdr/douban_movie/ratings.dat",)),
        *(VariantSpec(d, f"douban_{d}/ratings.dat only", (f"douban-gadtcdr/douban_{d}/ratings.dat",)) for d in DOUBAN_DOMAINS),
    ),
    url="https://www.researchgate.net/publication/350793434_Douban_dataset_ratings_item_details_user_profiles_and_reviews",
    manual=("douban_movie/ratings.dat (GA-DTCDR's processed movie ratings, 4 MiB or more) must be fetched by hand: "
            f"open https://github.com/fengzhu1/GA-DTCDR/blob/{_GADTCDR_COMMIT}/Data/douban_movie/ratings.dat , "
            "use 'Download raw file' and save it as {root}/douban-gadtcdr/douban_movie/ratings.dat . "
            "The raw Douban data with reviews (what FedPCL-CDR actually uses) is only on ResearchGate: "
            "https://www.researchgate.net/publication/350793434_Douban_dataset_ratings_item_details_user_profiles_and_reviews "
            "('Download' button, needs a ResearchGate login); fedlib reads it once converted to one CSV per "
            "domain with user_id, item_id, rating, reviews columns, saved as "
            "{root}/fedpcl-cdr/douban_<domain>/<domain>_review_data.csv "
            "(fedlib.data.protocols.fedpcl_cdr.build_original)."),
    licence="Per the GA-DTCDR README: cite Zhu et al. (IJCAI 2020 / CIKM 2019) when using the data.",
    licence_short="cite Zhu et al. (GA-DTCDR)",
    parser="load_douban",
    provenance=f"github.com/fengzhu1/GA-DTCDR @ {_GADTCDR_COMMIT} Data/douban_book/ratings.dat, "
               "Data/douban_music/ratings.dat",
    figures="book 96,041 rows / 2,110 users / 6,777 items; music 69,709 rows / 1,672 users / 5,567 items; "
            "ratings 1-5; user ids share one space (1-2,718)",
    notes=("SUBSTITUTE: GA-DTCDR's processed Douban subsets (user, item, rating; no timestamps, no reviews). "
           "FedPCL-CDR uses the raw Douban data with review text, which is not available here.",),
)

# ----------------------------------------------------------------------------------------
# The registry itself
# ----------------------------------------------------------------------------------------

_SPECS: Dict[str, DatasetSpec] = {
    spec.id: spec
    for spec in (
        _ML100K, _ML_LATEST_SMALL, _ML_1M, _HETREC_ML, _LASTFM, _FILMTRUST, _AMAZON_VIDEO, _AMAZON_INDUSTRIAL,
        _C2DSR_FOOD_KITCHEN, _C2DSR_MOVIE_BOOK, _C2DSR_ENT_EDU, _AMAZON_CDR, _DOUBAN,
    )
}


def list_specs() -> Tuple[DatasetSpec, ...]:
    """Every registered dataset, in teaching order (MovieLens first)."""
    return tuple(_SPECS.values())


def dataset_ids() -> Tuple[str, ...]:
    """Every registered dataset id."""
    return tuple(_SPECS)


def get_spec(dataset_id: "str | DatasetSpec") -> DatasetSpec:
    """The :class:`DatasetSpec` of ``dataset_id``.

    A :class:`DatasetSpec` is returned unchanged, so functions taking an id also accept a
    hand-made spec (tests use this to point a dataset at a local archive).

    Raises:
        UnknownDatasetError: unknown id; the message lists the known ids and the closest one.
    """
    if isinstance(dataset_id, DatasetSpec):
        return dataset_id
    try:
        return _SPECS[dataset_id]
    except KeyError:
        raise UnknownDatasetError(str(dataset_id), tuple(_SPECS)) from None


__all__ = [
    "STATUSES",
    "FileSpec",
    "VariantSpec",
    "ArchiveSpec",
    "DatasetSpec",
    "DISENCDR_PAIRS",
    "DOUBAN_DOMAINS",
    "get_spec",
    "list_specs",
    "dataset_ids",
]
