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


class HashText:
    """Prompt -> a fixed random unit vector of ``dim`` numbers, seeded by the prompt's CRC-32 (the
    same in every process, unlike ``hash()``); counts encode calls. A fast stand-in text tower for
    tests that need distinct, reproducible prompt vectors but no particular geometry."""

    def __init__(self, dim: int = 384):
        self.dim, self.calls = dim, 0

    def encode(self, texts):
        import zlib

        self.calls += 1
        out = [np.random.default_rng(zlib.crc32(t.encode())).normal(size=self.dim) for t in texts]
        return np.stack([v / np.linalg.norm(v) for v in out])
