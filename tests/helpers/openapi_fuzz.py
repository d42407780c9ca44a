# SPDX-License-Identifier: Apache-2.0
"""Property-based fuzzing of a live server's JSON request bodies, generated from the OpenAPI
schema the server publishes (schemathesis on hypothesis).

Two runs per operation:
- positive: bodies valid under the published schema; most must be answered 2xx (counted), and a
  refusal must be a 400 naming a field - the schema may leave a rule to a description, not lie;
- negative: bodies (or raw bytes) the schema rejects; each must get a 400 whose OpenAI-style
  error names a field the body violates.
Never a 5xx. The runs are bounded and reproducible: a fixed number of examples, derandomized,
no example database, no shrinking (a failure reports the example as found).
"""

from __future__ import annotations

import copy
import json
import tempfile
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, note, reject, settings
from hypothesis.configuration import set_hypothesis_home_dir
from jsonschema import Draft202012Validator

# Hypothesis caches data (its unicode tables) under ./.hypothesis by default: keep it out of the
# repository. database=None below keeps it from storing examples at all.
set_hypothesis_home_dir(Path(tempfile.gettempdir()) / "vllm_omni-hypothesis")


def fuzz_settings(max_examples: int) -> settings:
    return settings(
        max_examples=max_examples,
        derandomize=True,  # the same examples on every run: CI is reproducible
        database=None,
        deadline=None,  # a request runs a model
        phases=[Phase.explicit, Phase.generate],  # no shrinking: each step is an HTTP request
        suppress_health_check=[
            HealthCheck.too_slow,
            HealthCheck.filter_too_much,
            HealthCheck.data_too_large,
        ],
        print_blob=False,
    )


def inline_refs(node: Any, root: dict[str, Any]) -> Any:
    """`node` with every local `$ref` replaced by its target (the bodies here are not recursive)."""
    if isinstance(node, dict):
        if "$ref" in node:
            target: Any = root
            for part in node["$ref"].removeprefix("#/").split("/"):
                target = target[part]
            rest = {k: v for k, v in node.items() if k != "$ref"}
            return inline_refs({**target, **rest}, root)
        return {k: inline_refs(v, root) for k, v in node.items()}
    if isinstance(node, list):
        return [inline_refs(v, root) for v in node]
    return node


def body_schema(openapi: dict[str, Any], path: str) -> dict[str, Any]:
    """The JSON schema of POST `path`'s JSON body, self-contained."""
    ref = openapi["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]
    return inline_refs(ref, openapi)


def violated_fields(validator: Draft202012Validator, body: Any) -> set[str] | None:
    """The top-level fields `body` violates (missing and unknown ones included): an empty set
    for a valid body, None when the body as a whole is wrong (not an object)."""
    fields: set[str] = set()
    for error in validator.iter_errors(body):
        if error.absolute_path:
            fields.add(str(error.absolute_path[0]))
        elif error.validator == "required":
            fields.update(name for name in error.validator_value if name not in body)
        elif error.validator == "additionalProperties":
            fields.update(set(body) - set(validator.schema["properties"]))
        else:
            return None
    return fields


def restrict(openapi: dict[str, Any], path: str, properties: dict[str, Any]) -> dict[str, Any]:
    """A copy of `openapi` whose body for POST `path` has `properties` replaced and required:
    how a run keeps costly fields (image size, steps) cheap. Every body it allows must still be
    valid under the published schema; `fuzz_operation` checks that for each one."""
    narrowed = copy.deepcopy(openapi)
    ref = narrowed["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]
    target = narrowed
    for part in ref["$ref"].removeprefix("#/").split("/"):
        target = target[part]
    target["properties"].update(properties)
    target["required"] = sorted({*target.get("required", ()), *properties})
    return narrowed


@dataclass
class Tally:
    """What one operation's runs sent and got."""

    valid: int = 0
    accepted: int = 0  # valid bodies answered 2xx
    invalid: int = 0
    refusals: Counter[str] = field(default_factory=Counter)  # why valid bodies got a 400

    @property
    def accepted_fraction(self) -> float:
        return self.accepted / self.valid if self.valid else 0.0


def _check_error(response: requests.Response, fields: set[str] | None) -> str:
    """A 400 with OpenAI's error body; its param names one of `fields` (None: the body as a
    whole is wrong, any param or none will do) and its message starts with the param.
    Returns the message."""
    assert response.status_code == 400, (response.status_code, response.text)
    reply = response.json()
    assert "error" in reply, reply
    error = reply["error"]
    assert error["type"] == "invalid_request_error" and error["code"] == 400, error
    param = error["param"]
    if fields is not None:
        assert param is not None and param.split(".")[0] in fields, (fields, error)
    if param is not None:
        assert error["message"].startswith(f"{param}:"), error
    return error["message"]


def _send(base_url: str, path: str, headers: dict[str, str], body: Any) -> requests.Response:
    # Raw bytes as generated: schemathesis' negative bodies include invalid JSON on purpose.
    note(f"POST {path} {body!r}")  # hypothesis prints it with a failing example
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return requests.post(
        f"{base_url}{path}",
        data=data,
        headers={**headers, "Content-Type": "application/json"},
        timeout=120,
    )


def fuzz_operation(
    base_url: str,
    headers: dict[str, str],
    openapi: dict[str, Any],
    path: str,
    *,
    cheap: dict[str, Any],
    check_ok: Callable[[dict[str, Any], dict[str, Any]], None],
    positive_examples: int,
    negative_examples: int,
) -> Tally:
    """Fuzz POST `path` as the module docstring says; `cheap` narrows costly properties of the
    positive bodies (see `restrict`), `check_ok(body, reply)` checks each 2xx reply."""
    tally = Tally()
    published = Draft202012Validator(body_schema(openapi, path))

    positive = schemathesis.openapi.from_dict(restrict(openapi, path, cheap))[path]["POST"]

    @fuzz_settings(positive_examples)
    @given(positive.as_strategy(generation_mode=schemathesis.GenerationMode.POSITIVE))
    def valid_bodies_are_accepted(case) -> None:
        assert violated_fields(published, case.body) == set(), case.body
        response = _send(base_url, path, headers, case.body)
        tally.valid += 1
        if 200 <= response.status_code < 300:
            tally.accepted += 1
            check_ok(case.body, response.json())
        else:  # allowed, as long as it is a proper 400 naming one of its fields; counted
            tally.refusals[_check_error(response, fields=set(case.body))] += 1

    negative = schemathesis.openapi.from_dict(openapi)[path]["POST"]

    @fuzz_settings(negative_examples)
    @given(negative.as_strategy(generation_mode=schemathesis.GenerationMode.NEGATIVE))
    def invalid_bodies_are_refused(case) -> None:
        body = case.body
        try:
            parsed = json.loads(body) if isinstance(body, bytes) else body
        except ValueError:  # not JSON at all: no field to name
            fields = None
        else:
            fields = violated_fields(published, parsed)
            if fields == set():
                reject()  # schemathesis may mutate into a valid body: not a negative case
        tally.invalid += 1
        _check_error(_send(base_url, path, headers, body), fields)

    valid_bodies_are_accepted()
    invalid_bodies_are_refused()
    return tally
