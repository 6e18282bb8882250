"""What ``dsv41-kernels calibrate`` and ``benchmark/call_sites.py`` drive on the GPU: each hooked
SGLang 0.5.23 call site through SGLang's own callers, built from SGLang's real classes.

- :mod:`.callers`: the callers and their inputs (DSpark's verify logits and drafts, a V4.1
  decoder layer's mHC, the vision router's MoE layer, the attention output on its way to the FP8
  ``wo_a``), and :func:`~.callers.sglang_functions`, which puts SGLang's own functions back in
  place of the plugin's hooks;
- :mod:`.flashmla`: FlashMLA's sparse decode as the DeepSeek-V4 backend calls it, with the
  schedule the plugin hooks;
- :mod:`.drivers`: the cases, one per call site and row count, each building its inputs on
  demand, and the timing of one arm.

SGLang is imported inside the functions that need it: importing this package needs only torch.
The CPU import shim of the plugin's tests (``test/sglang/cpu_import.py``) is no part of it: on a
GPU server torchvision loads and SGLang imports as it is.
"""
