"""Percentiles of measured values (the audit's time to decision, the usage dashboard's ask
waits): a leaf module both page folders use."""

from __future__ import annotations

import math


def percentile(sorted_values: list[float], fraction: float) -> float | None:
    """The `fraction` percentile of ascending values (linear interpolation), None if empty."""
    if not sorted_values:
        return None
    position = (len(sorted_values) - 1) * fraction
    low, high = math.floor(position), math.ceil(position)
    if low == high:
        return sorted_values[low]
    return sorted_values[low] + (sorted_values[high] - sorted_values[low]) * (position - low)
