"""The topic detector's background corpus statistics, and chatterbot-corpus access.

The detector's IDF needs document frequencies of a background corpus. They ship as package
data, ``suffixmem/conversation/data/topic_idf.npz`` (hashed features -> document counts, a few
hundred KB), built once by ``build_background()`` from every language of chatterbot-corpus
(short chat utterances, BSD-3). Loading it takes milliseconds; nothing is trained at start-up.
Without the file the detector still works, with the session's own statistics only.

``load_topics`` reads chatterbot-corpus (an optional, bench-only dependency) as
topic -> conversations -> question/answer pairs; the benchmark builds labelled sessions from it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

Pair = tuple[str, str]
BACKGROUND_PATH = Path(__file__).parent / "data" / "topic_idf.npz"


def corpus_dir(language: str = "english") -> Path:
    """The folder of chatterbot-corpus YAML files for ``language``."""
    import chatterbot_corpus

    return Path(chatterbot_corpus.__file__).parent / "data" / language


def available_languages() -> list[str]:
    """Languages chatterbot-corpus ships (folder names)."""
    root = corpus_dir("english").parent
    return sorted(p.name for p in root.iterdir() if p.is_dir())


def load_topics(language: str = "english") -> dict[str, list[list[Pair]]]:
    """topic -> conversations -> question/answer pairs (utterances 0-1, 2-3, ...)."""
    import yaml

    # libyaml's safe loader when PyYAML has it: the same objects on every file of the corpus,
    # ten times faster (the bench reads every language)
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    out: dict[str, list[list[Pair]]] = {}
    for path in sorted(corpus_dir(language).glob("*.yml")):
        data = yaml.load(path.read_text(encoding="utf-8"), Loader=loader) or {}
        convs: list[list[Pair]] = []
        for conv in data.get("conversations") or []:
            texts = [str(u).strip() for u in conv if u is not None]
            pairs = [(texts[i], texts[i + 1]) for i in range(0, len(texts) - 1, 2)
                     if texts[i] and texts[i + 1]]
            if pairs:
                convs.append(pairs)
        if convs:
            out[path.stem] = convs
    return out


def corpus_texts(languages: list[str] | None = None) -> list[str]:
    """Every utterance of chatterbot-corpus in ``languages`` (all when None), de-duplicated."""
    seen: dict[str, None] = {}
    for lang in languages or available_languages():
        for convs in load_topics(lang).values():
            for conv in convs:
                for pair in conv:
                    for t in pair:
                        seen.setdefault(t, None)
    return list(seen)


def build_background(path: Path = BACKGROUND_PATH, texts: list[str] | None = None) -> Path:
    """Write the background document frequencies of ``texts`` (default: all of
    chatterbot-corpus) to ``path`` as sparse (index, count) arrays."""
    from suffixmem.conversation.topic_vector import Featurizer

    f = Featurizer().fit(corpus_texts() if texts is None else texts)
    arrays: dict[str, np.ndarray] = {"docs": np.asarray([f.docs], dtype=np.int64)}
    for name, df in (("char", f.char_df), ("word", f.word_df)):
        idx = np.flatnonzero(df)
        arrays[f"{name}_idx"] = idx.astype(np.uint32)
        arrays[f"{name}_df"] = df[idx].astype(np.uint16)
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(path, **arrays)
    return path


def load_background(path: Path = BACKGROUND_PATH) -> tuple[np.ndarray | None, np.ndarray | None,
                                                            int]:
    """(char_df, word_df, docs) from ``path``; (None, None, 0) when it is missing."""
    from suffixmem.conversation.topic_vector import N_FEATURES

    if not path.is_file():
        return None, None, 0
    with np.load(path) as data:
        out = []
        for name in ("char", "word"):
            df = np.zeros(N_FEATURES, dtype=np.float32)
            df[data[f"{name}_idx"]] = data[f"{name}_df"]
            out.append(df)
        return out[0], out[1], int(data["docs"][0])
