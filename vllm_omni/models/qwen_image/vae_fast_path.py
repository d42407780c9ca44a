# SPDX-License-Identifier: Apache-2.0
"""Still images through Qwen-Image's video VAE on a CPU: its 3-D work done as the 2-D work it is.

WHY: Qwen-Image's VAE is a video VAE. Each causal 3-D convolution pads the time axis with zeros
in front, so for a single frame (an image) the one output frame sees the input only through the
kernel's last temporal tap: the convolution is a 2-D one with that slice of the weight. PyTorch's
CPU `conv3d` runs these shapes on its reference kernel (`aten::slow_conv3d_forward`, no oneDNN),
10-25x slower than the equal `conv2d`, and the VAE's RMS norm (`F.normalize` over the channels of
a 5-D tensor) is 10-25x slower than the same sum of squares written out. On the tiny pipeline the
two made 90% of a 192x192 decode (docs/dit_acceleration.md, "CPU VAE decode fast path").

SCOPE: the modules of one loaded VAE (`accelerate_vae(vae)`), never diffusers' classes, so a
reference pipeline loaded elsewhere keeps diffusers' own path. The fast path runs only on CPU
tensors, for a convolution with no frame cache and one input frame (an image, or a video's first
frame), and falls back to the module's own forward otherwise. The result equals diffusers' up to
float rounding (tests/models/qwen_image/test_vae_fast_path.py). `vllm_omni._patches.all_pinned`
pins the two diffusers methods it stands in for, so a diffusers upgrade that changes them fails a
test.

REMOVE: when PyTorch's CPU conv3d takes oneDNN for these shapes (then only the norm is left).
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

NORMALIZE_EPS = 1e-12  # F.normalize's default
_FLOATS = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


def accelerate_vae(vae: torch.nn.Module) -> int:
    """Give the VAE's causal convolutions and RMS norms their single-frame CPU path; returns how
    many modules got it (0 for a VAE of another kind). Calling it again changes nothing."""
    try:
        from diffusers.models.autoencoders.autoencoder_kl_qwenimage import (
            QwenImageCausalConv3d,
            QwenImageRMS_norm,
        )
    except ImportError:  # a diffusers without Qwen-Image: nothing of this kind to speed up
        return 0
    count = 0
    for module in vae.modules():
        if getattr(module.forward, "_vllm_omni_fast_path", False):
            count += 1
            continue
        if isinstance(module, QwenImageCausalConv3d) and _is_causal_in_time(module):
            module.forward = _mark(functools.partial(_conv, module, module.forward))
        elif isinstance(module, QwenImageRMS_norm):
            module.forward = _mark(functools.partial(_rms_norm, module, module.forward))
        else:
            continue
        count += 1
    return count


def _mark(fn: functools.partial) -> functools.partial:
    fn._vllm_omni_fast_path = True
    return fn


def _is_causal_in_time(conv: torch.nn.Conv3d) -> bool:
    """Zero padding of kernel - 1 frames in front, none behind, stride and dilation 1 in time:
    then a single input frame gives a single output frame, made by the last temporal tap. (And
    the same padding on both sides in space, as Qwen-Image's are, which conv2d takes itself.)"""
    pad = conv._padding  # (W, W, H, H, T front, T back), as F.pad takes it
    return (
        pad[4] == conv.kernel_size[0] - 1
        and pad[5] == 0
        and pad[0] == pad[1]
        and pad[2] == pad[3]
        and conv.stride[0] == 1
        and conv.dilation[0] == 1
        and conv.padding == (0, 0, 0)
    )


def _conv(conv: torch.nn.Conv3d, original, x: torch.Tensor, cache_x=None) -> torch.Tensor:
    if cache_x is not None or x.device.type != "cpu" or x.dim() != 5 or x.shape[2] != 1:
        return original(x, cache_x)
    out = F.conv2d(
        x[:, :, 0],
        conv.weight[:, :, -1],
        conv.bias,
        stride=conv.stride[1:],
        padding=(conv._padding[2], conv._padding[0]),
        dilation=conv.dilation[1:],
        groups=conv.groups,
    )
    return out.unsqueeze(2)


def _rms_norm(norm: torch.nn.Module, original, x: torch.Tensor) -> torch.Tensor:
    if x.device.type != "cpu" or x.dtype not in _FLOATS:
        return original(x)
    dim = 1 if norm.channel_first else -1
    wide = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
    # F.normalize: x / max(||x||, eps), with the norm summed as squares (a fast reduction here).
    normalized = wide / wide.square().sum(dim, keepdim=True).sqrt().clamp_min(NORMALIZE_EPS)
    return normalized.to(x.dtype) * norm.scale * norm.gamma + norm.bias


def pinned() -> list:
    """The diffusers functions this module stands in for (tests/test_patches.py)."""
    from diffusers.models.autoencoders import autoencoder_kl_qwenimage as qwen_vae

    from vllm_omni._patches import Pinned

    return [
        Pinned(
            qwen_vae.QwenImageCausalConv3d,
            "forward",
            "afffb99acd51",
            "models.qwen_image.vae_fast_path stands in for it on one frame without a cache: "
            "zero padding of `_padding` (F.pad order, time in front), then the plain Conv3d.",
        ),
        Pinned(
            qwen_vae.QwenImageRMS_norm,
            "forward",
            "fc44101b6513",
            "models.qwen_image.vae_fast_path stands in for it: F.normalize over the channels "
            "(in float32 for 16-bit inputs), times `scale` and `gamma`, plus `bias`.",
        ),
    ]
