"""SGLang plugin: puts dsv41-kernels on the DeepSeek-V4.1 / DSpark call sites of SGLang.

SGLang (0.5.12.post1 and later) calls every function registered under the entry-point group
``sglang.srt.plugins`` in each of its processes, then applies the hooks they registered with
its ``HookRegistry``. :func:`register` is that function: it registers the AROUND (and AFTER)
hooks of each call site, each taking our op when the op's admission accepts the arguments and
otherwise calling SGLang's original function unchanged. This package is the only code in
dsv41-kernels that imports SGLang.

Call sites, each switched by the name of the op it puts there (the hooks' module has the same
name): ``accept_greedy`` (DSpark's greedy accept), ``moe_fused_gate`` (vision routing),
``hc_combine_norm`` (mHC combine+norm with the MXFP8 epilogue; on SM90 also the next FP8
linear's input groups in its launch: ``hc_combine_norm_quant_fp8``), ``decoding_sched_meta``
(FlashMLA scheduler metadata), ``hc_mix_stats`` (mHC mixing statistics and their derived
weights), ``inverse_rope_quant_fp8`` (the attention output's inverse RoPE and FP8 quantization
before the FP8 ``wo_a`` on Hopper), ``hc_boundary`` (the mHC post with the next statistics and
combine+norm in one launch, or, where SGLang runs the statistics on its side stream, the post
and combine+norm in one launch: ``hc_post_combine_norm``; on SM90 also the next FP8 linear's
input groups in the boundary's launch: ``hc_boundary_quant_fp8`` and
``hc_post_combine_norm_quant_fp8``), ``hc_stats_stream``
(SGLang's stats stream for an SM90 verify step: not an op, a schedule; off until measured),
``rmsnorm_quant_fp8`` (the
attention's Q-side RMSNorm and the FP8 groups of ``wq_b``'s input on Hopper in one launch),
``accept_greedy_epilogue`` (DSpark's static verify epilogue: the accept and its tail in one
launch), ``sharded_accept_greedy``
(DSpark's verify logits at TP > 1 left sharded for a greedy step; off until run on several
GPUs).

Whether a hook takes a call is decided twice: the op's admission says whether ours can run on
these arguments, the GPU's policy (:mod:`.policy`, written by ``dsv41-kernels calibrate``)
whether it should; on a GPU without a policy every hook declines. The start-up line names the
policy used (file, GPU, date) or says that none matched and what to run.

``DSV41_KERNELS_DISABLE`` turns call sites off: a comma-separated subset of the names above,
or ``all`` (the names the switches had before are still taken: :mod:`.switches`). Each
process reports one line saying what is on and what is off, and why: through logging when it
is set up to show INFO, else straight to stderr (SGLang loads plugins before it configures
logging, where Python's last-resort handler would drop an INFO line). A call site whose SGLang
target is missing (another SGLang release) is reported as off and left untouched; nothing here
raises during start-up.

:func:`fire_counts` says, per hook, how many calls took our op and how many went to SGLang's
function and why (:mod:`.dispatch`); ``DSV41_KERNELS_REPORT=1`` prints them at exit.
"""

from __future__ import annotations

import importlib
import logging
import os
import pkgutil
import sys
from collections.abc import Mapping
from dataclasses import dataclass

from dsv41_kernels.sglang_plugin.dispatch import arm_exit_report, failed_hooks, fire_counts
from dsv41_kernels.sglang_plugin.policy import startup_note
from dsv41_kernels.sglang_plugin.switches import DISABLE_ENV, FORCE_ENV, forced, switch_names

__all__ = ["fire_counts", "failed_hooks", "register", "status"]

logger = logging.getLogger(__name__)

TESTED_SGLANG = "0.5.23"


@dataclass(frozen=True)
class Site:
    """A call site: its switch name, the module holding its hooks, what it does."""

    switch: str
    module: str
    summary: str


SITES = (
    Site(
        "accept_greedy",
        f"{__name__}.accept_greedy",
        "DSpark greedy accept -> exact row_argmax / accept_greedy",
    ),
    Site(
        "moe_fused_gate",
        f"{__name__}.moe_fused_gate",
        "vision routing -> moe_fused_gate with packed ids",
    ),
    Site(
        "hc_combine_norm",
        f"{__name__}.hc_combine_norm",
        "mHC combine+norm -> hc_combine_norm(_mxfp8)",
    ),
    Site(
        "decoding_sched_meta",
        f"{__name__}.decoding_sched_meta",
        "FlashMLA scheduler metadata -> decoding_sched_meta",
    ),
    Site(
        "hc_mix_stats",
        f"{__name__}.hc_mix_stats",
        "mHC mixing statistics -> hc_mix_stats",
    ),
    Site(
        "inverse_rope_quant_fp8",
        f"{__name__}.inverse_rope_quant_fp8",
        "attention output RoPE + FP8 quant -> inverse_rope_quant_fp8",
    ),
    Site(
        "hc_boundary",
        f"{__name__}.hc_boundary",
        "mHC boundary: post + next statistics + next combine+norm -> hc_boundary "
        "(statistics on SGLang's stats stream: post + combine+norm -> hc_post_combine_norm)",
    ),
    Site(
        "hc_stats_stream",
        f"{__name__}.hc_stats_stream",
        "mHC statistics of an SM90 verify step on SGLang's stats stream, beside the sublayer",
    ),
    Site(
        "rmsnorm_quant_fp8",
        f"{__name__}.rmsnorm_quant_fp8",
        "Q-side norm + FP8 groups on Hopper -> rmsnorm_quant_fp8",
    ),
    Site(
        "accept_greedy_epilogue",
        f"{__name__}.accept_greedy_epilogue",
        "DSpark static verify epilogue: accept + tail -> accept_greedy_epilogue",
    ),
    Site(
        "sharded_accept_greedy",
        f"{__name__}.sharded_accept_greedy",
        "DSpark verify at TP > 1 -> sharded_accept_greedy: a key per row gathered, not logits",
    ),
)
SWITCHES = tuple(site.switch for site in SITES)

