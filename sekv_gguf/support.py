"""Whether SeKV can serve a model, decided from what llama.cpp built for it, never from a list of architecture names.

SeKV needs an attention cache of per-token K and V rows in every hooked layer, which nothing else reads. The KV hook
checks the context's memory layout (an attention KV cache, a separate V per layer, no per-cell extra data, no cells
shared with another cache); an encoder-decoder model passes that check with its decoder's self-attention cache, so its
encoder (llama.cpp's ``llama_model_has_encoder``) refuses it here. A refusal is an ``UnsupportedModelError`` whose
message names the architecture (``general.architecture``) and the reason.
"""

from __future__ import annotations

from typing import Any

import llama_cpp

from . import _hook_api as api
from .errors import UnsupportedModelError
from .hook import KVHook

ENCODER_DECODER = ("encoder-decoder model: the decoder's cross-attention reads the encoder's output, which is not in "
                   "the KV cache SeKV compresses")


def architecture(model: Any) -> str:
    """``general.architecture`` of a loaded model (``llama_cpp._internals.LlamaModel``), "?" if it has none."""
    return model.metadata().get("general.architecture", "?")


def _memory_kind(model: Any) -> str:
    """What llama.cpp built for the model's memory, in words (it explains a layout the hook refused)."""
    if llama_cpp.llama_model_is_hybrid(model.model):
        return "; llama.cpp built a hybrid memory: recurrent state next to the attention layers"
    if llama_cpp.llama_model_is_recurrent(model.model):
        return "; llama.cpp built a recurrent memory: a fixed-size state per sequence, no per-token K/V rows"
    return ""


def _hooked(model: Any, ctx: int, owner: object | None) -> tuple[KVHook | None, str | None]:
    """The context's hook, or None and why SeKV cannot serve the model."""
    try:
        hook = KVHook(ctx, owner=owner)
    except UnsupportedModelError as e:
        return None, e.message + _memory_kind(model)
    if llama_cpp.llama_model_has_encoder(model.model):
        return None, ENCODER_DECODER
    return hook, None


def refusal(model: Any, ctx: int) -> str | None:
    """Why SeKV cannot serve ``model`` through context ``ctx`` (None: it can)."""
    return _hooked(model, ctx, None)[1]


def open_hook(model: Any, ctx: int, owner: object | None = None) -> KVHook:
    """The ``KVHook`` of ``ctx`` (a context over ``model``), or an ``UnsupportedModelError`` naming the architecture
    and why SeKV cannot serve it."""
    hook, why = _hooked(model, ctx, owner)
    if hook is None:
        raise UnsupportedModelError("sekv_kv_get_info", api.SEKV_ERR_UNSUPPORTED,
                                    f"architecture {architecture(model)!r} is not supported: {why}")
    return hook


def support_line(why: str | None) -> str:
    """``info``'s verdict: "supported" or "refused: <reason>"."""
    return "supported" if why is None else f"refused: {why}"
