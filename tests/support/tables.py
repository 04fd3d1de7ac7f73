"""What the tests ask of a lifecycle table (trionsq.lifecycle.Moves)."""

from __future__ import annotations

import enum
from typing import Any

from trionsq.lifecycle import Moves


def reachable(moves: Moves[Any], start: enum.Enum) -> set[Any]:
    """Every state ``moves`` allows from ``start`` in any number of moves
    (``start`` itself included)."""
    seen, todo = {start}, [start]
    while todo:
        for target in moves.table.get(todo.pop(), ()):
            if target not in seen:
                seen.add(target)
                todo.append(target)
    return seen
