# SPDX-License-Identifier: Apache-2.0
"""Stable Diffusion 3 (diffusers `StableDiffusion3Pipeline`): served whole by the
`diffusers_pipeline` family; this folder holds its tiny builder."""
