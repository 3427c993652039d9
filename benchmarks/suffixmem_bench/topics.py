"""``suffixmem bench topics``: topic-jump detection on conversations the detector never saw.

Data sets (``topic_sets``, whose docstring describes each): ``chatterbot-<language>``
sessions built from held-out topic files, and the conversation sets written for this project
(``natural``, ``natural-fresh``, ``natural-blind`` ... ``natural-blind8`` and the stress set
``natural-hard``: ``topic_sets.CONVERSATION_SETS``), never tuned on.

Tuning data (never scored): the English chatterbot tuning sessions and
``data/natural_tune.jsonl``, separate sessions written in the natural set's style. On them: the
detector's signal model (``topic_signals``: seven weights fitted with the true history, then the
cutoff with the smallest worst regret running on its own verdicts, ``fit_model``) and the
baseline rule's threshold (``topic_scoring.RuleDetector``: char 2-4-gram TF-IDF fitted on the
session, cosine with the last three turns; its best mean F1), and the length rule's
(``topic_scoring.best_length``: a message of at least that many letters is a jump; its best
mean F1). Reported per data set: F1, precision, recall, the rule's F1, ``length_f1`` (the
length rule's: what length alone finds) and ``length_auc`` (length as a jump score, ROC AUC),
turns and jumps scored, ``all_jumps_f1`` (the F1 of calling
every turn a jump: a set near it carries little topic signal), ``similarity_auc`` (the rule's
similarity as a jump score, ROC AUC: 0.5 means no threshold on TF-IDF similarity can find the
set's jumps); for the sets independent readers labelled, ``reader_f1`` (``topic_readers``: how
well a careful reader's jumps match the writer's, the ceiling the labels allow) and
``chatterbot_reader`` (the same on 40 English chatterbot sessions, beside the detector's F1
there); ``f1_min`` over data sets; ``ms_per_turn_p99`` and ``peak_mb`` of the shipped
default detector on a 50-turn session in a fresh interpreter (what serving adds; this process
also holds the corpus and the bench's own torch probe). ``--context-gain`` or
``--hidden-similarity`` adds the detector with that signal of the served model beside the
default one (``topic_gain``).
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from suffixmem.conversation.topic import (
    Featurizer,
    TopicDetector,
    TopicState,
    default_detector,
    signal_name,
)
from suffixmem.conversation.topic_corpus import available_languages, load_topics
from suffixmem.conversation.topic_signals import EXTRA_FEATURES, SignalModel
from suffixmem_bench.measure import peak_rss_mb
from suffixmem_bench.topic_readers import agreement, chatterbot_sample
from suffixmem_bench.topic_scoring import (
    RuleDetector,
    best_length,
    best_rule,
    evaluate,
    length_auc,
    length_scores,
    predictions,
    rule_scores,
)
from suffixmem_bench.topic_sets import (
    CONVERSATION_SETS,
    NATURAL_TUNE,
    Session,
    build_sessions,
    load_natural,
    pools,
    split_topic_names,
    utterances,
)

CUTOFFS = [round(0.05 * i, 2) for i in range(2, 17)]  # 0.1 .. 0.8


def teacher_features(detector: TopicDetector, sessions: Sequence[Session],
                     ) -> tuple[list[list[float]], list[bool]]:
    """Signal features of every turn the model decides (not a first turn, none a cue decides:
    ``TopicDetector.decided_by_cues``), each against the true history (the state follows the
    true jumps)."""
    xs: list[list[float]] = []
    ys: list[bool] = []
    for session in sessions:
        state = TopicState()
        for i, (q, a, jump) in enumerate(session):
            found = detector.signals(state, q) if i else None
            if found is not None and not detector.decided_by_cues(q):
                xs.append(found[1])
                ys.append(jump)
            detector.add_turn(state, q, a, jump)
    return xs, ys


def fit_model(sets: Sequence[tuple[Featurizer, Sequence[Session]]], gain: Any = None
              ) -> tuple[SignalModel, float]:
    """The signal model fitted on ``sets`` (each weighs the same), then its cutoff with the
    smallest worst regret over them running on its own verdicts: a set's regret at a cutoff is
    how far its F1 there falls below its own best F1 over ``CUTOFFS``, and the cutoff whose
    largest regret is smallest wins (ties: the best mean F1); returns (model, the mean F1
    there). Why regret: the target is every set, and the tuning sets differ in how much they
    allow (chatterbot's topic-file changes top out near F1 0.5, natural conversations reach
    more). The mean F1 let the easier set pull the cutoff its way; the worst F1 (the rule of
    2026-12-04) let the harder set do the same the other way. With ``gain`` (a
    ``ContextGain`` or ``HiddenSimilarity``) the model has that signal's feature too."""
    xs: list[list[float]] = []
    ys: list[bool] = []
    ws: list[float] = []
    for feat, sessions in sets:
        x, y = teacher_features(TopicDetector(None, feat, None, gain), sessions)
        xs += x
        ys += y
        ws += [1.0 / len(x)] * len(x)
    scale = len(xs) / len(sets)
    model = SignalModel.fit(xs, ys, [w * scale for w in ws],
                            extra=signal_name(gain) or "context_gain")

    def f1s(cutoff: float) -> list[float]:
        m = model.with_cutoff(cutoff)
        return [evaluate(TopicDetector(None, feat, m, gain), sessions)["f1"]
                for feat, sessions in sets]

    scored = [(c, f1s(c)) for c in CUTOFFS]
    reachable = [max(f[i] for _, f in scored) for i in range(len(sets))]

    def regret(f: list[float]) -> float:
        return max(top - x for top, x in zip(reachable, f, strict=True))

    cutoff, best = min(scored, key=lambda x: (regret(x[1]), -statistics.fmean(x[1]),
                                              abs(x[0] - 0.5)))
    return model.with_cutoff(cutoff), statistics.fmean(best)


