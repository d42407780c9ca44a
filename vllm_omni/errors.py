# SPDX-License-Identifier: Apache-2.0
"""The error a request (or a stage graph) gets when one of its fields is wrong."""

from __future__ import annotations


class FieldError(ValueError):
    """`field` is wrong: `message` says how. Reads as "field: message"; the HTTP server answers
    it with a 400 whose `param` is the field. A ValueError, so callers that catch those keep
    working."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message

    def __reduce__(self):  # crosses process boundaries (a stage process's refusal) intact
        return (type(self), (self.field, self.message))
