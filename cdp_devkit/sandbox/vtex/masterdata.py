"""Master Data v1 queries over a store's CL records: ``_where``, equality, ``_sort``, scroll.

Supported ``_where`` grammar (keywords case-insensitive), enough for incremental CL syncs::

    expr      := term (OR term)*
    term      := factor (AND factor)*
    factor    := "(" expr ")" | field op value | field between value AND value
               | field is [not] null
    op        := = | <> | > | < | >= | <=

``createdIn`` / ``updatedIn`` compare as instants (``2024-01-01``, ``2024-01-01T10:00:00Z``, ...),
``between`` is inclusive at both ends, ``*`` in an ``=`` value is a wildcard, other fields compare
as text. Plain query parameters (``?userId=...``) are equality filters ANDed to ``_where``.
Without ``_fields`` only ``id`` is returned; ``_fields=_all`` returns every field.
"""

from __future__ import annotations

import itertools
import re
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from cdp_devkit.sandbox.vtex.generator import parse_ticks

if TYPE_CHECKING:
    from cdp_devkit.sandbox.vtex.generator import Store

SEARCH_MAX_PAGE = 100
SEARCH_MAX_DOCUMENTS = 10_000
SCROLL_MAX_SIZE = 1000
SCROLL_MAX_ACTIVE = 10
SCROLL_IDLE_SECONDS = 20 * 60

_DATE_FIELDS = frozenset({"createdIn", "updatedIn"})
_BOOL_FIELDS = frozenset({"isNewsletterOptIn"})
_TOKEN_RE = re.compile(r"""\s*(\(|\)|<>|>=|<=|=|>|<|"[^"]*"|'[^']*'|[^\s()=<>"']+)""")
_OPERATORS = frozenset({"=", "<>", ">", "<", ">=", "<="})


class QueryError(ValueError):
    """A Master Data query the sandbox cannot answer (reported to the client as 400)."""


Node = tuple[Any, ...]


def _tokenize(text: str) -> list[str]:
    tokens: list[str] = []
    position = 0
    text = text.strip()
    while position < len(text):
        match = _TOKEN_RE.match(text, position)
        if match is None:
            raise QueryError(f"cannot parse _where near {text[position:]!r}")
        tokens.append(match.group(1))
        position = match.end()
    return tokens


class _Parser:
    def __init__(self, text: str) -> None:
        self.tokens = _tokenize(text)
        self.position = 0

    def parse(self) -> Node:
        node = self._or()
        if self.position != len(self.tokens):
            raise QueryError(f"unexpected {self.tokens[self.position]!r} in _where")
        return node

    def _peek(self) -> str | None:
        return self.tokens[self.position] if self.position < len(self.tokens) else None

    def _take(self) -> str:
        token = self._peek()
        if token is None:
            raise QueryError("_where ends too early")
        self.position += 1
        return token

    def _keyword(self, word: str) -> bool:
        token = self._peek()
        if token is not None and token.lower() == word:
            self.position += 1
            return True
        return False

    def _or(self) -> Node:
        nodes = [self._and()]
        while self._keyword("or"):
            nodes.append(self._and())
        return nodes[0] if len(nodes) == 1 else ("or", nodes)

    def _and(self) -> Node:
        nodes = [self._factor()]
        while self._keyword("and"):
            nodes.append(self._factor())
        return nodes[0] if len(nodes) == 1 else ("and", nodes)

    def _factor(self) -> Node:
        if self._peek() == "(":
            self.position += 1
            node = self._or()
            if self._take() != ")":
                raise QueryError("missing ')' in _where")
            return node
        name = self._take()
        if self._keyword("between"):
            low = _unquote(self._take())
            if not self._keyword("and"):
                raise QueryError("between needs AND")
            return ("between", name, low, _unquote(self._take()))
        if self._keyword("is"):
            negated = self._keyword("not")
            if not self._keyword("null"):
                raise QueryError("expected 'is [not] null'")
            return ("null", name, not negated)
        operator = self._take()
        if operator not in _OPERATORS:
            raise QueryError(f"unknown operator {operator!r}")
        return ("cmp", name, operator, _unquote(self._take()))


def _unquote(token: str) -> str:
    if len(token) >= 2 and token[0] == token[-1] and token[0] in "\"'":
        return token[1:-1]
    return token


def parse_where(text: str) -> Node:
    """Parse a ``_where`` expression into a small tuple tree."""
    return _Parser(text).parse()


def _instant(text: str) -> int:
    try:
        return parse_ticks(text)
    except ValueError as error:
        raise QueryError(f"not a date: {text!r}") from error


