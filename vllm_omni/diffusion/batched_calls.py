# SPDX-License-Identifier: Apache-2.0
"""Several callers' calls of one module as one call: batch rows concatenated, the output split.

A pipeline calls its denoiser with tensors whose first dimension is the batch (its rows: one
per image, two with classifier-free guidance batched) beside arguments that are the same for
every row (position ids, attention options). Calls of different requests share one forward
when their arguments line up; this module decides which do and does it, knowing nothing of the
model:

- a call's rows are the first dimension of its first tensor argument (`hidden_states`);
- a tensor argument whose first dimension is the call's rows is batched: concatenated, so its
  other dimensions, dtype and device must agree; a list as long as the rows is batched too
  (Z-Image takes its latents as a list of per-image tensors, Qwen-Image its image shapes); a
  tuple is one value (CogVideoX-5b's rotary `(cos, sin)`, which two rows would otherwise split);
- a 0-d or one-element 1-d tensor (a timestep given as a scalar, or as Stable Audio's `(1,)`
  beside two guidance rows) that differs between calls is expanded to the call's rows and
  batched;
- anything else must be equal in every call, and is passed once.

Calls that differ elsewhere (another latent size, another text length) go into separate
batches. The rule reads tensors by shape, so a shared tensor whose first dimension happens to
equal the rows is taken as batched: Flux's position ids, (tokens, 3), of a 16x16 image (one
token) in calls of one row each. Joined, they no longer fit the latents and the forward raises;
a joint call that raises is run again call by call, and a call that raises alone gets its error
back as its output (`Failed`), for its caller alone.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields, is_dataclass
from typing import Any

import torch

BATCHED, SHARED, EXPANDED = "batched", "shared", "expanded"


@dataclass
class Call:
    """One caller's call: positional and keyword arguments."""

    args: tuple
    kwargs: dict[str, Any]

    @property
    def rows(self) -> int:
        for value in (*self.args, *self.kwargs.values()):
            if torch.is_tensor(value) and value.dim() > 0:
                return value.shape[0]
        raise ValueError("a batched call needs a tensor argument with a batch dimension")

    def items(self) -> list[tuple[int | str, Any]]:
        return [*enumerate(self.args), *self.kwargs.items()]


