"""Formulas that compute their value and print themselves from the same numbers.

A line of the sheet is a `Term`: its bytes are `term.value` and its formula is `term.text`, so the
formula a reader checks by hand cannot drift from the arithmetic the sheet uses.

    >>> per_token = num(2) * num(36, "layers") * num(8, "kv_heads") * num(128, "head_dim") * nbytes(2)
    >>> per_token.value, per_token.text
    (147456, '2 x layers 36 x kv_heads 8 x head_dim 128 x 2 B')
"""

from __future__ import annotations

from dataclasses import dataclass

# Binding strength, to parenthesise only where needed.
_SUM, _PRODUCT, _ATOM = 1, 2, 3


@dataclass(frozen=True)
class Term:
    value: int | float
    text: str
    _binds: int = _ATOM

    def _wrap(self, at_least: int) -> str:
        return self.text if self._binds >= at_least else f"({self.text})"

    def __mul__(self, other: Term | int) -> Term:
        other = _term(other)
        return Term(self.value * other.value, f"{self._wrap(_PRODUCT)} x {other._wrap(_PRODUCT)}", _PRODUCT)

    __rmul__ = __mul__

    def __add__(self, other: Term | int) -> Term:
        other = _term(other)
        return Term(self.value + other.value, f"{self.text} + {other.text}", _SUM)

    def __sub__(self, other: Term | int) -> Term:
        other = _term(other)
        return Term(self.value - other.value, f"{self.text} - {other._wrap(_PRODUCT)}", _SUM)

    def __truediv__(self, other: Term | int) -> Term:
        other = _term(other)
        return Term(self.value / other.value, f"{self._wrap(_PRODUCT)} / {other._wrap(_ATOM)}", _PRODUCT)

    def ceil_div(self, other: Term | int) -> Term:
        """ceil(self / other), as an integer."""
        other = _term(other)
        return Term(-(-int(self.value) // int(other.value)), f"ceil({self.text} / {other._wrap(_ATOM)})")

    def floor_div(self, other: Term | int) -> Term:
        other = _term(other)
        return Term(int(self.value) // int(other.value), f"floor({self.text} / {other._wrap(_ATOM)})")

    def named(self, label: str) -> Term:
        """The same value under a short name, its arithmetic shown once: `label (text = value)`."""
        if self.text == _number(self.value):
            return Term(self.value, f"{label} {self.text}")
        return Term(self.value, f"{label} ({self.text} = {_number(self.value)})")

    def but(self, text: str) -> Term:
        """The same value, said in words (for sums too long to print term by term)."""
        return Term(self.value, text)

    def plus_note(self, note: str) -> Term:
        return Term(self.value, f"{self.text} {note}", self._binds) if note else self

    def int(self) -> Term:
        return Term(int(self.value), self.text, self._binds)


def num(value: int | float, label: str = "") -> Term:
    """A quantity, printed as `label value` (`layers 36`) or the bare number."""
    return Term(value, f"{label} {_number(value)}" if label else _number(value))


def nbytes(value: int | float, what: str = "") -> Term:
    """A size in bytes, printed as `2 B` or `2 B (bf16)`."""
    return Term(value, f"{_number(value)} B" + (f" ({what})" if what else ""))


def given(value: int | float, text: str) -> Term:
    """A value whose text says where it comes from (a measured constant, a library's allowance)."""
    return Term(value, text)


def total(terms: list[Term], empty: str = "0") -> Term:
    if not terms:
        return Term(0, empty)
    out = terms[0]
    for t in terms[1:]:
        out = out + t
    return out


def _term(x: Term | int | float) -> Term:
    return x if isinstance(x, Term) else num(x)


def _number(value: int | float) -> str:
    if isinstance(value, float) and not value.is_integer():
        return f"{value:.4g}"
    return f"{int(value):,}"
