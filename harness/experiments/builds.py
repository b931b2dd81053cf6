"""Which weights a run's pipeline really had: its *build*, and how runs of several builds are pooled.

A stage's cache key names its recipe (config and inputs); the digest of its saved tensors
(:func:`harness.pipeline.stage.weights_digest`, tag ``digest.<stage>`` on every run) names what was built. Two
machines can build different weights under one key: the math libraries pick their kernels by the CPU's
instruction set, so reductions round differently in the last bits, and training amplifies that; an AVX2-only
AMD EPYC built review_sentiment's gold scorer, reward model of human ratings and draw-0 SFT policy with other
digests than the machines that trained the committed runs, under the same keys.

A build is a draw of the stages every pipeline draw shares (one key for all draws: the gold scorer, the reward
model of human ratings, draw 0's SFT policy), as a pipeline draw is a draw of the per-draw stages. Measured on the
ablations whose archives hold runs of two builds, the claims' effects agree across builds (9 of 9 in sign, with
overlapping intervals): a second build is a second sample of the same experiment. So builds are pooled as strata:

- a report counts the runs of every build; the unit of comparison is a *draw on a build*: arms are compared within
  one seed's pipeline draw on one build (:func:`pool_builds` keeps, per seed, the runs of one build: the one
  holding most of that seed's arms), so every within-draw difference is measured by one instrument, and the
  between-draw (so between-build) variation of the effect is in the blocked test's variance
  (:func:`draw_labels`); the report gives each claim's effect per build and Cochran's Q across them
  (:func:`harness.analysis.stats.heterogeneity`);
- a driver on a machine of another build trains only what the plan lacks, and retrains a seed's finished runs
  only where that seed has arms left to train here (:func:`harness.experiments.plan.accept_for_training`), so that no
  seed's arms span builds.

Where the runs of an ablation share one pipeline draw (``pipeline.replicates`` 1), the seeds are compared as
independent draws of the PPO run (Welch); each seed's arms are of one build, so a build's level enters both arms
alike and the test's variance (conservatively) with it.
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
    a stage built on this machine must match before a report reads it (:func:`harness.experiments.archive.stage_copy`).

    Example: columns ``tags.digest.gold`` ``["1", "1"]`` and ``tags.digest.sft`` ``["2", None]`` → ``{"1", "2"}``."""
    return {str(x) for col in runs.columns if col.startswith("tags.digest.") for x in runs[col].dropna()}


def choose_build(runs: "pd.DataFrame") -> tuple[str, list[dict[str, Any]]]:
    """The main build of FINISHED runs (columns ``variant``, ``seed``, ``start_time`` and those of :func:`build_ids`),
    the one ``harness build-check`` compares this machine with: the one whose runs cover the most variants, then the
    most distinct (variant, seed), then the one whose first run started first. Returns ``(build, others)``:
    ``others`` lists each other build with its runs' count and (variant, seed) keys (empty when every run is of one
    build). Reports count every build (:func:`pool_builds`).

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
    recorded: ``{stage: (key, digest)}`` (:func:`harness.experiments.build_check.check_build` compares them with this machine's).
    A stage whose digest varies among those runs is left out. Empty for no runs or no shared stage.

    Example: 3 runs of build ``gold=x1; human_rm=x2`` and 2 of ``gold=y1; human_rm=y2`` →
    ``{"gold": ("g", "x1"), "human_rm": ("h", "x2")}``."""
    if runs.empty:
        return {}
    chosen, _ = choose_build(runs)
    sub = runs[build_ids(runs) == chosen]
    return {st: (str(sub[f"tags.pipeline.{st}"].iloc[0]), str(sub[f"tags.digest.{st}"].iloc[0]))
            for st in shared_stages(sub) if sub[f"tags.digest.{st}"].nunique() == 1}



def short_build(build: str) -> str:
    """A build as a report names it: each stage's digest cut to 8 hex digits (``"gold=89c52bd3; human_rm=1f0e…"``);
    ``"one build"`` for ``""`` (no shared stage recorded)."""
    if not build:
        return "one build"
    return "; ".join(part if "=" not in part else f"{part.split('=', 1)[0]}={part.split('=', 1)[1][:8]}"
                     for part in build.split("; "))


