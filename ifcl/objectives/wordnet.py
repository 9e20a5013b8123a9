"""WordNet antonyms for ConIsI's word replacement (strategy o2; Sun & Huang 2022, Section 3.2.1).

The antonyms are read straight from the WordNet 3.0 database files that Debian's ``wordnet-base`` package installs
in ``/usr/share/wordnet`` (``apt-get install wordnet-base``): ``data.{noun,verb,adj,adv}`` hold the synsets and their
pointers, an antonym being the lexical pointer ``!`` from one word of a synset to one word of another;
``index.{noun,verb,adj,adv}`` list each lemma's synsets in sense-frequency order; ``{noun,verb,adj,adv}.exc`` map
irregular inflections to their base forms. Only the lines that carry an antonym pointer are parsed: antonymy is
symmetric, so the synsets the pointers reach are among those lines too.

Format: ``wndb(5WN)``, ``morphy(7WN)`` (the WordNet 3.0 manual pages).
"""

from __future__ import annotations

import functools
import os
import re
from collections import defaultdict
from dataclasses import dataclass

DEFAULT_WORDNET_PATH = "/usr/share/wordnet"

# Database file suffix of each part of speech, in the order that breaks ties between equally ranked senses.
PARTS_OF_SPEECH = ("adj", "adv", "verb", "noun")
# Synset type letter (wndb(5WN)) → the file that holds it; "s" is an adjective satellite, stored in data.adj.
SYNSET_TYPE_FILES = {"n": "noun", "v": "verb", "a": "adj", "s": "adj", "r": "adv"}

# morphy(7WN): suffix detachment rules per part of speech, tried after the exception lists.
DETACHMENT_RULES: dict[str, tuple[tuple[str, str], ...]] = {
    "noun": (
        ("s", ""),
        ("ses", "s"),
        ("xes", "x"),
        ("zes", "z"),
        ("ches", "ch"),
        ("shes", "sh"),
        ("men", "man"),
        ("ies", "y"),
    ),
    "verb": (("s", ""), ("ies", "y"), ("es", "e"), ("es", ""), ("ed", "e"), ("ed", ""), ("ing", "e"), ("ing", "")),
    "adj": (("er", ""), ("est", ""), ("er", "e"), ("est", "e")),
    "adv": (),
}

# An adjective in data.adj may carry a syntactic marker: "able(a)", "galore(ip)".
ADJECTIVE_MARKER = re.compile(r"\((?:a|p|ip)\)$")


class WordNetNotFoundError(FileNotFoundError):
    """The WordNet database files are not where the setting says."""


def missing_wordnet_message(path: str) -> str | None:
    """Why ``path`` is not a WordNet database folder, or None when it is one."""
    wanted = [f"{kind}.{pos}" for kind in ("data", "index") for pos in PARTS_OF_SPEECH]
    missing = [name for name in wanted if not os.path.isfile(os.path.join(path, name))]
    if not missing:
        return None
    return (
        f"WordNet not found in {path!r} (missing {', '.join(missing)}); ConIsI's word replacement (o2) reads its "
        f"antonyms from the WordNet 3.0 database files: `apt-get install wordnet-base` (files in "
        f"{DEFAULT_WORDNET_PATH}) or set --conisi_wordnet_path to the folder that holds them."
    )


def check_wordnet_folder(path: str) -> None:
    """Raise :class:`WordNetNotFoundError` naming the package and the setting when ``path`` lacks WordNet."""
    message = missing_wordnet_message(path)
    if message is not None:
        raise WordNetNotFoundError(message)


@dataclass(frozen=True)
class AntonymPointer:
    """A direct antonym of a lemma in one of its senses: ``rank`` 0 is the lemma's most frequent sense."""

    rank: int
    part_of_speech: str
    antonym: str


