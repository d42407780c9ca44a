# SPDX-License-Identifier: Apache-2.0
"""Each stage's modules, built on the meta device from a model's config files (no weights read).

The memory plan (vllm_omni.engine.memory_plan) counts their parameters and reads the decoder
config that sizes an AR stage's KV cache. What a stage holds:

- an AR stage of a transformers model: the class its `config.json` names (`architectures[0]`),
  or, for a family whose graph splits one checkpoint into stages, the part that stage runs
  (`ModelFamily.split_stages`, e.g. Qwen2.5-Omni's thinker, talker and token2wav);
- a DiT stage of a diffusers pipeline: every model component of `model_index.json` that no other
  stage of the graph loads (Qwen-Image's DiT stage: transformer and VAE; its text encoder is an
  AR stage of its own).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import torch


def on_meta(build: Callable[[], torch.nn.Module]) -> torch.nn.Module:
    """`build()` on the meta device: shapes only, no memory (the plan prices parameters at
    its own dtype)."""
    with torch.device("meta"):
        return build()


def transformers_stage(folder: Path, stage: str) -> torch.nn.Module:
    """The module an AR (or split) stage of a transformers checkpoint runs."""
    import transformers

    from vllm_omni.registry import detect_family

    config = transformers.AutoConfig.from_pretrained(folder)
    split = detect_family(folder).split_stages
    if stage in split:
        class_name, attr = split[stage]
        config = getattr(config, attr)
    else:
        names = getattr(config, "architectures", None) or []
        if not names:
            raise ValueError(f"model: {str(folder)!r}: config.json names no architectures")
        class_name = names[0]
    cls = getattr(transformers, class_name, None)
    if cls is None:
        raise ValueError(f"model: transformers has no class {class_name!r} (from {folder})")
    return on_meta(lambda: cls._from_config(config))


def diffusers_components(folder: Path, skip: set[str]) -> dict[str, torch.nn.Module]:
    """A diffusers pipeline's model components (name -> module), but for those in `skip`."""
    import diffusers

    index = json.loads((folder / "model_index.json").read_text())
    modules: dict[str, torch.nn.Module] = {}
    for name, value in index.items():
        if name.startswith("_") or name in skip or not isinstance(value, list):
            continue
        library, class_name = value
        if library == "diffusers" and hasattr(diffusers, class_name):
            cls = getattr(diffusers, class_name)
            if not issubclass(cls, diffusers.ModelMixin):
                continue  # a scheduler
            config = cls.load_config(folder / name)
            modules[name] = on_meta(lambda cls=cls, config=config: cls.from_config(config))
        elif library == "transformers" and (folder / name / "config.json").is_file():
            modules[name] = transformers_stage(folder / name, name)
    return modules
