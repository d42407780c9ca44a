# SPDX-License-Identifier: Apache-2.0
"""Z-Image (diffusers `ZImagePipeline`): served whole by the `diffusers_pipeline` family for now;
this folder holds its tiny builder."""
