"""Custom fields: a lead's values checked against the workspace's definitions (and normalized),
and the text of a web form's input or a CSV cell read as a field's type. Yes and no are spelt
the same way wherever text stands for a boolean: forms, CSV import and settings."""

from __future__ import annotations

import re
from datetime import date
from typing import Any, Mapping

from .fields import trim
from .models import CustomField
from .problems import ValidationFailed

MAX_TEXT_FIELD = 500   # characters in a text custom field
MAX_NUMBER = 10**15     # the largest magnitude of a number custom field
# The words that mean yes and no in text: a checkbox's value, a spreadsheet cell, an environment variable.
TRUE_WORDS = ("true", "yes", "y", "on", "1")
FALSE_WORDS = ("false", "no", "n", "off", "0")


def truth(text: str) -> bool | None:
    """What a yes-or-no word (any case) says; None when the text is neither."""
    word = text.lower()
    return True if word in TRUE_WORDS else False if word in FALSE_WORDS else None


def check_custom_fields(values: Mapping[str, Any], definitions: Mapping[str, CustomField], *,
                        allow_null: bool = False) -> dict[str, Any]:
    """Values that fit their field definitions, normalized; 422 naming each bad key otherwise."""
    errors: dict[str, list[str]] = {}
    clean: dict[str, Any] = {}
    for key, value in values.items():
        name = f"custom_fields.{key}"
        definition = definitions.get(key)
        if definition is None:
            errors[name] = ["Unknown custom field; GET /api/v1/custom-fields lists them."]
        elif value is None:
            if allow_null:
                clean[key] = None
            else:
                errors[name] = ["Leave the key out instead of sending null."]
        else:
            try:
                clean[key] = _field_value(value, definition)
            except ValueError as exc:
                errors[name] = [str(exc)]
    if errors:
        raise ValidationFailed(errors=errors)
    return clean


def _field_value(value: Any, definition: CustomField) -> Any:
    kind = definition.type
    if kind == "text":
        if not isinstance(value, str):
            raise ValueError("Must be a string.")
        value = trim(value)
        if len(value) > MAX_TEXT_FIELD:
            raise ValueError(f"At most {MAX_TEXT_FIELD} characters.")
        return value
    if kind == "number":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError("Must be a number.")
        if not -MAX_NUMBER <= value <= MAX_NUMBER:   # also NaN and the infinities
            raise ValueError(f"Must be a number between -{MAX_NUMBER:.0e} and {MAX_NUMBER:.0e}.")
        return value
    if kind == "boolean":
        if not isinstance(value, bool):
            raise ValueError("Must be true or false.")
        return value
    if kind == "date":
        if not isinstance(value, str) or not re.fullmatch(r"\d{4}-\d{2}-\d{2}", value):
            raise ValueError("Must be a date as YYYY-MM-DD.")
        try:
            date.fromisoformat(value)
        except ValueError:
            raise ValueError("Must be a real date as YYYY-MM-DD.") from None
        return value
    options = definition.options or []
    if value not in options:
        raise ValueError(f"Must be one of: {', '.join(options)}.")
    return value


# --- text as a field's type ------------------------------------------------------------------

def form_value(raw: str, definition: CustomField | None) -> Any:
    """A form field's text as the custom field's type; left as text when it does not fit (create_lead says why)."""
    kind = definition.type if definition else "text"
    if kind == "number":
        for number in (int, float):
            try:
                return number(raw)
            except ValueError:
                pass
    elif kind == "boolean" and (answer := truth(raw)) is not None:
        return answer
    return raw


def cell_value(text: str, kind: str) -> Any:
    """The JSON value a custom field's cell stands for; the field's own checks run in the pipeline."""
    if kind == "number":
        try:
            number = float(text.replace(",", ""))
        except ValueError:
            raise ValueError(f"{text!r} is not a number.") from None
        return int(number) if number.is_integer() and "." not in text else number
    if kind == "boolean":
        answer = truth(text)
        if answer is None:
            raise ValueError(f"{text!r} is not yes or no (true/false, 1/0 also work).")
        return answer
    return text
