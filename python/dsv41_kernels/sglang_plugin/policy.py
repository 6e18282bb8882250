"""Whether a hook should take a call on this GPU: the calibrated policy.

The op's admission answers "can it run here?"; the policy answers "should it run here?": per
call site, the row ranges where ours measured faster than SGLang 0.5.23's own function by a
margin that held in every repeat, on one GPU. A policy is a JSON file (``dsv41-kernels
calibrate`` writes it; :mod:`dsv41_kernels.calibrate` decides it from timing records):

- ``key``: ``gpu`` (``torch.cuda.get_device_name()``), ``sm`` (``sm_90``), ``sm_count``,
  ``sglang``, ``dsv41_kernels``, ``torch``, ``cuda``. The first four must equal this machine's
  for the policy to apply: a policy of another GPU or another SGLang release never applies.
  A different dsv41-kernels, torch or CUDA version still applies (the kernels and SGLang's
  function are the same code) and the start-up line names each difference, with the advice to
  calibrate again;
- ``sites``: per call site (the op the hook runs, e.g. ``row_argmax`` under the switch
  ``accept_greedy``), ``series``: one per size of the site's second dimension (``columns``:
  ``inverse_rope_quant_fp8``'s local heads), else one with ``columns`` null; each with
  ``ours`` (inclusive ``[first, last]`` row ranges, ``last`` null for no bound), ``declined``
  (the other ranges, each with the measurement behind it) and ``measured`` (the figures);
- ``margin``, ``date``, ``source``: how and from what it was derived.

Where to find it, first match wins: ``DSV41_KERNELS_POLICY`` (a file, or a folder of them:
only that place is read when it is set), else the user cache (:data:`USER_DIR`, every
``*.json`` there; ``calibrate`` writes ``policy-<gpu>-<sm>-<sms>sm-sglang<version>.json``),
else the policies this package ships (``policies/``). Among several matching files of one
place the latest ``date`` wins. A GPU that none matches gets no hook at all:
every call declines with :func:`not_measured`'s reason. ``DSV41_KERNELS_FORCE`` lifts the
policy for the switches it names. Calls on tensors off a CUDA device (the CPU tier, the
Triton interpreter) are no GPU's to decide: the policy lets the op's admission decide there.
"""

from __future__ import annotations

import functools
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from dsv41_kernels.admission import Admission, refuse
from dsv41_kernels.devices import cuda_index
from dsv41_kernels.jit import CACHE
from dsv41_kernels.sglang_plugin.switches import forced

logger = logging.getLogger(__name__)

POLICY_ENV = "DSV41_KERNELS_POLICY"
USER_DIR = CACHE / "policies"
"""The user's calibrations: ``$DSV41_KERNELS_CACHE/policies``, by default
``~/.cache/dsv41-kernels/policies``."""
BUILT_IN_DIR = Path(__file__).resolve().parent / "policies"
FORMAT = 1
HARD_KEYS = ("gpu", "sm", "sm_count", "sglang")
"""Key fields that must equal the machine's: another GPU or SGLang release never applies."""
SOFT_KEYS = ("dsv41_kernels", "torch", "cuda")
"""Key fields that may differ: the policy applies, the start-up line names the difference."""
SITE_SWITCH = {
    "accept_greedy": "accept_greedy",
    "row_argmax": "accept_greedy",
    "moe_fused_gate": "moe_fused_gate",
    "hc_combine_norm": "hc_combine_norm",
    "hc_combine_norm_quant_fp8": "hc_combine_norm",
    "decoding_sched_meta": "decoding_sched_meta",
    "hc_mix_stats": "hc_mix_stats",
    "inverse_rope_quant_fp8": "inverse_rope_quant_fp8",
    "hc_boundary": "hc_boundary",
    "hc_post_combine_norm": "hc_boundary",
    "hc_boundary_quant_fp8": "hc_boundary",
    "hc_post_combine_norm_quant_fp8": "hc_boundary",
    "hc_stats_stream": "hc_stats_stream",
    "accept_greedy_epilogue": "accept_greedy_epilogue",
    "rmsnorm_quant_fp8": "rmsnorm_quant_fp8",
    "sharded_accept_greedy": "sharded_accept_greedy",
}
"""Each call site a policy decides (the op its hook runs) and the switch it belongs to."""
COLUMNS = {"inverse_rope_quant_fp8": "local heads"}
"""Sites whose second dimension decides too, and what it counts."""
CALIBRATE = "run `dsv41-kernels calibrate`"
MEASURED_SLOWER = "measured slower than SGLang 0.5.23 here"
"""How every refusal of a policy begins."""


