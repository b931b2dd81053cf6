"""Which weights a run's pipeline really had: its *build*, and keeping runs of different builds apart.

A stage's cache key names its recipe (config and inputs); the digest of its saved tensors
(:func:`harness.pipeline.stage.weights_digest`, tag ``digest.<stage>`` on every run) names what was built. Two
machines can build different weights under one key: the math libraries pick their kernels by the CPU's
instruction set, so reductions round differently in the last bits, and training amplifies that; an AVX2-only
AMD EPYC built review_sentiment's gold scorer, reward model of human ratings and draw-0 SFT policy with other
digests than the machines that trained the committed runs, under the same keys, while those machines had agreed
with one another to the bit.

The stages that every pipeline draw shares (one key for all draws: the gold scorer, the reward model of human
ratings, draw 0's SFT policy) are one realisation per build. Runs of two builds are not two samples of one
experiment: an arm trained on one machine and compared with an arm trained on another confounds the arm with the
machine (a shared random effect with one draw per machine, which no number of seeds averages away), and the gold
that measures them is another instrument. So:

- a report counts the runs of one build only (:func:`choose_build`; runs of the others are set aside and named);
- a driver that trains compares this machine's build with the runs it would count or copy in (:func:`run_matches`,
  from :func:`harness.ablation_plan.accept_for_training`) and trains again, here, those of another build.

The per-draw stages (each draw's SFT policy, proxy data and proxy) are not part of a build: pairing two arms' runs
on draw ``r`` built on two machines compares two independent draws, which the blocked test's variance already
covers; only the shared stages make a confound.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, Optional

if TYPE_CHECKING:
    from pathlib import Path

    import pandas as pd


def machine_stages(summaries: Iterable[Mapping[str, Any]]) -> dict[str, tuple[str, str]]:
    """This machine's stages with saved weights, from the summaries of the pipelines it built or loaded
    (:func:`harness.pipeline.build_pipeline`'s ``summary``): ``{stage label: (cache key, weight digest)}``. A label met
    twice with different keys (two pipelines) keeps the first; stages without a digest (data, tokenizer) are left out.

    Example: ``[{"stages": {"gold": {"key": "g", "weights_sha256": "1"}, "data": {"key": "d", "weights_sha256":
    None}}}]`` → ``{"gold": ("g", "1")}``."""
    out: dict[str, tuple[str, str]] = {}
    for summary in summaries:
        for label, rec in (summary.get("stages") or {}).items():
            if rec.get("weights_sha256") and label not in out:
                out[label] = (str(rec.get("key")), str(rec["weights_sha256"]))
    return out


def run_matches(tags: Mapping[str, str], machine: Mapping[str, tuple[str, str]]) -> bool:
    """Whether a recorded run (its MLflow tags) was trained on this machine's build: for every stage of ``machine``
    whose key the run recorded (tag ``pipeline.<stage>``), the run's weight digest (``digest.<stage>``) is this
    machine's. Stages the run used under another key (another draw, another pipeline) are not compared. A run that
    used a stage under the same key but recorded no digest for it does not match (nothing shows it is the same).

    Example: machine ``{"gold": ("g", "1"), "sft": ("s0", "2")}``; a run with ``pipeline.gold=g, digest.gold=1,
    pipeline.sft=s7, digest.sft=9`` matches (draw 7's SFT is not compared); with ``digest.gold=5`` it does not."""
    for label, (key, digest) in machine.items():
        if tags.get(f"pipeline.{label}") == key and tags.get(f"digest.{label}") != digest:
            return False
    return True


def tags_frame(recorded: "Iterable[Mapping[str, str]]") -> "pd.DataFrame":
    """Runs given by their MLflow tags as the frame :func:`shared_stages` and :func:`build_ids` read: one row per run,
    a column ``tags.<name>`` per tag. Example: ``[{"digest.gold": "1"}]`` → one row, column ``tags.digest.gold``."""
    import pandas as pd

    return pd.DataFrame([{f"tags.{k}": v for k, v in tags.items()} for tags in recorded])


def shared_stages(runs: "pd.DataFrame") -> list[str]:
    """The stages every run shares (columns ``tags.pipeline.<stage>`` and ``tags.digest.<stage>``), in stage order: those
    every run recorded under one key, with a digest. Stages recorded under several keys (per-draw stages) or by some
    runs only (review_sentiment's ``sft_draw0``, which a run on draw 0 records as its ``sft``) are not shared.

    Example: runs with gold key ``g`` in all and sft keys ``a, b`` → ``["gold"]``."""
    shared = []
    for col in sorted(c for c in runs.columns if c.startswith("tags.digest.")):
        stage = col.removeprefix("tags.digest.")
        keys = runs.get(f"tags.pipeline.{stage}")
        if keys is not None and keys.notna().all() and keys.nunique() == 1 and runs[col].notna().all():
            shared.append(stage)
    return shared


def build_ids(runs: "pd.DataFrame") -> "pd.Series":
    """Each run's build, as read from the runs themselves: the digests of their :func:`shared_stages`, as
    ``"stage=digest; …"`` in stage order; ``""`` when there is none.

    Example: runs with gold ``g`` digests ``1, 1, 5`` and sft keys ``a, b, c`` → ``["gold=1", "gold=1", "gold=5"]``."""
    import pandas as pd

    shared = shared_stages(runs)
    if not shared:
        return pd.Series("", index=runs.index, dtype=object)

    def one(row: "pd.Series") -> str:
        return "; ".join(f"{st}={row[f'tags.digest.{st}']}" for st in shared
                         if isinstance(row[f"tags.digest.{st}"], str) and row[f"tags.digest.{st}"])

    return runs.apply(one, axis=1).astype(object)


def recorded_digests(runs: "pd.DataFrame") -> set[str]:
    """Every weight digest the runs recorded (the values of their ``tags.digest.<stage>`` columns, all stages), as
    a stage built on this machine must match before a report reads it (:func:`harness.archive.stage_copy`).

    Example: columns ``tags.digest.gold`` ``["1", "1"]`` and ``tags.digest.sft`` ``["2", None]`` → ``{"1", "2"}``."""
    return {str(x) for col in runs.columns if col.startswith("tags.digest.") for x in runs[col].dropna()}


def choose_build(runs: "pd.DataFrame") -> tuple[str, list[dict[str, Any]]]:
    """The build a report counts, from FINISHED runs (columns ``variant``, ``seed``, ``start_time`` and those of
    :func:`build_ids`): the one whose runs cover the most variants (a build holding one arm judges nothing), then
    the most distinct (variant, seed), then the one whose first run started first. Returns ``(build, others)``: ``others`` lists each other build with its runs' count, (variant, seed) keys
    and digests, for the report to name what it set aside (empty when every run is of one build).

    Example: build ``gold=1`` with 20 runs of the baseline, ``gold=5`` with 10 of each of two arms →
    ``("gold=5", [{"build": "gold=1", "runs": 20, …}])``."""
    if runs.empty:
        return "", []
    ids = build_ids(runs)
    stats = []
    for b in ids.unique():
        sub = runs[ids == b]
        stats.append((-sub["variant"].nunique(), -len(set(zip(sub["variant"], sub["seed"]))), sub["start_time"].min(),
                      str(b)))
    stats.sort()
    chosen = stats[0][-1]
    others = []
    for *_, b in stats[1:]:
        sub = runs[ids == b]
        others.append({"build": b, "runs": int(len(sub)),
                       "keys": sorted(f"{v}/s{int(s)}" for v, s in set(zip(sub["variant"], sub["seed"])))})
    return chosen, others


def counted_stages(runs: "pd.DataFrame") -> dict[str, tuple[str, str]]:
    """The shared stages of the build :func:`choose_build` picks among FINISHED ``runs``, with the key and digest its runs
    recorded: ``{stage: (key, digest)}`` (:func:`harness.build_check.check_build` compares them with this machine's).
    A stage whose digest varies among those runs is left out. Empty for no runs or no shared stage.

    Example: 3 runs of build ``gold=x1; human_rm=x2`` and 2 of ``gold=y1; human_rm=y2`` →
    ``{"gold": ("g", "x1"), "human_rm": ("h", "x2")}``."""
    if runs.empty:
        return {}
    chosen, _ = choose_build(runs)
    sub = runs[build_ids(runs) == chosen]
    return {st: (str(sub[f"tags.pipeline.{st}"].iloc[0]), str(sub[f"tags.digest.{st}"].iloc[0]))
            for st in shared_stages(sub) if sub[f"tags.digest.{st}"].nunique() == 1}


def one_build(df: "pd.DataFrame") -> tuple["pd.DataFrame", str, list[dict[str, Any]]]:
    """``df`` without the FINISHED runs of every build but the one :func:`choose_build` picks among
    them (unfinished runs stay: they are listed, never counted), that build (``""`` when all are of one), and the
    builds set aside."""
    done = df["status"] == "FINISHED"
    if not done.any():
        return df, "", []
    chosen, others = choose_build(df[done])
    if not others:
        return df, "", []
    ids = build_ids(df[done])  # the same frame choose_build read, so the same shared stages
    return df[~done | df.index.isin(ids.index[ids == chosen])], chosen, others


def cached_stages(recorded: "list[dict[str, str]]", out_dir: "str | Path") -> dict[str, tuple[str, str]]:
    """This machine's weights of the stages the ``recorded`` runs (their tags) share, as far as its pipeline cache
    (``out_dir``, every stage directory under it) holds them, nothing built to find out: ``{stage: (key, digest)}`` for
    each of their :func:`shared_stages` whose key has a built ``stage.json`` with a digest; for :func:`run_matches`.
    Empty when none is cached (nothing known yet).

    Example: runs sharing gold ``g`` and human_rm ``h``, with ``<out_dir>/gold/g/stage.json`` digest ``"5"`` and no
    ``h`` built → ``{"gold": ("g", "5")}``."""
    import json
    from pathlib import Path

    if not recorded:
        return {}
    runs = tags_frame(recorded)
    out: dict[str, tuple[str, str]] = {}
    for stage in shared_stages(runs):
        key = str(runs[f"tags.pipeline.{stage}"].iloc[0])
        for rec in sorted(Path(out_dir).glob(f"*/{key}/stage.json")):
            try:
                digest = json.loads(rec.read_text()).get("weights_sha256")
            except (OSError, ValueError):
                continue
            if digest:
                out[stage] = (key, str(digest))
                break
    return out


def spans_builds(recorded: list[dict[str, str]]) -> bool:
    """Whether runs given by their tags (``recorded``) span several builds (:func:`build_ids` over
    :func:`tags_frame`): then a driver builds the pipelines to choose among them, even with nothing else to train.
    False for none.

    Example: two runs with gold key ``g`` and digests ``x1`` and ``y1`` → True; the same digest twice → False.

    Raises:
        nothing: runs without shared stages are of one build (``""``)."""
    return bool(recorded) and build_ids(tags_frame(recorded)).nunique() > 1


def other_build_keys(state: Any, out_dir: "str | Path") -> set[str]:
    """The planned keys whose FINISHED runs (``state``: :class:`harness.ablation_plan.ResumeState`, the latest and the
    older ones) are all of another build than the shared stages this machine has cached (:func:`cached_stages`): what
    a driver that trains beside them sets aside and trains again. Empty when nothing of theirs is cached here (not
    known without building)."""
    machine = cached_stages(list(state.finished_tags.values()), out_dir)
    return {k for k in state.finished if not any(run_matches(tags, machine) for _, tags in state.finished_runs(k))}


__all__ = ["machine_stages", "run_matches", "tags_frame", "shared_stages", "build_ids", "counted_stages", "choose_build", "one_build",
           "cached_stages", "other_build_keys", "spans_builds"]
