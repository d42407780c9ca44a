# SPDX-License-Identifier: Apache-2.0
"""A small byte-level BPE tokenizer for the tiny test models, trained from a built-in corpus.

Every tiny model folder gets a copy, so `AutoTokenizer.from_pretrained(folder)` works in
transformers and in vLLM without any download. Training is deterministic: the corpus is fixed and
`tokenizers` breaks ties between equally frequent pairs by the pair itself (not by hash order or
thread timing), so two trainings give the same vocabulary and merges.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

VOCAB_SIZE = 2048
"""Total tokenizer length (BPE vocabulary + special + reserved tokens); a multiple of 64."""

ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
VISION_START = "<|vision_start|>"
VISION_END = "<|vision_end|>"
IMAGE_PAD = "<|image_pad|>"
VIDEO_PAD = "<|video_pad|>"
SPECIAL_TOKENS = (ENDOFTEXT, IM_START, IM_END, VISION_START, VISION_END, IMAGE_PAD, VIDEO_PAD)
"""Placed right after the BPE vocabulary, in this order (as in Qwen's vocabulary)."""

# Qwen2.5-Omni's multimodal tokens, by the attribute names its processor reads from the
# tokenizer. Images and videos are framed by <|vision_start|> / <|vision_end|>, as vLLM's
# placeholder for this model writes them.
OMNI_NAMED_TOKENS = {
    "audio_token": "<|AUDIO|>",
    "audio_bos_token": "<|audio_bos|>",
    "audio_eos_token": "<|audio_eos|>",
    "image_token": "<|IMAGE|>",
    "video_token": "<|VIDEO|>",
    "vision_bos_token": VISION_START,
    "vision_eos_token": VISION_END,
}
TTS_PAD = "<|tts_pad|>"
TTS_TEXT_BOS = "<|tts_text_bos|>"
TTS_TEXT_EOD = "<|tts_text_eod|>"

RESERVED_TOKENS = 16
"""At least this many `<|reserved_N|>` tokens fill the end of the vocabulary (more if the corpus
yields fewer merges), so that every id a random model can sample decodes to something. A
flavor's special tokens take the first of these places, so flavors without corpus lines of their
own share the BPE vocabulary and the common special tokens' ids."""

BPE_VOCAB_SIZE = VOCAB_SIZE - len(SPECIAL_TOKENS) - RESERVED_TOKENS

# ChatML, as Qwen uses it. Written for transformers' and vLLM's jinja2 sandbox.
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)


def omni_chat_template(image: str, audio: str, video: str) -> str:
    """ChatML whose content parts (OpenAI/vLLM part types) become the given placeholders, one
    per item: the processor expands each to the item's number of embeddings."""
    return (
        "{%- for message in messages -%}"
        "{{- '<|im_start|>' + message['role'] + '\\n' -}}"
        "{%- if message['content'] is string -%}{{- message['content'] -}}"
        "{%- else -%}{%- for part in message['content'] -%}"
        "{%- if part['type'] == 'text' -%}{{- part['text'] -}}"
        "{%- elif part['type'] in ('image', 'image_url', 'image_pil', 'image_embeds') -%}"
        f"{{{{- '{image}' -}}}}"
        "{%- elif part['type'] in ('audio', 'audio_url', 'input_audio', 'audio_embeds') -%}"
        f"{{{{- '{audio}' -}}}}"
        "{%- elif part['type'] in ('video', 'video_url') -%}"
        f"{{{{- '{video}' -}}}}"
        "{%- endif -%}{%- endfor -%}{%- endif -%}"
        "{{- '<|im_end|>\\n' -}}"
        "{%- endfor -%}"
        "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
    )


# Qwen2.5-Omni's placeholders. Images and videos are framed by <|vision_start|> /
# <|vision_end|>, as vLLM's placeholder for this model writes them.
OMNI_CHAT_TEMPLATE = omni_chat_template(
    "<|vision_start|><|IMAGE|><|vision_end|>",
    "<|audio_bos|><|AUDIO|><|audio_eos|>",
    "<|vision_start|><|VIDEO|><|vision_end|>",
)

