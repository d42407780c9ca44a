# SPDX-License-Identifier: Apache-2.0
"""Random media for chat messages: an image and a WAV clip, as OpenAI message parts and as the
arrays transformers' processor takes for the same message."""

from __future__ import annotations

import base64
import io

import torch


def image_part(gen: torch.Generator, height: int = 56, width: int = 112):
    """(PIL image, `image_url` part with it as a PNG data URL). 56x112: a 4x8 patch grid."""
    from PIL import Image

    image = Image.fromarray((torch.rand(height, width, 3, generator=gen) * 255).byte().numpy())
    png = io.BytesIO()
    image.save(png, format="PNG")
    url = "data:image/png;base64," + base64.b64encode(png.getvalue()).decode()
    return image, {"type": "image_url", "image_url": {"url": url}}


def audio_part(gen: torch.Generator, seconds: float = 1.0, rate: int = 16000):
    """(float32 samples, `input_audio` part with them as a float WAV: exact samples)."""
    import soundfile

    samples = (torch.rand(int(seconds * rate), generator=gen) * 0.2 - 0.1).numpy()
    wav = io.BytesIO()
    soundfile.write(wav, samples, rate, format="WAV", subtype="FLOAT")
    sound = {"data": base64.b64encode(wav.getvalue()).decode(), "format": "wav"}
    return samples, {"type": "input_audio", "input_audio": sound}


def picture(seed: int, size: tuple[int, int] = (80, 64)):
    """A smooth, seeded RGB picture (PIL image, width x height): an input image to edit."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    coarse = rng.integers(0, 256, (4, 5, 3), dtype=np.uint8)
    return Image.fromarray(coarse).resize(size, Image.BILINEAR)
