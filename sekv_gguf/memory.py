"""Conversation memories for a served model: one live policy, an LRU of saved memories (snapshots in host RAM,
bounded), a checkpoint at the end of each prompt, and a small scratch context for side requests.

Desktop clients send every turn as the whole conversation; between turns they send short unrelated prompts (chat
titles, tags, follow-up suggestions). ``select`` picks, for a new prompt, the memory that shares the longest prefix
with it: the live one, a saved one (the live one is saved and the other restored), or — for a short prompt that
continues no memory — the scratch context, so that the conversation is not wiped. ``truncate`` keeps a
prefix (the generation loop asks for it when a prompt diverges from the memory); a divergence at or before the end
of the last prompt (regenerate, an edited reply) starts from that prompt's checkpoint.

With a memory directory (``disk``, ``memory_dir.MemoryDir``) the live memory is queued for a memory file after each
request on it (``end_turn``; written by a background thread), every memory is written at ``close``, and a prompt
whose longest shared prefix is with a saved file is served by restoring that file instead of a prefill.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence


from .errors import MemoryFileError, SekvError
from .memory_dir import MemoryDir, common_prefix
from .memory_file import Fingerprint, SavedMemory, capture, capture_snapshot, restore_into
from .policies.base import Policy
from .policies.snapshot import Snapshot
from .stats import MemoryCounts


@dataclass
class MemoryConfig:
    """memories: conversation memories kept (the live one included); host_limit: most bytes the saved ones may
    hold in host RAM (the oldest go first); share: a prompt continues a memory when their common prefix covers at
    least this share of the memory; scratch_tokens: a prompt (plus its reply) of at most this many tokens that
    continues no memory runs in the scratch context."""

    memories: int = 2
    host_limit: int = 4 << 30
    share: float = 0.5
    scratch_tokens: int = 1024

    def __post_init__(self) -> None:
        if self.memories < 1 or self.host_limit < 0 or self.scratch_tokens < 0 or not 0 < self.share <= 1:
            raise ValueError(f"need memories >= 1, host_limit >= 0, scratch_tokens >= 0, share in (0, 1]; "
                             f"got {self}")


class Memories:
    """The live policy (made by ``make_live``), saved memories, the prompt checkpoint and the scratch policy (made
    by ``make_scratch`` on first use); ``active`` is the policy the current request runs on."""

    def __init__(self, make_live: Callable[[], Policy], make_scratch: Callable[[], Policy] | None,
                 config: MemoryConfig | None = None, disk: MemoryDir | None = None):
        self.config = config or MemoryConfig()
        self.disk = disk
        self._on_disk: list[int] | None = None  # the live memory's tokens when it was last queued for the disk
        self.live = make_live()
        self.make_scratch = make_scratch
        self.scratch: Policy | None = None  # exists only while it serves a request (``end_request``)
        self.scratch_tokens: list[int] = []  # what the last side request held
        self.active: Policy = self.live
        self.saved: list[Snapshot] = []  # least recently used first
        self.checkpoint: Snapshot | None = None
        self.counters = MemoryCounts()

    def select(self, prompt: Sequence[int], n_predict: int) -> Policy:
        """Make the memory that best serves ``prompt`` (plus ``n_predict`` new tokens) active; returns it."""
        cfg = self.config
        self.live.before_irreversible = None  # a checkpoint still waiting belongs to the previous request
        live = common_prefix(self.live.tokens, prompt)
        shared = [common_prefix(s.tokens, prompt) for s in self.saved]
        best = max(range(len(shared)), key=shared.__getitem__, default=None)
        saved = shared[best] if best is not None else 0
        continues_live = self.live.n_tokens > 0 and live >= cfg.share * self.live.n_tokens
        continues_saved = best is not None and saved >= cfg.share * self.saved[best].n_tokens
        if self.disk is not None and self._from_disk(prompt, max(live, saved)):
            return self.active
        little = not (continues_live or continues_saved)  # a side request or a new conversation
        fits_scratch = self.make_scratch is not None and len(prompt) + n_predict <= cfg.scratch_tokens
        seen = self.scratch_tokens  # a side request that goes on (a new conversation) moves to the live memory
        continues_scratch = bool(seen) and common_prefix(seen, prompt) >= cfg.share * len(seen)
        if little and fits_scratch and self.live.n_tokens > 0 and not continues_scratch:
            if self.scratch is None:
                self.scratch = self.make_scratch()
            self.counters.scratch_requests += 1
            self.active = self.scratch
            return self.active
        self.active = self.live
        if little and self.live.n_tokens > 0:  # a new conversation (or a side request that went on): a fresh memory
            self._save_live()
            self.live.reset()
            self.checkpoint = None
            self._on_disk = None
        elif saved > live:  # an earlier conversation goes on
            snap = self.saved.pop(best)
            self._save_live()
            self.live.restore(snap)
            self.checkpoint = None
            self._on_disk = None
            self.counters.switches += 1
        return self.active

    def set_aside(self) -> None:
        """Keep the live memory among the saved ones, before another memory replaces it (``SekvLlama.load_state``)."""
        self._save_live()

    def _from_disk(self, prompt: Sequence[int], held: int) -> bool:
        """Restore the saved file that shares the longest prefix with ``prompt`` into the live memory when it shares
        more than the ``held`` tokens of the memories in RAM (and ``share`` of its own); whether it did. A damaged
        file, or one saved with other settings, is left out of the index and logged."""
        match = self.disk.best(prompt)
        path = match.path
        if path is None or match.shared <= held or match.shared < self.config.share * match.n_tokens:
            return False
        try:
            saved = self.disk.read(path)
            saved.fingerprint.check_fits(Fingerprint.of(self.live), str(path))
        except MemoryFileError as e:
            self.disk.forget(path)
            self.disk.log(f"memory dir: not restoring {path}: {e}")
            return False
        kept = len(self.saved)
        self._save_live()
        try:
            restore_into(self.live, saved, str(path))
        except MemoryFileError as e:  # the live memory is empty now: bring it back from the snapshot just taken
            if len(self.saved) > kept:
                self.live.restore(self.saved.pop())
            self.disk.forget(path)
            self.disk.log(f"memory dir: not restoring {path}: {e}")
            return False
        self.active, self.checkpoint = self.live, None
        self._on_disk = list(self.live.tokens)
        self.counters.disk_restores += 1
        return True

    def end_turn(self) -> None:
        """A request on the live memory is done: queue its memory for the memory directory (when it changed). The
        copy is taken here (device cells; span data shared), the file written by the directory's thread."""
        saved = self._live_to_save()
        if saved is not None:
            self.disk.submit(saved)

    def _live_to_save(self) -> SavedMemory | None:
        """The live memory as a ``SavedMemory`` when there is a directory and it changed since it was last saved."""
        live = self.live
        if self.disk is None or self.active is not live or live.n_tokens == 0 or live.tokens == self._on_disk:
            return None
        try:
            saved = capture(live, self.disk.config.mode)
        except SekvError as e:
            self.disk.log(f"memory dir: cannot save this conversation: {e}")
            return None
        self._on_disk = list(live.tokens)
        self.counters.disk_saves += 1
        return saved

    def _save_all(self) -> None:
        """Every memory (the live one and those in RAM) into the memory directory, written in this thread after the
        queued saves (a closing interpreter may have stopped the writer thread)."""
        self.active = self.live  # closing: no request runs
        last = self._live_to_save()
        self.disk.close()
        todo = [last] if last is not None else []
        for snap in self.saved:
            try:
                todo.append(capture_snapshot(self.live, snap, self.disk.config.mode))
            except SekvError as e:
                self.disk.log(f"memory dir: cannot save a conversation: {e}")
        for saved in todo:
            try:
                self.disk.write(saved)
            except (OSError, SekvError) as e:
                self.disk.log(f"memory dir: could not save a conversation: {type(e).__name__}: {e}")
                continue
            if saved is not last:  # the live one was counted when it was taken
                self.counters.disk_saves += 1

    def _save_live(self) -> None:
        if self.live.n_tokens == 0 or self.config.memories < 2:
            return
        self.saved.append(self.live.snapshot())
        while len(self.saved) > self.config.memories - 1 or (
                self.saved and self.host_bytes > self.config.host_limit):
            self.saved.pop(0)
            self.counters.evicted += 1

    def end_request(self) -> None:
        """A request is done: the scratch context's cells go back (its tokens are remembered)."""
        if self.scratch is not None and self.active is self.scratch:
            self.scratch_tokens = list(self.scratch.tokens)
            self.scratch.close()
            self.scratch = None
            self.active = self.live

    def mark_prompt(self) -> None:
        """The prompt is in the active memory (the live one): checkpoint it — taken when generation first changes
        the memory beyond what a cut of the window undoes (compression, a new routing), so a short reply costs no
        copy and the first token comes sooner."""
        if self.active is not self.live:
            return
        self.checkpoint = None

        def take() -> None:
            self.checkpoint = self.live.snapshot()

        self.live.before_irreversible = take

    def truncate(self, n: int) -> bool:
        """Keep the first ``n`` tokens of the active memory (from the prompt checkpoint when the cut is at or
        before its end); False when it cannot."""
        policy, cp = self.active, self.checkpoint
        if n >= policy.n_tokens:
            return True
        if (policy is self.live and cp is not None and n <= cp.n_tokens < policy.n_tokens
                and policy.tokens[:cp.n_tokens] == cp.tokens):
            policy.restore(cp)
            self.counters.checkpoint_restores += 1
        return policy.truncate(n)

    def reset(self) -> None:
        """Empty the active memory."""
        self.active.reset()
        if self.active is self.live:
            self.checkpoint = None

    @property
    def host_bytes(self) -> int:
        """Bytes held in host RAM: the live memory's spans, the checkpoint's device copy (its spans are the live
        memory's) and the saved memories (device copy and spans)."""
        cp = self.checkpoint.device.nbytes if self.checkpoint is not None else 0
        return int(self.live.host_bytes + cp + sum(s.host_bytes for s in self.saved))

    def close(self) -> None:
        """Write every memory to the memory directory (when there is one), then free them."""
        if self.disk is not None:
            try:
                self._save_all()
            finally:
                self.disk.close()  # a no-op once _save_all stopped it
        self.saved.clear()
        self.checkpoint = None
        for p in (self.live, self.scratch):
            if p is not None:
                p.close()
