"""The gold's naturalness head: a judge of human text against degenerate loops, so that the gold stops preferring
"the greating the greating…" (``pipeline.gold.naturalness: on``).

A sentiment reward alone is hackable by repetition: a policy raises it fastest by looping its most positive n-gram
(RL4LMs/GRUE, Ramamurthy et al. 2022, arXiv 2210.01241, report naturalness beside the task reward for this reason).
The head is a logistic regression, P(natural | text), on four repetition statistics of the text
(:func:`repetition_features`): rep-1, rep-2 and rep-3 of its words (Welleck et al. 2019, arXiv 1908.04319 §6:
``1 − |unique n-grams| / |n-grams|`` per sequence) and rep-4 of its characters (character loops such as
"greatinginginging", "://://://").

Positives are the human-rated snippets; negatives are rule-made loops of the same snippets (:data:`LOOPS`, one per
snippet, the kind drawn at random: a repeated n-gram, a looped prefix, a character loop, a natural prefix that falls
into a loop). It is trained on the ``train`` split and validated on the held-out splits (accuracy, AUC, and the mean
P(natural) of the human test snippets and of each kind of degeneration, :data:`KINDS`, the two it is not trained on
included).

Why repetition alone, not the encoder's embedding too: a head that also read the sentence embedding separated human
text from degenerations better (test AUC 0.96) but called the SFT policy's own text unnatural (mean P(natural) 0.31
on 480 of its samples, against 0.83 for human text): the 1M-parameter policy writes noisy, loosely grammatical text,
and a judge trained on human text alone penalises that as much as a loop. Repetition statistics rank both the
human snippets and the SFT policy's text as natural (0.99 and 0.98) and the loops as not. What the head cannot see
is non-repeating word salad and truncation (:data:`KINDS` ``shuffle`` and ``truncate``, reported, not trained on):
the SFT policy's text resembles them itself.

Fragment soup is a third blind spot, found in the runs: under the loops-only head, kl_placement's KL-in-reward arm
ended with 54% of its final held-out responses made of run-together fragments of the corpus's URL placeholders and
emoticons (":)urlurl://removedurl_", 12 of 20 seeds above half), scored P(natural) 0.95 and above the SFT policy's
gold. ``pipeline.gold.naturalness_negatives: loops_and_soup`` trains the head on :func:`degenerate`'s
``fragment_soup`` too and gives it one more feature, the share of characters in long words
(:func:`soup_features`).

Symbol soup is the fourth, found in the runs trained under that gold: the policy spaced its fragments out and mixed
them with words (".!removed :)_ :)url incs and, all.removed http_"), so few of its words were long and the head
still gave such text P(natural) 0.65 on one seed whose responses were all soup. What sets that text apart is its
share of symbols: 0.27-0.34 of its non-space characters are neither letters nor digits, against 0.047 in the human
snippets and 0.083 in the SFT policy's text. ``loops_and_symbol_soup`` adds :func:`degenerate`'s ``symbol_soup``
(pieces of the corpus's own special tokens, :func:`special_tokens`, run together)
to the negatives and that share to the features (:func:`symbol_features`).

The gold with the head on (:class:`harness.tasks.review_sentiment.gold.GoldRewardModel`) is
``sentiment − penalty · (1 − P(natural))``: natural text keeps its sentiment score (about −1..1), a text the head calls
degenerate loses up to ``penalty`` (default 1, the distance from a neutral to the most positive rating).
"""

from __future__ import annotations

import random
import re
from collections import Counter
from typing import Any, Sequence

import torch

from harness.rl.evaluation import sequence_rep

#: The kinds of rule-made degeneration (:func:`degenerate`).
KINDS = ("repeat_ngram", "loop_prefix", "shuffle", "char_loop", "fall_into_loop", "truncate", "fragment_soup",
         "symbol_soup")
#: The kinds the head is trained on: loops (the failure a sentiment reward invites).
LOOPS = ("repeat_ngram", "loop_prefix", "char_loop", "fall_into_loop")
#: The negatives each ``pipeline.gold.naturalness_negatives`` trains the head on, and the features it reads:
#: ``loops`` the four repetition statistics (:func:`repetition_features`); ``loops_and_soup`` adds fragment soup to the
#: negatives and the share of characters in long words to the features (:func:`soup_features`);
#: ``loops_and_symbol_soup`` adds symbol soup too, and the share of symbol characters (:func:`symbol_features`).
NEGATIVES = {"loops": (LOOPS, "repetition"), "loops_and_soup": (LOOPS + ("fragment_soup",), "repetition+long_words"),
             "loops_and_symbol_soup": (LOOPS + ("fragment_soup", "symbol_soup"), "repetition+long_words+symbols")}
