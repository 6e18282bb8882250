"""Whether the ops a fused hook computes the bits of would run at their own call sites.

A fused hook (``hc_boundary``, ``accept_greedy_epilogue``) produces the bits of other call
sites' ops (its parts): where one of them would not run, SGLang's steps must, so the hook
declines too.
"""

from __future__ import annotations

from dsv41_kernels import sglang_plugin
from dsv41_kernels.admission import Admission, refuse
from dsv41_kernels.sglang_plugin import dispatch
from dsv41_kernels.sglang_plugin.policy import SITE_SWITCH, policy_refusal


def parts_refusal(parts: dict[str, str], rows) -> Admission | None:
    """The refusal when an op whose bits a fused hook produces (or whose launch a schedule
    relies on) would not be what runs at its own call site for ``rows``: its switch off or not
    installed, its hook off after an error, or the GPU's policy declining it. ``parts`` maps
    each such policy site to its hook's name."""
    installed = sglang_plugin.status()  # None: installed by hand, every site taken as on
    failed = dispatch.failed_hooks()
    for part, hook in parts.items():
        switch = SITE_SWITCH[part]
        state = "on" if installed is None else installed.get(switch, "off (not registered)")
        if state != "on":
            return refuse(f"{switch} switched {state}")
        if hook in failed:
            return refuse(f"{part} is off after an error")
        slower = policy_refusal(part, rows)
        if slower is not None:
            return refuse(f"{part}: {slower.reason}")
    return None
