"""How ``chat`` samples: llama.cpp's defaults, a model's recommended settings (from its GGUF or ``RECOMMENDED``),
the user's flags on top; bad values refused."""

from __future__ import annotations

import pytest

from sekv_gguf.sampling import RECOMMENDED, Sampling, for_model


def test_llama_cpp_defaults_then_the_models_recommendation_then_the_flags():
    assert for_model({}) == Sampling() == Sampling(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05,
                                                   repeat_penalty=1.0)
    qwen = for_model({"general.basename": "Qwen2.5-Coder"})
    assert qwen == RECOMMENDED["Qwen2.5-Coder"] and qwen.repeat_penalty > 1 and qwen.top_k == 20
    own = for_model({"general.basename": "Qwen2.5-Coder", "general.sampling.temp": "0.3",
                     "general.sampling.top_k": "64"})
    assert (own.temperature, own.top_k, own.top_p) == (0.3, 64, qwen.top_p)  # the GGUF's keys win, the rest stays
    flagged = for_model({"general.sampling.temp": "0.3"}, temperature=0.0, top_p=None, repeat_penalty=1.2)
    assert (flagged.temperature, flagged.top_p, flagged.repeat_penalty) == (0.0, 0.95, 1.2)
    assert set(Sampling().kwargs()) == {"temperature", "top_k", "top_p", "min_p", "repeat_penalty"}


@pytest.mark.parametrize("bad", [dict(temperature=-1.0), dict(top_p=0.0), dict(top_p=1.5), dict(min_p=2.0),
                                 dict(top_k=-3), dict(repeat_penalty=0.0)])
def test_bad_settings_are_refused(bad):
    with pytest.raises(ValueError, match="need"):
        for_model({}, **bad)


def test_a_malformed_gguf_key_is_named():
    with pytest.raises(ValueError, match="general.sampling.top_k"):
        for_model({"general.sampling.top_k": "many"})
