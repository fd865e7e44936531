"""Hints on request, one tier at a time.

The first hint of every exercise is in its answer cell. When it is not enough, ask for
the next one::

    from course_utils.hints import hint
    hint("4.3")          # the next hint for exercise 4.3
    hint("4.3", 1)       # the first one again

Hints say what to compute and which invariant holds, never the code. Asking for them
changes nothing in a grade. They are generated from the problem sets' solution
notebooks into ``course_utils/data/hints/``.
"""
from __future__ import annotations

import json
from pathlib import Path

HINTS_DIR = Path(__file__).resolve().parent / "data" / "hints"
_shown: dict[str, int] = {}


def _problem_set_file(exercise: str) -> Path:
    lesson = exercise.split(".", 1)[0]
    if not lesson.isdigit():
        raise ValueError(f"exercise ids look like '4.3', got {exercise!r}")
    matches = sorted(HINTS_DIR.glob(f"{int(lesson):02d}_*.json"))
    if not matches:
        raise ValueError(f"no problem set {int(lesson):02d} has hints")
    return matches[0]


def tiers(exercise: str) -> list[str]:
    """Every hint tier of ``exercise``, first first."""
    exercise = str(exercise)
    data = json.loads(_problem_set_file(exercise).read_text(encoding="utf-8"))
    if exercise not in data:
        known = ", ".join(sorted(data, key=lambda e: [int(p) if p.isdigit() else p
                                                      for p in e.split(".")]))
        raise ValueError(f"exercise {exercise!r} has no hints; this problem set has {known}")
    return data[exercise]


def hint(exercise: str, level: int | None = None) -> str:
    """Print (and return) hint number ``level`` of ``exercise`` (1 = the first); with no
    level, the next one not yet shown in this session."""
    all_tiers = tiers(exercise)
    if level is None:
        level = min(_shown.get(str(exercise), 0) + 1, len(all_tiers))
    if not 1 <= level <= len(all_tiers):
        raise ValueError(f"exercise {exercise} has hints 1 to {len(all_tiers)}, not {level}")
    _shown[str(exercise)] = max(_shown.get(str(exercise), 0), level)
    last = " (that is the last hint)" if level == len(all_tiers) else ""
    text = f"Hint {level} of {len(all_tiers)} for exercise {exercise}{last}: {all_tiers[level - 1]}"
    print(text)
    return text
