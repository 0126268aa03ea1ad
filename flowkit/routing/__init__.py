"""The JSON router DSL: filters and transforms over decoded records, built in Python or from
config data, each compiled once into one generated Python function.

>>> keep = (field("order.total") > 100) & ~field("customer.test").is_true()
>>> reshape = chain(pick("order.id", "customer.email"), lower("customer.email"))
>>> order = {"order": {"id": 1, "total": 250}, "customer": {"email": "Ada@X.org"}}
>>> keep(order), reshape(order)
(True, {'order': {'id': 1}, 'customer': {'email': 'ada@x.org'}})
"""

from __future__ import annotations

from ..errors import MissingFieldError
from .filters import Field, Filter, all_of, any_of, field
from .paths import MISSING, parse_path, resolve
from .transforms import (
    Literal,
    Transform,
    build,
    chain,
    drop,
    hash_field,
    literal,
    lower,
    pick,
    rename,
    strip,
    template,
    upper,
)

__all__ = [
    "MISSING",
    "Field",
    "Filter",
    "Literal",
    "MissingFieldError",
    "Transform",
    "all_of",
    "any_of",
    "build",
    "chain",
    "drop",
    "field",
    "hash_field",
    "literal",
    "lower",
    "parse_path",
    "pick",
    "rename",
    "resolve",
    "strip",
    "template",
    "upper",
]
