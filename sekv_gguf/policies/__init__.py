"""KV-cache policies, all driven through the same hook and decode loop (``sekv_gguf.engine``)."""

from .base import Policy
from .full import FullPolicy
from .sekv import SekvPolicy

# name -> class; the CLI, tests and benchmarks loop over this
POLICIES: dict[str, type[Policy]] = {cls.name: cls for cls in (FullPolicy, SekvPolicy)}

__all__ = ["POLICIES", "FullPolicy", "Policy", "SekvPolicy"]
