"""THE PPO loop: rollout → score → advantages → K epochs of shuffled minibatch updates.

One loop serves every ablation. Each implementation detail is looked up by name in its registry
(``harness.rl.components``) from the config; nothing here branches on a variant's name. :func:`train` is
the loop on one page; the models are :mod:`harness.rl.run_models`, scoring and the held-out evaluation
:mod:`harness.rl.evaluation`.

Sources: Schulman et al. 2017 (PPO); Ziegler et al. 2019 and Stiennon et al. 2020 (PPO for LMs);
Huang et al. 2024, "The N+ Implementation Details of RLHF with PPO" (the default recipe).
"""

from __future__ import annotations

import json
import math
import sys
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import torch

from harness.rl import components  # noqa: F401  (registers every variant)
from harness.rl.callbacks import Callback
from harness.rl.components.advantages import ADV_ESTIMATORS
from harness.rl.components.aggregation import agg_loss, group_mean_lengths
from harness.rl.components.eos import mask_extent
from harness.rl.components.kl import KL_CONTROLLERS, KL_ESTIMATORS, KL_PLACEMENTS, kl_loss_terms
from harness.rl.components.losses import POLICY_LOSSES, VALUE_LOSSES
from harness.rl.components.rewards import token_rewards, whiten_token_rewards
from harness.rl.components.token_selection import TOKEN_SELECTIONS
from harness.rl.components.whitening import masked_whiten
from harness.config import Config
from harness.errors import TrainingDivergedError
from harness.rl.evaluation import decode_responses, eval_summary, run_time_estimate
from harness.pipeline.stage import kernel_path
from harness.rl.rollout import response_logprobs
from harness.rl.batch import sample_batch
from harness.rl.metrics import iteration_metrics, task_distinct_floor, task_final_metrics
from harness.rl.run_models import Models, critic_values, update_forwards


# ------------------------------------------------------------------------------------------------
# The rollout batch
# ------------------------------------------------------------------------------------------------


@dataclass
class Rollout:
    """One rollout batch, as the update reads it. Per-token tensors are ``[B, L]`` (L ≤ T: the
    columns that are padding in every row may be cut); ``query_responses`` is ``[B, P + L]``.

    ``response_mask`` is float, 1 on real response tokens (EOS included, except under the
    ``ppo.pad_equals_eos`` negative control); ``logprobs`` are π_old's
    (rollout time) and ``ref_logprobs`` the frozen reference's, in nats at the sampling temperature;
    ``values`` are the critic's (None without one); ``advantages`` and ``returns`` come from
    :func:`compute_advantages`; ``max_len`` is the configured response length T (the constant of
    ``seq-mean-token-sum-norm``); ``policy_mask`` ``[B, L]`` the tokens whose policy loss counts
    (``ppo.token_selection``; None: every real token); ``group_lengths`` ``[B]`` each row's group mean response
    length (``prompt-mean``'s weights; None: not needed); ``loss_rows`` ``[B]`` 1 for the rows in the loss and its
    normalisers, 0 for those left out (``ppo.zero_variance_filter``; None: every row); ``is_weights`` ``[B, L]`` the
    rollout correction's per-token weights of the policy loss (``ppo.rollout_correction``; None: no correction).
    """

    query_responses: torch.Tensor
    context_length: int
    response_mask: torch.Tensor
    logprobs: torch.Tensor
    ref_logprobs: torch.Tensor
    values: Optional[torch.Tensor]
    advantages: torch.Tensor
    returns: torch.Tensor
    max_len: int
    policy_mask: Optional[torch.Tensor] = None
    group_lengths: Optional[torch.Tensor] = None
    loss_rows: Optional[torch.Tensor] = None
    is_weights: Optional[torch.Tensor] = None


# ------------------------------------------------------------------------------------------------
# Helpers
# ------------------------------------------------------------------------------------------------


def _check_finite(name: str, x: torch.Tensor, iteration: int) -> None:
    """Raise TrainingDivergedError if ``x`` holds a NaN or inf."""
    if not torch.isfinite(x).all():
        kind = "nan" if torch.isnan(x).any() else "inf"
        raise TrainingDivergedError(f"{name} is {kind} at iteration {iteration}; the run was stopped")


