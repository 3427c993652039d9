"""Surface cues of topic continuation and topic shift, in several languages.

These are general properties of conversation, not of any data set: a follow-up opens with a
conjunction or a question word ("and", "why", "what about", "und", "y", "那", "じゃあ") or refers
back with a pronoun ("is it", "sind sie", "它"); a speaker who leaves the subject often says so
("by the way", "unrelated question", "übrigens", "por cierto", "顺便问一下", "ところで").

A message that only acknowledges the answer ("thanks", "got it", "merci", "спасибо", "ありがとう")
reacts to the topic and never opens a new one.

``has_shift_marker(text)``, ``continues_topic(text)`` and ``is_acknowledgement(text)`` match
lower-cased text: phrases of spaced languages on word boundaries, CJK phrases as substrings.
"""

from __future__ import annotations

import re

from suffixmem.conversation.topic_text import CJK_CHAR, content_chars, is_question

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
    "changer de sujet", "autre sujet", "tout autre chose", "question sans rapport",
    # Italian / Portuguese / Dutch
    "a proposito", "cambiando argomento", "altra domanda", "mudando de assunto",
    "outra pergunta", "por falar nisso", "trouwens", "andere vraag", "ander onderwerp",
    "cambiando discorso", "tutt'altra cosa", "non c'entra", "altro argomento",
    "aliás", "outro assunto", "outra coisa", "nada a ver", "iets anders", "ander punt",
    # Russian / Ukrainian / Turkish
    "кстати", "другой вопрос", "сменим тему", "другая тема", "не по теме", "совсем другое",
    "вопрос не по теме", "к слову", "до речі", "інше питання", "bu arada", "başka bir soru",
    "konu değiştirelim", "alakasız ama",
    # Chinese
    "顺便问", "顺便说", "换个话题", "另一个问题", "另外一个问题", "题外话", "说点别的", "换个问题",
    "顺便請問", "換個話題", "另外問", "另外问一下",
    # Japanese
    "ところで", "話は変わ", "別の質問", "話題を変え", "関係ないけど", "全然違う", "ちなみに",
    # Korean
    "그건 그렇고", "다른 질문", "주제를 바꿔", "그나저나", "다른 얘기", "다른 이야기", "딴 얘기",
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
    "donc", "c'est-à-dire", "aussi", "et si", "et pour",
    # Italian / Portuguese
    "e", "ma", "perché", "allora", "quindi", "davvero", "per esempio", "cioè", "anche",
    "mas", "por que", "então", "tipo", "também", "e se",
    # Dutch / Turkish
    "maar", "waarom", "dus", "echt", "bijvoorbeeld", "ve", "ama", "neden", "peki",
    "yani", "mesela",
    # Russian / Ukrainian
    "а", "и", "но", "почему", "зачем", "тогда", "то есть", "например", "правда", "а если",
    "чому", "тоді", "наприклад",
    # Chinese
    "那", "为什么", "為什麼", "为啥", "还有", "還有", "然后", "然後", "第一个", "第二个", "第三个",
    "它", "他们", "她们", "这个", "那个", "这些", "那些", "真的", "怎么会", "比如", "所以",
    "但是", "可是", "那么", "那麼", "而且",
    # Japanese
    "なぜ", "どうして", "それ", "その", "あれ", "じゃあ", "では", "でも", "それで", "二つ目",
    "他には", "ほかには", "本当", "例えば", "つまり",
    # Korean
    "그럼", "그러면", "왜", "그래서", "그리고", "그거", "그것", "거기", "이거", "예를 들어",
    "정말", "진짜", "두 번째",
)

# pronouns that refer back (in a message of a few words they point at the previous turn)
ANAPHORA: tuple[str, ...] = (
    "it", "its", "they", "them", "their", "those", "these", "he", "she", "him", "his", "her",
    "there", "that one", "this one", "the same", "that",
    "er", "ihn", "ihm", "dafür", "davon", "damit", "dort", "dabei", "dazu",
    "eso", "esto", "ese", "esa", "ellos", "ellas", "allí", "allá", "ahí",
    "ça", "cela", "ceci", "il", "elle", "ils", "elles",
    "lo", "questo", "quello", "questa", "quella", "lì", "là", "isso", "isto", "ele", "ela",
    "eles", "elas", "dat", "daar", "bu", "şu", "orada",
    "это", "он", "она", "оно", "они", "его", "её", "их", "там", "це", "він", "вона", "вони",
    "它", "他们", "她",
    "それ", "その", "あれ", "彼", "彼女", "そこ",
    "그거", "그것", "거기", "그게",
)

