"""Intent resolution over 10,000 filters (50 actions): the index by action vs a linear scan.

Target (providers/intents issue): resolve ≤ 1 ms median. Baseline: ranking every filter of every
app without the index, in the same run.
"""

from __future__ import annotations

import random
import time

from atrium.intents import Candidate, Intent, IntentIndex, rank
from atrium.manifest import IntentFilter
from atrium.scopes import Scope
from bench.report import table

FILTERS = 10_000
ACTIONS = 50
APPS = 2_000
ROUNDS = 200
MIMES = ["text/plain", "text/*", "image/png", "image/*", "*/*", "application/json"]


def build() -> tuple[IntentIndex, list[Candidate]]:
    rng = random.Random(7)
    per_app: dict[str, list[IntentFilter]] = {}
    for n in range(FILTERS):
        app_id = f"com.bench.app{n % APPS}"
        fields: dict[str, object] = {
            "action": f"os.intent.action.A{rng.randrange(ACTIONS)}",
            "priority": rng.randrange(-5, 6),
        }
        if rng.random() < 0.6:
            fields["dataMime"] = rng.sample(MIMES, 2)
        if rng.random() < 0.3:
            fields["dataScheme"] = ["https", "file"]
        if rng.random() < 0.5:
            fields["category"] = ["os.intent.category.DEFAULT"]
        per_app.setdefault(app_id, []).append(IntentFilter.model_validate(fields))
    index = IntentIndex()
    everything: list[Candidate] = []
    for app_id, filters in per_app.items():
        index.set_app(app_id, Scope.GLOBAL, filters)
        everything += [Candidate(app_id, Scope.GLOBAL, i, f) for i, f in enumerate(filters)]
    return index, everything


def timed(fn: object, intents: list[Intent]) -> list[float]:
    samples = []
    for intent in intents:
        started = time.perf_counter()
        fn(intent)  # type: ignore[operator]
        samples.append(time.perf_counter() - started)
    return samples


async def main() -> None:
    index, everything = build()
    rng = random.Random(11)
    intents = [
        Intent(
            f"os.intent.action.A{rng.randrange(ACTIONS)}",
            type=rng.choice(MIMES[:4]),
            uri="https://x.test/a",
            category=("os.intent.category.DEFAULT",),
        )
        for _ in range(ROUNDS)
    ]
    linear = timed(lambda i: rank(everything, i), intents)
    indexed = timed(index.resolve, intents)
    started = time.perf_counter()
    index.set_app(
        "com.bench.app1",
        Scope.USER,
        [IntentFilter.model_validate({"action": "os.intent.action.A1"})],
    )
    update = [time.perf_counter() - started]
    table(
        f"Intent resolve over {FILTERS} filters, {ACTIONS} actions, {ROUNDS} intents",
        [
            ("linear scan of every filter (baseline)", linear),
            ("index by action", indexed),
            ("update one app in the index", update),
        ],
        baseline="linear scan of every filter (baseline)",
        target_ms=1,
    )