# A small, varied English corpus: everyday prose, numbers, code-ish text, punctuation and the
# kind of image descriptions that the Qwen-Image prompt template asks for.
CORPUS = """\
The quick brown fox jumps over the lazy dog near the river bank.
A red apple sits on a wooden table beside a glass of cold water.
She walked to the market on Saturday morning and bought fresh bread, cheese and olives.
The weather today is sunny with a light breeze from the west; tomorrow it may rain.
Describe the image by detailing the color, shape, size, texture, quantity, text,
spatial relationships of the objects and background.
In the picture, three small blue birds rest on a thin branch above a quiet pond.
A tall glass building reflects the orange light of the setting sun over the city.
The cat slept on the soft green sofa while the children played in the garden.
Please write a short poem about the ocean, the stars and the moon at night.
What is the capital of France? The capital of France is Paris.
How many days are there in a week? There are seven days in a week.
Water boils at 100 degrees Celsius and freezes at 0 degrees at sea level.
The train leaves the station at 9:45 and arrives in the city at 11:30.
He counted 1, 2, 3, 4, 5, 6, 7, 8, 9 and 10 coins on the floor.
In 2024 the company hired 250 engineers and opened offices in 12 countries.
def add(a, b):\n    return a + b
for i in range(10):\n    print(i * i)
import numpy as np\nx = np.zeros((3, 4), dtype=np.float32)
{"name": "tiny", "layers": 8, "hidden_size": 256, "enabled": true}
The model generates text one token at a time, using the tokens it has already produced.
Large language models are trained on a lot of text from books, articles and websites.
A pipeline splits the layers of a network across several devices to serve longer prompts.
The scheduler decides which requests run in the next step and how many tokens each one gets.
Memory for the key and value cache is allocated in fixed size blocks of tokens.
A white dog with brown spots runs across a field of yellow flowers under a clear sky.
Two people sit on a bench in a park, talking and drinking coffee from paper cups.
An old stone bridge crosses a narrow stream surrounded by tall pine trees and mossy rocks.
The kitchen has a black stove, a silver kettle and a shelf full of colorful jars.
A round clock on the wall shows a quarter past three in the afternoon.
The sign above the door reads OPEN in bright red letters with a white border.
Snow covers the mountains while the valley below stays green and warm.
A little girl holds a purple balloon and smiles at her father.
Five oranges, two lemons and a bunch of bananas fill a woven basket.
The astronaut floats inside the station and looks at the blue planet through the window.
Rain drops run down the window as the bus drives slowly through the busy street.
Our team will meet on Monday to review the results and plan the next release.
Thank you for your help! I really appreciate it, and I will call you tomorrow.
Can you explain why the sky is blue? Sunlight scatters off small molecules in the air.
Once upon a time, a young prince lived in a castle at the edge of a dark forest.
The recipe needs two cups of flour, one egg, a pinch of salt and half a cup of milk.
Mix the ingredients, pour the batter into a pan and bake it for thirty minutes.
The library is open from eight in the morning until ten in the evening.
Scientists observed a bright comet passing close to the sun last spring.
My favorite colors are green, blue, violet and a deep shade of gold.
The square box is heavier than the round one, but the triangle is the smallest.
A soft wool blanket with a striped pattern lies folded at the end of the bed.
Yes, no, maybe; perhaps later, or never: the answer depends on the question.
"Hello," said the robot. "How can I help you today?"
The price rose from $3.50 to $4.25, an increase of about 21 percent.
Email me at someone@example.com or visit https://example.com/docs for details.
The hikers climbed the steep trail for hours and reached the summit before noon.
A small boat with a white sail drifts across the calm lake at dawn.
The museum displays ancient pottery, bronze tools and gold jewelry from many cultures.
He fixed the bicycle, painted the fence and cleaned the windows before dinner.
Every student received a notebook, a pencil and a ruler on the first day of school.
The orchestra played a slow piece, and the audience listened in complete silence.
Bright neon lights glow above the crowded night market full of food stalls.
The farmer planted rows of corn, beans and pumpkins in the rich dark soil.
The photograph shows a foggy harbor with fishing boats tied to a long pier.
Quantum computers use qubits, which can hold a mix of zero and one at the same time.
Translate the sentence into French: the book is on the table.
Summarize the story in one sentence and list the main characters.
The system prompt tells the assistant to answer the user politely and briefly.
You are a helpful assistant. The user asks a question and the assistant replies.
Engineers measured latency, throughput and memory usage under a heavy synthetic workload.
Chemistry explains how atoms combine into molecules through electrons and energy.
Volcanoes erupt when pressure builds beneath the crust and molten rock escapes upward.
The violinist tuned her instrument carefully before the evening concert began.
Elephants, giraffes, zebras and lions gather around the waterhole during the dry season.
Our neighbor grows tomatoes, cucumbers, peppers, carrots and lettuce in raised beds.
The detective examined fingerprints, footprints and a torn envelope on the desk.
Physics describes motion, gravity, electricity, magnetism, light and thermodynamics.
The hospital hired additional nurses, doctors and pharmacists for the winter months.
Musicians improvise melodies, harmonies and rhythms during a lively jazz session.
The spacecraft entered orbit, deployed its antenna and transmitted photographs home.
Historians believe the treaty was signed quietly in a monastery during autumn.
Compilers translate source code into machine instructions that processors execute.
Vegetarian dishes often include lentils, chickpeas, spinach, mushrooms and tofu.
The carpenter sanded the oak plank, measured twice and cut once with a sharp saw.
Penguins waddle across icy beaches, dive gracefully and catch fish underwater.
Democracy depends on elections, independent courts, free press and public debate.
The marathon runners stretched, hydrated and waited nervously behind the starting line.
A gentle breeze rustled the leaves, and fireflies flickered across the meadow.
Mathematics studies numbers, equations, geometry, probability and infinite series.
The bakery sells croissants, baguettes, muffins, cinnamon rolls and chocolate cookies.
Programmers debug errors, write unit tests and refactor functions to improve readability.
Ancient sailors navigated by constellations, ocean currents and migrating seabirds.
The thunderstorm knocked out electricity, flooded basements and uprooted several trees.
Photographers adjust aperture, shutter speed and exposure to capture sharp portraits.
The committee approved the budget, postponed the vote and adjourned until Thursday.
Butterflies migrate thousands of kilometers, guided by sunlight and magnetic fields.
The jeweler polished emerald, sapphire, ruby and diamond rings for the exhibition.
Kubernetes schedules containers across nodes, restarts failures and balances traffic.
Grandmother knitted scarves, mittens and sweaters for every grandchild each December.
The pharmacist warned that combining medications could cause dizziness or nausea.
Skyscrapers, bridges, tunnels and highways require careful structural engineering.
Volunteers collected plastic bottles, cardboard boxes and aluminum cans along the shore.
A mysterious lighthouse keeper wrote letters nobody ever answered.
Wednesday, Friday and Sunday are reserved for swimming, cycling and yoga practice.
The geologist identified granite, basalt, limestone and quartz in the canyon walls.
Tokenizers split text into pieces; embeddings turn those pieces into vectors.
Attention layers compare queries with keys and mix values by their similarity.
January, February, March, April, May, June, July, August, September, October, November.
The volcano, the glacier and the desert appear together in this unusual landscape painting.
Hungry squirrels buried acorns, hazelnuts and walnuts before the first frost arrived.
The archaeologist carefully brushed dust from a fragile ceramic vase with painted spirals.
Vivid turquoise, crimson, magenta, indigo and amber stripes decorate the silk kite.
"""