def per_turn_ms(detector: TopicDetector, turns: int = 50) -> float:
    """p99 of observe_user + add_turn on a ``turns``-turn session made of the natural set's
    turns in order (milliseconds; one untimed turn first warms the featurizer up)."""
    natural = [t for s in load_natural() for t in s]
    detector.detect([], natural[0][0])
    times = []
    state = TopicState()
    for q, a, _ in natural[:turns]:
        t0 = time.perf_counter()
        v = detector.observe_user(state, q)
        detector.add_turn(state, q, a, v.jump)
        times.append((time.perf_counter() - t0) * 1000)
    times.sort()
    return times[min(len(times) - 1, int(0.99 * len(times)))]


def signal_turn_ms(featurizer: Featurizer, model: SignalModel, gain: Any) -> float:
    """``per_turn_ms`` of the detector with one of the served model's signals, its
    remembered vectors dropped first (each turn then pays what serving pays)."""
    if hasattr(gain, "forget"):
        gain.forget()
    return round(per_turn_ms(TopicDetector(None, featurizer, model, gain)), 2)


def footprint_here(turns: int = 50) -> dict[str, float]:
    """This process's p99 per turn and peak RSS after loading the default detector and running
    it on a ``turns``-turn session and on the whole natural set (run in a fresh interpreter)."""
    detector = default_detector()
    ms = per_turn_ms(detector, turns)
    predictions(detector, load_natural())
    return {"ms_per_turn_p99": round(ms, 3),
            "peak_mb": round(peak_rss_mb(), 1)}