def _rewards(p: Any, score: torch.Tensor, logprobs: torch.Tensor, ref_logprobs: torch.Tensor,
             response_mask: torch.Tensor, reward_kl_coef: float, iteration: int) -> torch.Tensor:
    """``[B, T]`` per-token rewards of :func:`compute_advantages` (``−β·kl_t`` plus the score at the last real token,
    scaled by ``ppo.whiten_rewards``); TrainingDivergedError when one is NaN/inf."""
    kl_tok = KL_ESTIMATORS.get(p.kl_estimator)(logprobs, ref_logprobs) * response_mask
    rewards = token_rewards(score, kl_tok, reward_kl_coef, response_mask)
    if p.whiten_rewards:
        rewards = whiten_token_rewards(rewards, response_mask)
    _check_finite("rewards", rewards, iteration)
    return rewards


def compute_advantages(p: Any, score: torch.Tensor, logprobs: torch.Tensor, ref_logprobs: torch.Tensor,
                       values: Optional[torch.Tensor], response_mask: torch.Tensor, reward_kl_coef: float,
                       group_size: int, iteration: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-token rewards, advantages and returns of one rollout batch.

    Args:
        p: the ``PPOConfig`` (estimators, γ, λ, whitening switches).
        score: ``[B]`` sequence scores (RM, after EOS penalty and clipping).
        logprobs, ref_logprobs: ``[B, T]`` π_old and reference log-probabilities (nats).
        values: ``[B, T]`` critic values, or None for critic-free estimators.
        response_mask: ``[B, T]`` float, 1 on real response tokens (EOS included).
        reward_kl_coef: β of the KL penalty placed in the reward (0 when KL is in the loss or off).
        group_size: responses per prompt (1 with a critic).
    Returns:
        ``(rewards, advantages, returns)``, each ``[B, T]``: ``rewards[t] = −β·kl_t`` plus the score
        at the last real token (Stiennon et al. 2020, eq. 2); advantages from the configured
        estimator, whitened over the batch when ``p.advantage_whitening`` (``whiten_advantages``, unset = the
        estimator's recipe: GAE whitened as in N+/TRL, critic-free estimators not, as in their sources).
    Raises:
        TrainingDivergedError: rewards or advantages contain NaN/inf.
    """
    rewards = _rewards(p, score, logprobs, ref_logprobs, response_mask, reward_kl_coef, iteration)
    estimator = ADV_ESTIMATORS.get(p.adv_estimator)
    advantages, returns = estimator(rewards, values, response_mask, gamma=p.gamma, lam=p.lam, group_size=group_size,
                                    knobs=ADV_ESTIMATORS.knobs(p.adv_estimator, p))
    if p.advantage_whitening:
        advantages = masked_whiten(advantages, response_mask)
    _check_finite("advantages", advantages, iteration)
    return rewards, advantages, returns


# ------------------------------------------------------------------------------------------------
# The loop
# ------------------------------------------------------------------------------------------------


@dataclass
class _Run:
    """What one run's loop holds: config, models, task, device, generators, optimizer, KL controller,
    the update's forwards and the evaluation history ``[(k, metrics)]``."""

    cfg: Config
    models: Models
    task: Any
    device: torch.device
    autocast: Callable[[], Any]
    callbacks: Sequence[Callback]
    optimizer: torch.optim.Optimizer
    gen: torch.Generator  # sampling and minibatch shuffles
    prompt_gen: torch.Generator  # prompt draws (CPU)
    kl_ctl: Any
    placement: Callable[[float], tuple[float, float]]
    policy_fwd: Callable[[torch.Tensor], torch.Tensor]
    critic_fwd: Optional[Callable[[torch.Tensor], torch.Tensor]]
    group_size: int
    eos_id: int
    pad_id: int
    eval_prompts: torch.Tensor
    evals: list[tuple[int, dict[str, float]]] = field(default_factory=list)
    pool: dict[str, Any] = field(default_factory=dict)  # the prompts and responses sampled so far, the pool's counts
    engine: Any = None  # the rollout engine apart from the trainer (harness.rl.engine; None: the policy samples)


def _start_run(cfg: Config, models: Models, task: Any, callbacks: Sequence[Callback]) -> _Run:
    """Seed, resolve the device, and build the optimizer (AdamW over policy and critic), KL controller, generators
    and forwards around the given models and task; call ``on_start``."""
    from harness.rl.models import resolve_device

    if cfg.torch_threads:
        torch.set_num_threads(cfg.torch_threads)
    torch.manual_seed(cfg.seed)
    device, amp_dtype = resolve_device(cfg.device)
    autocast = (lambda: torch.autocast(device.type, dtype=amp_dtype)) if amp_dtype else nullcontext
    p = cfg.ppo
    placement = KL_PLACEMENTS.get(p.kl_placement)
    kl_ctl = KL_CONTROLLERS.get(p.kl_ctl)(p.kl_coef, p.kl_target, p.kl_horizon)
    eos_id, pad_id = models.tokenizer.eos_token_id, models.tokenizer.pad_token_id
    update_tau = p.temperature if p.logprob_temperature == "sampling" else 1.0  # "unit": the negative control
    policy_fwd, critic_fwd = update_forwards(models, cfg.task.prompt_length, update_tau, compile=p.compile)
    params = list(models.policy.parameters()) + (list(models.critic.parameters()) if models.critic is not None else [])
    optimizer = torch.optim.AdamW(params, lr=p.lr, eps=p.adam_eps)
    run = _Run(cfg, models, task, device, autocast, callbacks, optimizer, torch.Generator(device=device).manual_seed(cfg.seed),
               torch.Generator().manual_seed(cfg.seed), kl_ctl, placement, policy_fwd, critic_fwd,
               1 if models.critic is not None else p.num_generations, eos_id, eos_id if pad_id is None else pad_id,
               task.eval_prompt_ids.to(device))
    if p.uses_engine:  # its own copy of the policy at ppo.rollout_precision, synced after every update
        from harness.rl.engine import RolloutEngine

        run.engine = RolloutEngine(models.policy, p.rollout_precision)
    for cb in callbacks:
        cb.on_start(cfg, {"n_params": models.n_params(), "device": str(device), "kernels": kernel_path(),
                          "pipeline_keys": dict(models.pipeline_keys), "pipeline_digests": dict(models.pipeline_digests),
                          "replicate": cfg.replicate})
    return run


@torch.no_grad()
def _forward_batch(run: _Run, query_responses: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """π_old's ``logprobs`` and per-token ``entropy``, the reference's ``ref_logprobs`` and the critic's
    ``values`` (None without one), each ``[B, T]``, at the sampling temperature."""
    models, P, tau = run.models, run.cfg.task.prompt_length, run.cfg.ppo.temperature
    with run.autocast():
        models.policy.eval()
        logprobs, entropy = response_logprobs(models.policy, query_responses, P, tau, with_entropy=True)
        ref_logprobs, _ = response_logprobs(models.ref, query_responses, P, tau)
        values = critic_values(models.critic.eval(), query_responses, P).float() if models.critic is not None else None
    return logprobs, entropy, ref_logprobs, values


def _engine_correction(run: _Run, query_responses: torch.Tensor, logprobs: torch.Tensor, ro: dict[str, Any]
                       ) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """With a rollout engine: π_old for the update and the correction's weights ``[B, L]``
    (:func:`harness.rl.engine.correct`), the mismatch metrics put in ``ro["rollout_metrics"]``; without one,
    ``(logprobs, None)``."""
    if run.engine is None:
        return logprobs, None
    from harness.rl.engine import correct

    p = run.cfg.ppo
    engine_logprobs = run.engine.logprobs(query_responses, run.cfg.task.prompt_length, p.temperature)
    old, weights, ro["rollout_metrics"] = correct(p, logprobs, engine_logprobs, ro["mask"].float())
    return old, weights


def _evaluate(run: _Run, k: int) -> dict[str, float]:
    """The held-out evaluation after ``k`` iterations (the task's ``evaluate``), recorded and sent to ``on_eval``; the
    responses it scored, where the task keeps them (``task.last_heldout``), to ``on_heldout``."""
    m = run.task.evaluate(run.models, run.cfg, run.eval_prompts, k, run.device, run.autocast, run.eos_id, run.pad_id)
    run.evals.append((k, m))
    heldout = getattr(run.task, "last_heldout", None)  # a task that keeps its held-out responses (rm_scoring)
    for cb in run.callbacks:
        cb.on_eval(k, m)
        if heldout is not None and heldout.get("iteration") == k:
            cb.on_heldout(k, heldout)
    return m


def _send_samples(run: _Run, it: int, prompts: torch.Tensor, ro: dict[str, Any]) -> None:
    """The first ``num_sample_completions`` (prompt, response, score, lexicon) of iteration ``it`` to ``on_samples``."""
    k = run.cfg.num_sample_completions
    prompt_texts = decode_responses(run.models.tokenizer, prompts, torch.ones_like(prompts))
    samples = [{"prompt": a, "response": b, "score": s, "gold_lexicon": g}
               for a, b, s, g in zip(prompt_texts[:k], ro["texts"][:k], ro["score"][:k].tolist(), ro["gold_lexicon"][:k].tolist())]
    for cb in run.callbacks:
        cb.on_samples(it, samples)


def _run_summary(run: _Run, history: list[dict[str, float]], t_start: float) -> dict[str, Any]:
    """:func:`train`'s return value (see there) from the iteration history and the evaluations."""
    ev0, last = run.evals[0][1], history[-max(1, math.ceil(0.1 * len(history))):]
    return {
        "initial": {"score": ev0["eval/proxy"], "score_std": ev0["eval/proxy_std"], "gold": ev0["eval/gold"],
                    "eos_rate": ev0["eval/eos_rate"]},
        "final": {k.split("/")[1]: sum(h[k] for h in last) / len(last)
                  for k in ("objective/score", "objective/gold_lexicon", "objective/kl", "objective/gold") if k in last[0]},
        **eval_summary(run.evals, run.cfg.ppo.total_iterations, task_final_metrics(run.cfg), task_distinct_floor(run.cfg)),
        "iterations": run.cfg.ppo.total_iterations,
        "wall_time_s": time.perf_counter() - t_start,
        "pipeline_build_s": run.models.pipeline_build_s,
        "n_params": run.models.n_params(),
        "device": str(run.device),
        "config_hash": run.cfg.hash(),
    }


def train(cfg: Config, out_dir: str | Path, models: Models, task: Any, callbacks: Sequence[Callback] = (),
          progress: bool = True, *, started: Optional[float] = None) -> dict[str, Any]:
    """One PPO run on built models and task (:func:`harness.rl.runner.run` builds them); returns its summary,
    also written to ``out_dir/summary.json``.

    Args:
        cfg: the resolved config. out_dir: for ``config.yaml`` and ``summary.json``. models, task: on cfg's device.
        callbacks: receive per-iteration metrics, samples and the summary. progress: a bar with score, gold, KL.
        started: ``time.perf_counter()`` at the run's start (the runner's: ``wall_time_s`` counts the build).
    Returns: ``{"initial": {score, score_std, gold, eos_rate}`` (the evaluation before any update), ``"final":
        {score, gold_lexicon, kl}`` (training batches, mean of the last 10% of iterations; plus ``gold``
        with ``ppo.train_on_gold``), ``"eval_final", "eval_peak", "eval_drop", "eval_auc"``
        (:func:`eval_summary`), ``"wall_time_s"`` (the whole run, seconds), ``"pipeline_build_s"`` (the part of it
        spent building missing pipeline stages, :attr:`Models.pipeline_build_s`), ``"iterations", "n_params",
        "device", "config_hash"}``. Held-out evaluations (the task's ``evaluate``) run before the first update,
        every ``eval.every`` iterations and after the last.
    Raises: TrainingDivergedError: a loss, reward or advantage became NaN/inf.
    """
    from tqdm.auto import tqdm

    t_start, out, p = time.perf_counter() if started is None else started, Path(out_dir), cfg.ppo
    out.mkdir(parents=True, exist_ok=True)
    cfg.save(out / "config.yaml")
    run = _start_run(cfg, models, task, callbacks)
    P, T = cfg.task.prompt_length, cfg.task.response_length
    t_eval = time.perf_counter()
    _evaluate(run, 0)  # the SFT policy on the fixed held-out prompts, before any update
    t_eval = time.perf_counter() - t_eval
    _critic_warmup(run, p.critic_warmup_iterations)  # VAPO's value pretraining (0 iterations: none)
    history: list[dict[str, float]] = []
    bar = tqdm(range(p.total_iterations), desc="ppo", disable=not progress, dynamic_ncols=True)
    for it in bar:
        t_iter = t0 = time.perf_counter()
        # ---- 1. rollout: sample responses to a batch of prompts (group_size per prompt), score them -----
        prompts, ro = sample_batch(run)
        mask = ro["mask"].float()
        timings = {"time/score": ro["score_time"], "time/generate": time.perf_counter() - t0 - ro["score_time"]}
        # ---- 2. score: logprobs (π_old), ref_logprobs, values; the sequence score after penalty and clip --
        t0 = time.perf_counter()
        query_responses = torch.cat([prompts, ro["responses"]], dim=1)
        logprobs, entropy, ref_logprobs, values = _forward_batch(run, query_responses)
        logprobs, is_weights = _engine_correction(run, query_responses, logprobs, ro)
        timings["time/forward"] = time.perf_counter() - t0
        score = ro["gold"] if p.train_on_gold else ro["shaped"]
        reward_coef, loss_coef = run.placement(run.kl_ctl.value)
        # ---- 3. advantages ---------------------------------------------------------------------------
        _, advantages, returns = compute_advantages(p, score, logprobs, ref_logprobs, values, mask, reward_coef,
                                                    run.group_size, it)
        # ---- 4. K epochs of shuffled minibatch updates -------------------------------------------------
        t0 = time.perf_counter()
        batch = Rollout(query_responses, P, mask, logprobs, ref_logprobs, values, advantages, returns, max_len=T,
                        policy_mask=None if p.token_selection == "all" else
                        TOKEN_SELECTIONS.get(p.token_selection)(entropy, mask, rho=p.entropy_rho),
                        group_lengths=group_mean_lengths(mask, run.group_size) if p.loss_agg == "prompt-mean" else None,
                        loss_rows=ro.get("loss_rows"), is_weights=is_weights)
        stats = _update(run.models, p, batch, loss_coef, run.optimizer, run.gen, run.autocast, it, run.policy_fwd,
                        run.critic_fwd)
        timings["time/update"] = time.perf_counter() - t0
        if run.engine is not None:
            timings["time/sync"] = run.engine.sync(run.models.policy)  # the new weights pushed to the engine
        # ---- metrics, samples, evaluation -------------------------------------------------------------
        m = iteration_metrics(batch, ro, score, entropy, reward_coef + loss_coef, stats, timings, p.batch_size)
        run.kl_ctl.update(m["objective/kl"], p.batch_size)
        history.append(m)
        for cb in callbacks:
            cb.on_metrics(it, m)
        if it in {0, p.total_iterations // 2, p.total_iterations - 1} and cfg.num_sample_completions:
            _send_samples(run, it, prompts, ro)
        if (it + 1) % cfg.eval.every == 0 or it + 1 == p.total_iterations:
            _evaluate(run, it + 1)
        bar.set_postfix(score=f"{m['objective/score']:.3f}", gold=f"{run.evals[-1][1]['eval/gold']:.3f}",
                        kl=f"{m['objective/kl']:.2f}")
        if it == 0 and progress:
            tqdm.write(run_time_estimate(time.perf_counter() - t_iter, t_eval, p.total_iterations, cfg.eval.every,
                                         str(run.device)), file=sys.stderr)
    summary = _run_summary(run, history, t_start)
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    for cb in callbacks:
        cb.on_end(summary)
    return summary


def _critic_warmup(run: _Run, iterations: int) -> None:
    """``iterations`` of VAPO's value pretraining, each a rollout batch of the (not yet updated) policy, its per-token
    rewards as the loop makes them (:func:`_rewards`), and K epochs of minibatch updates of the critic alone towards the λ = 1
    (Monte-Carlo) returns (Yue et al. 2025, arXiv 2504.05118 §3: value-pretraining). Nothing is logged."""
    p, P = run.cfg.ppo, run.cfg.task.prompt_length
    for _ in range(iterations):
        prompts, ro = sample_batch(run)
        mask = ro["mask"].float()
        query_responses = torch.cat([prompts, ro["responses"]], dim=1)
        logprobs, _, ref_logprobs, values = _forward_batch(run, query_responses)
        score = ro["gold"] if p.train_on_gold else ro["shaped"]
        rewards = _rewards(p, score, logprobs, ref_logprobs, mask, run.placement(run.kl_ctl.value)[0], -1)
        _, returns = ADV_ESTIMATORS.get("gae")(rewards, values, mask, gamma=p.gamma, lam=1.0, group_size=1)
        batch = Rollout(query_responses, P, mask, logprobs, ref_logprobs, values, torch.zeros_like(returns), returns,
                        max_len=run.cfg.task.response_length)
        _update(run.models, p, batch, 0.0, run.optimizer, run.gen, run.autocast, -1, run.policy_fwd, run.critic_fwd,
                train_policy=False)


def _minibatch_step(models: Models, p: Any, batch: Rollout, mb_idx: torch.Tensor, loss_coef: float, autocast: Any, it: int,
                    policy_fwd: Callable[[torch.Tensor], torch.Tensor],
                    critic_fwd: Optional[Callable[[torch.Tensor], torch.Tensor]],
                    train_policy: bool = True) -> dict[str, float]:
    """Accumulate the gradients of one minibatch (rows ``mb_idx``) over its micro-batches of
    ``ppo.micro_batch_size``, each loss aggregated with the whole minibatch's token and sequence counts
    (``agg_loss``), so the sum equals the minibatch loss. Returns the sums of the micro-batches' masked
    ratio, ratio², clipped tokens, approximate KL (½·(log-ratio)²) and clipped values, and of their policy and
    value losses. Raises TrainingDivergedError when a loss is NaN/inf."""
    mask, P, qr_all, rows = batch.response_mask, batch.context_length, batch.query_responses, batch.loss_rows
    in_loss = mask if rows is None else mask * rows[:, None]  # zero-variance filtering: rows out of the loss
    pg_loss_fn, vf_loss_fn = POLICY_LOSSES.get(p.policy_loss), VALUE_LOSSES.get(p.value_loss)
    kl_estimator = KL_ESTIMATORS.get(p.kl_estimator)
    knobs = POLICY_LOSSES.knobs(p.policy_loss, p)
    agg = dict(mode=p.loss_agg, num_tokens=in_loss[mb_idx].sum(), max_len=batch.max_len,
               num_seqs=len(mb_idx) if rows is None else int(rows[mb_idx].sum().item()))
    sums = {"ratio": 0.0, "ratio_sq": 0.0, "clip": 0.0, "approxkl": 0.0, "vclip": 0.0, "pg": 0.0, "vf": 0.0}
    for ms in range(0, p.minibatch_size, p.micro_batch_size):
        idx = mb_idx[ms : ms + p.micro_batch_size]
        L = mask.shape[1] if p.compile else mask_extent(mask[idx])
        m, lm, qr, old = mask[idx, :L], in_loss[idx, :L], qr_all[idx, : P + L], batch.logprobs[idx, :L]
        groups = {"group_lengths": batch.group_lengths[idx]} if batch.group_lengths is not None else {}
        loss = torch.zeros((), device=m.device)
        if train_policy:  # (False: the critic alone, value pretraining)
            with autocast():
                new_logprobs = policy_fwd(qr)
            new_logprobs = new_logprobs.float()
            pg_mat, pg_clipped, ratio = pg_loss_fn(new_logprobs, old, batch.advantages[idx, :L], m, cliprange=p.cliprange,
                                                   cliprange_high=p.cliprange_high, clip_ratio_c=p.clip_ratio_c,
                                                   knobs=knobs)
            if batch.policy_mask is not None:  # token selection: unselected tokens add 0, the counts stay the batch's
                pg_mat = pg_mat * batch.policy_mask[idx, :L]
            if batch.is_weights is not None:  # the rollout correction's weights (detached), the counts unchanged
                pg_mat = pg_mat * batch.is_weights[idx, :L]
            loss = pg = agg_loss(pg_mat, lm, **agg, **groups)
            if loss_coef:
                kl_new = kl_loss_terms(new_logprobs, batch.ref_logprobs[idx, :L], old, kl_estimator,
                                       p.kl_loss_importance_weight)
                loss = loss + loss_coef * agg_loss(kl_new, lm, **agg, **groups)
        if models.critic is not None:
            with autocast():
                new_values = critic_fwd(qr).float()
            vf_mat, vf_clipped = vf_loss_fn(new_values, batch.values[idx, :L], batch.returns[idx, :L],
                                            cliprange_value=p.cliprange_value)
            vf = agg_loss(vf_mat, lm, **agg, **groups)
            loss = loss + p.vf_coef * vf
            sums["vf"] += vf.item()
            sums["vclip"] += (vf_clipped.float() * m).sum().item()
        _check_finite("loss", loss, it)
        loss.backward()
        if train_policy:
            with torch.no_grad():
                lr_ = new_logprobs - old
                sums["pg"] += pg.item()
                sums["ratio"] += (ratio * m).sum().item()
                sums["ratio_sq"] += (ratio.square() * m).sum().item()
                sums["clip"] += (pg_clipped.float() * m).sum().item()
                sums["approxkl"] += (0.5 * lr_.square() * m).sum().item()
    return sums


def _update(models: Models, p: Any, batch: Rollout, loss_coef: float, optimizer: torch.optim.Optimizer,
            gen: torch.Generator, autocast: Any, it: int, policy_fwd: Callable[[torch.Tensor], torch.Tensor],
            critic_fwd: Optional[Callable[[torch.Tensor], torch.Tensor]], train_policy: bool = True) -> dict[str, float]:
    """K epochs over shuffled minibatches, each split into micro-batches normalized by the whole
    minibatch (:func:`_minibatch_step`), one optimizer step per minibatch (gradients clipped to
    ``ppo.max_grad_norm``). Returns the mean statistics over all minibatches, plus those of the very first
    minibatch (``policy/*_first``). ``policy_fwd`` / ``critic_fwd`` come from :func:`update_forwards` (eager
    or compiled). The policy loss is ``ppo.policy_loss``'s; with ``loss_coef`` > 0 the KL terms of "k_n as
    loss" (:func:`harness.rl.components.kl.kl_loss_terms`) are added. In eager mode each micro-batch is cut
    to the columns where it has real tokens (:func:`mask_extent`): a causal model's outputs there,
    and every masked sum, are the same without the padding columns. ``train_policy`` False updates the critic
    alone (:func:`_critic_warmup`)."""
    mask = batch.response_mask
    models.policy.train()
    if models.critic is not None:
        models.critic.train()
    acc: dict[str, list[float]] = {}
    first: dict[str, float] = {}
    for _epoch in range(p.num_ppo_epochs):
        perm = torch.randperm(mask.shape[0], generator=gen, device=mask.device)
        for start in range(0, mask.shape[0], p.minibatch_size):
            mb_idx = perm[start : start + p.minibatch_size]
            if batch.loss_rows is not None and not batch.loss_rows[mb_idx].any():
                continue  # zero-variance filtering left every row of this minibatch out of the loss: no step
            sums = _minibatch_step(models, p, batch, mb_idx, loss_coef, autocast, it, policy_fwd, critic_fwd, train_policy)
            if p.max_grad_norm is not None:
                torch.nn.utils.clip_grad_norm_([q for g in optimizer.param_groups for q in g["params"]], p.max_grad_norm)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            n = mask[mb_idx].sum().item()
            ratio_mean = sums["ratio"] / n
            stats = {
                "policy/ratio_mean": ratio_mean,
                "policy/ratio_std": math.sqrt(max(sums["ratio_sq"] / n - ratio_mean**2, 0.0)),
                "policy/clipfrac": sums["clip"] / n,
                "policy/approxkl": sums["approxkl"] / n,
                "loss/policy": sums["pg"],
            }
            if models.critic is not None:
                stats["loss/value"] = sums["vf"]
                stats["val/clipfrac"] = sums["vclip"] / n
            if not first:
                first = {f"{k}_first": v for k, v in stats.items() if k.startswith("policy/")}
            for k, v in stats.items():
                acc.setdefault(k, []).append(v)
    out = {k: sum(v) / len(v) for k, v in acc.items()}
    out.update(first)
    return out
