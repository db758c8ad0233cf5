"""The lineage's character n-gram model: the screen's second scorer, what CCNet does with a small LM per language.

A model a few steps old knows little more than which characters are frequent, and a document with its characters
shuffled has exactly the corpus's frequencies: the neural screen cannot tell it from a good one (docs/nightly.md,
"The data screen", has the measurements). Characters in their order can: a document's mean -ln p per character under
an order-n character model of the lineage's accepted documents is low for text like theirs and high for shuffled
characters, 2-3 character fragments strung together, random characters and a scraper's menus.

Witten-Bell interpolation (each order mixes its counts with the next lower order, weighted by how many different
characters followed the context), down to a uniform distribution over ALPHABET characters, so an unseen character
costs about ln(ALPHABET) and no probability is zero. Built in memory from text (plain dicts: a few hundred thousand
characters take a second or two); the history of a position is at most order - 1 characters of its own document.
"""
from __future__ import annotations

import math
from collections import Counter
from typing import Iterable

import numpy as np

ALPHABET = 1 << 16  # the uniform floor: an unseen character has about 1/65,536 probability


class CharNgram:
    def __init__(self, order: int = 5):
        if order < 1:
            raise ValueError(f"nightly.screen.ngram_order={order}: give an order of 1 or more (5 is the default)")
        self.order = order
        self.grams: Counter = Counter()   # context + next character -> count
        self.totals: Counter = Counter()  # context -> count of characters that followed it
        self.types: Counter = Counter()   # context -> distinct characters that followed it
        self.chars = 0

    @classmethod
    def build(cls, texts: Iterable[str], order: int = 5) -> "CharNgram":
        model = cls(order)
        for text in texts:
            model.add(text)
        return model

    def add(self, text: str) -> None:
        grams, totals, types, n = self.grams, self.totals, self.types, self.order
        for i, c in enumerate(text):
            for k in range(min(i, n - 1) + 1):
                ctx = text[i - k:i]
                gram = ctx + c
                if gram not in grams:
                    types[ctx] += 1
                grams[gram] += 1
                totals[ctx] += 1
        self.chars += len(text)

    def nll_per_char(self, text: str) -> float:
        """Mean -ln p of the text's characters (nats per character); nan for an empty text."""
        if not text:
            return math.nan
        grams, totals, types, n = self.grams, self.totals, self.types, self.order
        total = 0.0
        for i, c in enumerate(text):
            p = 1.0 / ALPHABET
            for k in range(min(i, n - 1) + 1):
                ctx = text[i - k:i]
                seen = totals.get(ctx, 0)
                if not seen:  # a longer context has this one as its suffix: unseen too
                    break
                kinds = types[ctx]
                p = (grams.get(ctx + c, 0) + kinds * p) / (seen + kinds)
            total -= math.log(p)
        return total / len(text)

    def score(self, texts: Iterable[str]) -> np.ndarray:
        return np.array([self.nll_per_char(t) for t in texts], dtype=np.float64)