def _coerce(name: str, text: str) -> Any:
    if name in _DATE_FIELDS:
        return _instant(text)
    if name in _BOOL_FIELDS:
        if text.lower() not in ("true", "false"):
            raise QueryError(f"{name} is a boolean")
        return text.lower() == "true"
    return text


class CustomerQuery:
    """Evaluates CL queries against the store's column table (built once per store)."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._equality_index: dict[str, dict[Any, np.ndarray]] = {}
        self._sort_order: dict[str, np.ndarray] = {}
        self._deleted = np.zeros(store.buyers.registered, dtype=bool)

    def delete(self, row: int) -> None:
        """The document of `row` was deleted: no query finds it any more."""
        self._deleted[row] = True

    def rows(self, where: str | None, equals: dict[str, str], sort: str | None) -> np.ndarray:
        """Matching CL rows, sorted as ``_sort`` asks (row order otherwise)."""
        mask = ~self._deleted
        if where:
            mask &= self._evaluate(parse_where(where))
        for name, value in equals.items():
            mask &= self._evaluate(("cmp", name, "=", value))
        if not sort:
            return np.flatnonzero(mask)
        parts = sort.split()
        if len(parts) > 2 or (len(parts) == 2 and parts[1].upper() not in ("ASC", "DESC")):
            raise QueryError("_sort must be '<field> ASC|DESC'")
        order = self._order(parts[0])
        if len(parts) == 2 and parts[1].upper() == "DESC":
            order = order[::-1]
        return order[mask[order]]

    def _column(self, name: str) -> np.ndarray:
        table = self._store.customer_table()
        if name not in table:
            raise QueryError(f"unknown CL field {name!r}")
        return table[name]

    def _order(self, name: str) -> np.ndarray:
        if name not in self._sort_order:
            self._sort_order[name] = np.argsort(self._column(name), kind="stable")
        return self._sort_order[name]

    def _evaluate(self, node: Node) -> np.ndarray:
        kind = node[0]
        if kind in ("or", "and"):
            masks = [self._evaluate(child) for child in node[1]]
            combine = np.logical_or if kind == "or" else np.logical_and
            result = masks[0]
            for mask in masks[1:]:
                result = combine(result, mask)
            return result
        name = node[1]
        column = self._column(name)
        if kind == "null":
            is_null = np.fromiter((v is None for v in column), dtype=bool, count=len(column))
            return is_null if node[2] else ~is_null
        if kind == "between":
            low, high = _coerce(name, node[2]), _coerce(name, node[3])
            return (column >= low) & (column <= high)
        _, _, operator, text = node
        if operator in ("=", "<>") and name not in _DATE_FIELDS and "*" in text:
            pattern = re.compile(".*".join(map(re.escape, text.split("*"))), re.IGNORECASE)
            matched = np.fromiter(
                (bool(pattern.fullmatch(str(v))) for v in column), dtype=bool, count=len(column)
            )
            return matched if operator == "=" else ~matched
        value = _coerce(name, text)
        if operator in ("=", "<>"):
            matched = np.zeros(len(column), dtype=bool)
            matched[self._equal_rows(name, value)] = True
            return matched if operator == "=" else ~matched
        comparisons: dict[str, Callable[[Any, Any], Any]] = {
            ">": np.greater,
            "<": np.less,
            ">=": np.greater_equal,
            "<=": np.less_equal,
        }
        return np.asarray(comparisons[operator](column, value), dtype=bool)

    def _equal_rows(self, name: str, value: Any) -> np.ndarray:
        # Point lookups (search?userId=...) are the hot path of e-mail resolution: index once.
        if name not in self._equality_index:
            index: dict[Any, list[int]] = {}
            for row, item in enumerate(self._column(name).tolist()):
                index.setdefault(item, []).append(row)
            self._equality_index[name] = {k: np.asarray(v) for k, v in index.items()}
        return self._equality_index[name].get(value, np.empty(0, dtype=np.int64))


def project(document: dict[str, Any], fields: list[str] | None) -> dict[str, Any]:
    """Apply ``_fields`` (``None`` = only ``id``, ``_all`` = everything, unknown names skipped)."""
    if fields is None:
        return {"id": document["id"]}
    if "_all" in fields:
        return document
    return {name: document[name] for name in fields if name in document}


def parse_fields(text: str | None) -> list[str] | None:
    if text is None:
        return None
    return [name.strip() for name in text.split(",") if name.strip()]


@dataclass
class _Scroll:
    rows: np.ndarray
    size: int
    fields: list[str] | None
    position: int
    touched: float
    pages: int = 0


class ScrollRegistry:
    """Open scroll cursors of one account.

    As Master Data documents them (https://developers.vtex.com/docs/api-reference/masterdata-api
    #get-/api/dataentities/-acronym-/scroll and https://developers.vtex.com/docs/guides/
    search-and-scroll-api-queries): a token is a forward cursor on the server's side, so every
    request made with it moves it on, whether or not its answer reached the client (a reset or
    a truncated body loses that page to a client that asks again); a token expires after 20
    idle minutes, each request resetting the timer; at most 10 scrolls per account at once.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._scrolls: dict[str, _Scroll] = {}
        self._counter = itertools.count()

    def open(self, rows: np.ndarray, size: int, fields: list[str] | None) -> str:
        self._expire()
        if len(self._scrolls) >= SCROLL_MAX_ACTIVE:
            raise QueryError(f"Maximum simultaneous scrolls rate exceeded ({SCROLL_MAX_ACTIVE})")
        token = f"{next(self._counter):06d}{secrets.token_hex(16)}"
        self._scrolls[token] = _Scroll(rows, size, fields, 0, self._clock())
        return token

    def advance(
        self, token: str, repeat: int, expire_after_pages: int = 0, endless: bool = False
    ) -> tuple[np.ndarray, list[str] | None, int]:
        """Next batch of rows (prefixed by ``repeat`` rows of the previous batch), its fields and
        the total; the cursor is dropped once an empty batch has been handed out.

        Faults: ``expire_after_pages`` expires the token once it served that many pages (the
        idle expiry, compressed); ``endless`` starts over at the end instead of ending."""
        self._expire()
        scroll = self._scrolls.get(token)
        if scroll is not None and expire_after_pages and scroll.pages >= expire_after_pages:
            del self._scrolls[token]
            scroll = None
        if scroll is None:
            raise QueryError("scroll token is invalid or expired")
        if endless and scroll.position >= len(scroll.rows):
            scroll.position = 0
        start = scroll.position
        batch = scroll.rows[start : start + scroll.size]
        if len(batch) == 0:
            del self._scrolls[token]
            return batch, scroll.fields, len(scroll.rows)
        scroll.position = start + len(batch)
        scroll.touched = self._clock()
        scroll.pages += 1
        if repeat and start:
            batch = np.concatenate([scroll.rows[max(0, start - repeat) : start], batch])
        return batch, scroll.fields, len(scroll.rows)

    def _expire(self) -> None:
        horizon = self._clock() - SCROLL_IDLE_SECONDS
        for token in [t for t, s in self._scrolls.items() if s.touched < horizon]:
            del self._scrolls[token]


