"""Argument checks every method's config shares: one wording for the same mistake, whichever method it is made in."""

from __future__ import annotations


def is_int(value) -> bool:
    """A Python int that is not a bool (``True`` is an int to Python, never a count to a user)."""
    return isinstance(value, int) and not isinstance(value, bool)


def check_int(name: str, value, minimum: int = 1, allow_none: bool = False, what: str = "") -> None:
    """Raise a ``ValueError`` naming ``name`` unless ``value`` is an int ``>= minimum`` (or None when allowed)."""
    if allow_none and value is None:
        return
    if not is_int(value) or value < minimum:
        valid = "a positive int" if minimum == 1 else f"an int >= {minimum}"
        raise ValueError(
            f"{name} must be {'None or ' if allow_none else ''}{valid}{f' ({what})' if what else ''}, got {value!r}"
        )


def check_bool(name: str, value) -> None:
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be a bool, got {value!r}")


def method_config(config_class, config, options: dict):
    """``config`` (an instance of ``config_class``) or one built from ``options`` (its fields as keywords), never both:
    the one calling convention of CAPE, the cascade and CASD."""
    if config is not None and options:
        raise ValueError(
            f"pass either config= or {config_class.__name__} fields as keywords ({sorted(options)}), not both"
        )
    if config is not None and not isinstance(config, config_class):
        first = next(iter(config_class.__dataclass_fields__))
        hint = f"; pass options as keywords, e.g. {first}={config!r}" if is_int(config) else ""
        raise TypeError(f"config must be a {config_class.__name__}, got {type(config).__name__}{hint}")
    if config is not None:
        return config
    fields = set(config_class.__dataclass_fields__)
    unknown = sorted(set(options) - fields)
    if unknown:
        raise TypeError(
            f"unexpected keyword argument(s) {unknown}; {config_class.__name__} fields are {sorted(fields)}"
        )
    return config_class(**options)


def check_copy_options(copy_from_context, max_copy_tokens, allow_none: bool = False) -> None:
    """Raise a ``ValueError`` unless ``copy_from_context`` is a bool or an int >= 0 (or None with ``allow_none``) and
    ``max_copy_tokens`` a positive int or None."""
    valid = isinstance(copy_from_context, int) and copy_from_context >= 0  # a bool too: True and False are ints >= 0
    if not valid and not (allow_none and copy_from_context is None):
        raise ValueError(
            f"copy_from_context must be an int >= 0 (the shortest match to copy from; 0 = never) or a bool "
            f"(False: never copy){' or None' if allow_none else ''}, got {copy_from_context!r}"
        )
    check_int("max_copy_tokens", max_copy_tokens, allow_none=True, what="the longest copy from the context")
