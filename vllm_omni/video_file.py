# SPDX-License-Identifier: Apache-2.0
"""Video frames to an MP4 file that browsers and ffprobe play: H.264 in yuv420p, the index at
the front (`+faststart`, so playback starts before the whole file has arrived), through PyAV's
bundled FFmpeg (no system ffmpeg).

    data = encode_mp4(output.video, output.fps)     # uint8 (frames, height, width, 3)
"""

from __future__ import annotations

import io
import tempfile
from fractions import Fraction
from pathlib import Path

import numpy as np

CODEC = "libx264"
PIXEL_FORMAT = "yuv420p"  # what browsers decode; it halves chroma, so sides must be even
QUALITY_CRF = "18"  # visually lossless for x264


def encode_mp4(frames: np.ndarray, fps: float) -> bytes:
    """uint8 frames (frames, height, width, 3), RGB -> the bytes of an MP4 file."""
    frames = np.asarray(frames)
    if frames.dtype != np.uint8 or frames.ndim != 4 or frames.shape[-1] != 3:
        raise ValueError(
            f"frames: want uint8 (frames, height, width, 3), got {frames.dtype} {frames.shape}"
        )
    if frames.shape[1] % 2 or frames.shape[2] % 2:
        raise ValueError(
            f"frames: height and width must be even for {PIXEL_FORMAT}, got "
            f"{frames.shape[1]}x{frames.shape[2]}"
        )
    # A file, not memory: +faststart rewrites it to move the index to the front.
    with tempfile.TemporaryDirectory(prefix="vllm_omni_mp4_") as folder:
        path = Path(folder) / "video.mp4"
        _write(path, frames, fps)
        return path.read_bytes()


def _write(path: Path, frames: np.ndarray, fps: float) -> None:
    import av

    with av.open(str(path), mode="w", options={"movflags": "+faststart"}) as container:
        stream = container.add_stream(CODEC, rate=Fraction(fps).limit_denominator(1001))
        stream.width, stream.height = frames.shape[2], frames.shape[1]
        stream.pix_fmt = PIXEL_FORMAT
        stream.options = {"crf": QUALITY_CRF}
        for frame in frames:
            container.mux(stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")))
        container.mux(stream.encode())  # flush


def decode_mp4(data: bytes) -> tuple[np.ndarray, float]:
    """An MP4 file's frames (uint8, RGB) and frame rate, for checks and clients."""
    import av

    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.video[0]
        frames = [f.to_ndarray(format="rgb24") for f in container.decode(stream)]
        return np.stack(frames), float(stream.average_rate)