# The CL entity's structure as `GET /api/dataentities/CL` gives it (schema `Getdataentityfields`
# of the Master Data v1 spec): the fields the sandbox's documents carry, and the merchant's own.
_CL_STANDARD_FIELDS = (
    ("id", "Varchar 100", False),
    ("userId", "Varchar 100", True),
    ("email", "Email", True),
    ("firstName", "Varchar 100", True),
    ("lastName", "Varchar 100", True),
    ("document", "Varchar 50", True),
    ("documentType", "Varchar 10", True),
    ("phone", "Varchar 50", True),
    ("isNewsletterOptIn", "Boolean", True),
    ("createdIn", "Date and Time", True),
    ("updatedIn", "Date and Time", True),
)
_INTERNAL_FIELDS = frozenset({"id", "createdIn", "updatedIn"})
_VARCHAR = re.compile(r"Varchar (\d+)")
_INSTANT = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})?")
FIELD_TYPES = ("Varchar 10", "Varchar 50", "Varchar 100", "Date and Time", "Integer", "Boolean")


def _field(name: str, field_type: str, nullable: bool, internal: bool) -> dict[str, Any]:
    return {
        "name": name,
        "type": field_type,
        "displayName": name,
        "isNullable": nullable,
        "isSearchable": True,
        "isFilter": True,
        "isInternal": internal,
    }


