# SPDX-License-Identifier: Apache-2.0
"""A mono float waveform to the audio formats OpenAI's speech API names: `pcm` (raw 16-bit
little-endian samples), `wav` (16-bit PCM), and `mp3`, `opus` (in Ogg), `aac` (ADTS) and
`flac` through PyAV's bundled FFmpeg encoders.

    data = encode_audio(output.audio, output.sample_rate, "mp3")
"""

from __future__ import annotations

import io
import wave

import numpy as np
import torch

FORMATS = ("mp3", "opus", "aac", "flac", "wav", "pcm")
# format -> (container, encoder)
COMPRESSED = {
    "mp3": ("mp3", "libmp3lame"),
    "opus": ("ogg", "libopus"),
    "aac": ("adts", "aac"),
    "flac": ("flac", "flac"),
}
MEDIA_TYPES = {
    "mp3": "audio/mpeg",
    "opus": "audio/ogg",
    "aac": "audio/aac",
    "flac": "audio/flac",
    "wav": "audio/wav",
    "pcm": "audio/pcm",
}


def pcm16(audio: torch.Tensor | np.ndarray) -> bytes:
    """Raw 16-bit little-endian mono samples (OpenAI's `pcm`), clipped to [-1, 1]."""
    samples = np.clip(np.asarray(audio, dtype=np.float32), -1, 1)
    return np.round(samples * 32767).astype("<i2").tobytes()


def wav_file(audio: torch.Tensor | np.ndarray, sample_rate: int) -> bytes:
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as f:
        f.setnchannels(1)
        f.setsampwidth(2)
        f.setframerate(sample_rate)
        f.writeframes(pcm16(audio))
    return buffer.getvalue()


def wav_header(sample_rate: int) -> bytes:
    """A WAV header for a stream of pcm16 samples whose length is not known yet (sizes at their
    maximum, as streaming servers write them; players read to the end)."""
    unknown = 0xFFFFFFFF
    return b"".join(
        [
            b"RIFF", unknown.to_bytes(4, "little"), b"WAVEfmt ",
            (16).to_bytes(4, "little"), (1).to_bytes(2, "little"), (1).to_bytes(2, "little"),
            sample_rate.to_bytes(4, "little"), (sample_rate * 2).to_bytes(4, "little"),
            (2).to_bytes(2, "little"), (16).to_bytes(2, "little"),
            b"data", unknown.to_bytes(4, "little"),
        ]
    )  # fmt: skip


def encode_audio(audio: torch.Tensor | np.ndarray, sample_rate: int, fmt: str) -> bytes:
    """The waveform as a file (or raw samples) of format `fmt`, one of FORMATS."""
    if fmt == "pcm":
        return pcm16(audio)
    if fmt == "wav":
        return wav_file(audio, sample_rate)
    if fmt not in COMPRESSED:
        raise ValueError(f"fmt: must be one of {list(FORMATS)}, got {fmt!r}")
    import av

    container_format, codec = COMPRESSED[fmt]
    samples = np.clip(np.asarray(audio, dtype=np.float32), -1, 1)[None]
    buffer = io.BytesIO()
    with av.open(buffer, "w", format=container_format) as container:
        stream = container.add_stream(codec, rate=sample_rate, layout="mono")
        frame = av.AudioFrame.from_ndarray(samples, format="flt", layout="mono")
        frame.sample_rate = sample_rate
        for packet in stream.encode(frame):
            container.mux(packet)
        for packet in stream.encode(None):
            container.mux(packet)
    return buffer.getvalue()


def decode_audio(data: bytes) -> tuple[np.ndarray, int]:
    """A file's mono float32 samples and rate (for tests and clients)."""
    import av

    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.audio[0]
        frames = []
        for frame in container.decode(stream):
            samples = frame.to_ndarray().reshape(-1)
            scale = 32768.0 if samples.dtype == np.int16 else 1.0  # wav and flac decode as s16
            frames.append(samples.astype(np.float32) / scale)
        return np.concatenate(frames) if frames else np.zeros(0, np.float32), stream.rate
