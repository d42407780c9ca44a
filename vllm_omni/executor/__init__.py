# SPDX-License-Identifier: Apache-2.0
"""Executors vLLM lacks for a platform: `cpu_ray.CPURayExecutor` (Ray on CPU)."""