def same(a: Any, b: Any) -> bool:
    """Equality that compares tensors by value, inside lists, tuples and dicts too."""
    if torch.is_tensor(a) or torch.is_tensor(b):
        return (
            torch.is_tensor(a)
            and torch.is_tensor(b)
            and a.shape == b.shape
            and a.dtype == b.dtype
            and a.device == b.device
            and torch.equal(a, b)
        )
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(map(same, a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    try:
        return bool(a == b)
    except Exception:  # objects whose == is not a truth value
        return a is b


def _is_batched(value: Any, rows: int) -> bool:
    if torch.is_tensor(value):
        return value.dim() > 0 and value.shape[0] == rows
    return isinstance(value, list) and len(value) == rows


def _joins(a: Any, b: Any, rows_a: int, rows_b: int) -> str | None:
    """How one argument of two calls goes into a joint call; None: it cannot."""
    if _is_batched(a, rows_a) and _is_batched(b, rows_b):
        if not torch.is_tensor(a):
            return BATCHED if not torch.is_tensor(b) else None
        ok = torch.is_tensor(b) and a.shape[1:] == b.shape[1:]
        return BATCHED if ok and a.dtype == b.dtype and a.device == b.device else None
    if same(a, b):
        return SHARED
    scalars = _is_scalar(a) and _is_scalar(b) and a.shape == b.shape
    return EXPANDED if scalars and a.dtype == b.dtype and a.device == b.device else None


def _is_scalar(value: Any) -> bool:
    """A tensor of one value that the model broadcasts over the rows: 0-d, or 1-d of one."""
    return torch.is_tensor(value) and value.dim() <= 1 and value.numel() == 1


def modes(a: Call, b: Call) -> tuple[str, ...] | None:
    """How each argument of `b` joins a call with `a` (in `a.items()` order); None: it cannot."""
    if len(a.args) != len(b.args) or a.kwargs.keys() != b.kwargs.keys():
        return None
    rows_a, rows_b = a.rows, b.rows
    values_b = dict(b.items())
    joins = tuple(_joins(v, values_b[k], rows_a, rows_b) for k, v in a.items())
    return None if None in joins else joins


@dataclass
class Batch:
    """Indices of calls that are one call, and how their arguments join (every member joins
    the first alike; empty while it has one member)."""

    members: list[int]
    joins: tuple[str, ...] = ()


def partition(calls: Sequence[Call]) -> list[Batch]:
    """`calls` in batches that can each be one call, in order of first appearance."""
    batches: list[Batch] = []
    for i, call in enumerate(calls):
        for batch in batches:
            found = modes(calls[batch.members[0]], call)
            if found is not None and (len(batch.members) == 1 or found == batch.joins):
                batch.members.append(i)
                batch.joins = found
                break
        else:
            batches.append(Batch([i]))
    return batches


def _join(values: list[Any], calls: Sequence[Call], how: str) -> Any:
    if how == SHARED:
        return values[0]
    if how == EXPANDED:
        return torch.cat([v.expand(c.rows) for v, c in zip(values, calls)])
    if torch.is_tensor(values[0]):
        return torch.cat(values)
    return type(values[0])(item for value in values for item in value)


def join(calls: Sequence[Call], joins: tuple[str, ...]) -> Call:
    """Calls that join alike (see `partition`) as one."""
    if len(calls) == 1:
        return calls[0]
    n = len(calls[0].args)
    args = tuple(_join([c.args[i] for c in calls], calls, joins[i]) for i in range(n))
    kwargs = {
        k: _join([c.kwargs[k] for c in calls], calls, joins[n + j])
        for j, k in enumerate(calls[0].kwargs)
    }
    return Call(args, kwargs)


def split(output: Any, rows: Sequence[int]) -> list[Any]:
    """A joint call's output as each call's: every tensor with the joint rows first, and every
    list as long as the joint rows (Z-Image's per-image outputs), is cut into the calls' rows,
    inside tuples, dicts and output dataclasses; the rest is shared."""
    total = sum(rows)
    if len(rows) == 1:
        return [output]
    if isinstance(output, list) and len(output) == total:
        bounds = [0, *itertools.accumulate(rows)]
        return [output[a:b] for a, b in itertools.pairwise(bounds)]
    if torch.is_tensor(output):
        if output.dim() > 0 and output.shape[0] == total:
            return list(torch.split(output, list(rows)))
        return [output] * len(rows)
    if isinstance(output, dict):  # diffusers' BaseOutput is an OrderedDict dataclass
        parts = {k: split(v, rows) for k, v in output.items()}
        return [_rebuild(output, {k: p[i] for k, p in parts.items()}) for i in range(len(rows))]
    if isinstance(output, (tuple, list)):
        parts = [split(v, rows) for v in output]
        return [type(output)(p[i] for p in parts) for i in range(len(rows))]
    return [output] * len(rows)


def _rebuild(output: dict, values: dict[str, Any]) -> Any:
    if is_dataclass(output):
        known = {f.name for f in fields(output)}
        return type(output)(**{k: v for k, v in values.items() if k in known})
    return type(output)(values)


@dataclass(frozen=True)
class Failed:
    """The output of a call that raised."""

    error: Exception


def _run_alone(fn: Callable[..., Any], call: Call) -> Any:
    try:
        return fn(*call.args, **call.kwargs)
    except Exception as e:  # noqa: BLE001 - the caller's to raise, not every caller's
        return Failed(e)


def run_batched(fn: Callable[..., Any], calls: Sequence[Call]) -> list[Any]:
    """Each call's output (or `Failed`), from one call of `fn` per batch of compatible calls."""
    outputs: list[Any] = [None] * len(calls)
    for batch in partition(calls):
        members = [calls[i] for i in batch.members]
        if len(members) == 1:
            parts = [_run_alone(fn, members[0])]
        else:
            joint = join(members, batch.joins)
            try:
                parts = split(fn(*joint.args, **joint.kwargs), [c.rows for c in members])
            except Exception:  # a misread argument (see above), or one call's own failure
                parts = [_run_alone(fn, call) for call in members]
        for i, part in zip(batch.members, parts, strict=True):
            outputs[i] = part
    return outputs
