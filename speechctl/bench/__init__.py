"""Benchmarks behind ``speechctl bench``: each reports ratios measured side by side in one run."""
