"""Marshmallow fields and the text rules they apply: input is normalized here, at the boundary
(whitespace, blank text, Indian and other mobiles, e-mails, public ids, amounts, UTC times), and
times are dumped as RFC 3339."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import UTC, datetime
from decimal import Decimal
from functools import lru_cache

import marshmallow as ma

from .models import Workspace, public_id_pattern, public_id_regex


def rfc3339(value: datetime | None) -> str | None:
    """A naive UTC datetime as RFC 3339 with Z."""
    return None if value is None else value.isoformat(timespec="microseconds") + "Z"


class UtcDateTime(ma.fields.DateTime):
    """Dumps naive UTC datetimes as RFC 3339 with `Z`."""

    def _serialize(self, value, attr, obj, **kwargs):
        return rfc3339(value)


# --- input fields: normalization happens here, at the boundary -------------------------------

# Whitespace, as the `\s` of JSON Schema's regular expressions (ECMA-262) means it: tab, line
# feed, vertical tab, form feed, carriage return, the space separators (Zs), U+2028, U+2029 and
# U+FEFF. Input is trimmed of these alone: Python's str.strip() and isspace() take a set of their
# own (U+001C-U+001F and U+0085 too, U+FEFF not), so what the published patterns allow around a
# value would not be what the code takes off.
WHITESPACE = ("\t\n\v\f\r \xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a"
              "\u2028\u2029\u202f\u205f\u3000\ufeff")
CONTROL = "".join(map(chr, (*range(0x20), *range(0x7F, 0xA0))))   # Unicode's Cc


def char_class(chars: str, negated: bool = False) -> str:
    """A regular expression class of exactly these characters, in \\u escapes: ECMA-262 (the
    published document's dialect) and Python read it alike, which they do not `\\s`."""
    runs: list[list[int]] = []
    for code in sorted(set(map(ord, chars))):
        if runs and code == runs[-1][1] + 1:
            runs[-1][1] = code
        else:
            runs.append([code, code])
    body = "".join(f"\\u{a:04x}" if a == b else f"\\u{a:04x}-\\u{b:04x}" for a, b in runs)
    return f"[{'^' if negated else ''}{body}]"


SPACE_PATTERN = char_class(WHITESPACE)
# Text that must say something holds a character that is neither whitespace nor a control
# character: a note of a lone U+001E says nothing, and neither does one of U+0085.
NOT_BLANK_PATTERN = char_class(WHITESPACE + CONTROL, negated=True)
BLANK_PATTERN = f"^{char_class(WHITESPACE + CONTROL)}*$"


def trim(text: str) -> str:
    """The text without the whitespace at its ends (WHITESPACE; never a bare str.strip())."""
    return text.strip(WHITESPACE)


def is_blank(text: str) -> bool:
    """Whether the text holds nothing but whitespace and control characters (NOT_BLANK_PATTERN)."""
    return all(ch in WHITESPACE or ch in CONTROL for ch in text)


def comma_separated(item: str) -> str:
    """The pattern of a comma-separated list of the item's pattern, whitespace around each item
    allowed: what list_items takes apart."""
    return rf"^{SPACE_PATTERN}*{item}{SPACE_PATTERN}*(,{SPACE_PATTERN}*{item}{SPACE_PATTERN}*)*$"


def list_items(text: str) -> list[str]:
    """The items of a comma-separated query value, each trimmed (an empty one stays, to be refused)."""
    return [trim(part) for part in text.split(",")]


class Text(ma.fields.String):
    """A trimmed string of at most max_length characters."""

    def __init__(self, max_length: int, validate: tuple = (), **kwargs):
        self.max_length = max_length
        super().__init__(validate=[ma.validate.Length(max=max_length), *validate], **kwargs)

    def _deserialize(self, value, attr, data, **kwargs):
        return trim(super()._deserialize(value, attr, data, **kwargs))


# The regions whose mobiles a phone may be: the workspace's phone_regions (setup), wherever the
# code that loads a schema knows the workspace (with phones_of), else India's alone.
MOBILE_REGIONS: ContextVar[tuple[str, ...]] = ContextVar("mobile_regions", default=("IN",))


@contextmanager
def phones_of(workspace: Workspace) -> Iterator[None]:
    """Phones loaded inside the block are read as the workspace takes them (its phone_regions)."""
    token = MOBILE_REGIONS.set(workspace.phone_regions)
    try:
        yield
    finally:
        MOBILE_REGIONS.reset(token)


def invalid_mobile_message(regions: tuple[str, ...]) -> str:
    if regions == ("IN",):
        return "Enter a valid Indian mobile number, such as +91 98765 43210."
    return (f"Enter a valid mobile number of {', '.join(regions)}: an Indian one such as +91 98765 43210, "
            "any other with its + country code.")


class Mobile(ma.fields.String):
    """A mobile number of the workspace's phone regions in any common spelling, stored as E.164."""

    MAX_LENGTH = 32   # longer is no phone number however it is spelt

    def __init__(self, **kwargs):
        metadata = {"minLength": 1, "maxLength": self.MAX_LENGTH, **kwargs.pop("metadata", {})}
        super().__init__(metadata=metadata, **kwargs)

    def _deserialize(self, value, attr, data, **kwargs):
        raw = trim(super()._deserialize(value, attr, data, **kwargs))
        regions = MOBILE_REGIONS.get()
        normalized = normalize_mobile(raw, regions) if len(raw) <= self.MAX_LENGTH else None
        if normalized is None:
            raise ma.ValidationError(invalid_mobile_message(regions))
        return normalized


# +91 and ten ASCII digits, the first not 0: E.164 already, and what phonenumbers.parse reads as
# country code 91 with those ten digits as the national number (India's national prefix, 0, is
# only stripped from a number that starts with it).
_INDIAN_E164 = re.compile(r"\+91([1-9][0-9]{9})", re.ASCII)
# What a phone may be written with. phonenumbers reads keypad letters as digits ("98765abcde" is
# +919876522233) and drops trailing text ("9876543210x"), so anything else is refused before it.
PHONE_PUNCTUATION = frozenset(" +-.()")


def is_phone_text(text: str) -> bool:
    """Whether text holds only what a phone may be written with: digits, spaces and + - . ( )."""
    return all(ch.isdecimal() or ch in PHONE_PUNCTUATION for ch in text)


@lru_cache(maxsize=4096)   # a pure function; repeats (duplicates, imports) cost nothing
def normalize_mobile(raw: str, regions: tuple[str, ...] = ("IN",)) -> str | None:
    """The phone rule, wherever a phone comes in: raw as E.164 when it spells a mobile number of
    one of the regions (one without + is read as Indian), else None."""
    import phonenumbers
    from phonenumbers import PhoneNumber, PhoneNumberFormat, PhoneNumberType

    if not is_phone_text(raw):
        return None
    # A range whose plan cannot tell mobiles from fixed lines (all of the US and Canada, a few of
    # India's) says "either": such a number may be a mobile, so it is taken, on both paths below.
    mobile_types = (PhoneNumberType.MOBILE, PhoneNumberType.FIXED_LINE_OR_MOBILE)
    e164 = _INDIAN_E164.fullmatch(raw)
    if e164 is not None and "IN" in regions:   # the spelling clients mostly send: its type, without parse
        number = PhoneNumber(country_code=91, national_number=int(e164[1]))
        return raw if phonenumbers.number_type(number) in mobile_types else None
    try:
        number = phonenumbers.parse(raw, "IN")
    except phonenumbers.NumberParseException:
        return None
    region = phonenumbers.region_code_for_number(number)
    if (number.extension or region not in regions or not phonenumbers.is_valid_number_for_region(number, region)
            or phonenumbers.number_type(number) not in mobile_types):
        return None
    return phonenumbers.format_number(number, PhoneNumberFormat.E164)


class LowerEmail(ma.fields.Email):
    """A checked e-mail address, trimmed and lower-cased."""

    def __init__(self, **kwargs):
        metadata = {"minLength": 1, **kwargs.pop("metadata", {})}
        super().__init__(validate=ma.validate.Length(max=254), metadata=metadata, **kwargs)

    def _deserialize(self, value, attr, data, **kwargs):
        if isinstance(value, str):
            value = trim(value)
        return super()._deserialize(value, attr, data, **kwargs).lower()


class JsonBoolean(ma.fields.Boolean):
    """JSON true or false, nothing else: marshmallow's Boolean also takes "yes", "on", 1 and 0, and
    truthy={True}, falsy={False} still lets 1 and 0 through (1 == True)."""

    def _deserialize(self, value, attr, data, **kwargs):
        if not isinstance(value, bool):
            raise self.make_error("invalid")
        return value


class PublicId(ma.fields.String):
    """A public id of one kind (a name or another kind's id is refused)."""

    def __init__(self, prefix: str, **kwargs):
        self.prefix = prefix
        metadata = {"pattern": f"^{public_id_regex(prefix)}$", **kwargs.pop("metadata", {})}
        super().__init__(validate=ma.validate.Regexp(
            public_id_pattern(prefix), error=f"Must be a {prefix}... id."), metadata=metadata, **kwargs)


class Money(ma.fields.Float):
    """A non-negative amount with at most two decimals, loaded as a Decimal."""

    MAX = 9_999_999_999_999

    def __init__(self, **kwargs):
        super().__init__(allow_nan=False, validate=ma.validate.Range(0, self.MAX), **kwargs)

    def _deserialize(self, value, attr, data, **kwargs):
        if isinstance(value, (bool, str)):   # the contract says number: neither true nor "100" is one
            raise self.make_error("invalid")
        number = super()._deserialize(value, attr, data, **kwargs)
        if abs(number) > self.MAX:
            return number   # out of range: the validator refuses it (quantize would overflow on 1e308)
        return Decimal(str(number)).quantize(Decimal("0.01"))


MAX_CUSTOM_FIELDS = 50


def at_most_custom_fields(value: dict) -> None:
    # A function, not ma.validate.Length: apispec documents a Length on a Dict as maxLength,
    # which says nothing about an object; the metadata below says maxProperties.
    if len(value) > MAX_CUSTOM_FIELDS:
        raise ma.ValidationError(f"At most {MAX_CUSTOM_FIELDS} custom fields.")


class CustomFieldValues(ma.fields.Dict):
    """custom_fields: at most 50 keys; each value is checked against its definition later."""

    def __init__(self, **kwargs):
        metadata = {"maxProperties": MAX_CUSTOM_FIELDS, **kwargs.pop("metadata", {})}
        super().__init__(keys=ma.fields.String(validate=ma.validate.Length(1, 64)), values=ma.fields.Raw(allow_none=True),
                         validate=at_most_custom_fields, metadata=metadata, **kwargs)


def required_text(max_length: int, blank: str, metadata: dict) -> Text:
    """A trimmed string of 1..max_length characters that says something: blank text (is_blank)
    is refused with the sentence `blank`."""
    def says_something(value: str) -> None:
        if is_blank(value):
            raise ma.ValidationError(blank)

    return Text(max_length, validate=(says_something,), required=True,
                metadata={"minLength": 1, "pattern": NOT_BLANK_PATTERN, **metadata})



class UtcAwareDateTime(ma.fields.AwareDateTime):
    """An RFC 3339 datetime with an offset, loaded as naive UTC (how times are stored)."""

    default_error_messages = {"out_of_range": "In UTC this time falls outside the years 1 to 9999."}

    def _deserialize(self, value, attr, data, **kwargs):
        moment = super()._deserialize(value, attr, data, **kwargs)
        try:
            return moment.astimezone(UTC).replace(tzinfo=None)
        except OverflowError:   # 0001-01-01T00:00:00+00:01 is in year 0 in UTC
            raise self.make_error("out_of_range") from None


class Choices(ma.fields.String):
    """Comma-separated values, each one of `choices` (OR)."""

    def __init__(self, choices: tuple[str, ...], **kwargs):
        self.choices = choices
        super().__init__(metadata={"description": f"{', '.join(choices)}; comma-separated for several.",
                                   "pattern": comma_separated(f"({'|'.join(choices)})")}, **kwargs)

    def _deserialize(self, value, attr, data, **kwargs):
        items = list_items(super()._deserialize(value, attr, data, **kwargs))
        if any(item not in self.choices for item in items):
            raise ma.ValidationError(f"Use {', '.join(self.choices)}, comma-separated.")
        return sorted(set(items))
