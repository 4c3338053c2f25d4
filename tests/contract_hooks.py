"""schemathesis hooks for the contract runs (loaded through `hooks` in schemathesis.toml).

Generated Idempotency-Key values repeat across requests ("0", "!"), and a key already used with
another body is refused with 422 by design: each well-formed key is made fresh, so a request
runs as itself and still goes through the key's whole path. A malformed key stays, to be refused.

A query parameter generated with no values (`[]`, to break `additionalProperties` or a type) is
left out of the URL, so the request arrives valid and its 200 reads as "schema-violating request
accepted": it is sent once, empty, which is as close to "no values" as a URL comes.
"""

import uuid

import schemathesis

from leadsvc.idempotency import HEADER, KEY_PATTERN


@schemathesis.hook
def before_call(ctx, case, **kwargs):
    key = (case.headers or {}).get(HEADER)
    if isinstance(key, str) and KEY_PATTERN.fullmatch(key):
        case.headers[HEADER] = uuid.uuid4().hex
    for name, value in (case.query or {}).items():
        if value == []:
            case.query[name] = ""