def not_measured(gpu: str) -> str:
    return f"not measured on {gpu}; {CALIBRATE}"


@dataclass(frozen=True)
class Series:
    columns: int | None
    ours: tuple[tuple[int, int | None], ...]
    declined: tuple[tuple[int, int | None, str], ...]

    def refusal(self, rows: int) -> str | None:
        """The reason ``rows`` declines, None where ours runs."""
        for first, last in self.ours:
            if first <= rows and (last is None or rows <= last):
                return None
        for first, last, why in self.declined:
            if first <= rows and (last is None or rows <= last):
                return why
        return f"no range of the policy holds {rows} rows"


@dataclass(frozen=True)
class Policy:
    key: dict
    date: str
    margin: float
    path: str
    sites: dict  # site -> tuple[Series, ...], sorted by columns

    def refusal(self, site: str, rows: int, columns: int | None = None) -> Admission | None:
        """The policy's refusal of a call of ``site`` with ``rows`` (and ``columns``), else None."""
        series = self.sites.get(site)
        if not series:
            return _refusal(f"{site} {not_measured(self.key['gpu'])} (not in {self.path})")
        for why in _bracket(series, columns):
            reason = why.refusal(rows)
            if reason is not None:
                return _refusal(f"{MEASURED_SLOWER}: {reason}")
        return None

    def differences(self, machine: dict) -> list[str]:
        """The soft key fields that differ from ``machine``'s, as ``name X (calibrated Y)``."""
        return [
            f"{name} {machine.get(name)} (calibrated {self.key.get(name)})"
            for name in SOFT_KEYS
            if machine.get(name) is not None and str(self.key.get(name)) != str(machine[name])
        ]


@functools.lru_cache(maxsize=256)
def _refusal(reason: str) -> Admission:
    return refuse(reason)


def _bracket(series: tuple[Series, ...], columns: int | None) -> tuple[Series, ...]:
    """The series that decide ``columns``: its own; between two measured sizes both of them;
    beyond the measured sizes the nearest."""
    if len(series) == 1 or columns is None:
        return series[:1] if columns is None or series[0].columns is None else series
    for s in series:
        if s.columns == columns:
            return (s,)
    below = [s for s in series if s.columns < columns]
    above = [s for s in series if s.columns > columns]
    return tuple(filter(None, (below[-1] if below else None, above[0] if above else None)))


def parse(data: dict, path: str = "<policy>") -> Policy:
    """A policy from its JSON object; ``ValueError`` naming what is wrong."""
    if data.get("format") != FORMAT:
        raise ValueError(f"{path}: format {data.get('format')!r}, expected {FORMAT}")
    key = data.get("key") or {}
    missing = [name for name in HARD_KEYS if key.get(name) in (None, "")]
    if missing:
        raise ValueError(f"{path}: key lacks {', '.join(missing)}")
    sites = {}
    for site, entry in (data.get("sites") or {}).items():
        if site not in SITE_SWITCH:
            raise ValueError(f"{path}: unknown call site {site!r}")
        series = []
        for s in entry["series"]:
            ours = tuple((int(a), None if b is None else int(b)) for a, b in s["ours"])
            declined = tuple(
                (int(d["rows"][0]), None if d["rows"][1] is None else int(d["rows"][1]), d["why"])
                for d in s.get("declined", ())
            )
            series.append(Series(s.get("columns"), ours, declined))
        sites[site] = tuple(sorted(series, key=lambda s: -1 if s.columns is None else s.columns))
    return Policy(key, str(data.get("date", "")), float(data.get("margin", 0.0)), path, sites)


def load(path: Path) -> Policy:
    return parse(json.loads(Path(path).read_text()), str(path))


def applies(policy: Policy, machine: dict) -> bool:
    """Whether ``policy`` is this machine's: every hard key field equal."""
    return all(str(policy.key.get(name)) == str(machine.get(name)) for name in HARD_KEYS)


def _files(place: Path) -> list[Path]:
    if place.is_dir():
        return sorted(place.glob("*.json"))
    return [place] if place.is_file() else []


def places(environ=os.environ) -> list[tuple[str, Path]]:
    """Where policies are looked for, in order: ``(what, path)``."""
    if environ.get(POLICY_ENV):
        return [(POLICY_ENV, Path(environ[POLICY_ENV]).expanduser())]
    return [("user cache", USER_DIR), ("built-in", BUILT_IN_DIR)]


