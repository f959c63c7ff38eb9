"""Benchmarks that compare this platform with its peers in one run; results (JSON + PNG) go to bench/results/."""
