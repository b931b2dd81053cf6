"""Byte-level BPE tokenizer trained with HF ``tokenizers`` on the train split.

GPT-2-style byte-level BPE (Radford et al. 2019): every byte is in the initial alphabet, so any
text encodes without unknown tokens. Two special tokens, deliberately DISTINCT:

* ``<|endoftext|>`` — EOS, appended to every training text; the RM score is read at it.
* ``<|pad|>`` — padding only. With pad == EOS the EOS of a padded sequence is indistinguishable from
  padding, the score lands on a pad token and a missing-EOS penalty never fires (TRL bug #3750,
  N+ detail 23), so we keep them apart.

No BOS token and no post-processor: ``tokenizer(text)["input_ids"]`` is exactly the BPE of ``text``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

EOS_TOKEN = "<|endoftext|>"
PAD_TOKEN = "<|pad|>"


def train_tokenizer(texts: Iterable[str], vocab_size: int, min_frequency: int = 2) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE tokenizer on ``texts``.

    Args:
        texts: training texts (the train split only, so val/test stay unseen).
        vocab_size: total vocabulary including the 256 byte tokens and the 2 special tokens.
        min_frequency: a merge must occur at least this often.

    Returns:
        ``PreTrainedTokenizerFast`` with ``eos_token="<|endoftext|>"`` (id 0), ``pad_token="<|pad|>"``
        (id 1), right padding. ``len(tokenizer) <= vocab_size``.

    Raises:
        ValueError: if ``vocab_size`` is too small for the byte alphabet plus the special tokens.
    """
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    if vocab_size < len(alphabet) + 2:
        raise ValueError(f"vocab_size {vocab_size} < {len(alphabet) + 2} (256 bytes + 2 special tokens)")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=[EOS_TOKEN, PAD_TOKEN],
        initial_alphabet=alphabet,
        show_progress=False,
    )
    tok.train_from_iterator(list(texts), trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS_TOKEN, pad_token=PAD_TOKEN)
    fast.padding_side = "right"
    return fast


def build_tokenizer(texts: Iterable[str], vocab_size: int, min_frequency: int, out_dir: str | Path) -> Path:
    """Train (see :func:`train_tokenizer`) and ``save_pretrained`` into ``out_dir``.

    Returns:
        ``out_dir`` as a Path; ``AutoTokenizer.from_pretrained(out_dir)`` reloads it.

    Raises:
        ValueError: from :func:`train_tokenizer`.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok = train_tokenizer(texts, vocab_size, min_frequency)
    tok.save_pretrained(str(out))
    return out


def encode_with_eos(tokenizer, texts: list[str], max_length: int) -> list[list[int]]:
    """Token ids of each text, truncated to ``max_length − 1`` tokens, with EOS appended.

    Every returned sequence ends in exactly one ``tokenizer.eos_token_id`` and has length ≤ ``max_length``,
    so the EOS (where the RM score is read) is never truncated away.

    Raises:
        ValueError: if the tokenizer has no EOS token or ``max_length < 2``.
    """
    if tokenizer.eos_token_id is None:
        raise ValueError("tokenizer has no eos_token")
    if max_length < 2:
        raise ValueError(f"max_length must be ≥ 2 (got {max_length})")
    ids = tokenizer(list(texts), add_special_tokens=False)["input_ids"]
    return [x[: max_length - 1] + [tokenizer.eos_token_id] for x in ids]


def tokenizer_stage(run, train_texts: list[str], data_key: str) -> tuple[str, str]:
    """The ``tokenizer`` stage of a task's pipeline: :func:`build_tokenizer` on ``train_texts`` with
    ``pipeline.tokenizer``, keyed by that config and ``data_key``; ``run`` is the
    :class:`~harness.pipeline.stage.StageRunner`. Metrics: vocabulary size, EOS and pad tokens and ids.

    Returns:
        ``(tokenizer_dir, key)``.
    Raises:
        ValueError: from the tokenizer trainer (e.g. no text).
    """
    from harness.rl.models import load_tokenizer

    tc = run.cfg.pipeline.tokenizer

    def build(tmp: Path) -> dict:
        build_tokenizer(train_texts, tc.vocab_size, tc.min_frequency, tmp)
        t = load_tokenizer(tmp)
        return {"vocab_size": len(t), "eos_token": t.eos_token, "eos_token_id": t.eos_token_id,
                "pad_token": t.pad_token, "pad_token_id": t.pad_token_id}

    path, rec = run("tokenizer", tc.model_dump(mode="json"), {"data": data_key}, build)
    return str(path), rec["key"]
