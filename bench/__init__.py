"""Benchmarks run by `make bench`: medians and ratios, never pass/fail gates."""
