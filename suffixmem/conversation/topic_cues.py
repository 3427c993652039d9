"""Surface cues of topic continuation and topic shift, in several languages.

These are general properties of conversation, not of any data set: a follow-up opens with a
conjunction or a question word ("and", "why", "what about", "und", "y", "那", "じゃあ") or refers
back with a pronoun ("is it", "sind sie", "它"); a speaker who leaves the subject often says so
("by the way", "unrelated question", "übrigens", "por cierto", "顺便问一下", "ところで").

``has_shift_marker(text)`` and ``continues_topic(text)`` match lower-cased text: phrases of
spaced languages on word boundaries, CJK phrases as substrings.
"""

from __future__ import annotations

import re

SHIFT_MARKERS: tuple[str, ...] = (
    # English
    "by the way", "btw", "unrelated question", "unrelated, but", "unrelated but",
    "on another note", "on a different note", "different topic", "change of topic",
    "changing the subject", "change the subject", "new topic", "something else",
    "something completely different", "different question", "switching gears", "random question",
    "off topic", "off-topic", "totally different", "completely different", "moving on",
    "another thing", "quick question about something", "not related",
    # German
    "übrigens", "ganz andere frage", "andere frage", "anderes thema", "themenwechsel",
    "was anderes", "etwas ganz anderes", "mal was ganz anderes", "nebenbei gefragt", "apropos",
    # Spanish
    "por cierto", "cambiando de tema", "otra pregunta", "otra cosa", "otro tema",
    "nada que ver", "a propósito", "hablando de otra cosa", "pregunta aparte",
    # French
    "au fait", "autre question", "autre chose", "changement de sujet", "rien à voir",
    "sans rapport", "changeons de sujet",
    # Italian / Portuguese / Dutch
    "a proposito", "cambiando argomento", "altra domanda", "mudando de assunto",
    "outra pergunta", "por falar nisso", "trouwens", "andere vraag", "ander onderwerp",
    # Russian / Turkish
    "кстати", "другой вопрос", "сменим тему", "bu arada", "başka bir soru",
    # Chinese
    "顺便问", "顺便说", "换个话题", "另一个问题", "另外一个问题", "题外话", "说点别的", "换个问题",
    "顺便請問", "換個話題", "另外問", "另外问一下",
    # Japanese
    "ところで", "話は変わ", "別の質問", "話題を変え", "関係ないけど", "全然違う",
    # Korean
    "그건 그렇고", "다른 질문", "주제를 바꿔",
)

# a message that opens with one of these builds on what was said before
CONTINUATION_OPENERS: tuple[str, ...] = (
    # English
    "and", "but", "so", "why", "how come", "what about", "how about", "what else", "also",
    "then", "really", "which one", "the first", "the second", "the third", "the other", "the last",
    "what do you mean", "tell me more", "more", "same", "what if", "in that case", "compared",
    "how so", "such as", "for example", "like what", "or", "ok and", "okay and", "wait",
    "is that", "isn't that", "can you explain", "explain", "give me an example", "and then",
    # German
    "und", "aber", "warum", "wieso", "weshalb", "was ist mit", "wie ist es mit", "also", "dann",
    "wirklich", "der erste", "die erste", "das erste", "der zweite",
    "die zweite", "das zweite", "zum beispiel", "und wie", "und was", "noch", "inwiefern",
    # Spanish
    "y", "pero", "por qué", "porque", "y el", "y la", "y los", "qué tal", "entonces",
    "de verdad", "el primero", "la primera", "el segundo", "la segunda", "por ejemplo",
    "o sea", "y si", "también",
    # French
    "et", "mais", "pourquoi", "alors", "vraiment", "lequel", "laquelle", "par exemple",
    # Chinese
    "那", "为什么", "為什麼", "为啥", "还有", "還有", "然后", "然後", "第一个", "第二个", "第三个",
    "它", "他们", "她们", "这个", "那个", "这些", "那些", "真的", "怎么会", "比如", "所以",
    "但是", "可是", "那么", "那麼", "而且",
    # Japanese
    "なぜ", "どうして", "それ", "その", "あれ", "じゃあ", "では", "でも", "それで", "二つ目",
    "他には", "ほかには", "本当", "例えば", "つまり",
)

# pronouns that refer back (in a message of a few words they point at the previous turn)
ANAPHORA: tuple[str, ...] = (
    "it", "its", "they", "them", "their", "those", "these", "he", "she", "him", "his", "her",
    "there", "that one", "this one", "the same", "that",
    "er", "ihn", "ihm", "dafür", "davon", "damit", "dort", "dabei", "dazu",
    "eso", "esto", "ese", "esa", "ellos", "ellas", "allí", "allá", "ahí",
    "ça", "cela", "ceci", "il", "elle", "ils", "elles",
    "它", "他们", "她",
    "それ", "その", "あれ", "彼", "彼女", "そこ",
)
# pronouns count only in messages this short (letters; CJK characters count 3)
ANAPHORA_MAX_CONTENT = 25
# a Chinese "X呢?" ("and X?") or Japanese "Xは?" is a follow-up by its form
_FOLLOW_UP_ENDINGS = re.compile(r"(呢|は)\s*[?？]?\s*$")
_CJK = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af]")
_LETTERS = re.compile(r"[^\W\d_]", re.UNICODE)
_LEADING = re.compile(r"^[\W_]+", re.UNICODE)


def _pattern(phrases: tuple[str, ...], anchored: bool) -> re.Pattern[str]:
    spaced = sorted((p for p in phrases if not _CJK.search(p)), key=len, reverse=True)
    cjk = sorted((p for p in phrases if _CJK.search(p)), key=len, reverse=True)
    start = "^" if anchored else r"(?<!\w)"
    alts = [f"{start}{re.escape(p)}(?!\\w)" for p in spaced]
    alts += [f"{'^' if anchored else ''}{re.escape(p)}" for p in cjk]
    return re.compile("|".join(alts))


_SHIFT = _pattern(SHIFT_MARKERS, anchored=False)
_OPENER = _pattern(CONTINUATION_OPENERS, anchored=True)
_ANAPHORA = _pattern(ANAPHORA, anchored=False)


def _clean(text: str) -> str:
    # typographic apostrophes and Spanish opening marks should not hide an opener
    return _LEADING.sub("", text.lower().replace("’", "'").strip())


def has_shift_marker(text: str) -> bool:
    """Whether ``text`` says it changes the subject ("by the way", "übrigens", "顺便问一下")."""
    return _SHIFT.search(_clean(text)) is not None


def continues_topic(text: str) -> bool:
    """Whether ``text`` reads as a follow-up: it opens with a continuation cue, ends as a CJK
    "and X?" question, or is short and refers back with a pronoun."""
    t = _clean(text)
    if _OPENER.search(t) or _FOLLOW_UP_ENDINGS.search(t):
        return True
    content = len(_LETTERS.findall(t)) + 2 * len(_CJK.findall(t))
    return content <= ANAPHORA_MAX_CONTENT and _ANAPHORA.search(t) is not None
