# SPDX-License-Identifier: Apache-2.0
"""Stage graphs: what stages a model has, how they connect, how each one runs."""
