"""Whether this machine builds the pipeline an ablation's recorded runs were trained on (``harness build-check NAME``).

The driver trains a run here only beside runs of this machine's build (:mod:`harness.experiments.builds`): where this CPU's math
libraries build the shared stages (gold scorer, reward model of human ratings, draw 0's SFT policy) with other
weights under the same keys, every recorded run of the ablation is set aside and trained again, and a paused
ablation's next look costs its earlier looks too. That is known only once the stages are built, and the gold scorer
alone takes minutes; so this check builds draw 0's pipeline of the ablation's baseline, stage by stage, compares each
shared stage's weight digest with the one the counted runs recorded as soon as it exists, and stops at the first
that differs. What it builds is cached, so a driver started afterwards on a matching machine builds nothing twice.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from harness.errors import HarnessError


@dataclass
class BuildCheck:
    """The outcome of :func:`check_build`.

    Attributes:
        name, scale: the ablation and scale checked.
        runs: FINISHED runs of the counted build (the report's runs); 0 when none is recorded.
        cpu_hours: their summed wall time in hours (a run takes one core), what training them again costs.
        expected: ``{stage: (key, digest)}`` the counted runs share (:func:`harness.experiments.builds.counted_stages`).
        agree: the shared stages this machine built or loaded with the runs' digest, in build order.
        differs: ``(stage, key, this machine's digest, the runs' digest)`` of the first that differs, else None.
        unbuilt: shared stages the baseline's draw-0 pipeline did not reach under the runs' key (not compared).
    """

    name: str
    scale: str
    runs: int = 0
    cpu_hours: float = 0.0
    expected: dict[str, tuple[str, str]] = field(default_factory=dict)
    agree: list[str] = field(default_factory=list)
    differs: Optional[tuple[str, str, str, str]] = None
    unbuilt: list[str] = field(default_factory=list)

    @property
    def matches(self) -> bool:
        """True when no compared stage differs (also when there are no runs to compare with)."""
        return self.differs is None

    def text(self) -> str:
        """What the check found and what it means for extending the ablation here, in a few lines."""
        where = f"{self.name} ({self.scale})"
        if not self.runs:
            return f"{where}: no FINISHED runs recorded, nothing to compare with; any machine can start it"
        if not self.expected:
            return (f"{where}: the {self.runs} FINISHED runs recorded no shared stage digests (runs of an older harness): "
                    "nothing to compare with")
        if self.differs is not None:
            stage, key, ours, theirs = self.differs
            same = f" ({', '.join(self.agree)} agree)" if self.agree else ""
            return (f"{where}: DIFFERS at {stage} (key {key}): this machine builds {ours}, the {self.runs} counted runs "
                    f"have {theirs}{same}.\nRunning `harness ablate {self.name}` here sets aside all {self.runs} of them "
                    f"and trains them again (~{self.cpu_hours:.1f} CPU-hours) before any new seed: another build is "
                    "another gold scorer (harness.experiments.builds). The stages after it were not built.")
        text = (f"{where}: MATCHES: {', '.join(f'{st} {self.expected[st][1]}' for st in self.agree)} as in the "
                f"{self.runs} counted runs; their runs stand beside the runs trained here")
        if self.unbuilt:
            text += (f"\n(not compared: {', '.join(self.unbuilt)}, which the baseline's draw-0 pipeline does not build "
                     "under the runs' key)")
        return text


class _Differs(Exception):
    """Raised by :func:`check_build`'s stage check to stop the build at the first stage that differs."""


def check_build(name: str, scale: str = "default",
                build: Optional[Callable[..., Any]] = None) -> BuildCheck:
    """Compare the weights this machine builds for ablation ``name`` with those its counted runs were trained on.

    Reads the runs the report counts (:func:`harness.reporting.runs.load_runs`, archived runs restored first; FINISHED
    runs of the one build :func:`harness.experiments.builds.choose_build` picks), takes the stages they all share with their key
    and digest, and builds (or loads from the cache) draw 0's pipeline of the baseline at ``scale`` with a check
    on every stage: a shared stage under the runs' key with another digest stops the build there.

    Args:
        build: the pipeline builder (default :func:`harness.pipeline.build_pipeline`; called as
            ``build(cfg, defer=True, check=…)``).
    Returns:
        :class:`BuildCheck`.
    Raises:
        HarnessError: unknown ablation or scale; no invocation of ``name`` recorded.
        DataCacheError: the data cache is missing (names ``harness data``).
    """
    from harness.reporting import runs as report_runs
    from harness.experiments.spec import load_spec, resolve_config
    from harness.experiments.builds import counted_stages

    spec = load_spec(name)
    cfg = resolve_config(spec, scale, spec.baseline, 0)  # an unknown scale fails here, before anything is read
    done = report_runs.load_runs(name, scale=scale, history_prefixes=()).runs  # the counted runs: FINISHED, one build
    out = BuildCheck(name, scale, runs=int(len(done)))
    if done.empty:
        return out
    out.cpu_hours = float(((done["end_time"] - done["start_time"]).dt.total_seconds()).sum() / 3600)
    out.expected = counted_stages(done)
    if not out.expected:
        return out
    by_key = {key: (stage, digest) for stage, (key, digest) in out.expected.items()}

    def check(label: str, record: dict) -> None:
        if record.get("key") not in by_key:
            return
        stage, digest = by_key[record["key"]]
        if record.get("weights_sha256") != digest:
            out.differs = (stage, str(record["key"]), str(record.get("weights_sha256")), digest)
            raise _Differs()
        out.agree.append(stage)

    if build is None:
        from harness.pipeline import build_pipeline as build
    try:
        build(cfg, defer=True, check=check)
    except _Differs:
        return out
    out.unbuilt = [st for st in out.expected if st not in out.agree]
    if not out.agree:
        raise HarnessError(f"{name} ({scale}): the baseline's draw-0 pipeline builds none of the stages its runs share "
                           f"({', '.join(out.expected)}) under their keys: the spec changed since they ran")
    return out


__all__ = ["BuildCheck", "check_build"]