@dataclass(frozen=True)
class Found:
    """The outcome of a look-up: the policy (None: none matched) and what to say about it."""

    policy: Policy | None
    gpu: str
    note: str


def find(machine: dict, environ=os.environ) -> Found:
    """This machine's policy, from the first place that holds a matching one."""
    skipped = []
    for what, place in places(environ):
        matching = []
        for path in _files(place):
            try:
                policy = load(path)
            except (OSError, ValueError, KeyError, TypeError) as e:
                skipped.append(f"{path}: {type(e).__name__}: {e}")
                continue
            if applies(policy, machine):
                matching.append(policy)
        if matching:
            policy = max(matching, key=lambda p: p.date)
            return Found(policy, machine["gpu"], _used(policy, machine, what, skipped))
    tried = ", ".join(str(place) for _, place in places(environ))
    note = (
        f"policy: none for {machine['gpu']} {machine.get('sm')} with SGLang "
        f"{machine.get('sglang')} (looked in {tried}): every hook declines; {CALIBRATE}"
    )
    return Found(None, machine["gpu"], note + "".join(f"; unreadable {s}" for s in skipped))


def _used(policy: Policy, machine: dict, what: str, skipped: list[str]) -> str:
    line = f"policy: {policy.path} ({what}; {policy.key['gpu']}, {policy.date})"
    differs = policy.differences(machine)
    if differs:
        line += f"; calibrated with other versions: {', '.join(differs)}; {CALIBRATE} again"
    return line + "".join(f"; unreadable {s}" for s in skipped)


def machine_key(device_index: int) -> dict:
    """This machine's key for CUDA device ``device_index`` (every field a policy keys on)."""
    import torch

    from dsv41_kernels import __version__

    props = torch.cuda.get_device_properties(device_index)
    return {
        "gpu": torch.cuda.get_device_name(device_index),
        "sm": f"sm_{props.major}{props.minor}",
        "sm_count": props.multi_processor_count,
        "sglang": sglang_version(),
        "dsv41_kernels": __version__,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
    }


def sglang_version() -> str | None:
    """SGLang's version: the imported module's, else the installed distribution's."""
    import sys
    from importlib.metadata import PackageNotFoundError, version

    found = getattr(sys.modules.get("sglang"), "__version__", None)
    if found:
        return str(found)
    try:
        return version("sglang")
    except PackageNotFoundError:
        return None


@functools.cache
def for_device(device_index: int) -> Found:
    """The policy of CUDA device ``device_index`` (looked up once per process and device, and
    said once in the log then: the start-up line may have had to leave it open)."""
    found = find(machine_key(device_index))
    (logger.info if found.policy is not None else logger.warning)("dsv41-kernels: %s", found.note)
    return found


def device_of(t) -> int | None:
    """The CUDA device index of tensor ``t``, None off CUDA (no policy decides there)."""
    return cuda_index(t.device) if t.is_cuda else None


def policy_refusal(site: str, rows, columns: bool = False) -> Admission | None:
    """The policy's refusal of a call of ``site`` on ``rows`` (a tensor: its leading dimension
    the row count, its device the GPU; ``columns``: its second dimension decides too), None
    where ours may run: forced, off CUDA, or inside a range the policy gives ours."""
    if forced(SITE_SWITCH[site]):
        return None
    index = device_of(rows)
    if index is None:
        return None
    found = for_device(index)
    if found.policy is None:
        return _refusal(not_measured(found.gpu))
    second = rows.shape[1] if columns and rows.dim() > 1 else None
    return found.policy.refusal(site, rows.shape[0], second)


def startup_note(environ=os.environ) -> str:
    """What the start-up line says of the policy of the current CUDA device."""
    try:
        import torch

        if not torch.cuda.is_available():
            return "policy: no CUDA device (hooks on CUDA tensors follow a GPU's policy)"
        if not torch.cuda.is_initialized():
            # Reading the device here would start CUDA in a process that may fork its workers
            # later (a forked child cannot use CUDA then): the first hooked call looks it up.
            return "policy: looked up at the first hooked call on each GPU, and logged then"
        if environ is os.environ:
            return for_device(torch.cuda.current_device()).note
        return find(machine_key(torch.cuda.current_device()), environ).note
    except Exception as e:  # the line must not fail the start-up
        return f"policy: not determined at start-up ({type(e).__name__}: {e})"