@dataclass(frozen=True, eq=False)  # hashed by identity: the trained tokenizers are cached
class Flavor:
    """What a model's tokenizer adds to the common one: named special tokens (the attributes its
    processor reads), more special tokens, its chat template, and corpus lines that make words
    its model code looks up by id (Qwen3-Omni's role names) single tokens."""

    name: str
    named_tokens: Mapping[str, str] = field(default_factory=dict)
    more_specials: tuple[str, ...] = ()
    chat_template: str = CHAT_TEMPLATE
    corpus: tuple[str, ...] = ()

    @property
    def specials(self) -> tuple[str, ...]:
        """Special tokens after SPECIAL_TOKENS, in order: the named ones, then the others."""
        extra = (*self.named_tokens.values(), *self.more_specials)
        return tuple(dict.fromkeys(t for t in extra if t not in SPECIAL_TOKENS))


PLAIN = Flavor("plain")


def _corpus_lines(flavor: Flavor) -> list[str]:
    # Each line is one training "sentence"; the literal "\n" in the code lines is a real newline.
    lines = [line.replace("\\n", "\n") for line in CORPUS.splitlines() if line.strip()]
    return lines + list(flavor.corpus)


def train_tokenizer(flavor: Flavor = PLAIN):
    """Train the byte-level BPE and wrap it as a `transformers.PreTrainedTokenizerFast`; the
    flavor's special tokens follow the common ones."""
    from tokenizers import (
        AddedToken,
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        trainers,
    )
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    # GPT-2 style byte-level pre-tokenisation: split on words/numbers/punctuation, then map bytes.
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=BPE_VOCAB_SIZE,
        min_frequency=1,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
    )
    # Repeat the corpus so that frequencies, not first occurrences, drive the early merges.
    tok.train_from_iterator(_corpus_lines(flavor) * 4, trainer=trainer)
    learned = tok.get_vocab_size()
    if learned > BPE_VOCAB_SIZE:
        raise RuntimeError(f"BPE vocab_size {learned} exceeds BPE_VOCAB_SIZE {BPE_VOCAB_SIZE}")

    specials = SPECIAL_TOKENS + flavor.specials
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    # Fill the rest of the vocabulary with reserved tokens: the tokenizer length then equals the
    # models' vocab_size, so whatever id a random model samples, it decodes.
    reserved = [f"<|reserved_{i}|>" for i in range(VOCAB_SIZE - tok.get_vocab_size())]
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in reserved])
    if tok.get_vocab_size() != VOCAB_SIZE:
        raise RuntimeError(f"tokenizer has {tok.get_vocab_size()} tokens, expected {VOCAB_SIZE}")

    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=IM_END,
        pad_token=ENDOFTEXT,
        unk_token=None,
        bos_token=None,
        model_max_length=65536,
        chat_template=flavor.chat_template,
        clean_up_tokenization_spaces=False,
        extra_special_tokens=dict(flavor.named_tokens) or None,
    )


@lru_cache(maxsize=4)
def _trained(flavor: Flavor = PLAIN):
    return train_tokenizer(flavor)


def save_tokenizer(out_dir: Path, flavor: Flavor = PLAIN) -> None:
    """Write the (cached) trained tokenizer's files into `out_dir`."""
    _trained(flavor).save_pretrained(str(out_dir))


def token_id(token: str, flavor: Flavor = PLAIN) -> int:
    """The id of a token of the flavor's trained tokenizer."""
    tid = _trained(flavor).convert_tokens_to_ids(token)
    if not isinstance(tid, int) or tid < 0:
        raise KeyError(f"token {token!r} is not in the tiny tokenizer")
    return tid
