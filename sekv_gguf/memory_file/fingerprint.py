"""The fingerprint of a memory: what it may only be loaded into — the model (its identity, as router adapters check
it), the policy, its logical size, device cells, K/V types, batch sizes, settings, and the tokens it holds."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, fields, is_dataclass
from typing import Any

import numpy as np

from ..adapter.identity import model_identity
from ..errors import MemoryFileError, MemoryMismatchError
from ..policies.base import Policy


def tokens_hash(tokens: Any) -> str:
    return hashlib.sha256(np.asarray(tokens, dtype="<i4").tobytes()).hexdigest()


def _settings(policy: Policy) -> str:
    recipe = policy.recipe
    params = recipe.params
    if params is None and type(policy).Config is not None:
        params = type(policy).Config()  # the defaults the policy ran with
    plain = lambda c: asdict(c) if is_dataclass(c) else c  # noqa: E731
    return json.dumps({"budget": plain(recipe.budget), "params": plain(params), "router": recipe.router},
                      sort_keys=True, default=str)


@dataclass(frozen=True)
class Fingerprint:
    """Fields in the order of ``keys.FP_*``; ``settings`` is JSON of the budget, the policy's parameters and its
    router label."""

    model_name: str
    model_architecture: str
    model_n_layer: int
    model_n_embd: int
    model_n_vocab: int
    model_tensor_hash: str
    policy: str
    n_context: int
    budget_cells: int
    type_k: int
    type_v: int
    n_batch: int
    n_ubatch: int
    settings: str
    n_tokens: int
    tokens_sha256: str

    @classmethod
    def of(cls, policy: Policy, tokens: list[int] | None = None) -> "Fingerprint":
        """The fingerprint of ``policy`` (made by ``engine.make_policy``) holding ``tokens`` (default: its own)."""
        tokens = policy.tokens if tokens is None else tokens
        if policy.recipe is None:
            raise MemoryFileError(f"a {type(policy).__name__} made outside engine.make_policy has no recipe: its "
                                  "memory cannot be saved or loaded")
        ident = model_identity(policy.session.model.path_model)
        info, cfg = policy.session.hook.info, policy.session.config
        return cls(model_name=ident.name, model_architecture=ident.architecture, model_n_layer=ident.n_layer,
                   model_n_embd=ident.n_embd, model_n_vocab=ident.n_vocab, model_tensor_hash=ident.tensor_hash,
                   policy=policy.recipe.name, n_context=int(policy.recipe.n_context), budget_cells=int(info.kv_size),
                   type_k=int(info.type_k), type_v=int(info.type_v), n_batch=int(cfg.n_batch),
                   n_ubatch=int(cfg.n_ubatch), settings=_settings(policy), n_tokens=len(tokens),
                   tokens_sha256=tokens_hash(tokens))

    def canonical(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    def check_fits(self, target: "Fingerprint", source: str) -> None:
        """Raise ``MemoryMismatchError`` naming every field (tokens aside) in which this saved fingerprint differs
        from ``target``'s, the fingerprint of the policy it is loaded into."""
        bad = []
        for f in fields(self):
            if f.name in ("n_tokens", "tokens_sha256"):
                continue
            mine, theirs = getattr(self, f.name), getattr(target, f.name)
            if mine != theirs:
                bad.append(_difference(f.name, mine, theirs))
        if bad:
            raise MemoryMismatchError(f"{source} cannot be loaded here: " + "; ".join(bad))


def _difference(name: str, saved: Any, here: Any) -> str:
    if name == "settings":
        a, b = json.loads(saved), json.loads(here)
        diffs = [f"{path} saved {x!r}, here {y!r}" for path, x, y in _walk(a, b, "")]
        return "settings differ: " + ", ".join(diffs[:8])
    if name.startswith("model_"):
        return f"another model: {name[6:]} saved {saved!r}, here {here!r}"
    return f"{name} saved {saved!r}, here {here!r}"


def _walk(a: Any, b: Any, path: str) -> list[tuple[str, Any, Any]]:
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in sorted(set(a) | set(b)):
            out += _walk(a.get(k), b.get(k), f"{path}.{k}" if path else k)
        return out
    return [] if a == b else [(path, a, b)]
