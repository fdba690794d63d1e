"""Print benchmark rows: median, p90, ratio to a baseline and to a target."""

from __future__ import annotations

import statistics
from collections.abc import Sequence


def ms(samples: Sequence[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    return statistics.median(ordered) * 1000, ordered[int(len(ordered) * 0.9)] * 1000


def table(
    title: str,
    rows: Sequence[tuple[str, Sequence[float]]],
    baseline: str,
    target_ms: float | None = None,
) -> None:
    base = statistics.median(dict(rows)[baseline]) * 1000
    print(f"\n{title}")
    print(
        f"{'case':<44} {'median ms':>10} {'p90 ms':>9} {'x baseline':>22}"
        + (f" {'vs target':>10}" if target_ms else "")
    )
    for name, samples in rows:
        median, p90 = ms(samples)
        line = f"{name:<44} {median:>10.2f} {p90:>9.2f} {median / base:>21.2f}x"
        if target_ms:
            line += f" {median / target_ms:>9.2f}x"
        print(line)
    if target_ms:
        print(f"target: {target_ms} ms")
