"""Notebook support: profiles, provenance header/footer, recorded metrics, the runner."""
from fedlib.notebook.profiles import PROFILES, Settings, load_settings, resolve_profile, settings_frame
from fedlib.notebook.records import read_records, record
from fedlib.notebook.lesson import show, show_source
from fedlib.notebook.session import finish, start, use_profile

__all__ = [
    "PROFILES",
    "Settings",
    "finish",
    "load_settings",
    "read_records",
    "record",
    "resolve_profile",
    "settings_frame",
    "show",
    "show_source",
    "start",
    "use_profile",
]
