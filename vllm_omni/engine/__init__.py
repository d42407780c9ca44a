# SPDX-License-Identifier: Apache-2.0
"""The omni engine: a stage graph of per-stage engines, and the clients that drive them."""
