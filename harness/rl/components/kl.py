"""KL penalty: per-token estimators, where the penalty goes, and how its coefficient evolves.

Estimators follow Schulman, "Approximating KL divergence" (2020 blog). With tokens sampled from
π (the policy) and ``log_ratio = logprobs - ref_logprobs = log π(x)/π_ref(x)``, each estimator's
expectation under π approximates KL(π ‖ π_ref):

- ``k1 = log_ratio``                          unbiased, high variance, can be negative;
- ``k2 = ½·log_ratio²``                       biased (exact to 2nd order), low variance, ≥ 0;
- ``k3 = exp(−log_ratio) − 1 + log_ratio``    unbiased, low variance, ≥ 0.

Placements follow the N+ / TRL convention (``reward``: −β·kl is added to per-token rewards) and the
GRPO / verl ``use_kl_loss`` convention (``loss``: β·agg(kl) is added to the policy loss).
"""

from __future__ import annotations

from typing import Protocol

import torch

from harness.registry import Registry


class KLEstimator(Protocol):
    """``fn(logprobs[B,T], ref_logprobs[B,T]) -> kl[B,T]`` (nats per token)."""

    def __call__(self, logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor: ...


class KLPlacement(Protocol):
    """``fn(kl_coef) -> (reward_coef, loss_coef)``."""

    def __call__(self, kl_coef: float) -> tuple[float, float]: ...


KL_ESTIMATORS: Registry = Registry("ppo.kl_estimator", KLEstimator, "per-token estimator of KL(π ‖ π_ref)")
KL_PLACEMENTS: Registry = Registry("ppo.kl_placement", KLPlacement, "where the KL penalty goes")
KL_CONTROLLERS: Registry = Registry("ppo.kl_ctl", None, "how β evolves")


# ---------------------------------------------------------------------------------------------
# Estimators: fn(logprobs[B,T], ref_logprobs[B,T]) -> kl[B,T]   (nats per token)
# ---------------------------------------------------------------------------------------------


@KL_ESTIMATORS.register("k1")
def k1(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """k1 = log π(x) − log π_ref(x), per token.

    Args:
        logprobs: ``[B, T]`` log-probabilities of the sampled tokens under the policy (nats).
        ref_logprobs: ``[B, T]`` log-probabilities of the same tokens under the reference model.

    Returns:
        ``[B, T]`` per-token estimate (nats); unbiased for KL(π ‖ π_ref), can be negative.

    Source: Schulman (2020), "Approximating KL divergence", k1; TRL / N+ default.
    """
    return logprobs - ref_logprobs


@KL_ESTIMATORS.register("k2")
def k2(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """k2 = ½·(log π(x) − log π_ref(x))², per token.

    Args:
        logprobs: ``[B, T]`` policy log-probabilities of the sampled tokens (nats).
        ref_logprobs: ``[B, T]`` reference log-probabilities of the same tokens.

    Returns:
        ``[B, T]`` non-negative estimate (nats); biased, but close to the KL when it is small.

    Source: Schulman (2020), k2; verl ``kl_penalty="mse"``, OpenRLHF ``--kl_estimator k2``.
    """
    log_ratio = logprobs - ref_logprobs
    return 0.5 * log_ratio.square()


@KL_ESTIMATORS.register("k3")
def k3(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """k3 = exp(−log_ratio) − 1 + log_ratio with log_ratio = log π(x) − log π_ref(x), per token.

    Args:
        logprobs: ``[B, T]`` policy log-probabilities of the sampled tokens (nats).
        ref_logprobs: ``[B, T]`` reference log-probabilities of the same tokens.

    Returns:
        ``[B, T]`` non-negative, unbiased estimate of KL(π ‖ π_ref) (nats). No clamping is applied.

    Source: Schulman (2020), k3; verl ``low_var_kl`` (without its clamp), GRPO paper eq. 4.
    """
    log_ratio = logprobs - ref_logprobs
    return torch.expm1(-log_ratio) + log_ratio


def kl_loss_terms(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, old_logprobs: torch.Tensor,
                  estimator: KLEstimator, importance_weight: bool = False) -> torch.Tensor:
    """Per-token KL terms of "k_n as loss": ``k_n(logprobs, ref_logprobs)`` with gradients through
    the current ``logprobs``, optionally weighted by the detached importance ratio
    ``sg(π_θ / π_old) = exp(logprobs − old_logprobs)``.

    The tokens were sampled from π_old. On-policy (π_θ = π_old: the first minibatch of an
    iteration) the weight is 1. After an update the unweighted term's expected gradient is
    ``E_{π_old}[∇k_n]``, not the ``E_{π_θ}[∇k_n]`` that the on-policy analysis is about; the
    detached weight restores it exactly: ``E_{π_old}[sg(π_θ/π_old)·∇k_n] = E_{π_θ}[∇k_n]``. With k2
    that is the reverse-KL gradient ``∇KL(π_θ ‖ π_ref)`` (the gradient of "k1 in the reward");
    with k1 it is 0 (``E_π[∇log π] = 0``); with k3 it is ``E_π[(1 − π_ref/π)∇log π]``, a biased
    first-order approximation.

    Args:
        logprobs: ``[B, T]`` log π_θ of the sampled tokens (with gradients; nats).
        ref_logprobs: ``[B, T]`` log π_ref of the same tokens.
        old_logprobs: ``[B, T]`` log π_old (rollout time); read only when ``importance_weight``.
        estimator: a :data:`KL_ESTIMATORS` function.
        importance_weight: multiply by the detached ratio.
    Returns:
        ``[B, T]`` per-token terms (nats), not masked: aggregate with ``agg_loss``.

    Source: Liu et al. 2025, "Rethinking KL Regularization in RLHF" (arXiv 2510.01555): the
    gradient-coefficient view of "k_n as loss", the on-policy equivalence of "k2 as loss" and
    "k1 in reward", and the importance-sampling correction of off-policy "k_n as loss".
    """
    kl = estimator(logprobs, ref_logprobs)
    if importance_weight:
        kl = kl * torch.exp(logprobs - old_logprobs).detach()
    return kl


# ---------------------------------------------------------------------------------------------
# Placements: fn(kl_coef) -> (reward_coef, loss_coef)
# ---------------------------------------------------------------------------------------------


@KL_PLACEMENTS.register("reward")
def in_reward(kl_coef: float) -> tuple[float, float]:
    """KL in the reward: ``rewards[t] -= β·kl_t``; returns ``(β, 0)``.

    Source: Stiennon et al. 2020 eq. 1; InstructGPT; N+; TRL PPOTrainer.
    """
    return float(kl_coef), 0.0


@KL_PLACEMENTS.register("loss")
def in_loss(kl_coef: float) -> tuple[float, float]:
    """KL in the loss: ``loss += β·agg(kl_t)`` on the current logprobs; returns ``(0, β)``.

    Source: Shao et al. 2024 (GRPO) eq. 3; verl ``actor.use_kl_loss``.
    """
    return 0.0, float(kl_coef)


@KL_PLACEMENTS.register("none")
def no_kl(kl_coef: float) -> tuple[float, float]:
    """No KL penalty anywhere; returns ``(0, 0)`` whatever ``kl_coef`` is (KL is still logged)."""
    return 0.0, 0.0


# ---------------------------------------------------------------------------------------------
# Controllers: factory fn(kl_coef, kl_target, kl_horizon) -> object with .value and .update()
# ---------------------------------------------------------------------------------------------


@KL_CONTROLLERS.register("fixed")
class FixedKLController:
    """Constant β. ``update`` is a no-op; ``kl_target``/``kl_horizon`` are accepted and ignored.

    Source: TRL / N+ (fixed ``kl_coef``).
    """

    def __init__(self, kl_coef: float, kl_target: float | None = None, kl_horizon: int | None = None) -> None:
        self.value = float(kl_coef)

    def update(self, current_kl: float, n_steps: int) -> None:
        """Do nothing (β stays fixed)."""


@KL_CONTROLLERS.register("adaptive")
class AdaptiveKLController:
    """Proportional controller driving the measured KL towards ``kl_target``.

    ``β ← β·(1 + clip(KL/KL_target − 1, −0.2, 0.2)·n_steps/horizon)``

    Args:
        kl_coef: initial β.
        kl_target: target KL per sequence (nats), > 0.
        kl_horizon: horizon in samples (the larger, the slower β moves), ≥ 1.

    Raises:
        ValueError: if ``kl_target`` ≤ 0 or ``kl_horizon`` < 1.

    Source: Ziegler et al. 2019, "Fine-Tuning Language Models from Human Preferences", §2.2.
    """

    def __init__(self, kl_coef: float, kl_target: float, kl_horizon: int) -> None:
        if kl_target is None or kl_target <= 0:
            raise ValueError(f"adaptive KL controller: kl_target must be > 0 (got {kl_target})")
        if kl_horizon is None or kl_horizon < 1:
            raise ValueError(f"adaptive KL controller: kl_horizon must be >= 1 (got {kl_horizon})")
        self.value = float(kl_coef)
        self.target = float(kl_target)
        self.horizon = int(kl_horizon)

    def update(self, current_kl: float, n_steps: int) -> None:
        """Move β after one batch whose mean KL was ``current_kl`` (nats) over ``n_steps`` samples."""
        proportional_error = min(max(float(current_kl) / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + proportional_error * n_steps / self.horizon
