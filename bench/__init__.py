"""blobhouse benchmarks: every contender on the same data in the same run, medians, ratios.

Run ``bin/bench`` (full size, writes BENCHMARKS.md and bench/results/) or ``bin/bench --quick``.
"""
