"""Errors of :mod:`lookupdec.tokenizer`."""

from __future__ import annotations

from lookupdec.errors import LookupdecError


class UnsupportedVocabError(LookupdecError, ValueError):
    """The vocabulary uses a tokenizer type or pre-tokenizer this package does not reproduce exactly."""
