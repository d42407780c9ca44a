# SPDX-License-Identifier: Apache-2.0
"""MP4 out: H.264 in yuv420p with the index first, which decodes back to the frames."""

from __future__ import annotations

import io

import av
import numpy as np
import pytest

from vllm_omni.video_file import decode_mp4, encode_mp4


def gradient_frames(count: int = 9, height: int = 48, width: int = 64) -> np.ndarray:
    """Smooth frames that move: what H.264 keeps nearly exactly at high quality."""
    x = np.linspace(0, 255, width)[None, None, :]
    t = np.arange(count)[:, None, None] * 8
    y = np.linspace(0, 128, height)[None, :, None]
    red = (x + t) % 256
    return np.stack([red + 0 * y, 255 - red + 0 * y, y + 0 * red], axis=-1).astype(np.uint8)


def test_mp4_is_h264_yuv420p_and_decodes_to_the_frames() -> None:
    frames = gradient_frames()
    data = encode_mp4(frames, fps=16.0)
    assert data[4:8] == b"ftyp" and data.find(b"moov") < data.find(b"mdat")  # playable early
    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.video[0]
        assert stream.codec_context.name == "h264"
        assert stream.format.name == "yuv420p"
    decoded, fps = decode_mp4(data)
    assert decoded.shape == frames.shape and fps == 16.0
    assert np.abs(decoded.astype(int) - frames).mean() < 3  # lossy, but close


@pytest.mark.parametrize(
    ("frames", "message"),
    [
        (np.zeros((2, 8, 8, 3), np.float32), "want uint8"),
        (np.zeros((2, 8, 8), np.uint8), "want uint8"),
        (np.zeros((2, 9, 8, 3), np.uint8), "must be even"),
    ],
)
def test_bad_frames_are_refused(frames, message) -> None:
    with pytest.raises(ValueError, match=message):
        encode_mp4(frames, fps=16.0)
