"""Checks shared by every layer's configuration and API: run ids and numbers.  Sans-IO.

A run id has one meaning everywhere: a non-empty string of at most
``MAX_RUN_ID_BYTES`` bytes of UTF-8.  On the wire, messages bound it by
characters (``RunId``: every string of at most that many bytes has at most that
many characters), and services check what they decode with
:func:`run_id_problem`.
"""

from __future__ import annotations

import math
from typing import Annotated

from ..errors import ConfigError
from ..wire import MaxLen

__all__ = ["MAX_RUN_ID_BYTES", "RunId", "check_run_id", "run_id_problem", "is_int",
           "is_number", "is_positive"]

#: Longest run id, in bytes of UTF-8.
MAX_RUN_ID_BYTES = 128

#: The annotation of a run id field in wire messages.
RunId = Annotated[str, MaxLen(MAX_RUN_ID_BYTES)]


def run_id_problem(run_id: object) -> str | None:
    """Why ``run_id`` is not a valid run id, or None when it is."""
    if not isinstance(run_id, str) or not run_id \
            or len(run_id.encode("utf-8", "surrogatepass")) > MAX_RUN_ID_BYTES:
        shown = repr(run_id) if len(repr(run_id)) <= 40 else repr(run_id)[:37] + "..."
        return (f"run_id must be a non-empty string of at most {MAX_RUN_ID_BYTES} bytes of "
                f"UTF-8, got {shown}")
    return None


def check_run_id(run_id: object) -> str:
    """``run_id`` if it is valid; :class:`~p2pdl.errors.ConfigError` otherwise."""
    problem = run_id_problem(run_id)
    if problem is not None:
        raise ConfigError(problem)
    return run_id  # type: ignore[return-value]


def is_int(value: object) -> bool:
    """An ``int`` that is not a ``bool``."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: object) -> bool:
    """A finite ``int`` or ``float`` that is not a ``bool``."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) \
        and math.isfinite(value)


def is_positive(value: object) -> bool:
    """A finite number above zero."""
    return is_number(value) and value > 0  # type: ignore[operator]
