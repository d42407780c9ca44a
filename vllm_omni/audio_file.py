# SPDX-License-Identifier: Apache-2.0
"""A float waveform, mono `(samples,)` or `(channels, samples)`, to the audio formats OpenAI's
speech API names: `pcm` (raw 16-bit little-endian samples, channels interleaved), `wav` (16-bit
PCM), and `mp3`, `opus` (in Ogg), `aac` (ADTS) and `flac` through PyAV's bundled FFmpeg encoders
(mono or stereo).

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


def channels_first(audio: torch.Tensor | np.ndarray) -> np.ndarray:
    """The waveform as float32 `(channels, samples)`."""
    samples = np.asarray(audio, dtype=np.float32)
    if samples.ndim not in (1, 2):
        raise ValueError(f"audio: must be (samples,) or (channels, samples), got {samples.shape}")
    return samples[None] if samples.ndim == 1 else samples


def pcm16(audio: torch.Tensor | np.ndarray) -> bytes:
    """Raw 16-bit little-endian samples (OpenAI's `pcm`), clipped to [-1, 1], channels
    interleaved."""
    samples = np.clip(channels_first(audio), -1, 1).T
    return np.round(samples * 32767).astype("<i2").tobytes()


def wav_file(audio: torch.Tensor | np.ndarray, sample_rate: int) -> bytes:
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as f:
        f.setnchannels(channels_first(audio).shape[0])
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
    samples = np.clip(channels_first(audio), -1, 1)
    layout = {1: "mono", 2: "stereo"}.get(samples.shape[0])
    if layout is None:
        raise ValueError(f"audio: {samples.shape[0]} channels; {fmt} takes mono or stereo")
    buffer = io.BytesIO()
    with av.open(buffer, "w", format=container_format) as container:
        stream = container.add_stream(codec, rate=sample_rate, layout=layout)
        # Interleaved: one plane of (1, samples x channels).
        frame = av.AudioFrame.from_ndarray(samples.T.reshape(1, -1), format="flt", layout=layout)
        frame.sample_rate = sample_rate
        for packet in stream.encode(frame):
            container.mux(packet)
        for packet in stream.encode(None):
            container.mux(packet)
    return buffer.getvalue()


def decode_audio(data: bytes) -> tuple[np.ndarray, int]:
    """A file's float32 samples, `(samples,)` mono or `(channels, samples)`, and its rate (for
    tests and clients)."""
    import av

    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.audio[0]
        channels = stream.codec_context.channels
        frames = []
        for frame in container.decode(stream):
            samples = frame.to_ndarray()
            # Packed formats interleave the channels in one plane; planar ones give one each.
            samples = samples.reshape(-1, channels).T if frame.format.is_packed else samples
            scale = 32768.0 if samples.dtype == np.int16 else 1.0  # wav and flac decode as s16
            frames.append(samples.reshape(channels, -1).astype(np.float32) / scale)
        audio = np.concatenate(frames, axis=1) if frames else np.zeros((channels, 0), np.float32)
        return (audio[0] if channels == 1 else audio), stream.rate
