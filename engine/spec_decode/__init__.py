"""Speculative decoding without a draft model: n-gram (prompt lookup) and suffix-tree proposers."""
