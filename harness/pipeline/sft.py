"""Supervised fine-tuning with TRL ``SFTTrainer``, and its perplexity baselines.

By default the policy starts from scratch (no hub weights): a ``GPT2Config`` from
``config.pipeline.model``, trained as a language model on real reviews (VADER snippets + Rotten
Tomatoes texts, train split), each text followed by EOS so the model learns to stop. This is the SFT
step of Ziegler et al. 2019 / Stiennon et al. 2020, at toy scale. With ``init_dir`` the same recipe
fine-tunes a pretrained checkpoint instead (the ``pretrained_sft`` stage of a model preset).

Perplexity is reported on the validation split against an add-one-smoothed unigram model over the
same tokens, so "the LM learned something beyond token frequencies" is a checked claim.
"""

from __future__ import annotations

import math
import tempfile
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from transformers import AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel

from harness.config.pipeline import ModelConfig, SFTConfig
from harness.pipeline.progress import install_progress, trainer_args
from harness.pipeline.tokenizer import encode_with_eos

if TYPE_CHECKING:  # TRL and datasets are imported where a model is trained: a run that loads one never needs them
    from datasets import Dataset


def build_model(model_cfg: ModelConfig, tokenizer, seed: int) -> GPT2LMHeadModel:
    """A freshly initialised GPT-2 LM sized by ``model_cfg`` for ``tokenizer``'s vocabulary.

    Dropout ``model_cfg.dropout`` is stored in the config for residual, embedding and attention
    (``resid_pdrop``, ``embd_pdrop``, ``attn_pdrop``); the PPO dropout axis decides whether it is used.
    Input and output embeddings are tied (GPT-2). ``eos/bos_token_id`` = EOS, ``pad_token_id`` = PAD.

    Raises:
        ValueError: from ``GPT2Config`` on inconsistent sizes.
    """
    cfg = GPT2Config(
        vocab_size=len(tokenizer),
        n_positions=model_cfg.n_positions,
        n_embd=model_cfg.n_embd,
        n_layer=model_cfg.n_layer,
        n_head=model_cfg.n_head,
        resid_pdrop=model_cfg.dropout,
        embd_pdrop=model_cfg.dropout,
        attn_pdrop=model_cfg.dropout,
        bos_token_id=tokenizer.eos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True,
    )
    torch.manual_seed(seed)
    model = GPT2LMHeadModel(cfg)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model


def _batches(seqs: list[list[int]], batch_size: int, pad_id: int):
    for i in range(0, len(seqs), batch_size):
        chunk = seqs[i : i + batch_size]
        L = max(len(s) for s in chunk)
        ids = torch.full((len(chunk), L), pad_id, dtype=torch.long)
        mask = torch.zeros((len(chunk), L), dtype=torch.long)
        for j, s in enumerate(chunk):
            ids[j, : len(s)] = torch.tensor(s)
            mask[j, : len(s)] = 1
        yield ids, mask


@torch.no_grad()
def lm_perplexity(model, seqs: list[list[int]], pad_id: int, batch_size: int = 128, device: torch.device | str = "cpu") -> float:
    """Perplexity ``exp(Σ −log p(x_t | x_<t) / N)`` of a causal LM over every token after the first of each sequence.

    Args:
        seqs: token-id lists (EOS included, as produced by :func:`encode_with_eos`); right-padded here.

    Returns:
        Perplexity (float, ≥ 1). Targets are positions 1..len−1 of each sequence (the first token has no
        context, no BOS is used), the same targets as :func:`unigram_perplexity`.

    Raises:
        ValueError: if no sequence has ≥ 2 tokens.
    """
    was_training = model.training
    model.eval()
    nll, n = 0.0, 0
    for ids, mask in _batches(seqs, batch_size, pad_id):
        ids, mask = ids.to(device), mask.to(device)
        logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1].float()  # [B, L-1, V]
        logp = torch.log_softmax(logits, dim=-1).gather(-1, ids[:, 1:, None]).squeeze(-1)  # [B, L-1]
        m = mask[:, 1:].float()
        nll -= float((logp * m).sum())
        n += int(m.sum())
    model.train(was_training)
    if n == 0:
        raise ValueError("no target tokens: every sequence has < 2 tokens")
    return math.exp(nll / n)


