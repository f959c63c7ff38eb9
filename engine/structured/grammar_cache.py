"""``GrammarCache``: compiled grammars by key, so a repeated schema never pays its compile again."""

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class GrammarCache(Generic[T]):
    """Least recently used entries go first once more than ``max_num_grammars`` are held.

    Thread-safe: the server compiles on worker threads while the engine loop looks grammars up at admission. The
    lock covers the bookkeeping only, never a compile, so a slow compile blocks no lookup."""

    def __init__(self, max_num_grammars: int = 1024):
        if max_num_grammars < 1:
            raise ValueError(f"max_num_grammars must be at least 1, got {max_num_grammars}")
        self.max_num_grammars = max_num_grammars
        self.num_hits = 0
        self.num_misses = 0
        self._entries: OrderedDict[str, T] = OrderedDict()
        self._lock = threading.Lock()

    def get_or_compile(self, key: str, compile_fn: Callable[[], T]) -> T:
        """The entry for ``key``, made by ``compile_fn`` on a miss (an exception caches nothing)."""
        with self._lock:
            if key in self._entries:
                self.num_hits += 1
                self._entries.move_to_end(key)
                return self._entries[key]
            self.num_misses += 1
        value = compile_fn()
        with self._lock:
            self._entries[key] = value
            self._entries.move_to_end(key)
            if len(self._entries) > self.max_num_grammars:
                self._entries.popitem(last=False)
        return value

    def stats(self) -> dict:
        """``hits``, ``misses`` (lookups since start) and ``entries`` (held now)."""
        with self._lock:
            return {"hits": self.num_hits, "misses": self.num_misses, "entries": len(self._entries)}

    def __contains__(self, key: str) -> bool:
        with self._lock:
            return key in self._entries

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)
