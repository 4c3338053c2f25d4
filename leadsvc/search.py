"""Search (`q` on the lead list and export): what a search string means, and the stored data it
is matched against.

Every kind of search is a prefix range on an indexed column that follows the workspace column,
so the database answers it from an index on SQLite and on PostgreSQL alike, never with LIKE
(whose case rules differ between them) nor full-text syntax (which a user could break):

- a phone suffix is a prefix of `lead.phone_reversed`, the phone's digits back to front;
- an e-mail is a prefix of `lead.email`, stored lower case;
- a name word is a prefix of a row of `lead_name_part`: each lead's first and last names and
  their parts, folded (lower case, no accents). The same parts are on the lead row, in
  `lead.name_key`, each after PART_START: a page that walks the list's own index checks a common
  word there, on the row it reads anyway, rather than with a lookup in `lead_name_part` per lead.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from typing import Iterable

import peewee as pw

from .db import database, insert_rows
from .models import Lead, LeadNamePart
from .fields import is_phone_text, trim

MIN_LENGTH, MAX_LENGTH = 2, 100
MIN_PHONE_DIGITS = 4
NAME_SEPARATORS = re.compile(r"[\s\-']+")
# Typographic apostrophes, typed or pasted, are the plain one.
APOSTROPHES = str.maketrans({"\u2019": "'", "\u2018": "'", "\u02bc": "'"})
# Above every character: `column >= p AND column < p + TOP` holds exactly the values that start
# with p under byte-wise (UTF-8) ordering, which SQLite's BINARY and the C collation both use
# (on PostgreSQL the searched columns are COLLATE "C" whatever the database's collation, 0013).
TOP = "\U0010ffff"
# What each part follows in a name key. No search word holds a control character (parse refuses
# them), so PART_START + word is in a key exactly where the word starts a part.
PART_START = "\x1f"


@dataclass(frozen=True)
class Search:
    """A parsed `q`: its kind (phone, email or name) and the normalized terms it matches."""

    kind: str
    terms: tuple[str, ...]

    def __str__(self) -> str:   # what a cursor is bound to
        return f"{self.kind}:{' '.join(self.terms)}"


def parse(text: str) -> Search:
    """What a `q` asks for; ValueError (a sentence for people) if it cannot be a search."""
    text = trim(text)
    if len(text) < MIN_LENGTH:
        raise ValueError(f"Type at least {MIN_LENGTH} characters.")
    if len(text) > MAX_LENGTH:
        raise ValueError(f"Type at most {MAX_LENGTH} characters.")
    if any(unicodedata.category(ch) in ("Cc", "Cs") for ch in text):
        raise ValueError("Control characters cannot be searched for.")
    digits = "".join(str(int(ch)) for ch in text if ch.isdecimal()) if is_phone_text(text) else ""
    if len(digits) >= MIN_PHONE_DIGITS:
        return Search("phone", (digits[::-1],))
    if "@" in text:
        return Search("email", (text.lower(),))
    words = tuple(word for word in (fold(w) for w in text.split()) if word)
    return Search("name", words)


def fold(text: str) -> str:
    """Lower case without accents: the form names are stored and searched in."""
    decomposed = unicodedata.normalize("NFKD", text)
    return "".join(ch for ch in decomposed if not unicodedata.combining(ch)).casefold().translate(APOSTROPHES)


def name_parts(first_name: str, last_name: str) -> set[str]:
    """What a name word may start: each name folded, from its start and from the start of each of
    its parts on (so `o'brien` starts a part of "van der O'Brien" as `brien` does)."""
    parts: set[str] = set()
    for name in (first_name, last_name):
        # Inside a name PART_START becomes another control character: one no word matches either.
        folded = fold(name or "").strip().replace(PART_START, "\x1e")
        starts = [0] + [m.end() for m in NAME_SEPARATORS.finditer(folded)]
        # A part is a CharField(100): NFKD can lengthen a 100-character name.
        parts.update(folded[start:start + 100] for start in starts if start < len(folded))
    return parts


def name_key(first_name: str, last_name: str) -> str | None:
    """`lead.name_key`: the name parts in one text, each after PART_START (None without a name)."""
    return "".join(PART_START + part for part in sorted(name_parts(first_name, last_name))) or None


def parts_of(key: str | None) -> list[str]:
    """The name parts a name key holds."""
    return key.split(PART_START)[1:] if key else []


def phone_reversed(phone: str | None) -> str | None:
    """The phone's digits back to front, so that a suffix of the phone is a prefix of this."""
    return re.sub(r"\D", "", phone)[::-1] if phone else None


def _starts_with(column: pw.Field, prefix: str) -> pw.Expression:
    return (column >= prefix) & (column < prefix + TOP)


def matching(search: Search, workspace_id: int) -> pw.Expression:
    """The condition on lead rows. A phone or e-mail search names the workspace even inside a
    narrower scope, so that their indexes (which start with the workspace) serve every scope; a
    name search finds parts by workspace, and leaves the lead rows to the scope's own indexes."""
    if search.kind == "phone":
        return (Lead.workspace == workspace_id) & _starts_with(Lead.phone_reversed, search.terms[0])
    if search.kind == "email":
        return (Lead.workspace == workspace_id) & _starts_with(Lead.email, search.terms[0])
    if not search.terms:   # punctuation only, say: nothing is named that
        return pw.SQL("1 = 0")
    condition = None
    # The rarest word decides the plan. Few matches: read them from the part index, then sort
    # them. Many: walk the list's sort index and check each lead's name key, and a page fills
    # after a few rows. Neither plan suits the other case, and a planner's estimate of a prefix
    # range is a guess, so the count (capped, from the part index alone) picks.
    counts = {word: _matches_up_to(workspace_id, word, COMMON) for word in search.terms}
    rarest = min(search.terms, key=counts.__getitem__)
    for word in search.terms:
        if word == rarest and counts[word] < COMMON:
            term = Lead.id.in_(_parts(workspace_id, word).select(LeadNamePart.lead))
        else:
            term = _holds(Lead.name_key, PART_START + word)
        condition = term if condition is None else condition & term
    return condition


def _holds(column: pw.Field, text: str) -> pw.Expression:
    """Whether the column's value contains the text, by position (no LIKE: no wildcards, and the
    same case rules on both databases). SQLite calls the function instr, PostgreSQL strpos."""
    position = pw.fn.instr if isinstance(database.obj, pw.SqliteDatabase) else pw.fn.strpos
    return position(column, text) > 0


# Matches above which a name word is common: walking the sort index then reads about
# page size x leads / matches rows, cheaper than sorting this many matches.
COMMON = 2000


def _parts(workspace_id: int, word: str) -> pw.ModelSelect:
    return LeadNamePart.select().where((LeadNamePart.workspace == workspace_id)
                                       & _starts_with(LeadNamePart.part, word))


def _matches_up_to(workspace_id: int, word: str, cap: int) -> int:
    return _parts(workspace_id, word).select(LeadNamePart.lead).limit(cap).count()


def save_name_parts(leads: Iterable[Lead], *, replace: bool = False) -> None:
    """Write the rows of the leads' name keys (in the caller's transaction); `replace` drops the
    old ones first."""
    leads = list(leads)
    if replace:
        LeadNamePart.delete().where(LeadNamePart.lead.in_([lead.id for lead in leads])).execute()
    rows = [{"lead": lead.id, "workspace": lead.workspace_id, "part": part}
            for lead in leads for part in parts_of(lead.name_key)]
    insert_rows(LeadNamePart, rows)
