# SPDX-License-Identifier: Apache-2.0
"""Benchmarks: each module compares a feature with its baseline in one run and prints ratios.

Run them from the repository root as modules (`python -m benchmarks.cpp_ttft --help`); what
they share is in `benchmarks.common`.
"""
