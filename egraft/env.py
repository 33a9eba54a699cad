"""egraft's on/off switches in the environment (``EGRAFT_*``), read one way everywhere.

Unset or empty: the switch's default.  ``1``, ``true``, ``yes``, ``on`` turn it
on and ``0``, ``false``, ``no``, ``off`` turn it off (any case); any other
value is an error naming the variable, not a silent default.
"""

from __future__ import annotations

import os

from .errors import InputError

ON = ("1", "true", "yes", "on")
OFF = ("0", "false", "no", "off")


def flag(name: str, default: bool) -> bool:
    """Whether the switch `name` is on (module docstring)."""
    raw = os.environ.get(name, "")
    value = raw.strip().lower()
    if not value:
        return default
    if value in ON:
        return True
    if value in OFF:
        return False
    raise InputError(f"environment variable {name}={raw!r} is not an on/off switch: set it to 1 (on) or 0 (off), "
                     "or unset it")


__all__ = ["OFF", "ON", "flag"]
