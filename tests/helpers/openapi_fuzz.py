# SPDX-License-Identifier: Apache-2.0
"""Property-based fuzzing of a live server's JSON request bodies and multipart forms, generated
from the OpenAPI schema the server publishes (schemathesis on hypothesis).

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


# ------------------------------------------------------------------ multipart forms
def form_schema(openapi: dict[str, Any], path: str, files: tuple[str, ...]) -> dict[str, Any]:
    """The JSON schema of POST `path`'s multipart form without its file fields, self-contained:
    what its text fields may hold, each read as the form's text."""
    form = openapi["paths"][path]["post"]["requestBody"]["content"]["multipart/form-data"]
    schema = inline_refs(form["schema"], openapi)
    schema["properties"] = {k: v for k, v in schema["properties"].items() if k not in files}
    schema["required"] = [k for k in schema.get("required", ()) if k not in files]
    return schema


def _as_json_operation(openapi: dict[str, Any], path: str, schema: dict[str, Any]) -> Any:
    """A one-operation document whose JSON body is `schema`: what schemathesis generates from."""
    document = {
        "openapi": openapi["openapi"],
        "info": openapi["info"],
        "paths": {
            path: {
                "post": {
                    "requestBody": {
                        "required": True,
                        "content": {"application/json": {"schema": schema}},
                    },
                    "responses": {"200": {"description": "OK"}},
                }
            }
        },
    }
    return schemathesis.openapi.from_dict(document)[path]["POST"]


def as_form(body: dict[str, Any]) -> list[tuple[str, str]]:
    """A generated body as form fields: text as is, other values as JSON text, a list as the
    field repeated, null as the field left out."""
    fields = []
    for key, value in body.items():
        for one in value if isinstance(value, list) else [value]:
            if one is not None:
                fields.append((key, one if isinstance(one, str) else json.dumps(one)))
    return fields


def violated_form_fields(schema: dict[str, Any], fields: list[tuple[str, str]]) -> set[str]:
    """The fields a form violates: unknown, missing, repeated, or text that neither as text
    nor read as a JSON value fits the field's schema (the server reads "2" as 2)."""
    keys = [key for key, _ in fields]
    violated = {key for key in keys if keys.count(key) > 1}
    violated |= {key for key in keys if key not in schema["properties"]}
    violated |= set(schema.get("required", ())) - set(keys)
    for key, text in fields:
        if key in violated:
            continue
        candidates: list[Any] = [text]
        try:
            candidates.append(json.loads(text))
        except ValueError:
            pass
        field_schema = Draft202012Validator(schema["properties"][key])
        if not any(field_schema.is_valid(value) for value in candidates):
            violated.add(key)
    return violated


def _send_form(
    base_url: str, path: str, headers: dict[str, str], fields: list, files: list
) -> requests.Response:
    note(f"POST {path} form {fields!r}")
    return requests.post(
        f"{base_url}{path}", data=fields, files=files, headers=headers, timeout=120
    )


def fuzz_form_operation(
    base_url: str,
    headers: dict[str, str],
    openapi: dict[str, Any],
    path: str,
    *,
    files: dict[str, Any],
    cheap: dict[str, Any],
    check_ok: Callable[[dict[str, Any], dict[str, Any]], None],
    positive_examples: int,
    negative_examples: int,
) -> Tally:
    """`fuzz_operation` for a multipart form: its text fields generated from the published
    form schema, sent with `files` (a valid upload: `{field: (name, bytes, type)}`)."""
    tally = Tally()
    published = form_schema(openapi, path, tuple(files))
    uploads = list(files.items())
    narrowed = copy.deepcopy(published)
    narrowed["properties"].update(cheap)
    narrowed["required"] = sorted({*narrowed["required"], *cheap})

    @fuzz_settings(positive_examples)
    @given(
        _as_json_operation(openapi, path, narrowed).as_strategy(
            generation_mode=schemathesis.GenerationMode.POSITIVE
        )
    )
    def valid_forms_are_accepted(case) -> None:
        fields = as_form(case.body)
        assert violated_form_fields(published, fields) == set(), fields
        response = _send_form(base_url, path, headers, fields, uploads)
        tally.valid += 1
        if 200 <= response.status_code < 300:
            tally.accepted += 1
            check_ok(case.body, response.json())
        else:
            tally.refusals[_check_error(response, fields=set(case.body))] += 1

    @fuzz_settings(negative_examples)
    @given(
        _as_json_operation(openapi, path, published).as_strategy(
            generation_mode=schemathesis.GenerationMode.NEGATIVE
        )
    )
    def invalid_forms_are_refused(case) -> None:
        if not isinstance(case.body, dict):
            reject()  # a form is a set of fields: nothing else can be sent as one
        fields = as_form(case.body)
        violated = violated_form_fields(published, fields)
        if not violated:
            reject()  # as form text the body is valid (e.g. 2 sent as "2" to a text field)
        tally.invalid += 1
        _check_error(_send_form(base_url, path, headers, fields, uploads), violated)

    valid_forms_are_accepted()
    invalid_forms_are_refused()
    return tally
