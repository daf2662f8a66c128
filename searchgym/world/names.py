"""Seeded, unique-by-construction names for the synthetic world's entities.

A name is a *pattern*: words joined by spaces. Each word is a *token*, the concatenation of one
choice from each of its *slots*. A type-local index k picks pattern k mod P and, through a keyed
permutation of that pattern's whole name space, a mixed-radix number whose digits pick the slots.
Distinct indices therefore give distinct names with no global set of names:

* a keyed Feistel permutation is a bijection, so distinct indices give distinct numbers;
* every slot of a syllable token except the last is prefix-free, so a token decodes uniquely;
* any two patterns (of one type or of two) differ in their number of words, or at some word
  position where they can never spell the same word: disjoint literal lists, a literal the
  syllable token there cannot spell, or syllable tokens whose endings are suffix-free together
  (as city and country endings are).

The tests check those properties on the lists below, and enumerate a 200,000-page world.
"""

from __future__ import annotations

import hashlib
from math import prod

MASK64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15

Slot = tuple[str, ...]
Token = tuple[Slot, ...]
Pattern = tuple[Token, ...]


def mix64(x: int) -> int:
    """SplitMix64 finaliser: a stable 64-bit integer hash (unlike the per-process salted `hash`)."""
    x = (x + _GOLDEN) & MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


def mix(*parts: int) -> int:
    """A stable 64-bit key from several integers, order-sensitive."""
    h = 0
    for part in parts:
        h = mix64(h ^ (part & MASK64))
    return h


