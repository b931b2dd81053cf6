"""Chain-sum problems from ``reasoning-gym``, the scratchpad traces the SFT stage learns from, and the
verifier reward.

Problems come from the library's procedural generator (``reasoning_gym.create_dataset("chain_sum", ...)``,
reasoning-gym 0.1.25): an expression of ``min_terms..max_terms`` integers of ``min_digits..max_digits`` digits
joined by ``+``/``-``, with its value as the answer. Training and held-out problems are drawn from disjoint
generator seeds (:func:`make_problems`), so no held-out problem is trained on unless the generator repeats an
expression (:func:`split_overlap` counts those); ``task.options.disjoint_heldout`` drops every such repeat.

Format. The prompt is the expression followed by `` =`` (e.g. ``"12 + 34 - 5 ="``). A solved response is the
scratchpad of running partial sums, one step per operator, then the answer in the library's answer tags::

    " 12+34=46; 46-5=41; <answer>41</answer>"

The answer is read with the library's own extractor (``reasoning_gym.utils.extract_answer``: the text inside
the last ``<answer>…</answer>``, stripped) and scored by the dataset's ``score_answer``. That scorer gives 1.0
for a numerically equal answer and partial credit when the true answer is a substring of a wrong one
(``"141"`` for 41 scores 2/3); the reward here is exact match: 1 when the scorer returns 1.0, else 0.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

DATASET = "chain_sum"
#: Seed offset between the training and the held-out generators (their problem indices never meet: the
#: generator draws problem ``i`` from ``random.Random(seed + i)``, so the two seed ranges must be further
#: apart than the larger pool).
HELDOUT_SEED_OFFSET = 10_000_000


def dataset(size: int, seed: int, min_terms: int = 2, max_terms: int = 6, min_digits: int = 1, max_digits: int = 2) -> Any:
    """The reasoning-gym chain-sum dataset of ``size`` problems from generator ``seed`` (problem ``i`` uses
    ``random.Random(seed + i)``), with the difficulty knobs of ``ChainSumConfig``.

    Raises:
        AssertionError: from the library's config validation (e.g. ``max_terms < min_terms``).
    """
    import reasoning_gym

    return reasoning_gym.create_dataset(DATASET, size=size, seed=seed, min_terms=min_terms, max_terms=max_terms,
                                        min_digits=min_digits, max_digits=max_digits)


#: A disjoint held-out set scans at most this many candidates per problem it keeps.
DISJOINT_SCAN = 50


def make_problems(n_train: int, n_heldout: int, seed: int, disjoint: bool = False,
                  **knobs: int) -> tuple[list[dict], list[dict]]:
    """Training and held-out problems: ``dataset(n_train, seed)`` and ``dataset(n_heldout, seed +
    HELDOUT_SEED_OFFSET)`` as lists of entries (``question``, ``answer``, ``metadata`` with ``expression``).

    With ``disjoint``, the held-out problems are the first ``n_heldout`` of the held-out generator whose expression
    occurs nowhere among the ``n_train`` training problems (the generator repeats short expressions: with one-digit
    numbers there are only 200 two-term ones), so held-out accuracy measures solving, not recall; the short chains
    then mostly drop out of the held-out set (:func:`split_overlap` is 0 by construction).

    Raises:
        ValueError: ``n_train`` ≥ :data:`HELDOUT_SEED_OFFSET` (the two index ranges would overlap), or fewer than
            ``n_heldout`` unseen expressions among ``DISJOINT_SCAN · n_heldout`` candidates (the knobs leave too few).
    """
    if n_train >= HELDOUT_SEED_OFFSET:
        raise ValueError(f"n_train must be < {HELDOUT_SEED_OFFSET} (got {n_train})")
    train = list(dataset(n_train, seed, **knobs))
    if not disjoint:
        return train, list(dataset(n_heldout, seed + HELDOUT_SEED_OFFSET, **knobs))
    seen = {e["metadata"]["expression"] for e in train}
    heldout = []
    for e in dataset(DISJOINT_SCAN * n_heldout, seed + HELDOUT_SEED_OFFSET, **knobs):
        if e["metadata"]["expression"] not in seen:
            heldout.append(e)
            if len(heldout) == n_heldout:
                return train, heldout
    raise ValueError(f"task.options.disjoint_heldout: only {len(heldout)} of {DISJOINT_SCAN * n_heldout} held-out "
                     f"candidates are unseen in training; {n_heldout} wanted (raise max_digits or max_terms, or lower "
                     "n_heldout)")


def split_overlap(train: Sequence[dict], heldout: Sequence[dict]) -> int:
    """Held-out problems whose expression also occurs among the training problems (generator repeats)."""
    seen = {e["metadata"]["expression"] for e in train}
    return sum(e["metadata"]["expression"] in seen for e in heldout)


def terms(entry: dict) -> int:
    """The number of terms of a chain-sum problem (``"12 + 34 - 5"`` has 3)."""
    return len(entry["metadata"]["expression"].split()) // 2 + 1


def prompt_text(entry: dict) -> str:
    """The prompt of a problem: its expression followed by `` =``."""
    return f"{entry['metadata']['expression']} ="


def scratchpad(entry: dict) -> str:
    """The solved response of a problem: running partial sums, one ``a±b=c;`` step per operator, then
    ``<answer>value</answer>`` (module docstring). Example: ``"12 + 34 - 5"`` →
    ``" 12+34=46; 46-5=41; <answer>41</answer>"``.

    Raises:
        ValueError: the expression is not ``int (op int)*`` with ``op`` in ``+``/``-``.
    """
    parts = entry["metadata"]["expression"].split()
    if len(parts) % 2 == 0 or any(op not in "+-" or len(op) != 1 for op in parts[1::2]):
        raise ValueError(f"not a chain sum: {entry['metadata']['expression']!r}")
    total, steps = int(parts[0]), []
    for op, term in zip(parts[1::2], parts[2::2]):
        new = total + int(term) if op == "+" else total - int(term)
        steps.append(f"{total}{op}{int(term)}={new};")
        total = new
    return " " + " ".join(steps) + f" <answer>{total}</answer>"


def direct_answer(entry: dict) -> str:
    """The response that states the answer with no scratchpad: ``" <answer>value</answer>"`` (the value the
    scratchpad ends with). Raises: as :func:`scratchpad`."""
    solved = scratchpad(entry)
    return solved[solved.rindex(" <answer>"):]


def is_direct(response: str) -> bool:
    """Whether a response text answers with no scratchpad (it opens with the answer tag, as
    :func:`direct_answer` does)."""
    return response.lstrip().startswith("<answer>")


def direct_indices(n: int, fraction: float, seed: int, eligible: Optional[Sequence[int]] = None) -> set[int]:
    """Which of ``n`` SFT traces answer directly: ``round(fraction · m)`` of the ``m`` ``eligible`` indices (default
    all of ``range(n)``), drawn without replacement by ``random.Random(seed)`` (exactly that many; the same set for
    the same arguments).

    Raises:
        ValueError: ``fraction`` outside [0, 1]; an eligible index outside ``range(n)``.
    """
    import random

    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"fraction must be in [0, 1] (got {fraction})")
    pool = list(range(n)) if eligible is None else list(eligible)
    if any(not 0 <= i < n for i in pool):
        raise ValueError(f"eligible indices must lie in range({n})")
    return set(random.Random(seed).sample(pool, round(fraction * len(pool))))


def extract(response: str) -> Optional[str]:
    """The answer of a response: ``reasoning_gym.utils.extract_answer`` (the last ``<answer>…</answer>``, stripped;
    None without one)."""
    from reasoning_gym.utils import extract_answer

    return extract_answer(response)


def reward(response: str, entry: dict, data: Any) -> float:
    """Exact-match reward of ``response`` to ``entry``: 1.0 when ``data.score_answer(extract(response), entry)``
    is 1.0 (the library's equality case), else 0.0 (its partial credit for a substring is not a correct answer).
    ``data`` is the problem's reasoning-gym dataset (its scorer)."""
    return 1.0 if data.score_answer(extract(response), entry) == 1.0 else 0.0
