"""JSON text for responses and for the JSON columns read back: orjson where it is installed, else
the standard library.

A page of 50 leads is mostly JSON work: orjson encodes it several times as fast as json, and
decodes each lead's custom fields and score reasons faster too. orjson is compiled, so the
one-file .pyz (tools/build_pyz.py), which can hold pure Python only, runs on json instead; both
write compact UTF-8 JSON. Request bodies are read by json (extensions.parse_json_body), whose
errors the problem documents name.
"""

from __future__ import annotations

import json
from typing import Any, Callable

try:
    import orjson
except ImportError:   # the .pyz
    orjson = None

encode: Callable[[Any], bytes | str]
decode: Callable[[bytes | str], Any]
if orjson is not None:
    encode, decode = orjson.dumps, orjson.loads
else:
    # One encoder: json.dumps with options builds a new one per call.
    encode, decode = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode, json.loads


def text(value: Any) -> str:
    """The JSON of a value as str, for a text column (encode gives bytes where orjson is used)."""
    encoded = encode(value)
    return encoded.decode() if isinstance(encoded, bytes) else encoded
