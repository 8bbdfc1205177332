"""A text tower for reward tests: each prompt maps to a fixed vector given by the test
(unit-normalised), and ``encode`` calls are counted. It stands in for the frozen text encoder so
reward formulas can be checked by hand."""

from __future__ import annotations

import numpy as np


class TableText:
    """Prompt -> fixed unit vector; counts encode calls."""

    def __init__(self, table):
        self.table = {k: np.asarray(v, np.float64) / np.linalg.norm(v) for k, v in table.items()}
        self.calls = 0

    def encode(self, texts):
        self.calls += 1
        return np.stack([self.table[t] for t in texts])
