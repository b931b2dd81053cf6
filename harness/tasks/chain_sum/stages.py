"""The chain_sum pipeline: problems → tokenizer → SFT (with its held-out pass@1).

:func:`build_stages` is the task's ``stages`` entry. Stages and their cache keys:

* ``problems``: ``task.options`` (knobs, ``n_train``, ``n_heldout``, ``seed``) + the reasoning-gym version.
  Training and held-out problems from disjoint generator seeds (:func:`.problems.make_problems`), written to
  ``problems.jsonl``. Metrics: counts, held-out expressions also among the training ones, problems per number
  of terms, the fraction of scratchpad traces the library's scorer accepts (must be 1.0).
* ``tokenizer``: byte-level, no merges (every digit and sign its own token, so that the model learns digit-wise
  arithmetic), plus ``<answer>`` and ``</answer>`` as single tokens; EOS and pad as in
  :mod:`harness.pipeline.tokenizer`. It depends on nothing but its own settings.
* ``sft``: ``pipeline.model`` (minus ``policy_path`` and ``preset``) + ``pipeline.sft`` + the draw seed (``pipeline.seed``
  with one pipeline draw; :attr:`harness.config.Config.draw_seed`) +
  ``task.prompt_length`` / ``task.response_length``: TRL ``SFTTrainer`` from scratch on (left-padded prompt,
  scratchpad) pairs, the loss on the completion only (:mod:`.sft`). Metrics: greedy pass@1 on the
  ``n_heldout`` held-out problems, overall and per number of terms; mean length and SD of all, of correct
  and of incorrect responses; the truncation rate.
* ``pretrained`` and ``pretrained_sft`` (only with ``pipeline.model.preset``, instead of ``sft``): the preset's
  checkpoint fine-tuned on the solved training problems as plain texts (:func:`solved_texts`), keyed on the
  ``problems`` stage (:func:`harness.pipeline.pretrained.build_preset_stages`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import harness.tasks.chain_sum.problems as problems
from harness.tasks.chain_sum.task import options_of

#: Tokens added to the byte-level vocabulary: the answer tags, each one token.
ADDED_TOKENS = ("<answer>", "</answer>")
#: Every stage this task builds, in build order.
STAGES = ("problems", "tokenizer", "sft")


def build_stages(cfg: Any, run: Any, full: bool = False) -> dict[str, Any]:
    """Build (or load) the stages of the module docstring with ``run`` (a ``StageRunner``); ``full`` changes nothing
    (the task has no optional stage).

    Returns:
        ``{"tokenizer_dir", "sft_dir"}`` (no reward model: the reward is the verifier); with
        ``pipeline.model.preset``, ``pretrained_dir`` instead of ``sft_dir`` (:func:`_preset_stages`).
    Raises:
        ValueError: a prompt longer than ``task.prompt_length``.
    """
    from harness.rl.models import load_tokenizer

    prob_dir, prob_key = _problems_stage(run)
    train, heldout = load_problems(prob_dir)
    tok_dir, tok_key = _tokenizer_stage(run)
    if cfg.pipeline.model.preset:
        return {"tokenizer_dir": tok_dir, "sft_dir": "", "pretrained_dir": _preset_stages(run, train, heldout, prob_key)}
    sft_dir, _ = _sft_stage(run, train, heldout, load_tokenizer(tok_dir), {"problems": prob_key, "tokenizer": tok_key})
    return {"tokenizer_dir": tok_dir, "sft_dir": sft_dir}


def solved_texts(entries: list[dict]) -> list[str]:
    """Each problem's prompt followed by its scratchpad (``"5 + 3 = 5+3=8; <answer>8</answer>"``): the texts a
    pretrained preset is fine-tuned on."""
    return [problems.prompt_text(e) + problems.scratchpad(e) for e in entries]


def _preset_stages(run: Any, train: list[dict], heldout: list[dict], prob_key: str) -> str:
    """With ``pipeline.model.preset``: the preset's checkpoint fine-tuned on the solved training problems (the first
    of them by the preset's own recipe, scratchpads only: ``task.options.direct_fraction`` is for the from-scratch
    policy), validated on the held-out ones (:func:`harness.pipeline.pretrained.build_preset_stages`), texts of up to
    ``task.prompt_length + task.response_length`` tokens. The from-scratch SFT stage is not built. Returns the
    ``pretrained_sft`` directory."""
    from harness.pipeline.pretrained import build_preset_stages

    cfg = run.cfg
    return build_preset_stages(run, solved_texts(train), solved_texts(heldout), prob_key,
                               max_length=cfg.task.prompt_length + cfg.task.response_length)


def load_problems(stage_dir: str | Path) -> tuple[list[dict], list[dict]]:
    """``(train, heldout)`` entries of a ``problems`` stage directory (``problems.jsonl``, one entry per line with
    its ``split``)."""
    train, heldout = [], []
    with open(Path(stage_dir) / "problems.jsonl") as f:
        for line in f:
            e = json.loads(line)
            (train if e.pop("split") == "train" else heldout).append(e)
    return train, heldout


def _problems_stage(run: Any) -> tuple[Path, str]:
    """The ``problems`` stage. Returns ``(dir, key)``."""
    from importlib.metadata import version

    opt = options_of(run.cfg)
    settings = {**opt.knobs(), "n_train": opt.n_train, "n_heldout": opt.n_heldout, "seed": opt.seed,
                "heldout_seed_offset": problems.HELDOUT_SEED_OFFSET, "reasoning_gym": version("reasoning-gym")}
    if opt.disjoint_heldout:  # only then in the key: the stages built before the option keep theirs
        settings["disjoint_heldout"] = True

    def build(tmp: Path) -> dict:
        train, heldout = problems.make_problems(opt.n_train, opt.n_heldout, opt.seed, opt.disjoint_heldout, **opt.knobs())
        data = problems.dataset(1, opt.seed, **opt.knobs())
        with open(tmp / "problems.jsonl", "w") as f:
            for split, entries in (("train", train), ("heldout", heldout)):
                for e in entries:
                    f.write(json.dumps({"split": split, "question": e["question"], "answer": e["answer"],
                                        "metadata": {"expression": e["metadata"]["expression"]}}) + "\n")
        traces_ok = sum(problems.reward(problems.scratchpad(e), e, data) for e in train + heldout)
        return {"n_train": len(train), "n_heldout": len(heldout),
                "heldout_in_train": problems.split_overlap(train, heldout),
                "train_by_terms": _count_terms(train), "heldout_by_terms": _count_terms(heldout),
                "traces_scored_correct": traces_ok / (len(train) + len(heldout))}

    path, rec = run("problems", settings, {}, build)
    return path, rec["key"]


def _count_terms(entries: list[dict]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for e in entries:
        n = str(problems.terms(e))
        counts[n] = counts.get(n, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: int(kv[0])))


def _tokenizer_stage(run: Any) -> tuple[str, str]:
    """The ``tokenizer`` stage: :func:`harness.pipeline.tokenizer.train_tokenizer` with the bare byte alphabet (no
    merges), plus :data:`ADDED_TOKENS`. Returns ``(dir, key)``."""
    from harness.rl.models import load_tokenizer
    from harness.pipeline.tokenizer import train_tokenizer

    settings = {"kind": "byte_level_no_merges", "added_tokens": list(ADDED_TOKENS)}

    def build(tmp: Path) -> dict:
        from tokenizers import pre_tokenizers

        tok = train_tokenizer(["0123456789 +-=;"], vocab_size=len(pre_tokenizers.ByteLevel.alphabet()) + 2)
        tok.add_tokens(list(ADDED_TOKENS))
        tok.save_pretrained(str(tmp))
        t = load_tokenizer(tmp)
        return {"vocab_size": len(t), "eos_token_id": t.eos_token_id, "pad_token_id": t.pad_token_id,
                "added_token_ids": [t.convert_tokens_to_ids(a) for a in ADDED_TOKENS]}

    path, rec = run("tokenizer", settings, {}, build)
    return str(path), rec["key"]


def _sft_stage(run: Any, train: list[dict], heldout: list[dict], tok: Any, inputs: dict[str, str]) -> tuple[str, str]:
    """The ``sft`` stage (:func:`.sft.train_chain_sum_sft`). Returns ``(dir, key)``."""
    from harness.tasks.chain_sum.sft import train_chain_sum_sft

    cfg = run.cfg
    pc = cfg.pipeline
    model_cfg = {k: v for k, v in pc.model.model_dump(mode="json").items() if k not in ("policy_path", "preset")}
    settings = {"model": model_cfg, "sft": pc.sft.model_dump(mode="json"), "seed": cfg.draw_seed,
                "prompt_length": cfg.task.prompt_length, "response_length": cfg.task.response_length}
    opts = options_of(cfg)
    if opts.direct_fraction:  # only when set: the stages built before the knob keep their keys
        settings["direct_fraction"] = opts.direct_fraction
        if opts.direct_min_terms > opts.min_terms:
            settings["direct_min_terms"] = opts.direct_min_terms

    def build(tmp: Path) -> dict:
        return train_chain_sum_sft(train, heldout, tok, cfg, tmp, device=run.device, bf16=run.bf16, progress=run.progress)

    path, rec = run("sft", settings, inputs, build)
    return str(path), rec["key"]


__all__ = ["ADDED_TOKENS", "STAGES", "build_stages", "load_problems", "solved_texts"]
