"""The machinery behind every stand-in module in this folder (see ``standins.txt``).

A stand-in exists only so that SGLang's *unconditional* imports of a package that cannot run on
the GPU test machine go through. Each stand-in module exports exactly the names SGLang's source
references from the real module that the real module also defines, each bound to a placeholder.
A placeholder allows what an import does (binding, attribute access, subclassing, use as a dict
key); anything that would run the real package's code (a call, an instantiation, truth, length,
iteration, arithmetic, comparison) raises :class:`StandInUsed`. A name the stand-in does not
export raises AttributeError (so ``from pkg import name`` raises ImportError, as for a real
package without that name).

:class:`StandInUsed` derives from BaseException, not Exception, on purpose: SGLang's
``except Exception`` fallbacks must not swallow it and quietly take a path that the real package
would not have taken. A test that reaches a stand-in fails, loudly, naming the package.
"""

from __future__ import annotations

import sys

__all__ = ["StandInUsed", "populate"]


class StandInUsed(BaseException):
    """Code on the tested path used a stand-in: carry the real package instead."""


def _used(qualname: str, what: str):
    raise StandInUsed(
        f"{qualname}: {what} a stand-in (tools/sglang_env/standins); the real "
        f"'{qualname.split('.')[0]}' is not on this machine, so this path cannot run here"
    )


class _PlaceholderMeta(type):
    def __getattr__(cls, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _placeholder(f"{cls.__qualname__}.{name}")

    def __call__(cls, *args, **kwargs):
        _used(cls.__qualname__, "called")

    def __bool__(cls):
        _used(cls.__qualname__, "truth value of")

    def __len__(cls):
        _used(cls.__qualname__, "len() of")

    def __iter__(cls):
        _used(cls.__qualname__, "iterated over")

    def __contains__(cls, item):
        _used(cls.__qualname__, "'in' on")

    def __getitem__(cls, item):
        _used(cls.__qualname__, "indexed")

    def __index__(cls):
        _used(cls.__qualname__, "used as an integer:")

    def __int__(cls):
        _used(cls.__qualname__, "int() of")

    def __float__(cls):
        _used(cls.__qualname__, "float() of")

    def __lt__(cls, other):
        _used(cls.__qualname__, "compared")

    __le__ = __gt__ = __ge__ = __lt__

    def __add__(cls, other):
        _used(cls.__qualname__, "arithmetic on")

    __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = __truediv__ = __floordiv__ = __add__
    __mod__ = __pow__ = __and__ = __xor__ = __lshift__ = __rshift__ = __add__
    # `|` stays type.__or__: `Placeholder | None` in an annotation is typing, not a use.

    def __repr__(cls):
        return f"<stand-in {cls.__qualname__}>"


def _placeholder(qualname: str) -> type:
    def _init_subclass(sub, **kwargs):  # SGLang subclassing a stand-in class is an import
        pass

    def _new(sub, *args, **kwargs):  # instantiating a subclass runs the real base's code
        _used(qualname, f"instantiated (as {sub.__qualname__}) from")

    ph = _PlaceholderMeta(
        qualname.rsplit(".", 1)[-1],
        (),
        {"__new__": _new, "__init_subclass__": classmethod(_init_subclass)},
    )
    ph.__qualname__ = qualname
    ph.__module__ = qualname.rsplit(".", 1)[0]
    return ph


def populate(namespace: dict, names: str) -> None:
    """Bind each whitespace-separated name in ``names`` to a placeholder in ``namespace``."""
    module = namespace["__name__"]
    exported = names.split()
    for name in exported:
        namespace[name] = _placeholder(f"{module}.{name}")
    namespace["__all__"] = exported
    namespace["__standin__"] = True

    def __getattr__(name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        raise AttributeError(
            f"stand-in module {module!r} has no attribute {name!r} (it exports only what "
            f"SGLang references and the real package defines: tools/sglang_env/standins)"
        )

    namespace["__getattr__"] = __getattr__
    sys.modules[module].__doc__ = namespace.get("__doc__")
