"""Profiles: plain defaults overridden by small per-notebook profile files.

Every notebook has ``notebooks/profiles/<notebook>.toml``::

    [base]          # settings shared by every profile
    dataset = "ml-100k"
    dim = 32

    [smoke]         # seconds, synthetic or tiny data; exists for tests
    rounds = 2

    [quick]         # the default: real data, at most 15 minutes on a 2-core CPU
    rounds = 30

    [paper]         # the paper's reported configuration
    rounds = 100

A profile's settings are ``base`` updated with its own table. The notebook's single
``parameters`` cell chooses the profile; ``FEDLIB_PROFILE`` overrides the default.
"""
from __future__ import annotations

import json
import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Optional

from fedlib.paths import project_root
from fedlib.reporting.results import PROFILES  # the results folders are named after the profiles

DEFAULT_PROFILE = "quick"
PROFILE_DESCRIPTIONS = {
    "smoke": "seconds on synthetic or tiny data; exercises every code path (tests, CI)",
    "quick": "the default: real data, a documented subset of the grid, <= 8 min per lesson on 2 CPU cores",
    "paper": "the paper's reported configurations; writes results/<paper>/ (hours, resumable)",
}


class Settings(Mapping):
    """Read-only settings of one profile; keys are also attributes (``settings.rounds``)."""

    def __init__(self, notebook: str, profile: str, values: Mapping[str, Any]):
        self._notebook = notebook
        self._profile = profile
        self._values = dict(values)

    @property
    def profile(self) -> str:
        return self._profile

    @property
    def notebook(self) -> str:
        return self._notebook

    def __getitem__(self, key: str) -> Any:
        return self._values[key]

    def __getattr__(self, key: str) -> Any:
        if key.startswith("_"):
            raise AttributeError(key)
        try:
            return self._values[key]
        except KeyError:
            known = ", ".join(sorted(self._values))
            raise AttributeError(
                f"profile {self._profile!r} of notebook {self._notebook!r} has no setting {key!r}; "
                f"known settings: {known}. Add it to notebooks/profiles/{self._notebook}.toml."
            ) from None

    def __iter__(self):
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def as_dict(self) -> dict:
        return dict(self._values)

    def __repr__(self) -> str:
        return f"Settings({self._notebook!r}, profile={self._profile!r}, {self._values!r})"


def resolve_profile(requested: Optional[str] = None) -> str:
    """The profile to run: an explicit value, else ``$FEDLIB_PROFILE``, else ``quick``."""
    profile = requested if requested not in (None, "") else os.environ.get("FEDLIB_PROFILE") or DEFAULT_PROFILE
    if profile not in PROFILES:
        raise ValueError(
            f"unknown profile {profile!r}; choose one of {', '.join(PROFILES)} "
            "(set PROFILE in the notebook's parameters cell or the FEDLIB_PROFILE environment variable)"
        )
    return profile


def profile_file(notebook: str) -> Path:
    return project_root() / "notebooks" / "profiles" / f"{notebook}.toml"


def read_profile_table(notebook: str) -> dict[str, dict]:
    """All profile tables of a notebook, ``{"base": {...}, "smoke": {...}, ...}``."""
    path = profile_file(notebook)
    if not path.exists():
        raise FileNotFoundError(
            f"no profile file for notebook {notebook!r}: expected {path}. "
            "Every notebook needs one (see notebooks/profiles/_template.toml)."
        )
    with path.open("rb") as handle:
        try:
            tables = tomllib.load(handle)
        except tomllib.TOMLDecodeError as error:
            raise ValueError(f"{path} is not valid TOML: {error}") from error
    unknown = set(tables) - {"base", *PROFILES}
    if unknown:
        raise ValueError(f"{path}: unknown table(s) {sorted(unknown)}; allowed: base, {', '.join(PROFILES)}")
    missing = [p for p in PROFILES if p not in tables]
    if missing:
        raise ValueError(f"{path}: missing profile table(s) {missing}; every notebook defines smoke, quick and paper")
    base_keys = set(tables.get("base", {}))
    for name in PROFILES:
        # A key that only one profile defines is almost always a typo: ask for it in [base].
        stray = set(tables[name]) - base_keys
        if stray:
            raise ValueError(
                f"{path}: [{name}] sets {sorted(stray)} which [base] does not define; "
                "declare every setting (with its default) in [base] first"
            )
    return tables


OVERRIDE_ENV = "FEDLIB_OVERRIDE"
"""JSON object of settings to override, e.g. ``FEDLIB_OVERRIDE='{"seed": 1}'`` (seed sweeps)."""


def load_settings(notebook: str, profile: Optional[str] = None) -> Settings:
    """Settings of ``notebook`` at ``profile`` (resolved with :func:`resolve_profile`).

    ``$FEDLIB_OVERRIDE`` (a JSON object) overrides individual settings, for seed sweeps of
    the quick profile; only settings the profile file declares can be overridden.
    """
    profile = resolve_profile(profile)
    tables = read_profile_table(notebook)
    values = dict(tables.get("base", {}))
    values.update(tables[profile])
    overrides = os.environ.get(OVERRIDE_ENV, "").strip()
    if overrides:
        try:
            changes = json.loads(overrides)
        except json.JSONDecodeError as error:
            raise ValueError(f"{OVERRIDE_ENV} is not a JSON object: {error}") from error
        if not isinstance(changes, dict):
            raise ValueError(f"{OVERRIDE_ENV} must be a JSON object like '{{\"seed\": 1}}'")
        unknown = set(changes) - set(values)
        if unknown:
            raise ValueError(f"{OVERRIDE_ENV} sets unknown setting(s) {sorted(unknown)} of notebook {notebook!r}")
        values.update(changes)
    return Settings(notebook, profile, values)


def settings_frame(notebook: str):
    """A table of every setting under every profile (rows: settings, columns: profiles).

    It does not depend on the profile being run, so notebooks display it in a cell that
    nbval checks against the committed outputs.
    """
    import pandas as pd

    tables = read_profile_table(notebook)
    base = tables.get("base", {})
    rows = {}
    for key in base:
        rows[key] = {p: tables[p].get(key, base[key]) for p in PROFILES}
    return pd.DataFrame.from_dict(rows, orient="index", columns=list(PROFILES))