_registered: dict[str, str] | None = None


def disabled_switches(value: str) -> tuple[frozenset[str], tuple[str, ...]]:
    """Parse ``DSV41_KERNELS_DISABLE``: (switches turned off, unknown names given)."""
    names = switch_names(value)
    if "all" in names:
        return frozenset(SWITCHES), tuple(sorted(names - {"all", *SWITCHES}))
    return frozenset(names & set(SWITCHES)), tuple(sorted(names - set(SWITCHES)))


def unresolved(targets) -> list[str]:
    """The dotted SGLang paths among ``targets`` that do not resolve, each with the reason."""
    missing = []
    for target in targets:
        try:
            pkgutil.resolve_name(target)
        except Exception as e:  # ImportError, AttributeError, or whatever the import raises
            missing.append(f"{target} ({type(e).__name__})")
    return missing


def install(environ: Mapping[str, str]) -> dict[str, str]:
    """Register the hooks of every call site that is switched on and resolves.

    Returns ``{switch: "on" | "off (reason)"}`` and logs it as one line. Hooks are only
    registered here; SGLang's ``load_plugins()`` applies them right after.
    """
    from sglang.srt.plugins.hook_registry import HookRegistry

    disabled, unknown = disabled_switches(environ.get(DISABLE_ENV, ""))
    status: dict[str, str] = {}
    registered = set()  # (target, hook): a hook two sites share is registered once
    for site in SITES:
        if site.switch in disabled:
            status[site.switch] = f"off ({DISABLE_ENV})"
            continue
        try:
            hooks = importlib.import_module(site.module)
        except Exception as e:
            status[site.switch] = f"off (cannot import its SGLang names: {type(e).__name__}: {e})"
            continue
        missing = unresolved([target for target, _, _ in hooks.HOOKS] + list(hooks.REQUIRES))
        if missing:
            status[site.switch] = f"off (missing in this SGLang: {', '.join(missing)})"
            continue
        for target, hook, hook_type in hooks.HOOKS:
            if (target, hook) not in registered:
                registered.add((target, hook))
                HookRegistry.register(target, hook, hook_type)
        status[site.switch] = "on"
    announce(report_line(status, unknown))
    return status


def announce(line: str) -> None:
    """``line`` at INFO where logging would show it, else on stderr."""
    if logger.isEnabledFor(logging.INFO) and logger.hasHandlers():
        logger.info(line)
    else:
        print(line, file=sys.stderr, flush=True)


def report_line(status: Mapping[str, str], unknown=()) -> str:
    """The start-up line: which call sites are on, which are off and why."""
    from dsv41_kernels import __version__

    try:
        from importlib.metadata import version

        sglang_version = version("sglang")
    except Exception:
        sglang_version = "unknown"
    on = [name for name, state in status.items() if state == "on"]
    off = [f"{name} {state[len('off ') :]}" for name, state in status.items() if state != "on"]
    line = (
        f"dsv41-kernels {__version__} on sglang {sglang_version} (tested {TESTED_SGLANG}): "
        f"on: {', '.join(on) or '-'}; off: {'; '.join(off) or '-'}"
    )
    line += f"; {startup_note()}"
    lifted = [name for name in on if forced(name)]
    if lifted:
        line += f"; {FORCE_ENV} lifts the policy for {', '.join(lifted)}"
    if unknown:
        line += f"; ignored unknown {DISABLE_ENV} names: {', '.join(unknown)}"
    return line


def register() -> None:
    """The ``sglang.srt.plugins`` entry point; runs once per process, never raises."""
    global _registered
    if _registered is not None:
        return
    try:
        arm_exit_report(os.environ)
        _registered = install(os.environ)
    except Exception:
        _registered = {}
        logger.exception("dsv41-kernels: plugin not installed; SGLang runs unchanged")


def status() -> dict[str, str] | None:
    """What :func:`register` decided in this process (None before it ran)."""
    return None if _registered is None else dict(_registered)
