"""Independent numpy forward passes of the tiny models (float64), for checking what the hook captures and reads."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sekv_gguf.tiny_models import TinySpec


@dataclass
class LayerTrace:
    q: np.ndarray  # [n_tok, n_head, head_dim] post-RoPE query as it enters attention (model scaling applied)
    k: np.ndarray  # [n_tok, n_head_kv, head_dim] post-RoPE key (what the cache stores)
    v: np.ndarray  # [n_tok, n_head_kv, head_dim]
    kq_scale: float


def _rms(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    # x: [..., d]
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def _rope(x: np.ndarray, pos: np.ndarray, base: float, neox: bool) -> np.ndarray:
    # x: [n_tok, n_head, d]; pos: [n_tok]
    d = x.shape[-1]
    inv = base ** (-np.arange(0, d, 2, dtype=np.float64) / d)  # [d/2]
    ang = pos[:, None, None] * inv[None, None, :]  # [n_tok, 1, d/2]
    cos, sin = np.cos(ang), np.sin(ang)
    if neox:
        x0, x1 = x[..., : d // 2], x[..., d // 2:]
        return np.concatenate([x0 * cos - x1 * sin, x0 * sin + x1 * cos], axis=-1)
    x0, x1 = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = x0 * cos - x1 * sin
    out[..., 1::2] = x0 * sin + x1 * cos
    return out


def _attend(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float, allowed: np.ndarray,
            bias: np.ndarray | None) -> np.ndarray:
    # q: [n, H, d], k/v: [n, Hkv, d], allowed: [n, n] bool, bias: [n, n] or per head [H, n, n] or None -> [n, H*d]
    n, n_head, d = q.shape
    group = n_head // k.shape[1]
    out = np.empty((n, n_head, d))
    for h in range(n_head):
        s = (q[:, h, :] @ k[:, h // group, :].T) * scale  # [n, n]
        s = np.where(allowed, s, -np.inf)
        if bias is not None:
            s = s + (bias[h] if bias.ndim == 3 else bias)
        p = np.exp(s - s.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        out[:, h, :] = p @ v[:, h // group, :]
    return out.reshape(n, n_head * d)


def _gelu(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x ** 3)))


def forward(weights: dict[str, np.ndarray], spec: TinySpec, tokens: list[int], gemma: bool = False,
            last_row_bias: dict[int, np.ndarray] | None = None) -> tuple[list[LayerTrace], np.ndarray]:
    """Per-layer traces and the logits [n_tok, n_vocab] of ``tokens`` at positions 0..n-1.

    ``last_row_bias[il]`` [n_tok] (or per query head [n_head, n_tok]) is added to layer il's attention scores of the
    last token (after scaling).
    """
    w = {name: a.astype(np.float64) for name, a in weights.items()}
    n = len(tokens)
    pos = np.arange(n, dtype=np.float64)
    dh, eps = spec.head_dim, spec.rms_eps
    causal = np.tril(np.ones((n, n), dtype=bool))
    x = w["token_embd.weight"][tokens]  # [n, d]
    if gemma:
        x = x * np.sqrt(spec.n_embd)
    traces: list[LayerTrace] = []
    for il in range(spec.n_layer):
        b = f"blk.{il}."
        h = _rms(x, w[b + "attn_norm.weight"], eps)
        q = (h @ w[b + "attn_q.weight"].T).reshape(n, spec.n_head, dh)
        k = (h @ w[b + "attn_k.weight"].T).reshape(n, spec.n_head_kv, dh)
        v = (h @ w[b + "attn_v.weight"].T).reshape(n, spec.n_head_kv, dh)
        allowed = causal
        if gemma:
            q = _rms(q, w[b + "attn_q_norm.weight"], eps)
            k = _rms(k, w[b + "attn_k_norm.weight"], eps)
            q = _rope(q, pos, spec.rope_base, neox=True) / np.sqrt(dh)
            k = _rope(k, pos, spec.rope_base, neox=True)
            scale = 1.0
            if (il + 1) % spec.swa_pattern != 0:  # sliding-window layer
                allowed = causal & (pos[:, None] - pos[None, :] < spec.swa_window)
        else:
            q = _rope(q, pos, spec.rope_base, neox=False)
            k = _rope(k, pos, spec.rope_base, neox=False)
            scale = 1.0 / np.sqrt(dh)
        traces.append(LayerTrace(q=q, k=k, v=v, kq_scale=scale))
        bias = None
        if last_row_bias is not None and il in last_row_bias:
            row = np.asarray(last_row_bias[il])
            bias = np.zeros(row.shape[:-1] + (n, n))                      # [n, n] or [H, n, n]
            bias[..., -1, :] = row
        a = _attend(q, k, v, scale, allowed, bias) @ w[b + "attn_output.weight"].T
        if gemma:
            a = _rms(a, w[b + "post_attention_norm.weight"], eps)
        x = x + a
        h = _rms(x, w[b + "ffn_norm.weight"], eps)
        gate = h @ w[b + "ffn_gate.weight"].T
        act = _gelu(gate) if gemma else gate / (1.0 + np.exp(-gate))
        f = (act * (h @ w[b + "ffn_up.weight"].T)) @ w[b + "ffn_down.weight"].T
        if gemma:
            f = _rms(f, w[b + "post_ffw_norm.weight"], eps)
        x = x + f
    x = _rms(x, w["output_norm.weight"], eps)
    out = w["token_embd.weight"] if gemma else w["output.weight"]
    return traces, x @ out.T
