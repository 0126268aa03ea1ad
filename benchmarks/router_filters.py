"""Router building blocks: flowkit filters and transforms vs hand-written Python, ns per record.

Both run in this process over the same list of dicts decoded by ``msgspec.json.decode``:

* filters: a single numeric ``>``, string ``==`` and boolean test, then 2- and 3-condition
  ANDs, each against the lambda a developer would write (``lambda v: v["user"]["age"] > 18``);
* a filter whose field is missing from every record (the miss path), against a hand-written
  lambda that checks for the keys first;
* a transform: pick 3 fields and hash one (sha256), against the dict built by hand.

    python -m benchmarks.router_filters [--records 200000] [--repeat 7]

Each case is timed with ``time.perf_counter_ns`` over a plain ``for`` loop, the candidates
taking turns in every round; the table shows the best round. "flowkit" calls the Filter or
Transform object, ``.func`` calls the generated function inside it (what a stream could call
directly). The Rust column is a compiled Rust router's figure, for context only.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import random
import sys
import time
from collections.abc import Callable
from typing import Any

import msgspec

from flowkit.routing import chain, field, hash_field, pick

RUST = {"single": "17-23", "and": "46-65"}


def make_records(n: int, seed: int = 1) -> list[Any]:
    """``n`` decoded JSON events (about 200 bytes each), half of them matching each test."""
    rng = random.Random(seed)
    encode = msgspec.json.Encoder().encode
    payloads = [
        encode(
            {
                "id": i,
                "ts": 1_700_000_000_000 + i,
                "user": {
                    "id": f"{rng.getrandbits(64):016x}",
                    "age": rng.randint(1, 36),
                    "name": rng.choice(["ada", "grace", "edsger", "barbara"]),
                },
                "country": rng.choice(["NL", "DE"]),
                "flags": {"beta": rng.random() < 0.5, "internal": False},
                "amount": round(rng.uniform(0, 500), 2),
            }
        )
        for i in range(n)
    ]
    decode = msgspec.json.Decoder().decode
    return [decode(p) for p in payloads]


def time_round(fn: Callable[[Any], Any], records: list[Any]) -> int:
    gc.disable()
    try:
        start = time.perf_counter_ns()
        for v in records:
            fn(v)
        return time.perf_counter_ns() - start
    finally:
        gc.enable()


def race(
    candidates: dict[str, Callable[[Any], Any]], records: list[Any], repeat: int
) -> dict[str, float]:
    """Best ns per record of each candidate, taking turns so that drift hits all alike."""
    best = dict.fromkeys(candidates, float("inf"))
    for _ in range(repeat):
        for name, fn in candidates.items():
            best[name] = min(best[name], time_round(fn, records) / len(records))
    return best


def empty(v: Any) -> None:
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    records = make_records(args.records)
    missing = [{k: v for k, v in r.items() if k != "user"} for r in records]

    age, country, beta = field("user.age") > 18, field("country") == "NL", field("flags.beta")
    cases: list[tuple[str, str, Any, Callable[[Any], Any], list[Any]]] = [
        ("numeric >", "single", age, lambda v: v["user"]["age"] > 18, records),
        ("string ==", "single", country, lambda v: v["country"] == "NL", records),
        ("boolean", "single", beta.is_true(), lambda v: v["flags"]["beta"] is True, records),
        (
            "AND of 2",
            "and",
            age & country,
            lambda v: v["user"]["age"] > 18 and v["country"] == "NL",
            records,
        ),
        (
            "AND of 3",
            "and",
            age & country & beta.is_true(),
            lambda v: v["user"]["age"] > 18 and v["country"] == "NL" and v["flags"]["beta"] is True,
            records,
        ),
        (
            "numeric >, field missing",
            "",
            age,
            lambda v: "user" in v and "age" in v["user"] and v["user"]["age"] > 18,
            missing,
        ),
    ]
    sha256 = hashlib.sha256

    def anonymise_by_hand(v: Any) -> Any:
        return {
            "id": v["id"],
            "user": {"id": sha256(v["user"]["id"].encode()).hexdigest()},
            "country": v["country"],
        }

    anonymise = chain(pick("id", "user.id", "country"), hash_field("user.id"))
    cases.append(("pick 3 + sha256 one", "", anonymise, anonymise_by_hand, records))

    print(f"Python {sys.version.split()[0]}, {args.records:,} records, best of {args.repeat}")
    base = race({"empty": empty}, records, args.repeat)["empty"]
    print(f"(calling an empty Python function in this loop costs {base:.1f} ns per record)\n")
    header = f"{'case':<26}{'flowkit':>9}{'.func':>9}{'hand':>9}{'ratio':>8}{'.func/hand':>12}"
    print(header + f"{'Rust':>9}")
    print("-" * (len(header) + 9))
    for name, rust, built, by_hand, data in cases:
        got = [built(v) for v in data[:1000]]
        assert got == [by_hand(v) for v in data[:1000]], f"{name}: results differ"
        best = race({"flowkit": built, "func": built.func, "hand": by_hand}, data, args.repeat)
        flowkit, func, hand = best["flowkit"], best["func"], best["hand"]
        print(
            f"{name:<26}{flowkit:>9.1f}{func:>9.1f}{hand:>9.1f}{flowkit / hand:>8.2f}"
            f"{func / hand:>12.2f}{RUST.get(rust, ''):>9}"
        )
    print("\nns per record; ratio = flowkit / hand-written (lower is better).")


if __name__ == "__main__":
    main()