def unigram_perplexity(train_seqs: list[list[int]], eval_seqs: list[list[int]], vocab_size: int) -> float:
    """Perplexity of an add-one (Laplace) smoothed unigram model.

    ``p(w) = (c(w) + 1) / (N + V)`` with counts ``c`` over every token of ``train_seqs`` (EOS included),
    ``N`` their total and ``V = vocab_size``; evaluated on positions 1..len−1 of each ``eval_seqs`` row,
    the targets :func:`lm_perplexity` scores. Jurafsky & Martin, SLP3 ch. 3 (Laplace smoothing).

    Raises:
        ValueError: if there are no target tokens.
    """
    counts = Counter(t for s in train_seqs for t in s)
    total = sum(counts.values())
    denom = math.log(total + vocab_size)
    nll, n = 0.0, 0
    for s in eval_seqs:
        for t in s[1:]:
            nll -= math.log(counts.get(t, 0) + 1) - denom
            n += 1
    if n == 0:
        raise ValueError("no target tokens: every sequence has < 2 tokens")
    return math.exp(nll / n)


def train_sft(
    train_texts: list[str],
    val_texts: list[str],
    tokenizer,
    model_cfg: ModelConfig,
    sft_cfg: SFTConfig,
    out_dir: str | Path,
    *,
    seed: int = 0,
    device: torch.device | str = "cpu",
    bf16: bool = False,
    progress: bool = True,
    init_dir: str | Path | None = None,
) -> dict:
    """Train the SFT policy with TRL ``SFTTrainer`` and save it (``save_pretrained``) with the tokenizer.

    Without ``init_dir`` the model is a fresh GPT-2 sized by ``model_cfg`` (:func:`build_model`); with it,
    the pretrained causal LM at that local path (``AutoModelForCausalLM.from_pretrained``, fp32) is
    fine-tuned and ``model_cfg`` is not used; ``tokenizer`` must then be that checkpoint's tokenizer, and
    the validation perplexity before fine-tuning is reported too (``val_perplexity_before``), so the
    stage shows that SFT moved the model towards the task's texts. Texts get EOS appended here (TRL
    would append it too; it skips texts that already end in EOS) and are truncated to
    ``sft_cfg.max_length`` tokens by TRL (``truncation_mode="keep_start"``). Loss: token-mean
    NLL over all tokens (TRL ``loss_type="nll"``), AdamW, cosine schedule with 5% warmup, no weight decay;
    ``sft_cfg.group_by_length`` batches texts of similar length (transformers' ``LengthGroupedSampler``).

    Returns:
        metrics: ``val_perplexity``, ``unigram_perplexity``, ``train_loss``, ``n_train_texts``,
        ``n_val_texts``, ``n_params``, ``steps`` (and ``val_perplexity_before`` with ``init_dir``).

    Raises:
        ValueError: empty training set.
        OSError: from ``from_pretrained`` when ``init_dir`` holds no checkpoint.
    """
    if not train_texts:
        raise ValueError("no SFT training texts")
    out = Path(out_dir)
    if sft_cfg.max_train_texts is not None:
        train_texts = train_texts[: sft_cfg.max_train_texts]
    from datasets import Dataset

    eos = tokenizer.eos_token
    ds = Dataset.from_dict({"text": [t + eos for t in train_texts]})
    if init_dir is None:
        model = build_model(model_cfg, tokenizer, seed)
    else:
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_pretrained(str(init_dir), dtype=torch.float32)
    max_length = min(sft_cfg.max_length, model.config.max_position_embeddings)
    val_seqs = encode_with_eos(tokenizer, val_texts, max_length)
    before: dict[str, float] = {}
    if init_dir is not None:
        before["val_perplexity_before"] = lm_perplexity(model.to(device), val_seqs, tokenizer.pad_token_id, device=device)
    model, result = fit_sft(model, ds, tokenizer, sft_cfg, max_length, seed=seed, device=device, bf16=bf16,
                            progress=progress)
    model.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))

    train_seqs = encode_with_eos(tokenizer, train_texts, max_length)
    model.to(device)
    ppl = lm_perplexity(model, val_seqs, tokenizer.pad_token_id, device=device)
    uni = unigram_perplexity(train_seqs, val_seqs, len(tokenizer))
    return {
        **before,
        "val_perplexity": ppl,
        "unigram_perplexity": uni,
        "train_loss": float(result.training_loss),
        "n_train_texts": len(train_texts),
        "n_val_texts": len(val_texts),
        "n_params": int(sum(p.numel() for p in model.parameters())),
        "steps": int(result.global_step),
    }


