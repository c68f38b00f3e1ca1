"""Numbers for output: JSON (which has no NaN or infinity) and table cells."""

from __future__ import annotations

import math
from typing import Any

__all__ = ["cell", "finite"]


def finite(value: float | None, digits: int = 4) -> float | None:
    """``value`` rounded to ``digits``; None (JSON null) for None, NaN and infinities."""
    if value is None or not math.isfinite(value):
        return None
    return round(float(value), digits)


def cell(value: Any, digits: int = 3) -> str:
    """A table cell or status-line field: "-" for None, floats to ``digits``."""
    if value is None:
        return "-"
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)
