"""JSON text for responses and for the JSON columns read back: orjson where it is installed, else
the standard library; `JSONProvider` makes it the Flask app's one encoder.

A page of leads is mostly JSON work: orjson encodes it several times as fast as json, and
decodes each lead's custom fields and score reasons faster too. orjson is compiled, so the
one-file .pyz (tools/build_pyz.py), which can hold pure Python only, runs on json instead; both
write compact UTF-8 JSON that keeps the keys in the order they were inserted. Request bodies are
read by json (extensions.parse_json_body), whose errors the problem documents name.
"""

from __future__ import annotations

import json
from typing import Any, Callable

from flask import Flask, Response
from flask.json.provider import JSONProvider as FlaskJSONProvider

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


class JSONProvider(FlaskJSONProvider):
    """The app's JSON (Flask's `app.json`): every answer, whether a schema serialized it, a view
    built it (documents.prebuilt_response) or it is a problem document, is written by `encode`."""

    mimetype = "application/json"

    def __init__(self, app: Flask) -> None:
        super().__init__(app)
        self.response_class: type[Response] = app.response_class

    def dumps(self, obj: Any, **kwargs: Any) -> str:
        """JSON text; options (Jinja's `tojson` asks for sorted keys) go to the standard library."""
        if not kwargs:
            try:
                return text(obj)
            except TypeError:
                # What orjson refuses and json writes (integers beyond 64 bits, lone surrogates):
                # never in an answer (custom_fields.MAX_NUMBER, fields.Money and check_storable keep them
                # out of storage), but the test client
                # encodes hostile request bodies through here.
                pass
        return json.dumps(obj, **kwargs)

    def loads(self, s: str | bytes, **kwargs: Any) -> Any:
        """The value of a JSON text."""
        return json.loads(s, **kwargs) if kwargs else decode(s)

    def response(self, *args: Any, **kwargs: Any) -> Response:
        """What `jsonify` and flask-smorest's `@blp.response` answer: one value, several as a list,
        or keyword arguments as an object, in the app's JSON."""
        if args and kwargs:
            raise TypeError("app.json.response() takes either args or kwargs, not both")
        obj = (args[0] if len(args) == 1 else list(args)) if args else (kwargs or None)
        return self.response_class(encode(obj), mimetype=self.mimetype)
