"""A lexical guard for the semantic cache: cheap checks where sentence embeddings are blind.

Mean-pooled sentence embeddings (all-MiniLM-L6-v2 among them) score two prompts made of
the same words as near-identical, whatever those words' order or the one word that
differs: "Why did Apple sue Samsung?" vs "Why did Samsung sue Apple?" has cosine 0.998.
A cache hit then returns a wrong answer. `conflict(a, b)` names the reason two prompts
must *not* share an answer, or returns None:

* ``numbers``: the numbers differ (digits, number words, ordinals: "5th" = "fifth" = 5);
* ``negation``: one has more negation cues (not, n't, no, never, without, ...);
* ``order``: the same content words in a different order (swapped entities, "A then B"
  vs "B then A");
* ``one word swapped``: identical but for one content word each ("enable" vs "disable",
  "France" vs "Spain"): the embedding barely moves, the answer changes completely.

Every rule errs towards a miss (it also rejects some true paraphrases, e.g. a synonym
swap); a miss costs one model call, a false hit serves a wrong answer.
"""

from __future__ import annotations

import collections
import re

_NUMBER_WORDS = {w: str(i) for i, w in enumerate(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
    "sixteen seventeen eighteen nineteen twenty".split())}
_NUMBER_WORDS.update(thirty="30", forty="40", fifty="50", sixty="60", seventy="70", eighty="80", ninety="90",
                     hundred="100", thousand="1000", million="1000000", billion="1000000000", first="1",
                     second="2", third="3", fourth="4", fifth="5", sixth="6", seventh="7", eighth="8",
                     ninth="9", tenth="10", half="0.5", twice="2", double="2", triple="3")
_NEGATIONS = frozenset("not no never without cannot nor none nothing neither nobody nowhere".split())
# Function words: dropped before comparing content words (relational words like "to",
# "from", "before" are dropped too: the order of the content words around them is checked).
_STOP = frozenset("""a an the is are was were be been being am do does did doing done have has had i me my mine
we us our you your yours it its this that these those he him his she her they them their of in on at to from for by
with about as and or then than so if what which who whom whose when where why how can could should would will shall
may might must please hi hello hey there some any much many more most s d ll re ve m also just very really""".split())
_TOKEN = re.compile(r"\d+(?:[.,]\d+)*(?:st|nd|rd|th)?|[a-z]+(?:'[a-z]+)?")


def _stem(word: str) -> str:
    """Crude: "painting" -> "paint", "caused" -> "caus". Enough to compare word order."""
    for suffix in ("ing", "ed"):
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            return word[: -len(suffix)]
    return word


def analyse(text: str) -> tuple[collections.Counter, int, list[str]]:
    """(numbers as a multiset, negation cues, content words in order) of `text`."""
    numbers: collections.Counter = collections.Counter()
    negations, content = 0, []
    for tok in _TOKEN.findall(text.lower()):
        if tok.endswith("n't"):
            negations += 1
            tok = {"ca": "can", "wo": "will", "sha": "shall"}.get(tok[:-3], tok[:-3])
        tok = re.sub(r"'(s|re|ll|ve|d|m)$", "", tok)  # what's -> what, Australia's -> australia
        if tok in _NEGATIONS:
            negations += 1
        elif tok[0].isdigit() or tok in _NUMBER_WORDS:
            value = _NUMBER_WORDS.get(tok) or re.sub(r"(st|nd|rd|th)$", "", tok).replace(",", "")
            numbers[value] += 1
            content.append(value)
        elif tok not in _STOP:
            content.append(_stem(tok))
    return numbers, negations, content


def conflict(a: str, b: str) -> str | None:
    """Why prompts `a` and `b` must not share a cached answer, or None if no rule objects."""
    num_a, neg_a, words_a = analyse(a)
    num_b, neg_b, words_b = analyse(b)
    if num_a != num_b:
        return "numbers"
    if neg_a != neg_b:
        return "negation"
    bag_a, bag_b = collections.Counter(words_a), collections.Counter(words_b)
    if len(words_a) >= 2 and bag_a == bag_b and words_a != words_b:
        return "order"
    if sum((bag_a - bag_b).values()) == 1 and sum((bag_b - bag_a).values()) == 1 and bag_a & bag_b:
        return "one word swapped"
    return None
