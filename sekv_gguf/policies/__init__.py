"""KV-cache policies, all driven through the same hook and decode loop (``sekv_gguf.engine``)."""

from .base import Policy
from .chunkkv import ChunkKVPolicy
from .eviction import EvictionPolicy
from .full import FullPolicy
from .h2o import H2OPolicy
from .pyramidkv import PyramidKVPolicy
from .quest import QuestPolicy
from .sekv import SekvPolicy
from .semanticache import SemantiCachePolicy
from .sentencekv import SentenceKVPolicy
from .snapkv import SnapKVPolicy
from .streaming import StreamingPolicy

# name -> class; the CLI, tests and benchmarks loop over this
POLICIES: dict[str, type[Policy]] = {
    cls.name: cls for cls in (FullPolicy, StreamingPolicy, H2OPolicy, SnapKVPolicy, PyramidKVPolicy, ChunkKVPolicy,
                              SentenceKVPolicy, SemantiCachePolicy, QuestPolicy, SekvPolicy)}

__all__ = ["POLICIES", "ChunkKVPolicy", "EvictionPolicy", "FullPolicy", "H2OPolicy", "Policy", "PyramidKVPolicy",
           "QuestPolicy", "SekvPolicy", "SemantiCachePolicy", "SentenceKVPolicy", "SnapKVPolicy", "StreamingPolicy"]