class ClFieldWrites:
    """Partial updates of a store's CL documents: the fields the merchant added to the entity,
    and the values written to them, per document.

    As Master Data v1 documents it (https://developers.vtex.com/docs/api-reference/
    masterdata-api#patch-/api/dataentities/-acronym-/documents/-id-): the body is a JSON object
    of fields and values, answered 204; a field must exist on the entity (custom fields are
    created in the Admin's data structure, there is no v1 route for it); a Varchar holds a
    string of at most its length. The spec describes the PATCH as updating "a subset of fields
    of a document" and documents no answer for an id without one, while its `PUT` on the same
    path creates or replaces: so a PATCH on an id that has no document (never had, or deleted
    since) creates one holding only the fields sent, the unkind case (UNVERIFIED on VTEX
    itself), so that a client writing to a missing document is seen doing it. A deleted
    document (`DELETE` on the same path, answered 204,
    https://developers.vtex.com/docs/api-reference/masterdata-api#delete-/api/dataentities/
    -acronym-/documents/-id-) is gone for GET and search alike (a document a PATCH created
    is found by GET only: the sandbox searches the store's generated documents)."""

    def __init__(self, existing: Callable[[str], bool]) -> None:
        self._existing = existing
        self._custom: dict[str, dict[str, Any]] = {}
        self.values: dict[str, dict[str, Any]] = {}
        self.created: set[str] = set()
        self.deleted: set[str] = set()

    def add_field(self, name: str, field_type: str = "Varchar 50", nullable: bool = True) -> None:
        if not re.fullmatch(r"[A-Za-z][A-Za-z0-9_]{0,49}", name):
            raise QueryError(f"invalid field name {name!r}")
        if field_type not in FIELD_TYPES:
            raise QueryError(f"field type must be one of {', '.join(FIELD_TYPES)}")
        if any(standard == name for standard, _, _ in _CL_STANDARD_FIELDS):
            raise QueryError(f"{name} is a standard CL field")
        self._custom[name] = _field(name, field_type, nullable, False)

    def fields(self) -> list[dict[str, Any]]:
        standard = [
            _field(name, field_type, nullable, name in _INTERNAL_FIELDS)
            for name, field_type, nullable in _CL_STANDARD_FIELDS
        ]
        return standard + list(self._custom.values())

    def structure(self) -> dict[str, Any]:
        return {
            "acronym": "CL",
            "name": "Client",
            "primaryKeyType": "GUID",
            "allowGetAll": False,
            "fields": self.fields(),
        }

    def patch(self, document_id: str, body: Any) -> None:
        """Validate the body against the entity, then keep its values; refused whole."""
        if not isinstance(body, dict) or not body:
            raise QueryError("the body must be a JSON object with the fields to update")
        fields = {field["name"]: field for field in self.fields()}
        for name, value in body.items():
            field = fields.get(name)
            if field is None:
                raise QueryError(f"Field '{name}' does not exist in data entity 'CL'")
            if field["isInternal"]:
                raise QueryError(f"Field '{name}' cannot be written")
            _check_value(field, value)
        if document_id in self.deleted or not (
            self._existing(document_id) or document_id in self.values
        ):
            self.created.add(document_id)
            self.deleted.discard(document_id)
        self.values.setdefault(document_id, {}).update(body)

    def delete(self, document_id: str) -> None:
        """The document and every value written to it are gone."""
        self.values.pop(document_id, None)
        if self._existing(document_id) or document_id in self.created:
            self.deleted.add(document_id)

    def document(self, document_id: str, stored: dict[str, Any] | None) -> dict[str, Any] | None:
        """The document as the store holds it now: generated fields, then values written."""
        if document_id in self.deleted:
            return None
        if document_id in self.created:  # what a PATCH created holds only what it sent
            stored = None
        written = self.values.get(document_id)
        if stored is None and written is None:
            return None
        custom = {name: None for name in self._custom}
        return {**(stored or {"id": document_id}), **custom, **(written or {})}


def _check_value(field: dict[str, Any], value: Any) -> None:
    name, field_type = field["name"], field["type"]
    if value is None:
        if not field["isNullable"]:
            raise QueryError(f"Field '{name}' cannot be null")
        return
    varchar = _VARCHAR.fullmatch(field_type)
    if varchar or field_type == "Email":
        if not isinstance(value, str):
            raise QueryError(f"Field '{name}' ({field_type}) takes a string")
        if varchar and len(value) > int(varchar.group(1)):
            raise QueryError(f"Field '{name}' holds at most {varchar.group(1)} characters")
    elif field_type == "Date and Time":
        if not isinstance(value, str) or not _INSTANT.fullmatch(value):
            raise QueryError(f"Field '{name}' takes an ISO 8601 date and time")
    elif field_type == "Boolean" and not isinstance(value, bool):
        raise QueryError(f"Field '{name}' is a boolean")
    elif field_type == "Integer" and (isinstance(value, bool) or not isinstance(value, int)):
        raise QueryError(f"Field '{name}' is an integer")
