"""A turn's text as the topic detector reads it: letters, CJK, question form, character
n-grams and words, in any script (no tokenizer, no language list). Pure ``re``; the detector
(``topic``) builds its TF-IDF vectors from ``char_ngrams`` and ``word_tokens``."""

from __future__ import annotations

import re

from suffixmem.tokens import CJK_CHAR

# word characters plus combining marks, which Python's \w leaves out: without them Indic,
# Hebrew and Arabic words fall apart at every vowel sign into fragments shared by everything
_MARKS = "\u0300-\u036f\u0591-\u05c7\u064b-\u065f\u0900-\u0dff\u0e31-\u0e4e\u1000-\u109f"
_NON_WORD = re.compile(f"[^\\w{_MARKS}]+", re.UNICODE)
# letters, with those marks: an Indic vowel sign is written as part of its word; without them
# Hindi text counted 0.59 of its letters (Thai 0.79), so its messages read as short ones
_LETTERS = re.compile(f"[^\\W\\d_]|[{_MARKS}]", re.UNICODE)


# kana write syllables (a mora is about two letters of an alphabet); a kanji or hanzi carries
# about a word, a hangul block a syllable of two or three letters. Counting kana as 3, like the
# others, made Japanese messages read half again as long as the same request in other languages
# (the natural tuning sessions: 24 letters per message in alphabetic languages, 7.5 hanzi in
# Chinese, 9.3 kana and 2.8 kanji in Japanese), and length is the signal model's strongest
# feature: Japanese follow-ups read as jumps.
_KANA = re.compile(r"[\u3040-\u30ff]")


def content_chars(text: str) -> int:
    """Letters in ``text`` (combining marks included: "नमस्ते" has 6, as "hello" has 5), with
    kanji, hanzi and hangul counting as 3 and kana as 2 ("天气" has 6, "ですか" 6)."""
    return (len(_LETTERS.findall(text)) + 2 * len(CJK_CHAR.findall(text))
            - len(_KANA.findall(text)))


# Thai, Lao, Myanmar and Khmer letters: scripts written without spaces between words (a space
# there ends a phrase), so what lies between two spaces is a clause, as in CJK text
_UNSPACED_SCRIPT = re.compile(r"[\u0e00-\u0eff\u1000-\u109f\u1780-\u17ff]")


def is_unspaced(text: str) -> bool:
    """Whether ``text`` is mostly written without spaces between words: CJK characters among
    its letters, or mostly Thai, Lao, Myanmar or Khmer letters."""
    letters = len(_LETTERS.findall(text))
    return letters > 0 and (len(CJK_CHAR.findall(text)) * 3 >= letters
                            or len(_UNSPACED_SCRIPT.findall(text)) * 2 >= letters)


_QUESTION = re.compile(r"[?？¿]|(吗|呢|か)\s*$")


def is_question(text: str) -> bool:
    """Whether ``text`` asks something (a question mark, or a CJK question particle at the end)."""
    return _QUESTION.search(text.strip()) is not None


def char_ngrams(text: str, ngrams: tuple[int, int] = (2, 4)) -> list[str]:
    """Character n-grams inside words (each padded with one space, as scikit-learn's
    ``char_wb``) after punctuation is dropped, plus every CJK character on its own: in Chinese
    and Japanese one character often is a word."""
    out: list[str] = []
    lo, hi = ngrams
    for word in _NON_WORD.sub(" ", text.lower()).split():
        padded = f" {word} "
        for n in range(lo, hi + 1):
            out += [padded[i:i + n] for i in range(len(padded) - n + 1)]
    out += CJK_CHAR.findall(text)
    return out


def word_tokens(text: str) -> list[str]:
    """Lower-cased words of two or more characters (none for text written without spaces
    between words, ``is_unspaced``: its "words" are whole clauses, which no other message
    repeats, and a word cosine of ~0 would halve its similarity)."""
    if is_unspaced(text):
        return []
    return [w for w in _NON_WORD.sub(" ", text.lower()).split() if len(w) > 1]