# a thanks or an "ok" acknowledges the last answer wherever it stands in a short message that
# asks nothing: after an interjection ("wow, thanks", "понял, спасибо", "오 감사합니다") too
THANKS: tuple[str, ...] = (
    "thanks", "thank you", "thx", "ok", "okay", "got it", "understood",
    "danke", "vielen dank", "verstehe", "verstanden",
    "gracias", "muchas gracias", "entendido", "entiendo", "merci", "merci beaucoup", "compris",
    "grazie", "grazie mille", "capito", "capisco", "obrigado", "obrigada", "entendi",
    "bedankt", "dank je", "begrepen", "dzięki", "dziękuję", "rozumiem", "tack", "tack så mycket",
    "спасибо", "понятно", "понял", "поняла", "дякую", "зрозуміло",
    "teşekkürler", "teşekkür ederim", "sağ ol", "anladım",
    "谢谢", "謝謝", "多谢", "明白了", "懂了", "知道了",
    "ありがとう", "わかった", "分かった", "わかりました", "分かりました",
    "고마워", "고마워요", "고맙습니다", "감사합니다", "감사해요",
    "알겠어", "알겠어요", "알겠습니다",
)
# these acknowledge only when they open the message: inside one they describe ("Prefiro o
# Super Mario 64", "the food was great"); a THANKS acknowledges at the start too
ACKNOWLEDGEMENTS: tuple[str, ...] = (
    "i see", "makes sense", "great", "cool", "nice", "perfect", "all right", "alright",
    "sounds good", "alles klar", "super", "prima", "vale", "de acuerdo", "genial", "perfecto",
    "claro", "d'accord", "parfait", "je vois", "va bene", "perfetto", "beleza", "valeu",
    "duidelijk", "ясно", "хорошо", "ладно", "tamam",
    "好的", "了解", "なるほど", "了解です", "了解しました", "그렇구나",
)
# letters (`content_chars`: kanji and hangul count 3, kana 2) around the thanks: "Ok. Now tell
# me about Rome" says more
ACKNOWLEDGEMENT_MAX_REST = 16
# of which at most this many before it: an interjection ("wow, thanks", "понял, спасибо",
# "오 감사합니다"), not a request that happens to end in "great"
ACKNOWLEDGEMENT_MAX_LEAD = 8
# pronouns count only in messages this short (`content_chars`)
ANAPHORA_MAX_CONTENT = 25
# a Chinese "X呢?" ("and X?"), Japanese "Xは?" or Korean "X은/는?" is a follow-up by its form
_FOLLOW_UP_ENDINGS = re.compile(r"(呢|は|은|는)\s*[?？]?\s*$")
_LEADING = re.compile(r"^[\W_]+", re.UNICODE)


def _pattern(phrases: tuple[str, ...], anchored: bool) -> re.Pattern[str]:
    spaced = sorted((p for p in phrases if not CJK_CHAR.search(p)), key=len, reverse=True)
    cjk = sorted((p for p in phrases if CJK_CHAR.search(p)), key=len, reverse=True)
    start = "^" if anchored else r"(?<!\w)"
    alts = [f"{start}{re.escape(p)}(?!\\w)" for p in spaced]
    alts += [f"{'^' if anchored else ''}{re.escape(p)}" for p in cjk]
    return re.compile("|".join(alts))


_SHIFT = _pattern(SHIFT_MARKERS, anchored=False)
_OPENER = _pattern(CONTINUATION_OPENERS, anchored=True)
_ANAPHORA = _pattern(ANAPHORA, anchored=False)
_ACK = _pattern(ACKNOWLEDGEMENTS, anchored=True)
_THANKS = _pattern(THANKS, anchored=False)


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
    return content_chars(t) <= ANAPHORA_MAX_CONTENT and _ANAPHORA.search(t) is not None


def is_acknowledgement(text: str) -> bool:
    """Whether ``text`` only acknowledges the last answer: it asks nothing and is a thanks or an
    "ok" with little around it ("Thanks, that helps.", "Merci beaucoup", "好的，明白了", "понял,
    спасибо", "오 감사합니다")."""
    t = _clean(text)
    if is_question(t):
        return False
    found = _ACK.search(t)
    if found is not None and content_chars(t[found.end():]) <= ACKNOWLEDGEMENT_MAX_REST:
        return True
    for found in _THANKS.finditer(t):
        lead = content_chars(t[:found.start()])
        if lead > ACKNOWLEDGEMENT_MAX_LEAD:
            return False
        if lead + content_chars(t[found.end():]) <= ACKNOWLEDGEMENT_MAX_REST:
            return True
    return False
