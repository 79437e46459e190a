"""Old argument and attribute names that keep working, with a ``FutureWarning`` naming the new one.

``FutureWarning`` rather than ``DeprecationWarning``: Python shows it to the users of a library
(``DeprecationWarning`` is hidden outside ``__main__``), and these renames concern them.
"""

from __future__ import annotations

import warnings
from typing import Any


def take_renamed(options: dict[str, Any], old: str, new: str, value: Any, *, owner: str) -> Any:
    """The value of argument ``new``, taken from ``options[old]`` (removed from ``options``,
    with a ``FutureWarning``) when the caller used the old name.

    Args:
        options: the caller's remaining keyword arguments.
        old: the old name.
        new: the new name.
        value: what the caller gave as ``new`` (``None``, its default, when nothing).
        owner: the class or function, for the messages.

    Raises:
        ValueError: both names were given.
    """
    if old not in options:
        return value
    old_value = options.pop(old)
    if value is not None:
        raise ValueError(f"{owner} got both {old}= and {new}=; {old} is the old name of {new}")
    warn_renamed(f"{owner}({old}=...)", f"{new}=...")
    return old_value


def warn_renamed(old: str, new: str, *, stacklevel: int = 4) -> None:
    """A ``FutureWarning`` that ``old`` is deprecated in favour of ``new``, attributed to the
    frame ``stacklevel`` up (by default the user's line that called a constructor that called a
    helper that called this)."""
    warnings.warn(
        f"{old} is deprecated and will be removed: use {new}", FutureWarning, stacklevel=stacklevel
    )


def renamed_attribute(old: str, new: str) -> property:
    """A property ``old`` that reads and writes attribute ``new``, with a ``FutureWarning``."""

    def getter(self: object) -> Any:
        warn_renamed(f"{type(self).__name__}.{old}", f".{new}", stacklevel=3)
        return getattr(self, new)

    def setter(self: object, value: Any) -> None:
        warn_renamed(f"{type(self).__name__}.{old}", f".{new}", stacklevel=3)
        setattr(self, new, value)

    return property(getter, setter, doc=f"Deprecated name of :attr:`{new}`.")
