# SPDX-License-Identifier: Apache-2.0
"""The OpenAI routes of the models that write and speak (the Omni families): chat completions
with audio (`chat.py`) and /v1/audio/speech (`speech.py`), given what each family says in a
`SpeechFamily` (`chat.py`)."""
