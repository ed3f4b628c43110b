"""Deterministic synthetic VTEX stores, held as numpy columns.

A store is generated once from a :class:`StoreSpec` and kept as flat arrays (one entry per order,
order item, customer, product, SKU); JSON documents are rendered from those arrays on demand by
:mod:`cdp_devkit.sandbox.vtex.documents`. Only a spec's default history end reads the wall clock
(today's midnight UTC, as VTEX serves the last two years from today); the same spec always
yields the same bytes, which is what lets tests use the sandbox as the source of truth.

Repeat purchases follow a BG/NBD-style process: every registered customer has a first-seen date,
a purchase rate drawn from a Gamma distribution and a Beta-distributed dropout probability applied
after each purchase. That gives many one-time buyers and a long tail of frequent ones, which the
downstream CLV/RFM models need to be exercised at all.
"""

from __future__ import annotations

import hashlib
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from datetime import UTC, date, datetime, timedelta
from datetime import time as dtime
from typing import Any, NamedTuple

import numpy as np

from cdp_devkit.sandbox.vtex import vocabulary as vocab

TICKS_PER_SECOND = 10_000_000  # VTEX prints 7 fractional digits: .NET ticks of 100 ns
TICKS_PER_MS = TICKS_PER_SECOND // 1000
TICKS_PER_DAY = 86_400 * TICKS_PER_SECOND
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

STATUSES: tuple[str, ...] = (
    "invoiced",
    "canceled",
    "ready-for-handling",
    "handling",
    "payment-pending",
    "waiting-for-sellers-confirmation",
)
STATUS_DESCRIPTIONS: tuple[str, ...] = (
    "Faturado",
    "Cancelado",
    "Pronto para o manuseio",
    "Preparando Entrega",
    "Pagamento Pendente",
    "Aguardando confirmação do seller",
)
INVOICED, CANCELED, READY_FOR_HANDLING, HANDLING, PAYMENT_PENDING, WAITING_FOR_SELLER = range(6)

MALFORMED_KINDS: tuple[str, ...] = (
    "unparseable",
    "missing_lastChange",
    "value_not_numeric",
    "missing_orderId",
)

# orderGroup = base + index * stride + jitter: unique, increasing with creation like VTEX's
# numbers, and invertible (id -> row) without a million-entry dict.
_GROUP_STRIDE = 1000
_SEQUENCE_BASE = 500_000
_ORDER_ID_RE = re.compile(r"(\d{13})-01")

_ACCOUNT_RE = re.compile(r"[a-z0-9]+")


def to_ticks(moment: datetime) -> int:
    """100-ns ticks since the Unix epoch; naive datetimes are taken as UTC."""
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    delta = moment - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * TICKS_PER_SECOND + delta.microseconds * 10


_INSTANT_RE = re.compile(
    r"(\d{4}-\d\d-\d\d)(?:[T ](\d\d:\d\d(?::\d\d)?)(?:\.(\d{1,7}))?)?(Z|[+-]\d\d:?\d\d)?"
)


def parse_ticks(text: str) -> int:
    """Ticks of an ISO-8601 instant or date, keeping all 7 fractional digits VTEX prints
    (``datetime.fromisoformat`` would truncate to microseconds). No offset means UTC."""
    match = _INSTANT_RE.fullmatch(text.strip())
    if match is None:
        raise ValueError(f"not an ISO-8601 instant: {text!r}")
    day, clock, fraction, offset = match.groups()
    whole = datetime.fromisoformat(f"{day}T{clock or '00:00'}{offset or '+00:00'}")
    return to_ticks(whole) + int((fraction or "0").ljust(7, "0"))


def format_ticks(ticks: int, zulu: bool = False) -> str:
    """VTEX timestamp text: 7 fractional digits, ``+00:00`` (OMS) or ``Z`` (feed, Master Data)."""
    seconds, fraction = divmod(int(ticks), TICKS_PER_SECOND)
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds))
    return f"{stamp}.{fraction:07d}{'Z' if zulu else '+00:00'}"


def _day_start(day: date) -> datetime:
    return datetime.combine(day, dtime(), UTC)


def history_end_today() -> datetime:
    """Today's midnight UTC, where stores end by default: recent enough for the 48-hour order
    sync to read real orders, and the same all day, so a store is reproducible within a day."""
    return _day_start(datetime.now(UTC).date())


def _stable_int(text: str) -> int:
    """Process-independent hash (``hash()`` is salted per interpreter)."""
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")


