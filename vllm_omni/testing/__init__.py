# SPDX-License-Identifier: Apache-2.0
"""Tiny random-weight models of the real architectures, for the tests, the benchmarks and the
demo: built deterministically by the families' own builders (`ModelFamily.tiny_models`), kept in
a local cache (`tiny.py`) and laid out as a Hugging Face hub cache under the real repo names
(`tiny_hub.py`)."""
