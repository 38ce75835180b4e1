"""Every selector of ``adapter_config.json`` must select something on the served base model.

PEFT skips a ``rank_pattern`` / ``alpha_pattern`` key that decides no targeted module (0.21 only
warns) and a ``target_modules`` list entry or ``layers_to_transform`` index that adds no module
while another one does. loraplex refuses each, naming it: nothing in a config is silently
ignored, and such an entry is a typo or a config written for another model, so the adapter would
not compute what its author meant. A pattern key counts when it is the first match (PEFT's
order) of at least one targeted module; one that only matches modules an earlier key already
decides is refused too. The work is the matcher's own: one first-match scan per targeted module.
"""

from __future__ import annotations

from collections.abc import Sequence

from loraplex.artifacts.base_model import TARGET_MODULES, BaseModelSpec
from loraplex.artifacts.manifest import ModuleMatcher
from loraplex.errors import AdapterConfigError


def check_reach(
    matcher: ModuleMatcher, base: BaseModelSpec, targeted: Sequence[tuple[int, str]]
) -> None:
    """Raise AdapterConfigError for the first selector entry that selects nothing in ``base``.

    ``targeted`` holds the (layer, module) pairs the config targets, non-empty.
    """
    spec = matcher.spec
    where = f"of {base.name!r} ({base.num_layers} layers)"
    if isinstance(spec.target_modules, tuple):
        paths = [BaseModelSpec.module_path(layer, module) for layer, module in targeted]
        _check_target_entries(spec.target_modules, paths, where)
    reached_layers = {layer for layer, _ in targeted}
    for index in spec.layers_to_transform or ():
        if index not in reached_layers:
            raise AdapterConfigError(
                "layers_to_transform",
                index,
                f"layer indices that each keep at least one module {where} that target_modules "
                "selects (after exclude_modules and layers_pattern); this one keeps none",
            )
    for field, what, pattern, first_key in (
        ("rank_pattern", "rank", spec.rank_pattern, matcher.rank_key),
        ("alpha_pattern", "alpha", spec.alpha_pattern, matcher.alpha_key),
    ):
        deciding = {first_key(layer, module) for layer, module in targeted}
        for key, _ in pattern:
            if key not in deciding:
                raise AdapterConfigError(
                    field,
                    key,
                    f"keys that each decide the {what} of at least one targeted module {where}; "
                    "this key matches none, or only modules an earlier key decides (the first "
                    "matching key wins, as in PEFT)",
                )


def _check_target_entries(entries: tuple[str, ...], paths: Sequence[str], where: str) -> None:
    """A list entry selects a path equal to it or ending in ``"." + entry``: every such suffix
    of the targeted paths is collected once, so the check is linear in paths and entries."""
    reached: set[str] = set()
    for path in paths:
        parts = path.split(".")
        reached.update(".".join(parts[i:]) for i in range(len(parts)))
    for entry in entries:
        if entry not in reached:
            raise AdapterConfigError(
                "target_modules",
                entry,
                f"entries that each select at least one module {where} (after "
                "layers_to_transform and exclude_modules); this one selects none",
            )


def exclude_warnings(matcher: ModuleMatcher, base: BaseModelSpec) -> tuple[str, ...]:
    """The warning, if any, for the ``exclude_modules`` entries that exclude none of the modules
    ``target_modules`` selects in ``base``: warned, not refused (docs/registry.md). PEFT matches
    excludes against every module of the model and warns only when none is excluded at all; an
    entry naming a module loraplex never adapts (``lm_head``, a norm) is valid there, so it is
    accepted here too, and said. NOTE: such an entry was accepted in silence."""
    spec = matcher.spec
    if not spec.exclude_modules:
        return ()
    selected = [
        BaseModelSpec.module_path(layer, module)
        for layer in range(base.num_layers)
        for module in TARGET_MODULES
        if matcher.selects(layer, module)
    ]
    excluding = matcher.excluding(selected)
    exclude = spec.exclude_modules
    if isinstance(exclude, str):
        if exclude in excluding:
            return ()
        what, does = f"exclude_modules {exclude!r} excludes", "it does"
    else:
        unused = [entry for entry in exclude if entry not in excluding]
        if not unused:
            return ()
        what = f"exclude_modules entries {unused} exclude"
        does = "it does" if len(unused) == 1 else "they do"
    return (
        f"{what} none of the {len(selected)} modules target_modules selects in {base.name!r} "
        f"({base.num_layers} layers; loraplex adapts only {', '.join(TARGET_MODULES)}): "
        f"accepted, as PEFT accepts it, but {does} nothing here",
    )
