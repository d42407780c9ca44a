# SPDX-License-Identifier: Apache-2.0
"""The speech API's audio formats: each encodes a tone, mono or stereo, that decodes back to it."""

from __future__ import annotations

import io
import wave

import numpy as np
import pytest

from vllm_omni.audio_file import FORMATS, decode_audio, encode_audio, wav_header

RATE = 24_000
TONE = (0.5 * np.sin(2 * np.pi * 440 * np.arange(RATE) / RATE)).astype(np.float32)


def test_pcm_is_16_bit_little_endian_and_clipped():
    data = encode_audio(np.array([0.0, 0.5, -1.0, 2.0], np.float32), RATE, "pcm")
    assert np.frombuffer(data, "<i2").tolist() == [0, 16384, -32767, 32767]


@pytest.mark.parametrize("fmt", [f for f in FORMATS if f != "pcm"])
def test_each_format_decodes_to_the_tone(fmt):
    samples, rate = decode_audio(encode_audio(TONE, RATE, fmt))
    if rate != RATE:  # opus decodes at 48 kHz
        samples = samples[:: rate // RATE]
    assert abs(len(samples) - RATE) < 0.1 * RATE  # codecs pad a frame or two
    spectrum = np.abs(np.fft.rfft(samples[:RATE]))
    assert abs(int(np.argmax(spectrum)) * RATE / min(len(samples), RATE) - 440) < 5
    assert 0.4 < np.abs(samples).max() < 0.6


@pytest.mark.parametrize("fmt", [f for f in FORMATS if f != "pcm"])
def test_stereo_keeps_its_two_channels(fmt):
    low = (0.5 * np.sin(2 * np.pi * 220 * np.arange(RATE) / RATE)).astype(np.float32)
    samples, rate = decode_audio(encode_audio(np.stack([TONE, low]), RATE, fmt))
    assert samples.shape[0] == 2
    step = rate // RATE  # opus decodes at 48 kHz
    for channel, hz in zip(samples, (440, 220)):
        spectrum = np.abs(np.fft.rfft(channel[::step][:RATE]))
        assert abs(int(np.argmax(spectrum)) * RATE / min(len(channel[::step]), RATE) - hz) < 5


def test_stereo_pcm_interleaves_the_channels():
    data = encode_audio(np.array([[0.5, 0.0], [-0.5, 1.0]], np.float32), RATE, "pcm")
    assert np.frombuffer(data, "<i2").tolist() == [16384, -16384, 0, 32767]


def test_a_streamed_wav_header_opens_as_wav():
    data = wav_header(RATE) + encode_audio(TONE[:100], RATE, "pcm")
    with wave.open(io.BytesIO(data)) as f:
        assert (f.getnchannels(), f.getsampwidth(), f.getframerate()) == (1, 2, RATE)


def test_unknown_format_names_the_field():
    with pytest.raises(ValueError, match="fmt: must be one of"):
        encode_audio(TONE, RATE, "ogg")
