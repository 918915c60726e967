"""How ``chat`` samples a reply (``Sampling``): llama.cpp's own defaults, replaced by the settings a model's authors
recommend where the GGUF carries them (``general.sampling.*``, as llama.cpp reads them) or where this project knows
them for a model it ships (``RECOMMENDED``, by ``general.basename``), and by the user's flags last.

llama-cpp-python's ``create_chat_completion`` defaults (temperature 0.2, no repeat penalty) are not llama.cpp's: on
a small model they loop (SmolLM2-135M-Instruct repeated one sentence ~40 times in a reply).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from typing import Any, Mapping

from gguf import Keys


@dataclass(frozen=True)
class Sampling:
    """One reply's sampler settings (llama.cpp's names in ``create_chat_completion``'s keywords)."""

    temperature: float = 0.8   # llama.cpp's defaults (common/common.h)
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    repeat_penalty: float = 1.0

    def __post_init__(self) -> None:
        if not self.temperature >= 0 or not 0 < self.top_p <= 1 or not 0 <= self.min_p <= 1:
            raise ValueError(f"need temperature >= 0, top_p in (0, 1] and min_p in [0, 1]; got {self}")
        if self.top_k < 0 or not self.repeat_penalty > 0:
            raise ValueError(f"need top_k >= 0 (0: the whole vocabulary) and repeat_penalty > 0; got {self}")

    def kwargs(self) -> dict[str, Any]:
        """Keywords for ``Llama.create_chat_completion``."""
        return asdict(self)


# a model's recommended settings, by general.basename, where its GGUF carries none (the authors' generation_config.json)
RECOMMENDED: dict[str, Sampling] = {
    "Qwen2.5-Coder": Sampling(temperature=0.7, top_k=20, top_p=0.8, min_p=0.0, repeat_penalty=1.05),
}

# general.sampling.* keys a GGUF may carry -> the Sampling field each sets
GGUF_KEYS = {Keys.General.SAMPLING_TEMP: "temperature", Keys.General.SAMPLING_TOP_K: "top_k",
             Keys.General.SAMPLING_TOP_P: "top_p", Keys.General.SAMPLING_MIN_P: "min_p",
             Keys.General.SAMPLING_PENALTY_REPEAT: "repeat_penalty"}


def for_model(metadata: Mapping[str, str], **overrides: float | int | None) -> Sampling:
    """The settings for a model whose GGUF metadata is ``metadata`` (llama_cpp's ``Llama.metadata``: strings):
    its ``general.sampling.*`` keys, else ``RECOMMENDED`` for its basename, else llama.cpp's defaults; then the
    ``overrides`` that are not None (the user's flags). A malformed key is a ValueError naming it."""
    base = RECOMMENDED.get(metadata.get(Keys.General.BASENAME, ""), Sampling())
    types = {f.name: f.type for f in fields(Sampling)}
    found: dict[str, float | int] = {}
    for key, name in GGUF_KEYS.items():
        if key in metadata:
            try:
                found[name] = int(metadata[key]) if types[name] in (int, "int") else float(metadata[key])
            except ValueError as e:
                raise ValueError(f"the model's {key} = {metadata[key]!r} is not a number") from e
    found |= {name: value for name, value in overrides.items() if value is not None}
    unknown = set(found) - set(types)
    if unknown:
        raise ValueError(f"unknown sampling settings {sorted(unknown)}")
    return replace(base, **found)