def pool_builds(df: "pd.DataFrame") -> tuple["pd.DataFrame", list[dict[str, Any]], "pd.DataFrame"]:
    """The runs a report counts when builds are pooled: ``df`` (columns ``status``, ``variant``, ``seed``,
    ``start_time`` and those of :func:`build_ids`) with a column ``build`` (each FINISHED run's :func:`build_ids`,
    ``""`` for the others) and, per seed, the FINISHED runs of one build only: the build that holds the most of that
    seed's variants, then the first in :func:`choose_build`'s order (the main build, then the others as it ranks
    them), so that a seed's arms are compared on one instrument and a seed the main build holds in full keeps its
    runs there. Unfinished runs stay (listed, never counted).

    Returns:
        ``(df, set_aside, every)``: ``set_aside`` lists, per build, the FINISHED runs left out (``{"build", "runs",
        "keys": ["variant/s<seed>", …]}``), empty when no seed spans builds; ``every``: all FINISHED runs with their
        build, those set aside included (each build's own estimate, for the heterogeneity check across builds).

    Example: seed 0 with ``all`` and ``top`` on build ``gold=1`` and ``all`` on ``gold=5``; seed 1 with both on
    ``gold=5`` → both builds counted (seed 0 on ``gold=1``, seed 1 on ``gold=5``); ``gold=5``'s ``all/s0`` set aside.
    A seed whose variants are all on two builds is counted on the main one.
    """
    out = df.copy()
    out["build"] = ""
    done = out["status"] == "FINISHED"
    if not done.any():
        return out, [], out[done]
    out.loc[done, "build"] = build_ids(out[done])
    main, others = choose_build(out[done])
    order = {b: i for i, b in enumerate([main, *(o["build"] for o in others)])}
    keep = ~done
    aside: dict[str, list[str]] = {}
    for seed, sub in out[done].groupby("seed", sort=True):
        ranked = sorted((-sub.loc[sub["build"] == b, "variant"].nunique(), order[str(b)], str(b))
                        for b in sub["build"].unique())
        chosen = ranked[0][-1]
        keep |= out.index.isin(sub.index[sub["build"] == chosen])
        for *_, b in ranked[1:]:
            aside.setdefault(b, []).extend(f"{v}/s{int(seed)}" for v in sub.loc[sub["build"] == b, "variant"])
    others = [{"build": b, "runs": len(keys), "keys": sorted(set(keys))} for b, keys in sorted(aside.items())]
    return out[keep], others, out[done]


def draw_labels(replicates: "Iterable[Optional[str]]", builds: "Iterable[str]") -> list[Optional[str]]:
    """The block of each value a blocked comparison pairs on when an ablation counts runs of several builds: its
    pipeline draw (``replicate``) on its build, ``"<draw>@<build>"`` (a draw built on two machines is two blocks). A
    value without a draw stays None.

    Example: draws ``["0", "1", None]`` on builds ``["x", "x", "y"]`` → ``["0@x", "1@x", None]``."""
    return [None if r is None else f"{r}@{b}" for r, b in zip(replicates, builds)]


def counted_builds(finished: "pd.DataFrame") -> dict[str, dict[str, Any]]:
    """The builds of the counted runs (column ``build``, :func:`pool_builds`): ``{build: {"runs": count, "seeds":
    [sorted seeds]}}``; empty for no runs or no such column.

    Example: two runs of seeds 0 and 1 on ``gold=1`` and one of seed 2 on ``gold=5`` → ``{"gold=1": {"runs": 2,
    "seeds": [0, 1]}, "gold=5": {"runs": 1, "seeds": [2]}}``."""
    if finished.empty or "build" not in finished.columns:
        return {}
    return {str(b): {"runs": int(len(sub)), "seeds": sorted({int(x) for x in sub["seed"]})}
            for b, sub in finished.groupby("build", sort=True)}


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



def other_build_keys(state: Any, out_dir: "str | Path", seeds: "Iterable[int]") -> set[str]:
    """The planned keys of the ``seeds`` that have arms left to train here whose FINISHED runs (``state``:
    :class:`harness.experiments.plan.ResumeState`, the latest and the older ones) are all of another build than the
    shared stages this machine has cached (:func:`cached_stages`): what a driver that trains those seeds' other arms
    sets aside and trains again, so that no seed's arms span builds. Empty when nothing of theirs is cached here
    (not known without building)."""
    machine = cached_stages(list(state.finished_tags.values()), out_dir)
    wanted = {str(s) for s in seeds}
    return {k for k in state.finished if state.finished_tags[k].get("seed") in wanted
            and not any(run_matches(tags, machine) for _, tags in state.finished_runs(k))}


__all__ = ["machine_stages", "run_matches", "tags_frame", "shared_stages", "build_ids", "counted_stages", "choose_build",
           "short_build", "pool_builds", "draw_labels", "counted_builds", "cached_stages", "other_build_keys"]
