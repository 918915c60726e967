"""The recent window of a streamed policy: the newest tokens at full resolution, with each token's segmentation
signal (surprisal, or 1 at a sentence end), oldest first. One structure instead of parallel lists."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class Window:
    """pos int64 [n], cell int32 [n], signal float32 [n] of the window's tokens, in position order."""

    pos: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    cell: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int32))
    signal: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.float32))

    def __post_init__(self) -> None:
        self.pos = np.asarray(self.pos, dtype=np.int64)
        self.cell = np.asarray(self.cell, dtype=np.int32)
        self.signal = np.asarray(self.signal, dtype=np.float32)

    def __len__(self) -> int:
        return int(self.pos.size)

    def extend(self, pos: np.ndarray, cell: np.ndarray, signal: np.ndarray) -> None:
        """Append newer tokens (ascending positions)."""
        self.pos = np.concatenate([self.pos, np.asarray(pos, dtype=np.int64)])
        self.cell = np.concatenate([self.cell, np.asarray(cell, dtype=np.int32)])
        self.signal = np.concatenate([self.signal, np.asarray(signal, dtype=np.float32)])

    def keep(self, idx: np.ndarray) -> None:
        """Keep only the tokens at window indices ``idx`` (ascending)."""
        self.pos, self.cell, self.signal = self.pos[idx], self.cell[idx], self.signal[idx]

    def drop_oldest(self, n: int) -> None:
        self.keep(np.arange(n, len(self)))

    def drop_newest(self, n: int) -> None:
        self.keep(np.arange(0, len(self) - n))