def footprint(turns: int = 50) -> dict[str, float]:
    """``footprint_here`` in a fresh interpreter: what the detector costs a serving process."""
    code = ("import json; from suffixmem_bench.topics import footprint_here; "
            f"print(json.dumps(footprint_here({int(turns)})))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=900)
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def check_conversation_sets(names: Iterable[str]) -> None:
    """``ValueError`` naming any of ``names`` that is not a conversation set."""
    unknown = sorted(set(names) - set(CONVERSATION_SETS))
    if unknown:
        raise ValueError(f"unknown conversation sets {unknown}; expected some of "
                         f"{list(CONVERSATION_SETS)}")


def run_topics(n_sessions: int = 120, seed: int = 0, languages: Sequence[str] | None = None,
               contiguous: bool = True, context_gain: bool = False,
               hidden_similarity: bool = False,
               conversation_sets: Sequence[str] | None = None,
               progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Tune on English held-in topics and the natural tuning sessions; score chatterbot
    held-out topics in ``languages`` (all by default) and the conversation sets named in
    ``conversation_sets`` (``CONVERSATION_SETS``' names; all by default, and ``natural``
    always, the report's ``f1``). See the module docstring for the JSON; ``context_gain`` /
    ``hidden_similarity``: also the detector with that signal of the served model
    (``topic_gain``; not both). ``progress`` gets a line as each phase starts (the served
    model's signals take minutes)."""
    if context_gain and hidden_similarity:
        raise ValueError("score one served-model signal at a time: context_gain or "
                         "hidden_similarity")
    wanted = set(CONVERSATION_SETS if conversation_sets is None else conversation_sets)
    check_conversation_sets(wanted)
    signal = "context_gain" if context_gain else "hidden_sim" if hidden_similarity else None
    say = progress or (lambda _m: None)
    say("building the sessions and fitting the default model and the rule")
    names = sorted(load_topics("english"))
    tune_names, test_names = split_topic_names(names, seed)
    tune_sessions = build_sessions(pools("english", tune_names), n_sessions, seed + 1,
                                   contiguous)
    natural_tune = load_natural(NATURAL_TUNE)
    langs = list(languages) if languages is not None else available_languages()
    tune_pools = {lang: pools(lang, tune_names) for lang in available_languages()}
    chat_feat = Featurizer().fit([t for p in tune_pools.values() for t in utterances(p)])
    shipped = default_detector().featurizer  # the background serving uses (natural sets)
    model, tune_f1 = fit_model([(chat_feat, tune_sessions), (shipped, natural_tune)])
    rule_thr, rule_tune_f1 = best_rule([tune_sessions, natural_tune])
    rule = RuleDetector(rule_thr)
    length_thr, length_tune_f1 = best_length([tune_sessions, natural_tune])
    gain = gain_model = None
    gain_tune_f1 = 0.0
    if signal is not None:
        from suffixmem_bench import topic_gain

        gain = topic_gain.MemoGain.load(signal=signal)
        say(f"fitting the {signal} model ({len(tune_sessions) + len(natural_tune)} tuning "
            "sessions, the served model's forwards on every turn)")
        gain_model, gain_tune_f1 = fit_model(
            [(chat_feat, tune_sessions), (shipped, natural_tune)], gain)

    datasets: dict[str, dict[str, Any]] = {}
    skipped: dict[str, list[str]] = {}  # fewer than two held-out topic files: no jump to score

    def score(name: str, detector: TopicDetector, sessions: list[Session],
              topics: list[str] | None = None, path: Path | None = None) -> None:
        if not sessions:
            skipped[name] = topics or []
            return
        ours = evaluate(detector, sessions)
        base = rule_scores(rule, sessions)
        datasets[name] = {
            "f1": round(ours["f1"], 4), "precision": round(ours["precision"], 4),
            "recall": round(ours["recall"], 4),
            "baseline_f1": round(base["f1"], 4),
            "length_f1": round(length_scores(length_thr, sessions)["f1"], 4),
            "length_auc": round(length_auc(sessions), 4),
            "similarity_auc": round(base["similarity_auc"], 4),
            "turns": sum(len(s) - 1 for s in sessions), "jumps": int(ours["tp"] + ours["fn"]),
        }
        # the trivial reference: call every scored turn a jump (precision = jump rate,
        # recall 1); a set whose figures sit near it carries little topic signal
        d = datasets[name]
        d["all_jumps_f1"] = round(2 * d["jumps"] / (d["jumps"] + d["turns"]), 4)
        if topics is not None:  # the topic files its sessions switch between
            datasets[name]["topics"] = topics
        if gain is not None:
            d[gain.feature] = topic_gain.scores(detector, gain_model, gain, sessions)
        if path is not None and (read := agreement(path)) is not None:
            d.update(read)

    scored = [*(f"chatterbot-{lang}" for lang in langs),
              *(n for n in CONVERSATION_SETS if n == "natural" or n in wanted)]

    def scoring(name: str) -> None:
        say(f"scoring {name} ({scored.index(name) + 1}/{len(scored)})")

    for lang in langs:
        scoring(f"chatterbot-{lang}")
        pool = pools(lang, test_names, utterances(tune_pools[lang]))
        score(f"chatterbot-{lang}", TopicDetector(None, chat_feat, model),
              build_sessions(pool, n_sessions, seed + 2, contiguous), sorted(pool))
    for name, path in CONVERSATION_SETS.items():
        if name in scored:
            scoring(name)
            score(name, TopicDetector(None, shipped, model), load_natural(path), path=path)
    say("the default detector's time and memory in a fresh interpreter")
    serving = footprint()
    return {
        "datasets": datasets,
        "f1": datasets["natural"]["f1"],
        "f1_min": min(d["f1"] for d in datasets.values()),
        "margin_min": round(min(d["f1"] - d["baseline_f1"] for d in datasets.values()), 4),
        "model": model.describe(), "tune_f1": round(tune_f1, 4),
        "baseline_threshold": rule_thr, "baseline_tune_f1": round(rule_tune_f1, 4),
        "length_threshold": length_thr, "length_tune_f1": round(length_tune_f1, 4),
        "tuning": {"chatterbot": "english, tune_topics", "natural_tune": NATURAL_TUNE.name,
                   "natural_tune_sessions": len(natural_tune), "scored": False},
        "session_construction": "contiguous" if contiguous else "shuffled",
        "tune_topics": tune_names, "test_topics": test_names, "skipped": skipped,
        "chatterbot_reader": chatterbot_sample(TopicDetector(None, chat_feat, model)),
        **serving,
        "bench_process_peak_mb": round(peak_rss_mb(), 1),
        **({gain.feature: topic_gain.summary(gain_model, gain_tune_f1, gain, datasets,
                                             signal_turn_ms(shipped, gain_model, gain.gain))}
           if gain is not None else {}),
    }


def register(bench: Any) -> None:
    import typer

    @bench.command("topics")
    def topics_cmd(
        sessions: int = typer.Option(120, help="sessions per data set built from the corpus"),
        seed: int = typer.Option(0, help="random seed of the topic split and the sessions"),
        language: list[str] = typer.Option(  # noqa: B008
            None, help="chatterbot languages to score (default: all)"),
        shuffled: bool = typer.Option(
            False, "--shuffled", help="chatterbot blocks drawn at random from a topic file"),
        context_gain: bool = typer.Option(
            False, "--context-gain", help="also score the detector with the served model's "
            "context gain (two forwards of the model per message: slow; limit --language)"),
        hidden_similarity: bool = typer.Option(
            False, "--hidden-similarity", help="also score the detector with the served "
            "model's hidden-state similarity (one forward of its first layers per message)"),
        conversation_set: list[str] = typer.Option(  # noqa: B008
            None, "--set", help="conversation sets to score (default: all; natural always)"),
        as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
    ) -> None:
        """Precision/recall/F1 of topic-jump detection on held-out topics and natural chats."""
        from suffixmem_bench.measure import RunContext

        try:  # before any work
            check_conversation_sets(conversation_set or ())
        except ValueError as e:
            raise typer.BadParameter(str(e), param_hint="--set") from None
        from rich.console import Console

        err = Console(stderr=True)
        start = time.perf_counter()

        def say(line: str) -> None:  # on stderr: --json keeps stdout one JSON object
            err.print(f"[dim]{time.perf_counter() - start:6.0f} s  {line}[/]")

        with RunContext() as ctx:  # quality figures, but the JSON carries the run's context too
            result = run_topics(sessions, seed, language or None, not shuffled, context_gain,
                                hidden_similarity, conversation_set or None, progress=say)
        result.update(ctx.fields())
        if as_json:
            print(json.dumps(result))
            return
        from rich.table import Table

        table = Table(title="topic jumps (tuned on English tuning topics and natural_tune only)")
        gained = next((k for k in EXTRA_FEATURES if k in result), None)
        for col in ("data set", "turns", "jumps", "precision", "recall", "F1", "rule F1",
                    *((f"F1 with {gained}",) if gained else ())):
            table.add_column(col)
        for name, d in result["datasets"].items():
            table.add_row(name, str(d["turns"]), str(d["jumps"]), f"{d['precision']:.3f}",
                          f"{d['recall']:.3f}", f"{d['f1']:.3f}", f"{d['baseline_f1']:.3f}",
                          *((f"{d[gained]['f1']:.3f}",) if gained else ()))
        Console().print(table)
        Console().print(f"p99 {result['ms_per_turn_p99']} ms/turn, peak {result['peak_mb']} MB")