class AntonymLexicon:
    """Direct WordNet antonyms of English words, looked up by word form (inflections through morphy(7WN)).

    Antonyms come in the lemma's sense order (most frequent sense first; ties: adjective, adverb, verb, noun).
    Lemmas are lower case, with spaces for WordNet's underscores ("ill will").

    Decision (the paper only says it uses WordNet): direct antonyms only, the ``!`` pointers; adjective satellites
    ("beneficial") have none, and indirect antonyms through their head adjective are not followed. A word is looked
    up as written first, then through its base forms; the antonym is WordNet's base form ("hotter" → "cold").
    """

    def __init__(
        self, antonyms: dict[str, tuple[AntonymPointer, ...]], exceptions: dict[str, dict[str, tuple[str, ...]]]
    ) -> None:
        # lemma → its antonym pointers, sorted by sense rank, then part of speech.
        self._antonyms = antonyms
        # part of speech → inflected form → base forms.
        self._exceptions = exceptions

    @classmethod
    def from_folder(cls, path: str = DEFAULT_WORDNET_PATH) -> AntonymLexicon:
        """Read the antonym pointers, the sense ranks and the exception lists of the WordNet database in ``path``."""
        check_wordnet_folder(path)
        words: dict[tuple[str, int], list[str]] = {}  # (file, synset offset) -> the synset's words
        # (source lemma, source (file, offset), target (file, offset), target word number, 0: every word)
        pointers: list[tuple[str, tuple[str, int], tuple[str, int], int]] = []
        for part_of_speech in PARTS_OF_SPEECH:
            with open(os.path.join(path, f"data.{part_of_speech}"), encoding="utf-8", errors="replace") as f:
                for line in f:
                    if line.startswith("  ") or " ! " not in line:
                        continue  # license header, or a synset without an antonym
                    offset, synset_words, synset_pointers = _parse_synset(line)
                    words[(part_of_speech, offset)] = synset_words
                    for symbol, target_offset, target_type, source_target in synset_pointers:
                        if symbol != "!":
                            continue
                        source, target = int(source_target[:2], 16), int(source_target[2:], 16)
                        target_synset = (SYNSET_TYPE_FILES[target_type], target_offset)
                        for index in range(len(synset_words)) if source == 0 else (source - 1,):
                            pointers.append((synset_words[index], (part_of_speech, offset), target_synset, target))
        lemmas = {lemma for lemma, *_ in pointers}
        ranks = {part_of_speech: _sense_ranks(path, part_of_speech, lemmas) for part_of_speech in PARTS_OF_SPEECH}
        found: dict[str, list[AntonymPointer]] = defaultdict(list)
        for lemma, (part_of_speech, offset), target_synset, target in pointers:
            target_words = words.get(target_synset)
            if not target_words:
                continue
            antonyms = target_words if target == 0 else target_words[target - 1 : target]
            lemma_ranks = ranks[part_of_speech].get(lemma, {})
            rank = lemma_ranks.get(offset, len(lemma_ranks))
            for antonym in antonyms:
                found[lemma].append(AntonymPointer(rank, part_of_speech, antonym))
        antonyms_by_lemma: dict[str, tuple[AntonymPointer, ...]] = {}
        for lemma, entries in found.items():
            entries = [entry for entry in entries if entry.antonym != lemma]
            entries.sort(key=lambda e: (e.rank, PARTS_OF_SPEECH.index(e.part_of_speech)))
            antonyms_by_lemma[lemma] = tuple(dict.fromkeys(entries))
        exceptions = {part_of_speech: _exceptions(path, part_of_speech) for part_of_speech in PARTS_OF_SPEECH}
        return cls(antonyms_by_lemma, exceptions)

    def base_forms(self, word: str, part_of_speech: str) -> list[str]:
        """Candidate lemmas of an inflected ``word`` (lower case) in one part of speech: its exception-list entries,
        then the detachment rules of morphy(7WN)."""
        forms = list(self._exceptions.get(part_of_speech, {}).get(word, ()))
        for suffix, ending in DETACHMENT_RULES[part_of_speech]:
            if word.endswith(suffix) and len(word) > len(suffix):
                forms.append(word[: -len(suffix)] + ending)
        return forms

    def antonym(self, word: str) -> str | None:
        """The antonym of ``word``'s most frequent sense that has one, or None: of the word itself when WordNet has
        it as a lemma with antonyms, otherwise of its base forms (``hotter`` → ``hot`` → ``cold``)."""
        key = word.lower().replace(" ", "_")
        entries = list(self._antonyms.get(key, ()))
        if not entries:
            for part_of_speech in PARTS_OF_SPEECH:
                for base in self.base_forms(key, part_of_speech):
                    entries.extend(e for e in self._antonyms.get(base, ()) if e.part_of_speech == part_of_speech)
            entries.sort(key=lambda e: (e.rank, PARTS_OF_SPEECH.index(e.part_of_speech)))
        return entries[0].antonym.replace("_", " ") if entries else None


def _parse_synset(line: str) -> tuple[int, list[str], list[tuple[str, int, str, str]]]:
    """One data.* line → (synset offset, its words, its pointers as (symbol, offset, synset type, source/target))."""
    fields = line.split(" | ", 1)[0].split()
    offset = int(fields[0])
    word_count = int(fields[3], 16)
    words = [ADJECTIVE_MARKER.sub("", fields[4 + 2 * i]).lower() for i in range(word_count)]
    position = 4 + 2 * word_count
    pointer_count = int(fields[position])
    pointers = []
    for i in range(pointer_count):
        symbol, target_offset, target_type, source_target = fields[position + 1 + 4 * i : position + 5 + 4 * i]
        pointers.append((symbol, int(target_offset), target_type, source_target))
    return offset, words, pointers


def _sense_ranks(path: str, part_of_speech: str, lemmas: set[str]) -> dict[str, dict[int, int]]:
    """lemma → synset offset → sense rank (0 = most frequent), for the given lemmas, from index.<part_of_speech>."""
    ranks: dict[str, dict[int, int]] = {}
    with open(os.path.join(path, f"index.{part_of_speech}"), encoding="utf-8", errors="replace") as f:
        for line in f:
            lemma = line.split(" ", 1)[0]
            if line.startswith("  ") or lemma not in lemmas:
                continue
            fields = line.split()
            synset_count, pointer_kinds = int(fields[2]), int(fields[3])
            offsets = fields[4 + pointer_kinds + 2 : 4 + pointer_kinds + 2 + synset_count]
            ranks[lemma] = {int(offset): rank for rank, offset in enumerate(offsets)}
    return ranks


def _exceptions(path: str, part_of_speech: str) -> dict[str, tuple[str, ...]]:
    """Inflected form → base forms, from <part_of_speech>.exc (absent files give none)."""
    file = os.path.join(path, f"{part_of_speech}.exc")
    if not os.path.isfile(file):
        return {}
    exceptions: dict[str, tuple[str, ...]] = {}
    with open(file, encoding="utf-8", errors="replace") as f:
        for line in f:
            fields = line.split()
            if len(fields) >= 2:
                exceptions[fields[0]] = tuple(fields[1:])
    return exceptions


@functools.lru_cache(maxsize=4)
def load_antonym_lexicon(path: str = DEFAULT_WORDNET_PATH) -> AntonymLexicon:
    """The :class:`AntonymLexicon` of the WordNet folder ``path``, read once per process."""
    return AntonymLexicon.from_folder(path)
