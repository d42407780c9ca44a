# SPDX-License-Identifier: Apache-2.0
"""What every benchmark shares: provenance and the JSON writer, a server on a free port, and
the statistics of paired runs."""

from benchmarks.common.provenance import provenance
from benchmarks.common.results import write_result
from benchmarks.common.server import BIN, ServerProcess, free_port
from benchmarks.common.stats import alternate, geomean, paired_ratio, percentile

__all__ = [
    "BIN",
    "ServerProcess",
    "alternate",
    "free_port",
    "geomean",
    "paired_ratio",
    "percentile",
    "provenance",
    "write_result",
]
