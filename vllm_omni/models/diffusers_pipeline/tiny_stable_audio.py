# SPDX-License-Identifier: Apache-2.0
"""A tiny random-weight Stable Audio Open, deterministic: a `diffusers.StableAudioPipeline`
folder laid out as the release `stabilityai/stable-audio-open-1.0`: a 2-layer T5 encoder, the
projection model that embeds the clip's start and end seconds (0 to 512 s, as the release's) and
passes the T5 states through unchanged (the release's `Identity`: its conditioning width is
T5's), a Stable Audio DiT of 2 blocks (4 query heads and 2 key/value heads of 16, the release's
24 and 12 of 64; partial rotary positions over the latent frames), the Oobleck VAE with the
release's five stages (2 x 4 x 4 x 8 x 8: 2048 stereo samples a latent frame at 44.1 kHz, as
the release's) shrunk to 8-32 channels and 8 latent channels (the release's 64), and the
release's cosine DPM-Solver sampler on v-predictions.

The DiT's sample size, the pipeline's default and longest clip, is 32 latent frames: 65536
samples, about 1.49 s (the release's 1024 frames, about 47.5 s); a request asks for less with
`audio_end_in_s`. The tokenizer is the T5 Unigram tokenizer the other tiny pipelines share
(vllm_omni.testing.tiny_common), padded as the release's to 128 tokens; the index names it by
the release's class, `T5Tokenizer`. Each component is saved in one file. Building or loading
the folder needs `torchsde` beside diffusers (the scheduler's Brownian noise).
"""

from __future__ import annotations

from pathlib import Path

from vllm_omni.models.diffusers_pipeline.tiny import rewrite_index
from vllm_omni.testing.tiny_common import T5_HIDDEN, randomize_, t5_text_encoder, t5_tokenizer

STABLE_AUDIO_SEED = 1017
STABLE_AUDIO_TEXT_LENGTH = 128  # the release's T5 length
STABLE_AUDIO_SAMPLE_RATE = 44100  # the release's
STABLE_AUDIO_LATENT_CHANNELS = 8  # the release's: 64
STABLE_AUDIO_SAMPLE_SIZE = 32  # latent frames: 32 * 2048 / 44100 = 1.49 s (the release's 1024)
STABLE_AUDIO_SECONDS = (0, 512)  # the start/end seconds the projection model embeds
HEAD_DIM, HEADS, KV_HEADS = 16, 4, 2  # the release's: 64, 24, 12
# The gain of the VAE decoder's weight-normed convolutions (all but its output): at 1, its
# residual stacks grow the waveform to a std of about 13 and its Snake activations turn a change
# of 1e-6 in the latents into 6e-4 of the waveform (so any batching shows); at 0.5 the waveform
# keeps a std of about 0.2, inside the -1..1 of a trained VAE's output (and of 16-bit PCM, which
# clips), and a 1e-6 change stays about 1e-6.
VAE_DECODER_GAIN = 0.5


def _projection_model():
    """The conditioning projection: T5's states as they are (the release's conditioning width is
    T5's), the start and end seconds each through a Fourier embedding and a linear layer."""
    import torch
    from diffusers.pipelines.stable_audio import StableAudioProjectionModel

    torch.manual_seed(STABLE_AUDIO_SEED + 1)
    projection = StableAudioProjectionModel(
        text_encoder_dim=T5_HIDDEN,
        conditioning_dim=T5_HIDDEN,
        min_value=STABLE_AUDIO_SECONDS[0],
        max_value=STABLE_AUDIO_SECONDS[1],
    )
    randomize_(projection, STABLE_AUDIO_SEED + 1)
    return projection


def _transformer():
    """Stable Audio's DiT: 2 blocks of self-attention (rotary on half of each head), grouped
    cross-attention to the T5 and seconds tokens, the seconds and time as one prepended global
    token; inner width 64."""
    import torch
    from diffusers import StableAudioDiTModel

    torch.manual_seed(STABLE_AUDIO_SEED + 2)
    transformer = StableAudioDiTModel(
        sample_size=STABLE_AUDIO_SAMPLE_SIZE,
        in_channels=STABLE_AUDIO_LATENT_CHANNELS,
        num_layers=2,
        attention_head_dim=HEAD_DIM,
        num_attention_heads=HEADS,
        num_key_value_attention_heads=KV_HEADS,
        out_channels=STABLE_AUDIO_LATENT_CHANNELS,
        cross_attention_dim=KV_HEADS * HEAD_DIM,  # as the release's 12 x 64 = 768
        time_proj_dim=256,
        global_states_input_dim=2 * T5_HIDDEN,  # the start and end seconds' embeddings
        cross_attention_input_dim=T5_HIDDEN,
    )
    randomize_(transformer, STABLE_AUDIO_SEED + 2)
    return transformer


def _vae():
    """The Oobleck VAE: the release's strides (2048x), stereo, 44.1 kHz; encoder 16-32 channels,
    decoder 8-32, 8 latent channels (the encoder's 16 outputs are their mean and scale); the
    decoder's inner convolutions scaled by `VAE_DECODER_GAIN`."""
    import torch
    from diffusers import AutoencoderOobleck

    torch.manual_seed(STABLE_AUDIO_SEED + 3)
    vae = AutoencoderOobleck(
        encoder_hidden_size=2 * STABLE_AUDIO_LATENT_CHANNELS,
        downsampling_ratios=[2, 4, 4, 8, 8],
        channel_multiples=[1, 1, 2, 2, 4],  # the release's: 1, 2, 4, 8, 16
        decoder_channels=8,
        decoder_input_channels=STABLE_AUDIO_LATENT_CHANNELS,
        audio_channels=2,
        sampling_rate=STABLE_AUDIO_SAMPLE_RATE,
    )
    inner = [n for n, _ in vae.named_parameters() if n.startswith("decoder") and "weight_g" in n]
    gains = {name: VAE_DECODER_GAIN for name in inner if name != "decoder.conv2.weight_g"}
    randomize_(vae, STABLE_AUDIO_SEED + 3, out_gain=gains)
    return vae


def _scheduler():
    """The release's sampler: second-order SDE DPM-Solver++ on v-predictions over an exponential
    schedule of sigmas from 500 down to 0.3, then 0; its noise is a Brownian tree (torchsde's,
    which diffusers needs to build or load this scheduler) seeded from the call's generator."""
    from diffusers import CosineDPMSolverMultistepScheduler

    return CosineDPMSolverMultistepScheduler(
        sigma_min=0.3,
        sigma_max=500,
        sigma_data=1.0,
        sigma_schedule="exponential",
        num_train_timesteps=1000,
        solver_order=2,
        prediction_type="v_prediction",
        rho=7.0,
        solver_type="midpoint",
        lower_order_final=True,
        euler_at_final=False,
        final_sigmas_type="zero",
    )


def build_stable_audio(out: Path) -> None:
    from diffusers import StableAudioPipeline

    out = Path(out)
    tokenizer = t5_tokenizer()
    tokenizer.model_max_length = STABLE_AUDIO_TEXT_LENGTH
    pipe = StableAudioPipeline(
        vae=_vae(),
        text_encoder=t5_text_encoder(len(tokenizer), STABLE_AUDIO_SEED),
        projection_model=_projection_model(),
        tokenizer=tokenizer,
        transformer=_transformer(),
        scheduler=_scheduler(),
    )
    pipe.save_pretrained(out)
    # As the release: the tokenizer named by the class the release's index names.
    rewrite_index(out, {"tokenizer": ["transformers", "T5Tokenizer"]}, drop_absent=True)
