"""The held-out evaluation of a PPO run, the part every task shares.

:func:`eval_rollout` samples the current policy on the task's fixed held-out prompts, the same way for every
run (the task scores the responses: its ``evaluate``); :func:`eval_summary` reads a run's outcomes off its
evaluation curve; :func:`run_time_estimate` prints the first iteration's estimate.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Optional, Sequence

import torch

from harness.rl.components.eos import mask_extent, truncate_after_eos
from harness.rl.components.outcome_advantages import unbiased_pass_at_k
from harness.config import Config
from harness.rl.rollout import response_logprobs, sample


def decode_responses(tokenizer: Any, ids: torch.Tensor, mask: torch.Tensor) -> list[str]:
    """The text of each row of ``ids`` ``[B, T]`` restricted to ``mask`` ``[B, T]`` (special tokens skipped)."""
    return [tokenizer.decode(row[m.bool()].tolist(), skip_special_tokens=True) for row, m in zip(ids, mask)]


@torch.no_grad()
def eval_rollout(models: Any, cfg: Config, prompts: torch.Tensor, k: int, device: torch.device,
                 autocast: Callable[[], Any], eos_id: int, pad_id: int,
                 with_entropy: bool = False, samples_per_prompt: Optional[int] = None,
                 with_kl: bool = True) -> dict[str, torch.Tensor]:
    """The held-out responses a task's evaluation scores, drawn the same way for every run and task.

    Each prompt is sampled ``eval.samples_per_prompt`` times; responses of ``task.response_length`` tokens are
    drawn at the PPO temperature from a generator seeded by :func:`eval_generator_seed` (independent of the
    training streams, so evaluating never changes training), truncated after the first EOS whatever
    ``ppo.truncate_after_eos`` says (unless ``eval.truncate_after_eos`` is false: fixed-length responses;
    sampling stops once every response holds an EOS, and the columns that are padding in every row are cut).

    Args:
        models: the run's models (``policy``, ``ref``). prompts: ``[N, P]`` on ``device``.
        k: PPO iterations done so far (0 = the SFT policy).
        samples_per_prompt: samples per prompt instead of ``eval.samples_per_prompt`` (the pass@k draw); its
            generator is then seeded apart (``eval_generator_seed + samples_per_prompt``), another draw.
        with_kl: False skips the policy's and the reference's forward passes over the responses (no ``kl``, no
            ``entropy``): a draw scored by its text alone, such as the pass@k draw, whose 16 samples per prompt
            would otherwise spend two forward passes each. The responses are the same either way: the forward
            passes draw nothing from the generator.
    Returns:
        ``prompts`` ``[M, P]`` (M = N · samples_per_prompt, each prompt's samples adjacent), ``responses`` and
        float ``mask`` ``[M, L]``, ``has_eos`` ``[M]`` bool, and (with ``with_kl``) ``kl`` ``[M]``: k1 summed
        over the response, nats (KL(π‖π_ref) per response).
    Raises:
        ValueError: ``with_entropy`` without ``with_kl`` (the entropy comes from the policy's forward pass).
    """
    if with_entropy and not with_kl:
        raise ValueError("eval_rollout: with_entropy needs with_kl (the entropy comes from the policy's forward pass)")
    P, T, tau = prompts.shape[1], cfg.task.response_length, cfg.ppo.temperature
    n = cfg.eval.samples_per_prompt if samples_per_prompt is None else samples_per_prompt
    prompts = prompts.repeat_interleave(n, dim=0)
    seed = eval_generator_seed(cfg, k) + (0 if samples_per_prompt is None else samples_per_prompt)
    gen = torch.Generator(device=device).manual_seed(seed % 2**31)
    models.policy.eval()
    with autocast():
        raw = sample(models.policy, prompts, T, tau, gen, sampler=cfg.ppo.sampler,
                     stop_token=eos_id if cfg.eval.truncate_after_eos else None)
    if cfg.eval.truncate_after_eos:
        responses, mask, has_eos = truncate_after_eos(raw, eos_id, pad_id)
        L = mask_extent(mask)  # columns of padding in every row change nothing below: cut them
        responses, mask = responses[:, :L], mask[:, :L]
    else:
        responses, mask, has_eos = raw, torch.ones_like(raw), (raw == eos_id).any(1)
    mask = mask.float()
    out = {"prompts": prompts, "responses": responses, "mask": mask, "has_eos": has_eos}
    if not with_kl:
        return out
    with autocast():
        qr = torch.cat([prompts, responses], dim=1)
        logprobs, entropy = response_logprobs(models.policy, qr, P, tau, with_entropy=with_entropy)
        ref_logprobs, _ = response_logprobs(models.ref, qr, P, tau)
    out["kl"] = ((logprobs.float() - ref_logprobs.float()) * mask).sum(1)
    if with_entropy:
        out["entropy"] = (entropy.float() * mask).sum(1) / mask.sum(1).clamp(min=1.0)
    return out


def standard_error(x: torch.Tensor) -> float:
    """``std(x) / √n`` (Bessel-corrected SD) of a ``[n]`` tensor: the standard error of its mean; NaN for n < 2."""
    n = len(x)
    return x.float().std().item() / math.sqrt(n) if n > 1 else float("nan")


#: The k of the pass@k a task with ``eval.passk_samples`` reports (each k ≤ the samples drawn).
PASSK: tuple[int, ...] = (1, 4, 16)


def pass_at_k_metrics(correct: torch.Tensor, ks: Sequence[int] = PASSK) -> dict[str, float]:
    """``pass_at_{k}`` (the mean over problems of the unbiased pass@k,
    :func:`harness.rl.components.outcome_advantages.unbiased_pass_at_k`) and ``pass_at_{k}_se`` (its standard
    error over problems) for each ``k`` of ``ks`` up to the samples per problem.

    Args:
        correct: ``[N, n]`` 0/1, sample ``j`` of problem ``i`` correct.
    Returns:
        ``{"pass_at_1": …, "pass_at_1_se": …, …}`` (no ``eval/`` prefix).
    """
    n = correct.shape[1]
    counts = correct.sum(dim=1).round().long().tolist()
    out: dict[str, float] = {}
    for k in (k for k in ks if k <= n):
        per = torch.tensor([unbiased_pass_at_k(n, c, k) for c in counts], dtype=torch.float64)
        out[f"pass_at_{k}"], out[f"pass_at_{k}_se"] = per.mean().item(), standard_error(per)
    return out


def eval_generator_seed(cfg: Config, k: int) -> int:
    """The seed of the held-out evaluation's sampling generator after ``k`` iterations.

    ``eval.sampling_seed: per_run`` (default): a 31-bit word of ``numpy.random.SeedSequence([eval.seed,
    seed, k])``: the same for runs that share ``seed`` (arms of an ablation compared at one seed see
    one draw), independent across seeds and iterations. ``shared``: ``eval.seed + k`` for every run.

    Args:
        cfg: the run's config (``eval.seed``, ``eval.sampling_seed``, ``seed``).
        k: PPO iterations done (≥ 0).
    Returns:
        a non-negative int below 2³¹.
    """
    if cfg.eval.sampling_seed == "shared":
        return cfg.eval.seed + k
    import numpy as np

    return int(np.random.SeedSequence([cfg.eval.seed, cfg.seed, k]).generate_state(1)[0] >> 1)


#: ``eval_final/*`` adds this to the task's evaluation metrics (1.0 when the last gold is below the SFT policy's).
COLLAPSED = "collapsed"
#: ``eval_final/*`` adds this when the task measures ``eval/length``: 1.0 when the last responses are degenerate
#: (``harness.rl.evaluation.is_degenerate``: mean length ≤ 2 tokens or distinct-2 < 0.1).
DEGENERATE = "degenerate"
#: A run's last evaluation is degenerate when its responses average at most this many tokens (EOS included: a lone
#: "." and its EOS) ...
DEGENERATE_LENGTH = 2.0
#: ... or when fewer than this share of their bigrams are distinct (one phrase repeated: "good good good ..."), on a
#: task that declares this floor (``distinct_floor``).
DEGENERATE_DISTINCT_2 = 0.1
#: The evaluation metrics a run summary copies into ``eval_final/*`` (``harness.rl.evaluation.eval_summary``).
FINAL_EVAL: tuple[str, ...] = ("gold", "gold_lexicon", "proxy", "kl", "eos_rate", "length", "distinct_1", "distinct_2",
                                "rep_2", "rep_3", "msttr", "top_response_share", "gold_sentiment", "gold_p_natural")
#: The segment length of :func:`msttr` (tokens): GRUE's MSTTR over the pooled generations, as its 100-word windows.
MSTTR_SEGMENT = 100


def distinct_n(responses: torch.Tensor, response_mask: torch.Tensor, n: int, eos_id: int | None = None) -> float:
    """Distinct-n of a set of responses: the number of distinct n-grams of token ids divided by the number of
    n-grams, pooled over all responses (n-grams never cross two responses). Li et al. 2016, "A Diversity-Promoting
    Objective Function for Neural Conversation Models", §4.3 (their denominator counts words; the n-gram count is
    the usual implementation, and keeps the value in [0, 1] for every n).

    Args:
        responses: ``LongTensor[B, T]``.
        response_mask: ``[B, T]``, 1 on the response's tokens (EOS included), 0 after.
        n: the n-gram order (≥ 1).
        eos_id: an EOS id not counted as a token (the response's text ends before it).
    Returns:
        the fraction in [0, 1]; 0.0 when no response has ``n`` tokens (no n-gram at all: a collapse).
    Raises:
        ValueError: ``n`` < 1, or the two tensors' shapes differ.
    """
    grams: list[tuple[int, ...]] = []
    for toks in _token_lists("distinct_n", responses, response_mask, n, eos_id):
        grams.extend(tuple(toks[i:i + n]) for i in range(len(toks) - n + 1))
    return len(set(grams)) / len(grams) if grams else 0.0


def _token_lists(name: str, responses: torch.Tensor, response_mask: torch.Tensor, n: int,
                 eos_id: int | None) -> list[list[int]]:
    """Each response's token ids under its mask, EOS left out when ``eos_id`` is given; the checks every diversity
    metric shares (``name`` names the metric in the error)."""
    if n < 1:
        raise ValueError(f"{name}: n must be ≥ 1 (got {n})")
    if responses.shape != response_mask.shape:
        raise ValueError(f"{name}: responses {tuple(responses.shape)} and mask {tuple(response_mask.shape)} differ")
    keep = response_mask.bool() if eos_id is None else response_mask.bool() & (responses != eos_id)
    return [[t for t, m in zip(row, k) if m] for row, k in zip(responses.tolist(), keep.tolist())]


def rep_n(responses: torch.Tensor, response_mask: torch.Tensor, n: int, eos_id: int | None = None) -> float:
    """rep-n of a set of responses: per response, ``1 − |unique n-grams| / |n-grams|`` of its token ids, averaged
    over the responses that have an n-gram (Welleck et al. 2019, "Neural Text Generation with Unlikelihood
    Training", arXiv 1908.04319 §6, sequence-level repetition). 0 is no repetition; a response that loops one token
    has rep-1 close to 1.

    Example: responses ``[[5, 6, 5, 6]]`` → rep-1 = 1 − 2/4 = 0.5, rep-2 = 1 − 2/3.

    Args:
        responses: ``LongTensor[B, T]``; response_mask: ``[B, T]``, 1 on the response (EOS included); n ≥ 1;
        eos_id: an EOS id not counted as a token.
    Returns:
        the mean in [0, 1); 0.0 when no response has ``n`` tokens.
    Raises:
        ValueError: ``n`` < 1, or the two tensors' shapes differ.
    """
    reps = [sequence_rep(toks, n) for toks in _token_lists("rep_n", responses, response_mask, n, eos_id)
            if len(toks) >= n]
    return sum(reps) / len(reps) if reps else 0.0


def sequence_rep(items: Sequence[Any], n: int) -> float:
    """rep-n of one sequence (token ids, words or characters): ``1 − |unique n-grams| / |n-grams|`` (Welleck et al.
    2019 §6); 0.0 when it has fewer than ``n`` items. Example: ``[5, 6, 5, 6]``, n = 2 → 1 − 2/3."""
    grams = [tuple(items[i:i + n]) for i in range(len(items) - n + 1)]
    return 1.0 - len(set(grams)) / len(grams) if grams else 0.0


def msttr(responses: torch.Tensor, response_mask: torch.Tensor, segment: int = MSTTR_SEGMENT,
          eos_id: int | None = None) -> float:
    """Mean segmental type-token ratio: the responses' tokens pooled in order, cut into consecutive segments of
    ``segment`` tokens (the last, shorter one dropped), each segment's distinct tokens over ``segment``, averaged
    (Johnson 1944; RL4LMs/GRUE's diversity measure, Ramamurthy et al. 2022 §3, over the pooled generations). With
    fewer than ``segment`` tokens in all, the type-token ratio of what there is.

    Example: tokens ``[1, 2, 1, 2, 3, 3]`` with ``segment=3`` → segments ``[1, 2, 1]`` (2/3) and ``[2, 3, 3]`` (2/3)
    → 2/3.

    Raises:
        ValueError: ``segment`` < 1, or the two tensors' shapes differ.
    """
    pooled = [t for toks in _token_lists("msttr", responses, response_mask, segment, eos_id) for t in toks]
    if not pooled:
        return 0.0
    if len(pooled) < segment:
        return len(set(pooled)) / len(pooled)
    segs = [pooled[i:i + segment] for i in range(0, len(pooled) - segment + 1, segment)]
    return sum(len(set(sg)) / segment for sg in segs) / len(segs)


def top_response_share(responses: torch.Tensor, response_mask: torch.Tensor, eos_id: int | None = None) -> float:
    """The share of the responses that are the most common response, token for token (EOS not counted when
    ``eos_id`` is given): a mode-collapse diagnostic beside distinct-n, which pools n-grams and so cannot see a
    policy that gives one short phrase (" is great!") to a quarter of its prompts while its other responses vary.
    Our diagnostic, the response-level counterpart of distinct-n's share of repeated n-grams (Li et al. 2016 §4.3).

    Example: responses ``[[5, 6, 0], [5, 6, 0], [7, 0, 1]]`` with EOS = 0 → ``(5, 6)`` twice of three → 2/3.

    Args:
        responses: ``LongTensor[B, T]``; response_mask: ``[B, T]``, 1 on the response (EOS included);
        eos_id: an EOS id not counted as a token (a response "5 6" with and without EOS is one response).
    Returns:
        the share in [1/B, 1] (an empty response counts as one response, ""); 0.0 for B = 0.
    Raises:
        ValueError: the two tensors' shapes differ.
    """
    from collections import Counter

    toks = _token_lists("top_response_share", responses, response_mask, 1, eos_id)
    return Counter(map(tuple, toks)).most_common(1)[0][1] / len(toks) if toks else 0.0


def is_degenerate(length: float, distinct_2: float | None, distinct_floor: float | None = DEGENERATE_DISTINCT_2) -> bool:
    """Whether an evaluation's responses have collapsed, read from the responses alone: mean length ≤
    :data:`DEGENERATE_LENGTH` tokens, or distinct-2 below ``distinct_floor`` (when measured, and when the task has a
    floor: a task whose responses are written in a handful of symbols, like chain_sum's digits and signs, has
    few distinct bigrams however healthy its policy, and declares none). Unlike ``collapsed`` (gold below the SFT
    policy's), it fires for a policy that says "." to every prompt whatever a gold scorer thinks of it."""
    low = distinct_floor is not None and distinct_2 is not None and distinct_2 < distinct_floor
    return length <= DEGENERATE_LENGTH or low


def eval_summary(history: Sequence[tuple[int, dict[str, float]]], total_iterations: int,
                 extra_final: Sequence[str] = (), distinct_floor: float | None = DEGENERATE_DISTINCT_2) -> dict[str, Any]:
    """Per-run outcomes read off the evaluation curve.

    Args:
        history: ``(k, metrics)`` per evaluation, ascending ``k``, the first at ``k = 0`` (SFT policy).
        total_iterations: PPO iterations of the run (the last evaluation's ``k``).
        extra_final: further ``eval/*`` names (without the prefix) the task reads at the end (its registered
            ``final_metrics``, e.g. chain_sum's greedy pass@1 and the lengths of correct and incorrect responses).
        distinct_floor: the task's distinct-2 floor of :func:`is_degenerate` (None: length alone decides).
    Returns:
        ``{"eval_final": {gold, gold_lexicon, proxy, kl, eos_rate, length, distinct_1, distinct_2, collapsed,
        degenerate}, "eval_peak": {gold,
        iteration, kl}, "eval_drop": {gold}, "eval_auc": {gold}}``: the last evaluation (``collapsed`` = 1.0
        when its gold is below the SFT policy's, else 0.0); the highest gold, the first iteration that
        reached it and the KL there; the gold lost from that peak to the last evaluation; the area under
        the gold curve by the trapezoid rule over k, divided by ``total_iterations`` (the mean gold over
        training, in gold units). ``degenerate`` (:func:`is_degenerate` of the last evaluation) is there when the
        task measures ``eval/length``.
    Raises:
        ValueError: an empty history.
    """
    if not history:
        raise ValueError("eval_summary: no evaluation recorded")
    ks = [k for k, _ in history]
    gold = [m["eval/gold"] for _, m in history]
    last = history[-1][1]
    peak = max(range(len(gold)), key=lambda i: (gold[i], -i))
    auc = sum((ks[i + 1] - ks[i]) * (gold[i] + gold[i + 1]) / 2 for i in range(len(ks) - 1))
    degenerate = ({DEGENERATE: float(is_degenerate(last["eval/length"], last.get("eval/distinct_2"), distinct_floor))}
                  if "eval/length" in last else {})
    return {
        "eval_final": {m: last[f"eval/{m}"] for m in FINAL_EVAL if f"eval/{m}" in last}
        | {m: last[f"eval/{m}"] for m in extra_final if f"eval/{m}" in last}
        | {COLLAPSED: float(last["eval/gold"] < gold[0])} | degenerate,
        "eval_peak": {"gold": gold[peak], "iteration": float(ks[peak]), "kl": history[peak][1].get("eval/kl", float("nan"))},
        "eval_drop": {"gold": gold[peak] - gold[-1]},
        "eval_auc": {"gold": auc / max(total_iterations, 1) if len(ks) > 1 else gold[0]},
    }


def run_time_estimate(first_iteration_s: float, evaluation_s: float, total_iterations: int, eval_every: int,
                      device: str) -> str:
    """One line estimating a run's wall time from its first iteration and its first evaluation.

    ``total ≈ first_iteration_s · total_iterations + evaluation_s · (⌈total_iterations / eval_every⌉ + 1)``
    (the evaluation before training, one after every ``eval_every`` iterations, and one after the
    last iteration when ``eval_every`` does not divide the total). The first iteration includes
    one-off warm-up, so the estimate errs long.

    Args:
        first_iteration_s, evaluation_s: seconds (≥ 0); total_iterations, eval_every: ≥ 1.
    Returns:
        e.g. ``"[ppo] first iteration 12.3 s, evaluation 4.0 s on cpu: about 2.1 h for 600 iterations"``.
    """
    n_evals = math.ceil(total_iterations / eval_every) + 1
    total = first_iteration_s * total_iterations + evaluation_s * n_evals
    human = f"{total / 3600:.1f} h" if total >= 3600 else f"{total / 60:.1f} min" if total >= 60 else f"{total:.0f} s"
    return (f"[ppo] first iteration {first_iteration_s:.1f} s, evaluation {evaluation_s:.1f} s on {device}: "
            f"about {human} for {total_iterations} iterations")
