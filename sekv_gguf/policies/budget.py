"""How a policy shares its device budget: the plan of sinks, recent window, prompt chunk, zoom slots and anchor cap
for one context, and the check that what must stay resident fits (``BudgetError`` saying what would)."""

from __future__ import annotations

from dataclasses import dataclass

from ..config import BudgetConfig, round_cells
from ..errors import BudgetError


@dataclass(frozen=True)
class BudgetPlan:
    """cells: the budget (device cells); fits: the whole context fits it (nothing is ever compressed); chunk:
    prompt tokens per decode; window: recent tokens at full resolution; n_zoom: cells for rebuilt spans (per
    layer); anchor_cap: most anchors."""

    config: BudgetConfig
    n_context: int
    cells: int
    fits: bool
    chunk: int
    window: int
    n_zoom: int = 0
    anchor_cap: int = 0

    @classmethod
    def of(cls, config: BudgetConfig, n_context: int, zoom_share: float = 0.0, anchor_share: float = 0.0,
           compress_when_fits: bool = False, chunk_share: float | None = None) -> "BudgetPlan":
        """The plan for a context of ``n_context`` tokens: when it fits the budget (and ``compress_when_fits`` is
        off) everything is window; otherwise ``zoom_share`` and ``anchor_share`` of the budget are reserved."""
        cells = config.cells(n_context)
        fits = n_context <= cells and not compress_when_fits
        return cls(config=config, n_context=n_context, cells=cells, fits=fits,
                   chunk=config.stream_chunk(cells, chunk_share),
                   window=n_context if fits else config.recent_window(cells),
                   n_zoom=0 if fits else int(zoom_share * cells),
                   anchor_cap=0 if fits else int(anchor_share * cells))

    def check(self, parts: dict[str, int], hint: str = "") -> None:
        """Raise ``BudgetError`` unless ``parts`` (name -> cells that must stay resident) fit the budget."""
        need = sum(parts.values())
        if need > self.cells:
            detail = " + ".join(f"{k} {v}" for k, v in parts.items())
            raise BudgetError(
                f"kv_budget of {self.cells} cells ({self.config.kv_budget:g} asked, in llama.cpp's units of "
                f"{self.config.cell_granularity}) cannot hold what must stay resident for {self.n_context} tokens: "
                f"{detail} = {need} cells; use a budget of at least "
                f"{round_cells(need, self.config.cell_granularity)} cells{hint}")