class Permutation:
    """A keyed bijection of range(n): a 4-round Feistel network on an even bit width, cycle-walked into range."""

    def __init__(self, n: int, key: int):
        self.n = n
        self._half = max(1, ((n - 1).bit_length() + 1) // 2)
        self._mask = (1 << self._half) - 1
        self._keys = tuple(mix(key, r) for r in range(4))

    def __call__(self, i: int) -> int:
        """The image of i; applying the network until it lands below n keeps the map a bijection of range(n)."""
        if not 0 <= i < self.n:
            raise IndexError(f"index {i} outside range({self.n})")
        x = self._encrypt(i)
        while x >= self.n:
            x = self._encrypt(x)
        return x

    def _encrypt(self, x: int) -> int:
        half, mask = self._half, self._mask
        left, right = x >> half, x & mask
        for key in self._keys:
            left, right = right, left ^ (mix64(key ^ right) & mask)
        return (left << half) | right


# ---------------------------------------------------------------------------------------------
# Syllables. INITIAL and MEDIAL are consonants followed by exactly one vowel, hence prefix-free.

_VOWELS = ("a", "e", "i", "o", "u")
_ONSETS = (
    "B",
    "D",
    "F",
    "G",
    "H",
    "K",
    "L",
    "M",
    "N",
    "P",
    "R",
    "S",
    "T",
    "V",
    "Z",
    "Br",
    "Dr",
    "Gr",
    "Kr",
    "Tr",
    "Th",
    "St",
    "Vr",
)
_AWKWARD = frozenset({"Fu", "Pu", "Nu", "Zu", "Vu", "Vru", "Stu", "Gru"})
INITIAL: Slot = tuple(o + v for o in _ONSETS for v in _VOWELS if o + v not in _AWKWARD) + ("A", "E", "I", "O")
MEDIAL: Slot = tuple(
    c + v
    for c in (
        "l",
        "r",
        "n",
        "m",
        "v",
        "d",
        "th",
        "s",
        "lv",
        "rv",
        "nd",
        "st",
        "sk",
        "rd",
        "ld",
        "ss",
        "dr",
        "tr",
        "br",
        "g",
        "k",
        "z",
        "ll",
        "rr",
        "nn",
        "sh",
    )
    for v in ("a", "e", "i", "o")
)
CODA: Slot = ("", "n", "r", "l", "s", "th", "nd", "rn", "x", "m", "sk", "rk", "ld", "ss", "v", "sh")
GIVEN_END: Slot = (
    "lda",
    "ra",
    "na",
    "rin",
    "ren",
    "lan",
    "ric",
    "mir",
    "ven",
    "ssa",
    "lla",
    "ris",
    "nna",
    "thas",
    "ros",
    "lia",
    "dan",
    "mon",
    "rik",
    "wen",
    "sha",
    "nor",
    "lis",
    "tan",
    "bel",
    "mar",
    "lo",
)
FAMILY_END: Slot = (
    "ss",
    "x",
    "rrow",
    "nner",
    "lby",
    "rwick",
    "ssel",
    "ndal",
    "vane",
    "rlow",
    "thorne",
    "ck",
    "rr",
    "lmond",
    "mmel",
    "rne",
    "ll",
    "ttering",
    "nley",
    "rth",
    "ske",
    "ven",
    "lding",
    "rran",
    "llis",
    "sk",
    "rrick",
    "bury",
    "wright",
    "holt",
    "marsh",
    "ley",
    "rst",
    "nsey",
    "rcott",
    "wen",
)
CITY_END: Slot = (
    "mere",
    "ford",
    "holm",
    "by",
    "ton",
    "wick",
    "gard",
    "mouth",
    "stead",
    "burg",
    "dale",
    "haven",
    "port",
    "field",
)
# Country ending -> the ending of its demonym, so "Ostravia" speaks "Ostravian".
COUNTRY_ENDINGS: dict[str, str] = {
    "via": "vian",
    "nia": "nian",
    "ria": "rian",
    "sia": "sian",
    "thia": "thian",
    "lia": "lian",
    "dora": "doran",
}

GIVEN: Token = (INITIAL, GIVEN_END)
FAMILY: Token = (INITIAL, FAMILY_END)
ROOT: Token = (INITIAL, MEDIAL, CODA)
CITY: Token = (INITIAL, MEDIAL, CITY_END)
COUNTRY: Token = (INITIAL, MEDIAL, tuple(COUNTRY_ENDINGS))
SYLLABLE_TOKENS: tuple[Token, ...] = (GIVEN, FAMILY, ROOT, CITY, COUNTRY)

# ---------------------------------------------------------------------------------------------
# English words. Film and book lists are disjoint from each other and from every other literal.

COMPANY_NOUNS: Slot = (
    "Mills",
    "Works",
    "Holdings",
    "Foundry",
    "Industries",
    "Trading",
    "Group",
    "Partners",
    "Brothers",
    "Company",
    "Ironworks",
    "Shipyards",
    "Textiles",
    "Press",
    "Brewery",
    "Logistics",
    "Instruments",
    "Motors",
    "Ventures",
    "Mining",
)
FILM_ADJECTIVES: Slot = (
    "Silent",
    "Crimson",
    "Distant",
    "Burning",
    "Hidden",
    "Broken",
    "Golden",
    "Endless",
    "Frozen",
    "Restless",
    "Scarlet",
    "Hollow",
    "Wild",
    "Last",
    "Midnight",
    "Electric",
    "Velvet",
    "Shattered",
    "Forgotten",
    "Lonely",
)
FILM_NOUNS: Slot = (
    "Harbor",
    "Horizon",
    "Signal",
    "Frontier",
    "Tide",
    "Mirror",
    "Engine",
    "Storm",
    "Orchard",
    "Passage",
    "Carnival",
    "Lighthouse",
    "Border",
    "Station",
    "Canyon",
    "Runway",
    "Echo",
    "Outpost",
    "Circuit",
    "Sky",
)
BOOK_PLURALS: Slot = (
    "Letters",
    "Songs",
    "Chronicles",
    "Tales",
    "Memories",
    "Gardens",
    "Ballads",
    "Notes",
    "Sketches",
    "Voyages",
    "Winters",
    "Lanterns",
    "Ashes",
    "Footsteps",
    "Whispers",
    "Seasons",
)
BOOK_NOUNS: Slot = (
    "Winter",
    "Summer",
    "Season",
    "Year",
    "Month",
    "Week",
    "Night",
    "Journey",
    "Promise",
    "Stranger",
    "Garden",
    "House",
    "Childhood",
    "Wedding",
    "Quarrel",
    "Silence",
)


def word(text: str) -> Token:
    """A token that is always the one literal word `text`."""
    return ((text,),)


def words(options: Slot) -> Token:
    """A token that is one word chosen from `options`."""
    return (options,)


PATTERNS: dict[str, tuple[Pattern, ...]] = {
    "person": ((GIVEN, FAMILY),),
    "city": ((CITY,),),
    "country": ((COUNTRY,),),
    "company": ((ROOT, words(COMPANY_NOUNS)),),
    "university": (
        (word("University"), word("of"), ROOT),
        (ROOT, word("University")),
        (ROOT, word("College")),
        (ROOT, word("Institute"), word("of"), word("Technology")),
    ),
    "river": ((ROOT, word("River")),),
    "mountain": ((word("Mount"), ROOT), (ROOT, word("Peak"))),
    "film": (
        (word("The"), words(FILM_ADJECTIVES), words(FILM_NOUNS), word("of"), ROOT),
        (word("The"), ROOT, words(FILM_NOUNS)),
        (words(FILM_ADJECTIVES), words(FILM_NOUNS), word("over"), ROOT),
    ),
    "book": (
        (words(BOOK_PLURALS), word("of"), ROOT),
        (word("The"), ROOT, words(BOOK_PLURALS)),
        (word("A"), words(BOOK_NOUNS), word("in"), ROOT),
    ),
    "event": (
        (ROOT, word("Festival")),
        (ROOT, word("Summit")),
        (ROOT, word("Fair")),
        (ROOT, word("Marathon")),
        (word("Congress"), word("of"), ROOT),
    ),
}


def pattern_size(pattern: Pattern) -> int:
    """How many distinct names a pattern can spell."""
    return prod(len(slot) for token in pattern for slot in token)


def decode(pattern: Pattern, x: int) -> str:
    """The name numbered x in a pattern: x's mixed-radix digits choose each slot, first slot lowest."""
    out = []
    for token in pattern:
        parts = []
        for slot in token:
            x, digit = divmod(x, len(slot))
            parts.append(slot[digit])
        out.append("".join(parts))
    return " ".join(out)


def language_of(country_name: str) -> str:
    """The official language a country's name implies: its ending swapped for the demonym ending ("Ostravian")."""
    for ending, demonym in COUNTRY_ENDINGS.items():
        if country_name.endswith(ending):
            return country_name[: -len(ending)] + demonym
    raise ValueError(f"{country_name!r} is not a country name")


class Namer:
    """The names of one entity type in one seeded world: type-local index -> unique name."""

    def __init__(self, entity_type: str, count: int, seed: int):
        self.patterns = PATTERNS[entity_type]
        per_pattern = -(-count // len(self.patterns))
        for pattern in self.patterns:
            if pattern_size(pattern) < per_pattern:
                raise ValueError(f"{entity_type} names run out: {count} needed, pattern holds {pattern_size(pattern)}")
        type_key = mix(seed, int.from_bytes(hashlib.blake2b(entity_type.encode(), digest_size=8).digest(), "big"))
        self._perms = tuple(Permutation(pattern_size(p), mix(type_key, i)) for i, p in enumerate(self.patterns))
        self.count = count

    def __call__(self, k: int) -> str:
        """The name of the type's k-th entity."""
        if not 0 <= k < self.count:
            raise IndexError(f"index {k} outside range({self.count})")
        j, p = divmod(k, len(self.patterns))
        return decode(self.patterns[p], self._perms[p](j))
