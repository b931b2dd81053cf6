"""An ablation's plan: its (variant, seed) runs, and what the tracking store already holds for them.

:func:`plan_runs` turns a spec and a scale into :class:`RunTask` s (one resolved config each).
:func:`resume_state` finds those FINISHED at this scale of the ablation (skipped) or RUNNING in a live
process (left alone); :func:`find_reusable` finds FINISHED runs of the same config hash elsewhere
(another ablation, or another scale of this one; all candidates in one search, :func:`reusable_candidates`),
which :func:`reuse_finished_runs` copies in instead of training again. :func:`plan_ablation` is the dry run of all three.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Optional

from harness.experiments.spec import AblationSpec, experiment_name, load_spec, resolve_config, run_hash
from harness.errors import HarnessError
from harness.config.presets import scale_overrides


@dataclass
class RunTask:
    """Everything a worker needs to run one (variant, seed): plain data, picklable."""

    ablation: str
    scale: str
    variant: str
    seed: int
    config: dict[str, Any]
    config_hash: str
    total_iterations: int
    experiment_id: str = ""
    parent_run_id: str = ""
    tracking_uri: str = ""
    out_root: str = ""
    git_sha: str = "unknown"
    attempt: int = 1

    @property
    def key(self) -> str:
        """``variant/s<seed>``: the display and bookkeeping key."""
        return f"{self.variant}/s{self.seed}"


def plan_runs(spec: AblationSpec, scale: str, seeds: Optional[list[int]] = None) -> list[RunTask]:
    """One :class:`RunTask` per (variant run at ``scale``, seed), variants in spec order, seeds ascending; a variant's
    run seeds are the planned seeds plus its ``seed_offset`` (0 unless the spec sets one)."""
    seeds = sorted(set(seeds)) if seeds else spec.seeds_for(scale)
    if any(s < 0 for s in seeds):
        raise HarnessError(f"--seeds: seeds must be ≥ 0, got {seeds}")
    tasks = []
    for variant in spec.variants_for(scale):
        for seed in (s + spec.seed_offset.get(variant, 0) for s in seeds):
            cfg = resolve_config(spec, scale, variant, seed)
            tasks.append(RunTask(ablation=spec.name or "", scale=scale, variant=variant, seed=seed, config=cfg.to_dict(),
                                 config_hash=run_hash(cfg), total_iterations=cfg.ppo.total_iterations))
    return tasks


@dataclass
class ResumeState:
    """What the store already holds for a plan."""

    finished: dict[str, str] = field(default_factory=dict)  # key -> run_id (latest FINISHED, same hash)
    finished_tags: dict[str, dict[str, str]] = field(default_factory=dict)  # key -> that run's tags
    # key -> the key's older FINISHED runs (run_id, tags), newest first: one may stand in when the latest is of
    # another build (accept_for_training)
    older: dict[str, list[tuple[str, dict[str, str]]]] = field(default_factory=dict)
    running: dict[str, str] = field(default_factory=dict)  # key -> run_id (RUNNING in a live process)
    marked_stale: list[tuple[str, str]] = field(default_factory=list)

    def finished_runs(self, key: str) -> list[tuple[str, dict[str, str]]]:
        """The FINISHED runs of ``key`` as ``(run_id, tags)``, newest first (the latest, then ``older``); empty when
        none finished."""
        if key not in self.finished:
            return []
        return [(self.finished[key], self.finished_tags[key]), *self.older.get(key, [])]


def resume_state(client: Any, exp_id: str, tasks: list[RunTask], mark_stale: bool = True) -> ResumeState:
    """Mark runs of killed processes FAILED, then find which planned runs are already FINISHED
    (same scale and ``config_hash``, any earlier invocation) or RUNNING elsewhere. A FINISHED run of
    the same config at another scale of this ablation is not counted here: :func:`reuse_finished_runs`
    copies it in, so that each scale's report holds all of its runs. ``mark_stale=False`` reads only
    (a dry run)."""
    from harness.infra.tracking import iter_children, mark_stale_runs, search_all

    state = ResumeState(marked_stale=mark_stale_runs(client, exp_id) if mark_stale else [])
    want = {(t.variant, str(t.seed), t.config_hash, t.scale): t.key for t in tasks}
    for run in iter_children(search_all(client, [exp_id])):  # newest first
        tags = run.data.tags
        key = want.get((tags.get("variant"), tags.get("seed"), tags.get("config_hash"), tags.get("scale")))
        if key is None:
            continue
        if run.info.status == "FINISHED":
            if key not in state.finished:
                state.finished[key], state.finished_tags[key] = run.info.run_id, dict(tags)
            else:
                state.older.setdefault(key, []).append((run.info.run_id, dict(tags)))
        elif run.info.status == "RUNNING":
            state.running.setdefault(key, run.info.run_id)
    for key in state.finished:
        state.running.pop(key, None)
    return state


def reusable_candidates(c: Any, exp_id: str, tasks: list[RunTask]) -> dict[str, list[tuple[str, Any]]]:
    """Every FINISHED run that could stand in for each of ``tasks``, newest first: same config hash (the same
    resolved config and seed, so the same training), from other ablations at any scale, or from this ablation at
    another scale (e.g. the default config is the baseline of most ablations, and the ``full`` scale repeats the
    ``default`` one's runs). Originals only (never a copy). One search of the store, however many tasks.

    Returns:
        ``{task key: [(source experiment name, source mlflow Run), ...]}``, newest first; keys without a
        candidate are absent.
    """
    from harness.infra.tracking import iter_children, search_all

    by_hash: dict[str, list[RunTask]] = {}
    for t in tasks:
        by_hash.setdefault(t.config_hash, []).append(t)
    ablations = {e.experiment_id: e.name for e in c.search_experiments() if e.name.startswith("ablation/")}
    found: dict[str, list[tuple[str, Any]]] = {}
    if not by_hash or not ablations:
        return found
    for run in iter_children(search_all(c, list(ablations), "attributes.status = 'FINISHED'")):  # newest first
        if run.data.tags.get("copied_from"):
            continue
        waiting = by_hash.get(run.data.tags.get("config_hash", ""), [])
        if not waiting or (run.info.experiment_id == exp_id and run.data.tags.get("scale") == waiting[0].scale):
            continue
        for t in waiting:
            found.setdefault(t.key, []).append((ablations[run.info.experiment_id], run))
    return found


def find_reusable(c: Any, exp_id: str, tasks: list[RunTask],
                  accept: Optional[Callable[[dict[str, str]], bool]] = None,
                  candidates: Optional[dict[str, list[tuple[str, Any]]]] = None,
                  finished: Optional[Mapping[str, Mapping[str, str]]] = None) -> dict[str, tuple[str, Any]]:
    """The FINISHED run that stands in for each of ``tasks``: one of :func:`reusable_candidates` whose tags ``accept``
    takes (default: any; the driver passes :func:`seeds_on_build` for this machine's build).
    A seed's arms are compared on one build (:func:`harness.experiments.builds.pool_builds`), so where a task has
    candidates of several builds, each seed's copies come from one build (:func:`seed_builds`: the one covering the
    most of that seed's arms, counting its ``finished`` runs here, ``{task key: tags}``, other than ``tasks``' own),
    each the newest of that build; a task without a candidate of that build takes its newest. ``candidates``, when
    given, is :func:`reusable_candidates`' answer for (a superset of) ``tasks``, so the store is not searched again.

    Returns:
        ``{task key: (source experiment name, source mlflow Run)}``.
    """
    if candidates is None:
        candidates = reusable_candidates(c, exp_id, tasks)
    options = {t.key: [(source, run) for source, run in candidates.get(t.key, [])
                       if accept is None or accept(run.data.tags)] for t in tasks}
    here = {k: tags for k, tags in (finished or {}).items() if k not in options}  # a task's own run is being replaced
    prefer = seed_builds(tasks, {k: [run.data.tags for _, run in v] for k, v in options.items()}, here)
    found: dict[str, tuple[str, Any]] = {}
    for t in tasks:
        opts = options[t.key]
        if opts:
            found[t.key] = next((o for o, b in zip(opts, prefer.get(t.key, [])) if b), opts[0])
    return found


def seed_builds(tasks: list[RunTask], options: Mapping[str, list[Mapping[str, str]]],
                finished: Mapping[str, Mapping[str, str]]) -> dict[str, list[bool]]:
    """Which of each task's candidate runs (``options``: task key → their tags, newest first) are of the build its
    seed's arms should share: per seed, the build (:func:`harness.experiments.builds.build_ids` over that seed's
    candidates and ``finished`` runs) that covers the most of its tasks and finished keys, ties to the build of its
    first task's newest candidate. Returns ``{task key: [whether each candidate is of that build]}`` (keys without
    candidates absent).

    Example: seed 0 with arm ``a``'s candidates on builds ``[x, y]`` and arm ``b``'s on ``[y]`` → build ``y``:
    ``{"a/s0": [False, True], "b/s0": [True]}``."""
    from harness.experiments.builds import build_ids, tags_frame

    out: dict[str, list[bool]] = {}
    by_seed: dict[str, list[RunTask]] = {}
    for t in tasks:
        if options.get(t.key):
            by_seed.setdefault(str(t.seed), []).append(t)
    for seed, group in by_seed.items():
        pairs = [(t.key, tags) for t in group for tags in options[t.key]]  # candidates first, in task order
        done = [(key, tags) for key, tags in finished.items() if tags.get("seed") == seed]
        ids = list(build_ids(tags_frame([tags for _, tags in pairs + done])))
        cover: dict[str, set[str]] = {}
        for (key, _), build in zip(pairs + done, ids):
            cover.setdefault(build, set()).add(key)
        best = max(cover, key=lambda b: (len(cover[b]), b == ids[0]))
        for (key, _), build in zip(pairs, ids):
            out.setdefault(key, []).append(build == best)
    return out


def restore_sources(c: Any, name: str, hashes: "set[str]", reports: Optional[Path] = None,
                    warn: Optional[Callable[[str], None]] = None) -> dict[str, int]:
    """Restore, from the archives of the *other* ablations, those that hold an original FINISHED run (not a copy)
    of one of ``hashes`` (config hashes ablation ``name`` plans to run), each whole (:func:`restore_runs` into its own
    experiment ``ablation/<other>``), so that a new machine copies such a run in (:func:`harness.experiments.plan.find_reusable`)
    instead of training it again: e.g. the baseline that several ablations share, archived with the first of them.
    An archive that fails validation is skipped with one line to ``warn`` (its own ablation refuses it when run).

    Args:
        c: the store.
        name: the ablation being run (its own archive is :func:`restore_runs`' business, and is skipped here).
        hashes: the config hashes of its planned runs; none → nothing is read.
        reports: the reports directory (default: the configured one).
        warn: where the line about a skipped archive goes (default: dropped).
    Returns:
        ``{other ablation: runs restored}``, for the archives that held a match (0 where the store had them all).
    """
    from harness.config.base import default_reports_dir
    from harness.experiments.archive import restore_runs
    from harness.infra.tracking import experiment_id, results_root

    root = Path(reports or default_reports_dir())
    restored: dict[str, int] = {}
    if not hashes or not root.is_dir():
        return restored
    index = ArchiveIndex(results_root() / ARCHIVE_INDEX)
    for folder in sorted(root.glob("*/archive")):
        other = folder.parent.name
        if other == name:
            continue
        try:  # read, not yet validated: restore_runs validates the archive it restores
            entries = [index.entry(path) for path in sorted(folder.glob("*.json.gz"))]  # all: the cache stays whole
            match = any(status == "FINISHED" and config_hash in hashes and not copied
                        for status, config_hash, copied in entries)
            if match:
                restored[other] = restore_runs(c, experiment_id(c, experiment_name(other)), other, root)
        except (HarnessError, KeyError, AttributeError) as e:
            if warn:
                warn(f"archive of {other} skipped while looking for runs to copy in: {' '.join(str(e).split())[:300]}")
    index.save()
    return restored


#: The local cache of what :func:`restore_sources` reads from each archive record (under the results root, ignored).
ARCHIVE_INDEX = "archive_index.json"


class ArchiveIndex:
    """What :func:`restore_sources` needs from an archive record (status, ``config_hash``, whether it is a copy),
    cached per file under the results root and read again when the file's size or modification time changed: the
    archives of all ablations hold thousands of records with their full metric histories, and decompressing them
    all took ~8-11 s of every driver invocation. A cache, never the truth: an unreadable or foreign index is
    ignored and rewritten; two drivers writing it at once lose at most each other's new entries."""

    def __init__(self, path: Path):
        import json

        self.path, self.fresh = path, {}
        try:
            loaded = json.loads(path.read_text())
            self.known = loaded if isinstance(loaded, dict) else {}
        except (OSError, ValueError):
            self.known = {}

    def entry(self, record_path: Path) -> tuple[Optional[str], Optional[str], bool]:
        """``(status, config_hash, copied)`` of the record at ``record_path``, from the cache when its size and
        mtime match, else read (:func:`harness.experiments.archive.read_record`).

        Raises:
            HarnessError: an unreadable record (not cached); KeyError / AttributeError: a record without tags."""
        from harness.experiments.archive import read_record

        st, key = record_path.stat(), str(record_path.resolve())
        hit = self.known.get(key)
        if isinstance(hit, list) and len(hit) == 3 and hit[:2] == [st.st_size, st.st_mtime_ns]:
            entry = tuple(hit[2])
        else:
            r = read_record(record_path)
            entry = (r.get("status"), r["tags"].get("config_hash"), bool(r["tags"].get("copied_from")))
        self.fresh[key] = [st.st_size, st.st_mtime_ns, list(entry)]
        return entry  # type: ignore[return-value]

    def save(self) -> None:
        """Write the cache, the entries read this time over the earlier ones, without the records gone since,
        atomically (the pipeline's writer: a temporary file and a rename); a failure is ignored."""
        from harness.pipeline.stage import _write_json_atomic

        keep = {k: v for k, v in {**self.known, **self.fresh}.items() if Path(k).is_file()}
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            _write_json_atomic(self.path, keep)
        except OSError:
            pass


def reuse_finished_runs(c: Any, exp_id: str, parent_id: str, tasks: list[RunTask],
                        accept: Optional[Callable[[dict[str, str]], bool]] = None,
                        candidates: Optional[dict[str, list[tuple[str, Any]]]] = None,
                        finished: Optional[Mapping[str, Mapping[str, str]]] = None) -> dict[str, tuple[str, str]]:
    """Copy in, as child runs of ``parent_id``, the runs :func:`find_reusable` finds for ``tasks`` (with ``accept``
    and, when given, the ``candidates`` already found and the tags of the ``finished`` runs here)
    (:func:`harness.infra.tracking.copy_run`, tagged with this ablation, scale, variant, seed and ``copied_from``).

    Returns:
        ``{task key: (source experiment name, source run id)}`` for the tasks now FINISHED here.
    """
    from harness.infra.tracking import copy_run

    copied: dict[str, tuple[str, str]] = {}
    tasks_by_key = {t.key: t for t in tasks}
    for key, (source, run) in find_reusable(c, exp_id, tasks, accept, candidates, finished).items():
        t = tasks_by_key[key]
        copy_run(c, run, exp_id, {"mlflow.parentRunId": parent_id, "mlflow.runName": f"{t.variant}-s{t.seed}",
                                  "ablation": t.ablation, "variant": t.variant, "seed": str(t.seed), "scale": t.scale})
        copied[key] = (source, run.info.run_id)
    return copied


def restore_archived(c: Any, exp_id: str, name: str, hashes: "set[str]",
                     warn: Optional[Callable[[str], None]] = None) -> dict[str, int]:
    """What an invocation of ablation ``name`` restores before it plans (:func:`harness.experiments.ablate.open_ablation`,
    and the dry run, so that both count alike on a new machine): the runs of its own archive that the store lacks
    (:func:`harness.experiments.archive.restore_runs` into ``exp_id``) and the archives of the other ablations that
    hold a FINISHED run of one of ``hashes`` (:func:`restore_sources`). One line per archive with runs restored goes to
    ``warn`` ("restored 3 run(s) of kl_placement from its archive", the others' lines saying why they were read), as
    do the lines of archives skipped.

    Returns:
        ``{ablation: runs restored}``, its own first, only those with runs restored.
    Raises:
        HarnessError: its own archive fails validation (named record; the others are skipped with a line to ``warn``).
    """
    from harness.experiments.archive import restore_runs

    own = {name: restore_runs(c, exp_id, name)}
    restored = {k: n for k, n in {**own, **restore_sources(c, name, hashes, warn=warn)}.items() if n}
    for source, n in restored.items():
        if warn:
            warn(f"restored {n} run(s) of {source} from its archive"
                 + ("" if source == name else ": it holds runs of this plan's configs"))
    return restored


def plan_ablation(name: str, scale: str = "default", seeds: Optional[list[int]] = None, reuse: bool = True,
                  variants: Optional[list[str]] = None, restore: bool = False,
                  echo: Optional[Callable[[str], None]] = None) -> dict[str, Any]:
    """A dry run of :func:`run_ablation`: what an invocation would do now (for ``variants`` only, when given: the
    arms a stage of ``--seeds auto`` runs, ``AblationSpec.claim_arms_for``). It writes no run (no parent
    run, no stale-run marking, no copies) and builds and starts nothing (no pipeline, no Ray); the
    store is created empty if it does not exist. With ``restore`` (``harness ablate --dry-run``) it first restores
    what the invocation would (:func:`restore_archived`: the ablation's archived runs and the other archives holding
    runs of its configs; one line each to ``echo``), so that a new machine's dry run counts as finished or to copy in
    the runs the invocation would not train. It tells this machine's build (:mod:`harness.experiments.builds`) only as far
    as the pipeline cache holds the stages the finished runs share: ``other_build`` lists the finished keys of the
    seeds with arms to train whose runs are all of another build than those (an invocation trains them again here,
    so that no seed's arms span builds); ``not_copied`` the keys whose runs to copy in are all of another build and
    whose seed has arms to train (an invocation trains them here instead: :func:`copies_of_this_build`);
    they are in ``train``, not in ``reusable``.

    Returns:
        ``{"ablation", "scale", "planned", "finished": [keys], "running": [keys], "reusable": {key:
        "experiment/run-id-prefix"}, "train": [keys], "sources": {experiment: count}, "other_build": [keys],
        "not_copied": [keys]}``; ``reusable`` is empty with ``reuse=False``.
    Raises:
        HarnessError: unknown ablation or scale, invalid spec (ConfigError).
    """
    from harness.infra import tracking
    from harness.experiments.builds import other_build_keys
    from harness.config.pipeline import PipelineConfig

    scale_overrides(scale)
    tasks = [t for t in plan_runs(load_spec(name), scale, seeds) if variants is None or t.variant in variants]
    c = tracking.init_store()
    if restore:
        restore_archived(c, tracking.experiment_id(c, experiment_name(name)), name, {t.config_hash for t in tasks}, warn=echo)
    exp = c.get_experiment_by_name(experiment_name(name))
    exp_id = exp.experiment_id if exp is not None else ""
    state = resume_state(c, exp_id, tasks, mark_stale=False) if exp_id else ResumeState()
    todo = [t for t in tasks if t.key not in state.finished and t.key not in state.running]
    found, refused, seeds = copies_of_this_build(c, exp_id, todo, state, reuse)
    sources: dict[str, int] = {}
    for source, _ in found.values():
        sources[source] = sources.get(source, 0) + 1
    return {"ablation": name, "scale": scale, "planned": len(tasks), "finished": sorted(state.finished),
            "running": sorted(state.running), "reusable": {k: f"{src}/{run.info.run_id[:8]}" for k, (src, run) in found.items()},
            "train": [t.key for t in todo if t.key not in found], "sources": sources,
            "other_build": sorted(other_build_keys(state, PipelineConfig().out_dir, seeds)), "not_copied": sorted(refused)}


def copies_of_this_build(c: Any, exp_id: str, todo: list[RunTask], state: "ResumeState",
                         reuse: bool) -> tuple[dict[str, tuple[str, Any]], set[str], set[int]]:
    """What the driver would copy in for ``todo`` (the planned runs not finished here): ``(found, refused, seeds)``,
    ``found`` the runs of other ablations of the same config (:func:`find_reusable`; none without ``reuse``), of the
    build of the stages cached here (:func:`harness.experiments.builds.cached_stages`) where their seed has arms to
    train here, as :func:`accept_for_training` lets the driver copy them; ``refused`` the keys whose only candidates
    are of another build while their seed has arms to train here (trained here instead); ``seeds`` the seeds with runs
    to train here (``refused`` ones included). Where a key has candidates of both builds, the one of this machine's
    build is copied, not the newest."""
    from harness.experiments.builds import cached_stages
    from harness.config.pipeline import PipelineConfig

    if not (reuse and todo):
        return {}, set(), {t.seed for t in todo}
    candidates = reusable_candidates(c, exp_id, todo)
    anywhere = find_reusable(c, exp_id, todo, candidates=candidates, finished=state.finished_tags)
    seeds = {t.seed for t in todo if t.key not in anywhere}
    machine = cached_stages(list(state.finished_tags.values()) + [run.data.tags for _, run in anywhere.values()],
                            PipelineConfig().out_dir)
    found = find_reusable(c, exp_id, todo, seeds_on_build(seeds, machine), candidates, state.finished_tags)
    return found, set(anywhere) - set(found), seeds


def seeds_on_build(seeds: "set[int]", machine: Mapping[str, tuple[str, str]]) -> Callable[[Mapping[str, str]], bool]:
    """The rule by which a recorded run (its MLflow tags) may stand beside the runs trained here: a run of a seed in
    ``seeds`` (those with arms to train here) only if it is of this machine's build (``machine``:
    :func:`harness.experiments.builds.run_matches`), a run of any other seed whatever its build, so that no seed's
    arms span builds. The driver (:func:`accept_for_training`) and the planner (:func:`copies_of_this_build`) share it.

    Example: seeds ``{3}``, machine ``{"gold": ("g", "x1")}``: a seed-3 run with ``pipeline.gold=g, digest.gold=y1``
    is refused; a seed-3 run with ``digest.gold=x1``, or a seed-7 run with ``y1``, is taken."""
    from harness.experiments.builds import run_matches

    wanted = {str(s) for s in seeds}
    return lambda tags: tags.get("seed") not in wanted or run_matches(tags, machine)


def accept_for_training(c: Any, exp_id: str, tasks: list[Any], todo: list[Any], state: Any, reuse: bool, console: Any,
                        build_pipelines: Callable[[list[Any]], list[dict[str, Any]]],
                        candidates: Optional[dict[str, list[tuple[str, Any]]]] = None) -> Callable[[dict[str, str]], bool]:
    """Which recorded runs may stand beside the runs this machine trains: a predicate on a run's tags, for the
    finished runs of the plan (``state``, :func:`resume_state`) and the runs to copy in. Builds are pooled
    (:mod:`harness.experiments.builds`): a run of any build is accepted, except where its seed has arms left to train here;
    then the pipelines are built first (``build_pipelines``: :func:`harness.experiments.ablate._build_pipelines`, which returns
    their summaries) and that seed's runs are accepted only if their shared stages have this machine's weights
    (:func:`harness.experiments.builds.run_matches`), so that no seed's arms span builds. Where the latest finished run of such a
    key is refused, the newest of its older FINISHED runs (``state.older``) that is accepted stands in for it
    (``state.finished`` and ``finished_tags`` are updated); the finished runs with none are named, to be trained again
    here. With nothing to train, every run is accepted (no pipeline is built). ``candidates``
    (:func:`reusable_candidates` for ``todo`` or more), when given, spares a search of the store; the driver passes
    the same ones on to the copy.

    Raises:
        whatever ``build_pipelines`` raises (e.g. :class:`harness.errors.DataCacheError`)."""
    from harness.experiments.builds import machine_stages

    found = find_reusable(c, exp_id, todo, candidates=candidates) if reuse and todo else {}
    train = [t for t in todo if t.key not in found]
    if not train:
        return lambda tags: True
    accept = seeds_on_build({t.seed for t in train}, machine_stages(build_pipelines(train)))

    for key in list(state.finished):
        mine = next(((rid, tags) for rid, tags in state.finished_runs(key) if accept(tags)), None)
        if mine is not None:  # the newest acceptable run (an older one of this build stands in for one of another)
            state.finished[key], state.finished_tags[key] = mine
        else:
            console.print(f"[yellow]set aside[/] {key}: run {state.finished[key][:8]} is of another build of the "
                          "pipeline and its seed has arms to train here (a seed's arms are compared on one build); "
                          "training it again here")
    for key, (source, run) in found.items():
        if not accept(run.data.tags):
            console.print(f"[yellow]not copied[/] {key}: run {run.info.run_id[:8]} of {source} is of another build and "
                          "its seed has arms to train here (an older run of this build may stand in; else it is trained here)")
    return accept


__all__ = ["RunTask", "ResumeState", "plan_runs", "resume_state", "reusable_candidates", "find_reusable", "seed_builds",
           "restore_sources", "restore_archived", "reuse_finished_runs", "plan_ablation", "copies_of_this_build",
           "seeds_on_build", "accept_for_training"]
