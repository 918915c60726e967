"""Short soaks (``sekv_gguf.reliability.soak``; ``scripts/soak.py`` runs 10,000 steps and 200 cycles): sekv decoding
with routing every step keeps its non-host memory flat, its host tier under full KV, and yields the same tokens when
run again; opening and closing policies leaks neither memory nor file descriptors."""

from __future__ import annotations

from sekv_gguf.reliability.soak import SoakConfig, decode_soak, open_close_soak


def test_decode_soak_is_flat_bounded_and_repeatable(llama_model):
    r = decode_soak(llama_model, SoakConfig(steps=600, prompt_tokens=1024, samples=6, budget=0.25, warm_share=0.3))
    assert r["same_tokens_on_rerun"], r["tokens_sha256"]
    assert r["spans"] > 10 and r["zooms_per_step"] > 0  # it compressed and routed
    assert r["host_end_bytes"] > r["host_warm_bytes"] > 0 and r["host_over_full_kv"] < 1.0
    assert r["rss_growth_outside_host_tier"] < 0.02, r["samples"]


def test_open_close_leaks_nothing(llama_model):
    r = open_close_soak(llama_model, SoakConfig(cycles=30))
    assert r["fds_end"] == r["fds_warm"], r
    assert r["rss_growth"] < 0.02, r
