"""KV-cache policies, all driven through the same hook and decode loop (``sekv_gguf.decode``); what each remembers is
one memory object (``memory_state.PolicyMemory``; SeKV's ``sekv_memory.SekvMemory``)."""

from .base import Policy
from .chunkkv import ChunkKVConfig, ChunkKVPolicy
from .eviction import EvictionConfig, EvictionPolicy
from .full import FullPolicy
from .h2o import H2OConfig, H2OPolicy
from .pyramidkv import PyramidKVConfig, PyramidKVPolicy
from .quest import QuestConfig, QuestPolicy
from .sekv import SekvPolicy
from .semanticache import SemantiCacheConfig, SemantiCachePolicy
from .sentencekv import SentenceKVConfig, SentenceKVPolicy
from .snapkv import SnapKVConfig, SnapKVPolicy
from .streaming import StreamingPolicy

# name -> class; the CLI, tests and benchmarks loop over this
POLICIES: dict[str, type[Policy]] = {
    cls.name: cls for cls in (FullPolicy, StreamingPolicy, H2OPolicy, SnapKVPolicy, PyramidKVPolicy, ChunkKVPolicy,
                              SentenceKVPolicy, SemantiCachePolicy, QuestPolicy, SekvPolicy)}

__all__ = ["POLICIES", "ChunkKVConfig", "ChunkKVPolicy", "EvictionConfig", "EvictionPolicy", "FullPolicy", "H2OConfig",
           "H2OPolicy", "Policy", "PyramidKVConfig", "PyramidKVPolicy", "QuestConfig", "QuestPolicy", "SekvPolicy",
           "SemantiCacheConfig", "SemantiCachePolicy", "SentenceKVConfig", "SentenceKVPolicy", "SnapKVConfig",
           "SnapKVPolicy", "StreamingPolicy"]