#: A whitespace-separated word longer than this many characters counts as long (:func:`soup_features`).
LONG_WORD = 12
#: A word holding a character outside letters, digits, ``_``, whitespace and ``'.,!?`` is a special token
#: (":)", "http://url_removed", "&amp;"; :func:`special_tokens`).
SPECIAL = re.compile(r"[^\w\s'.,!?]")
#: How many of the corpus's most frequent special tokens ``symbol_soup`` cuts its pieces from.
N_SPECIAL = 20
#: L2 strengths tried for the logistic head (the best by held-out ``val`` log-loss is kept).
L2S = (1e-4, 1e-3, 1e-2)


def repetition_features(texts: Sequence[str]) -> torch.Tensor:
    """``[N, 4]`` float32: rep-1, rep-2, rep-3 of each text's whitespace-separated words and rep-4 of its characters
    (Welleck et al. 2019 §6, per sequence; 0 where a text is shorter than n).

    Example: ``"a b a b"`` → words rep-1 = 1 − 2/4 = 0.5, rep-2 = 1 − 2/3 ≈ 0.333, rep-3 = 1 − 2/2 = 0, characters
    ``"a b a b"`` (7): 4-grams ``"a b ", " b a", "b a ", " a b"`` → rep-4 = 0."""
    rows = []
    for t in texts:
        words = t.split()
        rows.append([sequence_rep(words, 1), sequence_rep(words, 2), sequence_rep(words, 3), sequence_rep(t, 4)])
    return torch.tensor(rows, dtype=torch.float32).reshape(len(texts), 4)


def soup_features(texts: Sequence[str]) -> torch.Tensor:
    """``[N, 5]`` float32: :func:`repetition_features` and the share of each text's non-space characters that lie in
    words longer than :data:`LONG_WORD` characters (0 for a text without words).

    Fragment soup (":)urlurl://removedurl_removed://") runs its pieces together with few spaces: its words are few,
    long and unique, so word repetition stays at 0 and character rep-4 near 0.4, where a character loop reaches 0.9.
    Example: ``"a supercalifragilistic b"`` → 20 of 22 characters in a long word → 0.909."""
    rows = []
    for t in texts:
        words = t.split()
        chars = sum(len(w) for w in words)
        rows.append(sum(len(w) for w in words if len(w) > LONG_WORD) / chars if chars else 0.0)
    return torch.cat([repetition_features(texts), torch.tensor(rows, dtype=torch.float32).reshape(len(texts), 1)], dim=1)


def symbol_features(texts: Sequence[str]) -> torch.Tensor:
    """``[N, 6]`` float32: :func:`soup_features` and the share of each text's non-space characters that are neither
    letters nor digits (0 for an empty text).

    Example: ``"ok :)://"`` → 7 non-space characters ``ok:)://``, 5 of them symbols (``:``, ``)``, ``:``, ``/``,
    ``/``) → 5/7."""
    rows = []
    for t in texts:
        chars = "".join(t.split())
        rows.append(sum(not c.isalnum() for c in chars) / len(chars) if chars else 0.0)
    return torch.cat([soup_features(texts), torch.tensor(rows, dtype=torch.float32).reshape(len(texts), 1)], dim=1)


def special_tokens(texts: Sequence[str], k: int = N_SPECIAL) -> list[str]:
    """The ``k`` most frequent whitespace-separated tokens of ``texts`` that hold a :data:`SPECIAL` character, most
    frequent first (ties in order of first appearance): the corpus's emoticons, placeholders and markup, the material
    of ``symbol_soup``. Example: ``["a :) b", ":) &amp;"]`` → ``[":)", "&amp;"]``."""
    return [w for w, _ in Counter(w for t in texts for w in t.split() if SPECIAL.search(w)).most_common(k)]