def fit_sft(model, dataset: "Dataset", tokenizer, sft_cfg: SFTConfig, max_length: int, *, seed: int,
            device: torch.device | str = "cpu", bf16: bool = False, progress: bool = True, **trl_args):
    """Train ``model`` on ``dataset`` with TRL ``SFTTrainer`` by the harness's recipe (:func:`trainer_args` of
    ``sft_cfg``: AdamW, cosine schedule, seeded, no checkpoints; no packing), in a temporary output directory.

    Args:
        dataset: a TRL dataset: ``text`` rows (language modelling) or ``prompt``/``completion`` rows.
        max_length: tokens per training sequence.
        trl_args: further ``trl.SFTConfig`` fields (e.g. ``completion_only_loss=True``).
    Returns:
        ``(trained model, the trainer's TrainOutput)``.
    Raises:
        whatever TRL raises (e.g. an empty dataset).
    """
    from trl import SFTConfig as TRLSFTConfig
    from trl import SFTTrainer

    with tempfile.TemporaryDirectory(prefix="harness-sft-") as tmp:
        args = TRLSFTConfig(**trainer_args(sft_cfg, output_dir=tmp, max_length=max_length, seed=seed, bf16=bf16,
                                           device=device),
                            packing=False, dataset_num_proc=None, **trl_args)
        trainer = SFTTrainer(model=model, args=args, train_dataset=dataset, processing_class=tokenizer)
        install_progress(trainer, "sft", progress)
        result = trainer.train()
    return trainer.model, result


def sft_stage(run, train_texts: list[str], val_texts: list[str], tokenizer, inputs: dict[str, str], *,
              seed: int | None = None, label: str | None = None) -> tuple[str, str]:
    """The ``sft`` stage of a task's pipeline: :func:`train_sft` of the harness's own model
    (``pipeline.model`` minus ``policy_path`` and ``preset``) with ``pipeline.sft`` and the run's draw seed
    (:attr:`harness.config.Config.draw_seed`: ``pipeline.seed`` with one pipeline draw; ``seed`` names another
    draw's, recorded under ``label``), keyed by those and ``inputs`` (the data and tokenizer keys); ``run`` is the
    :class:`~harness.pipeline.stage.StageRunner`.

    Returns:
        ``(sft_dir, key)``.
    Raises:
        whatever :func:`train_sft` raises.
    """
    pc, seed = run.cfg.pipeline, (run.cfg.draw_seed if seed is None else seed)
    model_cfg = pc.model.model_dump(mode="json")
    model_cfg.pop("policy_path")
    model_cfg.pop("preset")  # the SFT stage trains the harness's own model either way
    settings = {"model": model_cfg, "sft": pc.sft.model_dump(mode="json"), "seed": seed}

    def build(tmp: Path) -> dict:
        return train_sft(train_texts, val_texts, tokenizer, pc.model, pc.sft, tmp, seed=seed, device=run.device,
                         bf16=run.bf16, progress=run.progress)

    path, rec = run("sft", settings, inputs, build, label=label)
    return str(path), rec["key"]
