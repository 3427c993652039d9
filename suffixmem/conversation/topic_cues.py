"""Surface cues of topic continuation and topic shift, in several languages.

These are general properties of conversation, not of any data set: a follow-up opens with a
conjunction or a question word ("and", "why", "what about", "und", "y", "那", "じゃあ") or refers
back with a pronoun ("is it", "sind sie", "它"); a speaker who leaves the subject often says so
("by the way", "unrelated question", "übrigens", "por cierto", "顺便问一下", "ところで").

A speaker who comes back to an earlier subject says that too ("back to the python thing",
"zurück zur Steuer", "回到红烧肉", "京都の話に戻りますが", "다시 제주 얘기인데"): the current
subject ends there, as after a shift marker (the benchmark's conversation sets label a return
after an unrelated stretch a jump); one who marks a shift but adds to the subject ("by the way,
does that work on a couch too", "übrigens, gilt das auch für ...") stays on it.

A message that only acknowledges the answer ("thanks", "got it", "merci", "спасибо", "ありがとう")
reacts to the topic and never opens a new one.

``has_shift_marker(text)``, ``returns_to_topic(text)``, ``adds_to_topic(text)``,
``continues_topic(text)`` and ``is_acknowledgement(text)`` match lower-cased text: phrases of
spaced languages on word boundaries, CJK phrases as substrings.
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

# a speaker coming back to an earlier subject: spaced phrases count at the start of a clause
# (up to two discourse words before them: "ok back to severance", "Entendido. Volviendo al
# portátil"), since later in one they describe ("should i go back to school"); CJK phrases
# anywhere. Only verbs of returning: "what you said earlier", "さっきの", "刚才说的" mostly
# point at the last answer, within the subject
RETURN_MARKERS: tuple[str, ...] = (
    # English
    "back to", "going back to", "coming back to", "getting back to", "returning to",
    "let's go back to", "lets go back to", "let's get back to", "lets get back to",
    # German / Dutch / Swedish
    "zurück zu", "zurück zur", "zurück zum", "zurückkommend auf", "nochmal zu", "noch mal zu",
    "terug naar", "terugkomend op", "om terug te komen op", "tillbaka till",
    # Spanish / Portuguese / Italian / French
    "volviendo a", "volviendo al", "volvamos a", "volvamos al", "retomando",
    "voltando a", "voltando ao", "voltando à", "tornando a", "tornando al", "tornando alla",
    "tornando ai", "tornando sul", "torniamo a", "ritornando a",
    "pour revenir à", "pour revenir au", "pour revenir sur", "revenons à", "revenons au",
    "je reviens à", "je reviens sur",
    # Russian / Ukrainian / Polish / Czech / Turkish
    "возвращаясь к", "вернёмся к", "вернемся к", "повертаючись до", "повернімося до",
    "wracając do", "wróćmy do", "zpět k", "konuya dönersek", "konuya dönecek olursak",
    # Vietnamese / Indonesian
    "quay lại", "trở lại với", "kembali ke",
    # Chinese
    "说回", "說回",
    # Japanese
    "話に戻", "話を戻", "件に戻",
    # Korean
    "얘기로 돌아", "이야기로 돌아", "돌아가서",
)
# "回到" is also coming home ("回到家"), so it counts where no place follows
_CHINESE_RETURN = re.compile(r"回到(?!家|公司|学校|學校|国|國|老家|宿舍|酒店)")
# "다시 제주 얘기인데": Korean names the subject between "again" and "talk"
_KOREAN_RETURN = re.compile(r"다시\s+\S{1,12}\s*(얘기|이야기)(인데|로|는)")
# additive words: a marked shift that says "also" or "too" adds to the subject it is on
ADDITIVES: tuple[str, ...] = (
    "too", "also", "as well", "the same", "same", "auch", "ebenfalls", "también", "tambien",
    "aussi", "également", "anche", "também", "tambem", "ook", "också", "też", "także",
    "тоже", "также", "теж", "також", "也", "同じ", "같은",
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
# words that judge the last answer: after a thanks or an "ok", a rest that ends on one of them
# (at most ``ACKNOWLEDGEMENT_MAX_TAIL`` letters after it: "ok it came out perfect ty") is still
# a reaction up to ``ACKNOWLEDGEMENT_MAX_PRAISE`` letters ("Thank you, that's really helpful.",
# "ありがとうございます、助かりました", "ok merci j'y vois plus clair"), unless it asks something
# or carries a shift marker; "Thanks, that was helpful. Now tell me about Paris" goes on past
# the praise. No comparatives: "ok so which of the two laptops is better" asks, even without a "?"
PRAISE: tuple[str, ...] = (
    "helpful", "helps", "helped", "useful", "clear", "perfect", "worked",
    "makes sense", "hilfreich", "hilft", "geholfen", "geklappt", "utile", "clair", "útil",
    "ajuda", "ajudou", "aiuta", "chiaro", "nuttig", "pomocne", "полезно", "помогли", "помогло",
    "помогает", "корисно", "допомогли",
    "有帮助", "有用", "清楚", "助かりました", "助かる", "わかりやすい", "도움", "덕분",
)
ACKNOWLEDGEMENT_MAX_PRAISE = 40
# of which at most this many before it: an interjection ("wow, thanks", "понял, спасибо",
# "오 감사합니다"), not a request that happens to end in "great"
ACKNOWLEDGEMENT_MAX_LEAD = 8
# and after the praise word: a sign-off ("ty", "danke"), not a new request
ACKNOWLEDGEMENT_MAX_TAIL = 8
# a rest that opens with one of these (after up to two ``DISCOURSE_WORDS``) asks, even typed
# without a question mark: "ok how do i make ice clear" ends on a praise word but is a question
INTERROGATIVES: tuple[str, ...] = (
    "how", "what", "why", "where", "when", "which", "who", "can", "could", "should", "would",
    "do", "does", "is", "are", "wie", "warum", "wo", "wann", "welche", "welcher", "kann",
    "cómo", "qué", "por qué", "dónde", "cuándo", "cuál", "comment", "pourquoi", "où", "quand",
    "quel", "quelle", "est-ce", "perché", "dove", "quale", "como", "onde", "qual",
    "hoe", "waarom", "как", "почему", "где", "когда", "какой", "чому",
    "怎么", "为什么", "為什麼", "どうやって", "どうすれば", "なぜ", "어떻게", "왜",
)
# pronouns count only in messages this short (`content_chars`)
ANAPHORA_MAX_CONTENT = 25
# a Chinese "X呢?" ("and X?"), Japanese "Xは?" or Korean "X은/는?" is a follow-up by its form
_FOLLOW_UP_ENDINGS = re.compile(r"(呢|は|은|는)\s*[?？]?\s*$")
_LEADING = re.compile(r"^[\W_]+", re.UNICODE)


# words that may open a clause before a return phrase ("ok back to", "e voltando ao", "so
# anyway, back to"): discourse particles only, so that "come back to bed", "flights back to
# London" or "im going back to school" describe rather than return
DISCOURSE_WORDS: tuple[str, ...] = (
    "ok", "okay", "oke", "oké", "okey", "k", "so", "anyway", "anyways", "alright", "right",
    "well", "now", "and", "but", "oh", "hey", "um", "umm", "hm", "hmm", "then", "btw", "also",
    "e", "y", "et", "und", "ja", "nun", "dann", "jetzt", "gut", "bon", "alors", "bueno",
    "pues", "vale", "entonces", "então", "entao", "pronto", "allora", "va", "bene", "dobrze",
    "no", "tak", "a", "i", "и", "а", "ну", "ладно", "так", "en", "nou", "goed", "och", "nå",
)
# up to two discourse words before a phrase (``INTERROGATIVES`` opening a rest: "ok so how ...")
_DISCOURSE = (r"(?:(?:" + "|".join(sorted(map(re.escape, DISCOURSE_WORDS), key=len, reverse=True))
              + r")(?!\w)\W*){0,2}")
# the start of a clause, with them before the phrase (``RETURN_MARKERS``)
_CLAUSE_START = r"(?:^|[.!?;:,。！？；：，、]\s*)" + _DISCOURSE


def _pattern(phrases: tuple[str, ...], anchored: bool,
             spaced_start: str | None = None) -> re.Pattern[str]:
    """Any of ``phrases``: spaced ones on word boundaries (at the start with ``anchored``, or
    after ``spaced_start``), CJK ones as substrings (at the start with ``anchored``)."""
    spaced = sorted((p for p in phrases if not CJK_CHAR.search(p)), key=len, reverse=True)
    cjk = sorted((p for p in phrases if CJK_CHAR.search(p)), key=len, reverse=True)
    start = spaced_start if spaced_start is not None else "^" if anchored else r"(?<!\w)"
    alts = [f"{start}{re.escape(p)}(?!\\w)" for p in spaced]
    alts += [f"{'^' if anchored else ''}{re.escape(p)}" for p in cjk]
    return re.compile("|".join(alts))


_SHIFT = _pattern(SHIFT_MARKERS, anchored=False)
_OPENER = _pattern(CONTINUATION_OPENERS, anchored=True)
_ANAPHORA = _pattern(ANAPHORA, anchored=False)
_ACK = _pattern(ACKNOWLEDGEMENTS, anchored=True)
_THANKS = _pattern(THANKS, anchored=False)
_PRAISE = _pattern(PRAISE, anchored=False)
_ADDITIVE = _pattern(ADDITIVES, anchored=False)
_RETURN = _pattern(RETURN_MARKERS, anchored=False, spaced_start=_CLAUSE_START)
_EXCLAIMED = re.compile(r"^\W*(?:(?:a|an|so|really|very|sehr|très|muy|molto)\s+)*")
_ASKS = _pattern(INTERROGATIVES, anchored=True, spaced_start="^" + _DISCOURSE)


def _clean(text: str) -> str:
    # typographic apostrophes and Spanish opening marks should not hide an opener
    return _LEADING.sub("", text.lower().replace("’", "'").strip())


def has_shift_marker(text: str) -> bool:
    """Whether ``text`` says it changes the subject ("by the way", "übrigens", "顺便问一下")."""
    return _SHIFT.search(_clean(text)) is not None


def returns_to_topic(text: str) -> bool:
    """Whether ``text`` says it comes back to an earlier subject ("back to the python thing",
    "Volviendo al portátil", "回到红烧肉", "肉じゃがの話に戻りますが", "다시 제주 얘기인데")."""
    t = _clean(text)
    return any(p.search(t) is not None for p in (_RETURN, _CHINESE_RETURN, _KOREAN_RETURN))


def adds_to_topic(text: str) -> bool:
    """Whether ``text`` says it adds to the subject ("too", "also", "auch", "也", "同じ")."""
    return _ADDITIVE.search(_clean(text)) is not None


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
    спасибо", "오 감사합니다"), or with a little more that judges the answer (``PRAISE``)."""
    t = _clean(text)
    if is_question(t):
        return False
    found = _ACK.search(t)
    if found is not None and _reacts(t[found.end():]):
        return True
    for found in _THANKS.finditer(t):
        lead = content_chars(t[:found.start()])
        if lead > ACKNOWLEDGEMENT_MAX_LEAD:
            return False
        if _reacts(t[found.end():], lead):
            return True
    return False


def _reacts(rest: str, lead: int = 0) -> bool:
    """Whether ``rest``, after a thanks or an "ok" (``lead`` letters before it), keeps the
    message a reaction: short, or ending on a judgement of the answer, with no shift marker."""
    letters = lead + content_chars(rest)
    if letters <= ACKNOWLEDGEMENT_MAX_REST:
        return True
    if letters > ACKNOWLEDGEMENT_MAX_PRAISE or _SHIFT.search(rest) is not None:
        return False
    rest = _LEADING.sub("", rest)
    asks = _ASKS.search(rest)
    # an exclamation judges ("what a helpful answer", "how useful", "wie hilfreich")
    if asks is not None and not _PRAISE.match(_EXCLAIMED.sub("", rest[asks.end():])):
        return False
    praised = [m.end() for m in _PRAISE.finditer(rest)]
    return bool(praised) and content_chars(rest[praised[-1]:]) <= ACKNOWLEDGEMENT_MAX_TAIL
