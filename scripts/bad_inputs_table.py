"""Per category of the bad-input corpus (tests/data/bad_inputs/*.yaml): inputs tried, refused, warned, accepted.

`python scripts/bad_inputs_table.py [PREFIX]` prints a Markdown table (PREFIX: only categories starting with it,
e.g. `27.`). An accepted case with `warns` counts as warned; the corpus test proves each case does what it says.
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import yaml

CORPUS = Path(__file__).resolve().parents[1] / "tests" / "data" / "bad_inputs"


def main(prefix: str = "") -> None:
    counts: dict[str, Counter[str]] = {}
    for path in sorted(CORPUS.glob("*.yaml")):
        part = yaml.safe_load(path.read_text()) or {}
        for kind in ("refused", "accepted"):
            for case in part.get(kind) or []:
                category = str(case.get("category", "accepted"))
                if not category.startswith(prefix):
                    continue
                outcome = "warned" if kind == "accepted" and case.get("warns") else kind
                counts.setdefault(category, Counter())[outcome] += 1
    print("| category | tried | refused | warned | accepted |\n|---|---|---|---|---|")
    for category in sorted(counts):
        c = counts[category]
        print(f"| {category} | {sum(c.values())} | {c['refused']} | {c['warned']} | {c['accepted']} |")


if __name__ == "__main__":
    main(*sys.argv[1:2])
