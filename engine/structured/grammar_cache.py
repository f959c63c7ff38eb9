"""``GrammarCache``: compiled grammars by key, so a repeated schema never pays its compile again."""

from collections import OrderedDict
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class GrammarCache(Generic[T]):
    """Least recently used entries go first once more than ``max_num_grammars`` are held."""

    def __init__(self, max_num_grammars: int = 1024):
        if max_num_grammars < 1:
            raise ValueError(f"max_num_grammars must be at least 1, got {max_num_grammars}")
        self.max_num_grammars = max_num_grammars
        self.num_hits = 0
        self.num_misses = 0
        self._entries: OrderedDict[str, T] = OrderedDict()

    def get_or_compile(self, key: str, compile_fn: Callable[[], T]) -> T:
        """The entry for ``key``, made by ``compile_fn`` on a miss (an exception caches nothing)."""
        if key in self._entries:
            self.num_hits += 1
            self._entries.move_to_end(key)
            return self._entries[key]
        self.num_misses += 1
        value = compile_fn()
        self._entries[key] = value
        if len(self._entries) > self.max_num_grammars:
            self._entries.popitem(last=False)
        return value

    def __contains__(self, key: str) -> bool:
        return key in self._entries

    def __len__(self) -> int:
        return len(self._entries)