def degenerate(text: str, kind: str, rng: random.Random, special: Sequence[str] = ()) -> str:
    """A rule-made degeneration of ``text`` of the given kind (:data:`KINDS`), about as long as ``text``:

    * ``repeat_ngram``: one of its word n-grams (n = 1..3) repeated;
    * ``loop_prefix``: its first 2-4 words looped;
    * ``shuffle``: its words in a random order (word salad);
    * ``char_loop``: a word, then its last 2-3 characters looped ("greatinginginging"), the whole repeated;
    * ``fall_into_loop``: its first third kept, the rest one looped word pair;
    * ``truncate``: cut mid-word before half of its characters;
    * ``fragment_soup``: 2-4 pieces of 2-7 characters cut from its words, drawn again and again and run together, a
      space after about one in ten (what a policy trained on a sentiment proxy wrote: ":)urlurl://removedurl_");
    * ``symbol_soup``: pieces of 1-7 characters cut from the ``special`` tokens (:func:`special_tokens`) and run
      together, a space after about one in three (what the policy wrote under a gold that saw fragment soup:
      ".!removed :)_ :)url incs and, all.removed http_"); none of the text's own words, so that the head does not
      learn to doubt human text that holds a few special tokens (measured: keeping three words in ten cost the
      combined gold 0.015 of its Pearson with the human means).

    Raises:
        ValueError: an unknown ``kind``, or ``symbol_soup`` without ``special`` tokens."""
    words = text.split() or ["the"]
    target = max(len(words), 6)
    if kind == "repeat_ngram":
        n = rng.randint(1, min(3, len(words)))
        i = rng.randrange(len(words) - n + 1)
        return " ".join((words[i:i + n] * target)[:target])
    if kind == "loop_prefix":
        k = rng.randint(2, 4)
        return " ".join((words[:k] * target)[:target])
    if kind == "shuffle":
        out = words[:]
        rng.shuffle(out)
        return " ".join(out)
    if kind == "char_loop":
        w = max(words, key=len)
        tail = w[-rng.randint(2, 3):] if len(w) >= 3 else w
        piece = w + tail * rng.randint(3, 6)
        return " ".join([piece] * max(2, target // 4))
    if kind == "fall_into_loop":
        keep = max(1, len(words) // 3)
        pair = words[rng.randrange(len(words))], words[rng.randrange(len(words))]
        return " ".join(words[:keep] + list(pair) * ((target - keep) // 2 + 1))
    if kind == "truncate":
        cut = rng.randint(max(1, len(text) // 5), max(2, len(text) // 2))
        return text[:cut]
    if kind == "fragment_soup":
        pieces = []
        for _ in range(rng.randint(2, 4)):
            w = words[rng.randrange(len(words))]
            i = rng.randrange(len(w))
            pieces.append(w[i:i + rng.randint(2, 7)])
        out: list[str] = []
        n = 0
        while n < len(text):
            piece = pieces[rng.randrange(len(pieces))] + (" " if rng.random() < 0.1 else "")
            out.append(piece)
            n += len(piece)
        return "".join(out).strip() or pieces[0]
    if kind == "symbol_soup":
        if not special:
            raise ValueError("degenerate: symbol_soup needs the corpus's special tokens (special_tokens(texts))")
        out, n = [], 0
        while n < len(text):
            w = special[rng.randrange(len(special))]
            i = rng.randrange(len(w))
            piece = w[i:i + rng.randint(1, 7)] + (" " if rng.random() < 0.3 else "")
            out.append(piece)
            n += len(piece)
        return "".join(out).strip() or special[0]
    raise ValueError(f"degenerate: kind must be one of {', '.join(KINDS)}; got {kind!r}")


def fit_logistic(x: torch.Tensor, y: torch.Tensor, l2: float, steps: int = 200) -> tuple[torch.Tensor, float]:
    """L2-penalised logistic regression ``min_w mean(BCE(x·w + b, y)) + l2·||w||²`` (intercept unpenalised), by
    L-BFGS in float64 from zero. ``x [N, F]``, ``y [N]`` in {0, 1}. Returns ``(w [F] float32, b)``."""
    x64, y64 = x.double(), y.double()
    w = torch.zeros(x.shape[1], dtype=torch.float64, requires_grad=True)
    b = torch.zeros((), dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS([w, b], lr=1.0, max_iter=steps, line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = torch.nn.functional.binary_cross_entropy_with_logits(x64 @ w + b, y64) + l2 * (w * w).sum()
        loss.backward()
        return loss

    opt.step(closure)
    return w.detach().float(), float(b.detach())


def _auc(p: torch.Tensor, y: torch.Tensor) -> float:
    """The ROC AUC of scores ``p`` for labels ``y`` (``sklearn.metrics.roc_auc_score``)."""
    from sklearn.metrics import roc_auc_score

    return float(roc_auc_score(y.numpy(), p.numpy()))


def train_naturalness(texts: Sequence[str], split: Sequence[str], seed: int,
                      negatives: str = "loops") -> tuple[dict, dict]:
    """Fit the naturalness head on human ``texts`` (positives) and one degeneration of each (negatives, the kind drawn
    from those ``negatives`` names in :data:`NEGATIVES`).

    Args:
        texts, split: the snippets and their ``train``/``val``/``test`` split.
        seed: draws the degenerations.
        negatives: ``loops`` (the four loops; 4 repetition features), ``loops_and_soup`` (and fragment soup; 5
            features, :func:`soup_features`) or ``loops_and_symbol_soup`` (and symbol soup, cut from the ``train``
            texts' :func:`special_tokens`; 6 features, :func:`symbol_features`).
    Returns:
        ``(head, metrics)``: ``head = {"features": "repetition" | "repetition+long_words" |
        "repetition+long_words+symbols", "w": [4 | 5 | 6], "b", "l2"}``; ``metrics`` with ``val`` and ``test``
        accuracy at 0.5 and AUC, ``test_p_natural`` (mean P(natural) of the human test snippets and of each kind of
        :data:`KINDS`' degenerations of them; ``symbol_soup`` only where the ``train`` texts hold special tokens),
        the special tokens and the training count.
    Raises:
        ValueError: unknown ``negatives``; ``loops_and_symbol_soup`` on ``train`` texts without a special token.
    """
    if negatives not in NEGATIVES:
        raise ValueError(f"naturalness_negatives must be one of {', '.join(NEGATIVES)}; got {negatives!r}")
    kinds_of, features = NEGATIVES[negatives]
    special = special_tokens([t for t, s in zip(texts, split) if s == "train"])
    if "symbol_soup" in kinds_of and not special:
        raise ValueError(f"naturalness_negatives {negatives}: the train texts hold no special token (a word with a "
                         f"character outside letters, digits and '.,!?) to cut symbol soup from")
    rng = random.Random(seed)
    kinds = [kinds_of[rng.randrange(len(kinds_of))] for _ in texts]
    neg = [degenerate(t, k, rng, special) for t, k in zip(texts, kinds)]
    feats = FEATURES[features](list(texts) + neg)
    y = torch.cat([torch.ones(len(texts)), torch.zeros(len(neg))])
    sp = list(split) * 2
    sel = {s: torch.tensor([v == s for v in sp]) for s in ("train", "val", "test")}
    best = None
    for l2 in L2S:
        w, b = fit_logistic(feats[sel["train"]], y[sel["train"]], l2)
        loss = float(torch.nn.functional.binary_cross_entropy_with_logits(feats[sel["val"]] @ w + b, y[sel["val"]]))
        if best is None or loss < best[0]:
            best = (loss, l2, w, b)
    _, l2, w, b = best
    head = {"features": features, "w": w.tolist(), "b": b, "l2": l2}
    p = torch.sigmoid(feats @ w + b)
    metrics: dict[str, Any] = {"n_train_pairs": int(sel["train"][: len(texts)].sum()), "l2": l2}
    if "symbol_soup" in kinds_of:
        metrics["special_tokens"] = special
    for s in ("val", "test"):
        m = sel[s]
        metrics[s] = {"accuracy": float(((p[m] > 0.5).float() == y[m]).float().mean()), "auc": _auc(p[m], y[m])}
    test = [t for t, s in zip(texts, split) if s == "test"]
    rng = random.Random(seed + 1)
    metrics["test_p_natural"] = {"human": float(p_natural(head, test).mean()),
                                 **{k: float(p_natural(head, [degenerate(t, k, rng, special) for t in test]).mean())
                                    for k in KINDS if special or k != "symbol_soup"}}
    return head, metrics


def p_natural(head: dict, texts: Sequence[str]) -> torch.Tensor:
    """``[N]`` P(natural) of ``texts`` under ``head`` (:func:`train_naturalness`)."""
    x = FEATURES[head.get("features", "repetition")](texts)
    return torch.sigmoid(x @ torch.tensor(head["w"], dtype=torch.float32) + float(head["b"]))


#: The feature sets a head can read, by the name its ``features`` records.
FEATURES = {"repetition": repetition_features, "repetition+long_words": soup_features,
            "repetition+long_words+symbols": symbol_features}

__all__ = ["KINDS", "LOOPS", "NEGATIVES", "FEATURES", "SPECIAL", "repetition_features", "soup_features",
           "symbol_features", "special_tokens", "degenerate", "fit_logistic", "train_naturalness", "p_natural"]