@dataclass(frozen=True)
class StoreSpec:
    """Everything that determines a synthetic store; equal specs give byte-identical stores."""

    account: str
    seed: int = 1
    customers: int = 1000
    orders: int = 5000
    products: int = 200
    max_skus_per_product: int = 4
    history_start: date = date(2020, 1, 1)
    history_end: datetime = field(default_factory=history_end_today)
    busy_day: date | None = None
    busy_day_orders: int = 0
    malformed_orders: int = 0
    guest_share: float = 0.1

    def __post_init__(self) -> None:
        if not _ACCOUNT_RE.fullmatch(self.account):
            raise ValueError(f"account must be lower-case letters and digits: {self.account!r}")
        end = self.history_end
        end = end.replace(tzinfo=UTC) if end.tzinfo is None else end.astimezone(UTC)
        object.__setattr__(self, "history_end", end)
        for name in ("seed", "customers", "orders", "busy_day_orders", "malformed_orders"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0")
        if self.products < 1 or self.max_skus_per_product < 1:
            raise ValueError("products and max_skus_per_product must be >= 1")
        if not 0.0 <= self.guest_share <= 1.0:
            raise ValueError("guest_share must be within [0, 1]")
        if _day_start(self.history_start) >= end:
            raise ValueError("history_start must be before history_end")
        if self.busy_day_orders and self.busy_day is None:
            raise ValueError("busy_day_orders needs busy_day")
        if self.busy_day is not None and not (
            _day_start(self.history_start) <= _day_start(self.busy_day)
            and _day_start(self.busy_day) + timedelta(days=1) <= end
        ):
            raise ValueError("busy_day must lie within the history")
        if self.malformed_orders > self.total_orders:
            raise ValueError("malformed_orders exceeds the number of orders")
        if self.customers == 0 and self.guest_share < 1.0 and self.orders:
            raise ValueError("a store with registered-customer orders needs customers >= 1")

    @property
    def total_orders(self) -> int:
        return self.orders + self.busy_day_orders

    @classmethod
    def parse(cls, text: str) -> StoreSpec:
        """Parse the CLI form ``acme:orders=20000,customers=5000,seed=1,busy_day=2024-03-15``."""
        account, _, rest = text.partition(":")
        kwargs: dict[str, Any] = {}
        for part in filter(None, (p.strip() for p in rest.split(","))):
            key, eq, value = part.partition("=")
            key = key.strip()
            if not eq or key not in _FIELD_PARSERS:
                raise ValueError(f"bad store option {part!r} in {text!r}")
            kwargs[key] = _FIELD_PARSERS[key](value.strip())
        return cls(account=account.strip(), **kwargs)

    def to_cli(self) -> str:
        """Inverse of :meth:`parse`; only non-default options are written, and the history end
        always (its default is the day's, which a sandbox process started after midnight would
        take as another)."""
        options = []
        for spec_field in fields(self):
            value = getattr(self, spec_field.name)
            if spec_field.name == "account" or value == spec_field.default:
                continue
            text = value.isoformat() if isinstance(value, date | datetime) else str(value)
            options.append(f"{spec_field.name}={text}")
        return f"{self.account}:{','.join(options)}" if options else self.account


_FIELD_PARSERS: dict[str, Callable[[str], Any]] = {
    "seed": int,
    "customers": int,
    "orders": int,
    "products": int,
    "max_skus_per_product": int,
    "history_start": date.fromisoformat,
    "history_end": datetime.fromisoformat,
    "busy_day": date.fromisoformat,
    "busy_day_orders": int,
    "malformed_orders": int,
    "guest_share": float,
}


class StatusChange(NamedTuple):
    """One order status transition, as the orders feed reports it."""

    order_id: str
    state: str
    last_state: str
    last_change: int  # ticks of the previous change
    current_change: int  # ticks of this change


@dataclass
class Catalog:
    """Products (sorted by id) and their SKUs (sorted by id, grouped by product)."""

    product_id: np.ndarray
    product_category: np.ndarray  # index into vocabulary.CATEGORIES
    product_brand: np.ndarray  # index into vocabulary.BRANDS
    product_noun: np.ndarray  # index into the category's noun list
    product_adjective: np.ndarray
    product_line: np.ndarray
    product_active: np.ndarray
    product_release_day: np.ndarray  # days since the epoch
    product_sku_start: np.ndarray  # CSR offsets into the SKU arrays, len = products + 1
    product_popularity_cdf: np.ndarray
    sku_id: np.ndarray
    sku_product: np.ndarray  # row index into the product arrays
    sku_color: np.ndarray
    sku_size: np.ndarray
    sku_active: np.ndarray
    sku_list_price: np.ndarray  # cents
    sku_price: np.ndarray  # cents
    sku_ean: np.ndarray
    sku_weight: np.ndarray  # grams
    sku_dimensions: np.ndarray  # (n, 3) height, width, length in cm


@dataclass
class Buyers:
    """Registered customers (rows < ``registered``, each with a CL record), then guest buyers."""

    registered: int
    first_name: np.ndarray
    last_name: np.ndarray
    last_name2: np.ndarray  # -1 when the buyer has a single surname
    document: np.ndarray  # CPF as an 11-digit integer
    phone: np.ndarray  # 9-digit mobile number without area code
    phone_format: np.ndarray
    city: np.ndarray
    street: np.ndarray
    street_number: np.ndarray
    cep_suffix: np.ndarray
    complement: np.ndarray
    uid_hi: np.ndarray  # userProfileId as two uint64 halves
    uid_lo: np.ndarray
    # Master Data (CL) columns, length == registered
    cl_id_hi: np.ndarray
    cl_id_lo: np.ndarray
    email_source: np.ndarray  # row whose address this record spells (differs for case variants)
    email_num: np.ndarray
    email_style: np.ndarray
    email_domain: np.ndarray
    email_variant: np.ndarray  # 0 plain, 1 Capitalised, 2 UPPER, 3 padded, 4 Capitalised+space
    newsletter: np.ndarray
    first_seen: np.ndarray  # ticks
    created: np.ndarray  # ticks
    updated: np.ndarray  # ticks


@dataclass
class Orders:
    """Order rows (sorted by creation at build time; mutations append) and their items (CSR)."""

    group: np.ndarray
    buyer: np.ndarray
    created: np.ndarray
    last_change: np.ndarray
    authorized: np.ndarray  # 0 = not authorized
    invoiced: np.ndarray  # 0 = not invoiced
    status: np.ndarray
    payment: np.ndarray  # index into vocabulary.PAYMENT_SYSTEMS
    installments: np.ndarray
    shipping: np.ndarray
    utm: np.ndarray  # -1 = no marketing data, else combined source/medium/campaign index
    cancel_reason: np.ndarray
    courier: np.ndarray
    malformed: np.ndarray  # -1 = well formed, else index into MALFORMED_KINDS
    items_total: np.ndarray
    discounts: np.ndarray  # <= 0, VTEX's sign convention
    value: np.ndarray
    quantity: np.ndarray  # units per order, the list's totalItems
    item_start: np.ndarray  # CSR offsets into the item arrays, len = orders + 1
    item_sku: np.ndarray  # row index into the SKU arrays
    item_quantity: np.ndarray
    item_price: np.ndarray
    item_list_price: np.ndarray
    item_selling_price: np.ndarray

    def __len__(self) -> int:
        return len(self.group)

    def append(self, other: Orders) -> None:
        offset = self.item_start[-1]
        for spec_field in fields(self):
            name = spec_field.name
            mine, theirs = getattr(self, name), getattr(other, name)
            if name == "item_start":
                setattr(self, name, np.concatenate([mine, theirs[1:] + offset]))
            else:
                setattr(self, name, np.concatenate([mine, theirs]))


def _pick(rng: np.random.Generator, n: int, weights: list[float] | np.ndarray) -> np.ndarray:
    """n draws of an index from a discrete distribution (vectorised inverse CDF)."""
    cdf = np.cumsum(np.asarray(weights, dtype=np.float64))
    cdf /= cdf[-1]
    return np.minimum(np.searchsorted(cdf, rng.random(n), side="right"), len(cdf) - 1)


def _uniform_ticks(rng: np.random.Generator, low: float, high: float, n: int) -> np.ndarray:
    return (low + (high - low) * rng.random(n)).astype(np.int64)


def _uint64(rng: np.random.Generator, n: int) -> np.ndarray:
    return rng.integers(0, np.iinfo(np.uint64).max, n, dtype=np.uint64, endpoint=True)


def _guid_halves(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    # Version-4 / RFC-4122 variant bits so the strings look like the GUIDs VTEX hands out.
    hi = (_uint64(rng, n) & np.uint64(0xFFFF_FFFF_FFFF_0FFF)) | np.uint64(0x4000)
    lo = (_uint64(rng, n) & np.uint64(0x3FFF_FFFF_FFFF_FFFF)) | np.uint64(0x8000_0000_0000_0000)
    return hi, lo


def _cpf(digits: np.ndarray) -> np.ndarray:
    """Valid CPF numbers (with both check digits) from an (n, 9) array of base digits."""
    first = (digits @ np.arange(10, 1, -1) * 10) % 11 % 10
    second = ((digits @ np.arange(11, 2, -1) + first * 2) * 10) % 11 % 10
    base = digits @ (10 ** np.arange(10, 1, -1, dtype=np.int64))
    return base + first * 10 + second


# Share of orders per UTC hour: Brazilian shoppers (UTC-3) buy mostly from noon to midnight.
_HOURLY_PROFILE = np.array(
    [6, 4, 2, 1, 1, 1, 1, 1, 1, 1, 2, 3, 4, 5, 6, 7, 7, 7, 7, 7, 8, 8, 8, 7], dtype=np.float64
)


def _with_time_of_day(rng: np.random.Generator, days: np.ndarray, span: float) -> np.ndarray:
    hours = _pick(rng, len(days), _HOURLY_PROFILE)
    moved = np.floor(days) + (hours + rng.random(len(days))) / 24.0
    return np.minimum(moved, np.nextafter(span, 0.0))


def _make_catalog(rng: np.random.Generator, spec: StoreSpec) -> Catalog:
    n_products = spec.products
    sku_counts = rng.integers(1, spec.max_skus_per_product + 1, n_products)
    product_id = np.cumsum(rng.integers(1, 4, n_products))
    category = rng.integers(0, len(vocab.CATEGORIES), n_products)
    noun_counts = np.array([len(c[3]) for c in vocab.CATEGORIES])
    noun = (rng.random(n_products) * noun_counts[category]).astype(np.int64)
    sku_start = np.concatenate([[0], np.cumsum(sku_counts)])
    n_skus = int(sku_start[-1])
    sku_product = np.repeat(np.arange(n_products), sku_counts)
    position = np.arange(n_skus) - sku_start[sku_product]
    variant_count = len(vocab.SKU_COLORS) * len(vocab.SKU_SIZES)
    # Consecutive variants of one base so the SKUs of a product have distinct names.
    variant = (rng.integers(0, variant_count, n_products)[sku_product] + position) % variant_count
    base_price = np.exp(rng.normal(np.log(80.0), 0.8, n_products))
    list_price = base_price[sku_product] * rng.uniform(0.9, 1.1, n_skus)
    list_cents = (np.maximum(np.floor(list_price), 4) * 100 + 90).astype(np.int64)
    discount = np.array([0.0, 0.1, 0.15, 0.2, 0.3])[
        _pick(rng, n_skus, [0.7, 0.1, 0.08, 0.07, 0.05])
    ]
    rank = rng.permutation(n_products)
    popularity = 1.0 / (rank + 1.0) ** 0.8
    return Catalog(
        product_id=product_id,
        product_category=category,
        product_brand=rng.integers(0, len(vocab.BRANDS), n_products),
        product_noun=noun,
        product_adjective=rng.integers(0, len(vocab.PRODUCT_ADJECTIVES), n_products),
        product_line=rng.integers(0, len(vocab.PRODUCT_LINES), n_products),
        product_active=rng.random(n_products) < 0.95,
        product_release_day=(
            to_ticks(_day_start(spec.history_start)) // TICKS_PER_DAY
            - rng.integers(0, 720, n_products)
        ),
        product_sku_start=sku_start,
        product_popularity_cdf=np.cumsum(popularity) / popularity.sum(),
        sku_id=(100_000 + np.cumsum(rng.integers(1, 6, n_skus))).astype(np.int32),
        sku_product=sku_product,
        sku_color=variant // len(vocab.SKU_SIZES),
        sku_size=variant % len(vocab.SKU_SIZES),
        sku_active=rng.random(n_skus) < 0.95,
        sku_list_price=list_cents,
        sku_price=np.round(list_cents * (1.0 - discount)).astype(np.int64),
        sku_ean=7_890_000_000_000 + rng.integers(0, 10_000_000_000, n_skus),
        sku_weight=rng.integers(50, 5000, n_skus),
        sku_dimensions=rng.integers(2, 80, (n_skus, 3)),
    )


def _customer_order_days(
    rng: np.random.Generator, n_customers: int, target: int, span: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """BG/NBD-style purchase histories for registered customers.

    Returns (first-seen day per customer, customer per order, day per order), exactly ``target``
    orders, days counted from history_start.
    """
    first_seen = span * rng.random(n_customers) ** (1 / 1.6)  # density ~ t^0.6: a growing store
    window = span - first_seen
    # Purchases per day (before calibration): a very heterogeneous Gamma, so that a store
    # averaging six orders per customer still has about 40% one-time buyers.
    rate = rng.gamma(0.3, 1.0 / (0.3 * 90.0), n_customers)
    dropout = rng.beta(1.1, 2.0, n_customers)
    # Repeat purchases the customer makes before dropping out (dropout is tested after each
    # one), capped at one a fortnight over their lifetime: without the cap the calibration
    # turns the luckiest draw into a single "customer" with thousands of orders.
    repeats_before_dropout = np.minimum(rng.geometric(dropout) - 1, (window / 14).astype(np.int64))
    poisson_seed = int(rng.integers(0, 2**63))

    def repeats_at(scale: float) -> tuple[np.ndarray, np.ndarray]:
        # Same Poisson stream for every scale, so the calibration below is a search over one
        # fixed population rather than over fresh noise.
        poisson = np.random.default_rng(poisson_seed).poisson(scale * rate * window)
        return np.minimum(poisson, repeats_before_dropout), poisson

    # Scale the purchase rates so the process yields at least `target` orders, as few extra as
    # possible; the surplus is removed uniformly below.
    low, high = -14.0, 14.0
    for _ in range(48):
        middle = (low + high) / 2
        if n_customers + repeats_at(float(np.exp(middle)))[0].sum() >= target:
            high = middle
        else:
            low = middle
    repeats, arrivals = repeats_at(float(np.exp(high)))
    shortfall = target - n_customers - int(repeats.sum())
    if shortfall > 0:
        # Dropout caps every history (tiny customer bases with many orders): top up the
        # customers who would have bought most, treating the extra purchases as unobserved gaps.
        weight = rate * window + 1e-12
        extra = rng.multinomial(shortfall, weight / weight.sum())
        repeats = repeats + extra
        arrivals = np.maximum(arrivals, repeats)

    per_customer = 1 + repeats
    customer = np.repeat(np.arange(n_customers), per_customer)
    starts = np.concatenate([[0], np.cumsum(per_customer)[:-1]])
    position = np.arange(len(customer)) - np.repeat(starts, per_customer)
    # Given n Poisson arrivals in the window, the first m of them are the first m order statistics
    # of n uniforms: cumulated exponential spacings normalised by their total (the tail of the
    # total is a single Gamma draw, so no more than one number per order is drawn).
    spacing = rng.exponential(1.0, len(customer))
    spacing[position == 0] = 0.0
    cumulative = np.cumsum(spacing)
    within = cumulative - np.repeat(cumulative[starts], per_customer)
    tail = rng.gamma(np.maximum(arrivals - repeats, 0) + 1.0)
    total = within[starts + per_customer - 1] + tail
    days = first_seen[customer] + window[customer] * within / np.repeat(total, per_customer)

    surplus = len(customer) - target
    if surplus > 0:
        keep = np.ones(len(customer), dtype=bool)
        keep[rng.choice(len(customer), surplus, replace=False)] = False
        customer, days = customer[keep], days[keep]
    return first_seen, customer, days


def _make_buyers(
    rng: np.random.Generator,
    n_registered: int,
    n_guests: int,
    first_seen: np.ndarray,
    start_ticks: int,
    end_ticks: int,
) -> Buyers:
    """Buyer rows; ``first_seen`` holds the ticks each registered customer first appeared."""
    n = n_registered + n_guests
    first_name = rng.integers(0, len(vocab.FIRST_NAMES), n)
    last_name = rng.integers(0, len(vocab.LAST_NAMES), n)
    last_name2 = np.where(rng.random(n) < 0.35, rng.integers(0, len(vocab.LAST_NAMES), n), -1)
    document = _cpf(rng.integers(0, 10, (n, 9)))
    city = _pick(rng, n, [c[6] for c in vocab.CITIES])
    street = rng.integers(0, len(vocab.STREETS), n)
    phone = 900_000_000 + rng.integers(0, 100_000_000, n)
    uid_hi, uid_lo = _guid_halves(rng, n)

    # A few CL records are the same person again: kind 1 re-registered with another e-mail
    # (same document), kind 2 with the same e-mail typed in another case / with spaces.
    kind = _pick(rng, n_registered, [0.97, 0.02, 0.01])
    if n_registered:
        kind[0] = 0
    earlier = (rng.random(n_registered) * np.arange(n_registered)).astype(np.int64)
    source = np.where(kind > 0, earlier, np.arange(n_registered))
    while True:  # follow duplicate-of-duplicate chains to the original record
        resolved = source[source]
        if np.array_equal(resolved, source):
            break
        source = resolved
    for column in (first_name, last_name, last_name2, document, city, street, phone):
        column[:n_registered] = column[:n_registered][source]
    email_variant = _pick(rng, n_registered, [0.9, 0.04, 0.02, 0.03, 0.01])
    shifted = (email_variant[source] + 1 + rng.integers(0, 4, n_registered)) % 5
    email_variant = np.where(kind == 2, shifted, email_variant)
    cl_id_hi, cl_id_lo = _guid_halves(rng, n_registered)

    registered_early = rng.random(n_registered) < 0.3
    created = np.maximum(
        first_seen
        - np.where(
            registered_early,
            _uniform_ticks(rng, 0, 30 * TICKS_PER_DAY, n_registered),
            _uniform_ticks(rng, 0, 600 * TICKS_PER_SECOND, n_registered),
        ),
        start_ticks,
    )
    touched = rng.random(n_registered) < 0.6
    updated = created + np.where(
        touched, ((end_ticks - created) * rng.random(n_registered)).astype(np.int64), 0
    )
    return Buyers(
        registered=n_registered,
        first_name=first_name,
        last_name=last_name,
        last_name2=last_name2,
        document=document,
        phone=phone,
        phone_format=rng.integers(0, 4, n),
        city=city,
        street=street,
        street_number=rng.integers(1, 3000, n),
        cep_suffix=rng.integers(0, 1000, n),
        complement=rng.integers(0, len(vocab.COMPLEMENTS), n),
        uid_hi=uid_hi,
        uid_lo=uid_lo,
        cl_id_hi=cl_id_hi,
        cl_id_lo=cl_id_lo,
        email_source=np.where(kind == 2, source, np.arange(n_registered)),
        email_num=rng.permutation(n_registered) + 1,  # unique per record: no accidental clashes
        email_style=rng.integers(0, 5, n_registered),
        email_domain=_pick(rng, n_registered, [d[1] for d in vocab.EMAIL_DOMAINS]),
        email_variant=email_variant,
        newsletter=rng.random(n_registered) < 0.35,
        first_seen=first_seen,
        created=created,
        updated=updated,
    )


def _lifecycle(
    rng: np.random.Generator, created: np.ndarray, now: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Status and (authorized, invoiced, lastChange) ticks of orders as seen at ``now``."""
    n = len(created)
    age_days = (now - created) / TICKS_PER_DAY
    status = np.empty(n, dtype=np.int8)
    bands = (
        (age_days > 14, [0.9, 0.1], [INVOICED, CANCELED]),
        (
            (age_days > 3) & (age_days <= 14),
            [0.72, 0.1, 0.12, 0.06],
            [INVOICED, CANCELED, HANDLING, READY_FOR_HANDLING],
        ),
        (
            age_days <= 3,
            [0.08, 0.07, 0.2, 0.35, 0.18, 0.12],
            [INVOICED, CANCELED, HANDLING, READY_FOR_HANDLING, PAYMENT_PENDING, WAITING_FOR_SELLER],
        ),
    )
    for mask, weights, values in bands:
        status[mask] = np.asarray(values)[_pick(rng, int(mask.sum()), weights)]
    unpaid = (status == PAYMENT_PENDING) | ((status == CANCELED) & (rng.random(n) < 0.4))
    authorized = np.where(
        unpaid,
        0,
        np.minimum(
            created + _uniform_ticks(rng, 30 * TICKS_PER_SECOND, 7200 * TICKS_PER_SECOND, n), now
        ),
    )
    base = np.where(authorized > 0, authorized, created)
    invoiced = np.where(
        status == INVOICED,
        np.minimum(base + _uniform_ticks(rng, TICKS_PER_DAY / 6, 4 * TICKS_PER_DAY, n), now),
        0,
    )
    after_invoice = np.where(rng.random(n) < 0.5, _uniform_ticks(rng, 0, 2 * TICKS_PER_DAY, n), 0)
    last_change = np.select(
        [status == INVOICED, status == CANCELED],
        [
            np.minimum(invoiced + after_invoice, now),
            np.minimum(
                base + _uniform_ticks(rng, 600 * TICKS_PER_SECOND, 3 * TICKS_PER_DAY, n), now
            ),
        ],
        base + ((now - base) * rng.random(n) * 0.5).astype(np.int64),
    )
    return status, authorized, invoiced, last_change


def _draw_orders(
    rng: np.random.Generator,
    catalog: Catalog,
    buyer: np.ndarray,
    created: np.ndarray,
    now: int,
) -> Orders:
    """Order rows (items, money, lifecycle) for the given buyers and creation instants."""
    n = len(created)
    n_items = 1 + _pick(rng, n, [0.5, 0.25, 0.13, 0.08, 0.04])
    item_start = np.concatenate([[0], np.cumsum(n_items)])
    total_items = int(item_start[-1])
    item_order = np.repeat(np.arange(n), n_items)
    product = np.minimum(
        np.searchsorted(catalog.product_popularity_cdf, rng.random(total_items)),
        len(catalog.product_id) - 1,
    )
    sku_start = catalog.product_sku_start
    sku = sku_start[product] + (
        rng.random(total_items) * (sku_start[product + 1] - sku_start[product])
    ).astype(np.int64)
    n_skus = len(catalog.sku_id)
    for _ in range(3):  # an order lists each SKU once: redraw the rare repeats
        key = item_order * n_skus + sku
        order = np.argsort(key, kind="stable")
        repeated = np.zeros(total_items, dtype=bool)
        repeated[order[1:]] = key[order[1:]] == key[order[:-1]]
        if not repeated.any():
            break
        sku[repeated] = rng.integers(0, n_skus, int(repeated.sum()))
    quantity = 1 + _pick(rng, total_items, [0.8, 0.13, 0.05, 0.02])
    price = catalog.sku_price[sku]
    promo = np.where(rng.random(total_items) < 0.2, rng.uniform(0.05, 0.15, total_items), 0.0)
    selling = np.round(price * (1.0 - promo)).astype(np.int64)
    items_total = np.add.reduceat(price * quantity, item_start[:-1])
    discounts = np.add.reduceat((selling - price) * quantity, item_start[:-1])
    units = np.add.reduceat(quantity, item_start[:-1])
    free_shipping = (items_total >= 20_000) & (rng.random(n) < 0.8)
    shipping = np.where(
        free_shipping, 0, np.array([990, 1290, 1590, 1990, 2490, 2990])[rng.integers(0, 6, n)]
    )
    payment = _pick(rng, n, [p[3] for p in vocab.PAYMENT_SYSTEMS])
    is_card = np.array([p[2] == "creditCard" for p in vocab.PAYMENT_SYSTEMS])[payment]
    utm_combinations = len(vocab.UTM_SOURCES) * len(vocab.UTM_MEDIUMS) * len(vocab.UTM_CAMPAIGNS)
    status, authorized, invoiced, last_change = _lifecycle(rng, created, now)
    return Orders(
        group=np.zeros(n, dtype=np.int64),
        buyer=buyer.astype(np.int64),
        created=created,
        last_change=last_change,
        authorized=authorized,
        invoiced=invoiced,
        status=status,
        payment=payment,
        installments=np.where(is_card, 1 + _pick(rng, n, [0.4, 0.15, 0.15, 0.1, 0.1, 0.1]), 1),
        shipping=shipping,
        utm=np.where(rng.random(n) < 0.4, rng.integers(0, utm_combinations, n), -1),
        cancel_reason=rng.integers(0, len(vocab.CANCEL_REASONS), n),
        courier=rng.integers(0, len(vocab.COURIERS), n),
        malformed=np.full(n, -1, dtype=np.int8),
        items_total=items_total,
        discounts=discounts,
        value=items_total + discounts + shipping,
        quantity=units,
        item_start=item_start,
        item_sku=sku,
        item_quantity=quantity,
        item_price=price,
        item_list_price=catalog.sku_list_price[sku],
        item_selling_price=selling,
    )


class Store:
    """One synthetic VTEX account: catalog, customers and orders as columns.

    Row indices are internal; the public accessors take VTEX identifiers (order id, product id,
    SKU id, CL document id) and return exactly what the sandbox serves. Rendering lives in
    :mod:`cdp_devkit.sandbox.vtex.documents`, which imports this module, hence the local imports.
    """

    def __init__(self, spec: StoreSpec) -> None:
        self.spec = spec
        self.account = spec.account
        self._salt = _stable_int(f"account:{spec.account}")
        self.account_guid = guid_text(
            _stable_int(f"guid-hi:{spec.account}"), _stable_int(f"guid-lo:{spec.account}")
        )
        self.version = 0  # bumped by every mutation so servers can drop cached query results
        start_ticks = to_ticks(_day_start(spec.history_start))
        self.history_end_ticks = to_ticks(spec.history_end)
        span = (self.history_end_ticks - start_ticks) / TICKS_PER_DAY

        self.catalog = _make_catalog(self._rng(1), spec)

        rng = self._rng(2)
        registered_orders = round(spec.orders * (1.0 - spec.guest_share))
        guest_orders = spec.orders - registered_orders
        first_seen, customer, days = _customer_order_days(
            rng, spec.customers, registered_orders, span
        )
        guest_days = span * rng.random(guest_orders) ** (1 / 1.6)
        busy_days = np.empty(0)
        busy_buyer = np.empty(0, dtype=np.int64)
        busy_guests = 0
        if spec.busy_day is not None and spec.busy_day_orders:
            offset = (to_ticks(_day_start(spec.busy_day)) - start_ticks) / TICKS_PER_DAY
            busy_days = offset + rng.random(spec.busy_day_orders)
            eligible = np.flatnonzero(first_seen <= offset)
            guest = (rng.random(spec.busy_day_orders) < spec.guest_share) | (len(eligible) == 0)
            busy_guests = int(guest.sum())
            busy_buyer = np.full(spec.busy_day_orders, -1, dtype=np.int64)
            if len(eligible):
                busy_buyer[~guest] = eligible[rng.integers(0, len(eligible), int((~guest).sum()))]
        n_guests = guest_orders + busy_guests
        guest_rows = spec.customers + np.arange(n_guests)
        busy_buyer[busy_buyer < 0] = guest_rows[guest_orders:]
        buyer = np.concatenate([customer, guest_rows[:guest_orders], busy_buyer])
        all_days = np.concatenate(
            [
                _with_time_of_day(rng, np.concatenate([days, guest_days]), span),
                busy_days,  # already spread over the one busy day
            ]
        )
        created = start_ticks + (all_days * TICKS_PER_DAY).astype(np.int64)
        order = np.lexsort((rng.random(len(created)), created))
        # A customer is first seen at their first order (the time of day was redrawn above), or
        # at the process's first-seen instant when the calibration left them without orders.
        seen = start_ticks + (first_seen * TICKS_PER_DAY).astype(np.int64)
        registered = buyer < spec.customers
        np.minimum.at(seen, buyer[registered], created[registered])

        self.buyers = _make_buyers(
            self._rng(3),
            spec.customers,
            n_guests,
            seen,
            start_ticks,
            self.history_end_ticks,
        )
        self.orders = _draw_orders(
            self._rng(4), self.catalog, buyer[order], created[order], self.history_end_ticks
        )
        rng = self._rng(5)
        self._group_base = 1_000_000_000_000 + (self._salt % 900) * 1_000_000_000
        self.orders.group = self._groups(rng, 0, len(self.orders))
        malformed = np.sort(rng.choice(len(self.orders), spec.malformed_orders, replace=False))
        self.orders.malformed[malformed] = np.arange(len(malformed)) % len(MALFORMED_KINDS)
        self._index_creation()
        self._customer_rows: dict[str, int] | None = None
        self._customer_table: dict[str, np.ndarray] | None = None

    def _rng(self, stream: int, *extra: int) -> np.random.Generator:
        return np.random.default_rng([self.spec.seed, self._salt, stream, *extra])

    def _groups(self, rng: np.random.Generator, first: int, count: int) -> np.ndarray:
        rows = np.arange(first, first + count, dtype=np.int64)
        return self._group_base + rows * _GROUP_STRIDE + rng.integers(0, _GROUP_STRIDE, count)

    def _index_creation(self) -> None:
        self._by_creation = np.argsort(self.orders.created, kind="stable")
        self._created_sorted = self.orders.created[self._by_creation]

    # ----- orders -------------------------------------------------------------------------------

    def order_id_at(self, row: int) -> str:
        return f"{int(self.orders.group[row])}-01"

    def sequence_at(self, row: int) -> str:
        return str(_SEQUENCE_BASE + row)

    def order_row(self, order_id: str) -> int | None:
        """Row of an order id (``1172452900788-01``) or sequence reference (``seq502556``)."""
        if order_id.startswith("seq") and order_id[3:].isdigit():
            row = int(order_id[3:]) - _SEQUENCE_BASE
            return row if 0 <= row < len(self.orders) else None
        if not _ORDER_ID_RE.fullmatch(order_id):
            return None
        group = int(order_id[:-3])
        row = (group - self._group_base) // _GROUP_STRIDE
        if 0 <= row < len(self.orders) and int(self.orders.group[row]) == group:
            return row
        return None

    def order_ids(self) -> list[str]:
        return [f"{g}-01" for g in self.orders.group.tolist()]

    def order_document(self, order_id: str) -> bytes:
        """Exact body the order-detail endpoint serves (broken on purpose for malformed orders)."""
        from cdp_devkit.sandbox.vtex.documents import order_bytes

        return order_bytes(self, self._require_order(order_id))

    def is_malformed(self, order_id: str) -> bool:
        return bool(self.orders.malformed[self._require_order(order_id)] >= 0)

    def malformed_kind(self, order_id: str) -> str | None:
        kind = int(self.orders.malformed[self._require_order(order_id)])
        return MALFORMED_KINDS[kind] if kind >= 0 else None

    def _require_order(self, order_id: str) -> int:
        row = self.order_row(order_id)
        if row is None:
            raise KeyError(order_id)
        return row

    def rows_created_between(self, low: int, high: int) -> np.ndarray:
        """Order rows with low <= creation ticks <= high, in creation order."""
        begin = np.searchsorted(self._created_sorted, low, side="left")
        end = np.searchsorted(self._created_sorted, high, side="right")
        return self._by_creation[begin:end]

    # ----- catalog ------------------------------------------------------------------------------

    def product_ids(self) -> list[int]:
        return self.catalog.product_id.tolist()

    def sku_ids(self) -> list[int]:
        return self.catalog.sku_id.tolist()

    def product_row(self, product_id: int) -> int | None:
        return _sorted_lookup(self.catalog.product_id, product_id)

    def sku_row(self, sku_id: int) -> int | None:
        return _sorted_lookup(self.catalog.sku_id, sku_id)

    def product_document(self, product_id: int) -> dict[str, Any]:
        from cdp_devkit.sandbox.vtex.documents import product_document

        row = self.product_row(product_id)
        if row is None:
            raise KeyError(product_id)
        return product_document(self, row)

    def sku_document(self, sku_id: int) -> dict[str, Any]:
        from cdp_devkit.sandbox.vtex.documents import sku_document

        row = self.sku_row(sku_id)
        if row is None:
            raise KeyError(sku_id)
        return sku_document(self, row)

    def skus_of_product_row(self, row: int) -> list[int]:
        start, stop = self.catalog.product_sku_start[row : row + 2]
        return self.catalog.sku_id[start:stop].tolist()

    # ----- customers (Master Data CL) -----------------------------------------------------------

    def customer_ids(self) -> list[str]:
        buyers = self.buyers
        return [
            guid_text(hi, lo)
            for hi, lo in zip(buyers.cl_id_hi.tolist(), buyers.cl_id_lo.tolist(), strict=True)
        ]

    def customer_row(self, customer_id: str) -> int | None:
        if self._customer_rows is None:
            self._customer_rows = {cid: row for row, cid in enumerate(self.customer_ids())}
        return self._customer_rows.get(customer_id)

    def customer_document(self, customer_id: str) -> dict[str, Any]:
        from cdp_devkit.sandbox.vtex.documents import customer_document

        row = self.customer_row(customer_id)
        if row is None:
            raise KeyError(customer_id)
        return customer_document(self, row)

    def customer_table(self) -> dict[str, np.ndarray]:
        """Every CL field as a column (object arrays; ticks for dates), for Master Data queries."""
        if self._customer_table is None:
            from cdp_devkit.sandbox.vtex.documents import customer_document

            docs = [customer_document(self, row) for row in range(self.buyers.registered)]
            table: dict[str, np.ndarray] = {}
            for key in docs[0] if docs else {}:
                column = np.empty(len(docs), dtype=object)
                column[:] = [doc[key] for doc in docs]
                table[key] = column
            table["createdIn"] = self.buyers.created.copy()
            table["updatedIn"] = self.buyers.updated.copy()
            self._customer_table = table
        return self._customer_table

    # ----- mutation -----------------------------------------------------------------------------

    def mutate(
        self,
        seed: int,
        changed: int,
        new: int,
        at: datetime,
        on_change: Callable[[StatusChange], None] | None = None,
    ) -> list[str]:
        """Move ``changed`` orders to a later status and append ``new`` orders, stamped at ``at``.

        Returns the affected order ids (changed first, then new). ``on_change`` receives one
        :class:`StatusChange` per status transition, which is how the server feeds its orders feed.
        """
        at_ticks = to_ticks(at)
        rng = self._rng(100, seed)
        orders = self.orders
        candidates = np.flatnonzero((orders.status != CANCELED) & (orders.malformed < 0))
        chosen = np.sort(rng.choice(candidates, min(changed, len(candidates)), replace=False))
        changes: list[StatusChange] = []
        stamp_offset = 0
        for row in chosen.tolist():
            old = int(orders.status[row])
            target = CANCELED if old == INVOICED or rng.random() < 0.25 else INVOICED
            previous = int(orders.last_change[row])
            stamp = max(
                at_ticks + stamp_offset + int(rng.integers(0, TICKS_PER_MS)),
                previous + TICKS_PER_MS,
            )
            stamp_offset += TICKS_PER_MS
            if target == INVOICED:
                if orders.authorized[row] == 0:
                    orders.authorized[row] = max(
                        int(orders.created[row]), stamp - 60 * TICKS_PER_SECOND
                    )
                orders.invoiced[row] = stamp
            orders.status[row] = target
            orders.last_change[row] = stamp
            changes.append(
                StatusChange(
                    self.order_id_at(row), STATUSES[target], STATUSES[old], previous, stamp
                )
            )

        first_new = len(orders)
        if new:
            appended = self._new_orders(rng, new, at_ticks, stamp_offset)
            appended.group = self._groups(rng, first_new, new)
            orders.append(appended)
            for row in range(first_new, first_new + new):
                order_id = self.order_id_at(row)
                created = int(orders.created[row])
                changes.append(StatusChange(order_id, "order-created", "", created, created))
                changes.append(
                    StatusChange(
                        order_id,
                        STATUSES[int(orders.status[row])],
                        "order-created",
                        created,
                        int(orders.last_change[row]),
                    )
                )
            self._index_creation()
        self.version += 1
        if on_change is not None:
            for change in changes:
                on_change(change)
        return [self.order_id_at(row) for row in chosen.tolist()] + [
            self.order_id_at(row) for row in range(first_new, first_new + new)
        ]

    def _new_orders(self, rng: np.random.Generator, count: int, at: int, offset: int) -> Orders:
        buyers = self.buyers
        created = at - _uniform_ticks(rng, 0, 3600 * TICKS_PER_SECOND, count)
        eligible = np.flatnonzero(buyers.first_seen <= at)
        guest = (rng.random(count) < self.spec.guest_share) | (len(eligible) == 0)
        buyer = np.empty(count, dtype=np.int64)
        if len(eligible):
            buyer[~guest] = eligible[rng.integers(0, len(eligible), int((~guest).sum()))]
        n_guests = int(guest.sum())
        if n_guests:
            fresh = _make_buyers(rng, 0, n_guests, np.empty(0, dtype=np.int64), 0, 0)
            buyer[guest] = len(buyers.first_name) + np.arange(n_guests)
            for spec_field in fields(Buyers):
                name = spec_field.name
                if name != "registered" and len(getattr(fresh, name)) == n_guests:
                    setattr(
                        buyers, name, np.concatenate([getattr(buyers, name), getattr(fresh, name)])
                    )
        appended = _draw_orders(rng, self.catalog, buyer, created, at)
        appended.status = np.array(
            [READY_FOR_HANDLING, PAYMENT_PENDING, WAITING_FOR_SELLER], dtype=np.int8
        )[_pick(rng, count, [0.5, 0.3, 0.2])]
        paid = appended.status != PAYMENT_PENDING
        appended.authorized = np.where(
            paid, np.minimum(appended.created + 60 * TICKS_PER_SECOND, at), 0
        )
        appended.invoiced = np.zeros(count, dtype=np.int64)
        appended.last_change = (
            at + offset + np.arange(count) * TICKS_PER_MS + rng.integers(0, TICKS_PER_MS, count)
        )
        return appended


def _sorted_lookup(ids: np.ndarray, value: int) -> int | None:
    row = int(np.searchsorted(ids, value))
    return row if row < len(ids) and int(ids[row]) == value else None


def guid_text(hi: int, lo: int) -> str:
    """GUID string from two 64-bit halves (how the columns store userId / CL ids)."""
    text = f"{int(hi) & 0xFFFF_FFFF_FFFF_FFFF:016x}{int(lo) & 0xFFFF_FFFF_FFFF_FFFF:016x}"
    return f"{text[:8]}-{text[8:12]}-{text[12:16]}-{text[16:20]}-{text[20:]}"
