"""A short storm of valid and hostile requests (``sekv_gguf.reliability.storm``) against ``serve``: every response
well-formed (a 2xx JSON body or SSE stream ending in [DONE], or an OpenAI-shaped 4xx), no 5xx, no dropped
connection. ``scripts/api_storm.py`` sends 1,000 and measures memory."""

from __future__ import annotations

import pytest

from sekv_gguf.reliability.storm import KINDS, run_storm

pytestmark = pytest.mark.serve


def test_every_response_to_a_storm_is_well_formed(server):
    out = run_storm(server, 3 * len(KINDS), seed=1, workers=4)
    assert out["requests"] == 3 * len(KINDS) and out["server_errors"] == 0 and out["failed_connections"] == 0, out
    assert out["well_formed"] == out["requests"], out["malformed"]
    assert set(out["by_kind"]) == set(KINDS)
    assert out["by_kind"]["chat"] == {"200": 3} and out["by_kind"]["unknown_route"] == {"404": 3}
    assert out["by_kind"]["over_long_prompt"] == {"400": 3} and out["by_kind"]["malformed_json"] == {"400": 3}
