import pytest

from engine.structured import GrammarCache


def test_hits_misses_and_least_recently_used_eviction():
    cache = GrammarCache(max_num_grammars=2)
    compiled = []

    def compile_fn(name):
        return lambda: compiled.append(name) or name.upper()

    assert cache.get_or_compile("a", compile_fn("a")) == "A"
    assert cache.get_or_compile("b", compile_fn("b")) == "B"
    assert cache.get_or_compile("a", compile_fn("a")) == "A"  # hit: "b" is now least recently used
    assert cache.get_or_compile("c", compile_fn("c")) == "C"
    assert compiled == ["a", "b", "c"] and (cache.num_hits, cache.num_misses) == (1, 3)
    assert "a" in cache and "c" in cache and "b" not in cache and len(cache) == 2


def test_a_failed_compile_caches_nothing():
    cache = GrammarCache()

    def fail():
        raise ValueError("bad grammar")

    with pytest.raises(ValueError):
        cache.get_or_compile("k", fail)
    assert "k" not in cache and cache.get_or_compile("k", lambda: 1) == 1


def test_capacity_must_be_positive():
    with pytest.raises(ValueError, match="at least 1"):
        GrammarCache(max_num_grammars=0)
